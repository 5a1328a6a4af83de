//! Joint placement of one sealed batch: requests are grouped by prompt prefix and each group is
//! steered to a replica so a shared prefix is prefilled once while the batch stays balanced.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::config::BalanceBy;

/// A candidate replica as the assignment sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replica<'a> {
    /// Stable identity (`"namespace/name"`); the last tie-break.
    pub id: &'a str,
    /// Requests the replica is running now; the tie-break before the id.
    pub running_requests: u64,
}

/// Assigns the requests of one batch to replicas.
///
/// `entries[i]` holds the block hashes of request `i` (all its prompts, flattened) in arrival
/// order. The result holds, per entry, the index into `replicas` it is steered to, or `None`
/// when it gets no affinity. The outcome depends only on the inputs, never on hash-map order.
///
/// How it decides:
/// 1. Requests with exactly the same hash list form a group. Requests without hashes, and every
///    request when `replicas` is empty, get `None`.
/// 2. A group of two or more is a placement unit. A lone request is a unit only when
///    `min_colocate_blocks > 0` and its first `min_colocate_blocks` hashes also start at least
///    one other request of the batch; any other lone request gets `None`.
/// 3. Groups are placed before lone requests; within each kind, units with more blocks go first
///    (ties in arrival order), so shorter units can attach to prefixes already placed.
/// 4. The fair share is the batch total divided by the number of replicas, rounded up, where the
///    total counts requests, or with [`BalanceBy::Tokens`] the units' block counts.
/// 5. With `min_colocate_blocks > 0`, a unit first looks for a replica that already holds at
///    least that many of its leading blocks from earlier units of this batch and whose load is
///    still below the fair share, preferring the longest match. Failing that — and for every
///    further replica a unit spills onto — it takes the least-loaded replica that still has room
///    under `max_per_replica`, or the least-loaded one overall when none has room.
/// 6. A unit fills its replica up to `max_per_replica` members (all of them when `None`) before
///    moving to the next pick; once every replica holds its cap, members go one at a time.
/// 7. Load grows by one per request placed, or with [`BalanceBy::Tokens`], once per replica a
///    unit lands on, by the unit's block count less the leading blocks that replica already
///    holds from this batch.
///
/// Ties between replicas go to the lower load, then fewer running requests, then the smaller id.
pub fn assign(
    entries: &[&[u64]],
    replicas: &[Replica<'_>],
    max_per_replica: Option<usize>,
    min_colocate_blocks: usize,
    balance_by: BalanceBy,
) -> Vec<Option<usize>> {
    let mut assigned = vec![None; entries.len()];
    if replicas.is_empty() {
        return assigned;
    }
    let groups = Groups::build(entries);
    let units = placement_order(&groups, min_colocate_blocks);
    if units.is_empty() {
        return assigned;
    }
    let by_tokens = balance_by == BalanceBy::Tokens;
    let total: usize = units
        .iter()
        .map(|&g| {
            if by_tokens {
                groups.keys[g].len()
            } else {
                groups.members(g).len()
            }
        })
        .sum();
    let mut placer = Placer::new(
        replicas,
        max_per_replica,
        min_colocate_blocks,
        by_tokens,
        total.div_ceil(replicas.len()) as u64,
    );
    placer.reserve(units.iter().map(|&g| groups.keys[g].len()).sum());
    for &g in &units {
        placer.place(groups.keys[g], groups.members(g), &mut assigned);
    }
    assigned
}

const NONE: usize = usize::MAX;

/// Requests with identical hash lists, in order of first appearance.
struct Groups<'a> {
    /// The shared hash list of each group.
    keys: Vec<&'a [u64]>,
    /// Entry indices, group after group, each group in arrival order.
    members: Vec<usize>,
    /// `members[starts[g]..starts[g + 1]]` are the members of group `g`.
    starts: Vec<usize>,
}

impl<'a> Groups<'a> {
    fn build(entries: &[&'a [u64]]) -> Self {
        let mut ids = SliceIds::with_capacity(entries.len());
        let mut group_of = vec![NONE; entries.len()];
        let mut sizes = Vec::new();
        for (entry, hashes) in entries.iter().enumerate() {
            if hashes.is_empty() {
                continue;
            }
            let g = ids.id(hashes);
            if g == sizes.len() {
                sizes.push(0);
            }
            sizes[g] += 1;
            group_of[entry] = g;
        }
        let mut starts = Vec::with_capacity(sizes.len() + 1);
        let mut at = 0;
        starts.push(0);
        for size in &sizes {
            at += size;
            starts.push(at);
        }
        let mut cursor = starts[..sizes.len()].to_vec();
        let mut members = vec![0; at];
        for (entry, &g) in group_of.iter().enumerate() {
            if g != NONE {
                members[cursor[g]] = entry;
                cursor[g] += 1;
            }
        }
        Self {
            keys: ids.slices,
            members,
            starts,
        }
    }

    fn members(&self, g: usize) -> &[usize] {
        &self.members[self.starts[g]..self.starts[g + 1]]
    }
}

/// The units to place, in placement order: groups of two or more, then lone requests that share
/// their first `min_blocks` blocks with another request; each part longest first, stable.
fn placement_order(groups: &Groups<'_>, min_blocks: usize) -> Vec<usize> {
    let count = groups.keys.len();
    let mut shared = vec![false; count];
    if min_blocks > 0 {
        let mut sigs = SliceIds::with_capacity(count);
        let mut sig_of = vec![NONE; count];
        let mut requests_per_sig: Vec<usize> = Vec::new();
        for (g, key) in groups.keys.iter().enumerate() {
            if key.len() < min_blocks {
                continue;
            }
            let sig = sigs.id(&key[..min_blocks]);
            if sig == requests_per_sig.len() {
                requests_per_sig.push(0);
            }
            requests_per_sig[sig] += groups.members(g).len();
            sig_of[g] = sig;
        }
        for (flag, &sig) in shared.iter_mut().zip(&sig_of) {
            *flag = sig != NONE && requests_per_sig[sig] >= 2;
        }
    }
    let mut multi: Vec<usize> = (0..count)
        .filter(|&g| groups.members(g).len() >= 2)
        .collect();
    let mut lone: Vec<usize> = (0..count)
        .filter(|&g| groups.members(g).len() == 1 && shared[g])
        .collect();
    multi.sort_by_key(|&g| Reverse(groups.keys[g].len()));
    lone.sort_by_key(|&g| Reverse(groups.keys[g].len()));
    multi.append(&mut lone);
    multi
}

/// Placement state shared by all units of one batch.
struct Placer {
    /// Most members of one unit per replica (`usize::MAX` = no limit).
    cap: usize,
    min_blocks: usize,
    by_tokens: bool,
    max_share: u64,
    /// Position of each replica when ordered by (running requests, id).
    rank: Vec<usize>,
    load: Vec<u64>,
    /// Members of the current unit placed on each replica.
    taken: Vec<usize>,
    /// Leading blocks of the current unit each replica already holds from this batch.
    matches: Vec<u64>,
    /// Replicas the current unit has landed on, in order.
    touched: Vec<usize>,
    /// Block hash → row of `bits` holding the set of replicas that hold the block.
    holders: HashMap<u64, usize, BuildHasherDefault<MixHasher>>,
    bits: Vec<u64>,
    words: usize,
}

impl Placer {
    fn new(
        replicas: &[Replica<'_>],
        max_per_replica: Option<usize>,
        min_blocks: usize,
        by_tokens: bool,
        max_share: u64,
    ) -> Self {
        let n = replicas.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&r| (replicas[r].running_requests, replicas[r].id));
        let mut rank = vec![0; n];
        for (position, &r) in order.iter().enumerate() {
            rank[r] = position;
        }
        Self {
            cap: max_per_replica.unwrap_or(usize::MAX),
            min_blocks,
            by_tokens,
            max_share,
            rank,
            load: vec![0; n],
            taken: vec![0; n],
            matches: vec![0; n],
            touched: Vec::new(),
            holders: HashMap::default(),
            bits: Vec::new(),
            words: n.div_ceil(64),
        }
    }

    /// Whether placements depend on which blocks replicas already hold; if not, no block index
    /// is kept.
    fn uses_matches(&self) -> bool {
        self.min_blocks > 0 || self.by_tokens
    }

    /// Makes room for `blocks` distinct block hashes in the holder index.
    fn reserve(&mut self, blocks: usize) {
        if !self.uses_matches() {
            return;
        }
        self.holders.reserve(blocks);
        self.bits.reserve(blocks * self.words);
    }

    fn place(&mut self, key: &[u64], members: &[usize], assigned: &mut [Option<usize>]) {
        let cost = key.len() as u64;
        let mut prefer_match = self.min_blocks > 0;
        self.matches.fill(0);
        if self.uses_matches() {
            self.count_matches(key);
        }
        let mut next = 0;
        while next < members.len() {
            let target = self.pick(prefer_match);
            let run =
                (members.len() - next).min(self.cap.saturating_sub(self.taken[target]).max(1));
            for &entry in &members[next..next + run] {
                assigned[entry] = Some(target);
            }
            if self.taken[target] == 0 {
                self.touched.push(target);
                if self.by_tokens {
                    self.load[target] += cost.saturating_sub(self.matches[target]);
                }
            }
            if !self.by_tokens {
                self.load[target] += run as u64;
            }
            self.taken[target] += run;
            next += run;
            prefer_match = false;
        }
        if self.uses_matches() {
            self.record(key);
        }
        for &r in &self.touched {
            self.taken[r] = 0;
        }
        self.touched.clear();
    }

    /// Walks the unit's blocks until one has no holder, crediting every holder of each block.
    /// Consecutive blocks with the same holders (a shared prefix) are credited in one pass.
    fn count_matches(&mut self, key: &[u64]) {
        let mut run: Option<(usize, u64)> = None;
        for hash in key {
            let Some(&row) = self.holders.get(hash) else {
                break;
            };
            run = match run {
                Some((held, len)) if self.same_row(held, row) => Some((held, len + 1)),
                Some((held, len)) => {
                    self.credit(held, len);
                    Some((row, 1))
                }
                None => Some((row, 1)),
            };
        }
        if let Some((held, len)) = run {
            self.credit(held, len);
        }
    }

    fn same_row(&self, a: usize, b: usize) -> bool {
        a == b || self.row(a) == self.row(b)
    }

    fn row(&self, row: usize) -> &[u64] {
        &self.bits[row * self.words..(row + 1) * self.words]
    }

    /// Adds `blocks` to the match count of every replica in `row`.
    fn credit(&mut self, row: usize, blocks: u64) {
        for w in 0..self.words {
            let mut rest = self.bits[row * self.words + w];
            while rest != 0 {
                self.matches[w * 64 + rest.trailing_zeros() as usize] += blocks;
                rest &= rest - 1;
            }
        }
    }

    /// Marks every block of the unit as held by every replica the unit landed on.
    fn record(&mut self, key: &[u64]) {
        for &hash in key {
            let row = *self.holders.entry(hash).or_insert_with(|| {
                self.bits.resize(self.bits.len() + self.words, 0);
                self.bits.len() / self.words - 1
            });
            for &r in &self.touched {
                self.bits[row * self.words + r / 64] |= 1 << (r % 64);
            }
        }
    }

    fn pick(&self, prefer_match: bool) -> usize {
        if prefer_match {
            // Longest match first, then the usual order. `min_blocks >= 1` here, so every
            // eligible key sorts before the initial one.
            let mut best = NONE;
            let mut best_key = (Reverse(0), u128::MAX);
            for r in 0..self.load.len() {
                let key = (Reverse(self.matches[r]), self.order_key(r));
                if self.taken[r] < self.cap
                    && self.load[r] < self.max_share
                    && self.matches[r] >= self.min_blocks as u64
                    && key < best_key
                {
                    best = r;
                    best_key = key;
                }
            }
            if best != NONE {
                return best;
            }
        }
        let with_room = self.least_loaded(self.cap);
        if with_room != NONE {
            with_room
        } else {
            self.least_loaded(usize::MAX)
        }
    }

    /// The least-loaded replica among those holding fewer than `cap` members of the current
    /// unit, or `NONE`.
    fn least_loaded(&self, cap: usize) -> usize {
        let mut best = NONE;
        let mut best_key = u128::MAX;
        for (r, &taken) in self.taken.iter().enumerate() {
            let key = self.order_key(r);
            if taken < cap && key < best_key {
                best = r;
                best_key = key;
            }
        }
        best
    }

    /// Smaller is preferred: lower load, then fewer running requests, then the smaller id.
    fn order_key(&self, r: usize) -> u128 {
        (u128::from(self.load[r]) << 64) | self.rank[r] as u128
    }
}

/// Dense ids for distinct hash lists, exact even when two lists fold to the same 64-bit key.
struct SliceIds<'a> {
    /// Folded key → most recent id with that key.
    first: HashMap<u64, usize, BuildHasherDefault<MixHasher>>,
    slices: Vec<&'a [u64]>,
    /// Previous id with the same folded key, or `NONE`.
    next: Vec<usize>,
}

impl<'a> SliceIds<'a> {
    fn with_capacity(capacity: usize) -> Self {
        Self {
            first: HashMap::with_capacity_and_hasher(capacity, Default::default()),
            slices: Vec::with_capacity(capacity),
            next: Vec::with_capacity(capacity),
        }
    }

    /// The id of `slice`, new ids numbered from 0 in order of first appearance.
    fn id(&mut self, slice: &'a [u64]) -> usize {
        let key = fold(slice);
        let head = self.first.get(&key).copied().unwrap_or(NONE);
        let mut id = head;
        while id != NONE {
            if self.slices[id] == slice {
                return id;
            }
            id = self.next[id];
        }
        let id = self.slices.len();
        self.slices.push(slice);
        self.next.push(head);
        self.first.insert(key, id);
        id
    }
}

fn fold(slice: &[u64]) -> u64 {
    let h = slice.iter().fold(slice.len() as u64, |h, &x| {
        (h.rotate_left(23) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    });
    mix(h)
}

/// Bit mixer (the 64-bit finaliser of MurmurHash3) so that small or patterned keys spread.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Unkeyed hasher for `u64` keys; deterministic, and the maps are never iterated.
#[derive(Default)]
struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix(self.0 ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = mix(self.0 ^ value);
    }
}

#[cfg(test)]
mod tests;
