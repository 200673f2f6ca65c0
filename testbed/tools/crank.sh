#!/usr/bin/env bash
# Builds crank, Crossplane's `crossplane` CLI (cmd/crank), which builds and
# pushes Crossplane packages (`xpkg build`, `xpkg push`). crank left the
# repository in v2.3, so it is pinned apart from core, at v2.2.1 in the
# wrapper module testbed/tools/crank (its packages are the ones core v2.3.4
# reads). Its dependencies are lifted to the versions core's default release
# builds with (crank/go.mod says which and why), so that built after core it
# shares core's compiled packages: 56 s of CPU instead of 225. Separate from
# ../crossplane/build.sh so that adding it rebuilds nothing else.
#
# Cached outside git (../go-install.sh), keyed by a hash of this script and the
# wrapper's go.mod and go.sum, so a warm run returns at once. Prints crank's
# path on its last line.
#
#   testbed/tools/crank.sh           build (or reuse) and print the path
#   CASCADE_GUARD_CACHE=/some/dir    where to cache (default ~/.cache/cascade-guard)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../go-install.sh"
wrapper=$here/crank
module=github.com/crossplane/crossplane/v2

build() {
  local version
  version=$(go_install_pinned "$wrapper" "$module") || return 1
  go_install_build "$1/crank" "$wrapper" "$module/cmd/crank" \
    "-s -w -X github.com/crossplane/crossplane-runtime/v2/pkg/version.version=$version"
}

bin=$(go_install_cache)/crank/$(go_install_key "$here/crank.sh" "$wrapper/go.mod" "$wrapper/go.sum")/bin
go_install "$bin" build
echo "$bin/crank"
