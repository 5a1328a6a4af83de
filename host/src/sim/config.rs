//! Fleet parameters of the simulated model servers, and the validation error shared by every
//! parameter struct of the simulator.

use serde::Deserialize;
use std::fmt;

/// A parameter that failed validation: which field, and a message stating the bad value and
/// the valid range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamError {
    pub field: &'static str,
    pub message: String,
}

impl ParamError {
    pub(crate) fn new(field: &'static str, message: String) -> Self {
        ParamError { field, message }
    }
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ParamError {}

/// Checks `lo <= value <= hi` for an integer parameter.
pub(crate) fn check_range<T>(field: &'static str, value: T, lo: T, hi: T) -> Result<(), ParamError>
where
    T: PartialOrd + fmt::Display + Copy,
{
    if value < lo || value > hi {
        return Err(ParamError::new(
            field,
            format!("{field} must be in {lo}..={hi} (got {value})"),
        ));
    }
    Ok(())
}

/// Checks that a rate or duration is finite and within `lo..=hi` (with `lo` exclusive when
/// `lo_exclusive`).
pub(crate) fn check_float(
    field: &'static str,
    value: f64,
    lo: f64,
    lo_exclusive: bool,
    hi: f64,
) -> Result<(), ParamError> {
    let low_ok = if lo_exclusive {
        value > lo
    } else {
        value >= lo
    };
    if !value.is_finite() || !low_ok || value > hi {
        let open = if lo_exclusive { "(" } else { "[" };
        return Err(ParamError::new(
            field,
            format!("{field} must be in {open}{lo}, {hi}] (got {value})"),
        ));
    }
    Ok(())
}

/// `replicas` identical model servers under the `fixed-rate` model (the parameters of that
/// profile; [`super::SimFleet`] describes a whole fleet, step-engine replicas included).
///
/// Each replica prefills one request at a time at `prefillTokensPerSecond`, charging only the
/// tokens not covered by its prefix cache; it decodes every admitted sequence concurrently at
/// `decodeTokensPerSecond` each, up to `maxRunningSequences` sequences (later requests wait in a
/// FIFO queue). The prefix cache holds `cacheCapacityBlocks` blocks of `blockSizeTokens` tokens.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FleetConfig {
    /// Number of model-server replicas (1..=4096).
    pub replicas: usize,
    /// Tokens per KV-cache block on the server (1..=1024).
    pub block_size_tokens: usize,
    /// Prefix-cache capacity per replica, in blocks (1..=100000000).
    pub cache_capacity_blocks: usize,
    /// Prefill throughput per replica, tokens per second (> 0, ≤ 1e9).
    pub prefill_tokens_per_second: f64,
    /// Decode speed of one sequence, tokens per second (> 0, ≤ 1e9).
    pub decode_tokens_per_second: f64,
    /// Sequences a replica runs at once; further requests queue (1..=100000).
    pub max_running_sequences: u32,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            replicas: 8,
            block_size_tokens: 16,
            cache_capacity_blocks: 16_384,
            prefill_tokens_per_second: 16_000.0,
            decode_tokens_per_second: 50.0,
            max_running_sequences: 64,
        }
    }
}

impl FleetConfig {
    /// Checks every field, in declaration order, and reports the first one out of range.
    pub fn validate(&self) -> Result<(), ParamError> {
        check_range("replicas", self.replicas, 1, 4096)?;
        check_range("blockSizeTokens", self.block_size_tokens, 1, 1024)?;
        check_range(
            "cacheCapacityBlocks",
            self.cache_capacity_blocks,
            1,
            100_000_000,
        )?;
        check_float(
            "prefillTokensPerSecond",
            self.prefill_tokens_per_second,
            0.0,
            true,
            1e9,
        )?;
        check_float(
            "decodeTokensPerSecond",
            self.decode_tokens_per_second,
            0.0,
            true,
            1e9,
        )?;
        check_range(
            "maxRunningSequences",
            self.max_running_sequences,
            1,
            100_000,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_decode_from_empty_object_and_validate() {
        let cfg: FleetConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(cfg, FleetConfig::default());
        assert_eq!(cfg.replicas, 8);
        assert_eq!(cfg.block_size_tokens, 16);
        assert_eq!(cfg.max_running_sequences, 64);
        cfg.validate().unwrap();
    }

    #[test]
    fn unknown_field_is_refused() {
        let err = serde_json::from_str::<FleetConfig>(r#"{"replica": 4}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `replica`"), "{err}");
    }

    #[test]
    fn validation_names_field_value_and_range() {
        let cfg: FleetConfig = serde_json::from_str(r#"{"replicas": 0}"#).unwrap();
        let err = cfg.validate().unwrap_err();
        assert_eq!(err.field, "replicas");
        assert_eq!(err.message, "replicas must be in 1..=4096 (got 0)");

        let cfg = FleetConfig {
            prefill_tokens_per_second: 0.0,
            ..FleetConfig::default()
        };
        let err = cfg.validate().unwrap_err();
        assert_eq!(err.field, "prefillTokensPerSecond");
        assert_eq!(
            err.message,
            "prefillTokensPerSecond must be in (0, 1000000000] (got 0)"
        );
    }

    #[test]
    fn first_failing_field_in_declaration_order_wins() {
        let cfg = FleetConfig {
            block_size_tokens: 0,
            max_running_sequences: 0,
            ..FleetConfig::default()
        };
        assert_eq!(cfg.validate().unwrap_err().field, "blockSizeTokens");
    }
}
