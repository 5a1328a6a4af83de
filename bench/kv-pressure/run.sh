#!/usr/bin/env bash
# The KV-pressure bench live: many tenants with long prefixes of their own, more than the
# replicas' caches hold, sent through `switchyard serve` with each shipped pipeline in turn, in
# front of mock-replica processes that publish their caches' stores and evictions as vLLM KV
# events. Per pipeline: the replicas start afresh (empty caches), the router starts with the
# pipeline's file and the replicas as endpoints, and client.py sends the same requests at the
# same offsets. One table: prefix-cache hit rate (the replicas' own counters), time to first
# token, and how right the prefix predictions were (the router's counters). With ROUTERS > 1,
# that many routers with the same pipeline stand side by side in front of the same replicas
# and the client deals its requests to them in turn, as behind a load balancer. See README.md.
#
# Needs: python3 with venv, curl, a build of switchyard (a release build is made when missing).
#
# Knobs (environment):
#   PIPELINES (precise-prefix-load approx-prefix-load default)   files of configs/, in order
#   REPLICAS (4)  CACHE_BLOCKS (3000)  PREFILL_TPS (16000)  DECODE_TPS (200)  MAX_RUNNING (64)
#   TENANTS (120)  PREFIX_TOKENS (2000)  REQUESTS (600)  RPS (8)  SEED (1)
#   ROUTERS (1)   routers side by side, each with the whole pipeline (at most 3)
#   BUILD_DIR (target/release)   where switchyard and its plugin libraries are taken from
#   CLIENT_VENV          the load client's venv (aiohttp; shared with bench/bursts)
#   OUT_DIR (target/bench-kv-pressure/<UTC time>)   per-pipeline JSON and the table (table.md)
#   KEEP_WORK=1          keep the logs
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"

PIPELINES=${PIPELINES:-precise-prefix-load approx-prefix-load default}
REPLICAS=${REPLICAS:-4}
CACHE_BLOCKS=${CACHE_BLOCKS:-3000}
PREFILL_TPS=${PREFILL_TPS:-16000}
DECODE_TPS=${DECODE_TPS:-200}
MAX_RUNNING=${MAX_RUNNING:-64}
TENANTS=${TENANTS:-120}
PREFIX_TOKENS=${PREFIX_TOKENS:-2000}
REQUESTS=${REQUESTS:-600}
RPS=${RPS:-8}
SEED=${SEED:-1}
ROUTERS=${ROUTERS:-1}
BUILD_DIR=${BUILD_DIR:-$repo/target/release}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/switchyard-bench
CLIENT_VENV=${CLIENT_VENV:-$cache/bursts-client}
OUT_DIR=${OUT_DIR:-$repo/target/bench-kv-pressure/$(date -u +%Y%m%d-%H%M%S)}

FIRST_REPLICA_PORT=28501
FIRST_EVENTS_PORT=28521
FIRST_REPLAY_PORT=28541
# Router k (from 0) listens on FIRST_ROUTER_PORT + 3k, its metrics and admin API on the next
# two ports.
FIRST_ROUTER_PORT=28510

# The scratch directory, the pids stopped on exit, need, wait_for, stop, snapshot_build and
# aiohttp_venv.
. "$repo/bench/router/common.sh"

need curl "apt-get install -y curl"
need python3 "apt-get install -y python3 python3-venv"
case $ROUTERS in
    1 | 2 | 3) ;;
    *)
        echo "ROUTERS is $ROUTERS; it must be 1, 2 or 3" >&2
        exit 1
        ;;
esac
router_ports=()
for k in $(seq 0 $((ROUTERS - 1))); do
    router_ports+=($((FIRST_ROUTER_PORT + 3 * k)) $((FIRST_ROUTER_PORT + 3 * k + 1)) $((FIRST_ROUTER_PORT + 3 * k + 2)))
done

aiohttp_venv "$CLIENT_VENV"
snapshot_build
mkdir -p "$OUT_DIR"

ports=()
for i in $(seq 0 $((REPLICAS - 1))); do
    ports+=($((FIRST_REPLICA_PORT + i)) $((FIRST_EVENTS_PORT + i)) $((FIRST_REPLAY_PORT + i)))
done
for port in "${ports[@]}" "${router_ports[@]}"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "port $port on 127.0.0.1 is already in use; stop what holds it first" >&2
        exit 1
    fi
done

# The producer whose predictions each pipeline's prefix scorer reads.
producer_of() {
    case $1 in
        precise-prefix-load) echo kv-event-prefix-cache-producer ;;
        *) echo approx-prefix-cache-producer ;;
    esac
}

# config_for PIPELINE K: the pipeline of configs/PIPELINE.toml (its top-level keys and
# everything from its first [[plugins]] on; its own endpoints and listeners left out) with
# router K's listeners, a fast scrape and the replicas as endpoints, each with its KV-event
# publisher and replay socket.
config_for() {
    awk '/^\[\[plugins\]\]/ { plugins = 1 }
         /^\[/ { tables = 1 }
         !tables || plugins' "configs/$1.toml"
    local port=$((FIRST_ROUTER_PORT + 3 * $2))
    printf '\n[serve]\nlisten = "127.0.0.1:%d"\nmetrics_listen = "127.0.0.1:%d"\nadmin_listen = "127.0.0.1:%d"\n' \
        $port $((port + 1)) $((port + 2))
    printf '\n[fleet]\nscrape_interval_ms = 50\n'
    local i
    for i in $(seq 0 $((REPLICAS - 1))); do
        printf '\n[[endpoints]]\nname = "r%d"\naddress = "127.0.0.1:%d"\nkv_events_endpoint = "tcp://127.0.0.1:%d"\nkv_replay_endpoint = "tcp://127.0.0.1:%d"\n' \
            "$i" $((FIRST_REPLICA_PORT + i)) $((FIRST_EVENTS_PORT + i)) $((FIRST_REPLAY_PORT + i))
    done
}

{
    echo "date:      $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "machine:   $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg) before the runs"
    echo "build:     $BUILD_DIR/switchyard, work tree at $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "replicas:  $REPLICAS x mock-replica --cache-blocks $CACHE_BLOCKS --prefill-tokens-per-second $PREFILL_TPS --decode-tokens-per-second $DECODE_TPS --max-running $MAX_RUNNING, KV events with replay"
    if [ "$ROUTERS" -gt 1 ]; then
        echo "routers:   $ROUTERS side by side, each with the whole pipeline, requests dealt to them in turn"
    fi
    echo "workload:  $TENANTS tenants x $PREFIX_TOKENS-token prefixes, questions 200-400 tokens, answers 300-600, $REQUESTS requests at $RPS/s (Poisson), seed $SEED"
} | tee "$OUT_DIR/header.txt"

files=()
for pipeline in $PIPELINES; do
    for k in $(seq 0 $((ROUTERS - 1))); do
        config_for "$pipeline" "$k" >"$work/$pipeline-$k.toml"
        "$sy" check --config "$work/$pipeline-$k.toml" >"$work/$pipeline-$k.check" 2>&1 || {
            cat "$work/$pipeline-$k.check" >&2
            exit 1
        }
    done
    replica_pids=()
    metrics=()
    for i in $(seq 0 $((REPLICAS - 1))); do
        RUST_LOG=warn "$sy" mock-replica --port $((FIRST_REPLICA_PORT + i)) --name "r$i" \
            --cache-blocks "$CACHE_BLOCKS" --prefill-tokens-per-second "$PREFILL_TPS" \
            --decode-tokens-per-second "$DECODE_TPS" --max-running "$MAX_RUNNING" \
            --kv-events-port $((FIRST_EVENTS_PORT + i)) --kv-replay-port $((FIRST_REPLAY_PORT + i)) \
            >>"$work/replica-r$i.log" 2>&1 &
        pids+=($!)
        replica_pids+=($!)
        metrics+=("http://127.0.0.1:$((FIRST_REPLICA_PORT + i))")
    done
    for i in $(seq 0 $((REPLICAS - 1))); do
        wait_for 10 "http://127.0.0.1:$((FIRST_REPLICA_PORT + i))/health"
    done
    router_pids=()
    urls=()
    router_metrics=()
    for k in $(seq 0 $((ROUTERS - 1))); do
        port=$((FIRST_ROUTER_PORT + 3 * k))
        RUST_LOG=${RUST_LOG:-warn} "$sy" serve --config "$work/$pipeline-$k.toml" \
            >>"$work/router-$pipeline-$k.log" 2>&1 &
        pids+=($!)
        router_pids+=($!)
        wait_for 60 "http://127.0.0.1:$((port + 1))/ready" || {
            tail -20 "$work/router-$pipeline-$k.log" >&2
            exit 1
        }
        # Every publisher subscribed before the first request.
        for _ in $(seq 1 100); do
            connected=$(curl -sf "http://127.0.0.1:$((port + 2))/kv-events" \
                | python3 -c 'import json,sys; print(sum(1 for e in json.load(sys.stdin)["endpoints"] if e.get("connected")))' \
                2>/dev/null || echo 0)
            [ "$connected" -ge "$REPLICAS" ] && break
            sleep 0.1
        done
        urls+=("http://127.0.0.1:$port/v1/completions")
        router_metrics+=("http://127.0.0.1:$((port + 1))/metrics")
    done
    out="$OUT_DIR/$pipeline.json"
    "$CLIENT_VENV/bin/python" "$here/client.py" run --pipeline "$pipeline" \
        --producer "$(producer_of "$pipeline")" \
        --url "$(IFS=,; echo "${urls[*]}")" \
        --router-metrics "$(IFS=,; echo "${router_metrics[*]}")" \
        --replica-metrics "$(IFS=,; echo "${metrics[*]}")" \
        --seed "$SEED" --tenants "$TENANTS" --prefix-tokens "$PREFIX_TOKENS" \
        --requests "$REQUESTS" --rps "$RPS" --out "$out"
    files+=("$out")
    stop "${router_pids[@]}" "${replica_pids[@]}"
done

echo
"$CLIENT_VENV/bin/python" "$here/client.py" report "${files[@]}" | tee "$OUT_DIR/table.md"
echo "results: $OUT_DIR"
