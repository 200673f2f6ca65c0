#!/usr/bin/env bash
# Opt-in soak on real Crossplane: `scripts/soak.sh N` tears down N random
# InferenceCluster trees in rounds (SOAK_TREES_PER_ROUND at once, 8 unless
# set), each round one random mode (Off, Refuse or Convert), random clients
# and delays, and zero to three faults at random moments (the leader of two
# cascade-guard replicas, Crossplane core or a provider SIGKILLed, the API
# server restarted). Under Refuse and Convert every edge must hold, with
# nothing wedged or leaked; under Off the broken edges are printed. Prints the
# seed and each tree's shape, client and faults; CASCADE_GUARD_SEED replays a
# run. Needs root (network namespaces). Each round takes about 4 to 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:?usage: scripts/soak.sh N}
per_round=${SOAK_TREES_PER_ROUND:-8}
rounds=$(( (n + per_round - 1) / per_round ))
LOCAL_CLUSTER_BIN_DIR=$(testbed/controlplane/build.sh)
LOCAL_CLUSTER_CROSSPLANE_BIN_DIR=$(testbed/crossplane/build.sh)
export LOCAL_CLUSTER_BIN_DIR LOCAL_CLUSTER_CROSSPLANE_BIN_DIR
export CASCADE_GUARD_REAL_ROUNDS=$rounds CASCADE_GUARD_REAL_TREES=$per_round
started=$SECONDS
cargo test --locked -p cascade-guard --test seed_real \
  random_trees_clients_and_kills_never_lose_a_cluster_first -- --nocapture
echo "soak: $((rounds * per_round)) trees in $rounds rounds passed in $((SECONDS - started))s"
