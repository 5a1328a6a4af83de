//! `switchyard replay`: schedules a JSONL file of timestamped requests on virtual time and
//! writes one decision per request. The format is documented in `docs/replay.md`.

use std::collections::HashMap;
use std::io::Write;

use serde::{Deserialize, Serialize};

use crate::jsonl;
use crate::live::body::PromptField;
use crate::pipeline::record::DecisionTrace;
use crate::pipeline::{ChatMessage, Decision, Endpoint, Fleet, Prompt, Request, Scheduler};
use switchyard_plugin_api::EndpointMetrics;

/// One input line.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayLine {
    /// The line's number in its file, from 1.
    #[serde(skip)]
    pub line: usize,
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
    /// A prefix prediction `serve`'s journal checked; read past.
    #[serde(default, rename = "prefix_check")]
    pub _prefix_check: Option<serde::de::IgnoredAny>,
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
    /// The facts' documented ranges; the error names the field.
    pub fn check(&self) -> Result<(), String> {
        match self.kv_cache_usage {
            Some(usage) if !(0.0..=1.0).contains(&usage) => Err(format!(
                "kv_cache_usage must be a number in 0..=1 (got {usage})"
            )),
            _ => Ok(()),
        }
    }

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
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "render_trace"
    )]
    pub decision: Option<Box<DecisionTrace>>,
}

fn render_trace<S: serde::Serializer>(
    trace: &Option<Box<DecisionTrace>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    trace.as_deref().serialize(serializer)
}

pub use crate::jsonl::LineError as InputError;

/// Reads replay input (JSONL; see [`crate::jsonl`]), checking each line on its own.
pub fn read_input(reader: impl std::io::BufRead) -> Result<Vec<ReplayLine>, InputError> {
    let mut lines = Vec::new();
    for entry in jsonl::ContentLines::new(reader) {
        let (number, text) = entry?;
        let text = text.as_str();
        let fail = |message: String| InputError {
            line: number,
            message,
        };
        let mut parsed: ReplayLine = jsonl::parse_line(number, text)?;
        parsed.line = number;
        let given = [
            parsed.tokens.is_some(),
            parsed.prompt.is_some(),
            parsed.messages.is_some(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err(fail(
                "give exactly one of `tokens`, `prompt` and `messages`".into(),
            ));
        }
        if !parsed.arrival_ms.is_finite() || parsed.arrival_ms < 0.0 {
            return Err(fail(format!(
                "arrival_ms must be a finite number >= 0 (got {})",
                parsed.arrival_ms
            )));
        }
        if let Some(done) = parsed.completion_ms {
            if !done.is_finite() || done < 0.0 {
                return Err(fail(format!(
                    "completion_ms must be a finite number >= 0 (got {done})"
                )));
            }
        }
        if let Some(updates) = &parsed.metrics {
            for (endpoint, update) in updates {
                update
                    .check()
                    .map_err(|e| fail(format!("metrics.{endpoint}.{e}")))?;
            }
        }
        lines.push(parsed);
    }
    Ok(lines)
}

/// The id a line's request gets: its own, or `req-<n>` from its position among the requests.
pub fn request_id(line: &ReplayLine, index: usize) -> String {
    line.id.clone().unwrap_or_else(|| format!("req-{index}"))
}

/// Checks what needs the whole input and the fleet: request ids are unique (given ones and
/// generated `req-<n>` alike, since in-flight accounting is keyed on them), and `metrics` name
/// only endpoints the fleet has.
pub fn check_input(input: &[ReplayLine], fleet: &Fleet) -> Result<(), InputError> {
    let mut seen: HashMap<String, usize> = HashMap::with_capacity(input.len());
    for (index, line) in input.iter().enumerate() {
        let id = request_id(line, index);
        if let Some(first) = seen.insert(id.clone(), line.line) {
            let how = if line.id.is_some() {
                ""
            } else {
                " (generated for a line without `id`)"
            };
            return Err(InputError {
                line: line.line,
                message: format!(
                    "request id {id:?}{how} is already used on line {first}; ids must be unique"
                ),
            });
        }
        for endpoint in line.metrics.iter().flat_map(|m| m.keys()) {
            if !fleet.endpoints.iter().any(|e| &e.id == endpoint) {
                let known: Vec<&str> = fleet.endpoints.iter().map(|e| e.id.as_str()).collect();
                return Err(InputError {
                    line: line.line,
                    message: format!(
                        "metrics name endpoint {endpoint:?}, which the config does not have; \
                         valid ids: {}",
                        if known.is_empty() {
                            "(none: add [[endpoints]] to the config)".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                });
            }
        }
    }
    Ok(())
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
        let id = request_id(line, index);
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
