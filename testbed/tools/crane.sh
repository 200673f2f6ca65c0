#!/usr/bin/env bash
# Installs the pinned crane (go-containerregistry's daemonless image tool) from
# the Go module proxy with this machine's Go toolchain (../go-install.sh), as
# helm.sh installs Helm. crane assembles cascade-guard's image
# (scripts/image.sh) and serves the loopback registry the tests push to
# (`crane registry serve`). Cached outside git; a warm run returns at once.
# Prints crane's path on its last line.
#
#   testbed/tools/crane.sh           install (or reuse) and print the path
#   CASCADE_GUARD_CACHE=/some/dir    where to cache (default ~/.cache/cascade-guard)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../go-install.sh"

version=v0.22.1

build() {
  go_install_build "$1/crane" "" "github.com/google/go-containerregistry/cmd/crane@$version"
}

bin=$(go_install_cache)/crane-$version/bin
go_install "$bin" build
echo "$bin/crane"
