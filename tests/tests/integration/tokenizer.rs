//! The `token-producer`'s `tokenizer.json`: `replay` tokenizes text with the backend its
//! config names, as the live drivers do, and its decision records say which requests kept the
//! estimate and why; `serve` reads the file again on a reload. (Text matched against the
//! engines' KV events: `kv_events.rs`.)

use serde_json::Value;
use switchyard::config::LoadedConfig;
use switchyard::pipeline::{build, load_registry, Scheduler};
use switchyard::replay;
use switchyard_tests::live::{
    endpoints_toml, fast_replicas, json, post_ok, send, start_router, temp_dir, word_tokenizer,
    Router,
};
use switchyard_tests::{endpoints, options};

/// One completions text, the same text as a list of token ids, and one chat request.
const INPUT: &str = r#"{"arrival_ms": 0, "id": "text", "prompt": "w1 w2 w3"}
{"arrival_ms": 1, "id": "ids", "prompt": [0, 3, 4, 5]}
{"arrival_ms": 2, "id": "chat", "messages": [{"role": "user", "content": "w1 w2 w3"}]}
"#;

/// Replays `INPUT` through a pipeline whose token-producer has `parameters`, with records;
/// returns the token producer's note on each request (`None` when its ids are exact).
fn notes(tag: &str, parameters: &str) -> Vec<(String, Option<String>)> {
    let dir = temp_dir(tag);
    word_tokenizer(&dir);
    let text = format!(
        "{}\n[[plugins]]\ntype = \"token-producer\"\n[plugins.parameters]\n{parameters}\n\n\
         [[plugins]]\ntype = \"queue-scorer\"\n",
        endpoints(2)
    );
    let path = dir.join("replay.toml");
    std::fs::write(&path, &text).expect("config written");
    let config = LoadedConfig::read(&path).expect("config reads");
    let options = options();
    let registry = load_registry(&config, &options).expect("registry");
    let pipeline = build(&config, &registry, &options).expect("pipeline wires");
    let lines = replay::read_input(INPUT.as_bytes()).expect("input parses");
    let fleet = replay::fleet_from_config(&config.config.endpoints);
    let mut scheduler = Scheduler::new(std::sync::Arc::new(pipeline), fleet, 0);
    let mut out = Vec::new();
    replay::run(&mut scheduler, &lines, true, &mut out).expect("replay runs");
    String::from_utf8(out)
        .expect("utf-8")
        .lines()
        .map(|line| {
            let decision: Value = serde_json::from_str(line).expect("JSON line");
            let id = decision["id"].as_str().unwrap_or_default().to_string();
            (id, token_producer_note(&decision))
        })
        .collect()
}

#[test]
fn replay_tokenizes_text_with_the_configured_tokenizer() {
    let with = notes(
        "replay-tokenizer",
        "tokenizer = { path = \"tokenizer.json\" }",
    );
    assert_eq!(
        with,
        [
            ("text".to_string(), None),
            ("ids".to_string(), None),
            (
                "chat".to_string(),
                Some("estimated: chat: no chat template".to_string())
            ),
        ]
    );
    let without = notes("replay-estimate", "estimate = {}");
    let estimated = Some("estimated: no tokenizer configured".to_string());
    assert_eq!(
        without,
        [
            ("text".to_string(), estimated.clone()),
            ("ids".to_string(), None),
            ("chat".to_string(), estimated),
        ]
    );
    let bounded = notes(
        "replay-bounded",
        "tokenizer = { path = \"tokenizer.json\" }\nmaxPromptBytes = 4",
    );
    assert_eq!(
        bounded[0].1.as_deref(),
        Some("estimated: the text is 8 bytes, over maxPromptBytes = 4")
    );
}

/// The token producer's note in a decision record (`None` when the ids are exact).
fn token_producer_note(record: &Value) -> Option<String> {
    record["decision"]["producers"]
        .as_array()
        .and_then(|all| all.iter().find(|p| p["name"] == "token-producer"))
        .and_then(|p| p["attributes"][0]["value"]["text"].as_str())
        .map(str::to_owned)
}

/// The token producer's note in the latest decision record of `router`, after sending it a
/// text completion.
async fn note_on_text(router: &Router) -> Option<String> {
    let body = serde_json::json!({"model": "test-model", "prompt": "w1 w2 w3", "max_tokens": 1});
    post_ok(router.api(), "/v1/completions", &body).await;
    let decisions = json(send(router.admin, "GET", "/decisions?limit=1", &[], "").await).await;
    token_producer_note(&decisions[0])
}

async fn reload(router: &Router) -> Value {
    json(send(router.admin, "POST", "/reload", &[], "").await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reads_the_tokenizer_file_again_and_refuses_a_broken_one() {
    let replicas = fast_replicas(1, &[]).await;
    let dir = temp_dir("reload-tokenizer");
    let file = word_tokenizer(&dir);
    let config = format!(
        "{}\n[[plugins]]\ntype = \"token-producer\"\n[plugins.parameters]\nestimate = {{}}\n\n\
         [[plugins]]\ntype = \"queue-scorer\"\n",
        endpoints_toml(&replicas)
    );
    let router = start_router(&dir, &config, "", &[]).await;
    assert_eq!(
        note_on_text(&router).await.as_deref(),
        Some("estimated: no tokenizer configured")
    );

    let path = dir.join("serve.toml");
    let text = std::fs::read_to_string(&path).expect("config");
    let with_file = text.replace("estimate = {}", "tokenizer = { path = \"tokenizer.json\" }");
    assert_ne!(with_file, text);
    std::fs::write(&path, with_file).expect("config written");
    let applied = reload(&router).await;
    assert_eq!(applied["result"], "applied", "{applied}");
    assert_eq!(
        note_on_text(&router).await,
        None,
        "the text is tokenized exactly"
    );

    // The file is read again on reload: a broken one is refused, naming it, and the running
    // pipeline keeps its tokenizer.
    std::fs::write(&file, "{\"model\": ").expect("file broken");
    let refused = reload(&router).await;
    assert_eq!(refused["result"], "refused", "{refused}");
    let reason = refused["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!(
            "tokenizer file {file} is not a valid tokenizer.json"
        )),
        "{refused}"
    );
    assert_eq!(note_on_text(&router).await, None);
}
