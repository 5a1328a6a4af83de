//! Workloads the simulator replays: seeded synthetic generators (RL rollout bursts,
//! shared-prefix groups, multi-turn sessions, many tenants under KV pressure) and JSONL
//! traces.
//!
//! Every generator is open-loop: arrival times are fixed by the parameters and the seed, not by
//! how fast the simulated fleet answers, so every pipeline sees exactly the same requests at
//! exactly the same times. Generators send requests at nominal times and the client arrival
//! model ([`arrivals`]) delays them to the times they reach the router; requests are ordered
//! by those times and numbered from 0.

pub mod arrivals;
mod kv_pressure;
mod multi_turn;
mod rl_rollout;
mod shared_prefix;
mod trace;

pub use kv_pressure::KvPressureParams;
pub use multi_turn::MultiTurnParams;
pub use rl_rollout::RlRolloutParams;
pub use shared_prefix::SharedPrefixParams;
pub use trace::{parse_trace, prompt_to_tokens, read_trace, TraceError, TraceParams};

use super::config::{check_range, ParamError};
use super::router::SimRequest;
use rand::rngs::SmallRng;
use rand::Rng;
use std::fmt;

/// Synthetic token ids are drawn uniformly from `0..VOCAB`.
const VOCAB: u32 = 128_000;

/// A synthetic workload with its parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    RlRollout(RlRolloutParams),
    SharedPrefix(SharedPrefixParams),
    MultiTurn(MultiTurnParams),
    KvPressure(KvPressureParams),
}

/// A workload that could not be built from a name and parameter overrides.
#[derive(Debug)]
pub enum WorkloadError {
    UnknownName(String),
    Decode {
        workload: &'static str,
        source: serde_json::Error,
    },
    Invalid {
        workload: &'static str,
        source: ParamError,
    },
    /// A parameter of the wrong type, or a run that would not fit in the memory allowed.
    Refused {
        workload: &'static str,
        message: String,
    },
}

impl fmt::Display for WorkloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkloadError::UnknownName(name) => write!(
                f,
                "unknown workload `{name}` (expected one of: {})",
                Workload::NAMES.join(", ")
            ),
            WorkloadError::Decode { workload, source } => {
                write!(f, "workload {workload}: {source}")
            }
            WorkloadError::Invalid { workload, source } => {
                write!(f, "workload {workload}: {source}")
            }
            WorkloadError::Refused { workload, message } => {
                write!(f, "workload {workload}: {message}")
            }
        }
    }
}

impl std::error::Error for WorkloadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WorkloadError::UnknownName(_) | WorkloadError::Refused { .. } => None,
            WorkloadError::Decode { source, .. } => Some(source),
            WorkloadError::Invalid { source, .. } => Some(source),
        }
    }
}

impl Workload {
    /// Names accepted by [`Workload::from_name`].
    pub const NAMES: [&'static str; 4] =
        ["rl-rollout", "shared-prefix", "multi-turn", "kv-pressure"];

    /// The workload called `name`, with `overrides` (a JSON object of camelCase parameters,
    /// `null` for none) decoded over its defaults and validated.
    pub fn from_name(name: &str, overrides: serde_json::Value) -> Result<Self, WorkloadError> {
        let overrides = if overrides.is_null() {
            serde_json::Value::Object(serde_json::Map::new())
        } else {
            overrides
        };
        let workload = match name {
            "rl-rollout" => Workload::RlRollout(decode(Self::NAMES[0], overrides)?),
            "shared-prefix" => Workload::SharedPrefix(decode(Self::NAMES[1], overrides)?),
            "multi-turn" => Workload::MultiTurn(decode(Self::NAMES[2], overrides)?),
            "kv-pressure" => Workload::KvPressure(decode(Self::NAMES[3], overrides)?),
            _ => return Err(WorkloadError::UnknownName(name.to_string())),
        };
        workload
            .validate()
            .map_err(|source| WorkloadError::Invalid {
                workload: workload.name(),
                source,
            })?;
        Ok(workload)
    }

    pub fn name(&self) -> &'static str {
        match self {
            Workload::RlRollout(_) => Self::NAMES[0],
            Workload::SharedPrefix(_) => Self::NAMES[1],
            Workload::MultiTurn(_) => Self::NAMES[2],
            Workload::KvPressure(_) => Self::NAMES[3],
        }
    }

    /// Every parameter, defaults filled in, under its camelCase name.
    pub fn parameters(&self) -> serde_json::Value {
        let value = match self {
            Workload::RlRollout(p) => serde_json::to_value(p),
            Workload::SharedPrefix(p) => serde_json::to_value(p),
            Workload::MultiTurn(p) => serde_json::to_value(p),
            Workload::KvPressure(p) => serde_json::to_value(p),
        };
        value.unwrap_or(serde_json::Value::Null)
    }

    pub fn validate(&self) -> Result<(), ParamError> {
        match self {
            Workload::RlRollout(p) => p.validate(),
            Workload::SharedPrefix(p) => p.validate(),
            Workload::MultiTurn(p) => p.validate(),
            Workload::KvPressure(p) => p.validate(),
        }
    }

    /// Requests in the workload.
    pub fn len(&self) -> usize {
        match self {
            Workload::RlRollout(p) => p.request_count(),
            Workload::SharedPrefix(p) => p.request_count(),
            Workload::MultiTurn(p) => p.request_count(),
            Workload::KvPressure(p) => p.request_count(),
        }
    }

    /// Always false: every valid workload has requests.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The requests, in arrival order, numbered from 0, made as they are asked for where the
    /// generator allows (`rl-rollout`, `shared-prefix`, `kv-pressure`); the same every time.
    /// Parameters are assumed validated.
    pub fn requests(&self) -> Box<dyn Iterator<Item = SimRequest> + '_> {
        match self {
            Workload::RlRollout(p) => Box::new(p.requests()),
            Workload::SharedPrefix(p) => Box::new(p.requests()),
            Workload::MultiTurn(p) => Box::new(p.generate().into_iter()),
            Workload::KvPressure(p) => Box::new(p.requests()),
        }
    }

    /// An estimate of the memory a `simulate` run of this workload takes, in bytes, made from
    /// the parameters alone so that a run too large to fit is refused before anything is
    /// allocated. It counts, per request, what the simulator keeps for the report; per
    /// distinct full block of 16 tokens, its hash in the simulator and in the ideal-prefill
    /// count; the token buffers a generator holds at once (two RL steps' prompts, or the
    /// prompts of the steps the client's spread overlaps; for Poisson arrivals, the requests
    /// held over the spread); and a copy of the prompts of the requests in flight together
    /// (one RL step, or, when a step's prefill on the default fleet outlasts
    /// `stepIntervalMs`, the steps piling up; one prompt per session; for Poisson arrivals, a
    /// fleet's worth of batches), which a pipeline holds while they are in flight. A fleet
    /// falling far behind its arrivals holds more.
    pub fn memory_estimate(&self) -> u64 {
        const PER_REQUEST: f64 = 256.0;
        const PER_BLOCK: f64 = 40.0;
        const PER_TOKEN: f64 = 4.0;
        /// A pipeline's copy of an in-flight prompt and its block hashes.
        const IN_FLIGHT_PER_TOKEN: f64 = PER_TOKEN + 8.0 / 16.0;
        const BLOCK: f64 = 16.0;
        /// Requests assumed in flight at once under Poisson arrivals.
        const POISSON_IN_FLIGHT: f64 = 4096.0;
        let n = self.len() as f64;
        let mean = |min: u32, max: u32| (f64::from(min) + f64::from(max)) / 2.0;
        // How long the client model may hold a request back: its spread and, practically,
        // all of its exponential jitter.
        let held_ms = |spread: f64, jitter: f64| spread + 20.0 * jitter;
        // Poisson arrivals of `groups` shared prefixes, each request adding a question of its
        // own: the prefixes once, each question's blocks, the requests held back by the
        // client model and a fleet's worth in flight.
        let prefixed_poisson = |groups: f64, prefix: f64, question: f64, rps: f64, held: f64| {
            let prompt = prefix + question;
            let distinct = groups * prefix + n * question;
            let held = (1.0 + rps * held / 1000.0).min(n);
            n * PER_REQUEST
                + (n * prompt / BLOCK * 8.0 + distinct / BLOCK * (PER_BLOCK - 8.0))
                + groups * prefix * PER_TOKEN
                + held * prompt * PER_TOKEN
                + n.min(POISSON_IN_FLIGHT) * prompt * IN_FLIGHT_PER_TOKEN
        };
        let bytes = match self {
            Workload::RlRollout(p) => {
                let prompt = mean(p.prompt_tokens_min, p.prompt_tokens_max);
                let per_step = f64::from(p.prompts) * f64::from(p.samples);
                let distinct = f64::from(p.prompts) * f64::from(p.steps) * prompt;
                // A step's prompts prefilled once per replica they are spread over, at the
                // default fleet's rate (8 replicas × 16000 tokens/s): when that takes longer
                // than the step interval, steps pile up and every request may be in flight.
                let replicas = 8.0;
                let step_work_ms =
                    f64::from(p.prompts) * f64::from(p.samples).min(replicas) * prompt
                        / (replicas * 16.0);
                let together = if p.step_interval_ms >= step_work_ms {
                    per_step
                } else {
                    n * (1.0 - p.step_interval_ms / step_work_ms)
                };
                // Steps whose sending overlaps are held together.
                let held = held_ms(p.arrival_spread_ms, p.arrival_jitter_ms);
                let overlapping = if p.step_interval_ms > 0.0 {
                    (2.0 + held / p.step_interval_ms).min(f64::from(p.steps))
                } else {
                    f64::from(p.steps)
                };
                let together = together.max(per_step * (overlapping - 1.0).max(1.0)).min(n);
                n * PER_REQUEST
                    + distinct / BLOCK * PER_BLOCK
                    + overlapping * f64::from(p.prompts) * prompt * PER_TOKEN
                    + together * prompt * IN_FLIGHT_PER_TOKEN
            }
            Workload::SharedPrefix(p) => prefixed_poisson(
                f64::from(p.groups),
                f64::from(p.system_prompt_tokens),
                f64::from(p.question_tokens),
                p.requests_per_second,
                held_ms(p.arrival_spread_ms, p.arrival_jitter_ms),
            ),
            Workload::KvPressure(p) => prefixed_poisson(
                f64::from(p.tenants),
                f64::from(p.prefix_tokens),
                mean(p.question_tokens_min, p.question_tokens_max),
                p.requests_per_second,
                held_ms(p.arrival_spread_ms, p.arrival_jitter_ms),
            ),
            Workload::MultiTurn(p) => {
                let last = f64::from(p.system_prompt_tokens)
                    + f64::from(p.turns) * mean(p.user_tokens_min, p.user_tokens_max)
                    + f64::from(p.turns - 1) * mean(p.output_tokens_min, p.output_tokens_max);
                let sessions = f64::from(p.sessions);
                // Every request is made before the run, and its session's buffer with it.
                n * 2.0 * PER_REQUEST
                    + sessions * last / BLOCK * PER_BLOCK
                    + sessions * last * PER_TOKEN
                    + sessions * last * IN_FLIGHT_PER_TOKEN
            }
        };
        bytes as u64
    }

    /// The parameters that drive [`Workload::memory_estimate`], to name in a refusal.
    pub fn size_parameters(&self) -> &'static str {
        match self {
            Workload::RlRollout(_) => "steps, prompts, samples or promptTokensMax",
            Workload::SharedPrefix(_) => {
                "groups, promptsPerGroup, systemPromptTokens or questionTokens"
            }
            Workload::MultiTurn(_) => "sessions, turns, systemPromptTokens or userTokensMax",
            Workload::KvPressure(_) => "requests, tenants, prefixTokens or questionTokensMax",
        }
    }

    /// Refuses the workload when its [`Workload::memory_estimate`] exceeds `limit` bytes;
    /// `limit_source` says where the limit came from.
    pub fn check_memory(&self, limit: u64, limit_source: &str) -> Result<(), WorkloadError> {
        let estimate = self.memory_estimate();
        if estimate <= limit {
            return Ok(());
        }
        Err(WorkloadError::Refused {
            workload: self.name(),
            message: format!(
                "this run needs an estimated {} of memory, over the limit of {} ({limit_source}); \
                 lower {}, or raise the limit with --max-memory",
                format_bytes(estimate),
                format_bytes(limit),
                self.size_parameters()
            ),
        })
    }

    /// All requests at once (see [`Workload::requests`]).
    pub fn generate(&self) -> Vec<SimRequest> {
        self.requests().collect()
    }
}

impl TraceParams {
    /// Name of the trace's parameter set in errors.
    pub const NAME: &'static str = "trace";

    /// The parameters with `overrides` (a JSON object of camelCase parameters, `null` for
    /// none) decoded over their defaults and validated.
    pub fn from_overrides(overrides: serde_json::Value) -> Result<Self, WorkloadError> {
        let overrides = if overrides.is_null() {
            serde_json::Value::Object(serde_json::Map::new())
        } else {
            overrides
        };
        let params: TraceParams = decode(Self::NAME, overrides)?;
        params.validate().map_err(|source| WorkloadError::Invalid {
            workload: Self::NAME,
            source,
        })?;
        Ok(params)
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    workload: &'static str,
    overrides: serde_json::Value,
) -> Result<T, WorkloadError> {
    serde_json::from_value(overrides.clone()).map_err(|source| {
        let unknown = overrides
            .as_object()
            .and_then(|object| object.keys().find(|k| valid_values(workload, k).is_none()));
        if let Some(key) = unknown {
            let names: Vec<&str> = PARAMETERS
                .iter()
                .copied()
                .filter(|p| valid_values(workload, p).is_some())
                .collect();
            return WorkloadError::Refused {
                workload,
                message: format!(
                    "unknown parameter {key:?} in --set; parameters of {workload}: {}",
                    names.join(", ")
                ),
            };
        }
        // Find the parameter at fault and say what it takes.
        let bad = overrides.as_object().and_then(|object| {
            object.iter().find_map(|(key, value)| {
                let alone = serde_json::json!({ key: value });
                let valid = valid_values(workload, key)?;
                serde_json::from_value::<T>(alone).is_err().then(|| {
                    let shown = match value {
                        serde_json::Value::String(s) => format!("{s:?}"),
                        other => other.to_string(),
                    };
                    format!("{key} must be {valid} (got {shown})")
                })
            })
        });
        match bad {
            Some(message) => WorkloadError::Refused { workload, message },
            None => WorkloadError::Decode { workload, source },
        }
    })
}

/// Every workload parameter name, in the order they are listed in refusals.
const PARAMETERS: &[&str] = &[
    "seed",
    "model",
    "cacheSalt",
    "prompts",
    "samples",
    "steps",
    "stepIntervalMs",
    "groups",
    "promptsPerGroup",
    "tenants",
    "requests",
    "prefixTokens",
    "questionTokensMin",
    "questionTokensMax",
    "sessions",
    "turns",
    "systemPromptTokens",
    "questionTokens",
    "userTokensMin",
    "userTokensMax",
    "promptTokensMin",
    "promptTokensMax",
    "outputTokens",
    "outputTokensMin",
    "outputTokensMax",
    "interleaved",
    "thinkTimeMs",
    "requestsPerSecond",
    "sessionsPerSecond",
    "arrivalSpreadMs",
    "arrivalJitterMs",
];

/// What a workload parameter takes, as documented (`None` for an unknown name).
fn valid_values(workload: &str, key: &str) -> Option<&'static str> {
    let common = match key {
        "seed" => Some("an integer in 0..=18446744073709551615"),
        "model" | "cacheSalt" if workload != TraceParams::NAME => Some("a string"),
        "arrivalSpreadMs" | "arrivalJitterMs" => Some("a number in 0..=1e9"),
        _ => None,
    };
    let specific = match (workload, key) {
        ("rl-rollout", "prompts") => "an integer in 1..=100000",
        ("rl-rollout", "samples") => "an integer in 1..=10000",
        ("rl-rollout", "steps") => "an integer in 1..=100000",
        ("rl-rollout", "stepIntervalMs") | ("multi-turn", "thinkTimeMs") => "a number in 0..=1e9",
        ("rl-rollout", "promptTokensMin" | "promptTokensMax")
        | ("rl-rollout" | "multi-turn", "outputTokensMin" | "outputTokensMax")
        | ("multi-turn", "userTokensMin" | "userTokensMax")
        | ("shared-prefix", "outputTokens")
        | (
            "kv-pressure",
            "prefixTokens" | "questionTokensMin" | "questionTokensMax" | "outputTokensMin"
            | "outputTokensMax",
        ) => "an integer in 1..=1000000",
        ("kv-pressure", "tenants") => "an integer in 1..=100000",
        ("kv-pressure", "requests") => "an integer in 1..=10000000",
        ("rl-rollout", "interleaved") => "true or false",
        ("shared-prefix", "groups" | "promptsPerGroup") | ("multi-turn", "sessions") => {
            "an integer in 1..=100000"
        }
        ("shared-prefix" | "multi-turn", "systemPromptTokens")
        | ("shared-prefix", "questionTokens") => "an integer in 0..=1000000",
        ("shared-prefix" | "kv-pressure", "requestsPerSecond")
        | ("multi-turn", "sessionsPerSecond") => "a number in (0, 1e6]",
        ("multi-turn", "turns") => "an integer in 1..=1000",
        _ => return common,
    };
    Some(specific)
}

/// `bytes` in binary units with one decimal (`1.5 GiB`).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Reads a memory size: a whole number of bytes, or one with a `K`, `M`, `G` or `T` suffix
/// (binary units, an optional `iB`/`B` after it, case-insensitive).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    number.checked_mul(1u64 << shift)
}

/// The default memory limit of `simulate`: half of the machine's physical memory
/// (`MemTotal` in `/proc/meminfo`), or 8 GiB where that cannot be read.
pub fn default_memory_limit() -> (u64, &'static str) {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            kib.checked_mul(1024)
        });
    match total {
        Some(bytes) => (bytes / 2, "half of physical memory"),
        None => (8 << 30, "the default when physical memory is unknown"),
    }
}

/// Appends `n` random token ids.
fn push_random_tokens(rng: &mut SmallRng, n: u32, out: &mut Vec<u32>) {
    out.extend((0..n).map(|_| rng.random_range(0..VOCAB)));
}

/// An exponential sample with the given mean.
fn exponential(rng: &mut SmallRng, mean: f64) -> f64 {
    let u: f64 = rng.random();
    -(1.0 - u).ln() * mean
}

/// Orders by arrival (ties keep generation order) and numbers from 0.
fn number_by_arrival(mut requests: Vec<SimRequest>) -> Vec<SimRequest> {
    requests.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    for (i, r) in requests.iter_mut().enumerate() {
        r.id = i as u64;
    }
    requests
}

/// Checks a pair of token-count parameters: each in 1..=1000000, and `min <= max`.
fn check_token_span(
    min_field: &'static str,
    max_field: &'static str,
    min: u32,
    max: u32,
) -> Result<(), ParamError> {
    check_range(min_field, min, 1, 1_000_000)?;
    check_range(max_field, max, 1, 1_000_000)?;
    if max < min {
        return Err(ParamError::new(
            max_field,
            format!("{max_field} must be >= {min_field} ({min}) (got {max})"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
