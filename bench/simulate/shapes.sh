#!/usr/bin/env bash
# Runs `switchyard simulate` over the burst shapes and the two cache workloads and prints one
# Markdown table: every pipeline (the one under test and the baselines) per shape.
#
#   bench/simulate/shapes.sh [simulate flags...]
#
# Extra flags go to every run (for example `--config configs/other.toml` or `--compare F`).
# SWITCHYARD names the binary (default: target/release/switchyard under the repository).
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${SWITCHYARD:-$root/target/release/switchyard}"
if [[ ! -x "$bin" ]]; then
    echo "error: $bin not found; run \`cargo build --release --workspace\` first" >&2
    exit 1
fi

# P prompts x S samples, one step, spread by the client arrival model's defaults.
shapes=(32x16 2x256 4x128 3x100 5x100 256x1)
replica_counts=(8 12 16)

echo "| workload | replicas | pipeline | hit rate | TTFT p99 ms | prefills/prompt | requests/replica min-max |"
echo "|---|---|---|---|---|---|---|"

# Prints the table rows of one run; `$1` labels the workload, `$2` the replica count.
rows() {
    local label="$1" replicas="$2"
    shift 2
    "$bin" simulate --replicas "$replicas" "$@" 2>/dev/null |
        awk -v label="$label" -v replicas="$replicas" '
            NF == 0 { exit }
            NR > 1 && NF >= 14 {
                printf "| %s | %s | %s | %s | %s | %s | %s |\n",
                    label, replicas, $1, $5, $10, $14, $13
            }'
}

for replicas in "${replica_counts[@]}"; do
    for shape in "${shapes[@]}"; do
        prompts="${shape%x*}"
        samples="${shape#*x}"
        rows "rl-rollout ${prompts}×${samples}" "$replicas" --workload rl-rollout \
            --set "prompts=$prompts" --set "samples=$samples" --set steps=1 "$@"
    done
done
for workload in shared-prefix multi-turn; do
    rows "$workload" 8 --workload "$workload" "$@"
done
