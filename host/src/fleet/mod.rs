//! The live fleet shared by the real-time drivers (`serve`, `ext-proc`): which endpoints
//! exist (static `[[endpoints]]` or a watched discovery file) and their load facts, scraped
//! from each model server's `/metrics`. It hands out immutable snapshots; the scheduler's
//! owner applies a new snapshot before the next request it admits.
//!
//! Pieces: `discovery` (the endpoint list and the file watch), `scrape` (one fetch loop per
//! endpoint), `prometheus` (reading the few families in use off a page), `tracker` (the task
//! that combines them and publishes).
//!
//! # What scorers see
//!
//! * Scraping off (`scrape_interval_ms = 0`): every endpoint is fresh and carries the facts
//!   from its `[[endpoints]]` entry (zeros for discovered endpoints).
//! * Scraping on: an endpoint is fresh while its last successful scrape is at most
//!   `stale_after_ms` old (`0`: scraped facts never age; an endpoint never scraped is still
//!   stale). A fresh endpoint carries its scraped facts.
//! * A stale endpoint stays a candidate, but reads as saturated so load-aware scorers steer
//!   away from it without it vanishing from the fleet: `kv_cache_usage` 1.0 and
//!   `waiting_requests` the larger of its last known count and one more than the longest
//!   queue among fresh endpoints. Its other facts are the last known ones (zeros if it was
//!   never scraped).
//!
//! # When a new state is published
//!
//! On a membership change, and otherwise at most once per scrape period when a fact, label
//! or freshness changed. `metrics_age_ms` and `scrape_failures` are as of the snapshot and
//! do not by themselves cause one. Endpoints that stay (same id, address and engine) keep
//! their facts across membership changes.

mod discovery;
pub mod kv_events;
mod prometheus;
mod scrape;
mod tracker;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::config::LoadedConfig;
use crate::pipeline::{Endpoint, Fleet};

use discovery::Target;
pub use discovery::{ENGINE_LABEL, ROLE_LABEL};

/// Which metric names an endpoint's `/metrics` page uses (label `llm-d.ai/engine-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Vllm,
    Sglang,
}

/// One endpoint of the live fleet.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// Identity, address, role and the load facts scorers see (stale-adjusted).
    pub endpoint: Endpoint,
    pub labels: BTreeMap<String, String>,
    pub engine: Engine,
    /// Its metrics were scraped successfully within `stale_after_ms` (always true when
    /// scraping is off).
    pub fresh: bool,
    /// Milliseconds since its last successful scrape, if any, when the snapshot was taken.
    pub metrics_age_ms: Option<u64>,
    /// Scrapes that failed since the last success, when the snapshot was taken.
    pub scrape_failures: u64,
}

/// The fleet at one moment.
#[derive(Debug, Clone, Default)]
pub struct FleetState {
    /// Increases with every change (membership or metrics).
    pub generation: u64,
    pub members: Arc<[Member]>,
}

impl FleetState {
    /// The endpoints as the scheduler takes them.
    pub fn fleet(&self) -> Fleet {
        Fleet::new(self.members.iter().map(|m| m.endpoint.clone()).collect())
    }

    /// At least one endpoint has fresh metrics.
    pub fn ready(&self) -> bool {
        self.members.iter().any(|m| m.fresh)
    }
}

/// A running fleet: discovery watcher and scrapers on the tokio runtime. Dropping it (or
/// [`LiveFleet::shutdown`]) stops them; receivers then keep the last state.
pub struct LiveFleet {
    state: watch::Receiver<Arc<FleetState>>,
    task: JoinHandle<()>,
    replace: mpsc::UnboundedSender<(Vec<Target>, Option<discovery::FileWatch>)>,
}

/// Replaces a running fleet's endpoints with those of a reloaded config.
#[derive(Clone)]
pub struct Membership {
    replace: mpsc::UnboundedSender<(Vec<Target>, Option<discovery::FileWatch>)>,
}

impl Membership {
    /// Reads the endpoints `config` names: its `[[endpoints]]`, or its discovery file (an
    /// unreadable one is an error).
    pub fn read(&self, config: &LoadedConfig) -> Result<NewMembers, String> {
        let (parsed, watch) = membership(config)?;
        Ok(NewMembers {
            targets: parsed.targets,
            watch,
        })
    }

    /// Hands `members` to the fleet, which applies them as it applies a changed discovery
    /// file: endpoints that stay keep their scraped facts, and the new discovery file (if
    /// any) is watched from then on. The `[fleet]` scrape settings stay those the fleet
    /// started with.
    pub fn apply(&self, members: NewMembers) {
        // Fails only once the fleet has stopped, when there is nothing left to change.
        let _ = self.replace.send((members.targets, members.watch));
    }
}

/// Endpoints read from a reloaded config, not yet applied.
pub struct NewMembers {
    targets: Vec<Target>,
    watch: Option<discovery::FileWatch>,
}

/// The endpoints `config` names, and the watch of its discovery file when it has one.
fn membership(
    config: &LoadedConfig,
) -> Result<(discovery::Parsed, Option<discovery::FileWatch>), String> {
    match &config.config.fleet.discovery_file {
        Some(file) => {
            if !config.config.endpoints.is_empty() {
                return Err(format!(
                    "{}: [fleet] discovery_file and [[endpoints]] are both given; the fleet \
                     comes from one of them",
                    config.path.display()
                ));
            }
            let path = config.base_dir().join(file);
            let failed = |e: String| format!("discovery file {}: {e}", path.display());
            let content = discovery::read_file(&path).map_err(failed)?;
            let parsed = discovery::parse(&content).map_err(failed)?;
            for note in &parsed.notes {
                tracing::warn!("discovery file {}: {note}", path.display());
            }
            Ok((parsed, Some(discovery::FileWatch::new(path, content))))
        }
        None => {
            let parsed = discovery::from_config(&config.config.endpoints);
            for note in &parsed.notes {
                tracing::warn!("{}: {note}", config.path.display());
            }
            Ok((parsed, None))
        }
    }
}

impl LiveFleet {
    /// Reads the initial endpoint set (an unreadable discovery file is an error here) and
    /// starts watching and scraping on the current tokio runtime.
    pub async fn start(config: &LoadedConfig) -> Result<LiveFleet, String> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err("the live fleet must be started on a tokio runtime".into());
        }
        let fleet = &config.config.fleet;
        let (parsed, watch) = membership(config)?;
        let scraping = fleet.scrape_interval_ms > 0;
        if scraping && fleet.scrape_timeout_ms == 0 {
            return Err(format!(
                "{}: [fleet] scrape_timeout_ms must be above 0 while scraping is on",
                config.path.display()
            ));
        }
        if scraping && fleet.stale_after_ms > 0 && fleet.stale_after_ms < fleet.scrape_interval_ms {
            tracing::warn!(
                "[fleet] stale_after_ms ({}) is below scrape_interval_ms ({}): endpoints will \
                 read as stale between scrapes",
                fleet.stale_after_ms,
                fleet.scrape_interval_ms
            );
        }
        let settings = tracker::Settings {
            scrape_interval: scraping.then(|| Duration::from_millis(fleet.scrape_interval_ms)),
            scrape_timeout: Duration::from_millis(fleet.scrape_timeout_ms),
            stale_after: (fleet.stale_after_ms > 0)
                .then(|| Duration::from_millis(fleet.stale_after_ms)),
        };
        let (tracker, state) = tracker::Tracker::new(settings, parsed.targets);
        let (replace, replaced) = mpsc::unbounded_channel();
        let task = tokio::spawn(tracker.run(watch, replaced));
        Ok(LiveFleet {
            state,
            task,
            replace,
        })
    }

    /// A handle that replaces the endpoints while the fleet runs.
    pub fn membership_handle(&self) -> Membership {
        Membership {
            replace: self.replace.clone(),
        }
    }

    /// Follows every change.
    pub fn subscribe(&self) -> watch::Receiver<Arc<FleetState>> {
        self.state.clone()
    }

    pub fn current(&self) -> Arc<FleetState> {
        self.state.borrow().clone()
    }

    /// Stops watching and scraping; the last state stays readable. Idempotent.
    pub fn shutdown(&self) {
        self.task.abort();
    }
}

impl Drop for LiveFleet {
    fn drop(&mut self) {
        self.task.abort();
    }
}
