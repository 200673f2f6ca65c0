#!/usr/bin/env bash
# Builds the pinned Helm (v3) from the Go module proxy with this machine's Go
# toolchain (../go-install.sh), as the control plane is built, so that the
# chart is rendered by a known Helm everywhere (scripts/test.sh and
# scripts/render-manifest.sh). Cached outside git; a warm run returns at once.
# Prints the helm binary's path on its last line.
#
# Pinned by provider-helm's wrapper module (../crossplane/provider-helm): the
# Helm release provider-helm is built with, and every module at the version it
# is built with, so that Helm's compiled packages are the provider's. Built
# after the provider (scripts/test.sh), Helm costs little more than its link
# (its packages are 51 MB of Go, all but 0.6 MB of them the provider's);
# alone, it pinned its own release (v3.19.5), a build of its own (433 s beside
# the other builds of a cold run at 25d68de).
#
#   testbed/tools/helm.sh            install (or reuse) and print the path
#   CASCADE_GUARD_CACHE=/some/dir    where to cache (default ~/.cache/cascade-guard)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../go-install.sh"
wrapper=$here/../crossplane/provider-helm
# Bump when the way Helm is built changes, so a cached build is redone.
recipe=1

version=$(go_install_pinned "$wrapper" helm.sh/helm/v3)
client_go=$(go_install_pinned "$wrapper" k8s.io/client-go)
# What Helm's own Makefile stamps in: its version, and the Kubernetes version
# `helm template` assumes for .Capabilities (and the chart's kubeVersion check)
# when it has no cluster to ask: that of the Kubernetes libraries it is built
# with (client-go v0.N is Kubernetes 1.N). The chart has nothing specific to a
# release, and the tests apply it to the newest pinned one.
k8s_minor=$(echo "$client_go" | cut -d. -f2)
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done

build() {
  go_install_build "$1/helm" "$wrapper" helm.sh/helm/v3/cmd/helm "$ldflags" &&
    "$1/helm" version --short >&2
}

bin=$(go_install_cache)/helm-$version-$(go_install_key -r "$recipe" "$wrapper/go.mod" "$wrapper/go.sum")/bin
go_install "$bin" build
echo "$bin/helm"
