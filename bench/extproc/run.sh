#!/usr/bin/env bash
# Picks per second and pick latency of `switchyard ext-proc` over ext_proc, from a bounded
# load client (tests/support/bin/extproc_load.rs) holding CONCURRENCY pick-only streams.
# Everything runs on 127.0.0.1 and stops by itself.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/router/common.sh

CONCURRENCY=${CONCURRENCY:-64}
CONNECTIONS=${CONNECTIONS:-2}
DURATION=${DURATION:-20}
WARMUP=${WARMUP:-3}
ROUNDS=${ROUNDS:-2}
REQUESTS=${REQUESTS:-2000000}

need cargo "a Rust toolchain"
cargo build --release --quiet --workspace
cargo build --release --quiet -p switchyard-tests --bin extproc-load

./target/release/switchyard ext-proc --config-file bench/extproc/switchyard.toml \
    --bind-address 127.0.0.1 --grpc-port 28400 --grpc-health-port 28401 --metrics-port 28402 \
    --secure-serving=false -v=0 --plugin-dir target/release >"$work/ext-proc.log" 2>&1 &
pids+=($!)
wait_for 30 http://127.0.0.1:28402/health

for round in $(seq "$ROUNDS"); do
    echo "round $round:"
    ./target/release/extproc-load --target 127.0.0.1:28400 --concurrency "$CONCURRENCY" \
        --connections "$CONNECTIONS" --seconds "$DURATION" --warmup-seconds "$WARMUP" \
        --requests "$REQUESTS"
done
echo "in flight afterwards: $(curl -s http://127.0.0.1:28402/metrics | awk '/^switchyard_in_flight_total/ {print $2}')"
