//! Hands the engines' KV-cache events to the plugins of the running pipeline that ask for
//! them (the `kv_events` capability of plugin API 1.3), and resets the prefix state of
//! endpoints on an operator's request.
//!
//! Called on the subscriptions' own thread, never on a request's path: a plugin applies
//! events under its own lock, which its `produce` shares only for the time of a lookup.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};

use switchyard_plugin_api::kv::{KvEvent, KvEventBatch, Reset, ResetReason};
use switchyard_plugin_api::sdk::extensions;

use crate::fleet::kv_events::KvSink;
use crate::live::LiveScheduler;
use crate::pipeline::Pipeline;

/// A pipeline and the positions of its plugins that take events.
type Interest = (Arc<Pipeline>, Arc<[usize]>);

/// Feeds one live scheduler's plugins.
pub struct KvFeed {
    live: Weak<LiveScheduler>,
    /// The pipeline last fed and the positions of its plugins that take events.
    interested: Mutex<Option<Interest>>,
    /// Plugins whose refusal of a batch was logged already.
    refused: Mutex<HashSet<String>>,
    pub batches: AtomicU64,
    pub refusals: AtomicU64,
}

impl KvFeed {
    pub fn new(live: &Arc<LiveScheduler>) -> KvFeed {
        KvFeed {
            live: Arc::downgrade(live),
            interested: Mutex::new(None),
            refused: Mutex::new(HashSet::new()),
            batches: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
        }
    }

    /// The plugins of `pipeline` that take KV events, asked once per pipeline. When the
    /// pipeline is a new one (a reload), an instance of a lineage it did not have before (not
    /// kept, and not carrying its predecessor's state) starts without the events that went
    /// before: it is told its index is incomplete for every endpoint.
    fn interested(&self, live: &LiveScheduler, pipeline: &Arc<Pipeline>) -> Arc<[usize]> {
        let mut cached = self.interested.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((known, positions)) = cached.as_ref() {
            if Arc::ptr_eq(known, pipeline) {
                return positions.clone();
            }
        }
        let positions: Arc<[usize]> = pipeline.kv_event_plugins().into();
        if let Some((previous, before)) = cached.as_ref() {
            let fresh: Vec<usize> = positions
                .iter()
                .copied()
                .filter(|&p| {
                    // Kept, or took its predecessor's state over: the same lineage.
                    let lineage = pipeline.plugins[p].lineage;
                    !before
                        .iter()
                        .any(|&q| previous.plugins[q].lineage == lineage)
                })
                .collect();
            if !fresh.is_empty() {
                tell_fresh(live, pipeline, &fresh);
            }
        }
        *cached = Some((pipeline.clone(), positions.clone()));
        positions
    }
}

impl KvSink for KvFeed {
    fn deliver(&self, endpoint_id: &str, events: Vec<KvEvent>) {
        let Some(live) = self.live.upgrade() else {
            return;
        };
        let (pipeline, host_index) = live.kv_target(endpoint_id);
        let positions = self.interested(&live, &pipeline);
        if positions.is_empty() {
            return;
        }
        let batch = KvEventBatch {
            host_index,
            endpoint: endpoint_id.to_string(),
            now_ms: live.clock().now_ms() as u64,
            events,
        };
        let Ok(json) = serde_json::to_string(&batch) else {
            return;
        };
        self.batches.fetch_add(1, Relaxed);
        for &position in positions.iter() {
            let plugin = &pipeline.plugins[position];
            if let Err(error) = plugin.object.extension(extensions::KV_EVENTS, &json) {
                self.refusals.fetch_add(1, Relaxed);
                let label = plugin.label();
                let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
                if refused.insert(label.clone()) {
                    tracing::warn!(
                        plugin = %label,
                        "a KV event batch was refused: {}; later refusals are only counted",
                        error.message
                    );
                }
            }
        }
    }
}

/// Tells the plugins at `positions` of `pipeline`, new in it, that their index of every
/// endpoint misses what was published before they existed.
fn tell_fresh(live: &LiveScheduler, pipeline: &Pipeline, positions: &[usize]) {
    for id in live.endpoint_ids() {
        let (_, host_index) = live.kv_target(&id);
        let batch = KvEventBatch {
            host_index,
            endpoint: id,
            now_ms: live.clock().now_ms() as u64,
            events: vec![KvEvent::Reset(Reset {
                reason: ResetReason::NewInstance,
                known: false,
            })],
        };
        let Ok(json) = serde_json::to_string(&batch) else {
            continue;
        };
        for &position in positions {
            let _ = pipeline.plugins[position]
                .object
                .extension(extensions::KV_EVENTS, &json);
        }
    }
}

/// Empties the prefix state of `endpoints` (every endpoint of the fleet when `None`) in every
/// plugin of the running pipeline that keeps one; returns the endpoints reset and the plugins
/// that took the reset.
pub fn reset_prefix_state(
    live: &LiveScheduler,
    endpoints: Option<&[String]>,
) -> (Vec<String>, Vec<String>) {
    let ids = match endpoints {
        Some(ids) => ids.to_vec(),
        None => live.endpoint_ids(),
    };
    let mut plugins = Vec::new();
    for id in &ids {
        let (pipeline, host_index) = live.kv_target(id);
        let batch = KvEventBatch {
            host_index,
            endpoint: id.clone(),
            now_ms: live.clock().now_ms() as u64,
            events: vec![KvEvent::Reset(Reset {
                reason: ResetReason::Admin,
                known: true,
            })],
        };
        let Ok(json) = serde_json::to_string(&batch) else {
            continue;
        };
        for position in pipeline.kv_event_plugins() {
            let plugin = &pipeline.plugins[position];
            if plugin
                .object
                .extension(extensions::KV_EVENTS, &json)
                .is_ok()
            {
                let label = plugin.label();
                if !plugins.contains(&label) {
                    plugins.push(label);
                }
            }
        }
    }
    (ids, plugins)
}
