#!/usr/bin/env bash
# Builds crank, Crossplane's `crossplane` CLI (cmd/crank), which builds and
# pushes Crossplane packages (`xpkg build`, `xpkg push`). crank left the
# repository in v2.3, so it is pinned apart from core, at v2.2.1 in the
# wrapper module crossplane/crank (its packages are the ones core v2.3.4 reads).
# Separate from build.sh so that adding it rebuilds nothing else.
#
# Cached outside git, keyed by a hash of this script and the wrapper's go.mod
# and go.sum, so a warm run returns at once. Prints crank's path on its last
# line.
#
#   crossplane/crank.sh              build (or reuse) and print the path
#   CASCADE_GUARD_CACHE=/some/dir    where to cache (default ~/.cache/cascade-guard)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${CASCADE_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cascade-guard}
module=github.com/crossplane/crossplane/v2
pkg=$module/cmd/crank

key=$(cat "$here/crank.sh" "$here/crank/go.mod" "$here/crank/go.sum" | sha256sum | cut -c1-12)
bin="$cache/crank/$key/bin"
if [ -x "$bin/crank" ]; then
  echo "$bin/crank"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "crank.sh: Go is not installed; crank is built from source with it" >&2
  exit 1
fi

# Never let the go command fetch another toolchain: only the machine's one exists here.
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

# The pinned version, read from the wrapper's go.mod as written (offline:
# asking the go command would already fetch it).
version=$(awk -v m="$module" '$1 == m {print $2} $1 == "require" && $2 == m {print $3}' \
  "$here/crank/go.mod" | head -n1)
if [ -z "$version" ]; then
  echo "crank.sh: crossplane/crank/go.mod does not require $module" >&2
  exit 1
fi

rm -rf "$bin.tmp"
mkdir -p "$bin.tmp"
if ! (cd "$here/crank" && go mod download "$module@$version") >"$bin.tmp/download.log" 2>&1; then
  cat "$bin.tmp/download.log" >&2
  echo "crank.sh: the Go module proxy refused $module $version (pinned in crossplane/crank/go.mod)" >&2
  exit 1
fi

echo "crank.sh: building crank $version ($pkg)" >&2
start=$SECONDS
if ! (cd "$here/crank" && go build -trimpath \
  -ldflags "-s -w -X github.com/crossplane/crossplane-runtime/v2/pkg/version.version=$version" \
  -o "$bin.tmp/crank" "$pkg") >"$bin.tmp/build.log" 2>&1; then
  cat "$bin.tmp/build.log" >&2
  echo "crank.sh: building crank $version failed" >&2
  exit 1
fi
rm -f "$bin.tmp/download.log" "$bin.tmp/build.log"
rm -rf "$bin"
mv "$bin.tmp" "$bin"
echo "crank.sh: built crank in $((SECONDS - start))s" >&2
echo "$bin/crank"
