#!/usr/bin/env bash
# Opt-in soak on real Crossplane: `scripts/soak.sh N` tears down N random
# trees of every shape the random-shapes test draws (the seed's
# InferenceCluster with or without its Usage, guarded by ClusterUsages,
# standalone Usages and ClusterUsages between XRs, nesting to depth 3,
# legacy claims, namespaced XRs) in rounds of SOAK_TREES_PER_ROUND (8 unless
# set). Each tree gets its own mode (Refuse, Convert, now and then Off),
# client and delay; each round one to three faults at random moments (the
# leader of two cascade-guard replicas, Crossplane core or a provider
# SIGKILLed, the API server restarted). Under Refuse and Convert every edge
# must hold, with nothing wedged or leaked; under Off the broken edges are
# printed. Prints the seed and each tree's shape, client and mode, and each
# round's faults; CASCADE_GUARD_SEED replays a run, and with it
# CASCADE_GUARD_SHAPE_FIRST_ROUND=K goes on from round K of a run cut short
# (the rounds before it are drawn, not run). Needs root (network namespaces).
# Each round takes about 3 to 4 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:?usage: scripts/soak.sh N}
per_round=${SOAK_TREES_PER_ROUND:-8}
rounds=$(( (n + per_round - 1) / per_round ))
LOCAL_CLUSTER_BIN_DIR=$(testbed/controlplane/build.sh)
LOCAL_CLUSTER_CROSSPLANE_BIN_DIR=$(testbed/crossplane/build.sh)
export LOCAL_CLUSTER_BIN_DIR LOCAL_CLUSTER_CROSSPLANE_BIN_DIR
export CASCADE_GUARD_SHAPE_ROUNDS=$rounds CASCADE_GUARD_REAL_SHAPES=$per_round
export CASCADE_GUARD_SHAPE_FAULTS=1
started=$SECONDS
cargo test --locked -p cascade-guard --test seed_real \
  shapes::random_shapes_keep_every_edge -- --exact --nocapture
first=${CASCADE_GUARD_SHAPE_FIRST_ROUND:-0}
echo "soak: $(((rounds - first) * per_round)) trees in rounds $first to $((rounds - 1)) passed in $((SECONDS - started))s"
