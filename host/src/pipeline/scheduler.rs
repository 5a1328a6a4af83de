//! Running requests through a wired pipeline, on whatever clock the driver keeps.
//!
//! The scheduler is a state machine over explicit time: [`Scheduler::submit`] runs a request
//! through its producers until it is decided or parks in a batching producer's window;
//! [`Scheduler::advance`] seals the windows that are due, calls each batching producer once
//! per sealed batch and carries its requests on. Drivers with a real clock call `advance` when
//! [`Scheduler::next_deadline`] passes; `replay` and `simulate` do the same on virtual time,
//! so windows behave identically and runs are deterministic.
//!
//! Faults are contained per stage: a producer's error, timeout or panic costs only that
//! producer's data for that request (later producers still run); a failing filter keeps every
//! candidate; a failing scorer scores zeros; a failing picker fails that one request. An
//! instance that panics [`POISON_AFTER_PANICS`] times in a row is switched off.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use switchyard_plugin_api::ffi::{RSlice, RStr, RString};
use switchyard_plugin_api::{
    AttrValue, AttrView, EndpointView, ErrorKind, Outcome, PluginError, PluginKind, ProduceItem,
    PromptTokens, RequestView,
};

use super::carry::{carry_state, Carried};
use super::prediction::Predicted;
use super::record::{DecisionTrace, TracePool, WindowTrace};
use super::request::{Endpoint, Fleet, Request};
use super::tokenize::{prompt_buffers, Estimated, PromptBuffer};
use super::wiring::Pipeline;
use crate::plugins::crash_note;

/// Consecutive panics after which an instance is switched off for the life of the process.
pub const POISON_AFTER_PANICS: u32 = 3;

/// The result of scheduling one request.
#[derive(Debug, Clone)]
pub struct Decision {
    pub request_id: String,
    /// Positions in the request's fleet snapshot of the chosen endpoints, best first.
    pub result: Result<Vec<usize>, Rejection>,
    /// The chosen endpoints' ids (empty when rejected).
    pub endpoints: Vec<String>,
    pub decided_ms: f64,
    pub arrival_ms: f64,
    pub record: Option<Box<DecisionTrace>>,
    /// What the producers of `PrefixCacheMatchInfo` expected the chosen endpoint to hold.
    pub predicted: Predicted,
}

/// Why a request was not placed.
#[derive(Debug, Clone, PartialEq)]
pub enum Rejection {
    NoEndpoints,
    /// A filter removed every candidate.
    FilteredOut {
        filter: String,
    },
    PickerFailed {
        picker: String,
        reason: String,
    },
    /// A live driver's in-flight limit is reached (never raised by the scheduler itself).
    Saturated {
        limit: String,
    },
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::NoEndpoints => f.write_str("no endpoints to schedule on"),
            Rejection::FilteredOut { filter } => {
                write!(f, "filter '{filter}' removed every candidate endpoint")
            }
            Rejection::PickerFailed { picker, reason } => {
                write!(f, "picker '{picker}' failed: {reason}")
            }
            Rejection::Saturated { limit } => write!(f, "saturated: {limit}"),
        }
    }
}

/// Counters of one plugin instance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PluginStats {
    pub calls: u64,
    pub errors: u64,
    pub timeouts: u64,
    pub panics: u64,
    /// Requests refused a place in a full batch window.
    pub batch_overflows: u64,
    pub poisoned: bool,
    /// Calls whose duration was measured: every produce call, and the filter, scorer and
    /// picker calls of one decision in [`TIMING_SAMPLE`].
    pub timed_calls: u64,
    /// Their total duration, in nanoseconds.
    pub timed_nanos: u64,
    /// Panics in a row, per entry point: a success of one entry point does not excuse
    /// another that panics on every call.
    #[serde(skip)]
    consecutive_panics: [u32; Entry::COUNT],
    /// Whether a non-panic error of this instance was logged already.
    #[serde(skip)]
    error_logged: bool,
}

/// The entry points of an instance the scheduler calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Produce,
    Filter,
    Score,
    Pick,
    Dispatched,
    Completed,
}

impl Entry {
    const COUNT: usize = 6;

    fn name(self) -> &'static str {
        match self {
            Entry::Produce => "produce",
            Entry::Filter => "filter",
            Entry::Score => "score",
            Entry::Pick => "pick",
            Entry::Dispatched => "dispatched",
            Entry::Completed => "completed",
        }
    }
}

/// One decision in this many has its filter, scorer and picker calls timed (a clock read per
/// call on every decision would cost more than some of the calls).
pub const TIMING_SAMPLE: u64 = 16;
const _: () = assert!(TIMING_SAMPLE.is_power_of_two());

/// The endpoints a request was scheduled against, with their host indices and their views,
/// built once per fleet or metrics change rather than per call.
#[derive(Clone)]
struct Snapshot {
    endpoints: Arc<[Endpoint]>,
    host_indices: Arc<[u32]>,
    /// One view per endpoint, borrowing the strings of `endpoints`. Only ever handed out
    /// borrowed from `self`, and always replaced together with `endpoints`.
    views: Arc<[EndpointView<'static>]>,
}

impl Snapshot {
    fn new(endpoints: Arc<[Endpoint]>, host_indices: Arc<[u32]>) -> Snapshot {
        let views = endpoints
            .iter()
            .zip(host_indices.iter())
            .enumerate()
            .map(|(slot, (endpoint, &host_index))| {
                // SAFETY: the view borrows the heap buffers of the endpoint's strings. They
                // are owned by `endpoints`, which this snapshot (and every clone of it) keeps
                // alive alongside `views`; they do not move when the `Arc` does, and nothing
                // changes them while shared (`update_metrics` writes only metrics, into an
                // unshared copy, and builds new views). The `'static` never escapes: views are
                // read through `&self`, which shortens it again.
                unsafe { extend_view(endpoint_view(endpoint, slot, host_index)) }
            })
            .collect();
        Snapshot {
            endpoints,
            host_indices,
            views,
        }
    }

    fn len(&self) -> usize {
        self.endpoints.len()
    }

    fn view(&self, slot: usize) -> EndpointView<'_> {
        self.views[slot]
    }

    fn views(&self) -> &[EndpointView<'_>] {
        &self.views
    }
}

/// Says, under the token producer's key on every candidate, that the request's token ids
/// are the host's estimate from text (a custom value; `keys::TOKENIZED_PROMPT`): empty, or
/// naming why when the decision is recorded.
fn mark_estimated(
    pipeline: &Pipeline,
    store: &mut [AttrValue],
    width: usize,
    why: &Estimated,
    explain: bool,
) {
    let row = pipeline
        .plugins
        .iter()
        .find(|p| p.host_native)
        .and_then(|p| p.produced_rows.first());
    if let Some(&row) = row {
        let start = row as usize * width;
        if let Some(values) = store.get_mut(start..start + width) {
            let note = if explain {
                why.to_string().into_bytes()
            } else {
                Vec::new()
            };
            values.fill_with(|| AttrValue::Custom(note.as_slice().into()));
        }
    }
}

/// # Safety
/// The strings `view` borrows must outlive every use of the result.
unsafe fn extend_view(view: EndpointView<'_>) -> EndpointView<'static> {
    std::mem::transmute::<EndpointView<'_>, EndpointView<'static>>(view)
}

/// # Safety
/// The tokens `view` borrows must outlive every use of the result.
unsafe fn extend_prompt(view: PromptTokens<'_>) -> PromptTokens<'static> {
    std::mem::transmute::<PromptTokens<'_>, PromptTokens<'static>>(view)
}

/// What the scheduler keeps of a request from admission until it completes.
struct Admitted {
    id: String,
    model: String,
    cache_salt: String,
    max_output_tokens: Option<u64>,
    /// Owns (or shares) the token buffers `prompt_views` borrows; never changed after
    /// admission.
    #[allow(dead_code)]
    prompts: Vec<PromptBuffer>,
    /// One view per prompt, built once on admission.
    prompt_views: Vec<PromptTokens<'static>>,
    fleet: Snapshot,
    seed: u64,
}

impl Admitted {
    #[allow(clippy::too_many_arguments)]
    fn new(
        id: String,
        model: String,
        cache_salt: String,
        max_output_tokens: Option<u64>,
        prompts: Vec<PromptBuffer>,
        fleet: Snapshot,
        seed: u64,
    ) -> Admitted {
        let prompt_views = prompts
            .iter()
            .map(|p| {
                // SAFETY: the view borrows the heap buffer of one prompt of `prompts` (a
                // vector's or a shared buffer's, which this value keeps a reference to),
                // which the returned value owns, never changes, and drops only together with
                // the views (moving the outer vector does not move the token buffers). The
                // `'static` never escapes: views are read through `&self`.
                unsafe {
                    extend_prompt(PromptTokens {
                        tokens: RSlice::from_slice(p.as_slice()),
                    })
                }
            })
            .collect();
        Admitted {
            id,
            model,
            cache_salt,
            max_output_tokens,
            prompts,
            prompt_views,
            fleet,
            seed,
        }
    }

    fn prompt_views(&self) -> &[PromptTokens<'_>] {
        &self.prompt_views
    }

    fn view<'a>(
        &'a self,
        prompts: &'a [PromptTokens<'a>],
        now_ms: f64,
        explain: bool,
    ) -> RequestView<'a> {
        RequestView {
            id: RStr::from(self.id.as_str()),
            model: RStr::from(self.model.as_str()),
            cache_salt: RStr::from(self.cache_salt.as_str()),
            prompts: RSlice::from_slice(prompts),
            max_output_tokens: self.max_output_tokens.map_or(-1, |m| m as i64),
            now_ms: now_ms.max(0.0) as u64,
            random_seed: self.seed,
            explain,
        }
    }
}

/// A request on its way through the producers.
struct Ticket {
    request: Admitted,
    /// Attribute rows × candidates.
    store: Vec<AttrValue>,
    /// Position in `Pipeline::producers` of the next producer to run.
    next_producer: usize,
    arrival_ms: f64,
    record: Option<Box<DecisionTrace>>,
}

struct Window {
    opened_ms: f64,
    seal_ms: f64,
    members: Vec<Ticket>,
}

/// A dispatched request; its `request.id` is empty, the id being the key it is filed under.
struct Dispatched {
    request: Admitted,
    endpoint: usize,
    /// The pipeline that placed it: its completion goes to the instances that charged it.
    pipeline: Arc<Pipeline>,
}

/// Buffers reused from one decision to the next.
#[derive(Default)]
struct Scratch {
    produced: Vec<AttrValue>,
    keep: Vec<bool>,
    scores: Vec<f64>,
    totals: Vec<f64>,
    picked: Vec<u32>,
    /// Candidate positions already picked in the current decision; all `false` between
    /// decisions.
    seen: Vec<bool>,
    /// Attribute stores of decided requests, emptied, for the next admissions.
    stores: Vec<Vec<AttrValue>>,
    /// Member lists of sealed windows, emptied, for the next windows.
    members: Vec<Vec<Ticket>>,
}

/// Most emptied buffers of each kind kept in [`Scratch`].
const SCRATCH_POOL: usize = 64;

/// `n` absent values, written without cloning one.
fn fill_absent(buffer: &mut Vec<AttrValue>, n: usize) {
    buffer.clear();
    buffer.extend(std::iter::repeat_with(|| AttrValue::Absent).take(n));
}

pub struct Scheduler {
    pipeline: Arc<Pipeline>,
    fleet: Snapshot,
    rng: SmallRng,
    explain: bool,
    /// Where records' traces come from and, once the live ring lets them go, return to.
    traces: Arc<TracePool>,
    /// Open window per position in `Pipeline::producers` (`None`: no open window).
    windows: Vec<Option<Window>>,
    dispatched: HashMap<String, Dispatched>,
    stats: Vec<PluginStats>,
    scratch: Scratch,
    /// Decisions made, for sampling call timings.
    decisions: u64,
    /// The host index of every endpoint ever in the fleet, by id: one that leaves and comes
    /// back (an ejected endpoint) gets its index, and with it its plugin state, back.
    indices: HashMap<String, u32>,
}

impl Scheduler {
    pub fn new(pipeline: Arc<Pipeline>, fleet: Fleet, seed: u64) -> Scheduler {
        let stats = vec![PluginStats::default(); pipeline.plugins.len()];
        let host_indices = (0..fleet.endpoints.len() as u32).collect();
        let indices = fleet
            .endpoints
            .iter()
            .enumerate()
            .map(|(i, e)| (e.id.clone(), i as u32))
            .collect();
        let windows = pipeline.producers.iter().map(|_| None).collect();
        crate::plugins::crash_note::install();
        Scheduler {
            pipeline,
            fleet: Snapshot::new(fleet.endpoints, host_indices),
            rng: SmallRng::seed_from_u64(seed),
            explain: false,
            traces: Arc::default(),
            windows,
            dispatched: HashMap::new(),
            stats,
            scratch: Scratch::default(),
            decisions: 0,
            indices,
        }
    }

    /// Record every decision (see [`DecisionRecord`]).
    pub fn set_explain(&mut self, explain: bool) {
        self.explain = explain;
    }

    /// The pool records' traces are taken from; give a trace back once its record is gone.
    pub fn trace_pool(&self) -> Arc<TracePool> {
        Arc::clone(&self.traces)
    }

    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    pub fn shared_pipeline(&self) -> Arc<Pipeline> {
        Arc::clone(&self.pipeline)
    }

    /// Replaces the fleet for requests submitted from now on. Endpoints keep their host index
    /// by id, so per-endpoint plugin state follows them.
    pub fn set_fleet(&mut self, fleet: Fleet) {
        let indices = fleet
            .endpoints
            .iter()
            .map(|e| self.host_index_for(&e.id))
            .collect();
        self.fleet = Snapshot::new(fleet.endpoints, indices);
    }

    /// The host index of endpoint `id`, given it now if it never had one.
    pub fn host_index_for(&mut self, id: &str) -> u32 {
        if let Some(&index) = self.indices.get(id) {
            return index;
        }
        let index = self.indices.len() as u32;
        self.indices.insert(id.to_string(), index);
        index
    }

    /// Updates the load facts of the current fleet (same endpoints, same order). Requests
    /// under way keep the facts they were admitted with.
    pub fn update_metrics(
        &mut self,
        metrics: impl IntoIterator<Item = switchyard_plugin_api::EndpointMetrics>,
    ) {
        if Arc::get_mut(&mut self.fleet.endpoints).is_none() {
            self.fleet.endpoints = self.fleet.endpoints.iter().cloned().collect();
        }
        // Drop this snapshot's views before writing: they borrow the endpoints' strings.
        self.fleet.views = Arc::new([]);
        let endpoints = Arc::get_mut(&mut self.fleet.endpoints).expect("just made unique");
        for (endpoint, m) in endpoints.iter_mut().zip(metrics) {
            endpoint.metrics = m;
        }
        self.fleet = Snapshot::new(
            self.fleet.endpoints.clone(),
            self.fleet.host_indices.clone(),
        );
    }

    /// The endpoints new requests are scheduled against.
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.fleet.endpoints
    }

    pub fn stats(&self) -> Vec<(String, PluginStats)> {
        self.pipeline
            .plugins
            .iter()
            .zip(&self.stats)
            .map(|(p, s)| (p.label(), *s))
            .collect()
    }

    /// Requests waiting in a window.
    pub fn pending(&self) -> usize {
        self.windows.iter().flatten().map(|w| w.members.len()).sum()
    }

    /// When the earliest open window seals.
    pub fn next_deadline(&self) -> Option<f64> {
        self.windows
            .iter()
            .flatten()
            .map(|w| w.seal_ms)
            .min_by(|a, b| a.total_cmp(b))
    }

    /// Takes a request in at `now_ms`. Returns the decisions made right away (the request's
    /// own, unless it waits in a window).
    pub fn submit(&mut self, request: Request, now_ms: f64) -> Vec<Decision> {
        let fleet = self.fleet.clone();
        self.admit(request, fleet, now_ms)
    }

    /// As [`Scheduler::submit`], with the candidates limited to the endpoints `keep` accepts
    /// (a gateway's subset hint). Endpoints keep their host index, so per-endpoint plugin
    /// state follows them.
    pub fn submit_within(
        &mut self,
        request: Request,
        now_ms: f64,
        keep: impl Fn(&Endpoint) -> bool,
    ) -> Vec<Decision> {
        let fleet = if self.fleet.endpoints.iter().all(&keep) {
            self.fleet.clone()
        } else {
            let (endpoints, indices): (Vec<Endpoint>, Vec<u32>) = self
                .fleet
                .endpoints
                .iter()
                .zip(self.fleet.host_indices.iter())
                .filter(|(e, _)| keep(e))
                .map(|(e, &i)| (e.clone(), i))
                .unzip();
            Snapshot::new(endpoints.into(), indices.into())
        };
        self.admit(request, fleet, now_ms)
    }

    fn admit(&mut self, request: Request, fleet: Snapshot, now_ms: f64) -> Vec<Decision> {
        let record = self.explain.then(|| {
            self.traces
                .take(Arc::clone(&self.pipeline), Arc::clone(&fleet.endpoints))
        });
        let mut store = self.scratch.stores.pop().unwrap_or_default();
        fill_absent(&mut store, self.pipeline.rows.len() * fleet.len());
        let (prompts, estimated) = prompt_buffers(&self.pipeline.tokenizer, request.prompt);
        if let Some(why) = &estimated {
            mark_estimated(
                &self.pipeline,
                &mut store,
                fleet.len(),
                why,
                record.is_some(),
            );
        }
        let ticket = Ticket {
            store,
            request: Admitted::new(
                request.id,
                request.model,
                request.cache_salt,
                request.max_output_tokens,
                prompts,
                fleet,
                self.rng.next_u64(),
            ),
            next_producer: 0,
            arrival_ms: now_ms,
            record,
        };
        let mut decisions = Vec::new();
        let pipeline = Arc::clone(&self.pipeline);
        self.carry_on(&pipeline, ticket, now_ms, &mut decisions);
        decisions
    }

    /// Seals every window due by `now_ms` and carries its requests on.
    pub fn advance(&mut self, now_ms: f64) -> Vec<Decision> {
        let mut decisions = Vec::new();
        while let Some((position, _)) = self
            .windows
            .iter()
            .enumerate()
            .filter_map(|(position, w)| Some((position, w.as_ref()?)))
            .filter(|(_, w)| w.seal_ms <= now_ms)
            .min_by(|a, b| a.1.seal_ms.total_cmp(&b.1.seal_ms))
        {
            let mut window = self.windows[position].take().expect("window exists");
            // Only a request that keeps a record needs the window's.
            let info = window
                .members
                .iter()
                .any(|t| t.record.is_some())
                .then(|| WindowTrace {
                    producer: self.pipeline.producers[position],
                    opened_ms: window.opened_ms,
                    sealed_ms: now_ms,
                    batch_size: window.members.len(),
                });
            let pipeline = Arc::clone(&self.pipeline);
            self.run_producer(
                &pipeline,
                position,
                &mut window.members,
                now_ms,
                info.as_ref(),
            );
            let mut members = window.members;
            for mut ticket in members.drain(..) {
                ticket.next_producer = position + 1;
                self.carry_on(&pipeline, ticket, now_ms, &mut decisions);
            }
            if self.scratch.members.len() < SCRATCH_POOL {
                self.scratch.members.push(members);
            }
        }
        decisions
    }

    /// Withdraws a request: one waiting in a window leaves it without being placed (it is
    /// not counted in the batch); one already dispatched completes as cancelled. Returns
    /// whether the request was known.
    pub fn cancel(&mut self, request_id: &str, now_ms: f64) -> bool {
        let found = self.windows.iter().enumerate().find_map(|(position, w)| {
            let index = w
                .as_ref()?
                .members
                .iter()
                .position(|t| t.request.id == request_id)?;
            Some((position, index))
        });
        if let Some((position, index)) = found {
            if let Some(window) = &mut self.windows[position] {
                window.members.remove(index);
            }
            for slot in self.windows.iter_mut() {
                if slot.as_ref().is_some_and(|w| w.members.is_empty()) {
                    *slot = None;
                }
            }
            return true;
        }
        self.complete(request_id, Outcome::Cancelled, now_ms)
    }

    /// A dispatched request finished, failed or was cancelled; producers release what they
    /// charged. Returns false for unknown or already completed requests, which change nothing.
    pub fn complete(&mut self, request_id: &str, outcome: Outcome, now_ms: f64) -> bool {
        let Some((id, mut done)) = self.dispatched.remove_entry(request_id) else {
            return false;
        };
        // The id lives in the map's key while the request is dispatched.
        done.request.id = id;
        let request = done
            .request
            .view(done.request.prompt_views(), now_ms, false);
        let endpoint = done.request.fleet.view(done.endpoint);
        let placed_by = Arc::clone(&done.pipeline);
        let current = Arc::ptr_eq(&placed_by, &self.pipeline);
        for &old in &placed_by.producers {
            // Placed before a reload: only an instance of the same lineage has its charge —
            // the one the reload kept, or the one that took its state over; one the reload
            // replaced afresh is gone with its state, and a new one never saw the request.
            let plugin = if current {
                old
            } else {
                let lineage = placed_by.plugins[old].lineage;
                match self
                    .pipeline
                    .plugins
                    .iter()
                    .position(|p| p.lineage == lineage)
                {
                    Some(plugin) => plugin,
                    None => continue,
                }
            };
            if self.skips(plugin) {
                continue;
            }
            let wired = &self.pipeline.plugins[plugin];
            let result = {
                let _call = crash_note::enter(&wired.call_label, Entry::Completed.name());
                wired.object.completed(&request, &endpoint, outcome)
            };
            self.account(plugin, Entry::Completed, &result);
        }
        true
    }

    /// Runs the requests of every open window through the current pipeline now, then makes
    /// `pipeline` the one later requests go through, its new instances first taking over the
    /// state of the ones they replace ([`carry_state`]). Instances of the same lineage keep
    /// their counters; requests dispatched before complete on the instance of their lineage.
    /// Returns the decisions of the flushed windows and what became of each replaced
    /// instance's state.
    pub fn replace_pipeline(
        &mut self,
        mut pipeline: Pipeline,
        now_ms: f64,
    ) -> (Vec<Decision>, Vec<(String, Carried)>) {
        let mut decisions = Vec::new();
        // A flushed request may park in a later producer's window: flush until none is open.
        while self.windows.iter().any(Option::is_some) {
            for window in self.windows.iter_mut().flatten() {
                window.seal_ms = window.seal_ms.min(now_ms);
            }
            decisions.extend(self.advance(now_ms));
        }
        let carried = carry_state(&mut pipeline);
        let stats = pipeline
            .plugins
            .iter()
            .map(|new| {
                self.pipeline
                    .plugins
                    .iter()
                    .position(|old| old.lineage == new.lineage)
                    .map_or_else(PluginStats::default, |old| self.stats[old])
            })
            .collect();
        self.stats = stats;
        self.windows = pipeline.producers.iter().map(|_| None).collect();
        self.pipeline = Arc::new(pipeline);
        (decisions, carried)
    }

    /// Whether a producer's calls are skipped: switched off, or work the host does itself.
    fn skips(&self, plugin: usize) -> bool {
        self.stats[plugin].poisoned || self.pipeline.plugins[plugin].host_native
    }

    /// Runs the ticket's remaining producers, parking it in a window or deciding it.
    /// `pipeline` is `self.pipeline`, borrowed once by the caller for the whole request.
    fn carry_on(
        &mut self,
        pipeline: &Pipeline,
        mut ticket: Ticket,
        now_ms: f64,
        decisions: &mut Vec<Decision>,
    ) {
        while let Some(&plugin) = pipeline.producers.get(ticket.next_producer) {
            let position = ticket.next_producer;
            ticket.next_producer += 1;
            let wired = &pipeline.plugins[plugin];
            if wired.host_native {
                // Done on admission; the record still shows the step, and the note on the
                // first candidate when the ids are estimated.
                if let Some(record) = &mut ticket.record {
                    let row = wired.produced_rows.first().copied();
                    let n = ticket.request.fleet.len();
                    let noted = row
                        .and_then(|row| Some((row, ticket.store.get(row as usize * n)?)))
                        .filter(|(_, value)| n > 0 && !value.is_absent())
                        .map(|(row, value)| (row, 0, value));
                    record.push_producer(plugin, None, noted.into_iter());
                }
                continue;
            }
            if self.stats[plugin].poisoned {
                continue;
            }
            let Some(policy) = wired.declarations.batch() else {
                self.run_producer(
                    pipeline,
                    position,
                    std::slice::from_mut(&mut ticket),
                    now_ms,
                    None,
                );
                continue;
            };
            let pooled = &mut self.scratch.members;
            let window = self.windows[position].get_or_insert_with(|| Window {
                opened_ms: now_ms,
                seal_ms: now_ms + policy.window_ms as f64,
                members: pooled.pop().unwrap_or_default(),
            });
            if policy.max_batch < 0 || (window.members.len() as i64) < policy.max_batch {
                ticket.next_producer = position;
                window.members.push(ticket);
                // A window that seals once arrivals pause: each request that joins moves the
                // seal to a quiet gap after itself, never past the declared window.
                if let Some(quiet) = wired.batch_quiet_ms {
                    let latest = window.opened_ms + policy.window_ms as f64;
                    window.seal_ms = (now_ms + quiet as f64).min(latest);
                }
                return;
            }
            self.stats[plugin].batch_overflows += 1;
            let message = format!(
                "batch full: maxBatchSize {} reached in the window opened at {:.0} ms",
                policy.max_batch, window.opened_ms
            );
            tracing::debug!(producer = %wired.label(), "{message}");
            if let Some(record) = &mut ticket.record {
                record.push_producer(plugin, Some(message), std::iter::empty());
            }
        }
        decisions.push(self.decide(pipeline, ticket, now_ms));
    }

    /// One call of the producer at `position` over `tickets`, outputs moved into each
    /// ticket's store.
    fn run_producer(
        &mut self,
        pipeline: &Pipeline,
        position: usize,
        tickets: &mut [Ticket],
        now_ms: f64,
        window: Option<&WindowTrace>,
    ) {
        let plugin_index = pipeline.producers[position];
        let plugin = &pipeline.plugins[plugin_index];
        let produced = plugin.produced_rows.len();
        let explain = self.explain;

        // A call with a budget is timed every time; the host's own producers only on sampled
        // decisions, for the latency counters.
        let budget_ms = plugin.budget_ms();
        let started = (budget_ms.is_some() || self.sampled()).then(Instant::now);
        let result = {
            let mut offset = 0u32;
            let consumed = plugin.consumed_rows.as_slice();
            let item =
                |t, offset: &mut u32| produce_item(t, consumed, produced, now_ms, explain, offset);
            // One request (every plain producer's call): no list to build.
            let single;
            let many: Vec<ProduceItem<'_>>;
            let items: &[ProduceItem<'_>] = if let [ticket] = &*tickets {
                single = item(ticket, &mut offset);
                std::slice::from_ref(&single)
            } else {
                many = tickets.iter().map(|t| item(t, &mut offset)).collect();
                &many
            };
            let out = &mut self.scratch.produced;
            fill_absent(out, offset as usize);
            let _call = crash_note::enter(&plugin.call_label, Entry::Produce.name());
            plugin.object.produce(items, out)
        };
        let elapsed_ms = self
            .timed(plugin_index, started)
            .map_or(0.0, |elapsed| elapsed.as_secs_f64() * 1000.0);
        let result = match (result, budget_ms) {
            (Ok(()), Some(budget)) if elapsed_ms > budget as f64 => {
                self.stats[plugin_index].timeouts += 1;
                Err(PluginError::failed(format!(
                    "timed out: the call took {elapsed_ms:.0} ms, over its {budget} ms budget; \
                     its output was discarded"
                )))
            }
            (Ok(()), _) => check_produced(plugin, tickets, &self.scratch.produced, &pipeline.rows),
            (other, _) => other,
        };
        self.account(plugin_index, Entry::Produce, &result);
        let error = result.err().map(|e| e.message.to_string());
        if let Some(message) = &error {
            tracing::debug!(producer = %plugin.label(), "produce failed: {message}");
        }

        if error.is_none() {
            move_outputs(plugin, tickets, &mut self.scratch.produced);
        }
        for ticket in tickets.iter_mut() {
            let Some(record) = &mut ticket.record else {
                continue;
            };
            let n = ticket.request.fleet.len();
            let store = &ticket.store;
            let rows = if error.is_none() {
                &plugin.produced_rows[..]
            } else {
                &[]
            };
            let written = rows.iter().flat_map(|&row| {
                store[row as usize * n..][..n]
                    .iter()
                    .enumerate()
                    .filter(|(_, value)| !value.is_absent())
                    .map(move |(slot, value)| (row, slot as u32, value))
            });
            record.push_producer(plugin_index, error.clone(), written);
            if window.is_some() {
                record.window = window.copied();
            }
        }
    }

    /// Counts a call and applies the panic policy. Pickers are never switched off: a failing
    /// picker costs each request it fails, and there is no picker to fall back on.
    ///
    /// Panics are counted per entry point, so a success of one (a producer's dispatch hook)
    /// does not reset the streak of another (its produce call). The first error that is not
    /// a panic is logged once per instance; later ones are counted and logged at debug level.
    #[inline]
    fn account<T>(&mut self, plugin: usize, entry: Entry, result: &Result<T, PluginError>) {
        let wired = &self.pipeline.plugins[plugin];
        let stats = &mut self.stats[plugin];
        stats.calls += 1;
        let streak = &mut stats.consecutive_panics[entry as usize];
        let Err(error) = result else {
            *streak = 0;
            return;
        };
        stats.errors += 1;
        if error.kind != ErrorKind::Panicked {
            *streak = 0;
            if !stats.error_logged {
                stats.error_logged = true;
                tracing::warn!(
                    plugin = %wired.label(),
                    "{} failed: {} (later errors of this plugin are counted, not logged; \
                     RUST_LOG=debug shows each)",
                    entry.name(),
                    error.message
                );
            }
            return;
        }
        stats.panics += 1;
        *streak += 1;
        let streak = *streak;
        tracing::error!(plugin = %wired.label(), "{}: {}", entry.name(), error.message);
        if streak >= POISON_AFTER_PANICS && !stats.poisoned && wired.kind != PluginKind::Picker {
            stats.poisoned = true;
            tracing::error!(
                plugin = %wired.label(),
                "switched off after {POISON_AFTER_PANICS} panics in a row in {}; its stage now \
                 fails open",
                entry.name()
            );
        }
    }

    /// Whether the current decision's calls are timed.
    fn sampled(&self) -> bool {
        // TIMING_SAMPLE is a power of two.
        self.decisions & (TIMING_SAMPLE - 1) == 0
    }

    /// Adds a timed call's duration to its plugin's counters and returns it.
    fn timed(&mut self, plugin: usize, started: Option<Instant>) -> Option<Duration> {
        let elapsed = started?.elapsed();
        let stats = &mut self.stats[plugin];
        stats.timed_calls += 1;
        stats.timed_nanos += elapsed.as_nanos() as u64;
        Some(elapsed)
    }

    fn decide(&mut self, pipeline: &Pipeline, ticket: Ticket, now_ms: f64) -> Decision {
        self.decisions += 1;
        let Ticket {
            request: mut admitted,
            mut store,
            arrival_ms,
            mut record,
            ..
        } = ticket;
        let request = admitted.view(admitted.prompt_views(), now_ms, self.explain);
        // Copied only if a filter removes a candidate.
        let mut candidates = Cow::Borrowed(admitted.fleet.views());
        let stride = admitted.fleet.len();
        let outcome = self
            .filter(
                pipeline,
                &request,
                &mut candidates,
                &store,
                stride,
                &mut record,
            )
            .and_then(|()| {
                self.score(pipeline, &request, &candidates, &store, stride, &mut record);
                self.pick(&request, &candidates)
            });
        let predicted = match &outcome {
            Ok(chosen) => pipeline.prefix_rows.take(&store, stride, chosen[0]),
            Err(_) => Predicted::default(),
        };
        if self.scratch.stores.len() < SCRATCH_POOL {
            if pipeline.plain_rows {
                // SAFETY: with plain rows every value in the store is `Absent` or a variant of
                // a well-known data type (the host checked each producer's output against its
                // key's type before moving it in) or the host's empty text marker
                // (`mark_estimated`), none of which owns memory, so forgetting
                // the values instead of dropping them frees nothing that needed freeing.
                unsafe { store.set_len(0) };
            } else {
                store.clear();
            }
            self.scratch.stores.push(store);
        }
        let chosen = match outcome {
            Ok(chosen) => chosen,
            Err(reason) => {
                return Decision {
                    request_id: admitted.id,
                    result: Err(reason),
                    endpoints: Vec::new(),
                    decided_ms: now_ms,
                    arrival_ms,
                    record,
                    predicted,
                }
            }
        };
        let ids: Vec<String> = chosen
            .iter()
            .map(|&s| admitted.fleet.endpoints[s].id.clone())
            .collect();
        if let Some(record) = &mut record {
            record.picked.clear();
            record.picked.extend(chosen.iter().map(|&slot| slot as u32));
        }

        // Dispatch hooks: producers charge what they track against the primary endpoint.
        let primary = admitted.fleet.view(chosen[0]);
        for &producer in &pipeline.producers {
            if self.skips(producer) {
                continue;
            }
            let wired = &pipeline.plugins[producer];
            let result = {
                let _call = crash_note::enter(&wired.call_label, Entry::Dispatched.name());
                wired.object.dispatched(&request, &primary)
            };
            self.account(producer, Entry::Dispatched, &result);
        }
        drop(candidates);
        let request_id = admitted.id.clone();
        self.dispatched.insert(
            std::mem::take(&mut admitted.id),
            Dispatched {
                endpoint: chosen[0],
                request: admitted,
                pipeline: Arc::clone(&self.pipeline),
            },
        );
        Decision {
            request_id,
            result: Ok(chosen),
            endpoints: ids,
            decided_ms: now_ms,
            arrival_ms,
            record,
            predicted,
        }
    }

    /// Runs the filters in profile order, each on the previous one's output.
    fn filter(
        &mut self,
        pipeline: &Pipeline,
        request: &RequestView<'_>,
        candidates: &mut Cow<'_, [EndpointView<'_>]>,
        store: &[AttrValue],
        stride: usize,
        record: &mut Option<Box<DecisionTrace>>,
    ) -> Result<(), Rejection> {
        if candidates.is_empty() {
            return Err(Rejection::NoEndpoints);
        }
        let mut keep = std::mem::take(&mut self.scratch.keep);
        let mut note = RString::new();
        let mut outcome = Ok(());
        for &filter in &pipeline.filters {
            if self.stats[filter].poisoned {
                continue;
            }
            let plugin = &pipeline.plugins[filter];
            keep.clear();
            keep.resize(candidates.len(), true);
            note.clear();
            let attrs = attr_view(store, stride, &plugin.consumed_rows);
            let started = self.sampled().then(Instant::now);
            let result = {
                let _call = crash_note::enter(&plugin.call_label, Entry::Filter.name());
                plugin
                    .object
                    .filter(request, candidates, &attrs, &mut keep, &mut note)
            };
            self.timed(filter, started);
            self.account(filter, Entry::Filter, &result);
            if result.is_ok() && keep.contains(&false) {
                let mut kept = keep.iter();
                candidates
                    .to_mut()
                    .retain(|_| kept.next().copied().unwrap_or(true));
            }
            if let Some(record) = record {
                record.push_filter(
                    filter,
                    candidates.iter().map(|e| e.slot),
                    note.to_string(),
                    result
                        .err()
                        .map(|e| format!("{} (kept every candidate)", e.message)),
                );
            }
            if candidates.is_empty() {
                outcome = Err(Rejection::FilteredOut {
                    filter: plugin.label(),
                });
                break;
            }
        }
        self.scratch.keep = keep;
        outcome
    }

    /// Sums the weighted, clamped scores into `scratch.totals`.
    fn score(
        &mut self,
        pipeline: &Pipeline,
        request: &RequestView<'_>,
        candidates: &[EndpointView<'_>],
        store: &[AttrValue],
        stride: usize,
        record: &mut Option<Box<DecisionTrace>>,
    ) {
        let mut totals = std::mem::take(&mut self.scratch.totals);
        let mut scores = std::mem::take(&mut self.scratch.scores);
        totals.clear();
        totals.resize(candidates.len(), 0.0);
        let mut note = RString::new();
        for scorer in &pipeline.scorers {
            if self.stats[scorer.plugin].poisoned {
                continue;
            }
            let plugin = &pipeline.plugins[scorer.plugin];
            scores.clear();
            scores.resize(candidates.len(), 0.0);
            note.clear();
            let attrs = attr_view(store, stride, &plugin.consumed_rows);
            let started = self.sampled().then(Instant::now);
            let result = {
                let _call = crash_note::enter(&plugin.call_label, Entry::Score.name());
                plugin
                    .object
                    .score(request, candidates, &attrs, &mut scores, &mut note)
            };
            self.timed(scorer.plugin, started);
            self.account(scorer.plugin, Entry::Score, &result);
            if result.is_err() {
                scores.fill(0.0);
            }
            for (total, raw) in totals.iter_mut().zip(&scores) {
                *total += clamp_score(*raw) * scorer.weight;
            }
            if let Some(record) = record {
                record.push_scorer(
                    scorer.plugin,
                    scorer.weight,
                    &scores,
                    note.to_string(),
                    result.err().map(|e| format!("{} (scored 0)", e.message)),
                );
            }
        }
        if let Some(record) = record {
            record.scored.clear();
            record.scored.extend(candidates.iter().map(|e| e.slot));
            record.totals.clone_from(&totals);
        }
        self.scratch.totals = totals;
        self.scratch.scores = scores;
    }

    /// Asks the picker, over the totals of [`Scheduler::score`]; returns fleet positions.
    fn pick(
        &mut self,
        request: &RequestView<'_>,
        candidates: &[EndpointView<'_>],
    ) -> Result<Vec<usize>, Rejection> {
        let picker_index = self.pipeline.picker;
        let picker = &self.pipeline.plugins[picker_index];
        let mut picked = std::mem::take(&mut self.scratch.picked);
        picked.clear();
        // Positions the picker leaves unwritten stay out of range.
        picked.resize(candidates.len(), UNWRITTEN);
        let started = self.sampled().then(Instant::now);
        let result = {
            let _call = crash_note::enter(&picker.call_label, Entry::Pick.name());
            picker
                .object
                .pick(request, candidates, &self.scratch.totals, &mut picked)
        };
        self.timed(picker_index, started);
        let result = result
            .and_then(|count| check_picks(&picked, count, &mut self.scratch.seen).map(|()| count));
        self.account(picker_index, Entry::Pick, &result);
        let outcome = match result {
            Ok(count) => Ok(picked[..count]
                .iter()
                .map(|&p| candidates[p as usize].slot as usize)
                .collect()),
            Err(error) => Err(error.message.to_string()),
        };
        self.scratch.picked = picked;
        outcome.map_err(|reason| Rejection::PickerFailed {
            picker: self.pipeline.plugins[picker_index].label(),
            reason,
        })
    }
}

/// What the picker's buffer holds where it wrote nothing.
const UNWRITTEN: u32 = u32::MAX;

/// A picker's answer is `count` distinct positions among the candidates, all written.
/// `seen` is all `false` on entry and on return.
fn check_picks(picked: &[u32], count: usize, seen: &mut Vec<bool>) -> Result<(), PluginError> {
    let candidates = picked.len();
    if count == 0 {
        return Err(PluginError::failed("it chose no endpoint"));
    }
    if count > candidates {
        return Err(PluginError::failed(format!(
            "bad output: it returned {count} positions for {candidates} candidates"
        )));
    }
    if seen.len() < candidates {
        seen.resize(candidates, false);
    }
    let mut problem = None;
    let mut marked = 0;
    for (i, &position) in picked[..count].iter().enumerate() {
        if position == UNWRITTEN {
            problem = Some(format!("it returned {count} positions but wrote only {i}"));
            break;
        }
        let Some(slot) = seen
            .get_mut(position as usize)
            .filter(|_| (position as usize) < candidates)
        else {
            problem = Some(format!(
                "it chose position {position}, out of range for {candidates} candidates"
            ));
            break;
        };
        if *slot {
            problem = Some(format!("it chose position {position} twice"));
            break;
        }
        *slot = true;
        marked = i + 1;
    }
    for &position in &picked[..marked] {
        seen[position as usize] = false;
    }
    match problem {
        None => Ok(()),
        Some(message) => Err(PluginError::failed(format!("bad output: {message}"))),
    }
}

/// Moves a successful produce call's outputs from the call's buffer (items one after the
/// other, each key-major over its endpoints) into the tickets' stores, leaving the buffer
/// empty.
///
/// A key of a well-known data type holds values that own no memory (the host checked them),
/// so its row is overwritten by one copy; any other key's values replace the row's one by one,
/// dropping what was there (nothing, unless two outputs write one row).
fn move_outputs(
    plugin: &super::wiring::WiredPlugin,
    tickets: &mut [Ticket],
    outputs: &mut Vec<AttrValue>,
) {
    let produced = plugin.produced_rows.len();
    let expected: usize = tickets
        .iter()
        .map(|t| produced * t.request.fleet.len())
        .sum();
    assert_eq!(
        outputs.len(),
        expected,
        "the items' outputs tile the call's buffer"
    );
    let source = outputs.as_ptr();
    // SAFETY: from here on the loop below owns the buffer's values and reads each exactly once
    // (the items' outputs tile the buffer, as just checked); should it stop early, the rest
    // leak, and none is dropped twice. The buffer is not touched again before the loop ends,
    // so `source` stays valid.
    unsafe { outputs.set_len(0) };
    let mut offset = 0usize;
    for ticket in tickets.iter_mut() {
        let n = ticket.request.fleet.len();
        for (k, (&row, check)) in plugin
            .produced_rows
            .iter()
            .zip(&plugin.produced_checks)
            .enumerate()
        {
            let target = &mut ticket.store[row as usize * n..][..n];
            // SAFETY: in bounds (the tiling), and the buffer's values from here are unread.
            let from = unsafe { source.add(offset + k * n) };
            if *check == super::wiring::ValueCheck::Any {
                for (i, slot) in target.iter_mut().enumerate() {
                    // SAFETY: as above; each value is read once, then owned by the store.
                    *slot = unsafe { from.add(i).read() };
                }
            } else {
                // SAFETY: `n` values in bounds on both sides, in different buffers. The row's
                // values, `Absent` or of its well-known type, own no memory, so overwriting
                // them without dropping frees nothing that needed freeing.
                unsafe { std::ptr::copy_nonoverlapping(from, target.as_mut_ptr(), n) };
            }
        }
        offset += produced * n;
    }
}

/// A producer's output holds, under each key of a well-known data type, only that type's
/// values. Checked over the host's buffer after the call, allocating nothing unless it fails.
fn check_produced(
    plugin: &super::wiring::WiredPlugin,
    tickets: &[Ticket],
    produced: &[AttrValue],
    rows: &[switchyard_plugin_api::DataKey],
) -> Result<(), PluginError> {
    if plugin
        .produced_checks
        .iter()
        .all(|c| *c == super::wiring::ValueCheck::Any)
    {
        return Ok(());
    }
    let keys = plugin.produced_checks.len();
    let mut offset = 0;
    for ticket in tickets {
        let n = ticket.request.fleet.len();
        for (k, check) in plugin.produced_checks.iter().enumerate() {
            let values = &produced[offset + k * n..][..n];
            if let Some(e) = values.iter().position(|v| !check.accepts(v)) {
                return Err(PluginError::failed(format!(
                    "bad output: it wrote a {} value under {} for endpoint {}, which holds {}; \
                     the call's output was discarded",
                    super::wiring::variant_name(&values[e]),
                    rows[plugin.produced_rows[k] as usize],
                    ticket.request.fleet.endpoints[e].id,
                    check.expected()
                )));
            }
        }
        offset += keys * n;
    }
    Ok(())
}

/// The item of one ticket in a produce call whose outputs so far end at `offset`; advances
/// `offset` past this item's outputs.
fn produce_item<'a>(
    ticket: &'a Ticket,
    consumed_rows: &'a [u32],
    produced: usize,
    now_ms: f64,
    explain: bool,
    offset: &mut u32,
) -> ProduceItem<'a> {
    let request = &ticket.request;
    let item = ProduceItem {
        request: request.view(request.prompt_views(), now_ms, explain),
        endpoints: RSlice::from_slice(request.fleet.views()),
        attrs: attr_view(&ticket.store, request.fleet.len(), consumed_rows),
        out_offset: *offset,
    };
    *offset += (produced * request.fleet.len()) as u32;
    item
}

fn attr_view<'a>(store: &'a [AttrValue], stride: usize, rows: &'a [u32]) -> AttrView<'a> {
    AttrView {
        values: RSlice::from_slice(store),
        stride: stride as u32,
        rows: RSlice::from_slice(rows),
    }
}

/// Scores are clamped to [0, 1]; a NaN counts as 0 rather than poisoning the sum.
#[inline]
#[allow(
    clippy::manual_clamp,
    reason = "`clamp` keeps a NaN; `max` returns its other operand, so a NaN becomes 0"
)]
pub fn clamp_score(score: f64) -> f64 {
    // Both steps are branch-free, so the totals loop over the candidates vectorises.
    score.max(0.0).min(1.0)
}

fn endpoint_view(endpoint: &Endpoint, slot: usize, host_index: u32) -> EndpointView<'_> {
    EndpointView {
        slot: slot as u32,
        host_index,
        id: RStr::from(endpoint.id.as_str()),
        address: RStr::from(endpoint.address.as_str()),
        role: RStr::from(endpoint.role.as_str()),
        metrics: endpoint.metrics,
    }
}

#[cfg(test)]
mod tests {
    use super::clamp_score;

    #[test]
    fn scores_are_clamped_to_the_unit_interval_and_nan_counts_as_zero() {
        let cases = [
            (f64::NAN, 0.0),
            (-f64::NAN, 0.0),
            (f64::INFINITY, 1.0),
            (f64::NEG_INFINITY, 0.0),
            (-3.0, 0.0),
            (0.25, 0.25),
            (1.0, 1.0),
            (7.5, 1.0),
        ];
        for (raw, clamped) in cases {
            assert_eq!(clamp_score(raw), clamped, "{raw}");
        }
        assert_eq!(clamp_score(-0.0), 0.0);
    }
}
