#!/usr/bin/env bash
# Builds real Crossplane for the local control plane: core (cmd/crossplane),
# function-patch-and-transform, provider-kubernetes and provider-helm, each from the upstream Go module pinned in its own wrapper
# module here (they want different k8s.io library versions), with this
# machine's Go toolchain and the Go module proxy. Beside the binaries, in
# data/, the CRDs and webhook configurations that ship in those module zips.
#
# Cached outside git, keyed by a hash of every wrapper's go.mod and go.sum and
# of this script, so a warm run returns at once. Prints the bin directory on
# its last line.
#
#   crossplane/build.sh              build (or reuse) and print the bin dir
#   CASCADE_GUARD_CACHE=/some/dir    where to cache (default ~/.cache/cascade-guard)
#   CROSSPLANE_BUILD_JOBS=N          Go builds run at once (default 2)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${CASCADE_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cascade-guard}
jobs=${CROSSPLANE_BUILD_JOBS:-2}

# binary name | wrapper dir | upstream module | main package
targets=(
  "crossplane|core|github.com/crossplane/crossplane/v2|github.com/crossplane/crossplane/v2/cmd/crossplane"
  "function-patch-and-transform|function-patch-and-transform|github.com/crossplane-contrib/function-patch-and-transform|github.com/crossplane-contrib/function-patch-and-transform"
  "provider-kubernetes|provider-kubernetes|github.com/crossplane-contrib/provider-kubernetes|github.com/crossplane-contrib/provider-kubernetes/cmd/provider"
  "provider-helm|provider-helm|github.com/crossplane-contrib/provider-helm|github.com/crossplane-contrib/provider-helm/cmd/provider"
)

key=$( (cat "$here/build.sh"; for t in "${targets[@]}"; do
  IFS='|' read -r _ dir _ _ <<<"$t"
  cat "$here/$dir/go.mod" "$here/$dir/go.sum"
done) | sha256sum | cut -c1-12)
bin="$cache/crossplane/$key/bin"

complete=1
for t in "${targets[@]}"; do
  IFS='|' read -r name _ _ _ <<<"$t"
  [ -x "$bin/$name" ] || complete=0
done
[ -d "$bin/data" ] || complete=0
if [ "$complete" = 1 ]; then
  echo "$bin"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "build.sh: Go is not installed; Crossplane is built from source with it" >&2
  exit 1
fi

# Never let the go command fetch another toolchain: only the machine's one exists here.
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
rm -rf "$bin.tmp"
mkdir -p "$bin.tmp/data"

# The version a wrapper pins for a module, read from its go.mod as written
# (offline: asking the go command would already fetch it).
pinned_version() {
  local dir=$1 module=$2 version
  version=$(awk -v m="$module" '$1 == m {print $2} $1 == "require" && $2 == m {print $3}' \
    "$here/$dir/go.mod" | head -n1)
  if [ -z "$version" ]; then
    echo "build.sh: crossplane/$dir/go.mod does not require $module" >&2
    return 1
  fi
  echo "$version"
}

# Downloads the pinned module, failing loudly with its name and version when
# the proxy refuses it (nothing falls back to another version).
download() {
  local dir=$1 module=$2 version
  version=$(pinned_version "$dir" "$module")
  if ! (cd "$here/$dir" && go mod download "$module@$version") >"$bin.tmp/$dir.download.log" 2>&1; then
    cat "$bin.tmp/$dir.download.log" >&2
    echo "build.sh: the Go module proxy refused $module $version (pinned in crossplane/$dir/go.mod)" >&2
    return 1
  fi
}

module_dir() {
  local dir=$1 module=$2
  (cd "$here/$dir" && go list -m -f '{{.Dir}}' "$module")
}

build() {
  local name=$1 dir=$2 module=$3 pkg=$4 ldflags="-s -w" version start=$SECONDS
  version=$(pinned_version "$dir" "$module")
  if [ "$name" = crossplane ]; then
    # Without it `crossplane --version` prints nothing.
    ldflags+=" -X github.com/crossplane/crossplane-runtime/v2/pkg/version.version=$version"
  fi
  echo "build.sh: building $name $version ($pkg)" >&2
  if ! (cd "$here/$dir" && go build -trimpath -ldflags "$ldflags" -o "$bin.tmp/$name" "$pkg") \
    >"$bin.tmp/$name.build.log" 2>&1; then
    cat "$bin.tmp/$name.build.log" >&2
    echo "build.sh: building $name $version failed" >&2
    return 1
  fi
  rm -f "$bin.tmp/$name.build.log"
  echo "build.sh: built $name in $((SECONDS - start))s" >&2
}

for t in "${targets[@]}"; do
  IFS='|' read -r _ dir module _ <<<"$t"
  download "$dir" "$module"
  rm -f "$bin.tmp/$dir.download.log"
done

# The data the local control plane applies, from the module zips as served.
copy_data() {
  local dir=$1 module=$2 from=$3 to=$4 src
  src="$(module_dir "$dir" "$module")/$from"
  if [ ! -d "$src" ]; then
    echo "build.sh: $module has no $from" >&2
    return 1
  fi
  mkdir -p "$bin.tmp/data/$to"
  cp -R "$src/." "$bin.tmp/data/$to/"
  chmod -R u+w "$bin.tmp/data/$to"
}
copy_data core github.com/crossplane/crossplane/v2 cluster/crds core/crds
copy_data core github.com/crossplane/crossplane/v2 cluster/webhookconfigurations core/webhookconfigurations
copy_data function-patch-and-transform github.com/crossplane-contrib/function-patch-and-transform package function-patch-and-transform/package
copy_data provider-kubernetes github.com/crossplane-contrib/provider-kubernetes package/crds provider-kubernetes/crds
copy_data provider-helm github.com/crossplane-contrib/provider-helm package/crds provider-helm/crds

# Bounded parallelism: each go build already uses every core for compiling,
# but two at once overlap one's linking and dependency loading with the other.
pids=()
failed=0
for t in "${targets[@]}"; do
  IFS='|' read -r name dir module pkg <<<"$t"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || failed=1; done
  build "$name" "$dir" "$module" "$pkg" &
  pids+=($!)
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || failed=1; done
if [ "$failed" != 0 ]; then
  echo "build.sh: a Crossplane build failed (see above)" >&2
  exit 1
fi

rm -rf "$bin"
mv "$bin.tmp" "$bin"
echo "$bin"
