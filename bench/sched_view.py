#!/usr/bin/env python3
"""What kept a server's threads from running, from a `perf sched record` file.

    perf sched record -o sched.data -- sleep 3      # while the server is under load
    bench/sched_view.py sched.data SERVER_PID [--json]
    perf script -i sched.data -F comm,pid,tid,cpu,time,event,trace | bench/sched_view.py - SERVER_PID

Reads the kernel's scheduler events (`sched_switch`, `sched_waking`) and, for the
server's serving threads (every thread of SERVER_PID except the prediction log's,
named `plog-*`), reports:

- their waits for a CPU: from the moment a thread became runnable (woken, or
  preempted while running) to the moment it ran: how many a second, the time a second
  they add up to, and their percentiles;
- who preempted them: each time a serving thread was switched out while still
  runnable, the thread that took its CPU, and how long the serving thread then
  waited to run again. The server's own threads are named `server:<name>`, the
  others by their command; `log` sums the prediction log's threads;
- how long a woken serving thread took to run, by what its CPU was running at that
  moment (an idle CPU, another serving thread, the log's encoder, ...).

Thread names are the kernel's (`comm`), with trailing numbers dropped. `bench/plog_bench.sh`
runs this for each run with `SCHED=1`. Needs `perf` with the sched tracepoints (root,
or kernel.perf_event_paranoid of -1).
"""
import bisect
import collections
import json
import re
import subprocess
import sys

SWITCH = re.compile(
    r"prev_comm=(.*?) prev_pid=(\d+) prev_prio=\d+ prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)")
WAKING = re.compile(r"comm=(.*?) pid=(\d+) prio=\d+ target_cpu=(\d+)")
HEAD = re.compile(r"^\s*(.*?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$")


def pct(xs, q):
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else 0.0


def analyse(lines, server):
    """The report for the threads of process `server` from the lines of `perf script -F
    comm,pid,tid,cpu,time,event,trace`; None when they hold no scheduler event."""
    tgid, comm, events = {}, {}, []
    for line in lines:
        m = HEAD.match(line)
        if not m:
            continue
        c, pid, tid, cpu, t, ev, rest = m.groups()
        tgid[int(tid)] = int(pid)
        comm[int(tid)] = c
        events.append((float(t), int(cpu), ev, rest))
    if not events:
        return None

    def name(tid):
        if tid == 0:
            return "idle"
        c = re.sub(r"[-/:]?\d+$", "", comm.get(tid, "?"))
        return f"server:{c}" if tgid.get(tid) == server else c

    def log_thread(tid):
        return tgid.get(tid) == server and comm.get(tid, "").startswith("plog-")

    def serving(tid):
        return tgid.get(tid) == server and not log_thread(tid)

    runnable, origin, running, spans, waits = {}, {}, {}, collections.defaultdict(list), []
    for t, cpu, ev, rest in events:
        if ev == "sched:sched_waking":
            m = WAKING.search(rest)
            if m and int(m.group(2)) not in runnable:
                runnable[int(m.group(2))] = t
                origin[int(m.group(2))] = ("woken", int(m.group(3)), None)
        elif ev == "sched:sched_switch":
            m = SWITCH.search(rest)
            if not m:
                continue
            prev, state, nxt = int(m.group(2)), m.group(3), int(m.group(5))
            comm.setdefault(nxt, m.group(4))
            if cpu in running:
                spans[cpu].append((running[cpu][0], t, running[cpu][1]))
            running[cpu] = (t, nxt)
            if state.startswith("R"):
                runnable[prev] = t
                origin[prev] = ("preempted", cpu, nxt)
            since = runnable.pop(nxt, None)
            if since is not None:
                waits.append((nxt, cpu, since, t, origin.pop(nxt, None)))
    span = events[-1][0] - events[0][0]
    starts = {c: [s for s, _, _ in v] for c, v in spans.items()}

    def on_cpu_at(cpu, t):
        i = bisect.bisect_right(starts.get(cpu, []), t) - 1
        if i >= 0 and spans[cpu][i][0] <= t < spans[cpu][i][1]:
            return name(spans[cpu][i][2])
        return "?"

    all_waits, by_preemptor, by_running = [], collections.defaultdict(list), collections.defaultdict(list)
    for tid, cpu, since, t, org in waits:
        if not serving(tid):
            continue
        us = (t - since) * 1e6
        all_waits.append(us)
        if org and org[0] == "preempted":
            by_preemptor[name(org[2])].append(us)
            if log_thread(org[2]):
                by_preemptor["log"].append(us)
        elif org and org[0] == "woken" and org[1] == cpu:
            by_running[on_cpu_at(cpu, since)].append(us)

    def summary(xs):
        xs = sorted(xs)
        return {"per_s": round(len(xs) / span, 1), "ms_per_s": round(sum(xs) / span / 1e3, 2),
                "p50_us": round(pct(xs, 0.5), 1), "p90_us": round(pct(xs, 0.9), 1),
                "p99_us": round(pct(xs, 0.99), 1), "p999_us": round(pct(xs, 0.999), 1),
                "max_us": round(xs[-1], 1) if xs else 0.0}

    return {
        "seconds": round(span, 3),
        "waits": summary(all_waits),
        "preempted_by": {k: summary(v) for k, v in by_preemptor.items()},
        "woken_onto": {k: summary(v) for k, v in by_running.items()},
    }


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        sys.exit(__doc__)
    data, server = args[0], int(args[1])
    if data == "-":
        lines = sys.stdin.read().splitlines()
    else:
        lines = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,tid,cpu,time,event,trace"],
                               capture_output=True, text=True, check=True).stdout.splitlines()
    report = analyse(lines, server)
    if report is None:
        sys.exit(f"{data}: no scheduler events")
    span = report["seconds"]
    if "--json" in sys.argv:
        print(json.dumps(report))
        return
    w = report["waits"]
    print(f"serving threads of {server}, {span:.2f} s: {w['per_s']:.0f} waits for a CPU a second, "
          f"{w['ms_per_s']:.1f} ms a second; p50 {w['p50_us']:.0f} p99 {w['p99_us']:.0f} "
          f"p99.9 {w['p999_us']:.0f} max {w['max_us']:.0f} µs")
    print(f"  {'preempted by':<28}{'/s':>8}{'ms/s':>8}{'p50 µs':>9}{'p90 µs':>9}{'max µs':>9}")
    for k, s in sorted(report["preempted_by"].items(), key=lambda kv: -kv[1]["ms_per_s"]):
        if s["per_s"] >= 0.5:
            print(f"  {k:<28}{s['per_s']:>8.1f}{s['ms_per_s']:>8.2f}{s['p50_us']:>9.0f}{s['p90_us']:>9.0f}{s['max_us']:>9.0f}")
    print(f"  {'woken onto a CPU running':<28}{'/s':>8}{'ms/s':>8}{'p50 µs':>9}{'p90 µs':>9}{'p99 µs':>9}")
    for k, s in sorted(report["woken_onto"].items(), key=lambda kv: -kv[1]["per_s"]):
        if s["per_s"] >= 5:
            print(f"  {k:<28}{s['per_s']:>8.1f}{s['ms_per_s']:>8.2f}{s['p50_us']:>9.0f}{s['p90_us']:>9.0f}{s['p99_us']:>9.0f}")


if __name__ == "__main__":
    main()
