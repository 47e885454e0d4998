#!/usr/bin/env bash
# Issue-2 benchmark: Triton's perf_analyzer (and h2load) against `mesh serve`
# with the reference fraud model at concurrency 1, 8 and 32, against a do-nothing
# OIP server (the transport's limit here), and batching on vs off for a
# compute-heavy MLP. Prints one table; raw CSVs go to $OUT.
#
#   bench/oip_perf.sh            (after: cargo build --release -p mesh --bin mesh --example null_oip)
#
# Needs: a venv with tritonclient==2.48.0 and nvidia-cuda-runtime-cu12 (VENV), Debian's
# libb64-0d and nghttp2-client.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CARGO_TARGET_DIR:-target}/release
VENV=${VENV:-.venv}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
WINDOW_MS=${WINDOW_MS:-3000}
PA="$VENV/bin/perf_analyzer"
CUDART=$(dirname "$(find "$VENV" -name 'libcudart.so.12' | head -1)")
export LD_LIBRARY_PATH="$CUDART${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
SAMPLES=tests/data/fraud-mlp/samples.csv

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

source bench/lib.sh

HEAVY=$OUT/heavy-repo
mkdir -p "$HEAVY"
"$VENV/bin/python" bench/make_heavy_mlp.py "$HEAVY"

"$BIN/mesh" serve --models examples/models --grpc-port 8201 --http-port 8200 >"$OUT/mesh.log" 2>&1 & pids+=($!)
"$BIN/examples/null_oip" examples/models/fraud_mlp 8202 >"$OUT/null.log" 2>&1 & pids+=($!)
"$BIN/mesh" serve --models "$HEAVY" --grpc-port 8203 --http-port 8204 >"$OUT/heavy.log" 2>&1 & pids+=($!)
wait_port 8201; wait_port 8202; wait_port 8203

run_pa() { # name port model concurrency
    "$PA" -m "$3" -x 1 -u "127.0.0.1:$2" -i grpc --concurrency-range "$4" -p "$WINDOW_MS" \
        --max-trials 10 --stability-percentage 25 --percentile 99 -f "$OUT/$1-c$4.csv" >"$OUT/$1-c$4.txt" 2>&1 \
        || { echo "perf_analyzer failed for $1 c=$4:"; tail -5 "$OUT/$1-c$4.txt"; }
}

for c in 1 8 32; do
    run_pa mesh 8201 fraud_mlp "$c"
    run_pa null 8202 fraud_mlp "$c"
done
run_pa heavy-batched 8203 heavy_batched 32
run_pa heavy-unbatched 8203 heavy_unbatched 32

"$VENV/bin/python" bench/grpc_body.py "$SAMPLES" fraud_mlp "$OUT/body.bin"
H2="-n 40000 -c 4 -m 8 -d $OUT/body.bin -H content-type:application/grpc -H te:trailers"
h2load $H2 http://127.0.0.1:8201/inference.GRPCInferenceService/ModelInfer >"$OUT/h2load-mesh.txt" 2>&1 || true
h2load $H2 http://127.0.0.1:8202/inference.GRPCInferenceService/ModelInfer >"$OUT/h2load-null.txt" 2>&1 || true

"$VENV/bin/python" - "$OUT" <<'PY'
import csv, glob, os, re, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{out}/*-c*.csv")):
    name = os.path.basename(f)[:-4]
    with open(f) as fh:
        r = list(csv.DictReader(fh))
    if r:
        rows[name] = r[0]
def us(r, k): return float(r.get(k, 0) or 0)
print(f"{'run':<22}{'infer/s':>10}{'p50 us':>9}{'p99 us':>9}{'queue us':>10}{'compute us':>12}")
for name, r in rows.items():
    comp = us(r, "Server Compute Input") + us(r, "Server Compute Infer") + us(r, "Server Compute Output")
    print(f"{name:<22}{float(r['Inferences/Second']):>10.0f}{us(r,'p50 latency'):>9.0f}{us(r,'p99 latency'):>9.0f}{us(r,'Server Queue'):>10.0f}{comp:>12.0f}")
def tput(n): return float(rows[n]["Inferences/Second"]) if n in rows else float("nan")
print(f"\nmesh / null at c=32: {tput('mesh-c32') / tput('null-c32'):.2f}")
print(f"heavy batched / unbatched at c=32: {tput('heavy-batched-c32') / tput('heavy-unbatched-c32'):.2f}")
for n in ("mesh", "null"):
    p = f"{out}/h2load-{n}.txt"
    if os.path.exists(p):
        t = open(p).read()
        m = re.search(r"finished in .*?, ([\d.]+) req/s", t)
        s = re.search(r"succeeded, (\d+) failed", t)
        print(f"h2load {n}: {m.group(1) if m else '?'} req/s")
print(f"raw output in {out}")
PY
