#!/usr/bin/env bash
# Builds the pinned promtool (Prometheus's rule checker and tester) from the Go
# module proxy with this machine's Go toolchain, through the wrapper module in
# prometheus/ (its go.mod pins github.com/prometheus/prometheus, its go.sum
# every dependency), and puts prometheus-operator's PrometheusRule CRD, as it
# ships in that operator's module zip, beside it. For the chart's alerting
# tests (tests/prometheus_rule.rs). Cached outside git, keyed by the wrapper's
# go.mod and go.sum and this script; a warm run returns at once. Prints the
# promtool binary's path on its last line; the CRD is ../crd/ from it.
#
#   scripts/promtool.sh              build (or reuse) and print the path
#   CASCADE_GUARD_CACHE=/some/dir    where to cache (default ~/.cache/cascade-guard)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wrapper=$here/prometheus
module=github.com/prometheus/prometheus
# The operator whose CRD the rendered PrometheusRule is validated against.
operator_module=github.com/prometheus-operator/prometheus-operator
operator_version=v0.88.0
crd_file=example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml

version=$(awk -v m="$module" '$1 == "require" && $2 == m { print $3 } $1 == m { print $2 }' "$wrapper/go.mod" | head -1)
if [ -z "$version" ]; then
  echo "promtool.sh: $wrapper/go.mod does not require $module" >&2
  exit 1
fi
cache=${CASCADE_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cascade-guard}
key=$(cat "$0" "$wrapper/go.mod" "$wrapper/go.sum" | sha256sum | cut -c1-12)
dir=$cache/promtool-$version-$key
if [ -x "$dir/bin/promtool" ] && [ -f "$dir/crd/prometheusrules.yaml" ]; then
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
if [ -x "$dir/bin/promtool" ] && [ -f "$dir/crd/prometheusrules.yaml" ]; then
  echo "$dir/bin/promtool"
  exit 0
fi

# Never let the go command fetch another toolchain: only the machine's one exists here.
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
rm -rf "$dir.tmp"
mkdir -p "$dir.tmp/bin" "$dir.tmp/crd"

echo "promtool.sh: building promtool ($module $version) from the Go module proxy" >&2
start=$SECONDS
# Module v0.3xx.y is Prometheus 3.xx.y: stamp that, as Prometheus's own build does.
minor=${version#v0.3}
minor=${minor%%.*}
release=3.$((10#$minor)).${version##*.}
ldflags="-s -w -X github.com/prometheus/common/version.Version=$release"
if ! (cd "$wrapper" && go build -trimpath -ldflags "$ldflags" -o "$dir.tmp/bin/promtool" "$module/cmd/promtool"); then
  echo "promtool.sh: cannot build $module/cmd/promtool at $version (is $module $version served by $(go env GOPROXY)?)" >&2
  exit 1
fi
"$dir.tmp/bin/promtool" --version >&2
echo "promtool.sh: built promtool in $((SECONDS - start))s" >&2

# Outside the wrapper module: the operator's own requirements must not move
# promtool's dependencies.
if ! info=$(cd "$dir.tmp" && go mod download -json "$operator_module@$operator_version"); then
  echo "promtool.sh: cannot download $operator_module $operator_version from $(go env GOPROXY): $info" >&2
  exit 1
fi
operator_dir=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ ! -f "$operator_dir/$crd_file" ]; then
  echo "promtool.sh: $operator_module $operator_version has no $crd_file" >&2
  exit 1
fi
cp "$operator_dir/$crd_file" "$dir.tmp/crd/prometheusrules.yaml"

rm -rf "$dir"
mv "$dir.tmp" "$dir"
echo "$dir/bin/promtool"
