//! Decision records: what each stage saw and did for one request, for `replay` output and
//! for operators asking "why did this request go there?".
//!
//! A decision keeps a [`DecisionTrace`]: fleet slots, plugin and key indices and raw values,
//! a few small buffers and no strings, so keeping one for every request costs little. It
//! becomes a [`DecisionRecord`], with names, only when someone reads it.

use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use switchyard_plugin_api::AttrValue;

use super::request::Endpoint;
use super::scheduler::clamp_score;
use super::wiring::Pipeline;

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct DecisionRecord {
    /// Candidate endpoint ids, in order.
    pub candidates: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowRecord>,
    pub producers: Vec<ProducerRecord>,
    pub filters: Vec<FilterRecord>,
    pub scorers: Vec<ScorerRecord>,
    /// Weighted total per remaining endpoint, in candidate order.
    pub totals: Vec<EndpointScore>,
    pub picked: Vec<String>,
}

/// The batching window a request waited in.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WindowRecord {
    pub producer: String,
    pub opened_ms: f64,
    pub sealed_ms: f64,
    pub batch_size: usize,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProducerRecord {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What it wrote, per endpoint: `{endpoint, key, value}`.
    pub attributes: Vec<AttributeRecord>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AttributeRecord {
    pub endpoint: String,
    pub key: String,
    pub value: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FilterRecord {
    pub name: String,
    pub kept: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub note: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ScorerRecord {
    pub name: String,
    pub weight: f64,
    pub scores: Vec<ScoreEntry>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub note: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ScoreEntry {
    pub endpoint: String,
    pub raw: f64,
    pub weighted: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EndpointScore {
    pub endpoint: String,
    pub score: f64,
}

/// Renders an attribute value for a record.
pub fn attribute_json(value: &switchyard_plugin_api::AttrValue) -> serde_json::Value {
    use switchyard_plugin_api::AttrValue;
    match value {
        AttrValue::Absent => serde_json::Value::Null,
        AttrValue::PrefixCacheMatch(v) => serde_json::json!({
            "matchBlocks": v.match_blocks,
            "totalBlocks": v.total_blocks,
            "blockSizeTokens": v.block_size_tokens,
        }),
        AttrValue::InFlightLoad(v) => serde_json::json!({
            "requests": v.requests,
            "tokens": v.tokens,
        }),
        AttrValue::LatencyPrediction(v) => serde_json::json!({
            "ttftMs": v.ttft_ms,
            "tpotMs": v.tpot_ms,
        }),
        AttrValue::Custom(bytes) => match std::str::from_utf8(bytes) {
            // A short text (a producer's note on where a value came from) is shown as it is.
            Ok(text) if text.len() <= 512 && !text.chars().any(char::is_control) => {
                serde_json::json!({ "customBytes": bytes.len(), "text": text })
            }
            _ => serde_json::json!({ "customBytes": bytes.len() }),
        },
    }
}

/// What one decision did, in the scheduler's terms. Serializes as its [`DecisionRecord`].
///
/// Per-step lists (attributes written, candidates kept, raw scores) live in flat buffers the
/// steps index by range, so a trace taken from a [`TracePool`] records a decision without
/// allocating once its buffers have grown.
#[derive(Clone)]
pub struct DecisionTrace {
    pipeline: Arc<Pipeline>,
    /// The candidates; every slot below indexes them.
    endpoints: Arc<[Endpoint]>,
    pub(super) window: Option<WindowTrace>,
    pub(super) producers: Vec<ProducerTrace>,
    pub(super) filters: Vec<FilterTrace>,
    pub(super) scorers: Vec<ScorerTrace>,
    /// `(row, slot, value)` of every value a producer wrote, producer after producer.
    pub(super) attributes: Vec<(u32, u32, AttrValue)>,
    /// Slots each filter kept, filter after filter.
    pub(super) kept: Vec<u32>,
    /// Each scorer's raw scores in `scored` order, scorer after scorer.
    pub(super) raw: Vec<f64>,
    /// Slots of the candidates left for scoring, in order; each scorer's raw scores and
    /// `totals` follow it.
    pub(super) scored: Vec<u32>,
    pub(super) totals: Vec<f64>,
    pub(super) picked: Vec<u32>,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct WindowTrace {
    /// Plugin index of the batching producer.
    pub producer: usize,
    pub opened_ms: f64,
    pub sealed_ms: f64,
    pub batch_size: usize,
}

#[derive(Debug, Clone)]
pub(super) struct ProducerTrace {
    pub plugin: usize,
    pub error: Option<String>,
    /// Its part of the trace's `attributes`.
    pub attributes: Range<usize>,
}

#[derive(Debug, Clone)]
pub(super) struct FilterTrace {
    pub plugin: usize,
    /// Its part of the trace's `kept`.
    pub kept: Range<usize>,
    pub note: String,
    pub error: Option<String>,
}

#[derive(Debug, Clone)]
pub(super) struct ScorerTrace {
    pub plugin: usize,
    pub weight: f64,
    /// Its part of the trace's `raw`.
    pub raw: Range<usize>,
    pub note: String,
    pub error: Option<String>,
}

/// Traces of records that left the live ring, kept for the next decisions so that recording
/// costs no allocation in a steady state.
#[derive(Default)]
pub struct TracePool {
    /// Boxed, as a decision carries its trace: taking one and giving it back moves a pointer.
    #[allow(clippy::vec_box)]
    spare: Mutex<Vec<Box<DecisionTrace>>>,
}

/// The most traces a pool keeps; a pool refills as fast as records are evicted, so a few
/// cover the decisions between two evictions.
const POOL_SIZE: usize = 64;

impl TracePool {
    /// An empty trace of a decision of `pipeline` over `endpoints`: a spare one when there is.
    pub(super) fn take(
        &self,
        pipeline: Arc<Pipeline>,
        endpoints: Arc<[Endpoint]>,
    ) -> Box<DecisionTrace> {
        let spare = self
            .spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match spare {
            Some(mut trace) => {
                trace.pipeline = pipeline;
                trace.endpoints = endpoints;
                trace
            }
            None => Box::new(DecisionTrace::new(pipeline, endpoints)),
        }
    }

    /// Keeps `trace`'s buffers for a later decision.
    pub fn give_back(&self, mut trace: Box<DecisionTrace>) {
        trace.clear();
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        if spare.len() < POOL_SIZE {
            spare.push(trace);
        }
    }
}

impl DecisionTrace {
    pub(super) fn new(pipeline: Arc<Pipeline>, endpoints: Arc<[Endpoint]>) -> DecisionTrace {
        DecisionTrace {
            pipeline,
            endpoints,
            window: None,
            producers: Vec::new(),
            filters: Vec::new(),
            scorers: Vec::new(),
            attributes: Vec::new(),
            kept: Vec::new(),
            raw: Vec::new(),
            scored: Vec::new(),
            totals: Vec::new(),
            picked: Vec::new(),
        }
    }

    /// Empties every list, keeping its capacity.
    fn clear(&mut self) {
        self.window = None;
        self.producers.clear();
        self.filters.clear();
        self.scorers.clear();
        self.attributes.clear();
        self.kept.clear();
        self.raw.clear();
        self.scored.clear();
        self.totals.clear();
        self.picked.clear();
    }

    /// Records a producer's step: its error, or the values it wrote (`(row, slot, value)`).
    pub(super) fn push_producer<'v>(
        &mut self,
        plugin: usize,
        error: Option<String>,
        written: impl Iterator<Item = (u32, u32, &'v AttrValue)>,
    ) {
        let start = self.attributes.len();
        self.attributes
            .extend(written.map(|(row, slot, value)| (row, slot, value.clone())));
        self.producers.push(ProducerTrace {
            plugin,
            error,
            attributes: start..self.attributes.len(),
        });
    }

    /// Records a filter's step: the slots it kept.
    pub(super) fn push_filter(
        &mut self,
        plugin: usize,
        kept: impl Iterator<Item = u32>,
        note: String,
        error: Option<String>,
    ) {
        let start = self.kept.len();
        self.kept.extend(kept);
        self.filters.push(FilterTrace {
            plugin,
            kept: start..self.kept.len(),
            note,
            error,
        });
    }

    /// Records a scorer's step: its raw scores, in the order of the candidates scored.
    pub(super) fn push_scorer(
        &mut self,
        plugin: usize,
        weight: f64,
        raw: &[f64],
        note: String,
        error: Option<String>,
    ) {
        let start = self.raw.len();
        self.raw.extend_from_slice(raw);
        self.scorers.push(ScorerTrace {
            plugin,
            weight,
            raw: start..self.raw.len(),
            note,
            error,
        });
    }

    fn id(&self, slot: u32) -> String {
        self.endpoints[slot as usize].id.clone()
    }

    fn label(&self, plugin: usize) -> String {
        self.pipeline.plugins[plugin].label()
    }

    /// Each scored candidate's id with its weighted total, in candidate order.
    pub fn totals(&self) -> impl Iterator<Item = (&str, f64)> + '_ {
        self.scored
            .iter()
            .zip(&self.totals)
            .map(|(&slot, &total)| (self.endpoints[slot as usize].id.as_str(), total))
    }

    /// The record, with every endpoint, plugin and key named.
    pub fn render(&self) -> DecisionRecord {
        DecisionRecord {
            candidates: self.endpoints.iter().map(|e| e.id.clone()).collect(),
            window: self.window.map(|w| WindowRecord {
                producer: self.label(w.producer),
                opened_ms: w.opened_ms,
                sealed_ms: w.sealed_ms,
                batch_size: w.batch_size,
            }),
            producers: self
                .producers
                .iter()
                .map(|p| ProducerRecord {
                    name: self.label(p.plugin),
                    error: p.error.clone(),
                    attributes: self.attributes[p.attributes.clone()]
                        .iter()
                        .map(|(row, slot, value)| AttributeRecord {
                            endpoint: self.id(*slot),
                            key: self.pipeline.rows[*row as usize].to_string(),
                            value: attribute_json(value),
                        })
                        .collect(),
                })
                .collect(),
            filters: self
                .filters
                .iter()
                .map(|f| FilterRecord {
                    name: self.label(f.plugin),
                    kept: self.kept[f.kept.clone()]
                        .iter()
                        .map(|&slot| self.id(slot))
                        .collect(),
                    note: f.note.clone(),
                    error: f.error.clone(),
                })
                .collect(),
            scorers: self
                .scorers
                .iter()
                .map(|s| ScorerRecord {
                    name: self.label(s.plugin),
                    weight: s.weight,
                    scores: self
                        .scored
                        .iter()
                        .zip(&self.raw[s.raw.clone()])
                        .map(|(&slot, &raw)| ScoreEntry {
                            endpoint: self.id(slot),
                            raw,
                            weighted: clamp_score(raw) * s.weight,
                        })
                        .collect(),
                    note: s.note.clone(),
                    error: s.error.clone(),
                })
                .collect(),
            totals: self
                .totals()
                .map(|(endpoint, score)| EndpointScore {
                    endpoint: endpoint.to_string(),
                    score,
                })
                .collect(),
            picked: self.picked.iter().map(|&slot| self.id(slot)).collect(),
        }
    }
}

impl Serialize for DecisionTrace {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.render().serialize(serializer)
    }
}

impl std::fmt::Debug for DecisionTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.render(), f)
    }
}
