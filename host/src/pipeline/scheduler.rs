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

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use switchyard_plugin_api::ffi::{RSlice, RStr, RString};
use switchyard_plugin_api::{
    AttrValue, AttrView, EndpointView, ErrorKind, Outcome, PluginError, ProduceItem, PromptTokens,
    RequestView,
};

use super::record::{
    attribute_json, AttributeRecord, DecisionRecord, EndpointScore, FilterRecord, ProducerRecord,
    ScoreEntry, ScorerRecord, WindowRecord,
};
use super::request::{Endpoint, Fleet, Request};
use super::tokenize::tokenize;
use super::wiring::Pipeline;

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
    pub record: Option<DecisionRecord>,
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
    #[serde(skip)]
    consecutive_panics: u32,
}

/// The endpoints a request was scheduled against, with their host indices.
#[derive(Clone)]
struct Snapshot {
    endpoints: Arc<[Endpoint]>,
    host_indices: Arc<[u32]>,
}

impl Snapshot {
    fn len(&self) -> usize {
        self.endpoints.len()
    }

    fn views(&self) -> Vec<EndpointView<'_>> {
        self.endpoints
            .iter()
            .zip(self.host_indices.iter())
            .enumerate()
            .map(|(slot, (e, &host_index))| endpoint_view(e, slot, host_index))
            .collect()
    }
}

struct Ticket {
    request: Request,
    prompts: Vec<Vec<u32>>,
    fleet: Snapshot,
    /// Attribute rows × candidates.
    store: Vec<AttrValue>,
    /// Position in `Pipeline::producers` of the next producer to run.
    next_producer: usize,
    seed: u64,
    arrival_ms: f64,
    record: Option<DecisionRecord>,
}

struct Window {
    opened_ms: f64,
    seal_ms: f64,
    members: Vec<u64>,
}

struct Dispatched {
    request: Request,
    prompts: Vec<Vec<u32>>,
    fleet: Snapshot,
    endpoint: usize,
    seed: u64,
}

pub struct Scheduler {
    pipeline: Arc<Pipeline>,
    fleet: Snapshot,
    rng: SmallRng,
    explain: bool,
    tickets: HashMap<u64, Ticket>,
    next_ticket: u64,
    /// Open window per position in `Pipeline::producers`.
    windows: BTreeMap<usize, Window>,
    dispatched: HashMap<String, Dispatched>,
    stats: Vec<PluginStats>,
    scratch: Vec<AttrValue>,
}

impl Scheduler {
    pub fn new(pipeline: Arc<Pipeline>, fleet: Fleet, seed: u64) -> Scheduler {
        let stats = vec![PluginStats::default(); pipeline.plugins.len()];
        let host_indices = (0..fleet.endpoints.len() as u32).collect();
        Scheduler {
            pipeline,
            fleet: Snapshot {
                endpoints: fleet.endpoints,
                host_indices,
            },
            rng: SmallRng::seed_from_u64(seed),
            explain: false,
            tickets: HashMap::new(),
            next_ticket: 0,
            windows: BTreeMap::new(),
            dispatched: HashMap::new(),
            stats,
            scratch: Vec::new(),
        }
    }

    /// Record every decision (see [`DecisionRecord`]).
    pub fn set_explain(&mut self, explain: bool) {
        self.explain = explain;
    }

    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// Replaces the fleet for requests submitted from now on. Endpoints keep their host index
    /// by id, so per-endpoint plugin state follows them.
    pub fn set_fleet(&mut self, fleet: Fleet) {
        let old: HashMap<&str, u32> = self
            .fleet
            .endpoints
            .iter()
            .zip(self.fleet.host_indices.iter())
            .map(|(e, &i)| (e.id.as_str(), i))
            .collect();
        let mut next = self
            .fleet
            .host_indices
            .iter()
            .copied()
            .max()
            .map_or(0, |m| m + 1);
        let indices = fleet
            .endpoints
            .iter()
            .map(|e| {
                old.get(e.id.as_str()).copied().unwrap_or_else(|| {
                    next += 1;
                    next - 1
                })
            })
            .collect();
        self.fleet = Snapshot {
            endpoints: fleet.endpoints,
            host_indices: indices,
        };
    }

    /// Updates the load facts of the current fleet in place (same endpoints, same order).
    pub fn update_metrics(
        &mut self,
        metrics: impl IntoIterator<Item = switchyard_plugin_api::EndpointMetrics>,
    ) {
        let mut endpoints: Vec<Endpoint> = self.fleet.endpoints.to_vec();
        for (endpoint, m) in endpoints.iter_mut().zip(metrics) {
            endpoint.metrics = m;
        }
        self.fleet.endpoints = endpoints.into();
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
        self.tickets.len()
    }

    /// When the earliest open window seals.
    pub fn next_deadline(&self) -> Option<f64> {
        self.windows
            .values()
            .map(|w| w.seal_ms)
            .min_by(|a, b| a.total_cmp(b))
    }

    /// Takes a request in at `now_ms`. Returns the decisions made right away (the request's
    /// own, unless it waits in a window).
    pub fn submit(&mut self, request: Request, now_ms: f64) -> Vec<Decision> {
        let fleet = self.fleet.clone();
        let prompts = tokenize(&request.prompt);
        let record = self.explain.then(|| DecisionRecord {
            candidates: fleet.endpoints.iter().map(|e| e.id.clone()).collect(),
            ..DecisionRecord::default()
        });
        let ticket = Ticket {
            store: vec![AttrValue::Absent; self.pipeline.rows.len() * fleet.len()],
            request,
            prompts,
            fleet,
            next_producer: 0,
            seed: self.rng.next_u64(),
            arrival_ms: now_ms,
            record,
        };
        let id = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.insert(id, ticket);
        let mut decisions = Vec::new();
        self.carry_on(id, now_ms, &mut decisions);
        decisions
    }

    /// Seals every window due by `now_ms` and carries its requests on.
    pub fn advance(&mut self, now_ms: f64) -> Vec<Decision> {
        let mut decisions = Vec::new();
        while let Some((&position, _)) = self
            .windows
            .iter()
            .filter(|(_, w)| w.seal_ms <= now_ms)
            .min_by(|a, b| a.1.seal_ms.total_cmp(&b.1.seal_ms))
        {
            let window = self.windows.remove(&position).expect("window exists");
            self.run_batch(position, &window, now_ms);
            for id in window.members {
                if let Some(ticket) = self.tickets.get_mut(&id) {
                    ticket.next_producer = position + 1;
                }
                self.carry_on(id, now_ms, &mut decisions);
            }
        }
        decisions
    }

    /// Seals every open window now (for shutdown or the end of a replay).
    pub fn flush(&mut self, now_ms: f64) -> Vec<Decision> {
        let latest = self.next_deadline().map_or(now_ms, |d| d.max(now_ms));
        let mut decisions = Vec::new();
        while self.next_deadline().is_some() {
            decisions.extend(self.advance(latest.max(self.next_deadline().unwrap_or(latest))));
        }
        decisions
    }

    /// A dispatched request finished, failed or was cancelled; producers release what they
    /// charged. Unknown or already completed requests are ignored.
    pub fn complete(&mut self, request_id: &str, outcome: Outcome, now_ms: f64) {
        let Some(done) = self.dispatched.remove(request_id) else {
            return;
        };
        let prompt_views: Vec<PromptTokens<'_>> = done
            .prompts
            .iter()
            .map(|p| PromptTokens {
                tokens: RSlice::from_slice(p),
            })
            .collect();
        let request = request_view(&done.request, &prompt_views, now_ms, done.seed, false);
        let endpoint = endpoint_view(
            &done.fleet.endpoints[done.endpoint],
            done.endpoint,
            done.fleet.host_indices[done.endpoint],
        );
        for position in 0..self.pipeline.producers.len() {
            let plugin = self.pipeline.producers[position];
            if self.stats[plugin].poisoned {
                continue;
            }
            let result = self.pipeline.plugins[plugin]
                .object
                .completed(&request, &endpoint, outcome);
            self.account(plugin, &result);
        }
    }

    /// Runs the ticket's remaining producers, parking it in a window or deciding it.
    fn carry_on(&mut self, id: u64, now_ms: f64, decisions: &mut Vec<Decision>) {
        let pipeline = self.pipeline.clone();
        loop {
            let Some(ticket) = self.tickets.get(&id) else {
                return;
            };
            let position = ticket.next_producer;
            if position >= pipeline.producers.len() {
                break;
            }
            let plugin = pipeline.producers[position];
            let wired = &pipeline.plugins[plugin];
            if self.stats[plugin].poisoned {
                self.tickets.get_mut(&id).expect("ticket").next_producer += 1;
                continue;
            }
            if let Some(policy) = wired.declarations.batch() {
                let window = self.windows.entry(position).or_insert_with(|| Window {
                    opened_ms: now_ms,
                    seal_ms: now_ms + policy.window_ms as f64,
                    members: Vec::new(),
                });
                let full = policy.max_batch >= 0 && window.members.len() as i64 >= policy.max_batch;
                if !full {
                    window.members.push(id);
                    return;
                }
                self.stats[plugin].batch_overflows += 1;
                let message = format!(
                    "batch full: maxBatchSize {} reached in the window opened at {:.0} ms",
                    policy.max_batch, window.opened_ms
                );
                tracing::debug!(producer = %wired.label(), "{message}");
                let ticket = self.tickets.get_mut(&id).expect("ticket");
                if let Some(record) = &mut ticket.record {
                    record.producers.push(ProducerRecord {
                        name: wired.label(),
                        error: Some(message),
                        attributes: Vec::new(),
                    });
                }
                ticket.next_producer += 1;
                continue;
            }
            self.run_single(position, id, now_ms);
            self.tickets.get_mut(&id).expect("ticket").next_producer += 1;
        }
        let ticket = self.tickets.remove(&id).expect("ticket");
        let decision = self.decide(ticket, now_ms);
        decisions.push(decision);
    }

    fn run_single(&mut self, position: usize, id: u64, now_ms: f64) {
        let ticket = self.tickets.remove(&id).expect("ticket");
        let mut tickets = [ticket];
        self.run_producer(position, &mut tickets, now_ms, None);
        let [ticket] = tickets;
        self.tickets.insert(id, ticket);
    }

    fn run_batch(&mut self, position: usize, window: &Window, now_ms: f64) {
        let mut batch: Vec<Ticket> = window
            .members
            .iter()
            .filter_map(|id| self.tickets.remove(id))
            .collect();
        let info = WindowRecord {
            producer: self.pipeline.plugins[self.pipeline.producers[position]].label(),
            opened_ms: window.opened_ms,
            sealed_ms: now_ms,
            batch_size: batch.len(),
        };
        self.run_producer(position, &mut batch, now_ms, Some(info));
        for (id, ticket) in window.members.iter().zip(batch) {
            self.tickets.insert(*id, ticket);
        }
    }

    /// One call of the producer at `position` over `tickets`, outputs copied into each
    /// ticket's store.
    fn run_producer(
        &mut self,
        position: usize,
        tickets: &mut [Ticket],
        now_ms: f64,
        window: Option<WindowRecord>,
    ) {
        let pipeline = self.pipeline.clone();
        let plugin_index = pipeline.producers[position];
        let plugin = &pipeline.plugins[plugin_index];
        let produced = plugin.produced_rows.len();
        let explain = self.explain;

        let started = Instant::now();
        let result = {
            let prompt_views: Vec<Vec<PromptTokens<'_>>> = tickets
                .iter()
                .map(|t| {
                    t.prompts
                        .iter()
                        .map(|p| PromptTokens {
                            tokens: RSlice::from_slice(p),
                        })
                        .collect()
                })
                .collect();
            let endpoint_views: Vec<Vec<EndpointView<'_>>> =
                tickets.iter().map(|t| t.fleet.views()).collect();
            let mut offset = 0u32;
            let items: Vec<ProduceItem<'_>> = tickets
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let item = ProduceItem {
                        request: request_view(
                            &t.request,
                            &prompt_views[i],
                            now_ms,
                            t.seed,
                            explain,
                        ),
                        endpoints: RSlice::from_slice(&endpoint_views[i]),
                        attrs: AttrView {
                            values: RSlice::from_slice(&t.store),
                            stride: t.fleet.len() as u32,
                            rows: RSlice::from_slice(&plugin.consumed_rows),
                        },
                        out_offset: offset,
                    };
                    offset += (produced * t.fleet.len()) as u32;
                    item
                })
                .collect();
            self.scratch.clear();
            self.scratch.resize(offset as usize, AttrValue::Absent);
            plugin.object.produce(&items, &mut self.scratch)
        };
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        let result = match result {
            Ok(()) if elapsed_ms > plugin.timeout_ms() as f64 => {
                self.stats[plugin_index].timeouts += 1;
                Err(PluginError::failed(format!(
                    "timed out: the call took {elapsed_ms:.0} ms, over its {} ms budget; its \
                     output was discarded",
                    plugin.timeout_ms()
                )))
            }
            other => other,
        };
        self.account(plugin_index, &result);
        let error = result.as_ref().err().map(|e| e.message.to_string());
        if let Some(message) = &error {
            tracing::debug!(producer = %plugin.label(), "produce failed: {message}");
        }

        let mut offset = 0usize;
        for ticket in tickets.iter_mut() {
            let n = ticket.fleet.len();
            if error.is_none() {
                for (k, &row) in plugin.produced_rows.iter().enumerate() {
                    let source = &mut self.scratch[offset + k * n..offset + (k + 1) * n];
                    let target = &mut ticket.store[row as usize * n..(row as usize + 1) * n];
                    for (to, from) in target.iter_mut().zip(source.iter_mut()) {
                        *to = std::mem::take(from);
                    }
                }
            }
            if let Some(record) = &mut ticket.record {
                let mut attributes = Vec::new();
                if error.is_none() {
                    for &row in &plugin.produced_rows {
                        for (j, endpoint) in ticket.fleet.endpoints.iter().enumerate() {
                            let value = &ticket.store[row as usize * n + j];
                            if !value.is_absent() {
                                attributes.push(AttributeRecord {
                                    endpoint: endpoint.id.clone(),
                                    key: pipeline.rows[row as usize].to_string(),
                                    value: attribute_json(value),
                                });
                            }
                        }
                    }
                }
                record.producers.push(ProducerRecord {
                    name: plugin.label(),
                    error: error.clone(),
                    attributes,
                });
                if window.is_some() {
                    record.window = window.clone();
                }
            }
            offset += produced * n;
        }
    }

    /// Counts a call and applies the panic policy.
    fn account<T>(&mut self, plugin: usize, result: &Result<T, PluginError>) {
        let stats = &mut self.stats[plugin];
        stats.calls += 1;
        match result {
            Ok(_) => stats.consecutive_panics = 0,
            Err(error) => {
                stats.errors += 1;
                if error.kind == ErrorKind::Panicked {
                    stats.panics += 1;
                    stats.consecutive_panics += 1;
                    tracing::error!(
                        plugin = %self.pipeline.plugins[plugin].label(),
                        "{}", error.message
                    );
                    if stats.consecutive_panics >= POISON_AFTER_PANICS && !stats.poisoned {
                        stats.poisoned = true;
                        tracing::error!(
                            plugin = %self.pipeline.plugins[plugin].label(),
                            "switched off after {POISON_AFTER_PANICS} panics in a row; its \
                             stage now fails open"
                        );
                    }
                } else {
                    stats.consecutive_panics = 0;
                }
            }
        }
    }

    /// Filters, scorers and picker over a ticket whose producers have all run.
    fn decide(&mut self, mut ticket: Ticket, now_ms: f64) -> Decision {
        let pipeline = self.pipeline.clone();
        let prompt_views: Vec<PromptTokens<'_>> = ticket
            .prompts
            .iter()
            .map(|p| PromptTokens {
                tokens: RSlice::from_slice(p),
            })
            .collect();
        let request = request_view(
            &ticket.request,
            &prompt_views,
            now_ms,
            ticket.seed,
            self.explain,
        );
        let all = ticket.fleet.views();
        let mut record = ticket.record.take();
        let reject = |reason: Rejection, record: Option<DecisionRecord>| Decision {
            request_id: ticket.request.id.clone(),
            result: Err(reason),
            endpoints: Vec::new(),
            decided_ms: now_ms,
            arrival_ms: ticket.arrival_ms,
            record,
        };
        if all.is_empty() {
            return reject(Rejection::NoEndpoints, record);
        }
        let store: &[AttrValue] = &ticket.store;
        let stride = ticket.fleet.len() as u32;
        fn attrs_for<'a>(store: &'a [AttrValue], stride: u32, rows: &'a [u32]) -> AttrView<'a> {
            AttrView {
                values: RSlice::from_slice(store),
                stride,
                rows: RSlice::from_slice(rows),
            }
        }

        let mut candidates: Vec<EndpointView<'_>> = all.clone();
        let mut keep: Vec<bool> = Vec::with_capacity(candidates.len());
        let mut note = RString::new();
        for &filter in &pipeline.filters {
            let plugin = &pipeline.plugins[filter];
            if self.stats[filter].poisoned {
                continue;
            }
            keep.clear();
            keep.resize(candidates.len(), true);
            note.clear();
            let attrs = attrs_for(store, stride, &plugin.consumed_rows);
            let result = plugin
                .object
                .filter(&request, &candidates, &attrs, &mut keep, &mut note);
            self.account(filter, &result);
            if result.is_ok() {
                let mut i = 0;
                candidates.retain(|_| {
                    i += 1;
                    keep[i - 1]
                });
            }
            if let Some(record) = &mut record {
                record.filters.push(FilterRecord {
                    name: plugin.label(),
                    kept: candidates.iter().map(|e| e.id.to_string()).collect(),
                    note: note.to_string(),
                    error: result
                        .err()
                        .map(|e| format!("{} (kept every candidate)", e.message)),
                });
            }
            if candidates.is_empty() {
                return reject(
                    Rejection::FilteredOut {
                        filter: plugin.label(),
                    },
                    record,
                );
            }
        }

        let mut totals = vec![0.0f64; candidates.len()];
        let mut scores = vec![0.0f64; candidates.len()];
        for scorer in &pipeline.scorers {
            let plugin = &pipeline.plugins[scorer.plugin];
            if self.stats[scorer.plugin].poisoned {
                continue;
            }
            scores.iter_mut().for_each(|s| *s = 0.0);
            note.clear();
            let attrs = attrs_for(store, stride, &plugin.consumed_rows);
            let result = plugin
                .object
                .score(&request, &candidates, &attrs, &mut scores, &mut note);
            self.account(scorer.plugin, &result);
            if result.is_err() {
                scores.iter_mut().for_each(|s| *s = 0.0);
            }
            for (total, raw) in totals.iter_mut().zip(&scores) {
                *total += clamp_score(*raw) * scorer.weight;
            }
            if let Some(record) = &mut record {
                record.scorers.push(ScorerRecord {
                    name: plugin.label(),
                    weight: scorer.weight,
                    scores: candidates
                        .iter()
                        .zip(&scores)
                        .map(|(e, raw)| ScoreEntry {
                            endpoint: e.id.to_string(),
                            raw: *raw,
                            weighted: clamp_score(*raw) * scorer.weight,
                        })
                        .collect(),
                    note: note.to_string(),
                    error: result.err().map(|e| format!("{} (scored 0)", e.message)),
                });
            }
        }
        if let Some(record) = &mut record {
            record.totals = candidates
                .iter()
                .zip(&totals)
                .map(|(e, s)| EndpointScore {
                    endpoint: e.id.to_string(),
                    score: *s,
                })
                .collect();
        }

        let picker = &pipeline.plugins[pipeline.picker];
        let mut picked = vec![0u32; candidates.len()];
        let result = picker
            .object
            .pick(&request, &candidates, &totals, &mut picked);
        self.account(pipeline.picker, &result);
        let count = match result {
            Ok(count) if count > 0 => count,
            Ok(_) => {
                return reject(
                    Rejection::PickerFailed {
                        picker: picker.label(),
                        reason: "it chose no endpoint".into(),
                    },
                    record,
                )
            }
            Err(error) => {
                return reject(
                    Rejection::PickerFailed {
                        picker: picker.label(),
                        reason: error.message.to_string(),
                    },
                    record,
                )
            }
        };
        let chosen: Vec<usize> = picked[..count]
            .iter()
            .filter_map(|&p| candidates.get(p as usize))
            .map(|e| e.slot as usize)
            .collect();
        let ids: Vec<String> = chosen
            .iter()
            .map(|&s| ticket.fleet.endpoints[s].id.clone())
            .collect();
        if let Some(record) = &mut record {
            record.picked = ids.clone();
        }

        // Dispatch hooks: producers charge what they track against the primary endpoint.
        let primary = &all[chosen[0]];
        for &producer in &pipeline.producers {
            if self.stats[producer].poisoned {
                continue;
            }
            let result = pipeline.plugins[producer]
                .object
                .dispatched(&request, primary);
            self.account(producer, &result);
        }
        drop(candidates);
        drop(all);
        let request_id = ticket.request.id.clone();
        self.dispatched.insert(
            request_id.clone(),
            Dispatched {
                endpoint: chosen[0],
                request: ticket.request,
                prompts: ticket.prompts,
                fleet: ticket.fleet,
                seed: ticket.seed,
            },
        );
        Decision {
            request_id,
            result: Ok(chosen),
            endpoints: ids,
            decided_ms: now_ms,
            arrival_ms: ticket.arrival_ms,
            record,
        }
    }
}

/// Scores are clamped to [0, 1]; a NaN counts as 0 rather than poisoning the sum.
pub fn clamp_score(score: f64) -> f64 {
    if score.is_nan() {
        0.0
    } else {
        score.clamp(0.0, 1.0)
    }
}

fn request_view<'a>(
    request: &'a Request,
    prompts: &'a [PromptTokens<'a>],
    now_ms: f64,
    seed: u64,
    explain: bool,
) -> RequestView<'a> {
    RequestView {
        id: RStr::from(request.id.as_str()),
        model: RStr::from(request.model.as_str()),
        cache_salt: RStr::from(request.cache_salt.as_str()),
        prompts: RSlice::from_slice(prompts),
        max_output_tokens: request.max_output_tokens.map_or(-1, |m| m as i64),
        now_ms: now_ms.max(0.0) as u64,
        random_seed: seed,
        explain,
    }
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
