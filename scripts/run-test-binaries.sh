#!/usr/bin/env bash
# Builds every test binary of the workspace once, then runs them: the slow
# ones (real Crossplane's timers keep them waiting, not computing) in the
# background, every other one in turn beside them, and two at a time, then
# three, as background jobs end. Each binary starts its own control plane, so
# they share nothing but the machine. Each binary's output is kept in
# target/test-logs/ and printed whole when it ends.
#
#   scripts/run-test-binaries.sh                  every test binary
#   TEST_BACKGROUND="seed_real real_crossplane"   which run in the background
#   TEST_LAST="chart install"                     which of the others run last
#                                                 (in this order): those that
#                                                 need a tool still being built
#   TEST_FIRST="real_crossplane"                  which of the others run first
#                                                 (in this order): long ones
#                                                 that mostly wait, kept out
#                                                 of the run's tail
#   TEST_LANES=3                                  how many of the others may
#                                                 run at once (one more as
#                                                 each background job ends)
#   --beside 'COMMAND'                            run COMMAND in the
#                                                 background from the start,
#                                                 like a background binary
#                                                 (its output kept in
#                                                 target/test-logs/beside.log)
#   --group GROUP                                 only the integration tests of
#                                                 one group: without_cluster,
#                                                 api_server or real_crossplane
#                                                 (their folder under each
#                                                 crate's tests/), or unit
#                                                 (every crate's unit tests)
#   other arguments                               passed to every binary
#   TEST_ARGS_<name>="--test-threads=4"           passed to binary <name> only
#                                                 (every character of the name
#                                                 other than a letter, digit or
#                                                 _ as _), after those
#
# TEST_ARGS_seed_real is --test-threads=16 unless set: its tests wait on real
# Crossplane's timers, not the CPU, and are written to run at once on its
# one stack (see tests/real_crossplane/seed_real.rs); libtest's default, one per core, would
# run them a few at a time. Its randomized test kills parts of the stack once
# every other test is done (it has the stack to itself); all 31 at once
# (64) loaded two cores so that cascade-guard's replicas kept losing their
# Leases and nearly every test failed (CI at af19925).
#
# Exits non-zero when any binary fails (after all have run), naming them, and
# when any binary of the list (or the command beside) has no result: never
# started, or its lane ended before it did.
set -euo pipefail
cd "$(dirname "$0")/.."

background=${TEST_BACKGROUND:-seed_real}
last=${TEST_LAST:-}
first=${TEST_FIRST:-}
: "${TEST_ARGS_seed_real=--test-threads=16}"
beside=
group=
while [ "${1:-}" = --beside ] || [ "${1:-}" = --group ]; do
  case $1 in
    --beside) beside=$2 ;;
    --group) group=$2 ;;
  esac
  shift 2
done
logs=target/test-logs
mkdir -p "$logs"
# seed_real records when each of its tests started and ended (printed below
# its log): what to shorten when it is the long pole.
export SEED_REAL_TIMES=$PWD/$logs/seed_real-times.tsv
rm -f "$SEED_REAL_TIMES"

# name, package directory and executable of every test binary (unit tests of
# each crate, and each integration test), from cargo's own build messages;
# with --group, only that group's.
list=$logs/binaries.tsv
cargo test --workspace --locked --no-run --message-format=json-render-diagnostics |
  GROUP=$group python3 -c '
import json, os, sys
wanted = os.environ["GROUP"]
def group_of(target, package_dir):
    if "test" not in target["kind"]:
        return "unit"
    rel = os.path.relpath(target["src_path"], os.path.join(package_dir, "tests"))
    parts = rel.split(os.sep)
    return parts[0] if len(parts) > 1 else "ungrouped"
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    if not m.get("profile", {}).get("test"):
        continue
    t = m["target"]
    if wanted and group_of(t, os.path.dirname(m["manifest_path"])) != wanted:
        continue
    name = t["name"] if "lib" not in t["kind"] else t["name"] + " (unit)"
    print("\t".join([name, os.path.dirname(m["manifest_path"]), m["executable"]]))
' >"$list"
if [ ! -s "$list" ]; then
  echo "run-test-binaries.sh: cargo built no test binary${group:+ of group $group}" >&2
  exit 1
fi

declare -A pids=()
# One line per binary (or beside) that ended: its name and passed or failed.
results=$logs/results.tsv
: >"$results"

# Like cargo test: each binary runs in its package's directory. Binary
# <name>'s own arguments (TEST_ARGS_<name>) come last.
run() {
  local name=$1 dir=$2 exe=$3 var own
  shift 3
  var=TEST_ARGS_${name//[^A-Za-z0-9_]/_}
  read -ra own <<<"${!var:-}"
  (cd "$dir" && "$exe" "$@" "${own[@]}")
}

is_background() {
  local name=$1 b
  for b in $background; do [ "$b" = "$name" ] && return 0; done
  return 1
}

is_first() {
  local name=$1 f
  for f in $first; do [ "$f" = "$name" ] && return 0; done
  return 1
}

is_last() {
  local name=$1 l
  for l in $last; do [ "$l" = "$name" ] && return 0; done
  return 1
}

while IFS=$'\t' read -r name dir exe; do
  if is_background "$name"; then
    echo "==> $name: started in the background (log: $logs/$name.log)"
    run "$name" "$dir" "$exe" "$@" >"$logs/$name.log" 2>&1 &
    pids[$name]=$!
  fi
done <"$list"

if [ -n "$beside" ]; then
  echo "==> beside: started in the background (log: $logs/beside.log): $beside"
  bash -c "$beside" </dev/null >"$logs/beside.log" 2>&1 &
  pids[beside]=$!
fi

# Every other binary, from one queue (TEST_FIRST's at its head, TEST_LAST's
# at its end), run by lanes: one from the start, and one more each time a
# background job ends or the cores idle (below), up to TEST_LANES (3). With
# one lane throughout, it was the run's long pole once seed_real had shrunk
# (a warm run at 638ef3a). A lane keeps each binary's output in target/test-logs/
# and prints it whole when the binary ends.
queue=$logs/queue.tsv
next=$logs/queue.next
: >"$queue"
echo 0 >"$next"
# The entries of the list named $1, in that order, to the queue.
enqueue_named() {
  local n name dir exe
  for n in $1; do
    while IFS=$'\t' read -r name dir exe; do
      if [ "$name" = "$n" ] && ! is_background "$name"; then
        printf '%s\t%s\t%s\n' "$name" "$dir" "$exe" >>"$queue"
      fi
    done <"$list"
  done
}
enqueue_named "$first"
while IFS=$'\t' read -r name dir exe; do
  is_background "$name" || is_first "$name" || is_last "$name" ||
    printf '%s\t%s\t%s\n' "$name" "$dir" "$exe" >>"$queue"
done <"$list"
enqueue_named "$last"
queued=$(wc -l <"$queue")

# The queue's next entry, taken under a lock (empty when none is left).
take() {
  (
    flock 9
    local n
    n=$(cat "$next")
    echo $((n + 1)) >"$next"
    sed -n "$((n + 1))p" "$queue"
  ) 9>"$queue.lock"
}

# How many entries of the queue were taken, read under the same lock.
taken() {
  (
    flock 9
    cat "$next"
  ) 9>"$queue.lock"
}

# One writer at a time on the script's output.
say() {
  (
    flock 9
    cat
  ) 9>"$logs/output.lock"
}

lane() {
  local entry name dir exe began status
  while entry=$(take) && [ -n "$entry" ]; do
    IFS=$'\t' read -r name dir exe <<<"$entry"
    began=$SECONDS
    if run "$name" "$dir" "$exe" "$@" </dev/null >"$logs/$name.log" 2>&1; then status=passed; else
      status=failed
    fi
    printf '%s\t%s\n' "$name" "$status" >>"$results"
    { echo "==> $name ($status in $((SECONDS - began))s, ${SECONDS}s after this script's start)"; cat "$logs/$name.log"; } | say
  done
}


background_ended() {
  local name=$1 status=$2
  {
    echo "==> $name (in the background; $status, ${SECONDS}s after this script's start)"
    cat "$logs/$name.log"
    if [ "$name" = seed_real ] && [ -s "$SEED_REAL_TIMES" ]; then
      echo "==> seed_real's tests by end (seconds from its first test: start, end, test)"
      sort -t$'\t' -k3 -n "$SEED_REAL_TIMES" | awk -F'\t' '{ printf "%6d %6d  %s %s\n", $2, $3, $1, $4 }'
    fi
  } | say
}

# The two cores' idle share over the last 30 s, in percent, from /proc/stat
# sampled every 5 s (nothing where there is no /proc/stat, or too few
# samples yet).
cpu_samples=()
sample_cpu() {
  [ -r /proc/stat ] || return 0
  local _cpu user nice system idle iowait irq softirq steal
  read -r _cpu user nice system idle iowait irq softirq steal _ </proc/stat
  cpu_samples+=("$((idle + iowait)) $((user + nice + system + idle + iowait + irq + softirq + steal))")
  [ ${#cpu_samples[@]} -le 7 ] || cpu_samples=("${cpu_samples[@]:1}")
}
idle_share() {
  [ ${#cpu_samples[@]} -ge 7 ] || return 0
  local i0 t0 i1 t1
  read -r i0 t0 <<<"${cpu_samples[0]}"
  read -r i1 t1 <<<"${cpu_samples[-1]}"
  if [ "$t1" -gt "$t0" ]; then echo $((100 * (i1 - i0) / (t1 - t0))); fi
}

can_open() {
  [ ${#lanes[@]} -lt "$max_lanes" ] && [ "$(taken)" -lt "$queued" ]
}
lanes=()
max_lanes=${TEST_LANES:-3}
binary_args=("$@")
# A lane more (the first from the start), saying why when it is not the first.
open_lane() {
  if [ ${#lanes[@]} -gt 0 ]; then
    echo "==> $1: $((${#lanes[@]} + 1)) of the others now run at once" | say
  fi
  lane "${binary_args[@]}" &
  lanes+=($!)
  opened=$SECONDS
}
open_lane "the start"

# Until every background job has ended: each one's output as it ends, and a
# lane more when one ends or when the cores have been a third idle for 30 s
# (the binaries mostly wait on control planes and Crossplane: at 4bc05a3 the
# cores were 34 to 64 % idle over the run's last four minutes, one lane
# running, seed_real's randomized round and the checks beside waiting).
declare -A name_of=()
for name in "${!pids[@]}"; do name_of[${pids[$name]}]=$name; done
while :; do
  for pid in "${!name_of[@]}"; do
    kill -0 "$pid" 2>/dev/null && continue
    if wait "$pid"; then status=passed; else status=failed; fi
    name=${name_of[$pid]}
    unset "name_of[$pid]"
    printf '%s\t%s\n' "$name" "$status" >>"$results"
    background_ended "$name" "$status"
    if can_open; then open_lane "$name having ended"; fi
  done
  sample_cpu
  idle=$(idle_share)
  if [ -n "$idle" ] && [ "$idle" -ge 33 ] && [ $((SECONDS - opened)) -ge 30 ] && can_open; then
    open_lane "the cores $idle % idle over the last 30 s"
  fi
  if [ ${#name_of[@]} -eq 0 ] && ! can_open; then break; fi
  sleep 5
done
wait "${lanes[@]}" || true
mapfile -t failed < <(awk -F'\t' '$2 == "failed" { print $1 }' "$results")
# Every binary of the list, and the command beside, ended with a result.
mapfile -t expected < <(cut -f1 "$list")
[ -z "$beside" ] || expected+=(beside)
missing=()
for name in "${expected[@]}"; do
  cut -f1 "$results" | grep -qxF -- "$name" || missing+=("$name")
done

status=0
if [ ${#failed[@]} -gt 0 ]; then
  # Why each failed, last and short: a CI report may keep only the output's
  # tail, where backtraces would otherwise crowd out the panics' messages
  # (CI at cf339f3 showed four seed_real failures and none of their causes).
  echo "==> why each failed (the start of every panic's message; the whole is above)"
  for name in "${failed[@]}"; do
    [ -f "$logs/$name.log" ] || continue
    why=$(awk -v name="$name" '
      /panicked at/ { left = 7; print name ": " substr($0, 1, 300); next }
      left > 0 { left--; print "    " substr($0, 1, 300) }
    ' "$logs/$name.log" | head -n 80)
    # No panic (the compatibility checks beside print tables, not panics):
    # the failing rows of its tables, else its last lines. CI at e237696
    # said only "failed: beside".
    [ -n "$why" ] || why=$(grep -E '^\| .*\| fail' "$logs/$name.log" | sed "s/^/$name: /" | cut -c1-400 | head -n 20)
    [ -n "$why" ] || why=$(tail -n 15 "$logs/$name.log" | sed "s/^/$name: /" | cut -c1-300)
    echo "$why"
  done
  echo "run-test-binaries.sh: failed: ${failed[*]}" >&2
  status=1
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "run-test-binaries.sh: no result from: ${missing[*]} (never started, or its lane ended before it did)" >&2
  status=1
fi
exit "$status"
