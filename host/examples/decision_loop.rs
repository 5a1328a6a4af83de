//! Runs many decisions of the `decision` bench's single-request shape without criterion, for
//! instruction-count profiling (e.g. under callgrind):
//!
//! `decision_loop [config] [endpoints] [tokens] [iterations]`
//!
//! Defaults: `approx-prefix-load.toml`, 64 endpoints, 8192 tokens, 2000 iterations. The plugin
//! libraries are loaded from `target/release` (build them with `cargo build --release
//! --workspace` first).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use switchyard::config::LoadedConfig;
use switchyard::pipeline::{
    build, load_registry, Endpoint, Fleet, Options, Prompt, Request, Scheduler,
};
use switchyard_plugin_api::{EndpointMetrics, Outcome};

const PROMPT_POOL: usize = 8;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ sits in the workspace")
        .to_path_buf()
}

fn fleet(n: usize) -> Fleet {
    Fleet::new(
        (0..n)
            .map(|i| Endpoint {
                id: format!("bench/pod{i}"),
                address: format!("127.0.0.1:{}", 9000 + i),
                role: String::new(),
                metrics: EndpointMetrics {
                    running_requests: (i % 7) as u32,
                    waiting_requests: (i % 3) as u32,
                    kv_cache_usage: (i % 10) as f64 / 10.0,
                    ..EndpointMetrics::default()
                },
            })
            .collect(),
    )
}

fn prompt(k: usize, tokens: usize) -> Vec<u32> {
    (0..tokens as u32)
        .map(|t| t.wrapping_mul(2_654_435_761) ^ (k as u32).wrapping_mul(40_503))
        .collect()
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

    let root = workspace_root();
    let config =
        LoadedConfig::read(&root.join("configs").join(&file)).unwrap_or_else(|e| panic!("{e}"));
    let options = Options {
        allow_experimental_plugins: true,
        plugin_dirs: vec![root.join("target").join("release")],
    };
    let registry = load_registry(&config, &options).unwrap_or_else(|e| panic!("{e}"));
    let pipeline = build(&config, &registry, &options).unwrap_or_else(|e| panic!("{e}"));
    let mut scheduler = Scheduler::new(Arc::new(pipeline), fleet(endpoints), 7);
    let window = scheduler
        .pipeline()
        .plugins
        .iter()
        .filter_map(|p| p.declarations.batch())
        .map(|b| b.window_ms as f64)
        .fold(0.0, f64::max);
    let pool: Vec<Vec<u32>> = (0..PROMPT_POOL).map(|k| prompt(k, tokens)).collect();

    let mut now = 0.0f64;
    let mut placed = 0usize;
    for next in 1..=iterations {
        let request = Request {
            id: format!("r{next}"),
            model: "bench-model".to_string(),
            cache_salt: String::new(),
            prompt: Prompt::Tokens(vec![pool[next % PROMPT_POOL].clone()]),
            max_output_tokens: Some(256),
        };
        let id = request.id.clone();
        let mut decisions = scheduler.submit(request, now);
        now += window;
        decisions.extend(scheduler.advance(now));
        assert_eq!(decisions.len(), 1, "one decision per request");
        placed += decisions.iter().filter(|d| d.result.is_ok()).count();
        scheduler.complete(&id, Outcome::Finished, now);
        now += 1.0;
        std::hint::black_box(decisions);
    }
    println!("{placed} of {iterations} placed");
}
