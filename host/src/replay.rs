//! `switchyard replay`: schedules a JSONL file of timestamped requests on virtual time and
//! writes one decision per request. The format is documented in `docs/replay.md`.

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

use crate::live::body::PromptField;
use crate::pipeline::record::DecisionRecord;
use crate::pipeline::{ChatMessage, Decision, Endpoint, Fleet, Prompt, Request, Scheduler};
use switchyard_plugin_api::EndpointMetrics;

/// One input line.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayLine {
    /// Arrival time in milliseconds from the start of the replay.
    pub arrival_ms: f64,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub cache_salt: String,
    /// Token ids of one prompt.
    #[serde(default)]
    pub tokens: Option<Vec<u32>>,
    /// A completions `prompt`: text, a list of texts, token ids or lists of token ids.
    #[serde(default)]
    pub prompt: Option<PromptField>,
    /// Chat messages (`role`, `content`).
    #[serde(default)]
    pub messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    /// When the request completes (releasing in-flight load), if it does.
    #[serde(default)]
    pub completion_ms: Option<f64>,
    /// Endpoint load facts from this moment on, by endpoint id (`namespace/name`); facts an
    /// entry leaves out keep their last value.
    #[serde(default)]
    pub metrics: Option<std::collections::BTreeMap<String, MetricsUpdate>>,
}

impl ReplayLine {
    /// The request's prompt, from whichever of `tokens`, `prompt` and `messages` it gives.
    pub fn prompt(&self) -> Prompt {
        match (&self.tokens, &self.prompt, &self.messages) {
            (Some(tokens), _, _) => Prompt::Tokens(vec![tokens.clone()]),
            (None, Some(prompt), _) => prompt.0.clone(),
            (None, None, Some(messages)) => Prompt::Chat(messages.clone()),
            (None, None, None) => Prompt::Tokens(Vec::new()),
        }
    }
}

/// The input fields that carry `prompt`, as a replay line writes them: `tokens` for one list of
/// token ids, `messages` for chat, `prompt` otherwise.
pub fn prompt_fields(prompt: &Prompt) -> (&'static str, serde_json::Value) {
    match prompt {
        Prompt::Tokens(lists) if lists.len() == 1 => ("tokens", serde_json::json!(lists[0])),
        Prompt::Chat(messages) => ("messages", serde_json::json!(messages)),
        other => ("prompt", serde_json::json!(other)),
    }
}

/// New values for some of an endpoint's load facts.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsUpdate {
    pub running_requests: Option<u32>,
    pub waiting_requests: Option<u32>,
    pub kv_cache_usage: Option<f64>,
    pub cache_block_size: Option<u32>,
    pub cache_num_blocks: Option<u64>,
}

impl MetricsUpdate {
    pub fn apply(&self, current: EndpointMetrics) -> EndpointMetrics {
        EndpointMetrics {
            running_requests: self.running_requests.unwrap_or(current.running_requests),
            waiting_requests: self.waiting_requests.unwrap_or(current.waiting_requests),
            kv_cache_usage: self.kv_cache_usage.unwrap_or(current.kv_cache_usage),
            cache_block_size: self.cache_block_size.unwrap_or(current.cache_block_size),
            cache_num_blocks: self.cache_num_blocks.unwrap_or(current.cache_num_blocks),
        }
    }
}

/// One output line.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayOutput {
    pub id: String,
    pub arrival_ms: f64,
    pub decided_ms: f64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<DecisionRecord>,
}

/// A line that could not be read.
#[derive(Debug)]
pub struct InputError {
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

pub fn read_input(reader: impl BufRead) -> Result<Vec<ReplayLine>, InputError> {
    let mut lines = Vec::new();
    for (index, line) in reader.lines().enumerate() {
        let number = index + 1;
        let text = line.map_err(|e| InputError {
            line: number,
            message: e.to_string(),
        })?;
        if text.trim().is_empty() || text.trim_start().starts_with('#') {
            continue;
        }
        let parsed: ReplayLine = serde_json::from_str(&text).map_err(|e| InputError {
            line: number,
            message: e.to_string(),
        })?;
        let given = [
            parsed.tokens.is_some(),
            parsed.prompt.is_some(),
            parsed.messages.is_some(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err(InputError {
                line: number,
                message: "give exactly one of `tokens`, `prompt` and `messages`".into(),
            });
        }
        if !parsed.arrival_ms.is_finite() || parsed.arrival_ms < 0.0 {
            return Err(InputError {
                line: number,
                message: format!(
                    "arrival_ms must be a finite number >= 0 (got {})",
                    parsed.arrival_ms
                ),
            });
        }
        lines.push(parsed);
    }
    Ok(lines)
}

/// Replays `input` through the scheduler, writing one JSON line per request in decision
/// order. Returns how many requests were placed and rejected.
pub fn run(
    scheduler: &mut Scheduler,
    input: &[ReplayLine],
    explain: bool,
    out: &mut dyn Write,
) -> std::io::Result<(usize, usize)> {
    scheduler.set_explain(explain);
    let mut events: Vec<(f64, usize)> = input
        .iter()
        .enumerate()
        .map(|(i, line)| (line.arrival_ms, i))
        .collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut pending: std::collections::VecDeque<(f64, usize)> = events.into();
    let mut completions: Vec<(f64, String)> = Vec::new();
    let (mut placed, mut rejected) = (0, 0);
    let mut emit = |decision: Decision, out: &mut dyn Write| -> std::io::Result<()> {
        match &decision.result {
            Ok(_) => placed += 1,
            Err(_) => rejected += 1,
        }
        let line = ReplayOutput {
            id: decision.request_id,
            arrival_ms: decision.arrival_ms,
            decided_ms: decision.decided_ms,
            endpoints: decision.endpoints,
            error: decision.result.err().map(|e| e.to_string()),
            decision: decision.record,
        };
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")
    };
    loop {
        let next_arrival = pending.front().map(|e| e.0);
        let next_window = scheduler.next_deadline();
        let next_completion = completions
            .iter()
            .map(|c| c.0)
            .min_by(|a, b| a.total_cmp(b));
        let Some(now) = [next_arrival, next_window, next_completion]
            .into_iter()
            .flatten()
            .min_by(|a, b| a.total_cmp(b))
        else {
            break;
        };
        // Windows due now seal before requests arriving at the same instant join a new one.
        if next_window.is_some_and(|w| w <= now) {
            for decision in scheduler.advance(now) {
                emit(decision, out)?;
            }
            continue;
        }
        if let Some(index) = completions.iter().position(|c| c.0 <= now) {
            let (_, id) = completions.remove(index);
            scheduler.complete(&id, switchyard_plugin_api::Outcome::Finished, now);
            continue;
        }
        let (_, index) = pending.pop_front().expect("an arrival is next");
        let line = &input[index];
        if let Some(updates) = &line.metrics {
            let updated: Vec<_> = scheduler
                .endpoints()
                .iter()
                .map(|e| updates.get(&e.id).map_or(e.metrics, |u| u.apply(e.metrics)))
                .collect();
            scheduler.update_metrics(updated);
        }
        let id = line.id.clone().unwrap_or_else(|| format!("req-{index}"));
        let request = Request {
            id: id.clone(),
            model: line.model.clone(),
            cache_salt: line.cache_salt.clone(),
            prompt: line.prompt(),
            max_output_tokens: line.max_output_tokens,
        };
        if let Some(done) = line.completion_ms {
            completions.push((done.max(now), id));
        }
        for decision in scheduler.submit(request, now) {
            emit(decision, out)?;
        }
    }
    Ok((placed, rejected))
}

/// The endpoints of a config as a fleet.
pub fn fleet_from_config(endpoints: &[crate::config::EndpointConfig]) -> Fleet {
    Fleet::new(
        endpoints
            .iter()
            .map(|e| Endpoint {
                id: e.id(),
                address: e.address.clone(),
                role: e.role.clone(),
                metrics: e.metrics.into(),
            })
            .collect(),
    )
}
