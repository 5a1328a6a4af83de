//! `switchyard ext-proc` as a real process on 127.0.0.1, spoken to over gRPC the way Envoy
//! and the RL trainers do: pick-only and tracked streams, pre-tokenized bodies, a burst
//! co-located over ext_proc, abandoned streams, the subset hint, the reference's errors,
//! gRPC health, TLS on and off, the reference's launch line, a burst of reset streams on one
//! connection, unreadable messages, and the connection cap.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use envoy_types::pb::envoy::service::ext_proc::v3::ProtocolConfiguration;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};
use switchyard_tests::extproc::{
    channel, pick, pick_with, report_completion, request_body, request_headers, response_body,
    response_headers, start_picker, Picker, RawConnection, RawStream, Stream,
};
use switchyard_tests::live::{
    binary, burst_pipeline, endpoints_toml, eventually, fast_replicas, json, metric_sum,
    metrics_page, prefix_cache_totals, send, temp_dir, Process,
};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const GENERATE: &str = "/inference/v1/generate";

async fn replicas(n: usize) -> Vec<Process> {
    fast_replicas(n, &[]).await
}

fn endpoints(replicas: &[Process]) -> String {
    endpoints_toml(replicas)
}

/// A windowless pipeline: the load-aware scorer and the default picker.
fn windowless(replicas: &[Process], extra: &str) -> String {
    format!(
        "[fleet]\nscrape_interval_ms = 100\n\n[[plugins]]\ntype = \"load-aware-scorer\"\n\n\
         [[profiles]]\nname = \"default\"\nscorers = [{{ plugin = \"load-aware-scorer\", weight = 1.0 }}]\n\n\
         {extra}\n{}",
        endpoints(replicas)
    )
}

/// Burst co-location, affinity filter, prefix and load scorers, over `replicas`.
fn burst_over(window_ms: u64, replicas: &[Process]) -> String {
    format!("{}{}", burst_pipeline(window_ms), endpoints(replicas))
}

fn generate(tokens: &[u32]) -> String {
    serde_json::json!({"model": "test-model", "token_ids": tokens, "sampling_params": {"max_tokens": 2}})
        .to_string()
}

async fn in_flight(picker: &Picker) -> f64 {
    metric_sum(
        &metrics_page(picker.metrics).await,
        "switchyard_in_flight_total",
    )
}

async fn assert_idle(picker: &Picker, what: &str) {
    let idle = eventually(Duration::from_secs(10), || async {
        in_flight(picker).await == 0.0
    })
    .await;
    let page = metrics_page(picker.metrics).await;
    assert!(idle, "{what}: requests still in flight\n{page}");
    assert_eq!(
        metric_sum(&page, "switchyard_in_flight"),
        0.0,
        "{what}\n{page}"
    );
}

fn subset(value: Value) -> Metadata {
    let mut hint = Struct::default();
    hint.fields
        .insert("x-gateway-destination-endpoint-subset".into(), value);
    let mut metadata = Metadata::default();
    metadata
        .filter_metadata
        .insert("envoy.lb.subset_hint".into(), hint);
    metadata
}

fn string(text: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(text.into())),
    }
}

/// The RL tooling's launch line, unchanged apart from the binary and the config file (and
/// the test's ports and loopback address).
const RL_LAUNCH_FLAGS: &[&str] = &[
    "--pool-name",
    "file-discovery",
    "--pool-namespace",
    "default",
    "--secure-serving=false",
    "--tracing=false",
    "--allow-experimental-plugins",
    "-v=1",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pick_and_tracked_streams_route_echo_and_release() {
    let replicas = replicas(3).await;
    let addresses: BTreeSet<String> = replicas.iter().map(|r| r.addr.to_string()).collect();
    let dir = temp_dir("extproc-modes");
    let picker = start_picker(&dir, &windowless(&replicas, ""), RL_LAUNCH_FLAGS).await;
    let grpc = channel(picker.grpc()).await;

    // Pick: headers and one body with end_of_stream, read the destination, abandon.
    let body = generate(&[1, 2, 3, 4, 5, 6, 7, 8]);
    let mut stream = Stream::open(grpc.clone()).await.expect("stream opens");
    let chosen = pick(&mut stream, GENERATE, &[("x-request-id", "pick-1")], &body).await;
    assert!(chosen.immediate.is_none(), "{:?}", chosen.immediate);
    assert!(
        addresses.contains(&chosen.header),
        "{chosen:?} not in {addresses:?}"
    );
    assert_eq!(chosen.header, chosen.metadata, "header and metadata agree");
    assert!(chosen.clear_route_cache);
    assert_eq!(
        chosen.echoed,
        body.as_bytes(),
        "the body comes back unchanged"
    );
    assert!(
        !chosen.set_headers.iter().any(|(k, _)| k == "x-request-id"),
        "a client's request id is kept, not replaced: {:?}",
        chosen.set_headers
    );
    assert_eq!(
        in_flight(&picker).await,
        1.0,
        "charged while the stream is open"
    );
    drop(stream);
    assert_idle(&picker, "after an abandoned pick").await;

    // Without a request id, one is generated and set.
    let mut stream = Stream::open(grpc.clone()).await.expect("stream opens");
    let chosen = pick(&mut stream, GENERATE, &[], &body).await;
    let generated = chosen
        .set_headers
        .iter()
        .find(|(k, _)| k == "x-request-id")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    assert!(!generated.is_empty(), "{:?}", chosen.set_headers);
    drop(stream);

    // Tracked: the stream stays open; the response phase ends the request.
    let mut stream = Stream::open(grpc.clone()).await.expect("stream opens");
    let chosen = pick(
        &mut stream,
        GENERATE,
        &[("x-request-id", "tracked-1")],
        &body,
    )
    .await;
    assert!(addresses.contains(&chosen.header));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        in_flight(&picker).await,
        1.0,
        "charged until the response ends"
    );
    let echoed = report_completion(&mut stream, 17).await;
    assert!(String::from_utf8_lossy(&echoed).contains("\"completion_tokens\":17"));
    assert_idle(&picker, "after a tracked completion").await;
    stream.half_close();
    assert!(
        matches!(stream.next().await, Ok(None)),
        "the picker ends the stream after the client does"
    );
    let page = metrics_page(picker.metrics).await;
    assert_eq!(
        metric_sum(&page, "switchyard_completion_tokens_total"),
        17.0,
        "{page}"
    );

    // OpenAI bodies over ext_proc: completions and chat.
    for (path, body) in [
        (
            "/v1/completions",
            r#"{"model":"test-model","prompt":"hello there","max_tokens":2}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"test-model","messages":[{"role":"user","content":"hi"}]}"#,
        ),
    ] {
        let mut stream = Stream::open(grpc.clone()).await.expect("stream opens");
        let chosen = pick(&mut stream, path, &[], body).await;
        assert!(addresses.contains(&chosen.header), "{path}: {chosen:?}");
    }
    assert_idle(&picker, "at the end").await;

    // A body in several chunks, larger than one echo chunk, comes back whole and in order.
    let tokens: Vec<u32> = (0..20_000).collect();
    let big = generate(&tokens);
    let mut stream = Stream::open(grpc.clone()).await.expect("stream opens");
    stream
        .send(request_headers(GENERATE, &[], false, None))
        .await;
    let pieces: Vec<&[u8]> = big.as_bytes().chunks(16_384).collect();
    for (i, piece) in pieces.iter().enumerate() {
        stream
            .send(request_body(piece, i + 1 == pieces.len()))
            .await;
    }
    let chosen = switchyard_tests::extproc::read_pick(&mut stream).await;
    assert!(big.len() > 62_000);
    assert_eq!(chosen.echoed, big.as_bytes());
    drop(stream);
    assert_idle(&picker, "after the large body").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_over_ext_proc_is_colocated_and_each_prompt_prefilled_once() {
    const PROMPTS: usize = 8;
    const SAMPLES: usize = 8;
    let replicas = replicas(3).await;
    let by_address: BTreeMap<String, usize> = replicas
        .iter()
        .enumerate()
        .map(|(i, r)| (r.addr.to_string(), i))
        .collect();
    let dir = temp_dir("extproc-burst");
    let picker = start_picker(
        &dir,
        &burst_over(400, &replicas),
        &["--allow-experimental-plugins"],
    )
    .await;
    let grpc = channel(picker.grpc()).await;
    // Prompts of 64 token ids, distinct from their first block on.
    let prompts: Vec<Vec<u32>> = (0..PROMPTS as u32)
        .map(|p| (0..64).map(|t| p * 1000 + t).collect())
        .collect();
    let mut tasks = Vec::new();
    for (p, tokens) in prompts.iter().enumerate() {
        for s in 0..SAMPLES {
            let grpc = grpc.clone();
            let tokens = tokens.clone();
            let replica_addresses = by_address.clone();
            tasks.push(tokio::spawn(async move {
                // The trainer's tracked client: pick, call the replica, report completion.
                let mut stream = Stream::open(grpc).await.expect("stream opens");
                let id = format!("p{p}-s{s}");
                let chosen = pick(
                    &mut stream,
                    GENERATE,
                    &[("x-request-id", id.as_str())],
                    &generate(&tokens),
                )
                .await;
                assert!(replica_addresses.contains_key(&chosen.header), "{chosen:?}");
                let replica: std::net::SocketAddr = chosen.header.parse().expect("ip:port");
                let body =
                    serde_json::json!({"model": "test-model", "prompt": tokens, "max_tokens": 2})
                        .to_string();
                let response = send(replica, "POST", "/v1/completions", &[], &body).await;
                assert_eq!(response.status(), 200);
                let answer = json(response).await;
                let tokens_out = answer["usage"]["completion_tokens"].as_u64().unwrap_or(0);
                report_completion(&mut stream, tokens_out).await;
                (p, chosen.header)
            }));
        }
    }
    let mut placements: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for task in tasks {
        let (p, address) = task.await.expect("request task");
        placements.entry(p).or_default().insert(address);
    }
    for (p, places) in &placements {
        assert_eq!(places.len(), 1, "prompt {p} went to {places:?}");
    }
    // Each prompt prefilled once: every other sample found its blocks cached.
    let (queries, hits) = prefix_cache_totals(&replicas).await;
    assert_eq!(queries, (PROMPTS * SAMPLES * 64) as f64);
    assert_eq!(queries - hits, (PROMPTS * 64) as f64);
    assert_idle(&picker, "after the burst").await;
    let page = metrics_page(picker.metrics).await;
    assert!(
        metric_sum(&page, "switchyard_window_wait_seconds_count") >= (PROMPTS * SAMPLES) as f64,
        "{page}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_abandoned_in_its_window_is_withdrawn() {
    let replicas = replicas(2).await;
    let dir = temp_dir("extproc-abandon");
    let picker = start_picker(
        &dir,
        &burst_over(600, &replicas),
        &["--allow-experimental-plugins"],
    )
    .await;
    let grpc = channel(picker.grpc()).await;
    let stream = Stream::open(grpc.clone()).await.expect("stream opens");
    stream
        .send(request_headers(GENERATE, &[], false, None))
        .await;
    stream
        .send(request_body(generate(&[9; 32]).as_bytes(), true))
        .await;
    let waiting = eventually(Duration::from_secs(5), || async {
        metric_sum(
            &metrics_page(picker.metrics).await,
            "switchyard_window_pending",
        ) == 1.0
    })
    .await;
    assert!(waiting, "the request waits in its window");
    drop(stream);
    let withdrawn = eventually(Duration::from_secs(5), || async {
        metric_sum(
            &metrics_page(picker.metrics).await,
            "switchyard_window_pending",
        ) == 0.0
    })
    .await;
    assert!(withdrawn, "the abandoned request left its window");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_idle(&picker, "after the window sealed").await;
    let counted = eventually(Duration::from_secs(5), || async {
        let page = metrics_page(picker.metrics).await;
        metric_sum(&page, "switchyard_requests_total") == 1.0
            && metric_sum(
                &page,
                "switchyard_requests_total{outcome=\"client_disconnected\",endpoint=\"\"}",
            ) == 1.0
    })
    .await;
    assert!(
        counted,
        "the withdrawn request is counted once, as a client that left\n{}",
        metrics_page(picker.metrics).await
    );
    // A stream that breaks mid-response is released too.
    let mut stream = Stream::open(grpc.clone()).await.expect("stream opens");
    let chosen = pick(&mut stream, GENERATE, &[], &generate(&[3; 32])).await;
    assert!(chosen.immediate.is_none());
    stream
        .send(switchyard_tests::extproc::response_headers(200))
        .await;
    let _ = stream.next().await;
    assert_eq!(in_flight(&picker).await, 1.0);
    drop(stream);
    assert_idle(&picker, "after a stream broken mid-response").await;
    // Headers and part of the body, then the stream goes: one more client that left. The
    // picker answers nothing before the whole body, so the test gives the messages a second
    // to arrive before it leaves.
    let stream = Stream::open(grpc.clone()).await.expect("stream opens");
    stream
        .send(request_headers(GENERATE, &[], false, None))
        .await;
    stream.send(request_body(b"{\"token_ids\"", false)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(stream);
    let counted = eventually(Duration::from_secs(5), || async {
        let page = metrics_page(picker.metrics).await;
        metric_sum(&page, "switchyard_requests_total") == 3.0
            && metric_sum(
                &page,
                "switchyard_requests_total{outcome=\"client_disconnected\"}",
            ) == 3.0
    })
    .await;
    assert!(
        counted,
        "each stream that left is counted once\n{}",
        metrics_page(picker.metrics).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subset_hint_limits_the_candidates() {
    let replicas = replicas(3).await;
    let dir = temp_dir("extproc-subset");
    let picker = start_picker(
        &dir,
        &windowless(&replicas, ""),
        &["--emit-endpoint-scores"],
    )
    .await;
    let grpc = channel(picker.grpc()).await;
    let only = replicas[2].addr.to_string();

    // Without a hint every endpoint is a candidate, and each one's total is in the metadata.
    let mut stream = Stream::open(grpc.clone()).await.expect("stream opens");
    let chosen = pick(&mut stream, GENERATE, &[], &generate(&[8, 8, 8, 8])).await;
    let scored: BTreeSet<String> = chosen.scores.iter().map(|(a, _)| a.clone()).collect();
    let all: BTreeSet<String> = replicas.iter().map(|r| r.addr.to_string()).collect();
    assert_eq!(scored, all, "{chosen:?}");
    assert!(chosen.scores.iter().all(|(_, s)| (0.0..=1.0).contains(s)));
    drop(stream);
    let body = generate(&[1, 2, 3, 4]);
    for hint in [
        Value {
            kind: Some(Kind::ListValue(ListValue {
                values: vec![string(&only)],
            })),
        },
        string(&format!("{only}, 10.255.255.1:1")),
        // A bare IP allows every port of the host: all three replicas share 127.0.0.1.
        string("127.0.0.1"),
    ] {
        let bare = matches!(&hint.kind, Some(Kind::StringValue(s)) if s == "127.0.0.1");
        for _ in 0..6 {
            let mut stream = Stream::open(grpc.clone()).await.expect("stream opens");
            let headers = request_headers(GENERATE, &[], false, Some(subset(hint.clone())));
            let chosen = pick_with(&mut stream, headers, &body).await;
            if bare {
                assert!(chosen.immediate.is_none(), "{chosen:?}");
            } else {
                assert_eq!(chosen.header, only, "{hint:?}");
                let scored: Vec<&str> = chosen.scores.iter().map(|(a, _)| a.as_str()).collect();
                assert_eq!(
                    scored,
                    [only.as_str()],
                    "only the allowed endpoint is scored"
                );
            }
        }
    }
    // Present but naming nobody in the pool: 503, no endpoints.
    for hint in [string(""), string("10.255.255.1:1")] {
        let mut stream = Stream::open(grpc.clone()).await.expect("stream opens");
        let headers = request_headers(GENERATE, &[], false, Some(subset(hint)));
        let chosen = pick_with(&mut stream, headers, &body).await;
        let immediate = chosen.immediate.expect("an immediate response");
        assert_eq!(immediate.status, 503);
        assert!(immediate.headers.contains(&(
            "x-llm-d-request-dropped-reason".into(),
            "rejected-no-endpoints".into()
        )));
    }
    assert_idle(&picker, "at the end").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_and_rejections_get_the_reference_errors() {
    let replicas = replicas(1).await;
    let dir = temp_dir("extproc-errors");
    let config = windowless(
        &replicas,
        "[serve]\nmax_in_flight = 1\nmax_body_bytes = 4096\n",
    );
    let picker = start_picker(&dir, &config, &[]).await;
    let grpc = channel(picker.grpc()).await;
    let cases: &[(&str, &str, u16, &str)] = &[
        (GENERATE, "{\"token_ids\":", 400, "invalid_body"),
        (GENERATE, r#"{"model":"m"}"#, 400, "invalid_body"),
        ("/v1/completions", r#"{"prompt":"hi"}"#, 400, "invalid_body"),
        (
            "/v1/embeddings",
            r#"{"model":"m","input":"x"}"#,
            404,
            "unknown_route",
        ),
    ];
    for (n, (path, body, status, code)) in cases.iter().enumerate() {
        let mut stream = Stream::open(grpc.clone()).await.expect("stream opens");
        // The client's x-request-id comes back; without one, a generated one does.
        let id = format!("bad-{n}");
        let extra = [("x-request-id", id.as_str())];
        let extra: &[(&str, &str)] = if n % 2 == 0 { &extra } else { &[] };
        let chosen = pick(&mut stream, path, extra, body).await;
        let immediate = chosen.immediate.expect("an immediate response");
        let (got, headers, text) = (immediate.status, immediate.headers, immediate.body);
        let answered_id = headers
            .iter()
            .find(|(name, _)| name == "x-request-id")
            .map(|(_, value)| value.clone());
        match extra.first() {
            Some((_, sent)) => assert_eq!(answered_id.as_deref(), Some(*sent), "{path}"),
            None => assert!(
                answered_id.is_some_and(|generated| !generated.is_empty()),
                "{path}: no x-request-id in {headers:?}"
            ),
        }
        assert_eq!(got, *status, "{path} {body}: {text}");
        let error: serde_json::Value = serde_json::from_str(&text).expect("JSON error body");
        assert_eq!(error["error"]["code"], *code, "{text}");
        assert!(error["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        assert!(headers.contains(&("content-type".into(), "application/json".into())));
    }
    // Too large a body: 413 before the whole body is in.
    let mut stream = Stream::open(grpc.clone()).await.expect("stream opens");
    stream
        .send(request_headers(GENERATE, &[], false, None))
        .await;
    stream.send(request_body(&[b' '; 3000], false)).await;
    stream.send(request_body(&[b' '; 3000], true)).await;
    let chosen = switchyard_tests::extproc::read_pick(&mut stream).await;
    assert_eq!(chosen.immediate.expect("immediate").status, 413);

    // Saturated: the one allowed request is in flight, the next gets 429.
    let body = generate(&[1, 2, 3, 4]);
    let mut held = Stream::open(grpc.clone()).await.expect("stream opens");
    assert!(pick(&mut held, GENERATE, &[], &body)
        .await
        .immediate
        .is_none());
    let mut stream = Stream::open(grpc.clone()).await.expect("stream opens");
    let rejected = pick(&mut stream, GENERATE, &[], &body)
        .await
        .immediate
        .expect("rejected");
    assert_eq!(rejected.status, 429);
    assert!(rejected.headers.contains(&(
        "x-llm-d-request-dropped-reason".into(),
        "rejected-saturated".into()
    )));
    drop(held);
    assert_idle(&picker, "after the saturation").await;

    // An Envoy filter configured for buffered bodies is refused at once, not left to stall.
    let mut stream = Stream::open(grpc.clone()).await.expect("stream opens");
    let mut headers = request_headers(GENERATE, &[], false, None);
    headers.protocol_config = Some(ProtocolConfiguration {
        request_body_mode: BodySendMode::Buffered as i32,
        response_body_mode: BodySendMode::FullDuplexStreamed as i32,
        send_body_without_waiting_for_header_response: false,
    });
    stream.send(headers).await;
    let status = stream.next().await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("FULL_DUPLEX_STREAMED") && status.message().contains("BUFFERED"),
        "{}",
        status.message()
    );

    // The full-duplex configuration passes; a body-less request gets an endpoint too.
    let mut stream = Stream::open(grpc.clone()).await.expect("stream opens");
    let mut headers = request_headers("/v1/models", &[], true, None);
    headers.protocol_config = Some(ProtocolConfiguration {
        request_body_mode: BodySendMode::FullDuplexStreamed as i32,
        response_body_mode: BodySendMode::FullDuplexStreamed as i32,
        send_body_without_waiting_for_header_response: true,
    });
    stream.send(headers).await;
    let answer = stream.next().await.expect("no error").expect("an answer");
    let text = format!("{answer:?}");
    assert!(text.contains(&replicas[0].addr.to_string()), "{text}");
}

async fn health(picker: &Picker, service: &str) -> ServingStatus {
    let channel = channel(picker.health).await;
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_string(),
        })
        .await
        .expect("health answers")
        .into_inner();
    ServingStatus::try_from(answer.status).expect("a known status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_services_follow_the_fleet_and_the_drain() {
    let replicas = replicas(1).await;
    let dir = temp_dir("extproc-health");
    let mut picker = start_picker(&dir, &windowless(&replicas, ""), &[]).await;
    let services = [
        "",
        "liveness",
        "readiness",
        "envoy.service.ext_proc.v3.ExternalProcessor",
        "inference-extension",
    ];
    let ready = eventually(Duration::from_secs(5), || async {
        health(&picker, "readiness").await == ServingStatus::Serving
    })
    .await;
    assert!(ready, "ready once the replica's metrics are fresh");
    for service in services {
        assert_eq!(
            health(&picker, service).await,
            ServingStatus::Serving,
            "{service}"
        );
    }
    assert_eq!(picker.process.terminate(Duration::from_secs(10)), Some(0));

    // A fleet with no fresh endpoint: alive, not ready.
    let dir = temp_dir("extproc-unready");
    let unreachable = "[[endpoints]]\nname = \"gone\"\naddress = \"127.0.0.1:1\"\n";
    let config = format!("[fleet]\nscrape_interval_ms = 50\n{unreachable}");
    let picker = start_picker(&dir, &config, &[]).await;
    assert_eq!(health(&picker, "liveness").await, ServingStatus::Serving);
    for service in ["readiness", "envoy.service.ext_proc.v3.ExternalProcessor"] {
        assert_eq!(
            health(&picker, service).await,
            ServingStatus::NotServing,
            "{service}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_given_certificate_a_self_signed_one_and_plain_text() {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig};
    let replicas = replicas(1).await;
    let dir = temp_dir("extproc-tls");
    let certified =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).expect("cert dir");
    std::fs::write(certs.join("tls.crt"), certified.cert.pem()).expect("cert written");
    std::fs::write(certs.join("tls.key"), certified.signing_key.serialize_pem())
        .expect("key written");
    let cert_flag = format!("--cert-path={}", certs.display());
    let picker = start_picker(
        &dir,
        &windowless(&replicas, ""),
        &["--secure-serving", &cert_flag],
    )
    .await;
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(certified.cert.pem()))
        .domain_name("localhost");
    let secure = Channel::from_shared(format!("https://{}", picker.grpc()))
        .expect("uri")
        .tls_config(tls)
        .expect("tls config")
        .connect()
        .await
        .expect("TLS handshake with the given certificate");
    let mut stream = Stream::open(secure).await.expect("stream opens");
    let chosen = pick(&mut stream, GENERATE, &[], &generate(&[1, 2, 3])).await;
    assert_eq!(chosen.header, replicas[0].addr.to_string());
    drop(stream);

    // Plain text against the TLS port gets nowhere.
    let plain = channel(picker.grpc()).await;
    assert!(
        Stream::open(plain).await.is_err(),
        "plain text refused on a TLS port"
    );

    // The default: TLS with a self-signed certificate made at start-up.
    let dir = temp_dir("extproc-self-signed");
    let picker = start_picker(&dir, &windowless(&replicas, ""), &["--secure-serving"]).await;
    let plain = channel(picker.grpc()).await;
    assert!(
        Stream::open(plain).await.is_err(),
        "plain text refused on a TLS port"
    );
    assert!(picker.log().contains("tls=true"), "{}", picker.log());
}

#[test]
fn reference_flags_switchyard_does_not_support_are_refused_with_the_alternative() {
    for (flag, expected) in [
        ("--ha-enable-leader-election", "leader election"),
        ("--config-text=plugins: []", "--config-file"),
        ("--tracing=true", "--tracing=false"),
        ("--tracing", "--tracing=false"),
    ] {
        let output = std::process::Command::new(binary())
            .args(["ext-proc", "--secure-serving=false", flag])
            .output()
            .expect("binary runs");
        assert!(!output.status.success(), "{flag} accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{flag}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_response_bodies_the_response_headers_end_the_request() {
    let replicas = replicas(1).await;
    let dir = temp_dir("extproc-no-bodies");
    let picker = start_picker(&dir, &windowless(&replicas, ""), &[]).await;
    let grpc = channel(picker.grpc()).await;
    let mut stream = Stream::open(grpc).await.expect("stream opens");
    let mut headers = request_headers(GENERATE, &[], false, None);
    headers.protocol_config = Some(ProtocolConfiguration {
        request_body_mode: BodySendMode::FullDuplexStreamed as i32,
        response_body_mode: BodySendMode::None as i32,
        send_body_without_waiting_for_header_response: true,
    });
    let chosen = pick_with(&mut stream, headers, &generate(&[4, 5, 6])).await;
    assert_eq!(chosen.header, replicas[0].addr.to_string());
    assert_eq!(in_flight(&picker).await, 1.0);
    stream
        .send(switchyard_tests::extproc::response_headers(200))
        .await;
    let _ = stream.next().await;
    assert_idle(&picker, "after the response headers").await;
    let page = metrics_page(picker.metrics).await;
    assert!(page.contains("outcome=\"completed\""), "{page}");
    drop(stream);
}

/// Reads a raw stream's answers to a request up to the end of the echoed body; returns the
/// destination.
async fn raw_pick(stream: &mut RawStream) -> String {
    let mut destination = None;
    loop {
        let answer = stream
            .next()
            .await
            .expect("the picker answers before ending the stream");
        match answer.response {
            Some(Answer::RequestHeaders(headers)) => {
                let set = headers
                    .response
                    .and_then(|c| c.header_mutation)
                    .map(|m| m.set_headers)
                    .unwrap_or_default();
                destination = set
                    .into_iter()
                    .filter_map(|o| o.header)
                    .find(|h| h.key == "x-gateway-destination-endpoint")
                    .map(|h| String::from_utf8_lossy(&h.raw_value).into_owned());
            }
            Some(Answer::RequestBody(body)) => {
                let text = format!("{body:?}");
                if text.contains("end_of_stream: true") {
                    return destination.expect("the destination comes before the echo");
                }
            }
            other => panic!("unexpected answer while picking: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_cancelled_streams_leaves_the_connection_and_a_tracked_stream_alone() {
    let replicas = replicas(1).await;
    let dir = temp_dir("extproc-resets");
    let picker = start_picker(&dir, &windowless(&replicas, ""), &[]).await;
    let connection = RawConnection::connect(picker.grpc()).await;
    let body = generate(&[1, 2, 3, 4, 5, 6]);

    let mut tracked = connection.open().await.expect("stream opens");
    tracked.send(request_headers(GENERATE, &[], false, None));
    tracked.send(request_body(body.as_bytes(), true));
    let destination = raw_pick(&mut tracked).await;
    assert_eq!(destination, replicas[0].addr.to_string());

    // What Envoy does when a thousand clients go away at once: each stream is opened, gets
    // its first message and is reset, all on the one connection.
    for _ in 0..1000 {
        let mut cancelled = connection.open().await.expect("stream opens");
        cancelled.send(request_headers(GENERATE, &[], false, None));
        drop(cancelled);
    }

    tracked.send(response_headers(200));
    match tracked.next().await.and_then(|m| m.response) {
        Some(Answer::ResponseHeaders(_)) => {}
        other => panic!("expected a response-headers answer, got {other:?}"),
    }
    tracked.send(response_body(br#"{"usage":{"completion_tokens":3}}"#, true));
    match tracked.next().await.and_then(|m| m.response) {
        Some(Answer::ResponseBody(_)) => {}
        other => panic!("expected a response-body answer, got {other:?}"),
    }
    tracked.half_close();
    assert_eq!(tracked.status().await, (0, String::new()));
    assert_idle(&picker, "after the tracked stream").await;

    let mut next = connection
        .open()
        .await
        .expect("the connection takes new streams");
    next.send(request_headers(GENERATE, &[], false, None));
    next.send(request_body(body.as_bytes(), true));
    raw_pick(&mut next).await;
    let page = metrics_page(picker.metrics).await;
    assert!(
        page.contains("switchyard_completion_tokens_total 3"),
        "{page}"
    );
}

fn log_lines(picker: &Picker, text: &str) -> usize {
    picker
        .log()
        .lines()
        .filter(|line| line.contains(text))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_messages_end_their_stream_with_a_status_a_log_line_and_a_count() {
    let replicas = replicas(1).await;
    let dir = temp_dir("extproc-unreadable");
    let picker = start_picker(
        &dir,
        &windowless(&replicas, ""),
        &["--grpc-max-recv-msg-size=1024"],
    )
    .await;

    // Bytes that are no ProcessingRequest.
    let connection = RawConnection::connect(picker.grpc()).await;
    let mut stream = connection.open().await.expect("stream opens");
    stream.send(request_headers(GENERATE, &[], false, None));
    stream.send_frame(&[0xff; 16]);
    let (code, message) = stream.status().await;
    assert_eq!(code, tonic::Code::Internal as i32, "{message}");

    // A well-formed message over --grpc-max-recv-msg-size.
    let grpc = channel(picker.grpc()).await;
    let mut stream = Stream::open(grpc.clone()).await.expect("stream opens");
    stream
        .send(request_headers(GENERATE, &[], false, None))
        .await;
    stream.send(request_body(&[b' '; 2000], true)).await;
    let status = stream.next().await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("1024"), "{status:?}");

    let page = metrics_page(picker.metrics).await;
    for code in ["internal", "resource_exhausted"] {
        let line = format!("switchyard_broken_messages_total{{code=\"{code}\"}} 1");
        assert!(page.contains(&line), "{line}\n{page}");
    }
    let logged = eventually(Duration::from_secs(5), || async {
        log_lines(&picker, "ext_proc message refused") == 2
    })
    .await;
    assert!(logged, "one warning per refused message\n{}", picker.log());
    assert!(picker
        .log()
        .lines()
        .filter(|l| l.contains("ext_proc message refused"))
        .all(|l| l.contains("WARN")));

    // Both connections still serve.
    let mut stream = Stream::open(grpc).await.expect("stream opens");
    let chosen = pick(&mut stream, GENERATE, &[], &generate(&[1, 2])).await;
    assert_eq!(chosen.header, replicas[0].addr.to_string());
    let mut raw = connection.open().await.expect("stream opens");
    raw.send(request_headers(GENERATE, &[], false, None));
    raw.send(request_body(generate(&[3, 4]).as_bytes(), true));
    assert_eq!(raw_pick(&mut raw).await, replicas[0].addr.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_beyond_the_cap_waits_until_one_closes() {
    let replicas = replicas(1).await;
    let dir = temp_dir("extproc-connection-cap");
    let picker = start_picker(
        &dir,
        &windowless(&replicas, ""),
        &["--grpc-max-connections=1"],
    )
    .await;
    let replica = replicas[0].addr.to_string();
    let body = generate(&[5, 6, 7]);

    let first = channel(picker.grpc()).await;
    let mut stream = Stream::open(first.clone()).await.expect("stream opens");
    assert_eq!(
        pick(&mut stream, GENERATE, &[], &body).await.header,
        replica
    );

    let addr = picker.grpc();
    let later = body.clone();
    let second = tokio::spawn(async move {
        let grpc = channel(addr).await;
        let mut stream = Stream::open(grpc).await.expect("stream opens");
        pick(&mut stream, GENERATE, &[], &later).await.header
    });
    let deferred = eventually(Duration::from_secs(10), || async {
        metric_sum(
            &metrics_page(picker.metrics).await,
            "switchyard_connection_cap_reached_total",
        ) == 1.0
    })
    .await;
    let page = metrics_page(picker.metrics).await;
    assert!(deferred, "the second connection is held\n{page}");
    assert_eq!(
        metric_sum(&page, "switchyard_connections_open"),
        1.0,
        "{page}"
    );
    assert!(
        !second.is_finished(),
        "not served while the first connection is open"
    );

    drop(stream);
    drop(first);
    let served = tokio::time::timeout(Duration::from_secs(15), second)
        .await
        .expect("served once the first connection closed")
        .expect("the second client ran");
    assert_eq!(served, replica);
    let page = metrics_page(picker.metrics).await;
    assert_eq!(
        metric_sum(&page, "switchyard_connection_cap_reached_total"),
        1.0,
        "{page}"
    );
    assert!(log_lines(&picker, "--grpc-max-connections = 1") >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_streams_is_closed_after_the_idle_timeout() {
    let replicas = replicas(1).await;
    let dir = temp_dir("extproc-idle-timeout");
    let picker = start_picker(
        &dir,
        &windowless(&replicas, ""),
        &["--grpc-idle-timeout=1s"],
    )
    .await;
    let open = |expected: f64| {
        let metrics = picker.metrics;
        async move {
            eventually(Duration::from_secs(10), || async {
                metric_sum(&metrics_page(metrics).await, "switchyard_connections_open") == expected
            })
            .await
        }
    };

    // One connection holds a stream (picked, its response not yet under way); one has none.
    let busy = channel(picker.grpc()).await;
    let mut stream = Stream::open(busy).await.expect("stream opens");
    let chosen = pick(&mut stream, GENERATE, &[], &generate(&[4, 2])).await;
    assert_eq!(chosen.header, replicas[0].addr.to_string());
    let _idle = channel(picker.grpc()).await;
    assert!(open(2.0).await, "both connections open");
    assert!(open(1.0).await, "the connection without a stream is closed");
    // Twice the timeout later the busy connection is still there.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        metric_sum(
            &metrics_page(picker.metrics).await,
            "switchyard_connections_open"
        ),
        1.0,
        "a connection with an open stream is not idle"
    );
    stream.half_close();
    drop(stream);
    assert!(open(0.0).await, "idle once its stream ended, then closed");
    assert_idle(&picker, "after the idle connections closed").await;
}
