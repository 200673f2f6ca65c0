#!/usr/bin/env bash
# Benchmarks that print figures (recorded in BENCHMARKS.md). Each starts its own
# local control plane. Usage: scripts/bench.sh refuse|update|convert|plan|teardown|static|static-manifests
# (refuse when none is named; help prints this). The benchmarks are the
# binaries of the crate testbed/bench (cascade-guard-bench, never published),
# run from the release build with the release build of cascade-guard beside
# them (in ${CARGO_TARGET_DIR:-target}/release).
#
#   plan     sibling order (#24): `cascade-guard plan` on a tree of 200 objects
#            (the binary's wall time, in-process, the pure graph), then the
#            controller at rest with 1,000 trees, --sibling-order off beside
#            enforce (BENCH_ONLY=plan|rest, BENCH_PLAN_RUNS, BENCH_TREES,
#            BENCH_REST_SECONDS)
#   teardown sibling order (#24): the seed's tree on real Crossplane in
#            Convert, without its hand-written Usage (sibling order) against
#            with it, pairs built and deleted side by side: each teardown, the
#            medians and their ratio (BENCH_PAIRS, default 3;
#            BENCH_LOAD_BALANCER_SECONDS; needs root: network namespaces)
#   static   convert's scale part (10,000 objects) for the release build (glibc)
#            and for the image's static musl build (scripts/image.sh binary),
#            one after the other, BENCH_ROUNDS times (default 1)
#   static-manifests   static protection (#29): how long a new annotation takes
#            to reach the static manifests file and to be refused by the API
#            server from it, BENCH_ROUNDS times (default 5) on each release of
#            BENCH_RELEASES (default "1.37 1.36"), through
#            tests/api_server/static_protection.rs (the controller is its debug build;
#            the figure is the API server's reload, not the compile)
#   BENCH_ONLY=scale refuse   the cost against the number of protected kinds
#            (BENCH_KINDS, default 10,100,500) beside no policy, the seed
#            report's own policy and the largest scale compiled a pair per kind
#            (the earlier design, by hand), in one run
#   BENCH_ONLY=alternated refuse   an allowed DELETE's admission cost with no
#            policy, the seed's and cascade-guard's (max(BENCH_KINDS) kinds),
#            sibling order's hold policy and its gate, alternated
#            BENCH_CYCLES times (default 5), as dry runs; the hold policy's
#            record holds BENCH_HOLD_ENTRIES holds, the gate's as many
#            ordered trees (default 3000)
#   BENCH_ONLY=scale-100k convert   Convert at 100,000 objects across 50 kinds
#            (BENCH_SCALE_KINDS, BENCH_SCALE_PER_KIND), each figure beside the
#            API server's own floor for the same work, in one run
#   BENCH_CONTROLLER_BIN=PATH  measure that cascade-guard binary instead
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  help | -h | --help)
    sed -n '2,/^set -euo pipefail/{/^set/d;s/^# \{0,1\}//;p}' "$0"
    exit 0
    ;;
esac
export LOCAL_CLUSTER_BIN_DIR=$(testbed/controlplane/build.sh)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/ {print $2}') GiB; $(date -u +%Y-%m-%d)"
cargo build --release --quiet -p cascade-guard -p cascade-guard-bench --bins
release=${CARGO_TARGET_DIR:-target}/release
case "${1:-refuse}" in
  refuse) "$release/bench-refuse" ;;
  update) "$release/bench-update" ;;
  convert) "$release/bench-convert" ;;
  plan) "$release/bench-plan" ;;
  teardown)
    LOCAL_CLUSTER_CROSSPLANE_BIN_DIR=$(testbed/crossplane/build.sh | tail -n 1) "$release/bench-teardown"
    ;;
  static)
    static_bin=$(scripts/image.sh binary | tail -n 1)
    for round in $(seq "${BENCH_ROUNDS:-1}"); do
      echo "--- round $round: glibc ($release/cascade-guard)"
      BENCH_ONLY=scale "$release/bench-convert"
      echo "--- round $round: musl ($static_bin)"
      BENCH_ONLY=scale BENCH_CONTROLLER_BIN=$static_bin "$release/bench-convert"
    done
    ;;
  static-manifests)
    for release in ${BENCH_RELEASES:-1.37 1.36}; do
      bin=$(testbed/controlplane/build.sh "$release" | tail -n 1)
      for round in $(seq "${BENCH_ROUNDS:-5}"); do
        LOCAL_CLUSTER_BIN_DIR=$bin cargo test --quiet -p cascade-guard --test static_protection \
          -- --nocapture --exact static_protection_holds_without_the_api_objects_and_the_controller 2>&1 |
          sed -n "s/^static: /$(basename "$(dirname "$bin")") round $round: /p"
      done
    done
    ;;
  *) echo "unknown benchmark ${1}; known: refuse, update, convert, plan, teardown, static, static-manifests (help)" >&2; exit 2 ;;
esac
