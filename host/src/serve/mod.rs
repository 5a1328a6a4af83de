//! `switchyard serve`: the OpenAI-compatible HTTP router.
//!
//! Three listeners: the API (`serve.listen`), `/metrics` `/health` `/ready`
//! (`serve.metrics_listen`) and the admin API (`serve.admin_listen`, loopback by default). On
//! SIGTERM or SIGINT the router stops accepting, reports not ready, lets requests in flight
//! finish within `drain_timeout_ms`, and exits; it does the same once a successor started with
//! the same `--handover PATH` serves on its listeners.

pub mod api;
pub mod response;
pub mod upstream;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::LoadedConfig;
use crate::live::admin::{spawn_operator_routes, OperatorListeners};
use crate::live::connection::{self, Guard};
use crate::live::ids::{id_prefix, RequestIds};
use crate::live::journal::Journal;
use crate::live::lifecycle::{Lifecycle, LiveSetup, Stop};
use crate::live::listen::{accept, address, local, AcceptLoops};
use crate::live::metrics::Metrics;
use crate::pipeline::Options;
use api::Router;

/// How long before the drain deadline requests still waiting for their answer get a 503.
const CUT_AHEAD: Duration = Duration::from_secs(1);

/// Command-line overrides of `[serve]`.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    pub port: Option<u16>,
    pub metrics_port: Option<u16>,
    pub admin_port: Option<u16>,
    pub seed: u64,
    /// Write every request as a `replay` input line here.
    pub journal: Option<PathBuf>,
    /// The control socket of hand-over restarts.
    pub handover: Option<PathBuf>,
}

/// Serves until SIGTERM/SIGINT, then drains.
pub async fn run(
    config: LoadedConfig,
    options: Options,
    serve: ServeOptions,
) -> Result<(), String> {
    config.check_serve().map_err(|e| e.to_string())?;
    let mut settings = config.config.serve.clone();
    let listen = address("serve.listen", &settings.listen, serve.port)?;
    let metrics_listen = address(
        "serve.metrics_listen",
        &settings.metrics_listen,
        serve.metrics_port,
    )?;
    let admin_listen = match (settings.admin_listen.is_empty(), serve.admin_port) {
        (true, None) => None,
        (true, Some(port)) => Some(SocketAddr::from(([127, 0, 0, 1], port))),
        (false, port) => Some(address("serve.admin_listen", &settings.admin_listen, port)?),
    };
    settings.listen = listen.to_string();

    let LiveSetup {
        reloader,
        fleet,
        live,
    } = LiveSetup::start(&config, &options, serve.seed, settings.decision_header).await?;
    let (journal, journal_task) = match &serve.journal {
        Some(path) => {
            let (journal, task) = Journal::create(path).await?;
            (Some(journal), Some(task))
        }
        None => (None, None),
    };

    let mut lifecycle = Lifecycle::begin("serve", serve.handover.as_deref()).await?;
    let api_listener = lifecycle.listen("API", listen).await?;
    let metrics_listener = lifecycle.listen("metrics", metrics_listen).await?;
    let admin_listener = match admin_listen {
        Some(addr) => Some(lifecycle.listen("admin", addr).await?),
        None => None,
    };
    let mut offered = vec![("API", &api_listener), ("metrics", &metrics_listener)];
    offered.extend(admin_listener.as_ref().map(|l| ("admin", l)));
    lifecycle.offer(&offered)?;
    let drain = Duration::from_millis(settings.drain_timeout_ms);
    let (cut, cut_watch) = watch::channel(false);
    let max_connections = connection::connection_cap(settings.max_connections);
    let ids = Arc::new(RequestIds::new(id_prefix()));
    let metrics = Metrics::default();
    let api_guard = Guard::new(&settings, Some(metrics.clone()), Some(ids.clone()));
    let operator_guard = Guard::new(&settings, None, None);
    let router = Arc::new(Router {
        live,
        reloader,
        fleet,
        client: upstream::client(),
        metrics,
        settings,
        journal,
        ids,
        cut: cut_watch,
    });
    let draining = Arc::new(AtomicBool::new(false));
    // The API stops first; metrics and admin stay up while it drains, so probes see the drain.
    let (stop, stopped) = watch::channel(false);
    let (stop_observers, observers_stopped) = watch::channel(false);

    tracing::info!(
        api = %local(&api_listener),
        metrics = %local(&metrics_listener),
        admin = %admin_listener.as_ref().map_or("off".to_string(), local),
        max_connections,
        endpoints = router.fleet.current().members.len(),
        "switchyard serve is listening"
    );

    let loops = AcceptLoops::new();
    let api = {
        let router = router.clone();
        tokio::spawn(accept(
            api_listener,
            loops.token(),
            stopped.clone(),
            drain,
            api_guard,
            Some(max_connections),
            move |request| router.clone().handle(request),
        ))
    };
    let observers = spawn_operator_routes(
        router.clone(),
        OperatorListeners {
            metrics: metrics_listener,
            admin: admin_listener,
        },
        &loops,
        draining.clone(),
        observers_stopped,
        drain,
        operator_guard,
    );

    lifecycle.serving().await;

    let reason = lifecycle.until_stopped().await?;
    if let Stop::HandedOver(_) = reason {
        // The successor answers probes on the same sockets, and this process accepts no more
        // there: the service stays ready. It says it handed over once it accepts nothing.
        let _ = stop_observers.send(true);
        let _ = stop.send(true);
        loops.stopped().await;
    } else {
        draining.store(true, Ordering::Relaxed);
        let _ = stop.send(true);
    }
    tracing::info!(
        "{reason}: draining (up to {} ms for requests in flight)",
        drain.as_millis()
    );
    // Requests still unanswered shortly before the deadline get a 503 while their
    // connections are still open.
    let cutter = tokio::spawn(async move {
        tokio::time::sleep(drain.saturating_sub(CUT_AHEAD.min(drain / 10))).await;
        let _ = cut.send(true);
        cut
    });
    let _ = api.await;
    cutter.abort();
    let (_, in_flight) = router.live.in_flight();
    if in_flight > 0 {
        tracing::warn!("{in_flight} requests still in flight after the drain deadline; cut");
    }
    let _ = stop_observers.send(true);
    for task in observers {
        let _ = task.await;
    }
    drop(router);
    if let Some(task) = journal_task {
        task.finish().await;
    }
    tracing::info!("stopped");
    Ok(())
}
