//! The approximate prefix-cache index: which block hashes each endpoint is believed to hold,
//! learnt from the requests dispatched to it, and how many leading blocks of a new request each
//! endpoint holds.
//!
//! Each endpoint has a bounded recency set of hashes; a reverse map lists, for every hash, the
//! endpoints whose sets contain it. Every change to a set updates the reverse map in the same
//! step, so the two never disagree.

mod lru;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use lru::{BuildBlockKeyHasher, Lru, Touch};

/// Endpoints holding a prompt's first block up to which each is followed through its own set;
/// beyond, the prompt is walked once for all of them (see [`PrefixIndex::match_into`]).
const FOLLOW_EACH_UP_TO: usize = 4;

/// The block hashes of one request, prompt by prompt, stored flat so one buffer serves every
/// request. Prompts without blocks are not stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptHashes {
    hashes: Vec<u64>,
    /// End offset in `hashes` of each prompt.
    ends: Vec<usize>,
}

impl PromptHashes {
    /// An empty set of prompts.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets every prompt, keeping the buffers.
    pub fn clear(&mut self) {
        self.hashes.clear();
        self.ends.clear();
    }

    /// Becomes a copy of `other`, keeping the buffers.
    pub fn copy_from(&mut self, other: &PromptHashes) {
        self.hashes.clone_from(&other.hashes);
        self.ends.clone_from(&other.ends);
    }

    /// Appends a prompt's block hashes (nothing when `hashes` is empty).
    pub fn push_prompt(&mut self, hashes: &[u64]) {
        self.push_prompt_with(|out| out.extend_from_slice(hashes));
    }

    /// Appends a prompt whose hashes `fill` appends to the buffer it is given (nothing when it
    /// appends none), so a hasher can write in place.
    pub fn push_prompt_with(&mut self, fill: impl FnOnce(&mut Vec<u64>)) {
        let start = self.hashes.len();
        fill(&mut self.hashes);
        if self.hashes.len() > start {
            self.ends.push(self.hashes.len());
        }
    }

    /// Number of prompts.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when there is no prompt.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Number of blocks over all prompts.
    pub fn total_blocks(&self) -> usize {
        self.hashes.len()
    }

    /// The hashes of prompt `index`, or an empty slice past the last prompt.
    pub fn prompt(&self, index: usize) -> &[u64] {
        let Some(&end) = self.ends.get(index) else {
            return &[];
        };
        let start = index
            .checked_sub(1)
            .map_or(0, |previous| self.ends[previous]);
        &self.hashes[start..end]
    }

    /// The prompts in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u64]> + '_ {
        (0..self.len()).map(|index| self.prompt(index))
    }

    fn longest_prompt(&self) -> usize {
        self.iter().map(<[u64]>::len).max().unwrap_or(0)
    }
}

impl<P: AsRef<[u64]>> FromIterator<P> for PromptHashes {
    fn from_iter<I: IntoIterator<Item = P>>(prompts: I) -> Self {
        let mut all = Self::new();
        for prompt in prompts {
            all.push_prompt(prompt.as_ref());
        }
        all
    }
}

/// One endpoint's entry: the id it is removed by and the hashes it holds.
#[derive(Debug)]
struct EndpointBlocks {
    id: Box<str>,
    blocks: Lru,
}

/// Block hashes believed cached on each endpoint.
///
/// Endpoints are addressed by a dense slot chosen by the caller (results are written into a
/// slice indexed by slot) and carry a stable id used to remove them. A slot holds one endpoint at
/// a time: recording under a slot with a different id first forgets the previous occupant, and
/// recording a known id under a new slot moves its blocks there.
#[derive(Debug, Default)]
pub struct PrefixIndex {
    endpoints: Vec<Option<EndpointBlocks>>,
    /// Slots whose sets contain each hash; no empty lists, no duplicates.
    holders: HashMap<u64, Vec<usize>, BuildBlockKeyHasher>,
}

impl PrefixIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that the request with `prompts` was dispatched to the endpoint `id` in `slot`,
    /// whose set holds at most `capacity` blocks (at least 1; a changed capacity applies from
    /// now on, dropping the least recent blocks when it shrinks).
    ///
    /// Blocks are touched deepest first, interleaving the prompts, so every prompt's first block
    /// ends up most recent: when the set overflows, the tails of prompts are forgotten before
    /// their beginnings, and a prefix match survives longest.
    pub fn record(&mut self, slot: usize, id: &str, capacity: usize, prompts: &PromptHashes) {
        if prompts.is_empty() {
            return;
        }
        self.claim(slot, id, capacity);
        let Self { endpoints, holders } = self;
        let Some(Some(endpoint)) = endpoints.get_mut(slot) else {
            return;
        };
        // One prompt already held in order (a repeat with nothing in between): it only moves
        // to the front.
        if let [only] = prompts.ends.as_slice() {
            if endpoint.blocks.refresh_run(&prompts.hashes[..*only]) {
                return;
            }
        }
        let mut touch = |hash: u64| touch_block(endpoint, holders, slot, hash);
        if let [only] = prompts.ends.as_slice() {
            // One prompt (the usual case): deepest first is simply back to front.
            prompts.hashes[..*only]
                .iter()
                .rev()
                .for_each(|&hash| touch(hash));
            return;
        }
        for depth in (0..prompts.longest_prompt()).rev() {
            for prompt in (0..prompts.len()).rev() {
                if let Some(&hash) = prompts.prompt(prompt).get(depth) {
                    touch(hash);
                }
            }
        }
    }

    /// Writes into `out[slot]` the number of leading blocks of each prompt that the endpoint in
    /// `slot` holds, summed over the prompts. A prompt's count stops at the endpoint's first
    /// missing block: a later block it holds does not count. Every entry of `out` is overwritten
    /// (0 for slots without an endpoint); endpoints whose slot is past its end are skipped.
    ///
    /// Only endpoints holding a prompt's first block are visited. A few such endpoints are
    /// followed block by block through their own sets; when many hold it (a prompt every
    /// replica has served), the prompt is walked once instead, one lookup per block advancing
    /// every endpoint that held all blocks before it.
    pub fn match_into(&self, prompts: &PromptHashes, out: &mut [u64]) {
        out.fill(0);
        for prompt in prompts.iter() {
            let Some(first) = prompt.first() else {
                continue;
            };
            let Some(slots) = self.holders.get(first) else {
                continue;
            };
            if slots.len() > FOLLOW_EACH_UP_TO && prompts.len() == 1 {
                self.walk_prompt(prompt, slots, out);
                continue;
            }
            for &slot in slots {
                let (Some(total), Some(Some(endpoint))) =
                    (out.get_mut(slot), self.endpoints.get(slot))
                else {
                    continue;
                };
                *total += endpoint.blocks.held_prefix(prompt) as u64;
            }
        }
    }

    /// `match_into` for one prompt whose first block the endpoints in `first_holders` hold,
    /// with `out` all zero: `out[slot]` counts the blocks the endpoint held so far and moves
    /// on only while it held every block before.
    fn walk_prompt(&self, prompt: &[u64], first_holders: &[usize], out: &mut [u64]) {
        let mut following = 0usize;
        for &slot in first_holders {
            if let (Some(held), Some(Some(_))) = (out.get_mut(slot), self.endpoints.get(slot)) {
                *held = 1;
                following += 1;
            }
        }
        for (depth, hash) in (1u64..).zip(&prompt[1..]) {
            if following == 0 {
                break;
            }
            let Some(slots) = self.holders.get(hash) else {
                break;
            };
            following = 0;
            for &slot in slots {
                if let Some(held) = out.get_mut(slot).filter(|held| **held == depth) {
                    *held = depth + 1;
                    following += 1;
                }
            }
        }
    }

    /// Forgets the endpoint `id` and every block it held; returns whether it was known.
    pub fn remove_endpoint(&mut self, id: &str) -> bool {
        match self.slot_of(id) {
            Some(slot) => {
                self.vacate(slot);
                true
            }
            None => false,
        }
    }

    /// Forgets every block the endpoint in `slot` holds (its engine emptied its cache).
    pub fn clear_slot(&mut self, slot: usize) {
        if slot < self.endpoints.len() {
            self.vacate(slot);
        }
    }

    /// Number of blocks the endpoint in `slot` holds (0 for an empty slot).
    pub fn blocks_held(&self, slot: usize) -> usize {
        match self.endpoints.get(slot) {
            Some(Some(endpoint)) => endpoint.blocks.len(),
            _ => 0,
        }
    }

    /// Number of distinct block hashes held by at least one endpoint.
    pub fn distinct_blocks(&self) -> usize {
        self.holders.len()
    }

    /// The endpoints known, in slot order: slot, id and number of blocks held.
    pub fn endpoints(&self) -> impl Iterator<Item = (usize, &str, usize)> + '_ {
        self.endpoints
            .iter()
            .enumerate()
            .filter_map(|(slot, entry)| {
                entry
                    .as_ref()
                    .map(|endpoint| (slot, &*endpoint.id, endpoint.blocks.len()))
            })
    }

    /// The endpoints known, in slot order, each with its capacity and its blocks from the
    /// least to the most recent: what [`PrefixIndex::restore`] takes back.
    pub fn export(&self) -> impl Iterator<Item = (usize, &str, usize, Vec<u64>)> + '_ {
        self.endpoints
            .iter()
            .enumerate()
            .filter_map(|(slot, entry)| {
                let endpoint = entry.as_ref()?;
                let mut blocks: Vec<u64> = endpoint.blocks.iter().collect();
                blocks.reverse();
                Some((slot, &*endpoint.id, endpoint.blocks.capacity(), blocks))
            })
    }

    /// Makes the endpoint `id` in `slot` hold `blocks`, given from the least to the most
    /// recent, with `capacity` (the least recent dropped beyond it), as if dispatched in that
    /// order.
    pub fn restore(&mut self, slot: usize, id: &str, capacity: usize, blocks: &[u64]) {
        self.claim(slot, id, capacity);
        let Self { endpoints, holders } = self;
        let Some(Some(endpoint)) = endpoints.get_mut(slot) else {
            return;
        };
        for &hash in blocks {
            touch_block(endpoint, holders, slot, hash);
        }
    }

    /// The id of the endpoint in `slot`, if any.
    pub fn endpoint_id(&self, slot: usize) -> Option<&str> {
        match self.endpoints.get(slot) {
            Some(Some(endpoint)) => Some(&endpoint.id),
            _ => None,
        }
    }

    fn slot_of(&self, id: &str) -> Option<usize> {
        self.endpoints
            .iter()
            .position(|entry| entry.as_ref().is_some_and(|endpoint| &*endpoint.id == id))
    }

    /// Makes `slot` hold the endpoint `id` with `capacity`, creating or moving its entry.
    fn claim(&mut self, slot: usize, id: &str, capacity: usize) {
        if self.endpoints.len() <= slot {
            self.endpoints.resize_with(slot + 1, || None);
        }
        if self.endpoints[slot]
            .as_ref()
            .is_some_and(|endpoint| &*endpoint.id != id)
        {
            self.vacate(slot);
        }
        if self.endpoints[slot].is_none() {
            let moved = self
                .slot_of(id)
                .and_then(|old_slot| self.move_entry(old_slot, slot));
            self.endpoints[slot] = Some(moved.unwrap_or_else(|| EndpointBlocks {
                id: id.into(),
                blocks: Lru::new(capacity),
            }));
        }
        let Self { endpoints, holders } = self;
        if let Some(Some(endpoint)) = endpoints.get_mut(slot) {
            endpoint.blocks.set_capacity(capacity);
            while let Some(evicted) = endpoint.blocks.pop_excess() {
                release(holders, evicted, slot);
            }
        }
    }

    /// Takes the entry out of `from`, re-pointing the reverse map at `to` (which must be empty).
    fn move_entry(&mut self, from: usize, to: usize) -> Option<EndpointBlocks> {
        let entry = self.endpoints.get_mut(from)?.take()?;
        for hash in entry.blocks.iter() {
            if let Some(slots) = self.holders.get_mut(&hash) {
                for slot in slots.iter_mut().filter(|slot| **slot == from) {
                    *slot = to;
                }
            }
        }
        Some(entry)
    }

    fn vacate(&mut self, slot: usize) {
        if let Some(entry) = self.endpoints.get_mut(slot).and_then(Option::take) {
            for hash in entry.blocks.iter() {
                release(&mut self.holders, hash, slot);
            }
        }
    }
}

/// Makes `hash` the most recent block of the endpoint in `slot`, keeping the reverse map in
/// step with what the set takes in and evicts.
fn touch_block(
    endpoint: &mut EndpointBlocks,
    holders: &mut HashMap<u64, Vec<usize>, BuildBlockKeyHasher>,
    slot: usize,
    hash: u64,
) {
    if let Touch::Inserted { evicted } = endpoint.blocks.touch(hash) {
        if let Some(evicted) = evicted {
            release(holders, evicted, slot);
        }
        holders.entry(hash).or_default().push(slot);
    }
}

/// Removes `slot` from the holders of `hash`, dropping the hash once nobody holds it.
fn release(holders: &mut HashMap<u64, Vec<usize>, BuildBlockKeyHasher>, hash: u64, slot: usize) {
    if let Some(slots) = holders.get_mut(&hash) {
        if let Some(position) = slots.iter().position(|&held| held == slot) {
            slots.swap_remove(position);
        }
        if slots.is_empty() {
            holders.remove(&hash);
        }
    }
}
