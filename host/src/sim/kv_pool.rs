//! A replica's KV block pool: every block is either held by running sequences (reference
//! counted) or free; a free block may still hold a cached prefix block, found by its chained
//! hash, until it is handed out again. Free blocks holding nothing findable are handed out
//! first (most recently freed first, as they are warm); then cached blocks, least recently
//! freed first, so cached content is evicted in LRU order and only when nothing else is free.

use super::index_list::IndexList;
use std::collections::HashMap;
use switchyard_prefix_hashing::BlockHashBuild as HashBuild;

#[derive(Debug, Clone, Copy)]
struct Block {
    /// The chained hash of the block's content, when it is registered in `cached`.
    hash: u64,
    hashed: bool,
    refs: u32,
}

/// A fixed pool of KV blocks with prefix caching.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    /// Free blocks with nothing findable in them, handed out last in, first out.
    empty: Vec<u32>,
    /// Free cached blocks, least recently freed (the next to evict) first.
    lru: IndexList,
    cached: HashMap<u64, u32, HashBuild>,
    /// Cached blocks whose content was dropped to hand the block out again.
    evictions: u64,
}

impl BlockPool {
    /// A pool of `capacity` free, empty blocks (at least one).
    pub fn new(capacity: usize) -> Self {
        let n = capacity.clamp(1, u32::MAX as usize - 1);
        let blocks = vec![
            Block {
                hash: 0,
                hashed: false,
                refs: 0,
            };
            n
        ];
        BlockPool {
            blocks,
            // Block 0 is handed out first.
            empty: (0..n as u32).rev().collect(),
            lru: IndexList::with_ids(n),
            cached: HashMap::with_capacity_and_hasher(n, HashBuild::default()),
            evictions: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks held by at least one sequence.
    pub fn in_use(&self) -> usize {
        self.blocks.len() - self.free()
    }

    /// Blocks that can be handed out (free, cached or not).
    pub fn free(&self) -> usize {
        self.empty.len() + self.lru.len()
    }

    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Blocks whose content can be found by hash.
    pub fn cached_blocks(&self) -> usize {
        self.cached.len()
    }

    /// The hashes of every content that can be found, in no particular order.
    pub fn cached_hashes(&self) -> impl Iterator<Item = u64> + '_ {
        self.cached.keys().copied()
    }

    /// The block holding the content hashed `hash`, if it is still in the pool.
    pub fn lookup(&self, hash: u64) -> Option<u32> {
        self.cached.get(&hash).copied()
    }

    /// Whether block `id` is free (so taking it as a prefix hit uses up a free block).
    pub fn is_free(&self, id: u32) -> bool {
        self.blocks[id as usize].refs == 0
    }

    /// Takes a reference to the cached block `id` (from [`BlockPool::lookup`]).
    pub fn acquire(&mut self, id: u32) {
        if self.blocks[id as usize].refs == 0 {
            self.lru.unlink(id);
        }
        self.blocks[id as usize].refs += 1;
    }

    /// Hands out a free block: an empty one if there is one, else the least recently freed
    /// cached block, dropping its content; `None` when every block is held.
    pub fn allocate(&mut self) -> Option<u32> {
        self.allocate_evicting().map(|(id, _)| id)
    }

    /// As [`BlockPool::allocate`], with the hash of the content the block held when handing
    /// it out dropped that content (an eviction).
    pub fn allocate_evicting(&mut self) -> Option<(u32, Option<u64>)> {
        if let Some(id) = self.empty.pop() {
            self.blocks[id as usize].refs = 1;
            return Some((id, None));
        }
        let id = self.lru.front()?;
        self.lru.unlink(id);
        let block = &mut self.blocks[id as usize];
        block.refs = 1;
        if !block.hashed {
            return Some((id, None));
        }
        block.hashed = false;
        let hash = block.hash;
        self.cached.remove(&hash);
        self.evictions += 1;
        Some((id, Some(hash)))
    }

    /// Registers the full block `id` as holding the content hashed `hash`, unless another
    /// block already does (the first copy stays the one prefix hits find). Returns whether
    /// the content became findable through this call.
    pub fn register(&mut self, id: u32, hash: u64) -> bool {
        let block = &mut self.blocks[id as usize];
        if block.hashed {
            return false;
        }
        match self.cached.entry(hash) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(id);
                block.hash = hash;
                block.hashed = true;
                true
            }
            std::collections::hash_map::Entry::Occupied(_) => false,
        }
    }

    /// Drops a reference to block `id`; the last one frees it, most recently freed.
    pub fn release(&mut self, id: u32) {
        let block = &mut self.blocks[id as usize];
        debug_assert!(block.refs > 0, "released a free block");
        block.refs = block.refs.saturating_sub(1);
        if block.refs == 0 {
            if block.hashed {
                self.lru.push_back(id);
            } else {
                self.empty.push(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_takes_least_recently_freed_and_evicts_its_content() {
        let mut pool = BlockPool::new(3);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        pool.register(a, 10);
        pool.register(b, 11);
        assert_eq!(pool.in_use(), 2);
        pool.release(b);
        pool.release(a);
        assert_eq!(pool.free(), 3);
        // The empty block goes first, then b (freed before a).
        let c = pool.allocate().unwrap();
        assert!(c != a && c != b);
        assert_eq!(pool.evictions(), 0);
        assert_eq!(pool.allocate(), Some(b));
        assert_eq!(pool.evictions(), 1);
        assert_eq!(pool.lookup(11), None);
        assert_eq!(pool.lookup(10), Some(a));
        assert_eq!(pool.allocate(), Some(a));
        assert_eq!(pool.allocate(), None);
        assert_eq!(pool.in_use(), 3);
    }

    #[test]
    fn a_prefix_hit_on_a_free_block_takes_it_off_the_free_list() {
        let mut pool = BlockPool::new(2);
        let a = pool.allocate().unwrap();
        pool.register(a, 7);
        pool.release(a);
        assert!(pool.is_free(a));
        let hit = pool.lookup(7).unwrap();
        pool.acquire(hit);
        pool.acquire(hit);
        assert_eq!(pool.free(), 1);
        pool.release(hit);
        assert_eq!(pool.free(), 1);
        pool.release(hit);
        assert_eq!(pool.free(), 2);
        assert_eq!(pool.lookup(7), Some(a));
    }

    #[test]
    fn empty_blocks_are_reused_before_any_cached_one_is_evicted() {
        let mut pool = BlockPool::new(3);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        pool.register(a, 1);
        pool.release(a);
        pool.release(b);
        // b holds nothing findable: it comes back first, warm; then the never-used block.
        assert_eq!(pool.allocate(), Some(b));
        assert_ne!(pool.allocate(), Some(a));
        assert_eq!(pool.evictions(), 0);
        assert_eq!(pool.allocate(), Some(a));
        assert_eq!(pool.evictions(), 1);
    }

    #[test]
    fn the_first_copy_of_a_content_stays_registered() {
        let mut pool = BlockPool::new(2);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        pool.register(a, 5);
        pool.register(b, 5);
        assert_eq!(pool.lookup(5), Some(a));
        assert_eq!(pool.cached_blocks(), 1);
    }
}
