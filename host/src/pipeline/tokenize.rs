//! The `token-producer` built-in: turns a request's prompt into token ids before any other
//! producer runs, and owns the one way the host does that ([`PromptTokenizer`]) for every
//! driver: `serve` and `ext-proc` call it on the request's own task, `replay` and `simulate`
//! on the scheduler's, and `mock-replica` for its own cache.
//!
//! Token ids in the request pass through. With a `tokenizer` (a model's `tokenizer.json`),
//! completions text is encoded as vLLM's completions endpoint encodes it, special tokens
//! added, and chat is rendered through the model's chat template ([`ChatTemplate`]) and the
//! result encoded without adding special tokens, as its chat endpoint does. Otherwise (no
//! tokenizer, chat without a template or whose template refused it, a prompt over
//! `maxPromptBytes`, the tokenizer failing), text is estimated at four bytes per token
//! (bytes zero-padded to a multiple of four, read as little-endian `u32`), as the reference's
//! tokenizer-free backend does, so prefix hashes of the same text agree with it; the request
//! is then marked estimated, with the reason. Several texts in one request are one prompt
//! each. Estimated chat messages contribute role then content, with no separators.

use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use switchyard_plugin_api::keys::TOKENIZED_PROMPT;
use switchyard_plugin_api::sdk::{Declare, Instance, Param, PluginFactory, ProduceBatch, Producer};
use switchyard_plugin_api::{PluginError, PluginKind, ProduceItem, Stability};

use super::chat_template::ChatTemplate;
use super::request::{ChatMessage, Prompt};
use crate::config::{ConfigError, LoadedConfig};
use crate::plugins::builtin::Builtin;

pub const TYPE_NAME: &str = "token-producer";

/// The default of `maxPromptBytes`.
pub const DEFAULT_MAX_PROMPT_BYTES: u64 = 1 << 20;
const MAX_PROMPT_BYTES_RANGE: std::ops::RangeInclusive<u64> = 1..=(64 << 20);

/// Text up to this many bytes is tokenized where it is; a longer one moves off the async
/// worker. Byte-level BPE encodes about 1 MB/s here (`benches/tokenize.rs`), so this keeps an
/// inline encode near a millisecond.
pub const INLINE_TEXT_BYTES: usize = 1024;

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TokenizerConfig {
    /// The tokenizer-free estimate; the default.
    pub estimate: Option<EstimateConfig>,
    /// A model's `tokenizer.json`.
    pub tokenizer: Option<TokenizerFile>,
    /// Text longer than this (all of a request's texts together) is estimated instead.
    pub max_prompt_bytes: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EstimateConfig {}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenizerFile {
    /// Relative to the config file's directory.
    pub path: String,
    /// A Jinja chat template, relative to the config file's directory; by default the
    /// `chat_template` of the `tokenizer_config.json` beside `path`.
    pub chat_template: Option<String>,
}

impl TokenizerConfig {
    /// The checks that need no file: one backend at most, `maxPromptBytes` in range.
    fn check(&self) -> Result<(), PluginError> {
        if self.estimate.is_some() && self.tokenizer.is_some() {
            return Err(PluginError::invalid_parameter(
                "tokenizer",
                "`estimate` and `tokenizer` are two backends; set one of them, not both \
                 (tokenizer = { path = \"FILE\", chatTemplate = \"FILE\" } for a model's \
                 tokenizer.json and, optionally, its chat template)",
            ));
        }
        if let Some(max) = self.max_prompt_bytes {
            if !MAX_PROMPT_BYTES_RANGE.contains(&max) {
                return Err(PluginError::invalid_parameter(
                    "maxPromptBytes",
                    format!(
                        "maxPromptBytes must be in {}..={} (got {max})",
                        MAX_PROMPT_BYTES_RANGE.start(),
                        MAX_PROMPT_BYTES_RANGE.end()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Why a request's token ids are the estimate rather than its model's tokenizer's.
#[derive(Debug, Clone, PartialEq)]
pub enum Estimated {
    NoTokenizer,
    Chat,
    /// The chat template failed on this request's messages.
    ChatTemplate(String),
    /// The request carries what the engine's chat template renders and the router's is not
    /// given (`ChatMessage::unrendered`).
    ChatUnrendered(String),
    TooLong {
        bytes: usize,
        max: u64,
    },
    Failed(String),
}

impl std::fmt::Display for Estimated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Estimated::NoTokenizer => f.write_str("estimated: no tokenizer configured"),
            Estimated::Chat => f.write_str("estimated: chat: no chat template"),
            Estimated::ChatTemplate(error) => {
                write!(f, "estimated: the chat template failed: {error}")
            }
            Estimated::ChatUnrendered(what) => {
                write!(f, "estimated: chat: {what} not passed to the chat template")
            }
            Estimated::TooLong { bytes, max } => write!(
                f,
                "estimated: the text is {bytes} bytes, over maxPromptBytes = {max}"
            ),
            Estimated::Failed(error) => write!(f, "estimated: the tokenizer failed: {error}"),
        }
    }
}

/// A request's token ids, one list per prompt, and whether they are exact.
#[derive(Debug, Clone, PartialEq)]
pub struct Tokenized {
    pub prompts: Vec<Vec<u32>>,
    /// `None` when exact: token ids the client sent, or text the model's tokenizer encoded.
    pub estimated: Option<Estimated>,
}

/// Turns prompts into token ids: the configured backend and its bound.
#[derive(Clone)]
pub struct PromptTokenizer {
    file: Option<Arc<tokenizers::Tokenizer>>,
    /// The model's chat template; only with `file`.
    chat: Option<Arc<ChatTemplate>>,
    max_prompt_bytes: u64,
}

impl std::fmt::Debug for PromptTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptTokenizer")
            .field("file", &self.file.is_some())
            .field("chat", &self.chat.is_some())
            .field("max_prompt_bytes", &self.max_prompt_bytes)
            .finish()
    }
}

impl Default for PromptTokenizer {
    fn default() -> Self {
        PromptTokenizer::estimate()
    }
}

impl PromptTokenizer {
    /// The tokenizer-free estimate.
    pub fn estimate() -> PromptTokenizer {
        PromptTokenizer {
            file: None,
            chat: None,
            max_prompt_bytes: DEFAULT_MAX_PROMPT_BYTES,
        }
    }

    /// Reads a `tokenizer.json` and the chat template beside it (the `chat_template` of its
    /// `tokenizer_config.json`, when there is one); the error names the file and what is
    /// wrong with it.
    pub fn load(path: &Path, max_prompt_bytes: u64) -> Result<PromptTokenizer, String> {
        PromptTokenizer::load_with(path, None, max_prompt_bytes)
    }

    /// As [`PromptTokenizer::load`], the chat template read from `chat_template` when given.
    pub fn load_with(
        path: &Path,
        chat_template: Option<&Path>,
        max_prompt_bytes: u64,
    ) -> Result<PromptTokenizer, String> {
        let text = std::fs::read(path)
            .map_err(|e| format!("cannot read tokenizer file {}: {e}", path.display()))?;
        let mut tokenizer = tokenizers::Tokenizer::from_bytes(&text).map_err(|e| {
            format!(
                "tokenizer file {} is not a valid tokenizer.json: {e}",
                path.display()
            )
        })?;
        // A serving engine encodes the whole prompt: no truncation, no padding, whatever the
        // file was saved with.
        tokenizer
            .with_truncation(None)
            .map_err(|e| format!("tokenizer file {}: {e}", path.display()))?;
        tokenizer.with_padding(None);
        let chat = ChatTemplate::find(path, chat_template)?;
        Ok(PromptTokenizer {
            file: Some(Arc::new(tokenizer)),
            chat: chat.map(Arc::new),
            max_prompt_bytes,
        })
    }

    /// The backend a config names: its `token-producer`'s `tokenizer` (the paths relative to
    /// the config's directory), else the estimate. A file that cannot be read or parsed, a
    /// chat template among them, is a config error at the `tokenizer` line.
    pub fn for_config(config: &LoadedConfig) -> Result<PromptTokenizer, ConfigError> {
        let Some((index, entry)) = config
            .config
            .plugins
            .iter()
            .enumerate()
            .find(|(_, p)| p.type_name == TYPE_NAME)
        else {
            return Ok(PromptTokenizer::estimate());
        };
        let parameters = crate::config::parameters_json(&entry.parameters);
        let fail = |field: &str, message: String| {
            ConfigError::new(&config.path, message)
                .at_line(config.plugin_line(index, Some(field)))
                .plugin(&entry.name, &entry.type_name)
                .field(field)
        };
        let parsed: TokenizerConfig = switchyard_plugin_api::sdk::parse_parameters(&parameters)
            .and_then(|c: TokenizerConfig| c.check().map(|()| c))
            .map_err(|e| fail(e.field.as_str(), e.message.to_string()))?;
        let max = parsed.max_prompt_bytes.unwrap_or(DEFAULT_MAX_PROMPT_BYTES);
        match parsed.tokenizer {
            None => Ok(PromptTokenizer {
                file: None,
                chat: None,
                max_prompt_bytes: max,
            }),
            Some(file) => {
                let base = config.base_dir();
                let template = file.chat_template.map(|t| base.join(t));
                PromptTokenizer::load_with(&base.join(&file.path), template.as_deref(), max)
                    .map_err(|message| fail("tokenizer", message))
            }
        }
    }

    /// Whether text is encoded by a model's tokenizer.
    pub fn is_exact(&self) -> bool {
        self.file.is_some()
    }

    /// Whether chat is rendered through a chat template and encoded by the tokenizer.
    pub fn renders_chat(&self) -> bool {
        self.file.is_some() && self.chat.is_some()
    }

    /// Whether tokenizing `prompt` is quick enough to do on an async worker.
    pub fn is_quick(&self, prompt: &Prompt) -> bool {
        self.file.is_none() || !prompt.is_text() || text_bytes(prompt) <= INLINE_TEXT_BYTES
    }

    /// Token ids of every prompt of a request, and whether they are exact. Never fails: when
    /// the tokenizer cannot encode a text, that request gets the estimate and says why.
    pub fn tokenize(&self, prompt: Prompt) -> Tokenized {
        let exact = |prompts| Tokenized {
            prompts,
            estimated: None,
        };
        let estimate = |prompt, why| Tokenized {
            prompts: tokenize(prompt),
            estimated: Some(why),
        };
        match prompt {
            Prompt::Tokenized(done) => done,
            Prompt::Tokens(_) | Prompt::Shared { .. } => exact(tokenize(prompt)),
            Prompt::Chat(_) if self.file.is_some() && self.chat.is_none() => {
                estimate(prompt, Estimated::Chat)
            }
            Prompt::Chat(ref messages)
                if self.file.is_some() && messages.iter().any(|m| m.unrendered.is_some()) =>
            {
                let what = messages.iter().find_map(|m| m.unrendered.clone());
                estimate(prompt, Estimated::ChatUnrendered(what.unwrap_or_default()))
            }
            _ => {
                let Some(file) = &self.file else {
                    return estimate(prompt, Estimated::NoTokenizer);
                };
                let bytes = text_bytes(&prompt);
                if bytes as u64 > self.max_prompt_bytes {
                    let max = self.max_prompt_bytes;
                    return estimate(prompt, Estimated::TooLong { bytes, max });
                }
                let encoded = match (&prompt, &self.chat) {
                    (Prompt::Chat(messages), Some(chat)) => encode_chat(file, chat, messages),
                    _ => encode_texts(file, &prompt).map_err(Estimated::Failed),
                };
                match encoded {
                    Ok(prompts) => exact(prompts),
                    Err(why) => estimate(prompt, why),
                }
            }
        }
    }
}

/// The bytes of a prompt's texts, all together.
fn text_bytes(prompt: &Prompt) -> usize {
    match prompt {
        Prompt::Text(text) => text.len(),
        Prompt::Texts(texts) => texts.iter().map(String::len).sum(),
        Prompt::Chat(messages) => messages
            .iter()
            .map(|m| m.role.len() + m.content.len())
            .sum(),
        Prompt::Tokens(_) | Prompt::Shared { .. } | Prompt::Tokenized(_) => 0,
    }
}

/// Encodes each text with special tokens added (`add_special_tokens = true`, as vLLM's
/// completions endpoint does).
fn encode_texts(
    tokenizer: &tokenizers::Tokenizer,
    prompt: &Prompt,
) -> Result<Vec<Vec<u32>>, String> {
    let texts: &[String] = match prompt {
        Prompt::Text(text) => std::slice::from_ref(text),
        Prompt::Texts(texts) => texts,
        _ => &[],
    };
    texts
        .iter()
        .map(|text| encode(tokenizer, text, true))
        .collect()
}

/// Renders `messages` through the chat template and encodes the text without adding special
/// tokens (the template wrote them), as vLLM's chat endpoint does: one prompt.
fn encode_chat(
    tokenizer: &tokenizers::Tokenizer,
    chat: &ChatTemplate,
    messages: &[ChatMessage],
) -> Result<Vec<Vec<u32>>, Estimated> {
    let render = || chat.render(messages);
    let text = std::panic::catch_unwind(std::panic::AssertUnwindSafe(render))
        .unwrap_or_else(|_| Err("it panicked".to_string()))
        .map_err(Estimated::ChatTemplate)?;
    encode(tokenizer, &text, false)
        .map(|ids| vec![ids])
        .map_err(Estimated::Failed)
}

/// The ids of one text. A panic inside the tokenizer is caught and reported like its errors,
/// so one pathological text costs only its own request's exactness.
fn encode(
    tokenizer: &tokenizers::Tokenizer,
    text: &str,
    add_special_tokens: bool,
) -> Result<Vec<u32>, String> {
    let encode = || {
        tokenizer
            .encode_fast(text, add_special_tokens)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| e.to_string())
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(encode))
        .unwrap_or_else(|_| Err("it panicked".to_string()))
}

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

/// Token ids of every prompt of a request, a shared prompt left shared, and why they are
/// estimated, if they are.
pub fn prompt_buffers(
    tokenizer: &PromptTokenizer,
    prompt: Prompt,
) -> (Vec<PromptBuffer>, Option<Estimated>) {
    match prompt {
        Prompt::Shared { buf, len } => (vec![PromptBuffer::Shared { buf, len }], None),
        other => {
            let tokenized = tokenizer.tokenize(other);
            let buffers = tokenized
                .prompts
                .into_iter()
                .map(PromptBuffer::Owned)
                .collect();
            (buffers, tokenized.estimated)
        }
    }
}

/// Token ids of every prompt of a request, text estimated.
pub fn tokenize(prompt: Prompt) -> Vec<Vec<u32>> {
    match prompt {
        Prompt::Tokens(prompts) => prompts,
        Prompt::Tokenized(done) => done.prompts,
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
    // The file is read where the config's directory is known (`PromptTokenizer::for_config`).
    let config: TokenizerConfig = switchyard_plugin_api::sdk::parse_parameters(parameters)?;
    config.check()?;
    Ok(Instance::producer(TokenProducer {
        name: name.to_string(),
    }))
}

pub static FACTORY: PluginFactory = PluginFactory {
    type_name: TYPE_NAME,
    kind: PluginKind::Producer,
    stability: Stability::Beta,
    description: "Tokenizes the request's prompt (token ids pass through; completions text, \
                  and chat through the model's chat template, is encoded by the model's \
                  tokenizer.json when one is given, else estimated at 4 bytes per token).",
    parameters: &[
        Param {
            name: "estimate",
            value_type: "table",
            default: "the backend when `tokenizer` is unset",
            range: "{}",
            description: "The tokenizer-free estimate backend (the default); not with \
                          `tokenizer`.",
        },
        Param {
            name: "tokenizer",
            value_type: "table",
            default: "unset",
            range: "{ path = \"FILE\", chatTemplate = \"FILE\" }",
            description: "A model's tokenizer.json (relative to the config's directory), read \
                          at start-up and on reload; completions text is encoded with special \
                          tokens added, as vLLM does. Chat is rendered through the chat \
                          template (`chatTemplate`, a Jinja file, else the `chat_template` of \
                          the tokenizer_config.json beside the tokenizer.json) and encoded \
                          without adding special tokens; without a template it keeps the \
                          estimate. Not with `estimate`.",
        },
        Param {
            name: "maxPromptBytes",
            value_type: "integer",
            default: "1048576",
            range: "1..=67108864",
            description: "A request whose texts together are longer is estimated, not \
                          tokenized.",
        },
    ],
    create,
};

inventory::submit! { Builtin(&FACTORY) }

#[cfg(test)]
pub(crate) mod tests {
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
            unrendered: None,
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
        let (buffers, estimated) = prompt_buffers(&PromptTokenizer::estimate(), prompt);
        assert_eq!(estimated, None);
        assert_eq!(buffers.len(), 1);
        assert_eq!(buffers[0].as_slice(), &[1, 2, 3]);
        assert_eq!(Arc::strong_count(&buf), 2, "no copy was made");
        let (owned, _) = prompt_buffers(
            &PromptTokenizer::estimate(),
            Prompt::Tokens(vec![vec![5], vec![6, 7]]),
        );
        let slices: Vec<&[u32]> = owned.iter().map(PromptBuffer::as_slice).collect();
        assert_eq!(slices, [&[5][..], &[6, 7][..]]);
    }

    /// A word-level tokenizer.json: `<s>` (0) added before every text, `<unk>` (1), then
    /// `hello` (2), `world` (3), `again` (4); words split on whitespace. Without `unk`, a
    /// word outside the vocabulary is an encoding error.
    fn tokenizer_json(unk: bool) -> String {
        let unk_entry = if unk { r#", "<unk>": 1"# } else { "" };
        format!(
            r#"{{
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{{"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
    "rstrip": false, "normalized": false, "special": true}}],
  "normalizer": null,
  "pre_tokenizer": {{"type": "WhitespaceSplit"}},
  "post_processor": {{"type": "TemplateProcessing",
    "single": [{{"SpecialToken": {{"id": "<s>", "type_id": 0}}}}, {{"Sequence": {{"id": "A", "type_id": 0}}}}],
    "pair": [{{"Sequence": {{"id": "A", "type_id": 0}}}}, {{"Sequence": {{"id": "B", "type_id": 1}}}}],
    "special_tokens": {{"<s>": {{"id": "<s>", "ids": [0], "tokens": ["<s>"]}}}}}},
  "decoder": null,
  "model": {{"type": "WordLevel", "unk_token": "<unk>",
    "vocab": {{"<s>": 0{unk_entry}, "hello": 2, "world": 3, "again": 4}}}}
}}"#
        )
    }

    /// A fresh directory holding `models/tokenizer.json` with `text`; one per call, as tests
    /// run at once.
    fn tokenizer_dir(tag: &str, text: &str) -> std::path::PathBuf {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "switchyard-tokenize-{tag}-{}-{n}",
            std::process::id()
        ));
        std::fs::create_dir_all(dir.join("models")).expect("temp dir");
        std::fs::write(dir.join("models/tokenizer.json"), text).expect("written");
        dir
    }

    /// The word-level tokenizer below, read from a file.
    pub(crate) fn loaded(unk: bool, max_prompt_bytes: u64) -> PromptTokenizer {
        let dir = tokenizer_dir(if unk { "unk" } else { "strict" }, &tokenizer_json(unk));
        PromptTokenizer::load(&dir.join("models/tokenizer.json"), max_prompt_bytes)
            .expect("a valid tokenizer.json")
    }

    /// The backend a config at `dir/switchyard.toml` with these token-producer parameters
    /// names, or the error's text.
    fn for_config(dir: &Path, parameters: &str) -> Result<PromptTokenizer, String> {
        let text = format!(
            "[[endpoints]]\nname = \"e\"\naddress = \"127.0.0.1:1\"\n\n\
             [[plugins]]\ntype = \"token-producer\"\n[plugins.parameters]\n{parameters}\n"
        );
        let config =
            LoadedConfig::parse(&dir.join("switchyard.toml"), text).map_err(|e| e.to_string())?;
        PromptTokenizer::for_config(&config).map_err(|e| e.to_string())
    }

    #[test]
    fn text_is_encoded_with_special_tokens_and_is_exact() {
        let tokenizer = loaded(true, DEFAULT_MAX_PROMPT_BYTES);
        assert!(tokenizer.is_exact());
        let text = tokenizer.tokenize(Prompt::Text("hello world again".into()));
        assert_eq!(text.prompts, vec![vec![0, 2, 3, 4]]);
        assert_eq!(text.estimated, None);
        let texts = tokenizer.tokenize(Prompt::Texts(vec!["hello".into(), "world zzz".into()]));
        assert_eq!(texts.prompts, vec![vec![0, 2], vec![0, 3, 1]]);
        assert_eq!(texts.estimated, None);
    }

    #[test]
    fn token_ids_pass_through_a_tokenizer_untouched() {
        let tokenizer = loaded(true, DEFAULT_MAX_PROMPT_BYTES);
        let ids = tokenizer.tokenize(Prompt::Tokens(vec![vec![7, 8, 9], vec![4]]));
        assert_eq!(ids.prompts, vec![vec![7, 8, 9], vec![4]]);
        assert_eq!(ids.estimated, None);
        let done = ids.clone();
        assert_eq!(tokenizer.tokenize(Prompt::Tokenized(done)), ids);
    }

    /// `tokenizer` gives `prompt` the estimate, noted as `why`, which reads `note`.
    fn assert_estimated(tokenizer: &PromptTokenizer, prompt: Prompt, why: Estimated, note: &str) {
        let tokenized = tokenizer.tokenize(prompt.clone());
        assert_eq!(tokenized.prompts, tokenize(prompt));
        assert_eq!(tokenized.estimated.as_ref(), Some(&why));
        assert_eq!(why.to_string(), note);
    }

    #[test]
    fn without_a_tokenizer_text_is_the_estimate_and_says_so() {
        assert_estimated(
            &PromptTokenizer::estimate(),
            Prompt::Text("hello world".into()),
            Estimated::NoTokenizer,
            "estimated: no tokenizer configured",
        );
    }

    #[test]
    fn chat_keeps_the_estimate_for_want_of_a_chat_template() {
        let chat = Prompt::Chat(vec![super::super::request::ChatMessage {
            role: "user".into(),
            content: "hello".into(),
            unrendered: None,
        }]);
        assert_estimated(
            &loaded(true, DEFAULT_MAX_PROMPT_BYTES),
            chat,
            Estimated::Chat,
            "estimated: chat: no chat template",
        );
    }

    #[test]
    fn a_prompt_over_the_bound_falls_back_to_the_estimate_with_a_note() {
        let tokenizer = loaded(true, 11);
        let fits = tokenizer.tokenize(Prompt::Text("hello world".into()));
        assert_eq!(fits.estimated, None);
        assert_estimated(
            &tokenizer,
            Prompt::Texts(vec!["hello".into(), "world again".into()]),
            Estimated::TooLong { bytes: 16, max: 11 },
            "estimated: the text is 16 bytes, over maxPromptBytes = 11",
        );
        assert!(!tokenizer.is_quick(&Prompt::Text("x".repeat(INLINE_TEXT_BYTES + 1))));
        assert!(tokenizer.is_quick(&Prompt::Text("x".repeat(INLINE_TEXT_BYTES))));
    }

    #[test]
    fn a_tokenizer_error_costs_only_that_request_its_exactness() {
        let tokenizer = loaded(false, DEFAULT_MAX_PROMPT_BYTES);
        let failed = tokenizer.tokenize(Prompt::Text("hello stranger".into()));
        assert_eq!(failed.prompts, vec![pack_bytes(b"hello stranger")]);
        let Some(Estimated::Failed(error)) = &failed.estimated else {
            panic!("{failed:?}");
        };
        assert!(!error.is_empty());
        let next = tokenizer.tokenize(Prompt::Text("hello world".into()));
        assert_eq!(next.prompts, vec![vec![0, 2, 3]]);
        assert_eq!(next.estimated, None);
    }

    #[test]
    fn the_config_path_is_relative_to_the_config_file() {
        let dir = tokenizer_dir("config", &tokenizer_json(true));
        let tokenizer = for_config(
            &dir,
            "tokenizer = { path = \"models/tokenizer.json\" }\nmaxPromptBytes = 5",
        )
        .expect("loads");
        assert!(tokenizer.is_exact());
        assert_eq!(tokenizer.max_prompt_bytes, 5);
        let estimate = for_config(&dir, "estimate = {}").expect("the estimate");
        assert!(!estimate.is_exact());
    }

    #[test]
    fn both_backends_are_refused_naming_file_line_plugin_and_field() {
        let dir = tokenizer_dir("both", &tokenizer_json(true));
        let error = for_config(
            &dir,
            "estimate = {}\ntokenizer = { path = \"models/tokenizer.json\" }",
        )
        .expect_err("refused");
        let file = dir.join("switchyard.toml");
        assert_eq!(
            error,
            format!(
                "{}:9: plugin 'token-producer': `estimate` and `tokenizer` are two backends; \
                 set one of them, not both (tokenizer = {{ path = \"FILE\", chatTemplate = \
                 \"FILE\" }} for a model's tokenizer.json and, optionally, its chat template)",
                file.display()
            )
        );
        let plugin = create("t", r#"{"estimate": {}, "tokenizer": {"path": "x"}}"#)
            .err()
            .expect("refused");
        assert_eq!(plugin.field.as_str(), "tokenizer");
        let range = for_config(&dir, "maxPromptBytes = 0").expect_err("refused");
        assert!(
            range.ends_with(
                ": plugin 'token-producer': maxPromptBytes must be in 1..=67108864 (got 0)"
            ),
            "{range}"
        );
    }

    #[test]
    fn a_missing_or_corrupt_file_is_refused_naming_the_path_and_the_error() {
        let dir = tokenizer_dir("corrupt", "{\"model\": {\"type\": \"WordLevel\"");
        let missing = for_config(&dir, "tokenizer = { path = \"nowhere/tokenizer.json\" }")
            .expect_err("refused");
        let path = dir.join("nowhere/tokenizer.json");
        assert!(
            missing.contains(&format!(
                ":8: plugin 'token-producer': cannot read tokenizer file {}: ",
                path.display()
            )),
            "{missing}"
        );
        let corrupt = for_config(&dir, "tokenizer = { path = \"models/tokenizer.json\" }")
            .expect_err("refused");
        let path = dir.join("models/tokenizer.json");
        let expected = format!(
            "tokenizer file {} is not a valid tokenizer.json: EOF while parsing",
            path.display()
        );
        assert!(corrupt.contains(&expected), "{corrupt}");
    }

    /// The word-level tokenizer above with the chat markers `<|system|>` (5), `<|user|>` (6),
    /// `<|assistant|>` (7) and `</s>` (8) as special added tokens, so a rendered chat splits on
    /// them.
    fn chat_tokenizer_json() -> String {
        let mut file: serde_json::Value =
            serde_json::from_str(&tokenizer_json(true)).expect("JSON");
        for (id, content) in [
            (5, "<|system|>"),
            (6, "<|user|>"),
            (7, "<|assistant|>"),
            (8, "</s>"),
        ] {
            file["added_tokens"].as_array_mut().expect("a list").push(
                serde_json::json!({"id": id, "content": content, "single_word": false,
                    "lstrip": false, "rstrip": false, "normalized": false, "special": true}),
            );
            file["model"]["vocab"][content] = id.into();
        }
        file.to_string()
    }

    /// The template of the module docs' example: BOS, each message as its role marker then its
    /// content, the assistant's marker last.
    const TEMPLATE: &str = "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>\
        {{ m.content }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

    /// A directory with the chat tokenizer as `models/tokenizer.json` and, when given, this
    /// `models/tokenizer_config.json`.
    fn chat_dir(tag: &str, tokenizer_config: Option<serde_json::Value>) -> std::path::PathBuf {
        let dir = tokenizer_dir(tag, &chat_tokenizer_json());
        if let Some(config) = tokenizer_config {
            std::fs::write(dir.join("models/tokenizer_config.json"), config.to_string())
                .expect("written");
        }
        dir
    }

    fn messages(messages: &[(&str, &str)]) -> Vec<ChatMessage> {
        messages
            .iter()
            .map(|(role, content)| ChatMessage {
                role: role.to_string(),
                content: content.to_string(),
                unrendered: None,
            })
            .collect()
    }

    fn chat(conversation: &[(&str, &str)]) -> Prompt {
        Prompt::Chat(messages(conversation))
    }

    fn load_chat(dir: &Path) -> PromptTokenizer {
        PromptTokenizer::load(&dir.join("models/tokenizer.json"), DEFAULT_MAX_PROMPT_BYTES)
            .expect("loads")
    }

    #[test]
    fn chat_is_rendered_through_the_template_and_encoded_without_added_special_tokens() {
        let dir = chat_dir(
            "chat",
            Some(serde_json::json!({
                "chat_template": TEMPLATE,
                "bos_token": {"content": "<s>", "special": true},
                "eos_token": "</s>",
            })),
        );
        let tokenizer = load_chat(&dir);
        assert!(tokenizer.renders_chat());
        let conversation = [("system", "hello"), ("user", "world again")];
        let template = tokenizer.chat.as_ref().expect("a template");
        let rendered = template.render(&messages(&conversation)).expect("renders");
        assert_eq!(
            rendered,
            "<s><|system|>hello<|user|>world again<|assistant|>"
        );
        let tokenized = tokenizer.tokenize(chat(&conversation));
        // One `<s>`, the template's: the post-processor's is not added.
        assert_eq!(tokenized.prompts, vec![vec![0, 5, 2, 6, 3, 4, 7]]);
        assert_eq!(tokenized.estimated, None);
        // Completions text still gets its special tokens.
        let text = tokenizer.tokenize(Prompt::Text("hello".into()));
        assert_eq!(text.prompts, vec![vec![0, 2]]);
    }

    #[test]
    fn chat_carrying_what_the_template_is_not_given_keeps_the_estimate_and_says_what() {
        let dir = chat_dir(
            "chat-unrendered",
            Some(serde_json::json!({"chat_template": TEMPLATE, "bos_token": "<s>"})),
        );
        let tokenizer = load_chat(&dir);
        let mut conversation = messages(&[("system", "hello"), ("user", "world")]);
        conversation[0].unrendered = Some("tools".into());
        let tokenized = tokenizer.tokenize(Prompt::Chat(conversation.clone()));
        assert_eq!(
            tokenized.estimated,
            Some(Estimated::ChatUnrendered("tools".into()))
        );
        assert_eq!(
            tokenized.estimated.expect("estimated").to_string(),
            "estimated: chat: tools not passed to the chat template"
        );
        conversation[0].unrendered = None;
        assert_eq!(
            tokenizer.tokenize(Prompt::Chat(conversation)).estimated,
            None
        );
    }

    #[test]
    fn the_default_of_named_templates_is_taken_and_a_configured_file_wins() {
        let named = serde_json::json!({
            "chat_template": [
                {"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
                {"name": "default", "template": TEMPLATE},
            ],
            "bos_token": "<s>",
            "eos_token": "</s>",
        });
        let dir = chat_dir("named", Some(named));
        let tokenized = load_chat(&dir).tokenize(chat(&[("user", "hello")]));
        assert_eq!(tokenized.prompts, vec![vec![0, 6, 2, 7]]);
        assert_eq!(tokenized.estimated, None);
        // A Jinja file named by the config, Python string methods and `tojson` in it; the
        // special tokens still come from tokenizer_config.json.
        std::fs::write(
            dir.join("chat.jinja"),
            "{% for m in messages %}{% if m.content.startswith(' ') %}{{ raise_exception('x') }}\
             {% endif %}<|{{ m.role }}|>{{ m.content.strip() }} {{ eos_token }}{% endfor %}\
             {{ 'hello' | tojson }}",
        )
        .expect("written");
        let configured = for_config(
            &dir,
            "tokenizer = { path = \"models/tokenizer.json\", chatTemplate = \"chat.jinja\" }",
        )
        .expect("loads");
        let tokenized = configured.tokenize(chat(&[("user", "world  ")]));
        assert_eq!(tokenized.prompts, vec![vec![6, 3, 8, 1]]);
        assert_eq!(tokenized.estimated, None);
    }

    #[test]
    fn a_template_that_raises_costs_only_that_request_its_exactness() {
        let template = format!(
            "{{% if messages[0].role != 'user' %}}{{{{ raise_exception('Conversation roles \
             must start with user') }}}}{{% endif %}}{TEMPLATE}"
        );
        let dir = chat_dir(
            "raise",
            Some(serde_json::json!({"chat_template": template, "bos_token": "<s>"})),
        );
        let tokenizer = load_chat(&dir);
        let refused = chat(&[("system", "hello"), ("user", "world")]);
        let tokenized = tokenizer.tokenize(refused.clone());
        assert_eq!(tokenized.prompts, tokenize(refused));
        let Some(Estimated::ChatTemplate(error)) = &tokenized.estimated else {
            panic!("{tokenized:?}");
        };
        assert!(
            error.contains("Conversation roles must start with user"),
            "{error}"
        );
        let note = tokenized.estimated.as_ref().expect("a note").to_string();
        assert!(
            note.starts_with("estimated: the chat template failed: "),
            "{note}"
        );
        let next = tokenizer.tokenize(chat(&[("user", "world")]));
        assert_eq!(next.prompts, vec![vec![0, 6, 3, 7]]);
        assert_eq!(next.estimated, None);
    }

    #[test]
    fn a_chat_template_that_does_not_parse_is_refused_naming_the_file() {
        let broken = "{% for m in messages %}{{ m.content }}";
        let dir = chat_dir(
            "unparsed",
            Some(serde_json::json!({"chat_template": broken})),
        );
        let error = for_config(&dir, "tokenizer = { path = \"models/tokenizer.json\" }")
            .expect_err("refused");
        let file = dir.join("models/tokenizer_config.json");
        let expected = format!(
            "{}:8: plugin 'token-producer': chat template in {} does not parse: syntax error: \
             unexpected end of input, expected end of block (in chat_template:1)",
            dir.join("switchyard.toml").display(),
            file.display()
        );
        assert_eq!(error, expected);
        // A configured file that does not parse, or is not there.
        std::fs::write(dir.join("broken.jinja"), broken).expect("written");
        for (template, before, after) in [
            (
                "broken.jinja",
                "chat template in ",
                " does not parse: syntax error",
            ),
            ("none.jinja", "cannot read chat template ", ": "),
        ] {
            let parameters = format!(
                "tokenizer = {{ path = \"models/tokenizer.json\", chatTemplate = \"{template}\" }}"
            );
            let error = for_config(&dir, &parameters).expect_err("refused");
            let named = format!("{before}{}{after}", dir.join(template).display());
            assert!(error.contains(&named), "{error}");
        }
    }

    #[test]
    fn without_a_chat_template_chat_keeps_the_estimate() {
        let no_config = load_chat(&chat_dir("no-config", None));
        assert!(!no_config.renders_chat());
        let no_template = load_chat(&chat_dir(
            "no-template",
            Some(serde_json::json!({"bos_token": "<s>"})),
        ));
        for tokenizer in [no_config, no_template] {
            assert_estimated(
                &tokenizer,
                chat(&[("user", "hello")]),
                Estimated::Chat,
                "estimated: chat: no chat template",
            );
        }
    }
}
