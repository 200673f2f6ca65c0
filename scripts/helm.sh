#!/usr/bin/env bash
# Installs the pinned Helm (v3) from the Go module proxy with this machine's Go
# toolchain, the way controlplane/build.sh builds the control plane, so that
# the chart is rendered by a known Helm everywhere (scripts/test.sh and
# scripts/render-manifest.sh). Cached outside git; a warm run returns at once.
# Prints the helm binary's path on its last line.
#
#   scripts/helm.sh                  install (or reuse) and print the path
#   CASCADE_GUARD_CACHE=/some/dir    where to cache (default ~/.cache/cascade-guard)
set -euo pipefail

# Helm 3.19 is built against the Kubernetes 1.34 libraries (its own go.mod);
# the chart it renders has nothing specific to a release, and the tests apply
# it to the newest pinned one. `go list -m -versions helm.sh/helm/v3` lists others.
version=v3.19.5
k8s_minor=34

cache=${CASCADE_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cascade-guard}
bin="$cache/helm-$version/bin"
if [ -x "$bin/helm" ]; then
  echo "$bin/helm"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "helm.sh: Go is not installed; Helm is built from source with it" >&2
  exit 1
fi

# Never let the go command fetch another toolchain: only the machine's one exists here.
export GOTOOLCHAIN=local CGO_ENABLED=0
# What Helm's own Makefile stamps in: its version, and the Kubernetes version
# `helm template` assumes for .Capabilities (and the chart's kubeVersion check)
# when it has no cluster to ask.
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done

echo "helm.sh: building helm $version from the Go module proxy" >&2
start=$SECONDS
rm -rf "$bin.tmp"
mkdir -p "$bin.tmp"
GOBIN="$bin.tmp" go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$version"
"$bin.tmp/helm" version --short >&2
rm -rf "$bin"
mv "$bin.tmp" "$bin"
echo "helm.sh: built helm in $((SECONDS - start))s" >&2
echo "$bin/helm"
