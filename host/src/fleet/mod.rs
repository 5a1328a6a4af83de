//! The live fleet shared by the real-time drivers (`serve`, `ext-proc`): which endpoints
//! exist (static `[[endpoints]]` or a watched discovery file) and their load facts, scraped
//! from each model server's `/metrics`. It hands out immutable snapshots; the scheduler's
//! owner applies a new snapshot before the next request it admits.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;

use crate::config::LoadedConfig;
use crate::pipeline::{Endpoint, Fleet};

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
    /// Milliseconds since its last successful scrape, if any.
    pub metrics_age_ms: Option<u64>,
    /// Scrapes that failed since the last success.
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

/// A running fleet: discovery watcher and scrapers on the tokio runtime.
pub struct LiveFleet {
    state: watch::Receiver<Arc<FleetState>>,
}

impl LiveFleet {
    /// Reads the initial endpoint set (an unreadable discovery file is an error here) and
    /// starts watching and scraping on the current tokio runtime.
    pub async fn start(config: &LoadedConfig) -> Result<LiveFleet, String> {
        let _ = config;
        unimplemented!()
    }

    /// Follows every change.
    pub fn subscribe(&self) -> watch::Receiver<Arc<FleetState>> {
        self.state.clone()
    }

    pub fn current(&self) -> Arc<FleetState> {
        self.state.borrow().clone()
    }
}
