//! The lifecycle of a live driver: what it starts on (the plugin libraries, the effective
//! config, the fleet and the scheduler on the real clock), where its listeners come from (bound
//! here or taken over from a predecessor), the signal that reloads its config, and what stops
//! it: a signal, or a successor taking the listeners over.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::LoadedConfig;
use crate::fleet::kv_events::KvEvents;
use crate::fleet::LiveFleet;
use crate::live::handover::{Offer, Takeover};
use crate::live::kv_feed::KvFeed;
use crate::live::listen::bind;
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
        let feed = Arc::new(KvFeed::new(&live));
        if let Some(kv_events) = KvEvents::start(config, fleet.subscribe(), feed) {
            live.attach_kv_events(kv_events);
        }
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

/// Why a driver stops.
pub(crate) enum Stop {
    /// SIGTERM or SIGINT.
    Signal(&'static str),
    /// A successor serves on the listeners now; its pid.
    HandedOver(String),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Signal(name) => f.write_str(name),
            Stop::HandedOver(pid) => write!(f, "handed over to process {pid}"),
        }
    }
}

/// A driver's listeners from start to stop: with `--handover PATH`, taken over from the
/// process offering them at PATH (bound here when none does) and offered there in turn.
pub(crate) struct Lifecycle {
    command: &'static str,
    path: Option<PathBuf>,
    takeover: Option<Takeover>,
    offer: Option<Offer>,
}

impl Lifecycle {
    /// Receives a predecessor's sockets when `handover` names a path a process offers them at.
    pub async fn begin(
        command: &'static str,
        handover: Option<&Path>,
    ) -> Result<Lifecycle, String> {
        let takeover = match handover {
            Some(path) => Takeover::connect(path, command).await?,
            None => None,
        };
        Ok(Lifecycle {
            command,
            path: handover.map(Path::to_path_buf),
            takeover,
            offer: None,
        })
    }

    /// The listener for `what` on `addr`: the predecessor's socket for it, or bound here.
    pub async fn listen(&mut self, what: &str, addr: SocketAddr) -> Result<TcpListener, String> {
        if let Some(takeover) = self.takeover.as_mut() {
            if let Some(listener) = takeover.claim(what, addr)? {
                return Ok(listener);
            }
        }
        bind(what, addr).await.map_err(|error| match &self.path {
            Some(path) if self.takeover.is_none() => format!(
                "{error} (no process offered its listeners at {}: was the one holding {addr} \
                 started without --handover, or with another path?)",
                path.display()
            ),
            _ => error,
        })
    }

    /// With `--handover`, offers `listeners` (named as they were opened) to a successor. Call
    /// it once nothing more can fail before they are served.
    pub fn offer(&mut self, listeners: &[(&str, &TcpListener)]) -> Result<(), String> {
        if let Some(path) = &self.path {
            self.offer = Some(Offer::start(path, self.command, listeners)?);
        }
        Ok(())
    }

    /// Call once every listener is served: a predecessor that handed its sockets over now
    /// drains.
    pub async fn serving(&mut self) {
        if let Some(takeover) = self.takeover.take() {
            takeover.finish().await;
        }
    }

    /// Waits for SIGTERM, SIGINT or a successor taking the listeners over; from then on
    /// nothing more is offered.
    pub async fn until_stopped(&mut self) -> Result<Stop, String> {
        let stop = {
            let taken = async {
                match self.offer.as_mut() {
                    Some(offer) => offer.taken().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                signal = shutdown_signal() => Stop::Signal(signal?),
                pid = taken => Stop::HandedOver(pid),
            }
        };
        if let Some(offer) = self.offer.take() {
            offer.withdraw().await;
        }
        Ok(stop)
    }
}

/// Waits for SIGTERM or SIGINT and names it.
async fn shutdown_signal() -> Result<&'static str, String> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
    tokio::select! {
        _ = terminate.recv() => Ok("SIGTERM"),
        result = tokio::signal::ctrl_c() => result
            .map(|()| "SIGINT")
            .map_err(|e| format!("cannot watch SIGINT: {e}")),
    }
}
