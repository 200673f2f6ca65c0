#!/usr/bin/env bash
# Builds the pinned promtool (Prometheus's rule checker and tester), without
# its service-discovery plugins (below), from the Go module proxy with this
# machine's Go toolchain (../go-install.sh), through the wrapper module in
# promtool/ (its go.mod pins github.com/prometheus/prometheus, its go.sum
# every dependency), and puts prometheus-operator's PrometheusRule
# and ServiceMonitor CRDs, as they ship in that operator's module zip, beside
# it. For the chart's monitoring tests (tests/api_server/prometheus_rule.rs). Cached
# outside git, promtool keyed by the wrapper's go.mod and go.sum and its build
# flags, the CRDs checked file by file (and by the operator's version), so that
# a cache without a CRD added here gets it without rebuilding promtool; a warm
# run returns at once. Prints the promtool binary's path on its last line; the
# CRDs are ../crd/ from it (prometheusrules.yaml, servicemonitors.yaml).
#
#   testbed/tools/promtool.sh        build (or reuse) and print the path
#   CASCADE_GUARD_CACHE=/some/dir    where to cache (default ~/.cache/cascade-guard)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../go-install.sh"
# Its go.mod still names scripts/promtool.sh, where this script was: the
# cache key hashes it, and a new key rebuilds promtool (about 100 s cold).
wrapper=$here/promtool
module=github.com/prometheus/prometheus
# The operator whose CRDs the chart's rendered PrometheusRule and
# ServiceMonitor are validated against: each file of its module zip, and the
# name it is copied to under crd/.
operator_module=github.com/prometheus-operator/prometheus-operator
operator_version=v0.88.0
crd_files=(
  example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml:prometheusrules.yaml
  example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml:servicemonitors.yaml
)

version=$(go_install_pinned "$wrapper" "$module")
# Module v0.3xx.y is Prometheus 3.xx.y: stamp that, as Prometheus's own build does.
minor=${version#v0.3}
minor=${minor%%.*}
release=3.$((10#$minor)).${version##*.}
ldflags="-s -w -X github.com/prometheus/common/version.Version=$release"

# Built without Prometheus's service-discovery plugins. cmd/promtool imports
# the package plugins/, generated upstream (plugins/plugins.go), which
# registers every discovery mechanism Prometheus has (AWS, Azure, GCE,
# OpenStack, Consul, Nomad, xDS and a dozen more, each with its SDK) for
# `promtool check config`. The tests run only `promtool check rules` and
# `promtool test rules` (tests/api_server/prometheus_rule.rs), which no plugin
# touches; the file and Kubernetes discoveries that promtool imports itself
# stay. Without them the cold build takes 198 s of CPU instead of 346 s, 102 s
# on two cores instead of 179 s, and the binary is 65 MiB instead of 126
# (BENCHMARKS.md "promtool"). Go refuses an -overlay of a file in the module
# cache, so the build reads the pinned module unpacked into a temporary
# directory, that one file emptied, through a copy of the wrapper whose go.mod
# replaces the module with it. Nothing else of Prometheus changes, and the
# copy is removed after the build.
sd_plugins=none

# What the binary is built from and how (go_install_build's flags), not this
# whole script: changing the CRDs below must not rebuild promtool.
key=$(printf '%s\n' "$module" -trimpath -ldflags "$ldflags" "sd-plugins $sd_plugins" |
  go_install_key - "$wrapper/go.mod" "$wrapper/go.sum")
dir=$(go_install_cache)/promtool-$version-$key
crd_stamp="$operator_module $operator_version"

# module_dir WHERE MODULE VERSION: downloads the module's zip into the module
# cache and prints where it is unpacked. Run in WHERE, outside the wrapper
# module, so that nothing it requires moves promtool's dependencies.
module_dir() {
  local info
  if ! info=$(cd "$1" && go mod download -json "$2@$3"); then
    echo "promtool.sh: cannot download $2 $3 from $(go env GOPROXY): $info" >&2
    return 1
  fi
  printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

build_promtool() {
  local out=$1 work status=0
  work=$(mktemp -d) || return 1
  promtool_without_sd_plugins "$out" "$work" || status=1
  rm -rf "$work"
  return "$status"
}

promtool_without_sd_plugins() {
  local out=$1 work=$2 source
  source=$(module_dir "$work" "$module" "$version") || return 1
  if [ ! -f "$source/plugins/plugins.go" ]; then
    echo "promtool.sh: $module $version has no plugins/plugins.go: see sd_plugins in $0" >&2
    return 1
  fi
  cp -r "$source" "$work/prometheus" && chmod -R u+w "$work/prometheus" || return 1
  printf '%s\n' "// Emptied by cascade-guard's testbed/tools/promtool.sh: no service-discovery plugin." \
    "package plugins" >"$work/prometheus/plugins/plugins.go" || return 1
  mkdir "$work/wrapper" && cp "$wrapper/go.mod" "$wrapper/go.sum" "$work/wrapper/" || return 1
  (cd "$work/wrapper" && go mod edit -replace "$module=$work/prometheus") || return 1
  go_install_build "$out/promtool" "$work/wrapper" "$module/cmd/promtool" "$ldflags" &&
    "$out/promtool" --version >&2
}

# Whether a crd/ directory has every file above, of this operator version.
crds_present() {
  local entry
  [ "$(cat "$1/operator-version" 2>/dev/null)" = "$crd_stamp" ] || return 1
  for entry in "${crd_files[@]}"; do
    [ -f "$1/${entry#*:}" ] || return 1
  done
}

fetch_crds() {
  local tmp=$1 operator_dir entry file
  operator_dir=$(module_dir "$tmp" "$operator_module" "$operator_version") || return 1
  for entry in "${crd_files[@]}"; do
    file=${entry%%:*}
    if [ ! -f "$operator_dir/$file" ]; then
      echo "promtool.sh: $operator_module $operator_version has no $file" >&2
      return 1
    fi
    cp "$operator_dir/$file" "$tmp/${entry#*:}" || return 1
  done
  # Last, so that a copy cut short is never taken for a complete one.
  echo "$crd_stamp" >"$tmp/operator-version"
}

go_install "$dir/bin" build_promtool
go_install_checked crds_present "$dir/crd" fetch_crds
echo "$dir/bin/promtool"
