#!/usr/bin/env bash
# What cascade-guard rests on, proven against each pinned Kubernetes release:
# the deletion-semantics characterization tests, the decision table through the
# real API server (every cell, Refuse and Convert), and Convert's basic cascade
# (plain deletes become foreground cascades; a Background re-delete mid-cascade
# is converted again), and that the release type-checks cascade-guard's
# policies and its warnings reach cascade-guard's reports, and static protection
# (from 1.36; refused by name before). Prints one table, release x check, with the first failing
# line of each failure; logs are kept in target/compat/.
#
#   scripts/compat.sh                 every pinned release (testbed/controlplane/build.sh --list)
#   scripts/compat.sh 1.30 v1.37.2    only these (a minor picks its pinned release)
#   scripts/compat.sh --only decision-table,type-check 1.31
#                                     only these checks
#   scripts/compat.sh --update-readme every check on every pinned release,
#                                     and the table in README.md's
#                                     "Supported Kubernetes versions"
#                                     replaced by this run's, naming its
#                                     commit
#
# With --crossplane, the same for each pinned Crossplane core release
# (testbed/crossplane/build.sh --list), on the default Kubernetes release: the
# characterization tests on real Crossplane (tests/real_crossplane/real_crossplane.rs), the
# seed tree in each mode (Off wedges, Refuse and Convert tear down in order;
# tests/real_crossplane/seed_real.rs), Crossplane's delete of a nested XR dropped from its
# parent's Composition never refused (seed_real), the Configuration package
# route (tests/real_crossplane/package_real.rs) and a legacy XRD with a claim (in
# real_crossplane and seed_real).
#
#   scripts/compat.sh --crossplane                   every pinned release
#   scripts/compat.sh --crossplane v2.4.0 2.0        only these
#   scripts/compat.sh --crossplane --only characterization,seed-convert 2.0
#                                                    only these checks
#
# Exits non-zero when any check fails.
set -euo pipefail
cd "$(dirname "$0")/.."

crossplane=0
only=
update_readme=0
while [ $# -gt 0 ]; do
  case $1 in
  --crossplane) crossplane=1 ;;
  --update-readme) update_readme=1 ;;
  --only)
    only=$2
    shift
    ;;
  *) break ;;
  esac
  shift
done
if [ "$update_readme" = 1 ] && { [ $# -gt 0 ] || [ -n "$only" ] || [ "$crossplane" = 1 ]; }; then
  echo "compat.sh: --update-readme runs every check on every pinned Kubernetes release, with nothing else" >&2
  exit 2
fi
if [ $# -gt 0 ]; then
  versions=("$@")
elif [ "$crossplane" = 1 ]; then
  mapfile -t versions < <(testbed/crossplane/build.sh --list)
else
  mapfile -t versions < <(testbed/controlplane/build.sh --list)
fi
logs=target/compat
mkdir -p "$logs"

checks=(deletion-semantics decision-table convert-cascade type-check static-protection)
# The cargo test arguments of each check: test targets and exact test names.
check_args() {
  case $1 in
  deletion-semantics) echo "-p local-cluster --test deletion_semantics" ;;
  decision-table-refuse) echo "-p cascade-guard --test refuse -- --exact the_api_server_agrees_with_the_decision_table_in_every_cell" ;;
  decision-table-convert) echo "-p cascade-guard --test convert -- --exact the_api_server_agrees_with_the_decision_table_for_held_objects" ;;
  convert-cascade) echo "-p cascade-guard --test convert -- --exact every_client_gets_a_foreground_cascade a_background_redelete_mid_cascade_does_not_cut_it_short" ;;
  type-check) echo "-p cascade-guard --test type_check" ;;
  # From 1.36 the static manifests hold without the API's objects; before,
  # render --static and run --static-manifests-dir refuse naming 1.36.
  static-protection) echo "-p cascade-guard --test static_protection" ;;
  esac
}
# The decision table is two tests in two binaries (each binary runs its own
# control plane).
parts_of() {
  case $1 in
  decision-table) echo decision-table-refuse decision-table-convert ;;
  *) echo "$1" ;;
  esac
}

# The first line that says why a run failed: a panic's message, else a compile
# or build error, else the last line. With a test name, that test's panic.
first_failure() {
  local log=$1 test=${2:-} line
  line=$(awk -v t="$test" 'BEGIN { mine = (t == "") }
    t != "" && /^---- / { mine = (index($0, "---- " t " stdout ----") == 1); next }
    mine && /panicked at/ { getline; print; exit }' "$log")
  # A component that crashed under the test (its log printed as the test
  # failed, local-cluster's ControlPlane) says more than the test's panic.
  local crashed
  crashed=$(grep -m1 -E ' CRASHED -----$' "$log" | sed -E 's|^----- .*/logs/([^ /]*)\.log CRASHED -----$|\1|' || true)
  if [ -n "$crashed" ]; then
    line="$crashed crashed: $(grep -m1 -A1 -E ' CRASHED -----$' "$log" | tail -n1)"
  fi
  [ -n "$line" ] || line=$(grep -m1 -E '^error|^go: |\.go:[0-9]+:[0-9]+: |build.sh:.*(cannot|not|refused)|FAILED|failed' "$log" || true)
  [ -n "$line" ] || line=$(tail -n1 "$log")
  # One table cell: no pipes, no newlines, not too long.
  echo "$line" | tr '|' '/' | cut -c1-160
}

# How many tests a cargo test log says passed, over all its binaries.
passed_in() {
  awk '/^test result:/ { for (i = 1; i < NF; i++) if ($(i + 1) ~ /^passed/) n += $i } END { print n + 0 }' "$1"
}

# Runs `cargo test --locked ARGS...` into LOG (the environment is the
# caller's) and sets `outcome`: pass, or fail with the first failing line.
run_part() {
  local log=$1
  shift
  outcome=pass
  if ! cargo test --locked "$@" >"$log" 2>&1; then
    outcome="fail: $(first_failure "$log")"
  elif [ "$(passed_in "$log")" -eq 0 ]; then
    # A renamed test makes a filter match nothing, and cargo passes that.
    outcome="fail: $(basename "$log" .log) ran no test (a filter matches nothing)"
  fi
}

# One test's outcome in a log of several: pass, or fail with its first line.
test_outcome() {
  local log=$1 test=$2
  if grep -q "^test $test \.\.\. ok$" "$log"; then
    echo pass
  elif grep -q "^test $test \.\.\. FAILED$" "$log"; then
    echo "fail: $(first_failure "$log" "$test")"
  else
    echo "fail: $test did not run: $(first_failure "$log")"
  fi
}

# The table: a header cell for the rows, then each column's key in `result`.
print_table() {
  local what=$1 r line c
  shift
  printf '\n| %s | %s |\n' "$what" "$(printf '%s | ' "$@" | sed 's/ | $//')"
  printf '|---|%s\n' "$(printf -- '---|%.0s' "$@")"
  for r in "${rows[@]}"; do
    line="| $r |"
    for c in "$@"; do line+=" ${result[$r,$c]:-not run} |"; done
    echo "$line"
  done
  printf '\nchecked on %s at %s; logs in %s/\n' "$(date -u +%Y-%m-%d)" "$built_at" "$logs"
}

# The commit checked, marked when the work tree had changes.
commit() {
  local c
  c=$(git rev-parse --short HEAD 2>/dev/null) || {
    echo '?'
    return
  }
  git diff --quiet HEAD -- . 2>/dev/null || c+=" with uncommitted changes"
  echo "$c"
}

# README.md's table of Kubernetes releases, between its two markers, replaced
# by this run's (without the timings, which are the machine's, not the
# release's).
update_readme_table() {
  local block=$logs/readme-kubernetes.md
  {
    echo "Checked on $(date -u +%Y-%m-%d) at commit \`$built_at\` (\`scripts/compat.sh --update-readme\`, every"
    echo "pinned release, every check):"
    print_table Kubernetes etcd "${checks[@]}" | sed '/^checked on /d'
  } >"$block"
  python3 - "$block" <<'PY'
import re, sys
block = open(sys.argv[1]).read().strip() + "\n"
text = open("README.md").read()
begin, end = "<!-- compat-kubernetes: begin -->\n", "<!-- compat-kubernetes: end -->"
if begin not in text or end not in text:
    sys.exit("compat.sh: README.md has no compat-kubernetes markers")
head, rest = text.split(begin, 1)
_, tail = rest.split(end, 1)
open("README.md", "w").write(head + begin + block + end + tail)
PY
  echo "compat: README.md's table replaced (from $block)" >&2
}

# The checks on each Crossplane release, and the tests each runs: seed_real's
# are one run (they share one stack), each test a column of its own.
xp_checks=(characterization seed-off seed-refuse seed-convert dropped-xr package legacy-claim)
declare -A xp_test=(
  [seed-off]=without_cascade_guard_a_plain_delete_wedges_the_serving_stack_and_leaks_its_load_balancer
  [seed-refuse]=refuse_refuses_the_plain_delete_and_a_foreground_delete_tears_down_in_order
  [seed-convert]=convert_tears_a_plain_delete_down_in_order
  [legacy-claim]=deleting_a_legacy_claim_ends_gone_in_order_or_says_which_command_works
  [dropped-xr]=crossplane_deleting_a_dropped_composite_is_never_refused
)
xp_wanted() { [ -z "$only" ] || [[ ,$only, == *,$1,* ]]; }

# Each name given to --only must be one of the mode's checks (its
# arguments): a misspelt one would match nothing, run nothing and pass.
check_only() {
  local name mode=Kubernetes
  [ "$crossplane" = 0 ] || mode=Crossplane
  if [ -z "${only//,/}" ]; then
    echo "compat.sh: --only names no check (the $mode checks: $*)" >&2
    exit 2
  fi
  for name in ${only//,/ }; do
    if [[ " $* " != *" $name "* ]]; then
      echo "compat.sh: no $mode check $name (the $mode checks: $*)" >&2
      exit 2
    fi
  done
}
if [ -n "$only" ]; then
  if [ "$crossplane" = 1 ]; then
    check_only "${xp_checks[@]}"
  else
    check_only "${checks[@]}"
    wanted=()
    for check in "${checks[@]}"; do
      [[ ,$only, == *,$check,* ]] && wanted+=("$check")
    done
    checks=("${wanted[@]}")
  fi
fi

# Every check on one Crossplane release (its bin directory), into `result`.
crossplane_release() {
  local release=$1 bin=$2 check log tests=()
  LOCAL_CLUSTER_CROSSPLANE_BIN_DIR=$bin
  export LOCAL_CLUSTER_CROSSPLANE_BIN_DIR
  if xp_wanted characterization; then
    echo "compat: Crossplane $release characterization" >&2
    run_part "$logs/crossplane-$release-characterization.log" -p local-cluster --test real_crossplane
    result[$release,characterization]=$outcome
  fi
  if [[ $release == v1.* ]]; then
    # v1 has no v2 (namespaced) XRDs, which Modelplane's are: the seed trees,
    # the dropped XR and the package do not apply; of the characterization
    # tests, those of v2 XRDs say so and pass.
    [ "${result[$release,characterization]:-}" != pass ] ||
      result[$release,characterization]="pass (v1: the Usage, the legacy claim, the providers; not the 5 tests of v2 XRDs)"
    for check in seed-off seed-refuse seed-convert dropped-xr package; do
      xp_wanted "$check" && result[$release,$check]="n/a (v1: no v2 XRDs)"
    done
  else
    for check in seed-off seed-refuse seed-convert dropped-xr legacy-claim; do
      if xp_wanted "$check"; then tests+=("${xp_test[$check]}"); fi
    done
  fi
  if [ ${#tests[@]} -gt 0 ]; then
    echo "compat: Crossplane $release seed_real: ${tests[*]}" >&2
    run_part "$logs/crossplane-$release-seed.log" -p cascade-guard --test seed_real -- \
      --exact "${tests[@]}" --test-threads=16
    for check in seed-off seed-refuse seed-convert dropped-xr legacy-claim; do
      xp_wanted "$check" || continue
      result[$release,$check]=$(test_outcome "$logs/crossplane-$release-seed.log" "${xp_test[$check]}")
    done
  fi
  if xp_wanted legacy-claim; then
    # The claim's characterization test too, whatever its binary's others did.
    log=$logs/crossplane-$release-characterization.log
    if xp_wanted characterization && [ "${result[$release,legacy-claim]:-pass}" = pass ]; then
      result[$release,legacy-claim]=$(test_outcome "$log" \
        deleting_a_legacy_claim_deletes_its_xr_with_the_claims_composite_delete_policy)
    fi
  fi
  if xp_wanted package && [[ $release != v1.* ]]; then
    echo "compat: Crossplane $release package" >&2
    run_part "$logs/crossplane-$release-package.log" -p cascade-guard --test package_real
    result[$release,package]=$outcome
  fi
}

# The commit the binaries are built from: the one checked, whatever HEAD is
# when the table is printed (a commit made during a long run is not).
built_at=$(commit)
# A Cargo build shared with another checkout (CI's clone on the same machine
# shares ~/.cache's): its test binaries read that checkout's files, whose
# paths are compiled in, and Cargo takes them for fresh when this checkout's
# files are older. As scripts/test.sh does: this checkout's crates built again.
if [ -n "${CARGO_TARGET_DIR:-}" ] && [ -d "$CARGO_TARGET_DIR" ] &&
  [ "$(cat "$CARGO_TARGET_DIR/checkout" 2>/dev/null)" != "$PWD" ]; then
  find "$CARGO_TARGET_DIR" -maxdepth 5 -type d -path '*/.fingerprint/*' \
    \( -name 'cascade-guard-*' -o -name 'local-cluster-*' \) -prune -exec rm -rf {} +
  echo "$PWD" >"$CARGO_TARGET_DIR/checkout"
fi
echo "compat: building the test binaries" >&2
cargo test --workspace --locked --no-run >"$logs/cargo-build.log" 2>&1 || {
  echo "compat: the tests do not build; see $logs/cargo-build.log" >&2
  tail -n 20 "$logs/cargo-build.log" >&2
  exit 1
}

declare -A result
rows=()
failed=0

if [ "$crossplane" = 1 ]; then
  # The default Kubernetes release, and what the package and chart tests run.
  LOCAL_CLUSTER_BIN_DIR=$(testbed/controlplane/build.sh | tail -n1)
  LOCAL_CLUSTER_CRANK_BIN=$(testbed/tools/crank.sh | tail -n1)
  CRANE_BIN=$(testbed/tools/crane.sh | tail -n1)
  HELM_BIN=$(testbed/tools/helm.sh | tail -n1)
  export LOCAL_CLUSTER_BIN_DIR LOCAL_CLUSTER_CRANK_BIN CRANE_BIN HELM_BIN
  columns=()
  for check in "${xp_checks[@]}"; do xp_wanted "$check" && columns+=("$check"); done
  for v in "${versions[@]}"; do
    start=$SECONDS
    release=v${v#v}
    echo "compat: Crossplane $release build" >&2
    if out=$(testbed/crossplane/build.sh "$v" 2>"$logs/crossplane-build-$release.log"); then
      bin=$(echo "$out" | tail -n1)
      release=$(basename "$(dirname "$bin")")
      release=${release%-*}
      rows+=("$release")
      if [ -s "$logs/crossplane-build-$release.log" ]; then
        result[$release,build]="$((SECONDS - start))s"
      else
        result[$release,build]=cached
      fi
      start=$SECONDS
      crossplane_release "$release" "$bin"
      result[$release,run]="$((SECONDS - start))s"
    else
      rows+=("$release")
      result[$release,build]="fail: $(first_failure "$logs/crossplane-build-$release.log")"
    fi
    for check in build "${columns[@]}"; do
      [[ ${result[$release,$check]:-fail} != fail* ]] || failed=1
    done
  done
  print_table Crossplane build "${columns[@]}" run
  exit "$failed"
fi

for v in "${versions[@]}"; do
  start=$SECONDS
  bin=
  if out=$(testbed/controlplane/build.sh "$v" 2>"$logs/build-$v.log"); then
    bin=$(echo "$out" | tail -n1)
    release=$(basename "$(dirname "$bin")")
    release=${release%-*}
  else
    release=$v
  fi
  built=$((SECONDS - start))
  rows+=("$release")
  # build.sh prints nothing on stderr when the release was cached.
  if [ -s "$logs/build-$v.log" ]; then result[$release,build]="${built}s"; else result[$release,build]=cached; fi
  result[$release,etcd]=$(cat "testbed/controlplane/releases/$release/etcd-version" 2>/dev/null || echo "?")
  result[$release,etcd]=${result[$release,etcd]#v}
  start=$SECONDS
  for check in "${checks[@]}"; do
    if [ -z "$bin" ]; then
      if [ "$check" = "${checks[0]}" ]; then
        result[$release,$check]="fail: $(first_failure "$logs/build-$v.log")"
      else
        result[$release,$check]="not run"
      fi
      failed=1
      continue
    fi
    result[$release,$check]=pass
    for part in $(parts_of "$check"); do
      echo "compat: $release $part" >&2
      # shellcheck disable=SC2046 # check_args is a word list on purpose
      LOCAL_CLUSTER_BIN_DIR=$bin run_part "$logs/$release-$part.log" $(check_args "$part")
      if [ "$outcome" != pass ]; then
        result[$release,$check]=$outcome
        failed=1
        break
      fi
    done
  done
  result[$release,run]="$((SECONDS - start))s"
done

print_table Kubernetes etcd "${checks[@]}" build run
[ "$update_readme" = 0 ] || update_readme_table
exit "$failed"
