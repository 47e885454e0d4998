#!/usr/bin/env bash
# Prediction log on vs off (issue 13): Decide through `mesh serve` on the example
# configuration, open loop at a fraction (default 50 %) of the saturation measured
# first, the log on and off alternating for ROUNDS rounds (the modes' order rotated
# each round and mirrored every other block of rounds: on/off, off/on, off/on, on/off),
# each run on a freshly started server. Prints one table: latency from the intended
# send time (p50/p99/p99.9/max, and the median and max of each second's p99), the
# server's own p99 and p99.9 (arrival to answer, as the answers' timings carry it),
# the load generator's send lag p99 (how late it sent: inside every latency above),
# throughput, errors, the log's dropped and written
# records and the segments the encoder fell behind on ("behind": it read the rest of
# each from its wal; from /metrics), and the CPU the server and its log threads used.
#
#   bench/plog_bench.sh [MESH_BIN]       (default $MESH_BIN, else $CARGO_TARGET_DIR/release/mesh)
#
# Settings (environment): SECS=10 seconds per run, ROUNDS=2, WARMUP=2 (seconds of the
# same open loop, in the same bench process, before each measured run: `mesh bench
# --warmup`), PCT=50 (% of saturation),
# RATE (skip the saturation run and use this rate), CONCURRENCY=32 (most outstanding
# requests of the open loop; callers of the saturation run), PORT=18731 (gRPC; HTTP is
# PORT-1; both must be free), OUT (directory for the raw output; default a new temp
# dir), LOG_CONFIG (extra lines for [prediction_log], e.g. 'writer_nice = 0'), NICE
# (run the server and the load at this nice value, e.g. -10 as root, to keep other work
# on a shared machine out of the figures; the log's writer_nice stays relative to it).
# MODELS: the model repository to serve (an absolute path; default examples/models).
# WORKERS: the servers' `[server] worker_threads` (default: the config's, one per core).
# SERVER_CPUS, BENCH_CPUS: run the server and the load generator on these CPUs
# (`taskset -c` lists, e.g. SERVER_CPUS=1 BENCH_CPUS=0: each on a core of its own).
# DEFERRED=1: a third mode in each round, "def", the log on with `parquet =
# "deferred"` (the serving process writes only the wal; closed segments wait for
# `mesh logs convert`). After each such run, `mesh logs convert` (in this script,
# with the server stopped, as a converter elsewhere would) builds the Parquet files,
# and the table shows its records/s and whether every written record reached one.
# TURNS=1: another mode in each round, "wt", the log on with `worker_turns = true`
# (the serving workers build the Parquet columns in short turns before they park),
# and "on" runs with `worker_turns = false` (the encoder
# thread alone); the table then also shows how many records the workers built.
# OWN_CORE=1: another mode in each round, "own", the log on with its threads on the
# load generator's CPUs, which it needs with SERVER_CPUS: the log's work kept off the
# server's core. When every CPU of BENCH_CPUS comes after every CPU of SERVER_CPUS
# (SERVER_CPUS=0 BENCH_CPUS=1), the server runs on both lists with `[prediction_log]
# reserved_cpus` set to the size of BENCH_CPUS, as a user would run it (the server
# splits its CPUs itself); otherwise on SERVER_CPUS with `cpus` naming BENCH_CPUS.
# SIDECAR=1: another mode in each round, "sc", the log on with `parquet = "deferred"`
# and `mesh logs convert --watch` running beside the server through the run, as the
# Helm chart's converter sidecar does (`predictionLog.converter`): on CONVERTER_CPUS
# (default BENCH_CPUS; the sidecar with a CPU of its own in a Guaranteed pod wants a
# list that neither the server nor the load generator runs on), else on any CPU. It
# is stopped after the server, converts once more, and the summary checks that every
# written record reached a Parquet file; its CPU over the run is in "log cpu %".
# Segments roll at 64 MiB (about 190,000 records) by default: runs of SECS=30 at
# 10,000/s see it convert during the run, or LOG_CONFIG='segment_max_bytes = 8388608'
# rolls one about every 23,000 records.
# BASE=<path to another mesh binary>: another mode in each round, "base", the log on
# served by that build (an older one, say), and the summary gives this build's log on
# against it round by round: a change to the log measured against the build before,
# in the same rounds.
# AA=1: another mode in each round, "off2", the log off again: its figures against
# "off" are what the same comparison gives for two identical servers (the noise of
# this machine, measured in the same run), to read the log's figures against.
# SCHED=1: in each measured run, `perf sched record` for SCHED_SECS (3) seconds from
# a second in, and `bench/sched_view.py` on it (what kept the serving threads from a
# CPU, and who preempted them; $OUT/<run>.sched.txt); the summary then gives each mode's
# preemptions of serving threads by the log's threads and the serving threads' waits
# for a CPU. Needs perf and root; perf's own work lands in every mode alike.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-${MESH_BIN:-${CARGO_TARGET_DIR:-target}/release/mesh}}
[ -x "$BIN" ] || { echo "no mesh binary at $BIN (cargo build --release -p mesh --bin mesh)" >&2; exit 2; }
if [ -n "${BASE:-}" ] && [ ! -x "$BASE" ]; then echo "BASE=$BASE is not an executable mesh binary" >&2; exit 2; fi
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
SECS=${SECS:-10}
ROUNDS=${ROUNDS:-2}
WARMUP=${WARMUP:-2}
PCT=${PCT:-50}
CONCURRENCY=${CONCURRENCY:-32}
PORT=${PORT:-18731}
HTTP_PORT=$((PORT - 1))
RUN=()
[ -n "${NICE:-}" ] && RUN=(nice -n "$NICE")
DATA=$OUT/data
mkdir -p "$DATA"
# A taskset list ("0", "0,2", "4-7") as a TOML array of CPU indices.
cpu_list() {
    python3 -c 'import sys
out = []
for part in sys.argv[1].split(","):
    a, _, b = part.partition("-")
    out += range(int(a), int(b or a) + 1)
print(", ".join(map(str, out)))' "$1"
}
if [ "${SCHED:-0}" = 1 ] && ! perf sched record -q -o /dev/null -- true >/dev/null 2>&1; then
    echo "SCHED=1 needs perf with the sched tracepoints (apt-get install linux-perf; as root, or kernel.perf_event_paranoid = -1)" >&2
    exit 2
fi
if [ "${OWN_CORE:-0}" = 1 ] && { [ -z "${SERVER_CPUS:-}" ] || [ -z "${BENCH_CPUS:-}" ]; }; then
    echo "OWN_CORE=1 needs SERVER_CPUS and BENCH_CPUS (the log's threads go to BENCH_CPUS)" >&2
    exit 2
fi
# OWN_CORE's way: reserved_cpus (the size of BENCH_CPUS) when BENCH_CPUS all come after
# SERVER_CPUS, so that the CPUs the server sets aside are BENCH_CPUS; else empty.
RESERVED=
if [ "${OWN_CORE:-0}" = 1 ]; then
    IFS=', ' read -ra srv <<<"$(cpu_list "$SERVER_CPUS")"
    IFS=', ' read -ra ben <<<"$(cpu_list "$BENCH_CPUS")"
    last_srv=$(printf '%s\n' "${srv[@]}" | sort -n | tail -1)
    first_ben=$(printf '%s\n' "${ben[@]}" | sort -n | head -1)
    if [ "$first_ben" -gt "$last_srv" ]; then RESERVED=${#ben[@]}; fi
fi
pid=
cleanup() {
    for p in "$pid" "${cpid:-}"; do
        if [ -n "$p" ]; then kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; fi
    done
}
trap cleanup EXIT
source bench/lib.sh

"$BIN" features demo --store "$DATA/features" --views examples/features/views.toml --cards 10000 --merchants 1000 >"$OUT/features.log" 2>&1

serve() { # name on|off
    local cfg=$OUT/mesh-$1.toml
    example_config "$DATA/features" "$DATA/predictions-$1" "$PORT" "$HTTP_PORT" "${MODELS:-}" >"$cfg"
    if [ -n "${WORKERS:-}" ]; then sed -i "/^\[server\]/a worker_threads = $WORKERS" "$cfg"; fi
    if [ "$2" = off ] || [ "$2" = off2 ]; then
        log_off "$cfg"
    else
        log_set "$cfg" "${LOG_CONFIG:-}"
        if [ "$2" = def ] || [ "$2" = sc ]; then log_set "$cfg" 'parquet = "deferred"'; fi
        if [ "$2" = wt ]; then log_set "$cfg" 'worker_turns = true'; fi
        if [ "$2" = own ]; then
            if [ -n "$RESERVED" ]; then
                log_set "$cfg" "reserved_cpus = $RESERVED"
            else
                log_set "$cfg" "cpus = [$(cpu_list "$BENCH_CPUS")]"
            fi
        fi
        if [ "$2" = on ] && [ "${TURNS:-0}" = 1 ]; then log_set "$cfg" 'worker_turns = false'; fi
    fi
    for p in "$PORT" "$HTTP_PORT"; do
        if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "port $p is already in use: set PORT" >&2; exit 1; fi
    done
    # Write out what the last run (its log) and the feature store left dirty, so the
    # kernel's writeback of it does not land in this run's window: each run pays for
    # its own log's writes only.
    sync
    local on=${SERVER_CPUS:-}
    if [ "$2" = own ] && [ -n "$RESERVED" ]; then on="$SERVER_CPUS,$BENCH_CPUS"; fi
    local bin=$BIN
    if [ "$2" = base ]; then bin=$BASE; fi
    "${RUN[@]}" ${on:+taskset -c "$on"} "$bin" serve --config "$cfg" >"$OUT/serve-$1.log" 2>&1 &
    pid=$!
    wait_port "$PORT"
    kill -0 "$pid" 2>/dev/null || { echo "mesh serve exited: $OUT/serve-$1.log" >&2; exit 1; }
    if [ "$2" = own ] && [ -n "$RESERVED" ]; then
        # The server takes its log's CPUs core by core (hyperthreads together): on a
        # machine where that is not BENCH_CPUS the mode would measure something else.
        got=$(sed -n 's/.*log_cpus=\([0-9,-]*\).*/\1/p' "$OUT/serve-$1.log" | head -n 1)
        if [ -z "$got" ] || [ "$(cpu_list "$got")" != "$(cpu_list "$BENCH_CPUS")" ]; then
            echo "the server set CPUs '${got:-none}' aside for its log, not BENCH_CPUS $BENCH_CPUS (hyperthreads?): choose SERVER_CPUS and BENCH_CPUS on whole cores" >&2
            exit 1
        fi
    fi
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; }
# SIDECAR's converter: started beside the server, stopped (SIGTERM) after it.
cpid=
converter() { # name
    local cpus=${CONVERTER_CPUS:-${BENCH_CPUS:-}}
    ${cpus:+taskset -c "$cpus"} "$BIN" logs convert --logs "$DATA/predictions-$1" --watch --interval-ms 1000 --json \
        >"$OUT/$1.convert.jsonl" 2>"$OUT/$1.convert.err" &
    cpid=$!
}
converter_stop() { kill "$cpid"; wait "$cpid" || { echo "the converter failed: $OUT/$name.convert.err" >&2; exit 1; }; cpid=; }
bench() { # name seconds args...
    local name=$1 secs=$2; shift 2
    "${RUN[@]}" ${BENCH_CPUS:+taskset -c "$BENCH_CPUS"} "$BIN" bench --addr "http://127.0.0.1:$PORT" --target decide --seconds "$secs" --json "$@" >"$OUT/$name.json" 2>"$OUT/$name.err"
}
# CPU seconds (user + system) of a process (the server, SIDECAR's converter), and
# of its threads named plog-* (the server's log).
cpu() { # pid
    python3 - "$1" <<'PY'
import os, sys
pid, tck = sys.argv[1], os.sysconf("SC_CLK_TCK")
def secs(stat):
    f = stat.rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tck
total = secs(open(f"/proc/{pid}/stat").read())
log = 0.0
for t in os.listdir(f"/proc/{pid}/task"):
    try:
        if open(f"/proc/{pid}/task/{t}/comm").read().startswith("plog-"):
            log += secs(open(f"/proc/{pid}/task/{t}/stat").read())
    except OSError:
        pass
print(f"{total:.3f} {log:.3f}")
PY
}
# The run's converted records (from `mesh logs convert --json`), the wal files left,
# and with t0 t1 the conversion's seconds: fields for <run>.server.json.
converted() { # name [t0 t1]
    python3 - "$OUT/$1.convert.jsonl" "$DATA/predictions-$1" "${2:-}" "${3:-}" <<'PY'
import glob, json, os, sys
segs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
waiting = len(glob.glob(os.path.join(sys.argv[2], "_wal", "**", "*.wal"), recursive=True))
took = f', "convert_s": {float(sys.argv[4]) - float(sys.argv[3]):.3f}' if sys.argv[3] else ""
print(f', "converted": {sum(s["records"] for s in segs)}{took}, "wal_left": {waiting}')
PY
}
metric() { # name: value from /metrics (0 when absent)
    curl -s "http://127.0.0.1:$HTTP_PORT/metrics" | awk -v m="$1" '$1 == m {v = $2} END {print v + 0}'
}

if [ -n "${RATE:-}" ]; then
    echo "open loop at RATE=$RATE req/s (given)"
else
    serve sat off
    bench sat-warmup 2 --concurrency 8
    bench saturation "$SECS" --concurrency "$CONCURRENCY"
    stop
    SAT=$(python3 -c "import json;print(round(json.load(open('$OUT/saturation.json'))['throughput']))")
    RATE=$(python3 -c "print(round($SAT * $PCT / 100))")
    echo "saturation (log off, closed loop, $CONCURRENCY callers): $SAT req/s; open loop at $PCT %: $RATE req/s"
fi

runs=()
for r in $(seq "$ROUNDS"); do
    # Each mode takes each place in a round equally often, and follows each other mode
    # equally often: the modes in turn, the list rotated by one each round, and every
    # other block of as many rounds as there are modes in the mirrored order (a
    # Williams design: with two modes on/off, off/on, off/on, on/off), so that what one
    # run leaves behind for the next (the kernel's writeback, a cache, a warmer or
    # busier machine) falls on every mode alike. ROUNDS a multiple of twice the modes
    # balances it whole.
    modes=(on)
    if [ -n "${BASE:-}" ]; then modes+=(base); fi
    if [ "${DEFERRED:-0}" = 1 ]; then modes+=(def); fi
    if [ "${TURNS:-0}" = 1 ]; then modes+=(wt); fi
    if [ "${OWN_CORE:-0}" = 1 ]; then modes+=(own); fi
    if [ "${SIDECAR:-0}" = 1 ]; then modes+=(sc); fi
    modes+=(off)
    if [ "${AA:-0}" = 1 ]; then modes+=(off2); fi
    n=${#modes[@]}
    order=
    mirrored=$((((r - 1) / n) % 2))
    for i in $(seq 0 $((n - 1))); do
        m=${modes[$(((i + r - 1) % n))]}
        if [ "$mirrored" = 1 ]; then order="$m $order"; else order+="$m "; fi
    done
    for mode in $order; do
        name=log-$mode-$r
        serve "$name" "$mode"
        if [ "$mode" = sc ]; then converter "$name"; fi
        # Warm-up at the measured rate: at saturation (a closed loop), it would starve
        # the log's idle-class encoder for its seconds, and the encoder would catch up
        # on the segment inside the measured run.
        bench "$name-warmup" 2 --rate "$RATE" --concurrency "$CONCURRENCY"
        read -r cpu0 log0 < <(cpu "$pid")
        if [ "$mode" = sc ]; then read -r conv0 _ < <(cpu "$cpid"); fi
        spid=
        if [ "${SCHED:-0}" = 1 ]; then
            (sleep "$(python3 -c "print($WARMUP + 1)")" && perf sched record -q -o "$OUT/$name.sched.data" -- sleep "${SCHED_SECS:-3}") >/dev/null 2>&1 &
            spid=$!
        fi
        bench "$name" "$SECS" --rate "$RATE" --concurrency "$CONCURRENCY" --warmup "$WARMUP"
        read -r cpu1 log1 < <(cpu "$pid")
        if [ "$mode" = sc ]; then
            # The converter's CPU counts as the log's (it is the log's work, done
            # outside the server).
            read -r conv1 _ < <(cpu "$cpid")
            log1=$(python3 -c "print($log1 + $conv1 - $conv0)")
        fi
        if [ -n "$spid" ]; then
            wait "$spid" || true
            python3 bench/sched_view.py "$OUT/$name.sched.data" "$pid" >"$OUT/$name.sched.txt" || true
            python3 bench/sched_view.py "$OUT/$name.sched.data" "$pid" --json >"$OUT/$name.sched.json" || true
            rm -f "$OUT/$name.sched.data"
        fi
        sleep 0.5 # one flush tick, so the written count is current
        printf '{"mode": "%s", "dropped": %s, "written": %s, "on_workers": %s, "behind": %s, "cpu_s": %s, "log_cpu_s": %s' "$mode" \
            "$(metric mesh_log_dropped_records_total)" "$(metric mesh_log_written_records_total)" \
            "$(metric mesh_log_worker_turn_records_total)" \
            "$(metric mesh_log_encoder_behind_segments_total)" \
            "$(python3 -c "print(round($cpu1 - $cpu0, 3))")" "$(python3 -c "print(round($log1 - $log0, 3))")" >"$OUT/$name.server.json"
        stop
        if [ "$mode" = sc ]; then
            # After the server, as the kubelet stops a native sidecar: its last pass
            # converts the segment the server closed as it stopped.
            converter_stop
            converted "$name" >>"$OUT/$name.server.json"
        fi
        if [ "$mode" = def ]; then
            # The Parquet work the serving process left: done here, the server stopped,
            # as a converter on another machine would do it. Every record the log
            # took (warm-up and run) must reach a Parquet file.
            t0=$(date +%s.%N)
            "$BIN" logs convert --logs "$DATA/predictions-$name" --json >"$OUT/$name.convert.jsonl"
            t1=$(date +%s.%N)
            converted "$name" "$t0" "$t1" >>"$OUT/$name.server.json"
        fi
        echo "}" >>"$OUT/$name.server.json"
        runs+=("$name")
    done
done

TURNS="${TURNS:-0}" python3 - "$OUT" "$RATE" "$WARMUP" "${STALL_LAG_US:-10000}" "${runs[@]}" <<'PY'
import json, os, statistics, sys
out, rate, warmup, stall_lag, runs = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
print(f"\nDecide, open loop at {rate:.0f} req/s, prediction log on vs off (latency in µs from the intended send time)")
print(f"{'run':<12}{'req/s':>8}{'p50':>7}{'p99':>8}{'p99.9':>8}{'max':>8}{'1s p99 med':>11}{'1s p99 max':>11}{'srv p99':>8}{'srv p99.9':>10}{'lag p99':>8}{'errors':>8}{'dropped':>9}{'written':>9}{'behind':>7}{'cpu %':>7}{'log cpu %':>10}")
modes = ("on", "base", "wt", "def", "own", "sc", "off", "off2")
p99 = {m: [] for m in modes}
sec_med = {m: [] for m in modes}
srv_p99 = {m: [] for m in modes}
srv_sec_med = {m: [] for m in modes}
srv_p999 = {m: [] for m in modes}
# Runs with a second whose p99 passed STALL_LAG_US: how often a mode's runs had a
# stall, whatever its cause.
bad_second = {m: [] for m in modes}
converts = []
# (mode, round) -> (p99, median of the per-second p99s): each mode against the log-off
# run of its own round, the runs next to each other in time.
by_round = {}
# Runs in which the load generator itself was held up (its send lag p99 over
# STALL_LAG_US): this machine now and then stalls whole processes for tens of ms,
# which no server setting causes or cures. They stay in the table and in the
# medians; a second set of medians leaves them out, and says how many.
stalled = {m: [] for m in modes}
for n in runs:
    r = json.load(open(f"{out}/{n}.json"))
    s = json.load(open(f"{out}/{n}.server.json"))
    errors = sum(v for k, v in r["codes"].items() if k != "OK")
    mode = s["mode"]
    p99[mode].append(r["p99_us"])
    by_round[(mode, n.rsplit("-", 1)[1])] = (
        r["p99_us"],
        statistics.median(sorted(w["p99_us"] for w in r.get("windows", [])) or [0]),
        statistics.median(sorted(w.get("server_p99_us") or 0 for w in r.get("windows", [])) or [0]),
    )
    stalled[mode].append(r.get("send_lag_p99_us", 0) > stall_lag)
    log_off = mode in ("off", "off2")
    dropped = "-" if log_off else f"{s['dropped']:.0f}"
    written = "-" if log_off else f"{s['written']:.0f}"
    # Segments the encoder fell behind on (it read the rest of each from the wal): a
    # sign that the log's threads found no idle CPU.
    behind = "-" if log_off else f"{s.get('behind', 0):.0f}"
    # The p99 of each second of the run: its median says how the run went most of
    # the time, its max whether the run's p99 came from a few bad seconds.
    # The CPU was read around the bench command, whose warm-up ran at the same rate.
    busy = r["seconds"] + warmup
    secs = sorted(w["p99_us"] for w in r.get("windows", [])) or [0]
    sec_med[mode].append(statistics.median(secs))
    # The server's own clock (arrival to answer, from the answers' timings): the
    # part of the latency spent inside the server.
    srv = r.get("server") or {"p99_us": 0, "p999_us": 0}
    srv_p99[mode].append(srv["p99_us"])
    srv_p999[mode].append(srv["p999_us"])
    bad_second[mode].append(secs[-1] > stall_lag)
    srv_secs = sorted(w.get("server_p99_us") or 0 for w in r.get("windows", [])) or [0]
    srv_sec_med[mode].append(statistics.median(srv_secs))
    print(f"{n + ('*' if stalled[mode][-1] else ''):<12}{r['throughput']:>8.0f}{r['p50_us']:>7}{r['p99_us']:>8}{r['p999_us']:>8}{r['max_us']:>8}"
          f"{statistics.median(secs):>11.0f}{secs[-1]:>11}{srv['p99_us']:>8}{srv['p999_us']:>10}{r.get('send_lag_p99_us', 0):>8}{errors:>8}"
          f"{dropped:>9}{written:>9}{behind:>7}{100 * s['cpu_s'] / busy:>7.0f}{100 * s['log_cpu_s'] / busy:>10.1f}")
    if "converted" in s:
        converts.append((n, s))
    if s.get("on_workers"):
        print(f"{'':<12}{s['on_workers']:.0f} records put into the columns in the workers' turns ({100 * s['on_workers'] / max(s['written'], 1):.0f}% of those written)")
# The mean of the rounds' ratios, with a 90% interval from resampling the rounds, and
# what it says of the 5% asked: the same function bench/plog_pool.py pools several
# runs with.
sys.path.insert(0, "bench")
from plog_pool import interval
names = {"on": "log on", "base": "log on, served by BASE", "wt": "log on, worker turns", "def": "log on, Parquet deferred",
         "own": "log on, its threads off the server's CPUs (reserved_cpus, or cpus)",
         "sc": "log on, Parquet deferred, a converter running beside the server (--watch)",
         "off2": "log off again (two identical servers: the noise of each figure below)"}
if os.environ.get("TURNS") == "1":
    names["on"] = "log on, the encoder thread alone (worker_turns = false)"
for m in ("on", "base", "wt", "def", "own", "sc", "off2"):
    if not (p99[m] and p99["off"]):
        continue
    print(f"{names[m]} against log off:")
    on, off = statistics.median(p99[m]), statistics.median(p99["off"])
    print(f"  median p99: {on:.0f} µs against {off:.0f} µs, {m}/off {on / off:.3f}")
    # Less moved by one stalled second (this machine stalls whole processes now and
    # then): the median over the runs of each run's median per-second p99.
    on, off = statistics.median(sec_med[m]), statistics.median(sec_med["off"])
    print(f"  median of the per-second p99 medians: {on:.0f} µs against {off:.0f} µs, {m}/off {on / off:.3f}")
    pairs = [(by_round[(m, r)], by_round[("off", r)]) for (mm, r) in by_round if mm == m and ("off", r) in by_round]
    if pairs:
        # This machine's speed drifts over a run (log-off p99s of one run have spread
        # over 1.0-1.6 ms): a ratio within each round, whose runs were minutes apart,
        # is less moved by the drift than a ratio of medians over all rounds.
        ratios = [a[0] / max(b[0], 1) for a, b in pairs]
        sec = [a[1] / max(b[1], 1) for a, b in pairs]
        print(f"  each round's p99 against its own log-off run: {', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.3f}); "
              f"per-second p99 medians: {', '.join(f'{x:.2f}' for x in sec)} (median {statistics.median(sec):.3f})")
        srv = [a[2] / max(b[2], 1) for a, b in pairs]
        print(f"  each round's per-second server p99 median against its own log-off run: {', '.join(f'{x:.2f}' for x in srv)}")
        # The mean of a round's ratio, with a 90% interval from resampling the rounds
        # (a fixed seed: the same runs give the same interval). A figure "within 5%"
        # holds when the interval's top is under 1.05, fails when its bottom is over,
        # and this run cannot tell otherwise; "off2" shows how wide the interval of two
        # identical servers is.
        for label, xs in (("per-second p99 medians", sec), ("per-second server p99 medians", srv)):
            print(f"  round by round, {label}: {interval(xs)}")
        # With AA=1 each round has two log-off runs: against their mean, the baseline's
        # own noise counts half as much (the off2 lines say how large it is).
        both = [(a, by_round[("off", r)], by_round[("off2", r)]) for (mm, r), a in by_round.items()
                if mm == m and m != "off2" and ("off", r) in by_round and ("off2", r) in by_round]
        if both:
            for label, k in (("per-second p99 medians", 1), ("per-second server p99 medians", 2)):
                xs = [a[k] / max((b[k] + c[k]) / 2, 1) for a, b, c in both]
                print(f"  against both log-off runs of each round (their mean), {label}: {interval(xs)}")
    on, off = statistics.median(srv_p99[m]), statistics.median(srv_p99["off"])
    print(f"  median server p99 (arrival to answer): {on:.0f} µs against {off:.0f} µs, {m}/off {on / max(off, 1):.3f}")
    on, off = statistics.median(srv_sec_med[m]), statistics.median(srv_sec_med["off"])
    print(f"  median of the per-second server p99 medians: {on:.0f} µs against {off:.0f} µs, {m}/off {on / max(off, 1):.3f}")
    on, off = statistics.median(srv_p999[m]), statistics.median(srv_p999["off"])
    print(f"  median server p99.9: {on:.0f} µs against {off:.0f} µs, {m}/off {on / max(off, 1):.3f}; "
          f"runs with a second whose p99 passed {stall_lag} µs: {sum(bad_second[m])} of {len(bad_second[m])} "
          f"(log off: {sum(bad_second['off'])} of {len(bad_second['off'])})")
    if any(stalled[m]) or any(stalled["off"]):
        keep = lambda k: [v for v, st in zip(p99[k], stalled[k]) if not st]
        if keep(m) and keep("off"):
            on, off = statistics.median(keep(m)), statistics.median(keep("off"))
            print(f"  median p99 without the runs marked * (load generator's send lag p99 over {stall_lag} µs: "
                  f"{sum(stalled[m])} {m}, {sum(stalled['off'])} off): {on:.0f} µs against {off:.0f} µs, {m}/off {on / off:.3f}")
# BASE: this build's log on against the other build's, round by round.
pairs = [(a, by_round[("base", r)]) for (mm, r), a in by_round.items()
         if mm == "on" and ("base", r) in by_round]
if pairs:
    print("log on, this build, against log on served by BASE:")
    for label, k in (("per-second p99 medians", 1), ("per-second server p99 medians", 2)):
        print(f"  round by round, {label}: {interval([a[k] / max(b[k], 1) for a, b in pairs])}")
    on = statistics.median(srv_sec_med["on"])
    base = statistics.median(srv_sec_med["base"])
    print(f"  median of the per-second server p99 medians: {on:.0f} µs against {base:.0f} µs, on/base {on / max(base, 1):.3f}")
for n, s in converts:
    # `written` was read before the server's shutdown, which writes what was still
    # queued: every record written reaches a Parquet file when converted >= written
    # and no wal is left.
    ok = s["converted"] >= s["written"] and s["wal_left"] == 0
    verdict = f"{s['wal_left']} wal files left: {'every written record is in Parquet' if ok else 'RECORDS MISSING'}"
    if "convert_s" not in s:
        print(f"{n}: the converter beside the server: {s['converted']} records, {verdict}")
        continue
    rps = s["converted"] / s["convert_s"] if s["convert_s"] > 0 else 0
    print(f"{n}: mesh logs convert afterwards: {s['converted']} records in {s['convert_s']:.2f} s ({rps:,.0f} records/s), {verdict}")
print(f"raw output in {out} (several runs' rounds pooled: python3 bench/plog_pool.py DIR DIR ...)")
PY
if [ "${SCHED:-0}" = 1 ]; then
    python3 - "$OUT" "${runs[@]}" <<'PY'
import json, os, statistics, sys
out, runs = sys.argv[1], sys.argv[2:]
by_mode = {}
for n in runs:
    p = os.path.join(out, f"{n}.sched.json")
    if os.path.exists(p) and os.path.getsize(p):
        by_mode.setdefault(n.split("-")[1], []).append(json.load(open(p)))
if by_mode:
    print("\nThe scheduler's view (bench/sched_view.py, perf sched): serving threads preempted by the log's threads,")
    print("a second (each run's figure; median over the runs), and the serving threads' waits for a CPU")
    z = {"per_s": 0.0, "ms_per_s": 0.0, "p90_us": 0.0}
    for m, rs in by_mode.items():
        for k, label in (("server:plog-writer", "writer"), ("server:plog-encoder", "encoder")):
            xs = [r["preempted_by"].get(k, z) for r in rs]
            print(f"  {m:<5} by the {label:<8} {statistics.median(x['per_s'] for x in xs):6.1f}/s "
                  f"({', '.join(format(x['per_s'], '.1f') for x in xs)}), "
                  f"{statistics.median(x['ms_per_s'] for x in xs):5.2f} ms/s, p90 wait "
                  f"{statistics.median(x['p90_us'] for x in xs):.0f} µs")
        w = [r["waits"] for r in rs]
        print(f"  {m:<5} waits for a CPU: {statistics.median(x['ms_per_s'] for x in w):.1f} ms/s, "
              f"p99 {statistics.median(x['p99_us'] for x in w):.0f} µs, p99.9 {statistics.median(x['p999_us'] for x in w):.0f} µs")
PY
fi
