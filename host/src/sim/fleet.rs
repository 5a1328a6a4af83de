//! The simulated fleet: groups of replicas, each group with a profile (a step-engine preset,
//! possibly with parameters overridden, or the fixed-rate model), plus what is fleet-wide —
//! block size, how often the router's metrics are scraped, how late the replicas' KV-cache
//! events reach it, and the latency objectives goodput is counted against. Read from a TOML
//! file (`simulate --fleet`).

use super::config::{check_float, check_range, FleetConfig, ParamError};
use super::kv_events::DEFAULT_KV_EVENT_DELAY_MS;
use super::profile::{preset, profile_names, EngineParams, DEFAULT_PROFILE, FIXED_RATE};
use crate::config::locate::{line_at, line_of, Step};
use crate::config::ConfigError;
use std::path::Path;

/// How one group of replicas is modelled.
#[derive(Debug, Clone, PartialEq)]
pub enum Profile {
    /// The fixed-rate model ([`super::replica`]); `replicas` and `block_size_tokens` of the
    /// config are the fleet's, not its own.
    FixedRate(FleetConfig),
    /// The step-based engine model ([`super::stepper`]).
    Engine(EngineParams),
}

impl Profile {
    /// Checks the profile's own parameters against their ranges.
    pub fn validate(&self) -> Result<(), ParamError> {
        match self {
            Profile::FixedRate(c) => c.validate(),
            Profile::Engine(e) => e.validate(),
        }
    }
}

/// `replicas` replicas sharing one profile.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaGroup {
    pub replicas: usize,
    /// The preset it started from (or `fixed-rate`).
    pub profile_name: String,
    pub profile: Profile,
}

/// Everything the simulator needs to know about the fleet.
#[derive(Debug, Clone, PartialEq)]
pub struct SimFleet {
    pub block_size_tokens: usize,
    /// How often the router's view of the replicas' metrics is refreshed; 0 refreshes it at
    /// every event. In-flight counts are always exact.
    pub scrape_interval_ms: f64,
    /// How long after a replica's cache changed the router hears of it, for routers that
    /// read the replicas' KV-cache events.
    pub kv_event_delay_ms: f64,
    /// A completed request meets its objectives when its TTFT and its time per output token
    /// (after the first) are within these.
    pub ttft_objective_ms: f64,
    pub tpot_objective_ms: f64,
    pub groups: Vec<ReplicaGroup>,
}

/// The reference's default metrics refresh interval.
pub const DEFAULT_SCRAPE_INTERVAL_MS: f64 = 50.0;
/// Default latency objectives, of the order of MLPerf Inference's server scenarios (2 s to
/// the first token, 100–200 ms per output token).
pub const DEFAULT_TTFT_OBJECTIVE_MS: f64 = 2000.0;
pub const DEFAULT_TPOT_OBJECTIVE_MS: f64 = 100.0;

impl From<&FleetConfig> for SimFleet {
    /// Every replica fixed-rate with `cfg`'s parameters, metrics fresh at every event: the
    /// model `simulate` had before profiles.
    fn from(cfg: &FleetConfig) -> SimFleet {
        SimFleet {
            block_size_tokens: cfg.block_size_tokens,
            scrape_interval_ms: 0.0,
            kv_event_delay_ms: DEFAULT_KV_EVENT_DELAY_MS,
            ttft_objective_ms: DEFAULT_TTFT_OBJECTIVE_MS,
            tpot_objective_ms: DEFAULT_TPOT_OBJECTIVE_MS,
            groups: vec![ReplicaGroup {
                replicas: cfg.replicas,
                profile_name: FIXED_RATE.to_string(),
                profile: Profile::FixedRate(cfg.clone()),
            }],
        }
    }
}

impl From<&SimFleet> for SimFleet {
    fn from(fleet: &SimFleet) -> SimFleet {
        fleet.clone()
    }
}

impl From<FleetConfig> for SimFleet {
    fn from(cfg: FleetConfig) -> SimFleet {
        SimFleet::from(&cfg)
    }
}

impl SimFleet {
    /// `replicas` replicas of the profile `name` (a preset or `fixed-rate`) with its default
    /// parameters, 16-token blocks, the default scrape interval and objectives.
    ///
    /// `fixed-rate` is the model `simulate` had before profiles, metrics fresh at every event
    /// included, so its figures can be checked by hand; a fleet file can give it a scrape
    /// interval.
    pub fn uniform(name: &str, replicas: usize) -> Result<SimFleet, String> {
        let profile = default_profile(name).ok_or_else(|| {
            format!(
                "unknown profile `{name}` (expected one of: {})",
                profile_names()
            )
        })?;
        let fixed = matches!(profile, Profile::FixedRate(_));
        Ok(SimFleet {
            block_size_tokens: 16,
            scrape_interval_ms: if fixed {
                0.0
            } else {
                DEFAULT_SCRAPE_INTERVAL_MS
            },
            kv_event_delay_ms: DEFAULT_KV_EVENT_DELAY_MS,
            ttft_objective_ms: DEFAULT_TTFT_OBJECTIVE_MS,
            tpot_objective_ms: DEFAULT_TPOT_OBJECTIVE_MS,
            groups: vec![ReplicaGroup {
                replicas,
                profile_name: name.to_string(),
                profile,
            }],
        })
    }

    /// The fleet `simulate` runs without `--fleet` or `--profile`.
    pub fn default_fleet(replicas: usize) -> SimFleet {
        SimFleet::uniform(DEFAULT_PROFILE, replicas).expect("the default profile is a preset")
    }

    pub fn replicas(&self) -> usize {
        self.groups.iter().map(|g| g.replicas).sum()
    }

    /// The profile of each replica, in fleet order (groups in file order).
    pub fn profiles(&self) -> impl Iterator<Item = &Profile> {
        self.groups
            .iter()
            .flat_map(|g| std::iter::repeat_n(&g.profile, g.replicas))
    }

    /// KV blocks of each replica (the pool, or the fixed-rate prefix cache).
    pub fn blocks_per_replica(&self) -> Vec<u64> {
        self.profiles()
            .map(|p| match p {
                Profile::FixedRate(c) => c.cache_capacity_blocks as u64,
                Profile::Engine(e) => e.kv_blocks as u64,
            })
            .collect()
    }

    /// One line per group, for the run's banner: `8 × h100x2-qwen3-32b`.
    pub fn describe(&self) -> String {
        self.groups
            .iter()
            .map(|g| format!("{} × {}", g.replicas, g.profile_name))
            .collect::<Vec<_>>()
            .join(" + ")
    }

    /// Checks the fleet-wide values and every group; the first problem wins.
    pub fn validate(&self) -> Result<(), ParamError> {
        self.validate_top_level()?;
        check_range("replicas", self.replicas(), 1, 4096)?;
        for g in &self.groups {
            check_range("replicas", g.replicas, 1, 4096)?;
            g.profile.validate()?;
        }
        Ok(())
    }

    /// Reads a fleet file. Errors name the file, the line, the field, the value and what it
    /// takes.
    pub fn parse(path: &Path, text: &str) -> Result<SimFleet, ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| {
            ConfigError::new(path, format!("TOML syntax: {}", e.message().trim()))
                .at_line(e.span().map(|s| line_at(text, s.start)))
        })?;
        let at = |steps: &[Step<'_>], field: &str, message: String| {
            ConfigError::new(path, message)
                .at_line(line_of(text, steps))
                .field(field)
        };
        let mut fleet = SimFleet {
            groups: Vec::new(),
            ..SimFleet::default_fleet(1)
        };
        for (key, value) in &table {
            let steps = [Step::Key(key)];
            let bad = |m: String| at(&steps, key, m);
            match key.as_str() {
                "blockSizeTokens" => fleet.block_size_tokens = integer(key, value).map_err(bad)?,
                "scrapeIntervalMs" => fleet.scrape_interval_ms = number(key, value).map_err(bad)?,
                "kvEventDelayMs" => fleet.kv_event_delay_ms = number(key, value).map_err(bad)?,
                "ttftObjectiveMs" => fleet.ttft_objective_ms = number(key, value).map_err(bad)?,
                "tpotObjectiveMs" => fleet.tpot_objective_ms = number(key, value).map_err(bad)?,
                "groups" => {}
                _ => {
                    return Err(bad(format!(
                        "unknown key `{key}` (expected blockSizeTokens, scrapeIntervalMs, \
                         kvEventDelayMs, ttftObjectiveMs, tpotObjectiveMs or [[groups]])"
                    )))
                }
            }
        }
        let top_level = fleet.validate_top_level();
        if let Err(e) = top_level {
            return Err(at(&[Step::Key(e.field)], e.field, e.message));
        }
        let Some(groups) = table.get("groups") else {
            return Err(ConfigError::new(
                path,
                "no [[groups]]: add at least one, e.g. [[groups]] replicas = 8, profile = \
                 \"h100x2-qwen3-32b\"",
            ));
        };
        let Some(groups) = groups.as_array() else {
            return Err(at(
                &[Step::Key("groups")],
                "groups",
                "groups must be an array of tables ([[groups]])".into(),
            ));
        };
        for (i, group) in groups.iter().enumerate() {
            let here = |key: &'static str| [Step::Key("groups"), Step::Index(i), Step::Key(key)];
            let Some(group) = group.as_table() else {
                return Err(at(
                    &[Step::Key("groups"), Step::Index(i)],
                    "groups",
                    "each of groups must be a table ([[groups]])".into(),
                ));
            };
            let name = match group.get("profile") {
                None => DEFAULT_PROFILE.to_string(),
                Some(toml::Value::String(s)) => s.clone(),
                Some(other) => {
                    return Err(at(
                        &here("profile"),
                        "profile",
                        format!("profile must be a string (got {other})"),
                    ))
                }
            };
            let Some(mut profile) = default_profile(&name) else {
                return Err(at(
                    &here("profile"),
                    "profile",
                    format!(
                        "unknown profile `{name}` (expected one of: {})",
                        profile_names()
                    ),
                ));
            };
            let mut replicas = 1;
            for (key, value) in group {
                let steps = [Step::Key("groups"), Step::Index(i), Step::Key(key.as_str())];
                let bad = |m: String| at(&steps, key, m);
                match key.as_str() {
                    "profile" => {}
                    "replicas" => replicas = integer(key, value).map_err(bad)?,
                    _ => set_profile_field(&mut profile, key, value).map_err(bad)?,
                }
            }
            let checked =
                check_range("replicas", replicas, 1, 4096).and_then(|()| profile.validate());
            if let Err(e) = checked {
                let steps = [Step::Key("groups"), Step::Index(i), Step::Key(e.field)];
                return Err(at(&steps, e.field, e.message));
            }
            fleet.groups.push(ReplicaGroup {
                replicas,
                profile_name: name,
                profile,
            });
        }
        if let Err(e) = check_range("replicas", fleet.replicas(), 1, 4096) {
            return Err(at(
                &[Step::Key("groups")],
                "replicas",
                format!(
                    "the groups' replicas add up to {}: {}",
                    fleet.replicas(),
                    e.message
                ),
            ));
        }
        Ok(fleet)
    }

    fn validate_top_level(&self) -> Result<(), ParamError> {
        check_range("blockSizeTokens", self.block_size_tokens, 1, 1024)?;
        check_float("scrapeIntervalMs", self.scrape_interval_ms, 0.0, false, 1e6)?;
        check_float("kvEventDelayMs", self.kv_event_delay_ms, 0.0, false, 1e6)?;
        check_float("ttftObjectiveMs", self.ttft_objective_ms, 0.0, true, 1e9)?;
        check_float("tpotObjectiveMs", self.tpot_objective_ms, 0.0, true, 1e9)?;
        Ok(())
    }
}

/// The profile `name` with its default parameters.
fn default_profile(name: &str) -> Option<Profile> {
    if name == FIXED_RATE {
        return Some(Profile::FixedRate(FleetConfig::default()));
    }
    preset(name).map(|p| Profile::Engine(p.params.clone()))
}

fn integer<T: TryFrom<i64>>(key: &str, value: &toml::Value) -> Result<T, String> {
    value
        .as_integer()
        .and_then(|v| T::try_from(v).ok())
        .ok_or_else(|| format!("{key} must be a non-negative integer (got {value})"))
}

fn number(key: &str, value: &toml::Value) -> Result<f64, String> {
    match value {
        toml::Value::Float(f) => Ok(*f),
        toml::Value::Integer(i) => Ok(*i as f64),
        other => Err(format!("{key} must be a number (got {other})")),
    }
}

/// Sets the parameter `key` of a group's profile.
fn set_profile_field(profile: &mut Profile, key: &str, value: &toml::Value) -> Result<(), String> {
    match profile {
        Profile::Engine(p) => match key {
            "kvBlocks" => p.kv_blocks = integer(key, value)?,
            "maxNumBatchedTokens" => p.max_num_batched_tokens = integer(key, value)?,
            "maxNumSeqs" => p.max_num_seqs = integer(key, value)?,
            "stepOverheadMs" => p.step_overhead_ms = number(key, value)?,
            "prefillMsPerToken" => p.prefill_ms_per_token = number(key, value)?,
            "decodeMsPerSequence" => p.decode_ms_per_sequence = number(key, value)?,
            "contextMsPerKiloToken" => p.context_ms_per_kilo_token = number(key, value)?,
            _ => {
                return Err(format!(
                    "unknown key `{key}` for a step-engine profile (expected replicas, profile, \
                     kvBlocks, maxNumBatchedTokens, maxNumSeqs, stepOverheadMs, \
                     prefillMsPerToken, decodeMsPerSequence or contextMsPerKiloToken)"
                ))
            }
        },
        Profile::FixedRate(c) => match key {
            "cacheCapacityBlocks" => c.cache_capacity_blocks = integer(key, value)?,
            "prefillTokensPerSecond" => c.prefill_tokens_per_second = number(key, value)?,
            "decodeTokensPerSecond" => c.decode_tokens_per_second = number(key, value)?,
            "maxRunningSequences" => c.max_running_sequences = integer(key, value)?,
            _ => {
                return Err(format!(
                    "unknown key `{key}` for the fixed-rate profile (expected replicas, \
                     profile, cacheCapacityBlocks, prefillTokensPerSecond, \
                     decodeTokensPerSecond or maxRunningSequences)"
                ))
            }
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests;
