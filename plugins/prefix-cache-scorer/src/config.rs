//! Parameters of the prefix-cache scorer: decoding, defaults and validation.

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

/// `prefix-cache-scorer` parameters. Omitted fields keep their defaults; unknown fields are
/// rejected.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ScorerConfig {
    /// Producer whose `PrefixCacheMatchInfo` is read; empty binds the default producer.
    pub prefix_match_info_producer_name: String,
    /// Share of the score given to the absolute matched length, in `[0, 1]`; the rest goes
    /// to the matched fraction of the prompt.
    pub match_length_weight: f64,
    /// Matched tokens at which the length term saturates; must be > 0 when the weight is > 0.
    pub match_length_scale_tokens: i64,
}

impl Default for ScorerConfig {
    fn default() -> Self {
        Self {
            prefix_match_info_producer_name: String::new(),
            match_length_weight: 0.0,
            match_length_scale_tokens: 8192,
        }
    }
}

impl ScorerConfig {
    /// Checks the parameters; the first failure is returned.
    pub fn validate(&self) -> Result<(), ParamError> {
        let w = self.match_length_weight;
        if !(0.0..=1.0).contains(&w) {
            return Err(ParamError {
                field: "matchLengthWeight",
                message: format!("matchLengthWeight must be in [0, 1] (got {w})"),
            });
        }
        if w > 0.0 && self.match_length_scale_tokens <= 0 {
            return Err(ParamError {
                field: "matchLengthScaleTokens",
                message: format!(
                    "matchLengthScaleTokens must be > 0 when matchLengthWeight is > 0 (got {})",
                    self.match_length_scale_tokens
                ),
            });
        }
        Ok(())
    }

    /// Name of the producer whose match info is read, with the default applied.
    pub fn prefix_match_info_producer(&self) -> &str {
        keys::producer_or_default(
            &self.prefix_match_info_producer_name,
            keys::APPROX_PREFIX_CACHE_PRODUCER,
        )
    }
}

#[cfg(test)]
mod tests;
