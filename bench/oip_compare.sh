#!/usr/bin/env bash
# OIP transport overhead, side by side in one run: `mesh serve` against do-nothing
# servers that speak the same protocol on the same machine.
#   gRPC: h2load (1 row per request) against mesh and mesh/examples/null_oip.rs at
#         concurrency 1, 8 and 32; p50 at concurrency 1 from `mesh bench --target infer`
#         (closed loop), which reports percentiles (h2load reports only mean/sd).
#   REST: wrk with the same JSON body against mesh and mesh/examples/null_rest.rs
#         (parses the body exactly as the mesh does, answers a fixed OIP response).
# A third server is the mesh with one [batching] setting changed in a copy of the
# example repository (BASELINE, default `inline_below_us = 0`: every request queued
# for a runner thread): the baseline for that setting, in the same run.
# Rounds alternate the servers (ROUNDS, default 2); the table shows the median of
# the rounds and the spread. Concurrency 1 runs C1_RUNS (default 5) shorter runs of
# C1_SECONDS (default 2) a round instead of one, each on new connections: on this
# 2-core virtual machine one connection's latency at concurrency 1 settles in one of
# two modes (about 37 or 75 µs p50 for the same server, by where the scheduler put
# the connection's thread against the load generator's), and one run per round
# compared whichever modes the servers happened to draw.
#
#   bench/oip_compare.sh      (builds what it needs in release)
#
# Needs Debian's nghttp2-client (h2load) and wrk, and the test venv (MESH_VENV) for
# the gRPC body (tritonclient's protobufs).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
VENV=${MESH_VENV:-$ROOT/.venv}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
ROUNDS=${ROUNDS:-2}
SECONDS_EACH=${SECONDS_EACH:-5}
C1_RUNS=${C1_RUNS:-5}
C1_SECONDS=${C1_SECONDS:-2}
for tool in h2load wrk; do
    command -v $tool >/dev/null || { echo "oip_compare.sh: $tool missing (apt-get install nghttp2-client wrk)" >&2; exit 1; }
done
"$VENV/bin/python" -c 'import numpy, tritonclient.grpc' 2>/dev/null || {
    echo "oip_compare.sh: no Python with tritonclient at $VENV (scripts/test makes the test venv there; or set MESH_VENV)" >&2
    exit 1
}
if [ -z "${MESH_BIN:-}" ]; then
    cargo build -q --release -p mesh --bin mesh --example null_oip --example null_rest
    MESH_BIN=$TARGET/release/mesh
fi
EX=$(dirname "$MESH_BIN")/examples

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
source bench/lib.sh

P=${PORT_BASE:-18400}
BASELINE=${BASELINE:-inline_below_us = 0}
key=${BASELINE%% *}
rm -rf "$OUT/models-base"
cp -r examples/models "$OUT/models-base"
for f in "$OUT"/models-base/*/model.toml; do
    if grep -q "^$key = " "$f"; then
        sed -i "s/^$key = .*/$BASELINE/" "$f"
    else
        sed -i "s/^\[batching\]$/[batching]\n$BASELINE/" "$f"
    fi
    grep -qx "$BASELINE" "$f" || { echo "oip_compare.sh: could not set '$BASELINE' in $f" >&2; exit 1; }
done
"$MESH_BIN" serve --models examples/models --grpc-port $((P+1)) --http-port $((P+0)) >"$OUT/mesh.log" 2>&1 & pids+=($!)
"$MESH_BIN" serve --models "$OUT/models-base" --grpc-port $((P+21)) --http-port $((P+20)) >"$OUT/base.log" 2>&1 & pids+=($!)
"$EX/null_oip" examples/models/fraud_mlp $((P+11)) >"$OUT/null_oip.log" 2>&1 & pids+=($!)
"$EX/null_rest" examples/models/fraud_mlp $((P+12)) >"$OUT/null_rest.log" 2>&1 & pids+=($!)
wait_port $((P+1)); wait_port $((P+0)); wait_port $((P+11)); wait_port $((P+12)); wait_port $((P+21)); wait_port $((P+20))
sleep 1 # warmup of the mesh's models

"$VENV/bin/python" bench/grpc_body.py tests/data/fraud-mlp/samples.csv fraud_mlp "$OUT/body.bin"
"$VENV/bin/python" - "$OUT/body.json" <<'PY'
import csv, json, sys
with open("tests/data/fraud-mlp/samples.csv") as f:
    next(f)
    x = [float(v) for v in next(f).split(",")[1:33]]
json.dump({"inputs": [{"name": "input", "shape": [1, 32], "datatype": "FP32", "data": x}]}, open(sys.argv[1], "w"))
PY
cat >"$OUT/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$OUT/body.json", "r"); wrk.body = f:read("*a"); f:close()
LUA

# h2load: concurrency c as streams over up to 4 connections.
grpc_run() { # name port c [seconds run]
    local conns=$(( $3 < 4 ? $3 : 4 ))
    local streams=$(( $3 / conns ))
    local f=$OUT/h2-$1-c$3-r$r${5:+-$5}.txt
    h2load -D "${4:-$SECONDS_EACH}" -c "$conns" -m "$streams" -d "$OUT/body.bin" \
        -H content-type:application/grpc -H te:trailers \
        "http://127.0.0.1:$2/inference.GRPCInferenceService/ModelInfer" >"$f" 2>&1 || true
    awk '/finished in/ {gsub(",","",$4); print $4}' "$f"
}
grpc_p50() { # name port
    "$MESH_BIN" bench --addr "http://127.0.0.1:$2" --target infer --concurrency 1 \
        --seconds "$SECONDS_EACH" --json >"$OUT/bench-$1-r$r.json" 2>/dev/null || true
    "$VENV/bin/python" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["p50_us"])' "$OUT/bench-$1-r$r.json" 2>/dev/null || echo nan
}
rest_run() { # name port c [seconds run] -> "req/s p50_us"
    local f=$OUT/wrk-$1-c$3-r$r${5:+-$5}.txt
    wrk -t 1 -c "$3" -d "${4:-$SECONDS_EACH}s" --latency -s "$OUT/post.lua" \
        "http://127.0.0.1:$2/v2/models/fraud_mlp/infer" >"$f" 2>&1 || true
    "$VENV/bin/python" - "$f" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
rps = re.search(r"Requests/sec:\s+([\d.]+)", t)
p50 = re.search(r"^\s+50%\s+([\d.]+)(us|ms|s)", t, re.M)
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
scale = {"us": 1, "ms": 1e3, "s": 1e6}
print(rps.group(1) if rps and not non2xx else "nan", float(p50.group(1)) * scale[p50.group(2)] if p50 else "nan")
PY
}

: >"$OUT/results.txt"
for r in $(seq "$ROUNDS"); do
    # Concurrency 1: short runs on new connections, the servers taking turns.
    for k in $(seq "$C1_RUNS"); do
        for s in "mesh $((P+1))" "null $((P+11))" "base $((P+21))"; do
            set -- $s; echo "grpc $1 c1 $(grpc_run "$1" "$2" 1 "$C1_SECONDS" "$k")" >>"$OUT/results.txt"
        done
        for s in "mesh $((P+0))" "null $((P+12))" "base $((P+20))"; do
            set -- $s; echo "rest $1 c1 $(rest_run "$1" "$2" 1 "$C1_SECONDS" "$k")" >>"$OUT/results.txt"
        done
    done
    for c in 8 32; do
        for s in "mesh $((P+1))" "null $((P+11))" "base $((P+21))"; do
            set -- $s; echo "grpc $1 c$c $(grpc_run "$1" "$2" "$c")" >>"$OUT/results.txt"
        done
        for s in "mesh $((P+0))" "null $((P+12))" "base $((P+20))"; do
            set -- $s; echo "rest $1 c$c $(rest_run "$1" "$2" "$c")" >>"$OUT/results.txt"
        done
    done
    for s in "mesh $((P+1))" "null $((P+11))" "base $((P+21))"; do
        set -- $s; echo "grpcp50 $1 c1 $(grpc_p50 "$1" "$2")" >>"$OUT/results.txt"
    done
done

"$VENV/bin/python" - "$OUT/results.txt" "$BASELINE" <<'PY'
import statistics as st, sys
rows = {}
for line in open(sys.argv[1]):
    parts = line.split()
    kind, server, c = parts[:3]
    vals = [float(v) for v in parts[3:]] or [float("nan")]
    rows.setdefault((kind, c, server), []).append(vals)
def med(kind, c, server, i=0):
    v = [x[i] for x in rows.get((kind, c, server), []) if len(x) > i]
    return (st.median(v), min(v), max(v)) if v else (float("nan"),) * 3
def fmt(m): return f"{m[0]:,.0f} ({m[1]:,.0f}-{m[2]:,.0f})"
print(f"| protocol | concurrency | mesh req/s | null server req/s | ratio | mesh, {sys.argv[2]} | its ratio |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for kind in ("grpc", "rest"):
    for c in ("c1", "c8", "c32"):
        m, n, z = med(kind, c, "mesh"), med(kind, c, "null"), med(kind, c, "base")
        print(f"| {kind} | {c[1:]} | {fmt(m)} | {fmt(n)} | {m[0] / n[0]:.2f} | {fmt(z)} | {z[0] / n[0]:.2f} |")
m, n, z = med("grpcp50", "c1", "mesh"), med("grpcp50", "c1", "null"), med("grpcp50", "c1", "base")
print(f"\np50 at concurrency 1, gRPC (mesh bench): mesh {m[0]:.0f} µs, null {n[0]:.0f} µs, difference {m[0]-n[0]:.0f} µs; mesh with {sys.argv[2]} {z[0]:.0f} µs")
m, n, z = med("rest", "c1", "mesh", 1), med("rest", "c1", "null", 1), med("rest", "c1", "base", 1)
print(f"p50 at concurrency 1, REST (wrk): mesh {m[0]:.0f} µs, null {n[0]:.0f} µs, difference {m[0]-n[0]:.0f} µs; mesh with {sys.argv[2]} {z[0]:.0f} µs")
PY
echo "raw output: $OUT"
