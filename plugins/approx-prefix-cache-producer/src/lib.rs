//! approx-prefix-cache-producer: estimates which endpoints already hold a request's prompt
//! prefix in their KV cache by remembering the prefix blocks of the requests dispatched to each
//! endpoint, and reports per endpoint how many leading blocks of the new request it holds.
//!
//! This module is the plugin itself: its factory, and the producer that hashes each request,
//! matches it against the shared [`index::PrefixIndex`] and records it on dispatch.

pub mod config;
pub mod index;

use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::Deserialize;
use serde_json::json;
use switchyard_plugin_api::keys::{
    BLOCK_CONTENT_HASHES, PREFIX_CACHE_MATCH_INFO, TOKENIZED_PROMPT, TOKEN_PRODUCER,
};
use switchyard_plugin_api::kv::{KvEvent, KvEventBatch};
use switchyard_plugin_api::sdk::{Declare, Instance, Param, PluginFactory, ProduceBatch, Producer};
use switchyard_plugin_api::{
    AttrValue, EndpointView, PluginError, PluginKind, PrefixCacheMatchInfo, ProduceItem,
    RequestView, Stability,
};
use switchyard_prefix_hashing::published::encode_content_hashes;
use switchyard_prefix_hashing::{
    chain_pieces_into, content_hashes_into, hash_prompt_into, prompt_seed,
};

use config::ApproxPrefixCacheConfig;
use index::{PrefixIndex, PromptHashes};

/// Positions of the declared produced keys.
const PRODUCES_MATCH_INFO: usize = 0;
/// Declared only with `hashBlockSizeTokens` set.
const PRODUCES_CONTENT_HASHES: usize = 1;

pub static FACTORY: PluginFactory = PluginFactory {
    type_name: "approx-prefix-cache-producer",
    kind: PluginKind::Producer,
    stability: Stability::Beta,
    description: "Estimates how many leading prompt blocks each endpoint holds in its KV cache \
                  from the requests dispatched to it.",
    parameters: &[
        Param {
            name: "autoTune",
            value_type: "bool",
            default: "true",
            range: "true | false",
            description: "Use the endpoint's reported cache block size and block count.",
        },
        Param {
            name: "blockSizeTokens",
            value_type: "integer",
            default: "16",
            range: "1..=4294967295",
            description: "Block size in tokens when the endpoint reports none (or autoTune is \
                          off); the effective size is never below 64.",
        },
        Param {
            name: "blockSize",
            value_type: "integer",
            default: "0",
            range: "0..=4294967295",
            description: "Deprecated: when positive and blockSizeTokens is still 16, used as \
                          blockSizeTokens.",
        },
        Param {
            name: "maxPrefixBlocksToMatch",
            value_type: "integer",
            default: "2048",
            range: ">= 0",
            description: "Block cap per prompt when maxPrefixTokensToMatch is 0; 0 means no \
                          cap.",
        },
        Param {
            name: "maxPrefixTokensToMatch",
            value_type: "integer",
            default: "131072",
            range: ">= 0",
            description: "Token cap per prompt, in whole blocks and at least one block; 0 \
                          defers to maxPrefixBlocksToMatch.",
        },
        Param {
            name: "lruCapacityPerServer",
            value_type: "integer",
            default: "31250",
            range: ">= 1",
            description: "Blocks remembered per endpoint when the capacity is not derived from \
                          its metrics.",
        },
        Param {
            name: "hashBlockSizeTokens",
            value_type: "integer",
            default: "0",
            range: "0..=64",
            description: "Hash each block as pieces of this many tokens (when it divides the \
                          block size) and publish the pieces' hashes as BlockContentHashes, so \
                          a producer keyed on such pieces does not hash the prompt again; 0 \
                          hashes whole blocks.",
        },
    ],
    create,
};

fn create(instance_name: &str, parameters: &str) -> Result<Instance, PluginError> {
    let config = ApproxPrefixCacheConfig::parse(parameters)?;
    Ok(Instance::producer(ApproxProducer {
        name: instance_name.to_owned(),
        config,
        index: Mutex::new(PrefixIndex::new()),
        scratch: Mutex::new(Vec::new()),
        last: Mutex::new(LastHashed::default()),
    }))
}

/// Buffers of one call, kept between calls so a warm call allocates nothing.
#[derive(Default)]
struct Scratch {
    hashes: PromptHashes,
    /// The pieces' content hashes when blocks are hashed in pieces.
    contents: Contents,
    /// Matched blocks per endpoint, indexed by host index.
    matched: Vec<u64>,
}

/// One configured instance.
struct ApproxProducer {
    name: String,
    config: ApproxPrefixCacheConfig,
    index: Mutex<PrefixIndex>,
    /// Idle scratch buffers; concurrent calls each take their own, so hashing happens outside
    /// the index lock.
    scratch: Mutex<Vec<Scratch>>,
    /// The most recent hashing, so that `dispatched` right after `produce` of the same request
    /// copies the hashes rather than computing them again.
    last: Mutex<LastHashed>,
}

/// The request and parameters of the most recent `produce` hashing, and its hashes, so that
/// `dispatched` of the same request can use them instead of hashing the prompt again.
///
/// The request is recognised by identity, not by content: its id, the host's per-request
/// random seed, model, cache salt, and the address and length of each prompt's token buffer.
/// The host keeps a request's token buffers alive and unchanged from `produce` until it
/// completes, so while the request is live no other request can have the same buffers. An
/// entry could outlive its request only when that request was never dispatched; to keep such
/// an entry from being mistaken for a later request that reuses the freed buffers, every
/// hashing in `produce` replaces the entry (invalidating it before it starts), and `dispatched`
/// consumes it.
#[derive(Default)]
struct LastHashed {
    valid: bool,
    id: String,
    random_seed: u64,
    model: String,
    cache_salt: String,
    block_size: u32,
    max_blocks: usize,
    /// Address and length of each prompt's token buffer.
    prompts: Vec<(usize, usize)>,
    hashes: PromptHashes,
}

impl LastHashed {
    /// Whether `request` is the request these hashes were computed for, with these parameters.
    fn matches(&self, request: &RequestView<'_>, block_size: u32, max_blocks: usize) -> bool {
        self.valid
            && self.block_size == block_size
            && self.max_blocks == max_blocks
            && self.random_seed == request.random_seed
            && self.prompts.len() == request.prompts.len()
            && self.id == request.id.as_str()
            && self.model == request.model.as_str()
            && self.cache_salt == request.cache_salt.as_str()
            && self
                .prompts
                .iter()
                .zip(request.prompts.iter())
                .all(|(&buffer, prompt)| buffer == identity(&prompt.tokens))
    }

    fn store(
        &mut self,
        request: &RequestView<'_>,
        block_size: u32,
        max_blocks: usize,
        hashes: &PromptHashes,
    ) {
        self.valid = true;
        self.id.clear();
        self.id.push_str(&request.id);
        self.random_seed = request.random_seed;
        self.model.clear();
        self.model.push_str(&request.model);
        self.cache_salt.clear();
        self.cache_salt.push_str(&request.cache_salt);
        self.block_size = block_size;
        self.max_blocks = max_blocks;
        self.prompts.clear();
        self.prompts.extend(
            request
                .prompts
                .iter()
                .map(|prompt| identity(&prompt.tokens)),
        );
        self.hashes.copy_from(hashes);
    }
}

/// Address and length of a token buffer.
fn identity(tokens: &[u32]) -> (usize, usize) {
    (tokens.as_ptr() as usize, tokens.len())
}

impl ApproxProducer {
    /// Hashes the prompts of `request` into `out` for an endpoint reporting
    /// `server_block_size` (0 = unknown), remembers the result for `dispatched`, and returns
    /// the effective block size.
    fn hash_request(
        &self,
        request: &RequestView<'_>,
        server_block_size: u32,
        out: &mut PromptHashes,
        contents: &mut Contents,
    ) -> u32 {
        let block_size = self.config.effective_block_size(Some(server_block_size));
        let max_blocks = self.config.max_blocks(block_size);
        // Invalid while hashing, so a panic below leaves no entry for another request.
        lock(&self.last).valid = false;
        let pieces = self.config.pieces_per_block(block_size);
        hash_into(request, block_size, max_blocks, pieces, out, contents);
        lock(&self.last).store(request, block_size, max_blocks, out);
        block_size
    }

    /// The hashes of `request` for an endpoint reporting `server_block_size` into `out`: those
    /// `produce` computed for it when the parameters are the same (consuming them), else hashed
    /// afresh. Returns the effective block size.
    fn hashes_for_dispatch(
        &self,
        request: &RequestView<'_>,
        server_block_size: u32,
        out: &mut PromptHashes,
    ) -> u32 {
        let block_size = self.config.effective_block_size(Some(server_block_size));
        let max_blocks = self.config.max_blocks(block_size);
        {
            let mut last = lock(&self.last);
            if last.matches(request, block_size, max_blocks) {
                last.valid = false;
                std::mem::swap(out, &mut last.hashes);
                return block_size;
            }
        }
        let mut contents = Contents::default();
        let pieces = self.config.pieces_per_block(block_size);
        hash_into(request, block_size, max_blocks, pieces, out, &mut contents);
        block_size
    }

    fn take_scratch(&self) -> Scratch {
        lock(&self.scratch).pop().unwrap_or_default()
    }

    fn return_scratch(&self, scratch: Scratch) {
        lock(&self.scratch).push(scratch);
    }

    fn produce_item(
        &self,
        item: &ProduceItem<'_>,
        scratch: &mut Scratch,
        out: &mut ProduceBatch<'_>,
    ) {
        let endpoints = item.endpoints.as_slice();
        let server_block_size = endpoints.first().map_or(0, |e| e.metrics.cache_block_size);
        let block_size = self.hash_request(
            &item.request,
            server_block_size,
            &mut scratch.hashes,
            &mut scratch.contents,
        );
        if self.config.pieces_per_block(block_size).is_some() {
            let mut bytes = Vec::new();
            encode_content_hashes(
                self.config.piece_tokens(),
                &scratch.contents.hashes,
                &scratch.contents.ends,
                &mut bytes,
            );
            out.put(
                item,
                PRODUCES_CONTENT_HASHES,
                0,
                AttrValue::Custom(bytes.into()),
            );
        }
        let width = endpoints
            .iter()
            .map(|e| e.host_index as usize + 1)
            .max()
            .unwrap_or(0);
        if scratch.matched.len() < width {
            scratch.matched.resize(width, 0);
        }
        let matched = &mut scratch.matched[..width];
        if scratch.hashes.is_empty() {
            matched.fill(0);
        } else {
            lock(&self.index).match_into(&scratch.hashes, matched);
        }
        let total_blocks = scratch.hashes.total_blocks() as u64;
        for (position, endpoint) in endpoints.iter().enumerate() {
            out.put(
                item,
                PRODUCES_MATCH_INFO,
                position,
                AttrValue::PrefixCacheMatch(PrefixCacheMatchInfo {
                    match_blocks: matched[endpoint.host_index as usize],
                    total_blocks,
                    block_size_tokens: u64::from(block_size),
                }),
            );
        }
    }
}

impl Producer for ApproxProducer {
    fn declare(&self) -> Declare {
        let mut declared = Declare::default().produces(PREFIX_CACHE_MATCH_INFO, &self.name);
        if self.config.piece_tokens() > 0 {
            declared = declared.produces(BLOCK_CONTENT_HASHES, &self.name);
        }
        declared = declared.requires(TOKENIZED_PROMPT, TOKEN_PRODUCER);
        // For the resets: an engine that emptied its cache, or an operator's reset.
        declared.kv_events = true;
        declared
    }

    /// Forgets what an endpoint was estimated to hold once it is known to hold nothing: its
    /// engine cleared its cache, or an operator reset it. Stores and removals are left to
    /// the producers that index them.
    fn kv_events(&self, batch: &KvEventBatch) -> Result<(), PluginError> {
        let emptied = batch.events.iter().any(|event| match event {
            KvEvent::AllBlocksCleared => true,
            KvEvent::Reset(reset) => reset.known,
            _ => false,
        });
        if emptied {
            lock(&self.index).clear_slot(batch.host_index as usize);
        }
        Ok(())
    }

    fn produce(
        &self,
        items: &[ProduceItem<'_>],
        out: &mut ProduceBatch<'_>,
    ) -> Result<(), PluginError> {
        let mut scratch = self.take_scratch();
        for item in items {
            self.produce_item(item, &mut scratch, out);
        }
        self.return_scratch(scratch);
        Ok(())
    }

    /// Remembers the request's blocks on `endpoint`, with the hashes `produce` computed for it
    /// when it was the last request hashed (see [`LastHashed`]), else hashing it again.
    fn dispatched(&self, request: &RequestView<'_>, endpoint: &EndpointView<'_>) {
        let mut scratch = self.take_scratch();
        let metrics = endpoint.metrics;
        let block_size =
            self.hashes_for_dispatch(request, metrics.cache_block_size, &mut scratch.hashes);
        if !scratch.hashes.is_empty() {
            let capacity = self.config.lru_capacity(
                Some(metrics.cache_num_blocks),
                Some(metrics.cache_block_size),
                block_size,
            );
            lock(&self.index).record(
                endpoint.host_index as usize,
                &endpoint.id,
                capacity,
                &scratch.hashes,
            );
        }
        self.return_scratch(scratch);
    }

    /// The whole index, each endpoint's blocks as one hex string (16 digits a block, least
    /// recent first), with what the hashes depend on.
    fn export_state(&self) -> Option<serde_json::Value> {
        let index = lock(&self.index);
        let endpoints: Vec<_> = index
            .export()
            .map(|(host_index, id, capacity, blocks)| {
                let mut hex = String::with_capacity(blocks.len() * 16);
                for block in blocks {
                    let _ = write!(hex, "{block:016x}");
                }
                json!({"hostIndex": host_index, "id": id, "capacity": capacity, "blocks": hex})
            })
            .collect();
        Some(json!({
            "autoTune": self.config.auto_tune,
            "blockSizeTokens": self.config.configured_block_size(),
            "hashBlockSizeTokens": self.config.piece_tokens(),
            "endpoints": endpoints,
        }))
    }

    /// Takes over an index [`Producer::export_state`] wrote, when its blocks were hashed as
    /// this instance hashes them.
    fn import_state(&self, state: serde_json::Value) -> Result<(), PluginError> {
        let snapshot: Snapshot = serde_json::from_value(state)
            .map_err(|e| PluginError::failed(format!("not an exported index: {e}")))?;
        let ours = (
            self.config.auto_tune,
            self.config.configured_block_size(),
            self.config.piece_tokens(),
        );
        let theirs = (
            snapshot.auto_tune,
            snapshot.block_size_tokens,
            snapshot.hash_block_size_tokens,
        );
        if theirs != ours {
            return Err(PluginError::failed(format!(
                "the index was hashed with autoTune = {}, blockSizeTokens = {}, \
                 hashBlockSizeTokens = {}; this instance hashes with autoTune = {}, \
                 blockSizeTokens = {}, hashBlockSizeTokens = {}",
                theirs.0, theirs.1, theirs.2, ours.0, ours.1, ours.2
            )));
        }
        let mut restored = PrefixIndex::new();
        for endpoint in &snapshot.endpoints {
            let blocks = parse_blocks(&endpoint.blocks).ok_or_else(|| {
                PluginError::failed(format!(
                    "the blocks of endpoint {} are not 16-digit hex hashes",
                    endpoint.id
                ))
            })?;
            restored.restore(
                endpoint.host_index,
                &endpoint.id,
                endpoint.capacity,
                &blocks,
            );
        }
        *lock(&self.index) = restored;
        Ok(())
    }

    fn state(&self) -> Option<serde_json::Value> {
        let index = lock(&self.index);
        let endpoints: Vec<_> = index
            .endpoints()
            .map(|(host_index, id, blocks)| {
                json!({"hostIndex": host_index, "id": id, "blocks": blocks})
            })
            .collect();
        Some(json!({
            "endpoints": endpoints,
            "distinctBlocks": index.distinct_blocks(),
        }))
    }
}

/// An index as [`Producer::export_state`] writes it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Snapshot {
    auto_tune: bool,
    block_size_tokens: u32,
    /// Absent in the snapshots of versions that always hashed whole blocks.
    #[serde(default)]
    hash_block_size_tokens: u32,
    endpoints: Vec<SnapshotEndpoint>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SnapshotEndpoint {
    host_index: usize,
    id: String,
    capacity: usize,
    blocks: String,
}

/// Block hashes written as consecutive 16-digit hex numbers.
fn parse_blocks(hex: &str) -> Option<Vec<u64>> {
    if !hex.len().is_multiple_of(16) || !hex.is_ascii() {
        return None;
    }
    (0..hex.len())
        .step_by(16)
        .map(|at| u64::from_str_radix(&hex[at..at + 16], 16).ok())
        .collect()
}

/// The content hashes of a request's pieces, every prompt's after the last one's.
#[derive(Default)]
struct Contents {
    hashes: Vec<u64>,
    /// Where each prompt's pieces end in `hashes`, empty prompts included; empty when the
    /// last hashing was of whole blocks.
    ends: Vec<usize>,
}

/// Hashes the prompts of `request` into `out` (cleared first) in `block_size`-token blocks:
/// each block whole, or with `pieces` per block, as the chain of its pieces' content hashes,
/// which are left in `contents`.
fn hash_into(
    request: &RequestView<'_>,
    block_size: u32,
    max_blocks: usize,
    pieces: Option<usize>,
    out: &mut PromptHashes,
    contents: &mut Contents,
) {
    let seed = prompt_seed(&request.model, &request.cache_salt);
    out.clear();
    contents.hashes.clear();
    contents.ends.clear();
    for prompt in request.prompts.iter() {
        match pieces {
            None => out.push_prompt_with(|hashes| {
                hash_prompt_into(
                    seed,
                    &prompt.tokens,
                    block_size as usize,
                    max_blocks,
                    hashes,
                );
            }),
            Some(pieces) => {
                let start = contents.hashes.len();
                content_hashes_into(
                    &prompt.tokens,
                    block_size as usize / pieces,
                    max_blocks.saturating_mul(pieces),
                    &mut contents.hashes,
                );
                contents.ends.push(contents.hashes.len());
                out.push_prompt_with(|hashes| {
                    chain_pieces_into(seed, &contents.hashes[start..], pieces, hashes);
                });
            }
        }
    }
}

/// Locks `mutex` even after a panic in another call (the SDK contained and reported it), so
/// the producer keeps serving estimates instead of failing every later call.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

switchyard_plugin_api::export_plugins!(FACTORY);

#[cfg(test)]
mod tests;
