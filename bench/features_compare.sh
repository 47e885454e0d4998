#!/usr/bin/env bash
# Feature lookups over gRPC as a client sees them, against Redis MGET of the same
# shape, each driven from its own process by a one-thread load generator:
#
#   mesh serve --role features   <- mesh bench --target lookup   (1 thread, 8 callers)
#   redis-server                 <- redis-benchmark MGET          (1 thread, 8 connections)
#
# Both hold 1M entities of 16 f32 (64 packed bytes a key in Redis); each call names 100 (then 10) random
# keys. The mesh runs twice: sled alone (the default), and with a row cache sized for
# every entity (`[features] cache_max_bytes`), as Redis holds every key in memory.
# Unlike feature-store/benches/lookup.rs (server and callers in one process, a
# writer at 1,000 rows/s), no writer runs here, as none runs against Redis.
#
#   bench/features_compare.sh [MESH_BIN]     (needs redis-server and redis-tools)
#
# The 100-key comparison with the row cache runs ROUNDS times (default 3), the mesh and
# Redis alternating (mesh then Redis, then Redis then mesh, ...) against one loaded
# Redis, and ends with each round's ratio and their median: this machine's speed
# drifts from minute to minute, and a pair of runs side by side is what compares.
#
# ENTITIES (1000000; bench/redis_mget.sh always loads 1M keys, so keep it for the
# comparison), SECS per figure (5), CONNS (8), ROUNDS (3).
set -euo pipefail
cd "$(dirname "$0")/.."
MESH_BIN=${1:-${MESH_BIN:-${CARGO_TARGET_DIR:-target}/release/mesh}}
[ -x "$MESH_BIN" ] || { echo "features_compare.sh: no mesh binary at $MESH_BIN (cargo build --release -p mesh)" >&2; exit 1; }
# The baseline's tools, checked before the minute of loading and lookups.
for tool in redis-server redis-benchmark redis-cli python3; do
    command -v $tool >/dev/null || { echo "features_compare.sh: $tool missing (apt-get install redis-server)" >&2; exit 1; }
done
ENTITIES=${ENTITIES:-1000000}
SECS=${SECS:-5}
CONNS=${CONNS:-8}
ROUNDS=${ROUNDS:-3}
[ "$ROUNDS" -ge 1 ] 2>/dev/null || { echo "features_compare.sh: ROUNDS=$ROUNDS: must be 1 or more" >&2; exit 2; }
DIR=$(mktemp -d)
spid=
REDIS_PID=
cleanup() {
    [ -n "$spid" ] && kill "$spid" 2>/dev/null
    [ -n "$REDIS_PID" ] && kill "$REDIS_PID" 2>/dev/null
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

feats=$(python3 -c 'print(", ".join("{ name = \"f%d\", type = \"f32\" }" % i for i in range(16)))')
cat >"$DIR/views.toml" <<EOF
[[entities]]
name = "entity"
join_key = "entity_id"
key_type = "int64"

[[views]]
name = "bench"
entity = "entity"
max_age = "7d"
timestamp_field = "event_timestamp"
features = [$feats]
EOF
# Entities 1..=ENTITIES, as mesh bench draws int64 keys from 1..=--cards.
python3 - "$DIR/bench.csv" "$ENTITIES" <<'PY'
import sys, time
n, now = int(sys.argv[2]), int(time.time())
with open(sys.argv[1], "w") as f:
    f.write("entity_id,event_timestamp," + ",".join(f"f{j}" for j in range(16)) + "\n")
    tail = [",".join(f"{(i + j) % 1000}.25" for j in range(16)) for i in range(1000)]
    for i in range(1, n + 1):
        f.write(f"{i},{now},{tail[i % 1000]}\n")
PY
t0=$(date +%s%N)
"$MESH_BIN" features ingest --store "$DIR/db" --views "$DIR/views.toml" --view bench "$DIR/bench.csv" >/dev/null 2>&1
echo "loaded $ENTITIES entities in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
rm -f "$DIR/bench.csv"

# The baseline, loaded once and kept up: its runs alternate with the mesh's.
mkdir -p "$DIR/redis"
. bench/redis_mget.sh
redis_mget_start "$DIR/redis"

# One mesh bench run: "calls/s p50 p99" from its JSON report (also kept in the file
# $2 names, when given).
cat >"$DIR/report.py" <<'PY'
import json, sys
r = json.load(sys.stdin)
if len(sys.argv) > 1:
    json.dump(r, open(sys.argv[1], "w"))
bad = {k: v for k, v in r["codes"].items() if k != "OK"}
if bad:
    sys.exit(f"features_compare.sh: calls that failed: {bad}")
t, p50, p99 = r["throughput"], r["p50_us"], r["p99_us"]
print(f"{t:>9,.0f} calls/s, p50 {p50:,} us, p99 {p99:,} us")
PY
lookup() { # [--json-to FILE] mesh bench args...
    local keep=()
    if [ "$1" = --json-to ]; then keep=("$2"); shift 2; fi
    "$MESH_BIN" bench --addr "http://127.0.0.1:$gport" --target lookup --view bench \
        --cards "$ENTITIES" --concurrency "$CONNS" --seconds "$SECS" --json "$@" 2>/dev/null |
        python3 "$DIR/report.py" "${keep[@]}"
}

mesh_round() { echo "  mesh lookup c=$CONNS, 100 keys (round $1):        $(lookup --json-to "$DIR/mesh-$1.json" --keys 100)"; }
redis_round() { echo "  $(redis_mget 100 "$DIR/redis-$1.json") (round $1)"; }

for cache in 0 $((512 << 20)); do
    gport=$(free_port)
    cat >"$DIR/mesh.toml" <<EOF
[server]
grpc_port = $gport
http_port = $(free_port)
[features]
path = "$DIR/db"
views = "$DIR/views.toml"
cache_max_bytes = $cache
EOF
    "$MESH_BIN" serve --role features --config "$DIR/mesh.toml" >"$DIR/serve.log" 2>&1 &
    spid=$!
    for _ in $(seq 150); do (exec 3<>/dev/tcp/127.0.0.1/"$gport") 2>/dev/null && break; sleep 0.2; done
    (exec 3<>/dev/tcp/127.0.0.1/"$gport") 2>/dev/null ||
        { echo "features_compare.sh: mesh serve did not start:" >&2; tail -5 "$DIR/serve.log" >&2; exit 1; }
    if [ "$cache" = 0 ]; then
        label="sled, no row cache"
        # Warm sled's page cache as the Redis run has its keys in memory.
        "$MESH_BIN" bench --addr "http://127.0.0.1:$gport" --target lookup --view bench \
            --cards "$ENTITIES" --keys 4096 --seconds "$SECS" >/dev/null 2>&1
    else
        label="row cache of every entity"
        # Fill the cache: random 4,096-key calls until nearly every entity was read.
        "$MESH_BIN" bench --addr "http://127.0.0.1:$gport" --target lookup --view bench \
            --cards "$ENTITIES" --keys 4096 --requests $((ENTITIES * 6 / 4096)) >/dev/null 2>&1
    fi
    echo "mesh, $label:"
    if [ "$cache" = 0 ]; then
        echo "  mesh lookup c=$CONNS, 100 keys:                  $(lookup --keys 100)"
    else
        for r in $(seq "$ROUNDS"); do
            # Mesh first in odd rounds, Redis first in even ones.
            if [ $((r % 2)) -eq 1 ]; then mesh_round "$r"; redis_round "$r"
            else redis_round "$r"; mesh_round "$r"; fi
        done
    fi
    echo "  mesh lookup c=$CONNS, 100 keys, per-view times:  $(lookup --keys 100 --event-times-per-view)"
    echo "  mesh lookup c=$CONNS,  10 keys:                  $(lookup --keys 10)"
    kill "$spid"; wait "$spid" 2>/dev/null || true; spid=
done
echo "baseline, same minute:"
echo "  $(redis_mget 10)"
python3 - "$DIR" "$ROUNDS" <<'PY'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
ratios = []
for r in range(1, rounds + 1):
    m = json.load(open(f"{d}/mesh-{r}.json"))["throughput"]
    x = json.load(open(f"{d}/redis-{r}.json"))["throughput"]
    ratios.append(m / x)
each = ", ".join(f"{v:.2f}" for v in ratios)
print(f"100 keys, row cache against Redis MGET, side by side: mesh/redis {each} "
      f"(median {statistics.median(ratios):.2f}, {rounds} rounds)")
PY
