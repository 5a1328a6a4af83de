//! `switchyard simulate`: the configured pipeline, through the real plugin libraries on the
//! virtual clock, against baselines on the same workload and the same modelled fleet. A
//! pipeline whose plugins take KV-cache events is fed the simulated replicas' own, as the live
//! host feeds it the engines'.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use switchyard_plugin_api::kv::{KvEvent, KvEventBatch};
use switchyard_plugin_api::sdk::extensions;
use switchyard_plugin_api::{EndpointMetrics, Outcome};

use crate::config::{ConfigError, LoadedConfig};
use crate::pipeline::{build, load_registry, Endpoint, Fleet, Options, Prompt, Request, Scheduler};
use crate::sim::{self, ReplicaState, SimFleet, SimRequest, SimRouter};

/// The reference's default pipeline (approximate prefix cache + load), run as a baseline.
pub const APPROX_BASELINE: &str = include_str!("../../configs/approx-prefix-load.toml");
const APPROX_BASELINE_FILE: &str = "approx-prefix-load.toml";

/// A wired pipeline driven by the simulator.
pub struct PipelineRouter {
    name: String,
    scheduler: Scheduler,
    decided: Vec<sim::Decision>,
    block_size: u32,
    /// KV blocks of each replica.
    blocks: Vec<u64>,
    /// Positions of the plugins that take KV-cache events.
    kv_plugins: Vec<usize>,
    /// Each replica's endpoint id and host index, as its events name them.
    endpoints: Vec<(String, u32)>,
    /// Plugins whose refusal of a batch was reported already.
    refused: HashSet<usize>,
}

impl PipelineRouter {
    pub fn new(name: String, mut scheduler: Scheduler, fleet: &SimFleet) -> Self {
        let kv_plugins = scheduler.pipeline().kv_event_plugins();
        let endpoints = if kv_plugins.is_empty() {
            Vec::new()
        } else {
            (0..fleet.replicas())
                .map(|i| {
                    let id = replica_id(i);
                    let host_index = scheduler.host_index_for(&id);
                    (id, host_index)
                })
                .collect()
        };
        PipelineRouter {
            name,
            scheduler,
            decided: Vec::new(),
            block_size: fleet.block_size_tokens as u32,
            blocks: fleet.blocks_per_replica(),
            kv_plugins,
            endpoints,
            refused: HashSet::new(),
        }
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    fn sync(&mut self, replicas: &[ReplicaState]) {
        let block = self.block_size;
        self.scheduler
            .update_metrics(replicas.iter().zip(&self.blocks).map(|(r, &blocks)| {
                EndpointMetrics {
                    running_requests: r.running,
                    waiting_requests: r.waiting,
                    kv_cache_usage: r.kv_usage,
                    cache_block_size: block,
                    cache_num_blocks: blocks,
                }
            }));
    }

    fn collect(&mut self, decisions: Vec<crate::pipeline::Decision>) {
        for decision in decisions {
            let Ok(request) = decision.request_id.parse::<u64>() else {
                continue;
            };
            self.decided.push(sim::Decision {
                request,
                replica: decision
                    .result
                    .as_ref()
                    .ok()
                    .and_then(|c| c.first().copied()),
                note: decision.result.err().map(|e| e.to_string()),
                predicted: decision.predicted,
            });
        }
    }
}

impl SimRouter for PipelineRouter {
    fn name(&self) -> &str {
        &self.name
    }

    fn submit(&mut self, now_ms: f64, req: &SimRequest, fleet: &[ReplicaState]) {
        self.sync(fleet);
        // A window due now seals before a request arriving at the same instant, as in replay.
        if self.scheduler.next_deadline().is_some_and(|d| d <= now_ms) {
            let sealed = self.scheduler.advance(now_ms);
            self.collect(sealed);
        }
        let request = Request {
            id: req.id.to_string(),
            model: req.model.clone(),
            cache_salt: req.cache_salt.clone(),
            prompt: Prompt::Shared {
                buf: Arc::clone(req.tokens.buffer()),
                len: req.tokens.len(),
            },
            max_output_tokens: Some(req.output_tokens as u64),
        };
        let decisions = self.scheduler.submit(request, now_ms);
        self.collect(decisions);
    }

    fn next_wakeup(&self) -> Option<f64> {
        self.scheduler.next_deadline()
    }

    fn poll(&mut self, now_ms: f64, fleet: &[ReplicaState], out: &mut Vec<sim::Decision>) {
        if self.scheduler.next_deadline().is_some_and(|d| d <= now_ms) {
            self.sync(fleet);
            let decisions = self.scheduler.advance(now_ms);
            self.collect(decisions);
        }
        out.append(&mut self.decided);
    }

    fn on_complete(&mut self, now_ms: f64, request: u64, _replica: usize) {
        self.scheduler
            .complete(&request.to_string(), Outcome::Finished, now_ms);
    }

    fn takes_kv_events(&self) -> bool {
        !self.kv_plugins.is_empty()
    }

    /// Hands the batch to every plugin that takes events, as the live host does: one JSON
    /// `KvEventBatch` per publishing replica and batch, stamped with the virtual time.
    fn kv_events(&mut self, now_ms: f64, replica: usize, events: Vec<KvEvent>) {
        let Some((id, host_index)) = self.endpoints.get(replica) else {
            return;
        };
        let batch = KvEventBatch {
            host_index: *host_index,
            endpoint: id.clone(),
            now_ms: now_ms as u64,
            events,
        };
        let Ok(json) = serde_json::to_string(&batch) else {
            return;
        };
        let pipeline = self.scheduler.pipeline();
        for &position in &self.kv_plugins {
            let plugin = &pipeline.plugins[position];
            if let Err(error) = plugin.object.extension(extensions::KV_EVENTS, &json) {
                if self.refused.insert(position) {
                    tracing::warn!(
                        pipeline = %self.name,
                        plugin = %plugin.label(),
                        "a KV event batch was refused: {}; later refusals are not reported",
                        error.message
                    );
                }
            }
        }
    }
}

/// The endpoint id of replica `i`.
fn replica_id(i: usize) -> String {
    format!("/replica-{i}")
}

/// The simulated replicas as endpoints.
pub fn sim_fleet(fleet: &SimFleet) -> Fleet {
    Fleet::new(
        fleet
            .blocks_per_replica()
            .into_iter()
            .enumerate()
            .map(|(i, blocks)| Endpoint {
                id: replica_id(i),
                address: format!("replica-{i}:8000"),
                role: String::new(),
                metrics: EndpointMetrics {
                    cache_block_size: fleet.block_size_tokens as u32,
                    cache_num_blocks: blocks,
                    ..EndpointMetrics::default()
                },
            })
            .collect(),
    )
}

/// Wires the pipeline of `config` as a simulated router.
pub fn pipeline_router(
    name: &str,
    config: &LoadedConfig,
    options: &Options,
    fleet: &SimFleet,
    seed: u64,
) -> Result<PipelineRouter, ConfigError> {
    let mut routers = pipeline_routers(name, config, options, fleet, seed, 1)?;
    Ok(routers.remove(0))
}

/// Wires the pipeline of `config` as `count` simulated routers, each with plugin instances of
/// its own and its scheduler seeded one after the previous one's; the libraries are loaded
/// (and their digests checked) once for all of them.
pub fn pipeline_routers(
    name: &str,
    config: &LoadedConfig,
    options: &Options,
    fleet: &SimFleet,
    seed: u64,
    count: usize,
) -> Result<Vec<PipelineRouter>, ConfigError> {
    let registry = load_registry(config, options)?;
    (0..count as u64)
        .map(|k| {
            let pipeline = build(config, &registry, options)?;
            let scheduler =
                Scheduler::new(Arc::new(pipeline), sim_fleet(fleet), seed.wrapping_add(k));
            Ok(PipelineRouter::new(name.to_string(), scheduler, fleet))
        })
        .collect()
}

/// The approx-prefix + load baseline, resolving its libraries like the main config's.
pub fn approx_baseline(main: &LoadedConfig) -> Result<LoadedConfig, ConfigError> {
    let sibling = main.base_dir().join(APPROX_BASELINE_FILE);
    LoadedConfig::parse(&sibling, APPROX_BASELINE.to_string())
}

/// A short name for a pipeline from its config file name.
pub fn pipeline_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "pipeline".into())
}
