//! An intrusive doubly-linked list over `u32` ids into its owner's table: O(1) unlink and push
//! at the back, for the LRU orders of the prefix cache and the block pool.

const NIL: u32 = u32::MAX;

/// A list of distinct ids, front (oldest) to back (newest).
#[derive(Debug)]
pub struct IndexList {
    /// Per id, its (previous, next) neighbours; meaningful only while it is listed.
    links: Vec<(u32, u32)>,
    head: u32,
    tail: u32,
    len: usize,
}

impl IndexList {
    /// An empty list with room for ids below `n`; it grows for larger ones.
    pub fn with_ids(n: usize) -> Self {
        IndexList {
            links: vec![(NIL, NIL); n],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The oldest id, if any.
    pub fn front(&self) -> Option<u32> {
        (self.head != NIL).then_some(self.head)
    }

    /// Takes the listed `id` out.
    pub fn unlink(&mut self, id: u32) {
        let (prev, next) = self.links[id as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.links[prev as usize].1 = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.links[next as usize].0 = prev;
        }
        self.len -= 1;
    }

    /// Puts the unlisted `id` at the back.
    pub fn push_back(&mut self, id: u32) {
        let i = id as usize;
        if i >= self.links.len() {
            self.links.resize(i + 1, (NIL, NIL));
        }
        self.links[i] = (self.tail, NIL);
        if self.tail == NIL {
            self.head = id;
        } else {
            self.links[self.tail as usize].1 = id;
        }
        self.tail = id;
        self.len += 1;
    }
}
