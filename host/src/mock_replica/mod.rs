//! `switchyard mock-replica`: an OpenAI-compatible stand-in for a model server, for tests and
//! demos. It runs the simulator's replica model ([`crate::sim::replica`]) on the real clock, so
//! its queueing, prefill and decode times, prefix-cache hits and `/metrics` follow the same
//! model `simulate` uses (`docs/mock-replica.md`).
//!
//! This module owns the listener (including closing it on demand), one connection task per
//! client and the shutdown on SIGTERM/SIGINT; [`http`] answers requests, [`api`] reads and
//! writes the OpenAI shapes and [`model`] owns the replica.

pub mod api;
pub mod http;
pub mod kv_publish;
pub mod model;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;

use crate::pipeline::tokenize::PromptTokenizer;
use crate::sim::FleetConfig;

/// Command-line options of `mock-replica`.
#[derive(Debug, Clone, clap::Args)]
pub struct MockOptions {
    /// Port to listen on (127.0.0.1; 0 picks a free one and logs it).
    #[arg(long)]
    pub port: u16,
    /// The replica's name, sent in the `x-mock-replica` header of every response.
    #[arg(long, default_value = "mock-replica")]
    pub name: String,
    /// The model it serves.
    #[arg(long, default_value = "mock-model")]
    pub model: String,
    /// Prefill throughput, prompt tokens per second (the simulator's default).
    #[arg(long, default_value_t = FleetConfig::default().prefill_tokens_per_second)]
    pub prefill_tokens_per_second: f64,
    /// Decode speed of one sequence, tokens per second.
    #[arg(long, default_value_t = FleetConfig::default().decode_tokens_per_second)]
    pub decode_tokens_per_second: f64,
    /// Sequences run at once; further requests wait.
    #[arg(long, default_value_t = FleetConfig::default().max_running_sequences)]
    pub max_running: u32,
    /// Tokens per KV-cache block (prefix-cache granularity).
    #[arg(long, default_value_t = FleetConfig::default().block_size_tokens)]
    pub block_size: usize,
    /// Prefix-cache capacity in blocks.
    #[arg(long, default_value_t = FleetConfig::default().cache_capacity_blocks)]
    pub cache_blocks: usize,
    /// Publish the cache's stores and evictions as vLLM KV events on this port (127.0.0.1).
    #[arg(long)]
    pub kv_events_port: Option<u16>,
    /// Answer replay requests for buffered KV events on this port (needs --kv-events-port).
    #[arg(long, requires = "kv_events_port")]
    pub kv_replay_port: Option<u16>,
    /// The KV event shape: tagged arrays (vLLM up to 0.23) or maps tagged by `type` (since
    /// June 2026).
    #[arg(long, value_enum, default_value_t = kv_publish::Shape::Array)]
    pub kv_events_format: kv_publish::Shape,
    /// KV event messages kept for replay.
    #[arg(long, default_value_t = 10_000)]
    pub kv_events_buffer: usize,
    /// Tokenize completions text with this `tokenizer.json` (special tokens added, as vLLM
    /// does) instead of the host's 4-bytes-per-token estimate, and chat through the chat
    /// template of the `tokenizer_config.json` beside it (else chat keeps the estimate).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<std::path::PathBuf>,
    /// Render chat through this Jinja chat template instead of the `tokenizer_config.json`'s.
    #[arg(long, value_name = "FILE", requires = "tokenizer")]
    pub chat_template: Option<std::path::PathBuf>,
}

impl MockOptions {
    /// Options with the simulator's replica defaults.
    pub fn new(port: u16, name: &str, model: &str) -> Self {
        let fleet = FleetConfig::default();
        MockOptions {
            port,
            name: name.to_string(),
            model: model.to_string(),
            prefill_tokens_per_second: fleet.prefill_tokens_per_second,
            decode_tokens_per_second: fleet.decode_tokens_per_second,
            max_running: fleet.max_running_sequences,
            block_size: fleet.block_size_tokens,
            cache_blocks: fleet.cache_capacity_blocks,
            kv_events_port: None,
            kv_replay_port: None,
            kv_events_format: kv_publish::Shape::Array,
            kv_events_buffer: 10_000,
            tokenizer: None,
            chat_template: None,
        }
    }

    /// The one-replica fleet these options describe, validated; errors name the flag.
    pub fn fleet(&self) -> Result<FleetConfig, String> {
        let fleet = FleetConfig {
            replicas: 1,
            block_size_tokens: self.block_size,
            cache_capacity_blocks: self.cache_blocks,
            prefill_tokens_per_second: self.prefill_tokens_per_second,
            decode_tokens_per_second: self.decode_tokens_per_second,
            max_running_sequences: self.max_running,
        };
        fleet.validate().map_err(|e| {
            let flag = match e.field {
                "blockSizeTokens" => "--block-size",
                "cacheCapacityBlocks" => "--cache-blocks",
                "prefillTokensPerSecond" => "--prefill-tokens-per-second",
                "decodeTokensPerSecond" => "--decode-tokens-per-second",
                "maxRunningSequences" => "--max-running",
                other => other,
            };
            format!("{flag}: {}", e.message)
        })?;
        Ok(fleet)
    }
}

/// What every connection shares.
pub struct Shared {
    pub name: String,
    pub model: String,
    pub block_size: usize,
    pub cache_blocks: usize,
    pub decode_ms_per_token: f64,
    /// Unix seconds at start, for `/v1/models`.
    pub created: u64,
    /// The model's clock: milliseconds since this instant.
    pub start: Instant,
    pub next_job: AtomicUsize,
    pub next_response: AtomicUsize,
    pub owner: mpsc::UnboundedSender<model::Command>,
    /// Asks the accept loop to close the listener for N ms; it acknowledges once closed.
    pub refuse: mpsc::Sender<(u64, oneshot::Sender<()>)>,
    /// The KV-event publisher, when the replica announces its cache's changes.
    pub kv_events: Option<kv_publish::Publisher>,
    /// How request text becomes token ids.
    pub tokenizer: PromptTokenizer,
}

/// Serves until SIGTERM/SIGINT.
pub async fn run(options: MockOptions) -> Result<(), String> {
    let mut server = start(options).await?;
    tokio::select! {
        result = &mut server.task => result.unwrap_or_else(|e| Err(format!("server task: {e}"))),
        signal = shutdown_signal() => {
            tracing::info!("mock-replica stopping on {signal}");
            Ok(())
        }
    }
}

/// A mock replica serving in the background; dropping it stops accepting connections.
pub struct Server {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds 127.0.0.1:`options.port` (0 picks a free port) and serves in a background task.
pub async fn start(options: MockOptions) -> Result<Server, String> {
    let fleet = options.fleet()?;
    let tokenizer = match &options.tokenizer {
        // An engine has no bound on the text it tokenizes; the body limit bounds it here.
        Some(path) => PromptTokenizer::load_with(path, options.chat_template.as_deref(), u64::MAX)
            .map_err(|e| format!("--tokenizer: {e}"))?,
        None => PromptTokenizer::estimate(),
    };
    let listener =
        bind(options.port).map_err(|e| format!("listening on 127.0.0.1:{}: {e}", options.port))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("listening socket: {e}"))?;
    let start = Instant::now();
    let (refuse_tx, refuse_rx) = mpsc::channel(4);
    let kv_events = match options.kv_events_port {
        Some(port) => Some(
            kv_publish::start(kv_publish::PublishOptions {
                port,
                replay_port: options.kv_replay_port,
                shape: options.kv_events_format,
                topic: format!("kv@{addr}@{}", options.model),
                buffer: options.kv_events_buffer,
            })
            .await?,
        ),
        None => None,
    };
    let shared = Arc::new(Shared {
        name: options.name.clone(),
        model: options.model.clone(),
        block_size: fleet.block_size_tokens,
        cache_blocks: fleet.cache_capacity_blocks,
        decode_ms_per_token: 1000.0 / fleet.decode_tokens_per_second,
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        start,
        next_job: AtomicUsize::new(0),
        next_response: AtomicUsize::new(0),
        owner: model::spawn(&fleet, start, kv_events.clone()),
        refuse: refuse_tx,
        kv_events,
        tokenizer,
    });
    tracing::info!(
        name = %options.name,
        model = %options.model,
        "mock-replica listening on {addr}"
    );
    let task = tokio::spawn(accept_loop(listener, addr.port(), shared, refuse_rx));
    Ok(Server { addr, task })
}

/// A listener on 127.0.0.1 that can be reopened on the same port at once.
fn bind(port: u16) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from(([127, 0, 0, 1], port)))?;
    socket.listen(1024)
}

async fn accept_loop(
    mut listener: TcpListener,
    port: u16,
    shared: Arc<Shared>,
    mut refuse: mpsc::Receiver<(u64, oneshot::Sender<()>)>,
) -> Result<(), String> {
    enum Step {
        Accepted(std::io::Result<TcpStream>),
        Refuse(u64, oneshot::Sender<()>),
    }
    loop {
        let step = tokio::select! {
            accepted = listener.accept() => Step::Accepted(accepted.map(|(stream, _)| stream)),
            Some((ms, ack)) = refuse.recv() => Step::Refuse(ms, ack),
        };
        match step {
            Step::Accepted(Ok(stream)) => {
                tokio::spawn(serve_connection(stream, shared.clone()));
            }
            Step::Accepted(Err(e)) => {
                // Out of descriptors and the like: back off rather than spin.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Step::Refuse(ms, ack) => {
                drop(listener);
                let _ = ack.send(());
                tracing::info!("refusing connections for {ms} ms");
                tokio::time::sleep(Duration::from_millis(ms)).await;
                listener = rebind(port).await?;
                tracing::info!("listening again on 127.0.0.1:{port}");
            }
        }
    }
}

/// Reopens the listener, retrying for a few seconds.
async fn rebind(port: u16) -> Result<TcpListener, String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match bind(port) {
            Ok(listener) => return Ok(listener),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("listening again on 127.0.0.1:{port}: {e}"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Serves one connection. A handler asking for a reset notifies `kill`: the connection is then
/// dropped with a zero linger on its socket, so the peer gets a reset instead of a clean close.
async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    // A second descriptor of the socket, kept to set the linger after hyper lets go of it.
    let (stream, twin) = match split_twin(stream) {
        Ok(pair) => pair,
        Err(e) => {
            tracing::warn!("connection setup failed: {e}");
            return;
        }
    };
    let kill = Arc::new(Notify::new());
    let service = {
        let kill = kill.clone();
        service_fn(move |request| {
            let shared = shared.clone();
            let kill = kill.clone();
            async move { Ok::<_, Infallible>(http::handle(request, shared, kill).await) }
        })
    };
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new());
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        result = connection => {
            if let Err(e) = result {
                tracing::debug!("connection ended: {e}");
            }
        }
        _ = kill.notified() => {
            if let Ok(twin) = TcpStream::from_std(twin) {
                let _ = twin.set_zero_linger();
            }
        }
    }
}

fn split_twin(stream: TcpStream) -> std::io::Result<(TcpStream, std::net::TcpStream)> {
    let std_stream = stream.into_std()?;
    let twin = std_stream.try_clone()?;
    Ok((TcpStream::from_std(std_stream)?, twin))
}

/// Resolves on SIGTERM or SIGINT, naming it.
async fn shutdown_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            return tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = tokio::signal::ctrl_c() => "SIGINT",
            };
        }
    }
    let _ = tokio::signal::ctrl_c().await;
    "SIGINT"
}

#[cfg(test)]
mod tests;
