//! The OpenAI-shaped surface: reading completions, chat and generate bodies into token ids
//! and an output length, and writing answers, stream chunks and error bodies.
//!
//! Prompts are tokenized as the host tokenizes them (`PromptTokenizer`: the estimate, or with
//! `--tokenizer` a model's `tokenizer.json` as vLLM uses it), so a router hashing the same
//! request agrees with this replica about which blocks it shares.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::pipeline::tokenize::PromptTokenizer;
use crate::pipeline::{ChatMessage, Prompt};

/// Output length when the request names none.
pub const DEFAULT_MAX_TOKENS: u32 = 16;
/// Longest output served.
pub const MAX_TOKENS_CAP: u32 = 4096;

/// Which route a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
    Generate,
}

/// An error answered with an OpenAI-shaped body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
        }
    }

    /// `{"error": {"message", "type", "code"}}`.
    pub fn body(&self) -> Bytes {
        let kind = match self.status {
            400 => "BadRequestError",
            401 => "AuthenticationError",
            403 => "PermissionDeniedError",
            404 => "NotFoundError",
            405 => "MethodNotAllowedError",
            408 => "RequestTimeoutError",
            413 => "RequestTooLargeError",
            422 => "UnprocessableEntityError",
            429 => "RateLimitError",
            503 => "ServiceUnavailableError",
            s if s >= 500 => "InternalServerError",
            _ => "APIError",
        };
        let body = json!({
            "error": {"message": self.message, "type": kind, "param": null, "code": self.status}
        });
        Bytes::from(body.to_string())
    }
}

/// What the replica needs from a request body.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// Token ids, one list per choice.
    pub prompts: Vec<Vec<u32>>,
    pub output_tokens: u32,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk carries the usage.
    pub include_usage: bool,
    pub cache_salt: String,
}

pub fn parse(api: Api, body: &[u8], tokenizer: &PromptTokenizer) -> Result<Parsed, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
    let Value::Object(fields) = &value else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    let prompts = match api {
        Api::Completions => {
            tokenizer
                .tokenize(completion_prompt(fields.get("prompt"))?)
                .prompts
        }
        Api::Chat => {
            tokenizer
                .tokenize(chat_prompt(fields.get("messages"))?)
                .prompts
        }
        Api::Generate => vec![token_list(
            fields.get("token_ids").unwrap_or(&Value::Null),
            "token_ids",
        )?],
    };
    let sampling = fields.get("sampling_params").and_then(Value::as_object);
    let max_tokens = [
        fields.get("max_tokens"),
        fields.get("max_completion_tokens"),
        sampling.and_then(|s| s.get("max_tokens")),
    ]
    .into_iter()
    .flatten()
    .find(|v| !v.is_null());
    let output_tokens = match max_tokens {
        None => DEFAULT_MAX_TOKENS,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => n.min(u64::from(MAX_TOKENS_CAP)) as u32,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "max_tokens must be an integer of at least 1 (got {v})"
                )))
            }
        },
    };
    let stream = match fields.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "stream must be a boolean (got {other})"
            )))
        }
    };
    let include_usage = fields
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let cache_salt = match fields.get("cache_salt") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "cache_salt must be a string (got {other})"
            )))
        }
    };
    Ok(Parsed {
        prompts,
        output_tokens,
        stream,
        include_usage,
        cache_salt,
    })
}

/// `prompt`: a string, a list of strings (one prompt each), a list of token ids, or a list of
/// such lists.
fn completion_prompt(prompt: Option<&Value>) -> Result<Prompt, ApiError> {
    match prompt {
        Some(Value::String(text)) => Ok(Prompt::Text(text.clone())),
        Some(Value::Array(items)) if !items.is_empty() => {
            if items.iter().all(Value::is_string) {
                Ok(Prompt::Texts(
                    items
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect(),
                ))
            } else if items.iter().all(Value::is_array) {
                let lists = items
                    .iter()
                    .map(|item| token_list(item, "prompt"))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Prompt::Tokens(lists))
            } else {
                Ok(Prompt::Tokens(vec![token_list(
                    &Value::Array(items.clone()),
                    "prompt",
                )?]))
            }
        }
        Some(Value::Array(_)) => Err(ApiError::bad_request("prompt must not be empty")),
        None | Some(Value::Null) => Err(ApiError::bad_request("prompt is required")),
        Some(other) => Err(ApiError::bad_request(format!(
            "prompt must be a string, a list of strings or a list of token ids (got {other})"
        ))),
    }
}

/// A list of token ids, each fitting in `u32`.
fn token_list(value: &Value, field: &str) -> Result<Vec<u32>, ApiError> {
    let Value::Array(items) = value else {
        return Err(ApiError::bad_request(format!(
            "{field} must be a list of token ids"
        )));
    };
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "{field} holds {v}, which is not a token id (0..=4294967295)"
                    ))
                })
        })
        .collect()
}

/// `messages`: role and content, content a string or a list of parts whose `text` parts count,
/// one per line.
fn chat_prompt(messages: Option<&Value>) -> Result<Prompt, ApiError> {
    let Some(Value::Array(items)) = messages else {
        return Err(ApiError::bad_request("messages must be a list"));
    };
    if items.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty"));
    }
    let mut chat = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Some(role) = item.get("role").and_then(Value::as_str) else {
            return Err(ApiError::bad_request(format!(
                "messages[{i}].role must be a string"
            )));
        };
        let content = match item.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            // One line per text part, as vLLM joins them.
            Some(Value::Array(parts)) => parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "messages[{i}].content must be a string or a list of parts (got {other})"
                )))
            }
        };
        chat.push(ChatMessage {
            role: role.to_string(),
            content,
            unrendered: None,
        });
    }
    Ok(Prompt::Chat(chat))
}

const WORDS: [&str; 12] = [
    " the",
    " mock",
    " replica",
    " says",
    " hello",
    " from",
    " a",
    " simulated",
    " model",
    " server",
    " on",
    " time.",
];

/// Text of output token `k` of a choice.
pub fn token_text(k: u32) -> &'static str {
    WORDS[k as usize % WORDS.len()]
}

/// Id of output token `k` of a choice (for `/inference/v1/generate`).
pub fn token_id(k: u32) -> u32 {
    1000 + k % 1000
}

/// Token counts of a whole request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
}

impl Usage {
    fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

/// Writes the answers of one request.
#[derive(Debug, Clone)]
pub struct Render {
    pub api: Api,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Render {
    /// The non-streamed answer: `choices[i]` holds `outputs[i]` tokens.
    pub fn full(&self, outputs: &[u32], usage: Usage) -> Bytes {
        let choices: Vec<Value> = outputs
            .iter()
            .enumerate()
            .map(|(index, &n)| match self.api {
                Api::Completions => json!({
                    "index": index, "text": text_of(0..n), "logprobs": null,
                    "finish_reason": "length", "stop_reason": null,
                }),
                Api::Chat => json!({
                    "index": index,
                    "message": {"role": "assistant", "content": text_of(0..n)},
                    "logprobs": null, "finish_reason": "length", "stop_reason": null,
                }),
                Api::Generate => json!({
                    "index": index, "token_ids": ids_of(0..n), "logprobs": null,
                    "finish_reason": "length",
                }),
            })
            .collect();
        let mut body = self.envelope(self.object(false));
        body["choices"] = Value::Array(choices);
        body["usage"] = usage.to_json();
        Bytes::from(body.to_string())
    }

    /// An SSE event carrying output tokens `from..to` of choice `index`.
    pub fn tokens_chunk(&self, index: usize, from: u32, to: u32) -> Bytes {
        let choice = match self.api {
            Api::Completions => json!({
                "index": index, "text": text_of(from..to), "logprobs": null,
                "finish_reason": null,
            }),
            Api::Chat => {
                let mut delta = json!({"content": text_of(from..to)});
                if from == 0 {
                    delta["role"] = json!("assistant");
                }
                json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": null})
            }
            Api::Generate => json!({
                "index": index, "token_ids": ids_of(from..to), "finish_reason": null,
            }),
        };
        self.event(choice)
    }

    /// The SSE event closing choice `index`.
    pub fn finish_chunk(&self, index: usize) -> Bytes {
        let choice = match self.api {
            Api::Completions => json!({
                "index": index, "text": "", "logprobs": null, "finish_reason": "length",
            }),
            Api::Chat => json!({
                "index": index, "delta": {}, "logprobs": null, "finish_reason": "length",
            }),
            Api::Generate => json!({
                "index": index, "token_ids": [], "finish_reason": "length",
            }),
        };
        self.event(choice)
    }

    /// The SSE event with the request's usage and no choices.
    pub fn usage_chunk(&self, usage: Usage) -> Bytes {
        let mut body = self.envelope(self.object(true));
        body["choices"] = json!([]);
        body["usage"] = usage.to_json();
        sse(&body)
    }

    fn event(&self, choice: Value) -> Bytes {
        let mut body = self.envelope(self.object(true));
        body["choices"] = json!([choice]);
        sse(&body)
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.api, chunk) {
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Generate, _) => "generate",
            (Api::Completions, _) => "text_completion",
        }
    }

    fn envelope(&self, object: &str) -> Value {
        match self.api {
            Api::Generate => json!({"request_id": self.id, "model": self.model}),
            _ => json!({
                "id": self.id, "object": object, "created": self.created, "model": self.model,
            }),
        }
    }
}

/// `data: {json}\n\n`.
fn sse(body: &Value) -> Bytes {
    Bytes::from(format!("data: {body}\n\n"))
}

/// The stream's last event.
pub const SSE_DONE: &[u8] = b"data: [DONE]\n\n";

fn text_of(range: std::ops::Range<u32>) -> String {
    range.map(token_text).collect()
}

fn ids_of(range: std::ops::Range<u32>) -> Vec<u32> {
    range.map(token_id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::tokenize::pack_bytes;

    fn parse_ok(api: Api, body: &str) -> Parsed {
        parse(api, body.as_bytes(), &PromptTokenizer::estimate()).expect("parses")
    }

    fn error(api: Api, body: &str) -> String {
        let e = parse(api, body.as_bytes(), &PromptTokenizer::estimate()).expect_err("refused");
        assert_eq!(e.status, 400);
        e.message
    }

    #[test]
    fn completion_prompts_in_every_shape() {
        let p = parse_ok(Api::Completions, r#"{"prompt": "hello world"}"#);
        assert_eq!(p.prompts, vec![vec![1819043176, 1870078063, 6581362]]);
        assert_eq!((p.output_tokens, p.stream), (DEFAULT_MAX_TOKENS, false));

        let p = parse_ok(Api::Completions, r#"{"prompt": ["ab", "cdef"]}"#);
        assert_eq!(p.prompts, vec![pack_bytes(b"ab"), pack_bytes(b"cdef")]);

        let p = parse_ok(
            Api::Completions,
            r#"{"prompt": [1, 2, 3], "max_tokens": 5}"#,
        );
        assert_eq!((p.prompts, p.output_tokens), (vec![vec![1, 2, 3]], 5));

        let p = parse_ok(
            Api::Completions,
            r#"{"prompt": [[1], [2, 3]], "stream": true}"#,
        );
        assert_eq!((p.prompts, p.stream), (vec![vec![1], vec![2, 3]], true));
    }

    #[test]
    fn chat_content_may_be_text_parts() {
        let plain = parse_ok(
            Api::Chat,
            r#"{"messages": [{"role": "user", "content": "hi\nthere"}]}"#,
        );
        // Text parts one per line, as vLLM joins them.
        let parts = parse_ok(
            Api::Chat,
            r#"{"messages": [{"role": "user", "content": [
                {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}},
                {"type": "text", "text": "there"}]}],
                "max_completion_tokens": 3}"#,
        );
        assert_eq!(plain.prompts, vec![pack_bytes(b"userhi\nthere")]);
        assert_eq!(parts.prompts, plain.prompts);
        assert_eq!(parts.output_tokens, 3);
    }

    #[test]
    fn generate_reads_token_ids_and_sampling_params() {
        let p = parse_ok(
            Api::Generate,
            r#"{"token_ids": [5, 6], "sampling_params": {"max_tokens": 9}, "cache_salt": "s"}"#,
        );
        assert_eq!((p.prompts, p.output_tokens), (vec![vec![5, 6]], 9));
        assert_eq!(p.cache_salt, "s");
    }

    #[test]
    fn output_length_is_capped() {
        let p = parse_ok(
            Api::Completions,
            r#"{"prompt": "x", "max_tokens": 1000000}"#,
        );
        assert_eq!(p.output_tokens, MAX_TOKENS_CAP);
    }

    #[test]
    fn bad_bodies_are_400_with_a_reason() {
        assert!(error(Api::Completions, "{not json").starts_with("invalid JSON body"));
        assert_eq!(
            error(Api::Completions, "[]"),
            "the body must be a JSON object"
        );
        assert_eq!(error(Api::Completions, "{}"), "prompt is required");
        assert_eq!(
            error(Api::Completions, r#"{"prompt": []}"#),
            "prompt must not be empty"
        );
        assert!(error(Api::Completions, r#"{"prompt": [1, -2]}"#).contains("-2"));
        assert!(
            error(Api::Completions, r#"{"prompt": "x", "max_tokens": 0}"#)
                .starts_with("max_tokens must be")
        );
        assert!(
            error(Api::Completions, r#"{"prompt": "x", "stream": "yes"}"#)
                .starts_with("stream must be")
        );
        assert_eq!(
            error(Api::Chat, r#"{"messages": []}"#),
            "messages must not be empty"
        );
        assert!(error(Api::Chat, r#"{"messages": [{"content": "x"}]}"#).contains("role"));
        assert!(error(Api::Generate, "{}").contains("token_ids"));
    }

    #[test]
    fn error_body_is_openai_shaped() {
        let body: Value = serde_json::from_slice(&ApiError::bad_request("nope").body()).unwrap();
        assert_eq!(body["error"]["message"], "nope");
        assert_eq!(body["error"]["type"], "BadRequestError");
        assert_eq!(body["error"]["code"], 400);
    }

    #[test]
    fn answers_and_chunks() {
        let render = Render {
            api: Api::Chat,
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
        };
        let usage = Usage {
            prompt_tokens: 10,
            completion_tokens: 3,
            cached_tokens: 8,
        };
        let full: Value = serde_json::from_slice(&render.full(&[3], usage)).unwrap();
        assert_eq!(full["object"], "chat.completion");
        assert_eq!(
            full["choices"][0]["message"]["content"],
            " the mock replica"
        );
        assert_eq!(full["usage"]["total_tokens"], 13);
        assert_eq!(full["usage"]["prompt_tokens_details"]["cached_tokens"], 8);

        let chunk = render.tokens_chunk(0, 0, 2);
        let text = std::str::from_utf8(&chunk).unwrap();
        assert!(text.starts_with("data: {") && text.ends_with("}\n\n"));
        let value: Value = serde_json::from_str(&text[6..]).unwrap();
        assert_eq!(value["choices"][0]["delta"]["content"], " the mock");
        assert_eq!(value["choices"][0]["delta"]["role"], "assistant");

        let render = Render {
            api: Api::Completions,
            ..render
        };
        let value: Value = serde_json::from_str(
            std::str::from_utf8(&render.tokens_chunk(1, 2, 3)).unwrap()[6..].trim(),
        )
        .unwrap();
        assert_eq!(value["choices"][0]["text"], " replica");
        assert_eq!(value["choices"][0]["index"], 1);
    }
}
