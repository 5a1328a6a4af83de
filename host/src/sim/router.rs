//! The routing interface the simulator drives, the request and fleet views it hands a router,
//! and two baseline routers.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use switchyard_plugin_api::kv::KvEvent;

use crate::pipeline::Predicted;

/// Prompt token ids, possibly shared with other requests: the first `len` ids of a reference
/// counted buffer. The samples of one RL prompt share one buffer, and the turns of a
/// multi-turn session are prefixes of the session's buffer, so a workload holds each distinct
/// prompt once however many requests carry it.
#[derive(Clone)]
pub struct Tokens {
    buf: Arc<[u32]>,
    len: usize,
}

impl Tokens {
    /// The first `len` ids of `buf` (all of them when `len` is larger).
    pub fn prefix(buf: &Arc<[u32]>, len: usize) -> Tokens {
        Tokens {
            buf: Arc::clone(buf),
            len: len.min(buf.len()),
        }
    }

    /// The whole buffer these ids are a prefix of.
    pub fn buffer(&self) -> &Arc<[u32]> {
        &self.buf
    }

    /// Whether `self` and `other` are prefixes of the same buffer.
    pub fn shares_buffer_with(&self, other: &Tokens) -> bool {
        Arc::ptr_eq(&self.buf, &other.buf)
    }
}

impl Deref for Tokens {
    type Target = [u32];

    fn deref(&self) -> &[u32] {
        &self.buf[..self.len]
    }
}

impl From<Vec<u32>> for Tokens {
    fn from(tokens: Vec<u32>) -> Tokens {
        let len = tokens.len();
        Tokens {
            buf: tokens.into(),
            len,
        }
    }
}

impl PartialEq for Tokens {
    fn eq(&self, other: &Tokens) -> bool {
        **self == **other
    }
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

/// One inference request of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct SimRequest {
    /// Unique within a workload; decisions refer to it.
    pub id: u64,
    /// Virtual arrival time at the router.
    pub arrival_ms: f64,
    pub model: String,
    pub cache_salt: String,
    /// Prompt token ids.
    pub tokens: Tokens,
    /// Tokens the replica generates; the first one comes out of prefill.
    pub output_tokens: u32,
    /// Workload tag: requests built to share a prompt prefix share a group (an RL prompt within
    /// one step, a shared-prefix group, a multi-turn session).
    pub group: u64,
    /// Workload tag: the RL rollout step a request belongs to; `None` outside RL workloads.
    pub step: Option<u32>,
}

/// What a router may see of one replica, current at the time of the call.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReplicaState {
    /// Sequences admitted to the batch (prefilling or decoding).
    pub running: u32,
    /// Requests queued for a batch slot.
    pub waiting: u32,
    /// Share of the prefix-cache capacity taken by the admitted sequences' prompt and output
    /// tokens, in whole blocks, clamped to 1.
    pub kv_usage: f64,
    /// Prompt tokens of every request sent to the replica and not yet completed.
    pub in_flight_tokens: u64,
    /// Requests sent to the replica and not yet completed (running + waiting, but always
    /// exact: the router counts what it sends, it does not scrape it).
    pub in_flight: u32,
}

/// A router's verdict on one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub request: u64,
    /// Index into the fleet; `None` rejects the request.
    pub replica: Option<usize>,
    /// Free-form explanation kept with the decision.
    pub note: Option<String>,
    /// The prompt tokens each prefix producer expected the chosen replica to hold, checked
    /// against what it held when the request's prefill was scheduled.
    pub predicted: Predicted,
}

impl Decision {
    /// `request` placed on `replica` (`None`: rejected), with no note and no prediction.
    pub fn to(request: u64, replica: Option<usize>) -> Decision {
        Decision {
            request,
            replica,
            note: None,
            predicted: Predicted::default(),
        }
    }
}

/// A routing policy under simulation.
///
/// The engine calls `submit` when a request arrives and `poll` after every event it processes
/// (arrivals, completions, wakeups), always with the fleet as it is at that moment. A router
/// may decide inside `submit` and hand the decision out on the following `poll`, or hold
/// requests and decide later; to be polled at a time when no other event happens, it returns
/// that time from `next_wakeup`. Requests still undecided when no event and no wakeup remain
/// are counted as unrouted.
pub trait SimRouter {
    /// Shown in reports.
    fn name(&self) -> &str;
    /// A request arrives at `now_ms`.
    fn submit(&mut self, now_ms: f64, req: &SimRequest, fleet: &[ReplicaState]);
    /// Earliest virtual time at which the router wants `poll` (e.g. a batching window seal).
    fn next_wakeup(&self) -> Option<f64>;
    /// Appends the decisions made up to `now_ms` to `out`.
    fn poll(&mut self, now_ms: f64, fleet: &[ReplicaState], out: &mut Vec<Decision>);
    /// A request sent to `replica` finished its last output token.
    fn on_complete(&mut self, now_ms: f64, request: u64, replica: usize);
    /// Whether the router reads the replicas' KV-cache events; the simulator records and
    /// delivers them only to one that does.
    fn takes_kv_events(&self) -> bool {
        false
    }
    /// Events replica `replica` published, delivered at `now_ms` (their publication time plus
    /// the fleet's event delay), in publication order.
    fn kv_events(&mut self, _now_ms: f64, _replica: usize, _events: Vec<KvEvent>) {}
}

/// Sends request k to replica k mod R, in arrival order.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: usize,
    decided: Vec<Decision>,
}

impl RoundRobin {
    pub fn new() -> Self {
        Self::default()
    }
}

impl SimRouter for RoundRobin {
    fn name(&self) -> &str {
        "round-robin"
    }

    fn submit(&mut self, _now_ms: f64, req: &SimRequest, fleet: &[ReplicaState]) {
        let replica = if fleet.is_empty() {
            None
        } else {
            let r = self.next % fleet.len();
            self.next = r + 1;
            Some(r)
        };
        self.decided.push(Decision::to(req.id, replica));
    }

    fn next_wakeup(&self) -> Option<f64> {
        None
    }

    fn poll(&mut self, _now_ms: f64, _fleet: &[ReplicaState], out: &mut Vec<Decision>) {
        out.append(&mut self.decided);
    }

    fn on_complete(&mut self, _now_ms: f64, _request: u64, _replica: usize) {}
}

/// Sends each request to the replica with the fewest requests in flight (sent, not completed)
/// at its arrival; ties go to the lowest index.
#[derive(Debug, Default)]
pub struct LeastInFlight {
    decided: Vec<Decision>,
}

impl LeastInFlight {
    pub fn new() -> Self {
        Self::default()
    }
}

impl SimRouter for LeastInFlight {
    fn name(&self) -> &str {
        "least-in-flight"
    }

    fn submit(&mut self, _now_ms: f64, req: &SimRequest, fleet: &[ReplicaState]) {
        let replica = fleet
            .iter()
            .enumerate()
            .min_by_key(|(i, s)| (s.in_flight, *i))
            .map(|(i, _)| i);
        self.decided.push(Decision::to(req.id, replica));
    }

    fn next_wakeup(&self) -> Option<f64> {
        None
    }

    fn poll(&mut self, _now_ms: f64, _fleet: &[ReplicaState], out: &mut Vec<Decision>) {
        out.append(&mut self.decided);
    }

    fn on_complete(&mut self, _now_ms: f64, _request: u64, _replica: usize) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: u64) -> SimRequest {
        SimRequest {
            id,
            arrival_ms: 0.0,
            model: "m".into(),
            cache_salt: String::new(),
            tokens: vec![1, 2, 3].into(),
            output_tokens: 1,
            group: 0,
            step: None,
        }
    }

    fn state(running: u32, waiting: u32) -> ReplicaState {
        ReplicaState {
            running,
            waiting,
            in_flight: running + waiting,
            ..ReplicaState::default()
        }
    }

    fn picks(router: &mut dyn SimRouter, fleet: &[ReplicaState], n: u64) -> Vec<Option<usize>> {
        for id in 0..n {
            router.submit(0.0, &req(id), fleet);
        }
        let mut out = Vec::new();
        router.poll(0.0, fleet, &mut out);
        assert_eq!(
            out.iter().map(|d| d.request).collect::<Vec<_>>(),
            (0..n).collect::<Vec<_>>()
        );
        out.into_iter().map(|d| d.replica).collect()
    }

    #[test]
    fn round_robin_cycles_through_the_fleet() {
        let fleet = [state(5, 5), state(0, 0), state(9, 0)];
        let got = picks(&mut RoundRobin::new(), &fleet, 5);
        assert_eq!(got, [Some(0), Some(1), Some(2), Some(0), Some(1)]);
    }

    #[test]
    fn least_in_flight_counts_running_and_waiting_and_breaks_ties_low() {
        let fleet = [state(2, 1), state(1, 1), state(0, 2), state(3, 0)];
        let got = picks(&mut LeastInFlight::new(), &fleet, 1);
        assert_eq!(got, [Some(1)]);
    }

    #[test]
    fn empty_fleet_rejects() {
        assert_eq!(picks(&mut RoundRobin::new(), &[], 1), [None]);
        assert_eq!(picks(&mut LeastInFlight::new(), &[], 1), [None]);
    }

    #[test]
    fn poll_hands_each_decision_out_once() {
        let mut rr = RoundRobin::new();
        let fleet = [state(0, 0)];
        rr.submit(0.0, &req(7), &fleet);
        let mut out = Vec::new();
        rr.poll(0.0, &fleet, &mut out);
        rr.poll(0.0, &fleet, &mut out);
        assert_eq!(out.len(), 1);
    }
}
