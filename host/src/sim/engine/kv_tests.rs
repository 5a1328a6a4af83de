//! The replicas' KV-cache events as a router reading them hears them, and the checks of
//! prefix predictions.

use super::*;
use crate::sim::config::FleetConfig;
use crate::sim::fleet::ReplicaGroup;
use crate::sim::profile::EngineParams;
use crate::sim::router::RoundRobin;
use crate::sim::workload::KvPressureParams;
use std::collections::HashSet;
use switchyard_plugin_api::kv::{KvEvent, Medium};
use switchyard_prefix_hashing::{hash_prompt_into, prompt_seed};

type Heard = Vec<(f64, usize, Vec<KvEvent>)>;

/// Places like round-robin, so where requests go never depends on the events, and keeps
/// every batch of events it is handed with the time it was handed over.
#[derive(Default)]
struct Listener {
    inner: RoundRobin,
    heard: Heard,
}

impl SimRouter for Listener {
    fn name(&self) -> &str {
        "listener"
    }
    fn submit(&mut self, now: f64, req: &SimRequest, fleet: &[ReplicaState]) {
        self.inner.submit(now, req, fleet);
    }
    fn next_wakeup(&self) -> Option<f64> {
        None
    }
    fn poll(&mut self, now: f64, fleet: &[ReplicaState], out: &mut Vec<Decision>) {
        self.inner.poll(now, fleet, out);
    }
    fn on_complete(&mut self, _now: f64, _request: u64, _replica: usize) {}
    fn takes_kv_events(&self) -> bool {
        true
    }
    fn kv_events(&mut self, now_ms: f64, replica: usize, events: Vec<KvEvent>) {
        self.heard.push((now_ms, replica, events));
    }
}

/// Six tenants with 64-token prefixes, half of them salted, on pools far too small for them:
/// every replica stores and evicts all the time, prefix hits included.
fn pressured_workload() -> Vec<SimRequest> {
    let params = KvPressureParams {
        tenants: 6,
        prefix_tokens: 64,
        question_tokens_min: 8,
        question_tokens_max: 40,
        output_tokens_min: 2,
        output_tokens_max: 24,
        requests: 300,
        requests_per_second: 40.0,
        ..KvPressureParams::default()
    };
    let mut requests = params.generate();
    for r in &mut requests {
        if r.group % 2 == 1 {
            r.cache_salt = format!("tenant-{}", r.group);
        }
    }
    requests
}

/// Two step-engine replicas of 24 blocks (1 ms per step, 0.25 ms per prefill token).
fn small_engines(kv_event_delay_ms: f64) -> SimFleet {
    SimFleet {
        scrape_interval_ms: 0.0,
        kv_event_delay_ms,
        groups: vec![ReplicaGroup {
            replicas: 2,
            profile_name: "test".into(),
            profile: Profile::Engine(EngineParams::round_numbers(24)),
        }],
        ..SimFleet::default_fleet(1)
    }
}

/// Runs `workload` with a [`Listener`]; returns what it heard, every replica's cached block
/// hashes at the end, and when the run ended.
fn listen(workload: &[SimRequest], fleet: &SimFleet) -> (Heard, Vec<HashSet<u64>>, f64) {
    let mut router = Listener::default();
    let mut sim = Sim::new(
        workload.len(),
        workload.iter().cloned().peekable(),
        fleet,
        true,
    );
    sim.run(&mut router, &mut |_, _| {});
    assert_eq!(sim.finished, workload.len(), "every request is done");
    let cached = sim
        .replicas
        .iter()
        .map(|r| match r {
            SimReplica::Stepped(s) => s.pool().cached_hashes().collect(),
            SimReplica::Fixed(f) => f.cache().blocks().iter().copied().collect(),
        })
        .collect();
    (router.heard, cached, sim.now)
}

/// Applies `heard` in order, checking each event against what came before it: batches in
/// time order; a store names blocks not held yet, under the hashes its tokens chain to from
/// its parent (or from the model and the salt its first block carries); a removal names
/// blocks held. Returns what each replica holds at the end, and how many stores named a
/// parent that was not held.
fn replay(heard: &Heard, replicas: usize, block_size: usize) -> (Vec<HashSet<u64>>, usize) {
    let mut held = vec![HashSet::new(); replicas];
    let mut orphans = 0;
    let mut last = f64::NEG_INFINITY;
    for (at, replica, events) in heard {
        assert!(*at >= last, "a batch at {at} after one at {last}");
        last = *at;
        assert!(!events.is_empty(), "an empty batch at {at}");
        let held = &mut held[*replica];
        for event in events {
            match event {
                KvEvent::BlockStored(s) => {
                    assert_eq!(s.block_size as usize, block_size);
                    assert_eq!(s.medium, Medium::Gpu);
                    assert_eq!(s.token_ids.len(), s.block_hashes.len() * block_size);
                    let seed = match s.parent_block_hash {
                        Some(parent) => {
                            orphans += usize::from(!held.contains(&parent));
                            parent
                        }
                        None => {
                            let salt = match s.extra_keys.first() {
                                Some(Some(keys)) => keys.concat(),
                                _ => String::new(),
                            };
                            prompt_seed("sim-model", &salt)
                        }
                    };
                    let mut chained = Vec::new();
                    hash_prompt_into(
                        seed,
                        &s.token_ids,
                        block_size,
                        s.block_hashes.len(),
                        &mut chained,
                    );
                    assert_eq!(chained, s.block_hashes, "tokens that are not the blocks'");
                    for &h in &s.block_hashes {
                        assert!(held.insert(h), "block {h} stored twice");
                    }
                }
                KvEvent::BlockRemoved(r) => {
                    assert_eq!(r.medium, Medium::Gpu);
                    for h in &r.block_hashes {
                        assert!(held.remove(h), "block {h} removed but not held");
                    }
                }
                other => panic!("the simulator sent {other:?}"),
            }
        }
    }
    (held, orphans)
}

#[test]
fn the_events_tell_every_store_and_eviction_of_the_step_engines_pools() {
    let workload = pressured_workload();
    let (heard, cached, _) = listen(&workload, &small_engines(0.0));
    let (held, orphans) = replay(&heard, 2, 16);
    assert_eq!(held, cached, "the events add up to what the pools hold");
    assert_eq!(orphans, 0, "every store's parent was stored before it");
    let removals: usize = heard
        .iter()
        .flat_map(|(_, _, events)| events)
        .map(|e| match e {
            KvEvent::BlockRemoved(r) => r.block_hashes.len(),
            _ => 0,
        })
        .sum();
    assert!(removals > 300, "the pools evict all the time ({removals})");
    let salted = heard
        .iter()
        .flat_map(|(_, _, events)| events)
        .filter(|e| matches!(e, KvEvent::BlockStored(s) if !s.extra_keys.is_empty()))
        .count();
    assert!(salted > 0, "salted chains carry their salt");
}

#[test]
fn the_events_tell_every_change_of_the_fixed_rate_caches() {
    let workload = pressured_workload();
    let fleet = SimFleet::from(&FleetConfig {
        replicas: 2,
        cache_capacity_blocks: 24,
        ..FleetConfig::default()
    });
    let (heard, cached, _) = listen(&workload, &fleet);
    let (held, _) = replay(&heard, 2, 16);
    assert_eq!(held, cached);
    assert!(heard
        .iter()
        .flat_map(|(_, _, events)| events)
        .any(|e| matches!(e, KvEvent::BlockRemoved(_))));
}

#[test]
fn events_reach_the_router_the_delay_after_they_happened_in_order() {
    let workload = pressured_workload();
    let (at_once, _, _) = listen(&workload, &small_engines(0.0));
    let (late, _, end) = listen(&workload, &small_engines(7.5));
    // Placement does not depend on the events, so the replicas did the same things at the
    // same times; each batch arrives 7.5 ms later, those due after the last completion not
    // at all.
    let shifted: Heard = at_once
        .into_iter()
        .map(|(at, replica, events)| (at + 7.5, replica, events))
        .filter(|(at, _, _)| *at <= end)
        .collect();
    assert!(shifted.len() > 100);
    assert_eq!(late.len(), shifted.len());
    for (i, (got, want)) in late.iter().zip(&shifted).enumerate() {
        assert_eq!(got, want, "batch {i}");
    }
    // The same seed, the same events.
    let (again, _, _) = listen(&workload, &small_engines(7.5));
    assert_eq!(again, late);
}

/// Places like round-robin and claims, for every request, `claims` prompt tokens per
/// producer.
struct Claimer {
    inner: RoundRobin,
    claims: Vec<(&'static str, u64)>,
}

impl SimRouter for Claimer {
    fn name(&self) -> &str {
        "claimer"
    }
    fn submit(&mut self, now: f64, req: &SimRequest, fleet: &[ReplicaState]) {
        self.inner.submit(now, req, fleet);
    }
    fn next_wakeup(&self) -> Option<f64> {
        None
    }
    fn poll(&mut self, now: f64, fleet: &[ReplicaState], out: &mut Vec<Decision>) {
        let from = out.len();
        self.inner.poll(now, fleet, out);
        for d in &mut out[from..] {
            d.predicted = Predicted::of(&self.claims);
        }
    }
    fn on_complete(&mut self, _now: f64, _request: u64, _replica: usize) {}
}

#[test]
fn each_producers_prediction_is_checked_against_the_prefix_found_at_scheduling() {
    // One replica. Request 0 (64 tokens) finds nothing; request 1, the same 64 tokens and 16
    // more, arrives after it is done and finds its 4 blocks.
    let first: Vec<u32> = (0..64).collect();
    let second: Vec<u32> = (0..80).collect();
    let workload = vec![
        SimRequest {
            id: 0,
            arrival_ms: 0.0,
            model: "m".into(),
            cache_salt: String::new(),
            tokens: first.into(),
            output_tokens: 1,
            group: 0,
            step: None,
        },
        SimRequest {
            id: 1,
            arrival_ms: 1000.0,
            model: "m".into(),
            cache_salt: String::new(),
            tokens: second.into(),
            output_tokens: 1,
            group: 0,
            step: None,
        },
    ];
    let mut router = Claimer {
        inner: RoundRobin::new(),
        claims: vec![("precise", 32), ("silent", 0)],
    };
    let fleet = SimFleet::from(&FleetConfig {
        replicas: 1,
        ..FleetConfig::default()
    });
    let report = run(&workload, &fleet, &mut router, &mut |_, _| {});
    assert_eq!(report.prefill_tokens_cached, 64);
    let shown: Vec<_> = report
        .prefix_predictions
        .iter()
        .map(|p| {
            (
                p.producer.as_str(),
                p.checked_requests,
                p.predicted_tokens,
                p.cached_tokens,
                p.correct_tokens,
                p.precision,
                p.recall,
            )
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            // 32 of 0, then 32 of 64.
            ("precise", 2, 64, 64, 32, Some(0.5), Some(0.5)),
            ("silent", 2, 0, 64, 0, None, Some(0.0)),
        ]
    );
    // A router that predicts nothing has nothing checked.
    let report = run(&workload, &fleet, &mut RoundRobin::new(), &mut |_, _| {});
    assert!(report.prefix_predictions.is_empty());
}

#[test]
fn a_router_that_reads_no_events_gets_none_and_nothing_is_kept_for_them() {
    let workload = pressured_workload();
    let fleet = small_engines(0.0);
    let mut sim = Sim::new(
        workload.len(),
        workload.iter().cloned().peekable(),
        &fleet,
        RoundRobin::new().takes_kv_events(),
    );
    assert!(sim.kv.is_none());
    sim.run(&mut RoundRobin::new(), &mut |_, _| {});
    for replica in &mut sim.replicas {
        let SimReplica::Stepped(s) = replica else {
            panic!("a step engine");
        };
        let mut changes = Vec::new();
        s.take_block_changes(&mut changes);
        assert!(changes.is_empty(), "no change kept");
    }
    // With a listener, every request's prompt is let go once it is done.
    let mut sim = Sim::new(
        workload.len(),
        workload.iter().cloned().peekable(),
        &fleet,
        true,
    );
    sim.run(&mut Listener::default(), &mut |_, _| {});
    assert!(sim.kv.as_ref().is_some_and(|kv| kv.prompts.is_empty()));
}
