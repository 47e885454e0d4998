#!/usr/bin/env bash
# Overload: does the mesh keep answering usefully when offered more than it can do?
# A compute-heavy model (bench/make_heavy_fraud.py: the fraud model's inputs, input
# spec and thresholds, a 32-3072-3072-1 MLP on one runner thread) so that the model,
# not the transport, saturates. Its saturation throughput: ModelInfer in closed loop,
# 24 callers (three batches: one running, two waiting), no deadline of the callers'
# own (so no refusal comes back at once to be sent again): the model's answers per
# second. Then ModelInfer and Decide in open loop at 1x, 2x and 4x of it, each request
# with a 50 ms deadline (grpc-timeout, counted from when it was due), each of these
# cells between two saturation runs: a shared machine's speed moved by up to 18% within two
# minutes here, so "of sat" is a cell's useful answers against the mean of the saturation
# runs just before and after it, and its offered rate a multiple of the one before.
# Useful answers are model answers (Decide: MODEL or PREVIOUS_VERSION) within the
# deadline; "late" are answers of any status more than 5 ms past the deadline (by
# status: a late Cancelled is the client's own timer firing late), and "lag max" how
# far behind its schedule the load generator sent a request (both inside its
# latencies). Where the capacity went, from the server around each run: "busy", the
# model's runner computing, of the run's wall time; "rows/b" and "ms/b", its batches;
# "cpu/req", the server's CPU outside the runner per request sent, in µs (refused
# ones included). ROUNDS repeats all of it, and the summary gives each cell's median
# and range over the rounds and how many cells reached 90%. Prints one table; raw
# JSON reports and the server's /metrics and threads' CPU before and after each run
# go to $OUT.
#
#   cargo build --release -p mesh --bin mesh
#   bench/overload_bench.sh [path/to/mesh]
#
# MESH_BIN (or the first argument) is the mesh binary that sends the load; SERVER_BIN
# (default: the same) is the one that serves, so an older build can be measured
# with the same client. SAT (the rate that 1x means, and what "of sat" is against;
# default: the saturation runs around each cell), SECS (8) per run, ROUNDS (1),
# DEADLINE_MS (50), MULTS ("1 2 4"), TARGETS ("infer decide"), HIDDEN (3072: the
# model's width), PYTHON (python3 with numpy). The prediction log is off (its cost is
# bench/plog_bench.sh's subject).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-${MESH_BIN:-${CARGO_TARGET_DIR:-target}/release/mesh}}
SERVER_BIN=${SERVER_BIN:-$BIN}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
SECS=${SECS:-8}
ROUNDS=${ROUNDS:-1}
DEADLINE_MS=${DEADLINE_MS:-50}
MULTS=${MULTS:-1 2 4}
TARGETS=${TARGETS:-infer decide}
HIDDEN=${HIDDEN:-3072}
PYTHON=${PYTHON:-python3}
GRPC=${GRPC_PORT:-8501}
HTTP=${HTTP_PORT:-8500}
"$PYTHON" -c 'import numpy' 2>/dev/null || { echo "needs numpy: set PYTHON to a python3 that has it" >&2; exit 1; }
[ -x "$BIN" ] || { echo "no mesh binary at $BIN (cargo build --release -p mesh --bin mesh)" >&2; exit 1; }
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT
source bench/lib.sh

mkdir -p "$OUT/models"
"$PYTHON" bench/make_heavy_fraud.py "$OUT/models" "$HIDDEN"
"$BIN" features demo --store "$OUT/features" --views examples/features/views.toml --cards 10000 --merchants 1000 >/dev/null
# examples/mesh.toml with absolute paths, the heavy model deployed, no log, and a
# per-try timeout that spans the decision's budget less the fallback reserve (a
# batch of this model takes a good part of the example's 20 ms).
example_config "$OUT/features" "$OUT/predictions" "$GRPC" "$HTTP" "$OUT/models" |
    sed -e "s#^model = \"fraud_mlp\"#model = \"heavy_fraud\"#" \
        -e "s#^deadline = .*#deadline = \"${DEADLINE_MS}ms\"#" \
        -e "s#^per_try_timeout = .*#per_try_timeout = \"$((DEADLINE_MS - 5))ms\"#" >"$OUT/mesh.toml"
log_off "$OUT/mesh.toml"
"$SERVER_BIN" serve --config "$OUT/mesh.toml" >"$OUT/serve.log" 2>&1 &
pid=$!
wait_port "$GRPC" "$OUT/serve.log"

# The server as a run leaves it: the wall clock, each thread's /proc stat line (its
# CPU time) and /metrics. The summary reads two of them around each run.
snap() {
    {
        date +%s.%N
        for t in /proc/"$pid"/task/*; do echo "stat $(cat "$t/stat" 2>/dev/null)"; done
        curl -s "http://127.0.0.1:$HTTP/metrics" || true
    } >"$1"
}
bench() { # name target args...
    local name=$1 target=$2
    shift 2
    snap "$OUT/$name.before"
    "$BIN" bench --addr "http://127.0.0.1:$GRPC" --target "$target" --model heavy_fraud \
        --json "$@" >"$OUT/$name.json" 2>"$OUT/$name.err"
    snap "$OUT/$name.after"
}
# Model answers per second of a report: Infer's OK, Decide's MODEL and PREVIOUS_VERSION.
answers() { "$PYTHON" -c "
import json, sys
r = json.load(open(sys.argv[1]))
n = r['sources'].get('MODEL', 0) + r['sources'].get('PREVIOUS_VERSION', 0) if r['sources'] else r['codes'].get('OK', 0)
print(n / r['seconds'])" "$1"; }

bench warmup infer --concurrency 8 --seconds 2
# Each round: a saturation run before every cell and one after the last, so that each
# cell is read against the saturation measured just around it (the mean of the runs
# before and after it): a shared machine's speed moved by up to 18% within two minutes here, and a
# ratio against the ends of a whole run would carry that drift. The offered rates are
# multiples of the saturation run just before the cell, or of SAT=<req/s> when given
# (to compare builds at the same offered load).
cells=()
for target in $TARGETS; do for m in $MULTS; do cells+=("$target:$m"); done; done
for r in $(seq 1 "$ROUNDS"); do
    i=0
    bench "r$r-sat$i" infer --concurrency 24 --seconds "$SECS"
    for cell in "${cells[@]}"; do
        target=${cell%%:*} m=${cell##*:}
        sat=${SAT:-$(answers "$OUT/r$r-sat$i.json")}
        if [ "$target" = decide ] && [ ! -e "$OUT/decide-warmup.json" ]; then
            bench decide-warmup decide --concurrency 8 --seconds 2
        fi
        rate=$("$PYTHON" -c "print(max(1, round($sat * $m)))")
        bench "r$r-$target-${m}x" "$target" --rate "$rate" --concurrency 64 --seconds "$SECS" --deadline-ms "$DEADLINE_MS"
        i=$((i + 1))
        bench "r$r-sat$i" infer --concurrency 24 --seconds "$SECS"
    done
done

"$PYTHON" - "$OUT" "$ROUNDS" "${cells[*]}" "${SAT:-}" <<'PY'
import json, os, statistics, sys
out, rounds, cells, given = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
TICK = os.sysconf("SC_CLK_TCK")
def snapshot(path):
    """(wall s, {thread name: CPU s}, {metric: sum over the heavy model's series})."""
    lines = open(path).read().splitlines()
    cpu, metrics = {}, {}
    for line in lines[1:]:
        if line.startswith("stat "):
            st = line[5:]
            if ")" not in st:
                continue  # the thread ended between the listing and the read
            name = st[st.index("(") + 1 : st.rindex(")")]
            fields = st[st.rindex(")") + 2 :].split()
            cpu[name] = cpu.get(name, 0) + (int(fields[11]) + int(fields[12])) / TICK
        elif 'model="heavy_fraud"' in line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            name = key.split("{", 1)[0]
            metrics[name] = metrics.get(name, 0) + float(value)
    return float(lines[0]), cpu, metrics
def server_side(run, requests):
    """The model's busy share of the run's wall time (1 runner computing all along:
    100%), its rows per batch and milliseconds per batch, and the server's CPU per
    request outside the model's runners (µs), from the snapshots around the run."""
    try:
        (w0, c0, m0), (w1, c1, m1) = snapshot(f"{out}/{run}.before"), snapshot(f"{out}/{run}.after")
    except (OSError, ValueError, IndexError):
        return f"{'-':>6}{'-':>7}{'-':>6}{'-':>8}"
    d = lambda k: m1.get(k, 0) - m0.get(k, 0)
    batches = d("mesh_model_batch_size_count")
    compute = d("mesh_model_compute_seconds_sum")
    other = sum(v - c0.get(k, 0) for k, v in c1.items() if k != "mesh-runner")
    return (f"{compute / max(w1 - w0, 1e-9):>6.0%}{d('mesh_model_batch_size_sum') / max(batches, 1):>7.2f}"
            f"{1000 * compute / max(batches, 1):>6.2f}{1e6 * other / max(requests, 1):>8.0f}")
def report(run):
    return json.load(open(f"{out}/{run}.json"))
def model_answers(r):
    """Model answers per second of a saturation run (no deadline: all of them are useful)."""
    return r["codes"].get("OK", 0) / r["seconds"]
print(f"{'run':<22}{'offered/s':>10}{'useful/s':>10}{'sat/s':>8}{'of sat':>8}{'p50 us':>9}{'p99 us':>9}{'max us':>9}{'late':>6}{'lag max':>9}"
      f"{'busy':>6}{'rows/b':>7}{'ms/b':>6}{'cpu/req':>8}  statuses (Decide: sources); late by status")
of_sat = {c: [] for c in cells}
late_total = 0
for rd in range(1, rounds + 1):
    sats = [model_answers(report(f"r{rd}-sat{i}")) for i in range(len(cells) + 1)]
    for i, cell in enumerate(cells):
        target, m = cell.split(":")
        run = f"r{rd}-{target}-{m}x"
        r = report(run)
        s = float(given) if given else (sats[i] + sats[i + 1]) / 2
        u = r["useful"]
        offered = r["requests"] / r["seconds"]
        rest = dict(r["codes"])
        if r["sources"]:
            rest.update({f"src:{k}": v for k, v in r["sources"].items()})
        of_sat[cell].append(u["per_second"] / s)
        late_total += u["late"]
        print(f"{f'{rd}: {target} {m}x':<22}{offered:>10.0f}{u['per_second']:>10.0f}{s:>8.0f}{u['per_second'] / s:>8.0%}"
              f"{r['p50_us']:>9}{r['p99_us']:>9}{r['max_us']:>9}{u['late']:>6}{r.get('send_lag_max_us', 0):>9}"
              f"{server_side(run, r['requests'])}  {rest}"
              + (f"; late {u['late_codes']}" if u.get('late_codes') else ""))
    print(f"{f'{rd}: saturation':<22}" + ", ".join(f"{x:.0f}" for x in sats) + " answers/s, in the order run"
          f" (each cell's: the two on either side of it)")
against = f"SAT={float(given):.0f}/s, as given" if given else "the mean of the saturation runs just before and after it"
print(f"of sat: each cell's useful answers per second against {against}")
print("busy: the model's runner computing, of each run's wall time; rows/b, ms/b: its batches; cpu/req: the server's CPU outside the runner per request sent (µs)")
first = cells[0].split(":")
deadline = report(f"r1-{first[0]}-{first[1]}x")["useful"]["deadline_ms"]
print(f"saturation: ModelInfer, closed loop, 24 callers, no deadline; the cells: open loop at multiples of the saturation run before them, deadline {deadline} ms; raw reports in {out}")
values = [v for vs in of_sat.values() for v in vs]
print(f"over {rounds} round(s): {sum(v >= 0.9 for v in values)} of {len(values)} cells at 90% or more of saturation; answers more than 5 ms past the deadline: {late_total}")
for cell, vs in of_sat.items():
    target, m = cell.split(":")
    print(f"  {target} {m}x: median {statistics.median(vs):.0%}, range {min(vs):.0%}-{max(vs):.0%}")
PY
