//! Several routers with the same policy in front of one fleet, as behind a load balancer.
//!
//! Requests are dealt to the routers in turn, in arrival order. Each router sees what one
//! router instance of a real deployment sees: the replicas' scraped load and, when it reads
//! them, every replica's KV-cache events, but only the requests it sent itself among those in
//! flight. A policy that models the replicas' caches from its own dispatches sees part of the
//! traffic that fills them; one that reads the engines' events sees all of it.

use std::collections::HashMap;

use switchyard_plugin_api::kv::KvEvent;

use super::router::{Decision, ReplicaState, SimRequest, SimRouter};

/// Requests one router sent to one replica and that have not completed.
#[derive(Debug, Clone, Copy, Default)]
struct Sent {
    requests: u32,
    tokens: u64,
}

pub struct SideBySide {
    routers: Vec<Box<dyn SimRouter + Send>>,
    /// The routers that read KV-cache events.
    event_takers: Vec<usize>,
    next: usize,
    /// Per request not yet completed: the router it was dealt to and its prompt tokens.
    owners: HashMap<u64, (usize, u64)>,
    /// Per router and replica.
    sent: Vec<Vec<Sent>>,
    /// The fleet as the router being called sees it.
    view: Vec<ReplicaState>,
    decided: Vec<Decision>,
}

impl SideBySide {
    /// `routers` side by side; they share the first one's name in reports.
    ///
    /// # Panics
    /// When `routers` is empty.
    pub fn new(routers: Vec<Box<dyn SimRouter + Send>>) -> Self {
        assert!(!routers.is_empty(), "side by side needs a router");
        let count = routers.len();
        let event_takers = (0..count)
            .filter(|&k| routers[k].takes_kv_events())
            .collect();
        SideBySide {
            routers,
            event_takers,
            next: 0,
            owners: HashMap::new(),
            sent: vec![Vec::new(); count],
            view: Vec::new(),
            decided: Vec::new(),
        }
    }

    /// The fleet as router `k` sees it: its own requests in flight instead of everyone's.
    fn view_for(&mut self, k: usize, fleet: &[ReplicaState]) {
        let sent = &mut self.sent[k];
        sent.resize(fleet.len(), Sent::default());
        self.view.clear();
        self.view.extend(
            fleet
                .iter()
                .zip(sent.iter())
                .map(|(state, own)| ReplicaState {
                    in_flight: own.requests,
                    in_flight_tokens: own.tokens,
                    ..*state
                }),
        );
    }

    /// Hands out router `k`'s new decisions, counting what it sent where.
    fn collect(&mut self, k: usize, out: &mut Vec<Decision>) {
        for decision in self.decided.drain(..) {
            match (decision.replica, self.owners.get(&decision.request)) {
                (Some(replica), Some(&(_, tokens))) => {
                    let sent = &mut self.sent[k];
                    if sent.len() <= replica {
                        sent.resize(replica + 1, Sent::default());
                    }
                    sent[replica].requests += 1;
                    sent[replica].tokens += tokens;
                }
                _ => {
                    self.owners.remove(&decision.request);
                }
            }
            out.push(decision);
        }
    }
}

impl SimRouter for SideBySide {
    fn name(&self) -> &str {
        self.routers[0].name()
    }

    fn submit(&mut self, now_ms: f64, req: &SimRequest, fleet: &[ReplicaState]) {
        let k = self.next;
        self.next = (k + 1) % self.routers.len();
        self.owners.insert(req.id, (k, req.tokens.len() as u64));
        self.view_for(k, fleet);
        self.routers[k].submit(now_ms, req, &self.view);
    }

    fn next_wakeup(&self) -> Option<f64> {
        self.routers
            .iter()
            .filter_map(|router| router.next_wakeup())
            .min_by(f64::total_cmp)
    }

    fn poll(&mut self, now_ms: f64, fleet: &[ReplicaState], out: &mut Vec<Decision>) {
        for k in 0..self.routers.len() {
            self.view_for(k, fleet);
            let mut decided = std::mem::take(&mut self.decided);
            self.routers[k].poll(now_ms, &self.view, &mut decided);
            self.decided = decided;
            self.collect(k, out);
        }
    }

    fn on_complete(&mut self, now_ms: f64, request: u64, replica: usize) {
        let Some((k, tokens)) = self.owners.remove(&request) else {
            return;
        };
        if let Some(sent) = self.sent[k].get_mut(replica) {
            sent.requests = sent.requests.saturating_sub(1);
            sent.tokens = sent.tokens.saturating_sub(tokens);
        }
        self.routers[k].on_complete(now_ms, request, replica);
    }

    fn takes_kv_events(&self) -> bool {
        !self.event_takers.is_empty()
    }

    fn kv_events(&mut self, now_ms: f64, replica: usize, events: Vec<KvEvent>) {
        let Some((&last, rest)) = self.event_takers.split_last() else {
            return;
        };
        for &k in rest {
            self.routers[k].kv_events(now_ms, replica, events.clone());
        }
        self.routers[last].kv_events(now_ms, replica, events);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What one fake router saw, shared with the test.
    #[derive(Default)]
    struct Seen {
        submitted: Vec<u64>,
        in_flight_at_submit: Vec<Vec<u32>>,
        completed: Vec<u64>,
        events: usize,
    }

    /// Sends every request to replica `to`.
    struct Fixed {
        to: usize,
        seen: Arc<Mutex<Seen>>,
        pending: Vec<Decision>,
    }

    impl SimRouter for Fixed {
        fn name(&self) -> &str {
            "fixed"
        }

        fn submit(&mut self, _now_ms: f64, req: &SimRequest, fleet: &[ReplicaState]) {
            let mut seen = self.seen.lock().unwrap();
            seen.submitted.push(req.id);
            seen.in_flight_at_submit
                .push(fleet.iter().map(|s| s.in_flight).collect());
            self.pending.push(Decision::to(req.id, Some(self.to)));
        }

        fn next_wakeup(&self) -> Option<f64> {
            None
        }

        fn poll(&mut self, _now_ms: f64, _fleet: &[ReplicaState], out: &mut Vec<Decision>) {
            out.append(&mut self.pending);
        }

        fn on_complete(&mut self, _now_ms: f64, request: u64, _replica: usize) {
            self.seen.lock().unwrap().completed.push(request);
        }

        fn takes_kv_events(&self) -> bool {
            true
        }

        fn kv_events(&mut self, _now_ms: f64, _replica: usize, events: Vec<KvEvent>) {
            self.seen.lock().unwrap().events += events.len();
        }
    }

    fn request(id: u64) -> SimRequest {
        SimRequest {
            id,
            arrival_ms: 0.0,
            model: "m".into(),
            cache_salt: String::new(),
            tokens: vec![1, 2, 3, 4].into(),
            output_tokens: 1,
            group: 0,
            step: None,
        }
    }

    fn two_routers() -> (SideBySide, [Arc<Mutex<Seen>>; 2]) {
        let seen = [Arc::default(), Arc::default()];
        let routers: Vec<Box<dyn SimRouter + Send>> = (0..2)
            .map(|k| {
                Box::new(Fixed {
                    to: k,
                    seen: Arc::clone(&seen[k]),
                    pending: Vec::new(),
                }) as Box<dyn SimRouter + Send>
            })
            .collect();
        (SideBySide::new(routers), seen)
    }

    #[test]
    fn requests_are_dealt_in_turn_and_completions_go_back_to_their_router() {
        let (mut routers, seen) = two_routers();
        let fleet = [ReplicaState::default(); 2];
        let mut out = Vec::new();
        for id in 0..5 {
            routers.submit(0.0, &request(id), &fleet);
            routers.poll(0.0, &fleet, &mut out);
        }
        let placed: Vec<_> = out.iter().map(|d| (d.request, d.replica)).collect();
        assert_eq!(
            placed,
            [
                (0, Some(0)),
                (1, Some(1)),
                (2, Some(0)),
                (3, Some(1)),
                (4, Some(0))
            ]
        );
        assert_eq!(seen[0].lock().unwrap().submitted, [0, 2, 4]);
        assert_eq!(seen[1].lock().unwrap().submitted, [1, 3]);
        routers.on_complete(1.0, 3, 1);
        routers.on_complete(1.0, 2, 0);
        assert_eq!(seen[0].lock().unwrap().completed, [2]);
        assert_eq!(seen[1].lock().unwrap().completed, [3]);
    }

    #[test]
    fn each_router_sees_only_its_own_requests_in_flight() {
        let (mut routers, seen) = two_routers();
        // The fleet says 9 in flight everywhere: the other router's requests are among them.
        let fleet = [ReplicaState {
            in_flight: 9,
            running: 9,
            ..ReplicaState::default()
        }; 2];
        let mut out = Vec::new();
        for id in 0..4 {
            routers.submit(0.0, &request(id), &fleet);
            routers.poll(0.0, &fleet, &mut out);
        }
        routers.on_complete(1.0, 0, 0);
        routers.submit(2.0, &request(4), &fleet);
        // Router 0 sent requests 0 and 2 to replica 0, and 0 completed before request 4.
        assert_eq!(
            seen[0].lock().unwrap().in_flight_at_submit,
            [vec![0, 0], vec![1, 0], vec![1, 0]]
        );
        assert_eq!(
            seen[1].lock().unwrap().in_flight_at_submit,
            [vec![0, 0], vec![0, 1]]
        );
    }

    #[test]
    fn every_router_hears_every_replicas_events() {
        let (mut routers, seen) = two_routers();
        assert!(routers.takes_kv_events());
        routers.kv_events(0.0, 1, vec![KvEvent::AllBlocksCleared; 3]);
        assert_eq!(seen[0].lock().unwrap().events, 3);
        assert_eq!(seen[1].lock().unwrap().events, 3);
    }
}
