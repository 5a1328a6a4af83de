use super::*;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::Value;

fn options() -> MockOptions {
    MockOptions {
        decode_tokens_per_second: 2000.0,
        block_size: 4,
        ..MockOptions::new(0, "r1", "m")
    }
}

/// Sends one request on a fresh connection.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Response<Incoming> {
    let stream = TcpStream::connect(addr).await.expect("connects");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "mock");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    sender.send_request(request).await.expect("response")
}

async fn text(response: Response<Incoming>) -> String {
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

async fn metric(addr: SocketAddr, name: &str) -> f64 {
    let page = text(send(addr, "GET", "/metrics", &[], "").await).await;
    page.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from\n{page}"))
}

#[test]
fn bad_flags_are_named() {
    let o = MockOptions {
        block_size: 0,
        ..options()
    };
    assert!(o.fleet().unwrap_err().starts_with("--block-size: "));
    let o = MockOptions {
        decode_tokens_per_second: f64::NAN,
        ..options()
    };
    assert!(o
        .fleet()
        .unwrap_err()
        .starts_with("--decode-tokens-per-second: "));
}

#[tokio::test]
async fn completion_answers_with_usage_and_the_cache_hits_on_repeat() {
    let server = start(options()).await.expect("starts");
    let body = r#"{"model": "m", "prompt": "0123456789abcdefXY", "max_tokens": 5}"#;
    let first = send(
        server.addr,
        "POST",
        "/v1/completions",
        &[("x-request-id", "q1")],
        body,
    )
    .await;
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["x-mock-replica"], "r1");
    assert_eq!(first.headers()["x-request-id"], "q1");
    let first: Value = serde_json::from_str(&text(first).await).unwrap();
    assert_eq!(first["usage"]["prompt_tokens"], 5);
    assert_eq!(first["usage"]["completion_tokens"], 5);
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(first["choices"][0]["text"], " the mock replica says hello");

    let second = send(server.addr, "POST", "/v1/completions", &[], body).await;
    let second: Value = serde_json::from_str(&text(second).await).unwrap();
    // 5 tokens in blocks of 4: the one full block is cached.
    assert_eq!(second["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
    assert_eq!(
        metric(server.addr, "vllm:prefix_cache_hits_total").await,
        4.0
    );
    assert_eq!(
        metric(server.addr, "vllm:prefix_cache_queries_total").await,
        10.0
    );
    assert_eq!(metric(server.addr, "vllm:request_success_total").await, 2.0);
    assert_eq!(
        metric(server.addr, "vllm:generation_tokens_total").await,
        10.0
    );
}

#[tokio::test]
async fn streamed_chat_arrives_in_chunks_and_ends_with_done() {
    let server = start(options()).await.expect("starts");
    let body = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40,
                   "stream": true, "stream_options": {"include_usage": true}}"#;
    let response = send(server.addr, "POST", "/v1/chat/completions", &[], body).await;
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            frames.push(String::from_utf8_lossy(&data).into_owned());
        }
    }
    let all = frames.concat();
    assert!(all.ends_with("data: [DONE]\n\n"), "{all}");
    let events: Vec<Value> = all
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).expect("chunk is JSON"))
        .collect();
    let content: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    let expected: String = (0..40).map(api::token_text).collect();
    assert_eq!(content, expected);
    assert!(events.len() >= 4, "{} events", events.len());
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let usage = &events.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 40);
}

#[tokio::test]
async fn a_client_leaving_mid_stream_frees_its_slot() {
    let server = start(MockOptions {
        decode_tokens_per_second: 100.0,
        ..options()
    })
    .await
    .expect("starts");
    let body = r#"{"prompt": "hello", "max_tokens": 2000, "stream": true}"#;
    let response = send(server.addr, "POST", "/v1/completions", &[], body).await;
    let mut body = response.into_body();
    body.frame().await.expect("a first chunk").expect("frame");
    assert_eq!(metric(server.addr, "vllm:num_requests_running").await, 1.0);
    drop(body);
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(server.addr, "vllm:num_requests_running").await != 0.0 {
        assert!(Instant::now() < deadline, "the request is still running");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(metric(server.addr, "vllm:request_success_total").await, 0.0);
}

#[tokio::test]
async fn errors_and_injected_statuses_are_openai_shaped() {
    let server = start(options()).await.expect("starts");
    let r = send(server.addr, "POST", "/v1/completions", &[], "{oops").await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()["x-mock-replica"], "r1");
    let v: Value = serde_json::from_str(&text(r).await).unwrap();
    assert_eq!(v["error"]["code"], 400);

    let r = send(
        server.addr,
        "POST",
        "/v1/completions",
        &[("x-mock-fault", "status=503")],
        "{}",
    )
    .await;
    assert_eq!(r.status(), 503);
    let v: Value = serde_json::from_str(&text(r).await).unwrap();
    assert_eq!(v["error"]["type"], "ServiceUnavailableError");

    let r = send(server.addr, "GET", "/v1/models", &[], "").await;
    let v: Value = serde_json::from_str(&text(r).await).unwrap();
    assert_eq!(v["data"][0]["id"], "m");
    assert_eq!(
        send(server.addr, "GET", "/nope", &[], "").await.status(),
        404
    );
    assert_eq!(
        send(server.addr, "GET", "/v1/completions", &[], "")
            .await
            .status(),
        405
    );
    assert_eq!(
        send(server.addr, "GET", "/health", &[], "").await.status(),
        200
    );
}

#[tokio::test]
async fn metrics_page_has_vllm_names_and_the_model_label() {
    let server = start(options()).await.expect("starts");
    let page = text(send(server.addr, "GET", "/metrics", &[], "").await).await;
    for line in [
        "vllm:num_requests_running{model_name=\"m\"} 0",
        "vllm:num_requests_waiting{model_name=\"m\"} 0",
        "vllm:kv_cache_usage_perc{model_name=\"m\"} 0",
        "vllm:cache_config_info{block_size=\"4\",num_gpu_blocks=\"16384\",model_name=\"m\"} 1",
        "# TYPE vllm:prefix_cache_hits_total counter",
        "vllm:prompt_tokens_total{model_name=\"m\"} 0",
    ] {
        assert!(
            page.lines().any(|l| l == line),
            "{line} missing from\n{page}"
        );
    }
}

#[tokio::test]
async fn a_tokenizer_file_encodes_completions_text_and_a_bad_one_stops_the_start() {
    let dir = std::env::temp_dir().join(format!("switchyard-mock-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let missing = dir.join("absent.json");
    let error = start(MockOptions {
        tokenizer: Some(missing.clone()),
        ..options()
    })
    .await
    .err()
    .expect("refused");
    assert!(
        error.starts_with(&format!(
            "--tokenizer: cannot read tokenizer file {}: ",
            missing.display()
        )),
        "{error}"
    );
    let tokenizer = crate::pipeline::tokenize::tests::loaded(true, 1 << 20);
    let body = br#"{"prompt": "hello world again", "max_tokens": 1}"#;
    let parsed = api::parse(api::Api::Completions, body, &tokenizer).expect("parses");
    assert_eq!(parsed.prompts, vec![vec![0, 2, 3, 4]]);
}
