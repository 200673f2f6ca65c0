#!/usr/bin/env bash
# Builds the pinned promtool (Prometheus's rule checker and tester) from the Go
# module proxy with this machine's Go toolchain, through the wrapper module in
# prometheus/ (its go.mod pins github.com/prometheus/prometheus, its go.sum
# every dependency), and puts prometheus-operator's PrometheusRule and
# ServiceMonitor CRDs, as they ship in that operator's module zip, beside it.
# For the chart's monitoring tests (tests/prometheus_rule.rs). Cached outside
# git, promtool keyed by the wrapper's go.mod and go.sum and its build flags,
# the CRDs checked file by file (and by the operator's version), so that a
# cache without a CRD added here gets it without rebuilding promtool; a warm
# run returns at once. Prints the promtool binary's path on its last line; the
# CRDs are ../crd/ from it (prometheusrules.yaml, servicemonitors.yaml).
#
#   scripts/promtool.sh              build (or reuse) and print the path
#   CASCADE_GUARD_CACHE=/some/dir    where to cache (default ~/.cache/cascade-guard)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wrapper=$here/prometheus
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

version=$(awk -v m="$module" '$1 == "require" && $2 == m { print $3 } $1 == m { print $2 }' "$wrapper/go.mod" | head -1)
if [ -z "$version" ]; then
  echo "promtool.sh: $wrapper/go.mod does not require $module" >&2
  exit 1
fi
# Module v0.3xx.y is Prometheus 3.xx.y: stamp that, as Prometheus's own build does.
minor=${version#v0.3}
minor=${minor%%.*}
release=3.$((10#$minor)).${version##*.}
ldflags="-s -w -X github.com/prometheus/common/version.Version=$release"
build_flags=(-trimpath -ldflags "$ldflags")

cache=${CASCADE_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cascade-guard}
# What the binary is built from and how, not this whole script: changing the
# CRDs below must not rebuild promtool (545 s cold).
key=$( { printf '%s\n' "$module" "${build_flags[@]}"; cat "$wrapper/go.mod" "$wrapper/go.sum"; } | sha256sum | cut -c1-12)
dir=$cache/promtool-$version-$key
crd_stamp="$operator_module $operator_version"

crds_present() {
  local entry
  [ "$(cat "$dir/crd/operator-version" 2>/dev/null)" = "$crd_stamp" ] || return 1
  for entry in "${crd_files[@]}"; do
    [ -f "$dir/crd/${entry#*:}" ] || return 1
  done
}

if [ -x "$dir/bin/promtool" ] && crds_present; then
  echo "$dir/bin/promtool"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "promtool.sh: Go is not installed; promtool is built from source with it" >&2
  exit 1
fi

mkdir -p "$cache"
exec 9>"$dir.lock"
flock 9

# Never let the go command fetch another toolchain: only the machine's one exists here.
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

if [ ! -x "$dir/bin/promtool" ]; then
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp/bin"
  echo "promtool.sh: building promtool ($module $version) from the Go module proxy" >&2
  start=$SECONDS
  if ! (cd "$wrapper" && go build "${build_flags[@]}" -o "$dir.tmp/bin/promtool" "$module/cmd/promtool"); then
    echo "promtool.sh: cannot build $module/cmd/promtool at $version (is $module $version served by $(go env GOPROXY)?)" >&2
    exit 1
  fi
  "$dir.tmp/bin/promtool" --version >&2
  echo "promtool.sh: built promtool in $((SECONDS - start))s" >&2
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
fi

if ! crds_present; then
  rm -rf "$dir/crd.tmp"
  mkdir -p "$dir/crd.tmp"
  # Outside the wrapper module: the operator's own requirements must not move
  # promtool's dependencies.
  if ! info=$(cd "$dir/crd.tmp" && go mod download -json "$operator_module@$operator_version"); then
    echo "promtool.sh: cannot download $operator_module $operator_version from $(go env GOPROXY): $info" >&2
    exit 1
  fi
  operator_dir=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  for entry in "${crd_files[@]}"; do
    file=${entry%%:*}
    if [ ! -f "$operator_dir/$file" ]; then
      echo "promtool.sh: $operator_module $operator_version has no $file" >&2
      exit 1
    fi
    cp "$operator_dir/$file" "$dir/crd.tmp/${entry#*:}"
  done
  # Last, so that a copy cut short is never taken for a complete one.
  echo "$crd_stamp" > "$dir/crd.tmp/operator-version"
  rm -rf "$dir/crd"
  mv "$dir/crd.tmp" "$dir/crd"
fi

echo "$dir/bin/promtool"
