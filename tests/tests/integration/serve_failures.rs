//! `switchyard serve` in front of `switchyard mock-replica` processes on 127.0.0.1, under
//! failures: refused connections, clients and replicas that go away mid-stream, a discovery
//! file replaced under load, SIGTERM while a stream is running, the in-flight limit, and the
//! official `openai` Python client.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::Response;
use serde_json::Value;
use switchyard_tests::live::{
    assert_router_idle, body_bytes, eventually, json, metric_sum, metrics_page, read_events,
    read_rest_of_stream, replica_name, send, start_replica, start_router, temp_dir, try_send,
    Router, QUEUE_PIPELINE,
};
use switchyard_tests::target_dir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const COMPLETIONS: &str = "/v1/completions";

/// A completions body.
fn completion(max_tokens: u32, stream: bool) -> String {
    format!(
        "{{\"model\": \"mock-model\", \"prompt\": \"tell me about switchyards\", \
         \"max_tokens\": {max_tokens}, \"stream\": {stream}}}"
    )
}

/// A config with static `[[endpoints]]` at `addresses` (name, host:port) and scraping off, so
/// every endpoint counts as fresh and only the picker's tie-breaking chooses among them.
fn static_config(endpoints: &[(&str, String)]) -> String {
    let mut text = String::new();
    for (name, address) in endpoints {
        text.push_str(&format!(
            "[[endpoints]]\nname = \"{name}\"\naddress = \"{address}\"\n\n"
        ));
    }
    text.push_str(QUEUE_PIPELINE);
    text.push_str("\n[fleet]\nscrape_interval_ms = 0\n");
    text
}

/// An address on 127.0.0.1 that refuses connections: a socket bound there without listening,
/// which also keeps other processes from taking the port while it lives.
fn refusing_address() -> (TcpSocket, SocketAddr) {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("binds");
    let addr = socket.local_addr().expect("address");
    (socket, addr)
}

fn router_log(router: &Router) -> String {
    std::fs::read_to_string(router.dir.join("serve.log")).unwrap_or_default()
}

async fn router_metric(router: &Router, name: &str) -> f64 {
    metric_sum(&metrics_page(router.metrics).await, name)
}

/// Reads frames until the first complete server-sent event; returns the text read so far.
async fn read_first_event(body: &mut Incoming) -> String {
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !text.contains("\n\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        let frame = tokio::time::timeout(left, body.frame())
            .await
            .expect("a first event within 10 s")
            .expect("the stream has a first event")
            .expect("the first event arrives intact");
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
    }
    text
}

/// Opens a raw connection, sends a streamed completion and reads until the first event; the
/// returned socket is the client's only hold on the request.
async fn raw_stream_until_first_event(addr: SocketAddr, body: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("router accepts");
    let head = format!(
        "POST {COMPLETIONS} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .await
        .expect("request sent");
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = String::from_utf8_lossy(&seen);
        if let Some((head, rest)) = text.split_once("\r\n\r\n") {
            assert!(head.starts_with("HTTP/1.1 200"), "answer: {head}");
            if rest.contains("data: ") && rest.contains("\n\n") {
                return stream;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, stream.read(&mut buffer))
            .await
            .expect("a first event within 10 s")
            .expect("readable");
        assert!(n > 0, "connection closed before the first event: {text}");
        seen.extend_from_slice(&buffer[..n]);
    }
}

// 1. Refused connections go to the next candidate.

#[tokio::test(flavor = "multi_thread")]
async fn refused_connections_go_to_the_next_candidate() {
    let a = start_replica("a", &["--decode-tokens-per-second", "2000"]).await;
    let b = start_replica("b", &["--decode-tokens-per-second", "2000"]).await;
    let (_reserved, dead) = refusing_address();
    let dir = temp_dir("serve-refused");
    let config = static_config(&[
        ("a", a.addr.to_string()),
        ("dead", dead.to_string()),
        ("b", b.addr.to_string()),
    ]);
    let router = start_router(&dir, &config, "", &[]).await;

    for i in 0..30 {
        let response = send(
            router.api(),
            "POST",
            COMPLETIONS,
            &[],
            &completion(2, false),
        )
        .await;
        let status = response.status();
        let replica = replica_name(&response);
        let body = body_bytes(response).await;
        assert_eq!(
            status,
            200,
            "request {i}: {}\n{}",
            String::from_utf8_lossy(&body),
            router_log(&router)
        );
        assert!(
            replica == "a" || replica == "b",
            "request {i} answered by '{replica}'"
        );
    }
    let page = metrics_page(router.metrics).await;
    let connect = metric_sum(
        &page,
        "switchyard_upstream_errors_total{endpoint=\"/dead\",kind=\"connect\"}",
    );
    assert!(connect >= 1.0, "no connect error counted\n{page}");
    assert!(
        metric_sum(&page, "switchyard_retries_total") >= 1.0,
        "no retry counted\n{page}"
    );
    assert_eq!(
        metric_sum(&page, "switchyard_requests_total{outcome=\"completed\"}"),
        30.0,
        "{page}"
    );
    assert_eq!(
        metric_sum(&page, "switchyard_requests_total{endpoint=\"/dead\"}"),
        0.0,
        "{page}"
    );
    assert_router_idle(&router, "after the refused connections").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_router_whose_only_endpoint_refuses_answers_502() {
    let (_reserved, dead) = refusing_address();
    let dir = temp_dir("serve-unreachable");
    let router = start_router(&dir, &static_config(&[("dead", dead.to_string())]), "", &[]).await;

    let response = send(
        router.api(),
        "POST",
        COMPLETIONS,
        &[],
        &completion(2, false),
    )
    .await;
    let status = response.status();
    let body = json(response).await;
    assert_eq!(status, 502, "{body}\n{}", router_log(&router));
    let error = &body["error"];
    assert_eq!(error["code"], "upstream_unreachable", "{body}");
    assert_eq!(error["type"], "server_error", "{body}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    let page = metrics_page(router.metrics).await;
    assert!(
        metric_sum(&page, "switchyard_upstream_errors_total{kind=\"connect\"}") >= 1.0,
        "{page}"
    );
    assert_eq!(
        metric_sum(&page, "switchyard_requests_total{outcome=\"unreachable\"}"),
        1.0,
        "{page}"
    );
    assert_router_idle(&router, "after an unreachable request").await;
}

// 2. A client that disconnects mid-stream.

#[tokio::test(flavor = "multi_thread")]
async fn a_client_disconnecting_mid_stream_releases_its_request() {
    let replica = start_replica("slow", &["--decode-tokens-per-second", "20"]).await;
    let dir = temp_dir("serve-disconnect");
    let config = static_config(&[("slow", replica.addr.to_string())]);
    let router = start_router(&dir, &config, "", &[]).await;

    let stream = raw_stream_until_first_event(router.api(), &completion(200, true)).await;
    // The request is under way on both sides.
    assert_eq!(
        router_metric(&router, "switchyard_in_flight_total").await,
        1.0
    );
    assert_eq!(
        metric_sum(
            &metrics_page(replica.addr).await,
            "vllm:num_requests_running"
        ),
        1.0
    );
    drop(stream);

    assert_router_idle(&router, "after the client left").await;
    let replica_idle = eventually(Duration::from_secs(5), || async {
        metric_sum(
            &metrics_page(replica.addr).await,
            "vllm:num_requests_running",
        ) == 0.0
    })
    .await;
    assert!(
        replica_idle,
        "the replica still runs the abandoned request\n{}",
        metrics_page(replica.addr).await
    );
    let counted = eventually(Duration::from_secs(5), || async {
        router_metric(
            &router,
            "switchyard_requests_total{outcome=\"client_disconnected\"}",
        )
        .await
            >= 1.0
    })
    .await;
    assert!(counted, "{}", metrics_page(router.metrics).await);
    // The 200-token stream would take 10 s; nothing counted it as completed.
    assert_eq!(
        router_metric(&router, "switchyard_requests_total{outcome=\"completed\"}").await,
        0.0
    );
}

// 3. A replica dying mid-stream.

/// Checks a stream cut by its replica: an error at the end, never `[DONE]`.
fn assert_cut(what: &str, events: &[String], end: &Result<(), String>) {
    assert!(
        !events.iter().any(|e| e == "[DONE]"),
        "{what}: the client saw [DONE]: {events:?}"
    );
    assert!(end.is_err(), "{what}: the stream ended cleanly: {events:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_failing_mid_stream_ends_the_client_stream_with_an_error() {
    let mut replica = start_replica("doomed", &["--decode-tokens-per-second", "50"]).await;
    let dir = temp_dir("serve-replica-dies");
    let config = static_config(&[("doomed", replica.addr.to_string())]);
    let router = start_router(&dir, &config, "", &[]).await;

    // The replica resets the connection after two chunks.
    let response = send(
        router.api(),
        "POST",
        COMPLETIONS,
        &[("x-mock-fault", "reset-after=2")],
        &completion(50, true),
    )
    .await;
    assert_eq!(response.status(), 200);
    let (events, end) = read_events(response).await;
    assert_cut("reset after 2 chunks", &events, &end);
    assert!(
        !events.is_empty() && events.len() <= 2,
        "relayed: {events:?}"
    );
    assert_router_idle(&router, "after the reset").await;
    let page = metrics_page(router.metrics).await;
    assert_eq!(
        metric_sum(&page, "switchyard_upstream_errors_total{kind=\"body\"}"),
        1.0,
        "{page}"
    );
    assert_eq!(
        metric_sum(
            &page,
            "switchyard_requests_total{outcome=\"upstream_error\"}"
        ),
        1.0,
        "{page}"
    );

    // The replica's process is killed while it streams.
    let response = send(
        router.api(),
        "POST",
        COMPLETIONS,
        &[],
        &completion(200, true),
    )
    .await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = read_first_event(&mut body).await;
    replica.child.kill().expect("replica killed");
    replica.child.wait().expect("replica reaped");
    let (events, end) = read_rest_of_stream(body, first).await;
    assert_cut("replica killed", &events, &end);
    assert_router_idle(&router, "after the replica died").await;
    let page = metrics_page(router.metrics).await;
    assert_eq!(
        metric_sum(&page, "switchyard_upstream_errors_total{kind=\"body\"}"),
        2.0,
        "{page}"
    );
    assert_eq!(
        metric_sum(
            &page,
            "switchyard_requests_total{outcome=\"upstream_error\"}"
        ),
        2.0,
        "{page}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_before_the_answer_are_counted_against_their_replica() {
    let replica = start_replica("flaky", &["--decode-tokens-per-second", "50"]).await;
    let dir = temp_dir("serve-failures-before-answer");
    let config = static_config(&[("flaky", replica.addr.to_string())]);
    let router = start_router(&dir, &config, "request_timeout_ms = 500", &[]).await;

    // The replica resets the connection before its head: 502, counted against it.
    let response = send(
        router.api(),
        "POST",
        COMPLETIONS,
        &[
            ("x-mock-fault", "reset-after=0"),
            ("x-request-id", "reset-1"),
        ],
        &completion(4, false),
    )
    .await;
    assert_eq!(response.status(), 502);
    assert_eq!(
        response.headers().get("x-request-id").map(|v| v.as_bytes()),
        Some(&b"reset-1"[..])
    );
    assert_eq!(json(response).await["error"]["code"], "upstream_error");

    // The replica takes longer than request_timeout_ms (100 tokens at 50 a second): 504.
    let response = send(
        router.api(),
        "POST",
        COMPLETIONS,
        &[("x-request-id", "slow-1")],
        &completion(100, false),
    )
    .await;
    assert_eq!(response.status(), 504);
    assert_eq!(
        response.headers().get("x-request-id").map(|v| v.as_bytes()),
        Some(&b"slow-1"[..])
    );
    assert_router_idle(&router, "after the failures").await;

    let page = metrics_page(router.metrics).await;
    for outcome in ["upstream_error", "timeout"] {
        let unlabelled =
            format!("switchyard_requests_total{{outcome=\"{outcome}\",endpoint=\"\"}}");
        assert_eq!(metric_sum(&page, &unlabelled), 0.0, "{page}");
        let any = format!("switchyard_requests_total{{outcome=\"{outcome}\"");
        assert_eq!(metric_sum(&page, &any), 1.0, "{page}");
    }
}

// 3b. Every answer: its id, a JSON body where it has one, and exactly one count.

/// One answer the router made: its status, `x-request-id` and body.
struct Answer {
    status: u16,
    id: Option<String>,
    body: Value,
}

/// A request and the answer it must get: status, error code (empty for the replica's own
/// answer), and the outcome and endpoint it is counted under.
struct Case {
    id: &'static str,
    method: &'static str,
    path: &'static str,
    fault: Option<&'static str>,
    body: String,
    status: u16,
    code: &'static str,
    outcome: &'static str,
    endpoint: &'static str,
}

impl Case {
    #[allow(
        clippy::too_many_arguments,
        reason = "one line per case reads as a table"
    )]
    fn new(
        id: &'static str,
        method: &'static str,
        path: &'static str,
        body: String,
        status: u16,
        code: &'static str,
        outcome: &'static str,
        endpoint: &'static str,
    ) -> Case {
        Case {
            id,
            method,
            path,
            fault: None,
            body,
            status,
            code,
            outcome,
            endpoint,
        }
    }

    fn with_fault(mut self, fault: &'static str) -> Case {
        self.fault = Some(fault);
        self
    }
}

/// A completion with `id` whose replica waits `delay_ms` before its first byte, in a task.
fn delayed_completion(
    api: SocketAddr,
    id: &'static str,
    delay_ms: u64,
) -> tokio::task::JoinHandle<Response<Incoming>> {
    tokio::spawn(async move {
        let fault = format!("first-byte-delay-ms={delay_ms}");
        let headers = [("x-mock-fault", fault.as_str()), ("x-request-id", id)];
        send(api, "POST", COMPLETIONS, &headers, &completion(1, false)).await
    })
}

/// Whether the router's requests in flight reach `count` within 5 s.
async fn in_flight_reaches(router: &Router, count: f64) -> bool {
    eventually(Duration::from_secs(5), || async {
        metric_sum(
            &metrics_page(router.metrics).await,
            "switchyard_in_flight_total",
        ) == count
    })
    .await
}

async fn answer_of(response: Response<Incoming>) -> Answer {
    let status = response.status().as_u16();
    let id = response
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let bytes = body_bytes(response).await;
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "{status}: the body is not JSON ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    Answer { status, id, body }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_answer_carries_its_id_a_json_body_and_exactly_one_count() {
    let replica = start_replica("one", &["--decode-tokens-per-second", "50"]).await;
    let dir = temp_dir("serve-every-answer");
    let config = static_config(&[("one", replica.addr.to_string())]);
    let router = start_router(
        &dir,
        &config,
        "request_timeout_ms = 1500\nmax_body_bytes = 2048\nmax_in_flight = 1",
        &[],
    )
    .await;
    let api = router.api();
    let big = format!(
        "{{\"model\": \"mock-model\", \"prompt\": \"{}\"}}",
        "x".repeat(4096)
    );
    let cases = [
        Case::new(
            "ok",
            "POST",
            COMPLETIONS,
            completion(1, false),
            200,
            "",
            "completed",
            "/one",
        ),
        Case::new(
            "models",
            "GET",
            "/v1/models",
            String::new(),
            200,
            "",
            "completed",
            "",
        ),
        Case::new(
            "not-json",
            "POST",
            COMPLETIONS,
            "{oops".into(),
            400,
            "invalid_body",
            "bad_request",
            "",
        ),
        Case::new(
            "no-route",
            "POST",
            "/v1/nothing",
            completion(1, false),
            404,
            "unknown_route",
            "bad_request",
            "",
        ),
        Case::new(
            "wrong-method",
            "GET",
            COMPLETIONS,
            String::new(),
            405,
            "method_not_allowed",
            "method_not_allowed",
            "",
        ),
        Case::new(
            "too-large",
            "POST",
            COMPLETIONS,
            big,
            413,
            "body_too_large",
            "body_too_large",
            "",
        ),
        Case::new(
            "reset",
            "POST",
            COMPLETIONS,
            completion(1, false),
            502,
            "upstream_error",
            "upstream_error",
            "/one",
        )
        .with_fault("reset-after=0"),
        Case::new(
            "slow",
            "POST",
            COMPLETIONS,
            completion(100, false),
            504,
            "upstream_timeout",
            "timeout",
            "/one",
        ),
    ];
    for case in &cases {
        let mut headers = vec![("x-request-id", case.id)];
        headers.extend(case.fault.map(|fault| ("x-mock-fault", fault)));
        let answer = answer_of(send(api, case.method, case.path, &headers, &case.body).await).await;
        let id = case.id;
        assert_eq!(answer.status, case.status, "{id}: {}", answer.body);
        assert_eq!(answer.id.as_deref(), Some(id), "{id}: x-request-id");
        if !case.code.is_empty() {
            assert_eq!(
                answer.body["error"]["code"], case.code,
                "{id}: {}",
                answer.body
            );
            assert!(
                answer.body["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
                "{id}: {}",
                answer.body
            );
        }
    }

    // Saturated: one request holds the only place (its first byte waits a second).
    let held = delayed_completion(api, "held", 1000);
    assert!(
        in_flight_reaches(&router, 1.0).await,
        "the held request never reached the replica"
    );
    let full = answer_of(
        send(
            api,
            "POST",
            COMPLETIONS,
            &[("x-request-id", "full")],
            &completion(1, false),
        )
        .await,
    )
    .await;
    assert_eq!(
        (full.status, full.id.as_deref()),
        (429, Some("full")),
        "{}",
        full.body
    );
    assert_eq!(full.body["error"]["code"], "saturated", "{}", full.body);
    let held = answer_of(held.await.expect("held request")).await;
    assert_eq!((held.status, held.id.as_deref()), (200, Some("held")));

    // A client that leaves before the answer's head: counted against the replica it was sent to.
    let mut gone = TcpStream::connect(api).await.expect("router accepts");
    let body = completion(1, false);
    let head = format!(
        "POST {COMPLETIONS} HTTP/1.1\r\nhost: {api}\r\ncontent-type: application/json\r\n\
         x-request-id: gone\r\nx-mock-fault: first-byte-delay-ms=1000\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    gone.write_all(head.as_bytes()).await.expect("request sent");
    assert!(
        in_flight_reaches(&router, 1.0).await,
        "the request never reached the replica"
    );
    drop(gone);
    assert_router_idle(&router, "after the client left").await;

    let counted = |page: &str, outcome: &str, endpoint: &str| {
        metric_sum(
            page,
            &format!("switchyard_requests_total{{outcome=\"{outcome}\",endpoint=\"{endpoint}\"}}"),
        )
    };
    let disconnected = eventually(Duration::from_secs(5), || async {
        counted(
            &metrics_page(router.metrics).await,
            "client_disconnected",
            "/one",
        ) == 1.0
    })
    .await;
    let page = metrics_page(router.metrics).await;
    assert!(disconnected, "the client that left was not counted\n{page}");
    let mut expected: std::collections::BTreeMap<(&str, &str), f64> = Default::default();
    for case in &cases {
        *expected.entry((case.outcome, case.endpoint)).or_default() += 1.0;
    }
    *expected.entry(("completed", "/one")).or_default() += 1.0; // the held request
    *expected.entry(("saturated", "")).or_default() += 1.0;
    *expected.entry(("client_disconnected", "/one")).or_default() += 1.0;
    for ((outcome, endpoint), count) in &expected {
        assert_eq!(
            counted(&page, outcome, endpoint),
            *count,
            "{outcome} at '{endpoint}'\n{page}"
        );
    }
    assert_eq!(
        metric_sum(&page, "switchyard_requests_total"),
        expected.values().sum::<f64>(),
        "every answer counted exactly once\n{page}"
    );
}

// 3c. A request still unanswered at the drain deadline gets a 503, not a closed connection.

#[tokio::test(flavor = "multi_thread")]
async fn a_request_unanswered_at_the_drain_deadline_gets_503_shutting_down() {
    let replica = start_replica("one", &[]).await;
    let dir = temp_dir("serve-drain-deadline");
    let config = static_config(&[("one", replica.addr.to_string())]);
    let router = start_router(&dir, &config, "drain_timeout_ms = 1000", &[]).await;
    let api = router.api();
    let waiting = delayed_completion(api, "late", 10_000);
    assert!(
        in_flight_reaches(&router, 1.0).await,
        "the request never reached the replica"
    );
    let exit = tokio::task::spawn_blocking(move || {
        let mut router = router;
        let code = router.process.terminate(Duration::from_secs(10));
        (code, router)
    });
    let answer = answer_of(waiting.await.expect("request task")).await;
    let (code, router) = exit.await.expect("terminate thread");
    let log = router_log(&router);
    assert_eq!(answer.status, 503, "{}\n{log}", answer.body);
    assert_eq!(answer.id.as_deref(), Some("late"));
    assert_eq!(
        answer.body["error"]["code"], "shutting_down",
        "{}",
        answer.body
    );
    assert_eq!(code, Some(0), "exit code\n{log}");
}

// 4. The discovery file replaced under load.

fn discovery_yaml(replicas: &[(&str, SocketAddr)]) -> String {
    let mut text = String::from("endpoints:\n");
    for (name, addr) in replicas {
        text.push_str(&format!(
            "  - name: {name}\n    address: \"127.0.0.1\"\n    port: \"{}\"\n",
            addr.port()
        ));
    }
    text
}

/// Replaces `path` atomically: a temporary file renamed over it.
fn replace_file(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).expect("temporary file written");
    std::fs::rename(&tmp, path).expect("renamed over");
}

/// One request of the load loop.
struct Sent {
    started: Instant,
    outcome: Result<(u16, String), String>,
}

#[tokio::test(flavor = "multi_thread")]
async fn a_discovery_file_replaced_under_load_moves_traffic_without_losing_requests() {
    let fast = ["--decode-tokens-per-second", "2000"];
    let a = start_replica("a", &fast).await;
    let b = start_replica("b", &fast).await;
    let c = start_replica("c", &fast).await;
    let dir = temp_dir("serve-discovery");
    let file = dir.join("endpoints.yaml");
    std::fs::write(&file, discovery_yaml(&[("a", a.addr), ("b", b.addr)])).expect("written");
    let config = format!(
        "{QUEUE_PIPELINE}\n[fleet]\ndiscovery_file = \"endpoints.yaml\"\nscrape_interval_ms = 0\n"
    );
    let router = start_router(&dir, &config, "", &[]).await;
    let api = router.api();

    const TASKS: usize = 8;
    const BUDGET: usize = 400;
    let stop = Arc::new(AtomicBool::new(false));
    let budget = Arc::new(AtomicUsize::new(BUDGET));
    let sent = Arc::new(Mutex::new(Vec::<Sent>::new()));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (stop, budget, sent) = (stop.clone(), budget.clone(), sent.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed)
                && budget
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
            {
                let started = Instant::now();
                let outcome =
                    match try_send(api, "POST", COMPLETIONS, &[], &completion(2, false)).await {
                        Ok(response) => {
                            let status = response.status().as_u16();
                            let replica = replica_name(&response);
                            match response.into_body().collect().await {
                                Ok(_) => Ok((status, replica)),
                                Err(e) => Err(format!("body: {e}")),
                            }
                        }
                        Err(e) => Err(e),
                    };
                sent.lock().unwrap().push(Sent { started, outcome });
                // Pacing, so that the budget spans the change and its pickup.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    let served_by = |sent: &Arc<Mutex<Vec<Sent>>>, name: &str, after: Option<Instant>| {
        sent.lock()
            .unwrap()
            .iter()
            .filter(|s| after.is_none_or(|t| s.started >= t))
            .filter(|s| matches!(&s.outcome, Ok((_, r)) if r == name))
            .count()
    };
    let warmed = eventually(Duration::from_secs(10), || async {
        served_by(&sent, "a", None) >= 3 && served_by(&sent, "b", None) >= 3
    })
    .await;
    assert!(warmed, "load never reached both a and b");

    replace_file(&file, &discovery_yaml(&[("b", b.addr), ("c", c.addr)]));
    let changed = Instant::now();
    let settled = changed + Duration::from_millis(1500);
    // Keep the load on until enough requests started after the pickup allowance.
    let enough = eventually(Duration::from_secs(10), || async {
        let after = sent
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.started >= settled)
            .count();
        after >= 60 || budget.load(Ordering::Relaxed) == 0
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("load task");
    }
    assert!(enough, "the load loop stalled");

    let sent = Arc::try_unwrap(sent)
        .ok()
        .expect("tasks done")
        .into_inner()
        .unwrap();
    let total = sent.len();
    assert!(total <= BUDGET);
    let failed: Vec<String> = sent
        .iter()
        .filter_map(|s| match &s.outcome {
            Ok((200, _)) => None,
            Ok((status, replica)) => Some(format!("{status} from '{replica}'")),
            Err(e) => Some(e.clone()),
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {total} requests failed: {failed:?}\n{}",
        failed.len(),
        router_log(&router)
    );
    let late: Vec<&str> = sent
        .iter()
        .filter(|s| s.started >= settled)
        .filter_map(|s| s.outcome.as_ref().ok().map(|(_, r)| r.as_str()))
        .collect();
    assert!(
        late.len() >= 20,
        "only {} requests after the pickup allowance",
        late.len()
    );
    assert!(
        late.iter().all(|r| *r == "b" || *r == "c"),
        "requests after the change reached {late:?}"
    );
    assert!(late.contains(&"c"), "c never got traffic: {late:?}");
    assert_router_idle(&router, "after the load").await;
    assert_eq!(router_metric(&router, "switchyard_endpoints").await, 2.0);

    // Garbage in the file: the last good set stays.
    std::fs::write(&file, "endpoints: [unclosed\n  - {name: x\n").expect("garbage written");
    let noticed = eventually(Duration::from_secs(5), || async {
        router_log(&router).contains("keeping the previous endpoints")
    })
    .await;
    assert!(
        noticed,
        "the router never read the broken file\n{}",
        router_log(&router)
    );
    for i in 0..20 {
        let response = send(api, "POST", COMPLETIONS, &[], &completion(2, false)).await;
        let status = response.status();
        let replica = replica_name(&response);
        let body = body_bytes(response).await;
        assert_eq!(
            status,
            200,
            "request {i} after the broken file: {}",
            String::from_utf8_lossy(&body)
        );
        assert!(
            replica == "b" || replica == "c",
            "request {i} after the broken file reached '{replica}'"
        );
    }
    assert_eq!(router_metric(&router, "switchyard_endpoints").await, 2.0);
    drop(a);
}

// 5. SIGTERM drains.

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_a_running_stream_finish_then_exits_0() {
    let replica = start_replica("slow", &["--decode-tokens-per-second", "20"]).await;
    let dir = temp_dir("serve-sigterm");
    let config = static_config(&[("slow", replica.addr.to_string())]);
    let router = start_router(&dir, &config, "", &[]).await;
    let api = router.api();

    // 20 tokens at 20 per second: about a second of stream.
    let response = send(api, "POST", COMPLETIONS, &[], &completion(20, true)).await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = read_first_event(&mut body).await;
    let signalled = Instant::now();
    let exit = tokio::task::spawn_blocking(move || {
        let mut router = router;
        let code = router.process.terminate(Duration::from_secs(10));
        (code, router)
    });
    // New connections are refused once the signal is handled, while the stream goes on.
    let refusing = eventually(Duration::from_secs(5), || async {
        TcpStream::connect(api).await.is_err()
    })
    .await;
    let (events, end) = read_rest_of_stream(body, first).await;
    let stream_ended = Instant::now();
    let (code, router) = exit.await.expect("terminate thread");
    let log = router_log(&router);

    assert!(refusing, "the router kept accepting while draining\n{log}");
    assert_eq!(end, Ok(()), "the stream was cut: {events:?}\n{log}");
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    assert!(
        events.len() >= 10,
        "the stream was short: {events:?}\n{log}"
    );
    assert!(
        stream_ended.duration_since(signalled) >= Duration::from_millis(300),
        "the stream ended {:?} after the signal; it was not running during the drain",
        stream_ended.duration_since(signalled)
    );
    assert_eq!(code, Some(0), "exit code\n{log}");
    assert!(
        TcpStream::connect(api).await.is_err(),
        "a connection after exit was accepted"
    );
}

// 6. The in-flight limit.

#[tokio::test(flavor = "multi_thread")]
async fn max_in_flight_rejects_with_429_while_full() {
    let replica = start_replica("slow", &["--decode-tokens-per-second", "20"]).await;
    let dir = temp_dir("serve-max-in-flight");
    let config = static_config(&[("slow", replica.addr.to_string())]);
    let router = start_router(&dir, &config, "max_in_flight = 1", &[]).await;
    let api = router.api();

    let response = send(api, "POST", COMPLETIONS, &[], &completion(20, true)).await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = read_first_event(&mut body).await;

    let second = send(api, "POST", COMPLETIONS, &[], &completion(1, false)).await;
    assert_eq!(second.status(), 429);
    let header = |name: &str| {
        second
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let retry_after = header("retry-after");
    assert!(
        retry_after
            .as_deref()
            .is_some_and(|v| v.parse::<u32>().is_ok_and(|s| s >= 1)),
        "Retry-After: {retry_after:?}"
    );
    assert_eq!(
        header("x-llm-d-request-dropped-reason").as_deref(),
        Some("rejected-saturated")
    );
    let error = json(second).await;
    assert_eq!(error["error"]["code"], "saturated", "{error}");

    let (events, end) = read_rest_of_stream(body, first).await;
    assert_eq!(end, Ok(()));
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));

    // The first request released its place when its stream ended.
    for i in 0..3 {
        let response = send(api, "POST", COMPLETIONS, &[], &completion(1, false)).await;
        let status = response.status();
        let body = body_bytes(response).await;
        assert_eq!(
            status,
            200,
            "request {i} after the stream: {}",
            String::from_utf8_lossy(&body)
        );
    }
    let page = metrics_page(router.metrics).await;
    assert_eq!(
        metric_sum(&page, "switchyard_requests_total{outcome=\"saturated\"}"),
        1.0,
        "{page}"
    );
    assert_eq!(metric_sum(&page, "switchyard_in_flight_total"), 0.0);
    // Every text prompt admitted was read into token ids; the refused one was refused first.
    assert_eq!(
        metric_sum(&page, "switchyard_tokenize_duration_seconds_count"),
        4.0,
        "{page}"
    );
}

// 7. The official `openai` Python client.

/// A virtual environment with the `openai` package, made once under the target directory.
fn openai_venv() -> PathBuf {
    let venv = target_dir().join("test-venv");
    let python = venv.join("bin/python");
    let has_openai = |python: &Path| {
        python.exists()
            && Command::new(python)
                .args(["-c", "import openai"])
                .status()
                .is_ok_and(|s| s.success())
    };
    if has_openai(&python) {
        return python;
    }
    let created = Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(&venv)
        .output()
        .expect("python3 runs");
    assert!(
        created.status.success(),
        "python3 -m venv {} failed: {}",
        venv.display(),
        String::from_utf8_lossy(&created.stderr)
    );
    let installed = Command::new(venv.join("bin/pip"))
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "openai",
        ])
        .output()
        .expect("pip runs");
    assert!(
        installed.status.success(),
        "pip install openai failed (is the package index reachable?):\n{}{}",
        String::from_utf8_lossy(&installed.stdout),
        String::from_utf8_lossy(&installed.stderr)
    );
    assert!(
        has_openai(&python),
        "openai does not import after installing"
    );
    python
}

const OPENAI_SCRIPT: &str = r#"
import json, sys
import openai

client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=30)
out = {}

completion = client.completions.create(model="mock-model", prompt="hello there", max_tokens=5)
out["completion"] = {
    "object": completion.object,
    "model": completion.model,
    "text": completion.choices[0].text,
    "finish_reason": completion.choices[0].finish_reason,
    "completion_tokens": completion.usage.completion_tokens,
    "prompt_tokens": completion.usage.prompt_tokens,
}

chunks, content, finish, role = 0, "", None, None
stream = client.chat.completions.create(
    model="mock-model",
    messages=[{"role": "user", "content": "stream something"}],
    max_tokens=8,
    stream=True,
)
for chunk in stream:
    chunks += 1
    if chunk.choices:
        delta = chunk.choices[0].delta
        role = role or delta.role
        content += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
out["chat_stream"] = {"chunks": chunks, "content": content, "finish_reason": finish, "role": role}

out["models"] = [m.id for m in client.models.list()]

try:
    client.completions.create(
        model="mock-model", prompt="x", max_tokens=1, extra_headers={"x-mock-fault": "status=400"}
    )
    out["error"] = None
except openai.APIStatusError as e:
    out["error"] = {"status": e.status_code, "class": type(e).__name__}

print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread")]
#[ignore = "slow tier: installs the openai Python client from PyPI into a virtual environment"]
async fn the_openai_python_client_works_against_the_router() {
    // Installing may take a while the first time; do it before starting processes.
    let python = tokio::task::spawn_blocking(openai_venv)
        .await
        .expect("venv");
    let replica = start_replica("r", &["--decode-tokens-per-second", "2000"]).await;
    let dir = temp_dir("serve-openai");
    let config = static_config(&[("r", replica.addr.to_string())]);
    let router = start_router(&dir, &config, "", &[]).await;
    let script = dir.join("client.py");
    std::fs::write(&script, OPENAI_SCRIPT).expect("script written");
    let base_url = format!("http://{}/v1", router.api());
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(&script)
            .arg(&base_url)
            .output()
            .expect("python runs")
    })
    .await
    .expect("python thread");
    assert!(
        output.status.success(),
        "the openai script failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stderr),
        router_log(&router)
    );
    let result: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "script output is not JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    });

    let completion = &result["completion"];
    assert_eq!(completion["object"], "text_completion", "{result}");
    assert_eq!(completion["model"], "mock-model", "{result}");
    assert_eq!(completion["finish_reason"], "length", "{result}");
    assert_eq!(completion["completion_tokens"], 5, "{result}");
    assert!(
        completion["text"].as_str().is_some_and(|t| !t.is_empty()),
        "{result}"
    );

    let chat = &result["chat_stream"];
    assert!(chat["chunks"].as_u64().is_some_and(|n| n >= 2), "{result}");
    assert!(
        chat["content"].as_str().is_some_and(|t| !t.is_empty()),
        "{result}"
    );
    assert_eq!(chat["finish_reason"], "length", "{result}");
    assert_eq!(chat["role"], "assistant", "{result}");

    assert_eq!(
        result["models"],
        serde_json::json!(["mock-model"]),
        "{result}"
    );
    assert_eq!(
        result["error"],
        serde_json::json!({"status": 400, "class": "BadRequestError"}),
        "{result}"
    );
    assert_router_idle(&router, "after the openai client").await;
}
