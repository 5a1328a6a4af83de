//! What a simulation run measured, and its outputs: `report.json`, `report.html` and a
//! terminal table.

mod html;

use super::engine::{RunOutcome, Status};
use super::replica::ReplicaStats;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Buckets of [`LoadSeries`] over a run.
const LOAD_BUCKETS: usize = 200;

/// The outcome of one pipeline on one workload.
///
/// Serialized (in `report.json`) with these keys, in this order:
///
/// * `name` — the router's name.
/// * `requests` — requests in the workload; `completed`, `rejected` (by the router, or as a
///   duplicate id) and `unrouted` (never decided) add up to it.
/// * `prompt_tokens` — prompt tokens of the requests sent to a replica ("served").
/// * `prefill_tokens_computed` / `prefill_tokens_cached` — of those, tokens the replicas
///   prefilled / found in their prefix cache (they add up to `prompt_tokens`).
/// * `prefill_tokens_ideal` — the least any placement could prefill with unbounded caches:
///   every distinct full block of the served prompts once (distinct chained block hashes ×
///   block size), plus every served prompt's partial last block (`len mod block size`
///   tokens), which replicas never cache.
/// * `cache_hit_rate` — `prefill_tokens_cached / prompt_tokens` (0 when nothing was served).
/// * `ttft_ms` — time to first token (arrival → prefill done, so it includes the router's
///   wait and queueing) over completed requests: `{count, mean, p50, p99}`.
/// * `e2e_ms` — arrival → last token, same shape.
/// * `router_wait_ms` — arrival → decision, over decided requests, same shape.
/// * `replica_load` — `{max, mean}`: the largest and the mean over replicas of each
///   replica's peak running + waiting requests; `peak_per_replica` those peaks;
///   `served_per_replica` requests sent to each replica; `prefill_tokens_computed_per_replica`
///   and `prefill_tokens_cached_per_replica` each replica's share of the token totals.
/// * `prefills_per_prompt_per_step` — for workloads with step tags (RL rollouts): over every
///   distinct (step, group), the number of replicas on which at least one of its requests
///   did not find its whole block-aligned prompt cached, averaged; `null` otherwise.
/// * `makespan_ms` — virtual time of the last event.
/// * `ttft_cdf_ms` — 101 TTFT percentiles, 0 to 100 (empty when nothing completed).
/// * `load_series` — `{bucket_ms, per_replica}`: for each replica, the peak running +
///   waiting in each of up to 200 equal time buckets from 0 to `makespan_ms`.
///
/// Percentiles use the nearest-rank method; empty sets give 0.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PipelineReport {
    pub name: String,
    pub requests: u64,
    pub completed: u64,
    pub rejected: u64,
    pub unrouted: u64,
    pub prompt_tokens: u64,
    pub prefill_tokens_computed: u64,
    pub prefill_tokens_cached: u64,
    pub prefill_tokens_ideal: u64,
    pub cache_hit_rate: f64,
    pub ttft_ms: Summary,
    pub e2e_ms: Summary,
    pub router_wait_ms: Summary,
    pub replica_load: ReplicaLoad,
    pub prefills_per_prompt_per_step: Option<f64>,
    pub makespan_ms: f64,
    pub ttft_cdf_ms: Vec<f64>,
    pub load_series: LoadSeries,
}

/// Count, mean and nearest-rank percentiles of a sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
}

/// Per-replica concurrency and traffic.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ReplicaLoad {
    pub max: u32,
    pub mean: f64,
    pub peak_per_replica: Vec<u32>,
    pub served_per_replica: Vec<u64>,
    pub prefill_tokens_computed_per_replica: Vec<u64>,
    pub prefill_tokens_cached_per_replica: Vec<u64>,
}

/// Peak running + waiting per replica per time bucket.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LoadSeries {
    pub bucket_ms: f64,
    pub per_replica: Vec<Vec<u32>>,
}

/// The nearest-rank `p`-th percentile of ascending `sorted`: the value at rank
/// `ceil(p / 100 × n)` (at least 1); 0 when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Summary {
    /// Summarizes `values`, sorting them in place.
    pub fn of(values: &mut [f64]) -> Summary {
        if values.is_empty() {
            return Summary::default();
        }
        values.sort_by(f64::total_cmp);
        Summary {
            count: values.len() as u64,
            mean: values.iter().sum::<f64>() / values.len() as f64,
            p50: percentile(values, 50.0),
            p99: percentile(values, 99.0),
        }
    }
}

impl PipelineReport {
    pub(crate) fn from_outcome(name: &str, run: &RunOutcome) -> PipelineReport {
        let bs = run.block_size as u64;
        let mut counts = [0u64; 3];
        let (mut prompt_tokens, mut computed, mut cached, mut tails) = (0u64, 0u64, 0u64, 0u64);
        let (mut ttft, mut e2e, mut wait) = (Vec::new(), Vec::new(), Vec::new());
        // (step, group) → replicas that prefilled part of the group's block-aligned prompt.
        let mut prefillers: BTreeMap<(u32, u64), Vec<usize>> = BTreeMap::new();

        for rec in &run.records {
            match rec.status {
                Status::Completed => counts[0] += 1,
                Status::Rejected => counts[1] += 1,
                _ => counts[2] += 1,
            }
            if !rec.decided_ms.is_nan() {
                wait.push(rec.decided_ms - rec.arrival_ms);
            }
            let Some(replica) = rec.replica else {
                continue;
            };
            let len = u64::from(rec.job.prompt_tokens);
            prompt_tokens += len;
            computed += u64::from(rec.computed_tokens);
            cached += u64::from(rec.cached_tokens);
            tails += len % bs;
            if rec.status == Status::Completed {
                ttft.push(rec.first_token_ms - rec.arrival_ms);
                e2e.push(rec.done_ms - rec.arrival_ms);
            }
            if let Some(step) = rec.step {
                let holders = prefillers.entry((step, rec.group)).or_default();
                let aligned = len - len % bs;
                if u64::from(rec.cached_tokens) < aligned && !holders.contains(&replica) {
                    holders.push(replica);
                }
            }
        }

        let ttft_ms = Summary::of(&mut ttft);
        let ttft_cdf_ms = if ttft.is_empty() {
            Vec::new()
        } else {
            (0..=100).map(|p| percentile(&ttft, f64::from(p))).collect()
        };
        let prefills_per_prompt_per_step = (!prefillers.is_empty()).then(|| {
            let total: usize = prefillers.values().map(Vec::len).sum();
            total as f64 / prefillers.len() as f64
        });

        PipelineReport {
            name: name.to_string(),
            requests: run.records.len() as u64,
            completed: counts[0],
            rejected: counts[1],
            unrouted: counts[2],
            prompt_tokens,
            prefill_tokens_computed: computed,
            prefill_tokens_cached: cached,
            prefill_tokens_ideal: run.distinct_blocks * bs + tails,
            cache_hit_rate: if prompt_tokens == 0 {
                0.0
            } else {
                cached as f64 / prompt_tokens as f64
            },
            ttft_ms,
            e2e_ms: Summary::of(&mut e2e),
            router_wait_ms: Summary::of(&mut wait),
            replica_load: replica_load(run),
            prefills_per_prompt_per_step,
            makespan_ms: run.end_ms,
            ttft_cdf_ms,
            load_series: load_series(run),
        }
    }
}

fn replica_load(run: &RunOutcome) -> ReplicaLoad {
    let peak_per_replica: Vec<u32> = run.replicas.iter().map(|r| r.stats().peak_load).collect();
    let per_replica =
        |f: fn(&ReplicaStats) -> u64| run.replicas.iter().map(|r| f(r.stats())).collect();
    let mean = if peak_per_replica.is_empty() {
        0.0
    } else {
        peak_per_replica.iter().map(|&p| f64::from(p)).sum::<f64>() / peak_per_replica.len() as f64
    };
    ReplicaLoad {
        max: peak_per_replica.iter().copied().max().unwrap_or(0),
        mean,
        peak_per_replica,
        served_per_replica: per_replica(|s| s.served),
        prefill_tokens_computed_per_replica: per_replica(|s| s.prefill_tokens_computed),
        prefill_tokens_cached_per_replica: per_replica(|s| s.cached_tokens),
    }
}

fn load_series(run: &RunOutcome) -> LoadSeries {
    let buckets = if run.end_ms > 0.0 { LOAD_BUCKETS } else { 1 };
    let bucket_ms = run.end_ms / buckets as f64;
    let per_replica = run
        .replicas
        .iter()
        .map(|replica| {
            let points = &replica.stats().load_points;
            let mut next = 0;
            let mut current = 0;
            (0..buckets)
                .map(|b| {
                    let last = b + 1 == buckets;
                    let end = (b + 1) as f64 * bucket_ms;
                    let mut peak = current;
                    while next < points.len() && (points[next].0 < end || last) {
                        current = points[next].1;
                        peak = peak.max(current);
                        next += 1;
                    }
                    peak
                })
                .collect()
        })
        .collect();
    LoadSeries {
        bucket_ms,
        per_replica,
    }
}

/// Writes `report.json` (an array with one object per pipeline, keys as documented on
/// [`PipelineReport`]) and `report.html` (summary table, per-replica load over time for each
/// pipeline, TTFT CDFs; inline SVG, no scripts or external assets) into `dir`, creating it
/// if needed.
pub fn write_reports(dir: &Path, reports: &[PipelineReport]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let json = serde_json::to_string_pretty(reports).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("report.json"), json + "\n")?;
    std::fs::write(dir.join("report.html"), html::page(reports))?;
    Ok(())
}

/// One row per pipeline with the key figures, columns aligned, for a terminal.
pub fn render_table(reports: &[PipelineReport]) -> String {
    const HEADER: [&str; 12] = [
        "pipeline",
        "done",
        "rejected",
        "hit rate",
        "prefill tok",
        "ideal tok",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "E2E p99 ms",
        "peak load max/mean",
        "requests/replica min-max",
        "prefills/prompt",
    ];
    let rows: Vec<[String; 12]> = reports
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                format!("{}/{}", r.completed, r.requests),
                (r.rejected + r.unrouted).to_string(),
                format!("{:.1}%", r.cache_hit_rate * 100.0),
                r.prefill_tokens_computed.to_string(),
                r.prefill_tokens_ideal.to_string(),
                format!("{:.1}", r.ttft_ms.p50),
                format!("{:.1}", r.ttft_ms.p99),
                format!("{:.1}", r.e2e_ms.p99),
                format!("{}/{:.1}", r.replica_load.max, r.replica_load.mean),
                served_range(&r.replica_load.served_per_replica),
                r.prefills_per_prompt_per_step
                    .map_or_else(|| "-".to_string(), |v| format!("{v:.2}")),
            ]
        })
        .collect();
    let mut widths = HEADER.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            if i == 0 {
                let _ = write!(text, "{cell:<w$}", w = widths[0]);
            } else {
                let _ = write!(text, "  {cell:>w$}", w = widths[i]);
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut HEADER.iter().copied());
    for row in &rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// The fewest and most requests sent to one replica, `min-max` (`-` without replicas).
fn served_range(served: &[u64]) -> String {
    match (served.iter().min(), served.iter().max()) {
        (Some(min), Some(max)) => format!("{min}-{max}"),
        _ => "-".to_string(),
    }
}

#[cfg(test)]
mod tests;
