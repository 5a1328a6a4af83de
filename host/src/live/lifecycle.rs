//! The lifecycle of a live driver: what it starts on (the plugin libraries, the effective
//! config, the fleet and the scheduler on the real clock) and the signal that stops it.

use std::sync::Arc;

use crate::config::LoadedConfig;
use crate::fleet::LiveFleet;
use crate::live::{Limits, LiveScheduler, RealClock};
use crate::pipeline::{build, load_registry, Fleet, Options, Scheduler};
use crate::plugins::Registry;

/// What a live driver runs on: the plugin libraries (kept loaded until the process exits),
/// the effective config, the fleet and the scheduler on the real clock.
pub(crate) struct LiveSetup {
    pub registry: Registry,
    pub effective: Arc<String>,
    pub fleet: LiveFleet,
    pub live: Arc<LiveScheduler>,
}

impl LiveSetup {
    /// Loads the libraries, wires the pipeline, starts the fleet and the scheduler with the
    /// `[serve]` limits. `records_needed` keeps at least one decision record per request.
    pub async fn start(
        config: &LoadedConfig,
        options: &Options,
        seed: u64,
        records_needed: bool,
    ) -> Result<LiveSetup, String> {
        let settings = &config.config.serve;
        let registry = load_registry(config, options).map_err(|e| e.to_string())?;
        let pipeline = build(config, &registry, options).map_err(|e| e.to_string())?;
        let effective = Arc::new(crate::effective::render(config, &registry, &pipeline));
        let fleet = LiveFleet::start(config).await?;
        let scheduler = Scheduler::new(Arc::new(pipeline), Fleet::default(), seed);
        let keep_records = if records_needed {
            settings.decision_records.max(1)
        } else {
            settings.decision_records
        };
        let live = LiveScheduler::start(
            scheduler,
            fleet.subscribe(),
            RealClock::start(),
            Limits {
                per_endpoint: settings.max_in_flight_per_endpoint,
                total: settings.max_in_flight,
            },
            keep_records,
        );
        Ok(LiveSetup {
            registry,
            effective,
            fleet,
            live,
        })
    }
}

/// Waits for SIGTERM or SIGINT and names it.
pub(crate) async fn shutdown_signal() -> Result<&'static str, String> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
    tokio::select! {
        _ = terminate.recv() => Ok("SIGTERM"),
        result = tokio::signal::ctrl_c() => result
            .map(|()| "SIGINT")
            .map_err(|e| format!("cannot watch SIGINT: {e}")),
    }
}
