//! The replica model on the real clock: one owner task holds the simulator's [`Replica`],
//! feeds it submissions and cancellations from request handlers, fires its prefill and decode
//! deadlines with tokio timers, and tells each handler when its sequences reach their first
//! and last token. It also keeps the counters `/metrics` reports.
//!
//! [`Model`] itself is clock-free (every call names `now` in ms), so it is tested on explicit
//! times; [`spawn`] runs it against milliseconds since start.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use switchyard_plugin_api::kv::KvEvent;

use super::kv_publish::{Publish, Publisher};
use crate::sim::kv_cache::CacheChange;
use crate::sim::kv_events::cache_events;
use crate::sim::replica::{BlockStore, Job, PrefillStart, Replica};
use crate::sim::FleetConfig;

/// One sequence to run: a prompt of a request, already hashed.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// Unique over the server's life.
    pub id: usize,
    /// The choice it answers within its request.
    pub index: usize,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// Full-block hash chain of the prompt.
    pub chain: Vec<u64>,
    /// The tokens of the chain's blocks, for the KV events that announce them.
    pub tokens: Vec<u32>,
    pub cache_salt: String,
}

/// What a handler hears about its sequences.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Progress {
    /// Prefill ended at `at_ms`: the first token is out.
    First {
        index: usize,
        at_ms: f64,
        cached_tokens: u32,
    },
    /// The last token is out.
    Done { index: usize, at_ms: f64 },
}

/// Load and counters for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Snapshot {
    pub running: u32,
    pub waiting: u32,
    pub kv_usage: f64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries: u64,
    /// Of those, tokens found cached.
    pub prefix_hits: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub successes: u64,
}

/// Messages to the owner task.
#[derive(Debug)]
pub enum Command {
    Submit {
        jobs: Vec<NewJob>,
        progress: mpsc::UnboundedSender<Progress>,
    },
    /// Withdraw these sequences if still live (unknown ids are ignored).
    Cancel(Vec<usize>),
    Snapshot(oneshot::Sender<Snapshot>),
    /// Empty the prefix cache (vLLM's `/reset_prefix_cache`).
    ClearCache,
}

/// Live jobs' chains, keyed by job id.
#[derive(Default)]
struct Chains(HashMap<usize, Vec<u64>>);

impl BlockStore for Chains {
    fn chain(&self, job: &Job) -> &[u64] {
        self.0.get(&job.request).map_or(&[], Vec::as_slice)
    }
}

struct Live {
    job: Job,
    index: usize,
    progress: mpsc::UnboundedSender<Progress>,
    cached_tokens: u32,
    first_at: Option<f64>,
    tokens: Vec<u32>,
    cache_salt: String,
}

/// The replica and everything needed to drive it.
pub struct Model {
    replica: Replica,
    chains: Chains,
    live: HashMap<usize, Live>,
    decode_ms_per_token: f64,
    /// When the running prefill ends, if one runs.
    prefill_due: Option<f64>,
    /// `(done_at, id)` of decoding sequences; cancelled ones are skipped when they surface.
    decode_due: BinaryHeap<Reverse<(OrderedMs, usize)>>,
    counters: Snapshot,
    /// Where the cache's stores and evictions are announced, when they are.
    events: Option<Events>,
}

/// How the model announces its cache's changes.
struct Events {
    publish: Publisher,
    block_size: usize,
    /// Mixed into every announced block hash, so the hashes cannot be recomputed outside this
    /// process (as an engine's, seeded per process, cannot).
    nonce: u64,
}

/// A finite, non-negative time in ms, ordered by value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct OrderedMs(u64);

impl OrderedMs {
    fn new(ms: f64) -> Self {
        // Non-negative finite floats order like their bit patterns.
        OrderedMs(if ms.is_finite() && ms > 0.0 { ms } else { 0.0 }.to_bits())
    }

    fn get(self) -> f64 {
        f64::from_bits(self.0)
    }
}

impl Model {
    /// An idle replica with an empty cache; `cfg` is assumed validated.
    pub fn new(cfg: &FleetConfig) -> Self {
        Model {
            replica: Replica::new(cfg).without_load_history(),
            chains: Chains::default(),
            live: HashMap::new(),
            decode_ms_per_token: 1000.0 / cfg.decode_tokens_per_second,
            prefill_due: None,
            decode_due: BinaryHeap::new(),
            counters: Snapshot::default(),
            events: None,
        }
    }

    /// Announces every store and eviction of the cache through `publish`.
    pub fn publishing(mut self, cfg: &FleetConfig, publish: Publisher) -> Self {
        self.replica =
            std::mem::replace(&mut self.replica, Replica::new(cfg)).keeping_cache_changes();
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x5eed, |d| d.as_nanos() as u64)
            | 1;
        self.events = Some(Events {
            publish,
            block_size: cfg.block_size_tokens,
            nonce,
        });
        self
    }

    /// Empties the prefix cache and announces it.
    pub fn clear_cache(&mut self) {
        self.replica.clear_cache();
        if let Some(events) = &self.events {
            let _ = events
                .publish
                .send(Publish::Events(vec![KvEvent::AllBlocksCleared]));
        }
    }

    pub fn submit(
        &mut self,
        now: f64,
        jobs: Vec<NewJob>,
        progress: &mpsc::UnboundedSender<Progress>,
    ) {
        for new in jobs {
            let job = Job {
                request: new.id,
                prompt_tokens: new.prompt_tokens,
                output_tokens: new.output_tokens,
                blocks: 0..new.chain.len(),
                chain_end: new.chain.len(),
            };
            self.chains.0.insert(new.id, new.chain);
            self.live.insert(
                new.id,
                Live {
                    job: job.clone(),
                    index: new.index,
                    progress: progress.clone(),
                    cached_tokens: 0,
                    first_at: None,
                    tokens: new.tokens,
                    cache_salt: new.cache_salt,
                },
            );
            let started = self.replica.dispatch(now, job, &self.chains);
            self.started(started);
        }
        self.advance(now);
    }

    pub fn cancel(&mut self, now: f64, ids: &[usize]) {
        for id in ids {
            let Some(live) = self.live.remove(id) else {
                continue;
            };
            if let Some(first) = live.first_at {
                let decoded = 1.0 + ((now - first) / self.decode_ms_per_token).floor();
                let produced = decoded.clamp(0.0, f64::from(live.job.output_tokens));
                self.counters.generation_tokens += produced as u64;
            }
            let started = self.replica.cancel(now, &live.job, &self.chains);
            self.chains.0.remove(id);
            self.started(started);
        }
        self.advance(now);
    }

    /// Fires every deadline at or before `now`.
    pub fn advance(&mut self, now: f64) {
        loop {
            let prefill = self.prefill_due.filter(|&t| t <= now);
            let decode = self
                .decode_due
                .peek()
                .map(|Reverse((t, _))| t.get())
                .filter(|&t| t <= now);
            match (prefill, decode) {
                (Some(p), Some(d)) if d < p => self.decode_done(now),
                (Some(_), _) => self.prefill_done(now),
                (None, Some(_)) => self.decode_done(now),
                (None, None) => return,
            }
        }
    }

    /// The earliest pending deadline.
    pub fn next_deadline(&self) -> Option<f64> {
        let decode = self.decode_due.peek().map(|Reverse((t, _))| t.get());
        match (self.prefill_due, decode) {
            (Some(p), Some(d)) => Some(p.min(d)),
            (p, d) => p.or(d),
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        let state = self.replica.state();
        Snapshot {
            running: state.running,
            waiting: state.waiting,
            kv_usage: state.kv_usage,
            ..self.counters
        }
    }

    fn prefill_done(&mut self, now: f64) {
        self.prefill_due = None;
        let (ended, started) = self.replica.finish_prefill(now, &self.chains);
        if let (Some(end), Some(events)) = (&ended, &self.events) {
            let changes = self.replica.take_cache_changes();
            let chain = self
                .chains
                .0
                .get(&end.request)
                .map_or(&[][..], Vec::as_slice);
            if let Some(live) = self.live.get(&end.request) {
                let announced = events.announce(&changes, chain, &live.tokens, &live.cache_salt);
                if !announced.is_empty() {
                    let _ = events.publish.send(Publish::Events(announced));
                }
            }
        }
        if let Some(end) = ended {
            if let Some(live) = self.live.get_mut(&end.request) {
                live.first_at = Some(now);
                let _ = live.progress.send(Progress::First {
                    index: live.index,
                    at_ms: now,
                    cached_tokens: live.cached_tokens,
                });
                self.decode_due
                    .push(Reverse((OrderedMs::new(end.done_at), end.request)));
            }
        }
        self.started(started);
    }

    fn decode_done(&mut self, now: f64) {
        let Some(Reverse((_, id))) = self.decode_due.pop() else {
            return;
        };
        let Some(live) = self.live.remove(&id) else {
            return;
        };
        let started = self.replica.complete(now, &live.job, &self.chains);
        self.chains.0.remove(&id);
        self.counters.successes += 1;
        self.counters.generation_tokens += u64::from(live.job.output_tokens);
        let _ = live.progress.send(Progress::Done {
            index: live.index,
            at_ms: now,
        });
        self.started(started);
    }

    /// Books a prefill that has just started (if any) and keeps `prefill_due` in step with
    /// the replica.
    fn started(&mut self, started: Option<PrefillStart>) {
        if let Some(s) = started {
            let prompt = u64::from(s.cached_tokens) + u64::from(s.computed_tokens);
            self.counters.prefix_queries += prompt;
            self.counters.prefix_hits += u64::from(s.cached_tokens);
            self.counters.prompt_tokens += prompt;
            if let Some(live) = self.live.get_mut(&s.request) {
                live.cached_tokens = s.cached_tokens;
            }
            self.prefill_due = Some(s.done_at);
        }
        if self.replica.prefilling().is_none() {
            self.prefill_due = None;
        }
    }
}

/// Milliseconds since `start`.
pub fn ms_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1000.0
}

/// The instant `ms` after `start`, capped a day ahead (rates can make times huge).
pub fn instant_at(start: Instant, ms: f64) -> Instant {
    let ms = if ms.is_finite() { ms.max(0.0) } else { 0.0 };
    let delay = Duration::try_from_secs_f64(ms / 1000.0)
        .unwrap_or(Duration::MAX)
        .min(Duration::from_secs(86_400) + start.elapsed());
    start + delay
}

impl Events {
    fn engine_hash(&self, hash: u64) -> u64 {
        hash.rotate_left(17) ^ self.nonce
    }

    /// The events announcing `changes`, made while `chain` (with `tokens`) entered the
    /// cache (see [`cache_events`]).
    fn announce(
        &self,
        changes: &[CacheChange],
        chain: &[u64],
        tokens: &[u32],
        cache_salt: &str,
    ) -> Vec<KvEvent> {
        cache_events(changes, chain, tokens, cache_salt, self.block_size, |h| {
            self.engine_hash(h)
        })
    }
}

/// Runs the model on the real clock until every sender is gone; announces the cache's
/// changes through `publish` when given.
pub fn spawn(
    cfg: &FleetConfig,
    start: Instant,
    publish: Option<Publisher>,
) -> mpsc::UnboundedSender<Command> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut model = Model::new(cfg);
    if let Some(publish) = publish {
        model = model.publishing(cfg, publish);
    }
    tokio::spawn(async move {
        loop {
            model.advance(ms_since(start));
            let deadline = model.next_deadline().map(|t| instant_at(start, t));
            let command = tokio::select! {
                command = rx.recv() => match command {
                    Some(command) => command,
                    None => return,
                },
                _ = async {
                    match deadline {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => continue,
            };
            let now = ms_since(start);
            model.advance(now);
            match command {
                Command::Submit { jobs, progress } => model.submit(now, jobs, &progress),
                Command::Cancel(ids) => model.cancel(now, &ids),
                Command::Snapshot(reply) => {
                    let _ = reply.send(model.snapshot());
                }
                Command::ClearCache => model.clear_cache(),
            }
        }
    });
    tx
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_plugin_api::kv::{Medium, RemovedBlocks, StoredBlocks};

    fn cfg() -> FleetConfig {
        FleetConfig {
            replicas: 1,
            block_size_tokens: 4,
            cache_capacity_blocks: 100,
            // 1 ms per prompt token, 10 ms per output token.
            prefill_tokens_per_second: 1000.0,
            decode_tokens_per_second: 100.0,
            max_running_sequences: 2,
        }
    }

    fn job(id: usize, prompt: u32, output: u32, chain: &[u64]) -> NewJob {
        NewJob {
            id,
            index: 0,
            prompt_tokens: prompt,
            output_tokens: output,
            chain: chain.to_vec(),
            tokens: Vec::new(),
            cache_salt: String::new(),
        }
    }

    fn drain(rx: &mut mpsc::UnboundedReceiver<Progress>) -> Vec<Progress> {
        let mut out = Vec::new();
        while let Ok(p) = rx.try_recv() {
            out.push(p);
        }
        out
    }

    #[test]
    fn a_request_reaches_first_and_last_token_on_the_model_times() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut m = Model::new(&cfg());
        m.submit(0.0, vec![job(1, 8, 3, &[11, 12])], &tx);
        assert_eq!(m.next_deadline(), Some(8.0));
        assert_eq!(m.snapshot().running, 1);
        m.advance(8.0);
        assert_eq!(
            drain(&mut rx),
            vec![Progress::First {
                index: 0,
                at_ms: 8.0,
                cached_tokens: 0
            }]
        );
        assert_eq!(m.next_deadline(), Some(28.0));
        m.advance(28.0);
        assert_eq!(
            drain(&mut rx),
            vec![Progress::Done {
                index: 0,
                at_ms: 28.0
            }]
        );
        let s = m.snapshot();
        assert_eq!((s.running, s.successes, s.generation_tokens), (0, 1, 3));
        assert_eq!(
            (s.prompt_tokens, s.prefix_queries, s.prefix_hits),
            (8, 8, 0)
        );
        assert_eq!(m.next_deadline(), None);
    }

    #[test]
    fn a_repeated_prompt_hits_the_cache() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut m = Model::new(&cfg());
        m.submit(0.0, vec![job(1, 9, 1, &[11, 12])], &tx);
        m.advance(9.0);
        m.submit(10.0, vec![job(2, 9, 1, &[11, 12])], &tx);
        // Two full blocks cached; the partial ninth token is computed.
        assert_eq!(m.next_deadline(), Some(11.0));
        m.advance(11.0);
        let cached: Vec<u32> = drain(&mut rx)
            .into_iter()
            .filter_map(|p| match p {
                Progress::First { cached_tokens, .. } => Some(cached_tokens),
                Progress::Done { .. } => None,
            })
            .collect();
        assert_eq!(cached, vec![0, 8]);
        let s = m.snapshot();
        assert_eq!((s.prefix_queries, s.prefix_hits, s.successes), (18, 8, 2));
    }

    #[test]
    fn cancelling_releases_the_slot_and_drops_stale_deadlines() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut m = Model::new(&cfg());
        m.submit(0.0, vec![job(1, 4, 100, &[1]), job(2, 4, 100, &[2])], &tx);
        m.submit(0.0, vec![job(3, 4, 1, &[3])], &tx);
        assert_eq!((m.snapshot().running, m.snapshot().waiting), (2, 1));
        m.advance(4.0);
        // 1 is decoding, 2 prefilling; cancel both, 3 gets a slot and starts.
        m.cancel(5.0, &[1, 2]);
        assert_eq!((m.snapshot().running, m.snapshot().waiting), (1, 0));
        assert_eq!(m.next_deadline(), Some(9.0));
        m.advance(9.0);
        m.cancel(9.5, &[1, 2, 42]);
        m.advance(2000.0);
        let done: Vec<Progress> = drain(&mut rx)
            .into_iter()
            .filter(|p| matches!(p, Progress::Done { .. }))
            .collect();
        assert_eq!(done.len(), 1, "only 3 completes: {done:?}");
        let s = m.snapshot();
        assert_eq!((s.running, s.waiting, s.successes), (0, 0, 1));
        // 1 produced its first token only; 3 its single one.
        assert_eq!(s.generation_tokens, 2);
        assert_eq!(m.next_deadline(), None);
    }

    #[test]
    fn new_blocks_are_announced_as_chained_stores_after_the_evictions() {
        let (commands, _rx) = mpsc::unbounded_channel();
        let events = Events {
            publish: Publisher::new(commands),
            block_size: 2,
            nonce: 0,
        };
        // Blocks 10 and 11 were cached; 12 and 13 are new; 99 made room for them.
        let changes = [
            CacheChange::Evicted(99),
            CacheChange::Stored(13),
            CacheChange::Stored(12),
        ];
        let announced = events.announce(&changes, &[10, 11, 12, 13], &[1, 2, 3, 4, 5, 6, 7, 8], "");
        let hash = |h: u64| events.engine_hash(h);
        assert_eq!(
            announced,
            [
                KvEvent::BlockRemoved(RemovedBlocks {
                    block_hashes: vec![hash(99)],
                    medium: Medium::Gpu,
                }),
                KvEvent::BlockStored(StoredBlocks {
                    block_hashes: vec![hash(12), hash(13)],
                    parent_block_hash: Some(hash(11)),
                    token_ids: vec![5, 6, 7, 8],
                    block_size: 2,
                    ..StoredBlocks::default()
                }),
            ]
        );
        // A salted chain from its start carries the salt on its first block.
        let changes = [CacheChange::Stored(21), CacheChange::Stored(20)];
        let announced = events.announce(&changes, &[20, 21], &[1, 2, 3, 4], "tenant");
        let KvEvent::BlockStored(stored) = &announced[0] else {
            panic!("{announced:?}");
        };
        assert_eq!(stored.parent_block_hash, None);
        assert_eq!(stored.extra_keys, [Some(vec!["tenant".to_string()]), None]);
    }
}
