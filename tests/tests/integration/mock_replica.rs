//! `switchyard mock-replica` as a separate process on 127.0.0.1: answers, streams, the prefix
//! cache, injected faults and shutdown, seen over real HTTP connections.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use switchyard_tests::live::{
    json, metric, read_events, send, start_replica, try_send, Process, FAST_REPLICA,
};
use tokio::net::TcpStream;

/// Starts a replica at 2000 decode tokens/s with 4-token blocks and waits for `/health`.
async fn start(name: &str) -> Process {
    start_replica(name, FAST_REPLICA).await
}

/// Waits (bounded) for the running count to drop back to zero.
async fn assert_drains(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let running = metric(addr, "vllm:num_requests_running").await;
        let waiting = metric(addr, "vllm:num_requests_waiting").await;
        if running == 0.0 && waiting == 0.0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still {running} running, {waiting} waiting"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn non_streamed_completion_reports_usage() {
    let replica = start("r-usage").await;
    let response = send(
        replica.addr,
        "POST",
        "/v1/completions",
        &[("x-request-id", "req-7")],
        r#"{"model": "test-model", "prompt": "The quick brown fox jumps", "max_tokens": 12}"#,
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-mock-replica"], "r-usage");
    assert_eq!(response.headers()["x-request-id"], "req-7");
    let body = json(response).await;
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], "test-model");
    // 25 bytes at 4 bytes per token.
    assert_eq!(body["usage"]["prompt_tokens"], 7);
    assert_eq!(body["usage"]["completion_tokens"], 12);
    assert_eq!(body["usage"]["total_tokens"], 19);
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert!(!body["choices"][0]["text"].as_str().unwrap_or("").is_empty());
    assert_eq!(
        metric(replica.addr, "vllm:request_success_total").await,
        1.0
    );
    assert_eq!(
        metric(replica.addr, "vllm:generation_tokens_total").await,
        12.0
    );

    let bad = send(replica.addr, "POST", "/v1/completions", &[], "{nope").await;
    assert_eq!(bad.status(), 400);
    assert_eq!(json(bad).await["error"]["code"], 400);
    assert_drains(replica.addr).await;
}

#[tokio::test]
async fn streamed_chat_arrives_in_chunks_ending_in_done() {
    let replica = start("r-stream").await;
    let response = send(
        replica.addr,
        "POST",
        "/v1/chat/completions",
        &[],
        r#"{"model": "test-model", "stream": true, "max_tokens": 60,
            "messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "hello"}]}]}"#,
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert_eq!(response.headers()["x-mock-replica"], "r-stream");
    let (events, end) = read_events(response).await;
    assert_eq!(end, Ok(()));
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk is JSON"))
        .collect();
    let with_content = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"]["content"].is_string())
        .count();
    assert!(with_content >= 3, "only {with_content} content chunks");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    assert_drains(replica.addr).await;
}

#[tokio::test]
async fn a_repeated_prompt_hits_the_prefix_cache() {
    let replica = start("r-cache").await;
    let body = r#"{"model": "test-model", "max_tokens": 4,
                   "prompt": "a shared system prompt that spans several blocks, then a question"}"#;
    let first = json(send(replica.addr, "POST", "/v1/completions", &[], body).await).await;
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let hits_before = metric(replica.addr, "vllm:prefix_cache_hits_total").await;

    let second = json(send(replica.addr, "POST", "/v1/completions", &[], body).await).await;
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens");
    assert!(cached > 0, "{second}");
    let hits_after = metric(replica.addr, "vllm:prefix_cache_hits_total").await;
    assert_eq!(hits_after - hits_before, cached as f64);
    assert!(metric(replica.addr, "vllm:prefix_cache_queries_total").await >= hits_after);
    assert_drains(replica.addr).await;
}

#[tokio::test]
async fn reset_after_two_chunks_cuts_the_stream() {
    let replica = start("r-reset").await;
    let response = send(
        replica.addr,
        "POST",
        "/v1/completions",
        &[("x-mock-fault", "reset-after=2")],
        r#"{"model": "test-model", "prompt": "tell me a long story", "max_tokens": 400,
            "stream": true}"#,
    )
    .await;
    assert_eq!(response.status(), 200);
    let (events, end) = read_events(response).await;
    assert!(end.is_err(), "the stream ended cleanly: {events:?}");
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(!events.iter().any(|e| e == "[DONE]"));
    assert_drains(replica.addr).await;
    assert_eq!(
        metric(replica.addr, "vllm:request_success_total").await,
        0.0
    );

    // The replica keeps serving on new connections.
    let ok = send(
        replica.addr,
        "POST",
        "/v1/completions",
        &[],
        r#"{"prompt": "again", "max_tokens": 2}"#,
    )
    .await;
    assert_eq!(ok.status(), 200);
}

#[tokio::test]
async fn injected_status_and_delay() {
    let replica = start("r-status").await;
    let began = Instant::now();
    let response = send(
        replica.addr,
        "POST",
        "/v1/chat/completions",
        &[("x-mock-fault", "first-byte-delay-ms=150, status=503")],
        r#"{"messages": [{"role": "user", "content": "hi"}]}"#,
    )
    .await;
    assert!(began.elapsed() >= Duration::from_millis(150));
    assert_eq!(response.status(), 503);
    let body = json(response).await;
    assert_eq!(body["error"]["code"], 503);
    assert!(body["error"]["message"].is_string());
    assert!(body["error"]["type"].is_string());
    assert_drains(replica.addr).await;
}

#[tokio::test]
async fn refuse_closes_the_listener_then_recovers() {
    let replica = start("r-refuse").await;
    let response = send(replica.addr, "POST", "/mock/refuse?ms=400", &[], "").await;
    assert_eq!(response.status(), 200);
    let refused = TcpStream::connect(replica.addr).await;
    assert_eq!(
        refused.map(|_| ()).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionRefused)
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(r) = try_send(replica.addr, "GET", "/health", &[], "").await {
            if r.status() == 200 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "never listened again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_drains(replica.addr).await;
}

#[tokio::test]
async fn sigterm_exits_zero() {
    let mut replica = start("r-term").await;
    let pid = replica.child.id().to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = replica.child.try_wait().expect("child status") {
            break status;
        }
        assert!(Instant::now() < deadline, "still running after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status.code(), Some(0));
}
