//! Parameters of the approximate prefix-cache producer: decoding over the defaults, validation,
//! and the values derived from them for a request (block size, block limit, endpoint capacity).

use std::fmt;

use serde::Deserialize;
use switchyard_plugin_api::sdk::parse_parameters;
use switchyard_plugin_api::PluginError;

/// Smallest effective block size in tokens; smaller configured or reported sizes are raised to it.
pub const MIN_BLOCK_SIZE_TOKENS: u32 = 64;

const DEFAULT_BLOCK_SIZE_TOKENS: i64 = 16;
const DEFAULT_LRU_CAPACITY_PER_SERVER: i64 = 31_250;

/// A rejected parameter: which field, and a message giving the bad value and the valid range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamError {
    /// The camelCase parameter name.
    pub field: &'static str,
    /// Human-readable reason, naming the field, the value and what is accepted.
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

/// Configuration of one `approx-prefix-cache-producer` instance.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ApproxPrefixCacheConfig {
    /// Use the endpoint's reported cache block size and block count when it reports them.
    pub auto_tune: bool,
    /// Tokens per block when the endpoint reports no block size (or `autoTune` is off); the
    /// effective size is never below 64.
    pub block_size_tokens: i64,
    /// Deprecated: when positive and `blockSizeTokens` is left at its default, used as
    /// `blockSizeTokens` (taken as a token count as it stands).
    pub block_size: i64,
    /// Most blocks of a prompt to hash and match when `maxPrefixTokensToMatch` is 0; 0 means no
    /// limit.
    pub max_prefix_blocks_to_match: i64,
    /// Most tokens of a prompt to hash and match, rounded down to whole blocks (at least one);
    /// 0 defers to `maxPrefixBlocksToMatch`.
    pub max_prefix_tokens_to_match: i64,
    /// Blocks remembered per endpoint when its cache size is not derived from its metrics.
    pub lru_capacity_per_server: i64,
    /// Tokens per piece of a block when a block's key chains its pieces' content hashes, which
    /// are then published for a producer keyed on pieces of that size; 0 hashes whole blocks.
    pub hash_block_size_tokens: i64,
}

impl Default for ApproxPrefixCacheConfig {
    fn default() -> Self {
        Self {
            auto_tune: true,
            block_size_tokens: DEFAULT_BLOCK_SIZE_TOKENS,
            block_size: 0,
            max_prefix_blocks_to_match: 2048,
            max_prefix_tokens_to_match: 131_072,
            lru_capacity_per_server: DEFAULT_LRU_CAPACITY_PER_SERVER,
            hash_block_size_tokens: 0,
        }
    }
}

impl ApproxPrefixCacheConfig {
    /// Decodes JSON parameters over the defaults (`null` or empty means all defaults) and
    /// validates them. Unknown fields and type errors name the field at fault.
    pub fn parse(parameters: &str) -> Result<Self, PluginError> {
        let config: Self = parse_parameters(parameters)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every field, in declaration order; the first violation is returned.
    pub fn validate(&self) -> Result<(), ParamError> {
        let block_max = i64::from(u32::MAX);
        in_range(
            "blockSizeTokens",
            self.block_size_tokens,
            1,
            Some(block_max),
        )?;
        in_range("blockSize", self.block_size, 0, Some(block_max))?;
        in_range(
            "maxPrefixBlocksToMatch",
            self.max_prefix_blocks_to_match,
            0,
            None,
        )?;
        in_range(
            "maxPrefixTokensToMatch",
            self.max_prefix_tokens_to_match,
            0,
            None,
        )?;
        in_range(
            "lruCapacityPerServer",
            self.lru_capacity_per_server,
            1,
            None,
        )?;
        in_range(
            "hashBlockSizeTokens",
            self.hash_block_size_tokens,
            0,
            Some(i64::from(MIN_BLOCK_SIZE_TOKENS)),
        )?;
        Ok(())
    }

    /// Tokens per block for an endpoint reporting `server_cache_block_size`: the reported size
    /// when `autoTune` is on and it is positive, else the configured size; never below
    /// [`MIN_BLOCK_SIZE_TOKENS`].
    pub fn effective_block_size(&self, server_cache_block_size: Option<u32>) -> u32 {
        let size = match server_cache_block_size {
            Some(reported) if self.auto_tune && reported > 0 => reported,
            _ => self.configured_block_size(),
        };
        size.max(MIN_BLOCK_SIZE_TOKENS)
    }

    /// Most blocks per prompt for `block_size`-token blocks: `maxPrefixTokensToMatch` in whole
    /// blocks (at least 1) when it is positive, else `maxPrefixBlocksToMatch` when positive,
    /// else `usize::MAX` (no limit).
    pub fn max_blocks(&self, block_size: u32) -> usize {
        if self.max_prefix_tokens_to_match > 0 {
            let blocks = self.max_prefix_tokens_to_match / i64::from(block_size.max(1));
            return to_usize(blocks).max(1);
        }
        if self.max_prefix_blocks_to_match > 0 {
            return to_usize(self.max_prefix_blocks_to_match);
        }
        usize::MAX
    }

    /// How many `block_size`-token blocks to remember for an endpoint. With `autoTune` on and
    /// both a reported block count and block size, its whole KV cache converted to our blocks
    /// (`numBlocks × serverBlockSize / block_size`, at least 1); otherwise
    /// `lruCapacityPerServer`.
    pub fn lru_capacity(
        &self,
        server_cache_num_blocks: Option<u64>,
        server_cache_block_size: Option<u32>,
        block_size: u32,
    ) -> usize {
        if self.auto_tune {
            if let (Some(blocks), Some(size)) = (
                server_cache_num_blocks.filter(|&blocks| blocks > 0),
                server_cache_block_size.filter(|&size| size > 0),
            ) {
                let tokens = u128::from(blocks) * u128::from(size);
                let ours = tokens / u128::from(block_size.max(1));
                return usize::try_from(ours).unwrap_or(usize::MAX).max(1);
            }
        }
        to_usize(self.lru_capacity_per_server).max(1)
    }

    /// How a `block_size`-token block is hashed: `Some(pieces)` when its key chains the content
    /// hashes of `pieces` pieces of `hashBlockSizeTokens` tokens (set, and dividing the block),
    /// `None` when the block is hashed whole.
    pub fn pieces_per_block(&self, block_size: u32) -> Option<usize> {
        let piece = u32::try_from(self.hash_block_size_tokens).ok()?;
        (piece > 0 && block_size.is_multiple_of(piece)).then(|| (block_size / piece) as usize)
    }

    /// `hashBlockSizeTokens` as a token count (0 when blocks are hashed whole).
    pub fn piece_tokens(&self) -> u32 {
        u32::try_from(self.hash_block_size_tokens).unwrap_or(0)
    }

    /// `blockSizeTokens`, or the deprecated `blockSize` when that is set and the former is not.
    pub fn configured_block_size(&self) -> u32 {
        let tokens = if self.block_size > 0 && self.block_size_tokens == DEFAULT_BLOCK_SIZE_TOKENS {
            self.block_size
        } else {
            self.block_size_tokens
        };
        u32::try_from(tokens).unwrap_or(MIN_BLOCK_SIZE_TOKENS)
    }
}

/// Non-negative values as `usize`, saturating; negatives (rejected by validation) become 0.
fn to_usize(value: i64) -> usize {
    usize::try_from(value.max(0)).unwrap_or(usize::MAX)
}

fn in_range(field: &'static str, value: i64, min: i64, max: Option<i64>) -> Result<(), ParamError> {
    let ok = value >= min && max.is_none_or(|max| value <= max);
    if ok {
        return Ok(());
    }
    let range = match max {
        Some(max) => format!("in {min}..={max}"),
        None => format!(">= {min}"),
    };
    Err(ParamError {
        field,
        message: format!("{field} must be {range} (got {value})"),
    })
}

#[cfg(test)]
mod tests;
