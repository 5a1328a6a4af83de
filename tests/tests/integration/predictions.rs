//! Prefix predictions checked against what replicas report: `switchyard serve` with the
//! approximate prefix producer in front of two `mock-replica`s. A repeated prompt is predicted
//! whole and found whole; a replica replaced behind the router's back (same port, empty and
//! smaller cache) makes the producer's belief wrong, which the counters, `GET /predictions`,
//! the journal and one drift warning show.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use switchyard_tests::live::{
    binary, endpoints_toml, eventually, fast_replicas, json, metric_sum, metrics_page, read_events,
    replica_name, send, start_router, temp_dir, wait_healthy, Process, Router, FAST_REPLICA,
};

const PRODUCER: &str = "approx-prefix-cache-producer";
/// 512 bytes of text: 128 tokens at the host's 4 bytes per token, so two of the producer's
/// 64-token blocks and 32 of the replicas' 4-token blocks, every one full.
const PROMPT_TOKENS: u64 = 128;
/// Blocks of the replacement replica's cache: it keeps a prompt's first 8 blocks (its cache
/// inserts a chain so that the prefix outlives the blocks extending it), 32 tokens.
const SMALL_CACHE_BLOCKS: u64 = 8;
const SMALL_CACHE_TOKENS: u64 = SMALL_CACHE_BLOCKS * 4;
/// The drift rule's window (live/predictions.rs).
const DRIFT_WINDOW: u64 = 50;

/// The approximate producer alone decides, on its own fixed 64-token blocks (the replicas'
/// reported block size and capacity are not used, so its belief changes only by dispatch).
fn pipeline(replicas: &[Process]) -> String {
    format!(
        r#"
allow_experimental_plugins = true
libraries = ["approx_prefix_cache_producer", "prefix_cache_scorer"]

[fleet]
scrape_interval_ms = 100

[[plugins]]
type = "{PRODUCER}"
[plugins.parameters]
autoTune = false
blockSizeTokens = 64

[[plugins]]
type = "prefix-cache-scorer"
[plugins.parameters]
prefixMatchInfoProducerName = "{PRODUCER}"

[[profiles]]
name = "default"
scorers = [{{ plugin = "prefix-cache-scorer", weight = 1.0 }}]

{}"#,
        endpoints_toml(replicas)
    )
}

fn prompt() -> String {
    "The same long system prompt, sent again and again. "
        .repeat(11)
        .chars()
        .take(512)
        .collect()
}

fn completion(stream: Option<bool>) -> String {
    let mut body = serde_json::json!({"model": "test-model", "prompt": prompt(), "max_tokens": 1});
    if let Some(include_usage) = stream {
        body["stream"] = true.into();
        body["stream_options"] = serde_json::json!({"include_usage": include_usage});
    }
    body.to_string()
}

/// Sends the prompt; returns the replica that answered and the cached tokens it reported
/// (`None` for a stream without usage).
async fn ask(router: &Router, stream: Option<bool>) -> (String, Option<u64>) {
    let response = send(
        router.api(),
        "POST",
        "/v1/completions",
        &[],
        &completion(stream),
    )
    .await;
    assert_eq!(response.status(), 200);
    let replica = replica_name(&response);
    let cached = match stream {
        None => json(response).await["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Some(_) => {
            let (events, end) = read_events(response).await;
            end.expect("the stream ends cleanly");
            events
                .iter()
                .filter_map(|e| serde_json::from_str::<Value>(e).ok())
                .find_map(|e| e["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64())
        }
    };
    (replica, cached)
}

/// The four counters of the producer on `endpoint`: checked requests, predicted, cached and
/// correct tokens.
fn counters(page: &str, endpoint: &str) -> [f64; 4] {
    let series = |family: &str| {
        metric_sum(
            page,
            &format!("{family}{{producer=\"{PRODUCER}\",endpoint=\"{endpoint}\"}}"),
        )
    };
    [
        series("switchyard_prefix_checked_requests_total"),
        series("switchyard_prefix_predicted_tokens_total"),
        series("switchyard_prefix_cached_tokens_total"),
        series("switchyard_prefix_correct_tokens_total"),
    ]
}

/// Waits (bounded) until the counters on `endpoint` are `expected`; the router counts a
/// request when it has relayed the end of its body, a moment after the client read it.
async fn assert_counters(router: &Router, endpoint: &str, expected: [u64; 4]) {
    let expected = expected.map(|v| v as f64);
    let reached = eventually(Duration::from_secs(5), || async {
        counters(&metrics_page(router.metrics).await, endpoint) == expected
    })
    .await;
    let page = metrics_page(router.metrics).await;
    assert!(
        reached,
        "expected {expected:?} on {endpoint}, got {:?}\n{page}",
        counters(&page, endpoint)
    );
}

async fn predictions(router: &Router) -> Value {
    json(send(router.admin, "GET", "/predictions", &[], "").await).await
}

/// Starts a mock replica named `name` on `addr`'s port (taken a moment ago by the replica it
/// replaces) with a cache of `SMALL_CACHE_BLOCKS` blocks.
async fn replace(name: &str, addr: SocketAddr) -> Process {
    let mut flags: Vec<String> = FAST_REPLICA.iter().map(|s| s.to_string()).collect();
    flags.extend(["--cache-blocks".into(), SMALL_CACHE_BLOCKS.to_string()]);
    for _ in 0..50 {
        let mut child = Command::new(binary())
            .args([
                "mock-replica",
                "--port",
                &addr.port().to_string(),
                "--name",
                name,
            ])
            .args(&flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mock-replica starts");
        if wait_healthy(&mut child, addr, "/health").await.is_ok() {
            return Process { child, addr };
        }
        // The port may still be held for a moment after the old replica exited.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no replacement replica could listen on {addr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predictions_are_checked_against_cached_tokens_and_drift_is_logged_once() {
    let mut replicas = fast_replicas(2, &[]).await;
    let dir = temp_dir("predictions");
    let journal = dir.join("journal.jsonl");
    let router = start_router(
        &dir,
        &pipeline(&replicas),
        "",
        &["--journal", journal.to_str().expect("utf-8 path")],
    )
    .await;

    // First sight of the prompt: nothing predicted anywhere, nothing cached.
    let (first, cached) = ask(&router, None).await;
    assert_eq!(cached, Some(0));
    let endpoint = format!("/{first}");
    assert_counters(&router, &endpoint, [1, 0, 0, 0]).await;

    // Again, streamed with usage: the producer predicts the whole prompt on the replica it sent
    // it to, and that replica reports it cached, in the stream's usage chunk.
    let (second, cached) = ask(&router, Some(true)).await;
    assert_eq!(second, first, "the prefix scorer follows the prediction");
    assert_eq!(cached, Some(PROMPT_TOKENS));
    assert_counters(
        &router,
        &endpoint,
        [2, PROMPT_TOKENS, PROMPT_TOKENS, PROMPT_TOKENS],
    )
    .await;
    let shown = predictions(&router).await;
    let entries = shown["predictions"].as_array().expect("a list").clone();
    assert_eq!(entries.len(), 1, "{shown}");
    let entry = &entries[0];
    assert_eq!(entry["producer"], PRODUCER);
    assert_eq!(entry["endpoint"], endpoint.as_str());
    assert_eq!(entry["checked_requests"], 2);
    assert_eq!(entry["precision"], 1.0);
    assert_eq!(entry["recall"], 1.0);
    assert_eq!(entry["drifting"], false);

    // A stream without usage cannot be checked: counted apart, the totals unchanged.
    let (third, cached) = ask(&router, Some(false)).await;
    assert_eq!((third.as_str(), cached), (first.as_str(), None));
    let unchecked = eventually(Duration::from_secs(5), || async {
        metric_sum(
            &metrics_page(router.metrics).await,
            "switchyard_prefix_unchecked_requests_total",
        ) == 1.0
    })
    .await;
    assert!(unchecked, "{}", metrics_page(router.metrics).await);
    assert_counters(
        &router,
        &endpoint,
        [2, PROMPT_TOKENS, PROMPT_TOKENS, PROMPT_TOKENS],
    )
    .await;

    // The replica is replaced on the same port by one with an empty cache of 8 blocks; the
    // producer still believes the whole prompt is there.
    let index: usize = first[1..].parse().expect("replicas are named r<i>");
    let addr = replicas[index].addr;
    assert_eq!(replicas[index].terminate(Duration::from_secs(10)), Some(0));
    replicas[index] = replace(&first, addr).await;

    // First request: nothing cached. Then the replica keeps the prompt's first 8 blocks only.
    let (after, cached) = ask(&router, None).await;
    assert_eq!((after.as_str(), cached), (first.as_str(), Some(0)));
    let wrong = DRIFT_WINDOW;
    for i in 1..wrong {
        let (replica, cached) = ask(&router, None).await;
        assert_eq!(replica, first, "request {i} after the replacement");
        assert_eq!(
            cached,
            Some(SMALL_CACHE_TOKENS),
            "request {i} after the replacement"
        );
    }
    let cached_total = PROMPT_TOKENS + (wrong - 1) * SMALL_CACHE_TOKENS;
    assert_counters(
        &router,
        &endpoint,
        [
            2 + wrong,
            PROMPT_TOKENS * (1 + wrong),
            cached_total,
            cached_total,
        ],
    )
    .await;
    let page = metrics_page(router.metrics).await;
    assert_eq!(
        metric_sum(
            &page,
            &format!(
                "switchyard_prefix_prediction_drifting{{producer=\"{PRODUCER}\",endpoint=\"{endpoint}\"}}"
            )
        ),
        1.0,
        "{page}"
    );

    let shown = predictions(&router).await;
    let entry = &shown["predictions"][0];
    let precision = entry["precision"].as_f64().expect("a precision");
    let expected = cached_total as f64 / (PROMPT_TOKENS * (1 + wrong)) as f64;
    assert!((precision - expected).abs() < 1e-9, "{shown}");
    assert!(precision < 0.5, "{shown}");
    assert_eq!(
        entry["recall"], 1.0,
        "never more cached than predicted: {shown}"
    );
    assert_eq!(entry["drifting"], true, "{shown}");
    assert_eq!(entry["window"]["checked_requests"], DRIFT_WINDOW, "{shown}");

    // The warning is logged once, however many wrong predictions follow.
    for _ in 0..5 {
        ask(&router, None).await;
    }
    let log = std::fs::read_to_string(dir.join("serve.log")).expect("serve log");
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("prefix predictions drifted"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains(&endpoint) && warnings[0].contains(PRODUCER),
        "{log}"
    );

    // The journal's lines carry each check.
    let expected_line = serde_json::json!({
        "endpoint": endpoint,
        "predicted_tokens": {PRODUCER: PROMPT_TOKENS},
        "cached_tokens": SMALL_CACHE_TOKENS,
    });
    let journaled = eventually(Duration::from_secs(5), || async {
        std::fs::read_to_string(&journal)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["prefix_check"] == expected_line)
            .count()
            >= (wrong - 1) as usize
    })
    .await;
    assert!(
        journaled,
        "{}",
        std::fs::read_to_string(&journal).unwrap_or_default()
    );
}
