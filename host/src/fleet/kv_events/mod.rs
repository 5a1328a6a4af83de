//! KV-cache event subscriptions: one per endpoint whose engine publishes its cache's stores
//! and evictions (vLLM's `--kv-events-config`), over ZMQ.
//!
//! This module owns the sockets and the bookkeeping; what the events mean is left to the
//! plugins that ask for them. It follows the live fleet (a subscription per member with a
//! publisher address, started and stopped as members come and go), and hands every decoded
//! message to a [`KvSink`] on a thread of its own, off the decision path.
//!
//! Pieces: `decode` (frames and the msgpack payload in both event shapes, read by
//! `msgpack` value by value), `sequence` (which
//! message comes next), `replay` (the publisher's replay socket), `subscriber` (one
//! endpoint's connection loop).

mod decode;
mod msgpack;
mod replay;
mod sequence;
mod subscriber;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use switchyard_plugin_api::kv::KvEvent;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::FleetState;
use crate::config::{KvEventsConfig, LoadedConfig};

pub use decode::events as decode_payload;

/// Deliveries waiting for the sink before subscribers wait for it in turn (and their
/// publishers drop messages for them, which shows as gaps).
const QUEUE: usize = 4096;

/// Where decoded events go.
pub trait KvSink: Send + Sync + 'static {
    /// One endpoint's events, in the order they were published, possibly led by a reset.
    fn deliver(&self, endpoint_id: &str, events: Vec<KvEvent>);
}

/// One decoded message (or a recovery) for one endpoint.
#[derive(Debug)]
pub struct Delivery {
    pub endpoint_id: String,
    /// The message's sequence number, noted as applied once the sink has the events.
    pub seq: u64,
    pub events: Vec<KvEvent>,
    pub stats: Arc<EndpointStats>,
}

/// Where one endpoint's events come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub endpoint_id: String,
    pub address: String,
    pub replay: Option<String>,
    pub topic: String,
}

/// Timings shared by every subscription.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub reconnect: Duration,
    pub replay_idle: Duration,
    /// Reconnect after this long without a message (a publisher that went away is not
    /// always noticed otherwise); `None`: never.
    pub idle_reconnect: Option<Duration>,
}

/// Counters of one endpoint's subscription.
#[derive(Debug, Default)]
pub struct EndpointStats {
    pub connected: AtomicBool,
    pub connects: AtomicU64,
    pub connect_failures: AtomicU64,
    pub messages: AtomicU64,
    pub events: AtomicU64,
    pub duplicates: AtomicU64,
    pub gaps: AtomicU64,
    pub restarts: AtomicU64,
    pub replays: AtomicU64,
    pub replay_failures: AtomicU64,
    /// Recoveries that left the index incomplete (a reset with `known = false`).
    pub lost: AtomicU64,
    pub malformed: AtomicU64,
    pub last_seq: AtomicU64,
    /// The last message whose events the plugins have (or that had none).
    pub applied_seq: AtomicU64,
}

/// [`EndpointStats`] read at one moment, as the admin API shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StatsSnapshot {
    pub endpoint: String,
    pub address: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay: Option<String>,
    pub connected: bool,
    pub connects: u64,
    pub connect_failures: u64,
    pub messages: u64,
    pub events: u64,
    pub duplicates: u64,
    pub gaps: u64,
    pub restarts: u64,
    pub replays: u64,
    pub replay_failures: u64,
    pub lost: u64,
    pub malformed: u64,
    pub last_seq: u64,
    pub applied_seq: u64,
}

/// The publisher address of an endpoint at `address` (`host:port`) from a pattern such as
/// `tcp://{host}:5557` (`{port}` is the endpoint's port).
pub fn expand(pattern: &str, address: &str) -> String {
    let (host, port) = address.rsplit_once(':').unwrap_or((address, ""));
    pattern.replace("{host}", host).replace("{port}", port)
}

/// A discovered endpoint's label naming its KV-event publisher (as `kv_events_endpoint`
/// does in `[[endpoints]]`).
pub const PUBLISHER_LABEL: &str = "switchyard/kv-events-endpoint";
/// A discovered endpoint's label naming its replay socket.
pub const REPLAY_LABEL: &str = "switchyard/kv-replay-endpoint";

/// The subscriptions `config` asks for in `fleet`: an endpoint's own addresses (its
/// `[[endpoints]]` entry, or its labels in a discovery file) before the patterns.
fn wanted(config: &KvEventsConfig, overrides: &Overrides, fleet: &FleetState) -> Vec<Subscription> {
    let pattern = |p: &String| (!p.is_empty()).then(|| p.clone());
    let mut out = Vec::new();
    for member in fleet.members.iter() {
        let endpoint = &member.endpoint;
        let own = overrides.get(&endpoint.id);
        let label = |name: &str| member.labels.get(name).filter(|v| !v.is_empty()).cloned();
        let address = own
            .and_then(|o| o.0.clone())
            .or_else(|| label(PUBLISHER_LABEL))
            .or_else(|| pattern(&config.endpoint));
        let Some(address) = address else {
            continue;
        };
        let replay = own
            .and_then(|o| o.1.clone())
            .or_else(|| label(REPLAY_LABEL))
            .or_else(|| pattern(&config.replay_endpoint))
            .filter(|r| !r.is_empty());
        out.push(Subscription {
            endpoint_id: endpoint.id.clone(),
            address: expand(&address, &endpoint.address),
            replay: replay.map(|r| expand(&r, &endpoint.address)),
            topic: config.topic.clone(),
        });
    }
    out
}

/// Every running subscription and its counters, by endpoint id.
type Shared = Arc<Mutex<BTreeMap<String, (Subscription, Arc<EndpointStats>)>>>;

/// Per endpoint id, its own publisher and replay addresses from `[[endpoints]]`.
type Overrides = HashMap<String, (Option<String>, Option<String>)>;

/// The running subscriptions.
pub struct KvEvents {
    stats: Shared,
    task: JoinHandle<()>,
}

impl KvEvents {
    /// Starts following `fleet` on the current runtime, when `config` names a publisher for
    /// any endpoint; `None` when it names none.
    pub fn start(
        config: &LoadedConfig,
        fleet: watch::Receiver<Arc<FleetState>>,
        sink: Arc<dyn KvSink>,
    ) -> Option<KvEvents> {
        let settings = &config.config.kv_events;
        let overrides: Overrides = config
            .config
            .endpoints
            .iter()
            .filter(|e| e.kv_events_endpoint.is_some() || e.kv_replay_endpoint.is_some())
            .map(|e| {
                (
                    e.id(),
                    (e.kv_events_endpoint.clone(), e.kv_replay_endpoint.clone()),
                )
            })
            .collect();
        let labelled = config.config.fleet.discovery_file.is_some();
        if settings.endpoint.is_empty() && overrides.is_empty() && !labelled {
            return None;
        }
        let (sender, receiver) = mpsc::channel(QUEUE);
        std::thread::Builder::new()
            .name("kv-events".into())
            .spawn(move || feed(receiver, sink))
            .ok()?;
        let stats = Arc::new(Mutex::new(BTreeMap::new()));
        let timing = Settings {
            reconnect: Duration::from_millis(settings.reconnect_ms.max(1)),
            replay_idle: Duration::from_millis(settings.replay_timeout_ms.max(1)),
            idle_reconnect: (settings.idle_reconnect_ms > 0)
                .then(|| Duration::from_millis(settings.idle_reconnect_ms)),
        };
        let task = tokio::spawn(follow(
            settings.clone(),
            overrides,
            timing,
            fleet,
            sender,
            stats.clone(),
        ));
        Some(KvEvents { stats, task })
    }

    /// Every subscription's counters, by endpoint id.
    pub fn stats(&self) -> Vec<StatsSnapshot> {
        let stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        stats
            .values()
            .map(|(subscription, s)| StatsSnapshot {
                endpoint: subscription.endpoint_id.clone(),
                address: subscription.address.clone(),
                replay: subscription.replay.clone(),
                connected: s.connected.load(Relaxed),
                connects: s.connects.load(Relaxed),
                connect_failures: s.connect_failures.load(Relaxed),
                messages: s.messages.load(Relaxed),
                events: s.events.load(Relaxed),
                duplicates: s.duplicates.load(Relaxed),
                gaps: s.gaps.load(Relaxed),
                restarts: s.restarts.load(Relaxed),
                replays: s.replays.load(Relaxed),
                replay_failures: s.replay_failures.load(Relaxed),
                lost: s.lost.load(Relaxed),
                malformed: s.malformed.load(Relaxed),
                last_seq: s.last_seq.load(Relaxed),
                applied_seq: s.applied_seq.load(Relaxed),
            })
            .collect()
    }
}

impl Drop for KvEvents {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Hands deliveries to the sink until every subscription is gone.
fn feed(mut receiver: mpsc::Receiver<Delivery>, sink: Arc<dyn KvSink>) {
    while let Some(delivery) = receiver.blocking_recv() {
        let (seq, stats) = (delivery.seq, delivery.stats);
        if !delivery.events.is_empty() {
            sink.deliver(&delivery.endpoint_id, delivery.events);
        }
        stats.applied_seq.store(seq, Relaxed);
    }
}

/// Keeps one subscription task per fleet member with a publisher.
async fn follow(
    config: KvEventsConfig,
    overrides: Overrides,
    settings: Settings,
    mut fleet: watch::Receiver<Arc<FleetState>>,
    sender: mpsc::Sender<Delivery>,
    stats: Shared,
) {
    let mut running: HashMap<String, (Subscription, JoinHandle<()>)> = HashMap::new();
    let stop = Stop(&mut running);
    loop {
        let state = fleet.borrow_and_update().clone();
        let wanted = wanted(&config, &overrides, &state);
        let running = &mut *stop.0;
        running.retain(|id, (subscription, task)| {
            let keep = wanted.iter().any(|w| w == subscription);
            if !keep {
                task.abort();
                stats.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
            }
            keep
        });
        for subscription in wanted {
            if running.contains_key(&subscription.endpoint_id) {
                continue;
            }
            let counters = Arc::new(EndpointStats::default());
            stats.lock().unwrap_or_else(|e| e.into_inner()).insert(
                subscription.endpoint_id.clone(),
                (subscription.clone(), counters.clone()),
            );
            let task = tokio::spawn(subscriber::run(
                subscription.clone(),
                settings,
                sender.clone(),
                counters,
            ));
            running.insert(subscription.endpoint_id.clone(), (subscription, task));
        }
        if fleet.changed().await.is_err() {
            return;
        }
    }
}

/// Aborts the subscription tasks when the follower stops (or is aborted).
struct Stop<'a>(&'a mut HashMap<String, (Subscription, JoinHandle<()>)>);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        for (_, (_, task)) in self.0.drain() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{Engine, Member};
    use crate::pipeline::Endpoint;

    fn member(name: &str, address: &str, labels: &[(&str, &str)]) -> Member {
        Member {
            endpoint: Endpoint {
                id: format!("/{name}"),
                address: address.into(),
                role: String::new(),
                metrics: Default::default(),
            },
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            engine: Engine::Vllm,
            fresh: true,
            metrics_age_ms: None,
            scrape_failures: 0,
        }
    }

    #[test]
    fn an_endpoints_own_address_wins_over_its_label_and_the_pattern() {
        let config = KvEventsConfig {
            endpoint: "tcp://{host}:5557".into(),
            replay_endpoint: "tcp://{host}:5558".into(),
            ..KvEventsConfig::default()
        };
        let fleet = FleetState {
            generation: 1,
            members: vec![
                member("a", "10.0.0.1:8000", &[]),
                member(
                    "b",
                    "10.0.0.2:8000",
                    &[(PUBLISHER_LABEL, "tcp://10.0.0.2:6000")],
                ),
                member(
                    "c",
                    "10.0.0.3:8000",
                    &[(PUBLISHER_LABEL, "tcp://ignored:1")],
                ),
            ]
            .into(),
        };
        let overrides: Overrides = [(
            "/c".to_string(),
            (Some("tcp://10.0.0.3:7000".to_string()), None),
        )]
        .into();
        let addresses: Vec<(String, Option<String>)> = wanted(&config, &overrides, &fleet)
            .into_iter()
            .map(|s| (s.address, s.replay))
            .collect();
        let expected = [
            ("tcp://10.0.0.1:5557", Some("tcp://10.0.0.1:5558")),
            ("tcp://10.0.0.2:6000", Some("tcp://10.0.0.2:5558")),
            ("tcp://10.0.0.3:7000", Some("tcp://10.0.0.3:5558")),
        ]
        .map(|(a, r)| (a.to_string(), r.map(str::to_string)));
        assert_eq!(addresses, expected);
        // Without a pattern, only endpoints naming a publisher are subscribed.
        let bare: Vec<String> = wanted(&KvEventsConfig::default(), &Overrides::new(), &fleet)
            .into_iter()
            .map(|s| s.address)
            .collect();
        assert_eq!(bare, ["tcp://10.0.0.2:6000", "tcp://ignored:1"]);
    }
}
