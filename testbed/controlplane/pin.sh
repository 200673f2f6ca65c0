#!/usr/bin/env bash
# Pins one Kubernetes release for testbed/controlplane/build.sh: writes the
# wrapper module releases/<version>/ (go.mod and go.sum) that builds its
# kube-apiserver, kube-controller-manager and kubectl (and etcd, when the
# release's own graph pins it; below), and etcd/<etcd version>/
# for the etcd that release supports (the version its build/dependencies.yaml
# names), all read from the release's own module zip through the Go module
# proxy.
#
#   testbed/controlplane/pin.sh v1.37.2
#
# Run once per release by a person pinning it; build.sh only reads the result.
# The wrappers pinned before testbed/ existed name controlplane/ in their
# module path and comments: build.sh keys its cache by their contents, so they
# are left as written.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=${1:-}
if ! [[ $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]]; then
  echo "usage: testbed/controlplane/pin.sh v1.MINOR.PATCH (an exact Kubernetes release)" >&2
  exit 2
fi
# Each staging module (k8s.io/api, k8s.io/client-go, ...) is released as v0.MINOR.PATCH.
staging=v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}

export GOTOOLCHAIN=local GOFLAGS=-mod=mod
src=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
if [ -z "$src" ] || [ ! -f "$src/go.mod" ]; then
  echo "pin.sh: the Go module proxy did not serve k8s.io/kubernetes@$version" >&2
  exit 1
fi

# The Go language version the release is written for sets the wrapper's GODEBUG
# defaults, so the binaries behave as upstream's build of that release does.
release_go=$(awk '$1 == "go" {print $2; exit}' "$src/go.mod")
release_godebug=$(awk '$1 == "godebug" && $2 ~ /^default=/ {print $2; exit}' "$src/go.mod")
[ -n "$release_godebug" ] || release_godebug="default=go${release_go%.*}"
# `tool` directives need go 1.24 in the wrapper; the newer of the two wins.
wrapper_go=$(printf '%s\n' 1.24.0 "$release_go" | sort -V | tail -1)

etcd_version=v$(awk '
  /^  - name: / { in_etcd = ($0 ~ /name: "etcd"$/) }
  in_etcd && $1 == "version:" { print $2; exit }
' "$src/build/dependencies.yaml")
if [ "$etcd_version" = v ]; then
  echo "pin.sh: no etcd version in $src/build/dependencies.yaml" >&2
  exit 1
fi

staging_modules=$(sed -n 's|^\t\(k8s.io/[a-z-]*\) => ./staging/src/k8s.io/[a-z-]*$|\1|p' "$src/go.mod")
if [ -z "$staging_modules" ]; then
  echo "pin.sh: no staging replace directives in $src/go.mod" >&2
  exit 1
fi

dir=$here/releases/$version
mkdir -p "$dir"
{
  echo "module github.com/cascade-guard/cascade-guard/testbed/controlplane/releases/$version"
  echo
  echo "// Builds kube-apiserver, kube-controller-manager and kubectl of Kubernetes"
  echo "// $version from the upstream Go modules. Written by"
  echo "// testbed/controlplane/pin.sh; see testbed/controlplane/build.sh."
  echo
  echo "go $wrapper_go"
  echo
  echo "godebug $release_godebug"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  echo "// k8s.io/kubernetes replaces its staging modules with local paths, which only"
  echo "// count in its own repository; pin each to the release that matches $version."
  echo "replace ("
  for m in $staging_modules; do printf '\t%s => %s %s\n' "$m" "$m" "$staging"; done
  echo ")"
  echo
  echo "tool ("
  printf '\tk8s.io/kubernetes/cmd/%s\n' kube-apiserver kube-controller-manager kubectl
  echo ")"
} >"$dir/go.mod"
rm -f "$dir/go.sum" "$dir/etcd-version"
if ! (cd "$dir" && go mod tidy); then
  # Typically a staging module of this patch that the proxy does not serve.
  rm -rf "$dir"
  echo "pin.sh: Kubernetes $version cannot be built from the Go module proxy (above)" >&2
  exit 1
fi
echo "$etcd_version" >"$dir/etcd-version"
# When the release's own module graph pins the etcd server it names (the API
# server's storage tests run it embedded), build.sh builds etcd in this
# wrapper, with the versions kube-apiserver is built with, so that the two
# share their compiled packages: etcd becomes a tool of the wrapper.
# Otherwise etcd gets a wrapper of its own, etcd/<version>/, shared by the
# releases that name it.
etcd_in_release=0
if [ "$(cd "$dir" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3 2>/dev/null)" = "$etcd_version" ]; then
  (cd "$dir" && go get -tool go.etcd.io/etcd/server/v3@"$etcd_version" && go mod tidy)
  etcd_in_release=1
fi

etcd_dir=$here/etcd/$etcd_version
if [ "$etcd_in_release" = 0 ] && [ ! -f "$etcd_dir/go.sum" ]; then
  etcd_src=$(go mod download -json "go.etcd.io/etcd/server/v3@$etcd_version" |
    sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  etcd_go=$(awk '$1 == "go" {print $2; exit}' "$etcd_src/go.mod")
  etcd_wrapper_go=$(printf '%s\n' 1.24.0 "$etcd_go" | sort -V | tail -1)
  mkdir -p "$etcd_dir"
  {
    echo "module github.com/cascade-guard/cascade-guard/testbed/controlplane/etcd/$etcd_version"
    echo
    echo "// Builds etcd $etcd_version from the upstream Go modules. Written by"
    echo "// testbed/controlplane/pin.sh; see testbed/controlplane/build.sh."
    echo
    echo "go $etcd_wrapper_go"
    echo
    echo "godebug default=go$(echo "$etcd_go" | cut -d. -f1,2)"
    echo
    echo "require go.etcd.io/etcd/server/v3 $etcd_version"
    echo
    echo "tool go.etcd.io/etcd/server/v3"
  } >"$etcd_dir/go.mod"
  (cd "$etcd_dir" && go mod tidy)
fi
echo "pin.sh: pinned Kubernetes $version (Go $release_go, $release_godebug) with etcd $etcd_version" >&2
