//! KV-cache events as the host hands them to plugins (since 1.3).
//!
//! The host subscribes to each endpoint's event publisher, decodes whatever shape the engine
//! sends, checks sequence numbers and delivers one [`KvEventBatch`] per endpoint and received
//! message through the `kv_events` capability, as JSON. These types are that JSON; they are
//! not boundary types, so they may gain optional fields within 1.x (unknown fields are
//! ignored when read).

use serde::{Deserialize, Serialize};

/// The events one endpoint published, in order, or a signal from the host about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvEventBatch {
    /// The endpoint's `host_index` (the same number requests carry in `EndpointView`).
    pub host_index: u32,
    /// The endpoint's id, for messages.
    #[serde(default)]
    pub endpoint: String,
    /// The host's clock when the batch was delivered, in milliseconds.
    #[serde(default)]
    pub now_ms: u64,
    pub events: Vec<KvEvent>,
}

/// One event. Engine events keep vLLM's names; `Reset` comes from the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum KvEvent {
    /// Full blocks the engine stored, as one chain: the first block's parent is
    /// `parent_block_hash` (none at the start of a sequence), each next block's parent is
    /// the block before it.
    BlockStored(StoredBlocks),
    /// Blocks the engine evicted, by engine hash.
    BlockRemoved(RemovedBlocks),
    /// The engine emptied its cache (weights reloaded, cache reset).
    AllBlocksCleared,
    /// From the host: forget everything held for this endpoint.
    Reset(Reset),
}

/// The payload of [`KvEvent::BlockStored`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StoredBlocks {
    /// The engine's hash of each block (64-bit; a longer digest is folded to its last 8
    /// bytes read big-endian).
    pub block_hashes: Vec<u64>,
    pub parent_block_hash: Option<u64>,
    /// The tokens of every listed block, concatenated; empty when the engine sent none (a
    /// CPU-offload store may carry none).
    #[serde(default)]
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    #[serde(default)]
    pub medium: Medium,
    #[serde(default)]
    pub lora_id: Option<i64>,
    #[serde(default)]
    pub lora_name: Option<String>,
    /// Per block, the engine's extra hash keys (LoRA name, `cache_salt`, multimodal ids),
    /// each rendered as text (strings as they are, other values as compact JSON); `None`
    /// for a block without any. Empty when the engine sent none at all.
    #[serde(default)]
    pub extra_keys: Vec<Option<Vec<String>>>,
}

/// The payload of [`KvEvent::BlockRemoved`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RemovedBlocks {
    pub block_hashes: Vec<u64>,
    #[serde(default)]
    pub medium: Medium,
}

/// Where a block lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Medium {
    #[default]
    #[serde(rename = "GPU")]
    Gpu,
    #[serde(rename = "CPU")]
    Cpu,
    /// Any other tier an engine names (disk, remote); counted apart from GPU and CPU.
    #[serde(other, rename = "other")]
    Other,
}

/// The payload of [`KvEvent::Reset`]: whatever the plugin held for the endpoint is void.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reset {
    pub reason: ResetReason,
    /// `true` when the host knows the endpoint now holds nothing (an operator reset it,
    /// or its publisher restarted and every event since has arrived): the emptied index is
    /// exact. `false` when events were lost: the index is incomplete and rebuilds from the
    /// events that follow.
    pub known: bool,
}

/// Why the host reset an endpoint's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResetReason {
    /// Sequence numbers skipped and no replay filled the hole.
    Gap,
    /// The publisher restarted (its sequence started over).
    Restart,
    /// The first message seen from the publisher was not its first.
    FirstContact,
    /// An operator asked for it (the admin API), e.g. after new weights were loaded.
    Admin,
}
