#!/usr/bin/env bash
# Bounded load run: 4 fast `switchyard mock-replica` processes behind `switchyard serve`
# (bench/router/load.toml, the pipeline of configs/default.toml), REQUESTS completion requests
# at CONCURRENCY with oha. Afterwards it checks that every request got a 2xx answer, that the
# router holds nothing in flight and counted every request as completed, and that no mock
# replica still runs a sequence. Exits non-zero when a check fails.
#
# Needs: oha (`cargo install oha`), curl, a release build of switchyard (built when missing).
# Everything listens on 127.0.0.1; everything started here is stopped by pid on exit.
#
# Knobs (environment): REQUESTS (100000), CONCURRENCY (256), PROMPT_BYTES (2000),
# KEEP_WORK=1 keeps the logs.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"

REQUESTS=${REQUESTS:-100000}
CONCURRENCY=${CONCURRENCY:-256}
PROMPT_BYTES=${PROMPT_BYTES:-2000}

MOCK_PORTS="28301 28302 28303 28304"   # as in bench/router/load.toml
API=28300
METRICS=28309

. "$here/common.sh"

command -v oha >/dev/null || { echo "missing: oha (cargo install oha)" >&2; exit 1; }
command -v curl >/dev/null || { echo "missing: curl" >&2; exit 1; }
if [ ! -x target/release/switchyard ]; then
    cargo build --release --workspace
fi

for port in $MOCK_PORTS $API $METRICS; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "port $port on 127.0.0.1 is already in use; stop what holds it first" >&2
        exit 1
    fi
done


i=0
for port in $MOCK_PORTS; do
    i=$((i + 1))
    RUST_LOG=warn target/release/switchyard mock-replica --port "$port" --name "mock-$i" \
        --decode-tokens-per-second 5000 --prefill-tokens-per-second 1000000 \
        >"$work/mock-$i.log" 2>&1 &
    pids+=($!)
done
for port in $MOCK_PORTS; do
    wait_for 20 "http://127.0.0.1:$port/health"
done

RUST_LOG=${RUST_LOG:-warn} target/release/switchyard serve --config "$here/load.toml" \
    >"$work/switchyard.log" 2>&1 &
pids+=($!)
wait_for 30 "http://127.0.0.1:$METRICS/ready"

# One prompt of PROMPT_BYTES characters, the same for every request.
prompt=$(head -c "$PROMPT_BYTES" < <(yes "the router places this request on a replica" | tr '\n' ' '))
body="{\"model\":\"m\",\"prompt\":\"$prompt\",\"max_tokens\":16}"

echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) before the run"
echo "oha:     -n $REQUESTS -c $CONCURRENCY, POST /v1/completions, ${PROMPT_BYTES}-byte prompt, max_tokens 16"
start=$SECONDS
oha -n "$REQUESTS" -c "$CONCURRENCY" --no-tui -m POST \
    -H 'content-type: application/json' -d "$body" \
    "http://127.0.0.1:$API/v1/completions" >"$work/oha.txt" 2>&1 || true
echo "elapsed: $((SECONDS - start)) s"
sed -n '/^Summary/,/^Response time histogram/p' "$work/oha.txt" | grep -v histogram
sed -n '/^Response time distribution/,/^$/p' "$work/oha.txt"
sed -n '/^Status code distribution/,$p' "$work/oha.txt"

# What the router and the replicas say right after the last answer.
router=$(curl -sf "http://127.0.0.1:$METRICS/metrics")
in_flight=$(awk '/^switchyard_in_flight_total / { print $2 }' <<<"$router")
completed=$(awk '/^switchyard_requests_total\{/ && /outcome="completed"/ { s += $NF } END { print s + 0 }' <<<"$router")
all=$(awk '/^switchyard_requests_total\{/ { s += $NF } END { print s + 0 }' <<<"$router")
ok_2xx=$(awk '/^[ \t]*\[2[0-9][0-9]\]/ { s += $2 } END { print s + 0 }' "$work/oha.txt")
errors=$(sed -n '/^Error distribution/,$p' "$work/oha.txt" | awk '/^[ \t]*\[[0-9]+\]/ { s += substr($1, 2) } END { print s + 0 }')
running=0
for port in $MOCK_PORTS; do
    r=$(curl -sf "http://127.0.0.1:$port/metrics" | awk '/^vllm:num_requests_running/ { s += $NF } END { print s + 0 }')
    running=$((running + ${r%.*}))
done

echo
echo "per endpoint (completed):"
awk '/^switchyard_requests_total\{/ && /outcome="completed"/ {
        match($0, /endpoint="[^"]*"/); printf "  %s %d\n", substr($0, RSTART + 10, RLENGTH - 11), $NF }' <<<"$router"

fail=0
check() {
    if [ "$2" = "$3" ]; then
        printf "ok    %-52s %s\n" "$1" "$2"
    else
        printf "FAIL  %-52s %s (expected %s)\n" "$1" "$2" "$3"
        fail=1
    fi
}
echo
check "2xx answers seen by oha" "$ok_2xx" "$REQUESTS"
check "errors seen by oha" "$errors" 0
check "switchyard_in_flight_total" "${in_flight:-missing}" 0
check "sum of switchyard_requests_total{outcome=completed}" "$completed" "$REQUESTS"
check "sum of switchyard_requests_total (all outcomes)" "$all" "$REQUESTS"
check "sum of vllm:num_requests_running over the replicas" "$running" 0
exit $fail
