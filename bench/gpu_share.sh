#!/usr/bin/env bash
# Models sharing one GPU: the fraud MLP on cuda:0 in 1, 2 and 4 replicas (one runner
# each, nothing inline) and a 256-1024-1024-1 MLP (bench/make_heavy_mlp.py, random
# weights) in 1 and 2; and each in one replica whose queue two runners serve (`_i2`:
# runner_instances = 2, one assembling a batch while the other computes). One release
# `mesh serve` built with `--features cuda`, 32 callers (`mesh bench --target infer`),
# two rounds. With BASE set to a second such binary (another build), the two servers
# alternate within each round, so that their figures come from one run. Prints one
# line per run: throughput, latency, the server's queue and compute per request (the
# pass of the batch a request rode in), and the cores the server kept busy. Each
# server's /metrics is kept at the end of its run (metrics-*.txt), and summed up by
# model (bench/device_waits.py): rows per batch, the wait for the GPU's turn per batch
# (mesh_model_device_wait_seconds; a build before the lock has none), the pass.
#
#   cargo build --release -p mesh --features cuda && bench/gpu_share.sh
#   BASE=/path/to/the/build/before/mesh bench/gpu_share.sh
#
# Needs a GPU, and numpy for the large MLP (MESH_VENV's python, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MESH_BIN:-${CARGO_TARGET_DIR:-target}/release/mesh}
OUT=${OUT:-$(mktemp -d)}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-4}
CONCURRENCY=${CONCURRENCY:-32}
DEVICE=${DEVICE:-cuda:0}   # DEVICE=cpu: the same runs on the CPU (a check of the script)
PY=python3; [ -n "${MESH_VENV:-}" ] && [ -x "$MESH_VENV/bin/python" ] && PY=$MESH_VENV/bin/python
mkdir -p "$OUT/models"

# The repository: the example fraud MLP moved to $DEVICE, and the large MLP.
for v in r1 r2 r4 i2; do   # rN: N replicas of one runner; i2: one replica of two
    d=$OUT/models/fraud_gpu_$v; rm -rf "$d"; cp -r examples/models/fraud_mlp "$d"
    replicas=${v#r} runners=1; [ $v = i2 ] && replicas=1 runners=2
    sed -i -e "s/^device = \"cpu\"/device = \"$DEVICE\"/" -e '/^inline_below_us = /d' \
        -e "s/^replicas = 2/replicas = $replicas/" -e "s/^runner_instances = .*/runner_instances = $runners/" "$d/model.toml"
done
"$PY" bench/make_heavy_mlp.py "$OUT/heavy"
for v in r1 r2 i2; do
    d=$OUT/models/heavy_gpu_$v; rm -rf "$d"; cp -r "$OUT/heavy/heavy_batched" "$d"
    replicas=${v#r} runners=1; [ $v = i2 ] && replicas=1 runners=2
    sed -i -e "s/^kind = \"mlp\"/kind = \"mlp\"\ndevice = \"$DEVICE\"/" -e 's/^max_batch_size = .*/max_batch_size = 64/' \
        -e 's/^max_queue_delay_us = .*/max_queue_delay_us = 0/' \
        -e "s/^runner_instances = .*/runner_instances = $runners\nreplicas = $replicas/" "$d/model.toml"
done
MODELS=${MODELS:-fraud_gpu_r1 fraud_gpu_r2 fraud_gpu_r4 fraud_gpu_i2 heavy_gpu_r1 heavy_gpu_r2 heavy_gpu_i2}

pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT
source bench/lib.sh

# The server's CPU time so far (user and system, in clock ticks).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
HZ=$(getconf CLK_TCK)

run() { # label model
    local t0 c0
    t0=$(date +%s.%N) c0=$(cpu_ticks)
    "$BIN" bench --target infer --addr http://127.0.0.1:8421 --model "$2" --concurrency "$CONCURRENCY" \
        --seconds "$SECONDS_PER_RUN" --warmup 1 --json >"$OUT/$1-$2-r$round.json" 2>/dev/null
    # The cores the server kept busy over the run (its warm-up second included): the
    # runners' watch for their turn at the GPU spends CPU while they wait.
    cores=$(awk -v c0="$c0" -v c1="$(cpu_ticks)" -v t0="$t0" -v t1="$(date +%s.%N)" -v hz="$HZ" \
        'BEGIN { printf "%.2f", (c1 - c0) / hz / (t1 - t0) }')
    echo "$(python3 bench/infer_line.py "$OUT/$1-$2-r$round.json" "$(printf '%-5s %-13s' "$1" "$2")")  server CPU $cores cores"
}

for round in 1 2; do
    echo "round $round"
    for label in ${BASE:+base} this; do
        b=$BIN; [ "$label" = base ] && b=$BASE
        "$b" serve --models "$OUT/models" --grpc-port 8421 --http-port 8420 >"$OUT/serve-$label-r$round.log" 2>&1 &
        pid=$!
        wait_port 8421
        for m in $MODELS; do run "$label" "$m"; done
        curl -s 127.0.0.1:8420/metrics >"$OUT/metrics-$label-r$round.txt" || true
        python3 bench/device_waits.py "$OUT/metrics-$label-r$round.txt" | sed "s/^/$label  /"
        kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
    done
done
echo "raw reports in $OUT"
