//! kv-event-prefix-cache-producer: reports per endpoint how many leading blocks of a request's
//! prompt the endpoint's engine holds, from the KV-cache events the engines publish (the host
//! subscribes and hands them over; this library does no I/O).
//!
//! This module is the plugin itself: its factory, the producer that matches requests against
//! the [`index::KvIndex`], and the event handler that keeps the index.

mod carry;
pub mod config;
pub mod index;

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

use serde_json::json;
use switchyard_plugin_api::keys::{
    BLOCK_CONTENT_HASHES, PREFIX_CACHE_MATCH_INFO, TOKENIZED_PROMPT, TOKEN_PRODUCER,
};
use switchyard_plugin_api::kv::{KvEvent, KvEventBatch};
use switchyard_plugin_api::sdk::{Declare, Instance, Param, PluginFactory, ProduceBatch, Producer};
use switchyard_plugin_api::{
    AttrValue, EndpointView, Outcome, PluginError, PluginKind, PrefixCacheMatchInfo, ProduceItem,
    RequestView, Stability,
};
use switchyard_prefix_hashing::published::ContentHashes;
use switchyard_prefix_hashing::{block_count, hash_prompt_into};

use config::KvEventPrefixCacheConfig;
use index::{KvIndex, MatchScratch, Status};

/// Positions of the declared produced keys.
const PRODUCES_MATCH_INFO: usize = 0;
const PRODUCES_SOURCE: usize = 1;
/// Positions of the consumed keys.
const CONSUMES_TOKENS: usize = 0;
const CONSUMES_FALLBACK: usize = 1;
/// The fallback's published content hashes, chained here instead of hashing the prompt again.
const CONSUMES_CONTENT_HASHES: usize = 2;

/// The data type under which the producer says, for an explained request, where a value it
/// wrote came from when it was not the exact index (UTF-8 text in a custom value).
pub const PREFIX_CACHE_SOURCE: &str = "PrefixCacheSource";

/// Why a text prompt is not matched against the index.
const TEXT_PROMPT: &str =
    "a text prompt: its token ids are the host's estimate, which no engine stored";

/// Why a value is not the exact index's.
enum Why<'a> {
    /// With the host's note on why, if it gave one.
    TextPrompt(&'a str),
    Incomplete(&'a str),
}

pub static FACTORY: PluginFactory = PluginFactory {
    type_name: "kv-event-prefix-cache-producer",
    kind: PluginKind::Producer,
    stability: Stability::Beta,
    description: "Reports how many leading prompt blocks each endpoint holds, from the KV-cache \
                  events its engine publishes.",
    parameters: &[
        Param {
            name: "blockSizeTokens",
            value_type: "integer",
            default: "16",
            range: "1..=4096",
            description: "The engines' block size until an endpoint's first event tells its own.",
        },
        Param {
            name: "maxPrefixBlocksToMatch",
            value_type: "integer",
            default: "2048",
            range: ">= 1",
            description: "Most blocks of a prompt to hash and match.",
        },
        Param {
            name: "includeCpuTier",
            value_type: "bool",
            default: "false",
            range: "true | false",
            description: "Count blocks an endpoint holds only in its CPU tier as matched.",
        },
        Param {
            name: "fallbackProducerName",
            value_type: "string",
            default: "\"approx-prefix-cache-producer\"",
            range: "a producer instance name, or empty for none",
            description: "Whose PrefixCacheMatchInfo stands in for an endpoint whose index is \
                          incomplete.",
        },
        Param {
            name: "rebuildMs",
            value_type: "integer",
            default: "60000",
            range: ">= 0",
            description: "After events were lost, how long the index rebuilds from live events \
                          before it is trusted again; 0 trusts it at once.",
        },
        Param {
            name: "inFlightBlocks",
            value_type: "bool",
            default: "true",
            range: "true | false",
            description: "Count a request's blocks as held by the endpoint it was dispatched to \
                          until it completes: what its engine is about to store.",
        },
    ],
    create,
};

fn create(instance_name: &str, parameters: &str) -> Result<Instance, PluginError> {
    let config = KvEventPrefixCacheConfig::parse(parameters)?;
    Ok(Instance::producer(KvEventProducer::new(
        instance_name,
        config,
    )))
}

/// Buffers of one produce call, kept between calls so a warm call allocates nothing.
#[derive(Default)]
struct Scratch {
    hashes: Vec<u64>,
    /// Where each prompt's hashes end in `hashes`.
    ends: Vec<usize>,
    /// Matched blocks per host index.
    matched: Vec<u64>,
    /// Candidate bits per host index, for the block size being matched.
    candidates: Vec<u64>,
    sizes: Vec<u32>,
    /// The request's blocks at each size in `sizes`.
    totals: Vec<u64>,
    matching: MatchScratch,
}

/// The last request produced for, kept for its dispatch: a request is usually dispatched
/// right after its decision, and its blocks need not be hashed again.
#[derive(Default)]
struct LastProduced {
    request_id: String,
    /// False when nothing is kept (several block sizes, or taken already).
    valid: bool,
    /// The request's token ids were the host's estimate, which no engine stores: nothing is
    /// counted for it.
    estimated: bool,
    block_size: u32,
    hashes: Vec<u64>,
    /// Matched blocks per host index, and the request's blocks.
    matched: Vec<u64>,
    total: u64,
}

/// One configured instance.
pub struct KvEventProducer {
    name: String,
    config: KvEventPrefixCacheConfig,
    index: RwLock<KvIndex>,
    scratch: Mutex<Vec<Scratch>>,
    last: Mutex<LastProduced>,
    /// Per request in flight, what was counted for it.
    in_flight: Mutex<HashMap<String, InFlight>>,
}

/// The request keys counted on an endpoint for one request in flight: those its engine did
/// not hold yet, and among them the prompts' last blocks short of a full one.
struct InFlight {
    host: usize,
    keys: Vec<u64>,
    partial: Vec<u64>,
}

impl KvEventProducer {
    pub fn new(name: &str, config: KvEventPrefixCacheConfig) -> Self {
        KvEventProducer {
            name: name.to_owned(),
            index: RwLock::new(KvIndex::new(config.block_size())),
            config,
            scratch: Mutex::new(Vec::new()),
            last: Mutex::new(LastProduced::default()),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, KvIndex> {
        self.index.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, KvIndex> {
        self.index.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Why `host_index`'s index cannot stand for its cache at `now_ms`, if it cannot.
    fn incomplete<'a>(
        &self,
        index: &'a KvIndex,
        host_index: usize,
        now_ms: u64,
    ) -> Option<&'a str> {
        match &index.endpoint(host_index)?.status {
            Status::Exact => None,
            Status::Rebuilding { since_ms, reason } => (now_ms.saturating_sub(*since_ms)
                < self.config.rebuild_ms as u64)
                .then_some(reason.as_str()),
        }
    }

    fn produce_item(
        &self,
        item: &ProduceItem<'_>,
        scratch: &mut Scratch,
        out: &mut ProduceBatch<'_>,
    ) {
        let endpoints = item.endpoints.as_slice();
        let request = &item.request;
        // Token ids the host estimated from text match no engine's blocks.
        // The host's note says why, when the decision is recorded.
        let estimated = item
            .attrs
            .of_request(CONSUMES_TOKENS, endpoints)
            .and_then(AttrValue::custom)
            .map(|bytes| std::str::from_utf8(bytes).unwrap_or(""));
        let index = self.read();
        let width = endpoints
            .iter()
            .map(|e| e.host_index as usize + 1)
            .max()
            .unwrap_or(0);
        scratch.matched.clear();
        scratch.matched.resize(width, 0);
        scratch.sizes.clear();
        for endpoint in endpoints {
            let size = index.block_size(endpoint.host_index as usize);
            if !scratch.sizes.contains(&size) {
                scratch.sizes.push(size);
            }
        }
        let seed = index.request_seed(&request.model, &request.cache_salt);
        // Usually every engine uses one block size: no endpoint's size needs looking up again.
        let one_size = (scratch.sizes.len() == 1).then(|| scratch.sizes[0]);
        let published = item
            .attrs
            .of_request(CONSUMES_CONTENT_HASHES, endpoints)
            .and_then(AttrValue::custom)
            .and_then(ContentHashes::parse);
        scratch.totals.clear();
        for &size in &scratch.sizes {
            scratch.hashes.clear();
            scratch.ends.clear();
            let ends = &mut scratch.ends;
            let needed = |prompt: usize| {
                let tokens = request.prompts[prompt].tokens.len();
                block_count(tokens, size as usize, self.config.max_blocks())
            };
            let prompts = (size, request.prompts.len());
            let chained = published.is_some_and(|hashes| {
                hashes.chain_into(seed, prompts, needed, &mut scratch.hashes, |end| {
                    ends.push(end)
                })
            });
            if !chained {
                self.hash_prompts(seed, request, size, &mut scratch.hashes, |end| {
                    ends.push(end)
                });
            }
            scratch.totals.push(scratch.hashes.len() as u64);
            scratch.candidates.clear();
            scratch.candidates.resize(width.div_ceil(64), 0);
            for endpoint in endpoints {
                let host = endpoint.host_index as usize;
                if one_size.is_some() || index.block_size(host) == size {
                    scratch.candidates[host / 64] |= 1 << (host % 64);
                }
            }
            let mut start = 0;
            for &end in &scratch.ends {
                index.match_into(
                    &scratch.hashes[start..end],
                    self.config.include_cpu_tier,
                    &scratch.candidates,
                    &mut scratch.matching,
                    &mut scratch.matched,
                );
                start = end;
            }
        }
        for (position, endpoint) in endpoints.iter().enumerate() {
            let host = endpoint.host_index as usize;
            let (size, round) = match one_size {
                Some(size) => (size, 0),
                None => {
                    let size = index.block_size(host);
                    (
                        size,
                        scratch.sizes.iter().position(|&s| s == size).unwrap_or(0),
                    )
                }
            };
            let precise = PrefixCacheMatchInfo {
                match_blocks: scratch.matched[host],
                total_blocks: scratch.totals.get(round).copied().unwrap_or(0),
                block_size_tokens: u64::from(size),
            };
            let why = if let Some(note) = estimated {
                Some(Why::TextPrompt(note))
            } else {
                self.incomplete(&index, host, request.now_ms)
                    .map(Why::Incomplete)
            };
            let value = match why {
                None => precise,
                Some(why) => {
                    let fallback = item
                        .attrs
                        .get(CONSUMES_FALLBACK, endpoint)
                        .and_then(AttrValue::prefix_cache_match);
                    if request.explain {
                        let reason = match why {
                            Why::TextPrompt("") => TEXT_PROMPT.to_string(),
                            Why::TextPrompt(note) => format!("{TEXT_PROMPT} ({note})"),
                            Why::Incomplete(reason) => format!("index incomplete ({reason})"),
                        };
                        let text = match fallback {
                            Some(_) => format!(
                                "estimate from {}: {reason}",
                                self.config.fallback_producer_name
                            ),
                            None => format!("{reason}; no estimate to fall back on"),
                        };
                        out.put(
                            item,
                            PRODUCES_SOURCE,
                            position,
                            AttrValue::Custom(text.into_bytes().into()),
                        );
                    }
                    fallback.unwrap_or(precise)
                }
            };
            out.put(
                item,
                PRODUCES_MATCH_INFO,
                position,
                AttrValue::PrefixCacheMatch(value),
            );
        }
        if self.config.in_flight_blocks {
            // Kept for the dispatch by swapping buffers: the scratch gets the older ones.
            let mut last = lock(&self.last);
            last.estimated = estimated.is_some();
            last.valid = last.estimated || scratch.sizes.len() == 1;
            if last.valid {
                last.request_id.clear();
                last.request_id.push_str(&request.id);
                last.block_size = scratch.sizes.first().copied().unwrap_or(0);
                std::mem::swap(&mut last.hashes, &mut scratch.hashes);
                std::mem::swap(&mut last.matched, &mut scratch.matched);
                last.total = scratch.totals.first().copied().unwrap_or(0);
            }
        }
    }

    /// Appends the request keys of `request`'s prompts in blocks of `size` to `out`, telling
    /// `prompt_end` where each prompt's keys end.
    fn hash_prompts(
        &self,
        seed: u64,
        request: &RequestView<'_>,
        size: u32,
        out: &mut Vec<u64>,
        mut prompt_end: impl FnMut(usize),
    ) {
        for prompt in request.prompts.iter() {
            hash_prompt_into(
                seed,
                &prompt.tokens,
                size as usize,
                self.config.max_blocks(),
                out,
            );
            prompt_end(out.len());
        }
    }

    /// The request keys of `request` that `endpoint`'s engine does not hold in its GPU tier
    /// (all of them while blocks are pending there), from the hashes of the last produce call
    /// when it was this request's, and among them the prompts' last blocks when short of a
    /// full one (no engine stores those).
    fn keys_new_to(
        &self,
        request: &RequestView<'_>,
        endpoint: &EndpointView<'_>,
    ) -> (Vec<u64>, Vec<u64>) {
        let host = endpoint.host_index as usize;
        let index = self.read();
        let size = index.block_size(host);
        let mut last = lock(&self.last);
        let kept = last.valid
            && last.request_id == request.id.as_str()
            && (last.estimated || last.block_size == size);
        if kept {
            last.valid = false;
            if last.estimated {
                return (Vec::new(), Vec::new());
            }
            // Matched whole with nothing in flight there: the engine holds it all.
            if last.matched.get(host) == Some(&last.total) && index.in_flight_keys(host) == 0 {
                return (Vec::new(), Vec::new());
            }
        } else {
            // Another request's kept hashes are overwritten: it hashes afresh in turn.
            last.valid = false;
            let seed = index.request_seed(&request.model, &request.cache_salt);
            last.hashes.clear();
            self.hash_prompts(seed, request, size, &mut last.hashes, |_| {});
        }
        // Behind a queue, the blocks the engine holds now may be evicted before this request
        // is prefilled and stored again when it is: they count as in flight too.
        let queued = index.pending_blocks(host) > 0;
        let new_here = |key: &u64| queued || !index.engine_holds(host, *key);
        let mut partial = Vec::new();
        let mut end = 0;
        for prompt in request.prompts.iter() {
            let tokens = prompt.tokens.len();
            let blocks = block_count(tokens, size as usize, self.config.max_blocks());
            end += blocks;
            let short = tokens % size as usize != 0 && blocks == tokens.div_ceil(size as usize);
            if let Some(&key) = last.hashes.get(end.wrapping_sub(1)).filter(|_| short) {
                if new_here(&key) {
                    partial.push(key);
                }
            }
        }
        let mut keys: Vec<u64> = last.hashes.iter().copied().filter(new_here).collect();
        keys.sort_unstable();
        keys.dedup();
        (keys, partial)
    }

    /// Applies one endpoint's events in order.
    fn apply(&self, batch: &KvEventBatch) {
        let host = batch.host_index as usize;
        let id = batch.endpoint.as_str();
        let mut index = self.write();
        for event in &batch.events {
            match event {
                KvEvent::BlockStored(stored) => {
                    index.store(host, id, stored);
                }
                KvEvent::BlockRemoved(removed) => {
                    index.remove(host, id, &removed.block_hashes, removed.medium);
                }
                KvEvent::AllBlocksCleared => index.clear(host, id, Status::Exact),
                KvEvent::Reset(reset) => {
                    let status = if reset.known {
                        Status::Exact
                    } else {
                        Status::Rebuilding {
                            since_ms: batch.now_ms,
                            reason: serde_json::to_value(reset.reason)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_owned))
                                .unwrap_or_default(),
                        }
                    };
                    index.clear(host, id, status);
                }
            }
        }
    }
}

impl Producer for KvEventProducer {
    fn declare(&self) -> Declare {
        let mut declared = Declare::default()
            .produces(PREFIX_CACHE_MATCH_INFO, &self.name)
            .produces(PREFIX_CACHE_SOURCE, &self.name)
            .requires(TOKENIZED_PROMPT, TOKEN_PRODUCER);
        if !self.config.fallback_producer_name.is_empty() {
            declared = declared
                .optionally(PREFIX_CACHE_MATCH_INFO, &self.config.fallback_producer_name)
                .optionally(BLOCK_CONTENT_HASHES, &self.config.fallback_producer_name);
        }
        declared.kv_events = true;
        declared
    }

    fn produce(
        &self,
        items: &[ProduceItem<'_>],
        out: &mut ProduceBatch<'_>,
    ) -> Result<(), PluginError> {
        let mut scratch = lock(&self.scratch).pop().unwrap_or_default();
        for item in items {
            self.produce_item(item, &mut scratch, out);
        }
        lock(&self.scratch).push(scratch);
        Ok(())
    }

    /// With `inFlightBlocks`, counts the request's blocks the endpoint does not hold yet as
    /// held there until the request completes: the engine stores them when it prefills it,
    /// and a request routed meanwhile should find them.
    fn dispatched(&self, request: &RequestView<'_>, endpoint: &EndpointView<'_>) {
        if !self.config.in_flight_blocks {
            return;
        }
        let (keys, partial) = self.keys_new_to(request, endpoint);
        if keys.is_empty() {
            return;
        }
        let host = endpoint.host_index as usize;
        let mut index = self.write();
        index.add_in_flight(host, &endpoint.id, &keys, &partial);
        // Ids are unique among requests in flight; were one reused, the older count goes now
        // rather than never.
        let counted = InFlight {
            host,
            keys,
            partial,
        };
        let replaced = lock(&self.in_flight).insert(request.id.to_string(), counted);
        if let Some(old) = replaced {
            index.release_in_flight(old.host, &old.keys, &old.partial);
        }
    }

    fn completed(&self, request: &RequestView<'_>, _endpoint: &EndpointView<'_>, _: Outcome) {
        let counted = lock(&self.in_flight).remove(request.id.as_str());
        if let Some(old) = counted {
            self.write()
                .release_in_flight(old.host, &old.keys, &old.partial);
        }
    }

    fn kv_events(&self, batch: &KvEventBatch) -> Result<(), PluginError> {
        self.apply(batch);
        Ok(())
    }

    /// The whole index, for a successor to take over on a reload (see [`carry`]).
    fn export_state(&self) -> Option<serde_json::Value> {
        Some(carry::export(&self.read()))
    }

    /// Takes over an index [`Producer::export_state`] wrote, when its entries were keyed as
    /// this instance keys them; a refused one leaves this instance's index as it was.
    fn import_state(&self, state: serde_json::Value) -> Result<(), PluginError> {
        let restored = carry::import(state, self.config.block_size())?;
        *self.write() = restored;
        Ok(())
    }

    fn state(&self) -> Option<serde_json::Value> {
        let index = self.read();
        let endpoints: Vec<_> = index
            .endpoints()
            .filter(|(_, e)| !e.id.is_empty() || e.engine_keys() > 0)
            .map(|(host_index, e)| {
                let status = e.status.to_json();
                json!({
                    "hostIndex": host_index,
                    "id": e.id,
                    "status": status,
                    "blockSizeTokens": e.block_size,
                    "blocks": {"gpu": e.blocks[0], "cpu": e.blocks[1], "other": e.blocks[2]},
                    "engineKeys": e.engine_keys(),
                    "unknownParents": e.unknown_parents,
                    "storesWithoutTokens": e.without_tokens,
                    "unknownRemovals": e.unknown_removals,
                    "inFlightKeys": index.in_flight_keys(host_index),
                    "pendingBlocks": index.pending_blocks(host_index),
                    "malformed": e.malformed,
                })
            })
            .collect();
        Some(json!({
            "endpoints": endpoints,
            "distinctBlocks": index.distinct_blocks(),
        }))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

switchyard_plugin_api::export_plugins!(FACTORY);

#[cfg(test)]
mod tests;
