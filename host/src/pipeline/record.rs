//! Decision records: what each stage saw and did for one request, for `replay` output and
//! for operators asking "why did this request go there?".

use serde::Serialize;

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
        AttrValue::Custom(bytes) => serde_json::json!({ "customBytes": bytes.len() }),
    }
}
