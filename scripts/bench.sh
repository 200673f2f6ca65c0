#!/usr/bin/env bash
# Benchmarks that print figures (recorded in BENCHMARKS.md). Each starts its own
# local control plane. Usage: scripts/bench.sh refuse|update|convert
set -euo pipefail
cd "$(dirname "$0")/.."
export LOCAL_CLUSTER_BIN_DIR=$(controlplane/build.sh)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/ {print $2}') GiB; $(date -u +%Y-%m-%d)"
cargo build --release --quiet --bins --examples
case "${1:-refuse}" in
  refuse) target/release/examples/bench-refuse ;;
  update) target/release/examples/bench-update ;;
  convert) target/release/examples/bench-convert ;;
  *) echo "unknown benchmark ${1}; known: refuse, update, convert" >&2; exit 2 ;;
esac
