//! The scheduler on the real clock, shared by the request handlers of a live driver.
//!
//! The [`Scheduler`] stays a synchronous state machine. It sits behind one mutex: a handler
//! admits its request under the lock and, unless the request parks in a batching window, gets
//! its decision back in the same call, with no hop to another thread. A single window task
//! sleeps until [`Scheduler::next_deadline`] and seals due windows. Due windows are also
//! sealed, at their own deadline, before any later arrival is admitted, so a window groups
//! exactly the arrivals that `replay` groups for the same arrival times.
//!
//! In-flight accounting: a placed request is charged at dispatch (by the scheduler's dispatch
//! hooks and by this module's per-endpoint counters) and released exactly once through its
//! [`InFlight`] guard, whichever way it ends. Endpoints that refuse connections are left out
//! of new decisions for [`EJECTION`].
//!
//! Decision records are filed in a ring as decisions are delivered, under the lock the
//! decision already holds. Once the ring is full, the record it pushes out is written over
//! for the new one and its trace goes back to the scheduler's pool: a record then costs no
//! lock and no allocation of its own.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use switchyard_plugin_api::sdk::extensions;
use switchyard_plugin_api::Outcome;
use tokio::sync::{oneshot, watch, Notify};

use super::clock::RealClock;
use crate::fleet::kv_events::{KvEvents, StatsSnapshot};
use crate::fleet::FleetState;
use crate::pipeline::carry::Carried;
use crate::pipeline::record::TracePool;
use crate::pipeline::scheduler::PluginStats;
use crate::pipeline::tokenize::{Estimated, PromptTokenizer, Tokenized};
use crate::pipeline::{
    Decision, Fleet, Pipeline, Predicted, Prompt, Rejection, Request, Scheduler,
};
use crate::replay::ReplayOutput;

/// How long an endpoint that refused a connection is left out of new decisions.
pub const EJECTION: Duration = Duration::from_secs(1);

/// In-flight limits; 0 means none.
#[derive(Debug, Clone, Copy, Default)]
pub struct Limits {
    pub per_endpoint: u32,
    pub total: u32,
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    pub endpoint_id: String,
    pub address: String,
    /// Addresses of the picker's further choices, best first (empty when it chose one).
    pub fallbacks: Vec<String>,
}

/// The endpoints a gateway allows for one request: `ip:port` entries, a bare IP meaning
/// every port of that host.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Subset {
    pub entries: Vec<String>,
}

impl Subset {
    /// Whether an endpoint at `address` (`host:port`) is allowed.
    pub fn allows(&self, address: &str) -> bool {
        let host = address
            .rsplit_once(':')
            .map_or(address, |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']');
        self.entries.iter().any(|entry| {
            entry == address || entry.trim_start_matches('[').trim_end_matches(']') == host
        })
    }
}

/// The outcome of placing one request.
#[derive(Debug)]
pub struct Placement {
    /// The id the scheduler knows the request by (the client's `x-request-id` unless another
    /// request in flight already uses it).
    pub request_id: String,
    pub result: Result<(Placed, InFlight), Rejection>,
    pub arrival_ms: f64,
    pub decided_ms: f64,
    /// Time spent inside the scheduler for this decision, windows excluded.
    pub cost: Duration,
    /// The decision record, when records are kept.
    pub record: Option<Arc<ReplayOutput>>,
    /// The prefix tokens the pipeline expected the chosen endpoint to hold, per producer.
    pub predicted: Predicted,
    /// Time spent turning a text prompt into token ids before admission; `None` when the
    /// request carried token ids or was refused before its prompt was read.
    pub tokenizing: Option<Duration>,
}

/// A dispatched request's charge. Released exactly once: by [`InFlight::finish`], or as
/// cancelled when dropped unfinished.
#[derive(Debug)]
pub struct InFlight {
    live: Arc<LiveScheduler>,
    request_id: String,
    endpoint_id: String,
    done: bool,
}

impl InFlight {
    pub fn finish(mut self, outcome: Outcome) {
        self.release(outcome);
    }

    pub fn endpoint_id(&self) -> &str {
        &self.endpoint_id
    }

    fn release(&mut self, outcome: Outcome) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        self.live
            .release(&self.request_id, &self.endpoint_id, outcome);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.release(Outcome::Cancelled);
    }
}

/// What one decision delivers to the request waiting for it.
struct Delivery {
    request_id: String,
    result: Result<Placed, Rejection>,
    arrival_ms: f64,
    decided_ms: f64,
    cost: Duration,
    record: Option<Arc<ReplayOutput>>,
    predicted: Predicted,
}

struct Inner {
    scheduler: Scheduler,
    fleet_updates: Option<watch::Receiver<Arc<FleetState>>>,
    fleet: Arc<FleetState>,
    /// Endpoints left out of new decisions, until when.
    ejected: Vec<(String, Instant)>,
    /// Requests admitted and not yet decided.
    waiting: HashMap<String, oneshot::Sender<Delivery>>,
    /// Ids of requests admitted and not yet released.
    live_ids: HashSet<String>,
    next_suffix: u64,
    in_flight: HashMap<String, u32>,
    total_in_flight: u32,
    /// Address of every endpoint seen, by id: a request decided for an endpoint that has
    /// left the fleet since its admission still finds it.
    addresses: HashMap<String, String>,
    /// The latest decision records, oldest first. Filed as decisions are delivered, under the
    /// lock the decision already holds, so a record costs no lock of its own.
    records: VecDeque<Arc<ReplayOutput>>,
}

/// The scheduler of a live driver, its clock and its in-flight accounting.
pub struct LiveScheduler {
    inner: Mutex<Inner>,
    window_due: Arc<Notify>,
    clock: RealClock,
    limits: Limits,
    keep_records: usize,
    /// Where the trace of a record pushed out of the ring goes, for a later decision.
    traces: Arc<TracePool>,
    /// The KV-event subscriptions feeding this scheduler's plugins, when any.
    kv_events: Mutex<Option<KvEvents>>,
    /// The running pipeline's tokenizer, read by each request's task without the scheduler's
    /// lock.
    tokenizer: Mutex<Arc<PromptTokenizer>>,
}

impl std::fmt::Debug for LiveScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveScheduler")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl LiveScheduler {
    /// Takes ownership of `scheduler` and starts the window task on the current runtime.
    /// `keep_records` > 0 turns decision records on and keeps that many of the latest.
    pub fn start(
        mut scheduler: Scheduler,
        mut fleet_updates: watch::Receiver<Arc<FleetState>>,
        clock: RealClock,
        limits: Limits,
        keep_records: usize,
    ) -> Arc<LiveScheduler> {
        scheduler.set_explain(keep_records > 0);
        let traces = scheduler.trace_pool();
        let tokenizer = Mutex::new(Arc::clone(&scheduler.pipeline().tokenizer));
        let fleet = fleet_updates.borrow_and_update().clone();
        let live = Arc::new(LiveScheduler {
            inner: Mutex::new(Inner {
                scheduler,
                fleet_updates: Some(fleet_updates),
                fleet,
                ejected: Vec::new(),
                waiting: HashMap::new(),
                live_ids: HashSet::new(),
                next_suffix: 0,
                in_flight: HashMap::new(),
                total_in_flight: 0,
                addresses: HashMap::new(),
                records: VecDeque::with_capacity(keep_records),
            }),
            window_due: Arc::new(Notify::new()),
            clock,
            limits,
            keep_records,
            traces,
            kv_events: Mutex::new(None),
            tokenizer,
        });
        live.lock().apply_fleet();
        tokio::spawn(seal_windows(Arc::downgrade(&live), live.window_due.clone()));
        live
    }

    pub fn clock(&self) -> RealClock {
        self.clock
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Places `request`: tokenizes its prompt on the caller's task, admits it and waits for its
    /// decision (at once, or when its window seals). Dropping the future withdraws the request
    /// or releases its charge.
    pub async fn place(self: &Arc<Self>, request: Request) -> Placement {
        self.place_within(request, None).await
    }

    /// As [`LiveScheduler::place`], choosing only among the endpoints `subset` allows.
    pub async fn place_within(
        self: &Arc<Self>,
        mut request: Request,
        subset: Option<&Subset>,
    ) -> Placement {
        let tokenizing = if request.prompt.is_text() {
            // Refused now rather than after tokenizing, the costliest step of admission.
            {
                let mut inner = self.lock();
                if let Some((key, limit)) = self.saturated(&inner) {
                    let id = inner.unique_id(request.id);
                    return self.refused(id, self.clock.now_ms(), key, limit);
                }
            }
            let started = Instant::now();
            request.prompt = self.tokenized(request.prompt).await;
            Some(started.elapsed())
        } else {
            None
        };
        let arrival_ms;
        let receiver;
        let request_id;
        {
            let mut inner = self.lock();
            let now = self.clock.now_ms();
            arrival_ms = now;
            self.seal_due(&mut inner, now);
            self.sync_fleet(&mut inner);
            request.id = inner.unique_id(request.id);
            if let Some((key, limit)) = self.saturated(&inner) {
                let mut refused = self.refused(request.id, now, key, limit);
                refused.tokenizing = tokenizing;
                return refused;
            }
            let (sender, rx) = oneshot::channel();
            receiver = rx;
            request_id = request.id.clone();
            inner.live_ids.insert(request_id.clone());
            inner.waiting.insert(request_id.clone(), sender);
            let started = Instant::now();
            let decisions = match subset {
                None => inner.scheduler.submit(request, now),
                Some(subset) => inner
                    .scheduler
                    .submit_within(request, now, |e| subset.allows(&e.address)),
            };
            let cost = started.elapsed();
            if decisions.is_empty() {
                self.window_due.notify_one();
            }
            self.deliver(&mut inner, decisions, cost);
        }
        let mut pending = PendingPlacement {
            live: self,
            request_id: &request_id,
            receiver: Some(receiver),
        };
        let delivery = match pending.receiver.as_mut().expect("set above").await {
            Ok(delivery) => delivery,
            Err(_) => Delivery {
                request_id: request_id.clone(),
                result: Err(Rejection::NoEndpoints),
                arrival_ms,
                decided_ms: self.clock.now_ms(),
                cost: Duration::ZERO,
                record: None,
                predicted: Predicted::default(),
            },
        };
        pending.receiver = None;
        let mut placement = self.into_placement(delivery);
        placement.tokenizing = tokenizing;
        placement
    }

    /// The prompt's token ids, made by the running pipeline's tokenizer outside the scheduler's
    /// lock; a long text is encoded on a blocking thread, not on an async worker. A reload
    /// between this and admission leaves the request tokenized by the tokenizer it found.
    async fn tokenized(&self, prompt: Prompt) -> Prompt {
        if !prompt.is_text() {
            return prompt;
        }
        let tokenizer = Arc::clone(&self.tokenizer.lock().unwrap_or_else(|e| e.into_inner()));
        if tokenizer.is_quick(&prompt) {
            return Prompt::Tokenized(tokenizer.tokenize(prompt));
        }
        let tokenized = tokio::task::spawn_blocking(move || tokenizer.tokenize(prompt)).await;
        // `tokenize` catches the tokenizer's panics: only a runtime shutting down gets here.
        Prompt::Tokenized(tokenized.unwrap_or_else(|e| Tokenized {
            prompts: Vec::new(),
            estimated: Some(Estimated::Failed(e.to_string())),
        }))
    }

    /// The in-flight limit that a new request would exceed now, with its value, if any.
    fn saturated(&self, inner: &Inner) -> Option<(&'static str, u32)> {
        if self.limits.total > 0 && inner.total_in_flight >= self.limits.total {
            return Some(("max_in_flight", self.limits.total));
        }
        let every_endpoint_full = !inner.fleet.members.is_empty()
            && inner.fleet.members.iter().all(|m| {
                inner.in_flight.get(&m.endpoint.id).copied().unwrap_or(0)
                    >= self.limits.per_endpoint
            });
        (self.limits.per_endpoint > 0 && every_endpoint_full)
            .then_some(("max_in_flight_per_endpoint", self.limits.per_endpoint))
    }

    fn refused(&self, request_id: String, now: f64, key: &str, limit: u32) -> Placement {
        Placement {
            request_id,
            result: Err(Rejection::Saturated {
                limit: format!("{key} = {limit} requests in flight reached"),
            }),
            arrival_ms: now,
            decided_ms: now,
            cost: Duration::ZERO,
            record: None,
            predicted: Predicted::default(),
            tokenizing: None,
        }
    }

    fn into_placement(self: &Arc<Self>, delivery: Delivery) -> Placement {
        let Delivery {
            request_id,
            result,
            arrival_ms,
            decided_ms,
            cost,
            record,
            predicted,
        } = delivery;
        let result = result.map(|placed| {
            let guard = InFlight {
                live: self.clone(),
                request_id: request_id.clone(),
                endpoint_id: placed.endpoint_id.clone(),
                done: false,
            };
            (placed, guard)
        });
        Placement {
            request_id,
            result,
            arrival_ms,
            decided_ms,
            cost,
            record,
            predicted,
            tokenizing: None,
        }
    }

    /// Leaves `endpoint_id` out of new decisions for [`EJECTION`].
    pub fn eject(&self, endpoint_id: &str) {
        let mut inner = self.lock();
        let until = Instant::now() + EJECTION;
        inner.ejected.retain(|(id, _)| id != endpoint_id);
        inner.ejected.push((endpoint_id.to_string(), until));
        inner.apply_fleet();
    }

    /// The pipeline new requests go through.
    pub fn pipeline(&self) -> Arc<Pipeline> {
        self.lock().scheduler.shared_pipeline()
    }

    /// Makes `pipeline` the one new requests go through, between two decisions: requests
    /// waiting in a window are decided first, by the pipeline they entered.
    pub fn replace_pipeline(&self, pipeline: Pipeline) -> Vec<(String, Carried)> {
        *self.tokenizer.lock().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&pipeline.tokenizer);
        let mut inner = self.lock();
        let now = self.clock.now_ms();
        let started = Instant::now();
        let (decisions, carried) = inner.scheduler.replace_pipeline(pipeline, now);
        let cost = started.elapsed() / decisions.len().max(1) as u32;
        self.deliver(&mut inner, decisions, cost);
        carried
    }

    /// The pipeline KV-cache events go to now, and the host index of `endpoint_id` in it.
    pub fn kv_target(&self, endpoint_id: &str) -> (Arc<Pipeline>, u32) {
        let mut inner = self.lock();
        self.sync_fleet(&mut inner);
        let index = inner.scheduler.host_index_for(endpoint_id);
        (inner.scheduler.shared_pipeline(), index)
    }

    /// The ids of the fleet's endpoints now.
    pub fn endpoint_ids(&self) -> Vec<String> {
        let mut inner = self.lock();
        self.sync_fleet(&mut inner);
        inner
            .fleet
            .members
            .iter()
            .map(|m| m.endpoint.id.clone())
            .collect()
    }

    /// Keeps the KV-event subscriptions for as long as the scheduler runs.
    pub fn attach_kv_events(&self, kv_events: KvEvents) {
        *self.kv_events.lock().unwrap_or_else(|e| e.into_inner()) = Some(kv_events);
    }

    /// The KV-event subscriptions' counters; `None` when there are none.
    pub fn kv_event_stats(&self) -> Option<Vec<StatsSnapshot>> {
        let kv_events = self.kv_events.lock().unwrap_or_else(|e| e.into_inner());
        kv_events.as_ref().map(KvEvents::stats)
    }

    /// Requests in flight per endpoint id, and in total.
    pub fn in_flight(&self) -> (Vec<(String, u32)>, u32) {
        let inner = self.lock();
        let mut per: Vec<(String, u32)> = inner
            .in_flight
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        per.sort();
        (per, inner.total_in_flight)
    }

    /// Each plugin's label, type name, library digest (`None` for a built-in) and counters.
    pub fn plugin_stats(&self) -> Vec<(String, String, Option<String>, PluginStats)> {
        let inner = self.lock();
        let pipeline = inner.scheduler.pipeline();
        inner
            .scheduler
            .stats()
            .into_iter()
            .zip(&pipeline.plugins)
            .map(|((label, stats), plugin)| {
                (
                    label,
                    plugin.type_name.clone(),
                    plugin.digest.clone(),
                    stats,
                )
            })
            .collect()
    }

    /// Each plugin's `state` extension: its JSON snapshot, or why there is none.
    pub fn plugin_states(&self) -> Vec<(String, Result<String, String>)> {
        let inner = self.lock();
        inner
            .scheduler
            .pipeline()
            .plugins
            .iter()
            .map(|p| {
                (
                    p.label(),
                    p.object
                        .extension(extensions::STATE, "")
                        .map_err(|e| e.message.to_string()),
                )
            })
            .collect()
    }

    /// The latest decision records, oldest first.
    pub fn records(&self, limit: usize) -> Vec<Arc<ReplayOutput>> {
        let inner = self.lock();
        let skip = inner.records.len().saturating_sub(limit);
        inner.records.iter().skip(skip).cloned().collect()
    }

    /// Keeps a record of `decision` in the ring. The record it pushes out, unless a reader
    /// still holds it, is written over in place and its trace goes back to the pool, so a
    /// record costs no allocation once the ring is full.
    fn file(
        &self,
        inner: &mut Inner,
        decision: &mut Decision,
        error: Option<String>,
    ) -> Arc<ReplayOutput> {
        let mut evicted = if inner.records.len() >= self.keep_records {
            inner.records.pop_front()
        } else {
            None
        };
        let trace = decision.record.take();
        let record = match evicted.as_mut().and_then(Arc::get_mut) {
            Some(reused) => {
                reused.id.clear();
                reused.id.push_str(&decision.request_id);
                reused.arrival_ms = decision.arrival_ms;
                reused.decided_ms = decision.decided_ms;
                copy_ids(&mut reused.endpoints, &decision.endpoints);
                reused.error = error;
                if let Some(old) = std::mem::replace(&mut reused.decision, trace) {
                    self.traces.give_back(old);
                }
                evicted.expect("written over above")
            }
            None => Arc::new(ReplayOutput {
                id: decision.request_id.clone(),
                arrival_ms: decision.arrival_ms,
                decided_ms: decision.decided_ms,
                endpoints: decision.endpoints.clone(),
                error,
                decision: trace,
            }),
        };
        inner.records.push_back(record.clone());
        record
    }

    /// Requests waiting in a window.
    pub fn pending(&self) -> usize {
        self.lock().scheduler.pending()
    }

    fn release(&self, request_id: &str, endpoint_id: &str, outcome: Outcome) {
        let now = self.clock.now_ms();
        self.lock().release(request_id, endpoint_id, outcome, now);
    }

    /// A request whose placement future was dropped: withdraw it from its window, or release
    /// a placement already delivered.
    fn abandon(&self, request_id: &str, receiver: &mut oneshot::Receiver<Delivery>) {
        let mut inner = self.lock();
        if inner.waiting.remove(request_id).is_some() {
            let now = self.clock.now_ms();
            inner.scheduler.cancel(request_id, now);
            inner.live_ids.remove(request_id);
            return;
        }
        drop(inner);
        if let Ok(delivery) = receiver.try_recv() {
            if let Ok(placed) = delivery.result {
                self.release(request_id, &placed.endpoint_id, Outcome::Cancelled);
            }
        }
    }

    /// Seals, at their own deadlines, the windows due by `now`.
    fn seal_due(&self, inner: &mut Inner, now: f64) {
        while let Some(deadline) = inner.scheduler.next_deadline().filter(|d| *d <= now) {
            let started = Instant::now();
            let decisions = inner.scheduler.advance(deadline);
            let cost = started.elapsed() / decisions.len().max(1) as u32;
            self.deliver(inner, decisions, cost);
        }
    }

    /// Hands each decision to the request waiting for it, charging placed ones.
    fn deliver(&self, inner: &mut Inner, decisions: Vec<Decision>, cost: Duration) {
        for mut decision in decisions {
            let now = self.clock.now_ms();
            let mut result = match &decision.result {
                Ok(_) => {
                    let id = decision.endpoints.first().cloned().unwrap_or_default();
                    let address = inner.addresses.get(&id).cloned().unwrap_or_default();
                    let fallbacks = decision
                        .endpoints
                        .iter()
                        .skip(1)
                        .filter_map(|id| inner.addresses.get(id).cloned())
                        .collect();
                    Ok(Placed {
                        endpoint_id: id,
                        address,
                        fallbacks,
                    })
                }
                Err(rejection) => Err(rejection.clone()),
            };
            if let Ok(placed) = &result {
                let count = inner
                    .in_flight
                    .get(&placed.endpoint_id)
                    .copied()
                    .unwrap_or(0);
                if self.limits.per_endpoint > 0 && count >= self.limits.per_endpoint {
                    inner
                        .scheduler
                        .complete(&decision.request_id, Outcome::Cancelled, now);
                    result = Err(Rejection::Saturated {
                        limit: format!(
                            "max_in_flight_per_endpoint = {} requests in flight reached on \
                             {}",
                            self.limits.per_endpoint, placed.endpoint_id
                        ),
                    });
                } else {
                    inner.charge(&placed.endpoint_id);
                }
            }
            if result.is_err() {
                inner.live_ids.remove(&decision.request_id);
            }
            let record = (self.keep_records > 0).then(|| {
                let error = decision.result.as_ref().err().map(Rejection::to_string);
                self.file(inner, &mut decision, error)
            });
            let delivery = Delivery {
                request_id: decision.request_id,
                result,
                arrival_ms: decision.arrival_ms,
                decided_ms: decision.decided_ms,
                cost,
                record,
                predicted: decision.predicted,
            };
            let unsent = match inner.waiting.remove(&delivery.request_id) {
                Some(sender) => sender.send(delivery),
                None => Err(delivery),
            };
            if let Err(unsent) = unsent {
                // The client left between admission and decision (its record is kept).
                match unsent.result {
                    Ok(placed) => inner.release(
                        &unsent.request_id,
                        &placed.endpoint_id,
                        Outcome::Cancelled,
                        now,
                    ),
                    Err(_) => {
                        inner.live_ids.remove(&unsent.request_id);
                    }
                }
            }
        }
    }

    /// Applies a new fleet snapshot, or an ejection that ran out, before the next admission.
    fn sync_fleet(&self, inner: &mut Inner) {
        let now = Instant::now();
        let expired = inner.ejected.iter().any(|(_, until)| *until <= now);
        let changed = inner
            .fleet_updates
            .as_ref()
            .is_some_and(|rx| rx.has_changed().unwrap_or(false));
        if changed {
            if let Some(rx) = inner.fleet_updates.as_mut() {
                inner.fleet = rx.borrow_and_update().clone();
            }
        }
        if expired {
            inner.ejected.retain(|(_, until)| *until > now);
        }
        if changed || expired {
            inner.apply_fleet();
        }
    }
}

/// Seals windows when they are due, for as long as the scheduler lives.
async fn seal_windows(live: Weak<LiveScheduler>, window_due: Arc<Notify>) {
    loop {
        let notified = window_due.notified();
        let Some(deadline) = live
            .upgrade()
            .map(|l| (l.lock().scheduler.next_deadline(), l.clock))
        else {
            return;
        };
        match deadline {
            (Some(ms), clock) => {
                let at = tokio::time::Instant::from_std(clock.instant_at(ms));
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = notified => continue,
                }
                let Some(live) = live.upgrade() else { return };
                let mut inner = live.lock();
                live.seal_due(&mut inner, clock.now_ms());
            }
            // Wake now and then even when idle, so a dropped scheduler ends this task.
            (None, _) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
            }
        }
    }
}

impl Inner {
    /// Counts a dispatch to `endpoint_id`.
    fn charge(&mut self, endpoint_id: &str) {
        match self.in_flight.get_mut(endpoint_id) {
            Some(count) => *count += 1,
            None => {
                self.in_flight.insert(endpoint_id.to_string(), 1);
            }
        }
        self.total_in_flight += 1;
    }

    /// Completes a dispatched request in the scheduler and takes back its charge.
    fn release(&mut self, request_id: &str, endpoint_id: &str, outcome: Outcome, now: f64) {
        self.scheduler.complete(request_id, outcome, now);
        self.live_ids.remove(request_id);
        if let Some(count) = self.in_flight.get_mut(endpoint_id) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.in_flight.remove(endpoint_id);
            }
        }
        self.total_in_flight = self.total_in_flight.saturating_sub(1);
    }

    /// `id`, or `id` with a suffix when another live request already uses it.
    fn unique_id(&mut self, id: String) -> String {
        if !self.live_ids.contains(&id) {
            return id;
        }
        loop {
            self.next_suffix += 1;
            let candidate = format!("{id}~{}", self.next_suffix);
            if !self.live_ids.contains(&candidate) {
                return candidate;
            }
        }
    }

    fn apply_fleet(&mut self) {
        for member in self.fleet.members.iter() {
            if self.addresses.get(&member.endpoint.id) != Some(&member.endpoint.address) {
                self.addresses
                    .insert(member.endpoint.id.clone(), member.endpoint.address.clone());
            }
        }
        let endpoints = self
            .fleet
            .members
            .iter()
            .filter(|m| !self.ejected.iter().any(|(id, _)| *id == m.endpoint.id))
            .map(|m| m.endpoint.clone())
            .collect();
        self.scheduler.set_fleet(Fleet::new(endpoints));
    }
}

/// Withdraws a request whose placement future is dropped before it returns.
struct PendingPlacement<'a> {
    live: &'a Arc<LiveScheduler>,
    request_id: &'a str,
    receiver: Option<oneshot::Receiver<Delivery>>,
}

impl Drop for PendingPlacement<'_> {
    fn drop(&mut self) {
        if let Some(mut receiver) = self.receiver.take() {
            self.live.abandon(self.request_id, &mut receiver);
        }
    }
}

/// Makes `to` a copy of `from`, reusing the strings `to` already holds.
fn copy_ids(to: &mut Vec<String>, from: &[String]) {
    to.truncate(from.len());
    for (kept, id) in to.iter_mut().zip(from) {
        kept.clear();
        kept.push_str(id);
    }
    let kept = to.len();
    to.extend(from[kept..].iter().cloned());
}
