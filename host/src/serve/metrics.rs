//! The router's Prometheus metrics: counters and histograms updated on the request path, and
//! gauges read from the scheduler and the fleet at scrape time.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::fleet::FleetState;
use crate::live::LiveScheduler;

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
    ClientDisconnected,
    ShuttingDown,
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
            RequestOutcome::ClientDisconnected => "client_disconnected",
            RequestOutcome::ShuttingDown => "shutting_down",
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
    connections: Gauge,
    connections_deferred: Counter,
    decision_seconds: Histogram,
    window_wait_seconds: Histogram,
}

impl Default for Handles {
    fn default() -> Self {
        Handles {
            requests: Family::default(),
            upstream_errors: Family::default(),
            retries: Counter::default(),
            served_elsewhere: Counter::default(),
            completion_tokens: Counter::default(),
            broken_messages: Family::default(),
            connections: Gauge::default(),
            connections_deferred: Counter::default(),
            decision_seconds: Histogram::new(exponential_buckets(1e-6, 2.0, 20)),
            window_wait_seconds: Histogram::new(exponential_buckets(1e-4, 2.0, 16)),
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

    /// An ext_proc message that could not be read ended its stream with gRPC `code`.
    pub fn broken_message(&self, code: &'static str) {
        self.broken_messages
            .get_or_create(&vec![("code", code.to_string())])
            .inc();
    }

    /// An ext_proc connection was accepted.
    pub fn connection_opened(&self) {
        self.connections.inc();
    }

    pub fn connection_closed(&self) {
        self.connections.dec();
    }

    /// An ext_proc connection had to wait for another to close before being served.
    pub fn connection_deferred(&self) {
        self.connections_deferred.inc();
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

    /// The whole exposition: the request-path metrics plus the scheduler's and the fleet's
    /// state as of now.
    pub fn render(&self, live: &LiveScheduler, fleet: &FleetState) -> String {
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
            "grpc_connections",
            "Open ext_proc connections (ext-proc)",
            self.connections.clone(),
        );
        registry.register(
            "grpc_connections_deferred",
            "ext_proc connections that waited at --grpc-max-connections for another to close \
             (ext-proc)",
            self.connections_deferred.clone(),
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
        for (label, type_name, stats) in live.plugin_stats() {
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

        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &registry);
        text
    }
}
