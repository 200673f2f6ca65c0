#!/usr/bin/env bash
# Pins one Crossplane core release for testbed/crossplane/build.sh: writes the
# wrapper module core/releases/<version>/ (go.mod and go.sum) that builds its
# cmd/crossplane, with the exact version asked for (the Go module proxy often
# refuses a module's version list but serves an exact version).
#
#   testbed/crossplane/pin.sh v2.4.0
#   testbed/crossplane/pin.sh v1.20.0     (v1 is the module path without /v2)
#
# Run once per release by a person pinning it; build.sh only reads the result.
# function-patch-and-transform and the providers are pinned once, in their own
# wrappers, and go with every core release. The wrappers pinned before
# testbed/ existed name crossplane/ in their module path and comments:
# build.sh keys its cache by their contents, so they are left as written.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=${1:-}
if ! [[ $version =~ ^v([12])\.[0-9]+\.[0-9]+$ ]]; then
  echo "usage: testbed/crossplane/pin.sh vMAJOR.MINOR.PATCH (an exact Crossplane release, v1 or v2)" >&2
  exit 2
fi
module=github.com/crossplane/crossplane
[ "${BASH_REMATCH[1]}" = 1 ] || module+=/v${BASH_REMATCH[1]}

export GOTOOLCHAIN=local GOFLAGS=-mod=mod
dir=$here/core/releases/$version
rm -rf "$dir.tmp"
mkdir -p "$dir.tmp"
cat >"$dir.tmp/go.mod" <<EOF
module github.com/cascade-guard/cascade-guard/testbed/crossplane/core/releases/$version

// Builds Crossplane core (cmd/crossplane) $version from the Go module proxy.
// Written by testbed/crossplane/pin.sh; see testbed/crossplane/build.sh.

go 1.24.0
EOF
# `go get` of the main package records every module it imports, at the
# versions the release asks for; the release's own go directive wins.
if ! (cd "$dir.tmp" && go get "$module/cmd/crossplane@$version"); then
  rm -rf "$dir.tmp"
  echo "pin.sh: Crossplane $version cannot be pinned from the Go module proxy (above)" >&2
  exit 1
fi
# A module the release replaces with a directory of its own repository
# (apis/v2 since v2.3) is built from that directory upstream; a replace counts
# only in its own module, so pin it to the same release, served on its own.
src=$(cd "$dir.tmp" && go list -m -f '{{.Dir}}' "$module")
for replaced in $(awk '$1 == "replace" && $4 ~ /^\.\// {print $2}' "$src/go.mod"); do
  if ! (cd "$dir.tmp" && go get "$replaced@$version"); then
    rm -rf "$dir.tmp"
    echo "pin.sh: Crossplane $version builds $replaced from its own repository, and the Go module proxy does not serve $replaced $version (above)" >&2
    exit 1
  fi
done
rm -rf "$dir"
mv "$dir.tmp" "$dir"
echo "pin.sh: pinned Crossplane $version ($module) in testbed/crossplane/core/releases/$version" >&2
