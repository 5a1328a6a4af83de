//! Reloading the config of a running `switchyard serve` in place: on SIGHUP and through the
//! admin API's `POST /reload`, a changed weight changes decisions and bumps the generation,
//! a broken config is refused and counted while the running pipeline keeps serving, an
//! unchanged producer keeps its in-flight charges across a reload, and a plugin library file
//! overwritten with `cp` under the running router neither crashes it nor changes what runs
//! until a reload picks the new bytes up.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use switchyard_tests::live::{
    eventually, fast_replicas, json, metric_sum, metrics_page, replica_name, send, start_replica,
    start_router, temp_dir, Process, Router,
};
use switchyard_tests::plugin_dir;

const COMPLETIONS: &str = "/v1/completions";

fn completion() -> String {
    r#"{"model": "test-model", "prompt": "reload me", "max_tokens": 1}"#.to_string()
}

/// Two endpoints the two scorers rank in opposite orders (scraping off, so the facts are the
/// config's): `r0` has the shorter queue, `r1` the emptier KV cache.
fn opposed_endpoints(replicas: &[Process]) -> String {
    format!(
        "[fleet]\nscrape_interval_ms = 0\n\n\
         [[endpoints]]\nname = \"r0\"\naddress = \"{}\"\n\
         metrics = {{ waiting_requests = 0, kv_cache_usage = 0.9 }}\n\n\
         [[endpoints]]\nname = \"r1\"\naddress = \"{}\"\n\
         metrics = {{ waiting_requests = 10, kv_cache_usage = 0.0 }}\n",
        replicas[0].addr, replicas[1].addr
    )
}

/// A pipeline whose choice between the opposed endpoints follows the two weights.
fn weighted_pipeline(queue: f64, kv: f64) -> String {
    format!(
        r#"
[[plugins]]
type = "queue-scorer"
[[plugins]]
type = "kv-cache-utilization-scorer"
[[plugins]]
type = "max-score-picker"
[[profiles]]
name = "default"
scorers = [
    {{ plugin = "queue-scorer", weight = {queue:.1} }},
    {{ plugin = "kv-cache-utilization-scorer", weight = {kv:.1} }},
]
picker = "max-score-picker"
"#
    )
}

/// The replica that answered one request.
async fn served_by(router: &Router) -> String {
    let response = send(router.api(), "POST", COMPLETIONS, &[], &completion()).await;
    assert_eq!(response.status(), 200);
    replica_name(&response)
}

/// Rewrites the router's config file, keeping its `[serve]` table (written last).
fn rewrite(router: &Router, pipeline: &str) {
    let path = router.dir.join("serve.toml");
    let text = std::fs::read_to_string(&path).expect("config");
    let serve = &text[text.rfind("\n[serve]").expect("a [serve] table")..];
    std::fs::write(&path, format!("{pipeline}\n{serve}")).expect("config written");
}

fn hang_up(router: &Router) {
    let status = Command::new("kill")
        .args(["-HUP", &router.process.pid().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

async fn router_metric(router: &Router, name: &str) -> f64 {
    metric_sum(&metrics_page(router.metrics).await, name)
}

/// Whether the router's metric `name` reaches `value` within 10 s.
async fn reaches(router: &Router, name: &str, value: f64) -> bool {
    eventually(Duration::from_secs(10), || async {
        router_metric(router, name).await == value
    })
    .await
}

fn log(router: &Router) -> String {
    std::fs::read_to_string(router.dir.join("serve.log")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_changed_weight_and_refuses_a_broken_config() {
    let replicas = fast_replicas(2, &[]).await;
    let dir = temp_dir("reload-sighup");
    let endpoints = opposed_endpoints(&replicas);
    let router = start_router(
        &dir,
        &format!("{endpoints}{}", weighted_pipeline(2.0, 1.0)),
        "",
        &[],
    )
    .await;
    assert_eq!(
        router_metric(&router, "switchyard_config_generation").await,
        1.0
    );
    assert_eq!(served_by(&router).await, "r0", "the queue weighs more");

    rewrite(
        &router,
        &format!("{endpoints}{}", weighted_pipeline(1.0, 2.0)),
    );
    hang_up(&router);
    assert!(
        reaches(&router, "switchyard_config_generation", 2.0).await,
        "the reload was not applied\n{}",
        log(&router)
    );
    assert_eq!(
        router_metric(
            &router,
            "switchyard_config_reloads_total{result=\"applied\"}"
        )
        .await,
        1.0
    );
    for _ in 0..3 {
        assert_eq!(
            served_by(&router).await,
            "r1",
            "the KV cache weighs more now"
        );
    }

    rewrite(
        &router,
        &format!("{endpoints}{}", weighted_pipeline(1.0, 2.0))
            .replace("queue-scorer\"\n", "no-such-scorer\"\n"),
    );
    hang_up(&router);
    assert!(
        reaches(
            &router,
            "switchyard_config_reloads_total{result=\"refused\"}",
            1.0
        )
        .await,
        "the broken config was not refused\n{}",
        log(&router)
    );
    assert_eq!(
        router_metric(&router, "switchyard_config_generation").await,
        2.0
    );
    assert_eq!(
        served_by(&router).await,
        "r1",
        "the running pipeline keeps serving"
    );
    let log = log(&router);
    assert!(
        log.contains("refused") && log.contains("no-such-scorer"),
        "the refusal and its reason are logged:\n{log}"
    );
}

/// A completion whose replica waits `delay_ms` before answering, in a task.
fn held_completion(
    router: &Router,
    id: &'static str,
    delay_ms: u64,
) -> tokio::task::JoinHandle<u16> {
    let api = router.api();
    tokio::spawn(async move {
        let fault = format!("first-byte-delay-ms={delay_ms}");
        let headers = [("x-mock-fault", fault.as_str()), ("x-request-id", id)];
        send(api, "POST", COMPLETIONS, &headers, &completion())
            .await
            .status()
            .as_u16()
    })
}

/// The `openRequests` the in-flight producer reports in `/plugins/state`.
async fn open_requests(router: &Router) -> i64 {
    let state = json(send(router.admin, "GET", "/plugins/state", &[], "").await).await;
    state["inflight-load-producer"]["openRequests"]
        .as_i64()
        .unwrap_or_else(|| panic!("no openRequests in {state}"))
}

fn in_flight_pipeline(threshold: u32) -> String {
    format!(
        r#"
[[plugins]]
type = "inflight-load-producer"
[[plugins]]
type = "load-aware-scorer"
parameters = {{ threshold = {threshold} }}
[[plugins]]
type = "queue-scorer"
[[profiles]]
name = "default"
scorers = [
    {{ plugin = "load-aware-scorer", weight = 1.0 }},
    {{ plugin = "queue-scorer", weight = 1.0 }},
]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_reload_keeps_unchanged_producers_and_their_charges() {
    let replica = start_replica("r0", &["--model", "test-model"]).await;
    let dir = temp_dir("reload-admin");
    let endpoints = format!(
        "[fleet]\nscrape_interval_ms = 0\n\n[[endpoints]]\nname = \"r0\"\naddress = \"{}\"\n",
        replica.addr
    );
    let router = start_router(
        &dir,
        &format!("{endpoints}{}", in_flight_pipeline(10)),
        "",
        &[],
    )
    .await;
    let held: Vec<_> = ["held-1", "held-2", "held-3"]
        .into_iter()
        .map(|id| held_completion(&router, id, 1500))
        .collect();
    assert!(reaches(&router, "switchyard_in_flight_total", 3.0).await);
    assert_eq!(open_requests(&router).await, 3);

    rewrite(&router, &format!("{endpoints}{}", in_flight_pipeline(20)));
    let response = send(router.admin, "POST", "/reload", &[], "").await;
    assert_eq!(response.status(), 200);
    let result = json(response).await;
    assert_eq!(result["result"], "applied", "{result}");
    assert_eq!(result["generation"], 2, "{result}");
    let listed = |key: &str| -> Vec<String> {
        result[key]
            .as_array()
            .unwrap_or_else(|| panic!("no {key} in {result}"))
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect()
    };
    assert!(
        listed("kept").contains(&"inflight-load-producer".to_string()),
        "{result}"
    );
    assert!(
        listed("kept").contains(&"queue-scorer".to_string()),
        "{result}"
    );
    assert!(
        listed("created").contains(&"load-aware-scorer".to_string()),
        "{result}"
    );
    assert_eq!(
        open_requests(&router).await,
        3,
        "the kept producer still holds the charges of the requests in flight"
    );

    for task in held {
        assert_eq!(task.await.expect("request task"), 200);
    }
    assert!(reaches(&router, "switchyard_in_flight_total", 0.0).await);
    assert_eq!(
        open_requests(&router).await,
        0,
        "requests placed before the reload released their charges on completion"
    );
    assert_eq!(served_by(&router).await, "r0");
    assert_eq!(open_requests(&router).await, 0);

    rewrite(&router, &format!("{endpoints}{}", in_flight_pipeline(0)));
    let response = send(router.admin, "POST", "/reload", &[], "").await;
    assert_eq!(response.status(), 409);
    let refusal = json(response).await;
    assert_eq!(refusal["result"], "refused", "{refusal}");
    assert_eq!(refusal["generation"], 2, "{refusal}");
    assert!(
        refusal["reason"]
            .as_str()
            .is_some_and(|r| r.contains("threshold")),
        "{refusal}"
    );
    let status = json(send(router.admin, "GET", "/reload", &[], "").await).await;
    assert_eq!(status["generation"], 2, "{status}");
    assert_eq!(status["applied"], 1, "{status}");
    assert_eq!(status["refused"], 1, "{status}");
    assert_eq!(
        router_metric(
            &router,
            "switchyard_config_reloads_total{result=\"refused\"}"
        )
        .await,
        1.0
    );
    assert_eq!(served_by(&router).await, "r0");
}

fn sha256_of(path: &Path) -> String {
    let output = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum runs");
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .expect("a digest")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_overwritten_in_place_keeps_running_until_a_reload_loads_the_new_bytes() {
    let replicas = fast_replicas(2, &[]).await;
    let dir = temp_dir("reload-library");
    let name = switchyard::config::library_file_name("approx_prefix_cache_producer");
    let library = dir.join(&name);
    std::fs::copy(plugin_dir().join(&name), &library).expect("library copied");
    // Another build of the same library: the same code with bytes appended, which the loader
    // ignores but the digest does not.
    let other = dir.join("other-build");
    let mut bytes = std::fs::read(&library).expect("library read");
    bytes.extend_from_slice(b"another build");
    std::fs::write(&other, &bytes).expect("other build written");
    let config = format!(
        "allow_experimental_plugins = true\nlibraries = [\"{}\"]\n{}\n{}",
        library.display(),
        opposed_endpoints(&replicas),
        r#"
[[plugins]]
type = "approx-prefix-cache-producer"
[[plugins]]
type = "queue-scorer"
"#
    );
    let router = start_router(&dir, &config, "", &[]).await;
    let first = sha256_of(&library);
    let info = |digest: &str| {
        format!(
            "switchyard_plugin_library_info{{library=\"{}\",digest=\"{digest}\"}}",
            library.canonicalize().expect("path").display()
        )
    };
    assert_eq!(
        router_metric(&router, &info(&first)).await,
        1.0,
        "{}",
        metrics_page(router.metrics).await
    );

    // Overwrite the file the router loaded, in place, while requests run through its code.
    let load = {
        let api = router.api();
        tokio::spawn(async move {
            for _ in 0..40 {
                let response = send(api, "POST", COMPLETIONS, &[], &completion()).await;
                assert_eq!(response.status(), 200);
            }
        })
    };
    let copied = Command::new("cp")
        .arg(&other)
        .arg(&library)
        .status()
        .expect("cp runs");
    assert!(copied.success());
    load.await.expect("requests through the overwrite");
    assert_eq!(
        served_by(&router).await,
        "r0",
        "still serving after the overwrite"
    );
    assert_eq!(
        router_metric(&router, &info(&first)).await,
        1.0,
        "the old bytes run until a reload"
    );

    hang_up(&router);
    assert!(
        reaches(&router, "switchyard_config_generation", 2.0).await,
        "the reload was not applied\n{}",
        log(&router)
    );
    let second = sha256_of(&library);
    assert_ne!(first, second);
    let page = metrics_page(router.metrics).await;
    assert_eq!(metric_sum(&page, &info(&second)), 1.0, "{page}");
    assert_eq!(metric_sum(&page, &info(&first)), 0.0, "{page}");
    let plugins = json(send(router.admin, "GET", "/plugins", &[], "").await).await;
    let producer = plugins
        .as_array()
        .and_then(|all| {
            all.iter()
                .find(|p| p["type"] == "approx-prefix-cache-producer")
        })
        .unwrap_or_else(|| panic!("no producer in {plugins}"));
    assert_eq!(producer["library_sha256"], second.as_str(), "{plugins}");
    for _ in 0..5 {
        assert_eq!(served_by(&router).await, "r0");
    }
}

fn carrying_pipeline(estimate_output: bool, lru_capacity: u32) -> String {
    format!(
        r#"
[[plugins]]
type = "inflight-load-producer"
parameters = {{ addEstimatedOutputTokens = {estimate_output} }}
[[plugins]]
type = "approx-prefix-cache-producer"
parameters = {{ lruCapacityPerServer = {lru_capacity}, autoTune = false }}
[[plugins]]
type = "load-aware-scorer"
[[plugins]]
type = "prefix-cache-scorer"
parameters = {{ prefixMatchInfoProducerName = "approx-prefix-cache-producer" }}
[[profiles]]
name = "default"
scorers = [
    {{ plugin = "load-aware-scorer", weight = 1.0 }},
    {{ plugin = "prefix-cache-scorer", weight = 1.0 }},
]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_a_producers_parameters_carries_its_state_over() {
    let replica = start_replica("r0", &["--model", "test-model"]).await;
    let dir = temp_dir("reload-carry");
    let endpoints = format!(
        "libraries = [\"approx_prefix_cache_producer\", \"prefix_cache_scorer\"]\n\n\
         [fleet]\nscrape_interval_ms = 0\n\n[[endpoints]]\nname = \"r0\"\naddress = \"{}\"\n",
        replica.addr
    );
    let router = start_router(
        &dir,
        &format!("{endpoints}{}", carrying_pipeline(false, 1000)),
        "",
        &[],
    )
    .await;
    let held: Vec<_> = ["carried-1", "carried-2"]
        .into_iter()
        .map(|id| held_completion(&router, id, 1500))
        .collect();
    assert!(reaches(&router, "switchyard_in_flight_total", 2.0).await);
    let state = |router: &Router| {
        let admin = router.admin;
        async move { json(send(admin, "GET", "/plugins/state", &[], "").await).await }
    };
    let before = state(&router).await;
    assert_eq!(
        before["inflight-load-producer"]["openRequests"], 2,
        "{before}"
    );
    let blocks = before["approx-prefix-cache-producer"]["distinctBlocks"].clone();
    assert!(blocks.as_u64().is_some_and(|n| n > 0), "{before}");

    // Both producers get other parameters: new instances, which take the state over.
    rewrite(
        &router,
        &format!("{endpoints}{}", carrying_pipeline(true, 2000)),
    );
    let response = send(router.admin, "POST", "/reload", &[], "").await;
    assert_eq!(response.status(), 200);
    let result = json(response).await;
    assert_eq!(result["result"], "applied", "{result}");
    let carried: Vec<&str> = result["carried"]
        .as_array()
        .unwrap_or_else(|| panic!("no carried in {result}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(carried.contains(&"inflight-load-producer"), "{result}");
    assert!(
        carried.contains(&"approx-prefix-cache-producer"),
        "{result}"
    );
    assert_eq!(result["fresh"], serde_json::json!({}), "{result}");
    let after = state(&router).await;
    assert_eq!(
        after["inflight-load-producer"]["openRequests"], 2,
        "{after}"
    );
    assert_eq!(
        after["approx-prefix-cache-producer"]["distinctBlocks"], blocks,
        "{after}"
    );

    // The requests placed before the reload release their charges on the successor.
    for task in held {
        assert_eq!(task.await.expect("request task"), 200);
    }
    assert!(reaches(&router, "switchyard_in_flight_total", 0.0).await);
    let settled = state(&router).await;
    assert_eq!(
        settled["inflight-load-producer"]["openRequests"], 0,
        "{settled}"
    );
    assert_eq!(
        settled["inflight-load-producer"]["endpoints"],
        serde_json::json!([]),
        "{settled}"
    );

    // A block size the index was not hashed with: the successor starts empty, and says why.
    let other_blocks = carrying_pipeline(true, 2000).replace(
        "autoTune = false",
        "autoTune = false, blockSizeTokens = 128",
    );
    rewrite(&router, &format!("{endpoints}{other_blocks}"));
    let result = json(send(router.admin, "POST", "/reload", &[], "").await).await;
    assert_eq!(result["result"], "applied", "{result}");
    let why = result["fresh"]["approx-prefix-cache-producer"]
        .as_str()
        .unwrap_or_else(|| panic!("no reason in {result}"));
    assert!(why.contains("blockSizeTokens"), "{result}");
    assert!(
        log(&router).contains("approx-prefix-cache-producer starts with an empty state"),
        "{}",
        log(&router)
    );
    assert_eq!(served_by(&router).await, "r0");
}
