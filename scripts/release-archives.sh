#!/usr/bin/env bash
# Release archives of the command line, for people and for krew:
# cascade-guard-vVERSION-linux-ARCH.tar.gz holding the static binary as
# kubectl-cascade_guard (the file name kubectl runs for `kubectl
# cascade-guard`; README "Install") and the LICENSE (krew's index asks every
# plugin for one), SHA256SUMS over every archive in the
# output directory, and the krew manifest (deploy/krew/cascade-guard.yaml)
# filled with one platform per archive there.
#
#   scripts/release-archives.sh [OUT_DIR]   default OUT_DIR: target/release-archives
#
# The binary is the image's static (musl) one, built or reused by
# `scripts/image.sh binary` for this machine's architecture; run the script on
# an x86_64 and an aarch64 machine into the same OUT_DIR for both platforms.
#   CASCADE_GUARD_BINARY=PATH  package this binary instead (the archive is
#                              named for the architecture in its ELF header)
#   RELEASE_URL=URL            where the archives will be downloaded from
#                              (default: the repository's GitHub release vVERSION)
#
# Reproducible: the same binary gives the same archive (fixed time, owner and
# order; gzip without a name or time).
set -euo pipefail
cd "$(dirname "$0")/.."

die() {
  echo "release-archives.sh: $*" >&2
  exit 1
}

out=${1:-target/release-archives}
template=deploy/krew/cascade-guard.yaml
plugin_file=kubectl-cascade_guard

if [ -n "${CASCADE_GUARD_BINARY:-}" ]; then
  binary=$CASCADE_GUARD_BINARY
  [ -x "$binary" ] || die "CASCADE_GUARD_BINARY=$binary is not an executable file"
else
  binary=$(scripts/image.sh binary | tail -n 1) || die "scripts/image.sh binary failed (its output is above)"
fi

# The architecture the binary is for, read from its ELF header (e_machine),
# not assumed from this machine: an archive is never named for another.
case "$(od -An -tx1 -j18 -N2 "$binary" | tr -d ' \n')" in
  3e00) arch=amd64 ;;
  b700) arch=arm64 ;;
  *) die "$binary is not an x86_64 or aarch64 Linux executable" ;;
esac

# The version the binary itself reports, so that an archive cannot be named
# for another one.
version=$("$binary" version --client | awk '{ print $2 }') || die "$binary version --client failed"
[ -n "$version" ] || die "$binary printed no version"
repository=$(sed -n 's/^repository = "\(.*\)"$/\1/p' Cargo.toml)
url=${RELEASE_URL:-$repository/releases/download/v$version}

mkdir -p "$out"
archive=cascade-guard-v$version-linux-$arch.tar.gz
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
install -m 0755 "$binary" "$stage/$plugin_file"
install -m 0644 LICENSE "$stage/LICENSE"
tar --create --directory "$stage" --format=ustar \
  --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner "$plugin_file" LICENSE |
  gzip -n -9 >"$out/$archive"
echo "release-archives.sh: wrote $out/$archive" >&2

# Checksums and the manifest over every archive of this version in OUT_DIR:
# those of other architectures, built on other machines, too.
mapfile -t archives < <(cd "$out" && ls cascade-guard-v"$version"-linux-*.tar.gz | sort)
(cd "$out" && sha256sum "${archives[@]}") >"$out/SHA256SUMS"

platform=$(sed -n '/^# platform-begin/,/^# platform-end/p' "$template" | sed '1d;$d')
[ -n "$platform" ] || die "$template has no '# platform-begin' ... '# platform-end' block"
platforms=
for name in "${archives[@]}"; do
  a=${name##*-linux-}
  a=${a%.tar.gz}
  sum=$(awk -v f="$name" '$2 == f { print $1 }' "$out/SHA256SUMS")
  entry=${platform//\{\{ARCH\}\}/$a}
  entry=${entry//\{\{URI\}\}/$url/$name}
  entry=${entry//\{\{SHA256\}\}/$sum}
  platforms+="$entry"$'\n'
done
manifest=$out/cascade-guard.yaml
{
  sed -n '/^# platform-begin/q;p' "$template" | sed '/^# /d' | sed "s/{{VERSION}}/$version/g"
  printf '%s' "$platforms"
} >"$manifest"
if grep -n '{{' "$manifest" >&2; then
  die "$manifest still has placeholders (above)"
fi
echo "release-archives.sh: wrote $out/SHA256SUMS and the krew manifest $manifest (platforms: ${archives[*]})" >&2
cat "$out/SHA256SUMS"
