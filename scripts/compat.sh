#!/usr/bin/env bash
# What cascade-guard rests on, proven against each pinned Kubernetes release:
# the deletion-semantics characterization tests, the decision table through the
# real API server (every cell, Refuse and Convert), and Convert's basic cascade
# (plain deletes become foreground cascades; a Background re-delete mid-cascade
# is converted again), and that the release type-checks cascade-guard's
# policies and its warnings reach cascade-guard's reports. Prints one table, release x check, with the first failing
# line of each failure; logs are kept in target/compat/.
#
#   scripts/compat.sh                 every pinned release (controlplane/build.sh --list)
#   scripts/compat.sh 1.30 v1.37.2    only these (a minor picks its pinned release)
#
# Exits non-zero when any check fails.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -gt 0 ]; then
  versions=("$@")
else
  mapfile -t versions < <(controlplane/build.sh --list)
fi
logs=target/compat
mkdir -p "$logs"

checks=(deletion-semantics decision-table convert-cascade type-check)
# The cargo test arguments of each check: test targets and exact test names.
check_args() {
  case $1 in
  deletion-semantics) echo "-p local-cluster --test deletion_semantics" ;;
  decision-table-refuse) echo "-p cascade-guard --test refuse -- --exact the_api_server_agrees_with_the_decision_table_in_every_cell" ;;
  decision-table-convert) echo "-p cascade-guard --test convert -- --exact the_api_server_agrees_with_the_decision_table_for_held_objects" ;;
  convert-cascade) echo "-p cascade-guard --test convert -- --exact every_client_gets_a_foreground_cascade a_background_redelete_mid_cascade_does_not_cut_it_short" ;;
  type-check) echo "-p cascade-guard --test type_check" ;;
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
# or build error, else the last line.
first_failure() {
  local log=$1 line
  line=$(awk '/panicked at/ { getline; print; exit }' "$log")
  [ -n "$line" ] || line=$(grep -m1 -E '^error|build.sh:.*(cannot|not)|FAILED|failed' "$log" || true)
  [ -n "$line" ] || line=$(tail -n1 "$log")
  # One table cell: no pipes, no newlines, not too long.
  echo "$line" | tr '|' '/' | cut -c1-160
}

# How many tests a cargo test log says passed, over all its binaries.
passed_in() {
  awk '/^test result:/ { for (i = 1; i < NF; i++) if ($(i + 1) ~ /^passed/) n += $i } END { print n + 0 }' "$1"
}

echo "compat: building the test binaries" >&2
cargo test --workspace --locked --no-run >"$logs/cargo-build.log" 2>&1 || {
  echo "compat: the tests do not build; see $logs/cargo-build.log" >&2
  tail -n 20 "$logs/cargo-build.log" >&2
  exit 1
}

declare -A result
rows=()
failed=0
for v in "${versions[@]}"; do
  start=$SECONDS
  bin=
  if out=$(controlplane/build.sh "$v" 2>"$logs/build-$v.log"); then
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
  result[$release,etcd]=$(cat "controlplane/releases/$release/etcd-version" 2>/dev/null || echo "?")
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
      log=$logs/$release-$part.log
      echo "compat: $release $part" >&2
      # shellcheck disable=SC2046 # check_args is a word list on purpose
      if ! LOCAL_CLUSTER_BIN_DIR=$bin cargo test --locked $(check_args "$part") >"$log" 2>&1; then
        result[$release,$check]="fail: $(first_failure "$log")"
        failed=1
        break
      fi
      # A renamed test makes a filter match nothing, and cargo passes that.
      if [ "$(passed_in "$log")" -eq 0 ]; then
        result[$release,$check]="fail: $part ran no test (a filter matches nothing)"
        failed=1
        break
      fi
    done
  done
  result[$release,run]="$((SECONDS - start))s"
done

printf '\n| Kubernetes | etcd | %s | build | run |\n' "$(printf '%s | ' "${checks[@]}" | sed 's/ | $//')"
printf '|---|---|%s---|---|\n' "$(printf -- '---|%.0s' "${checks[@]}")"
for r in "${rows[@]}"; do
  line="| $r | ${result[$r,etcd]#v} |"
  for check in "${checks[@]}"; do line+=" ${result[$r,$check]} |"; done
  line+=" ${result[$r,build]} | ${result[$r,run]} |"
  echo "$line"
done
printf '\nchecked on %s; logs in %s/\n' "$(date -u +%Y-%m-%d)" "$logs"
exit "$failed"
