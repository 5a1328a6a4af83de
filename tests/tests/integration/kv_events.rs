//! KV-cache events end to end: `mock-replica`s publish their caches' stores and evictions in
//! vLLM's wire format over ZMQ, `switchyard serve` subscribes, and the
//! `kv-event-prefix-cache-producer` library keeps its index from them. Every test reads what
//! the index holds (`GET /plugins/state`), what the subscription saw (`GET /kv-events`) and,
//! for routing, how the producer's predictions compared with the replicas' cached tokens
//! (`GET /predictions`). Waits are bounded and wait for a state, never for a duration.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use switchyard_tests::live::{
    binary, eventually, free_port, json, metric_sum, metrics_page, post_ok, send, start_router,
    temp_dir, wait_healthy, word_tokenizer, Process, Router, FAST_REPLICA,
};

const PRODUCER: &str = "kv-event-prefix-cache-producer";
/// The replicas' block size (`FAST_REPLICA`).
const BLOCK: usize = 4;
/// Tokens of a test prompt: 16 full blocks.
const PROMPT: usize = 64;

/// A mock replica publishing KV events, and the ports it publishes on.
struct Publisher {
    process: Process,
    kv_port: u16,
    replay_port: Option<u16>,
}

/// Starts a fast mock replica publishing KV events in `shape` (`array` or `map`), with a
/// replay socket when `replay`, a cache of `cache_blocks` blocks, on the given ports (fresh
/// ones when `None`).
async fn publisher(
    name: &str,
    shape: &str,
    replay: bool,
    cache_blocks: usize,
    ports: Option<(u16, u16, Option<u16>)>,
) -> Publisher {
    publisher_with(name, shape, replay, cache_blocks, ports, &[]).await
}

/// As [`publisher`], with `extra` flags.
async fn publisher_with(
    name: &str,
    shape: &str,
    replay: bool,
    cache_blocks: usize,
    ports: Option<(u16, u16, Option<u16>)>,
    extra: &[&str],
) -> Publisher {
    for _ in 0..50 {
        let (http, kv_port, replay_port) =
            ports.unwrap_or_else(|| (free_port(), free_port(), replay.then(free_port)));
        let mut flags: Vec<String> = FAST_REPLICA.iter().map(|s| s.to_string()).collect();
        flags.extend([
            "--cache-blocks".into(),
            cache_blocks.to_string(),
            "--kv-events-port".into(),
            kv_port.to_string(),
            "--kv-events-format".into(),
            shape.into(),
        ]);
        if let Some(port) = replay_port {
            flags.extend(["--kv-replay-port".into(), port.to_string()]);
        }
        flags.extend(extra.iter().map(|s| s.to_string()));
        let mut child = Command::new(binary())
            .args(["mock-replica", "--port", &http.to_string(), "--name", name])
            .args(&flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mock-replica starts");
        let addr = SocketAddr::from(([127, 0, 0, 1], http));
        if wait_healthy(&mut child, addr, "/health").await.is_ok() {
            return Publisher {
                process: Process { child, addr },
                kv_port,
                replay_port,
            };
        }
        // A port found free was taken meanwhile, or the old process still holds it.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("mock-replica {name} could not start");
}

/// The pipeline: the approximate producer as fallback, the KV-event producer deciding, each
/// replica an endpoint with its own publisher.
fn pipeline(publishers: &[&Publisher], rebuild_ms: u64) -> String {
    pipeline_with(publishers, rebuild_ms, "")
}

/// As [`pipeline`], with `plugins` (TOML `[[plugins]]` entries) listed first.
fn pipeline_with(publishers: &[&Publisher], rebuild_ms: u64, plugins: &str) -> String {
    let mut text = format!(
        r#"
allow_experimental_plugins = true
libraries = ["approx_prefix_cache_producer", "kv_event_prefix_cache_producer", "prefix_cache_scorer"]

[fleet]
scrape_interval_ms = 100

[kv_events]
reconnect_ms = 100
replay_timeout_ms = 2000
idle_reconnect_ms = 300

{plugins}
[[plugins]]
type = "approx-prefix-cache-producer"

[[plugins]]
type = "{PRODUCER}"
[plugins.parameters]
blockSizeTokens = {BLOCK}
rebuildMs = {rebuild_ms}

[[plugins]]
type = "prefix-cache-scorer"
[plugins.parameters]
prefixMatchInfoProducerName = "{PRODUCER}"

[[profiles]]
name = "default"
scorers = [{{ plugin = "prefix-cache-scorer", weight = 1.0 }}]
"#
    );
    for (i, p) in publishers.iter().enumerate() {
        text.push_str(&format!(
            "\n[[endpoints]]\nname = \"r{i}\"\naddress = \"{}\"\nkv_events_endpoint = \"tcp://127.0.0.1:{}\"\n",
            p.process.addr, p.kv_port
        ));
        if let Some(port) = p.replay_port {
            text.push_str(&format!(
                "kv_replay_endpoint = \"tcp://127.0.0.1:{port}\"\n"
            ));
        }
    }
    text
}

/// Token ids `start..start + n`.
fn tokens(start: u32, n: usize) -> Vec<u32> {
    (start..start + n as u32).collect()
}

/// Sends a completion of `prompt` (token ids) straight to `replica`, bypassing the router.
async fn direct(replica: SocketAddr, prompt: &[u32]) -> Value {
    let body = serde_json::json!({"model": "test-model", "prompt": prompt, "max_tokens": 1});
    let response = send(replica, "POST", "/v1/completions", &[], &body.to_string()).await;
    assert_eq!(response.status(), 200);
    json(response).await
}

/// Sends a completion of `prompt` (token ids or text) through the router; returns the replica
/// that answered and the usage it reported.
async fn completed(router: &Router, prompt: Value) -> (String, Value) {
    let body = serde_json::json!({"model": "test-model", "prompt": prompt, "max_tokens": 1});
    let response = post_ok(router.api(), "/v1/completions", &body).await;
    let replica = switchyard_tests::live::replica_name(&response);
    (replica, json(response).await["usage"].clone())
}

/// Sends a completion of `prompt` through the router; returns the replica that answered and
/// the tokens it had cached.
async fn routed(router: &Router, prompt: &[u32]) -> (String, u64) {
    let (replica, usage) = completed(router, prompt.into()).await;
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("usage with cached tokens");
    (replica, cached)
}

async fn kv_stats(router: &Router) -> Vec<Value> {
    let body = json(send(router.admin, "GET", "/kv-events", &[], "").await).await;
    body["endpoints"].as_array().cloned().unwrap_or_default()
}

/// The subscription counters of endpoint `r{i}`.
async fn stats_of(router: &Router, i: usize) -> Value {
    let id = format!("/r{i}");
    kv_stats(router)
        .await
        .into_iter()
        .find(|s| s["endpoint"] == id.as_str())
        .unwrap_or(Value::Null)
}

/// What the producer's index holds for endpoint `r{i}`.
async fn index_of(router: &Router, i: usize) -> Value {
    let states = json(send(router.admin, "GET", "/plugins/state", &[], "").await).await;
    let id = format!("/r{i}");
    states[PRODUCER]["endpoints"]
        .as_array()
        .and_then(|all| all.iter().find(|e| e["id"] == id.as_str()).cloned())
        .unwrap_or(Value::Null)
}

async fn sequenced(replica: SocketAddr) -> u64 {
    let page = switchyard_tests::live::metrics_page(replica).await;
    metric_sum(&page, "mock_kv_event_messages_total") as u64
}

/// Waits until the router has taken every message replica `r{i}` sequenced.
async fn caught_up(router: &Router, i: usize, replica: &Publisher) {
    let target = sequenced(replica.process.addr).await;
    let reached = eventually(Duration::from_secs(10), || async {
        let stats = stats_of(router, i).await;
        target == 0 || stats["applied_seq"].as_u64().map(|s| s + 1) >= Some(target)
    })
    .await;
    assert!(
        reached,
        "the router never took message {target} of r{i}: {}",
        stats_of(router, i).await
    );
}

/// Waits until the router is subscribed to replica `r{i}`: once its socket is connected,
/// publishes empty batches until one arrives.
///
/// Nothing is published before the connection: a publisher drops what it sends with no
/// subscriber, and a router whose first message from a publisher is its third or later
/// rightly takes the index as incomplete (first contact). The first batch after the
/// connection may still be lost while the subscription travels; the router takes a
/// publisher's second message as its start, as it does for publishers counting from 1.
async fn subscribed(router: &Router, i: usize, replica: &Publisher) {
    let connected = eventually(Duration::from_secs(20), || async {
        stats_of(router, i).await["connected"] == true
    })
    .await;
    assert!(
        connected,
        "never connected to r{i}: {}",
        stats_of(router, i).await
    );
    // The subscription follows the connection; most often it has arrived by now.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let reached = eventually(Duration::from_secs(20), || async {
        let _ = send(
            replica.process.addr,
            "POST",
            "/mock/kv-events?flood=1",
            &[],
            "",
        )
        .await;
        stats_of(router, i).await["messages"].as_u64().unwrap_or(0) > 0
    })
    .await;
    assert!(
        reached,
        "never subscribed to r{i}: {}",
        stats_of(router, i).await
    );
    caught_up(router, i, replica).await;
}

fn gpu_blocks(index: &Value) -> u64 {
    index["blocks"]["gpu"].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_reach_the_index_in_both_event_shapes() {
    let array = publisher("r0", "array", false, 1000, None).await;
    let map = publisher("r1", "map", false, 1000, None).await;
    let dir = temp_dir("kv-shapes");
    let router = start_router(&dir, &pipeline(&[&array, &map], 60_000), "", &[]).await;
    for (i, p) in [&array, &map].into_iter().enumerate() {
        subscribed(&router, i, p).await;
        direct(p.process.addr, &tokens(1000 * i as u32, PROMPT)).await;
        caught_up(&router, i, p).await;
        let index = index_of(&router, i).await;
        assert_eq!(gpu_blocks(&index), (PROMPT / BLOCK) as u64, "r{i}: {index}");
        assert_eq!(index["status"], "exact", "r{i}: {index}");
        assert_eq!(index["unknownParents"], 0, "r{i}: {index}");
    }
    // A prompt extending the first one: only its new blocks are stored, chained to the old.
    let longer = tokens(0, PROMPT + 8 * BLOCK);
    direct(array.process.addr, &longer).await;
    caught_up(&router, 0, &array).await;
    assert_eq!(
        gpu_blocks(&index_of(&router, 0).await),
        (PROMPT / BLOCK + 8) as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removals_under_eviction_keep_predictions_within_five_percent_of_cached_tokens() {
    // 24 blocks of cache against prompts of 16: every third prompt evicts.
    let replicas = [
        publisher("r0", "array", true, 24, None).await,
        publisher("r1", "map", true, 24, None).await,
    ];
    let dir = temp_dir("kv-accuracy");
    let router = start_router(
        &dir,
        &pipeline(&[&replicas[0], &replicas[1]], 60_000),
        "",
        &[],
    )
    .await;
    for (i, r) in replicas.iter().enumerate() {
        subscribed(&router, i, r).await;
    }
    // Six prompts sharing a 4-block prefix, in rounds: the caches keep churning.
    let prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|p| {
            let mut prompt = tokens(0, 4 * BLOCK);
            prompt.extend(tokens(10_000 + 1000 * p, PROMPT - 4 * BLOCK));
            prompt
        })
        .collect();
    for round in 0..5 {
        for (p, prompt) in prompts.iter().enumerate() {
            let (replica, _) = routed(&router, prompt).await;
            let i: usize = replica.trim_start_matches('r').parse().expect("r0 or r1");
            caught_up(&router, i, &replicas[i]).await;
            let index = index_of(&router, i).await;
            assert!(
                gpu_blocks(&index) <= 24,
                "round {round} prompt {p}: {index}"
            );
        }
    }
    for i in 0..2 {
        let index = index_of(&router, i).await;
        if index.is_null() {
            // Nothing was routed there.
            continue;
        }
        assert_eq!(index["unknownRemovals"], 0, "{index}");
        assert_eq!(index["unknownParents"], 0, "{index}");
    }
    let predictions = json(send(router.admin, "GET", "/predictions", &[], "").await).await;
    let (mut cached, mut correct) = (0.0, 0.0);
    for entry in predictions["predictions"].as_array().expect("a list") {
        eprintln!(
            "{} on {}: predicted {}, cached {}, correct {}",
            entry["producer"],
            entry["endpoint"],
            entry["predicted_tokens"],
            entry["cached_tokens"],
            entry["correct_tokens"]
        );
        if entry["producer"] == PRODUCER {
            cached += entry["cached_tokens"].as_f64().unwrap_or(0.0);
            correct += entry["correct_tokens"].as_f64().unwrap_or(0.0);
        }
    }
    assert!(cached > 0.0, "the replicas cached something: {predictions}");
    let accuracy = correct / cached;
    eprintln!(
        "precise predictions under eviction: {correct} of {cached} cached tokens ({accuracy:.3})"
    );
    assert!(
        accuracy >= 0.95,
        "predicted {correct} of {cached} cached tokens ({accuracy:.3}): {predictions}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_is_filled_through_the_replay_socket() {
    let replica = publisher("r0", "array", true, 1000, None).await;
    let dir = temp_dir("kv-replay");
    let router = start_router(&dir, &pipeline(&[&replica], 60_000), "", &[]).await;
    subscribed(&router, 0, &replica).await;
    let withhold = send(
        replica.process.addr,
        "POST",
        "/mock/kv-events?withhold=2",
        &[],
        "",
    )
    .await;
    assert_eq!(withhold.status(), 200);
    direct(replica.process.addr, &tokens(0, PROMPT)).await;
    direct(replica.process.addr, &tokens(5000, PROMPT)).await;
    direct(replica.process.addr, &tokens(9000, PROMPT)).await;
    caught_up(&router, 0, &replica).await;
    // The missing messages came back through the replay socket: when the next message
    // showed the gap, or when the subscriber reconnected after a quiet spell.
    let stats = stats_of(&router, 0).await;
    assert!(stats["replays"].as_u64() >= Some(1), "{stats}");
    assert_eq!(stats["lost"], 0, "{stats}");
    let index = index_of(&router, 0).await;
    assert_eq!(gpu_blocks(&index), 3 * (PROMPT / BLOCK) as u64, "{index}");
    assert_eq!(index["status"], "exact", "{index}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_without_replay_rebuilds_from_live_events_and_drops_orphaned_continuations() {
    let replica = publisher("r0", "map", false, 1000, None).await;
    let dir = temp_dir("kv-gap");
    let router = start_router(&dir, &pipeline(&[&replica], 600_000), "", &[]).await;
    subscribed(&router, 0, &replica).await;
    send(
        replica.process.addr,
        "POST",
        "/mock/kv-events?withhold=1",
        &[],
        "",
    )
    .await;
    // Its store is lost...
    direct(replica.process.addr, &tokens(0, PROMPT)).await;
    // ...so this continuation names a parent the index never saw.
    direct(replica.process.addr, &tokens(0, PROMPT + 4 * BLOCK)).await;
    direct(replica.process.addr, &tokens(7000, PROMPT)).await;
    caught_up(&router, 0, &replica).await;
    let stats = stats_of(&router, 0).await;
    assert!(stats["gaps"].as_u64() >= Some(1), "{stats}");
    assert!(stats["lost"].as_u64() >= Some(1), "{stats}");
    let index = index_of(&router, 0).await;
    assert_eq!(index["unknownParents"], 1, "{index}");
    assert_eq!(gpu_blocks(&index), (PROMPT / BLOCK) as u64, "{index}");
    assert_eq!(index["status"]["reason"], "gap", "{index}");
    // The router routes on the estimate meanwhile, and the decision record says so.
    routed(&router, &tokens(7000, PROMPT)).await;
    let decisions = json(send(router.admin, "GET", "/decisions?limit=1", &[], "").await).await;
    let text = decisions.to_string();
    assert!(
        text.contains("estimate from approx-prefix-cache-producer: index incomplete (gap)"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_restart_empties_the_endpoint_and_a_new_shape_is_read() {
    let first = publisher("r0", "array", false, 1000, None).await;
    let dir = temp_dir("kv-restart");
    let router = start_router(&dir, &pipeline(&[&first], 600_000), "", &[]).await;
    subscribed(&router, 0, &first).await;
    direct(first.process.addr, &tokens(0, PROMPT)).await;
    caught_up(&router, 0, &first).await;
    assert_eq!(
        gpu_blocks(&index_of(&router, 0).await),
        (PROMPT / BLOCK) as u64
    );

    let ports = (first.process.addr.port(), first.kv_port, None);
    drop(first);
    // The engine comes back on the same ports, publishing maps now, its cache empty: the
    // subscriber finds it again and sees its sequence start over.
    let second = publisher("r0", "map", false, 1000, Some(ports)).await;
    // A connection made from now on reaches the new publisher.
    let before = stats_of(&router, 0).await["connects"].as_u64().unwrap_or(0);
    let reconnected = eventually(Duration::from_secs(20), || async {
        stats_of(&router, 0).await["connects"].as_u64() > Some(before)
    })
    .await;
    assert!(reconnected, "{}", stats_of(&router, 0).await);
    let restarted = eventually(Duration::from_secs(20), || async {
        let _ = send(
            second.process.addr,
            "POST",
            "/mock/kv-events?flood=1",
            &[],
            "",
        )
        .await;
        stats_of(&router, 0).await["restarts"].as_u64() >= Some(1)
    })
    .await;
    assert!(restarted, "{}", stats_of(&router, 0).await);
    // The restart is counted when the subscriber sees it; the reset reaches the plugin on the
    // feed's own thread, a moment later.
    let emptied = eventually(Duration::from_secs(10), || async {
        gpu_blocks(&index_of(&router, 0).await) == 0
    })
    .await;
    let index = index_of(&router, 0).await;
    assert!(emptied, "the old blocks are gone: {index}");
    direct(second.process.addr, &tokens(3000, PROMPT)).await;
    caught_up(&router, 0, &second).await;
    let index = index_of(&router, 0).await;
    assert_eq!(gpu_blocks(&index), (PROMPT / BLOCK) as u64, "{index}");
    assert_eq!(index["unknownParents"], 0, "{index}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_message_is_counted_and_logged_once_and_the_subscriber_goes_on() {
    let replica = publisher("r0", "array", false, 1000, None).await;
    let dir = temp_dir("kv-malformed");
    let router = start_router(&dir, &pipeline(&[&replica], 60_000), "", &[]).await;
    subscribed(&router, 0, &replica).await;
    for _ in 0..2 {
        let r = send(
            replica.process.addr,
            "POST",
            "/mock/kv-events?malformed",
            &[],
            "",
        )
        .await;
        assert_eq!(r.status(), 200);
    }
    direct(replica.process.addr, &tokens(0, PROMPT)).await;
    caught_up(&router, 0, &replica).await;
    let stats = stats_of(&router, 0).await;
    assert_eq!(stats["malformed"], 2, "{stats}");
    assert_eq!(stats["gaps"], 0, "{stats}");
    assert_eq!(
        gpu_blocks(&index_of(&router, 0).await),
        (PROMPT / BLOCK) as u64
    );
    let log = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
    assert_eq!(log.matches("could not be read").count(), 1, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_that_outruns_the_subscriber_leaves_it_consistent() {
    let replica = publisher("r0", "array", true, 1000, None).await;
    let dir = temp_dir("kv-flood");
    let router = start_router(&dir, &pipeline(&[&replica], 60_000), "", &[]).await;
    subscribed(&router, 0, &replica).await;
    let r = send(
        replica.process.addr,
        "POST",
        "/mock/kv-events?flood=20000",
        &[],
        "",
    )
    .await;
    assert_eq!(r.status(), 200);
    direct(replica.process.addr, &tokens(0, PROMPT)).await;
    caught_up(&router, 0, &replica).await;
    let indexed = eventually(Duration::from_secs(10), || async {
        gpu_blocks(&index_of(&router, 0).await) == (PROMPT / BLOCK) as u64
    })
    .await;
    let stats = stats_of(&router, 0).await;
    assert!(indexed, "{} {stats}", index_of(&router, 0).await);
    // Whatever the publisher dropped for the slow subscriber was replayed or reset.
    assert!(stats["messages"].as_u64() >= Some(1), "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_reset_empties_every_producers_prefix_state() {
    let replica = publisher("r0", "array", false, 1000, None).await;
    let dir = temp_dir("kv-reset");
    let router = start_router(&dir, &pipeline(&[&replica], 60_000), "", &[]).await;
    subscribed(&router, 0, &replica).await;
    let prompt = tokens(0, PROMPT);
    routed(&router, &prompt).await;
    caught_up(&router, 0, &replica).await;
    assert_eq!(
        gpu_blocks(&index_of(&router, 0).await),
        (PROMPT / BLOCK) as u64
    );

    let unknown = send(
        router.admin,
        "POST",
        "/prefix-reset?endpoint=%2Fnone",
        &[],
        "",
    )
    .await;
    assert_eq!(unknown.status(), 404);
    let reset = json(
        send(
            router.admin,
            "POST",
            "/prefix-reset?endpoint=%2Fr0",
            &[],
            "",
        )
        .await,
    )
    .await;
    assert_eq!(reset["reset"], serde_json::json!(["/r0"]), "{reset}");
    let plugins = reset["plugins"].to_string();
    assert!(
        plugins.contains(PRODUCER) && plugins.contains("approx-prefix-cache-producer"),
        "{reset}"
    );
    let index = index_of(&router, 0).await;
    assert_eq!(gpu_blocks(&index), 0, "{index}");
    assert_eq!(index["status"], "exact", "{index}");
    let states = json(send(router.admin, "GET", "/plugins/state", &[], "").await).await;
    assert_eq!(
        states["approx-prefix-cache-producer"]["distinctBlocks"], 0,
        "{states}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_prompt_is_routed_on_the_estimate_and_the_record_says_so() {
    let replica = publisher("r0", "array", false, 1000, None).await;
    let dir = temp_dir("kv-text");
    let router = start_router(&dir, &pipeline(&[&replica], 60_000), "", &[]).await;
    let body = serde_json::json!({"model": "test-model", "prompt": "a prompt sent as text", "max_tokens": 1});
    let response = send(
        router.api(),
        "POST",
        "/v1/completions",
        &[],
        &body.to_string(),
    )
    .await;
    assert_eq!(response.status(), 200);
    let decisions = json(send(router.admin, "GET", "/decisions?limit=1", &[], "").await).await;
    let text = decisions.to_string();
    assert!(
        text.contains("estimate from approx-prefix-cache-producer: a text prompt"),
        "{text}"
    );
    // Token ids the client sent are matched on the index, with no note.
    routed(&router, &tokens(0, PROMPT)).await;
    let decisions = json(send(router.admin, "GET", "/decisions?limit=1", &[], "").await).await;
    assert!(
        !decisions.to_string().contains("a text prompt"),
        "{decisions}"
    );
}

/// Sends a completion of `prompt` through the router as request `id`; returns what the
/// producer's decision record says for `/r0`: its match info, and its note on where the
/// value came from, if any.
async fn predicted(router: &Router, id: &str, prompt: &[u32]) -> (Value, Option<String>) {
    let body = serde_json::json!({"model": "test-model", "prompt": prompt, "max_tokens": 1});
    let response = send(
        router.api(),
        "POST",
        "/v1/completions",
        &[("x-request-id", id)],
        &body.to_string(),
    )
    .await;
    assert_eq!(response.status(), 200);
    let decisions = json(send(router.admin, "GET", "/decisions?limit=10", &[], "").await).await;
    let record = decisions
        .as_array()
        .and_then(|all| all.iter().find(|r| r["id"] == id))
        .unwrap_or_else(|| panic!("no record of {id}: {decisions}"));
    let producer = record["decision"]["producers"]
        .as_array()
        .and_then(|all| all.iter().find(|p| p["name"] == PRODUCER))
        .unwrap_or_else(|| panic!("no {PRODUCER} in {record}"));
    let written = |key: &str| {
        producer["attributes"]
            .as_array()
            .and_then(|all| {
                all.iter()
                    .find(|a| a["endpoint"] == "/r0" && a["key"] == format!("{key}/{PRODUCER}"))
            })
            .map(|a| a["value"].clone())
    };
    let info =
        written("PrefixCacheMatchInfo").unwrap_or_else(|| panic!("no match info in {record}"));
    let note = written("PrefixCacheSource").and_then(|v| v["text"].as_str().map(str::to_owned));
    (info, note)
}

async fn producer_state(router: &Router) -> Value {
    let states = json(send(router.admin, "GET", "/plugins/state", &[], "").await).await;
    states[PRODUCER].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_the_producers_parameters_keeps_its_index_and_predictions() {
    let replica = publisher("r0", "array", false, 1000, None).await;
    let dir = temp_dir("kv-reload-carry");
    let router = start_router(&dir, &pipeline(&[&replica], 60_000), "", &[]).await;
    subscribed(&router, 0, &replica).await;
    let prompt = tokens(0, PROMPT);
    direct(replica.process.addr, &prompt).await;
    direct(replica.process.addr, &tokens(5000, PROMPT)).await;
    caught_up(&router, 0, &replica).await;
    let (before_match, note) = predicted(&router, "before-reload", &prompt).await;
    let full = (PROMPT / BLOCK) as u64;
    assert_eq!(before_match["matchBlocks"], full, "{before_match}");
    assert_eq!(note, None);
    // Whatever the routed request made the replica publish is in before the reload.
    caught_up(&router, 0, &replica).await;
    let before = producer_state(&router).await;
    assert_eq!(
        before["endpoints"][0]["blocks"]["gpu"],
        2 * full,
        "{before}"
    );
    let messages = stats_of(&router, 0).await["messages"].clone();

    // Another default block size and rebuild window: a new instance, which takes the index
    // over. The endpoint keeps the block size its events told.
    let path = dir.join("serve.toml");
    let config = std::fs::read_to_string(&path).expect("config");
    let changed = config
        .replace("blockSizeTokens = 4", "blockSizeTokens = 16")
        .replace("rebuildMs = 60000", "rebuildMs = 50000");
    assert_ne!(changed, config);
    std::fs::write(&path, changed).unwrap();
    let reloaded = json(send(router.admin, "POST", "/reload", &[], "").await).await;
    assert_eq!(reloaded["result"], "applied", "{reloaded}");
    let carried = reloaded["carried"].as_array().cloned().unwrap_or_default();
    assert!(carried.iter().any(|c| c == PRODUCER), "{reloaded}");
    assert_eq!(reloaded["fresh"], serde_json::json!({}), "{reloaded}");

    // No event in between: the successor holds what its predecessor held, still exact.
    let after = producer_state(&router).await;
    assert_eq!(stats_of(&router, 0).await["messages"], messages);
    assert_eq!(after, before);
    assert_eq!(after["endpoints"][0]["status"], "exact", "{after}");
    let (after_match, note) = predicted(&router, "after-reload", &prompt).await;
    assert_eq!(after_match, before_match);
    assert_eq!(note, None, "the exact index answered, not the estimate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_adds_a_producer_marks_its_new_index_incomplete() {
    let replica = publisher("r0", "array", false, 1000, None).await;
    let dir = temp_dir("kv-reload");
    let router = start_router(&dir, &pipeline(&[&replica], 60_000), "", &[]).await;
    subscribed(&router, 0, &replica).await;
    direct(replica.process.addr, &tokens(0, PROMPT)).await;
    caught_up(&router, 0, &replica).await;
    assert_eq!(index_of(&router, 0).await["status"], "exact");

    // A second instance under a new name: it saw none of the events so far.
    let path = dir.join("serve.toml");
    let config = std::fs::read_to_string(&path).expect("config");
    let scorer = "[[plugins]]\ntype = \"prefix-cache-scorer\"";
    assert!(config.contains(scorer));
    let late = format!(
        "[[plugins]]\nname = \"late\"\ntype = \"{PRODUCER}\"\n\
         [plugins.parameters]\nblockSizeTokens = {BLOCK}\n\n{scorer}"
    );
    std::fs::write(&path, config.replace(scorer, &late)).unwrap();
    let reloaded = json(send(router.admin, "POST", "/reload", &[], "").await).await;
    assert_eq!(reloaded["result"], "applied", "{reloaded}");
    assert!(
        reloaded["created"].to_string().contains("late"),
        "{reloaded}"
    );
    direct(replica.process.addr, &tokens(5000, PROMPT)).await;
    caught_up(&router, 0, &replica).await;
    let states = json(send(router.admin, "GET", "/plugins/state", &[], "").await).await;
    let index = &states[format!("late ({PRODUCER})").as_str()]["endpoints"][0];
    assert_eq!(index["status"]["reason"], "new-instance", "{states}");
    assert_eq!(gpu_blocks(index), (PROMPT / BLOCK) as u64, "{states}");
    // The instance that was there keeps its exact index.
    let kept = index_of(&router, 0).await;
    assert_eq!(kept["status"], "exact", "{kept}");
    assert_eq!(gpu_blocks(&kept), 2 * (PROMPT / BLOCK) as u64, "{kept}");
}

/// The `token-producer` reading the test tokenizer, written next to the router's config.
const TOKENIZER_PRODUCER: &str = "[[plugins]]\ntype = \"token-producer\"\n\
     [plugins.parameters]\ntokenizer = { path = \"tokenizer.json\" }\n";

/// Six texts of `PROMPT` tokens with the tokenizer above (`<s>` and 63 words of 5 bytes each,
/// so the 4-bytes-per-token estimate makes about 79 of them): a 4-block prefix in common.
fn text_prompts() -> Vec<String> {
    let words = |start: usize, n: usize| -> Vec<String> {
        (start..start + n).map(|i| format!("w{i}")).collect()
    };
    (0..6)
        .map(|p| {
            let mut prompt = words(100, 4 * BLOCK - 1);
            prompt.extend(words(200 + 100 * p, PROMPT - 4 * BLOCK));
            prompt.join(" ")
        })
        .collect()
}

/// Sends a text completion through the router; returns the index of the replica that
/// answered and the usage it reported.
async fn routed_text(router: &Router, prompt: &str) -> (usize, Value) {
    let (replica, usage) = completed(router, prompt.into()).await;
    (replica_index(&replica), usage)
}

/// 0 for `r0`, 1 for `r1`.
fn replica_index(replica: &str) -> usize {
    replica.trim_start_matches('r').parse().expect("r0 or r1")
}

/// The KV-event producer's predictions over every endpoint: predicted, cached and correct
/// tokens.
async fn precise_totals(router: &Router) -> (f64, f64, f64) {
    let predictions = json(send(router.admin, "GET", "/predictions", &[], "").await).await;
    let mut totals = (0.0, 0.0, 0.0);
    for entry in predictions["predictions"].as_array().expect("a list") {
        if entry["producer"] == PRODUCER {
            totals.0 += entry["predicted_tokens"].as_f64().unwrap_or(0.0);
            totals.1 += entry["cached_tokens"].as_f64().unwrap_or(0.0);
            totals.2 += entry["correct_tokens"].as_f64().unwrap_or(0.0);
        }
    }
    totals
}

/// Replicas r0 (array events) and r1 (map events, both with replay) of `cache_blocks` blocks
/// each, tokenizing with the test tokenizer, and a router over them with `plugins` listed first,
/// subscribed to both. With `chat_template`, a `tokenizer_config.json` holding it (BOS `<s>`)
/// lies beside the tokenizer, for the replicas and the router alike.
async fn tokenizing_fleet(
    tag: &str,
    cache_blocks: usize,
    plugins: &str,
    chat_template: Option<&str>,
) -> ([Publisher; 2], Router) {
    let dir = temp_dir(tag);
    let file = word_tokenizer(&dir);
    if let Some(template) = chat_template {
        let config = serde_json::json!({"chat_template": template,
            "bos_token": {"content": "<s>"}, "eos_token": "</s>"});
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string())
            .expect("tokenizer_config.json written");
    }
    let flags = ["--tokenizer", file.as_str()];
    let replicas = [
        publisher_with("r0", "array", true, cache_blocks, None, &flags).await,
        publisher_with("r1", "map", true, cache_blocks, None, &flags).await,
    ];
    let config = pipeline_with(&[&replicas[0], &replicas[1]], 60_000, plugins);
    let router = start_router(&dir, &config, "", &[]).await;
    for (i, r) in replicas.iter().enumerate() {
        subscribed(&router, i, r).await;
    }
    (replicas, router)
}

/// The last 30 decisions estimated nothing, and the KV-event producer's predictions over all
/// of them have precision and recall of 95% or more; `what` names the run in the figures.
async fn predicted_exactly(router: &Router, what: &str) {
    let decisions = json(send(router.admin, "GET", "/decisions?limit=30", &[], "").await).await;
    assert_eq!(decisions.as_array().map(Vec::len), Some(30));
    let text = decisions.to_string();
    assert!(!text.contains("estimate"), "nothing was estimated: {text}");
    let (predicted, cached, correct) = precise_totals(router).await;
    let (precision, recall) = (correct / predicted, correct / cached);
    eprintln!(
        "{what}: predicted {predicted}, cached {cached}, correct {correct} \
         (precision {precision:.3}, recall {recall:.3})"
    );
    assert!(cached > 0.0 && predicted > 0.0, "the caches were hit");
    assert!(precision >= 0.95, "precision {precision:.3}");
    assert!(recall >= 0.95, "recall {recall:.3}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_tokenized_with_the_engines_tokenizer_is_predicted_exactly() {
    // 24 blocks of cache against prompts of 16: the caches churn.
    let (replicas, router) = tokenizing_fleet("kv-tokenizer", 24, TOKENIZER_PRODUCER, None).await;
    let prompts = text_prompts();
    for round in 0..5 {
        for (p, prompt) in prompts.iter().enumerate() {
            let (i, usage) = routed_text(&router, prompt).await;
            // The replica counted the tokenizer's tokens, not the estimate's.
            assert_eq!(usage["prompt_tokens"], PROMPT, "round {round} prompt {p}");
            caught_up(&router, i, &replicas[i]).await;
        }
    }
    predicted_exactly(&router, "text with the tokenizer").await;

    // Without a chat template beside the tokenizer, chat keeps the estimate, and the record
    // says why.
    let chat = serde_json::json!({"model": "test-model", "max_tokens": 1,
        "messages": [{"role": "user", "content": prompts[0]}]});
    post_ok(router.api(), "/v1/chat/completions", &chat).await;
    let decisions = json(send(router.admin, "GET", "/decisions?limit=1", &[], "").await).await;
    let text = decisions.to_string();
    assert!(text.contains("estimated: chat: no chat template"), "{text}");
    assert!(
        text.contains("estimate from approx-prefix-cache-producer: a text prompt"),
        "{text}"
    );
}

/// A chat template as Hugging Face writes them: BOS, each message as its role then its
/// content, the assistant's turn opened. With the test tokenizer a role is `<unk>`.
const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\n\
    {{ message['role'] }} {{ message['content'] | trim }}\n\
    {% endfor %}\n\
    {% if add_generation_prompt %}assistant{% endif %}";

/// Six chats of `PROMPT` tokens once rendered (`<s>`, the system role and 13 words, the user
/// role and 47 words, the assistant role): a system prompt and the user's role in common, 4
/// blocks.
fn chats() -> Vec<Value> {
    let words = |start: usize, n: usize| -> String {
        let words: Vec<String> = (start..start + n).map(|i| format!("w{i}")).collect();
        words.join(" ")
    };
    (0..6)
        .map(|p| {
            serde_json::json!([
                {"role": "system", "content": words(100, 4 * BLOCK - 3)},
                {"role": "user", "content": words(200 + 100 * p, PROMPT - 4 * BLOCK - 1)},
            ])
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_rendered_through_the_engines_chat_template_is_predicted_exactly() {
    let (replicas, router) =
        tokenizing_fleet("kv-chat", 24, TOKENIZER_PRODUCER, Some(CHAT_TEMPLATE)).await;
    let chats = chats();
    for round in 0..5 {
        for (p, messages) in chats.iter().enumerate() {
            let body = serde_json::json!({"model": "test-model", "max_tokens": 1,
                "messages": messages});
            let response = post_ok(router.api(), "/v1/chat/completions", &body).await;
            let i = replica_index(&switchyard_tests::live::replica_name(&response));
            let usage = json(response).await["usage"].clone();
            // The replica rendered the template and counted the tokenizer's tokens.
            assert_eq!(usage["prompt_tokens"], PROMPT, "round {round} chat {p}");
            caught_up(&router, i, &replicas[i]).await;
        }
    }
    predicted_exactly(&router, "chat with the chat template").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_without_a_tokenizer_is_marked_estimated_and_mispredicted() {
    let (replicas, router) = tokenizing_fleet("kv-no-tokenizer", 1000, "", None).await;
    for _ in 0..3 {
        for prompt in &text_prompts() {
            let (i, _) = routed_text(&router, prompt).await;
            caught_up(&router, i, &replicas[i]).await;
        }
    }
    let decisions = json(send(router.admin, "GET", "/decisions?limit=1", &[], "").await).await;
    let text = decisions.to_string();
    assert!(
        text.contains("estimated: no tokenizer configured"),
        "{text}"
    );
    assert!(
        text.contains("estimate from approx-prefix-cache-producer: a text prompt"),
        "{text}"
    );
    // The estimate counts about 79 tokens where the engines count 64: what the fallback
    // predicts for the KV-event producer is not what the replicas cached.
    let (predicted, cached, correct) = precise_totals(&router).await;
    eprintln!(
        "text without the tokenizer: predicted {predicted}, cached {cached}, correct {correct}"
    );
    assert!(cached > 0.0, "the caches were hit");
    assert!(
        correct / predicted < 0.9,
        "precision {:.3} of the estimate",
        correct / predicted
    );
}

/// `pipeline`'s text with the KV-event producer's `inFlightBlocks` set.
fn pipeline_counting(publishers: &[&Publisher], in_flight_blocks: bool) -> String {
    let text = pipeline(publishers, 60_000);
    let counting = text.replace(
        "rebuildMs = 60000\n",
        &format!("rebuildMs = 60000\ninFlightBlocks = {in_flight_blocks}\n"),
    );
    assert_ne!(
        counting, text,
        "the producer's parameters are where this test expects them"
    );
    counting
}

/// Sends a completion of `prompt` to `addr` on a task of its own, answered when it is done.
fn completion_on_its_own(
    addr: SocketAddr,
    prompt: Vec<u32>,
    max_tokens: u32,
) -> tokio::task::JoinHandle<hyper::Response<hyper::body::Incoming>> {
    let body =
        serde_json::json!({"model": "test-model", "prompt": prompt, "max_tokens": max_tokens});
    tokio::spawn(async move { post_ok(addr, "/v1/completions", &body).await })
}

/// Waits (bounded) until the mock replica at `addr` reports the gauge `name` at 1 or more.
async fn gauge_reaches_one(addr: SocketAddr, name: &str) -> bool {
    eventually(Duration::from_secs(10), || async {
        metric_sum(&metrics_page(addr).await, name) >= 1.0
    })
    .await
}

/// A request routed to r0, which holds the first half of its prompt, waits there unprefilled
/// behind a long request; a second request for the same prompt is routed meanwhile. Returns
/// the request keys the producer counted for the first on r0 and the blocks it predicted r0
/// to hold for the second.
async fn second_of_a_queued_pair(in_flight_blocks: bool) -> (u64, u64) {
    // One running sequence each, so a request sent while a replica is busy waits unprefilled.
    let extra = ["--max-running", "1"];
    let replicas = [
        publisher_with("r0", "array", false, 1000, None, &extra).await,
        publisher_with("r1", "array", false, 1000, None, &extra).await,
    ];
    let dir = temp_dir(&format!("kv-in-flight-{in_flight_blocks}"));
    let config = pipeline_counting(&[&replicas[0], &replicas[1]], in_flight_blocks);
    let router = start_router(&dir, &config, "", &[]).await;
    for (i, p) in replicas.iter().enumerate() {
        subscribed(&router, i, p).await;
    }
    let prompt = tokens(7000, PROMPT);
    direct(replicas[0].process.addr, &prompt[..PROMPT / 2]).await;
    caught_up(&router, 0, &replicas[0]).await;
    // r0 busy with a long request sent past the router: 0.75 s of decode on 375 of its 1000
    // blocks, so it runs rather than waits for room.
    let busy = completion_on_its_own(replicas[0].process.addr, tokens(50_000, 8), 1500);
    assert!(
        gauge_reaches_one(replicas[0].process.addr, "vllm:num_requests_running").await,
        "the long request never ran"
    );
    let first = completion_on_its_own(router.api(), prompt.clone(), 1);
    // Routed to r0 (half its prompt is there) and waiting: nothing of it stored yet.
    assert!(
        gauge_reaches_one(replicas[0].process.addr, "vllm:num_requests_waiting").await,
        "the first request never waited at r0"
    );
    let keys = index_of(&router, 0).await["inFlightKeys"]
        .as_u64()
        .unwrap_or(0);
    let (info, _) = predicted(&router, "second", &prompt).await;
    let first = first.await.expect("first answered");
    assert_eq!(switchyard_tests::live::replica_name(&first), "r0");
    busy.await.expect("long request answered");
    (keys, info["matchBlocks"].as_u64().unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_queued_unprefilled_counts_its_blocks_for_the_next_on_its_replica() {
    let whole = (PROMPT / BLOCK) as u64;
    let (keys, matched) = second_of_a_queued_pair(true).await;
    assert_eq!(
        keys,
        whole / 2,
        "the queued request's blocks its replica lacked, counted"
    );
    assert_eq!(
        matched, whole,
        "the second request finds the whole prompt on r0"
    );
    // Without the count the index knows only the half r0's engine announced.
    let (keys, matched) = second_of_a_queued_pair(false).await;
    assert_eq!((keys, matched), (0, whole / 2));
}
