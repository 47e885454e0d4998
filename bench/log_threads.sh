#!/usr/bin/env bash
# Where a server's CPU goes, thread by thread, with the prediction log off, inline,
# deferred, or converted at each roll (issue 13): one server at a time, an open loop of
# Decide at RATE for SECS, and around it each thread's CPU time and context switches
# (`/proc/<pid>/task/*`),
# the machine's interrupts (`/proc/interrupts`: local timer, rescheduling and
# function-call IPIs, TLB shootdowns) and the server's minor page faults. With PERF=1,
# `perf record` samples the server for the middle of the run (no call graphs: with
# them the load generator falls behind and the run measures perf) and the top of each
# log thread's profile is printed.
#
#   bench/log_threads.sh [MESH_BIN]    (default $MESH_BIN, else $CARGO_TARGET_DIR/release/mesh)
#
# Modes: `off`; `inline` (the default: the encoder thread builds the Parquet columns as
# records arrive); `deferred` (`parquet = "deferred"`: closed segments wait as their wal,
# no Parquet built in the run); `roll` (deferred, with `segment_max_bytes` and
# `deferred_max_bytes` both 64 MiB: the server's closer converts each segment from its
# wal as it rolls, the same work done in one pass after the roll instead of record by
# record).
#
# Settings (environment): MODES="off inline deferred" (the servers, one after another),
# RATE=14602, SECS=20, PORT=18751 (gRPC; HTTP on PORT-1), OUT (raw output; default a
# new temp dir), PERF=0, FREQ=2999 (perf's samples a second).
#
# One server alone, not two side by side as in bench/plog_alt.sh: these counts are
# totals over a run, which do not drift as much as a p99 does between runs.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-${MESH_BIN:-${CARGO_TARGET_DIR:-target}/release/mesh}}
[ -x "$BIN" ] || { echo "no mesh binary at $BIN (cargo build --release -p mesh --bin mesh)" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d)}
MODES=${MODES:-off inline deferred}
RATE=${RATE:-14602}
SECS=${SECS:-20}
PORT=${PORT:-18751}
PERF=${PERF:-0}
FREQ=${FREQ:-2999}
source bench/lib.sh
mkdir -p "$OUT/data"
SP=
cleanup() {
    if [ -n "$SP" ]; then
        kill "$SP" 2>/dev/null || true
        wait "$SP" 2>/dev/null || true
    fi
}
trap cleanup EXIT

"$BIN" features demo --store "$OUT/data/features" --views examples/features/views.toml --cards 10000 --merchants 1000 >"$OUT/features.log" 2>&1

threads() { # pid: "name cpu_ticks voluntary involuntary" per thread
    local t
    for t in /proc/"$1"/task/*; do
        echo "$(cat "$t/comm" | tr ' ' _) $(awk '{print $14 + $15}' "$t/stat") $(awk '/^voluntary_ctxt/ {v = $2} /^nonvoluntary_ctxt/ {n = $2} END {print v, n}' "$t/status")"
    done
}
irqs() { grep -E '^ *(LOC|RES|CAL|TLB):' /proc/interrupts | awk '{s = 0; for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) s += $i; print $1, s}'; }

printf '%-9s %-22s %10s %10s %10s\n' mode thread "cpu s" "vol/s" "invol/s"
for mode in $MODES; do
    dir=$OUT/$mode
    rm -rf "$dir"
    mkdir -p "$dir"
    rm -rf "$OUT/data/features-run"
    cp -r "$OUT/data/features" "$OUT/data/features-run"
    cfg=$dir/mesh.toml
    example_config "$OUT/data/features-run" "$dir/predictions" "$PORT" $((PORT - 1)) >"$cfg"
    case $mode in
        off) log_off "$cfg" ;;
        inline) ;;
        deferred) log_set "$cfg" 'parquet = "deferred"' ;;
        roll) log_set "$cfg" 'parquet = "deferred"' "segment_max_bytes = $((64 << 20))" "deferred_max_bytes = $((64 << 20))" ;;
        *) echo "unknown mode $mode (off, inline, deferred, roll)" >&2; exit 2 ;;
    esac
    "$BIN" serve --config "$cfg" >"$dir/serve.log" 2>&1 &
    SP=$!
    wait_port "$PORT" "$dir/serve.log"
    "$BIN" bench --addr "http://127.0.0.1:$PORT" --target decide --rate "$RATE" --seconds 3 --json >/dev/null 2>&1
    threads "$SP" >"$dir/threads.before"
    irqs >"$dir/irqs.before"
    flt0=$(awk '{print $10}' /proc/"$SP"/stat)
    PP=
    if [ "$PERF" = 1 ]; then
        (sleep $((SECS / 4)); perf record -q -F "$FREQ" -p "$SP" -o "$dir/perf.data" -- sleep $((SECS / 2)) >"$dir/perf.log" 2>&1) &
        PP=$!
    fi
    "$BIN" bench --addr "http://127.0.0.1:$PORT" --target decide --rate "$RATE" --seconds "$SECS" --json >"$dir/bench.json" 2>"$dir/bench.err"
    if [ -n "$PP" ]; then wait "$PP"; fi
    threads "$SP" >"$dir/threads.after"
    irqs >"$dir/irqs.after"
    flt1=$(awk '{print $10}' /proc/"$SP"/stat)
    curl -s "http://127.0.0.1:$((PORT - 1))/metrics" | grep -E '^mesh_log_(written|dropped)_records_total' >"$dir/metrics" || true
    kill "$SP"
    wait "$SP" 2>/dev/null || true
    SP=
    # Threads of one name summed (the runtime's workers, the runners).
    join <(awk '{c[$1] += $2; v[$1] += $3; n[$1] += $4} END {for (k in c) print k, c[k], v[k], n[k]}' "$dir/threads.before" | sort) \
         <(awk '{c[$1] += $2; v[$1] += $3; n[$1] += $4} END {for (k in c) print k, c[k], v[k], n[k]}' "$dir/threads.after" | sort) |
        awk -v m="$mode" -v s="$SECS" -v hz="$(getconf CLK_TCK)" '$5 - $2 > 0 {printf "%-9s %-22s %10.2f %10.0f %10.0f\n", m, $1, ($5 - $2) / hz, ($6 - $3) / s, ($7 - $4) / s}'
    join <(sort "$dir/irqs.before") <(sort "$dir/irqs.after") |
        awk -v m="$mode" '{printf "%-9s interrupts %-11s %10d\n", m, $1, $3 - $2}'
    echo "$mode minor page faults $((flt1 - flt0)); $(tr '\n' ' ' <"$dir/metrics")"
    python3 -c "import json,sys; d = json.load(open(sys.argv[1])); print(sys.argv[2], 'decisions', d['requests'], 'p50', d['p50_us'], 'us, p99', d['p99_us'], 'us')" "$dir/bench.json" "$mode"
    if [ "$PERF" = 1 ] && [ -f "$dir/perf.data" ]; then
        perf report -i "$dir/perf.data" --no-children --sort comm --stdio 2>/dev/null | grep '%' | head -5 | sed "s/^/$mode perf /" || true
        for comm in plog-encoder plog-writer; do
            perf report -i "$dir/perf.data" --no-children --comm "$comm" --percentage relative --sort dso,sym --stdio 2>/dev/null |
                grep '%' | head -8 | sed "s/^/$mode $comm /" || true
        done
    fi
done
echo "raw output in $OUT"
