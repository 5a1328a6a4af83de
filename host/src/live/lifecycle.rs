//! The lifecycle of a live driver: what it starts on (the plugin libraries, the effective
//! config, the fleet and the scheduler on the real clock), the signal that reloads its config
//! and the signals that stop it.

use std::sync::Arc;

use crate::config::LoadedConfig;
use crate::fleet::LiveFleet;
use crate::live::reload::{reload_on_hangup, Reloader};
use crate::live::{Limits, LiveScheduler, RealClock};
use crate::pipeline::{build, load_registry, Fleet, Options, Scheduler};

/// What a live driver runs on: the fleet, the scheduler on the real clock and the reloader
/// (which holds the plugin libraries and the effective config of the running generation).
pub(crate) struct LiveSetup {
    pub reloader: Arc<Reloader>,
    pub fleet: LiveFleet,
    pub live: Arc<LiveScheduler>,
}

impl LiveSetup {
    /// Loads the libraries, wires the pipeline, starts the fleet and the scheduler with the
    /// `[serve]` limits, and reloads on SIGHUP from then on. `records_needed` keeps at least
    /// one decision record per request.
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
        let reloader = Arc::new(Reloader::new(
            config,
            options,
            live.clone(),
            fleet.membership_handle(),
            registry,
            effective,
        ));
        reload_on_hangup(Arc::downgrade(&reloader))?;
        Ok(LiveSetup {
            reloader,
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
