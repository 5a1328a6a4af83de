//! Parameters of the prefix-cache affinity filter: decoding, defaults, validation, and which
//! attributes the configuration makes it read.

use std::fmt;

use serde::Deserialize;
use switchyard_plugin_api::keys;

/// A parameter that failed validation: the field and a message naming the bad value and the
/// valid range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamError {
    pub field: &'static str,
    pub message: String,
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ParamError {}

/// Where the load gate's per-endpoint TTFT comes from.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(from = "String")]
pub enum TtftSource {
    /// `InFlightLoad.Tokens / peakPrefillThroughput * 1000`.
    #[default]
    PrefillThroughput,
    /// The latency predictor's TTFT in milliseconds.
    LatencyPredictor,
    /// Any other string; kept so that `validate()` can name it.
    Unknown(String),
}

impl From<String> for TtftSource {
    fn from(s: String) -> Self {
        match s.as_str() {
            "prefillThroughput" => Self::PrefillThroughput,
            "latencyPredictor" => Self::LatencyPredictor,
            _ => Self::Unknown(s),
        }
    }
}

/// What the load gate compares the sticky endpoints' extra load against.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(from = "String")]
pub enum PenaltyMode {
    /// The TTFT gap against the fixed `maxTTFTPenaltyMs`.
    #[default]
    Static,
    /// The in-flight token gap against the tokens this request would re-prefill elsewhere;
    /// `maxTTFTPenaltyMs` (when > 0) remains an absolute ceiling.
    MatchedTokens,
    /// Any other string; kept so that `validate()` can name it.
    Unknown(String),
}

impl From<String> for PenaltyMode {
    fn from(s: String) -> Self {
        match s.as_str() {
            "static" => Self::Static,
            "matchedTokens" => Self::MatchedTokens,
            _ => Self::Unknown(s),
        }
    }
}

/// `prefix-cache-affinity-filter` parameters. Omitted fields keep their defaults; unknown
/// fields are rejected.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AffinityConfig {
    /// Matched fraction of the prompt at which an endpoint is sticky; <= 0 disables the filter.
    pub affinity_threshold: f64,
    /// Probability in `[0, 1]` of skipping the filter for a request.
    pub exploration_probability: f64,
    /// TTFT gap in ms beyond which stickiness is released; 0 disables the static gate (and
    /// the ceiling in `matchedTokens` mode).
    #[serde(rename = "maxTTFTPenaltyMs")]
    pub max_ttft_penalty_ms: f64,
    pub ttft_source: TtftSource,
    /// Tokens per second one endpoint prefills, used to turn in-flight tokens into TTFT.
    pub peak_prefill_throughput: f64,
    pub prefix_match_info_producer_name: String,
    pub latency_prediction_info_producer_name: String,
    pub in_flight_load_producer_name: String,
    pub penalty_mode: PenaltyMode,
}

impl Default for AffinityConfig {
    fn default() -> Self {
        Self {
            affinity_threshold: 0.80,
            exploration_probability: 0.0,
            max_ttft_penalty_ms: 18000.0,
            ttft_source: TtftSource::PrefillThroughput,
            peak_prefill_throughput: 15928.0,
            prefix_match_info_producer_name: String::new(),
            latency_prediction_info_producer_name: String::new(),
            in_flight_load_producer_name: String::new(),
            penalty_mode: PenaltyMode::Static,
        }
    }
}

/// The per-endpoint load attribute the gate reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateInput {
    /// In-flight tokens (`ttftSource: prefillThroughput`, and always in `matchedTokens` mode).
    InFlightLoad,
    /// Predicted TTFT (`ttftSource: latencyPredictor`).
    LatencyPrediction,
}

impl AffinityConfig {
    /// Checks the parameters in the reference's order, then the `penaltyMode` rules; the
    /// first failure is returned. NaN fails every numeric check.
    pub fn validate(&self) -> Result<(), ParamError> {
        let err = |field: &'static str, message: String| Err(ParamError { field, message });
        if self.affinity_threshold.is_nan() || self.affinity_threshold > 1.0 {
            return err(
                "affinityThreshold",
                format!(
                    "affinityThreshold must be <= 1.0 (got {}); a value <= 0 disables the filter",
                    self.affinity_threshold
                ),
            );
        }
        if !(0.0..=1.0).contains(&self.exploration_probability) {
            return err(
                "explorationProbability",
                format!(
                    "explorationProbability must be in [0, 1] (got {})",
                    self.exploration_probability
                ),
            );
        }
        if self.max_ttft_penalty_ms.is_nan() || self.max_ttft_penalty_ms < 0.0 {
            return err(
                "maxTTFTPenaltyMs",
                format!(
                    "maxTTFTPenaltyMs must be >= 0 (got {}); 0 disables the TTFT limit",
                    self.max_ttft_penalty_ms
                ),
            );
        }
        if self.peak_prefill_throughput.is_nan() || self.peak_prefill_throughput < 0.0 {
            return err(
                "peakPrefillThroughput",
                format!(
                    "peakPrefillThroughput must be >= 0 (got {})",
                    self.peak_prefill_throughput
                ),
            );
        }
        if let TtftSource::Unknown(s) = &self.ttft_source {
            return err(
                "ttftSource",
                format!(
                    "ttftSource must be \"prefillThroughput\" or \"latencyPredictor\" (got {s:?})"
                ),
            );
        }
        if let PenaltyMode::Unknown(s) = &self.penalty_mode {
            return err(
                "penaltyMode",
                format!("penaltyMode must be \"static\" or \"matchedTokens\" (got {s:?})"),
            );
        }
        if self.ttft_source == TtftSource::PrefillThroughput
            && self.max_ttft_penalty_ms > 0.0
            && self.peak_prefill_throughput <= 0.0
        {
            return err(
                "peakPrefillThroughput",
                format!(
                    "peakPrefillThroughput must be > 0 when ttftSource is prefillThroughput and \
                     maxTTFTPenaltyMs > 0 (got {})",
                    self.peak_prefill_throughput
                ),
            );
        }
        if self.penalty_mode == PenaltyMode::MatchedTokens
            && self.ttft_source == TtftSource::LatencyPredictor
        {
            return err(
                "penaltyMode",
                "penaltyMode \"matchedTokens\" requires ttftSource \"prefillThroughput\" (got \
                 \"latencyPredictor\"): a predicted TTFT is in milliseconds and has no token \
                 interpretation, so it cannot be compared with matched prefix tokens"
                    .to_string(),
            );
        }
        Ok(())
    }

    /// Whether the filter can narrow at all (`affinityThreshold > 0`).
    pub fn enabled(&self) -> bool {
        self.affinity_threshold > 0.0
    }

    /// Whether a load gate can release stickiness: always in `matchedTokens` mode, and in
    /// `static` mode only when `maxTTFTPenaltyMs > 0`.
    pub fn gate_active(&self) -> bool {
        self.penalty_mode == PenaltyMode::MatchedTokens || self.max_ttft_penalty_ms > 0.0
    }

    /// The load attribute the gate reads, or `None` when no gate runs. Never both: a
    /// validated `matchedTokens` configuration always uses in-flight load.
    pub fn gate_input(&self) -> Option<GateInput> {
        if !self.gate_active() {
            None
        } else if self.ttft_source == TtftSource::LatencyPredictor {
            Some(GateInput::LatencyPrediction)
        } else {
            Some(GateInput::InFlightLoad)
        }
    }

    /// Producer of the match info, with the default applied.
    pub fn prefix_match_info_producer(&self) -> &str {
        keys::producer_or_default(
            &self.prefix_match_info_producer_name,
            keys::APPROX_PREFIX_CACHE_PRODUCER,
        )
    }

    /// Producer of the in-flight load, with the default applied.
    pub fn in_flight_load_producer(&self) -> &str {
        keys::producer_or_default(
            &self.in_flight_load_producer_name,
            keys::INFLIGHT_LOAD_PRODUCER,
        )
    }

    /// Producer of the latency prediction, with the default applied.
    pub fn latency_prediction_producer(&self) -> &str {
        keys::producer_or_default(
            &self.latency_prediction_info_producer_name,
            keys::PREDICTED_LATENCY_PRODUCER,
        )
    }
}

#[cfg(test)]
mod tests;
