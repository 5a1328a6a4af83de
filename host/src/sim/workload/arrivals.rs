//! The client arrival model: how an HTTP client delivers requests that a workload sends at one
//! nominal time.
//!
//! A client told to send a burst "at once" sends it over tens of milliseconds (connection
//! set-up, event-loop scheduling), and every request picks up a little network and event-loop
//! noise on top. Every generator makes its requests at nominal times; this module delays
//! them, reorders them by the time they reach the router and numbers them from 0.
//!
//! The `n` requests of a burst (a run of requests at one nominal time) are given, in the
//! generator's order, the `n` draws of a uniform distribution over `[0, arrivalSpreadMs)` sorted
//! ascending, so a burst keeps its order while it is spread; each request then gets an
//! exponential jitter of mean `arrivalJitterMs`, which may swap neighbours. The draws come from
//! a stream of their own derived from the workload's seed, so the prompts do not depend on the
//! model's parameters.

use crate::sim::config::{check_float, ParamError};
use crate::sim::router::SimRequest;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::iter::Fuse;

/// Default `arrivalSpreadMs` of the synthetic workloads.
pub const DEFAULT_SPREAD_MS: f64 = 30.0;
/// Default `arrivalJitterMs` of the synthetic workloads and traces.
pub const DEFAULT_JITTER_MS: f64 = 1.0;

/// Checks `arrivalSpreadMs` and `arrivalJitterMs`.
pub(super) fn check_arrival_params(spread_ms: f64, jitter_ms: f64) -> Result<(), ParamError> {
    check_float("arrivalSpreadMs", spread_ms, 0.0, false, 1e9)?;
    check_float("arrivalJitterMs", jitter_ms, 0.0, false, 1e9)
}

/// Client delays, drawn burst by burst.
pub struct Delays {
    spread_ms: f64,
    jitter_ms: f64,
    rng: SmallRng,
    /// Requests of the current burst still to be given a delay.
    left: u64,
    /// The last request's place in the spread, in `[0, 1)`.
    position: f64,
}

impl Delays {
    pub fn new(seed: u64, spread_ms: f64, jitter_ms: f64) -> Self {
        // Distinct from the generator's stream of the same seed.
        const STREAM: u64 = 0x9e37_79b9_7f4a_7c15;
        Delays {
            spread_ms,
            jitter_ms,
            rng: SmallRng::seed_from_u64(seed ^ STREAM),
            left: 0,
            position: 0.0,
        }
    }

    /// Starts a burst of `n` requests.
    pub fn start_burst(&mut self, n: usize) {
        self.left = n as u64;
        self.position = 0.0;
    }

    /// The next request's delay after its nominal time, ms.
    pub fn next_delay(&mut self) -> f64 {
        debug_assert!(self.left > 0, "a delay past the end of its burst");
        let left = self.left.max(1) as f64;
        self.left = self.left.saturating_sub(1);
        // The smallest of `left` uniform draws over [position, 1): 1 - (1 - v)^(1 / left) of
        // the rest of the interval.
        let v: f64 = self.rng.random();
        let share = -(f64::ln_1p(-v) / left).exp_m1();
        self.position += (1.0 - self.position) * share;
        let u: f64 = self.rng.random();
        let jitter = -f64::ln_1p(-u) * self.jitter_ms;
        self.position * self.spread_ms + jitter
    }
}

/// A generator's requests as they reach the router.
///
/// The inner iterator yields requests at nondecreasing nominal times. A burst is read whole
/// (plus the first request of the next one, whose nominal time bounds every later arrival),
/// delayed, and held until no later request can arrive before it; ties keep the generator's
/// order. So only the requests of overlapping bursts are held at once.
pub struct Arrivals<I: Iterator<Item = SimRequest>> {
    nominal: Fuse<I>,
    delays: Delays,
    /// The first request of the next burst.
    ahead: Option<SimRequest>,
    held: BinaryHeap<Held>,
    burst: Vec<SimRequest>,
    made: u64,
    next_id: u64,
}

impl<I: Iterator<Item = SimRequest>> Arrivals<I> {
    pub fn new(nominal: I, delays: Delays) -> Self {
        Arrivals {
            nominal: nominal.fuse(),
            delays,
            ahead: None,
            held: BinaryHeap::new(),
            burst: Vec::new(),
            made: 0,
            next_id: 0,
        }
    }

    fn read_burst(&mut self, first: SimRequest) {
        let at = first.arrival_ms;
        self.burst.push(first);
        loop {
            match self.nominal.next() {
                Some(r) if r.arrival_ms == at => self.burst.push(r),
                next => {
                    self.ahead = next;
                    break;
                }
            }
        }
        self.delays.start_burst(self.burst.len());
        for mut request in self.burst.drain(..) {
            request.arrival_ms += self.delays.next_delay();
            self.held.push(Held {
                order: self.made,
                request,
            });
            self.made += 1;
        }
    }
}

impl<I: Iterator<Item = SimRequest>> Iterator for Arrivals<I> {
    type Item = SimRequest;

    fn next(&mut self) -> Option<SimRequest> {
        loop {
            if self.ahead.is_none() {
                self.ahead = self.nominal.next();
            }
            let horizon = self.ahead.as_ref().map(|r| r.arrival_ms);
            let due = self
                .held
                .peek()
                .map(|h| horizon.is_none_or(|at| h.request.arrival_ms <= at));
            match (due, self.ahead.take()) {
                (Some(true), ahead) => {
                    self.ahead = ahead;
                    let mut request = self.held.pop()?.request;
                    request.id = self.next_id;
                    self.next_id += 1;
                    return Some(request);
                }
                (_, Some(first)) => self.read_burst(first),
                (_, None) => return None,
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let here = self.held.len() + usize::from(self.ahead.is_some());
        let (low, high) = self.nominal.size_hint();
        (
            low.saturating_add(here),
            high.and_then(|h| h.checked_add(here)),
        )
    }
}

/// A delayed request, ordered so that the heap's top is the earliest (then first made).
struct Held {
    order: u64,
    request: SimRequest,
}

impl Ord for Held {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .request
            .arrival_ms
            .total_cmp(&self.request.arrival_ms)
            .then(other.order.cmp(&self.order))
    }
}

impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Held {}
