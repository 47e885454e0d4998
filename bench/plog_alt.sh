#!/usr/bin/env bash
# Prediction log on vs off (issue 13), the two servers side by side: one open loop
# (`mesh bench --alternate-addr`) sends each second's Decide requests to one of two
# servers in turn, so both are measured at the same rate, on the same machine, in the
# same minutes. `bench/plog_bench.sh` compares runs of 10 s one after another; this
# machine drifts by 10-30% between them (two identical log-off servers measured 1.08
# to 1.27 apart on the client's clock in one hour), which hides a cost of 5%. Here the
# drift falls on both servers alike, second by second.
#
# Each round has two runs: "on/off" (server A with the log on, server B with it off)
# and "off/off" (both off: what two identical servers give, the noise of the figures),
# in alternating order; each run's first second goes to A in odd rounds and to B in
# even ones. Every server is started fresh for its run, with its own copy of the
# feature store. Prints each run's servers (median per-second p99 on the client's
# clock, from the intended send time, and on the server's, arrival to answer; errors;
# the log's dropped and written records), then each second's p99 against the mean of
# the other server's seconds on either side of it (so a trend over the run cancels):
# the median of each run's ratios, and of all runs' with a 90% interval from resampling
# the runs; then the geometric mean of all runs' ratios, with its interval (a cost that
# falls in a few seconds only, such as a segment converted in one pass at its roll,
# counts there, where the median passes over it). ROUNDS=0 with the OUT of an earlier
# run prints that run's summary again; POOL="DIR ..." adds the runs of other OUT
# directories to the summary (ROUNDS=0 OUT=/tmp/a POOL=/tmp/b: both runs' rounds in one
# estimate). Each run's `mesh bench --html` page is OUT/<run>.html: its per-second
# chart draws each server's p99 through the seconds sent to it.
#
#   bench/plog_alt.sh [MESH_BIN]       (default $MESH_BIN, else $CARGO_TARGET_DIR/release/mesh)
#
# Settings (environment): SECS=30 seconds per run (15 a server), ROUNDS=3, WARMUP=2
# (alternating too), PCT=50 (% of the saturation of one log-off server, measured first
# with 32 callers), RATE (skip the saturation run), PORT=18751 (server A's gRPC port;
# its HTTP port is PORT-1, server B's PORT+2 and PORT+1), OUT (raw output; default a
# new temp dir), NICE (run the servers and the load at this nice value), LOG_CONFIG
# (extra lines for the log-on server's [prediction_log], e.g. 'parquet = "deferred"'),
# NOISE=0 (the on/off runs only: half the time, no estimate of the noise).
#
# What leaks between the two: requests of one second still in flight when the next
# begins (a few ms at these rates) are the first server's, counted in its second; the
# log's encoder and writer finish the records of the log-on server's second in the few
# ms after it (they take their queues every 5 ms), on the same CPUs as the other
# server's requests, so a little of the log's cost lands on the log-off seconds and the
# comparison understates it by that much.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-${MESH_BIN:-${CARGO_TARGET_DIR:-target}/release/mesh}}
[ -x "$BIN" ] || { echo "no mesh binary at $BIN (cargo build --release -p mesh --bin mesh)" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
SECS=${SECS:-30}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-2}
PCT=${PCT:-50}
PORT=${PORT:-18751}
RUN=()
[ -n "${NICE:-}" ] && RUN=(nice -n "$NICE")
DATA=$OUT/data
mkdir -p "$DATA"
source bench/lib.sh
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

if [ "$ROUNDS" != 0 ]; then
    "$BIN" features demo --store "$DATA/features" --views examples/features/views.toml --cards 10000 --merchants 1000 >"$OUT/features.log" 2>&1
fi

grpc_port() { if [ "$1" = a ]; then echo "$PORT"; else echo $((PORT + 2)); fi; }
http_port() { if [ "$1" = a ]; then echo $((PORT - 1)); else echo $((PORT + 1)); fi; }

serve() { # name a|b on|off
    local name=$1 gp hp cfg=$OUT/mesh-$1.toml
    gp=$(grpc_port "$2")
    hp=$(http_port "$2")
    # sled takes its directory for one process: each server a copy of the store.
    rm -rf "$DATA/features-$2"
    cp -r "$DATA/features" "$DATA/features-$2"
    example_config "$DATA/features-$2" "$DATA/predictions-$name" "$gp" "$hp" >"$cfg"
    if [ "$3" = off ]; then
        log_off "$cfg"
    else
        log_set "$cfg" "${LOG_CONFIG:-}"
    fi
    for p in "$gp" "$hp"; do
        if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "port $p is already in use: set PORT" >&2; exit 1; fi
    done
    "${RUN[@]}" "$BIN" serve --config "$cfg" >"$OUT/serve-$name.log" 2>&1 &
    pids+=($!)
    wait_port "$gp" "$OUT/serve-$name.log"
}
stop_all() { cleanup; pids=(); }
metric() { # server(a|b) name: value from its /metrics (0 when absent)
    curl -s "http://127.0.0.1:$(http_port "$1")/metrics" | awk -v m="$2" '$1 == m {v = $2} END {print v + 0}'
}

if [ "$ROUNDS" = 0 ]; then
    # The summary of the runs already in OUT; their rate is in their reports.
    RATE=$(python3 -c "import glob, json; print(next((json.load(open(p))['mode'].split()[3] for p in sorted(glob.glob('$OUT/on-off-*.json')) if not p.endswith('.servers.json')), '?'))")
elif [ -n "${RATE:-}" ]; then
    echo "open loop at RATE=$RATE req/s (given)"
else
    sync
    serve sat a off
    "${RUN[@]}" "$BIN" bench --addr "http://127.0.0.1:$PORT" --target decide --seconds 2 --concurrency 8 --json >"$OUT/sat-warmup.json" 2>/dev/null
    "${RUN[@]}" "$BIN" bench --addr "http://127.0.0.1:$PORT" --target decide --seconds 10 --concurrency 32 --json >"$OUT/saturation.json" 2>"$OUT/saturation.err"
    stop_all
    SAT=$(python3 -c "import json;print(round(json.load(open('$OUT/saturation.json'))['throughput']))")
    RATE=$(python3 -c "print(round($SAT * $PCT / 100))")
    echo "saturation (one server, log off, closed loop, 32 callers): $SAT req/s; open loop at $PCT %: $RATE req/s"
fi

for r in $(seq "$ROUNDS"); do
    runs=("on off" "off off2")
    if [ $((r % 2)) = 0 ]; then runs=("off off2" "on off"); fi
    if [ "${NOISE:-1}" = 0 ]; then runs=("on off"); fi
    for pair in "${runs[@]}"; do
        read -r ma mb <<<"$pair"
        # Even rounds swap the servers' places: the log-on (or first log-off) server
        # gets the odd seconds.
        if [ $((r % 2)) = 0 ]; then sa=$mb; sb=$ma; else sa=$ma; sb=$mb; fi
        name=$ma-$mb-$r
        sync
        serve "$name-$sa" a "${sa%2}"
        serve "$name-$sb" b "${sb%2}"
        "${RUN[@]}" "$BIN" bench --addr "http://127.0.0.1:$(grpc_port a)" --alternate-addr "http://127.0.0.1:$(grpc_port b)" \
            --target decide --rate "$RATE" --seconds "$SECS" --warmup "$WARMUP" --json --html "$OUT/$name.html" >"$OUT/$name.json" 2>"$OUT/$name.err"
        dropped=0 written=0
        for s in a b; do
            dropped=$((dropped + $(metric "$s" mesh_log_dropped_records_total)))
            written=$((written + $(metric "$s" mesh_log_written_records_total)))
        done
        printf '{"a": "%s", "b": "%s", "dropped": %s, "written": %s}\n' "$sa" "$sb" "$dropped" "$written" >"$OUT/$name.servers.json"
        stop_all
        echo "round $r: $name done (A $sa, B $sb; log dropped $dropped, written $written)"
    done
done

# shellcheck disable=SC2086
python3 - "$RATE" "$OUT" ${POOL:-} <<'PY'
import glob, json, math, os, random, statistics as st, sys
rate, dirs = sys.argv[1], sys.argv[2:]

def ratios(windows, first, second, key):
    """Each `first` second's figure over the mean of the `second` seconds beside it."""
    xs = []
    for k, w in enumerate(windows):
        if w["who"] != first or w.get(key) is None:
            continue
        side = [windows[j][key] for j in (k - 1, k + 1)
                if 0 <= j < len(windows) and windows[j]["who"] == second and windows[j].get(key)]
        if side and w[key]:
            xs.append(w[key] / st.mean(side))
    return xs

def resampled(runs, f=st.median, q=0.90, n=2000):
    """`f` (the median) of every second's ratio, with a `q` interval from resampling the
    runs (a run's seconds are not independent of each other; the runs are), seeded."""
    rng = random.Random(1)
    fs = sorted(f([x for r in (rng.choice(runs) for _ in runs) for x in r]) for _ in range(n))
    return f([x for r in runs for x in r]), fs[int(n * (1 - q) / 2)], fs[int(n * (1 + q) / 2) - 1]

print(f"\nDecide, one open loop at {rate} req/s alternating each second between two servers")
print(f"{'run':14} {'A':>4} {'B':>4} {'seconds':>8} {'p99 med A':>10} {'p99 med B':>10} {'srv A':>6} {'srv B':>6} {'errors':>7} {'dropped':>8} {'written':>8}")
pooled = {}
for path in sorted(p for out in dirs for p in glob.glob(os.path.join(out, "*-*-[0-9]*.json"))):
    if path.endswith(".servers.json"):
        continue
    name = os.path.basename(path)[:-5] if len(dirs) == 1 else os.path.relpath(path[:-5], os.path.dirname(os.path.dirname(path)))
    rep = json.load(open(path))
    srv = json.load(open(path[:-5] + ".servers.json"))
    ws = [w for w in rep["windows"] if w["seconds"] >= 0.5]
    who = {0: srv["a"], 1: srv["b"]}
    for k, w in enumerate(ws):
        w["who"] = who[k % 2]
    med = lambda m, key: round(st.median([w[key] for w in ws if w["who"] == m and w.get(key)] or [0]))
    errors = sum(rep.get("codes", {}).values()) - rep.get("codes", {}).get("OK", 0)
    print(f"{name:14} {srv['a']:>4} {srv['b']:>4} {len(ws):>8} {med(srv['a'], 'p99_us'):>10} {med(srv['b'], 'p99_us'):>10} "
          f"{med(srv['a'], 'server_p99_us'):>6} {med(srv['b'], 'server_p99_us'):>6} {errors:>7} {srv['dropped']:>8} {srv['written']:>8}")
    test, base = ("on", "off") if "on" in (srv["a"], srv["b"]) else ("off2", "off")
    for key in ("p99_us", "server_p99_us"):
        # Each second of the one against its neighbours of the other, both ways round.
        xs = ratios(ws, test, base, key) + [1 / x for x in ratios(ws, base, test, key) if x]
        pooled.setdefault((test, key), []).append(xs)
def pooled_runs():
    """(label, clock, each run's ratios) for every comparison and clock that has runs."""
    for test, label in (("on", "log on against log off"), ("off2", "log off against log off (the noise)")):
        for key, clock in (("p99_us", "client's clock"), ("server_p99_us", "server's clock")):
            runs = [r for r in pooled.get((test, key), []) if r]
            if runs:
                yield label, clock, runs

print("\neach second's p99 against the other server's seconds beside it: the median of each run's, and of all")
print("runs' seconds with a 90% interval from resampling the runs")
for label, clock, runs in pooled_runs():
    m, lo, hi = resampled(runs)
    verdict = "under 1.05" if hi < 1.05 else ("over 1.05" if lo > 1.05 else "cannot tell against 1.05")
    each = ", ".join(f"{st.median(r):.3f}" for r in runs)
    print(f"  {label:36} {clock}: runs {each}; all {m:.3f} ({lo:.3f}-{hi:.3f}) {verdict}")
# The median passes over a cost that falls in a few seconds only (a segment converted
# in one pass at its roll, say); the geometric mean of the same ratios counts it (and,
# unlike their plain mean, reads the same whichever server is on top of the ratio).
geomean = lambda xs: math.exp(st.mean(math.log(x) for x in xs))
print("the same seconds' geometric mean, with its interval (a cost gathered into a few seconds counts here)")
for label, clock, runs in pooled_runs():
    m, lo, hi = resampled(runs, geomean)
    print(f"  {label:36} {clock}: all {m:.3f} ({lo:.3f}-{hi:.3f})")
PY
echo "raw output in $OUT"
