#!/usr/bin/env bash
# The cost of the mesh's own path on OIP gRPC: h2load (1 row per request, the
# reference fraud model) against a do-nothing tonic OIP server (null_oip: the
# transport's limit here) and `mesh serve`, and optionally other mesh builds
# (OTHERS="name=path ...", e.g. before a change), at concurrency 1, 8 and 32 (that many clients,
# one request in flight each), the servers taking turns, ROUNDS rounds. Prints one
# row per server and concurrency: the median req/s over the rounds, its ratio to
# null_oip, and h2load's mean request time.
#
#   cargo build --release -p mesh --bin mesh --example null_oip
#   bench/hops_bench.sh [path/to/mesh]
#
# MESH_BIN (or the first argument), NULL_BIN (default: examples/null_oip next to
# it), OTHERS (optional), SECS (5) per run, ROUNDS (3), CONCURRENCY ("1 8 32"),
# PYTHON (a python3 with numpy and tritonclient, for the request body).
# Needs h2load (Debian: nghttp2-client).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-${MESH_BIN:-${CARGO_TARGET_DIR:-target}/release/mesh}}
NULL_BIN=${NULL_BIN:-$(dirname "$BIN")/examples/null_oip}
OTHERS=${OTHERS:-}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
SECS=${SECS:-5}
ROUNDS=${ROUNDS:-3}
CONCURRENCY=${CONCURRENCY:-1 8 32}
PYTHON=${PYTHON:-python3}
command -v h2load >/dev/null || { echo "needs h2load (apt-get install nghttp2-client)" >&2; exit 1; }

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
source bench/lib.sh

"$PYTHON" bench/grpc_body.py tests/data/fraud-mlp/samples.csv fraud_mlp "$OUT/body.bin"
# A repository of the fraud MLP alone: what the requests call, and nothing an older
# build (OTHERS) might not know how to load.
mkdir -p "$OUT/models" && cp -r examples/models/fraud_mlp "$OUT/models/"
servers="null:8602 mesh:8601"
"$NULL_BIN" examples/models/fraud_mlp 8602 >"$OUT/null.log" 2>&1 & pids+=($!)
"$BIN" serve --models "$OUT/models" --grpc-port 8601 --http-port 8600 >"$OUT/mesh.log" 2>&1 & pids+=($!)
port=8603
for o in $OTHERS; do
    "${o#*=}" serve --models "$OUT/models" --grpc-port "$port" --http-port $((port + 100)) >"$OUT/${o%%=*}.log" 2>&1 & pids+=($!)
    servers="$servers ${o%%=*}:$port"
    port=$((port + 1))
done
for s in $servers; do wait_port "${s#*:}"; done

for round in $(seq "$ROUNDS"); do
    for c in $CONCURRENCY; do
        for s in $servers; do
            h2load -c "$c" -m 1 -D "$SECS" --warm-up-time 1 -d "$OUT/body.bin" \
                -H content-type:application/grpc -H te:trailers \
                "http://127.0.0.1:${s#*:}/inference.GRPCInferenceService/ModelInfer" \
                >"$OUT/${s%%:*}-c$c-r$round.txt" 2>&1 || true
        done
    done
done

"$PYTHON" - "$OUT" "$ROUNDS" "$CONCURRENCY" "$servers" <<'PY'
import re, statistics, sys
out, rounds, concurrency, servers = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), [s.split(":")[0] for s in sys.argv[4].split()]
def run(name, c, r):
    t = open(f"{out}/{name}-c{c}-r{r}.txt").read()
    rps = re.search(r"finished in .*?, ([\d.]+) req/s", t)
    ok = re.search(r"(\d+) succeeded, (\d+) failed", t)
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+(\S+)", t)
    return float(rps.group(1)) if rps else float("nan"), (ok.group(2) if ok else "?"), (mean.group(1) if mean else "?")
print(f"{'server':<8}{'c':>4}{'req/s (median)':>16}{'/ null':>8}{'mean time':>11}{'failed':>8}  all rounds")
for c in concurrency:
    null = statistics.median(run("null", c, r)[0] for r in range(1, rounds + 1))
    for s in servers:
        runs = [run(s, c, r) for r in range(1, rounds + 1)]
        med = statistics.median(x[0] for x in runs)
        print(f"{s:<8}{c:>4}{med:>16.0f}{med / null:>8.2f}{runs[-1][2]:>11}{runs[-1][1]:>8}  {' '.join(f'{x[0]:.0f}' for x in runs)}")
print(f"raw output in {out}")
PY
