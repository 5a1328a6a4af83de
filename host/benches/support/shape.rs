//! The inputs of the `decision` bench, shared with `examples/decision_loop.rs` so a profile
//! of the loop measures the same work: the allocator, the fleet, the prompt pool, the model,
//! reading a config, the longest batching window, and the hashing floor.

use std::path::{Path, PathBuf};

use switchyard::config::LoadedConfig;
use switchyard::pipeline::{Endpoint, Fleet, Options, Scheduler};
use switchyard_plugin_api::EndpointMetrics;

/// The allocator the `switchyard` binary runs with, so the host's allocations cost here what
/// they cost there (plugin libraries keep their own).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The model every request names.
pub const MODEL: &str = "bench-model";

/// Tokens per block of the floor: the block size the default pipeline's producers hash at.
pub const FLOOR_BLOCK_TOKENS: usize = 64;

/// The floor: `prompt`'s chained hashes in blocks of `block_tokens` (`FLOOR_BLOCK_TOKENS` for
/// the hashing no decision of the default pipeline can avoid), into `out`.
pub fn hash_floor_at(prompt: &[u32], block_tokens: usize, out: &mut Vec<u64>) {
    out.clear();
    let seed = switchyard_prefix_hashing::prompt_seed(MODEL, "");
    switchyard_prefix_hashing::hash_prompt_into(seed, prompt, block_tokens, usize::MAX, out);
}

/// Distinct prompts the requests rotate over.
pub const PROMPT_POOL: usize = 8;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ sits in the workspace")
        .to_path_buf()
}

/// `n` endpoints with varied load facts.
pub fn fleet(n: usize) -> Fleet {
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

/// Prompt `k` of the pool: distinct from its first token on.
pub fn prompt(k: usize, tokens: usize) -> Vec<u32> {
    (0..tokens as u32)
        .map(|t| t.wrapping_mul(2_654_435_761) ^ (k as u32).wrapping_mul(40_503))
        .collect()
}

/// `configs/<file>`, with options naming the libraries of `plugin_dir` and allowing alpha types.
pub fn load(file: &str, plugin_dir: &Path) -> (LoadedConfig, Options) {
    let path = workspace_root().join("configs").join(file);
    let config = LoadedConfig::read(&path).unwrap_or_else(|e| panic!("{e}"));
    let options = Options {
        allow_experimental_plugins: true,
        plugin_dirs: vec![plugin_dir.to_path_buf()],
    };
    (config, options)
}

/// The window of the config's batching producer, in ms (0 when nothing batches).
pub fn window_ms(scheduler: &Scheduler) -> f64 {
    scheduler
        .pipeline()
        .plugins
        .iter()
        .filter_map(|p| p.declarations.batch())
        .map(|b| b.window_ms as f64)
        .fold(0.0, f64::max)
}
