# Sourced, not run: how every script under testbed/ installs a pinned Go
# program and caches it (testbed/controlplane/build.sh,
# testbed/crossplane/build.sh and testbed/tools/*.sh). Everything is built from
# the upstream Go modules with this machine's Go toolchain and the Go module
# proxy, and cached outside git, in
# ${CASCADE_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cascade-guard}.
#
#   go_install_cache                     the cache directory
#   go_install_key [-r RECIPE] FILE...   12 hex digits of the sha256 of the
#                                        FILEs' contents ("-" is stdin), after
#                                        a line "recipe RECIPE" when given: a
#                                        cache key
#   go_install_pinned WRAPPER PACKAGE    the version WRAPPER/go.mod requires of
#                                        the module that has PACKAGE (or is it)
#   go_install DIR BUILD [ARG...]        makes DIR, a directory in the cache,
#                                        with `BUILD TMP ARG...` (see below)
#   go_install_checked CHECK DIR BUILD [ARG...]
#                                        the same, DIR complete when
#                                        `CHECK DIR` says so
#   go_install_build OUT WRAPPER PACKAGE [LDFLAGS]
#                                        builds PACKAGE into the file OUT
#   go_install_std                       compiles Go's standard library into
#                                        Go's build cache, once (see below)
#
# A script keys DIR by what its binaries are built from (go_install_key of its
# wrapper module's go.mod and go.sum, and a recipe number it bumps when the way
# it builds changes) and prints the directory it made, or a binary in it, on
# its last line. Sourcing this file also sets, for every go command of the
# script: no other toolchain than the machine's one (the only one there is
# here), module files completed rather than refused when a build needs it
# (-mod=mod), and static binaries.
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

go_install_cache() {
  echo "${CASCADE_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cascade-guard}"
}

go_install_key() {
  local recipe=
  if [ "${1:-}" = -r ]; then
    recipe=$2
    shift 2
  fi
  { [ -z "$recipe" ] || echo "recipe $recipe"; cat "$@"; } | sha256sum | cut -c1-12
}

# Read from the go.mod as written (offline: asking the go command would
# already fetch the module): the longest module path that is PACKAGE or a
# prefix of it, in a require line or block.
go_install_pinned() {
  local wrapper=$1 pkg=$2 v
  v=$(awk -v p="$pkg" '
    $1 == "require" { $0 = substr($0, index($0, $2)) }
    $2 ~ /^v[0-9]/ && (p == $1 || index(p, $1 "/") == 1) && length($1) > length(m) { m = $1; v = $2 }
    END { print v }
  ' "$wrapper/go.mod")
  if [ -z "$v" ]; then
    echo "${0##*/}: $wrapper/go.mod does not require $pkg" >&2
    return 1
  fi
  echo "$v"
}

# go_install DIR BUILD [ARG...]
# go_install_checked CHECK DIR BUILD [ARG...]
#
# Returns at once when DIR is complete: when it exists (a directory is only
# ever renamed into place whole), or, checked, when `CHECK DIR` succeeds.
# Otherwise, under the lock DIR.lock (two builds of one DIR at once, such as
# parallel test binaries, would race: the second waits for the first and then
# finds DIR complete), runs `BUILD TMP ARG...` in a fresh, empty TMP (DIR.tmp),
# then replaces DIR with TMP. Fails, leaving TMP to look at, when Go is missing
# or BUILD fails; BUILD runs where `set -e` does not stop it, so it checks what
# it runs and returns non-zero on failure.
go_install() {
  go_install_checked go_install_made "$@"
}

go_install_made() {
  [ -d "$1" ]
}

go_install_checked() {
  local check=$1 dir=$2 build=$3 lock status=0
  shift 3
  "$check" "$dir" && return 0
  if ! command -v go >/dev/null 2>&1; then
    echo "${0##*/}: Go is not installed; the test platform (testbed/) is built from source with it" >&2
    return 1
  fi
  mkdir -p "$(dirname "$dir")" || return 1
  exec {lock}>"$dir.lock" || return 1
  flock "$lock" || status=1
  if [ "$status" = 0 ] && ! "$check" "$dir"; then
    rm -rf "$dir.tmp"
    if ! mkdir -p "$dir.tmp" || ! "$build" "$dir.tmp" "$@"; then
      echo "${0##*/}: could not make $dir (what was made is in $dir.tmp)" >&2
      status=1
    else
      rm -rf "$dir"
      mv "$dir.tmp" "$dir" || status=1
    fi
  fi
  exec {lock}>&-
  return "$status"
}

# The compiler's flags for every build here and for the standard library
# ahead of them (their cache entries must match). -dwarf=false: the
# compiler leaves out the debug information that the linker's -w drops
# anyway, which is about 6 % of the compiler's CPU (Crossplane's core and
# the standard library, 277 s against 295, BENCHMARKS.md "CI"); the binaries'
# code is the same, so the caches keyed before it stay valid.
go_install_flags=(-trimpath -gcflags=all=-dwarf=false)

# go_install_build OUT WRAPPER PACKAGE [LDFLAGS]
#
# Builds the main package PACKAGE into OUT (go_install_flags, LDFLAGS default -s -w):
# inside WRAPPER, a wrapper module whose go.mod and go.sum pin every module
# the build reads; or, with WRAPPER empty, with `go install PACKAGE@VERSION`
# and that module's own requirements (OUT must then be named as go install
# names the command). The go command's output is shown only when it fails: a
# module the proxy refuses, or a build error. Prints what it builds and how
# long it took on stderr.
go_install_build() {
  local out=$1 wrapper=$2 pkg=$3 ldflags=${4:-"-s -w"} what ok=1 start=$SECONDS
  if [ -n "$wrapper" ]; then
    what="$pkg@$(go_install_pinned "$wrapper" "$pkg")" || return 1
  else
    what=$pkg
  fi
  go_install_std
  echo "${0##*/}: building $(basename "$out") ($what)" >&2
  if [ -n "$wrapper" ]; then
    (cd "$wrapper" && go build "${go_install_flags[@]}" -ldflags "$ldflags" -o "$out" "$pkg") >"$out.log" 2>&1 || ok=
  else
    GOBIN=$(dirname "$out") go install "${go_install_flags[@]}" -ldflags "$ldflags" "$pkg" >"$out.log" 2>&1 || ok=
  fi
  if [ -z "$ok" ] || [ ! -x "$out" ]; then
    cat "$out.log" >&2
    echo "${0##*/}: cannot build $what${wrapper:+ (pinned in $wrapper/go.mod)}: the Go module proxy ($(go env GOPROXY)) refused a module, or the build failed (above)" >&2
    return 1
  fi
  rm -f "$out.log"
  echo "${0##*/}: built $(basename "$out") in $((SECONDS - start))s" >&2
}

# go_install_std
#
# Compiles the standard library into Go's build cache with the flags
# go_install_build compiles with, under a lock, so that it is compiled once:
# Go's cache does not share work in flight, and scripts/test.sh starts four
# builds at once on a cold machine (etcd, Crossplane's core and function,
# Helm), each of which would compile it, about 50 s of CPU a time here
# (`go build -trimpath std`, 42 s user and 9 s system alone, before
# -dwarf=false). Cached, it takes
# under a second. A failure here is not one: the build that follows compiles
# what it needs and reports its own errors.
go_install_std() {
  local lock
  mkdir -p "$(go_install_cache)" || return 0
  exec {lock}>"$(go_install_cache)/go-std.lock" || return 0
  if flock "$lock"; then
    (cd / && go build "${go_install_flags[@]}" std) >/dev/null 2>&1 ||
      echo "${0##*/}: compiling Go's standard library ahead failed; the build compiles it" >&2
  fi
  exec {lock}>&-
  return 0
}
