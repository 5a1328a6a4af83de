//! `switchyard serve` in front of `switchyard mock-replica` processes on 127.0.0.1: routes,
//! streaming, co-location of a burst (sent at once, and spread as a real client spreads it, checked
//! against `simulate`), errors, decisions equal to `replay`'s for the same
//! arrivals, and random bodies.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use switchyard_tests::live::{
    assert_router_idle, body_bytes, burst_pipeline, endpoints_toml, fast_replicas, header, json,
    metric_sum, metrics_page, prefix_cache_totals, read_events, replay_file, send, start_replica,
    start_router, temp_dir, try_send_bytes, Process, Router,
};
use switchyard_tests::{plugin_dir, workspace_root};

async fn replicas(n: usize, extra: &[&str]) -> Vec<Process> {
    fast_replicas(n, extra).await
}

fn endpoints(replicas: &[Process]) -> String {
    endpoints_toml(replicas)
}

fn completion(prompt: &str, max_tokens: u32, stream: bool) -> String {
    serde_json::json!({"model": "test-model", "prompt": prompt, "max_tokens": max_tokens, "stream": stream})
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_forward_stream_and_answer_models() {
    let replicas = replicas(3, &[]).await;
    let dir = temp_dir("serve-routes");
    let router = start_router(
        &dir,
        &format!("{}{}", burst_pipeline(20), endpoints(&replicas)),
        "decision_header = true",
        &[],
    )
    .await;

    // Not streamed: the replica's body comes back whole, with our request id.
    let response = send(
        router.api(),
        "POST",
        "/v1/completions",
        &[("x-request-id", "client-7")],
        &completion("The quick brown fox jumps over the lazy dog", 6, false),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-request-id"), "client-7");
    let replica = header(&response, "x-mock-replica").to_string();
    let decision = header(&response, "x-switchyard-decision").to_string();
    assert!(
        decision.starts_with(&format!("endpoint=/{replica}; top=")),
        "{decision} for {replica}"
    );
    let body = json(response).await;
    assert_eq!(body["usage"]["completion_tokens"], 6, "{body}");

    // Streamed chat: several chunks as they are produced, then [DONE].
    let chat = serde_json::json!({
        "model": "test-model", "stream": true, "max_tokens": 40,
        "messages": [{"role": "user", "content": "Say something long"}]
    });
    let response = send(
        router.api(),
        "POST",
        "/v1/chat/completions",
        &[],
        &chat.to_string(),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert!(!header(&response, "x-request-id").is_empty());
    let (events, end) = read_events(response).await;
    assert!(end.is_ok(), "{end:?}");
    assert!(events.len() > 3, "{events:?}");
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));

    // Pre-tokenized generate.
    let response = send(
        router.api(),
        "POST",
        "/inference/v1/generate",
        &[],
        r#"{"token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "sampling_params": {"max_tokens": 3}}"#,
    )
    .await;
    assert_eq!(response.status(), 200, "{:?}", body_bytes(response).await);

    // Models, answered from the fleet.
    let models = json(send(router.api(), "GET", "/v1/models", &[], "").await).await;
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "test-model", "{models}");

    // The admin API shows the decisions and the plugins.
    let decisions = json(send(router.admin, "GET", "/decisions?limit=10", &[], "").await).await;
    let ids: Vec<&str> = decisions
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|d| d["id"].as_str())
        .collect();
    assert!(ids.contains(&"client-7"), "{decisions}");
    let plugins = json(send(router.admin, "GET", "/plugins", &[], "").await).await;
    assert!(plugins
        .as_array()
        .expect("array")
        .iter()
        .any(|p| p["type"] == "burst-prefix-cache-producer" && p["calls"].as_u64() > Some(0)));
    let state = json(send(router.admin, "GET", "/plugins/state", &[], "").await).await;
    assert!(state.as_object().is_some_and(|s| !s.is_empty()), "{state}");
    // A plugin without a state says so; none is a bare null.
    assert!(
        state
            .as_object()
            .is_some_and(|s| s.values().all(|v| !v.is_null())),
        "{state}"
    );
    // The operator routes' errors are JSON like every other error.
    for (addr, method, path, status, code) in [
        (router.admin, "GET", "/nope", 404, "unknown_route"),
        (
            router.admin,
            "POST",
            "/decisions",
            405,
            "method_not_allowed",
        ),
        (router.metrics, "GET", "/nope", 404, "unknown_route"),
    ] {
        let response = send(addr, method, path, &[], "").await;
        assert_eq!(response.status(), status, "{method} {path}");
        assert_eq!(
            json(response).await["error"]["code"],
            code,
            "{method} {path}"
        );
    }
    let config = body_bytes(send(router.admin, "GET", "/config", &[], "").await).await;
    assert!(String::from_utf8_lossy(&config).contains("burst-prefix-cache-producer"));

    assert_router_idle(&router, "at the end").await;
    let page = metrics_page(router.metrics).await;
    // Three placed requests, each counted against its replica, and GET /v1/models.
    assert_eq!(
        metric_sum(&page, "switchyard_requests_total{outcome=\"completed\""),
        4.0,
        "{page}"
    );
    assert_eq!(
        metric_sum(
            &page,
            "switchyard_requests_total{outcome=\"completed\",endpoint=\"\"}"
        ),
        1.0,
        "{page}"
    );
    assert!(metric_sum(&page, "switchyard_decision_duration_seconds_count") >= 3.0);
    let timed = "{plugin=\"burst-prefix-cache-producer\"";
    assert!(
        metric_sum(
            &page,
            &format!("switchyard_plugin_timed_calls_total{timed}")
        ) >= 3.0
    );
    assert!(
        metric_sum(
            &page,
            &format!("switchyard_plugin_call_seconds_total{timed}")
        ) > 0.0
    );
    let ready = send(router.metrics, "GET", "/ready", &[], "").await;
    assert_eq!(ready.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_colocated_and_each_prompt_prefilled_once() {
    const PROMPTS: usize = 16;
    const SAMPLES: usize = 8;
    let replicas = replicas(3, &[]).await;
    let dir = temp_dir("serve-burst");
    // A window long enough that the whole burst lands in it.
    let router = start_router(
        &dir,
        &format!("{}{}", burst_pipeline(400), endpoints(&replicas)),
        "",
        &[],
    )
    .await;
    // Prompts of 64 tokens (256 bytes), distinct from their first block on.
    let prompts: Vec<String> = (0..PROMPTS)
        .map(|p| format!("{p:04}{}", "abcdefgh".repeat(32))[..256].to_string())
        .collect();
    let api = router.api();
    let mut tasks = Vec::new();
    for (p, prompt) in prompts.iter().enumerate() {
        for _ in 0..SAMPLES {
            let body = completion(prompt, 2, false);
            tasks.push(tokio::spawn(async move {
                let response = send(api, "POST", "/v1/completions", &[], &body).await;
                assert_eq!(response.status(), 200);
                let replica = header(&response, "x-mock-replica").to_string();
                let cached = json(response).await["usage"]["prompt_tokens_details"]
                    ["cached_tokens"]
                    .as_u64()
                    .unwrap_or(0);
                (p, replica, cached)
            }));
        }
    }
    let mut placed: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    let mut cold = 0;
    for task in tasks {
        let (p, replica, cached) = task.await.expect("request task");
        placed.entry(p).or_default().insert(replica);
        if cached == 0 {
            cold += 1;
        }
    }
    for (p, replicas) in &placed {
        assert_eq!(replicas.len(), 1, "prompt {p} spread over {replicas:?}");
    }
    assert_eq!(cold, PROMPTS, "each prompt is prefilled exactly once");
    // The replicas' own counters agree: computed tokens = one prefill per prompt.
    let (queries, hits) = prefix_cache_totals(&replicas).await;
    assert_eq!(queries, (PROMPTS * SAMPLES * 64) as f64);
    assert_eq!(queries - hits, (PROMPTS * 64) as f64);
    assert_router_idle(&router, "at the end").await;
}

/// The serving pipeline as shipped (`configs/serve-local.toml`) without its `[serve]` table and
/// its endpoints.
fn shipped_serving_pipeline() -> String {
    let text = std::fs::read_to_string(workspace_root().join("configs/serve-local.toml"))
        .expect("configs/serve-local.toml");
    let mut kept = String::new();
    let mut skipping = false;
    for line in text.lines() {
        let header = line.trim_start();
        if header.starts_with('[') {
            skipping = header == "[serve]" || header == "[[endpoints]]";
        }
        if !skipping {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

/// The burst windows of the router's decision records, in order: each window's opening time,
/// its length and its batch size — what a failing comparison with `simulate` needs to be read.
async fn windows_seen(router: &Router) -> String {
    let records = json(send(router.admin, "GET", "/decisions?limit=4096", &[], "").await).await;
    let mut windows: BTreeMap<u64, (f64, u64)> = BTreeMap::new();
    for window in records
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["decision"]["window"].as_object())
    {
        let opened = window["opened_ms"].as_f64().unwrap_or(0.0);
        let sealed = window["sealed_ms"].as_f64().unwrap_or(0.0);
        let size = window["batch_size"].as_u64().unwrap_or(0);
        windows.insert((opened * 1000.0) as u64, (sealed - opened, size));
    }
    windows
        .iter()
        .map(|(opened, (length, size))| {
            format!("{:.1}+{length:.1}ms:{size}", *opened as f64 / 1000.0)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Prefills per prompt: over the prompts, the replicas where one of its requests did not find
/// its whole prompt cached (one block of slack), averaged.
fn prefills_per_prompt(cold: &BTreeMap<usize, BTreeSet<String>>, prompts: usize) -> f64 {
    cold.values().map(BTreeSet::len).sum::<usize>() as f64 / prompts as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spread_burst_through_serve_matches_simulate() {
    spread_burst_through_serve_and_simulate(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_sent_prompt_by_prompt_through_serve_matches_simulate() {
    spread_burst_through_serve_and_simulate(true).await;
}

/// One RL step: 32 prompts of 1,024 tokens × 8 samples over 4 replicas, each request sent at
/// a fixed offset within 150 ms (a client that spreads its burst), in a random order or, with
/// `prompt_by_prompt`, every sample of a prompt before the next prompt's; through the shipped
/// serving pipeline, then the arrivals the router saw through `simulate` on the fixed-rate
/// model that mock-replica runs. 32 prompts, so that 10% of the prefills is more than one group split by
/// a live router's timing (the CI runs it beside other tests).
async fn spread_burst_through_serve_and_simulate(prompt_by_prompt: bool) {
    const PROMPTS: usize = 32;
    const SAMPLES: usize = 8;
    const REPLICAS: usize = 4;
    const PROMPT_TOKENS: usize = 1024;
    const OUTPUT_TOKENS: u32 = 24;
    const SPREAD_MS: u64 = 150;
    let mut replicas = Vec::new();
    for i in 0..REPLICAS {
        replicas.push(start_replica(&format!("r{i}"), &["--model", "mock-model"]).await);
    }
    let dir = temp_dir(if prompt_by_prompt {
        "serve-burst-prompt-by-prompt"
    } else {
        "serve-spread-burst"
    });
    let pipeline = shipped_serving_pipeline();
    let router = start_router(
        &dir,
        &format!("{pipeline}{}", endpoints(&replicas)),
        "decision_records = 4096",
        &[],
    )
    .await;
    let mut random = rand::rngs::SmallRng::seed_from_u64(18);
    let prompts: Vec<String> = (0..PROMPTS)
        .map(|_| {
            (0..PROMPT_TOKENS * 4)
                .map(|_| char::from(b'a' + random.random_range(0..26u8)))
                .collect()
        })
        .collect();
    let mut arrivals: Vec<(u64, usize)> = (0..PROMPTS)
        .flat_map(|p| std::iter::repeat_n(p, SAMPLES))
        .map(|p| (random.random_range(0..SPREAD_MS), p))
        .collect();
    arrivals.sort();
    if prompt_by_prompt {
        for (k, arrival) in arrivals.iter_mut().enumerate() {
            arrival.1 = k / SAMPLES;
        }
    }

    let api = router.api();
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for (k, &(at, p)) in arrivals.iter().enumerate() {
        let body = serde_json::json!({"model": "mock-model", "prompt": prompts[p],
            "max_tokens": OUTPUT_TOKENS})
        .to_string();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(start + Duration::from_millis(at)).await;
            let id = format!("burst-{k}");
            let response = send(
                api,
                "POST",
                "/v1/completions",
                &[("x-request-id", &id)],
                &body,
            )
            .await;
            assert_eq!(response.status(), 200);
            let replica = header(&response, "x-mock-replica").to_string();
            let cached = json(response).await["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0);
            (p, at, replica, cached)
        }));
    }
    let mut live_cold: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    let mut live_served: BTreeMap<String, u64> = BTreeMap::new();
    // Per prompt, its requests in sending order: when sent, where served, whether cold there.
    let mut requests_of: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for task in tasks {
        let (p, at, replica, cached) = task.await.expect("request task");
        let cold = (cached as usize) + 16 < PROMPT_TOKENS;
        if cold {
            live_cold.entry(p).or_default().insert(replica.clone());
        }
        requests_of.entry(p).or_default().push(format!(
            "{at}ms {replica}{}",
            if cold { " cold" } else { "" }
        ));
        *live_served.entry(replica).or_default() += 1;
    }
    let split: Vec<String> = live_cold
        .iter()
        .filter(|(_, replicas)| replicas.len() > 1)
        .map(|(p, _)| format!("prompt {p}: {}", requests_of[p].join(", ")))
        .collect();
    assert_router_idle(&router, "after the burst").await;

    // `simulate` gets the arrivals the router saw: on a loaded machine the client's requests
    // leave late and unevenly, and the question is whether the router places what reached it
    // as `simulate` does, not what the client meant to send.
    let records = json(send(router.admin, "GET", "/decisions?limit=4096", &[], "").await).await;
    let arrived: HashMap<&str, f64> = records
        .as_array()
        .expect("records")
        .iter()
        .filter_map(|r| Some((r["id"].as_str()?, r["arrival_ms"].as_f64()?)))
        .collect();
    let mut seen: Vec<(f64, usize)> = arrivals
        .iter()
        .enumerate()
        .map(|(k, &(_, p))| {
            let at = arrived
                .get(format!("burst-{k}").as_str())
                .unwrap_or_else(|| panic!("no decision record of burst-{k}"));
            (*at, p)
        })
        .collect();
    seen.sort_by(|a, b| a.0.total_cmp(&b.0));
    let first = seen[0].0;
    let trace: String = seen
        .iter()
        .map(|&(at, p)| {
            serde_json::json!({"arrival_ms": ((at - first) * 10.0).round() / 10.0,
                "prompt": prompts[p], "output_tokens": OUTPUT_TOKENS,
                "model": "mock-model", "group": p, "step": 0})
            .to_string()
                + "\n"
        })
        .collect();
    let trace_path = dir.join("burst.jsonl");
    std::fs::write(&trace_path, trace).expect("trace written");

    let config_path = dir.join("pipeline.toml");
    std::fs::write(&config_path, &pipeline).expect("pipeline written");
    let output = dir.join("simulated");
    let status = std::process::Command::new(switchyard_tests::live::binary())
        .args(["simulate", "--profile", "fixed-rate", "--no-baselines"])
        .args(["--replicas", &REPLICAS.to_string()])
        .arg("--config")
        .arg(&config_path)
        .arg("--trace")
        .arg(&trace_path)
        .arg("--plugin-dir")
        .arg(plugin_dir())
        .arg("--output")
        .arg(&output)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("simulate runs");
    assert!(status.success(), "simulate succeeds");
    let report: Value =
        serde_json::from_slice(&std::fs::read(output.join("report.json")).expect("report.json"))
            .expect("report is JSON");
    let simulated = &report["pipelines"][0];
    let sim_prefills = simulated["prefills_per_prompt_per_step"]
        .as_f64()
        .expect("prefills per prompt");
    let mut sim_served: Vec<u64> = simulated["replica_load"]["served_per_replica"]
        .as_array()
        .expect("served per replica")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    let mut served: Vec<u64> = (0..REPLICAS)
        .map(|i| live_served.get(&format!("r{i}")).copied().unwrap_or(0))
        .collect();

    let live_prefills = prefills_per_prompt(&live_cold, PROMPTS);
    let detail = format!(
        "live: {live_prefills:.2} prefills per prompt, {served:?} requests per replica; \
         simulate: {sim_prefills:.2}, {sim_served:?}\nlive windows: {}\nsplit live: {}",
        windows_seen(&router).await,
        split.join("\n  ")
    );
    assert!(
        (live_prefills - sim_prefills).abs() <= 0.1 * sim_prefills,
        "prefills per prompt disagree by more than 10%: {detail}"
    );
    // Which replica gets which share depends on tie-breaks between equally loaded replicas,
    // so the loads are compared sorted. A live router under load (a CI run beside other
    // tests) can split one group the simulation keeps whole: that moves up to half a group's
    // samples, which is more than 10% of a share this small.
    // Prompt by prompt, each group looks like the last until the step ends, and the plan
    // lets a replica run one group ahead while new ones keep coming: a live router's timing
    // can leave one whole group where the simulation evened the replicas out.
    let slack = if prompt_by_prompt {
        SAMPLES as f64
    } else {
        SAMPLES as f64 / 2.0
    };
    served.sort_unstable();
    sim_served.sort_unstable();
    for (live, sim) in served.iter().zip(&sim_served) {
        assert!(
            (*live as f64 - *sim as f64).abs() <= (0.1 * *sim as f64).max(slack),
            "requests per replica disagree by more than 10%: {detail}"
        );
    }
    // And the burst is co-located and balanced, not only alike in both.
    assert!(live_prefills <= 1.25, "{detail}");
    let fair = (PROMPTS * SAMPLES / REPLICAS) as f64;
    assert!(
        served
            .iter()
            .all(|&n| (n as f64 - fair).abs() <= (0.2 * fair).max(2.0)),
        "{detail}"
    );
    eprintln!("{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_record_ring_keeps_the_latest_decisions_each_its_own() {
    // Three records kept: every decision after the third reuses the buffers of a record the
    // ring let go, and each record still shows only its own request's steps.
    let replicas = replicas(2, &[]).await;
    let dir = temp_dir("serve-record-ring");
    let router = start_router(
        &dir,
        &format!("{}{}", burst_pipeline(1), endpoints(&replicas)),
        "decision_records = 3",
        &[],
    )
    .await;
    let mut served = Vec::new();
    for i in 0..9 {
        let id = format!("ring-{i}");
        let prompt = format!(
            "request {i} of the ring test, with a prompt of its own {}",
            "x".repeat(i * 40)
        );
        let response = send(
            router.api(),
            "POST",
            "/v1/completions",
            &[("x-request-id", &id)],
            &completion(&prompt, 2, false),
        )
        .await;
        assert_eq!(response.status(), 200);
        served.push((id, format!("/{}", header(&response, "x-mock-replica"))));
    }
    let decisions = json(send(router.admin, "GET", "/decisions?limit=10", &[], "").await).await;
    let records = decisions.as_array().expect("array");
    assert_eq!(records.len(), 3, "{decisions}");
    for (record, (id, replica)) in records.iter().zip(&served[6..]) {
        assert_eq!(record["id"], id.as_str(), "{decisions}");
        let decision = &record["decision"];
        assert_eq!(decision["picked"], serde_json::json!([replica]), "{record}");
        // One step per plugin of each stage, as in a fresh record.
        let steps = |stage: &str| decision[stage].as_array().map_or(0, Vec::len);
        assert_eq!(
            (steps("producers"), steps("filters"), steps("scorers")),
            (3, 1, 2),
            "{record}"
        );
        // token-producer notes once why the text's ids are estimated, the other two write
        // one value per candidate.
        let producers = decision["producers"].as_array().expect("producers");
        let written: Vec<usize> = producers
            .iter()
            .map(|p| p["attributes"].as_array().map_or(0, Vec::len))
            .collect();
        assert_eq!(written, [1, 2, 2], "{record}");
        assert_eq!(
            producers[0]["attributes"][0]["value"]["text"], "estimated: no tokenizer configured",
            "{record}"
        );
        for scorer in decision["scorers"].as_array().expect("scorers") {
            assert_eq!(
                scorer["scores"].as_array().map(Vec::len),
                Some(2),
                "{record}"
            );
        }
        assert_eq!(
            decision["totals"].as_array().map(Vec::len),
            Some(2),
            "{record}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_shaped_errors() {
    let replicas = replicas(1, &[]).await;
    let dir = temp_dir("serve-errors");
    let router = start_router(&dir, &endpoints(&replicas), "max_body_bytes = 2048", &[]).await;
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        (
            "POST",
            "/v1/completions",
            "{\"model\":".into(),
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/completions",
            r#"{"prompt":"hi"}"#.into(),
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/completions",
            r#"{"model":"m"}"#.into(),
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/chat/completions",
            r#"{"model":"m","messages":"x"}"#.into(),
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/inference/v1/generate",
            r#"{"token_ids":[-1]}"#.into(),
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/completions",
            completion(&"x".repeat(4096), 1, false),
            413,
            "body_too_large",
        ),
        ("POST", "/v2/unknown", "{}".into(), 404, "unknown_route"),
        (
            "GET",
            "/v1/completions",
            String::new(),
            405,
            "method_not_allowed",
        ),
    ];
    for (i, (method, path, body, status, code)) in cases.into_iter().enumerate() {
        // The router's own errors carry the request's id too.
        let id = format!("err-{i}");
        let response = send(router.api(), method, path, &[("x-request-id", &id)], &body).await;
        assert_eq!(response.status(), status, "{method} {path} {body:.60}");
        assert_eq!(header(&response, "x-request-id"), id, "{method} {path}");
        let error = json(response).await;
        assert_eq!(error["error"]["code"], code, "{error}");
        assert!(error["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        assert!(error["error"]["type"].is_string());
    }
    let page = metrics_page(router.metrics).await;
    assert!(metric_sum(&page, "switchyard_requests_total{outcome=\"bad_request\"") >= 6.0);
    assert_eq!(
        metric_sum(
            &page,
            "switchyard_requests_total{outcome=\"body_too_large\""
        ),
        1.0
    );

    // An id with a space is not a usable id: the router makes its own.
    let response = send(
        router.api(),
        "POST",
        "/v2/unknown",
        &[("x-request-id", "two words")],
        "{}",
    )
    .await;
    let generated = header(&response, "x-request-id");
    assert!(
        !generated.is_empty() && !generated.contains(' '),
        "{generated:?}"
    );

    // No endpoints at all: 503 with the reference's reason header.
    let empty = start_router(&temp_dir("serve-empty"), "", "", &[]).await;
    let response = send(
        empty.api(),
        "POST",
        "/v1/completions",
        &[],
        &completion("hi", 1, false),
    )
    .await;
    assert_eq!(response.status(), 503);
    assert_eq!(
        header(&response, "x-llm-d-request-dropped-reason"),
        "rejected-no-endpoints"
    );
    assert_eq!(json(response).await["error"]["code"], "no_endpoints");
    let ready = send(empty.metrics, "GET", "/ready", &[], "").await;
    assert_eq!(ready.status(), 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_places_requests_as_replay_does_for_the_same_arrivals() {
    let replicas = replicas(3, &[]).await;
    let dir = temp_dir("serve-replay");
    let config = format!("{}{}", burst_pipeline(60), endpoints(&replicas)).replace(
        "scrape_interval_ms = 100",
        // Live load facts would differ from the journal's; in-flight counts stay exact.
        "scrape_interval_ms = 0",
    );
    let journal = dir.join("journal.jsonl");
    let mut router = start_router(
        &dir,
        &config,
        "decision_header = true",
        &["--journal", journal.to_str().expect("utf-8 path")],
    )
    .await;
    // A recorded arrival pattern: bursts of shared prompts, gaps, and stragglers.
    let api = router.api();
    let mut placed: BTreeMap<String, String> = BTreeMap::new();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    for round in 0..4 {
        let mut tasks = Vec::new();
        for i in 0..12 {
            let prompt = format!(
                "round {round} group {} {}",
                i % 3,
                "shared context ".repeat(20)
            );
            let id = format!("req-{round}-{i}");
            let max_tokens = rng.random_range(1..40);
            let body = completion(&prompt, max_tokens, false);
            tasks.push(tokio::spawn(async move {
                let response = send(
                    api,
                    "POST",
                    "/v1/completions",
                    &[("x-request-id", &id)],
                    &body,
                )
                .await;
                assert_eq!(response.status(), 200);
                let decision = header(&response, "x-switchyard-decision").to_string();
                let _ = body_bytes(response).await;
                (id, decision)
            }));
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..15))).await;
        }
        for task in tasks {
            let (id, decision) = task.await.expect("task");
            let endpoint = decision
                .strip_prefix("endpoint=")
                .and_then(|d| d.split(';').next())
                .expect("decision header")
                .to_string();
            placed.insert(id, endpoint);
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..150))).await;
    }
    assert_router_idle(&router, "at the end").await;
    assert_eq!(router.process.terminate(Duration::from_secs(10)), Some(0));

    // Replay the journal through the same config and compare every placement.
    let text = std::fs::read_to_string(&journal).expect("journal");
    assert_eq!(
        text.lines().count(),
        placed.len(),
        "one journal line per request"
    );
    let replayed = replay_file(&dir.join("serve.toml"), &journal);
    assert_eq!(replayed.len(), placed.len());
    let mut groups = BTreeSet::new();
    for (id, endpoint) in &replayed {
        assert_eq!(placed.get(id), Some(endpoint), "request {id}");
        groups.insert(endpoint.clone());
    }
    assert!(groups.len() > 1, "the pattern used more than one replica");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_and_truncated_bodies_never_break_the_server() {
    let replicas = replicas(1, &[]).await;
    let dir = temp_dir("serve-fuzz");
    let router = start_router(&dir, &endpoints(&replicas), "", &[]).await;
    let valid = [
        completion("hello there", 1, false),
        r#"{"model":"test-model","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":1}"#.to_string(),
        r#"{"token_ids":[1,2,3],"sampling_params":{"max_tokens":1}}"#.to_string(),
    ];
    let routes = [
        "/v1/completions",
        "/v1/chat/completions",
        "/inference/v1/generate",
    ];
    let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
    let api = router.api();
    let shared = Arc::new(valid);
    for round in 0..300 {
        let route = routes[round % 3];
        let source = shared[round % 3].as_bytes();
        let body: Vec<u8> = match round % 4 {
            0 => source[..rng.random_range(0..source.len())].to_vec(),
            1 => (0..rng.random_range(0..200))
                .map(|_| rng.random())
                .collect(),
            2 => {
                let mut bytes = source.to_vec();
                for _ in 0..3 {
                    let at = rng.random_range(0..bytes.len());
                    bytes[at] = rng.random();
                }
                bytes
            }
            _ => source.to_vec(),
        };
        let response = try_send_bytes(api, "POST", route, &[], Bytes::from(body.clone()))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "round {round}: {e} for {:?}",
                    String::from_utf8_lossy(&body)
                )
            });
        let status = response.status().as_u16();
        let bytes = body_bytes(response).await;
        assert!(
            status == 200 || status == 400,
            "round {round}: {status} for {:?}",
            String::from_utf8_lossy(&body)
        );
        if status == 400 {
            let error: Value = serde_json::from_slice(&bytes).expect("JSON error");
            assert!(error["error"]["message"].is_string());
        }
    }
    let response = send(
        api,
        "POST",
        routes[0],
        &[],
        &completion("still alive", 1, false),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_router_idle(&router, "at the end").await;
}
