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

# stop PID...: stops the given pids (all started here), waits for them and forgets them, so a
# pid is never signalled again after it may have been reused.
stop() {
    local pid p keep
    for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
    for pid in "$@"; do wait "$pid" 2>/dev/null || true; done
    keep=()
    for p in "${pids[@]}"; do
        [[ " $* " == *" $p "* ]] || keep+=("$p")
    done
    pids=("${keep[@]+"${keep[@]}"}")
}

# snapshot_build: a release build of the workspace when BUILD_DIR is repo/target/release and
# holds none yet; then a copy of BUILD_DIR's switchyard and plugin libraries in $work/bin for
# the whole run, so a rebuild in the work tree meanwhile changes nothing. Sets sy.
snapshot_build() {
    if [ "$BUILD_DIR" = "$repo/target/release" ] && [ ! -x "$repo/target/release/switchyard" ]; then
        cargo build --release --workspace
    fi
    mkdir -p "$work/bin"
    cp "$BUILD_DIR/switchyard" "$BUILD_DIR"/lib*.so "$work/bin/"
    sy=$work/bin/switchyard
}

# aiohttp_venv VENV: a venv with aiohttp at VENV, created when missing.
aiohttp_venv() {
    if [ ! -x "$1/bin/python" ] || ! "$1/bin/python" -c 'import aiohttp' 2>/dev/null; then
        python3 -m venv "$1"
        "$1/bin/pip" install --quiet aiohttp
    fi
}
