//! KV pressure: many tenants, each with a long prefix of its own, whose requests (the prefix
//! and a fresh question) arrive mixed together as a Poisson process. Together the prefixes
//! hold more blocks than a replica's KV cache, so caches evict all the time and where a
//! tenant's prefix still is decides each request's prefill.

use super::arrivals::{
    check_arrival_params, Arrivals, Delays, DEFAULT_JITTER_MS, DEFAULT_SPREAD_MS,
};
use super::{check_token_span, exponential, push_random_tokens};
use crate::sim::config::{check_float, check_range, ParamError};
use crate::sim::router::SimRequest;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Parameters of the `kv-pressure` workload.
///
/// `tenants` prefixes of `prefixTokens` tokens are drawn first. Each of the `requests`
/// requests picks a tenant uniformly at random and is that tenant's prefix followed by a
/// question of its own (uniform in `questionTokensMin..=questionTokensMax` tokens); it
/// carries the tenant as its group tag. Requests are sent as a Poisson process at
/// `requestsPerSecond`, the first at 0 ms, each its own burst for the client arrival model.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KvPressureParams {
    /// Seed of the generator.
    pub seed: u64,
    pub model: String,
    pub cache_salt: String,
    /// Tenants, each with its own prefix (1..=100000).
    pub tenants: u32,
    /// Each tenant's prefix, tokens (1..=1000000).
    pub prefix_tokens: u32,
    /// A request's question after its tenant's prefix, tokens (1..=1000000, min ≤ max).
    pub question_tokens_min: u32,
    pub question_tokens_max: u32,
    /// Output per request, tokens (1..=1000000, min ≤ max).
    pub output_tokens_min: u32,
    pub output_tokens_max: u32,
    /// Requests in the workload (1..=10000000).
    pub requests: u32,
    /// Mean arrival rate (> 0, ≤ 1e6).
    pub requests_per_second: f64,
    /// Time the client takes to send one request, ms (0..=1e9).
    pub arrival_spread_ms: f64,
    /// Mean of each request's exponential jitter, ms (0..=1e9).
    pub arrival_jitter_ms: f64,
}

impl Default for KvPressureParams {
    fn default() -> Self {
        KvPressureParams {
            seed: 1,
            model: "sim-model".to_string(),
            cache_salt: String::new(),
            tenants: 200,
            prefix_tokens: 6000,
            question_tokens_min: 600,
            question_tokens_max: 1200,
            output_tokens_min: 1000,
            output_tokens_max: 2000,
            requests: 2000,
            requests_per_second: 8.0,
            arrival_spread_ms: DEFAULT_SPREAD_MS,
            arrival_jitter_ms: DEFAULT_JITTER_MS,
        }
    }
}

impl KvPressureParams {
    pub fn validate(&self) -> Result<(), ParamError> {
        check_range("tenants", self.tenants, 1, 100_000)?;
        check_range("prefixTokens", self.prefix_tokens, 1, 1_000_000)?;
        check_token_span(
            "questionTokensMin",
            "questionTokensMax",
            self.question_tokens_min,
            self.question_tokens_max,
        )?;
        check_token_span(
            "outputTokensMin",
            "outputTokensMax",
            self.output_tokens_min,
            self.output_tokens_max,
        )?;
        check_range("requests", self.requests, 1, 10_000_000)?;
        check_float(
            "requestsPerSecond",
            self.requests_per_second,
            0.0,
            true,
            1e6,
        )?;
        check_arrival_params(self.arrival_spread_ms, self.arrival_jitter_ms)
    }

    /// Requests in the workload.
    pub fn request_count(&self) -> usize {
        self.requests as usize
    }

    /// The requests, in arrival order, numbered from 0, each made when asked for: the
    /// tenants' prefixes are drawn first, then each request's gap, tenant, question and
    /// output length.
    pub fn requests(&self) -> Arrivals<KvPressureNominal<'_>> {
        let mut rng = SmallRng::seed_from_u64(self.seed);
        let prefixes = (0..self.tenants)
            .map(|_| {
                let mut tokens = Vec::with_capacity(self.prefix_tokens as usize);
                push_random_tokens(&mut rng, self.prefix_tokens, &mut tokens);
                tokens
            })
            .collect();
        let nominal = KvPressureNominal {
            params: self,
            rng,
            prefixes,
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

/// The requests of a [`KvPressureParams`] workload at their nominal times, made as they are
/// asked for.
pub struct KvPressureNominal<'a> {
    params: &'a KvPressureParams,
    rng: SmallRng,
    prefixes: Vec<Vec<u32>>,
    next: u32,
    now: f64,
}

impl Iterator for KvPressureNominal<'_> {
    type Item = SimRequest;

    fn next(&mut self) -> Option<SimRequest> {
        let p = self.params;
        if self.next >= p.requests {
            return None;
        }
        if self.next > 0 {
            self.now += exponential(&mut self.rng, 1000.0 / p.requests_per_second);
        }
        self.next += 1;
        let tenant = self.rng.random_range(0..p.tenants);
        let question = self
            .rng
            .random_range(p.question_tokens_min..=p.question_tokens_max);
        let output = self
            .rng
            .random_range(p.output_tokens_min..=p.output_tokens_max);
        let prefix = &self.prefixes[tenant as usize];
        let mut tokens = Vec::with_capacity(prefix.len() + question as usize);
        tokens.extend_from_slice(prefix);
        push_random_tokens(&mut self.rng, question, &mut tokens);
        Some(SimRequest {
            // Numbered by arrival in `Arrivals`.
            id: 0,
            arrival_ms: self.now,
            model: p.model.clone(),
            cache_salt: p.cache_salt.clone(),
            tokens: tokens.into(),
            output_tokens: output,
            group: u64::from(tenant),
            step: None,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.params.requests - self.next) as usize;
        (left, Some(left))
    }
}
