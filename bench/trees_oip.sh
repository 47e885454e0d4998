#!/usr/bin/env bash
# OIP gRPC end to end, one row per request, through `mesh bench --target infer`
# (rows shaped by each model's metadata: 34 values with category codes for the tree
# models, 32 for the MLP) against one release `mesh serve` of the example repository:
# the XGBoost model next to the MLP (and LightGBM), at concurrency 1, 8 and 32,
# models alternating within each round, two rounds. Prints one line per run.
#
#   cargo build --release -p mesh --bin mesh && bench/trees_oip.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MESH_BIN:-${CARGO_TARGET_DIR:-target}/release/mesh}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
MODELS=${MODELS:-fraud_mlp fraud_xgb fraud_lgbm}

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
source bench/lib.sh

"$BIN" serve --models examples/models --grpc-port 8321 --http-port 8320 >"$OUT/serve.log" 2>&1 & pids+=($!)
wait_port 8321

run() { # model concurrency
    "$BIN" bench --target infer --addr http://127.0.0.1:8321 --model "$1" --concurrency "$2" \
        --seconds "$SECONDS_PER_RUN" --json >"$OUT/$1-c$2-r$round.json" 2>/dev/null
    python3 bench/infer_line.py "$OUT/$1-c$2-r$round.json" "$(printf '%-10s c=%2s' "$1" "$2")"
}

for round in 1 2; do
    echo "round $round"
    for c in 1 8 32; do
        for m in $MODELS; do run "$m" "$c"; done
    done
done
echo "raw reports in $OUT"
