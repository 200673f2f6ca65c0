#!/usr/bin/env bash
# The main job: the seed's InferenceCluster on real Crossplane, deleted with a
# plain `kubectl delete`, torn down safely by cascade-guard in Convert mode and
# followed live with `cascade-guard trace`.
#
# It builds the control plane and real Crossplane from the upstream Go modules
# on the first run (cached in ~/.cache/cascade-guard; see the README for how
# long), starts the local control plane with Crossplane core,
# function-patch-and-transform, provider-helm, provider-kubernetes, the local
# cloud and the seed's platform (testbed/crossplane/modelplane/) in the background, or
# reuses them, runs cascade-guard, and leaves everything running at the end.
#
#   scripts/demo.sh                 Convert mode
#   scripts/demo.sh --mode Refuse   the plain delete is refused; foreground goes through
#   scripts/demo.sh --mode Off      without cascade-guard: the seed's failure
#   scripts/demo.sh --no-usage      the tree without its hand-written Usage: plan
#                                   shows the order, and cascade-guard keeps it
#   scripts/demo.sh --no-usage --sibling-order off
#                                   the same tree, siblings deleted together: it wedges
set -euo pipefail
cd "$(dirname "$0")/.."

started=$SECONDS
step() { printf 'demo: [%4ss] %s\n' "$((SECONDS - started))" "$*"; }

step "the control plane's binaries (testbed/controlplane/build.sh; about 7 minutes the first time)"
bin=$(testbed/controlplane/build.sh)
step "real Crossplane (testbed/crossplane/build.sh; 8 to 20 minutes the first time)"
crossplane_bin=$(testbed/crossplane/build.sh)
export LOCAL_CLUSTER_BIN_DIR=$bin LOCAL_CLUSTER_CROSSPLANE_BIN_DIR=$crossplane_bin PATH="$bin:$PATH"
step "building cascade-guard (cargo; a few minutes the first time)"
cargo build --quiet --bins --examples
step "starting the control plane, then Crossplane and the seed's platform (needs root: network namespaces)"
kubeconfig=$(target/debug/local-cluster up)
target/debug/local-cluster up --crossplane --modelplane >/dev/null
step "ready"
exec target/debug/examples/demo --kubeconfig "$kubeconfig" "$@"
