#!/usr/bin/env bash
# Builds real Crossplane for the local control plane: core (cmd/crossplane) of
# one pinned release, with function-patch-and-transform, provider-kubernetes
# and provider-helm, each from the upstream Go module pinned in its own wrapper
# module here (they want different k8s.io library versions), with this
# machine's Go toolchain and the Go module proxy. Beside the binaries, in
# data/, the CRDs and webhook configurations that ship in those module zips.
#
# Each core release is pinned by a wrapper in core/releases/<version>/ (written
# by pin.sh); the function and the providers are pinned once and go with every
# release. Each binary is cached on its own outside git, keyed by a hash of its
# wrapper's go.mod and go.sum, so another release rebuilds core only; a
# release's bin directory links them together. Prints it on its last line.
#
#   crossplane/build.sh              the default release ($default below)
#   crossplane/build.sh v2.0.2       that pinned release (or a minor: 2.0, v1.20)
#   crossplane/build.sh --list       the pinned releases, oldest first
#   crossplane/build.sh --default    the default release
#   CASCADE_GUARD_CACHE=/some/dir    where to cache (default ~/.cache/cascade-guard)
#   CROSSPLANE_BUILD_JOBS=N          Go builds run at once (default 2)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${CASCADE_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cascade-guard}
jobs=${CROSSPLANE_BUILD_JOBS:-2}
# The release every test runs on unless told otherwise.
default=v2.4.0
# Bump when the way a binary is built changes, so cached builds are redone.
recipe=1

pinned=$(cd "$here/core/releases" && ls | grep -E '^v[0-9]+\.[0-9]+\.[0-9]+$' | sort -V)
case ${1:-} in
--list)
  echo "$pinned"
  exit 0
  ;;
--default)
  echo "$default"
  exit 0
  ;;
esac
version=
want=${1:-$default}
for v in $pinned; do
  # An exact release, or the pinned release of a minor.
  if [ "$v" = "v${want#v}" ] || [[ $v == "v${want#v}".* ]]; then version=$v; fi
done
if [ -z "$version" ]; then
  echo "build.sh: Crossplane $want is not pinned (pinned: $(echo $pinned)); pin it with crossplane/pin.sh" >&2
  exit 1
fi

# Core's module path has no /v2 in v1.
core_module=github.com/crossplane/crossplane
[[ $version == v1.* ]] || core_module+=/v2

# name | wrapper dir | upstream module | main package | data (from:to, ...) |
# whether it has a version variable to set
targets=(
  "crossplane|core/releases/$version|$core_module|$core_module/cmd/crossplane|cluster/crds:core/crds,cluster/webhookconfigurations:core/webhookconfigurations|versioned"
  "function-patch-and-transform|function-patch-and-transform|github.com/crossplane-contrib/function-patch-and-transform|github.com/crossplane-contrib/function-patch-and-transform|package:function-patch-and-transform/package|"
  "provider-kubernetes|provider-kubernetes|github.com/crossplane-contrib/provider-kubernetes|github.com/crossplane-contrib/provider-kubernetes/cmd/provider|package/crds:provider-kubernetes/crds|"
  "provider-helm|provider-helm|github.com/crossplane-contrib/provider-helm|github.com/crossplane-contrib/provider-helm/cmd/provider|package/crds:provider-helm/crds|"
)

hash_of() { { echo "recipe $recipe"; cat "$@"; } | sha256sum | cut -c1-12; }
# Where one binary and its data are cached: keyed by how it is built (its
# line above) and its wrapper.
parts=()
for t in "${targets[@]}"; do
  IFS='|' read -r name dir _ _ _ _ <<<"$t"
  parts+=("$cache/crossplane/parts/$name-$(echo "$t" | hash_of - "$here/$dir/go.mod" "$here/$dir/go.sum")")
done
bin=$cache/crossplane/$version-$(printf '%s\n' "${parts[@]}" | hash_of /dev/stdin)/bin
if [ -d "$bin" ]; then
  echo "$bin"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "build.sh: Go is not installed; Crossplane is built from source with it" >&2
  exit 1
fi

# Never let the go command fetch another toolchain: only the machine's one exists here.
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

# The version a wrapper pins for a module, read from its go.mod as written
# (offline: asking the go command would already fetch it).
pinned_version() {
  local dir=$1 module=$2 v
  v=$(awk -v m="$module" '$1 == m {print $2} $1 == "require" && $2 == m {print $3}' \
    "$here/$dir/go.mod" | head -n1)
  if [ -z "$v" ]; then
    echo "build.sh: crossplane/$dir/go.mod does not require $module" >&2
    return 1
  fi
  echo "$v"
}

# Downloads, builds and copies the data of one binary into its part directory,
# failing loudly with its name and version when the proxy refuses the module
# (nothing falls back to another version) or the build fails. Two builds of
# one part at once (parallel test binaries) would race: the second waits for
# the first and then finds it done.
build_part() {
  local name=$1 dir=$2 module=$3 pkg=$4 data=$5 versioned=$6 part=$7 ldflags="-s -w" v src pair
  local start=$SECONDS
  mkdir -p "$cache/crossplane/parts"
  exec 8>"$part.lock"
  flock 8
  [ -d "$part" ] && return 0
  v=$(pinned_version "$dir" "$module")
  rm -rf "$part.tmp"
  mkdir -p "$part.tmp/data"
  if ! (cd "$here/$dir" && go mod download "$module@$v") >"$part.tmp/download.log" 2>&1; then
    cat "$part.tmp/download.log" >&2
    echo "build.sh: the Go module proxy refused $module $v (pinned in crossplane/$dir/go.mod)" >&2
    return 1
  fi
  # The data the local control plane applies, from the module zip as served.
  src=$(cd "$here/$dir" && go list -m -f '{{.Dir}}' "$module")
  for pair in ${data//,/ }; do
    if [ ! -d "$src/${pair%%:*}" ]; then
      echo "build.sh: $module $v has no ${pair%%:*}" >&2
      return 1
    fi
    mkdir -p "$part.tmp/data/${pair#*:}"
    cp -R "$src/${pair%%:*}/." "$part.tmp/data/${pair#*:}/"
  done
  chmod -R u+w "$part.tmp/data"
  # Without it `crossplane --version` prints nothing. The variable is in the
  # version package main.go imports: core's own (internal/version) up to
  # v2.2, crossplane-runtime's (pkg/version) since v2.3.
  if [ "$versioned" = versioned ]; then
    ldflags+=" -X $(sed -n 's|^[[:space:]]*"\(.*/version\)"$|\1|p' "$src/cmd/$name/main.go" | head -n1).version=$v"
  fi
  echo "build.sh: building $name $v ($pkg)" >&2
  if ! (cd "$here/$dir" && go build -trimpath -ldflags "$ldflags" -o "$part.tmp/$name" "$pkg") \
    >"$part.tmp/build.log" 2>&1; then
    cat "$part.tmp/build.log" >&2
    echo "build.sh: building $name $v failed" >&2
    return 1
  fi
  rm -f "$part.tmp/download.log" "$part.tmp/build.log"
  mv "$part.tmp" "$part"
  echo "build.sh: built $name in $((SECONDS - start))s" >&2
}

# Bounded parallelism: each go build already uses every core for compiling,
# but two at once overlap one's linking and dependency loading with the other.
failed=0
for i in "${!targets[@]}"; do
  IFS='|' read -r name dir module pkg data versioned <<<"${targets[$i]}"
  [ -d "${parts[$i]}" ] && continue
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || failed=1; done
  build_part "$name" "$dir" "$module" "$pkg" "$data" "$versioned" "${parts[$i]}" &
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || failed=1; done
if [ "$failed" != 0 ]; then
  echo "build.sh: a Crossplane $version build failed (see above)" >&2
  exit 1
fi

# The release's bin directory: hard links to its parts, so it costs no space.
rm -rf "$bin.tmp"
mkdir -p "$bin.tmp"
for part in "${parts[@]}"; do cp -Rl "$part/." "$bin.tmp/"; done
rm -rf "$bin"
mv "$bin.tmp" "$bin"
echo "$bin"
