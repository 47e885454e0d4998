#!/usr/bin/env bash
# OIP gRPC through `mesh bench --target infer` against two release meshes on this
# machine, one plain and one with [tls] (a throwaway CA made here), alternating
# plain/TLS runs at concurrency 8 and 32, two rounds. Prints one line per run.
#
#   cargo build --release -p mesh --bin mesh && bench/tls_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MESH_BIN:-${CARGO_TARGET_DIR:-target}/release/mesh}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
source bench/lib.sh

(
    cd "$OUT"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 1 -subj /CN=bench-ca 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key -out server.csr -subj /CN=localhost 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 1 -extfile server.ext 2>/dev/null
    printf '[tls]\ncert = "%s/server.pem"\nkey = "%s/server.key"\n' "$OUT" "$OUT" >tls.toml
)

"$BIN" serve --models examples/models --grpc-port 8311 --http-port 8310 >"$OUT/plain.log" 2>&1 & pids+=($!)
"$BIN" serve --config "$OUT/tls.toml" --models examples/models --grpc-port 8313 --http-port 8312 >"$OUT/tls.log" 2>&1 & pids+=($!)
wait_port 8311; wait_port 8313

run() { # name addr concurrency [extra]
    local name=$1 addr=$2 c=$3
    shift 3
    "$BIN" bench --target infer --addr "$addr" --concurrency "$c" --seconds "$SECONDS_PER_RUN" --json "$@" >"$OUT/$name-c$c.json" 2>/dev/null
    python3 bench/infer_line.py "$OUT/$name-c$c.json" "$(printf '%-5s c=%2s' "$name" "$c")"
}

for round in 1 2; do
    echo "round $round"
    for c in 8 32; do
        run plain http://127.0.0.1:8311 "$c"
        run tls https://localhost:8313 "$c" --tls-ca "$OUT/ca.pem"
    done
done
echo "raw reports in $OUT"
