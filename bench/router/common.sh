# Shared by the scripts of bench/router: a scratch directory, the processes a script starts
# (stopped by pid on exit), and small checks. Sourced, not run.

work=$(mktemp -d)
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [ "${KEEP_WORK:-0}" = 1 ]; then
        echo "logs kept in $work"
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT

# need COMMAND HOW-TO-INSTALL
need() { command -v "$1" >/dev/null || { echo "missing: $1 ($2)" >&2; exit 1; }; }

# wait_for SECONDS CURL-ARGS...: until curl succeeds, or fail after SECONDS.
wait_for() {
    local seconds=$1
    shift
    local deadline=$((SECONDS + seconds))
    until curl -sf -o /dev/null --max-time 2 "$@"; do
        if [ $SECONDS -ge $deadline ]; then
            echo "timed out waiting for: curl $*" >&2
            return 1
        fi
        sleep 0.2
    done
}
