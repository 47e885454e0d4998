#!/usr/bin/env bash
# Issue-4/5 benchmark: Decide with a 2-view feature lookup (card + merchant) through
# `mesh serve` on the example configuration. Finds the closed-loop saturation
# throughput, then runs open loop (latency from the intended send time) at 25, 50
# and 75 % of it; then 50 % with one of the two replicas stalled far past the
# deadline; then 50 % with the prediction log off, for the log on/off comparison.
#
#   bench/decide_bench.sh     (after: cargo build --release -p mesh --bin mesh)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CARGO_TARGET_DIR:-target}/release/mesh
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
SECS=${SECS:-8}
DATA=$OUT/data
mkdir -p "$DATA"
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT
source bench/lib.sh

"$BIN" features demo --store "$DATA/features" --views examples/features/views.toml --cards 10000 --merchants 1000

serve() { # log on|off
    local cfg=$OUT/mesh-$1.toml
    example_config "$DATA/features" "$DATA/predictions-$1" 8401 8400 >"$cfg"
    if [ "$1" = off ]; then log_off "$cfg"; fi
    "$BIN" serve --config "$cfg" >"$OUT/serve-$1.log" 2>&1 &
    pid=$!
    wait_port 8401
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; }
bench() { # name seconds args...
    local name=$1 secs=$2; shift 2
    "$BIN" bench --addr http://127.0.0.1:8401 --target decide --seconds "$secs" --json "$@" >"$OUT/$name.json" 2>"$OUT/$name.err"
}

serve on
bench warmup 2 --concurrency 8
bench saturation "$SECS" --concurrency 32
SAT=$(python3 -c "import json;print(json.load(open('$OUT/saturation.json'))['throughput'])")
for pct in 25 50 75; do
    bench "open-$pct" "$SECS" --rate "$(python3 -c "print(round($SAT*$pct/100))")" --concurrency 32
done
curl -s -X POST -H 'content-type: application/json' -d '{"replica":"fraud_mlp/v1/local0","delay_ms":2000}' http://127.0.0.1:8400/admin/faults
bench "stalled-50" "$SECS" --rate "$(python3 -c "print(round($SAT*0.5))")" --concurrency 32
curl -s -X POST -H 'content-type: application/json' -d '{"replica":"fraud_mlp/v1/local0","delay_ms":0}' http://127.0.0.1:8400/admin/faults
stop
serve off
bench warmup-off 2 --concurrency 8
bench "log-off-50" "$SECS" --rate "$(python3 -c "print(round($SAT*0.5))")" --concurrency 32
stop

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
print(f"{'run':<14}{'req/s':>9}{'p50 us':>9}{'p99 us':>9}{'p99.9 us':>10}{'max us':>9}  sources / errors")
for n in ["saturation", "open-25", "open-50", "open-75", "stalled-50", "log-off-50"]:
    p = f"{out}/{n}.json"
    if not os.path.exists(p):
        continue
    r = json.load(open(p))
    print(f"{n:<14}{r['throughput']:>9.0f}{r['p50_us']:>9}{r['p99_us']:>9}{r['p999_us']:>10}{r['max_us']:>9}  {r['sources']} {dict((k, v) for k, v in r['codes'].items() if k != 'OK')}")
    if n == "open-50":
        print("              server stages (mean µs):", {k: round(v) for k, v in r["stages_us"].items()})
print(f"raw output in {out}")
PY
