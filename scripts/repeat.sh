#!/usr/bin/env bash
# One test, run again and again on one pinned Kubernetes release, two at once
# (each on its own control plane), to tell a rare failure from a fixed one:
#
#   scripts/repeat.sh RELEASE PAIRS CARGO_TEST_ARGS...
#   scripts/repeat.sh v1.32.9 50 -p cascade-guard --test refuse -- --exact \
#     the_api_server_agrees_with_the_decision_table_in_every_cell
#
# Prints how many runs passed and failed, and in how many a control-plane
# component crashed (local-cluster prints a crash's own lines when a test
# fails: `... CRASHED -----`), with the first line of each crash. Logs are
# kept in target/repeat/. The release is built first when it is not cached.
# BENCHMARKS.md "kube-apiserver's crash on 1.30 to 1.35" has what it showed.
set -euo pipefail
cd "$(dirname "$0")/.."
release=${1:?usage: scripts/repeat.sh RELEASE PAIRS CARGO_TEST_ARGS...}
pairs=${2:?usage: scripts/repeat.sh RELEASE PAIRS CARGO_TEST_ARGS...}
shift 2
[ $# -gt 0 ] || {
  echo "repeat.sh: name the test: cargo test arguments after PAIRS" >&2
  exit 2
}
LOCAL_CLUSTER_BIN_DIR=$(testbed/controlplane/build.sh "$release" | tail -n1)
export LOCAL_CLUSTER_BIN_DIR
logs=target/repeat
rm -rf "$logs"
mkdir -p "$logs"
# The build takes the arguments before the test binary's (`--`).
build=()
for arg in "$@"; do
  [ "$arg" != -- ] || break
  build+=("$arg")
done
cargo test --locked --no-run "${build[@]}" >"$logs/build.log" 2>&1 || {
  tail -n 20 "$logs/build.log" >&2
  exit 1
}
started=$SECONDS
for i in $(seq 1 "$pairs"); do
  cargo test --locked "$@" >"$logs/$i-a.log" 2>&1 &
  cargo test --locked "$@" >"$logs/$i-b.log" 2>&1 || true
  wait || true
done
runs=$((pairs * 2))
passed=$(grep -l '^test result: ok' "$logs"/*-?.log | wc -l || true)
crashed=$(grep -l ' CRASHED -----$' "$logs"/*-?.log | wc -l || true)
echo "repeat: $runs runs on $release in $((SECONDS - started))s: $passed passed, $((runs - passed)) failed, a component crashed in $crashed"
if [ "$crashed" -gt 0 ]; then
  grep -h -A1 ' CRASHED -----$' "$logs"/*-?.log | grep -v -e ' CRASHED -----$' -e '^--$' | sort | uniq -c
fi
[ "$passed" = "$runs" ]
