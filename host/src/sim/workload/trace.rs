//! JSONL request traces: one request per line.
//!
//! Each line (blank lines and `#` comments aside; see [`crate::jsonl`]) is an object with
//! `arrival_ms` (≥ 0), `output_tokens` (≥ 1), exactly one of `tokens` (token ids) or `prompt`
//! (text, turned into tokens by [`prompt_to_tokens`]: the config's tokenizer, or the estimate),
//! and optionally `model` and `cache_salt` (default empty), `group` (default 0) and `step`
//! (default none). Unknown keys are refused. Requests are ordered by arrival (ties keep file
//! order) and numbered from 0. [`TraceParams`] puts the client arrival model over the trace's
//! times.

use super::arrivals::{check_arrival_params, Arrivals, Delays, DEFAULT_JITTER_MS};
use super::number_by_arrival;
use crate::jsonl;
use crate::pipeline::tokenize::PromptTokenizer;
use crate::pipeline::Prompt;
use crate::sim::config::ParamError;
use crate::sim::router::SimRequest;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

/// A trace that could not be read.
#[derive(Debug)]
pub enum TraceError {
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// `line` counts from 1.
    Line { line: usize, message: String },
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Io { path, source } => {
                write!(f, "cannot read trace {}: {source}", path.display())
            }
            TraceError::Line { line, message } => write!(f, "trace line {line}: {message}"),
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TraceError::Io { source, .. } => Some(source),
            TraceError::Line { .. } => None,
        }
    }
}

/// Parameters of a trace replay (`--set` with `--trace`): the client arrival model over the
/// trace's `arrival_ms`, which are taken as the times the client sends. Requests at one time
/// are a burst, spread over `arrivalSpreadMs` in file order; each gets `arrivalJitterMs` of
/// jitter (see [`super::arrivals`]). The trace's own times usually carry the client's spread,
/// so `arrivalSpreadMs` is 0 by default.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TraceParams {
    /// Seed of the arrival model's draws.
    pub seed: u64,
    /// Time the client takes to send a burst, ms (0..=1e9).
    pub arrival_spread_ms: f64,
    /// Mean of each request's exponential jitter, ms (0..=1e9).
    pub arrival_jitter_ms: f64,
}

impl Default for TraceParams {
    fn default() -> Self {
        TraceParams {
            seed: 1,
            arrival_spread_ms: 0.0,
            arrival_jitter_ms: DEFAULT_JITTER_MS,
        }
    }
}

impl TraceParams {
    pub fn validate(&self) -> Result<(), ParamError> {
        check_arrival_params(self.arrival_spread_ms, self.arrival_jitter_ms)
    }

    /// The requests of a trace (ordered by `arrival_ms`, as read) as they reach the router,
    /// in arrival order and numbered from 0.
    pub fn deliver(&self, requests: Vec<SimRequest>) -> Vec<SimRequest> {
        let delays = Delays::new(self.seed, self.arrival_spread_ms, self.arrival_jitter_ms);
        Arrivals::new(requests.into_iter(), delays).collect()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceLine {
    arrival_ms: f64,
    output_tokens: u32,
    #[serde(default)]
    tokens: Option<Vec<u32>>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    model: String,
    #[serde(default)]
    cache_salt: String,
    #[serde(default)]
    group: u64,
    #[serde(default)]
    step: Option<u32>,
}

/// The token ids of a text prompt as the host makes them for a completions request with the
/// same text (with [`PromptTokenizer::estimate`]: its UTF-8 bytes, zero-padded to a multiple
/// of 4, read as little-endian `u32`s).
pub fn prompt_to_tokens(prompt: String, tokenizer: &PromptTokenizer) -> Vec<u32> {
    let mut prompts = tokenizer.tokenize(Prompt::Text(prompt)).prompts;
    prompts.pop().unwrap_or_default()
}

/// Reads a JSONL trace file line by line, text prompts tokenized by `tokenizer`.
pub fn read_trace(path: &Path, tokenizer: &PromptTokenizer) -> Result<Vec<SimRequest>, TraceError> {
    let io = |source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    parse_trace_lines(
        jsonl::ContentLines::new(std::io::BufReader::new(file)),
        tokenizer,
    )
}

/// Parses JSONL trace text; the first bad line is reported with its number.
pub fn parse_trace(text: &str) -> Result<Vec<SimRequest>, TraceError> {
    parse_trace_bytes(text.as_bytes())
}

/// Parses JSONL trace bytes (see [`crate::jsonl`] for comments, byte-order marks and UTF-8).
pub fn parse_trace_bytes(bytes: &[u8]) -> Result<Vec<SimRequest>, TraceError> {
    parse_trace_lines(jsonl::content_lines(bytes), &PromptTokenizer::estimate())
}

fn parse_trace_lines(
    lines: impl Iterator<Item = Result<(usize, String), jsonl::LineError>>,
    tokenizer: &PromptTokenizer,
) -> Result<Vec<SimRequest>, TraceError> {
    let mut requests = Vec::new();
    for entry in lines {
        let (line, raw) = entry.map_err(TraceError::from)?;
        let raw = raw.as_str();
        let fail = |message: String| TraceError::Line { line, message };
        let parsed: TraceLine = jsonl::parse_line(line, raw)?;
        if !(parsed.arrival_ms.is_finite() && parsed.arrival_ms >= 0.0) {
            return Err(fail(format!(
                "arrival_ms must be a finite number >= 0 (got {})",
                parsed.arrival_ms
            )));
        }
        if parsed.output_tokens == 0 {
            return Err(fail(
                "output_tokens must be in 1..=4294967295 (got 0)".to_string(),
            ));
        }
        let tokens = match (parsed.tokens, parsed.prompt) {
            (Some(tokens), None) => tokens,
            (None, Some(prompt)) => prompt_to_tokens(prompt, tokenizer),
            (Some(_), Some(_)) => {
                return Err(fail(
                    "give either `tokens` or `prompt`, not both".to_string(),
                ))
            }
            (None, None) => return Err(fail("missing `tokens` or `prompt`".to_string())),
        };
        if tokens.is_empty() {
            return Err(fail("the prompt is empty".to_string()));
        }
        requests.push(SimRequest {
            id: 0,
            arrival_ms: parsed.arrival_ms,
            model: parsed.model,
            cache_salt: parsed.cache_salt,
            tokens: tokens.into(),
            output_tokens: parsed.output_tokens,
            group: parsed.group,
            step: parsed.step,
        });
    }
    Ok(number_by_arrival(requests))
}

impl From<jsonl::LineError> for TraceError {
    fn from(e: jsonl::LineError) -> Self {
        TraceError::Line {
            line: e.line,
            message: e.message,
        }
    }
}
