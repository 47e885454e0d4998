#!/usr/bin/env bash
# The baseline for the feature store's gRPC lookups: a plain Redis 7 on this machine
# answering MGET of the same shape (1M keys of 64 bytes, i.e. 16 packed f32; 100 and
# 10 random keys per call; 8 connections), with redis-benchmark. Prints one line per
# key count: calls/s, p50 and p99. Run it in the same minute as
# `cargo bench -p mesh-feature-store --bench lookup`.
#
#   bench/redis_mget.sh        (needs Debian's redis-server and redis-tools)
#
# N (calls per key count, default 100000), CONNS (8), PORT (a free one).
#
# Sourced (`. bench/redis_mget.sh`), it only defines the two steps, so that a script
# can keep one loaded Redis up and alternate its runs with the mesh's
# (bench/features_compare.sh does):
#   redis_mget_start DIR      starts redis-server, loads the keys; sets REDIS_PORT and
#                             REDIS_PID (the caller stops it)
#   redis_mget KEYS [JSON]    one redis-benchmark run of MGET of KEYS random keys; prints
#                             the line, and writes {"throughput", "p50_us", "p99_us"}
#                             to the file JSON when given

redis_mget_start() {
    local dir=$1
    for tool in redis-server redis-benchmark redis-cli; do
        command -v $tool >/dev/null || { echo "redis_mget.sh: $tool missing (apt-get install redis-server)" >&2; return 1; }
    done
    REDIS_PORT=${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
        --daemonize no >"$dir/redis.log" 2>&1 &
    REDIS_PID=$!
    for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
    # redis-benchmark writes __rand_int__ as 12 digits: key:000000000000 ..
    # key:000000999999, 64 bytes each, loaded through the pipe protocol.
    python3 - <<'PY' | redis-cli -p "$REDIS_PORT" --pipe >/dev/null
import sys
out = sys.stdout.buffer
value = bytes(range(64))
for i in range(1_000_000):
    key = b"key:%012d" % i
    out.write(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$64\r\n%s\r\n" % (len(key), key, value))
PY
    [ "$(redis-cli -p "$REDIS_PORT" dbsize)" = 1000000 ] || { echo "redis_mget.sh: loading the keys failed" >&2; return 1; }
    # Every key a call names exists (a miss costs Redis less than a hit).
    [ "$(redis-cli -p "$REDIS_PORT" --no-raw strlen key:000000999999)" = "(integer) 64" ] || { echo "redis_mget.sh: keys are not what redis-benchmark asks for" >&2; return 1; }
}

redis_mget() {
    local keys=$1 json=${2:-} out
    out=$(mktemp)
    # redis-benchmark replaces each __rand_int__ with its own random number < -r.
    local args=()
    for _ in $(seq "$keys"); do args+=("key:__rand_int__"); done
    redis-benchmark -p "$REDIS_PORT" -c "${CONNS:-8}" -n "${N:-100000}" -r 1000000 MGET "${args[@]}" >"$out" 2>&1
    python3 - "$out" "$keys" "${CONNS:-8}" "$json" <<'PY'
import json, re, sys
t = open(sys.argv[1]).read().replace("\r", "\n")
rps = re.findall(r"throughput summary:\s+([\d.]+) requests per second", t)
lat = re.search(r"avg\s+min\s+p50\s+p95\s+p99\s+max\s*\n\s*([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", t)
if not rps or not lat:
    sys.exit("redis_mget.sh: could not read redis-benchmark's output:\n" + t[-2000:])
p50, p99 = float(lat.group(3)) * 1000, float(lat.group(5)) * 1000
print(f"redis MGET c={sys.argv[3]}, {sys.argv[2]:>3} keys: {float(rps[-1]):>9,.0f} calls/s, p50 {p50:,.0f} us, p99 {p99:,.0f} us")
if sys.argv[4]:
    json.dump({"throughput": float(rps[-1]), "p50_us": p50, "p99_us": p99}, open(sys.argv[4], "w"))
PY
    local rc=$?
    rm -f "$out"
    return $rc
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    DIR=$(mktemp -d)
    REDIS_PID=
    trap '[ -n "$REDIS_PID" ] && kill $REDIS_PID 2>/dev/null; wait 2>/dev/null || true; rm -rf "$DIR"' EXIT
    redis_mget_start "$DIR"
    for keys in 100 10; do
        redis_mget "$keys"
    done
fi
