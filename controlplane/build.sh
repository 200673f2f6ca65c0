#!/usr/bin/env bash
# Builds the local control plane's binaries (etcd, kube-apiserver,
# kube-controller-manager, kubectl) from the upstream Go modules pinned in
# go.mod, with this machine's Go toolchain and the Go module proxy.
#
# The binaries are cached outside git, keyed by a hash of go.mod and go.sum, so
# a warm run returns at once. Prints the bin directory on its last line.
#
#   controlplane/build.sh            build (or reuse) and print the bin dir
#   CASCADE_GUARD_CACHE=/some/dir    where to cache (default ~/.cache/cascade-guard)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${CASCADE_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cascade-guard}
k8s_version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$here/go.mod")
if [ -z "$k8s_version" ]; then
  echo "build.sh: cannot read the pinned k8s.io/kubernetes version from $here/go.mod" >&2
  exit 1
fi
key=$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-12)
bin="$cache/controlplane/$k8s_version-$key/bin"

tools=(etcd kube-apiserver kube-controller-manager kubectl)
complete=1
for t in "${tools[@]}"; do [ -x "$bin/$t" ] || complete=0; done
if [ "$complete" = 1 ]; then
  echo "$bin"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "build.sh: Go is not installed; the control plane is built from source with it" >&2
  exit 1
fi

# Never let the go command fetch another toolchain: only the machine's one exists here.
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$bin.tmp"
minor=${k8s_version#v1.}
minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean"
done

build() {
  local out=$1 pkg=$2
  echo "build.sh: building $out ($pkg)" >&2
  local start=$SECONDS
  (cd "$here" && go build -trimpath -ldflags "$ldflags" -o "$bin.tmp/$out" "$pkg")
  echo "build.sh: built $out in $((SECONDS - start))s" >&2
}

build etcd go.etcd.io/etcd/server/v3
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
build kubectl k8s.io/kubernetes/cmd/kubectl

rm -rf "$bin"
mv "$bin.tmp" "$bin"
echo "$bin"
