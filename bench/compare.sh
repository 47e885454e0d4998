#!/usr/bin/env bash
# Issue 13's figures side by side in one run, one table per question:
#   1. the prediction log on vs off, Decide at 50 % of saturation. First the two
#      servers side by side under one open loop that alternates each second between
#      them, with two log-off servers as the noise (bench/plog_alt.sh, PLOG_ALT_ROUNDS
#      rounds, default 4; PLOG_ALT=0 skips it): the figure. Then run after run
#      (bench/plog_bench.sh): the log on, on with the Parquet files deferred to
#      `mesh logs convert` (PLOG_DEFERRED=0 skips that mode) and with
#      `worker_turns = true` (PLOG_TURNS=0 skips it), with the log off twice, for the
#      noise of two identical servers (PLOG_AA=0 skips that), then again with the
#      server and the load generator on cores of their own (PLOG_PINNED=0 skips
#      that), where the log also runs with its threads on the load generator's core
#      (`reserved_cpus`, the server on both cores; PLOG_OWN_CORE=0 skips that mode)
#   2. overload at 1x, 2x, 4x of saturation with a 50 ms deadline   (bench/overload_bench.sh)
#   3. OIP gRPC and REST against do-nothing servers                  (bench/oip_compare.sh)
#   4. feature lookups in process, with a writer                     (feature-store/benches/lookup.rs)
#      and over gRPC from another process (mesh serve --role features,
#      mesh bench --target lookup) against Redis MGET of the same shape
#      (redis-benchmark)                                             (bench/features_compare.sh)
# plus the `mesh bench --html` report of a Decide run (the tails, per second).
#
#   bench/compare.sh                 (builds the release binaries it needs)
#   ONLY="plog oip" bench/compare.sh (a subset: plog overload oip features)
#
# Each part's own settings pass through (SECS, ROUNDS, ...; see each script; the
# prediction log parts run PLOG_ROUNDS, default 4, instead of ROUNDS). The
# machine is shared and noisy: read ratios within one run, and the spread over rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
export MESH_VENV=${MESH_VENV:-$ROOT/.venv}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
ONLY=${ONLY:-plog overload oip features}
# What each part needs, checked before the first part runs: a missing tool or venv
# would otherwise stop the run only when its part comes, minutes in.
missing=()
for p in $ONLY; do
    case $p in
        plog|overload) tools=(python3 curl) ;;
        oip) tools=(h2load wrk)
             if ! "$MESH_VENV/bin/python" -c 'import numpy, tritonclient.grpc' 2>/dev/null; then
                 missing+=("the test venv at $MESH_VENV with tritonclient (scripts/test makes it; or set MESH_VENV)")
             fi ;;
        features) tools=(redis-server redis-benchmark redis-cli python3) ;;
        *) echo "bench/compare.sh: unknown part '$p' (plog overload oip features)" >&2; exit 2 ;;
    esac
    for t in "${tools[@]}"; do
        command -v "$t" >/dev/null || missing+=("$t (for the $p part)")
    done
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "bench/compare.sh: missing, nothing run:" >&2
    printf '  %s\n' "${missing[@]}" >&2
    echo "  (apt-get install nghttp2-client wrk redis-server redis-tools; ONLY=... runs a subset)" >&2
    exit 1
fi
cargo build -q --release -p mesh --bin mesh --example null_oip --example null_rest
export MESH_BIN=$TARGET/release/mesh
PYTHON=${PYTHON:-$MESH_VENV/bin/python}
export PYTHON

part() { echo; echo "## $1"; echo; }
for p in $ONLY; do
    case $p in
        plog)
            if [ "${PLOG_ALT:-1}" != 0 ]; then
                # The figure: each second's p99 against the other server's seconds
                # beside it, so the machine's drift falls on both alike.
                part "Prediction log on vs off, side by side (Decide, one open loop at ${PCT:-50}% of saturation alternating each second)"
                OUT=$OUT/plog-alt ROUNDS=${PLOG_ALT_ROUNDS:-4} bench/plog_alt.sh "$MESH_BIN"
            fi
            part "Prediction log on vs off, run after run, and its modes (Decide, open loop at ${PCT:-50}% of saturation)"
            # Four rounds (PLOG_ROUNDS), where the others run ROUNDS: two runs of the
            # same build on these 2 shared cores differed by up to 20% at the p99,
            # more than the 5% asked of the log, so the median needs more of them.
            OUT=$OUT/plog ROUNDS=${PLOG_ROUNDS:-4} DEFERRED=${PLOG_DEFERRED:-1} TURNS=${PLOG_TURNS:-1} AA=${PLOG_AA:-1} bench/plog_bench.sh "$MESH_BIN"
            # The same with the server on a core of its own and the load generator on
            # another, as a client on another machine would see it: the log's cost to
            # the server's core, without the load generator competing for it.
            if [ "$(nproc)" -ge 2 ] && [ "${PLOG_PINNED:-1}" != 0 ]; then
                part "Prediction log on vs off, the server on core 0, the load generator on core 1"
                OUT=$OUT/plog-pinned ROUNDS=${PLOG_ROUNDS:-4} DEFERRED=${PLOG_DEFERRED:-1} TURNS=${PLOG_TURNS:-1} AA=${PLOG_AA:-1} OWN_CORE=${PLOG_OWN_CORE:-1} SERVER_CPUS=0 BENCH_CPUS=1 bench/plog_bench.sh "$MESH_BIN"
            fi ;;
        overload)
            part "Overload: useful answers within a ${DEADLINE_MS:-50} ms deadline"
            OUT=$OUT/overload bench/overload_bench.sh "$MESH_BIN" ;;
        oip)
            part "OIP transport: mesh against do-nothing servers"
            OUT=$OUT/oip bench/oip_compare.sh ;;
        features)
            part "Feature store lookups in process (1M entities x 16 f32, a writer at 1,000 rows/s)"
            cargo bench -q -p mesh-feature-store --bench lookup -- --seconds "${SECS:-4}" --skip-grpc 2>/dev/null
            part "Feature store lookups over gRPC against Redis MGET (1M entities x 16 f32)"
            bench/features_compare.sh "$MESH_BIN" ;;
    esac
done

part "Decide latency report (mesh bench --html)"
mkdir -p "$OUT/html"
P=18590
"$MESH_BIN" features demo --store "$OUT/html/features" --views examples/features/views.toml >/dev/null 2>&1
"$MESH_BIN" serve --config examples/mesh.toml --grpc-port $((P+1)) --http-port $P \
    --features "$OUT/html/features" >"$OUT/html/serve.log" 2>&1 &
spid=$!
trap 'kill $spid 2>/dev/null || true' EXIT
for _ in $(seq 150); do (exec 3<>/dev/tcp/127.0.0.1/$((P+1))) 2>/dev/null && break; sleep 0.2; done
"$MESH_BIN" bench --addr "http://127.0.0.1:$((P+1))" --target decide --rate "${HTML_RATE:-2000}" \
    --seconds "${SECS:-10}" --html "$OUT/decide.html" | tail -4
echo "report: $OUT/decide.html"
