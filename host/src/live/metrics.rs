//! The Prometheus metrics of both live drivers: counters and histograms updated on the request
//! path, gauges read from the scheduler and the fleet at scrape time, and the [`Tally`] that
//! counts each request exactly once.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::fleet::FleetState;
use crate::live::predictions::{PredictionBook, DRIFT_BELOW, DRIFT_WINDOW, RECOVERED_AT};
use crate::live::reload::Reloader;
use crate::live::LiveScheduler;
use crate::pipeline::Predicted;

type Labels = Vec<(&'static str, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// How a request ended, as counted in `switchyard_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestOutcome {
    /// The replica's response was passed back whole (whatever its status).
    Completed,
    BadRequest,
    BodyTooLarge,
    NoEndpoints,
    FilteredOut,
    PickerFailed,
    Saturated,
    /// No candidate could be reached.
    Unreachable,
    /// The replica failed before or during its response.
    UpstreamError,
    Timeout,
    /// The request head was not complete within `header_timeout_ms`.
    HeaderTimeout,
    /// The request body paused longer than `body_idle_timeout_ms`.
    BodyTimeout,
    /// The client went away before its answer ended.
    ClientDisconnected,
    /// Still running at the drain deadline: answered 503, or its stream cut.
    ShuttingDown,
    MethodNotAllowed,
}

impl RequestOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            RequestOutcome::Completed => "completed",
            RequestOutcome::BadRequest => "bad_request",
            RequestOutcome::BodyTooLarge => "body_too_large",
            RequestOutcome::NoEndpoints => "no_endpoints",
            RequestOutcome::FilteredOut => "filtered_out",
            RequestOutcome::PickerFailed => "picker_failed",
            RequestOutcome::Saturated => "saturated",
            RequestOutcome::Unreachable => "unreachable",
            RequestOutcome::UpstreamError => "upstream_error",
            RequestOutcome::Timeout => "timeout",
            RequestOutcome::HeaderTimeout => "header_timeout",
            RequestOutcome::BodyTimeout => "body_timeout",
            RequestOutcome::ClientDisconnected => "client_disconnected",
            RequestOutcome::ShuttingDown => "shutting_down",
            RequestOutcome::MethodNotAllowed => "method_not_allowed",
        }
    }
}

/// Why the router closed a client connection, as counted in
/// `switchyard_connections_closed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)] // named after their label values
pub enum CloseReason {
    HeaderTimeout,
    BodyTimeout,
    IdleTimeout,
}

impl CloseReason {
    pub const ALL: [CloseReason; 3] = [
        CloseReason::HeaderTimeout,
        CloseReason::BodyTimeout,
        CloseReason::IdleTimeout,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::HeaderTimeout => "header_timeout",
            CloseReason::BodyTimeout => "body_timeout",
            CloseReason::IdleTimeout => "idle_timeout",
        }
    }
}

/// Metrics updated while requests are served; cheap to clone (one shared handle).
#[derive(Clone, Default)]
pub struct Metrics {
    handles: Arc<Handles>,
}

impl std::ops::Deref for Metrics {
    type Target = Handles;
    fn deref(&self) -> &Handles {
        &self.handles
    }
}

/// The metric families behind [`Metrics`].
pub struct Handles {
    requests: Family<Labels, Counter>,
    upstream_errors: Family<Labels, Counter>,
    retries: Counter,
    served_elsewhere: Counter,
    completion_tokens: Counter,
    broken_messages: Family<Labels, Counter>,
    decision_seconds: Histogram,
    window_wait_seconds: Histogram,
    tokenize_seconds: Histogram,
    connections_open: Gauge,
    connections_closed: Family<Labels, Counter>,
    connection_cap_reached: Counter,
    rejected_heads: Family<Labels, Counter>,
    predictions: PredictionBook,
    prefix_unchecked: Counter,
}

impl Default for Handles {
    fn default() -> Self {
        // Every reason is shown from the start, at 0.
        let connections_closed = Family::<Labels, Counter>::default();
        for reason in CloseReason::ALL {
            connections_closed
                .get_or_create(&vec![("reason", reason.as_str().to_string())])
                .inc_by(0);
        }
        Handles {
            requests: Family::default(),
            upstream_errors: Family::default(),
            retries: Counter::default(),
            served_elsewhere: Counter::default(),
            completion_tokens: Counter::default(),
            broken_messages: Family::default(),
            predictions: PredictionBook::default(),
            prefix_unchecked: Counter::default(),
            decision_seconds: Histogram::new(exponential_buckets(1e-6, 2.0, 20)),
            window_wait_seconds: Histogram::new(exponential_buckets(1e-4, 2.0, 16)),
            tokenize_seconds: Histogram::new(exponential_buckets(1e-6, 2.0, 24)),
            connections_open: Gauge::default(),
            connections_closed,
            connection_cap_reached: Counter::default(),
            rejected_heads: Family::default(),
        }
    }
}

impl Metrics {
    /// Counts a request that ended with `outcome`; `endpoint` is empty when it was not placed.
    pub fn request(&self, outcome: RequestOutcome, endpoint: &str) {
        self.requests
            .get_or_create(&vec![
                ("outcome", outcome.as_str().to_string()),
                ("endpoint", endpoint.to_string()),
            ])
            .inc();
    }

    /// Counts a failure talking to a replica: `connect`, `response`, `body` or `timeout`.
    pub fn upstream_error(&self, endpoint: &str, kind: &'static str) {
        self.upstream_errors
            .get_or_create(&vec![
                ("endpoint", endpoint.to_string()),
                ("kind", kind.to_string()),
            ])
            .inc();
    }

    /// The data plane reported serving a request on another endpoint than the one picked.
    pub fn served_elsewhere(&self) {
        self.served_elsewhere.inc();
    }

    /// Output tokens a completed request reported in its `usage`.
    pub fn completion_tokens(&self, tokens: u64) {
        self.completion_tokens.inc_by(tokens);
    }

    /// Checks a request's prefix predictions against the `cached` prompt tokens the replica
    /// reported; `None` when its usage did not say.
    pub fn prefix_checked(&self, endpoint: &str, predicted: &Predicted, cached: Option<u64>) {
        match cached {
            Some(cached) => self.predictions.check(endpoint, predicted, cached),
            None => {
                self.prefix_unchecked.inc();
            }
        }
    }

    /// The predictions checked so far.
    pub fn predictions(&self) -> &PredictionBook {
        &self.predictions
    }

    /// An ext_proc message that could not be read ended its stream with gRPC `code`.
    pub fn broken_message(&self, code: &'static str) {
        self.broken_messages
            .get_or_create(&vec![("code", code.to_string())])
            .inc();
    }

    pub fn retry(&self) {
        self.retries.inc();
    }

    /// Time spent deciding (windows excluded) and time spent waiting in a window.
    pub fn decision(&self, cost_seconds: f64, window_wait_seconds: f64) {
        self.decision_seconds.observe(cost_seconds);
        if window_wait_seconds > 0.0 {
            self.window_wait_seconds.observe(window_wait_seconds);
        }
    }

    /// A text prompt was turned into token ids before admission, taking `seconds`.
    pub fn tokenized(&self, seconds: f64) {
        self.tokenize_seconds.observe(seconds);
    }

    /// A client connection on the API listener opened (`1`) or ended (`-1`).
    pub fn connections_open(&self, change: i64) {
        self.connections_open.inc_by(change);
    }

    pub fn connection_closed(&self, reason: CloseReason) {
        self.connections_closed
            .get_or_create(&vec![("reason", reason.as_str().to_string())])
            .inc();
    }

    /// The API listener reached `max_connections` and stopped accepting.
    pub fn connection_cap_reached(&self) {
        self.connection_cap_reached.inc();
    }

    /// A request head the router could not read, answered with `status`.
    pub fn head_rejected(&self, status: u16) {
        self.rejected_heads
            .get_or_create(&vec![("status", status.to_string())])
            .inc();
    }

    /// The prefix-prediction families, from the book as of now.
    fn register_predictions(&self, registry: &mut Registry) {
        let checked = Family::<Labels, Counter>::default();
        let predicted = Family::<Labels, Counter>::default();
        let cached = Family::<Labels, Counter>::default();
        let correct = Family::<Labels, Counter>::default();
        let drifting = Family::<Labels, Gauge>::default();
        for f in self.predictions.figures() {
            let labels = vec![("producer", f.producer), ("endpoint", f.endpoint)];
            checked.get_or_create(&labels).inc_by(f.checked);
            predicted.get_or_create(&labels).inc_by(f.total.predicted);
            cached.get_or_create(&labels).inc_by(f.total.cached);
            correct.get_or_create(&labels).inc_by(f.total.correct);
            drifting.get_or_create(&labels).set(i64::from(f.drifting));
        }
        registry.register(
            "prefix_checked_requests",
            "Requests whose prefix prediction was checked against the replica's reported \
             cached tokens, by producer of PrefixCacheMatchInfo and endpoint",
            checked,
        );
        registry.register(
            "prefix_predicted_tokens",
            "Prompt tokens the producer predicted the chosen endpoint held, over checked \
             requests",
            predicted,
        );
        registry.register(
            "prefix_cached_tokens",
            "Prompt tokens the endpoint reported cached (usage.prompt_tokens_details.\
             cached_tokens), over checked requests",
            cached,
        );
        registry.register(
            "prefix_correct_tokens",
            "Tokens both predicted and cached (the smaller of the two per request): precision \
             is correct / predicted, recall correct / cached",
            correct,
        );
        registry.register(
            "prefix_prediction_drifting",
            format!(
                "1 while the producer's predictions on the endpoint are drifting (precision or \
                 recall under {DRIFT_BELOW} over its latest {DRIFT_WINDOW} checked requests, \
                 until both are at {RECOVERED_AT} or more), else 0"
            ),
            drifting,
        );
        registry.register(
            "prefix_unchecked_requests",
            "Completed 2xx requests with a prefix prediction whose response reported no \
             cached_tokens (vLLM: --enable-prompt-tokens-details; streams: \
             stream_options.include_usage)",
            self.prefix_unchecked.clone(),
        );
    }

    /// The whole exposition: the request-path metrics plus the scheduler's and the fleet's
    /// state as of now.
    pub fn render(&self, live: &LiveScheduler, fleet: &FleetState, reload: &Reloader) -> String {
        let mut registry = Registry::with_prefix("switchyard");
        registry.register(
            "requests",
            "Requests by outcome and endpoint",
            self.requests.clone(),
        );
        registry.register(
            "upstream_errors",
            "Failures talking to a replica, by endpoint and kind (connect, response, body, \
             timeout)",
            self.upstream_errors.clone(),
        );
        registry.register(
            "retries",
            "Requests sent to another candidate after a refused connection",
            self.retries.clone(),
        );
        registry.register(
            "served_endpoint_mismatches",
            "Responses the data plane reported as served by another endpoint than the picked one",
            self.served_elsewhere.clone(),
        );
        registry.register(
            "completion_tokens",
            "Output tokens reported in the usage of completed responses (ext-proc)",
            self.completion_tokens.clone(),
        );
        registry.register(
            "broken_messages",
            "ext_proc streams ended by a message that could not be read, by the gRPC code \
             sent back: internal (undecodable) or resource_exhausted (over \
             --grpc-max-recv-msg-size) (ext-proc)",
            self.broken_messages.clone(),
        );
        registry.register(
            "decision_duration_seconds",
            "Time spent in the scheduler per decision, batching windows excluded",
            self.decision_seconds.clone(),
        );
        registry.register(
            "window_wait_seconds",
            "Time requests waited in a batching window before their decision",
            self.window_wait_seconds.clone(),
        );
        registry.register(
            "tokenize_duration_seconds",
            "Time spent turning a text prompt into token ids before admission (estimates included)",
            self.tokenize_seconds.clone(),
        );

        registry.register(
            "connections_open",
            "Client connections open on the API listener (serve) or the gRPC listener (ext-proc)",
            self.connections_open.clone(),
        );
        registry.register(
            "connections_closed",
            "Client connections the router closed, by reason (header_timeout, body_timeout, \
             idle_timeout)",
            self.connections_closed.clone(),
        );
        registry.register(
            "connection_cap_reached",
            "Times the API listener reached max_connections (serve), or connections that waited \
             at --grpc-max-connections (ext-proc), left in the kernel's backlog until one closed",
            self.connection_cap_reached.clone(),
        );
        registry.register(
            "rejected_heads",
            "Request heads answered without reaching a route, by status (400 unreadable, 414 \
             target too long, 431 head too large)",
            self.rejected_heads.clone(),
        );

        self.register_predictions(&mut registry);

        let (per_endpoint, total) = live.in_flight();
        let in_flight = Family::<Labels, Gauge>::default();
        for member in fleet.members.iter() {
            in_flight
                .get_or_create(&vec![("endpoint", member.endpoint.id.clone())])
                .set(0);
        }
        for (endpoint, count) in per_endpoint {
            in_flight
                .get_or_create(&vec![("endpoint", endpoint)])
                .set(i64::from(count));
        }
        registry.register(
            "in_flight",
            "Requests dispatched and not yet released, by endpoint",
            in_flight,
        );
        let in_flight_total = Gauge::<i64>::default();
        in_flight_total.set(i64::from(total));
        registry.register(
            "in_flight_total",
            "Requests dispatched and not yet released",
            in_flight_total,
        );
        let pending = Gauge::<i64>::default();
        pending.set(live.pending() as i64);
        registry.register(
            "window_pending",
            "Requests waiting in a batching window",
            pending,
        );

        let calls = Family::<Labels, Counter>::default();
        let errors = Family::<Labels, Counter>::default();
        let timeouts = Family::<Labels, Counter>::default();
        let panics = Family::<Labels, Counter>::default();
        let overflows = Family::<Labels, Counter>::default();
        let switched_off = Family::<Labels, Gauge>::default();
        let timed_seconds = Family::<Labels, Counter<f64, AtomicU64>>::default();
        let timed_calls = Family::<Labels, Counter>::default();
        for (label, type_name, _, stats) in live.plugin_stats() {
            let labels = vec![("plugin", label), ("type", type_name)];
            calls.get_or_create(&labels).inc_by(stats.calls);
            errors.get_or_create(&labels).inc_by(stats.errors);
            timeouts.get_or_create(&labels).inc_by(stats.timeouts);
            panics.get_or_create(&labels).inc_by(stats.panics);
            overflows
                .get_or_create(&labels)
                .inc_by(stats.batch_overflows);
            switched_off
                .get_or_create(&labels)
                .set(i64::from(stats.poisoned));
            timed_seconds
                .get_or_create(&labels)
                .inc_by(stats.timed_nanos as f64 / 1e9);
            timed_calls.get_or_create(&labels).inc_by(stats.timed_calls);
        }
        registry.register("plugin_calls", "Calls into each plugin", calls);
        registry.register(
            "plugin_errors",
            "Plugin calls that failed (errors, timeouts and panics)",
            errors,
        );
        registry.register(
            "plugin_timeouts",
            "Producer calls over their time budget (output discarded)",
            timeouts,
        );
        registry.register("plugin_panics", "Plugin calls that panicked", panics);
        registry.register(
            "plugin_call_seconds",
            "Time spent in timed plugin calls (every produce call of a plugin library; the \
             host's own producers and filter, scorer and picker calls of one decision in 16); \
             divide by plugin_timed_calls for the mean latency",
            timed_seconds,
        );
        registry.register(
            "plugin_timed_calls",
            "Plugin calls whose duration is in plugin_call_seconds",
            timed_calls,
        );
        registry.register(
            "plugin_batch_overflows",
            "Requests refused a place in a full batch window",
            overflows,
        );
        registry.register(
            "plugin_switched_off",
            "1 when a plugin was switched off after repeated panics",
            switched_off,
        );

        let fresh = Family::<Labels, Gauge>::default();
        let age = Family::<Labels, FloatGauge>::default();
        let failures = Family::<Labels, Gauge>::default();
        for member in fleet.members.iter() {
            let labels = vec![("endpoint", member.endpoint.id.clone())];
            fresh.get_or_create(&labels).set(i64::from(member.fresh));
            if let Some(ms) = member.metrics_age_ms {
                age.get_or_create(&labels).set(ms as f64 / 1000.0);
            }
            failures
                .get_or_create(&labels)
                .set(member.scrape_failures as i64);
        }
        registry.register(
            "endpoint_fresh",
            "1 when the endpoint's metrics were scraped within stale_after_ms",
            fresh,
        );
        registry.register(
            "endpoint_metrics_age_seconds",
            "Time since the endpoint's last successful metrics scrape",
            age,
        );
        registry.register(
            "endpoint_scrape_failures",
            "Metrics scrapes failed since the endpoint's last success",
            failures,
        );
        let endpoints = Gauge::<i64>::default();
        endpoints.set(fleet.members.len() as i64);
        registry.register("endpoints", "Endpoints in the fleet", endpoints);

        let generation = Gauge::<i64>::default();
        generation.set(reload.generation() as i64);
        registry.register(
            "config_generation",
            "The running config's generation: 1 at start, one more per reload applied",
            generation,
        );
        let reloads = Family::<Labels, Counter>::default();
        let (applied, refused) = reload.counts();
        reloads
            .get_or_create(&vec![("result", "applied".to_string())])
            .inc_by(applied);
        reloads
            .get_or_create(&vec![("result", "refused".to_string())])
            .inc_by(refused);
        registry.register(
            "config_reloads",
            "Config reloads (SIGHUP or POST /reload) by result: applied, or refused with the \
             running config kept",
            reloads,
        );
        let libraries = Family::<Labels, Gauge>::default();
        for library in reload.libraries() {
            libraries
                .get_or_create(&vec![
                    ("library", library.path.display().to_string()),
                    ("digest", library.digest),
                ])
                .set(1);
        }
        registry.register(
            "plugin_library_info",
            "1 for each plugin library the running config loaded, with the SHA-256 of the \
             bytes that run",
            libraries,
        );

        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &registry);
        text
    }
}

/// Counts one request in `switchyard_requests_total` exactly once: settled with the outcome
/// its answer had, handed over to the relayed body (which counts when the body ends), or, when
/// dropped before either, as a client that went away — or as cut by the shutdown once `cut`
/// says the drain deadline passed.
pub struct Tally<'a> {
    metrics: &'a Metrics,
    cut: &'a tokio::sync::watch::Receiver<bool>,
    /// The replica the request was last sent to.
    endpoint: Option<String>,
    counted: bool,
}

impl<'a> Tally<'a> {
    pub fn new(metrics: &'a Metrics, cut: &'a tokio::sync::watch::Receiver<bool>) -> Tally<'a> {
        Tally {
            metrics,
            cut,
            endpoint: None,
            counted: false,
        }
    }

    pub fn sent_to(&mut self, endpoint: &str) {
        match &mut self.endpoint {
            Some(known) => endpoint.clone_into(known),
            None => self.endpoint = Some(endpoint.to_string()),
        }
    }

    /// Counts the answer, against `endpoint` (empty for outcomes the router decides).
    pub fn settle(&mut self, outcome: RequestOutcome, endpoint: &str) {
        if !self.counted {
            self.counted = true;
            self.metrics.request(outcome, endpoint);
        }
    }

    /// The answer's body counts the request when it ends; returns the replica's id.
    pub fn hand_over(&mut self) -> String {
        self.counted = true;
        self.endpoint.take().unwrap_or_default()
    }
}

impl Drop for Tally<'_> {
    fn drop(&mut self) {
        let outcome = if *self.cut.borrow() {
            RequestOutcome::ShuttingDown
        } else {
            RequestOutcome::ClientDisconnected
        };
        if !self.counted {
            self.counted = true;
            let endpoint = self.endpoint.as_deref().unwrap_or("");
            self.metrics.request(outcome, endpoint);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counted series, sorted.
    fn requests(metrics: &Metrics) -> Vec<String> {
        let mut registry = Registry::default();
        registry.register("requests", "", metrics.requests.clone());
        let mut page = String::new();
        encode(&mut page, &registry).expect("encodes");
        let mut lines: Vec<String> = page
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_string)
            .collect();
        lines.sort();
        lines
    }

    #[test]
    fn a_tally_counts_once_whatever_happens_to_it() {
        let metrics = Metrics::default();
        let (cut, watch) = tokio::sync::watch::channel(false);
        {
            let mut settled = Tally::new(&metrics, &watch);
            settled.sent_to("a");
            settled.settle(RequestOutcome::UpstreamError, "a");
            settled.settle(RequestOutcome::Completed, "a");
        }
        {
            let mut handed = Tally::new(&metrics, &watch);
            handed.sent_to("b");
            assert_eq!(handed.hand_over(), "b");
        }
        {
            let mut gone = Tally::new(&metrics, &watch);
            gone.sent_to("c");
        }
        cut.send(true).expect("receiver alive");
        drop(Tally::new(&metrics, &watch));
        assert_eq!(
            requests(&metrics),
            [
                "requests_total{outcome=\"client_disconnected\",endpoint=\"c\"} 1",
                "requests_total{outcome=\"shutting_down\",endpoint=\"\"} 1",
                "requests_total{outcome=\"upstream_error\",endpoint=\"a\"} 1",
            ]
        );
    }
}
