//! Parameters of the burst producer: decoding from JSON, defaults, validation and the derived
//! values the assignment needs.

use std::fmt;

use serde::Deserialize;
use switchyard_plugin_api::sdk::parse_parameters;
use switchyard_plugin_api::PluginError;

/// `groupMemoryMs` when not set: long enough for any client's spread of one burst, short
/// next to the time between RL steps.
pub const DEFAULT_GROUP_MEMORY_MS: i64 = 2000;

/// Block cap used when `maxPrefixTokensToMatch` is 0.
pub const DEFAULT_MAX_BLOCKS: usize = 2048;

/// A parameter that failed validation (or parameters that failed to decode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamError {
    /// The offending parameter.
    pub field: &'static str,
    /// States the field, the bad value and what would be valid.
    pub message: String,
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ParamError {}

impl From<ParamError> for PluginError {
    fn from(error: ParamError) -> Self {
        PluginError::invalid_parameter(error.field, error.message)
    }
}

/// What the fair share of a batch is measured in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BalanceBy {
    /// Each request counts 1.
    Requests,
    /// Each placement counts the prefix blocks the replica does not already hold from this batch.
    Tokens,
}

impl BalanceBy {
    /// Parses a `balanceBy` value; the empty string means [`BalanceBy::Requests`].
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "" | "requests" => Some(Self::Requests),
            "tokens" => Some(Self::Tokens),
            _ => None,
        }
    }
}

/// How a batch is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignment {
    /// The reference's greedy placement ([`crate::assign`]).
    Reference,
    /// Equal shares over the replicas' carried load ([`crate::fair_share`]); ours.
    FairShare,
}

impl Assignment {
    /// Parses an `assignment` value; the empty string means [`Assignment::Reference`].
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "" | "reference" => Some(Self::Reference),
            "fairShare" => Some(Self::FairShare),
            _ => None,
        }
    }
}

/// `burst-prefix-cache-producer` parameters, with the reference's names and defaults.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct BurstConfig {
    /// Length of a batch window in milliseconds, counted from the first request of the batch.
    pub window_duration_ms: i64,
    /// Most members of one unit placed on one replica; -1 = no limit.
    pub max_per_replica: i64,
    /// Tokens per hashed prefix block.
    pub block_size_tokens: i64,
    /// Prefix tokens hashed per prompt; 0 = up to [`DEFAULT_MAX_BLOCKS`] blocks.
    pub max_prefix_tokens_to_match: i64,
    /// Leading blocks two requests must share to be co-located; 0 = identical prompts only.
    pub min_colocate_blocks: i64,
    /// Most requests one window may hold; -1 = no limit.
    pub max_batch_size: i64,
    /// `"requests"` or `"tokens"` (see [`BalanceBy`]); empty means `"requests"`.
    pub balance_by: String,
    /// `"reference"` or `"fairShare"` (see [`Assignment`]); a switchyard extension.
    pub assignment: String,
    /// Seal the window once no request has joined it for this many milliseconds, still at
    /// most `windowDurationMs` after it opened; 0 keeps the fixed window. A switchyard extension.
    pub window_quiet_ms: i64,
    /// Producer of `PrefixCacheMatchInfo` estimating what the replicas already cache (such as
    /// `approx-prefix-cache-producer`); empty for none. A switchyard extension.
    pub cached_match_producer_name: String,
    /// Producer of `InFlightLoad` (such as `inflight-load-producer`); when set, fair share
    /// counts a replica's carried load as the larger of its reported running requests and the
    /// requests in flight to it, so metrics read at the last scrape cannot hide the requests
    /// sent since. Empty for none. A switchyard extension.
    pub in_flight_producer_name: String,
    /// With `fairShare`: how long a prompt group placed by one window is remembered after its
    /// last request, so later windows continue its placement ([`crate::burst_plan`]); 0 places
    /// every window on its own. A switchyard extension.
    pub group_memory_ms: i64,
}

impl Default for BurstConfig {
    fn default() -> Self {
        Self {
            window_duration_ms: 100,
            max_per_replica: -1,
            block_size_tokens: 64,
            max_prefix_tokens_to_match: 0,
            min_colocate_blocks: 0,
            max_batch_size: 1000,
            balance_by: "requests".to_owned(),
            assignment: "reference".to_owned(),
            window_quiet_ms: 0,
            cached_match_producer_name: String::new(),
            in_flight_producer_name: String::new(),
            group_memory_ms: DEFAULT_GROUP_MEMORY_MS,
        }
    }
}

impl BurstConfig {
    /// Decodes JSON parameters over the defaults (`null` or empty means all defaults) and
    /// validates them. Unknown fields and type errors name the field at fault.
    pub fn parse(parameters: &str) -> Result<Self, PluginError> {
        let config: Self = parse_parameters(parameters)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every parameter in declaration order and reports the first one out of range.
    pub fn validate(&self) -> Result<(), ParamError> {
        let fail = |field: &'static str, message: String| Err(ParamError { field, message });
        if !(1..=10_000).contains(&self.window_duration_ms) {
            return fail(
                "windowDurationMs",
                format!(
                    "windowDurationMs must be in 1..=10000 (got {})",
                    self.window_duration_ms
                ),
            );
        }
        if self.max_per_replica != -1 && self.max_per_replica < 1 {
            return fail(
                "maxPerReplica",
                format!(
                    "maxPerReplica must be -1 (unlimited) or >= 1 (got {})",
                    self.max_per_replica
                ),
            );
        }
        if self.block_size_tokens < 1 {
            return fail(
                "blockSizeTokens",
                format!(
                    "blockSizeTokens must be >= 1 (got {})",
                    self.block_size_tokens
                ),
            );
        }
        if self.max_prefix_tokens_to_match < 0 {
            return fail(
                "maxPrefixTokensToMatch",
                format!(
                    "maxPrefixTokensToMatch must be >= 0 (got {})",
                    self.max_prefix_tokens_to_match
                ),
            );
        }
        if self.max_prefix_tokens_to_match > 0
            && self.max_prefix_tokens_to_match < self.block_size_tokens
        {
            return fail(
                "maxPrefixTokensToMatch",
                format!(
                    "maxPrefixTokensToMatch must be 0 or >= blockSizeTokens ({}) (got {}); \
                     a smaller positive value would hash no block",
                    self.block_size_tokens, self.max_prefix_tokens_to_match
                ),
            );
        }
        if self.min_colocate_blocks < 0 {
            return fail(
                "minColocateBlocks",
                format!(
                    "minColocateBlocks must be >= 0 (got {})",
                    self.min_colocate_blocks
                ),
            );
        }
        if self.max_batch_size != -1 && self.max_batch_size < 1 {
            return fail(
                "maxBatchSize",
                format!(
                    "maxBatchSize must be -1 (unlimited) or >= 1 (got {})",
                    self.max_batch_size
                ),
            );
        }
        if BalanceBy::parse(&self.balance_by).is_none() {
            return fail(
                "balanceBy",
                format!(
                    "balanceBy must be \"requests\" or \"tokens\" (got {:?})",
                    self.balance_by
                ),
            );
        }
        match Assignment::parse(&self.assignment) {
            None => {
                return fail(
                    "assignment",
                    format!(
                        "assignment must be \"reference\" or \"fairShare\" (got {:?})",
                        self.assignment
                    ),
                )
            }
            Some(Assignment::FairShare) if self.max_per_replica != -1 => {
                return fail(
                    "maxPerReplica",
                    format!(
                        "maxPerReplica must be -1 with assignment = \"fairShare\", which sizes \
                         each replica's share itself (got {})",
                        self.max_per_replica
                    ),
                )
            }
            Some(_) => {}
        }
        if !(0..=self.window_duration_ms).contains(&self.window_quiet_ms) {
            return fail(
                "windowQuietMs",
                format!(
                    "windowQuietMs must be in 0..=windowDurationMs ({}) (got {}); 0 keeps the \
                     fixed window",
                    self.window_duration_ms, self.window_quiet_ms
                ),
            );
        }
        if !(0..=600_000).contains(&self.group_memory_ms) {
            return fail(
                "groupMemoryMs",
                format!(
                    "groupMemoryMs must be in 0..=600000 (got {}); 0 places every window on its \
                     own",
                    self.group_memory_ms
                ),
            );
        }
        Ok(())
    }

    // The accessors below give the validated values in the types the logic uses. On a config
    // that failed validation they fall back to the nearest meaningful value instead of panicking.

    /// Blocks hashed per prompt: `maxPrefixTokensToMatch / blockSizeTokens` when positive,
    /// otherwise [`DEFAULT_MAX_BLOCKS`].
    pub fn max_blocks(&self) -> usize {
        if self.max_prefix_tokens_to_match > 0 && self.block_size_tokens > 0 {
            to_usize(self.max_prefix_tokens_to_match / self.block_size_tokens)
        } else {
            DEFAULT_MAX_BLOCKS
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        to_usize(self.block_size_tokens)
    }

    /// Per-replica cap of one unit; `None` = unlimited.
    pub fn per_replica_cap(&self) -> Option<usize> {
        (self.max_per_replica >= 1).then(|| to_usize(self.max_per_replica))
    }

    /// Most requests per batch; `None` = unlimited.
    pub fn batch_cap(&self) -> Option<usize> {
        (self.max_batch_size >= 1).then(|| to_usize(self.max_batch_size))
    }

    /// Shared leading blocks needed for co-location; 0 = identical prompts only.
    pub fn colocate_blocks(&self) -> usize {
        to_usize(self.min_colocate_blocks)
    }

    /// Batch window length in milliseconds.
    pub fn window_ms(&self) -> u64 {
        u64::try_from(self.window_duration_ms).unwrap_or(0)
    }

    /// Quiet gap that seals a window early; `None` for the fixed window (also when the gap is
    /// the whole window, which seals no earlier).
    pub fn quiet_ms(&self) -> Option<u64> {
        (self.window_quiet_ms > 0 && self.window_quiet_ms < self.window_duration_ms)
            .then(|| u64::try_from(self.window_quiet_ms).unwrap_or(0))
    }

    /// The producer whose cache estimates leave lone requests to the scorers, if any.
    pub fn cached_match_producer(&self) -> Option<&str> {
        (!self.cached_match_producer_name.is_empty())
            .then_some(self.cached_match_producer_name.as_str())
    }

    /// The producer of in-flight counts fair share adds to the replicas' reported load, if any.
    pub fn in_flight_producer(&self) -> Option<&str> {
        (!self.in_flight_producer_name.is_empty()).then_some(self.in_flight_producer_name.as_str())
    }

    /// How long placed groups are remembered, when windows continue each other's placement
    /// (`fairShare` with a positive `groupMemoryMs`).
    pub fn group_memory(&self) -> Option<u64> {
        (self.assignment() == Assignment::FairShare && self.group_memory_ms > 0)
            .then(|| u64::try_from(self.group_memory_ms).unwrap_or(0))
    }

    /// The placement ([`Assignment::Reference`] if the value is invalid).
    pub fn assignment(&self) -> Assignment {
        Assignment::parse(&self.assignment).unwrap_or(Assignment::Reference)
    }

    /// The fair-share measure ([`BalanceBy::Requests`] if the value is invalid).
    pub fn balance(&self) -> BalanceBy {
        BalanceBy::parse(&self.balance_by).unwrap_or(BalanceBy::Requests)
    }
}

fn to_usize(value: i64) -> usize {
    usize::try_from(value.max(0)).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests;
