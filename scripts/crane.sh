#!/usr/bin/env bash
# Installs the pinned crane (go-containerregistry's daemonless image tool) from
# the Go module proxy with this machine's Go toolchain, the way scripts/helm.sh
# installs Helm. crane assembles cascade-guard's image (scripts/image.sh) and
# serves the loopback registry the tests push to (`crane registry serve`).
# Cached outside git; a warm run returns at once. Prints crane's path on its
# last line.
#
#   scripts/crane.sh                 install (or reuse) and print the path
#   CASCADE_GUARD_CACHE=/some/dir    where to cache (default ~/.cache/cascade-guard)
set -euo pipefail

version=v0.22.1

cache=${CASCADE_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cascade-guard}
bin="$cache/crane-$version/bin"
if [ -x "$bin/crane" ]; then
  echo "$bin/crane"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "crane.sh: Go is not installed; crane is built from source with it" >&2
  exit 1
fi

# Never let the go command fetch another toolchain: only the machine's one exists here.
export GOTOOLCHAIN=local CGO_ENABLED=0
echo "crane.sh: building crane $version from the Go module proxy" >&2
start=$SECONDS
rm -rf "$bin.tmp"
mkdir -p "$bin.tmp"
if ! GOBIN="$bin.tmp" go install -trimpath -ldflags "-s -w" \
  "github.com/google/go-containerregistry/cmd/crane@$version"; then
  echo "crane.sh: the Go module proxy refused or could not build go-containerregistry $version" >&2
  exit 1
fi
rm -rf "$bin"
mv "$bin.tmp" "$bin"
echo "crane.sh: built crane in $((SECONDS - start))s" >&2
echo "$bin/crane"
