#!/usr/bin/env bash
# The main job: the seed's InferenceCluster, deleted with a plain
# `kubectl delete`, torn down safely by cascade-guard in Convert mode and
# followed live with `cascade-guard trace`.
#
# It starts the local control plane in the background (or reuses the running
# one), installs Crossplane's and Modelplane's CRDs, runs a model of Crossplane
# and cascade-guard, and leaves the control plane running at the end.
#
#   scripts/demo.sh                 Convert mode
#   scripts/demo.sh --mode Refuse   the plain delete is refused; foreground goes through
#   scripts/demo.sh --mode Off      without cascade-guard: the seed's failure
set -euo pipefail
cd "$(dirname "$0")/.."

bin=$(controlplane/build.sh)
export LOCAL_CLUSTER_BIN_DIR=$bin PATH="$bin:$PATH"
echo "demo: building cascade-guard"
cargo build --quiet --bins --examples
kubeconfig=$(target/debug/local-cluster up)
exec target/debug/examples/demo --kubeconfig "$kubeconfig" "$@"
