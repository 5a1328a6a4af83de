//! One endpoint's bounded set of block hashes in recency order: a slab of nodes in a doubly
//! linked list (most recent first) plus a hash → node map, so touch and eviction are O(1).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// List terminator for node links.
const NIL: u32 = u32::MAX;

/// Largest capacity an [`Lru`] accepts: node indices are `u32` and one value is the terminator.
pub(super) const MAX_CAPACITY: usize = (u32::MAX - 1) as usize;

/// Hasher for keys that are already block hashes (or other `u64`s): one folded multiply, enough
/// to spread both uniform hashes and small consecutive integers over buckets.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct BlockKeyHasher(u64);

impl Hasher for BlockKeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(self.0 ^ u64::from(byte));
        }
    }

    fn write_u64(&mut self, value: u64) {
        let product = u128::from(value) * 0x9e37_79b9_7f4a_7c15_u128;
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Builds [`BlockKeyHasher`]s; stateless, so map layouts are the same on every run.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct BuildBlockKeyHasher;

impl BuildHasher for BuildBlockKeyHasher {
    type Hasher = BlockKeyHasher;

    fn build_hasher(&self) -> BlockKeyHasher {
        BlockKeyHasher::default()
    }
}

#[derive(Debug, Clone)]
struct Node {
    hash: u64,
    /// Towards the most recent end (`NIL` at the head).
    prev: u32,
    /// Towards the least recent end (`NIL` at the tail); links the free chain for free nodes.
    next: u32,
}

/// What [`Lru::touch`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Touch {
    /// The hash was present and is now the most recent.
    Refreshed,
    /// The hash was added as the most recent, evicting the least recent hash if the set was full.
    Inserted { evicted: Option<u64> },
}

/// A set of at most `capacity` hashes that forgets the least recently touched one first.
#[derive(Debug)]
pub(super) struct Lru {
    index: HashMap<u64, u32, BuildBlockKeyHasher>,
    nodes: Vec<Node>,
    head: u32,
    tail: u32,
    free: u32,
    capacity: usize,
}

impl Lru {
    /// An empty set; `capacity` is clamped to `1..=MAX_CAPACITY`. Nodes are allocated as hashes
    /// arrive, not up front.
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            index: HashMap::default(),
            nodes: Vec::new(),
            head: NIL,
            tail: NIL,
            free: NIL,
            capacity: capacity.clamp(1, MAX_CAPACITY),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(super) fn contains(&self, hash: u64) -> bool {
        self.index.contains_key(&hash)
    }

    /// Makes `hash` the most recent entry, inserting it (and evicting the least recent entry when
    /// full) if absent.
    pub(super) fn touch(&mut self, hash: u64) -> Touch {
        if let Some(&node) = self.index.get(&hash) {
            if node != self.head {
                self.unlink(node);
                self.link_front(node);
            }
            return Touch::Refreshed;
        }
        let evicted = if self.len() >= self.capacity {
            self.pop_least_recent()
        } else {
            None
        };
        let node = self.allocate(hash);
        self.link_front(node);
        self.index.insert(hash, node);
        Touch::Inserted { evicted }
    }

    /// How many leading hashes of `prefix` the set holds (stopping at the first it lacks).
    ///
    /// Follows the recency list from the first hash while it continues with the next ones of
    /// `prefix` (a prompt recorded in order, one map lookup for the whole stretch), then looks
    /// the remaining hashes up one by one.
    pub(super) fn held_prefix(&self, prefix: &[u64]) -> usize {
        let Some(first) = prefix.first() else {
            return 0;
        };
        let Some(&start) = self.index.get(first) else {
            return 0;
        };
        let mut held = 1;
        let mut at = start;
        while let Some(&hash) = prefix.get(held) {
            let next = self.nodes[at as usize].next;
            if next == NIL || self.nodes[next as usize].hash != hash {
                break;
            }
            at = next;
            held += 1;
        }
        held + prefix[held..]
            .iter()
            .take_while(|&&hash| self.contains(hash))
            .count()
    }

    /// When `run` (most recent first) is already a contiguous stretch of the list in that
    /// order, moves the stretch to the front and returns true: the same as touching its hashes
    /// from last to first, each being present. Otherwise changes nothing and returns false.
    pub(super) fn refresh_run(&mut self, run: &[u64]) -> bool {
        let Some((first, rest)) = run.split_first() else {
            return true;
        };
        let Some(&start) = self.index.get(first) else {
            return false;
        };
        let mut end = start;
        for &hash in rest {
            let next = self.nodes[end as usize].next;
            if next == NIL || self.nodes[next as usize].hash != hash {
                return false;
            }
            end = next;
        }
        if start == self.head {
            return true;
        }
        // `start` is not the head, so it has a predecessor.
        let before = self.nodes[start as usize].prev;
        let after = self.nodes[end as usize].next;
        self.nodes[before as usize].next = after;
        match after {
            NIL => self.tail = before,
            _ => self.nodes[after as usize].prev = before,
        }
        let old_head = self.head;
        self.nodes[start as usize].prev = NIL;
        self.nodes[end as usize].next = old_head;
        self.nodes[old_head as usize].prev = end;
        self.head = start;
        true
    }

    /// Changes the capacity (clamped as in [`Lru::new`]); entries beyond a smaller capacity stay
    /// until drained with [`Lru::pop_excess`].
    pub(super) fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.clamp(1, MAX_CAPACITY);
    }

    /// Removes and returns the least recent hash while the set holds more than its capacity.
    pub(super) fn pop_excess(&mut self) -> Option<u64> {
        if self.len() > self.capacity {
            self.pop_least_recent()
        } else {
            None
        }
    }

    /// Hashes from the most to the least recent.
    pub(super) fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        let mut at = self.head;
        std::iter::from_fn(move || {
            let node = self.nodes.get(at as usize)?;
            at = node.next;
            Some(node.hash)
        })
    }

    fn pop_least_recent(&mut self) -> Option<u64> {
        let node = self.tail;
        let hash = self.nodes.get(node as usize)?.hash;
        self.unlink(node);
        self.index.remove(&hash);
        self.nodes[node as usize].next = self.free;
        self.free = node;
        Some(hash)
    }

    fn allocate(&mut self, hash: u64) -> u32 {
        let fresh = Node {
            hash,
            prev: NIL,
            next: NIL,
        };
        if self.free != NIL {
            let node = self.free;
            self.free = self.nodes[node as usize].next;
            self.nodes[node as usize] = fresh;
            node
        } else {
            // Live nodes never exceed the capacity, itself below `NIL`, so the index fits.
            let node = self.nodes.len() as u32;
            self.nodes.push(fresh);
            node
        }
    }

    fn unlink(&mut self, node: u32) {
        let Node { prev, next, .. } = self.nodes[node as usize];
        match prev {
            NIL => self.head = next,
            _ => self.nodes[prev as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            _ => self.nodes[next as usize].prev = prev,
        }
    }

    fn link_front(&mut self, node: u32) {
        let old_head = self.head;
        self.nodes[node as usize].prev = NIL;
        self.nodes[node as usize].next = old_head;
        match old_head {
            NIL => self.tail = node,
            _ => self.nodes[old_head as usize].prev = node,
        }
        self.head = node;
    }

    /// Panics unless the list, the map and the free chain describe the same entries.
    #[cfg(test)]
    pub(super) fn assert_consistent(&self) {
        let mut forward = Vec::new();
        let (mut at, mut prev) = (self.head, NIL);
        while at != NIL {
            let node = &self.nodes[at as usize];
            assert_eq!(node.prev, prev, "back link of node {at}");
            assert_eq!(
                self.index.get(&node.hash),
                Some(&at),
                "map entry of node {at}"
            );
            forward.push(at);
            assert!(
                forward.len() <= self.nodes.len(),
                "cycle in the recency list"
            );
            prev = at;
            at = node.next;
        }
        assert_eq!(self.tail, prev, "tail");
        assert_eq!(forward.len(), self.index.len(), "list length vs map size");
        assert!(self.len() <= self.capacity, "over capacity");
        let mut free = 0;
        let mut at = self.free;
        while at != NIL {
            assert!(!forward.contains(&at), "node {at} is both live and free");
            free += 1;
            at = self.nodes[at as usize].next;
        }
        assert_eq!(forward.len() + free, self.nodes.len(), "leaked nodes");
    }
}

#[cfg(test)]
mod tests {
    use super::{Lru, Touch};

    fn contents(lru: &Lru) -> Vec<u64> {
        lru.iter().collect()
    }

    #[test]
    fn touch_orders_most_recent_first_and_evicts_the_least_recent() {
        let mut lru = Lru::new(3);
        assert_eq!(lru.touch(1), Touch::Inserted { evicted: None });
        assert_eq!(lru.touch(2), Touch::Inserted { evicted: None });
        assert_eq!(lru.touch(3), Touch::Inserted { evicted: None });
        assert_eq!(contents(&lru), [3, 2, 1]);
        assert_eq!(lru.touch(1), Touch::Refreshed);
        assert_eq!(contents(&lru), [1, 3, 2]);
        assert_eq!(lru.touch(4), Touch::Inserted { evicted: Some(2) });
        assert_eq!(contents(&lru), [4, 1, 3]);
        assert!(!lru.contains(2));
        assert!(lru.contains(3));
        lru.assert_consistent();
    }

    #[test]
    fn refreshing_the_tail_or_head_keeps_links_intact() {
        let mut lru = Lru::new(4);
        for hash in [10, 20, 30] {
            lru.touch(hash);
        }
        assert_eq!(lru.touch(10), Touch::Refreshed);
        assert_eq!(contents(&lru), [10, 30, 20]);
        assert_eq!(lru.touch(10), Touch::Refreshed);
        assert_eq!(contents(&lru), [10, 30, 20]);
        lru.assert_consistent();
    }

    #[test]
    fn shrinking_drains_the_least_recent_and_reuses_their_nodes() {
        let mut lru = Lru::new(4);
        for hash in [1, 2, 3, 4] {
            lru.touch(hash);
        }
        lru.set_capacity(2);
        assert_eq!(lru.pop_excess(), Some(1));
        assert_eq!(lru.pop_excess(), Some(2));
        assert_eq!(lru.pop_excess(), None);
        assert_eq!(contents(&lru), [4, 3]);
        lru.assert_consistent();
        lru.set_capacity(3);
        assert_eq!(lru.touch(5), Touch::Inserted { evicted: None });
        assert_eq!(contents(&lru), [5, 4, 3]);
        assert_eq!(
            lru.nodes.len(),
            4,
            "freed nodes are reused before the slab grows"
        );
        lru.assert_consistent();
    }

    #[test]
    fn refreshing_a_run_is_touching_it_back_to_front() {
        let runs: [&[u64]; 7] = [&[3, 4, 5], &[1, 2], &[5, 6], &[6], &[2, 1], &[9], &[]];
        for run in runs {
            let mut by_run = Lru::new(8);
            let mut by_touch = Lru::new(8);
            for hash in [6, 5, 4, 3, 2, 1] {
                by_run.touch(hash);
                by_touch.touch(hash);
            }
            let expected = run.iter().all(|hash| by_touch.contains(*hash))
                && (run.is_empty() || {
                    let list = contents(&by_touch);
                    let at = list.iter().position(|h| *h == run[0]).expect("present");
                    list[at..].starts_with(run)
                });
            assert_eq!(by_run.refresh_run(run), expected, "{run:?}");
            if expected {
                for &hash in run.iter().rev() {
                    by_touch.touch(hash);
                }
            }
            assert_eq!(contents(&by_run), contents(&by_touch), "{run:?}");
            by_run.assert_consistent();
        }
    }

    #[test]
    fn held_prefix_counts_leading_hashes_held_in_any_order() {
        let mut lru = Lru::new(8);
        for hash in [6, 5, 4, 3, 2, 1] {
            lru.touch(hash);
        }
        let cases: [(&[u64], usize); 8] = [
            (&[], 0),
            (&[9, 1], 0),
            (&[1, 2, 3], 3),
            (&[2, 3, 9, 4], 2),
            (&[3, 1, 2, 9], 3),
            (&[4, 5, 6, 1, 2], 5),
            (&[6], 1),
            (&[5, 6, 7], 2),
        ];
        for (prefix, held) in cases {
            let expected = prefix.iter().take_while(|h| lru.contains(**h)).count();
            assert_eq!(expected, held, "{prefix:?}");
            assert_eq!(lru.held_prefix(prefix), held, "{prefix:?}");
        }
    }

    #[test]
    fn capacity_is_at_least_one() {
        let mut lru = Lru::new(0);
        assert_eq!(lru.capacity(), 1);
        lru.touch(7);
        assert_eq!(lru.touch(8), Touch::Inserted { evicted: Some(7) });
        assert_eq!(contents(&lru), [8]);
        lru.assert_consistent();
    }
}
