//! The step-based replica model: a continuous-batching engine that runs in steps, with one KV
//! block pool shared by running sequences and cached prefixes.
//!
//! Each step is scheduled when the previous one ends (or when work arrives at an idle
//! replica), within a budget of `maxNumBatchedTokens` tokens and `maxNumSeqs` sequences:
//!
//! 1. Running sequences, oldest first: each gets the tokens it still has to compute (one for a
//!    decoding sequence, the rest of its prompt — up to the budget left — for one being
//!    prefilled in chunks). A sequence that cannot get the blocks those tokens need preempts
//!    the newest running sequence (its blocks are freed and it goes back to the front of the
//!    queue, to be recomputed), again until the blocks are there or it is itself the newest,
//!    in which case it is preempted.
//! 2. If nothing was preempted, waiting sequences in order, while budget and sequence slots
//!    last: the longest chain of its full blocks still in the pool is a prefix hit (never the
//!    whole sequence: at least one token is computed, for the logits), the rest is scheduled
//!    as one chunk within the budget, if the pool has the blocks for it; otherwise it stays
//!    first in the queue.
//!
//! A block the step fills is registered for prefix hits as soon as it is scheduled, when its
//! content is known — prompt tokens, and generated tokens where the workload knows them (a
//! multi-turn session's next turn repeats the answer): its KV is written before the step's
//! attention reads it, so even a sequence scheduled later in the same step can hit it.
//!
//! The step then takes [`EngineParams::step_ms`] of its prefill tokens, decoding sequences
//! and the KV tokens those sequences read. When it ends, every sequence whose tokens are all
//! computed emits one token (the first one ends its prefill), and finished sequences free
//! their blocks, last block first, so a prefix outlives its extensions in the pool's LRU
//! order. A request too long ever to fit in the pool is refused on arrival.

use super::kv_pool::BlockPool;
use super::profile::EngineParams;
use super::replica::{BlockStore, Job, ReplicaStats};
use super::router::ReplicaState;
use std::collections::VecDeque;

/// Something a step did to one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepEvent {
    /// The request's first token came out. `scheduled_at` is when its prefill was first
    /// scheduled (the end of its queue wait); `full_hit` whether its prefix hit was as long
    /// as a hit can be.
    FirstToken {
        request: usize,
        cached_tokens: u32,
        computed_tokens: u32,
        scheduled_at: f64,
        full_hit: bool,
    },
    /// The request's last token came out.
    Done { request: usize },
}

#[derive(Debug, Default)]
struct Seq {
    job: Option<Job>,
    /// Tokens whose KV is computed (or was found cached).
    computed: u32,
    /// Output tokens emitted.
    generated: u32,
    /// Tokens scheduled in the current step.
    new: u32,
    /// Leading blocks whose content is registered in the pool (or known not to be knowable).
    registered: u32,
    /// Tokens found cached when the current admission began.
    admitted_at_computed: u32,
    /// Prompt tokens found cached at the first admission.
    first_hit: u32,
    blocks: Vec<u32>,
    /// When it was first scheduled; `NaN` before.
    first_scheduled: f64,
}

/// A change to what the pool's prefix cache can find, as an engine announces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockChange {
    /// Block `block` of request `request`'s chain (its prompt continued over the output
    /// tokens the workload knows) became findable.
    Stored { request: usize, block: u32 },
    /// The content with this chained hash was dropped to hand its block out again.
    Removed(u64),
}

/// What the engine model adds to [`ReplicaStats`], and the accounting its checks compare.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineTotals {
    pub steps: u64,
    /// Tokens computed by steps, prefill and decode (counted per step).
    pub step_tokens: u64,
    /// Tokens computed by sequences, counted per admission when it ends.
    pub admission_tokens: u64,
    /// Tokens emitted.
    pub emitted_tokens: u64,
    /// Highest number of blocks held at once.
    pub peak_blocks: u64,
}

/// What the step being scheduled holds so far.
struct Batch {
    /// Tokens it may still take.
    budget: u32,
    prefill: u64,
    decode: u64,
    context: u64,
}

/// One replica under the step-based engine model.
#[derive(Debug)]
pub struct StepReplica {
    params: EngineParams,
    block_size: u32,
    pool: BlockPool,
    seqs: Vec<Seq>,
    free_slots: Vec<u32>,
    /// Admitted sequences, oldest first.
    running: Vec<u32>,
    waiting: VecDeque<u32>,
    /// Sequences scheduled in the step under way.
    scheduled: Vec<u32>,
    /// Block ids of a prefix hit being looked at.
    hits: Vec<u32>,
    /// Whether a step is under way.
    stepping: bool,
    /// Whether the owner is to call [`StepReplica::finish_step`]: a step is under way, or
    /// work arrived at an idle replica (the step starts once every arrival of the instant is
    /// in).
    pending: bool,
    in_flight_tokens: u64,
    stats: ReplicaStats,
    totals: EngineTotals,
    /// The pool's stores and evictions in order, when kept.
    changes: Option<Vec<BlockChange>>,
}

impl StepReplica {
    /// An idle replica with an empty pool; `params` are assumed validated.
    pub fn new(params: &EngineParams, block_size: usize) -> Self {
        StepReplica {
            pool: BlockPool::new(params.kv_blocks),
            params: params.clone(),
            block_size: block_size.max(1) as u32,
            seqs: Vec::new(),
            free_slots: Vec::new(),
            running: Vec::new(),
            waiting: VecDeque::new(),
            scheduled: Vec::new(),
            hits: Vec::new(),
            stepping: false,
            pending: false,
            in_flight_tokens: 0,
            stats: ReplicaStats::default(),
            totals: EngineTotals::default(),
            changes: None,
        }
    }

    /// Keeps every store and eviction of the pool from now on, for
    /// [`StepReplica::take_block_changes`].
    pub fn keep_block_changes(&mut self) {
        self.changes.get_or_insert_with(Vec::new);
    }

    /// Appends the stores and evictions since the last call to `out`, in the order they
    /// happened.
    pub fn take_block_changes(&mut self, out: &mut Vec<BlockChange>) {
        if let Some(changes) = &mut self.changes {
            out.append(changes);
        }
    }

    /// The router's view of this replica.
    pub fn state(&self) -> ReplicaState {
        ReplicaState {
            running: self.running.len() as u32,
            waiting: self.waiting.len() as u32,
            kv_usage: self.pool.in_use() as f64 / self.pool.capacity() as f64,
            in_flight_tokens: self.in_flight_tokens,
            in_flight: (self.running.len() + self.waiting.len()) as u32,
        }
    }

    pub fn stats(&self) -> &ReplicaStats {
        &self.stats
    }

    pub fn totals(&self) -> &EngineTotals {
        &self.totals
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Whether a request of `job`'s size can ever fit in the pool.
    pub fn fits(&self, job: &Job) -> bool {
        let tokens = u64::from(job.prompt_tokens) + u64::from(job.output_tokens);
        tokens.div_ceil(u64::from(self.block_size)) <= self.pool.capacity() as u64
    }

    /// Takes a request routed here at `now` (it must [`fit`](Self::fits)). When the replica
    /// was idle, returns `now`: the owner calls [`StepReplica::finish_step`] then, after the
    /// other arrivals of the same instant, and the first step starts with all of them.
    pub fn dispatch(&mut self, now: f64, job: Job) -> Option<f64> {
        self.stats.served += 1;
        self.in_flight_tokens += u64::from(job.prompt_tokens);
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.seqs.push(Seq::default());
                (self.seqs.len() - 1) as u32
            }
        };
        let seq = &mut self.seqs[slot as usize];
        seq.job = Some(job);
        seq.computed = 0;
        seq.generated = 0;
        seq.new = 0;
        seq.registered = 0;
        seq.admitted_at_computed = 0;
        seq.first_hit = 0;
        seq.blocks.clear();
        seq.first_scheduled = f64::NAN;
        self.waiting.push_back(slot);
        self.record_load(now);
        if self.pending {
            return None;
        }
        self.pending = true;
        Some(now)
    }

    /// Ends the step under way at `now` (the owner calls this at the time it was given),
    /// appending what it did to `out`, and starts the next one. Returns when that one ends.
    pub fn finish_step<S: BlockStore + ?Sized>(
        &mut self,
        now: f64,
        store: &S,
        out: &mut Vec<StepEvent>,
    ) -> Option<f64> {
        self.pending = false;
        if self.stepping {
            self.stepping = false;
            self.apply_step(now, out);
        }
        let next = self.start_step(now, store);
        self.pending = next.is_some();
        next
    }

    /// Books the tokens of the step that has just ended.
    fn apply_step(&mut self, now: f64, out: &mut Vec<StepEvent>) {
        let bs = self.block_size;
        let mut finished = false;
        for i in 0..self.scheduled.len() {
            let slot = self.scheduled[i] as usize;
            let seq = &mut self.seqs[slot];
            let Some(job) = seq.job.as_ref() else {
                continue;
            };
            seq.computed += seq.new;
            seq.new = 0;
            if seq.computed < job.prompt_tokens + seq.generated {
                continue;
            }
            seq.generated += 1;
            self.totals.emitted_tokens += 1;
            if seq.generated == 1 {
                let cached = seq.first_hit;
                let limit = (job.prompt_tokens - 1) / bs * bs;
                out.push(StepEvent::FirstToken {
                    request: job.request,
                    cached_tokens: cached,
                    computed_tokens: job.prompt_tokens - cached,
                    scheduled_at: seq.first_scheduled,
                    full_hit: cached >= limit,
                });
            }
            if seq.generated >= job.output_tokens {
                out.push(StepEvent::Done {
                    request: job.request,
                });
                self.in_flight_tokens = self
                    .in_flight_tokens
                    .saturating_sub(u64::from(job.prompt_tokens));
                self.end_admission(slot);
                self.seqs[slot].job = None;
                self.free_slots.push(slot as u32);
                finished = true;
            }
        }
        if finished {
            let seqs = &self.seqs;
            self.running.retain(|&s| seqs[s as usize].job.is_some());
        }
        self.record_load(now);
    }

    fn blocks_for(&self, tokens: u32) -> usize {
        tokens.div_ceil(self.block_size) as usize
    }

    /// Registers the blocks of sequence `slot` that the step fills, as far as their content
    /// is known: their KV is written before the step's attention reads it, so a sequence
    /// scheduled later in the same step may already hit them.
    fn register_full<S: BlockStore + ?Sized>(&mut self, slot: usize, store: &S) {
        let bs = self.block_size;
        let seq = &mut self.seqs[slot];
        let Some(job) = seq.job.as_ref() else {
            return;
        };
        let full = (seq.computed + seq.new) / bs;
        if full <= seq.registered {
            return;
        }
        let chain = store.full_chain(job);
        let known = (chain.len() as u32).min(full);
        for k in seq.registered..known {
            let stored = self
                .pool
                .register(seq.blocks[k as usize], chain[k as usize]);
            if let (true, Some(changes)) = (stored, &mut self.changes) {
                changes.push(BlockChange::Stored {
                    request: job.request,
                    block: k,
                });
            }
        }
        seq.registered = full;
    }

    /// Books the tokens sequence `slot` computed since it was admitted and frees its blocks,
    /// last block first.
    fn end_admission(&mut self, slot: usize) {
        let seq = &mut self.seqs[slot];
        self.totals.admission_tokens += u64::from(seq.computed - seq.admitted_at_computed);
        for &b in seq.blocks.iter().rev() {
            self.pool.release(b);
        }
        seq.blocks.clear();
    }

    /// Schedules `n` more tokens of sequence `slot` in the step, with the `want` blocks they
    /// need beyond those it holds (the caller checked the pool has them free).
    fn book<S: BlockStore + ?Sized>(
        &mut self,
        slot: usize,
        n: u32,
        want: usize,
        batch: &mut Batch,
        store: &S,
    ) {
        let seq = &mut self.seqs[slot];
        let Some(job) = &seq.job else {
            return;
        };
        let total = job.prompt_tokens + seq.generated;
        for _ in 0..want {
            let (b, evicted) = self
                .pool
                .allocate_evicting()
                .expect("blocks were checked free");
            if let (Some(hash), Some(changes)) = (evicted, &mut self.changes) {
                changes.push(BlockChange::Removed(hash));
            }
            seq.blocks.push(b);
        }
        if is_decode(seq.generated, seq.computed, n, total) {
            batch.decode += 1;
        } else {
            batch.prefill += u64::from(n);
        }
        batch.context += u64::from(seq.computed + n);
        seq.new = n;
        batch.budget -= n;
        self.scheduled.push(slot as u32);
        self.register_full(slot, store);
    }

    /// Frees the newest running sequence's blocks and puts it first in the queue.
    fn preempt_newest(&mut self) {
        let Some(slot) = self.running.pop() else {
            return;
        };
        self.end_admission(slot as usize);
        let seq = &mut self.seqs[slot as usize];
        seq.computed = 0;
        seq.registered = 0;
        seq.admitted_at_computed = 0;
        self.waiting.push_front(slot);
        self.stats.preemptions += 1;
    }

    fn start_step<S: BlockStore + ?Sized>(&mut self, now: f64, store: &S) -> Option<f64> {
        self.scheduled.clear();
        let mut batch = Batch {
            budget: self.params.max_num_batched_tokens,
            prefill: 0,
            decode: 0,
            context: 0,
        };
        let mut preempted = false;

        let mut i = 0;
        while i < self.running.len() && batch.budget > 0 {
            let slot = self.running[i] as usize;
            let seq = &self.seqs[slot];
            let Some(job) = seq.job.as_ref() else {
                i += 1;
                continue;
            };
            let total = job.prompt_tokens + seq.generated;
            let n = (total - seq.computed).min(batch.budget);
            let want = self.blocks_for(seq.computed + n) - seq.blocks.len();
            while self.pool.free() < want && self.running.len() > i + 1 {
                self.preempt_newest();
                preempted = true;
            }
            if self.pool.free() < want {
                self.preempt_newest();
                preempted = true;
                break;
            }
            self.book(slot, n, want, &mut batch, store);
            i += 1;
        }

        while !preempted
            && batch.budget > 0
            && self.running.len() < self.params.max_num_seqs as usize
        {
            let Some(&slot) = self.waiting.front() else {
                break;
            };
            let seq = &self.seqs[slot as usize];
            let Some(job) = seq.job.as_ref() else {
                self.waiting.pop_front();
                continue;
            };
            // Admission needs at least one block beyond its hits (its last token is never
            // cached), so with none free the lookups below could only end in the break.
            if self.pool.free() == 0 {
                break;
            }
            let bs = self.block_size;
            let prompt = job.prompt_tokens;
            let total = prompt + seq.generated;
            let chain = store.full_chain(job);
            let limit = (((total - 1) / bs) as usize).min(chain.len());
            self.hits.clear();
            let mut free_hits = 0;
            for &h in &chain[..limit] {
                match self.pool.lookup(h) {
                    Some(b) => {
                        free_hits += usize::from(self.pool.is_free(b));
                        self.hits.push(b);
                    }
                    None => break,
                }
            }
            let hit_tokens = self.hits.len() as u32 * bs;
            let n = (total - hit_tokens).min(batch.budget);
            let want = self.blocks_for(hit_tokens + n) - self.hits.len();
            if self.pool.free() < want + free_hits {
                break;
            }
            self.waiting.pop_front();
            for &b in &self.hits {
                self.pool.acquire(b);
            }
            let seq = &mut self.seqs[slot as usize];
            seq.blocks.extend_from_slice(&self.hits);
            seq.computed = hit_tokens;
            seq.registered = self.hits.len() as u32;
            seq.admitted_at_computed = hit_tokens;
            if seq.first_scheduled.is_nan() {
                seq.first_scheduled = now;
                seq.first_hit = hit_tokens;
                self.stats.cached_tokens += u64::from(hit_tokens);
                self.stats.prefill_tokens_computed += u64::from(prompt - hit_tokens);
            } else {
                self.stats.recomputed_tokens += u64::from(total - hit_tokens);
            }
            self.running.push(slot);
            self.book(slot as usize, n, want, &mut batch, store);
        }

        self.stats.evictions = self.pool.evictions();
        if self.scheduled.is_empty() {
            debug_assert!(
                self.running.is_empty() && self.waiting.is_empty(),
                "work left but nothing could be scheduled"
            );
            return None;
        }
        let in_use = self.pool.in_use() as u64;
        self.totals.peak_blocks = self.totals.peak_blocks.max(in_use);
        self.totals.steps += 1;
        self.totals.step_tokens += batch.prefill + batch.decode;
        let dt = self
            .params
            .step_ms(batch.prefill, batch.decode, batch.context);
        self.stats.busy_ms += dt;
        self.stats.kv_usage_ms += dt * in_use as f64 / self.pool.capacity() as f64;
        self.stats.batch_seq_ms += dt * self.scheduled.len() as f64;
        self.stepping = true;
        Some(now + dt)
    }

    /// Checks the model's conservation laws once every request has finished: tokens computed
    /// by steps equal tokens computed by sequences, and every block is back in the pool.
    pub fn check_drained(&self) -> Result<(), String> {
        let t = &self.totals;
        if t.step_tokens != t.admission_tokens {
            return Err(format!(
                "steps computed {} tokens, sequences {}",
                t.step_tokens, t.admission_tokens
            ));
        }
        let live = self.seqs.iter().filter(|s| s.job.is_some()).count();
        if live == 0 && self.pool.in_use() != 0 {
            return Err(format!(
                "{} blocks still held with no sequence left",
                self.pool.in_use()
            ));
        }
        Ok(())
    }

    fn record_load(&mut self, now: f64) {
        let load = (self.running.len() + self.waiting.len()) as u32;
        self.stats.record_load(now, load, true);
    }
}

/// Whether `n` tokens scheduled for a sequence that has `computed` of its `total` tokens
/// computed and `generated` emitted are one decode (rather than a prefill or recompute chunk).
fn is_decode(generated: u32, computed: u32, n: u32, total: u32) -> bool {
    generated > 0 && n == 1 && computed + 1 == total
}

#[cfg(test)]
mod tests;
