#!/usr/bin/env bash
# Every test, from a clean clone on a fresh machine: builds the newest pinned
# control plane and real Crossplane from the upstream Go modules (cached in
# ~/.cache/cascade-guard), then checks formatting and lints, and runs the unit
# and integration tests (the integration tests start real etcd, kube-apiserver
# and kube-controller-manager, and real Crossplane with its providers), and the
# compatibility checks on the other pinned Kubernetes releases and the oldest
# supported Crossplane release (a machine whose cache was empty leaves those
# out and names them, with the command that checks each).
set -euo pipefail
cd "$(dirname "$0")/.."

# The oldest Crossplane v2 release that passes every check of
# scripts/compat.sh --crossplane (README "Supported Crossplane releases"; v2.0
# and v2.1 delete a dropped nested XR without a policy, which Refuse refuses);
# CI runs it beside the default.
oldest_crossplane=v2.2.1

# Each step's time, printed at the end (BENCHMARKS.md "CI" records them).
timings=()
current=""
step_start=$SECONDS
left_out=()
# The time of each step, also when one fails.
print_timings() {
  end_step
  current=""
  printf '\n==> time by step\n'
  printf '%s\n' "${timings[@]}"
  print_cpu_use
}
# Where the two cores went over the whole run (scripts/cpu-use.py): by test
# binary, what each started included. When they are busy throughout, only
# less work makes a run shorter, and this says which.
cpu_use_pid=
cpu_use=target/cpu-use.json
print_cpu_use() {
  [ -n "$cpu_use_pid" ] || return 0
  kill -TERM "$cpu_use_pid" 2>/dev/null || true
  wait "$cpu_use_pid" 2>/dev/null || true
  cpu_use_pid=
  printf '\n==> CPU by test binary (seconds; scripts/cpu-use.py report %s)\n' "$cpu_use"
  python3 scripts/cpu-use.py report "$cpu_use" || true
}
# And no build left running in the background when a step fails.
on_exit() {
  print_timings
  local pid
  for pid in $(jobs -p); do
    pkill -TERM -P "$pid" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
  done
}
trap on_exit EXIT
end_step() {
  if [ -n "$current" ]; then
    timings+=("$(printf '%6ds  %s' $((SECONDS - step_start)) "$current")")
  fi
}
step() {
  end_step
  current=$*
  step_start=$SECONDS
  printf '\n==> %s\n' "$*"
}
# Cargo's defaults: the tests' and clippy's builds (the dev profile) are
# incremental, the image's (release) is not. Every run builds the workspace's
# own crates again (a fresh clone's files are all newer than the last build);
# incremental, that costs 34 s of CPU instead of 126 when little changed (a
# fresh clone of the same commit, 2026-12-07), for about 2 GB of cache in
# Cargo's build. A release build gained nothing from it (94 s against 99).
cache=${XDG_CACHE_HOME:-$HOME/.cache}
# Cargo's build outside the clone, like the Go builds: CI runs a fresh clone
# each time, and with target/ in it every run compiled the whole dependency
# tree again, three times (tests, clippy, the static image). Cargo names a
# workspace crate's artifacts by its path inside the workspace, so another
# clone of the same code, anywhere, overwrites the same files and only
# rebuilds the workspace's own crates. Logs stay in the clone's target/.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$cache/cascade-guard/cargo-target}
# But Cargo takes a workspace crate for fresh when its files are older than
# its build, wherever they are: a checkout whose files are older than a build
# from another one (a second worktree; CI's clone on the same machine) would
# run test binaries that read the other checkout's files, whose paths are
# compiled in. When the checkout changes, its own crates are built again.
checkout_stamp=$CARGO_TARGET_DIR/checkout
if [ "$(cat "$checkout_stamp" 2>/dev/null)" != "$PWD" ] && [ -d "$CARGO_TARGET_DIR" ]; then
  find "$CARGO_TARGET_DIR" -maxdepth 5 -type d -path '*/.fingerprint/*' \
    \( -name 'cascade-guard-*' -o -name 'local-cluster-*' \) -prune -exec rm -rf {} +
fi
mkdir -p "$CARGO_TARGET_DIR" && echo "$PWD" >"$checkout_stamp"
# The Go programs of the test stacks (etcd, kube-apiserver, Crossplane, the
# providers) and Go's compiler spend much of two cores on garbage collection:
# collecting less often trades memory (24 GB here) for CPU.
export GOGC=${GOGC:-400}
start=$SECONDS
mkdir -p target
python3 scripts/cpu-use.py record "$cpu_use" &
cpu_use_pid=$!

step "the repository stands alone"
# A clone must run everything with nothing beside it: no file may read or
# cite a folder outside the repository (the project's data is in testdata/,
# the facts its comments cite in docs/).
outside='\.\./(\.\./)*shared/|shared/(fixtures|research|seed)'
if git rev-parse --git-dir >/dev/null 2>&1; then
  found=$(git grep -nIE "$outside" -- . ':!scripts/test.sh' || true)
else
  found=$(grep -rnIE "$outside" --exclude-dir=target --exclude-dir=.git --exclude=test.sh . || true)
fi
if [ -n "$found" ]; then
  echo "these lines reach outside the repository:" >&2
  echo "$found" >&2
  exit 1
fi
echo "nothing reads or names a folder beside the repository"

step "free disk space"
# A full disk shows up far from its cause (CI once saw the linker die with a
# bus error): say it first. A warm run writes a few gigabytes (the test
# binaries, the control planes' logs); a cold one adds the Go build cache of
# every release it builds.
free_gb() { df -Pk "$1" | awk 'NR == 2 { print int($4 / 1048576) }'; }
mkdir -p "$cache"
# Cargo's shared build only grows (each toolchain and lock file adds its
# artifacts): past 30 GB it starts again, at the cost of one cold Rust build.
if [ -d "$CARGO_TARGET_DIR" ]; then
  used_gb=$(du -sk "$CARGO_TARGET_DIR" | awk '{ print int($1 / 1048576) }')
  echo "$used_gb GB in Cargo's build ($CARGO_TARGET_DIR)"
  if [ "$used_gb" -gt 30 ]; then
    echo "over 30 GB: removed, built again below"
    rm -rf "$CARGO_TARGET_DIR"
  fi
fi
for place in . "$cache"; do
  gb=$(free_gb "$place")
  echo "$gb GB free where $place is"
  if [ "$gb" -lt 4 ]; then
    echo "only $gb GB free where $place is: a run needs more; the largest users are" \
      "$CARGO_TARGET_DIR, target/, $(go env GOCACHE 2>/dev/null || echo "Go's build cache") (go clean -cache)" \
      "and $cache/cascade-guard" >&2
    exit 1
  elif [ "$gb" -lt 20 ]; then
    echo "warning: a cold run may need up to 20 GB here" >&2
  fi
done

step "the Rust builds (the tests', clippy's and the image's static binary), started in the background"
# On a cold machine the Go builds below leave part of the two cores idle
# (module downloads, one linker at a time): the Rust builds run beside them.
# The steps "clippy" and "the tests' build" below run the same commands
# again, which then only confirm the result and show it.
#
# The container image's static (musl) binary is built in image/ under
# CARGO_TARGET_DIR, or kept when it was built from the same inputs (the
# product's sources, the manifests, the toolchain; scripts/image.sh, which
# adds the Rust musl target and Debian's musl-tools when they are missing, or
# stops with the installer's error). tests/api_server/install.rs pushes the image
# (scripts/image.sh push, with the pinned crane of testbed/tools/crane.sh) to a
# registry on loopback (crane registry serve), pulls it, and runs the binary
# taken out of it as the chart's ServiceAccount. The tests wait for it: built
# beside them (a warm run at f8700e9, 471 s to build) the real-Crossplane
# suite, the run's long pole, took 961 s against 787 the run before; at the
# lowest priority beside them (a cold run at 4083d61) it had hardly begun its
# dependencies when the tests were done, and install.rs waited for it.
mkdir -p target
rust_log=target/rust-build.log
(cargo fetch --locked &&
  cargo test --workspace --locked --no-run &&
  cargo clippy --workspace --all-targets --locked -- -D warnings) >"$rust_log" 2>&1 &
rust_pid=$!
image_log=target/image-build.log
scripts/image.sh binary >"$image_log" 2>&1 &
image_pid=$!
echo "logs: $rust_log, $image_log"

step "the Go builds of real Crossplane, crank, crane and Helm, and promtool: started in the background"
# Go builds run beside the control plane's below and the Rust builds above:
# one after another, a cold run's builds left a quarter of the two cores idle
# (module downloads, one linker at a time; 2,694 s of CPU in 1,774 s at
# b4fabbe, BENCHMARKS.md "CI"). At once (4083d61) they left none, but cost a
# sixth more CPU: the tests started at 1,742 s against 1,780. Kept for Helm
# and promtool, which no longer build beside the tests. Each is cached like
# the control plane; a warm run finds them all at once.
#
# Crossplane core, function-patch-and-transform, provider-kubernetes and
# provider-helm (for tests/real_crossplane/real_crossplane.rs and
# tests/real_crossplane/seed_real.rs), with their CRDs and webhook
# configurations beside them; then crank (Crossplane's CLI, v2.2.1), which
# builds and pushes the Configuration package, after core, whose compiled
# packages it shares (testbed/tools/crank/go.mod), and crane, which serves the OCI
# registry on loopback that Crossplane installs it from (for
# tests/real_crossplane/package_real.rs); then the pinned Helm
# (tests/api_server/install.rs and tests/without_cluster/chart.rs render the
# chart with it), after provider-helm, whose compiled packages it shares
# (testbed/tools/helm.sh): built beside it, it compiled them again.
crossplane_log=target/crossplane-build.log
crossplane_paths=target/crossplane-build.paths
# Made once Crossplane's builds have succeeded: promtool waits for it, or for
# the chain's end when they fail.
crossplane_built=target/crossplane-build.over
rm -f "$crossplane_built"
(
  testbed/crossplane/build.sh >"$crossplane_paths" && touch "$crossplane_built" &&
    testbed/tools/crank.sh >>"$crossplane_paths" &&
    testbed/tools/crane.sh >>"$crossplane_paths" &&
    testbed/tools/helm.sh >&2
) 2>"$crossplane_log" &
crossplane_pid=$!
# promtool, with prometheus-operator's PrometheusRule CRD from its module zip
# beside it (tests/api_server/prometheus_rule.rs runs `promtool test rules` on
# the rules the chart renders and applies the rendered PrometheusRule against
# that CRD). Only the test binaries that need it wait for it (TEST_LAST
# below): each runs the same script, which waits under its lock for the build
# to finish; the tests' step waits for this job at its end. It starts when
# Crossplane's builds are over: its dependencies are at core's versions
# (testbed/tools/promtool/go.mod), so that built after core it compiles 51 s
# of CPU instead of 165; built beside it, it would compile them again.
tools_log=target/tools-build.log
(
  tools_start=$SECONDS
  while [ ! -e "$crossplane_built" ] && kill -0 "$crossplane_pid" 2>/dev/null; do sleep 2; done
  echo "promtool started $((SECONDS - tools_start))s in, after Crossplane's builds"
  testbed/tools/promtool.sh &&
    echo "promtool ready in $((SECONDS - tools_start))s (in the background)"
) >"$tools_log" 2>&1 &
tools_pid=$!
echo "logs: $crossplane_log, $tools_log"

step "control plane binaries (testbed/controlplane/build.sh)"
# Its kubectl also runs cascade-guard as a plugin
# (tests/without_cluster/kubectl_plugin.rs, which fails without it).
bin=$(testbed/controlplane/build.sh)
export LOCAL_CLUSTER_BIN_DIR=$bin
echo "$bin"

step "real Crossplane (testbed/crossplane/build.sh), crank (testbed/tools/crank.sh), crane (testbed/tools/crane.sh) and Helm (testbed/tools/helm.sh), waited for"
crossplane_ok=1
wait "$crossplane_pid" || crossplane_ok=0
cat "$crossplane_log"
mapfile -t built < "$crossplane_paths"
if [ "$crossplane_ok" = 0 ] || [ ${#built[@]} -ne 3 ]; then
  echo "testbed/crossplane/build.sh, testbed/tools/crank.sh, testbed/tools/crane.sh or testbed/tools/helm.sh failed (their output is above)" >&2
  exit 1
fi
export LOCAL_CLUSTER_CROSSPLANE_BIN_DIR=${built[0]} LOCAL_CLUSTER_CRANK_BIN=${built[1]} CRANE_BIN=${built[2]}
printf '%s\n' "${built[@]}"

step "Graphviz's dot (testbed/tools/graphviz.sh), for tests/without_cluster/plan_picture.rs"
# Debian's graphviz, installed when missing: the test has dot read every
# picture of `plan -o dot`, and fails without it.
GRAPHVIZ_DOT=$(testbed/tools/graphviz.sh | tail -n1)
export GRAPHVIZ_DOT
echo "$GRAPHVIZ_DOT"

step "zsh and fish (testbed/tools/shells.sh), for tests/without_cluster/completion.rs"
# Debian's, installed when missing: the test parses their completion scripts
# with them (bash's it drives), and says it skipped a shell still missing.
testbed/tools/shells.sh

step "the other pinned Kubernetes releases (testbed/controlplane/build.sh) and the oldest Crossplane (testbed/crossplane/build.sh), for the compatibility checks"
# The suite runs on the newest release; every compatibility check on the
# oldest; the decision table (Refuse and Convert, every cell through the real
# API server) on each release between them: beside the tests below. Each
# release is cached like the newest. A release that is not cached yet costs 4
# to 10 minutes of Go builds on two cores, and its checks keep the two cores
# busy beside the suite: on a machine whose cache was empty (the builds above
# took more than five minutes) every release other than the newest, and the
# oldest Crossplane, is left out, each named with the command that checks it,
# so that a cold run stays inside 40 minutes (BENCHMARKS.md "CI");
# CASCADE_GUARD_ALL_RELEASES=1 builds them anyway. A warm run (CI's) builds
# at most CASCADE_GUARD_BUILD_AT_MOST (2) that are missing, oldest first, and
# leaves the rest out, named: the run after a cold one would otherwise build
# seven releases, over an hour, and outlast CI's 90 minutes. Each later run
# builds two more, until every release is cached and checked.
mapfile -t pinned < <(testbed/controlplane/build.sh --list)
oldest_kubernetes=${pinned[0]}
# Decided once, before any of them.
cold_cache=0
[ $((SECONDS - start)) -le 300 ] || cold_cache=1
build_budget=${CASCADE_GUARD_BUILD_AT_MOST:-2}
[ "$cold_cache" = 0 ] || build_budget=0
[ "${CASCADE_GUARD_ALL_RELEASES:-0}" != 1 ] || build_budget=1000
# Whether to build a missing release, or leave it out (and `why`, the true
# reason: the cold machine, or the build budget). Called directly, not in a
# subshell: it counts down the budget.
why=
may_build() {
  if [ "$build_budget" -gt 0 ]; then
    build_budget=$((build_budget - 1))
    return 0
  fi
  if [ "$cold_cache" = 1 ]; then
    why="not cached on a cold machine: the builds above took over 300 s; CASCADE_GUARD_ALL_RELEASES=1 builds it"
  else
    why="not cached, over the build budget: this run builds at most CASCADE_GUARD_BUILD_AT_MOST=${CASCADE_GUARD_BUILD_AT_MOST:-2} missing releases"
  fi
  return 1
}
oldest_built=
between=()
for release in "${pinned[@]:0:${#pinned[@]}-1}"; do
  if testbed/controlplane/build.sh --cached "$release" >/dev/null || may_build; then
    testbed/controlplane/build.sh "$release" | tail -n1
    if [ "$release" = "$oldest_kubernetes" ]; then oldest_built=$release; else between+=("$release"); fi
  else
    if [ "$release" = "$oldest_kubernetes" ]; then
      check="scripts/compat.sh $release checks it"
    else
      check="scripts/compat.sh --only decision-table $release checks it"
    fi
    echo "LEFT OUT: Kubernetes $release ($why): not checked in this run; $check"
    left_out+=("Kubernetes $release ($why; $check)")
  fi
done
# The oldest supported Crossplane v2 release likewise: only its core is built
# (the function and the providers are shared, and cached); a cold run leaves
# its checks out (its core's build, about five minutes of Go on two cores, and
# its checks', four minutes of CPU beside the suite).
oldest_crossplane_built=
if testbed/crossplane/build.sh --cached "$oldest_crossplane" >/dev/null 2>&1 || may_build; then
  testbed/crossplane/build.sh "$oldest_crossplane" | tail -n1
  oldest_crossplane_built=$oldest_crossplane
else
  check="scripts/compat.sh --crossplane --only characterization,seed-convert $oldest_crossplane checks it"
  echo "LEFT OUT: Crossplane $oldest_crossplane ($why): not checked in this run; $check"
  left_out+=("Crossplane $oldest_crossplane ($why; $check)")
fi

step "the Rust builds started above, waited for"
# Their result is what the next steps show: a failure here is reported there.
wait "$rust_pid" || echo "the background Rust build stopped early; the steps below show why (its log: $rust_log)"

step "rustfmt"
cargo fmt --all -- --check

step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "the policy crate stays pure"
# The domain may not grow I/O: no Kubernetes client, async runtime or network
# library among cascade-guard-policy's dependencies, however indirect.
impure=$(cargo tree -p cascade-guard-policy -e normal --prefix none --locked |
  grep -E '^(kube-client|kube-runtime|kube |tokio|hyper|reqwest|tower|mio|rustls|openssl) ' || true)
if [ -n "$impure" ]; then
  echo "cascade-guard-policy depends on I/O crates:" >&2
  echo "$impure" >&2
  exit 1
fi
echo "cascade-guard-policy: no kube client, tokio, hyper or TLS"

step "no module under cli/ imports controller/"
# The commands read and write a cluster through cluster/ (Convert, which
# uninstall runs, included); the controller's wiring is not theirs to reach
# into. Any path to the controller in a use (grouped or not) or in code.
python3 - crates/cascade-guard/src/cli <<'PY'
import pathlib, re, sys
found = []
for path in sorted(pathlib.Path(sys.argv[1]).rglob("*.rs")):
    text = path.read_text(encoding="utf-8")
    code = re.sub(r"//[^\n]*", lambda m: " " * len(m.group(0)), text)
    spans = [m.span() for m in re.finditer(r"\buse\s[^;]*;", code) if re.search(r"\bcontroller\b", m.group(0))]
    spans += [m.span() for m in re.finditer(r"\b(crate|super|cascade_guard)(::super)*::controller\b", code)]
    for line in sorted({text.count("\n", 0, start) for start, _ in spans}):
        found.append(f"{path}:{line + 1}: {text.splitlines()[line].strip()}")
if found:
    print("modules under cli/ import controller/ (use cluster/ or the policy crate):", file=sys.stderr)
    print("\n".join(found), file=sys.stderr)
    sys.exit(1)
print("cli/: no import of controller/")
PY

step "sizes: no file over 700 lines, no function over 120 outside the tests (issue #47)"
scripts/sizes.sh

step "the tests' build"
cargo test --workspace --locked --no-run

step "the image's static binary, waited for"
if wait "$image_pid"; then
  cat "$image_log"
else
  cat "$image_log" >&2
  echo "scripts/image.sh binary failed (its output is above)" >&2
  exit 1
fi

step "tests, and every pinned Kubernetes release and the oldest Crossplane release (scripts/compat.sh) beside the slowest"
# Every test binary once (scripts/run-test-binaries.sh):
# tests/real_crossplane/seed_real.rs, which mostly waits on real Crossplane's
# timers, in the background while the others run in turn (two or three at
# a time once the background jobs end or the cores idle); beside them from
# the start (they too wait on control planes and Crossplane's timers more than
# on the CPU), on the oldest supported Crossplane v2 release its
# characterization tests and the seed tree under Convert, then every
# compatibility check on the oldest Kubernetes release, then the decision
# table on each release between it and the newest (every run goes on,
# whichever fails); each of them only if built above. The tests that need Helm and promtool run last.
# `scripts/compat.sh` with no arguments runs every check on every pinned
# Kubernetes release, `scripts/compat.sh --crossplane` every Crossplane one.
# The oldest Crossplane's checks first, the decision tables last: the
# Crossplane ones mostly wait on Crossplane's timers and lose little to the
# busy cores of the run's first ten minutes; the decision tables are short
# and busy, and fill the cores the other tests leave at the end (last, the
# Crossplane checks ran alone for the run's final 90 s, the cores 56 to 80 %
# idle; a warm run at cd5b09c, BENCHMARKS.md "CI").
beside="status=0"
if [ -n "$oldest_crossplane_built" ]; then
  beside+="
scripts/compat.sh --crossplane --only characterization,seed-convert $oldest_crossplane_built || status=1"
fi
if [ -n "$oldest_built" ]; then
  beside+="
scripts/compat.sh $oldest_built || status=1"
fi
if [ ${#between[@]} -gt 0 ]; then
  beside+="
scripts/compat.sh --only decision-table ${between[*]} || status=1"
fi
beside+="
exit \$status"
tests=0
# The logs newer than this are this run's (skipped tests are counted from them).
tests_began=target/tests-began
touch "$tests_began"
# The two real-Crossplane binaries beside seed_real (80 to 100 s, mostly
# waiting on Crossplane) run first: last, one of them ran alone for the run's
# final 80 s with half of the two cores idle (CI at 9c62760). Then the other
# long ones, longest first (their times in a warm run at feff554), so that
# the run's tail, when two or three lanes run at once, is made of short
# ones: in Cargo's order sibling_order (165 s) started 560 s in and ended
# last but the three that wait for Helm and promtool.
TEST_FIRST="real_crossplane package_real recovery sibling_order restarts seed held refuse deletion_semantics" \
  TEST_LAST="chart install prometheus_rule" \
  scripts/run-test-binaries.sh --beside "$beside" || tests=$?
# The test that needed promtool waited for it; a failed build shows in it
# too, and here with its log.
if ! wait "$tools_pid"; then
  cat "$tools_log" >&2
  echo "testbed/tools/promtool.sh failed (its output is above)" >&2
  exit 1
fi
tail -n1 "$tools_log"
[ "$tests" = 0 ] || exit "$tests"

end_step
current=""
# What passed without being checked, said with the pass: each test that
# reported itself skipped (crates/local-cluster/src/skip.rs's line, in this run's logs of
# the tests and of the compatibility checks), and each release left out,
# with its reason.
mapfile -t skipped < <(find target/test-logs target/compat -name '*.log' -newer "$tests_began" \
  -exec grep -Ho 'cascade-guard-test: SKIPPED .*' {} + 2>/dev/null |
  sed 's/^\([^:]*\):cascade-guard-test: SKIPPED \(.*\)$/\2 (log: \1)/' | sort)
if [ ${#skipped[@]} -eq 0 ] && [ ${#left_out[@]} -eq 0 ]; then
  printf '\n==> all tests passed in %ss\n' "$((SECONDS - start))"
else
  printf '\n==> all tests that ran passed in %ss; tests skipped: %d, releases left out: %d\n' \
    "$((SECONDS - start))" "${#skipped[@]}" "${#left_out[@]}"
  for s in "${skipped[@]}"; do printf '==>   skipped: %s\n' "$s"; done
  for l in "${left_out[@]}"; do printf '==>   left out: %s\n' "$l"; done
fi
