//! Multi-turn sessions: each turn's prompt is the previous prompt, the previous answer and a
//! new user message.

use super::arrivals::{check_arrival_params, Delays, DEFAULT_JITTER_MS, DEFAULT_SPREAD_MS};
use super::{check_token_span, exponential, number_by_arrival, push_random_tokens};
use crate::sim::config::{check_float, check_range, ParamError};
use crate::sim::router::{SimRequest, Tokens};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Parameters of the `multi-turn` workload.
///
/// Sessions start as a Poisson process at `sessionsPerSecond`, the first at 0 ms. Turn 0's
/// prompt is a per-session system prompt (`systemPromptTokens`) plus a user message; turn
/// `t + 1`'s prompt is turn `t`'s prompt, then turn `t`'s answer (as many random tokens as its
/// `output_tokens`), then a new user message. User messages are uniform in
/// `userTokensMin..=userTokensMax` tokens, answers in `outputTokensMin..=outputTokensMax`.
/// Turn `t + 1` is sent a think time after turn `t` *was sent* (open loop), uniform in
/// `[0.5, 1.5] × thinkTimeMs`; the default is long enough for a turn to finish on an unloaded
/// fleet. All turns of session `s` carry the group tag `s`.
///
/// Each turn is its own burst for the client arrival model ([`super::arrivals`]; the turns of
/// a session are one burst when `thinkTimeMs` is 0): it reaches the router up to
/// `arrivalSpreadMs` after the time above, plus `arrivalJitterMs` of jitter, but never before
/// the previous turn of its session.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MultiTurnParams {
    /// Seed of the generator.
    pub seed: u64,
    pub model: String,
    pub cache_salt: String,
    /// Sessions (1..=100000).
    pub sessions: u32,
    /// Turns per session (1..=1000).
    pub turns: u32,
    /// Per-session system prompt, tokens (0..=1000000).
    pub system_prompt_tokens: u32,
    /// Shortest user message, tokens (1..=1000000).
    pub user_tokens_min: u32,
    /// Longest user message, tokens (userTokensMin..=1000000).
    pub user_tokens_max: u32,
    /// Shortest answer, tokens (1..=1000000).
    pub output_tokens_min: u32,
    /// Longest answer, tokens (outputTokensMin..=1000000).
    pub output_tokens_max: u32,
    /// Mean time between a turn's arrival and the next one's, ms (0..=1e9).
    pub think_time_ms: f64,
    /// Mean session start rate (> 0, ≤ 1e6).
    pub sessions_per_second: f64,
    /// Time the client takes to send one turn, ms (0..=1e9).
    pub arrival_spread_ms: f64,
    /// Mean of each request's exponential jitter, ms (0..=1e9).
    pub arrival_jitter_ms: f64,
}

impl Default for MultiTurnParams {
    fn default() -> Self {
        MultiTurnParams {
            seed: 1,
            model: "sim-model".to_string(),
            cache_salt: String::new(),
            sessions: 32,
            turns: 6,
            system_prompt_tokens: 512,
            user_tokens_min: 64,
            user_tokens_max: 512,
            output_tokens_min: 128,
            output_tokens_max: 512,
            think_time_ms: 30_000.0,
            sessions_per_second: 1.0,
            arrival_spread_ms: DEFAULT_SPREAD_MS,
            arrival_jitter_ms: DEFAULT_JITTER_MS,
        }
    }
}

impl MultiTurnParams {
    pub fn validate(&self) -> Result<(), ParamError> {
        check_range("sessions", self.sessions, 1, 100_000)?;
        check_range("turns", self.turns, 1, 1000)?;
        check_range(
            "systemPromptTokens",
            self.system_prompt_tokens,
            0,
            1_000_000,
        )?;
        check_token_span(
            "userTokensMin",
            "userTokensMax",
            self.user_tokens_min,
            self.user_tokens_max,
        )?;
        check_token_span(
            "outputTokensMin",
            "outputTokensMax",
            self.output_tokens_min,
            self.output_tokens_max,
        )?;
        check_float("thinkTimeMs", self.think_time_ms, 0.0, false, 1e9)?;
        check_float(
            "sessionsPerSecond",
            self.sessions_per_second,
            0.0,
            true,
            1e6,
        )?;
        let longest = u64::from(self.system_prompt_tokens)
            + u64::from(self.turns) * u64::from(self.user_tokens_max)
            + u64::from(self.turns - 1) * u64::from(self.output_tokens_max);
        if longest > u64::from(u32::MAX) {
            return Err(ParamError::new(
                "turns",
                format!(
                    "systemPromptTokens + turns × userTokensMax + (turns - 1) × outputTokensMax \
                     must be at most {} (got {longest})",
                    u32::MAX
                ),
            ));
        }
        check_arrival_params(self.arrival_spread_ms, self.arrival_jitter_ms)
    }

    /// Requests in the workload.
    pub fn request_count(&self) -> usize {
        self.sessions as usize * self.turns as usize
    }

    /// The requests, in arrival order, numbered from 0. Sessions interleave in time, so all
    /// are made before sorting; each turn's prompt is a prefix of its session's last prompt,
    /// and all turns of a session share that one buffer.
    pub fn generate(&self) -> Vec<SimRequest> {
        let mut rng = SmallRng::seed_from_u64(self.seed);
        let mut delays = Delays::new(self.seed, self.arrival_spread_ms, self.arrival_jitter_ms);
        let mean_start_gap_ms = 1000.0 / self.sessions_per_second;
        let mut requests = Vec::with_capacity(self.request_count());
        // (arrival, prompt length, output tokens) of the current session's turns.
        let mut turns = Vec::with_capacity(self.turns as usize);
        let mut start = 0.0;
        for s in 0..self.sessions {
            if s > 0 {
                start += exponential(&mut rng, mean_start_gap_ms);
            }
            let mut prompt = Vec::new();
            push_random_tokens(&mut rng, self.system_prompt_tokens, &mut prompt);
            let mut arrival_ms = start;
            let mut previous_answer = 0;
            turns.clear();
            for t in 0..self.turns {
                if t > 0 {
                    arrival_ms += self.think_time_ms * rng.random_range(0.5..=1.5);
                    push_random_tokens(&mut rng, previous_answer, &mut prompt);
                }
                let user = rng.random_range(self.user_tokens_min..=self.user_tokens_max);
                push_random_tokens(&mut rng, user, &mut prompt);
                let output_tokens =
                    rng.random_range(self.output_tokens_min..=self.output_tokens_max);
                turns.push((arrival_ms, prompt.len(), output_tokens));
                previous_answer = output_tokens;
            }
            let mut previous = 0.0;
            let mut t = 0;
            while t < turns.len() {
                let at = turns[t].0;
                let burst = turns[t..].iter().take_while(|turn| turn.0 == at).count();
                delays.start_burst(burst);
                for turn in &mut turns[t..t + burst] {
                    turn.0 = f64::max(turn.0 + delays.next_delay(), previous);
                    previous = turn.0;
                }
                t += burst;
            }
            let buf: Arc<[u32]> = prompt.into();
            for &(arrival_ms, len, output_tokens) in &turns {
                requests.push(SimRequest {
                    id: 0,
                    arrival_ms,
                    model: self.model.clone(),
                    cache_salt: self.cache_salt.clone(),
                    tokens: Tokens::prefix(&buf, len),
                    output_tokens,
                    group: u64::from(s),
                    step: None,
                });
            }
        }
        number_by_arrival(requests)
    }
}
