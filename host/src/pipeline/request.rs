//! What the pipeline schedules: requests, and the endpoints they can go to.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use switchyard_plugin_api::EndpointMetrics;

/// The prompt of a request as it arrived.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Token ids, one list per prompt.
    Tokens(Vec<Vec<u32>>),
    /// Text, tokenized by the token producer.
    Text(String),
    /// Several texts in one completions request: one prompt per text when there are two or
    /// more (as the reference hashes them), the text itself when there is one.
    Texts(Vec<String>),
    /// Chat messages, tokenized by the token producer.
    Chat(Vec<ChatMessage>),
    /// One prompt of token ids: the first `len` ids of a buffer other requests may share (the
    /// turns of a conversation, the samples of a prompt), held without a copy while the
    /// request is in flight. Built by `simulate` only; never read or written as JSON.
    #[serde(skip)]
    Shared { buf: Arc<[u32]>, len: usize },
    /// Token ids a live driver's task already made from the prompt (`PromptTokenizer`), so the
    /// scheduler does not tokenize under its lock. Never read or written as JSON.
    #[serde(skip)]
    Tokenized(super::tokenize::Tokenized),
}

impl Prompt {
    /// Whether the prompt came as text, still to be tokenized.
    pub fn is_text(&self) -> bool {
        matches!(self, Prompt::Text(_) | Prompt::Texts(_) | Prompt::Chat(_))
    }
}

/// One chat message as the tokenizer sees it: the role, and the text of its content (text
/// parts of structured content one per line, as vLLM joins them).
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// What the request carries beyond roles and text that its engine's chat template renders
    /// and the router's does not get (tools, tool calls, images, template arguments), when
    /// anything: such a chat is not tokenized as the engine tokenizes it. Set on the first
    /// message for the whole request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unrendered: Option<String>,
}

/// One inference request to place.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub id: String,
    pub model: String,
    pub cache_salt: String,
    pub prompt: Prompt,
    pub max_output_tokens: Option<u64>,
}

/// One model-server replica.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    /// `namespace/name`.
    pub id: String,
    pub address: String,
    pub role: String,
    pub metrics: EndpointMetrics,
}

/// The endpoints known at one moment. Requests keep the snapshot they arrived with, so a
/// change of fleet never disturbs a decision under way.
#[derive(Debug, Clone, Default)]
pub struct Fleet {
    pub endpoints: Arc<[Endpoint]>,
}

impl Fleet {
    pub fn new(endpoints: Vec<Endpoint>) -> Fleet {
        Fleet {
            endpoints: endpoints.into(),
        }
    }
}
