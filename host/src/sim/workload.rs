//! Workloads the simulator replays: seeded synthetic generators (RL rollout bursts,
//! shared-prefix groups, multi-turn sessions) and JSONL traces.
//!
//! Every generator is open-loop: arrival times are fixed by the parameters and the seed, not by
//! how fast the simulated fleet answers, so every pipeline sees exactly the same requests at
//! exactly the same times. Generated requests are ordered by arrival and numbered from 0.

mod multi_turn;
mod rl_rollout;
mod shared_prefix;
mod trace;

pub use multi_turn::MultiTurnParams;
pub use rl_rollout::RlRolloutParams;
pub use shared_prefix::SharedPrefixParams;
pub use trace::{parse_trace, prompt_to_tokens, read_trace, TraceError};

use super::config::ParamError;
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
        }
    }
}

impl std::error::Error for WorkloadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WorkloadError::UnknownName(_) => None,
            WorkloadError::Decode { source, .. } => Some(source),
            WorkloadError::Invalid { source, .. } => Some(source),
        }
    }
}

impl Workload {
    /// Names accepted by [`Workload::from_name`].
    pub const NAMES: [&'static str; 3] = ["rl-rollout", "shared-prefix", "multi-turn"];

    /// The workload called `name`, with `overrides` (a JSON object of camelCase parameters,
    /// `null` for none) decoded over its defaults and validated.
    pub fn from_name(name: &str, overrides: serde_json::Value) -> Result<Self, WorkloadError> {
        let overrides = if overrides.is_null() {
            serde_json::Value::Object(serde_json::Map::new())
        } else {
            overrides
        };
        let workload = match name {
            "rl-rollout" => Workload::RlRollout(decode(name, overrides)?),
            "shared-prefix" => Workload::SharedPrefix(decode(name, overrides)?),
            "multi-turn" => Workload::MultiTurn(decode(name, overrides)?),
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
        }
    }

    pub fn validate(&self) -> Result<(), ParamError> {
        match self {
            Workload::RlRollout(p) => p.validate(),
            Workload::SharedPrefix(p) => p.validate(),
            Workload::MultiTurn(p) => p.validate(),
        }
    }

    /// The requests, in arrival order, numbered from 0. Parameters are assumed validated.
    pub fn generate(&self) -> Vec<SimRequest> {
        match self {
            Workload::RlRollout(p) => p.generate(),
            Workload::SharedPrefix(p) => p.generate(),
            Workload::MultiTurn(p) => p.generate(),
        }
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    name: &str,
    overrides: serde_json::Value,
) -> Result<T, WorkloadError> {
    serde_json::from_value(overrides).map_err(|source| WorkloadError::Decode {
        workload: Workload::NAMES
            .iter()
            .find(|n| **n == name)
            .copied()
            .unwrap_or("?"),
        source,
    })
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

/// Checks `min <= max` for a pair of range parameters.
fn check_order(
    max_field: &'static str,
    min_field: &'static str,
    min: u32,
    max: u32,
) -> Result<(), ParamError> {
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
