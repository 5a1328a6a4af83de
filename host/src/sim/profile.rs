//! Replica profiles: the parameters of the step-based engine model, and the named presets.
//!
//! A step costs
//!
//! ```text
//! step_ms = stepOverheadMs
//!         + prefillMsPerToken      × prefill tokens scheduled in the step
//!         + decodeMsPerSequence    × sequences decoding one token in the step
//!         + contextMsPerKiloToken  × (KV tokens the step's sequences attend over) / 1000
//! ```
//!
//! so a decode step grows with the batch and with its sequences' lengths, and a prefill chunk
//! scheduled beside decodes lengthens the step they share. `docs/simulate.md` derives the
//! presets' coefficients from public figures.

use super::config::{check_float, check_range, ParamError};

/// Parameters of one replica under the step-based engine model.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineParams {
    /// KV blocks in the replica's pool, shared by running sequences and cached prefixes
    /// (1..=10000000).
    pub kv_blocks: usize,
    /// Tokens scheduled in one step at most, prefill chunks and decodes together
    /// (1..=10000000).
    pub max_num_batched_tokens: u32,
    /// Sequences running at once at most (1..=100000).
    pub max_num_seqs: u32,
    /// Fixed cost of a step, ms (0..=1e6).
    pub step_overhead_ms: f64,
    /// Cost per prefilled token, ms (0..=1e6).
    pub prefill_ms_per_token: f64,
    /// Cost per decoding sequence, ms (0..=1e6).
    pub decode_ms_per_sequence: f64,
    /// Cost per 1000 tokens of KV read by the step's attention, ms (0..=1e6).
    pub context_ms_per_kilo_token: f64,
}

impl EngineParams {
    /// Checks every field, in declaration order, and reports the first one out of range.
    pub fn validate(&self) -> Result<(), ParamError> {
        check_range("kvBlocks", self.kv_blocks, 1, 10_000_000)?;
        check_range(
            "maxNumBatchedTokens",
            self.max_num_batched_tokens,
            1,
            10_000_000,
        )?;
        check_range("maxNumSeqs", self.max_num_seqs, 1, 100_000)?;
        check_float("stepOverheadMs", self.step_overhead_ms, 0.0, false, 1e6)?;
        check_float(
            "prefillMsPerToken",
            self.prefill_ms_per_token,
            0.0,
            false,
            1e6,
        )?;
        check_float(
            "decodeMsPerSequence",
            self.decode_ms_per_sequence,
            0.0,
            false,
            1e6,
        )?;
        check_float(
            "contextMsPerKiloToken",
            self.context_ms_per_kilo_token,
            0.0,
            false,
            1e6,
        )?;
        if self.step_overhead_ms + self.prefill_ms_per_token + self.decode_ms_per_sequence <= 0.0 {
            return Err(ParamError::new(
                "stepOverheadMs",
                "stepOverheadMs, prefillMsPerToken and decodeMsPerSequence are all 0: a step \
                 would take no time; make at least one of them positive"
                    .to_string(),
            ));
        }
        Ok(())
    }

    /// The step time of a step with this composition, ms.
    pub fn step_ms(&self, prefill_tokens: u64, decode_seqs: u64, context_tokens: u64) -> f64 {
        self.step_overhead_ms
            + self.prefill_ms_per_token * prefill_tokens as f64
            + self.decode_ms_per_sequence * decode_seqs as f64
            + self.context_ms_per_kilo_token * context_tokens as f64 / 1000.0
    }
}

#[cfg(test)]
impl EngineParams {
    /// Round numbers for cases worked out by hand: 1 ms per step, 0.25 ms per prefill token,
    /// 0.5 ms per decoding sequence, no context cost; 64 tokens and 4 sequences per step.
    pub(crate) fn round_numbers(kv_blocks: usize) -> EngineParams {
        EngineParams {
            kv_blocks,
            max_num_batched_tokens: 64,
            max_num_seqs: 4,
            step_overhead_ms: 1.0,
            prefill_ms_per_token: 0.25,
            decode_ms_per_sequence: 0.5,
            context_ms_per_kilo_token: 0.0,
        }
    }
}

/// A named preset: a model on a GPU setup, with the engine defaults it is served with.
#[derive(Debug, Clone)]
pub struct Preset {
    pub name: &'static str,
    pub summary: &'static str,
    pub params: EngineParams,
}

/// The name of the profile that keeps the fixed-rate replica model.
pub const FIXED_RATE: &str = "fixed-rate";

/// The profile `simulate` uses unless told otherwise.
pub const DEFAULT_PROFILE: &str = "h100x2-qwen3-32b";

/// The step-engine presets (coefficients derived in `docs/simulate.md`, 16-token blocks).
pub const PRESETS: [Preset; 4] = [
    Preset {
        name: "h100x2-qwen3-32b",
        summary: "Qwen3-32B BF16, tensor-parallel over 2 H100 80GB",
        params: EngineParams {
            kv_blocks: 18_000,
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            step_overhead_ms: 11.0,
            prefill_ms_per_token: 0.0628,
            decode_ms_per_sequence: 0.04,
            context_ms_per_kilo_token: 0.04,
        },
    },
    Preset {
        name: "h100-llama3-8b",
        summary: "Llama-3.1-8B BF16 on one H100 80GB",
        params: EngineParams {
            kv_blocks: 25_000,
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            step_overhead_ms: 6.0,
            prefill_ms_per_token: 0.03,
            decode_ms_per_sequence: 0.03,
            context_ms_per_kilo_token: 0.04,
        },
    },
    Preset {
        name: "a100-llama3-8b",
        summary: "Llama-3.1-8B BF16 on one A100 40GB",
        params: EngineParams {
            kv_blocks: 8_800,
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            step_overhead_ms: 12.5,
            prefill_ms_per_token: 0.1,
            decode_ms_per_sequence: 0.06,
            context_ms_per_kilo_token: 0.08,
        },
    },
    Preset {
        name: "h100x4-llama3-70b",
        summary: "Llama-3.1-70B BF16, tensor-parallel over 4 H100 80GB",
        params: EngineParams {
            kv_blocks: 26_000,
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            step_overhead_ms: 12.0,
            prefill_ms_per_token: 0.09,
            decode_ms_per_sequence: 0.05,
            context_ms_per_kilo_token: 0.025,
        },
    },
];

/// The preset called `name`.
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// Every profile name, for messages: the presets, then `fixed-rate`.
pub fn profile_names() -> String {
    let mut names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
    names.push(FIXED_RATE);
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_validates_and_the_default_is_one() {
        for p in &PRESETS {
            p.params.validate().unwrap();
        }
        assert!(preset(DEFAULT_PROFILE).is_some());
        assert!(preset(FIXED_RATE).is_none());
    }

    #[test]
    fn step_time_is_the_documented_linear_function() {
        let p = EngineParams {
            kv_blocks: 10,
            max_num_batched_tokens: 100,
            max_num_seqs: 4,
            step_overhead_ms: 5.0,
            prefill_ms_per_token: 0.5,
            decode_ms_per_sequence: 2.0,
            context_ms_per_kilo_token: 4.0,
        };
        // 5 + 0.5 × 10 + 2 × 3 + 4 × 2500 / 1000
        assert_eq!(p.step_ms(10, 3, 2500), 26.0);
    }

    #[test]
    fn validation_names_the_field() {
        let mut p = PRESETS[0].params.clone();
        p.max_num_seqs = 0;
        let err = p.validate().unwrap_err();
        assert_eq!(err.field, "maxNumSeqs");
        assert_eq!(err.message, "maxNumSeqs must be in 1..=100000 (got 0)");
    }
}
