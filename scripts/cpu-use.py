#!/usr/bin/env python3
"""Where a test run's CPU goes, by test binary and by program.

    scripts/cpu-use.py record FILE      samples every process once a second
                                        until SIGTERM or SIGINT, then writes
                                        FILE (JSON)
    scripts/cpu-use.py report FILE      CPU seconds by test binary (the
                                        control planes, Crossplane stacks and
                                        controllers it started included), and
                                        within the real-Crossplane suite by
                                        program

A process's CPU is its user and system time from /proc, less what it had
used when the recording began; a process that ends between two samples
loses at most its last second, and one that lives less than a second is not
seen at all (the Go compiler's processes often are): the machine's own
counters (/proc/stat: busy, idle and, in a VM, stolen) say how much that is.
Each process is counted under the outermost
test binary among its ancestors (a name ending in `-` and 16 hex digits, as
Cargo names them), seen when the process was first sampled; `cargo build`,
`cargo clippy` and rustc are the build. Used for BENCHMARKS.md, "CI".
"""

import json
import os
import re
import signal
import sys
import time

TEST_BINARY = re.compile(r"^(.+)-[0-9a-f]{16}$")


def stat_of(pid):
    """(name in /proc's stat, parent pid, CPU ticks, start time) of `pid`."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    close = stat.rfind(")")
    fields = stat[close + 2 :].split()
    return stat[stat.find("(") + 1 : close], int(fields[1]), int(fields[11]) + int(fields[12]), fields[19]


def program_of(pid, fallback):
    """The program's name: its executable's, or a script's own (compat.sh),
    not its interpreter's."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0")]
    except OSError:
        return fallback
    script = argv[0].endswith("bash") and len(argv) > 1 and argv[1].endswith(".sh")
    return (argv[1] if script else argv[0]).rsplit("/", 1)[-1] or fallback


def machine():
    """The two cores' time so far, in ticks, from /proc/stat's first line:
    (busy, idle, stolen by the hypervisor)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    steal = fields[7] if len(fields) > 7 else 0
    return user + nice + system + irq + softirq, idle + iowait, steal


def record(path):
    # (pid, start time) -> [program, ticks at first sight, last ticks,
    # ancestry]; the name and ancestry read once, at first sight.
    seen = {}

    def sample(baseline):
        now = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    now[int(entry)] = stat_of(entry)
                except (OSError, IndexError, ValueError):
                    continue
        for pid, (comm, _, ticks, started) in now.items():
            entry = seen.get((pid, started))
            if entry is None:
                chain = [program_of(pid, comm)]
                up = now[pid][1]
                while up in now and up > 1 and len(chain) < 40:
                    chain.append(program_of(up, now[up][0]))
                    up = now[up][1]
                seen[(pid, started)] = [chain[0], ticks if baseline else 0, ticks, chain]
            else:
                entry[2] = ticks

    def write(*_):
        tick = os.sysconf("SC_CLK_TCK")
        out = {
            f"{pid}@{started}": [name, (last - first) / tick, chain]
            for (pid, started), (name, first, last, chain) in seen.items()
        }
        now = machine()
        out["_machine"] = {
            "seconds": time.monotonic() - began,
            "busy": (now[0] - at_start[0]) / tick,
            "idle": (now[1] - at_start[1]) / tick,
            "stolen": (now[2] - at_start[2]) / tick,
        }
        with open(path, "w") as f:
            json.dump(out, f)
        sys.exit(0)

    signal.signal(signal.SIGTERM, write)
    signal.signal(signal.SIGINT, write)
    began, at_start = time.monotonic(), machine()
    sample(baseline=True)
    while True:
        time.sleep(1)
        sample(baseline=False)


def owner(chain):
    outermost = None
    for name in chain:
        match = TEST_BINARY.match(name)
        if match:
            outermost = match.group(1)
    if outermost:
        # The compatibility checks run the same binaries on other releases.
        return ("compat.sh: " if "compat.sh" in chain else "") + outermost
    if any(n in ("rustc", "cargo-clippy", "clippy-driver") for n in chain):
        return "(the Rust builds)"
    return "(other: " + (chain[-1] if chain else "?") + ")"


def report(path):
    with open(path) as f:
        data = json.load(f)
    whole = data.pop("_machine", None)
    by_owner, suite = {}, {}
    for name, cpu, chain in data.values():
        who = owner(chain)
        by_owner[who] = by_owner.get(who, 0) + cpu
        if who == "seed_real":
            cpu_so_far, count = suite.get(name, (0, 0))
            suite[name] = (cpu_so_far + cpu, count + 1)
    total = sum(by_owner.values())
    print(f"{total:8.0f} s of CPU in all")
    if whole:
        print(
            f"the machine over {whole['seconds']:.0f} s: {whole['busy']:.0f} s of its cores busy"
            f" ({whole['busy'] - total:.0f} s in no process seen: short-lived ones, the kernel),"
            f" {whole['idle']:.0f} s idle, {whole['stolen']:.0f} s stolen by the hypervisor"
        )
    ranked = sorted(by_owner.items(), key=lambda kv: -kv[1])
    for who, cpu in ranked[:25]:
        print(f"{cpu:8.1f}  {who}")
    rest = ranked[25:]
    if rest:
        print(f"{sum(cpu for _, cpu in rest):8.1f}  ({len(rest)} more)")
    if suite:
        print("seed_real, by program (how many processes):")
        for name, (cpu, count) in sorted(suite.items(), key=lambda kv: -kv[1][0])[:12]:
            print(f"{cpu:8.1f}  {name} ({count})")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("record", "report"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    (record if sys.argv[1] == "record" else report)(sys.argv[2])


if __name__ == "__main__":
    main()
