//! A model's chat template: the Jinja text that turns chat messages into the one prompt the
//! engine encodes. vLLM renders it as Hugging Face's `apply_chat_template` does (blocks trim
//! their newline and strip the whitespace before them, loop controls on, `raise_exception`
//! fails the render), with `messages`, `add_generation_prompt = true` and the tokenizer's
//! `bos_token` and `eos_token`, then encodes the result without adding special tokens.
//!
//! The template comes from a file the config names or, by default, from the `chat_template`
//! of the `tokenizer_config.json` beside the `tokenizer.json`; it is compiled once, when the
//! config is loaded.

use std::path::Path;

use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::Value as Json;

use super::request::ChatMessage;

/// The name the compiled template goes by inside its environment (error messages show it).
const NAME: &str = "chat_template";

/// The file beside `tokenizer.json` that holds the chat template and the special tokens.
pub const CONFIG_FILE: &str = "tokenizer_config.json";

/// A compiled chat template and the special tokens it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; a template that does not parse is an error naming `origin` (the
    /// file it came from) and the parser's message.
    pub fn compile(
        source: String,
        origin: &Path,
        bos_token: String,
        eos_token: String,
    ) -> Result<ChatTemplate, String> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| describe(&e))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(NAME, source).map_err(|e| {
            format!(
                "chat template in {} does not parse: {}",
                origin.display(),
                describe(&e)
            )
        })?;
        Ok(ChatTemplate {
            env,
            bos_token,
            eos_token,
        })
    }

    /// The chat template for the `tokenizer.json` at `tokenizer`: the Jinja file `explicit`
    /// when given, else the `chat_template` of the `tokenizer_config.json` beside it, if that
    /// file exists and has one. The special tokens come from that `tokenizer_config.json`
    /// either way (empty without it). Errors name the file and what is wrong with it.
    pub fn find(tokenizer: &Path, explicit: Option<&Path>) -> Result<Option<ChatTemplate>, String> {
        let config_path = tokenizer
            .parent()
            .unwrap_or_else(|| Path::new("."))
            .join(CONFIG_FILE);
        let config = match std::fs::read(&config_path) {
            Ok(bytes) => Some(
                serde_json::from_slice::<Json>(&bytes)
                    .map_err(|e| format!("{} is not valid JSON: {e}", config_path.display()))?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("cannot read {}: {e}", config_path.display())),
        };
        let token = |key: &str| {
            config
                .as_ref()
                .map(|c| special_token(&c[key]))
                .unwrap_or_default()
        };
        let (source, origin) = match explicit {
            Some(path) => {
                let source = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read chat template {}: {e}", path.display()))?;
                (source, path)
            }
            None => match config
                .as_ref()
                .and_then(|c| template_of(&c["chat_template"]))
            {
                Some(source) => (source, config_path.as_path()),
                None => return Ok(None),
            },
        };
        ChatTemplate::compile(source, origin, token("bos_token"), token("eos_token")).map(Some)
    }

    /// The prompt text of `messages`, the assistant's turn opened. The error is the renderer's
    /// message (a `raise_exception` call's own text among them).
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, String> {
        let messages: Value = messages
            .iter()
            .map(|m| {
                Value::from(std::collections::BTreeMap::from([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ]))
            })
            .collect();
        let context = Value::from(std::collections::BTreeMap::from([
            ("messages", messages),
            ("add_generation_prompt", Value::from(true)),
            ("bos_token", Value::from(self.bos_token.as_str())),
            ("eos_token", Value::from(self.eos_token.as_str())),
        ]));
        let template = self.env.get_template(NAME).map_err(|e| describe(&e))?;
        template.render(context).map_err(|e| describe(&e))
    }
}

/// `raise_exception(message)`: the template refuses the messages; the render fails with it.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// An error and its causes on one line.
fn describe(error: &Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// A special token as `tokenizer_config.json` writes it: a string, or an object whose
/// `content` is one; anything else is no token.
fn special_token(value: &Json) -> String {
    match value {
        Json::String(text) => text.clone(),
        Json::Object(token) => token
            .get("content")
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

/// The template `chat_template` holds: a string, or from a list of `{name, template}` the one
/// named `default`.
fn template_of(value: &Json) -> Option<String> {
    match value {
        Json::String(text) => Some(text.clone()),
        Json::Array(named) => named
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(str::to_owned),
        _ => None,
    }
}
