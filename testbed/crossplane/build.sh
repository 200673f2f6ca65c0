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
# release. Each binary is cached on its own outside git (../go-install.sh),
# keyed by a hash of its wrapper's go.mod and go.sum, so another release
# rebuilds core only; a release's bin directory links them together. Prints it
# on its last line.
#
#   testbed/crossplane/build.sh            the default release ($default below)
#   testbed/crossplane/build.sh v2.0.2     that pinned release (or a minor: 2.0, v1.20)
#   testbed/crossplane/build.sh --list     the pinned releases, oldest first
#   testbed/crossplane/build.sh --default  the default release
#   testbed/crossplane/build.sh --cached v2.2.1
#                                          print the release's bin directory
#                                          if it is cached, else fail
#   CASCADE_GUARD_CACHE=/some/dir          where to cache (default ~/.cache/cascade-guard)
#   CROSSPLANE_BUILD_JOBS=N                Go builds run at once (default 2)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../go-install.sh"
cache=$(go_install_cache)
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
only_cached=0
if [ "${1:-}" = --cached ]; then
  only_cached=1
  shift
fi
version=
want=${1:-$default}
for v in $pinned; do
  # An exact release, or the pinned release of a minor.
  if [ "$v" = "v${want#v}" ] || [[ $v == "v${want#v}".* ]]; then version=$v; fi
done
if [ -z "$version" ]; then
  echo "build.sh: Crossplane $want is not pinned (pinned: $(echo $pinned)); pin it with testbed/crossplane/pin.sh" >&2
  exit 1
fi

# Core's module path has no /v2 in v1.
core_module=github.com/crossplane/crossplane
[[ $version == v1.* ]] || core_module+=/v2

# name | wrapper dir | upstream module | main package | data (from:to, ...) |
# whether it has a version variable to set. Started in this order, two at a
# time (CROSSPLANE_BUILD_JOBS).
targets=(
  "crossplane|core/releases/$version|$core_module|$core_module/cmd/crossplane|cluster/crds:core/crds,cluster/webhookconfigurations:core/webhookconfigurations|versioned"
  "provider-kubernetes|provider-kubernetes|github.com/crossplane-contrib/provider-kubernetes|github.com/crossplane-contrib/provider-kubernetes/cmd/provider|package/crds:provider-kubernetes/crds|"
  "provider-helm|provider-helm|github.com/crossplane-contrib/provider-helm|github.com/crossplane-contrib/provider-helm/cmd/provider|package/crds:provider-helm/crds|"
  "function-patch-and-transform|function-patch-and-transform|github.com/crossplane-contrib/function-patch-and-transform|github.com/crossplane-contrib/function-patch-and-transform|package:function-patch-and-transform/package|"
)
# The function's wrapper has the dependency versions of the default core
# release: it starts once core's build is over (last, so that the providers
# keep the two slots busy meanwhile), and then shares core's compiled
# packages; built beside core, it compiled them again (Go's build cache does
# not share work in flight). Another release's core shares less with it.
after_core=function-patch-and-transform

# Where one binary and its data are cached: keyed by how it is built (its
# line above) and its wrapper.
parts=()
for t in "${targets[@]}"; do
  IFS='|' read -r name dir _ _ _ _ <<<"$t"
  parts+=("$cache/crossplane/parts/$name-$(echo "$t" | go_install_key -r "$recipe" - "$here/$dir/go.mod" "$here/$dir/go.sum")")
done
bin=$cache/crossplane/$version-$(printf '%s\n' "${parts[@]}" | go_install_key -r "$recipe" -)/bin

# Downloads, builds and copies the data of one binary into its part directory
# (TMP, which go_install renames into place), failing loudly with its name and
# version when the proxy refuses the module (nothing falls back to another
# version) or the build fails.
build_part() {
  local tmp=$1 name=$2 dir=$3 module=$4 pkg=$5 data=$6 versioned=$7 ldflags="-s -w" v src pair
  v=$(go_install_pinned "$here/$dir" "$module") || return 1
  mkdir -p "$tmp/data" || return 1
  if ! (cd "$here/$dir" && go mod download "$module@$v") >"$tmp/download.log" 2>&1; then
    cat "$tmp/download.log" >&2
    echo "build.sh: the Go module proxy refused $module $v (pinned in testbed/crossplane/$dir/go.mod)" >&2
    return 1
  fi
  rm -f "$tmp/download.log"
  # The data the local control plane applies, from the module zip as served.
  src=$(cd "$here/$dir" && go list -m -f '{{.Dir}}' "$module") || return 1
  for pair in ${data//,/ }; do
    if [ ! -d "$src/${pair%%:*}" ]; then
      echo "build.sh: $module $v has no ${pair%%:*}" >&2
      return 1
    fi
    mkdir -p "$tmp/data/${pair#*:}" || return 1
    cp -R "$src/${pair%%:*}/." "$tmp/data/${pair#*:}/" || return 1
  done
  chmod -R u+w "$tmp/data" || return 1
  # Without it `crossplane --version` prints nothing. The variable is in the
  # version package main.go imports: core's own (internal/version) up to
  # v2.2, crossplane-runtime's (pkg/version) since v2.3.
  if [ "$versioned" = versioned ]; then
    ldflags+=" -X $(sed -n 's|^[[:space:]]*"\(.*/version\)"$|\1|p' "$src/cmd/$name/main.go" | head -n1).version=$v"
  fi
  go_install_build "$tmp/$name" "$here/$dir" "$pkg" "$ldflags"
}

# Every part not cached yet, then the release's bin directory (TMP): hard links
# to its parts, so it costs no space. Bounded parallelism: each go build
# already uses every core for compiling, but two at once overlap one's linking
# and dependency loading with the other.
build_release() {
  local tmp=$1 failed=0 i part name dir module pkg data versioned core_pid=
  for i in "${!targets[@]}"; do
    IFS='|' read -r name dir module pkg data versioned <<<"${targets[$i]}"
    [ -d "${parts[$i]}" ] && continue
    if [ "$name" = "$after_core" ] && [ -n "$core_pid" ]; then
      wait "$core_pid" || failed=1
    fi
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || failed=1; done
    go_install "${parts[$i]}" build_part "$name" "$dir" "$module" "$pkg" "$data" "$versioned" &
    [ "$name" != crossplane ] || core_pid=$!
  done
  while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || failed=1; done
  if [ "$failed" != 0 ]; then
    echo "build.sh: a Crossplane $version build failed (see above)" >&2
    return 1
  fi
  for part in "${parts[@]}"; do cp -Rl "$part/." "$tmp/" || return 1; done
}

if [ "$only_cached" = 1 ]; then
  if [ -d "$bin" ]; then
    echo "$bin"
    exit 0
  fi
  echo "build.sh: Crossplane $version is not cached" >&2
  exit 1
fi
go_install "$bin" build_release
echo "$bin"
