//! Parameters of the KV-event prefix-cache producer: decoding over the defaults and validation.

use serde::Deserialize;
use switchyard_plugin_api::keys::APPROX_PREFIX_CACHE_PRODUCER;
use switchyard_plugin_api::sdk::parse_parameters;
use switchyard_plugin_api::PluginError;

/// Largest engine block size accepted as a default.
pub const MAX_BLOCK_SIZE_TOKENS: i64 = 4096;

/// Configuration of one `kv-event-prefix-cache-producer` instance.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KvEventPrefixCacheConfig {
    /// The engines' block size in tokens until an endpoint's first event tells its own.
    pub block_size_tokens: i64,
    /// Most blocks of a prompt to hash and match.
    pub max_prefix_blocks_to_match: i64,
    /// Count blocks an endpoint holds only in its CPU tier as matched.
    pub include_cpu_tier: bool,
    /// The producer whose estimate stands in for an endpoint whose index is incomplete; empty
    /// for none.
    pub fallback_producer_name: String,
    /// After events were lost, how long the index rebuilds from live events before it is
    /// trusted again, in milliseconds; 0 trusts it at once.
    pub rebuild_ms: i64,
    /// Count a dispatched request's blocks as held by its endpoint until it completes.
    pub in_flight_blocks: bool,
}

impl Default for KvEventPrefixCacheConfig {
    fn default() -> Self {
        Self {
            block_size_tokens: 16,
            max_prefix_blocks_to_match: 2048,
            include_cpu_tier: false,
            fallback_producer_name: APPROX_PREFIX_CACHE_PRODUCER.to_string(),
            rebuild_ms: 60_000,
            in_flight_blocks: true,
        }
    }
}

impl KvEventPrefixCacheConfig {
    /// Decodes JSON parameters over the defaults (`null` means all defaults) and validates
    /// them; a bad value is reported with its field and the valid range.
    pub fn parse(parameters: &str) -> Result<Self, PluginError> {
        let config: Self = parse_parameters(parameters)?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), PluginError> {
        if !(1..=MAX_BLOCK_SIZE_TOKENS).contains(&self.block_size_tokens) {
            return Err(PluginError::invalid_parameter(
                "blockSizeTokens",
                format!(
                    "blockSizeTokens is {}; it must be between 1 and {MAX_BLOCK_SIZE_TOKENS}",
                    self.block_size_tokens
                ),
            ));
        }
        if self.max_prefix_blocks_to_match < 1 {
            return Err(PluginError::invalid_parameter(
                "maxPrefixBlocksToMatch",
                format!(
                    "maxPrefixBlocksToMatch is {}; it must be at least 1",
                    self.max_prefix_blocks_to_match
                ),
            ));
        }
        if self.rebuild_ms < 0 {
            return Err(PluginError::invalid_parameter(
                "rebuildMs",
                format!("rebuildMs is {}; it must be 0 or more", self.rebuild_ms),
            ));
        }
        Ok(())
    }

    pub fn block_size(&self) -> u32 {
        self.block_size_tokens as u32
    }

    pub fn max_blocks(&self) -> usize {
        self.max_prefix_blocks_to_match as usize
    }
}
