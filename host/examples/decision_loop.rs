//! Runs many decisions of the `decision` bench's single-request shape without criterion, for
//! instruction-count profiling (e.g. under callgrind):
//!
//! `decision_loop [config] [endpoints] [tokens] [iterations] [records]`
//!
//! Defaults: `approx-prefix-load.toml`, 64 endpoints, 8192 tokens, 2000 iterations, no
//! decision records (`records` builds one per decision, as `serve` does by default). Prints the
//! mean time per decision spent in the scheduler and in each plugin's timed calls, and its
//! ratio to hashing the same prompt alone, measured in the same iterations. A pipeline with a
//! plugin that takes KV-cache events (a precise prefix producer) is told, after each decision,
//! that the chosen endpoint's engine stored the prompt (once per prompt and endpoint), as a
//! live engine would: its index then holds what the fleet holds, as in steady state, and the
//! loop also prints the floor at an engine's 16-token blocks, the hashing such a producer
//! cannot avoid. The plugin
//! libraries are loaded from the directory of the profile the example was built with
//! (`target/release`, or `target/profiling` for callgrind and perf): build them with `cargo
//! build --release --workspace` (or `--profile profiling`) first.

use std::collections::HashSet;
use std::sync::Arc;

use switchyard::pipeline::{build, load_registry, Prompt, Request, Scheduler};
use switchyard_plugin_api::kv::{KvEvent, KvEventBatch, StoredBlocks};
use switchyard_plugin_api::sdk::extensions::KV_EVENTS;
use switchyard_plugin_api::Outcome;

#[path = "../benches/support/shape.rs"]
mod shape;
use shape::{
    fleet, hash_floor_at, load, prompt, window_ms, FLOOR_BLOCK_TOKENS, MODEL, PROMPT_POOL,
};

/// The block size of the engines whose stores the loop announces.
const ENGINE_BLOCK_TOKENS: usize = 16;

/// Tells every plugin of `scheduler` that takes KV-cache events that endpoint `id`'s engine
/// stored prompt `k` (`tokens`) as one chain of full blocks.
fn announce_store(
    scheduler: &mut Scheduler,
    plugins: &[usize],
    id: &str,
    k: usize,
    tokens: &[u32],
) {
    let blocks = tokens.len() / ENGINE_BLOCK_TOKENS;
    let batch = KvEventBatch {
        host_index: scheduler.host_index_for(id),
        endpoint: id.to_string(),
        now_ms: 0,
        events: vec![KvEvent::BlockStored(StoredBlocks {
            // The engine's own hashes: any distinct numbers per prompt and block.
            block_hashes: (0..blocks as u64).map(|b| ((k as u64) << 32) | b).collect(),
            token_ids: tokens[..blocks * ENGINE_BLOCK_TOKENS].to_vec(),
            block_size: ENGINE_BLOCK_TOKENS as u32,
            ..StoredBlocks::default()
        })],
    };
    let json = serde_json::to_string(&batch).expect("a batch serialises");
    for &position in plugins {
        scheduler.pipeline().plugins[position]
            .object
            .extension(KV_EVENTS, &json)
            .unwrap_or_else(|e| panic!("KV events refused: {}", e.message));
    }
}

/// `target/<profile>`: the directory above the `examples/` this program was built into.
fn profile_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the path of this program");
    exe.parent()
        .and_then(std::path::Path::parent)
        .expect("built into target/<profile>/examples")
        .to_path_buf()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let file = args
        .first()
        .cloned()
        .unwrap_or_else(|| "approx-prefix-load.toml".to_string());
    let endpoints: usize = args.get(1).map_or(64, |a| a.parse().expect("endpoints"));
    let tokens: usize = args.get(2).map_or(8192, |a| a.parse().expect("tokens"));
    let iterations: usize = args.get(3).map_or(2000, |a| a.parse().expect("iterations"));
    let records = match args.get(4).map(String::as_str) {
        None => false,
        Some("records") => true,
        Some(other) => panic!("the fifth argument is `records` or nothing, not `{other}`"),
    };

    let (config, options) = load(&file, &profile_dir());
    let registry = load_registry(&config, &options).unwrap_or_else(|e| panic!("{e}"));
    let pipeline = build(&config, &registry, &options).unwrap_or_else(|e| panic!("{e}"));
    let mut scheduler = Scheduler::new(Arc::new(pipeline), fleet(endpoints), 7);
    scheduler.set_explain(records);
    // As `serve`'s ring does once full: each record's trace goes back for a later decision.
    let traces = scheduler.trace_pool();
    let window = window_ms(&scheduler);
    let pool: Vec<Vec<u32>> = (0..PROMPT_POOL).map(|k| prompt(k, tokens)).collect();
    let kv_plugins = scheduler.pipeline().kv_event_plugins();
    let mut stored: HashSet<(usize, String)> = HashSet::new();

    let mut now = 0.0f64;
    let mut placed = 0usize;
    let mut in_scheduler = std::time::Duration::ZERO;
    // The floor, measured in the same iterations.
    let mut hashes = Vec::new();
    let mut hashing = std::time::Duration::ZERO;
    // The floor at an engine's block size, measured alike but apart from the decision.
    let mut engine_hashing = std::time::Duration::ZERO;
    for next in 1..=iterations {
        let request = Request {
            id: format!("r{next}"),
            model: MODEL.to_string(),
            cache_salt: String::new(),
            prompt: Prompt::Tokens(vec![pool[next % PROMPT_POOL].clone()]),
            max_output_tokens: Some(256),
        };
        let id = request.id.clone();
        let started = std::time::Instant::now();
        let mut decisions = scheduler.submit(request, now);
        now += window;
        decisions.extend(scheduler.advance(now));
        assert_eq!(decisions.len(), 1, "one decision per request");
        placed += decisions.iter().filter(|d| d.result.is_ok()).count();
        scheduler.complete(&id, Outcome::Finished, now);
        let chosen = decisions[0].endpoints.first().cloned();
        for trace in decisions.iter_mut().filter_map(|d| d.record.take()) {
            traces.give_back(trace);
        }
        let decided = std::time::Instant::now();
        in_scheduler += decided - started;
        // After the decision, so the floor, not the decision, finds the prompt in cache.
        hash_floor_at(&pool[next % PROMPT_POOL], FLOOR_BLOCK_TOKENS, &mut hashes);
        std::hint::black_box(&hashes);
        let floored = std::time::Instant::now();
        hashing += floored - decided;
        hash_floor_at(&pool[next % PROMPT_POOL], ENGINE_BLOCK_TOKENS, &mut hashes);
        std::hint::black_box(&hashes);
        engine_hashing += floored.elapsed();
        if let Some(endpoint) = chosen.filter(|_| !kv_plugins.is_empty()) {
            let k = next % PROMPT_POOL;
            if stored.insert((k, endpoint.clone())) {
                announce_store(&mut scheduler, &kv_plugins, &endpoint, k, &pool[k]);
            }
        }
        now += 1.0;
        std::hint::black_box(&decisions);
    }
    println!("{placed} of {iterations} placed");
    let per_decision = |nanos: f64| nanos / iterations.max(1) as f64;
    println!(
        "{:>9.0} ns per decision in the scheduler (submit, advance, complete)",
        per_decision(in_scheduler.as_nanos() as f64)
    );
    println!(
        "{:>9.0} ns per decision hashing the prompt alone (the floor); the decision is {:.2}x it",
        per_decision(hashing.as_nanos() as f64),
        in_scheduler.as_secs_f64() / hashing.as_secs_f64().max(f64::MIN_POSITIVE)
    );
    println!(
        "{:>9.0} ns per decision hashing it in {ENGINE_BLOCK_TOKENS}-token blocks (an engine's); the decision is {:.2}x it",
        per_decision(engine_hashing.as_nanos() as f64),
        in_scheduler.as_secs_f64() / engine_hashing.as_secs_f64().max(f64::MIN_POSITIVE)
    );
    if !kv_plugins.is_empty() {
        println!(
            "{} stores announced (prompt, endpoint) to {} plugin(s) taking KV events",
            stored.len(),
            kv_plugins.len()
        );
    }
    for (name, stats) in scheduler.stats() {
        if stats.timed_calls > 0 {
            println!(
                "{:>9.0} ns per decision in {name} ({} timed calls)",
                per_decision(stats.timed_nanos as f64),
                stats.timed_calls
            );
        }
    }
}
