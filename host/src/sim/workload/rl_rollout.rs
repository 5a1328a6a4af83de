//! RL rollout bursts: every step, `prompts` fresh prompts each sampled `samples` times, all
//! arriving at the step's start; steps start every `stepIntervalMs`.

use super::{check_order, number_by_arrival, push_random_tokens};
use crate::sim::config::{check_float, check_range, ParamError};
use crate::sim::router::SimRequest;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;

/// Parameters of the `rl-rollout` workload.
///
/// Step `s` (from 0) arrives at `s × stepIntervalMs`, a fixed schedule: a step does not wait
/// for the previous one to finish, so a slow pipeline sees steps overlap. Each prompt's length
/// is uniform in `promptTokensMin..=promptTokensMax`; each sample's output length is uniform in
/// `outputTokensMin..=outputTokensMax`. The samples of one prompt carry identical tokens, the
/// group tag `s × prompts + p` and the step tag `s`. Within a step the requests arrive prompt
/// by prompt (all samples of prompt 0, then of prompt 1, …), or sample by sample when
/// `interleaved` (one sample of every prompt, then the next round), which is how some trainers
/// repeat a batch.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RlRolloutParams {
    /// Seed of the generator.
    pub seed: u64,
    pub model: String,
    pub cache_salt: String,
    /// Distinct prompts per step (1..=100000).
    pub prompts: u32,
    /// Samples per prompt (1..=10000).
    pub samples: u32,
    /// Rollout steps (1..=100000).
    pub steps: u32,
    /// Time between step starts, ms (0..=1e9).
    pub step_interval_ms: f64,
    /// Shortest prompt, tokens (1..=1000000).
    pub prompt_tokens_min: u32,
    /// Longest prompt, tokens (promptTokensMin..=1000000).
    pub prompt_tokens_max: u32,
    /// Shortest output, tokens (1..=1000000).
    pub output_tokens_min: u32,
    /// Longest output, tokens (outputTokensMin..=1000000).
    pub output_tokens_max: u32,
    /// Arrival order within a step: sample rounds instead of prompt by prompt.
    pub interleaved: bool,
}

impl Default for RlRolloutParams {
    fn default() -> Self {
        RlRolloutParams {
            seed: 1,
            model: "sim-model".to_string(),
            cache_salt: String::new(),
            prompts: 32,
            samples: 16,
            steps: 4,
            step_interval_ms: 30_000.0,
            prompt_tokens_min: 1024,
            prompt_tokens_max: 4096,
            output_tokens_min: 128,
            output_tokens_max: 512,
            interleaved: false,
        }
    }
}

impl RlRolloutParams {
    pub fn validate(&self) -> Result<(), ParamError> {
        check_range("prompts", self.prompts, 1, 100_000)?;
        check_range("samples", self.samples, 1, 10_000)?;
        check_range("steps", self.steps, 1, 100_000)?;
        check_float("stepIntervalMs", self.step_interval_ms, 0.0, false, 1e9)?;
        check_range("promptTokensMin", self.prompt_tokens_min, 1, 1_000_000)?;
        check_range("promptTokensMax", self.prompt_tokens_max, 1, 1_000_000)?;
        check_order(
            "promptTokensMax",
            "promptTokensMin",
            self.prompt_tokens_min,
            self.prompt_tokens_max,
        )?;
        check_range("outputTokensMin", self.output_tokens_min, 1, 1_000_000)?;
        check_range("outputTokensMax", self.output_tokens_max, 1, 1_000_000)?;
        check_order(
            "outputTokensMax",
            "outputTokensMin",
            self.output_tokens_min,
            self.output_tokens_max,
        )?;
        let total = u64::from(self.prompts) * u64::from(self.samples) * u64::from(self.steps);
        if total > 10_000_000 {
            return Err(ParamError::new(
                "steps",
                format!("prompts × samples × steps must be at most 10000000 (got {total})"),
            ));
        }
        Ok(())
    }

    pub fn generate(&self) -> Vec<SimRequest> {
        let mut rng = SmallRng::seed_from_u64(self.seed);
        let per_step = self.prompts as usize * self.samples as usize;
        let mut requests = Vec::with_capacity(per_step * self.steps as usize);
        let mut prompts: Vec<Vec<u32>> = Vec::with_capacity(self.prompts as usize);
        for step in 0..self.steps {
            let arrival_ms = f64::from(step) * self.step_interval_ms;
            prompts.clear();
            for _ in 0..self.prompts {
                let len = rng.random_range(self.prompt_tokens_min..=self.prompt_tokens_max);
                let mut tokens = Vec::with_capacity(len as usize);
                push_random_tokens(&mut rng, len, &mut tokens);
                prompts.push(tokens);
            }
            for k in 0..per_step as u32 {
                let (p, _sample) = if self.interleaved {
                    (k % self.prompts, k / self.prompts)
                } else {
                    (k / self.samples, k % self.samples)
                };
                requests.push(SimRequest {
                    id: 0,
                    arrival_ms,
                    model: self.model.clone(),
                    cache_salt: self.cache_salt.clone(),
                    tokens: prompts[p as usize].clone(),
                    output_tokens: rng
                        .random_range(self.output_tokens_min..=self.output_tokens_max),
                    group: u64::from(step) * u64::from(self.prompts) + u64::from(p),
                    step: Some(step),
                });
            }
        }
        number_by_arrival(requests)
    }
}
