//! `switchyard serve` against slow, idle and malformed clients on 127.0.0.1: heads and bodies
//! that stall, kept-alive connections left idle, the connection cap, and heads hyper refuses
//! before any route sees them. Timeouts are a few hundred milliseconds; the tests check what
//! the router does at them, not how fast.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use switchyard_tests::live::{
    assert_router_idle, binary, eventually, free_port, metric_sum, metrics_page, send,
    start_replica, start_router, temp_dir, wait_healthy, Process, Router, QUEUE_PIPELINE,
    START_ATTEMPTS,
};
use switchyard_tests::plugin_dir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Every connection timeout of the routers below, in milliseconds.
const TIMEOUT_MS: u64 = 400;

const BODY: &str = "{\"model\": \"mock-model\", \"prompt\": \"slow clients\", \"max_tokens\": 2}";

/// A router in front of one fast replica, with `serve_table` added to `[serve]`.
async fn router(tag: &str, serve_table: &str) -> (Process, Router) {
    let replica = start_replica("r0", &["--decode-tokens-per-second", "2000"]).await;
    let config = format!(
        "[[endpoints]]\nname = \"r0\"\naddress = \"{}\"\n\n{QUEUE_PIPELINE}\n[fleet]\nscrape_interval_ms = 0\n",
        replica.addr
    );
    let router = start_router(&temp_dir(tag), &config, serve_table, &[]).await;
    (replica, router)
}

fn short_timeouts() -> String {
    format!(
        "header_timeout_ms = {TIMEOUT_MS}\nbody_idle_timeout_ms = {TIMEOUT_MS}\n\
         keepalive_idle_timeout_ms = {TIMEOUT_MS}\n"
    )
}

fn completion_head(addr: SocketAddr, length: usize) -> String {
    format!(
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {length}\r\n\r\n"
    )
}

fn completion_request(addr: SocketAddr) -> String {
    format!("{}{BODY}", completion_head(addr, BODY.len()))
}

/// One response read off a raw connection.
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_string())
        })
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {}\n{}",
                self.head,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The OpenAI-shaped error's code, after checking the shape.
    fn error_code(&self) -> String {
        let body = self.json();
        assert_eq!(
            self.header("content-type").as_deref(),
            Some("application/json"),
            "{}",
            self.head
        );
        let error = &body["error"];
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
        assert_eq!(error["type"], "invalid_request_error", "{body}");
        error["code"].as_str().unwrap_or_default().to_string()
    }
}

/// Reads from `stream` into `seen` until `done` holds; `None` if the connection ends first.
async fn read_until(
    stream: &mut TcpStream,
    seen: &mut Vec<u8>,
    done: impl Fn(&[u8]) -> bool,
) -> Option<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buffer = [0u8; 8192];
    while !done(seen) {
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, stream.read(&mut buffer))
            .await
            .expect("the router answers or closes within 10 s")
            .unwrap_or(0);
        if n == 0 {
            return None;
        }
        seen.extend_from_slice(&buffer[..n]);
    }
    Some(())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads one response (content-length or chunked body); `seen` keeps what follows it.
async fn read_answer(stream: &mut TcpStream, seen: &mut Vec<u8>) -> Option<Answer> {
    read_until(stream, seen, |s| find(s, b"\r\n\r\n").is_some()).await?;
    let end = find(seen, b"\r\n\r\n").expect("a head") + 4;
    let head = String::from_utf8_lossy(&seen[..end]).into_owned();
    seen.drain(..end);
    let status = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not a status line: {head}"));
    let mut answer = Answer {
        status,
        head,
        body: Vec::new(),
    };
    if let Some(length) = answer.header("content-length") {
        let length: usize = length.parse().expect("a length");
        read_until(stream, seen, |s| s.len() >= length).await?;
        answer.body = seen.drain(..length).collect();
    } else if answer
        .header("transfer-encoding")
        .is_some_and(|t| t.contains("chunked"))
    {
        loop {
            read_until(stream, seen, |s| find(s, b"\r\n").is_some()).await?;
            let line_end = find(seen, b"\r\n").expect("a chunk size");
            let size_text = String::from_utf8_lossy(&seen[..line_end]).into_owned();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .unwrap_or_else(|_| panic!("not a chunk size: {size_text:?}"));
            read_until(stream, seen, |s| s.len() >= line_end + 2 + size + 2).await?;
            answer
                .body
                .extend_from_slice(&seen[line_end + 2..line_end + 2 + size]);
            seen.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break;
            }
        }
    }
    Some(answer)
}

/// Whether the router closes `stream` within 10 s, reading (and discarding) what it sends.
async fn closed_by_router(stream: &mut TcpStream) -> bool {
    let mut seen = Vec::new();
    read_until(stream, &mut seen, |_| false).await.is_none()
}

async fn router_metric(router: &Router, name: &str) -> f64 {
    metric_sum(&metrics_page(router.metrics).await, name)
}

async fn assert_no_connections_open(router: &Router, what: &str) {
    let none = eventually(Duration::from_secs(10), || async {
        router_metric(router, "switchyard_connections_open").await == 0.0
    })
    .await;
    assert!(none, "{what}\n{}", metrics_page(router.metrics).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_head_that_stalls_gets_408_and_a_silent_connection_is_closed() {
    let (_replica, router) = router("conn-head", &short_timeouts()).await;

    // The router's clock starts when it accepts the connection: measured from before the
    // connect, the answer can come no sooner than the timeout however slow the test runs.
    let started = Instant::now();
    let mut stalled = TcpStream::connect(router.api()).await.expect("connects");
    stalled
        .write_all(b"POST /v1/completions HTTP/1.1\r\nhost: router\r\n")
        .await
        .expect("part of a head");
    let mut seen = Vec::new();
    let answer = read_answer(&mut stalled, &mut seen)
        .await
        .expect("a 408 before the close");
    assert!(
        started.elapsed() >= Duration::from_millis(TIMEOUT_MS),
        "answered before header_timeout_ms"
    );
    assert_eq!(answer.status, 408, "{}", answer.head);
    assert_eq!(answer.error_code(), "header_timeout");
    assert!(answer.header("x-request-id").is_some(), "{}", answer.head);
    assert!(closed_by_router(&mut stalled).await, "still open after 408");

    // A connection that never sends a byte is closed without an answer.
    let mut silent = TcpStream::connect(router.api()).await.expect("connects");
    let mut seen = Vec::new();
    assert!(read_until(&mut silent, &mut seen, |_| false)
        .await
        .is_none());
    assert!(seen.is_empty(), "{}", String::from_utf8_lossy(&seen));

    let page = metrics_page(router.metrics).await;
    assert_eq!(
        metric_sum(
            &page,
            "switchyard_connections_closed_total{reason=\"header_timeout\"}"
        ),
        2.0,
        "{page}"
    );
    // Only the connection that sent part of a head got an answer, counted as a request.
    assert_eq!(
        metric_sum(
            &page,
            "switchyard_requests_total{outcome=\"header_timeout\",endpoint=\"\"}"
        ),
        1.0,
        "{page}"
    );
    // A head that arrives in pieces, each well within the timeout, is served.
    let mut steady = TcpStream::connect(router.api()).await.expect("connects");
    let request = completion_request(router.api());
    let (first, rest) = request.split_at(20);
    steady
        .write_all(first.as_bytes())
        .await
        .expect("first part");
    tokio::time::sleep(Duration::from_millis(TIMEOUT_MS / 4)).await;
    steady.write_all(rest.as_bytes()).await.expect("the rest");
    let mut seen = Vec::new();
    let answer = read_answer(&mut steady, &mut seen).await.expect("answer");
    assert_eq!(answer.status, 200, "{}", answer.head);
    drop(steady);

    assert_router_idle(&router, "after the stalled heads").await;
    assert_no_connections_open(&router, "after the stalled heads").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_steady_body_is_served_and_a_stalled_one_gets_408() {
    let (_replica, router) = router("conn-body", &short_timeouts()).await;
    let addr = router.api();

    // Eight pieces, a quarter of the timeout apart: twice the timeout in all.
    let mut slow = TcpStream::connect(addr).await.expect("connects");
    let started = Instant::now();
    slow.write_all(completion_head(addr, BODY.len()).as_bytes())
        .await
        .expect("head");
    for piece in BODY.as_bytes().chunks(BODY.len().div_ceil(8)) {
        tokio::time::sleep(Duration::from_millis(TIMEOUT_MS / 4)).await;
        slow.write_all(piece).await.expect("a piece of the body");
    }
    let mut seen = Vec::new();
    let answer = read_answer(&mut slow, &mut seen).await.expect("an answer");
    assert!(started.elapsed() > Duration::from_millis(TIMEOUT_MS));
    assert_eq!(
        answer.status,
        200,
        "{}{}",
        answer.head,
        String::from_utf8_lossy(&answer.body)
    );
    assert!(answer.json()["choices"].is_array());
    drop(slow);

    // Half the body, then nothing.
    let mut stalled = TcpStream::connect(addr).await.expect("connects");
    stalled
        .write_all(completion_head(addr, BODY.len()).as_bytes())
        .await
        .expect("head");
    stalled
        .write_all(&BODY.as_bytes()[..BODY.len() / 2])
        .await
        .expect("half a body");
    let mut seen = Vec::new();
    let answer = read_answer(&mut stalled, &mut seen).await.expect("a 408");
    assert_eq!(answer.status, 408, "{}", answer.head);
    assert_eq!(answer.error_code(), "body_timeout");
    assert!(answer.header("x-request-id").is_some(), "{}", answer.head);
    assert!(closed_by_router(&mut stalled).await, "still open after 408");

    let page = metrics_page(router.metrics).await;
    assert_eq!(
        metric_sum(
            &page,
            "switchyard_connections_closed_total{reason=\"body_timeout\"}"
        ),
        1.0,
        "{page}"
    );
    assert_eq!(
        metric_sum(&page, "switchyard_requests_total{outcome=\"body_timeout\"}"),
        1.0,
        "{page}"
    );
    assert_eq!(
        metric_sum(&page, "switchyard_requests_total{outcome=\"completed\"}"),
        1.0,
        "{page}"
    );
    assert_router_idle(&router, "after the slow bodies").await;
    assert_no_connections_open(&router, "after the slow bodies").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kept_alive_connections_serve_pipelined_requests_and_close_when_idle() {
    let (_replica, router) = router("conn-idle", &short_timeouts()).await;
    let addr = router.api();

    let mut stream = TcpStream::connect(addr).await.expect("connects");
    let mut seen = Vec::new();
    // Two requests in one write, then a third after a pause shorter than the idle timeout.
    let pipelined = format!("{}{}", completion_request(addr), completion_request(addr));
    stream.write_all(pipelined.as_bytes()).await.expect("sent");
    for i in 0..2 {
        let answer = read_answer(&mut stream, &mut seen)
            .await
            .unwrap_or_else(|| panic!("pipelined answer {i}"));
        assert_eq!(answer.status, 200, "{i}: {}", answer.head);
    }
    tokio::time::sleep(Duration::from_millis(TIMEOUT_MS / 2)).await;
    stream
        .write_all(completion_request(addr).as_bytes())
        .await
        .expect("sent");
    let answer = read_answer(&mut stream, &mut seen)
        .await
        .expect("answer after a short pause");
    assert_eq!(answer.status, 200, "{}", answer.head);

    // Then idle: closed without an answer, not before the idle timeout.
    let idle_from = Instant::now();
    assert!(read_until(&mut stream, &mut seen, |_| false)
        .await
        .is_none());
    assert!(idle_from.elapsed() >= Duration::from_millis(TIMEOUT_MS));
    assert!(seen.is_empty(), "{}", String::from_utf8_lossy(&seen));

    let page = metrics_page(router.metrics).await;
    assert_eq!(
        metric_sum(
            &page,
            "switchyard_connections_closed_total{reason=\"idle_timeout\"}"
        ),
        1.0,
        "{page}"
    );
    assert_eq!(
        metric_sum(&page, "switchyard_requests_total{outcome=\"completed\"}"),
        3.0,
        "{page}"
    );
    assert_router_idle(&router, "after the idle connection").await;
    assert_no_connections_open(&router, "after the idle connection").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn at_the_connection_cap_new_clients_wait_for_a_free_slot() {
    let (_replica, router) = router(
        "conn-cap",
        "max_connections = 4\nheader_timeout_ms = 20000\nkeepalive_idle_timeout_ms = 20000\n",
    )
    .await;
    let addr = router.api();

    // Four kept-alive connections, each after one request.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut stream = TcpStream::connect(addr).await.expect("connects");
        stream
            .write_all(completion_request(addr).as_bytes())
            .await
            .expect("sent");
        let answer = read_answer(&mut stream, &mut Vec::new())
            .await
            .expect("answer");
        assert_eq!(answer.status, 200, "{}", answer.head);
        held.push(stream);
    }
    assert_eq!(
        router_metric(&router, "switchyard_connections_open").await,
        4.0
    );

    let waiting =
        tokio::spawn(async move { send(addr, "POST", "/v1/completions", &[], BODY).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "a fifth connection was served");
    let page = metrics_page(router.metrics).await;
    assert_eq!(
        metric_sum(&page, "switchyard_connection_cap_reached_total"),
        1.0,
        "{page}"
    );
    assert_eq!(metric_sum(&page, "switchyard_connections_open"), 4.0);
    let log = std::fs::read_to_string(router.dir.join("serve.log")).unwrap_or_default();
    assert_eq!(
        log.matches("wait in the backlog").count(),
        1,
        "one log line for the episode:\n{log}"
    );

    drop(held.pop());
    let response = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("served once a slot freed")
        .expect("the client task");
    assert_eq!(response.status(), 200);
    drop(response);
    drop(held);

    assert_router_idle(&router, "after the cap").await;
    assert_no_connections_open(&router, "after the cap").await;
    // The router still serves.
    let response = send(addr, "POST", "/v1/completions", &[], BODY).await;
    assert_eq!(response.status(), 200);
}

/// Sends `bytes` on a new connection and reads the answer, which must close the connection.
async fn refused(addr: SocketAddr, bytes: &[u8]) -> Answer {
    let mut stream = TcpStream::connect(addr).await.expect("connects");
    stream.write_all(bytes).await.expect("sent");
    let mut seen = Vec::new();
    let answer = read_answer(&mut stream, &mut seen)
        .await
        .expect("an answer");
    assert!(
        closed_by_router(&mut stream).await,
        "still open after {}",
        answer.status
    );
    answer
}

#[tokio::test(flavor = "multi_thread")]
async fn heads_hyper_refuses_get_json_errors() {
    let (_replica, router) = router("conn-refused", &short_timeouts()).await;
    let addr = router.api();

    // The start of a TLS ClientHello on the plain port.
    let mut hello = vec![
        0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03,
    ];
    hello.extend_from_slice(&[0x42; 64]);
    let answer = refused(addr, &hello).await;
    assert_eq!(answer.status, 400, "{}", answer.head);
    assert_eq!(answer.error_code(), "malformed_request");
    assert!(answer.header("x-request-id").is_some(), "{}", answer.head);

    let long_target = format!(
        "GET /v1/models?q={} HTTP/1.1\r\nhost: router\r\n\r\n",
        "a".repeat(70_000)
    );
    let answer = refused(addr, long_target.as_bytes()).await;
    assert_eq!(answer.status, 414, "{}", answer.head);
    assert_eq!(answer.error_code(), "uri_too_long");

    let mut many_headers = String::from("GET /v1/models HTTP/1.1\r\nhost: router\r\n");
    for i in 0..120 {
        many_headers.push_str(&format!("x-header-{i}: {i}\r\n"));
    }
    many_headers.push_str("\r\n");
    let answer = refused(addr, many_headers.as_bytes()).await;
    assert_eq!(answer.status, 431, "{}", answer.head);
    assert_eq!(answer.error_code(), "head_too_large");

    // After a served request on the same connection, a broken head is refused the same way.
    let mut stream = TcpStream::connect(addr).await.expect("connects");
    let mut bytes = completion_request(addr).into_bytes();
    bytes.extend_from_slice(b"NOT HTTP AT ALL\r\n\r\n");
    stream.write_all(&bytes).await.expect("sent");
    let mut seen = Vec::new();
    let first = read_answer(&mut stream, &mut seen).await.expect("answer");
    assert_eq!(first.status, 200, "{}", first.head);
    assert!(first.json()["choices"].is_array());
    let second = read_answer(&mut stream, &mut seen).await.expect("answer");
    assert_eq!(second.status, 400, "{}", second.head);
    assert_eq!(second.error_code(), "malformed_request");
    assert!(closed_by_router(&mut stream).await);

    let page = metrics_page(router.metrics).await;
    for (status, count) in [("400", 2.0), ("414", 1.0), ("431", 1.0)] {
        assert_eq!(
            metric_sum(
                &page,
                &format!("switchyard_rejected_heads_total{{status=\"{status}\"}}")
            ),
            count,
            "{status}\n{page}"
        );
    }
    assert_eq!(
        metric_sum(
            &page,
            "switchyard_requests_total{outcome=\"bad_request\",endpoint=\"\"}"
        ),
        4.0,
        "every refused head is an answer, counted once\n{page}"
    );
    assert_router_idle(&router, "after the refused heads").await;
    assert_no_connections_open(&router, "after the refused heads").await;
}

/// The soft and hard `Max open files` of a process, from `/proc/<pid>/limits`.
fn open_file_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits readable");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("an open-file line");
    let mut fields = line["Max open files".len()..].split_whitespace();
    (
        fields.next().expect("soft").to_string(),
        fields.next().expect("hard").to_string(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_router_raises_a_low_open_file_limit_to_the_hard_limit() {
    let replica = start_replica("r0", &[]).await;
    let dir = temp_dir("open-files");
    let config = dir.join("serve.toml");
    let log = dir.join("serve.log");
    let mut last = String::new();
    let mut started = None;
    // Free ports can be taken by another test before serve binds them: retry as `start_router`.
    for _ in 0..START_ATTEMPTS {
        let (api, metrics) = (free_port(), free_port());
        std::fs::write(
            &config,
            format!(
                "[[endpoints]]\nname = \"r0\"\naddress = \"{}\"\n\n{QUEUE_PIPELINE}\n[fleet]\nscrape_interval_ms = 0\n[serve]\n\
                 listen = \"127.0.0.1:{api}\"\nmetrics_listen = \"127.0.0.1:{metrics}\"\n\
                 admin_listen = \"\"\n",
                replica.addr
            ),
        )
        .expect("config written");
        // Started with a soft limit of 1024 (the common default), whatever the test runs with.
        let child = std::process::Command::new("sh")
            .arg("-c")
            .arg("ulimit -Sn 1024 && exec \"$0\" serve --config \"$1\" --plugin-dir \"$2\"")
            .arg(binary())
            .arg(&config)
            .arg(plugin_dir())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("serve starts");
        let mut router = Process {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], api)),
        };
        let probe = SocketAddr::from(([127, 0, 0, 1], metrics));
        match wait_healthy(&mut router.child, probe, "/health").await {
            Ok(()) => {
                started = Some(router);
                break;
            }
            Err(status) => {
                last = format!(
                    "{status}\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            }
        }
    }
    let router = started
        .unwrap_or_else(|| panic!("serve exited early {START_ATTEMPTS} times, last: {last}"));
    let (soft, hard) = open_file_limits(router.pid());
    assert_eq!(soft, hard, "soft open-file limit of serve");
}
