#!/usr/bin/env bash
# Router overhead: wrk posts a ~9 KB completion prompt over 64 connections (a) straight to one
# static nginx backend, (b) through `switchyard serve` and (c) through sglang-router 0.3.2
# (cache-aware policy), both routers in front of the same 8 nginx backends. Prints requests/s,
# p50 and p99 for each and the latency each router adds over the direct run.
#
# Needs: nginx and wrk (Debian packages), python3 with venv, a release build of switchyard
# (built here when missing). Everything listens on 127.0.0.1; everything started here is
# stopped by pid on exit.
#
# Knobs (environment): DURATION (20s), CONNS (64), THREADS (2), ROUNDS (1: each round runs the
# three targets once, in the order below), WARMUP (3s), NGINX_WORKERS (1),
# SGLANG_VENV (a cache directory; created with pip when missing), KEEP_WORK=1 keeps the logs,
# TARGETS (default "direct switchyard switchyard-no-records sglang"; "switchyard-no-records" is
# switchyard.toml with decision_records = 0; "switchyard-minimal" adds switchyard with a
# pipeline that does no prefix work, bench/router/switchyard-minimal.toml; "baseline" runs
# switchyard.toml on another build, the binary named by BASELINE, to compare two builds in one run).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"

DURATION=${DURATION:-20s}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-1}
WARMUP=${WARMUP:-3s}
NGINX_WORKERS=${NGINX_WORKERS:-1}
SGLANG_VENV=${SGLANG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard-bench/sglang-router-0.3.2}
TARGETS=${TARGETS:-direct switchyard switchyard-no-records sglang}

BACKEND_PORTS="28001 28002 28003 28004 28005 28006 28007 28008"
SWITCHYARD_PORT=28100   # as in bench/router/switchyard.toml
SWITCHYARD_METRICS=28101
MINIMAL_PORT=28110      # as in bench/router/switchyard-minimal.toml
NO_RECORDS_PORT=28120   # switchyard.toml's ports moved by 20
BASELINE_PORT=28130     # and by 30
SGLANG_PORT=28200
SGLANG_METRICS=28201

. "$here/common.sh"

need nginx "apt-get install -y nginx"
need wrk "apt-get install -y wrk"
need curl "apt-get install -y curl"

if [ ! -x target/release/switchyard ]; then
    cargo build --release --workspace
fi
if [[ " $TARGETS " == *" sglang "* ]] && [ ! -x "$SGLANG_VENV/bin/python" ]; then
    python3 -m venv "$SGLANG_VENV"
    "$SGLANG_VENV/bin/pip" install --quiet "sglang-router==0.3.2"
fi

for port in $BACKEND_PORTS $SWITCHYARD_PORT $SWITCHYARD_METRICS $MINIMAL_PORT $NO_RECORDS_PORT $BASELINE_PORT $SGLANG_PORT $SGLANG_METRICS; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "port $port on 127.0.0.1 is already in use; stop what holds it first" >&2
        exit 1
    fi
done

# Waits until `curl ARGS...` succeeds, up to $1 seconds.

probe='{"model":"m","prompt":"hello","max_tokens":16}'

# --- backends -------------------------------------------------------------------------------
mkdir -p "$work/nginx/body"
"$here/nginx.conf.sh" "$work/nginx" "$BACKEND_PORTS" "$NGINX_WORKERS" >"$work/nginx/nginx.conf"
nginx -e "$work/nginx/error.log" -p "$work/nginx" -c "$work/nginx/nginx.conf" &
pids+=($!)
nginx_pid=$!
for port in $BACKEND_PORTS; do
    wait_for 10 -X POST -d "$probe" "http://127.0.0.1:$port/v1/completions"
done

# --- switchyard -----------------------------------------------------------------------------
RUST_LOG=${RUST_LOG:-warn} target/release/switchyard serve --config "$here/switchyard.toml" \
    >"$work/switchyard.log" 2>&1 &
pids+=($!)
switchyard_pid=$!
wait_for 30 -X POST -H 'content-type: application/json' -d "$probe" \
    "http://127.0.0.1:$SWITCHYARD_PORT/v1/completions"

minimal_pid=
if [[ " $TARGETS " == *" switchyard-minimal "* ]]; then
    RUST_LOG=${RUST_LOG:-warn} target/release/switchyard serve \
        --config "$here/switchyard-minimal.toml" >"$work/switchyard-minimal.log" 2>&1 &
    pids+=($!)
    minimal_pid=$!
    wait_for 30 -X POST -H 'content-type: application/json' -d "$probe" \
        "http://127.0.0.1:$MINIMAL_PORT/v1/completions"
fi

no_records_pid=
if [[ " $TARGETS " == *" switchyard-no-records "* ]]; then
    sed -e 's/:28100"/:28120"/; s/:28101"/:28121"/; s/:28102"/:28122"/' \
        -e 's/^\[serve\]$/[serve]\ndecision_records = 0/' \
        "$here/switchyard.toml" >"$work/switchyard-no-records.toml"
    RUST_LOG=${RUST_LOG:-warn} target/release/switchyard serve \
        --config "$work/switchyard-no-records.toml" >"$work/switchyard-no-records.log" 2>&1 &
    pids+=($!)
    no_records_pid=$!
    wait_for 30 -X POST -H 'content-type: application/json' -d "$probe" \
        "http://127.0.0.1:$NO_RECORDS_PORT/v1/completions"
fi

baseline_pid=
if [[ " $TARGETS " == *" baseline "* ]]; then
    if [ ! -x "${BASELINE:-}" ]; then
        echo "TARGETS names baseline: set BASELINE to another build's switchyard binary" >&2
        exit 1
    fi
    sed -e 's/:28100"/:28130"/; s/:28101"/:28131"/; s/:28102"/:28132"/' \
        "$here/switchyard.toml" >"$work/switchyard-baseline.toml"
    RUST_LOG=${RUST_LOG:-warn} "$BASELINE" serve --config "$work/switchyard-baseline.toml" \
        --plugin-dir "$(dirname "$BASELINE")" >"$work/baseline.log" 2>&1 &
    pids+=($!)
    baseline_pid=$!
    wait_for 30 -X POST -H 'content-type: application/json' -d "$probe" \
        "http://127.0.0.1:$BASELINE_PORT/v1/completions"
fi

# --- sglang-router --------------------------------------------------------------------------
sglang_pid=
if [[ " $TARGETS " == *" sglang "* ]]; then
    urls=()
    for port in $BACKEND_PORTS; do urls+=("http://127.0.0.1:$port"); done
    "$SGLANG_VENV/bin/python" -m sglang_router.launch_router \
        --worker-urls "${urls[@]}" --policy cache_aware \
        --host 127.0.0.1 --port "$SGLANG_PORT" \
        --prometheus-host 127.0.0.1 --prometheus-port "$SGLANG_METRICS" \
        --log-level warn >"$work/sglang.log" 2>&1 &
    pids+=($!)
    sglang_pid=$!
    wait_for 60 -X POST -H 'content-type: application/json' -d "$probe" \
        "http://127.0.0.1:$SGLANG_PORT/v1/completions"
fi

url_of() {
    case $1 in
        direct) echo "http://127.0.0.1:${BACKEND_PORTS%% *}/v1/completions" ;;
        switchyard) echo "http://127.0.0.1:$SWITCHYARD_PORT/v1/completions" ;;
        switchyard-minimal) echo "http://127.0.0.1:$MINIMAL_PORT/v1/completions" ;;
        switchyard-no-records) echo "http://127.0.0.1:$NO_RECORDS_PORT/v1/completions" ;;
        baseline) echo "http://127.0.0.1:$BASELINE_PORT/v1/completions" ;;
        sglang) echo "http://127.0.0.1:$SGLANG_PORT/v1/completions" ;;
    esac
}
pid_of() {
    case $1 in
        direct) echo "$nginx_pid" ;;
        switchyard) echo "$switchyard_pid" ;;
        switchyard-minimal) echo "$minimal_pid" ;;
        switchyard-no-records) echo "$no_records_pid" ;;
        baseline) echo "$baseline_pid" ;;
        sglang) echo "$sglang_pid" ;;
    esac
}

# CPU seconds (user + system) used so far by a process and its threads.
cpu_seconds() {
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"
}
# nginx's work is done by its worker processes: add theirs to the master's.
cpu_of() {
    local total pid
    if [ "$1" = direct ]; then
        total=0
        for pid in $(pgrep -P "$nginx_pid") "$nginx_pid"; do
            total=$(echo "$total + $(cpu_seconds "$pid")" | bc)
        done
        echo "$total"
    else
        cpu_seconds "$(pid_of "$1")"
    fi
}

cp "$here/post.lua" "$work/post.lua"
cd "$work"

# Warm-up: connections, the routers' pools and prefix indexes.
for target in $TARGETS; do
    wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" -s post.lua "$(url_of "$target")" >/dev/null
done

echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: $(nproc) cores, $(awk '/model name/ { $1=$2=$3=""; print; exit }' /proc/cpuinfo | sed 's/^ *//')"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) before the runs"
echo "build:   switchyard at $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$repo" diff --quiet HEAD -- host plugins plugin-api 2>/dev/null || echo ' with uncommitted changes'), binary of $(date -u -r "$repo/target/release/switchyard" '+%Y-%m-%d %H:%M UTC')"
echo "wrk:     -t$THREADS -c$CONNS -d$DURATION --latency -s post.lua, ~9 KB prompt, nginx workers $NGINX_WORKERS"
echo

results="$work/results.tsv"
: >"$results"
for round in $(seq 1 "$ROUNDS"); do
    for target in $TARGETS; do
        out="$work/wrk-$target-$round.txt"
        before=$(cpu_of "$target")
        wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency -s post.lua "$(url_of "$target")" >"$out"
        after=$(cpu_of "$target")
        load=$(cut -d' ' -f1 /proc/loadavg)
        # wrk prints latencies as 812.00us, 1.23ms or 1.02s: convert to ms.
        awk -v target="$target" -v round="$round" -v cpu="$(echo "$after - $before" | bc)" \
            -v load="$load" '
            function ms(v) {
                if (v ~ /us$/) return substr(v, 1, length(v) - 2) / 1000
                if (v ~ /ms$/) return substr(v, 1, length(v) - 2) + 0
                if (v ~ /s$/)  return substr(v, 1, length(v) - 1) * 1000
                return v + 0
            }
            $1 == "50%" { p50 = ms($2) }
            $1 == "99%" { p99 = ms($2) }
            /^Requests\/sec:/ { rps = $2 }
            /requests in/ { n = $1 }
            /Non-2xx or 3xx responses:/ { bad = $NF }
            /Socket errors:/ { gsub(",", ""); errors = $4 + $6 + $8 + $10 }
            END {
                printf "%s\t%s\t%.0f\t%.3f\t%.3f\t%d\t%d\t%s\t%s\t%d\n", \
                    target, round, rps, p50, p99, bad, errors, cpu, load, n
            }' "$out" >>"$results"
    done
done

awk -F'\t' '
    $1 == "direct" { d50[$2] = $4; d99[$2] = $5 }
    { rows[NR] = $0 }
    END {
        printf "%-22s %5s %9s %9s %9s %10s %10s %7s %7s %9s %6s\n", \
            "target", "round", "req/s", "p50 ms", "p99 ms", "+p50 ms", "+p99 ms", \
            "non2xx", "sockerr", "cpu s", "load1"
        for (i = 1; i <= NR; i++) {
            split(rows[i], f, "\t")
            add50 = (f[1] == "direct" || !(f[2] in d50)) ? "-" : sprintf("%.3f", f[4] - d50[f[2]])
            add99 = (f[1] == "direct" || !(f[2] in d99)) ? "-" : sprintf("%.3f", f[5] - d99[f[2]])
            printf "%-22s %5s %9s %9.3f %9.3f %10s %10s %7s %7s %9s %6s\n", \
                f[1], f[2], f[3], f[4], f[5], add50, add99, f[6], f[7], f[8], f[9]
        }
    }' "$results"
echo
echo "cpu s: CPU seconds the target process used during its run (nginx: master + workers)."
echo "+p50/+p99: router latency minus the direct run of the same round."
echo "load after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"
