//! What placement needs from an inference request body: the model, the prompt in the forms
//! the OpenAI-compatible APIs allow, the cache salt and the output budget. The body itself is
//! forwarded unchanged; nothing here rewrites it.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use crate::pipeline::{ChatMessage, Prompt};

/// The inference APIs a body can belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/completions`: `prompt` as text, texts, token ids or lists of token ids.
    Completions,
    /// `POST /v1/chat/completions`: `messages`.
    ChatCompletions,
    /// `POST /inference/v1/generate`: pre-tokenized `token_ids`.
    Generate,
}

impl Api {
    pub fn path(self) -> &'static str {
        match self {
            Api::Completions => "/v1/completions",
            Api::ChatCompletions => "/v1/chat/completions",
            Api::Generate => "/inference/v1/generate",
        }
    }
}

/// The placement-relevant part of a request body.
#[derive(Debug, Clone, PartialEq)]
pub struct InferenceBody {
    pub model: String,
    pub prompt: Prompt,
    pub cache_salt: String,
    pub max_output_tokens: Option<u64>,
    pub stream: bool,
}

/// Why a body cannot be placed; the message is meant for the client.
#[derive(Debug, Clone, PartialEq)]
pub struct BodyError {
    pub message: String,
    /// The offending field, when there is one.
    pub param: Option<&'static str>,
}

impl BodyError {
    fn missing(param: &'static str, api: Api) -> BodyError {
        BodyError {
            message: format!("`{param}` is required by {}", api.path()),
            param: Some(param),
        }
    }
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[derive(Deserialize)]
struct RawBody {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    prompt: Option<PromptField>,
    #[serde(default)]
    messages: Option<Vec<RawMessage>>,
    #[serde(default)]
    token_ids: Option<Vec<u32>>,
    #[serde(default)]
    cache_salt: Option<String>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    sampling_params: Option<SamplingParams>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    tools: Option<serde_json::Value>,
    #[serde(default)]
    chat_template_kwargs: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct SamplingParams {
    #[serde(default)]
    max_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct RawMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    tool_calls: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

/// Parses a body of `api`. Unknown fields are ignored (they are the model server's business).
pub fn parse(api: Api, bytes: &[u8]) -> Result<InferenceBody, BodyError> {
    let raw: RawBody = serde_json::from_slice(bytes).map_err(|e| BodyError {
        message: format!("the request body is not valid JSON for {}: {e}", api.path()),
        param: None,
    })?;
    let model = match (raw.model, api) {
        (Some(model), _) if !model.is_empty() => model,
        (_, Api::Generate) => String::new(),
        _ => return Err(BodyError::missing("model", api)),
    };
    let (prompt, max_output_tokens) = match api {
        Api::Completions => {
            let prompt = raw.prompt.ok_or(BodyError::missing("prompt", api))?;
            (prompt.0, raw.max_tokens)
        }
        Api::ChatCompletions => {
            let messages = raw.messages.ok_or(BodyError::missing("messages", api))?;
            let mut unrendered = Vec::new();
            if raw.tools.as_ref().is_some_and(carries_something) {
                unrendered.push("tools");
            }
            if raw
                .chat_template_kwargs
                .as_ref()
                .is_some_and(carries_something)
            {
                unrendered.push("chat_template_kwargs");
            }
            if messages
                .iter()
                .any(|m| m.tool_calls.as_ref().is_some_and(carries_something))
            {
                unrendered.push("tool calls");
            }
            let non_text = |m: &RawMessage| match &m.content {
                Some(Content::Parts(parts)) => parts.iter().any(|p| p.kind != "text"),
                _ => false,
            };
            if messages.iter().any(non_text) {
                unrendered.push("non-text content");
            }
            let mut messages: Vec<ChatMessage> = messages
                .into_iter()
                .map(|m| ChatMessage {
                    role: m.role,
                    content: match m.content {
                        None => String::new(),
                        Some(Content::Text(text)) => text,
                        // One line per text part, as vLLM joins them for a template
                        // that takes text content.
                        Some(Content::Parts(parts)) => parts
                            .into_iter()
                            .filter(|p| p.kind == "text")
                            .filter_map(|p| p.text)
                            .collect::<Vec<_>>()
                            .join("\n"),
                    },
                    unrendered: None,
                })
                .collect();
            if let Some(first) = messages.first_mut().filter(|_| !unrendered.is_empty()) {
                first.unrendered = Some(unrendered.join(", "));
            }
            (
                Prompt::Chat(messages),
                raw.max_completion_tokens.or(raw.max_tokens),
            )
        }
        Api::Generate => {
            let tokens = raw.token_ids.ok_or(BodyError::missing("token_ids", api))?;
            let max = raw
                .sampling_params
                .and_then(|s| s.max_tokens)
                .or(raw.max_tokens);
            (Prompt::Tokens(vec![tokens]), max)
        }
    };
    Ok(InferenceBody {
        model,
        prompt,
        cache_salt: raw.cache_salt.unwrap_or_default(),
        max_output_tokens,
        stream: raw.stream.unwrap_or(false),
    })
}

/// Whether an optional chat field holds anything: not null, not an empty list or object.
fn carries_something(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Null => false,
        serde_json::Value::Array(items) => !items.is_empty(),
        serde_json::Value::Object(fields) => !fields.is_empty(),
        _ => true,
    }
}

/// A completions `prompt`: a string, a list of strings, a list of token ids or a list of such
/// lists. Read without buffering the value first.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptField(pub Prompt);

impl<'de> Deserialize<'de> for PromptField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(PromptVisitor).map(PromptField)
    }
}

struct PromptVisitor;

/// One element of a prompt list, whose kind decides the list's.
enum Item {
    Text(String),
    Token(u32),
    Tokens(Vec<u32>),
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ItemVisitor;
        impl<'de> Visitor<'de> for ItemVisitor {
            type Value = Item;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, a token id or a list of token ids")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Item, E> {
                Ok(Item::Text(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Item, E> {
                Ok(Item::Text(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Item, E> {
                u32::try_from(v)
                    .map(Item::Token)
                    .map_err(|_| E::custom(format!("token id {v} is out of range")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Item, E> {
                u32::try_from(v)
                    .map(Item::Token)
                    .map_err(|_| E::custom(format!("token id {v} is out of range")))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Item, A::Error> {
                let mut tokens = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(t) = seq.next_element::<u32>()? {
                    tokens.push(t);
                }
                Ok(Item::Tokens(tokens))
            }
        }
        deserializer.deserialize_any(ItemVisitor)
    }
}

impl<'de> Visitor<'de> for PromptVisitor {
    type Value = Prompt;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a string, a list of strings, a list of token ids or a list of lists of token ids",
        )
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Prompt, E> {
        Ok(Prompt::Text(v.to_string()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Prompt, E> {
        Ok(Prompt::Text(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prompt, A::Error> {
        let mixed = || de::Error::custom("prompt lists must not mix strings, token ids and lists");
        let Some(first) = seq.next_element::<Item>()? else {
            return Ok(Prompt::Texts(Vec::new()));
        };
        match first {
            Item::Text(text) => {
                let mut texts = vec![text];
                while let Some(item) = seq.next_element::<Item>()? {
                    match item {
                        Item::Text(t) => texts.push(t),
                        _ => return Err(mixed()),
                    }
                }
                Ok(Prompt::Texts(texts))
            }
            Item::Token(token) => {
                let mut tokens = Vec::with_capacity(seq.size_hint().unwrap_or(0) + 1);
                tokens.push(token);
                while let Some(t) = seq.next_element::<u32>()? {
                    tokens.push(t);
                }
                Ok(Prompt::Tokens(vec![tokens]))
            }
            Item::Tokens(tokens) => {
                let mut lists = vec![tokens];
                while let Some(item) = seq.next_element::<Item>()? {
                    match item {
                        Item::Tokens(t) => lists.push(t),
                        _ => return Err(mixed()),
                    }
                }
                Ok(Prompt::Tokens(lists))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completions(body: &str) -> Result<InferenceBody, BodyError> {
        parse(Api::Completions, body.as_bytes())
    }

    #[test]
    fn completions_prompt_forms() {
        let text = completions(r#"{"model":"m","prompt":"hi","max_tokens":5,"stream":true}"#)
            .expect("parses");
        assert_eq!(text.prompt, Prompt::Text("hi".into()));
        assert_eq!(text.max_output_tokens, Some(5));
        assert!(text.stream);
        let texts = completions(r#"{"model":"m","prompt":["a","b"]}"#).expect("parses");
        assert_eq!(texts.prompt, Prompt::Texts(vec!["a".into(), "b".into()]));
        let ids = completions(r#"{"model":"m","prompt":[1,2,3]}"#).expect("parses");
        assert_eq!(ids.prompt, Prompt::Tokens(vec![vec![1, 2, 3]]));
        let lists = completions(r#"{"model":"m","prompt":[[1,2],[3]]}"#).expect("parses");
        assert_eq!(lists.prompt, Prompt::Tokens(vec![vec![1, 2], vec![3]]));
    }

    #[test]
    fn bad_bodies_name_the_problem() {
        let missing_model = completions(r#"{"prompt":"hi"}"#).expect_err("refused");
        assert_eq!(missing_model.param, Some("model"));
        let missing_prompt = completions(r#"{"model":"m"}"#).expect_err("refused");
        assert_eq!(missing_prompt.param, Some("prompt"));
        let mixed = completions(r#"{"model":"m","prompt":["a",1]}"#).expect_err("refused");
        assert!(mixed.message.contains("must not mix"), "{}", mixed.message);
        let negative = completions(r#"{"model":"m","prompt":[-1]}"#).expect_err("refused");
        assert!(
            negative.message.contains("out of range"),
            "{}",
            negative.message
        );
        assert!(completions("{\"model\":").is_err());
        assert!(completions("[]").is_err());
    }

    #[test]
    fn chat_messages_keep_role_and_text() {
        let body = r#"{"model":"m","max_completion_tokens":7,"messages":[
            {"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"he"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"llo"}]},
            {"role":"assistant","content":null,"tool_calls":[]}]}"#;
        let parsed = parse(Api::ChatCompletions, body.as_bytes()).expect("parses");
        let Prompt::Chat(messages) = parsed.prompt else {
            panic!("chat expected")
        };
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[1].content, "he\nllo");
        assert_eq!(messages[2].content, "");
        // The image part is not text the router can render: the request says so.
        assert_eq!(messages[0].unrendered.as_deref(), Some("non-text content"));
        let with_tools = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],
            "tools":[{"type":"function","function":{"name":"f"}}],
            "chat_template_kwargs":{"enable_thinking":false}}"#;
        let Prompt::Chat(messages) = parse(Api::ChatCompletions, with_tools.as_bytes())
            .expect("parses")
            .prompt
        else {
            panic!("chat expected")
        };
        assert_eq!(
            messages[0].unrendered.as_deref(),
            Some("tools, chat_template_kwargs")
        );
        let plain = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[],
            "chat_template_kwargs":null}"#;
        let Prompt::Chat(messages) = parse(Api::ChatCompletions, plain.as_bytes())
            .expect("parses")
            .prompt
        else {
            panic!("chat expected")
        };
        assert_eq!(messages[0].unrendered, None);
        assert_eq!(parsed.max_output_tokens, Some(7));
        assert_eq!(
            parse(Api::ChatCompletions, br#"{"model":"m"}"#)
                .expect_err("refused")
                .param,
            Some("messages")
        );
    }

    #[test]
    fn generate_takes_token_ids_and_needs_no_model() {
        let body = br#"{"token_ids":[5,6],"sampling_params":{"max_tokens":3}}"#;
        let parsed = parse(Api::Generate, body).expect("parses");
        assert_eq!(parsed.prompt, Prompt::Tokens(vec![vec![5, 6]]));
        assert_eq!(parsed.max_output_tokens, Some(3));
        assert_eq!(
            parse(Api::Generate, br#"{"model":"m"}"#)
                .expect_err("refused")
                .param,
            Some("token_ids")
        );
    }
}
