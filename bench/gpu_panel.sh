#!/usr/bin/env bash
# The dashboard's "GPU turns" panel on real data: a release `mesh serve` built with
# `--features cuda`, the example fraud MLP on $DEVICE in its 2 replicas, 32 callers
# (`mesh bench --target infer`) for $SECONDS_OF_LOAD seconds, a Prometheus scraping it
# every second with dashboards/prometheus/prometheus.yml; then each of the panel's
# queries, with Grafana's variables as for one range query, and what it answers
# (dashboards/queries.py, as the end-to-end test reads them).
# The end-to-end test (tests/e2e/test_prometheus.py) checks every panel on the CPU,
# where this one can only evaluate.
#
#   cargo build --release -p mesh --features cuda && bench/gpu_panel.sh
#
# Needs a GPU and `prometheus` (PROMETHEUS_BIN, else on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MESH_BIN:-${CARGO_TARGET_DIR:-target}/release/mesh}
PROM=${PROMETHEUS_BIN:-prometheus}
OUT=${OUT:-$(mktemp -d)}
DEVICE=${DEVICE:-cuda:0}   # DEVICE=cpu: the same on the CPU, where the queries answer no series
SECONDS_OF_LOAD=${SECONDS_OF_LOAD:-25}
source bench/lib.sh

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

rm -rf "$OUT/models" "$OUT/prometheus" "$OUT/tsdb"; mkdir -p "$OUT/models"
cp -r examples/models/fraud_mlp "$OUT/models/"
sed -i -e "s/^device = \"cpu\"/device = \"$DEVICE\"/" -e '/^inline_below_us = /d' "$OUT/models/fraud_mlp/model.toml"
"$BIN" serve --models "$OUT/models" --grpc-port 8431 --http-port 8430 >"$OUT/serve.log" 2>&1 &
pids+=($!)
PYTHONPATH=dashboards python3 -c 'import sys, pathlib, queries; queries.prometheus_config(pathlib.Path(sys.argv[1]), "127.0.0.1:8430")' "$OUT"
"$PROM" --config.file="$OUT/prometheus/prometheus.yml" --storage.tsdb.path="$OUT/tsdb" \
    --web.listen-address=127.0.0.1:8439 >"$OUT/prometheus.log" 2>&1 &
pids+=($!)
wait_port 8431 "$OUT/serve.log"
wait_port 8439 "$OUT/prometheus.log"
"$BIN" bench --addr http://127.0.0.1:8431 --target infer --model fraud_mlp --concurrency 32 \
    --seconds "$SECONDS_OF_LOAD" --warmup 1 --json >"$OUT/bench.json" 2>/dev/null
python3 bench/infer_line.py "$OUT/bench.json" "fraud_mlp on $DEVICE"
sleep 2   # one more scrape
PYTHONPATH=dashboards python3 - <<'PY'
import json, urllib.parse, urllib.request

from queries import dashboard, expand, panels

for p in panels(dashboard()["panels"]):
    if not p.get("title", "").startswith("GPU turns"):
        continue
    for t in p["targets"]:
        expr = expand(t["expr"], ".*")
        url = "http://127.0.0.1:8439/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        answer = json.load(urllib.request.urlopen(url))
        print(f"{t['refId']}  {expr}\n   {answer['status']}, {len(answer['data']['result'])} series")
        for s in answer["data"]["result"]:
            print(f"   {s['metric']}  {s['value'][1]}")
PY
