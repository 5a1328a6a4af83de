//! `switchyard ext-proc`: the endpoint picker behind Envoy, serving
//! `envoy.service.ext_proc.v3.ExternalProcessor` with the reference's flags and ports.
//!
//! Listeners: the ext_proc gRPC service (`--grpc-port`, TLS unless `--secure-serving=false`),
//! `grpc.health.v1` (`--grpc-health-port`), `/metrics` `/health` `/ready` (`--metrics-port`)
//! and, when asked, the admin API on loopback. The fleet, the scheduler on the real clock,
//! the request lifecycle, the metrics, the operator routes and hand-over restarts
//! (`--handover`) come from `live`, as `serve`'s do.

mod connections;
mod conversation;
pub mod flags;
pub mod messages;

use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;

use crate::config::LoadedConfig;
use crate::fleet::{FleetState, LiveFleet};
use crate::live::admin::{spawn_operator_routes, Observed, OperatorListeners};
use crate::live::ids::{id_prefix, RequestIds};
use crate::live::lifecycle::{Lifecycle, LiveSetup, Stop};
use crate::live::listen::{incoming_until, local, AcceptLoops};
use crate::live::metrics::Metrics;
use crate::live::reload::Reloader;
use crate::live::LiveScheduler;
use crate::pipeline::Options;
use crate::replay::ReplayOutput;
pub use flags::ExtProcArgs;

/// The service name Envoy health-checks, and the other names the reference answers.
pub const SERVICE_NAME: &str = "envoy.service.ext_proc.v3.ExternalProcessor";
const HEALTH_SERVICES: [&str; 4] = ["liveness", "readiness", SERVICE_NAME, "inference-extension"];
/// Messages buffered towards one stream's client.
const STREAM_BUFFER: usize = 16;

/// What every stream shares.
pub struct Picker {
    live: Arc<LiveScheduler>,
    reloader: Arc<Reloader>,
    fleet: LiveFleet,
    metrics: Metrics,
    ids: RequestIds,
    max_body_bytes: u64,
    emit_scores: bool,
    bodiless_turn: AtomicUsize,
}

impl Picker {
    fn next_bodiless(&self) -> usize {
        self.bodiless_turn.fetch_add(1, Ordering::Relaxed)
    }

    /// Each candidate's weighted total, by address.
    fn scores(&self, record: &ReplayOutput) -> Vec<(String, f64)> {
        let Some(decision) = &record.decision else {
            return Vec::new();
        };
        let fleet = self.fleet.current();
        decision
            .totals()
            .filter_map(|(endpoint, score)| {
                fleet
                    .members
                    .iter()
                    .find(|m| m.endpoint.id == endpoint)
                    .map(|m| (m.endpoint.address.clone(), score))
            })
            .collect()
    }
}

impl Observed for Picker {
    fn live(&self) -> &Arc<LiveScheduler> {
        &self.live
    }
    fn reloader(&self) -> &Arc<Reloader> {
        &self.reloader
    }
    fn fleet(&self) -> Arc<FleetState> {
        self.fleet.current()
    }
    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

/// The gRPC service: one conversation task per stream.
struct Service(Arc<Picker>);

type ResponseStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<ProcessingResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl ExternalProcessor for Service {
    type ProcessStream = ResponseStream;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
        // The connection is not idle while this stream's conversation runs.
        let open = request
            .extensions()
            .get::<connections::ConnectionInfo>()
            .map(|info| info.activity.stream_opened());
        let picker = self.0.clone();
        tokio::spawn(async move {
            conversation::converse(picker, request.into_inner(), sender).await;
            drop(open);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }
}

/// Serves until SIGTERM/SIGINT, then drains for up to `--drain-timeout`.
pub async fn run(config: LoadedConfig, args: ExtProcArgs) -> Result<(), String> {
    args.check()?;
    let mut config = config;
    apply_flags(&mut config, &args);
    config.check_serve().map_err(|e| e.to_string())?;
    let settings = config.config.serve.clone();
    let options = Options {
        allow_experimental_plugins: args.allow_experimental_plugins
            || config.config.allow_experimental_plugins,
        plugin_dirs: args.plugin_dirs.clone(),
    };
    let identity = if args.secure_serving {
        Some(identity(args.cert_path.as_deref())?)
    } else {
        None
    };
    let LiveSetup {
        reloader,
        fleet,
        live,
    } = LiveSetup::start(&config, &options, args.seed, args.emit_endpoint_scores).await?;
    let picker = Arc::new(Picker {
        live,
        reloader,
        fleet,
        metrics: Metrics::default(),
        ids: RequestIds::new(id_prefix()),
        max_body_bytes: settings.max_body_bytes,
        emit_scores: args.emit_endpoint_scores,
        bodiless_turn: AtomicUsize::new(0),
    });

    let host = args.bind_address;
    let mut lifecycle = Lifecycle::begin("ext-proc", args.handover.as_deref()).await?;
    let grpc_listener = lifecycle
        .listen("ext_proc service", SocketAddr::new(host, args.grpc_port))
        .await?;
    let health_listener = lifecycle
        .listen(
            "gRPC health service",
            SocketAddr::new(host, args.grpc_health_port),
        )
        .await?;
    let metrics_listener = lifecycle
        .listen("metrics", SocketAddr::new(host, args.metrics_port))
        .await?;
    let admin_listener = match args.admin_port {
        Some(port) => Some(
            lifecycle
                .listen("admin", SocketAddr::from(([127, 0, 0, 1], port)))
                .await?,
        ),
        None => None,
    };
    tracing::info!(
        grpc = %local(&grpc_listener),
        tls = args.secure_serving,
        health = %local(&health_listener),
        metrics = %local(&metrics_listener),
        admin = %admin_listener.as_ref().map_or("off".to_string(), local),
        endpoints = picker.fleet.current().members.len(),
        "switchyard ext-proc is listening"
    );

    let draining = Arc::new(AtomicBool::new(false));
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    for name in ["", "liveness"] {
        health_reporter
            .set_service_status(name, ServingStatus::Serving)
            .await;
    }
    let readiness = tokio::spawn(track_readiness(
        health_reporter.clone(),
        picker.fleet.subscribe(),
        draining.clone(),
    ));

    let (stop, stopped) = watch::channel(false);
    let (stop_observers, observers_stopped) = watch::channel(false);
    let drain = args.drain_timeout;
    let mut grpc = grpc_server(&args);
    if let Some(identity) = identity {
        grpc = grpc
            .tls_config(ServerTlsConfig::new().identity(identity))
            .map_err(|e| format!("cannot set up TLS on the ext_proc service: {e}"))?;
    }
    let service = ExternalProcessorServer::new(Service(picker.clone()))
        .max_decoding_message_size(args.grpc_max_recv_msg_size)
        .max_encoding_message_size(args.grpc_max_send_msg_size);
    // Up to --grpc-max-connections sockets, each with its streams' connections to replicas.
    crate::live::connection::raise_open_file_limit();
    // Offered last, once nothing more can fail before the listeners are served.
    let mut offered = vec![
        ("ext_proc service", &grpc_listener),
        ("gRPC health service", &health_listener),
        ("metrics", &metrics_listener),
    ];
    offered.extend(admin_listener.as_ref().map(|l| ("admin", l)));
    lifecycle.offer(&offered)?;
    let loops = AcceptLoops::new();
    let grpc_task = tokio::spawn(grpc.add_service(service).serve_with_incoming_shutdown(
        connections::admit(
            grpc_listener,
            loops.token(),
            args.grpc_max_connections,
            args.grpc_idle_timeout,
            picker.metrics.clone(),
            stopped.clone(),
        ),
        // The server drains once the admitted connections end.
        std::future::pending::<()>(),
    ));
    let health_task = tokio::spawn(
        Server::builder()
            .add_service(health_service)
            .serve_with_incoming_shutdown(
                incoming_until(health_listener, observers_stopped.clone(), loops.token()),
                until(observers_stopped.clone()),
            ),
    );
    let observers = spawn_operator_routes(
        picker.clone(),
        OperatorListeners {
            metrics: metrics_listener,
            admin: admin_listener,
        },
        &loops,
        draining.clone(),
        observers_stopped.clone(),
        drain,
        crate::live::connection::Guard::new(&settings, None, None),
    );

    lifecycle.serving().await;

    let reason = lifecycle.until_stopped().await?;
    if let Stop::HandedOver(_) = reason {
        // The successor serves and answers health checks on the same sockets: this process
        // stays healthy to whoever still holds a connection to it, and accepts no more. It
        // says it handed over once it accepts nothing.
        let _ = stop_observers.send(true);
        let _ = stop.send(true);
        loops.stopped().await;
    } else {
        draining.store(true, Ordering::Relaxed);
        for name in HEALTH_SERVICES.iter().chain(&[""]) {
            health_reporter
                .set_service_status(*name, ServingStatus::NotServing)
                .await;
        }
        let _ = stop.send(true);
    }
    tracing::info!(
        "{reason}: draining (up to {} ms for open streams)",
        drain.as_millis()
    );
    if tokio::time::timeout(drain, grpc_task).await.is_err() {
        let (_, in_flight) = picker.live.in_flight();
        tracing::warn!("drain deadline reached with {in_flight} requests in flight; cut");
    }
    let _ = stop_observers.send(true);
    readiness.abort();
    let _ = tokio::time::timeout(Duration::from_secs(1), health_task).await;
    for task in observers {
        let _ = task.await;
    }
    drop(picker);
    tracing::info!("stopped");
    Ok(())
}

/// The ext_proc server's HTTP/2 settings. Envoy keeps few connections open for hours and
/// multiplexes every request over them, so the limits are per connection and generous; the
/// keep-alive pings find peers that went away without closing.
fn grpc_server(args: &ExtProcArgs) -> Server {
    let nonzero = |d: Duration| (!d.is_zero()).then_some(d);
    let mut server = Server::builder()
        .http2_keepalive_interval(nonzero(args.grpc_keepalive_interval))
        .http2_keepalive_timeout(Some(args.grpc_keepalive_timeout))
        .max_concurrent_streams(args.grpc_max_concurrent_streams)
        .http2_max_pending_accept_reset_streams(Some(args.grpc_max_pending_reset_streams))
        .http2_max_local_error_reset_streams(Some(args.grpc_max_error_reset_streams));
    if let Some(age) = nonzero(args.grpc_max_connection_age) {
        server = server.max_connection_age(age);
    }
    server
}

/// The command line wins over the config file for what both can say.
fn apply_flags(config: &mut LoadedConfig, args: &ExtProcArgs) {
    let fleet = &mut config.config.fleet;
    if let Some(interval) = args.refresh_metrics_interval {
        fleet.scrape_interval_ms = (interval.as_millis() as u64).max(1);
    }
    if let Some(threshold) = args.metrics_staleness_threshold {
        fleet.stale_after_ms = threshold.as_millis() as u64;
    }
    if args.pool_name.is_some() || args.pool_namespace.is_some() {
        tracing::info!(
            "--pool-name/--pool-namespace are accepted for compatibility; the endpoints come \
             from {}",
            config.path.display()
        );
    }
}

async fn until(mut stop: watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// `readiness` and the ext_proc service are serving while at least one endpoint is fresh and
/// the picker is not draining.
async fn track_readiness(
    reporter: tonic_health::server::HealthReporter,
    mut fleet: watch::Receiver<Arc<FleetState>>,
    draining: Arc<AtomicBool>,
) {
    let mut last = None;
    loop {
        let ready = fleet.borrow_and_update().ready() && !draining.load(Ordering::Relaxed);
        if last != Some(ready) {
            let status = if ready {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            for name in &HEALTH_SERVICES[1..] {
                reporter.set_service_status(*name, status).await;
            }
            last = Some(ready);
        }
        if fleet.changed().await.is_err() {
            return;
        }
    }
}

/// The TLS identity: `tls.crt` and `tls.key` from `cert_path`, or a self-signed certificate
/// made at start-up.
fn identity(cert_path: Option<&Path>) -> Result<Identity, String> {
    match cert_path {
        Some(dir) => {
            let read = |name: &str| {
                let path = dir.join(name);
                std::fs::read(&path)
                    .map_err(|e| format!("--cert-path: cannot read {}: {e}", path.display()))
            };
            Ok(Identity::from_pem(read("tls.crt")?, read("tls.key")?))
        }
        None => {
            let names = vec!["localhost".to_string(), "switchyard".to_string()];
            let certified = rcgen::generate_simple_self_signed(names)
                .map_err(|e| format!("cannot make a self-signed certificate: {e}"))?;
            Ok(Identity::from_pem(
                certified.cert.pem(),
                certified.signing_key.serialize_pem(),
            ))
        }
    }
}
