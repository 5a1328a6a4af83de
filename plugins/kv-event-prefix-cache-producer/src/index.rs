//! The dual-key index: what each endpoint's engine says it holds, keyed both by the engine's
//! own block hashes and by ours.
//!
//! The engine's hash cannot be recomputed outside the engine (it depends on a per-process seed
//! and on the hash algorithm), so it is only ever used as a name: a stored block's *request
//! key* is our chained hash of its token ids, continuing from its parent's request key, and
//! requests are matched on request keys. Removals carry engine hashes only and are resolved
//! through the engine → request key map. Each tier (GPU, CPU, other) is counted apart.

use std::collections::{HashMap, HashSet};

use switchyard_plugin_api::kv::{Medium, StoredBlocks};
use switchyard_prefix_hashing::{hash_prompt_into, prompt_seed, BlockHashBuild};

/// Block keys (ours and the engines') are already uniform 64-bit hashes.
type KeyMap<V> = HashMap<u64, V, BlockHashBuild>;

/// Tiers in the order their counts are kept.
pub const TIERS: usize = 3;

/// The holder bits beyond the tiers: endpoints to which a request for the block was dispatched
/// and has not completed (what its engine is about to store, or already stored).
const IN_FLIGHT: usize = TIERS;
/// Holder bit sets per request key: one per tier, and the in-flight one.
const BIT_SETS: usize = TIERS + 1;

pub fn tier(medium: Medium) -> usize {
    match medium {
        Medium::Gpu => 0,
        Medium::Cpu => 1,
        Medium::Other => 2,
    }
}

/// Whether an endpoint's index can be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Every event since the endpoint's index was last empty has been applied.
    Exact,
    /// Events were lost at `since_ms`; the index holds only what arrived since.
    Rebuilding { since_ms: u64, reason: String },
}

impl Status {
    /// As the admin state and an exported index show it: `"exact"`, or when and why the
    /// index started over.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Status::Exact => serde_json::json!("exact"),
            Status::Rebuilding { since_ms, reason } => {
                serde_json::json!({"rebuildingSinceMs": since_ms, "reason": reason})
            }
        }
    }
}

/// One engine block on one endpoint.
#[derive(Debug, Clone, Copy)]
struct EngineBlock {
    ours: u64,
    /// Stores not yet removed, per tier (an offloading engine may announce a block again).
    stored: [u32; TIERS],
}

/// What one endpoint holds.
#[derive(Debug)]
pub struct EndpointIndex {
    pub id: String,
    pub block_size: u32,
    /// Whether `block_size` is the engine's (an event told it) rather than the default.
    sized_by_events: bool,
    pub status: Status,
    engine: KeyMap<EngineBlock>,
    /// Per request key, how many engine blocks hold it, per tier.
    ours: KeyMap<[u32; TIERS]>,
    /// Request keys held, per tier.
    pub blocks: [u64; TIERS],
    /// Per request key, how many requests dispatched here and not completed carry it.
    in_flight: KeyMap<u32>,
    /// Keys counted in flight that the engine does not hold in its GPU tier yet: blocks the
    /// requests queued here will store, and evict as many of the oldest to make room for.
    pending: u64,
    pub unknown_parents: u64,
    pub without_tokens: u64,
    pub unknown_removals: u64,
    pub malformed: u64,
}

impl EndpointIndex {
    fn new(block_size: u32) -> Self {
        EndpointIndex {
            id: String::new(),
            block_size,
            sized_by_events: false,
            status: Status::Exact,
            engine: KeyMap::default(),
            ours: KeyMap::default(),
            blocks: [0; TIERS],
            in_flight: KeyMap::default(),
            pending: 0,
            unknown_parents: 0,
            without_tokens: 0,
            unknown_removals: 0,
            malformed: 0,
        }
    }

    pub fn engine_keys(&self) -> usize {
        self.engine.len()
    }

    /// One pending block stored, or no longer awaited.
    fn settle_pending(&mut self) {
        debug_assert!(self.pending > 0, "a pending block settled twice");
        self.pending = self.pending.saturating_sub(1);
    }

    /// The block size an event told, if one did.
    pub fn told_block_size(&self) -> Option<u32> {
        self.sized_by_events.then_some(self.block_size)
    }

    /// Every engine block: its engine hash, its request key and its stores not yet removed
    /// per tier, ordered by engine hash.
    pub fn engine_blocks(&self) -> Vec<(u64, u64, [u32; TIERS])> {
        let mut blocks: Vec<_> = self
            .engine
            .iter()
            .map(|(&engine, block)| (engine, block.ours, block.stored))
            .collect();
        blocks.sort_unstable_by_key(|&(engine, _, _)| engine);
        blocks
    }

    /// Whether nothing ever happened to this endpoint: a slot below a higher host index.
    pub fn is_untouched(&self) -> bool {
        self.id.is_empty()
            && self.engine.is_empty()
            && !self.sized_by_events
            && self.status == Status::Exact
            && self.unknown_parents == 0
            && self.without_tokens == 0
            && self.unknown_removals == 0
            && self.malformed == 0
    }
}

/// The endpoints holding one request key: a bit per host index, per tier and for requests in
/// flight (`IN_FLIGHT`). The first 64 host indices of each set sit inline, so a fleet of up to
/// 64 endpoints is matched without a pointer to follow per block; the words beyond, set-major,
/// in `rest`.
#[derive(Debug, Clone, Default)]
struct Holders {
    first: [u64; BIT_SETS],
    rest: Vec<u64>,
}

impl Holders {
    /// Bits of `tier`'s word `word`, in a layout of `words` words per tier.
    fn word(&self, tier: usize, word: usize, words: usize) -> u64 {
        match word.checked_sub(1) {
            None => self.first[tier],
            Some(beyond) => self
                .rest
                .get(tier * (words - 1) + beyond)
                .copied()
                .unwrap_or(0),
        }
    }

    fn word_mut(&mut self, tier: usize, word: usize, words: usize) -> &mut u64 {
        match word.checked_sub(1) {
            None => &mut self.first[tier],
            Some(beyond) => {
                if self.rest.len() < BIT_SETS * (words - 1) {
                    self.rest.resize(BIT_SETS * (words - 1), 0);
                }
                &mut self.rest[tier * (words - 1) + beyond]
            }
        }
    }

    /// Re-lays the words beyond the first from `old` to `words` words per tier.
    fn widen(&mut self, old: usize, words: usize) {
        if self.rest.is_empty() {
            return;
        }
        let mut wider = vec![0u64; BIT_SETS * (words - 1)];
        for tier in 0..BIT_SETS {
            wider[tier * (words - 1)..tier * (words - 1) + old - 1]
                .copy_from_slice(&self.rest[tier * (old - 1)..tier * (old - 1) + old - 1]);
        }
        self.rest = wider;
    }

    fn is_empty(&self) -> bool {
        self.first.iter().chain(&self.rest).all(|&w| w == 0)
    }
}

/// Per-request buffers, reused between calls.
#[derive(Default)]
pub struct MatchScratch {
    alive: Vec<u64>,
}

/// All endpoints' blocks.
pub struct KvIndex {
    default_block_size: u32,
    endpoints: Vec<EndpointIndex>,
    holders: KeyMap<Holders>,
    /// Bitset words per tier in every `Holders`.
    words: usize,
    /// LoRA adapter names seen in events: a request naming one as its model is matched
    /// against that adapter's blocks.
    loras: HashSet<String>,
    hashes: Vec<u64>,
}

impl KvIndex {
    pub fn new(default_block_size: u32) -> Self {
        KvIndex {
            default_block_size,
            endpoints: Vec::new(),
            holders: KeyMap::default(),
            words: 1,
            loras: HashSet::new(),
            hashes: Vec::new(),
        }
    }

    pub fn endpoints(&self) -> impl Iterator<Item = (usize, &EndpointIndex)> {
        self.endpoints.iter().enumerate()
    }

    pub fn endpoint(&self, host_index: usize) -> Option<&EndpointIndex> {
        self.endpoints.get(host_index)
    }

    pub fn distinct_blocks(&self) -> usize {
        self.holders.len()
    }

    /// The block size requests are hashed with for `host_index`.
    pub fn block_size(&self, host_index: usize) -> u32 {
        self.endpoints
            .get(host_index)
            .map_or(self.default_block_size, |e| e.block_size)
    }

    /// The seed of a request's chain: its model when that is a LoRA adapter the engines
    /// announced, and its cache salt.
    pub fn request_seed(&self, model: &str, cache_salt: &str) -> u64 {
        let lora = if self.loras.contains(model) {
            model
        } else {
            ""
        };
        prompt_seed(lora, cache_salt)
    }

    fn endpoint_mut(&mut self, host_index: usize, id: &str) -> &mut EndpointIndex {
        if host_index >= self.endpoints.len() {
            let size = self.default_block_size;
            self.endpoints
                .resize_with(host_index + 1, || EndpointIndex::new(size));
            let words = (host_index / 64) + 1;
            if words > self.words {
                self.widen(words);
            }
        }
        let endpoint = &mut self.endpoints[host_index];
        if endpoint.id != id && !id.is_empty() {
            endpoint.id.clear();
            endpoint.id.push_str(id);
        }
        endpoint
    }

    /// Re-lays every holder set out for `words` words per tier.
    fn widen(&mut self, words: usize) {
        let old = self.words;
        for holders in self.holders.values_mut() {
            holders.widen(old, words);
        }
        self.words = words;
    }

    fn set_bit(&mut self, ours: u64, host_index: usize, tier: usize, on: bool) {
        let words = self.words;
        let (word, bit) = (host_index / 64, 1u64 << (host_index % 64));
        if on {
            let holders = self.holders.entry(ours).or_default();
            *holders.word_mut(tier, word, words) |= bit;
        } else if let Some(holders) = self.holders.get_mut(&ours) {
            *holders.word_mut(tier, word, words) &= !bit;
            if holders.is_empty() {
                self.holders.remove(&ours);
            }
        }
    }

    /// Applies a `BlockStored` event. Returns how many blocks were added.
    pub fn store(&mut self, host_index: usize, id: &str, stored: &StoredBlocks) -> usize {
        let count = stored.block_hashes.len();
        let block_size = stored.block_size;
        let lora = lora_name(stored);
        if let Some(name) = &lora {
            self.add_lora(name);
        }
        let endpoint = self.endpoint_mut(host_index, id);
        if block_size == 0 || count == 0 {
            endpoint.malformed += 1;
            return 0;
        }
        endpoint.block_size = block_size;
        endpoint.sized_by_events = true;
        let parent = match stored.parent_block_hash {
            None => None,
            Some(parent) => match endpoint.engine.get(&parent) {
                Some(block) => Some(block.ours),
                None => {
                    endpoint.unknown_parents += 1;
                    return 0;
                }
            },
        };
        let mut hashes = std::mem::take(&mut self.hashes);
        hashes.clear();
        let tokens = &stored.token_ids;
        let endpoint = &mut self.endpoints[host_index];
        if tokens.len() == count * block_size as usize {
            let seed = parent.unwrap_or_else(|| {
                prompt_seed(
                    lora.as_deref().unwrap_or(""),
                    &salt(stored, lora.as_deref()),
                )
            });
            hash_prompt_into(seed, tokens, block_size as usize, count, &mut hashes);
        } else if tokens.is_empty() {
            // A store without tokens (an offloading tier) names blocks the endpoint already
            // holds in another tier; unknown ones cannot be placed in a chain.
            for engine_hash in &stored.block_hashes {
                match endpoint.engine.get(engine_hash) {
                    Some(block) => hashes.push(block.ours),
                    None => {
                        endpoint.without_tokens += 1;
                        break;
                    }
                }
            }
        } else {
            endpoint.malformed += 1;
        }
        let tier = tier(stored.medium);
        let mut added = 0;
        for (&engine_hash, &ours) in stored.block_hashes.iter().zip(&hashes) {
            if self.add(host_index, engine_hash, ours, tier) {
                added += 1;
            }
        }
        self.hashes = hashes;
        added
    }

    /// Records one engine block; returns whether the endpoint newly holds `ours` in `tier`.
    fn add(&mut self, host_index: usize, engine_hash: u64, ours: u64, tier: usize) -> bool {
        let endpoint = &mut self.endpoints[host_index];
        let block = endpoint.engine.entry(engine_hash).or_insert(EngineBlock {
            ours,
            stored: [0; TIERS],
        });
        if block.ours != ours {
            // The engine reused a hash for other content: the old content is gone.
            let old = *block;
            *block = EngineBlock {
                ours,
                stored: [0; TIERS],
            };
            for (t, &n) in old.stored.iter().enumerate() {
                for _ in 0..n {
                    self.release(host_index, old.ours, t);
                }
            }
        }
        let endpoint = &mut self.endpoints[host_index];
        let block = endpoint
            .engine
            .get_mut(&engine_hash)
            .expect("inserted above");
        block.stored[tier] += 1;
        if block.stored[tier] > 1 {
            return false;
        }
        let held = endpoint.ours.entry(ours).or_insert([0; TIERS]);
        held[tier] += 1;
        if held[tier] > 1 {
            return false;
        }
        endpoint.blocks[tier] += 1;
        if tier == 0 && endpoint.in_flight.contains_key(&ours) {
            endpoint.settle_pending();
        }
        self.set_bit(ours, host_index, tier, true);
        true
    }

    /// Drops one engine block's hold on `ours` in `tier`.
    fn release(&mut self, host_index: usize, ours: u64, tier: usize) {
        let endpoint = &mut self.endpoints[host_index];
        let Some(held) = endpoint.ours.get_mut(&ours) else {
            return;
        };
        if held[tier] == 0 {
            return;
        }
        held[tier] -= 1;
        if held[tier] > 0 {
            return;
        }
        if held.iter().all(|&n| n == 0) {
            endpoint.ours.remove(&ours);
        }
        endpoint.blocks[tier] -= 1;
        if tier == 0 && endpoint.in_flight.contains_key(&ours) {
            endpoint.pending += 1;
        }
        self.set_bit(ours, host_index, tier, false);
    }

    /// Applies a `BlockRemoved` event. Returns how many blocks the endpoint no longer holds.
    pub fn remove(&mut self, host_index: usize, id: &str, hashes: &[u64], medium: Medium) -> usize {
        let tier = tier(medium);
        self.endpoint_mut(host_index, id);
        let mut removed = 0;
        for engine_hash in hashes {
            let endpoint = &mut self.endpoints[host_index];
            let Some(block) = endpoint.engine.get_mut(engine_hash) else {
                endpoint.unknown_removals += 1;
                continue;
            };
            if block.stored[tier] == 0 {
                endpoint.unknown_removals += 1;
                continue;
            }
            block.stored[tier] -= 1;
            let ours = block.ours;
            let last = block.stored[tier] == 0;
            if block.stored.iter().all(|&n| n == 0) {
                endpoint.engine.remove(engine_hash);
            }
            if last {
                let before = self.endpoints[host_index].blocks[tier];
                self.release(host_index, ours, tier);
                removed += usize::from(self.endpoints[host_index].blocks[tier] < before);
            }
        }
        removed
    }

    /// Counts the request keys `keys` as held by `host_index` while a request carrying them
    /// is in flight there: each key until as many [`KvIndex::release_in_flight`] calls. Keys
    /// also in `partial` name a prompt's last block, short of a full one, which the engine
    /// never stores: they are not pending.
    pub fn add_in_flight(&mut self, host_index: usize, id: &str, keys: &[u64], partial: &[u64]) {
        self.endpoint_mut(host_index, id);
        for &key in keys {
            let awaited = !self.engine_holds(host_index, key) && !partial.contains(&key);
            let endpoint = &mut self.endpoints[host_index];
            let count = endpoint.in_flight.entry(key).or_insert(0);
            *count += 1;
            if *count == 1 {
                if awaited {
                    endpoint.pending += 1;
                }
                self.set_bit(key, host_index, IN_FLIGHT, true);
            }
        }
    }

    /// Undoes one [`KvIndex::add_in_flight`] of `keys` and `partial` on `host_index` (a key
    /// the endpoint no longer counts, after a clear, is skipped).
    pub fn release_in_flight(&mut self, host_index: usize, keys: &[u64], partial: &[u64]) {
        if host_index >= self.endpoints.len() {
            return;
        }
        let mut released = Vec::new();
        for key in keys {
            let awaited = !self.engine_holds(host_index, *key) && !partial.contains(key);
            let endpoint = &mut self.endpoints[host_index];
            if let Some(count) = endpoint.in_flight.get_mut(key) {
                *count -= 1;
                if *count == 0 {
                    endpoint.in_flight.remove(key);
                    if awaited {
                        endpoint.settle_pending();
                    }
                    released.push(*key);
                }
            }
        }
        for key in released {
            self.set_bit(key, host_index, IN_FLIGHT, false);
        }
    }

    /// Whether `host_index`'s engine holds the request key `key` in its GPU tier.
    pub fn engine_holds(&self, host_index: usize, key: u64) -> bool {
        let (word, bit) = (host_index / 64, 1u64 << (host_index % 64));
        self.holders
            .get(&key)
            .is_some_and(|h| h.word(0, word, self.words) & bit != 0)
    }

    /// Blocks the requests in flight to `host_index` will store that its engine does not hold
    /// yet.
    pub fn pending_blocks(&self, host_index: usize) -> u64 {
        self.endpoints.get(host_index).map_or(0, |e| e.pending)
    }

    /// Request keys counted for requests in flight to `host_index`.
    pub fn in_flight_keys(&self, host_index: usize) -> usize {
        self.endpoints
            .get(host_index)
            .map_or(0, |endpoint| endpoint.in_flight.len())
    }

    /// Forgets everything `host_index` holds and sets its status.
    pub fn clear(&mut self, host_index: usize, id: &str, status: Status) {
        self.endpoint_mut(host_index, id);
        let endpoint = &mut self.endpoints[host_index];
        let ours: Vec<(u64, [u32; TIERS])> = endpoint.ours.drain().collect();
        let in_flight: Vec<u64> = endpoint.in_flight.drain().map(|(key, _)| key).collect();
        endpoint.pending = 0;
        endpoint.engine.clear();
        endpoint.blocks = [0; TIERS];
        endpoint.status = status;
        for (key, held) in ours {
            for (tier, &n) in held.iter().enumerate() {
                if n > 0 {
                    self.set_bit(key, host_index, tier, false);
                }
            }
        }
        for key in in_flight {
            self.set_bit(key, host_index, IN_FLIGHT, false);
        }
    }

    pub fn set_status(&mut self, host_index: usize, id: &str, status: Status) {
        self.endpoint_mut(host_index, id).status = status;
    }

    /// The LoRA adapter names seen in events.
    pub fn loras(&self) -> impl Iterator<Item = &str> {
        self.loras.iter().map(String::as_str)
    }

    pub fn add_lora(&mut self, name: &str) {
        if !self.loras.contains(name) {
            self.loras.insert(name.to_owned());
        }
    }

    /// The endpoint `id` at `host_index`, holding nothing yet, with the block size an event
    /// told (`None` keeps the default), for a restore to fill in.
    pub fn restore_endpoint(
        &mut self,
        host_index: usize,
        id: &str,
        told_block_size: Option<u32>,
    ) -> &mut EndpointIndex {
        let endpoint = self.endpoint_mut(host_index, id);
        if let Some(size) = told_block_size {
            endpoint.block_size = size;
            endpoint.sized_by_events = true;
        }
        endpoint
    }

    /// Makes the restored endpoint at `host_index` hold the engine block `engine_hash` under
    /// the request key `ours`, with `stored` stores not yet removed per tier. An engine hash
    /// is restored at most once per endpoint.
    pub fn restore_block(
        &mut self,
        host_index: usize,
        engine_hash: u64,
        ours: u64,
        stored: [u32; TIERS],
    ) {
        let endpoint = &mut self.endpoints[host_index];
        let previous = endpoint
            .engine
            .insert(engine_hash, EngineBlock { ours, stored });
        debug_assert!(previous.is_none(), "engine block restored twice");
        for (tier, &n) in stored.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let endpoint = &mut self.endpoints[host_index];
            let held = endpoint.ours.entry(ours).or_insert([0; TIERS]);
            held[tier] += 1;
            if held[tier] == 1 {
                endpoint.blocks[tier] += 1;
                self.set_bit(ours, host_index, tier, true);
            }
        }
    }

    /// Adds to `matched[host_index]` the leading blocks of `hashes` (one prompt's chain) each
    /// endpoint holds, for every endpoint whose bit is set in `candidates`.
    pub fn match_into(
        &self,
        hashes: &[u64],
        include_cpu: bool,
        candidates: &[u64],
        scratch: &mut MatchScratch,
        matched: &mut [u64],
    ) {
        let words = self.words.min(candidates.len());
        if words == 1 {
            self.match_one_word(hashes, include_cpu, candidates[0], matched);
            return;
        }
        scratch.alive.clear();
        scratch.alive.extend_from_slice(&candidates[..words]);
        let alive = &mut scratch.alive;
        for (position, hash) in hashes.iter().enumerate() {
            let holders = self.holders.get(hash);
            let mut any = false;
            for (word, alive_word) in alive.iter_mut().enumerate() {
                if *alive_word == 0 {
                    continue;
                }
                let held = holders.map_or(0, |h| {
                    let mut bits =
                        h.word(0, word, self.words) | h.word(IN_FLIGHT, word, self.words);
                    if include_cpu {
                        bits |= h.word(1, word, self.words);
                    }
                    bits
                });
                credit(*alive_word & !held, word, position as u64, matched);
                *alive_word &= held;
                any |= *alive_word != 0;
            }
            if !any {
                return;
            }
        }
        for (word, &alive_word) in alive.iter().enumerate() {
            credit(alive_word, word, hashes.len() as u64, matched);
        }
    }

    /// `match_into` for a fleet of at most 64 host indices: one word of candidates.
    fn match_one_word(
        &self,
        hashes: &[u64],
        include_cpu: bool,
        mut alive: u64,
        matched: &mut [u64],
    ) {
        for (position, hash) in hashes.iter().enumerate() {
            if alive == 0 {
                return;
            }
            let held = self.holders.get(hash).map_or(0, |h| {
                h.first[0] | h.first[IN_FLIGHT] | if include_cpu { h.first[1] } else { 0 }
            });
            credit(alive & !held, 0, position as u64, matched);
            alive &= held;
        }
        credit(alive, 0, hashes.len() as u64, matched);
    }
}

/// Adds `blocks` to `matched` for every host index whose bit is set in `bits` (word `word`).
fn credit(mut bits: u64, word: usize, blocks: u64, matched: &mut [u64]) {
    while bits != 0 {
        let bit = bits.trailing_zeros() as usize;
        bits &= bits - 1;
        if let Some(slot) = matched.get_mut(word * 64 + bit) {
            *slot += blocks;
        }
    }
}

/// The LoRA adapter of a store: its name, or, from an engine that sends only the id, the
/// first extra key of its first block.
fn lora_name(stored: &StoredBlocks) -> Option<String> {
    if let Some(name) = &stored.lora_name {
        return Some(name.clone());
    }
    stored.lora_id?;
    stored
        .extra_keys
        .first()
        .and_then(|keys| keys.as_ref())
        .and_then(|keys| keys.first())
        .cloned()
}

/// The cache salt a chain starts with: the first block's extra keys less the LoRA name.
fn salt(stored: &StoredBlocks, lora: Option<&str>) -> String {
    let Some(Some(keys)) = stored.extra_keys.first() else {
        return String::new();
    };
    let mut salt = String::new();
    let mut lora_skipped = false;
    for key in keys {
        if !lora_skipped && Some(key.as_str()) == lora {
            lora_skipped = true;
            continue;
        }
        salt.push_str(key);
    }
    salt
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: u32 = 4;

    /// Pending blocks recounted from scratch: keys in flight the GPU tier does not hold,
    /// short last blocks left out.
    fn recount(index: &KvIndex, host: usize, partial: &[u64]) -> u64 {
        let endpoint = &index.endpoints[host];
        let gpu_holds = |key: u64| endpoint.ours.get(&key).is_some_and(|held| held[0] > 0);
        endpoint
            .in_flight
            .keys()
            .filter(|&&key| !gpu_holds(key) && !partial.contains(&key))
            .count() as u64
    }

    /// A small deterministic generator, so a failure replays.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn pending_blocks_match_a_recount_through_stores_evictions_requests_and_clears() {
        let tokens: Vec<u32> = (0..8 * BLOCK).collect();
        let mut keys = Vec::new();
        hash_prompt_into(prompt_seed("", ""), &tokens, BLOCK as usize, 8, &mut keys);
        // A prompt one token past the fifth block: its sixth block is short.
        let mut short = Vec::new();
        let short_tokens = &tokens[..5 * BLOCK as usize + 1];
        hash_prompt_into(
            prompt_seed("", ""),
            short_tokens,
            BLOCK as usize,
            8,
            &mut short,
        );
        let partial = vec![short[5]];
        let mut index = KvIndex::new(BLOCK);
        let mut requests: Vec<(Vec<u64>, Vec<u64>)> = Vec::new();
        let mut state = 0x9E37_79B9_7F4A_7C15;
        for round in 0..5_000 {
            let roll = next(&mut state);
            let n = (roll >> 8) as usize % 8 + 1;
            match roll % 6 {
                0 => {
                    let stored = StoredBlocks {
                        block_hashes: (0..n as u64).map(|i| 100 + i).collect(),
                        token_ids: tokens[..n * BLOCK as usize].to_vec(),
                        block_size: BLOCK,
                        ..StoredBlocks::default()
                    };
                    index.store(0, "e", &stored);
                }
                1 => {
                    let evicted: Vec<u64> = (0..8usize)
                        .filter(|i| i % n == 0)
                        .map(|i| 100 + i as u64)
                        .collect();
                    index.remove(0, "e", &evicted, Medium::Gpu);
                }
                2 | 3 => {
                    let (request, short_block) = if roll.is_multiple_of(5) {
                        (short.clone(), partial.clone())
                    } else {
                        (keys[..n].to_vec(), Vec::new())
                    };
                    index.add_in_flight(0, "e", &request, &short_block);
                    requests.push((request, short_block));
                }
                4 => {
                    if !requests.is_empty() {
                        let (request, short_block) =
                            requests.swap_remove(roll as usize % requests.len());
                        index.release_in_flight(0, &request, &short_block);
                    }
                }
                _ => {
                    if roll % 50 == 5 {
                        index.clear(0, "e", Status::Exact);
                        requests.clear();
                    }
                }
            }
            assert_eq!(
                index.pending_blocks(0),
                recount(&index, 0, &partial),
                "round {round}"
            );
        }
    }
}
