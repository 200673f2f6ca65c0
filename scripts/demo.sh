#!/usr/bin/env bash
# The main job: starts the local control plane in the background (or reuses the
# running one) and runs cascade-guard against it. Stop it with
# `cargo run -p local-cluster -- down`.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=$(controlplane/build.sh)
export LOCAL_CLUSTER_BIN_DIR=$bin PATH="$bin:$PATH"
cargo build --quiet --bins
kubeconfig=$(target/debug/local-cluster up)
export KUBECONFIG=$kubeconfig
echo "KUBECONFIG=$KUBECONFIG"
kubectl get namespaces
target/debug/cascade-guard version
