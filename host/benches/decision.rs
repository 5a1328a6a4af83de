//! Cost of one scheduling decision, the batch window's wait excluded, with the plugin
//! libraries loaded from their release builds.
//!
//! One iteration submits a request at virtual time `t`, advances the clock to the end of the
//! window (no real waiting), and completes the request so in-flight state stays bounded.
//! Prompts rotate over a small pool so prefix state sees both repeats and other prompts.
//! A third group places a burst of 16 requests sharing one prompt per iteration, the case
//! the batch window exists for; its figure covers all 16 decisions. A fourth places 16
//! requests with distinct prompts of the same length in one window: each must be hashed.
//!
//! `decision/floor` is the hashing a decision cannot avoid, measured in the same run: the
//! chained block hashes of the same prompts, rotating over the same pool, in the 64-token
//! blocks the default pipeline's producers hash (the approximate producer raises its 16-token
//! default to its 64-token minimum).

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use switchyard::pipeline::{build, load_registry, Prompt, Request, Scheduler};
use switchyard_plugin_api::Outcome;

#[path = "support/shape.rs"]
mod shape;
use shape::{
    fleet, hash_floor_at, load, prompt, window_ms, workspace_root, FLOOR_BLOCK_TOKENS, MODEL,
    PROMPT_POOL,
};

const PLUGIN_PACKAGES: &[&str] = &[
    "burst-prefix-cache-producer",
    "prefix-cache-scorer",
    "prefix-cache-affinity-filter",
    "approx-prefix-cache-producer",
];
const PROMPT_TOKENS: &[usize] = &[8 * 1024, 32 * 1024];
const ENDPOINT_COUNTS: &[usize] = &[8, 64, 256];
/// Samples per prompt in the burst variant (an RL rollout step's `n`).
const BURST: usize = 16;

/// Builds the plugin libraries in release mode and returns the directory holding them.
fn release_plugin_dir() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut command = Command::new(cargo);
    command
        .current_dir(workspace_root())
        .args(["build", "--release", "--quiet"]);
    for package in PLUGIN_PACKAGES {
        command.args(["-p", package]);
    }
    let status = command.status().expect("cargo runs");
    assert!(status.success(), "building the plugin libraries failed");
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| {
            if p.is_absolute() {
                p
            } else {
                workspace_root().join(p)
            }
        })
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("release")
}

/// Benches one config. Each iteration places `burst` requests that arrive together (one
/// window), sharing one prompt or, with `distinct`, each with a prompt of its own (same
/// length); with `burst > 1` the figure covers the whole burst.
fn bench_config(
    c: &mut Criterion,
    plugin_dir: &Path,
    file: &str,
    label: &str,
    burst: usize,
    distinct: bool,
) {
    let (config, options) = load(file, plugin_dir);
    let registry = load_registry(&config, &options).unwrap_or_else(|e| panic!("{e}"));

    let mut group = c.benchmark_group(format!("decision/{label}"));
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    for &tokens in PROMPT_TOKENS {
        let pool: Vec<Vec<u32>> = (0..PROMPT_POOL.max(burst))
            .map(|k| prompt(k, tokens))
            .collect();
        for &endpoints in ENDPOINT_COUNTS {
            let pipeline = build(&config, &registry, &options).unwrap_or_else(|e| panic!("{e}"));
            let mut scheduler = Scheduler::new(Arc::new(pipeline), fleet(endpoints), 7);
            let window = window_ms(&scheduler);
            let mut next = 0usize;
            let mut now = 0.0f64;
            let id = BenchmarkId::new(format!("{}k_tokens", tokens / 1024), endpoints);
            group.bench_function(id, |b| {
                b.iter_batched(
                    || {
                        next += 1;
                        (0..burst)
                            .map(|sample| {
                                let tokens = if distinct {
                                    &pool[(next + sample) % pool.len()]
                                } else {
                                    &pool[next % PROMPT_POOL]
                                };
                                let request = Request {
                                    id: format!("r{next}-{sample}"),
                                    model: MODEL.to_string(),
                                    cache_salt: String::new(),
                                    prompt: Prompt::Tokens(vec![tokens.clone()]),
                                    max_output_tokens: Some(256),
                                };
                                let request_id = request.id.clone();
                                (request, request_id)
                            })
                            .collect::<Vec<_>>()
                    },
                    |requests| {
                        let mut decisions = Vec::with_capacity(requests.len());
                        let mut ids = Vec::with_capacity(requests.len());
                        for (request, request_id) in requests {
                            decisions.extend(scheduler.submit(request, now));
                            ids.push(request_id);
                        }
                        now += window;
                        decisions.extend(scheduler.advance(now));
                        assert_eq!(decisions.len(), burst, "one decision per request");
                        assert!(
                            decisions.iter().all(|d| d.result.is_ok()),
                            "every request is placed"
                        );
                        for request_id in &ids {
                            scheduler.complete(request_id, Outcome::Finished, now);
                        }
                        now += 1.0;
                        black_box(decisions)
                    },
                    BatchSize::SmallInput,
                )
            });
        }
    }
    group.finish();
}

/// Hashing alone, for the ratio of each decision to it.
fn bench_floor(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision/floor");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    for &tokens in PROMPT_TOKENS {
        let pool: Vec<Vec<u32>> = (0..PROMPT_POOL).map(|k| prompt(k, tokens)).collect();
        let mut out = Vec::with_capacity(tokens / FLOOR_BLOCK_TOKENS);
        let mut next = 0usize;
        group.bench_function(format!("{}k_tokens", tokens / 1024), |b| {
            b.iter(|| {
                next += 1;
                hash_floor_at(
                    black_box(&pool[next % PROMPT_POOL]),
                    FLOOR_BLOCK_TOKENS,
                    &mut out,
                );
                black_box(&out);
            })
        });
    }
    group.finish();
}

fn decision(c: &mut Criterion) {
    bench_floor(c);
    let plugin_dir = release_plugin_dir();
    bench_config(c, &plugin_dir, "default.toml", "default", 1, false);
    bench_config(
        c,
        &plugin_dir,
        "approx-prefix-load.toml",
        "approx_prefix_load",
        1,
        false,
    );
    bench_config(
        c,
        &plugin_dir,
        "default.toml",
        "default_burst16",
        BURST,
        false,
    );
    bench_config(
        c,
        &plugin_dir,
        "default.toml",
        "default_distinct16",
        BURST,
        true,
    );
}

criterion_group!(benches, decision);
criterion_main!(benches);
