//! The discrete-event loop: arrivals, router polls and wakeups, and replica prefill and decode
//! completions, in virtual time.

use super::config::FleetConfig;
use super::replica::{Job, PrefillStart, Replica};
use super::report::PipelineReport;
use super::router::{Decision, ReplicaState, SimRequest, SimRouter};
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use switchyard_prefix_hashing::{hash_prompt_into, prompt_seed};

/// After this many wakeups at one instant that decide nothing, wakeups at that instant are no
/// longer honoured, so a router that keeps asking for "now" cannot stall the run.
const MAX_IDLE_WAKEUPS_PER_INSTANT: u32 = 1000;

/// Where a request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    NotArrived,
    /// Submitted to the router, no decision yet.
    Pending,
    Rejected,
    /// Sent to a replica, not finished.
    Dispatched,
    Completed,
}

/// What happened to one request (times in ms; `NaN` where it did not happen).
#[derive(Debug, Clone)]
pub(crate) struct RequestRecord {
    pub status: Status,
    pub replica: Option<usize>,
    pub decided_ms: f64,
    pub first_token_ms: f64,
    pub done_ms: f64,
    pub cached_tokens: u32,
    pub computed_tokens: u32,
    pub job: Job,
}

/// Everything the report is computed from.
pub(crate) struct RunOutcome<'a> {
    pub workload: &'a [SimRequest],
    pub records: Vec<RequestRecord>,
    pub replicas: Vec<Replica>,
    /// All requests' full-block hash chains; `RequestRecord::job.blocks` indexes it.
    pub hashes: Vec<u64>,
    pub block_size: usize,
    pub end_ms: f64,
}

#[derive(Debug, Clone, Copy)]
enum EventKind {
    Arrival(usize),
    Wakeup,
    PrefillDone(usize),
    DecodeDone(usize),
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
/// are scheduled first, in workload order. The router is polled after every event. The run
/// ends when every request has completed or been rejected, or when nothing is left to happen
/// (requests the router never decided are reported as unrouted). Request ids should be unique:
/// a request whose id was already seen is rejected on arrival without reaching the router.
/// `progress(finished, total)` is called at the start, each time another percent of the
/// requests has finished (completed or rejected), and once at the end.
pub fn run(
    workload: &[SimRequest],
    fleet: &FleetConfig,
    router: &mut dyn SimRouter,
    progress: &mut dyn FnMut(usize, usize),
) -> PipelineReport {
    let mut sim = Sim::new(workload, fleet);
    sim.run(router, progress);
    PipelineReport::from_outcome(router.name(), &sim.into_outcome())
}

struct Sim<'a> {
    workload: &'a [SimRequest],
    block_size: usize,
    records: Vec<RequestRecord>,
    index_of: HashMap<u64, usize>,
    hashes: Vec<u64>,
    replicas: Vec<Replica>,
    view: Vec<ReplicaState>,
    events: BinaryHeap<Reverse<Event>>,
    seq: u64,
    now: f64,
    finished: usize,
    next_progress: usize,
    scheduled_wakeup: Option<f64>,
    idle_wakeups: u32,
    decisions: Vec<Decision>,
}

impl<'a> Sim<'a> {
    fn new(workload: &'a [SimRequest], fleet: &FleetConfig) -> Self {
        let block_size = fleet.block_size_tokens.max(1);
        let mut hashes = Vec::new();
        let mut records = Vec::with_capacity(workload.len());
        for (i, req) in workload.iter().enumerate() {
            let start = hashes.len();
            let seed = prompt_seed(&req.model, &req.cache_salt);
            let full_blocks = req.tokens.len() / block_size;
            hash_prompt_into(seed, &req.tokens, block_size, full_blocks, &mut hashes);
            records.push(RequestRecord {
                status: Status::NotArrived,
                replica: None,
                decided_ms: f64::NAN,
                first_token_ms: f64::NAN,
                done_ms: f64::NAN,
                cached_tokens: 0,
                computed_tokens: 0,
                job: Job {
                    request: i,
                    prompt_tokens: u32::try_from(req.tokens.len()).unwrap_or(u32::MAX),
                    output_tokens: req.output_tokens,
                    blocks: start..hashes.len(),
                },
            });
        }
        let replicas: Vec<Replica> = (0..fleet.replicas).map(|_| Replica::new(fleet)).collect();
        let view = replicas.iter().map(Replica::state).collect();
        let mut sim = Sim {
            workload,
            block_size,
            records,
            index_of: HashMap::with_capacity(workload.len()),
            hashes,
            replicas,
            view,
            events: BinaryHeap::with_capacity(workload.len() * 2),
            seq: 0,
            now: 0.0,
            finished: 0,
            next_progress: 0,
            scheduled_wakeup: None,
            idle_wakeups: 0,
            decisions: Vec::new(),
        };
        for (i, req) in workload.iter().enumerate() {
            sim.schedule(req.arrival_ms, EventKind::Arrival(i));
        }
        sim
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
        let total = self.workload.len();
        while self.finished < total {
            let Some(Reverse(event)) = self.events.pop() else {
                break;
            };
            if event.at > self.now {
                self.idle_wakeups = 0;
            }
            self.now = self.now.max(event.at);
            match event.kind {
                EventKind::Arrival(i) => self.arrive(i, router),
                EventKind::Wakeup => {
                    if self.scheduled_wakeup == Some(event.at) {
                        self.scheduled_wakeup = None;
                    }
                }
                EventKind::PrefillDone(r) => self.prefill_done(r),
                EventKind::DecodeDone(i) => self.decode_done(i, router),
            }
            let decided = self.poll(router);
            if matches!(event.kind, EventKind::Wakeup) && decided == 0 {
                self.idle_wakeups += 1;
            }
            self.schedule_wakeup(router);
            self.report_progress(progress);
        }
        progress(self.finished, total);
    }

    fn arrive(&mut self, i: usize, router: &mut dyn SimRouter) {
        let req = &self.workload[i];
        if self.index_of.contains_key(&req.id) {
            self.records[i].status = Status::Rejected;
            self.records[i].decided_ms = self.now;
            self.finished += 1;
            return;
        }
        self.index_of.insert(req.id, i);
        self.records[i].status = Status::Pending;
        router.submit(self.now, req, &self.view);
    }

    fn poll(&mut self, router: &mut dyn SimRouter) -> usize {
        let mut decisions = std::mem::take(&mut self.decisions);
        router.poll(self.now, &self.view, &mut decisions);
        let mut decided = 0;
        for d in decisions.drain(..) {
            let Some(&i) = self.index_of.get(&d.request) else {
                continue;
            };
            if self.records[i].status != Status::Pending {
                continue;
            }
            decided += 1;
            self.records[i].decided_ms = self.now;
            match d.replica {
                Some(r) if r < self.replicas.len() => self.dispatch(i, r),
                _ => {
                    self.records[i].status = Status::Rejected;
                    self.finished += 1;
                }
            }
        }
        self.decisions = decisions;
        decided
    }

    fn dispatch(&mut self, i: usize, r: usize) {
        let record = &mut self.records[i];
        record.status = Status::Dispatched;
        record.replica = Some(r);
        let job = record.job.clone();
        let started = self.replicas[r].dispatch(self.now, job, &self.hashes);
        self.started(r, started);
    }

    fn prefill_done(&mut self, r: usize) {
        let (ended, started) = self.replicas[r].finish_prefill(self.now, &self.hashes);
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
        let record = &mut self.records[i];
        record.status = Status::Completed;
        record.done_ms = self.now;
        let started = self.replicas[r].complete(self.now, &record.job, &self.hashes);
        self.started(r, started);
        self.finished += 1;
        router.on_complete(self.now, self.workload[i].id, r);
    }

    /// Books a prefill that has just started on replica `r` and refreshes `r`'s view.
    fn started(&mut self, r: usize, started: Option<PrefillStart>) {
        if let Some(s) = started {
            let record = &mut self.records[s.request];
            record.cached_tokens = s.cached_tokens;
            record.computed_tokens = s.computed_tokens;
            self.schedule(s.done_at, EventKind::PrefillDone(r));
        }
        self.view[r] = self.replicas[r].state();
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
        let total = self.workload.len();
        if self.finished >= self.next_progress && self.finished < total {
            progress(self.finished, total);
            self.next_progress = self.finished + total.div_ceil(100).max(1);
        }
    }

    fn into_outcome(self) -> RunOutcome<'a> {
        RunOutcome {
            workload: self.workload,
            records: self.records,
            replicas: self.replicas,
            hashes: self.hashes,
            block_size: self.block_size,
            end_ms: self.now,
        }
    }
}

#[cfg(test)]
mod tests;
