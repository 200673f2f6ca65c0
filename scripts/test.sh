#!/usr/bin/env bash
# Every test, from a clean clone on a fresh machine: builds the newest pinned
# control plane and real Crossplane from the upstream Go modules (cached in
# ~/.cache/cascade-guard), then checks formatting and lints, and runs the unit
# and integration tests (the integration tests start real etcd, kube-apiserver
# and kube-controller-manager, and real Crossplane with its providers), and the
# compatibility checks on the oldest supported Kubernetes release.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }
start=$SECONDS

step "control plane binaries (controlplane/build.sh)"
bin=$(controlplane/build.sh)
export LOCAL_CLUSTER_BIN_DIR=$bin
echo "$bin"

step "real Crossplane (crossplane/build.sh), for tests/real_crossplane.rs and tests/seed_real.rs"
# Crossplane core, function-patch-and-transform, provider-kubernetes and
# provider-helm, built from the Go module proxy and cached like the control
# plane; with their CRDs and webhook configurations beside them.
crossplane_bin=$(crossplane/build.sh)
export LOCAL_CLUSTER_CROSSPLANE_BIN_DIR=$crossplane_bin
echo "$crossplane_bin"

step "helm (scripts/helm.sh), for the chart tests"
# The pinned Helm, built from the Go module proxy and cached like the control
# plane; tests/install.rs renders the chart with it.
HELM_BIN=$(scripts/helm.sh)
export HELM_BIN
echo "$HELM_BIN"

step "promtool (scripts/promtool.sh), for the chart's alerts"
# The pinned promtool, built from the Go module proxy and cached like helm,
# with prometheus-operator's PrometheusRule CRD from its module zip beside it;
# tests/prometheus_rule.rs runs `promtool test rules` on the rules the chart
# renders and applies the rendered PrometheusRule against that CRD.
PROMTOOL_BIN=$(scripts/promtool.sh)
export PROMTOOL_BIN
echo "$PROMTOOL_BIN"

step "the image's static binary (scripts/image.sh binary), for tests/install.rs"
# The container image's static (musl) binary, built incrementally in
# target/image (scripts/image.sh adds the Rust musl target and Debian's
# musl-tools when they are missing, or stops with the installer's error).
# tests/install.rs pushes the image (scripts/image.sh push, with the pinned
# crane of scripts/crane.sh) to a registry on loopback (crane registry serve),
# pulls it, and runs the binary taken out of it as the chart's ServiceAccount.
scripts/image.sh binary

step "rustfmt"
cargo fmt --all -- --check

step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "tests"
cargo test --workspace --locked

step "the oldest supported Kubernetes release (scripts/compat.sh 1.30)"
# The suite above runs on the newest pinned release; the characterization
# tests, the decision table, Convert's cascade and the type check also run on
# 1.30 (built first, and cached like the newest).
# `scripts/compat.sh` with no arguments runs every pinned release.
scripts/compat.sh 1.30

step "all tests passed in $((SECONDS - start))s"
