#!/usr/bin/env bash
# cascade-guard's container image, built without a Docker daemon.
#
# The binary is static (the musl target), so the image holds nothing else: one
# layer with /cascade-guard, run as the non-root user 65532:65532 (what the
# chart's securityContext sets), entrypoint the binary, `run` its default
# argument, labels naming the version and the source. The pinned crane
# (testbed/tools/crane.sh) assembles it on an empty base and pushes it.
#
#   scripts/image.sh binary              build (or reuse) the static binary; prints its path
#   scripts/image.sh push REPOSITORY:TAG build, assemble and push the image; prints
#                                        REPOSITORY@sha256:... on its last line
#
# Reproducible: the same binary gives the same digest. The layer's one file has
# a fixed time, owner and mode; the config's times are Go's zero time (crane's
# empty base) and it names no commit; the binary is built with its target
# dir's and Cargo's paths remapped, so it names no host path, and with symbols
# stripped (the C objects' file symbols carry their build paths).
#
# Needs, and installs when missing: the Rust musl target (rustup), and musl's C
# compiler for ring's C part (Debian's musl-tools, pinned below; apt-get as
# root). Anything it cannot install stops it with the installer's own error.
# The build has its own target dir (image/ in CARGO_TARGET_DIR, else in
# target/), shared by every clone: the flags name the target dir and Cargo's
# home, not the checkout (Cargo gives rustc a workspace crate's sources by
# their path inside the workspace). A binary built from the same inputs
# (inputs_key below) is kept, from any clone; otherwise Cargo builds.
set -euo pipefail
cd "$(dirname "$0")/.."

musl_tools_version=1.2.3-1

die() {
  echo "image.sh: $*" >&2
  exit 1
}

case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) die "no image for $(uname -m): only x86_64 and aarch64 have a musl target here" ;;
esac
rust_target="$(uname -m)-unknown-linux-musl"
target_dir="${CARGO_TARGET_DIR:-$PWD/target}/image"
binary="$target_dir/$rust_target/release/cascade-guard"

ensure_musl_target() {
  if rustup target list --installed | grep -qx "$rust_target"; then
    return
  fi
  echo "image.sh: adding the Rust target $rust_target" >&2
  rustup target add "$rust_target" >&2 || die "rustup target add $rust_target failed (its error is above)"
}

ensure_musl_gcc() {
  if command -v musl-gcc >/dev/null 2>&1; then
    return
  fi
  local packages=(musl-tools="$musl_tools_version" musl-dev="$musl_tools_version" musl="$musl_tools_version")
  if [ "$(id -u)" != 0 ]; then
    die "musl-gcc is missing; as root: apt-get install ${packages[*]}"
  fi
  echo "image.sh: installing Debian's ${packages[*]} (musl-gcc, for ring's C part)" >&2
  # A fresh machine may have no package lists yet: update once, then retry.
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${packages[@]}" >&2; then
    apt-get update >&2 || die "apt-get update failed (its error is above)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${packages[@]}" >&2 \
      || die "apt-get install ${packages[*]} failed (its error is above)"
  fi
  command -v musl-gcc >/dev/null 2>&1 || die "musl-tools is installed but musl-gcc is not on PATH"
}

# What the static binary is built from, hashed: the product's two crates
# (their tests and examples aside), every manifest of the workspace and its
# lock file, this script, Cargo's configuration, the toolchain, musl's C
# compiler and the flags. Cargo takes a fresh clone's files for changed (they
# are newer than its last build) and built the same two crates again in every
# CI run: two to three minutes of both cores. Nothing printed (not a git
# checkout, a listed file missing): no key, and Cargo decides as before.
inputs_key() {
  local flags=$1 listed hashed
  listed=$(git ls-files -z --cached --others --exclude-standard -- \
    Cargo.toml Cargo.lock '*Cargo.toml' .cargo scripts/image.sh \
    crates/cascade-guard crates/cascade-guard-policy \
    ':!crates/cascade-guard/tests' ':!crates/cascade-guard-policy/tests' \
    ':!crates/cascade-guard/examples' 2>/dev/null | tr '\0' '\n' | LC_ALL=C sort) || return 0
  [ -n "$listed" ] || return 0
  hashed=$({
    tr '\n' '\0' <<<"$listed" | xargs -0 sha256sum -- || exit 1
    local config
    for config in "$cargo_home/config.toml" "$cargo_home/config"; do
      if [ -f "$config" ]; then sha256sum -- "$config" || exit 1; fi
    done
    rustc -vV && cargo -V && musl-gcc --version | sed -n 1p || exit 1
    echo "$rust_target $flags"
  } 2>/dev/null) || return 0
  sha256sum <<<"$hashed" | cut -d' ' -f1
}

build_binary() {
  ensure_musl_target
  ensure_musl_gcc
  local cargo_home=${CARGO_HOME:-$HOME/.cargo}
  local cc_var="CC_${rust_target//-/_}" cflags_var="CFLAGS_${rust_target//-/_}"
  # No host path in the binary: Rust's panic locations and the C objects'
  # names are remapped to fixed prefixes.
  # The checkout itself is not remapped: that would make the flags, and so
  # every crate, differ from one clone to the next (tests/api_server/install.rs
  # checks that the binary names neither the checkout nor Cargo's home).
  local remap="--remap-path-prefix=$target_dir=/target --remap-path-prefix=$cargo_home=/cargo"
  local rustflags="$remap -C strip=symbols"
  local cflags="-ffile-prefix-map=$target_dir=/target -ffile-prefix-map=$cargo_home=/cargo"
  mkdir -p "$target_dir"
  # The key, and the binary's own hash beside it: a binary Cargo built since
  # by other means is not taken for the one the key names.
  local key recorded="$binary.inputs" now
  key=$(inputs_key "$rustflags $cflags")
  if [ -n "$key" ] && [ -x "$binary" ] && [ -f "$recorded" ]; then
    now="$key $(sha256sum <"$binary" | cut -d' ' -f1)"
    if [ "$(cat "$recorded")" = "$now" ]; then
      echo "image.sh: the static binary was built from these same inputs (key ${key:0:12}): kept" >&2
      "$binary" version --client >&2 || die "the built binary does not run: $binary"
      return
    fi
  fi
  rm -f "$recorded"
  local start=$SECONDS
  echo "image.sh: building the static binary ($rust_target, release) in $target_dir" >&2
  # Run from a test (cargo test sets CARGO_MANIFEST_DIR, CARGO_PKG_* and more
  # for it), Cargo would see ring's build script's inputs changed and rebuild
  # half the tree: build in an environment without them.
  local inherited
  for inherited in $(compgen -e | grep -E '^(CARGO_|OUT_DIR$|RUSTC_|__CARGO)' | grep -vx CARGO_HOME); do
    unset "$inherited"
  done
  env \
    CARGO_TARGET_DIR="$target_dir" \
    RUSTFLAGS="$rustflags" \
    "$cc_var=musl-gcc" \
    "$cflags_var=$cflags" \
    cargo build --release --locked --target "$rust_target" -p cascade-guard --bin cascade-guard >&2 \
    || die "cargo build for $rust_target failed (its error is above)"
  echo "image.sh: static binary ready in $((SECONDS - start))s" >&2
  # A static binary runs here as it will in the image.
  "$binary" version --client >&2 || die "the built binary does not run: $binary"
  if [ -n "$key" ]; then
    echo "$key $(sha256sum <"$binary" | cut -d' ' -f1)" >"$recorded"
  fi
}

# The one layer: /cascade-guard, root-owned, world-executable, time 0.
write_layer() {
  local layer=$1 stage
  stage=$(mktemp -d)
  install -m 0755 "$binary" "$stage/cascade-guard"
  tar --create --file "$layer" --directory "$stage" --format=ustar \
    --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner cascade-guard
  rm -rf "$stage"
}

push_image() {
  local ref=$1
  [[ $ref == */*:* && $ref != *@* ]] || die "push needs REPOSITORY:TAG (e.g. 127.0.0.1:5000/cascade-guard/cascade-guard:0.1.0), got '$ref'"
  build_binary
  local crane version source work
  crane=$(testbed/tools/crane.sh | tail -n 1)
  version=$("$binary" version --client | awk '{print $2}')
  [ -n "$version" ] || die "the binary printed no version"
  source=$(sed -n 's/^repository = "\(.*\)"$/\1/p' Cargo.toml)
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  write_layer "$work/layer.tar"
  # crane's empty base with OCI media types; then the config. Label values
  # must not hold commas (crane splits its --label list on them).
  "$crane" append --oci-empty-base -f "$work/layer.tar" -t "$ref" >/dev/null 2>"$work/append.log" \
    || die "crane append to $ref failed: $(cat "$work/append.log")"
  "$crane" mutate "$ref" -t "$ref" \
    --set-platform "linux/$arch" \
    --entrypoint /cascade-guard --cmd run \
    --user 65532:65532 \
    --exposed-ports 8080/tcp \
    --label org.opencontainers.image.title=cascade-guard \
    --label "org.opencontainers.image.description=Makes every delete of a protected Kubernetes object a safe foreground cascade" \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.source=$source" \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    2>"$work/mutate.log" >"$work/pushed" \
    || die "crane mutate of $ref failed: $(cat "$work/mutate.log")"
  cat "$work/pushed"
}

case "${1:-}" in
  binary)
    build_binary
    echo "$binary"
    ;;
  push)
    [ $# -eq 2 ] || die "usage: scripts/image.sh push REPOSITORY:TAG"
    push_image "$2"
    ;;
  *)
    echo "usage: scripts/image.sh binary | push REPOSITORY:TAG" >&2
    exit 2
    ;;
esac
