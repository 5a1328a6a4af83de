//! The discrete-event loop: arrivals, router polls and wakeups, replica prefill and decode
//! completions, and the replicas' KV-cache events on their way to a router that reads them,
//! in virtual time. It also checks each decision's prefix prediction against what the chosen
//! replica had cached when the request's prefill was scheduled.

use super::fleet::{Profile, SimFleet};
use super::kv_events::{cache_events, step_events, ChainSource, EventQueue};
use super::replica::{Job, PrefillStart, Replica, ReplicaStats};
use super::report::PipelineReport;
use super::router::{Decision, ReplicaState, SimRequest, SimRouter, Tokens};
use super::stepper::{BlockChange, StepEvent, StepReplica};
use crate::pipeline::{Predicted, Sums};
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::iter::Peekable;
use std::ops::Range;
use std::sync::Arc;
use switchyard_prefix_hashing::{hash_prompt_into, prompt_seed};

/// After this many wakeups at one instant that decide nothing, wakeups at that instant are no
/// longer honoured, so a router that keeps asking for "now" cannot stall the run.
const MAX_IDLE_WAKEUPS_PER_INSTANT: u32 = 1000;

/// Where a request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Submitted to the router, no decision yet.
    Pending,
    /// Refused by the router, or a duplicate id turned away on arrival.
    Rejected,
    /// Sent to a replica that refused it (longer than its whole KV pool).
    Refused,
    /// Sent to a replica, not finished.
    Dispatched,
    Completed,
}

/// What happened to one request (times in ms; `NaN` where it did not happen), with the tags
/// of the request the report needs once its tokens are gone.
#[derive(Debug, Clone)]
pub(crate) struct RequestRecord {
    pub id: u64,
    pub arrival_ms: f64,
    pub group: u64,
    pub step: Option<u32>,
    pub status: Status,
    pub replica: Option<usize>,
    pub decided_ms: f64,
    /// When its prefill was first scheduled on the replica (the end of its queue wait).
    pub scheduled_ms: f64,
    pub first_token_ms: f64,
    pub done_ms: f64,
    pub cached_tokens: u32,
    pub computed_tokens: u32,
    /// Whether the prefix hit was as long as the replica's model allows.
    pub full_hit: bool,
    pub job: Job,
}

/// A replica under one of the two models.
#[derive(Debug)]
pub(crate) enum SimReplica {
    Fixed(Replica),
    Stepped(StepReplica),
}

impl SimReplica {
    /// A replica of `profile`; one whose cache changes are `announced` keeps them for
    /// [`Sim::publish_step`] and [`Sim::prefill_done`].
    fn new(profile: &Profile, block_size: usize, announced: bool) -> SimReplica {
        match profile {
            Profile::FixedRate(cfg) => {
                let replica = Replica::new(&super::config::FleetConfig {
                    block_size_tokens: block_size,
                    ..cfg.clone()
                });
                SimReplica::Fixed(if announced {
                    replica.keeping_cache_changes()
                } else {
                    replica
                })
            }
            Profile::Engine(params) => {
                let mut replica = StepReplica::new(params, block_size);
                if announced {
                    replica.keep_block_changes();
                }
                SimReplica::Stepped(replica)
            }
        }
    }

    fn state(&self) -> ReplicaState {
        match self {
            SimReplica::Fixed(r) => r.state(),
            SimReplica::Stepped(r) => r.state(),
        }
    }

    pub fn stats(&self) -> &ReplicaStats {
        match self {
            SimReplica::Fixed(r) => r.stats(),
            SimReplica::Stepped(r) => r.stats(),
        }
    }
}

/// Everything the report is computed from.
pub(crate) struct RunOutcome {
    /// One per request of the workload, in arrival order.
    pub records: Vec<RequestRecord>,
    pub replicas: Vec<SimReplica>,
    /// TTFT and time-per-output-token objectives, ms.
    pub objectives: (f64, f64),
    /// Distinct full-block hashes of the prompts the replicas took, less those a replica
    /// could have cached from a taken request's output (see [`ideal_blocks`]).
    pub ideal_blocks: u64,
    pub block_size: usize,
    pub end_ms: f64,
    /// Per producer of prefix predictions, in the order they were first checked: the
    /// requests checked and their token sums.
    pub predictions: Vec<(String, u64, Sums)>,
}

#[derive(Debug, Clone, Copy)]
enum EventKind {
    /// Arrivals are taken from the workload in order, not from the queue.
    Arrival,
    Wakeup,
    PrefillDone(usize),
    DecodeDone(usize),
    /// A step of replica r ends.
    StepDone(usize),
    /// A batch of KV-cache events reaches the router.
    KvDue,
}

#[derive(Debug, Clone, Copy)]
struct Event {
    at: f64,
    seq: u64,
    kind: EventKind,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Event {}

impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Event {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at.total_cmp(&other.at).then(self.seq.cmp(&other.seq))
    }
}

/// Simulates `workload` on the fleet described by `fleet` (which should have passed
/// [`FleetConfig::validate`]) with `router` deciding placements, and reports the outcome.
///
/// Events at the same virtual time are processed in the order they were scheduled; arrivals
/// come first, in workload order (requests arriving at the same time keep their order). The
/// router is polled after every event. A router that [takes KV
/// events](SimRouter::takes_kv_events) is handed each replica's cache changes the fleet's
/// `kv_event_delay_ms` after they happened, before anything else at that time; batches still
/// on their way when the run ends are not delivered. The run ends when every request has
/// completed or been rejected, or when nothing is left to happen (requests the router never
/// decided are reported as unrouted). Request ids should be unique: a request whose id was already seen is
/// rejected on arrival without reaching the router. `progress(finished, total)` is called at
/// the start, each time another percent of the requests has finished (completed or
/// rejected), and once at the end.
pub fn run(
    workload: &[SimRequest],
    fleet: impl Into<SimFleet>,
    router: &mut dyn SimRouter,
    progress: &mut dyn FnMut(usize, usize),
) -> PipelineReport {
    let mut order: Vec<&SimRequest> = workload.iter().collect();
    order.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    run_stream(
        workload.len(),
        order.into_iter().cloned(),
        &fleet.into(),
        router,
        progress,
    )
}

/// As [`run`], with the `total` requests taken from `requests` one at a time as their
/// arrival comes up, so only the requests under way are held. `requests` must be in arrival
/// order (ties in workload order); a request arriving earlier than the one before it arrives
/// at that one's time.
pub fn run_stream(
    total: usize,
    requests: impl Iterator<Item = SimRequest>,
    fleet: &SimFleet,
    router: &mut dyn SimRouter,
    progress: &mut dyn FnMut(usize, usize),
) -> PipelineReport {
    let mut sim = Sim::new(total, requests.peekable(), fleet, router.takes_kv_events());
    sim.run(router, progress);
    PipelineReport::from_outcome(router.name(), &sim.into_outcome())
}

/// The replicas' KV-cache events on their way to a router that reads them.
struct KvFeed {
    queue: EventQueue,
    /// Prompt tokens and cache salt of each request a replica may still store blocks of, by
    /// record index.
    prompts: HashMap<usize, (Tokens, String)>,
    /// A step engine's changes, taken after each step.
    changes: Vec<BlockChange>,
    /// When a [`EventKind::KvDue`] is scheduled.
    wakeup: Option<f64>,
}

/// The hash chain of one token buffer, kept while requests may still bring the buffer.
struct SharedChain {
    /// Keeps the buffer alive, so its address is not reused while the entry exists.
    buffer: Arc<[u32]>,
    seed: u64,
    /// Where the buffer's full-block chain starts in `Sim::hashes`.
    start: usize,
}

struct Sim<I: Iterator<Item = SimRequest>> {
    /// Requests not arrived yet, in arrival order.
    incoming: Peekable<I>,
    total: usize,
    block_size: usize,
    records: Vec<RequestRecord>,
    /// Record index by request id, for the ids that differ from their record's index (see
    /// [`Sim::record_of`]); generated workloads number their requests in arrival order, so
    /// theirs stays empty.
    index_of: HashMap<u64, usize>,
    /// Full-block hash chains of the arrived requests' buffers; `RequestRecord::job.blocks`
    /// indexes it.
    hashes: Vec<u64>,
    /// Chains of buffers that later requests may share, by buffer address.
    chains: HashMap<usize, SharedChain>,
    /// Sweep `chains` of buffers nothing else holds when it grows past this.
    sweep_at: usize,
    /// Per chain (by its start in `hashes`), the end of the part served so far: the
    /// samples of a prompt add its blocks once, not once each.
    counted: HashMap<usize, usize>,
    /// The parts of `hashes` that requests served by a step engine generated (their
    /// output's full blocks), non-empty ones only.
    generated: Vec<Range<usize>>,
    replicas: Vec<SimReplica>,
    /// Each replica as the router sees it: metrics as of the last scrape, in-flight counts
    /// exact.
    view: Vec<ReplicaState>,
    scrape_interval_ms: f64,
    next_scrape_ms: f64,
    objectives: (f64, f64),
    step_events: Vec<StepEvent>,
    events: BinaryHeap<Reverse<Event>>,
    seq: u64,
    now: f64,
    finished: usize,
    next_progress: usize,
    scheduled_wakeup: Option<f64>,
    idle_wakeups: u32,
    decisions: Vec<Decision>,
    /// `None` unless the router reads KV-cache events.
    kv: Option<KvFeed>,
    /// The prefix predictions of dispatched requests not yet scheduled, by record index.
    predicted: HashMap<usize, Predicted>,
    /// Per producer: requests checked and token sums.
    checks: Vec<(String, u64, Sums)>,
}

impl<I: Iterator<Item = SimRequest>> Sim<I> {
    fn new(total: usize, incoming: Peekable<I>, fleet: &SimFleet, kv_events: bool) -> Self {
        let block_size = fleet.block_size_tokens.max(1);
        let replicas: Vec<SimReplica> = fleet
            .profiles()
            .map(|p| SimReplica::new(p, block_size, kv_events))
            .collect();
        let view = replicas.iter().map(SimReplica::state).collect();
        Sim {
            incoming,
            total,
            block_size,
            records: Vec::with_capacity(total),
            index_of: HashMap::new(),
            hashes: Vec::new(),
            chains: HashMap::new(),
            sweep_at: 64,
            counted: HashMap::new(),
            generated: Vec::new(),
            replicas,
            view,
            scrape_interval_ms: fleet.scrape_interval_ms,
            next_scrape_ms: 0.0,
            objectives: (fleet.ttft_objective_ms, fleet.tpot_objective_ms),
            step_events: Vec::new(),
            events: BinaryHeap::new(),
            seq: 0,
            now: 0.0,
            finished: 0,
            next_progress: 0,
            scheduled_wakeup: None,
            idle_wakeups: 0,
            decisions: Vec::new(),
            kv: kv_events.then(|| KvFeed {
                queue: EventQueue::new(fleet.kv_event_delay_ms),
                prompts: HashMap::new(),
                changes: Vec::new(),
                wakeup: None,
            }),
            predicted: HashMap::new(),
            checks: Vec::new(),
        }
    }

    /// The next thing to happen: the next arrival when it is due no later than the earliest
    /// scheduled event (arrivals go first at equal times), else that event.
    fn next_event(&mut self) -> Option<(f64, Option<SimRequest>, EventKind)> {
        let arrival_first = match (self.incoming.peek(), self.events.peek()) {
            (None, None) => return None,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(req), Some(Reverse(e))) => req.arrival_ms.total_cmp(&e.at) != Ordering::Greater,
        };
        if arrival_first {
            let req = self.incoming.next()?;
            Some((req.arrival_ms, Some(req), EventKind::Arrival))
        } else {
            let Reverse(e) = self.events.pop()?;
            Some((e.at, None, e.kind))
        }
    }

    /// The range of `hashes` holding `req`'s full-block chain, hashing its buffer the first
    /// time the buffer is seen. A buffer's chain covers all its full blocks, and a prefix of
    /// the buffer has a prefix of that chain, since every block's hash chains on the ones
    /// before it.
    ///
    /// The second value is where the chain continued over the request's output ends: the
    /// buffer's tokens after the prompt are taken to be the output where the buffer has them
    /// (a multi-turn session's buffer holds each answer before the next message).
    fn chain_of(&mut self, req: &SimRequest) -> (Range<usize>, usize) {
        let seed = prompt_seed(&req.model, &req.cache_salt);
        let bs = self.block_size;
        let full_blocks = req.tokens.len() / bs;
        let buffer = req.tokens.buffer();
        let with_output = (req.tokens.len() + req.output_tokens as usize).min(buffer.len()) / bs;
        let key = Arc::as_ptr(buffer) as *const u32 as usize;
        if let Some(c) = self.chains.get(&key) {
            if c.seed == seed && Arc::ptr_eq(&c.buffer, buffer) {
                return (c.start..c.start + full_blocks, c.start + with_output);
            }
        }
        let start = self.hashes.len();
        if Arc::strong_count(buffer) == 1 {
            // Nothing else holds the buffer: no later request can share it.
            hash_prompt_into(seed, &req.tokens, bs, full_blocks, &mut self.hashes);
            return (start..self.hashes.len(), self.hashes.len());
        }
        hash_prompt_into(seed, buffer, bs, buffer.len() / bs, &mut self.hashes);
        if self.chains.len() >= self.sweep_at {
            self.chains.retain(|_, c| Arc::strong_count(&c.buffer) > 1);
            self.sweep_at = (self.chains.len() * 2).max(64);
        }
        self.chains.insert(
            key,
            SharedChain {
                buffer: Arc::clone(buffer),
                seed,
                start,
            },
        );
        (start..start + full_blocks, start + with_output)
    }

    fn schedule(&mut self, at: f64, kind: EventKind) {
        self.events.push(Reverse(Event {
            at,
            seq: self.seq,
            kind,
        }));
        self.seq += 1;
    }

    fn run(&mut self, router: &mut dyn SimRouter, progress: &mut dyn FnMut(usize, usize)) {
        while self.finished < self.total {
            let Some((at, arriving, kind)) = self.next_event() else {
                break;
            };
            if at > self.now {
                self.idle_wakeups = 0;
            }
            self.scrape(at);
            self.now = self.now.max(at);
            // Events due by now reach the router before whatever happens now.
            self.deliver_kv(router);
            match kind {
                EventKind::Arrival => {
                    if let Some(req) = arriving {
                        self.arrive(req, router);
                    }
                }
                EventKind::Wakeup => {
                    if self.scheduled_wakeup == Some(at) {
                        self.scheduled_wakeup = None;
                    }
                }
                EventKind::PrefillDone(r) => self.prefill_done(r),
                EventKind::DecodeDone(i) => self.decode_done(i, router),
                EventKind::StepDone(r) => self.step_done(r, router),
                EventKind::KvDue => {
                    if let Some(kv) = &mut self.kv {
                        if kv.wakeup == Some(at) {
                            kv.wakeup = None;
                        }
                    }
                }
            }
            // Without a delay, what happened now is known before the next decision.
            self.deliver_kv(router);
            let decided = self.poll(router);
            if matches!(kind, EventKind::Wakeup) && decided == 0 {
                self.idle_wakeups += 1;
            }
            self.schedule_wakeup(router);
            self.schedule_kv();
            self.report_progress(progress);
        }
        progress(self.finished, self.total);
        if cfg!(debug_assertions) && self.finished == self.total {
            for (r, replica) in self.replicas.iter().enumerate() {
                if let SimReplica::Stepped(s) = replica {
                    if let Err(e) = s.check_drained() {
                        panic!("replica {r}: {e}");
                    }
                }
            }
        }
    }

    /// Refreshes the router's view of the metrics when a scrape came due before `at`: the
    /// replicas have not changed since the last event, so they are as they were at the scrape.
    fn scrape(&mut self, at: f64) {
        if self.scrape_interval_ms > 0.0 && at >= self.next_scrape_ms {
            for (view, replica) in self.view.iter_mut().zip(&self.replicas) {
                *view = replica.state();
            }
            let interval = self.scrape_interval_ms;
            self.next_scrape_ms = ((at / interval).floor() + 1.0) * interval;
        }
    }

    fn arrive(&mut self, req: SimRequest, router: &mut dyn SimRouter) {
        let i = self.records.len();
        let duplicate = self.record_of(req.id).is_some();
        let (blocks, chain_end) = if duplicate {
            (0..0, 0)
        } else {
            self.chain_of(&req)
        };
        self.records.push(RequestRecord {
            id: req.id,
            arrival_ms: req.arrival_ms,
            group: req.group,
            step: req.step,
            status: Status::Pending,
            replica: None,
            decided_ms: f64::NAN,
            scheduled_ms: f64::NAN,
            first_token_ms: f64::NAN,
            done_ms: f64::NAN,
            cached_tokens: 0,
            computed_tokens: 0,
            full_hit: false,
            job: Job {
                request: i,
                prompt_tokens: u32::try_from(req.tokens.len()).unwrap_or(u32::MAX),
                output_tokens: req.output_tokens,
                blocks,
                chain_end,
            },
        });
        if duplicate {
            self.records[i].status = Status::Rejected;
            self.records[i].decided_ms = self.now;
            self.finished += 1;
            return;
        }
        if req.id != i as u64 {
            self.index_of.insert(req.id, i);
        }
        if let Some(kv) = &mut self.kv {
            kv.prompts
                .insert(i, (req.tokens.clone(), req.cache_salt.clone()));
        }
        router.submit(self.now, &req, &self.view);
    }

    /// The record of the first request with id `id`. An id found in `index_of` maps to its
    /// record; any other id can only be its own record's index (the first request with an id
    /// is put in the map unless the two are equal, and a later one with the same id is a
    /// duplicate, never looked up).
    fn record_of(&self, id: u64) -> Option<usize> {
        if let Some(&i) = self.index_of.get(&id) {
            return Some(i);
        }
        let i = usize::try_from(id).ok()?;
        (self.records.get(i)?.id == id).then_some(i)
    }

    fn poll(&mut self, router: &mut dyn SimRouter) -> usize {
        let mut decisions = std::mem::take(&mut self.decisions);
        router.poll(self.now, &self.view, &mut decisions);
        let mut decided = 0;
        for d in decisions.drain(..) {
            let Some(i) = self.record_of(d.request) else {
                continue;
            };
            if self.records[i].status != Status::Pending {
                continue;
            }
            decided += 1;
            self.records[i].decided_ms = self.now;
            match d.replica {
                Some(r) if r < self.replicas.len() => {
                    if !d.predicted.is_empty() {
                        self.predicted.insert(i, d.predicted);
                    }
                    self.dispatch(i, r, router)
                }
                _ => {
                    self.records[i].status = Status::Rejected;
                    self.finished += 1;
                    self.forget(i);
                }
            }
        }
        self.decisions = decisions;
        decided
    }

    fn dispatch(&mut self, i: usize, r: usize, router: &mut dyn SimRouter) {
        let record = &mut self.records[i];
        record.status = Status::Dispatched;
        record.replica = Some(r);
        let job = record.job.clone();
        if let SimReplica::Stepped(replica) = &self.replicas[r] {
            if !replica.fits(&job) {
                // Longer than the replica's whole KV pool: refused, as an engine refuses a
                // request over its maximum length.
                self.records[i].status = Status::Refused;
                self.records[i].replica = None;
                self.finished += 1;
                self.forget(i);
                self.predicted.remove(&i);
                router.on_complete(self.now, self.records[i].id, r);
                return;
            }
        }
        let counted = self
            .counted
            .entry(job.blocks.start)
            .or_insert(job.blocks.start);
        *counted = (*counted).max(job.blocks.end);
        match &mut self.replicas[r] {
            SimReplica::Fixed(replica) => {
                let started = replica.dispatch(self.now, job, &self.hashes);
                self.started(r, started);
            }
            SimReplica::Stepped(replica) => {
                // Only the step engine keeps the blocks its decode fills.
                if job.chain_end > job.blocks.end {
                    self.generated.push(job.blocks.end..job.chain_end);
                }
                if let Some(at) = replica.dispatch(self.now, job) {
                    self.schedule(at, EventKind::StepDone(r));
                }
                self.refresh(r);
            }
        }
    }

    fn step_done(&mut self, r: usize, router: &mut dyn SimRouter) {
        let SimReplica::Stepped(replica) = &mut self.replicas[r] else {
            return;
        };
        let mut events = std::mem::take(&mut self.step_events);
        let next = replica.finish_step(self.now, &self.hashes, &mut events);
        if let Some(at) = next {
            self.schedule(at, EventKind::StepDone(r));
        }
        self.refresh(r);
        // Before finished requests are forgotten: the step may have stored their blocks.
        self.publish_step(r);
        for event in events.drain(..) {
            match event {
                StepEvent::FirstToken {
                    request,
                    cached_tokens,
                    computed_tokens,
                    scheduled_at,
                    full_hit,
                } => {
                    let record = &mut self.records[request];
                    record.first_token_ms = self.now;
                    record.scheduled_ms = scheduled_at;
                    record.cached_tokens = cached_tokens;
                    record.computed_tokens = computed_tokens;
                    record.full_hit = full_hit;
                    self.check_prediction(request, cached_tokens);
                }
                StepEvent::Done { request } => {
                    let record = &mut self.records[request];
                    record.status = Status::Completed;
                    record.done_ms = self.now;
                    self.finished += 1;
                    router.on_complete(self.now, record.id, r);
                    self.forget(request);
                }
            }
        }
        self.step_events = events;
    }

    fn prefill_done(&mut self, r: usize) {
        let SimReplica::Fixed(replica) = &mut self.replicas[r] else {
            return;
        };
        let (ended, started) = replica.finish_prefill(self.now, &self.hashes);
        if let (Some(end), Some(kv)) = (&ended, &mut self.kv) {
            let changes = replica.take_cache_changes();
            if let Some((tokens, salt)) = kv.prompts.get(&end.request) {
                let chain = &self.hashes[self.records[end.request].job.blocks.clone()];
                let events = cache_events(&changes, chain, tokens, salt, self.block_size, |h| h);
                kv.queue.publish(self.now, r, events);
            }
        }
        if let Some(end) = ended {
            self.records[end.request].first_token_ms = self.now;
            self.schedule(end.done_at, EventKind::DecodeDone(end.request));
        }
        self.started(r, started);
    }

    fn decode_done(&mut self, i: usize, router: &mut dyn SimRouter) {
        let Some(r) = self.records[i].replica else {
            return;
        };
        let SimReplica::Fixed(replica) = &mut self.replicas[r] else {
            return;
        };
        let record = &mut self.records[i];
        record.status = Status::Completed;
        record.done_ms = self.now;
        let started = replica.complete(self.now, &record.job, &self.hashes);
        self.started(r, started);
        self.finished += 1;
        router.on_complete(self.now, self.records[i].id, r);
        self.forget(i);
    }

    /// Books a prefill that has just started on replica `r` and refreshes `r`'s view.
    fn started(&mut self, r: usize, started: Option<PrefillStart>) {
        if let Some(s) = started {
            let bs = self.block_size as u32;
            let record = &mut self.records[s.request];
            record.cached_tokens = s.cached_tokens;
            record.computed_tokens = s.computed_tokens;
            record.scheduled_ms = self.now;
            let prompt = record.job.prompt_tokens;
            record.full_hit = s.cached_tokens >= prompt - prompt % bs;
            self.schedule(s.done_at, EventKind::PrefillDone(r));
            self.check_prediction(s.request, s.cached_tokens);
        }
        self.refresh(r);
    }

    /// Hands the router the KV-cache events due by now, in the order they were published.
    fn deliver_kv(&mut self, router: &mut dyn SimRouter) {
        let Some(kv) = &mut self.kv else {
            return;
        };
        while let Some((replica, events)) = kv.queue.pop_due(self.now) {
            router.kv_events(self.now, replica, events);
        }
    }

    /// Makes sure the loop stops when the next batch of KV-cache events is due.
    fn schedule_kv(&mut self) {
        let Some(kv) = &self.kv else {
            return;
        };
        let Some(due) = kv.queue.next_due() else {
            return;
        };
        if kv.wakeup.is_none_or(|w| due < w) {
            if let Some(kv) = &mut self.kv {
                kv.wakeup = Some(due);
            }
            self.schedule(due, EventKind::KvDue);
        }
    }

    /// Publishes what step-engine replica `r`'s last step did to its prefix cache.
    fn publish_step(&mut self, r: usize) {
        let (Some(kv), SimReplica::Stepped(replica)) = (&mut self.kv, &mut self.replicas[r]) else {
            return;
        };
        kv.changes.clear();
        replica.take_block_changes(&mut kv.changes);
        if kv.changes.is_empty() {
            return;
        }
        let (records, hashes, prompts) = (&self.records, &self.hashes, &kv.prompts);
        let events = step_events(&kv.changes, self.block_size, |request| {
            let job = &records.get(request)?.job;
            let (tokens, salt) = prompts.get(&request)?;
            Some(ChainSource {
                hashes: &hashes[job.blocks.start..job.chain_end.max(job.blocks.end)],
                tokens: tokens.buffer(),
                cache_salt: salt,
            })
        });
        kv.queue.publish(self.now, r, events);
    }

    /// Drops what was kept of request `i` for its KV-cache events: it will store no more.
    fn forget(&mut self, i: usize) {
        if let Some(kv) = &mut self.kv {
            kv.prompts.remove(&i);
        }
    }

    /// Scores the prediction made for request `i` against the `cached` prompt tokens its
    /// replica found when the prefill was scheduled.
    fn check_prediction(&mut self, i: usize, cached: u32) {
        let Some(predicted) = self.predicted.remove(&i) else {
            return;
        };
        for (producer, tokens) in predicted.iter() {
            let one = Sums::one(tokens, u64::from(cached));
            match self.checks.iter_mut().find(|c| c.0 == producer) {
                Some(check) => {
                    check.1 += 1;
                    check.2.add(one);
                }
                None => self.checks.push((producer.to_string(), 1, one)),
            }
        }
    }

    /// Replica `r` changed: the router's view of it is refreshed — wholly when metrics are
    /// fresh at every event, only its in-flight count otherwise.
    fn refresh(&mut self, r: usize) {
        let state = self.replicas[r].state();
        if self.scrape_interval_ms > 0.0 {
            self.view[r].in_flight_tokens = state.in_flight_tokens;
            self.view[r].in_flight = state.in_flight;
        } else {
            self.view[r] = state;
        }
    }

    fn schedule_wakeup(&mut self, router: &dyn SimRouter) {
        let Some(wanted) = router.next_wakeup() else {
            return;
        };
        if wanted.is_nan() {
            return;
        }
        let at = wanted.max(self.now);
        if at <= self.now && self.idle_wakeups >= MAX_IDLE_WAKEUPS_PER_INSTANT {
            return;
        }
        if self.scheduled_wakeup.is_none_or(|s| at < s) {
            self.scheduled_wakeup = Some(at);
            self.schedule(at, EventKind::Wakeup);
        }
    }

    fn report_progress(&mut self, progress: &mut dyn FnMut(usize, usize)) {
        let total = self.total;
        if self.finished >= self.next_progress && self.finished < total {
            progress(self.finished, total);
            self.next_progress = self.finished + total.div_ceil(100).max(1);
        }
    }

    fn into_outcome(self) -> RunOutcome {
        RunOutcome {
            records: self.records,
            replicas: self.replicas,
            objectives: self.objectives,
            ideal_blocks: ideal_blocks(self.hashes, &self.counted, &self.generated),
            block_size: self.block_size,
            end_ms: self.now,
            predictions: self.checks,
        }
    }
}

/// How many distinct block hashes the served parts of the prompt chains hold that no served
/// request generated on a replica that caches its output: such a block can be in a cache
/// without being prefilled (a multi-turn session's next prompt holds the previous answer);
/// every other block of a served prompt is prefilled at least once by any placement.
///
/// The prompt parts are counted in the chains' own store: they are moved to its front,
/// sorted and deduplicated there, so the count costs no memory beyond the store and a copy of
/// the generated blocks.
fn ideal_blocks(
    mut hashes: Vec<u64>,
    counted: &HashMap<usize, usize>,
    generated: &[Range<usize>],
) -> u64 {
    let mut decoded: Vec<u64> = generated
        .iter()
        .flat_map(|range| hashes[range.clone()].iter().copied())
        .collect();
    decoded.sort_unstable();
    decoded.dedup();
    let mut parts: Vec<(usize, usize)> = counted.iter().map(|(&s, &e)| (s, e)).collect();
    parts.sort_unstable();
    let mut len = 0;
    for (start, end) in parts {
        // Chains do not overlap and are visited in store order, so `len <= start`.
        hashes.copy_within(start..end, len);
        len += end - start;
    }
    hashes.truncate(len);
    hashes.sort_unstable();
    hashes.dedup();
    hashes
        .iter()
        .filter(|h| decoded.binary_search(h).is_err())
        .count() as u64
}

#[cfg(test)]
mod kv_tests;
#[cfg(test)]
mod tests;
