#!/usr/bin/env bash
# Builds the local control plane's binaries (etcd, kube-apiserver,
# kube-controller-manager, kubectl) of one pinned Kubernetes release from the
# upstream Go modules, with this machine's Go toolchain and the Go module proxy.
#
# Each release is pinned by a wrapper module in releases/<version>/ (written by
# pin.sh), which names the etcd that release supports (etcd/<etcd version>/).
# Each release and each etcd is cached on its own, outside git, keyed by a hash
# of its go.mod and go.sum, so a warm run returns at once (../go-install.sh).
# Prints the bin directory on its last line.
#
#   testbed/controlplane/build.sh          the newest pinned release
#   testbed/controlplane/build.sh 1.30     the pinned release of that minor (or an exact v1.30.14)
#   testbed/controlplane/build.sh --list   the pinned releases, oldest first
#   testbed/controlplane/build.sh --cached 1.31
#                                          builds nothing: prints the bin
#                                          directory if that release is
#                                          cached, else fails
#   CASCADE_GUARD_CACHE=/some/dir          where to cache (default ~/.cache/cascade-guard)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../go-install.sh"
cache=$(go_install_cache)
# Bump when the way a binary is built changes, so cached builds are redone.
recipe=2

pinned=$(cd "$here/releases" && ls -d v1.* | sort -V)
if [ "${1:-}" = --list ]; then
  echo "$pinned"
  exit 0
fi
only_cached=0
if [ "${1:-}" = --cached ]; then
  only_cached=1
  shift
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
  echo "build.sh: Kubernetes $1 is not pinned (pinned: $(echo $pinned)); pin it with testbed/controlplane/pin.sh" >&2
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
bin=$cache/controlplane/$k8s_version-$(go_install_key -r "$recipe" "$release/go.mod" "$release/go.sum" "$release/etcd-version")/bin

minor=${k8s_version#v1.}
minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean"
done

build_etcd() {
  go_install_build "$1/etcd" "$etcd_module" go.etcd.io/etcd/server/v3
}

# Where a release's etcd is built. A release whose own module graph pins the
# etcd server it names (the API server's storage tests run that etcd embedded)
# lists it as a tool in its wrapper (pin.sh), and etcd is built there: with
# the versions of gRPC, protobuf, OpenTelemetry and etcd's client that
# kube-apiserver is built with, so that the two share 256 of etcd's 351
# compiled packages (BENCHMARKS.md "CI"). Otherwise etcd is built in its own
# wrapper, etcd/<version>/, with its own go.mod's versions, cached apart and
# shared by the releases that name it.
etcd_in_release=0
if grep -q '^[[:space:]]*go.etcd.io/etcd/server/v3$' "$release/go.mod"; then
  if ! grep -q "^[[:space:]]*go.etcd.io/etcd/server/v3 $etcd_version\b" "$release/go.mod"; then
    echo "build.sh: $release/go.mod builds etcd but does not pin $etcd_version, the etcd $k8s_version names; pin the release again with testbed/controlplane/pin.sh" >&2
    exit 1
  fi
  etcd_in_release=1
elif [ ! -f "$etcd_module/go.sum" ]; then
  echo "build.sh: $k8s_version names etcd $etcd_version, which is not pinned in $etcd_module" >&2
  exit 1
else
  etcd_bin=$cache/etcd/$etcd_version-$(go_install_key -r "$recipe" "$etcd_module/go.mod" "$etcd_module/go.sum")
fi

# The release's bin directory: its etcd and its three binaries.
build_release() {
  local tmp=$1 t
  if [ "$etcd_in_release" = 1 ]; then
    go_install_build "$tmp/etcd" "$release" go.etcd.io/etcd/server/v3 || return 1
  else
    go_install "$etcd_bin" build_etcd || return 1
    cp "$etcd_bin/etcd" "$tmp/etcd" || return 1
  fi
  for t in kube-apiserver kube-controller-manager kubectl; do
    go_install_build "$tmp/$t" "$release" "k8s.io/kubernetes/cmd/$t" "$ldflags" || return 1
  done
}

if [ "$only_cached" = 1 ]; then
  [ -d "$bin" ] || exit 1
  echo "$bin"
  exit 0
fi
go_install "$bin" build_release
echo "$bin"
