//! The simulated engines' KV-cache events: what each replica's prefix cache stored and
//! evicted, told in the form a vLLM engine publishes it and the live host hands it to plugins
//! ([`KvEvent`]: engine block hashes, parent, token ids, block size, GPU tier), and the queue
//! that hands those events to a router a fixed delay after they happened, in time order.
//!
//! A simulated block's engine hash is the simulator's own chained hash of its content; the
//! consumers never recompute it, they key blocks by their own hash of the token ids, as they do
//! with a real engine's.

use std::collections::{HashSet, VecDeque};

use switchyard_plugin_api::kv::{KvEvent, Medium, RemovedBlocks, StoredBlocks};

use super::kv_cache::CacheChange;
use super::stepper::BlockChange;

/// The KV-event delay of a fleet unless set: vLLM publishes a step's events once the step
/// ran, and they cross a network to the router.
pub const DEFAULT_KV_EVENT_DELAY_MS: f64 = 10.0;

/// One batch of events waiting for its delivery time.
#[derive(Debug)]
struct Pending {
    at: f64,
    replica: usize,
    events: Vec<KvEvent>,
}

/// Event batches on their way to the router. Batches are delivered in the order they were
/// published, each `delay_ms` after it: since publication times never go back, that is also
/// the order of their delivery times.
#[derive(Debug)]
pub struct EventQueue {
    delay_ms: f64,
    pending: VecDeque<Pending>,
}

impl EventQueue {
    pub fn new(delay_ms: f64) -> Self {
        EventQueue {
            delay_ms: delay_ms.max(0.0),
            pending: VecDeque::new(),
        }
    }

    pub fn delay_ms(&self) -> f64 {
        self.delay_ms
    }

    /// Replica `replica` published `events` at `now`; an empty batch is not sent.
    pub fn publish(&mut self, now: f64, replica: usize, events: Vec<KvEvent>) {
        if events.is_empty() {
            return;
        }
        let at = now + self.delay_ms;
        debug_assert!(
            self.pending.back().is_none_or(|last| last.at <= at),
            "events published out of time order"
        );
        self.pending.push_back(Pending {
            at,
            replica,
            events,
        });
    }

    /// When the next batch is due, if one is on its way.
    pub fn next_due(&self) -> Option<f64> {
        self.pending.front().map(|p| p.at)
    }

    /// The next batch due at or before `now`, with the replica that published it.
    pub fn pop_due(&mut self, now: f64) -> Option<(usize, Vec<KvEvent>)> {
        if self.pending.front()?.at > now {
            return None;
        }
        self.pending.pop_front().map(|p| (p.replica, p.events))
    }
}

/// What an event needs to know of one request's chain: its hashes (the prompt continued over
/// the output blocks the workload knows), the tokens those blocks hold, and its cache salt.
#[derive(Debug, Clone, Copy)]
pub struct ChainSource<'a> {
    pub hashes: &'a [u64],
    pub tokens: &'a [u32],
    pub cache_salt: &'a str,
}

/// The events telling a step engine's `changes`, in their order: each run of stores that
/// continue one another is one `BlockStored` naming the block before the run as its parent,
/// each run of evictions one `BlockRemoved`. `source` gives the chain of a request; a store
/// whose request it does not know, or whose tokens it lacks, is left out.
pub fn step_events<'a>(
    changes: &[BlockChange],
    block_size: usize,
    mut source: impl FnMut(usize) -> Option<ChainSource<'a>>,
) -> Vec<KvEvent> {
    let mut events: Vec<KvEvent> = Vec::new();
    for change in changes {
        match *change {
            BlockChange::Removed(hash) => {
                if let Some(KvEvent::BlockRemoved(run)) = events.last_mut() {
                    run.block_hashes.push(hash);
                } else {
                    events.push(KvEvent::BlockRemoved(RemovedBlocks {
                        block_hashes: vec![hash],
                        medium: Medium::Gpu,
                    }));
                }
            }
            BlockChange::Stored { request, block } => {
                let Some(chain) = source(request) else {
                    continue;
                };
                let k = block as usize;
                let (Some(&hash), Some(tokens)) = (
                    chain.hashes.get(k),
                    chain.tokens.get(k * block_size..(k + 1) * block_size),
                ) else {
                    continue;
                };
                let parent = k.checked_sub(1).map(|p| chain.hashes[p]);
                if let Some(KvEvent::BlockStored(run)) = events.last_mut() {
                    if parent.is_some() && run.block_hashes.last().copied() == parent {
                        run.block_hashes.push(hash);
                        run.token_ids.extend_from_slice(tokens);
                        if !run.extra_keys.is_empty() {
                            run.extra_keys.push(None);
                        }
                        continue;
                    }
                }
                events.push(KvEvent::BlockStored(StoredBlocks {
                    block_hashes: vec![hash],
                    parent_block_hash: parent,
                    token_ids: tokens.to_vec(),
                    block_size: block_size as u32,
                    medium: Medium::Gpu,
                    extra_keys: salt_keys(k, chain.cache_salt),
                    ..StoredBlocks::default()
                }));
            }
        }
    }
    events
}

/// The extra keys of a run of stores starting at block `first` of a chain: the cache salt on
/// the chain's first block, as vLLM sends it; none elsewhere.
fn salt_keys(first: usize, cache_salt: &str) -> Vec<Option<Vec<String>>> {
    if first == 0 && !cache_salt.is_empty() {
        vec![Some(vec![cache_salt.to_string()])]
    } else {
        Vec::new()
    }
}

/// The events telling `changes`, made by a fixed-rate replica's cache while `chain` (holding
/// `tokens`) entered it: the evictions first, then the chain's blocks that are new, in runs
/// that each name the block before them as parent. A block both stored and evicted within
/// `changes` is in neither, and one evicted and stored again is in neither: the net change is
/// told, since the cache inserts a chain deepest block first and its order would name parents
/// not yet stored. Hashes are told as `engine_hash` maps them.
pub fn cache_events(
    changes: &[CacheChange],
    chain: &[u64],
    tokens: &[u32],
    cache_salt: &str,
    block_size: usize,
    engine_hash: impl Fn(u64) -> u64,
) -> Vec<KvEvent> {
    let stored: HashSet<u64> = changes
        .iter()
        .filter_map(|c| match c {
            CacheChange::Stored(h) => Some(*h),
            CacheChange::Evicted(_) => None,
        })
        .collect();
    let mut evicted: HashSet<u64> = HashSet::new();
    let mut removed = Vec::new();
    for change in changes {
        if let CacheChange::Evicted(h) = change {
            if evicted.insert(*h) && !stored.contains(h) {
                removed.push(engine_hash(*h));
            }
        }
    }
    let mut events = Vec::new();
    if !removed.is_empty() {
        events.push(KvEvent::BlockRemoved(RemovedBlocks {
            block_hashes: removed,
            medium: Medium::Gpu,
        }));
    }
    let new = |i: usize| stored.contains(&chain[i]) && !evicted.contains(&chain[i]);
    let mut i = 0;
    while i < chain.len() {
        if !new(i) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chain.len() && new(i) {
            i += 1;
        }
        let Some(run_tokens) = tokens.get(start * block_size..i * block_size) else {
            break;
        };
        let mut extra_keys = salt_keys(start, cache_salt);
        if !extra_keys.is_empty() {
            extra_keys.resize(i - start, None);
        }
        events.push(KvEvent::BlockStored(StoredBlocks {
            block_hashes: chain[start..i].iter().map(|&h| engine_hash(h)).collect(),
            parent_block_hash: start.checked_sub(1).map(|p| engine_hash(chain[p])),
            token_ids: run_tokens.to_vec(),
            block_size: block_size as u32,
            medium: Medium::Gpu,
            extra_keys,
            ..StoredBlocks::default()
        }));
    }
    events
}

#[cfg(test)]
mod tests;
