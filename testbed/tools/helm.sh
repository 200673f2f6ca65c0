#!/usr/bin/env bash
# Installs the pinned Helm (v3) from the Go module proxy with this machine's Go
# toolchain (../go-install.sh), as the control plane is built, so that the
# chart is rendered by a known Helm everywhere (scripts/test.sh and
# scripts/render-manifest.sh). Cached outside git; a warm run returns at once.
# Prints the helm binary's path on its last line.
#
#   testbed/tools/helm.sh            install (or reuse) and print the path
#   CASCADE_GUARD_CACHE=/some/dir    where to cache (default ~/.cache/cascade-guard)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../go-install.sh"

# Helm 3.19 is built against the Kubernetes 1.34 libraries (its own go.mod);
# the chart it renders has nothing specific to a release, and the tests apply
# it to the newest pinned one. `go list -m -versions helm.sh/helm/v3` lists others.
version=v3.19.5
k8s_minor=34

# What Helm's own Makefile stamps in: its version, and the Kubernetes version
# `helm template` assumes for .Capabilities (and the chart's kubeVersion check)
# when it has no cluster to ask.
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done

build() {
  go_install_build "$1/helm" "" "helm.sh/helm/v3/cmd/helm@$version" "$ldflags" &&
    "$1/helm" version --short >&2
}

bin=$(go_install_cache)/helm-$version/bin
go_install "$bin" build
echo "$bin/helm"
