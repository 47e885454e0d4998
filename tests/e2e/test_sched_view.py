"""bench/sched_view.py, the scheduler's view that `bench/plog_bench.sh SCHED=1` prints:
its attribution checked on a short, hand-written `perf script` stream whose answer is
known (no perf needed)."""
import importlib.util
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "bench" / "sched_view.py"

spec = importlib.util.spec_from_file_location("sched_view", TOOL)
sched_view = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sched_view)

SERVER = 100


def line(comm, pid, tid, cpu, t, event, trace):
    return f"{comm:>16} {pid:>5}/{tid:<5} [{cpu:03d}] {t:.6f}: {event}: {trace}"


def switch(cpu, t, prev, prev_pid, state, nxt, next_pid, pid_of):
    return line(prev, pid_of[prev_pid], prev_pid, cpu, t, "sched:sched_switch",
                f"prev_comm={prev} prev_pid={prev_pid} prev_prio=120 prev_state={state} ==> "
                f"next_comm={nxt} next_pid={next_pid} next_prio=120")


def waking(cpu, t, by, by_pid, comm, pid, target, pid_of):
    return line(by, pid_of[by_pid], by_pid, cpu, t, "sched:sched_waking",
                f"comm={comm} pid={pid} prio=120 target_cpu={target:03d}")


# Threads: 101 and 102 serve (process 100), 103 is the log's writer (process 100),
# 201 is another process's thread; 0 is the idle task.
PID_OF = {0: 0, 101: SERVER, 102: SERVER, 103: SERVER, 201: 200}


def stream():
    p = PID_OF
    return [
        # CPU 0: the worker 101 runs; the log's writer wakes and takes the CPU from it
        # (101 preempted, still runnable) for 200 µs.
        switch(0, 1.000000, "swapper/0", 0, "R", "tokio-rt-worker", 101, p),
        waking(0, 1.000100, "tokio-rt-worker", 101, "plog-writer", 103, 0, p),
        switch(0, 1.000110, "tokio-rt-worker", 101, "R", "plog-writer", 103, p),
        switch(0, 1.000310, "plog-writer", 103, "S", "tokio-rt-worker", 101, p),
        # CPU 1 idle; worker 102 is woken onto it and runs 40 µs later.
        switch(1, 1.000000, "swapper/1", 0, "R", "swapper/1", 0, p),
        waking(0, 1.000400, "tokio-rt-worker", 101, "tokio-rt-worker", 102, 1, p),
        switch(1, 1.000440, "swapper/1", 0, "R", "tokio-rt-worker", 102, p),
        # Another process's thread preempts 102 for 30 µs.
        switch(1, 1.000500, "tokio-rt-worker", 102, "R", "other", 201, p),
        switch(1, 1.000530, "other", 201, "S", "tokio-rt-worker", 102, p),
        switch(0, 1.001000, "tokio-rt-worker", 101, "S", "swapper/0", 0, p),
        switch(1, 1.001000, "tokio-rt-worker", 102, "S", "swapper/1", 0, p),
    ]


def test_preemptions_and_wake_ups_are_attributed_to_who_held_the_cpu():
    r = sched_view.analyse(stream(), SERVER)
    assert r["seconds"] == 0.001
    by = r["preempted_by"]
    # The writer held the worker off 200 µs once; `log` sums the log's threads.
    assert by["server:plog-writer"]["per_s"] == 1000.0
    assert by["server:plog-writer"]["max_us"] == 200.0
    assert by["log"]["max_us"] == 200.0
    # Another process's thread: named by its command.
    assert by["other"]["max_us"] == 30.0
    # The wake-up onto an idle CPU took 40 µs.
    assert r["woken_onto"]["idle"]["max_us"] == 40.0
    # Three waits of the serving threads (the writer's own wait is not counted).
    assert r["waits"]["per_s"] == 3000.0
    assert r["waits"]["max_us"] == 200.0


def test_the_command_line_reads_perf_script_from_stdin():
    out = subprocess.run([sys.executable, str(TOOL), "-", str(SERVER), "--json"],
                         input="\n".join(stream()), capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    assert r["preempted_by"]["server:plog-writer"]["max_us"] == 200.0
    text = subprocess.run([sys.executable, str(TOOL), "-", str(SERVER)],
                          input="\n".join(stream()), capture_output=True, text=True, check=True)
    assert "server:plog-writer" in text.stdout and "waits for a CPU" in text.stdout
    # Nothing to read: a clear error, not a traceback.
    bad = subprocess.run([sys.executable, str(TOOL), "-", str(SERVER)], input="",
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "no scheduler events" in bad.stderr
