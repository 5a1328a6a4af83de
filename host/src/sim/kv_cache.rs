//! A replica's prefix cache: a fixed-capacity LRU set of chained block hashes.

use super::index_list::IndexList;
use std::collections::HashMap;

use switchyard_prefix_hashing::BlockHashBuild as HashBuild;

/// LRU set of block hashes with O(1) lookup, touch and insert.
#[derive(Debug)]
pub struct BlockCache {
    capacity: usize,
    slots: HashMap<u64, u32, HashBuild>,
    /// The hash in each slot.
    hashes: Vec<u64>,
    /// Every slot, least recently used first.
    lru: IndexList,
    evictions: u64,
    /// Blocks stored and evicted since the last [`BlockCache::take_changes`], when kept.
    changes: Option<Vec<CacheChange>>,
}

/// One change to the cache's contents, as an engine would announce it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheChange {
    Stored(u64),
    Evicted(u64),
}

impl BlockCache {
    /// An empty cache holding at most `capacity` blocks (at least one).
    pub fn new(capacity: usize) -> Self {
        BlockCache {
            capacity: capacity.max(1),
            slots: HashMap::default(),
            hashes: Vec::new(),
            lru: IndexList::with_ids(0),
            evictions: 0,
            changes: None,
        }
    }

    /// Keeps every store and eviction from now on, for [`BlockCache::take_changes`].
    pub fn keep_changes(&mut self) {
        self.changes.get_or_insert_with(Vec::new);
    }

    /// The stores and evictions since the last call, in order.
    pub fn take_changes(&mut self) -> Vec<CacheChange> {
        self.changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Forgets every block (an engine resetting its prefix cache); not counted as evictions.
    pub fn clear(&mut self) {
        self.slots.clear();
        self.hashes.clear();
        self.lru = IndexList::with_ids(0);
        if let Some(changes) = &mut self.changes {
            changes.clear();
        }
    }

    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// Blocks dropped to make room so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Every block held, in no particular order.
    pub fn blocks(&self) -> &[u64] {
        &self.hashes
    }

    pub fn contains(&self, hash: u64) -> bool {
        self.slots.contains_key(&hash)
    }

    /// Number of leading hashes of `chain` present in the cache, without touching them.
    pub fn matched_prefix(&self, chain: &[u64]) -> usize {
        chain.iter().take_while(|h| self.contains(**h)).count()
    }

    /// Marks `hash` most recently used if present; returns whether it was.
    pub fn touch(&mut self, hash: u64) -> bool {
        match self.slots.get(&hash) {
            Some(&slot) => {
                self.lru.unlink(slot);
                self.lru.push_back(slot);
                true
            }
            None => false,
        }
    }

    /// Inserts (or refreshes) a prompt's block chain so that its *first* block ends up most
    /// recently used: deeper blocks are evicted before the prefix they extend, so an eviction
    /// shortens cached prefixes instead of breaking them at the root.
    pub fn insert_chain(&mut self, chain: &[u64]) {
        for &h in chain.iter().rev() {
            self.insert(h);
        }
    }

    /// Inserts `hash` as most recently used, evicting the least recently used block when full.
    pub fn insert(&mut self, hash: u64) {
        if self.touch(hash) {
            return;
        }
        let slot = if self.hashes.len() < self.capacity {
            self.hashes.push(hash);
            (self.hashes.len() - 1) as u32
        } else {
            let victim = self.lru.front().expect("a full cache lists its slots");
            self.evictions += 1;
            if let Some(changes) = &mut self.changes {
                changes.push(CacheChange::Evicted(self.hashes[victim as usize]));
            }
            self.lru.unlink(victim);
            self.slots.remove(&self.hashes[victim as usize]);
            self.hashes[victim as usize] = hash;
            victim
        };
        self.slots.insert(hash, slot);
        self.lru.push_back(slot);
        if let Some(changes) = &mut self.changes {
            changes.push(CacheChange::Stored(hash));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used() {
        let mut c = BlockCache::new(3);
        c.insert(1);
        c.insert(2);
        c.insert(3);
        assert!(c.touch(1));
        c.insert(4);
        assert!(!c.contains(2));
        assert!(c.contains(1) && c.contains(3) && c.contains(4));
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn chain_root_outlives_its_extensions() {
        let mut c = BlockCache::new(4);
        c.insert_chain(&[10, 11, 12, 13]);
        c.insert_chain(&[20, 21]);
        // Evicted: 13 then 12, the deepest blocks of the first chain.
        assert_eq!(c.matched_prefix(&[10, 11, 12, 13]), 2);
        assert_eq!(c.matched_prefix(&[20, 21]), 2);
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn matched_prefix_stops_at_first_miss() {
        let mut c = BlockCache::new(8);
        c.insert_chain(&[1, 2, 4]);
        assert_eq!(c.matched_prefix(&[1, 2, 3, 4]), 2);
        assert_eq!(c.matched_prefix(&[5, 1]), 0);
        assert_eq!(c.matched_prefix(&[]), 0);
    }

    #[test]
    fn reinserting_refreshes_without_growing() {
        let mut c = BlockCache::new(2);
        c.insert(1);
        c.insert(2);
        c.insert(1);
        c.insert(3);
        assert!(c.contains(1) && c.contains(3) && !c.contains(2));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn capacity_one_keeps_latest() {
        let mut c = BlockCache::new(1);
        c.insert_chain(&[1, 2, 3]);
        assert!(c.contains(1));
        assert_eq!(c.len(), 1);
    }
}
