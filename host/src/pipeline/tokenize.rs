//! The `token-producer` built-in: turns a request's prompt into token ids before any other
//! producer runs.
//!
//! Token ids in the request pass through. Text is estimated at four bytes per token (bytes
//! zero-padded to a multiple of four, read as little-endian `u32`), as the reference's
//! tokenizer-free backend does, so prefix hashes of the same text agree with it. Several texts
//! in one request are one prompt each. Chat messages contribute role then content, with no
//! separators.

use std::sync::Arc;

use serde::Deserialize;
use switchyard_plugin_api::keys::TOKENIZED_PROMPT;
use switchyard_plugin_api::sdk::{Declare, Instance, Param, PluginFactory, ProduceBatch, Producer};
use switchyard_plugin_api::{PluginError, PluginKind, ProduceItem, Stability};

use super::request::Prompt;
use crate::plugins::builtin::Builtin;

pub const TYPE_NAME: &str = "token-producer";

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TokenizerConfig {
    /// The tokenizer-free estimate; the default and, for now, the only backend.
    pub estimate: Option<EstimateConfig>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EstimateConfig {}

/// The token ids of one prompt, owned or a prefix of a shared buffer.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptBuffer {
    Owned(Vec<u32>),
    Shared { buf: Arc<[u32]>, len: usize },
}

impl PromptBuffer {
    /// The ids; their memory stays where it is while `self` lives, even when `self` moves.
    pub fn as_slice(&self) -> &[u32] {
        match self {
            PromptBuffer::Owned(tokens) => tokens,
            PromptBuffer::Shared { buf, len } => &buf[..(*len).min(buf.len())],
        }
    }
}

/// Token ids of every prompt of a request, a shared prompt left shared.
pub fn prompt_buffers(prompt: Prompt) -> Vec<PromptBuffer> {
    match prompt {
        Prompt::Shared { buf, len } => vec![PromptBuffer::Shared { buf, len }],
        other => tokenize(other)
            .into_iter()
            .map(PromptBuffer::Owned)
            .collect(),
    }
}

/// Token ids of every prompt of a request.
pub fn tokenize(prompt: Prompt) -> Vec<Vec<u32>> {
    match prompt {
        Prompt::Tokens(prompts) => prompts,
        Prompt::Shared { buf, len } => vec![buf[..len.min(buf.len())].to_vec()],
        Prompt::Text(text) => vec![pack_bytes(text.as_bytes())],
        Prompt::Texts(texts) => texts.iter().map(|t| pack_bytes(t.as_bytes())).collect(),
        Prompt::Chat(messages) => {
            let mut bytes = Vec::new();
            for message in &messages {
                bytes.extend_from_slice(message.role.as_bytes());
                bytes.extend_from_slice(message.content.as_bytes());
            }
            vec![pack_bytes(&bytes)]
        }
    }
}

/// Reads bytes as little-endian `u32`s, zero-padding the last one.
pub fn pack_bytes(bytes: &[u8]) -> Vec<u32> {
    let words = bytes.chunks_exact(4);
    let rest = words.remainder();
    let mut out = Vec::with_capacity(bytes.len().div_ceil(4));
    out.extend(words.map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])));
    if !rest.is_empty() {
        let mut word = [0u8; 4];
        word[..rest.len()].copy_from_slice(rest);
        out.push(u32::from_le_bytes(word));
    }
    out
}

struct TokenProducer {
    name: String,
}

impl Producer for TokenProducer {
    fn declare(&self) -> Declare {
        Declare::default().produces(TOKENIZED_PROMPT, &self.name)
    }

    fn produce(&self, _: &[ProduceItem<'_>], _: &mut ProduceBatch<'_>) -> Result<(), PluginError> {
        // The host tokenizes before producers run; this instance only anchors the dependency.
        Ok(())
    }
}

fn create(name: &str, parameters: &str) -> Result<Instance, PluginError> {
    let _config: TokenizerConfig = switchyard_plugin_api::sdk::parse_parameters(parameters)?;
    Ok(Instance::producer(TokenProducer {
        name: name.to_string(),
    }))
}

pub static FACTORY: PluginFactory = PluginFactory {
    type_name: TYPE_NAME,
    kind: PluginKind::Producer,
    stability: Stability::Beta,
    description: "Tokenizes the request's prompt (token ids pass through; text is estimated at \
                  4 bytes per token).",
    parameters: &[Param {
        name: "estimate",
        value_type: "table",
        default: "{}",
        range: "{}",
        description: "The tokenizer-free estimate backend (the default).",
    }],
    create,
};

inventory::submit! { Builtin(&FACTORY) }

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimate_matches_the_reference_vectors() {
        assert_eq!(
            tokenize(Prompt::Text("hello world".into())),
            vec![vec![1819043176, 1870078063, 6581362]]
        );
        let chat = Prompt::Chat(vec![super::super::request::ChatMessage {
            role: "user".into(),
            content: "hi".into(),
        }]);
        assert_eq!(tokenize(chat), vec![vec![1919251317, 26984]]);
    }

    #[test]
    fn several_texts_are_one_prompt_each() {
        let prompt = Prompt::Texts(vec!["abcd".into(), "hello world".into()]);
        assert_eq!(
            tokenize(prompt),
            vec![vec![1684234849], vec![1819043176, 1870078063, 6581362]]
        );
        let one = Prompt::Texts(vec!["hello world".into()]);
        assert_eq!(tokenize(one), tokenize(Prompt::Text("hello world".into())));
    }

    #[test]
    fn token_ids_pass_through() {
        let prompt = Prompt::Tokens(vec![vec![1, 2, 3], vec![4]]);
        assert_eq!(tokenize(prompt), vec![vec![1, 2, 3], vec![4]]);
    }

    #[test]
    fn unknown_parameter_is_refused() {
        let error = create("t", r#"{"vllm": {}}"#).err().expect("refused");
        assert_eq!(error.field.as_str(), "vllm");
    }

    #[test]
    fn a_shared_prompt_stays_shared_and_reads_as_its_prefix() {
        let buf: Arc<[u32]> = vec![1, 2, 3, 4].into();
        let prompt = Prompt::Shared {
            buf: Arc::clone(&buf),
            len: 3,
        };
        assert_eq!(tokenize(prompt.clone()), vec![vec![1, 2, 3]]);
        let buffers = prompt_buffers(prompt);
        assert_eq!(buffers.len(), 1);
        assert_eq!(buffers[0].as_slice(), &[1, 2, 3]);
        assert_eq!(Arc::strong_count(&buf), 2, "no copy was made");
        let owned = prompt_buffers(Prompt::Tokens(vec![vec![5], vec![6, 7]]));
        let slices: Vec<&[u32]> = owned.iter().map(PromptBuffer::as_slice).collect();
        assert_eq!(slices, [&[5][..], &[6, 7][..]]);
    }
}
