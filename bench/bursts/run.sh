#!/usr/bin/env bash
# Burst bench: switchyard serve (the pipeline of configs/serve-local.toml) against
# sglang-router 0.3.2 (cache_aware) in front of the same REPLICAS `switchyard mock-replica`
# processes, on seven burst shapes (client.py). For each target in turn: start fresh mock
# replicas (empty caches, zero counters), start the router, warm its connections, run every
# shape (STEPS steps each, fresh random prompts every step), stop the router and the replicas.
# Both targets of a round get the same workload (one seed per round), so a row pair differs by
# the router alone.
# Prints a markdown table and writes the raw results as JSON (OUT_JSON).
#
# Needs: python3 with venv, curl, a release build of switchyard (built here when missing).
# Everything listens on 127.0.0.1; everything started here is stopped by pid on exit.
#
# Knobs (environment):
#   ROUNDS (1)           each round runs every target once; the target order alternates
#   TARGETS ("switchyard sglang")
#   SHAPES ("1 2 3 4 5 6 7 8 9") see README.md
#   STEPS (2)            steps per shape, each after the previous one completed
#   REPLICAS (8)         mock replicas (ports 28401..)
#   MAX_TOKENS (64)      output tokens per request
#   PREFILL_TPS (16000)  mock-replica --prefill-tokens-per-second (its default)
#   DECODE_TPS (200)     mock-replica --decode-tokens-per-second (default 50; faster here so a
#                        step takes seconds and prefill, not decode, dominates)
#   MAX_RUNNING (64)     mock-replica --max-running (its default)
#   SGLANG_VENV          sglang-router 0.3.2's venv (shared with bench/router; created when missing)
#   CLIENT_VENV          the load client's venv (aiohttp; created when missing)
#   BUILD_DIR (target/release)   where switchyard and its plugin libraries are taken from
#   CLIENT (raw)         how client.py sends: raw (pre-built HTTP/1.1 on asyncio streams) or
#                        aiohttp (slower per request: "at once" spreads over ~100 ms)
#   OUT_JSON (target/bench-bursts/results-<UTC time>.json)   raw results and per-row
#                        summaries; the printed table is written beside it (.md)
#   KEEP_WORK=1          keep the logs and per-target JSON
#   SEED                 the first round's workload seed (round k uses SEED + k - 1); default:
#                        drawn afresh for every round
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"

ROUNDS=${ROUNDS:-1}
TARGETS=${TARGETS:-switchyard sglang}
SHAPES=${SHAPES:-1 2 3 4 5 6 7 8 9}
STEPS=${STEPS:-2}
REPLICAS=${REPLICAS:-8}
MAX_TOKENS=${MAX_TOKENS:-64}
PREFILL_TPS=${PREFILL_TPS:-16000}
DECODE_TPS=${DECODE_TPS:-200}
MAX_RUNNING=${MAX_RUNNING:-64}
CLIENT=${CLIENT:-raw}
BUILD_DIR=${BUILD_DIR:-$repo/target/release}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/switchyard-bench
SGLANG_VENV=${SGLANG_VENV:-$cache/sglang-router-0.3.2}
CLIENT_VENV=${CLIENT_VENV:-$cache/bursts-client}
OUT_JSON=${OUT_JSON:-$repo/target/bench-bursts/results-$(date -u +%Y%m%d-%H%M%S).json}

FIRST_REPLICA_PORT=28401
SWITCHYARD_PORT=28410   # as in bench/bursts/switchyard.toml
SWITCHYARD_METRICS=28411
SWITCHYARD_ADMIN=28412
SGLANG_PORT=28420
SGLANG_METRICS=28421

# The scratch directory, the pids stopped on exit, need, wait_for, stop, snapshot_build and
# aiohttp_venv: shared with bench/router.
. "$repo/bench/router/common.sh"

need curl "apt-get install -y curl"
need python3 "apt-get install -y python3 python3-venv"

aiohttp_venv "$CLIENT_VENV"
if [[ " $TARGETS " == *" sglang "* ]] && [ ! -x "$SGLANG_VENV/bin/python" ]; then
    python3 -m venv "$SGLANG_VENV"
    "$SGLANG_VENV/bin/pip" install --quiet "sglang-router==0.3.2"
fi

snapshot_build

replica_ports=()
for i in $(seq 0 $((REPLICAS - 1))); do replica_ports+=($((FIRST_REPLICA_PORT + i))); done
for port in "${replica_ports[@]}" $SWITCHYARD_PORT $SWITCHYARD_METRICS $SWITCHYARD_ADMIN \
    $SGLANG_PORT $SGLANG_METRICS; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "port $port on 127.0.0.1 is already in use; stop what holds it first" >&2
        exit 1
    fi
done

# The switchyard config: bench/bursts/switchyard.toml with its [[endpoints]] replaced by one per
# replica. Its pipeline must be the shipped one of configs/serve-local.toml.
pipeline_of() { sed -n '/^\[\[plugins\]\]/,$p' "$1"; sed -n '/^libraries/,/^]/p; /^allow_experimental/p; /^scrape_interval_ms/p' "$1"; }
if diff <(pipeline_of configs/serve-local.toml) <(pipeline_of "$here/switchyard.toml") >"$work/pipeline.diff"; then
    pipeline_note="identical to configs/serve-local.toml"
else
    pipeline_note="DIFFERS from configs/serve-local.toml (update bench/bursts/switchyard.toml):"
    echo "warning: the pipeline of bench/bursts/switchyard.toml differs from configs/serve-local.toml:" >&2
    cat "$work/pipeline.diff" >&2
fi
awk '/^\[\[endpoints\]\]/ { skip = 1; next }
     skip && /^(name|address) *=/ { next }
     skip && /^ *$/ { next }
     { skip = 0; print }' "$here/switchyard.toml" >"$work/switchyard.toml"
for i in "${!replica_ports[@]}"; do
    printf '\n[[endpoints]]\nname = "r%d"\naddress = "127.0.0.1:%d"\n' "$i" "${replica_ports[$i]}" \
        >>"$work/switchyard.toml"
done
"$sy" check --config "$work/switchyard.toml" >"$work/check.txt" 2>&1 || {
    cat "$work/check.txt" >&2
    exit 1
}

probe='{"model":"mock-model","prompt":"hello","max_tokens":2}'
replica_urls=()
for port in "${replica_ports[@]}"; do replica_urls+=("http://127.0.0.1:$port"); done
replica_csv=$(IFS=,; echo "${replica_urls[*]}")

start_replicas() {
    replica_pids=()
    local i
    for i in "${!replica_ports[@]}"; do
        RUST_LOG=warn "$sy" mock-replica --port "${replica_ports[$i]}" \
            --name "r$i" --prefill-tokens-per-second "$PREFILL_TPS" \
            --decode-tokens-per-second "$DECODE_TPS" --max-running "$MAX_RUNNING" \
            >>"$work/replica-r$i.log" 2>&1 &
        pids+=($!)
        replica_pids+=($!)
    done
    for port in "${replica_ports[@]}"; do wait_for 10 "http://127.0.0.1:$port/health"; done
}

# start_router TARGET: starts it, waits until a completion goes through; sets router_pid,
# router_url, router_admin.
start_router() {
    case $1 in
        switchyard)
            RUST_LOG=${RUST_LOG:-warn} "$sy" serve \
                --config "$work/switchyard.toml" >>"$work/switchyard.log" 2>&1 &
            router_pid=$!
            router_url="http://127.0.0.1:$SWITCHYARD_PORT/v1/completions"
            router_admin="http://127.0.0.1:$SWITCHYARD_ADMIN"
            ;;
        sglang)
            "$SGLANG_VENV/bin/python" -m sglang_router.launch_router \
                --worker-urls "${replica_urls[@]}" --policy cache_aware \
                --host 127.0.0.1 --port "$SGLANG_PORT" \
                --prometheus-host 127.0.0.1 --prometheus-port "$SGLANG_METRICS" \
                --log-level warn >>"$work/sglang.log" 2>&1 &
            router_pid=$!
            router_url="http://127.0.0.1:$SGLANG_PORT/v1/completions"
            router_admin=
            ;;
        *) echo "unknown target: $1 (switchyard, sglang)" >&2; exit 1 ;;
    esac
    pids+=("$router_pid")
    if ! wait_for 60 -X POST -H 'content-type: application/json' -d "$probe" "$router_url"; then
        echo "--- $1 log:" >&2
        tail -20 "$work/$1.log" >&2
        exit 1
    fi
}

commit=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
dirty=$(git diff --quiet HEAD -- host plugins plugin-api 2>/dev/null || echo ' with uncommitted changes')
{
    echo "date:     $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "machine:  $(nproc) cores, $(awk '/model name/ { $1=$2=$3=""; print; exit }' /proc/cpuinfo | sed 's/^ *//')"
    echo "load:     $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) before the runs"
    echo "build:    $BUILD_DIR/switchyard of $(date -u -r "$BUILD_DIR/switchyard" '+%Y-%m-%d %H:%M UTC'); work tree at $commit$dirty"
    echo "pipeline: bench/bursts/switchyard.toml, $pipeline_note"
    echo "replicas: $REPLICAS x mock-replica --prefill-tokens-per-second $PREFILL_TPS --decode-tokens-per-second $DECODE_TPS --max-running $MAX_RUNNING"
    echo "shapes:   $SHAPES, $STEPS steps each, max_tokens $MAX_TOKENS, rounds $ROUNDS, targets $TARGETS, client $CLIENT"
    if [ -n "$dirty" ]; then
        echo "changed:  (work tree) $(git status --porcelain -- host plugins plugin-api 2>/dev/null | awk '{ print $2 }' | tr '\n' ' ')"
    fi
} | tee "$work/header.txt"
echo

files=()
targets=($TARGETS)
for round in $(seq 1 "$ROUNDS"); do
    # One seed per round, shared by its targets: the same prompts, lengths and send times.
    if [ -n "${SEED:-}" ]; then
        seed=$((SEED + round - 1))
    else
        seed=$(od -An -N6 -tu8 /dev/urandom | tr -d ' ')
    fi
    order=("${targets[@]}")
    if [ $((round % 2)) = 0 ]; then   # alternate the order: even rounds run it reversed
        order=()
        for ((k = ${#targets[@]} - 1; k >= 0; k--)); do order+=("${targets[$k]}"); done
    fi
    for target in "${order[@]}"; do
        echo "round $round: $target" >&2
        start_replicas
        start_router "$target"
        out="$work/$target-$round.json"
        "$CLIENT_VENV/bin/python" "$here/client.py" run --target "$target" --round "$round" --seed "$seed" \
            --url "$router_url" --replica-metrics "$replica_csv" --admin "$router_admin" \
            --shapes "$SHAPES" --steps "$STEPS" --max-tokens "$MAX_TOKENS" --client "$CLIENT" --out "$out"
        files+=("$out")
        stop "$router_pid" "${replica_pids[@]}"
    done
done

mkdir -p "$(dirname "$OUT_JSON")"
{
    cat "$work/header.txt"
    echo
    "$CLIENT_VENV/bin/python" "$here/client.py" report --json "$OUT_JSON" "${files[@]}"
    echo
    echo "load after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"${OUT_JSON%.json}.md"
echo
sed '1,/^$/d' "${OUT_JSON%.json}.md"
echo "raw results: $OUT_JSON (table: ${OUT_JSON%.json}.md)"
