#!/usr/bin/env bash
# Builds the local control plane's binaries (etcd, kube-apiserver,
# kube-controller-manager, kubectl) of one pinned Kubernetes release from the
# upstream Go modules, with this machine's Go toolchain and the Go module proxy.
#
# Each release is pinned by a wrapper module in releases/<version>/ (written by
# pin.sh), which names the etcd that release supports (etcd/<etcd version>/).
# Each release and each etcd is cached on its own, outside git, keyed by a hash
# of its go.mod and go.sum, so a warm run returns at once. Prints the bin
# directory on its last line.
#
#   controlplane/build.sh            the newest pinned release
#   controlplane/build.sh 1.30       the pinned release of that minor (or an exact v1.30.14)
#   controlplane/build.sh --list     the pinned releases, oldest first
#   CASCADE_GUARD_CACHE=/some/dir    where to cache (default ~/.cache/cascade-guard)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${CASCADE_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cascade-guard}
# Bump when the way a binary is built changes, so cached builds are redone.
recipe=2

pinned=$(cd "$here/releases" && ls -d v1.* | sort -V)
if [ "${1:-}" = --list ]; then
  echo "$pinned"
  exit 0
fi

resolve() {
  local want=${1#v}
  local v
  for v in $pinned; do
    # An exact release, or the pinned release of a minor.
    if [ "${v#v}" = "$want" ] || [[ ${v#v} == "$want".* ]]; then
      echo "$v"
      return
    fi
  done
  echo "build.sh: Kubernetes $1 is not pinned (pinned: $(echo $pinned)); pin it with controlplane/pin.sh" >&2
  exit 1
}

if [ -n "${1:-}" ]; then
  k8s_version=$(resolve "$1")
else
  k8s_version=$(echo "$pinned" | tail -1)
fi
release=$here/releases/$k8s_version
etcd_version=$(cat "$release/etcd-version")
etcd_module=$here/etcd/$etcd_version
if [ ! -f "$etcd_module/go.sum" ]; then
  echo "build.sh: $k8s_version names etcd $etcd_version, which is not pinned in $etcd_module" >&2
  exit 1
fi

hash_of() { { echo "recipe $recipe"; cat "$@"; } | sha256sum | cut -c1-12; }
etcd_bin=$cache/etcd/$etcd_version-$(hash_of "$etcd_module/go.mod" "$etcd_module/go.sum")
bin=$cache/controlplane/$k8s_version-$(hash_of "$release/go.mod" "$release/go.sum" "$release/etcd-version")/bin

tools=(etcd kube-apiserver kube-controller-manager kubectl)
complete() {
  local t
  for t in "${tools[@]}"; do [ -x "$bin/$t" ] || return 1; done
}
if complete; then
  echo "$bin"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "build.sh: Go is not installed; the control plane is built from source with it" >&2
  exit 1
fi

# Two builds of one release at once (parallel test binaries) would race on the
# same directory: the second waits for the first and then finds it complete.
mkdir -p "$cache/controlplane" "$cache/etcd"
exec 9>"$cache/controlplane/$k8s_version.lock"
flock 9
if complete; then
  echo "$bin"
  exit 0
fi

# Never let the go command fetch another toolchain: only the machine's one exists here.
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

build() {
  local module=$1 out=$2 pkg=$3 ldflags=$4
  echo "build.sh: building $(basename "$out") ($pkg)" >&2
  local start=$SECONDS
  (cd "$module" && go build -trimpath -ldflags "$ldflags" -o "$out" "$pkg")
  echo "build.sh: built $(basename "$out") in $((SECONDS - start))s" >&2
}

if [ ! -x "$etcd_bin/etcd" ]; then
  mkdir -p "$etcd_bin.tmp"
  build "$etcd_module" "$etcd_bin.tmp/etcd" go.etcd.io/etcd/server/v3 "-s -w"
  rm -rf "$etcd_bin"
  mv "$etcd_bin.tmp" "$etcd_bin"
fi

minor=${k8s_version#v1.}
minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean"
done

rm -rf "$bin.tmp"
mkdir -p "$bin.tmp"
for t in kube-apiserver kube-controller-manager kubectl; do
  build "$release" "$bin.tmp/$t" "k8s.io/kubernetes/cmd/$t" "$ldflags"
done
cp "$etcd_bin/etcd" "$bin.tmp/etcd"

rm -rf "$bin"
mv "$bin.tmp" "$bin"
echo "$bin"
