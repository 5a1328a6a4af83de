//! RL rollout bursts: every step, `prompts` fresh prompts each sampled `samples` times, all
//! sent at the step's start; steps start every `stepIntervalMs`.

use super::arrivals::{
    check_arrival_params, Arrivals, Delays, DEFAULT_JITTER_MS, DEFAULT_SPREAD_MS,
};
use super::{check_token_span, push_random_tokens};
use crate::sim::config::{check_float, check_range, ParamError};
use crate::sim::router::{SimRequest, Tokens};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Parameters of the `rl-rollout` workload.
///
/// Step `s` (from 0) is sent at `s × stepIntervalMs`, a fixed schedule: a step does not wait
/// for the previous one to finish, so a slow pipeline sees steps overlap. The client spreads
/// each step over `arrivalSpreadMs` in the order below, with `arrivalJitterMs` of jitter (see
/// [`super::arrivals`]); steps under `stepIntervalMs = 0` are one burst. Each prompt's length
/// is uniform in `promptTokensMin..=promptTokensMax`; each sample's output length is uniform in
/// `outputTokensMin..=outputTokensMax`. The samples of one prompt carry identical tokens, the
/// group tag `s × prompts + p` and the step tag `s`. Within a step the requests arrive prompt
/// by prompt (all samples of prompt 0, then of prompt 1, …), or sample by sample when
/// `interleaved` (one sample of every prompt, then the next round), which is how some trainers
/// repeat a batch.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
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
    /// Time the client takes to send one step, ms (0..=1e9).
    pub arrival_spread_ms: f64,
    /// Mean of each request's exponential jitter, ms (0..=1e9).
    pub arrival_jitter_ms: f64,
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
            arrival_spread_ms: DEFAULT_SPREAD_MS,
            arrival_jitter_ms: DEFAULT_JITTER_MS,
        }
    }
}

impl RlRolloutParams {
    pub fn validate(&self) -> Result<(), ParamError> {
        check_range("prompts", self.prompts, 1, 100_000)?;
        check_range("samples", self.samples, 1, 10_000)?;
        check_range("steps", self.steps, 1, 100_000)?;
        check_float("stepIntervalMs", self.step_interval_ms, 0.0, false, 1e9)?;
        check_token_span(
            "promptTokensMin",
            "promptTokensMax",
            self.prompt_tokens_min,
            self.prompt_tokens_max,
        )?;
        check_token_span(
            "outputTokensMin",
            "outputTokensMax",
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
        check_arrival_params(self.arrival_spread_ms, self.arrival_jitter_ms)
    }

    /// Requests in the workload.
    pub fn request_count(&self) -> usize {
        self.prompts as usize * self.samples as usize * self.steps as usize
    }

    /// The requests, in arrival order, numbered from 0, generated one step at a time: only
    /// the prompts of the steps whose requests are being sent are held, and each prompt's
    /// samples share its tokens.
    pub fn requests(&self) -> Arrivals<RlRolloutNominal<'_>> {
        let nominal = RlRolloutNominal {
            params: self,
            rng: SmallRng::seed_from_u64(self.seed),
            step: 0,
            k: 0,
            prompts: Vec::with_capacity(self.prompts as usize),
        };
        let delays = Delays::new(self.seed, self.arrival_spread_ms, self.arrival_jitter_ms);
        Arrivals::new(nominal, delays)
    }

    pub fn generate(&self) -> Vec<SimRequest> {
        self.requests().collect()
    }
}

/// The requests of an [`RlRolloutParams`] workload at their nominal times, made as they are
/// asked for: steps at nondecreasing times (`s × stepIntervalMs` with a non-negative
/// interval), the requests of one step at the same time.
pub struct RlRolloutNominal<'a> {
    params: &'a RlRolloutParams,
    rng: SmallRng,
    step: u32,
    /// Position within the step.
    k: u32,
    /// The current step's prompts; empty before the step's first request.
    prompts: Vec<Arc<[u32]>>,
}

impl Iterator for RlRolloutNominal<'_> {
    type Item = SimRequest;

    fn next(&mut self) -> Option<SimRequest> {
        let p = self.params;
        let per_step = p.prompts * p.samples;
        if self.k == per_step {
            self.step += 1;
            self.k = 0;
            self.prompts.clear();
        }
        if self.step >= p.steps {
            return None;
        }
        if self.k == 0 {
            for _ in 0..p.prompts {
                let len = self
                    .rng
                    .random_range(p.prompt_tokens_min..=p.prompt_tokens_max);
                let mut tokens = Vec::with_capacity(len as usize);
                push_random_tokens(&mut self.rng, len, &mut tokens);
                self.prompts.push(tokens.into());
            }
        }
        let k = self.k;
        self.k += 1;
        let (prompt, _sample) = if p.interleaved {
            (k % p.prompts, k / p.prompts)
        } else {
            (k / p.samples, k % p.samples)
        };
        let buf = &self.prompts[prompt as usize];
        Some(SimRequest {
            // Numbered by arrival in `Arrivals`.
            id: 0,
            arrival_ms: f64::from(self.step) * p.step_interval_ms,
            model: p.model.clone(),
            cache_salt: p.cache_salt.clone(),
            tokens: Tokens::prefix(buf, buf.len()),
            output_tokens: self
                .rng
                .random_range(p.output_tokens_min..=p.output_tokens_max),
            group: u64::from(self.step) * u64::from(p.prompts) + u64::from(prompt),
            step: Some(self.step),
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let p = self.params;
        let done = self.step as usize * (p.prompts * p.samples) as usize + self.k as usize;
        let left = p.request_count().saturating_sub(done);
        (left, Some(left))
    }
}
