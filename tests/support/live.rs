//! Helpers for tests of the live drivers: the `switchyard` binary run as real processes on
//! 127.0.0.1 (mock replicas and the router), and a small HTTP client over real connections.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

use crate::{plugin_dir, target_dir};

/// The debug `switchyard` binary, built once per test binary.
pub fn binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // The plugin build and this one share the cargo lock; build the plugins first.
        plugin_dir();
        let status = crate::cargo_command()
            .args(["build", "--quiet", "-p", "switchyard"])
            .status()
            .expect("cargo runs");
        assert!(status.success(), "switchyard builds");
        target_dir().join("debug/switchyard")
    })
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    listener.local_addr().expect("address").port()
}

/// A child process killed by its pid when dropped.
pub struct Process {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Process {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits (bounded) for the exit; returns the exit code.
    pub fn terminate(&mut self, within: Duration) -> Option<i32> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Attempts at starting a process on free ports: a port found free can be taken by another
/// test before the child binds it, and the child then exits at once.
pub const START_ATTEMPTS: usize = 4;

/// A response header's value, `""` when absent or not text.
pub fn header<'a>(response: &'a hyper::Response<hyper::body::Incoming>, name: &str) -> &'a str {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// The mock replica that answered: its `x-mock-replica` header.
pub fn replica_name(response: &hyper::Response<hyper::body::Incoming>) -> String {
    header(response, "x-mock-replica").to_string()
}

/// Waits (bounded) until `GET path` on `probe` answers 200; `Err` with the exit status when the
/// process exits first.
pub async fn wait_healthy(child: &mut Child, probe: SocketAddr, path: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().expect("child status") {
            return Err(status.to_string());
        }
        if let Ok(r) = try_send(probe, "GET", path, &[], "").await {
            if r.status() == 200 {
                return Ok(());
            }
        }
        assert!(Instant::now() < deadline, "never became healthy on {probe}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts `switchyard mock-replica` with `extra` flags on a free port and waits for it.
pub async fn start_replica(name: &str, extra: &[&str]) -> Process {
    let mut last = String::new();
    for _ in 0..START_ATTEMPTS {
        let port = free_port();
        let mut child = Command::new(binary())
            .args(["mock-replica", "--port", &port.to_string(), "--name", name])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mock-replica starts");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        match wait_healthy(&mut child, addr, "/health").await {
            Ok(()) => return Process { child, addr },
            Err(status) => last = status,
        }
    }
    panic!("mock-replica {name} exited early {START_ATTEMPTS} times, last: {last}");
}

/// Flags of a replica fast enough for tests, with 4-token blocks so short prompts fill blocks.
pub const FAST_REPLICA: &[&str] = &[
    "--model",
    "test-model",
    "--decode-tokens-per-second",
    "2000",
    "--block-size",
    "4",
];

/// `n` fast replicas named `r0`, `r1`, ..., with `extra` flags.
pub async fn fast_replicas(n: usize, extra: &[&str]) -> Vec<Process> {
    let mut flags = FAST_REPLICA.to_vec();
    flags.extend_from_slice(extra);
    let mut started = Vec::new();
    for i in 0..n {
        started.push(start_replica(&format!("r{i}"), &flags).await);
    }
    started
}

/// `[[endpoints]]` entries `r0`, `r1`, ... for `replicas`.
pub fn endpoints_toml(replicas: &[Process]) -> String {
    replicas
        .iter()
        .enumerate()
        .map(|(i, r)| format!("[[endpoints]]\nname = \"r{i}\"\naddress = \"{}\"\n", r.addr))
        .collect()
}

/// The default kind of pipeline for 4-token blocks: burst co-location, affinity filter,
/// prefix and load scorers (alpha types allowed).
pub fn burst_pipeline(window_ms: u64) -> String {
    format!(
        r#"
allow_experimental_plugins = true
libraries = ["burst_prefix_cache_producer", "prefix_cache_affinity_filter", "prefix_cache_scorer"]

[fleet]
scrape_interval_ms = 100

[[plugins]]
type = "burst-prefix-cache-producer"
[plugins.parameters]
windowDurationMs = {window_ms}
blockSizeTokens = 4

[[plugins]]
name = "burst-affinity"
type = "prefix-cache-affinity-filter"
[plugins.parameters]
prefixMatchInfoProducerName = "burst-prefix-cache-producer"
penaltyMode = "matchedTokens"

[[plugins]]
type = "prefix-cache-scorer"
[plugins.parameters]
prefixMatchInfoProducerName = "burst-prefix-cache-producer"

[[plugins]]
type = "load-aware-scorer"

[[profiles]]
name = "default"
filters = ["burst-affinity"]
scorers = [
    {{ plugin = "prefix-cache-scorer", weight = 2.0 }},
    {{ plugin = "load-aware-scorer", weight = 1.0 }},
]
"#
    )
}

/// A running `switchyard serve`: the API, metrics and admin addresses.
pub struct Router {
    pub process: Process,
    pub metrics: SocketAddr,
    pub admin: SocketAddr,
    pub dir: PathBuf,
}

impl Router {
    pub fn api(&self) -> SocketAddr {
        self.process.addr
    }
}

/// A fresh directory for one test's files.
pub fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("switchyard-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Writes `config` (a TOML pipeline without a `[serve]` table) to a file in `dir`, adds
/// loopback listeners on free ports, starts `switchyard serve` with `extra` flags and waits
/// until `/health` answers.
pub async fn start_router(dir: &Path, config: &str, serve_table: &str, extra: &[&str]) -> Router {
    let mut last = String::new();
    for _ in 0..START_ATTEMPTS {
        let (api, metrics, admin) = (free_port(), free_port(), free_port());
        let text = format!(
            "{config}\n[serve]\nlisten = \"127.0.0.1:{api}\"\nmetrics_listen = \"127.0.0.1:{metrics}\"\n\
             admin_listen = \"127.0.0.1:{admin}\"\n{serve_table}\n"
        );
        let path = dir.join("serve.toml");
        std::fs::write(&path, text).expect("config written");
        let log = std::fs::File::create(dir.join("serve.log")).expect("log file");
        let mut child = Command::new(binary())
            .arg("serve")
            .arg("--config")
            .arg(&path)
            .arg("--plugin-dir")
            .arg(plugin_dir())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("serve starts");
        // Health is answered by the metrics listener.
        let metrics = SocketAddr::from(([127, 0, 0, 1], metrics));
        match wait_healthy(&mut child, metrics, "/health").await {
            Ok(()) => {
                return Router {
                    process: Process {
                        child,
                        addr: SocketAddr::from(([127, 0, 0, 1], api)),
                    },
                    metrics,
                    admin: SocketAddr::from(([127, 0, 0, 1], admin)),
                    dir: dir.to_path_buf(),
                }
            }
            Err(status) => {
                let log = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
                last = format!("{status}\n{log}");
            }
        }
    }
    panic!("serve exited early {START_ATTEMPTS} times, last: {last}");
}

/// One request on a fresh connection.
pub async fn try_send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<Response<Incoming>, String> {
    try_send_bytes(addr, method, path, headers, Bytes::from(body.to_string())).await
}

/// One request with a raw body on a fresh connection.
pub async fn try_send_bytes(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<Response<Incoming>, String> {
    let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request.body(Full::new(body)).map_err(|e| e.to_string())?;
    sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())
}

pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Response<Incoming> {
    try_send(addr, method, path, headers, body)
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// POSTs `body` (JSON) to `path` on `addr` and checks the answer is 200.
pub async fn post_ok(addr: SocketAddr, path: &str, body: &Value) -> Response<Incoming> {
    let response = send(addr, "POST", path, &[], &body.to_string()).await;
    assert_eq!(response.status(), 200, "POST {path}");
    response
}

pub async fn body_bytes(response: Response<Incoming>) -> Bytes {
    response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
}

pub async fn json(response: Response<Incoming>) -> Value {
    let bytes = body_bytes(response).await;
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
}

/// The Prometheus page at `addr`.
pub async fn metrics_page(addr: SocketAddr) -> String {
    let bytes = body_bytes(send(addr, "GET", "/metrics", &[], "").await).await;
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The sum of every series of `name` on a page (0 when absent). `name` may include a label
/// filter such as `switchyard_in_flight{endpoint="/r0"}`.
pub fn metric_sum(page: &str, name: &str) -> f64 {
    let (family, filter) = match name.split_once('{') {
        Some((family, rest)) => (family, Some(rest.trim_end_matches('}'))),
        None => (name, None),
    };
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| filter.is_none_or(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next())
        .filter_map(|v| v.parse::<f64>().ok())
        .sum()
}

/// The value of a series that must be on the page.
pub async fn metric(addr: SocketAddr, name: &str) -> f64 {
    let page = metrics_page(addr).await;
    let prefix = format!("{name}{{");
    page.lines()
        .find(|l| l.starts_with(&prefix) || l.starts_with(&format!("{name} ")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from\n{page}"))
}

/// The `data:` payloads of a stream, in order, and whether it ended cleanly.
pub async fn read_events(response: Response<Incoming>) -> (Vec<String>, Result<(), String>) {
    read_rest_of_stream(response.into_body(), String::new()).await
}

/// Reads a stream to its end (within 30 s), after `start` already read: the `data:` payloads
/// and how it ended.
pub async fn read_rest_of_stream(
    mut body: Incoming,
    start: String,
) -> (Vec<String>, Result<(), String>) {
    let mut text = start;
    let mut end = Ok(());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, body.frame()).await {
            Err(_) => panic!("the stream did not end within 30 s; read so far:\n{text}"),
            Ok(None) => break,
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    text.push_str(&String::from_utf8_lossy(&data));
                }
            }
            Ok(Some(Err(error))) => {
                end = Err(error.to_string());
                break;
            }
        }
    }
    let events = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect();
    (events, end)
}

/// The replicas' prefix-cache counters summed: (queried tokens, hit tokens).
pub async fn prefix_cache_totals(replicas: &[Process]) -> (f64, f64) {
    let (mut queries, mut hits) = (0.0, 0.0);
    for replica in replicas {
        let page = metrics_page(replica.addr).await;
        queries += metric_sum(&page, "vllm:prefix_cache_queries_total");
        hits += metric_sum(&page, "vllm:prefix_cache_hits_total");
    }
    (queries, hits)
}

/// Waits (bounded) until the router counts nothing in flight, in total and per endpoint.
pub async fn assert_router_idle(router: &Router, what: &str) {
    let idle = eventually(Duration::from_secs(10), || async {
        metric_sum(
            &metrics_page(router.metrics).await,
            "switchyard_in_flight_total",
        ) == 0.0
    })
    .await;
    let page = metrics_page(router.metrics).await;
    assert!(
        idle,
        "{what}: the router still counts requests in flight\n{page}"
    );
    assert_eq!(
        metric_sum(&page, "switchyard_in_flight"),
        0.0,
        "{what}\n{page}"
    );
}

/// Polls `check` every 20 ms until it holds or `within` passes; returns whether it held.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Replays a `replay` input file through the pipeline of `config` (seed 0, like `serve`'s
/// default) and returns each request's first chosen endpoint by id.
pub fn replay_file(config: &Path, input: &Path) -> std::collections::BTreeMap<String, String> {
    use switchyard::config::LoadedConfig;
    use switchyard::pipeline::{build, load_registry, Options, Scheduler};
    use switchyard::replay;

    let loaded = LoadedConfig::read(config).expect("config reads");
    let options = Options {
        allow_experimental_plugins: false,
        plugin_dirs: vec![plugin_dir().to_path_buf()],
    };
    let registry = load_registry(&loaded, &options).expect("libraries load");
    let pipeline = build(&loaded, &registry, &options).expect("pipeline wires");
    let bytes = std::fs::read(input).expect("input reads");
    let lines = replay::read_input(bytes.as_slice()).expect("input parses");
    let fleet = replay::fleet_from_config(&loaded.config.endpoints);
    replay::check_input(&lines, &fleet).expect("input fits the fleet");
    let mut scheduler = Scheduler::new(std::sync::Arc::new(pipeline), fleet, 0);
    replay_placements(&mut scheduler, &lines)
}

/// Request id → first endpoint of its decision, as `replay` places `lines` with `scheduler`.
pub fn replay_placements(
    scheduler: &mut switchyard::pipeline::Scheduler,
    lines: &[switchyard::replay::ReplayLine],
) -> std::collections::BTreeMap<String, String> {
    let mut out = Vec::new();
    switchyard::replay::run(scheduler, lines, false, &mut out).expect("replay runs");
    String::from_utf8(out)
        .expect("utf-8")
        .lines()
        .map(|line| {
            let decision: Value = serde_json::from_str(line).expect("JSON line");
            (
                decision["id"].as_str().unwrap_or_default().to_string(),
                decision["endpoints"][0]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

/// A windowless pipeline: queue depth only, ties broken by the picker's seeded randomness.
pub const QUEUE_PIPELINE: &str = "\
[[plugins]]
type = \"queue-scorer\"

[[plugins]]
type = \"max-score-picker\"

[[profiles]]
name = \"default\"
scorers = [{ plugin = \"queue-scorer\", weight = 1.0 }]
picker = \"max-score-picker\"
";

/// Writes a word-level `dir/tokenizer.json`: `<s>` (0) added before every text as vLLM's
/// completions endpoint adds special tokens, `<unk>` (1), and the words `w0` to `w999` (2 on);
/// words split on whitespace. Returns its path.
pub fn word_tokenizer(dir: &Path) -> String {
    let vocab: serde_json::Map<String, Value> = ["<s>".to_string(), "<unk>".to_string()]
        .into_iter()
        .chain((0..1000).map(|i| format!("w{i}")))
        .enumerate()
        .map(|(id, word)| (word, Value::from(id)))
        .collect();
    let file = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}},
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, file.to_string()).expect("tokenizer written");
    path.display().to_string()
}
