//! Shared-prefix groups: `groups` system prompts, each followed by `promptsPerGroup` distinct
//! questions, sent in random order as a Poisson process.

use super::arrivals::{
    check_arrival_params, Arrivals, Delays, DEFAULT_JITTER_MS, DEFAULT_SPREAD_MS,
};
use super::{exponential, push_random_tokens};
use crate::sim::config::{check_float, check_range, ParamError};
use crate::sim::router::SimRequest;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

/// Parameters of the `shared-prefix` workload.
///
/// Prompt `(g, q)` is group `g`'s system prompt (`systemPromptTokens` tokens, identical within
/// the group) followed by its own question (`questionTokens` tokens); it carries the group tag
/// `g`. The `groups × promptsPerGroup` prompts are shuffled and sent as a Poisson process at
/// `requestsPerSecond`, the first at 0 ms. Each request is its own burst for the client
/// arrival model ([`super::arrivals`]): it reaches the router up to `arrivalSpreadMs` late,
/// plus `arrivalJitterMs` of jitter.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SharedPrefixParams {
    /// Seed of the generator.
    pub seed: u64,
    pub model: String,
    pub cache_salt: String,
    /// Groups (1..=100000).
    pub groups: u32,
    /// Prompts per group (1..=100000).
    pub prompts_per_group: u32,
    /// Shared system prompt, tokens (0..=1000000).
    pub system_prompt_tokens: u32,
    /// Question after the system prompt, tokens (0..=1000000).
    pub question_tokens: u32,
    /// Output per request, tokens (1..=1000000).
    pub output_tokens: u32,
    /// Mean arrival rate (> 0, ≤ 1e6).
    pub requests_per_second: f64,
    /// Time the client takes to send one request, ms (0..=1e9).
    pub arrival_spread_ms: f64,
    /// Mean of each request's exponential jitter, ms (0..=1e9).
    pub arrival_jitter_ms: f64,
}

impl Default for SharedPrefixParams {
    fn default() -> Self {
        SharedPrefixParams {
            seed: 1,
            model: "sim-model".to_string(),
            cache_salt: String::new(),
            groups: 64,
            prompts_per_group: 16,
            system_prompt_tokens: 2048,
            question_tokens: 128,
            output_tokens: 256,
            requests_per_second: 16.0,
            arrival_spread_ms: DEFAULT_SPREAD_MS,
            arrival_jitter_ms: DEFAULT_JITTER_MS,
        }
    }
}

impl SharedPrefixParams {
    pub fn validate(&self) -> Result<(), ParamError> {
        check_range("groups", self.groups, 1, 100_000)?;
        check_range("promptsPerGroup", self.prompts_per_group, 1, 100_000)?;
        check_range(
            "systemPromptTokens",
            self.system_prompt_tokens,
            0,
            1_000_000,
        )?;
        check_range("questionTokens", self.question_tokens, 0, 1_000_000)?;
        if self.system_prompt_tokens == 0 && self.question_tokens == 0 {
            return Err(ParamError::new(
                "questionTokens",
                "questionTokens must be >= 1 when systemPromptTokens is 0 (got 0)".to_string(),
            ));
        }
        check_range("outputTokens", self.output_tokens, 1, 1_000_000)?;
        check_float(
            "requestsPerSecond",
            self.requests_per_second,
            0.0,
            true,
            1e6,
        )?;
        let total = u64::from(self.groups) * u64::from(self.prompts_per_group);
        if total > 10_000_000 {
            return Err(ParamError::new(
                "promptsPerGroup",
                format!("groups × promptsPerGroup must be at most 10000000 (got {total})"),
            ));
        }
        check_arrival_params(self.arrival_spread_ms, self.arrival_jitter_ms)
    }

    /// Requests in the workload.
    pub fn request_count(&self) -> usize {
        self.groups as usize * self.prompts_per_group as usize
    }

    /// The requests, in arrival order, numbered from 0, each made when asked for: the system
    /// prompts and the shuffled order are drawn first, then each request's gap and question.
    pub fn requests(&self) -> Arrivals<SharedPrefixNominal<'_>> {
        let mut rng = SmallRng::seed_from_u64(self.seed);
        let mut order: Vec<(u32, u32)> = (0..self.groups)
            .flat_map(|g| (0..self.prompts_per_group).map(move |q| (g, q)))
            .collect();
        let mut systems = Vec::with_capacity(self.groups as usize);
        for _ in 0..self.groups {
            let mut tokens = Vec::with_capacity(self.system_prompt_tokens as usize);
            push_random_tokens(&mut rng, self.system_prompt_tokens, &mut tokens);
            systems.push(tokens);
        }
        order.shuffle(&mut rng);
        let nominal = SharedPrefixNominal {
            params: self,
            rng,
            order,
            systems,
            next: 0,
            now: 0.0,
        };
        let delays = Delays::new(self.seed, self.arrival_spread_ms, self.arrival_jitter_ms);
        Arrivals::new(nominal, delays)
    }

    pub fn generate(&self) -> Vec<SimRequest> {
        self.requests().collect()
    }
}

/// The requests of a [`SharedPrefixParams`] workload at their nominal times (non-negative
/// gaps apart), made as they are asked for.
pub struct SharedPrefixNominal<'a> {
    params: &'a SharedPrefixParams,
    rng: SmallRng,
    order: Vec<(u32, u32)>,
    systems: Vec<Vec<u32>>,
    next: usize,
    now: f64,
}

impl Iterator for SharedPrefixNominal<'_> {
    type Item = SimRequest;

    fn next(&mut self) -> Option<SimRequest> {
        let p = self.params;
        let i = self.next;
        let &(g, _q) = self.order.get(i)?;
        self.next += 1;
        if i > 0 {
            self.now += exponential(&mut self.rng, 1000.0 / p.requests_per_second);
        }
        let system = &self.systems[g as usize];
        let mut tokens = Vec::with_capacity(system.len() + p.question_tokens as usize);
        tokens.extend_from_slice(system);
        push_random_tokens(&mut self.rng, p.question_tokens, &mut tokens);
        Some(SimRequest {
            // Numbered by arrival in `Arrivals`.
            id: 0,
            arrival_ms: self.now,
            model: p.model.clone(),
            cache_salt: p.cache_salt.clone(),
            tokens: tokens.into(),
            output_tokens: p.output_tokens,
            group: u64::from(g),
            step: None,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.order.len() - self.next;
        (left, Some(left))
    }
}
