//! The model of one model-server replica: admission to a bounded batch, serial prefill that
//! skips the cached prefix, concurrent decode, and the prefix cache it fills.
//!
//! A request sent to a replica takes a batch slot if fewer than `maxRunningSequences` are
//! taken, otherwise it waits in a FIFO queue for one. Admitted requests are prefilled one at a
//! time, in admission order, at `prefillTokensPerSecond`. When a prefill starts, the replica
//! looks up the request's full-block hash chain in its cache; the longest cached prefix is
//! free and only the remaining prompt tokens are charged (a partial last block is never cached,
//! so it is always computed). When the prefill ends the request has its first token and its
//! full blocks enter the cache. It then decodes its remaining `output_tokens - 1` tokens at
//! `decodeTokensPerSecond`, independently of other sequences, and frees its slot. Generated
//! tokens are not cached.
//!
//! The model has no clock of its own: every call names its `now` in milliseconds and returns
//! the times at which the caller must call back, so the simulator's event loop and the
//! `mock-replica` server on the real clock drive the same code.

use super::config::FleetConfig;
use super::kv_cache::BlockCache;
use super::router::ReplicaState;
use std::collections::VecDeque;
use std::ops::Range;

/// Where a replica reads a job's full-block hash chain: the simulator keeps every request's
/// chain in one vector (`Job::blocks` indexes it); a long-running owner can keep one chain per
/// live job instead.
pub trait BlockStore {
    /// The prompt's full-block chain.
    fn chain(&self, job: &Job) -> &[u64];
    /// The prompt's chain continued over the blocks its output tokens fill, as far as the
    /// output's tokens are known (a multi-turn session's next turn repeats the answer).
    fn full_chain(&self, job: &Job) -> &[u64] {
        self.chain(job)
    }
}

impl BlockStore for [u64] {
    fn chain(&self, job: &Job) -> &[u64] {
        &self[job.blocks.clone()]
    }

    fn full_chain(&self, job: &Job) -> &[u64] {
        &self[job.blocks.start..job.chain_end.max(job.blocks.end)]
    }
}

impl BlockStore for Vec<u64> {
    fn chain(&self, job: &Job) -> &[u64] {
        self.as_slice().chain(job)
    }

    fn full_chain(&self, job: &Job) -> &[u64] {
        self.as_slice().full_chain(job)
    }
}

/// A request as a replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// The engine's index of the request.
    pub request: usize,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// The request's full-block hash chain, as a range of the engine's hash store (a
    /// [`BlockStore`] other than a slice may ignore it).
    pub blocks: Range<usize>,
    /// Where the chain continued over the output's blocks ends in the store (`blocks.end`
    /// when the output's tokens are not known).
    pub chain_end: usize,
}

/// A prefill that has just started.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillStart {
    pub request: usize,
    pub cached_tokens: u32,
    pub computed_tokens: u32,
    /// When its first token is out.
    pub done_at: f64,
}

/// A prefill that has just ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillEnd {
    pub request: usize,
    /// When its last token is out.
    pub done_at: f64,
}

/// One simulated replica.
#[derive(Debug)]
pub struct Replica {
    cache: BlockCache,
    block_size: u64,
    capacity_blocks: u64,
    prefill_ms_per_token: f64,
    decode_ms_per_token: f64,
    max_running: u32,
    /// Requests waiting for a batch slot.
    waiting: VecDeque<Job>,
    /// Admitted requests waiting for the prefill engine.
    prefill_queue: VecDeque<Job>,
    prefilling: Option<Job>,
    running: u32,
    footprint_blocks: u64,
    in_flight_tokens: u64,
    stats: ReplicaStats,
    /// Whether `stats.load_points` grows; off for a replica that runs indefinitely.
    load_history: bool,
    /// When the occupancy last changed, and the running count and KV usage since then.
    last_change: f64,
    held: (u32, f64),
}

/// What a replica did over a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplicaStats {
    pub prefill_tokens_computed: u64,
    pub cached_tokens: u64,
    /// Requests dispatched to the replica.
    pub served: u64,
    /// Highest running + waiting.
    pub peak_load: u32,
    /// `(time, running + waiting)` at every change.
    pub load_points: Vec<(f64, u32)>,
    /// Sequences preempted to free KV blocks (step engine; 0 under fixed rate).
    pub preemptions: u64,
    /// Cached blocks dropped to make room.
    pub evictions: u64,
    /// Tokens computed again after a preemption.
    pub recomputed_tokens: u64,
    /// Time spent working: in steps (step engine), with a sequence admitted (fixed rate).
    pub busy_ms: f64,
    /// Integral of the KV usage (0..=1) over time, in ms.
    pub kv_usage_ms: f64,
    /// Integral of the sequences in the batch over time, in ms.
    pub batch_seq_ms: f64,
}

impl ReplicaStats {
    /// Notes the occupancy `load` (running + waiting) at `now`, in `load_points` when
    /// `history`.
    pub(crate) fn record_load(&mut self, now: f64, load: u32, history: bool) {
        self.peak_load = self.peak_load.max(load);
        if !history {
            return;
        }
        match self.load_points.last_mut() {
            Some(last) if last.0 == now => last.1 = load,
            Some(last) if last.1 == load => {}
            _ => self.load_points.push((now, load)),
        }
    }
}

impl Replica {
    /// An idle replica with an empty cache. `cfg` is assumed validated.
    pub fn new(cfg: &FleetConfig) -> Self {
        Replica {
            cache: BlockCache::new(cfg.cache_capacity_blocks),
            block_size: cfg.block_size_tokens.max(1) as u64,
            capacity_blocks: cfg.cache_capacity_blocks.max(1) as u64,
            prefill_ms_per_token: 1000.0 / cfg.prefill_tokens_per_second,
            decode_ms_per_token: 1000.0 / cfg.decode_tokens_per_second,
            max_running: cfg.max_running_sequences.max(1),
            waiting: VecDeque::new(),
            prefill_queue: VecDeque::new(),
            prefilling: None,
            running: 0,
            footprint_blocks: 0,
            in_flight_tokens: 0,
            stats: ReplicaStats::default(),
            load_history: true,
            last_change: 0.0,
            held: (0, 0.0),
        }
    }

    /// The same replica without `load_points` (`peak_load` is still kept), so its memory stays
    /// bounded however long it runs.
    pub fn without_load_history(mut self) -> Self {
        self.load_history = false;
        self
    }

    /// Keeps the cache's stores and evictions for [`Replica::take_cache_changes`].
    pub fn keeping_cache_changes(mut self) -> Self {
        self.cache.keep_changes();
        self
    }

    /// The cache's stores and evictions since the last call, in order.
    pub fn take_cache_changes(&mut self) -> Vec<super::kv_cache::CacheChange> {
        self.cache.take_changes()
    }

    /// The prefix cache.
    pub fn cache(&self) -> &BlockCache {
        &self.cache
    }

    /// Empties the prefix cache (an engine resetting it, e.g. after loading new weights).
    pub fn clear_cache(&mut self) {
        self.cache.clear();
    }

    /// The request whose prefill is running, if any.
    pub fn prefilling(&self) -> Option<usize> {
        self.prefilling.as_ref().map(|job| job.request)
    }

    /// The router's view of this replica.
    pub fn state(&self) -> ReplicaState {
        ReplicaState {
            running: self.running,
            waiting: self.waiting.len() as u32,
            kv_usage: (self.footprint_blocks as f64 / self.capacity_blocks as f64).min(1.0),
            in_flight_tokens: self.in_flight_tokens,
            in_flight: self.load(),
        }
    }

    pub fn load(&self) -> u32 {
        self.running + self.waiting.len() as u32
    }

    pub fn stats(&self) -> &ReplicaStats {
        &self.stats
    }

    /// Takes a request routed here at `now`. Returns the prefill it starts, if the replica was
    /// idle enough to start one at once.
    pub fn dispatch<S: BlockStore + ?Sized>(
        &mut self,
        now: f64,
        job: Job,
        store: &S,
    ) -> Option<PrefillStart> {
        self.stats.served += 1;
        self.in_flight_tokens += u64::from(job.prompt_tokens);
        if self.running < self.max_running {
            self.admit(job);
        } else {
            self.waiting.push_back(job);
        }
        self.record_load(now);
        self.start_prefill(now, store)
    }

    /// Ends the current prefill at `now` (the engine calls this at the `done_at` it was given).
    /// Returns the ended prefill, if one was running, and the next prefill it starts.
    pub fn finish_prefill<S: BlockStore + ?Sized>(
        &mut self,
        now: f64,
        store: &S,
    ) -> (Option<PrefillEnd>, Option<PrefillStart>) {
        let Some(job) = self.prefilling.take() else {
            return (None, None);
        };
        self.cache.insert_chain(store.chain(&job));
        let decode_ms = f64::from(job.output_tokens.saturating_sub(1)) * self.decode_ms_per_token;
        let end = PrefillEnd {
            request: job.request,
            done_at: now + decode_ms,
        };
        (Some(end), self.start_prefill(now, store))
    }

    /// The request in `job` produced its last token at `now`: frees its slot and admits the
    /// next waiting request. Returns the prefill that starts as a result, if any.
    pub fn complete<S: BlockStore + ?Sized>(
        &mut self,
        now: f64,
        job: &Job,
        store: &S,
    ) -> Option<PrefillStart> {
        self.release_slot(job);
        if self.running < self.max_running {
            if let Some(next) = self.waiting.pop_front() {
                self.admit(next);
            }
        }
        self.record_load(now);
        self.start_prefill(now, store)
    }

    /// Withdraws `job` at `now` wherever it is: a waiting request leaves the queue; an admitted
    /// one gives its slot back, its prefill abandoned if queued or running (nothing enters the
    /// cache) and its decode cut short otherwise. Returns the prefill that starts as a result.
    /// The simulator never cancels; a live owner does when a client goes away.
    pub fn cancel<S: BlockStore + ?Sized>(
        &mut self,
        now: f64,
        job: &Job,
        store: &S,
    ) -> Option<PrefillStart> {
        if let Some(at) = self.waiting.iter().position(|j| j.request == job.request) {
            self.waiting.remove(at);
            self.in_flight_tokens = self
                .in_flight_tokens
                .saturating_sub(u64::from(job.prompt_tokens));
            self.record_load(now);
            return None;
        }
        if let Some(at) = self
            .prefill_queue
            .iter()
            .position(|j| j.request == job.request)
        {
            self.prefill_queue.remove(at);
        } else if self.prefilling.as_ref().map(|j| j.request) == Some(job.request) {
            self.prefilling = None;
        }
        self.complete(now, job, store)
    }

    fn release_slot(&mut self, job: &Job) {
        self.running = self.running.saturating_sub(1);
        self.footprint_blocks = self.footprint_blocks.saturating_sub(self.footprint_of(job));
        self.in_flight_tokens = self
            .in_flight_tokens
            .saturating_sub(u64::from(job.prompt_tokens));
    }

    fn admit(&mut self, job: Job) {
        self.running += 1;
        self.footprint_blocks += self.footprint_of(&job);
        self.prefill_queue.push_back(job);
    }

    fn footprint_of(&self, job: &Job) -> u64 {
        (u64::from(job.prompt_tokens) + u64::from(job.output_tokens)).div_ceil(self.block_size)
    }

    fn start_prefill<S: BlockStore + ?Sized>(
        &mut self,
        now: f64,
        store: &S,
    ) -> Option<PrefillStart> {
        if self.prefilling.is_some() {
            return None;
        }
        let job = self.prefill_queue.pop_front()?;
        let chain = store.chain(&job);
        let matched = self.cache.matched_prefix(chain);
        for &h in &chain[..matched] {
            self.cache.touch(h);
        }
        let cached = (matched as u64 * self.block_size).min(u64::from(job.prompt_tokens)) as u32;
        let computed = job.prompt_tokens - cached;
        self.stats.cached_tokens += u64::from(cached);
        self.stats.prefill_tokens_computed += u64::from(computed);
        let start = PrefillStart {
            request: job.request,
            cached_tokens: cached,
            computed_tokens: computed,
            done_at: now + f64::from(computed) * self.prefill_ms_per_token,
        };
        self.prefilling = Some(job);
        Some(start)
    }

    fn record_load(&mut self, now: f64) {
        // The state held since the last change, integrated before it changes.
        let held = (now - self.last_change).max(0.0);
        let (running, kv_usage) = self.held;
        if running > 0 {
            self.stats.busy_ms += held;
        }
        self.stats.kv_usage_ms += held * kv_usage;
        self.stats.batch_seq_ms += held * f64::from(running);
        self.last_change = self.last_change.max(now);
        self.held = (self.running, self.state().kv_usage);
        self.stats.evictions = self.cache.evictions();
        let load = self.load();
        self.stats.record_load(now, load, self.load_history);
    }
}

/// Appends `chain` to `store` and returns the job over it, its first `prompt_blocks` blocks
/// the prompt's, the rest its output's.
#[cfg(test)]
pub(crate) fn job_in(
    store: &mut Vec<u64>,
    request: usize,
    prompt: u32,
    output: u32,
    chain: &[u64],
    prompt_blocks: usize,
) -> Job {
    let start = store.len();
    store.extend_from_slice(chain);
    Job {
        request,
        prompt_tokens: prompt,
        output_tokens: output,
        blocks: start..start + prompt_blocks,
        chain_end: store.len(),
    }
}

#[cfg(test)]
mod tests;
