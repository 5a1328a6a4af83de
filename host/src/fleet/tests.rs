//! The live fleet end to end: a watched discovery file and scrapes of a real HTTP server.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;

use super::tracker::DISCOVERY_POLL;
use super::{FleetState, LiveFleet};
use crate::config::LoadedConfig;

/// Upper bound for anything the fleet should notice; the design needs well under a second.
const DEADLINE: Duration = Duration::from_secs(5);

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "switchyard-fleet-{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn config(dir: &Path, toml: &str) -> LoadedConfig {
    LoadedConfig::parse(&dir.join("switchyard.toml"), toml.to_string()).unwrap()
}

fn ids(state: &FleetState) -> Vec<String> {
    state
        .members
        .iter()
        .map(|m| m.endpoint.id.clone())
        .collect()
}

fn endpoints_file(names: &[&str]) -> String {
    let mut text = String::from("endpoints:\n");
    for (i, name) in names.iter().enumerate() {
        text.push_str(&format!(
            "  - {{name: {name}, namespace: ns, address: 10.0.0.{i}, port: \"8000\", rankIndex: {i}}}\n"
        ));
    }
    text
}

/// Waits until the published state satisfies `done`.
async fn wait_for(fleet: &LiveFleet, what: &str, done: impl Fn(&FleetState) -> bool) {
    let mut receiver = fleet.subscribe();
    let waited = tokio::time::timeout(DEADLINE, receiver.wait_for(|s| done(s))).await;
    assert!(
        matches!(waited, Ok(Ok(_))),
        "timed out waiting for {what}; state: {:?}",
        fleet.current()
    );
}

#[tokio::test]
async fn discovery_file_changes_are_followed() {
    let dir = TempDir::new("watch");
    let file = dir.0.join("endpoints.yaml");
    std::fs::write(&file, endpoints_file(&["a", "b"])).unwrap();
    let fleet = LiveFleet::start(&config(
        &dir.0,
        "[fleet]\ndiscovery_file = \"endpoints.yaml\"\nscrape_interval_ms = 0\n",
    ))
    .await
    .unwrap();
    let first = fleet.current();
    assert_eq!(ids(&first), ["ns/a", "ns/b"]);
    assert_eq!(first.generation, 1);
    assert!(first.ready());
    assert_eq!(first.members[1].endpoint.address, "10.0.0.1:8000");

    // Written aside and renamed over.
    let aside = dir.0.join("endpoints.yaml.tmp");
    std::fs::write(&aside, endpoints_file(&["a", "b", "c"])).unwrap();
    std::fs::rename(&aside, &file).unwrap();
    wait_for(&fleet, "the renamed file", |s| {
        ids(s) == ["ns/a", "ns/b", "ns/c"]
    })
    .await;
    assert_eq!(fleet.current().generation, 2);

    // Rewritten in place.
    std::fs::write(&file, endpoints_file(&["c"])).unwrap();
    wait_for(&fleet, "the edit in place", |s| ids(s) == ["ns/c"]).await;
    let before = fleet.current();

    // Broken, empty and missing files all keep the last good set.
    for broken in ["endpoints: [{name: x", "", "no_endpoints_here: 1"] {
        std::fs::write(&file, broken).unwrap();
        tokio::time::sleep(DISCOVERY_POLL * 2).await;
        let now = fleet.current();
        assert_eq!(ids(&now), ["ns/c"], "after writing {broken:?}");
        assert_eq!(now.generation, before.generation);
    }
    std::fs::remove_file(&file).unwrap();
    tokio::time::sleep(DISCOVERY_POLL * 2).await;
    assert_eq!(fleet.current().generation, before.generation);

    // Back again, and an unchanged rewrite publishes nothing.
    std::fs::write(&file, endpoints_file(&["c"])).unwrap();
    tokio::time::sleep(DISCOVERY_POLL * 2).await;
    assert_eq!(fleet.current().generation, before.generation);
    std::fs::write(&file, endpoints_file(&["d", "c"])).unwrap();
    wait_for(&fleet, "the repaired file", |s| ids(s) == ["ns/d", "ns/c"]).await;
    assert_eq!(fleet.current().generation, before.generation + 1);
}

#[tokio::test]
async fn start_refuses_bad_setups() {
    let dir = TempDir::new("start");
    let missing = LiveFleet::start(&config(&dir.0, "[fleet]\ndiscovery_file = \"nope.yaml\"\n"))
        .await
        .err()
        .unwrap();
    assert!(
        missing.contains("nope.yaml") && missing.contains("cannot open"),
        "{missing}"
    );

    std::fs::write(dir.0.join("bad.yaml"), "endpoints: [").unwrap();
    let bad = LiveFleet::start(&config(&dir.0, "[fleet]\ndiscovery_file = \"bad.yaml\"\n"))
        .await
        .err()
        .unwrap();
    assert!(
        bad.contains("bad.yaml") && bad.contains("not YAML"),
        "{bad}"
    );

    let both = LiveFleet::start(&config(
        &dir.0,
        "[fleet]\ndiscovery_file = \"bad.yaml\"\n\n[[endpoints]]\nname = \"a\"\naddress = \"127.0.0.1:1\"\n",
    ))
    .await
    .err()
    .unwrap();
    assert!(
        both.contains("switchyard.toml") && both.contains("both"),
        "{both}"
    );
}

#[tokio::test]
async fn static_endpoints_without_scraping_carry_config_facts() {
    let dir = TempDir::new("static");
    let fleet = LiveFleet::start(&config(
        &dir.0,
        r#"
[fleet]
scrape_interval_ms = 0

[[endpoints]]
name = "a"
address = "127.0.0.1:1"
role = "decode"
metrics = { waiting_requests = 3, kv_cache_usage = 0.25 }
"#,
    ))
    .await
    .unwrap();
    let state = fleet.current();
    assert!(state.ready());
    let fleet_view = state.fleet();
    let a = &fleet_view.endpoints[0];
    assert_eq!((a.id.as_str(), a.role.as_str()), ("/a", "decode"));
    assert_eq!(a.metrics.waiting_requests, 3);
    assert_eq!(a.metrics.kv_cache_usage, 0.25);
}

const PAGE: &str = "# HELP vllm:num_requests_waiting Requests waiting.\n\
# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{model_name=\"m\"} 3.0\n\
vllm:num_requests_running{model_name=\"m\"} 5.0\n\
vllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n\
vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"2048\"} 1.0\n";

/// Serves `PAGE` on 127.0.0.1 until `failing` is set, then answers 500.
async fn metrics_server(failing: Arc<AtomicBool>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let failing = failing.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_request| {
                    let status = if failing.load(Ordering::SeqCst) {
                        500
                    } else {
                        200
                    };
                    async move {
                        let response = hyper::Response::builder()
                            .status(status)
                            .body(Full::new(Bytes::from_static(PAGE.as_bytes())))
                            .unwrap();
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    address
}

#[tokio::test]
async fn scraped_endpoints_go_stale_when_scrapes_fail() {
    let failing = Arc::new(AtomicBool::new(false));
    let server = metrics_server(failing.clone()).await;
    // A port nobody listens on.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let dir = TempDir::new("scrape");
    let fleet = LiveFleet::start(&config(
        &dir.0,
        &format!(
            r#"
[fleet]
scrape_interval_ms = 20
scrape_timeout_ms = 500
stale_after_ms = 300

[[endpoints]]
name = "up"
address = "{server}"

[[endpoints]]
name = "down"
address = "{closed}"
"#
        ),
    ))
    .await
    .unwrap();
    assert!(!fleet.current().ready(), "nothing is scraped yet");

    wait_for(&fleet, "the first scrape", |s| s.members[0].fresh).await;
    let state = fleet.current();
    assert!(state.ready());
    let up = &state.members[0];
    let m = up.endpoint.metrics;
    assert_eq!((m.waiting_requests, m.running_requests), (3, 5));
    assert_eq!(m.kv_cache_usage, 0.5);
    assert_eq!((m.cache_block_size, m.cache_num_blocks), (16, 2048));
    let down = &state.members[1];
    assert!(!down.fresh);
    assert_eq!(down.endpoint.metrics.waiting_requests, 4);
    assert_eq!(down.endpoint.metrics.kv_cache_usage, 1.0);

    // Steady facts: many scrape rounds, no new state.
    let generation = fleet.current().generation;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(fleet.current().generation, generation);

    failing.store(true, Ordering::SeqCst);
    wait_for(&fleet, "the endpoint to go stale", |s| !s.members[0].fresh).await;
    let state = fleet.current();
    assert!(!state.ready());
    let up = &state.members[0];
    assert_eq!(up.endpoint.metrics.kv_cache_usage, 1.0);
    assert_eq!(up.endpoint.metrics.waiting_requests, 3);
    assert!(up.scrape_failures > 0);
    assert!(up.metrics_age_ms.unwrap() >= 300);

    // Stopping ends the publisher; the last state stays readable.
    let mut receiver = fleet.subscribe();
    fleet.shutdown();
    let ended = tokio::time::timeout(DEADLINE, async {
        while receiver.changed().await.is_ok() {}
    })
    .await;
    assert!(ended.is_ok(), "the publisher did not stop");
    assert!(!fleet.current().members.is_empty());
}
