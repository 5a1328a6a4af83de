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
/// * `requests` — requests in the workload; `completed`, `rejected_by_router` (the router
///   refused it, or its id repeated an earlier request's), `rejected_by_replica` (the replica
///   it was sent to refused it: longer than its whole KV pool) and `unrouted` (never decided)
///   add up to it.
/// * `prompt_tokens` — prompt tokens of the requests sent to a replica ("served").
/// * `prefill_tokens_computed` / `prefill_tokens_cached` — of those, tokens the replicas
///   prefilled / found in their prefix cache (they add up to `prompt_tokens`).
/// * `prefill_tokens_ideal` — a floor no placement goes below, even with unbounded caches:
///   every distinct full block of the served prompts once (distinct chained block hashes ×
///   block size), except the blocks a request served by a step engine generated (the engine
///   caches its output, which a later prompt such as a session's next turn can reuse without
///   prefilling it),
///   plus every served prompt's partial last block (`len mod block size` tokens), which
///   replicas never cache.
/// * `cache_hit_rate` — `prefill_tokens_cached / prompt_tokens` (0 when nothing was served).
/// * `ttft_ms` — time to first token (arrival → prefill done, so it includes the router's
///   wait and queueing) over completed requests: `{count, mean, p50, p90, p99}`.
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
/// * `throughput` — `{requests_per_s, output_tokens_per_s}` of completed requests over
///   `makespan_ms`.
/// * `goodput` — `{ttft_objective_ms, tpot_objective_ms, requests, requests_per_s, share}`:
///   completed requests whose TTFT and time per output token are both within the objectives.
/// * `queue_wait_ms` — decision → first scheduled on the replica; `prefill_ms` — first
///   scheduled → first token; `tpot_ms` — (last token − first token) / (output tokens − 1),
///   over completed requests with more than one output token. Same shape as `ttft_ms`.
/// * `preemptions`, `evictions`, `recomputed_tokens` — over all replicas: sequences preempted
///   for KV blocks, cached blocks dropped to make room, tokens computed again after a
///   preemption.
/// * `utilisation` — per replica, time-averaged over `makespan_ms`: `busy` (share of time in
///   steps; fixed rate: with a sequence admitted), `kv_usage` (share of KV blocks held),
///   `batch` (sequences in the batch).
/// * `rl_steps` — for workloads with step tags: per step, `{step, requests, start_ms,
///   done_ms, duration_ms}` (first arrival → last completion of the step, what a trainer
///   waits for); `rl_step_total_ms` their durations added up. `[]` and `null` otherwise.
/// * `prefix_predictions` — per producer of `PrefixCacheMatchInfo` in the pipeline, how its
///   predictions held ([`PrefixPrediction`]); `[]` for a router that predicts nothing.
///
/// Percentiles use the nearest-rank method; empty sets give 0.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PipelineReport {
    pub name: String,
    pub requests: u64,
    pub completed: u64,
    pub rejected_by_router: u64,
    pub rejected_by_replica: u64,
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
    pub throughput: Throughput,
    pub goodput: Goodput,
    pub queue_wait_ms: Summary,
    pub prefill_ms: Summary,
    pub tpot_ms: Summary,
    pub preemptions: u64,
    pub evictions: u64,
    pub recomputed_tokens: u64,
    pub utilisation: Utilisation,
    pub rl_steps: Vec<RlStep>,
    pub rl_step_total_ms: Option<f64>,
    pub prefix_predictions: Vec<PrefixPrediction>,
}

/// How one prefix producer's predictions held over a run: for every request placed on a
/// replica and scheduled there, the prompt tokens the producer expected that replica to hold
/// at the decision against the tokens it found cached when the prefill was scheduled (the
/// figure vLLM returns as `cached_tokens`). The words are those of the live check
/// (`GET /predictions`): `correct_tokens` are both predicted and cached (the smaller of the
/// two per request), `precision` = correct / predicted, `recall` = correct / cached, `null`
/// when the denominator is 0.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrefixPrediction {
    pub producer: String,
    pub checked_requests: u64,
    pub predicted_tokens: u64,
    pub cached_tokens: u64,
    pub correct_tokens: u64,
    pub precision: Option<f64>,
    pub recall: Option<f64>,
}
/// What was run, as `report.json`'s `run` object and the head of `report.html`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RunContext {
    /// The command line, program name first.
    pub command_line: Vec<String>,
    pub switchyard_version: String,
    /// The built-in workload's name, or `trace`.
    pub workload: String,
    /// The trace file, when a trace was replayed.
    pub trace: Option<String>,
    /// Every workload parameter with defaults filled in (a trace's arrival parameters).
    pub workload_parameters: serde_json::Value,
    pub requests: u64,
    /// The fleet file, when the fleet came from one.
    pub fleet_file: Option<String>,
    pub replicas: usize,
    /// The replica groups in fleet order: `{replicas, profile}`.
    pub profiles: Vec<ProfileGroup>,
    pub block_size_tokens: usize,
    pub scrape_interval_ms: f64,
    /// How long after a replica's cache changed a router reading KV-cache events hears of it.
    pub kv_event_delay_ms: f64,
    /// Seed of each pipeline's scheduler.
    pub seed: u64,
    /// Routers of each policy side by side, requests dealt to them in turn.
    pub routers: usize,
    /// The config of each pipeline run from a file, in report order.
    pub configs: Vec<ConfigFile>,
}

/// Replicas sharing a profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileGroup {
    pub replicas: usize,
    pub profile: String,
}

/// A pipeline's config file as it was read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigFile {
    pub pipeline: String,
    /// As given on the command line; `null` for a config built into the binary.
    pub path: Option<String>,
    /// SHA-256 of the bytes read, lowercase hex.
    pub sha256: String,
}

/// Completed work per second of the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Throughput {
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
}

/// Completed requests within both latency objectives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Goodput {
    pub ttft_objective_ms: f64,
    pub tpot_objective_ms: f64,
    pub requests: u64,
    pub requests_per_s: f64,
    /// `requests` over completed requests (0 when none completed).
    pub share: f64,
}

/// Time-averaged use of each replica.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Utilisation {
    pub busy: Vec<f64>,
    pub kv_usage: Vec<f64>,
    pub batch: Vec<f64>,
}

/// When one RL rollout step's requests started arriving and when the last one finished.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RlStep {
    pub step: u32,
    pub requests: u64,
    pub start_ms: f64,
    pub done_ms: f64,
    pub duration_ms: f64,
}

/// Count, mean and nearest-rank percentiles of a sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
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
            p90: percentile(values, 90.0),
            p99: percentile(values, 99.0),
        }
    }
}

impl PipelineReport {
    pub(crate) fn from_outcome(name: &str, run: &RunOutcome) -> PipelineReport {
        let bs = run.block_size as u64;
        let mut counts = [0u64; 4];
        let (mut prompt_tokens, mut computed, mut cached, mut tails) = (0u64, 0u64, 0u64, 0u64);
        let (mut ttft, mut e2e, mut wait) = (Vec::new(), Vec::new(), Vec::new());
        let (mut queue, mut prefill, mut tpot) = (Vec::new(), Vec::new(), Vec::new());
        let (ttft_objective, tpot_objective) = run.objectives;
        let (mut output_tokens, mut good) = (0u64, 0u64);
        // step → (requests, first arrival, last completion)
        let mut steps: BTreeMap<u32, (u64, f64, f64)> = BTreeMap::new();
        // (step, group) → replicas that prefilled part of the group's block-aligned prompt.
        let mut prefillers: BTreeMap<(u32, u64), Vec<usize>> = BTreeMap::new();

        for rec in &run.records {
            match rec.status {
                Status::Completed => counts[0] += 1,
                Status::Rejected => counts[1] += 1,
                Status::Refused => counts[2] += 1,
                Status::Pending | Status::Dispatched => counts[3] += 1,
            }
            if !rec.decided_ms.is_nan() {
                wait.push(rec.decided_ms - rec.arrival_ms);
            }
            if let Some(step) = rec.step {
                let entry = steps.entry(step).or_insert((0, f64::INFINITY, 0.0));
                entry.0 += 1;
                entry.1 = entry.1.min(rec.arrival_ms);
                if rec.status == Status::Completed {
                    entry.2 = entry.2.max(rec.done_ms);
                }
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
                let first = rec.first_token_ms - rec.arrival_ms;
                ttft.push(first);
                e2e.push(rec.done_ms - rec.arrival_ms);
                queue.push(rec.scheduled_ms - rec.decided_ms);
                prefill.push(rec.first_token_ms - rec.scheduled_ms);
                output_tokens += u64::from(rec.job.output_tokens);
                let per_token = if rec.job.output_tokens > 1 {
                    let t =
                        (rec.done_ms - rec.first_token_ms) / f64::from(rec.job.output_tokens - 1);
                    tpot.push(t);
                    t
                } else {
                    0.0
                };
                if first <= ttft_objective && per_token <= tpot_objective {
                    good += 1;
                }
            }
            if let Some(step) = rec.step {
                let holders = prefillers.entry((step, rec.group)).or_default();
                if !rec.full_hit && !holders.contains(&replica) {
                    holders.push(replica);
                }
            }
        }

        debug_assert_eq!(
            computed + cached,
            prompt_tokens,
            "prompt tokens served = prefilled + found cached"
        );
        let completed = ttft.len() as u64;
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
            rejected_by_router: counts[1],
            rejected_by_replica: counts[2],
            unrouted: counts[3],
            prompt_tokens,
            prefill_tokens_computed: computed,
            prefill_tokens_cached: cached,
            prefill_tokens_ideal: run.ideal_blocks * bs + tails,
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
            throughput: Throughput {
                requests_per_s: per_second(completed as f64, run.end_ms),
                output_tokens_per_s: per_second(output_tokens as f64, run.end_ms),
            },
            goodput: Goodput {
                ttft_objective_ms: ttft_objective,
                tpot_objective_ms: tpot_objective,
                requests: good,
                requests_per_s: per_second(good as f64, run.end_ms),
                share: if completed == 0 {
                    0.0
                } else {
                    good as f64 / completed as f64
                },
            },
            queue_wait_ms: Summary::of(&mut queue),
            prefill_ms: Summary::of(&mut prefill),
            tpot_ms: Summary::of(&mut tpot),
            preemptions: run.replicas.iter().map(|r| r.stats().preemptions).sum(),
            evictions: run.replicas.iter().map(|r| r.stats().evictions).sum(),
            recomputed_tokens: run
                .replicas
                .iter()
                .map(|r| r.stats().recomputed_tokens)
                .sum(),
            utilisation: utilisation(run),
            rl_step_total_ms: (!steps.is_empty())
                .then(|| steps.values().map(|&(_, start, done)| done - start).sum()),
            rl_steps: steps
                .into_iter()
                .map(|(step, (requests, start_ms, done_ms))| RlStep {
                    step,
                    requests,
                    start_ms,
                    done_ms,
                    duration_ms: done_ms - start_ms,
                })
                .collect(),
            prefix_predictions: run
                .predictions
                .iter()
                .map(|(producer, checked, sums)| PrefixPrediction {
                    producer: producer.clone(),
                    checked_requests: *checked,
                    predicted_tokens: sums.predicted,
                    cached_tokens: sums.cached,
                    correct_tokens: sums.correct,
                    precision: sums.precision(),
                    recall: sums.recall(),
                })
                .collect(),
        }
    }
}

/// `count` per second over `ms` (0 for an empty run).
fn per_second(count: f64, ms: f64) -> f64 {
    if ms > 0.0 {
        count * 1000.0 / ms
    } else {
        0.0
    }
}

fn utilisation(run: &RunOutcome) -> Utilisation {
    let average = |f: fn(&ReplicaStats) -> f64| {
        run.replicas
            .iter()
            .map(|r| {
                if run.end_ms > 0.0 {
                    f(r.stats()) / run.end_ms
                } else {
                    0.0
                }
            })
            .collect()
    };
    Utilisation {
        busy: average(|s| s.busy_ms),
        kv_usage: average(|s| s.kv_usage_ms),
        batch: average(|s| s.batch_seq_ms),
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

/// Writes `report.json` (`{"run": ..., "pipelines": [...]}`: the [`RunContext`] and one
/// object per pipeline, keys as documented on [`PipelineReport`]) and `report.html` (the run,
/// summary tables and charts; inline SVG, no scripts or external assets) into `dir`, creating
/// it if needed.
pub fn write_reports(
    dir: &Path,
    run: &RunContext,
    reports: &[PipelineReport],
) -> std::io::Result<()> {
    #[derive(Serialize)]
    struct Report<'a> {
        run: &'a RunContext,
        pipelines: &'a [PipelineReport],
    }
    std::fs::create_dir_all(dir)?;
    let json = serde_json::to_string_pretty(&Report {
        run,
        pipelines: reports,
    })
    .map_err(std::io::Error::other)?;
    std::fs::write(dir.join("report.json"), json + "\n")?;
    std::fs::write(dir.join("report.html"), html::page(run, reports))?;
    Ok(())
}

/// One row per pipeline with the serving figures — throughput, goodput, where time went,
/// KV pressure, utilisation, RL step times — columns aligned, for a terminal.
pub fn render_serving_table(reports: &[PipelineReport]) -> String {
    const HEADER: [&str; 10] = [
        "pipeline",
        "out tok/s",
        "goodput",
        "queue p50/p99 ms",
        "prefill p50 ms",
        "TPOT p50 ms",
        "preempt",
        "evict",
        "busy",
        "RL step mean/max s",
    ];
    let rows: Vec<Vec<String>> = reports
        .iter()
        .map(|r| {
            let busy = &r.utilisation.busy;
            let mean_busy = if busy.is_empty() {
                0.0
            } else {
                busy.iter().sum::<f64>() / busy.len() as f64
            };
            let steps = if r.rl_steps.is_empty() {
                "-".to_string()
            } else {
                let total = r.rl_step_total_ms.unwrap_or(0.0);
                let max = r.rl_steps.iter().map(|s| s.duration_ms).fold(0.0, f64::max);
                format!(
                    "{:.1}/{:.1}",
                    total / r.rl_steps.len() as f64 / 1000.0,
                    max / 1000.0
                )
            };
            vec![
                r.name.clone(),
                format!("{:.0}", r.throughput.output_tokens_per_s),
                format!("{:.1}%", r.goodput.share * 100.0),
                format!("{:.1}/{:.1}", r.queue_wait_ms.p50, r.queue_wait_ms.p99),
                format!("{:.1}", r.prefill_ms.p50),
                format!("{:.1}", r.tpot_ms.p50),
                r.preemptions.to_string(),
                r.evictions.to_string(),
                format!("{:.0}%", mean_busy * 100.0),
                steps,
            ]
        })
        .collect();
    aligned(&HEADER, &rows)
}

/// `header` and `rows` with the first column left-aligned and the others right-aligned.
fn aligned<R: AsRef<[String]>>(header: &[&str], rows: &[R]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row.as_ref()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i == 0 {
                let _ = write!(text, "{cell}{}", " ".repeat(pad));
            } else {
                let _ = write!(text, "  {}{cell}", " ".repeat(pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.as_ref().iter().map(String::as_str));
    }
    out
}

/// One row per pipeline with the key figures, columns aligned, for a terminal.
pub fn render_table(reports: &[PipelineReport]) -> String {
    const HEADER: [&str; 14] = [
        "pipeline",
        "done",
        "rejected router/replica",
        "unrouted",
        "hit rate",
        "prefill tok",
        "ideal tok",
        "TTFT p50 ms",
        "TTFT p90 ms",
        "TTFT p99 ms",
        "E2E p99 ms",
        "peak load max/mean",
        "requests/replica min-max",
        "prefills/prompt",
    ];
    let rows: Vec<[String; 14]> = reports
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                format!("{}/{}", r.completed, r.requests),
                format!("{}/{}", r.rejected_by_router, r.rejected_by_replica),
                r.unrouted.to_string(),
                format!("{:.1}%", r.cache_hit_rate * 100.0),
                r.prefill_tokens_computed.to_string(),
                r.prefill_tokens_ideal.to_string(),
                format!("{:.1}", r.ttft_ms.p50),
                format!("{:.1}", r.ttft_ms.p90),
                format!("{:.1}", r.ttft_ms.p99),
                format!("{:.1}", r.e2e_ms.p99),
                format!("{}/{:.1}", r.replica_load.max, r.replica_load.mean),
                served_range(&r.replica_load.served_per_replica),
                r.prefills_per_prompt_per_step
                    .map_or_else(|| "-".to_string(), |v| format!("{v:.2}")),
            ]
        })
        .collect();
    aligned(&HEADER, &rows)
}

/// One row per pipeline and prefix producer with how its predictions held (see
/// [`PrefixPrediction`]), columns aligned, for a terminal; empty when no pipeline predicts.
pub fn render_predictions_table(reports: &[PipelineReport]) -> String {
    const HEADER: [&str; 8] = [
        "pipeline",
        "producer",
        "checked",
        "predicted tok",
        "cached tok",
        "correct tok",
        "precision",
        "recall",
    ];
    let share =
        |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{:.1}%", v * 100.0));
    let rows: Vec<[String; 8]> = reports
        .iter()
        .flat_map(|r| {
            r.prefix_predictions.iter().map(|p| {
                [
                    r.name.clone(),
                    p.producer.clone(),
                    p.checked_requests.to_string(),
                    p.predicted_tokens.to_string(),
                    p.cached_tokens.to_string(),
                    p.correct_tokens.to_string(),
                    share(p.precision),
                    share(p.recall),
                ]
            })
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    aligned(&HEADER, &rows)
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
