use super::*;
use crate::sim::config::FleetConfig;
use crate::sim::report::Summary;
use crate::sim::router::{LeastInFlight, RoundRobin};
use crate::sim::workload::RlRolloutParams;

fn request(id: u64, arrival_ms: f64, tokens: Vec<u32>, output_tokens: u32) -> SimRequest {
    SimRequest {
        id,
        arrival_ms,
        model: "m".into(),
        cache_salt: String::new(),
        tokens: tokens.into(),
        output_tokens,
        group: id,
        step: None,
    }
}

/// A prompt of `len` tokens no other prompt shares a block with.
fn distinct_prompt(tag: u32, len: u32) -> Vec<u32> {
    (0..len).map(|i| tag * 1_000_000 + i).collect()
}

fn fleet(replicas: usize, max_running: u32, decode_tokens_per_second: f64) -> FleetConfig {
    FleetConfig {
        replicas,
        block_size_tokens: 16,
        cache_capacity_blocks: 10_000,
        prefill_tokens_per_second: 16_000.0,
        decode_tokens_per_second,
        max_running_sequences: max_running,
    }
}

fn run_quiet(
    workload: &[SimRequest],
    fleet: &FleetConfig,
    router: &mut dyn SimRouter,
) -> PipelineReport {
    run(workload, fleet, router, &mut |_, _| {})
}

/// Two replicas with one batch slot each; 1600-token prompts prefill in 100 ms, decode takes
/// 10 ms per token after the first. Request 0 decodes for 1000 ms, the others not at all.
fn uneven_workload() -> Vec<SimRequest> {
    vec![
        request(0, 0.0, distinct_prompt(1, 1600), 101),
        request(1, 0.0, distinct_prompt(2, 1600), 1),
        request(2, 500.0, distinct_prompt(3, 1600), 1),
        request(3, 700.0, distinct_prompt(4, 1600), 1),
    ]
}

#[test]
fn round_robin_queues_behind_the_long_request() {
    let report = run_quiet(
        &uneven_workload(),
        &fleet(2, 1, 100.0),
        &mut RoundRobin::new(),
    );
    assert_eq!(report.name, "round-robin");
    assert_eq!(
        (
            report.requests,
            report.completed,
            report.rejected_by_router,
            report.unrouted
        ),
        (4, 4, 0, 0)
    );
    // Request 2 lands on replica 0 at 500 ms and waits for request 0 to finish at 1100 ms.
    assert_eq!(
        report.ttft_ms,
        Summary {
            count: 4,
            mean: 250.0,
            p50: 100.0,
            p90: 700.0,
            p99: 700.0
        }
    );
    assert_eq!(
        report.e2e_ms,
        Summary {
            count: 4,
            mean: 500.0,
            p50: 100.0,
            p90: 1100.0,
            p99: 1100.0
        }
    );
    assert_eq!(
        report.router_wait_ms,
        Summary {
            count: 4,
            mean: 0.0,
            p50: 0.0,
            p90: 0.0,
            p99: 0.0
        }
    );
    assert_eq!(report.replica_load.max, 2);
    assert_eq!(report.replica_load.mean, 1.5);
    assert_eq!(report.replica_load.peak_per_replica, vec![2, 1]);
    assert_eq!(report.replica_load.served_per_replica, vec![2, 2]);
    assert_eq!(report.makespan_ms, 1200.0);
    assert_eq!(report.prefill_tokens_computed, 6400);
    assert_eq!(report.prefill_tokens_ideal, 6400);
    assert_eq!(report.cache_hit_rate, 0.0);
    assert_eq!(report.prefills_per_prompt_per_step, None);
}

#[test]
fn least_in_flight_avoids_the_busy_replica() {
    let report = run_quiet(
        &uneven_workload(),
        &fleet(2, 1, 100.0),
        &mut LeastInFlight::new(),
    );
    assert_eq!(report.name, "least-in-flight");
    assert_eq!(
        report.ttft_ms,
        Summary {
            count: 4,
            mean: 100.0,
            p50: 100.0,
            p90: 100.0,
            p99: 100.0
        }
    );
    assert_eq!(
        report.e2e_ms,
        Summary {
            count: 4,
            mean: 350.0,
            p50: 100.0,
            p90: 1100.0,
            p99: 1100.0
        }
    );
    assert_eq!(report.replica_load.peak_per_replica, vec![1, 1]);
    assert_eq!(report.replica_load.served_per_replica, vec![1, 3]);
    assert_eq!(report.makespan_ms, 1100.0);
}

/// Sends every request of group g to replica g mod R.
struct ByGroup {
    decided: Vec<Decision>,
}

impl SimRouter for ByGroup {
    fn name(&self) -> &str {
        "by-group"
    }
    fn submit(&mut self, _now: f64, req: &SimRequest, fleet: &[ReplicaState]) {
        self.decided
            .push(Decision::to(req.id, Some(req.group as usize % fleet.len())));
    }
    fn next_wakeup(&self) -> Option<f64> {
        None
    }
    fn poll(&mut self, _now: f64, _fleet: &[ReplicaState], out: &mut Vec<Decision>) {
        out.append(&mut self.decided);
    }
    fn on_complete(&mut self, _now: f64, _request: u64, _replica: usize) {}
}

/// One step: prompt A (64 tokens, 4 full blocks) and prompt B (40 tokens, 2 full blocks and an
/// 8-token tail), 4 samples each, arriving together, A's samples first.
fn burst() -> Vec<SimRequest> {
    let a = distinct_prompt(1, 64);
    let b = distinct_prompt(2, 40);
    (0..8)
        .map(|i| {
            let (tokens, group) = if i < 4 {
                (a.clone(), 0)
            } else {
                (b.clone(), 1)
            };
            SimRequest {
                group,
                step: Some(0),
                ..request(i, 0.0, tokens, 4)
            }
        })
        .collect()
}

#[test]
fn round_robin_prefills_each_prompt_on_every_replica() {
    let report = run_quiet(&burst(), &fleet(2, 64, 50.0), &mut RoundRobin::new());
    assert_eq!(report.prompt_tokens, 4 * 64 + 4 * 40);
    // Per replica: A 64 + A 0 + B 40 + B 8 (its uncached tail).
    assert_eq!(report.prefill_tokens_computed, 2 * (64 + 40 + 8));
    assert_eq!(report.prefill_tokens_cached, 2 * (64 + 32));
    assert_eq!(
        report.replica_load.prefill_tokens_computed_per_replica,
        vec![112, 112]
    );
    assert_eq!(
        report.replica_load.prefill_tokens_cached_per_replica,
        vec![96, 96]
    );
    // 6 distinct blocks of 16, plus four 8-token tails.
    assert_eq!(report.prefill_tokens_ideal, 6 * 16 + 4 * 8);
    assert_eq!(report.cache_hit_rate, 192.0 / 416.0);
    assert_eq!(report.prefills_per_prompt_per_step, Some(2.0));
}

#[test]
fn co_location_reaches_the_ideal() {
    let report = run_quiet(
        &burst(),
        &fleet(2, 64, 50.0),
        &mut ByGroup {
            decided: Vec::new(),
        },
    );
    assert_eq!(report.prefill_tokens_computed, 64 + 40 + 3 * 8);
    assert_eq!(report.prefill_tokens_computed, report.prefill_tokens_ideal);
    assert_eq!(report.prefills_per_prompt_per_step, Some(1.0));
    assert_eq!(report.replica_load.served_per_replica, vec![4, 4]);
}

/// Holds every request and decides them all `window_ms` after the first arrival of a window.
struct Windowed {
    window_ms: f64,
    seal_at: Option<f64>,
    held: Vec<u64>,
}

impl SimRouter for Windowed {
    fn name(&self) -> &str {
        "windowed"
    }
    fn submit(&mut self, now: f64, req: &SimRequest, _fleet: &[ReplicaState]) {
        self.seal_at.get_or_insert(now + self.window_ms);
        self.held.push(req.id);
    }
    fn next_wakeup(&self) -> Option<f64> {
        self.seal_at
    }
    fn poll(&mut self, now: f64, _fleet: &[ReplicaState], out: &mut Vec<Decision>) {
        if self.seal_at.is_some_and(|t| t <= now) {
            self.seal_at = None;
            out.extend(self.held.drain(..).map(|id| Decision {
                note: Some("window sealed".into()),
                ..Decision::to(id, Some(0))
            }));
        }
    }
    fn on_complete(&mut self, _now: f64, _request: u64, _replica: usize) {}
}

#[test]
fn router_wait_counts_towards_ttft() {
    let workload = vec![
        request(0, 0.0, distinct_prompt(1, 1600), 1),
        request(1, 20.0, distinct_prompt(2, 1600), 1),
    ];
    let mut router = Windowed {
        window_ms: 50.0,
        seal_at: None,
        held: Vec::new(),
    };
    let report = run_quiet(&workload, &fleet(1, 64, 50.0), &mut router);
    // Both decided at 50 ms; prefills 50→150 and 150→250.
    assert_eq!(
        (report.router_wait_ms.p50, report.router_wait_ms.p99),
        (30.0, 50.0)
    );
    assert_eq!(report.ttft_ms.p50, 150.0);
    assert_eq!(report.ttft_ms.p99, 230.0);
    assert_eq!(report.makespan_ms, 250.0);
}

/// Rejects everything, or never decides at all.
struct Refuser {
    decide: bool,
    always_wake: bool,
    held: Vec<Decision>,
}

impl SimRouter for Refuser {
    fn name(&self) -> &str {
        "refuser"
    }
    fn submit(&mut self, _now: f64, req: &SimRequest, _fleet: &[ReplicaState]) {
        if self.decide {
            self.held.push(Decision::to(req.id, None));
        }
    }
    fn next_wakeup(&self) -> Option<f64> {
        self.always_wake.then_some(0.0)
    }
    fn poll(&mut self, _now: f64, _fleet: &[ReplicaState], out: &mut Vec<Decision>) {
        out.append(&mut self.held);
    }
    fn on_complete(&mut self, _now: f64, _request: u64, _replica: usize) {}
}

#[test]
fn rejected_and_unrouted_requests_end_the_run() {
    let workload = uneven_workload();
    let mut rejecting = Refuser {
        decide: true,
        always_wake: false,
        held: Vec::new(),
    };
    let report = run_quiet(&workload, &fleet(2, 1, 100.0), &mut rejecting);
    assert_eq!(
        (report.completed, report.rejected_by_router, report.unrouted),
        (0, 4, 0)
    );
    assert_eq!(report.prompt_tokens, 0);
    assert_eq!(report.ttft_ms, Summary::default());
    assert!(report.ttft_cdf_ms.is_empty());

    let mut silent = Refuser {
        decide: false,
        always_wake: false,
        held: Vec::new(),
    };
    let report = run_quiet(&workload, &fleet(2, 1, 100.0), &mut silent);
    assert_eq!(
        (report.completed, report.rejected_by_router, report.unrouted),
        (0, 0, 4)
    );

    // Asks to be woken "now" forever without deciding: the run still ends.
    let mut restless = Refuser {
        decide: false,
        always_wake: true,
        held: Vec::new(),
    };
    let report = run_quiet(&workload, &fleet(2, 1, 100.0), &mut restless);
    assert_eq!(report.unrouted, 4);
}

/// Sends everything to a replica that does not exist.
struct OutOfRange;

impl SimRouter for OutOfRange {
    fn name(&self) -> &str {
        "out-of-range"
    }
    fn submit(&mut self, _now: f64, _req: &SimRequest, _fleet: &[ReplicaState]) {}
    fn next_wakeup(&self) -> Option<f64> {
        None
    }
    fn poll(&mut self, _now: f64, fleet: &[ReplicaState], out: &mut Vec<Decision>) {
        out.push(Decision::to(0, Some(fleet.len())));
        out.push(Decision::to(99, Some(0)));
    }
    fn on_complete(&mut self, _now: f64, _request: u64, _replica: usize) {}
}

#[test]
fn decisions_for_missing_replicas_reject_and_unknown_ids_are_ignored() {
    let workload = vec![request(0, 0.0, distinct_prompt(1, 32), 1)];
    let report = run_quiet(&workload, &fleet(2, 1, 100.0), &mut OutOfRange);
    assert_eq!(
        (report.completed, report.rejected_by_router, report.unrouted),
        (0, 1, 0)
    );
}

#[test]
fn duplicate_ids_are_rejected_without_reaching_the_router() {
    let workload = vec![
        request(5, 0.0, distinct_prompt(1, 32), 1),
        request(5, 1.0, distinct_prompt(2, 32), 1),
    ];
    let report = run_quiet(&workload, &fleet(1, 4, 100.0), &mut RoundRobin::new());
    assert_eq!((report.completed, report.rejected_by_router), (1, 1));
    assert_eq!(report.replica_load.served_per_replica, vec![1]);
}

#[test]
fn ids_equal_to_their_arrival_index_and_other_ids_are_told_apart() {
    // Ids 0, 2 and 6 arrive at their own index; 7, 1 and 4 do not; the second 0 and the
    // second 7 are duplicates, one of an id at its own index and one of an id elsewhere.
    let ids = [0, 7, 2, 0, 1, 7, 6, 4];
    let workload: Vec<SimRequest> = ids
        .iter()
        .enumerate()
        .map(|(k, &id)| request(id, k as f64, distinct_prompt(k as u32, 32), 1))
        .collect();
    let report = run_quiet(&workload, &fleet(2, 4, 100.0), &mut RoundRobin::new());
    assert_eq!((report.completed, report.rejected_by_router), (6, 2));

    // A duplicate at its own index (the second 3) must not hide the first 3, placed elsewhere,
    // from decisions that come after the duplicate arrived.
    let workload: Vec<SimRequest> = [3, 8, 9, 3]
        .iter()
        .enumerate()
        .map(|(k, &id)| request(id, k as f64, distinct_prompt(k as u32, 32), 1))
        .collect();
    let mut router = DecidesAtTheEnd::default();
    let report = run_quiet(&workload, &fleet(2, 4, 100.0), &mut router);
    assert_eq!((report.completed, report.rejected_by_router), (3, 1));
}

/// Holds every decision until it is polled at 3 ms or later, then places all it holds on
/// replica 0.
#[derive(Default)]
struct DecidesAtTheEnd {
    held: Vec<u64>,
}

impl SimRouter for DecidesAtTheEnd {
    fn name(&self) -> &str {
        "decides-at-the-end"
    }
    fn submit(&mut self, _now_ms: f64, req: &SimRequest, _fleet: &[ReplicaState]) {
        self.held.push(req.id);
    }
    fn next_wakeup(&self) -> Option<f64> {
        None
    }
    fn poll(&mut self, now_ms: f64, _fleet: &[ReplicaState], out: &mut Vec<Decision>) {
        if now_ms >= 3.0 {
            out.extend(
                self.held
                    .drain(..)
                    .map(|request| Decision::to(request, Some(0))),
            );
        }
    }
    fn on_complete(&mut self, _now_ms: f64, _request: u64, _replica: usize) {}
}

#[test]
fn progress_is_monotonic_and_ends_complete() {
    let workload: Vec<SimRequest> = (0..250)
        .map(|i| request(i, i as f64, distinct_prompt(i as u32, 32), 2))
        .collect();
    let mut seen = Vec::new();
    run(
        &workload,
        fleet(4, 8, 100.0),
        &mut LeastInFlight::new(),
        &mut |done, total| seen.push((done, total)),
    );
    assert_eq!(seen.last(), Some(&(250, 250)));
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0));
    assert!(seen.len() <= 102, "{} progress calls", seen.len());
}

#[test]
fn same_seed_gives_identical_reports() {
    let params = RlRolloutParams {
        prompts: 6,
        samples: 4,
        steps: 2,
        step_interval_ms: 5_000.0,
        prompt_tokens_min: 100,
        prompt_tokens_max: 300,
        output_tokens_min: 10,
        output_tokens_max: 40,
        ..RlRolloutParams::default()
    };
    let fleet = fleet(3, 4, 100.0);
    let render = |seed: u64| {
        let workload = RlRolloutParams {
            seed,
            ..params.clone()
        }
        .generate();
        let a = run_quiet(&workload, &fleet, &mut LeastInFlight::new());
        let b = run_quiet(&workload, &fleet, &mut RoundRobin::new());
        serde_json::to_string(&[a, b]).unwrap()
    };
    assert_eq!(render(7), render(7));
    assert_ne!(render(7), render(8));
}

#[test]
fn rl_step_prefills_match_the_analytic_burst_model() {
    // One default step (32 prompts × 16 samples) on 8 replicas: spreading a group's 16
    // samples prefills its prompt min(n, R) = 8 times; co-locating it, once. The model is
    // of a burst arriving at once: a spread arrival lets late samples find the prompt cached.
    let workload = RlRolloutParams {
        steps: 1,
        arrival_spread_ms: 0.0,
        arrival_jitter_ms: 0.0,
        ..RlRolloutParams::default()
    }
    .generate();
    let fleet = FleetConfig::default();
    let rr = run_quiet(&workload, &fleet, &mut RoundRobin::new());
    let lif = run_quiet(&workload, &fleet, &mut LeastInFlight::new());
    let grouped = run_quiet(
        &workload,
        &fleet,
        &mut ByGroup {
            decided: Vec::new(),
        },
    );
    assert_eq!(rr.prefills_per_prompt_per_step, Some(8.0));
    assert_eq!(lif.prefills_per_prompt_per_step, Some(8.0));
    assert_eq!(grouped.prefills_per_prompt_per_step, Some(1.0));
    assert_eq!(
        grouped.prefill_tokens_computed,
        grouped.prefill_tokens_ideal
    );
    assert!(rr.prefill_tokens_computed > 7 * rr.prefill_tokens_ideal);
    assert_eq!(rr.completed, 512);
}

/// Not a timing assertion: run with `--release -- --ignored` to see how long 10,000 requests take.
#[test]
#[ignore]
fn ten_thousand_requests() {
    let workload = RlRolloutParams {
        prompts: 125,
        samples: 16,
        steps: 5,
        ..RlRolloutParams::default()
    }
    .generate();
    assert_eq!(workload.len(), 10_000);
    let started = std::time::Instant::now();
    let report = run_quiet(&workload, &FleetConfig::default(), &mut RoundRobin::new());
    eprintln!("10,000 requests simulated in {:?}", started.elapsed());
    assert_eq!(report.completed, 10_000);
}

#[test]
fn streamed_shared_and_copied_prompts_report_alike() {
    // The same requests three ways: from the generator as it streams (samples and turns
    // sharing buffers), from a slice of them, and with every prompt copied into its own
    // buffer; the report must not tell them apart.
    let fleet = fleet(3, 4, 200.0);
    let rl = crate::sim::Workload::RlRollout(RlRolloutParams {
        prompts: 5,
        samples: 6,
        steps: 3,
        step_interval_ms: 400.0,
        prompt_tokens_min: 40,
        prompt_tokens_max: 300,
        output_tokens_min: 10,
        output_tokens_max: 40,
        interleaved: true,
        ..RlRolloutParams::default()
    });
    let mt = crate::sim::Workload::from_name(
        "multi-turn",
        serde_json::json!({"sessions": 4, "turns": 5, "thinkTimeMs": 300}),
    )
    .unwrap();
    for workload in [rl, mt] {
        let shared = workload.generate();
        let copied: Vec<SimRequest> = shared
            .iter()
            .map(|r| SimRequest {
                tokens: r.tokens.to_vec().into(),
                ..r.clone()
            })
            .collect();
        let streamed = run_stream(
            workload.len(),
            workload.requests(),
            &SimFleet::from(&fleet),
            &mut RoundRobin::new(),
            &mut |_, _| {},
        );
        let from_slice = run_quiet(&shared, &fleet, &mut RoundRobin::new());
        let from_copies = run_quiet(&copied, &fleet, &mut RoundRobin::new());
        assert_eq!(streamed, from_slice, "{}", workload.name());
        assert_eq!(streamed, from_copies, "{}", workload.name());
        assert!(streamed.prefill_tokens_cached > 0);
    }
}

#[test]
fn a_shared_buffer_under_another_model_gets_its_own_chain() {
    // Two requests on one buffer but different models hash differently, so the second
    // finds nothing of the first cached.
    let buffer: std::sync::Arc<[u32]> = distinct_prompt(1, 320).into();
    let mut a = request(0, 0.0, Vec::new(), 1);
    a.tokens = crate::sim::Tokens::prefix(&buffer, 320);
    let mut b = a.clone();
    b.id = 1;
    b.arrival_ms = 100.0;
    b.model = "other".into();
    let mut c = a.clone();
    c.id = 2;
    c.arrival_ms = 200.0;
    c.tokens = crate::sim::Tokens::prefix(&buffer, 160);
    let report = run_quiet(&[a, b, c], &fleet(1, 4, 100.0), &mut RoundRobin::new());
    assert_eq!(report.prefill_tokens_cached, 160);
    assert_eq!(report.prefill_tokens_computed, 640);
    assert_eq!(report.prefill_tokens_ideal, 640);
}

/// A fleet of `replicas` step-engine replicas with round numbers: 1 ms per step, 0.25 ms per
/// prefill token, 0.5 ms per decoding sequence; 64 tokens and 4 sequences per step.
fn engine_fleet(replicas: usize, scrape_interval_ms: f64) -> SimFleet {
    use crate::sim::fleet::ReplicaGroup;
    use crate::sim::profile::EngineParams;
    SimFleet {
        scrape_interval_ms,
        groups: vec![ReplicaGroup {
            replicas,
            profile_name: "test".into(),
            profile: Profile::Engine(EngineParams::round_numbers(100)),
        }],
        ..SimFleet::default_fleet(1)
    }
}

fn run_engine(
    workload: &[SimRequest],
    fleet: &SimFleet,
    router: &mut dyn SimRouter,
) -> PipelineReport {
    run(workload, fleet, router, &mut |_, _| {})
}

#[test]
fn the_step_engine_serves_a_burst_in_shared_steps() {
    // Four samples A–D of one 48-token prompt (3 blocks), 2 output tokens, reach one replica
    // at 0. Step 1 (0..17): A's 48 tokens, whose blocks are registered as they are
    // scheduled, then B, which hits A's first two (a hit never covers the last token) and
    // computes 16: the 64-token budget is spent, C and D wait. Step 2 (17..27): A and B
    // decode and end; C and D hit the same two blocks and compute 16 each: 1 + 32 × 0.25 +
    // 2 × 0.5. Step 3 (27..29): C and D decode and end.
    let prompt = distinct_prompt(1, 48);
    let workload: Vec<SimRequest> = (0..4)
        .map(|i| SimRequest {
            group: 0,
            step: Some(0),
            ..request(i, 0.0, prompt.clone(), 2)
        })
        .collect();
    let report = run_engine(&workload, &engine_fleet(1, 0.0), &mut RoundRobin::new());
    assert_eq!(report.completed, 4);
    assert_eq!(report.prefill_tokens_computed, 48 + 16 + 16 + 16);
    assert_eq!(report.prefill_tokens_cached, 3 * 32);
    assert_eq!(
        report.ttft_ms,
        Summary {
            count: 4,
            mean: 22.0,
            p50: 17.0,
            p90: 27.0,
            p99: 27.0
        }
    );
    assert_eq!(report.makespan_ms, 29.0);
    assert_eq!(report.preemptions, 0);
    // Only A prefilled the whole prompt, on the one replica.
    assert_eq!(report.prefills_per_prompt_per_step, Some(1.0));
    assert_eq!(report.rl_step_total_ms, Some(29.0));
    assert_eq!(report.queue_wait_ms.p99, 17.0);
    assert_eq!(report.utilisation.busy, vec![1.0]);
}

/// Records the `running` count of replica 0 and its in-flight count as seen at each arrival;
/// places like round-robin (everything on replica 0 of a one-replica fleet).
#[derive(Default)]
struct Watcher {
    seen: Vec<(f64, u32, u32)>,
    inner: RoundRobin,
}

impl SimRouter for Watcher {
    fn name(&self) -> &str {
        "watcher"
    }
    fn submit(&mut self, now: f64, req: &SimRequest, fleet: &[ReplicaState]) {
        self.seen.push((now, fleet[0].running, fleet[0].in_flight));
        self.inner.submit(now, req, fleet);
    }
    fn next_wakeup(&self) -> Option<f64> {
        self.inner.next_wakeup()
    }
    fn poll(&mut self, now: f64, fleet: &[ReplicaState], out: &mut Vec<Decision>) {
        self.inner.poll(now, fleet, out);
    }
    fn on_complete(&mut self, _now: f64, _request: u64, _replica: usize) {}
}

#[test]
fn the_router_sees_metrics_as_of_the_last_scrape_and_exact_in_flight_counts() {
    // One long request at 0 (64 tokens, 200 output tokens: busy far beyond 300 ms), then
    // probes at 50, 150 and 250 ms. Scrapes every 100 ms, at 0, 100, 200.
    let workload = vec![
        request(0, 0.0, distinct_prompt(1, 64), 200),
        request(1, 50.0, distinct_prompt(2, 16), 1),
        request(2, 150.0, distinct_prompt(3, 16), 1),
        request(3, 250.0, distinct_prompt(4, 16), 1),
    ];
    let mut stale = Watcher::default();
    run_engine(&workload, &engine_fleet(1, 100.0), &mut stale);
    // At 50 the last scrape (0) saw an idle replica; in flight is counted at once.
    // The probe of 50 is done within 100 ms, so the scrapes at 100 and 200 see one running.
    assert_eq!(
        stale.seen,
        vec![(0.0, 0, 0), (50.0, 0, 1), (150.0, 1, 1), (250.0, 1, 1)]
    );
    let mut fresh = Watcher::default();
    run_engine(&workload, &engine_fleet(1, 0.0), &mut fresh);
    assert_eq!(
        fresh.seen,
        vec![(0.0, 0, 0), (50.0, 1, 1), (150.0, 1, 1), (250.0, 1, 1)]
    );
}

#[test]
fn a_request_larger_than_the_pool_is_rejected_and_released() {
    let workload = vec![
        request(0, 0.0, distinct_prompt(1, 2000), 1),
        request(1, 0.0, distinct_prompt(2, 16), 1),
    ];
    let report = run_engine(&workload, &engine_fleet(1, 0.0), &mut RoundRobin::new());
    assert_eq!(
        (
            report.completed,
            report.rejected_by_router,
            report.rejected_by_replica
        ),
        (1, 0, 1)
    );
}

/// One replica of `kv_blocks` blocks of 16 tokens.
fn small_engine_fleet(kv_blocks: usize) -> SimFleet {
    use crate::sim::fleet::ReplicaGroup;
    use crate::sim::profile::EngineParams;
    SimFleet {
        groups: vec![ReplicaGroup {
            replicas: 1,
            profile_name: "test".into(),
            profile: Profile::Engine(EngineParams::round_numbers(kv_blocks)),
        }],
        ..SimFleet::default_fleet(1)
    }
}

#[test]
fn a_prompt_the_replica_refuses_adds_nothing_to_the_ideal() {
    // Two 54-token prompts (3 full blocks and a 6-token tail each) on a 4-block replica: the
    // first with its output fits in 4 blocks, the second needs 5 and is refused.
    let workload = vec![
        request(0, 0.0, distinct_prompt(1, 54), 1),
        request(1, 0.0, distinct_prompt(2, 54), 20),
    ];
    let report = run_engine(&workload, &small_engine_fleet(4), &mut RoundRobin::new());
    assert_eq!(
        (
            report.completed,
            report.rejected_by_router,
            report.rejected_by_replica
        ),
        (1, 0, 1)
    );
    assert_eq!(report.prompt_tokens, 54);
    assert_eq!(report.prefill_tokens_computed, 54);
    assert_eq!(report.prefill_tokens_ideal, 3 * 16 + 6);
    assert!(report.prefill_tokens_ideal <= report.prefill_tokens_computed);
}

/// Three turns of one session: each prompt is the conversation so far (the previous prompt
/// and its answer) and a new 16-token message; all prompts and answers are whole blocks.
fn session() -> Vec<SimRequest> {
    let (messages, answers) = ([48usize, 16, 16], [32usize, 32, 0]);
    let total: usize = messages.iter().sum::<usize>() + answers.iter().sum::<usize>();
    let buffer: std::sync::Arc<[u32]> = distinct_prompt(7, total as u32).into();
    let mut len = 0;
    let mut turns = Vec::new();
    for (k, (message, answer)) in messages.iter().zip(answers).enumerate() {
        len += message;
        turns.push(SimRequest {
            tokens: crate::sim::Tokens::prefix(&buffer, len),
            group: 0,
            ..request(
                k as u64,
                1000.0 * k as f64,
                Vec::new(),
                answer.max(1) as u32,
            )
        });
        len += answer;
    }
    turns
}

#[test]
fn the_ideal_counts_no_block_a_replica_generated() {
    let workload = session();
    let report = run_engine(&workload, &small_engine_fleet(100), &mut RoundRobin::new());
    assert_eq!(report.completed, 3);
    // Distinct prompt blocks: the 48 + 32 + 16 + 32 + 16 tokens of the last prompt, 9 blocks;
    // the two answers' 4 blocks were decoded, so no placement has to prefill them.
    assert_eq!(report.prefill_tokens_ideal, (9 - 4) * 16);
    assert!(
        report.prefill_tokens_ideal <= report.prefill_tokens_computed,
        "{} > {}",
        report.prefill_tokens_ideal,
        report.prefill_tokens_computed
    );
}

#[test]
fn the_step_engine_keeps_its_books_on_every_workload_and_is_deterministic() {
    use crate::sim::workload::{MultiTurnParams, SharedPrefixParams};
    use crate::sim::Workload;
    let workloads = [
        Workload::RlRollout(RlRolloutParams {
            prompts: 6,
            samples: 8,
            steps: 2,
            step_interval_ms: 500.0,
            prompt_tokens_min: 100,
            prompt_tokens_max: 300,
            output_tokens_min: 10,
            output_tokens_max: 60,
            ..RlRolloutParams::default()
        }),
        Workload::SharedPrefix(SharedPrefixParams {
            groups: 4,
            prompts_per_group: 8,
            system_prompt_tokens: 200,
            question_tokens: 30,
            output_tokens: 20,
            requests_per_second: 200.0,
            ..SharedPrefixParams::default()
        }),
        Workload::MultiTurn(MultiTurnParams {
            sessions: 6,
            turns: 4,
            system_prompt_tokens: 100,
            user_tokens_min: 10,
            user_tokens_max: 50,
            output_tokens_min: 10,
            output_tokens_max: 40,
            think_time_ms: 200.0,
            sessions_per_second: 50.0,
            ..MultiTurnParams::default()
        }),
    ];
    // RL runs on 30 blocks of 16 tokens per replica: four running sequences of distinct
    // prompts do not fit, so sequences are preempted and recomputed; the others on 1000.
    // Debug builds check the engine's books at the end of each run.
    for workload in &workloads {
        let mut fleet = engine_fleet(2, 50.0);
        if let Profile::Engine(params) = &mut fleet.groups[0].profile {
            params.kv_blocks = if let Workload::RlRollout(_) = workload {
                30
            } else {
                1000
            };
        }
        let requests = workload.generate();
        let run_both = || {
            let a = run_engine(&requests, &fleet, &mut LeastInFlight::new());
            let b = run_engine(&requests, &fleet, &mut RoundRobin::new());
            (a, b)
        };
        let (a, b) = run_both();
        for report in [&a, &b] {
            assert_eq!(report.completed, report.requests, "{}", workload.name());
            assert_eq!(
                report.prefill_tokens_computed + report.prefill_tokens_cached,
                report.prompt_tokens
            );
        }
        if let Workload::RlRollout(_) = workload {
            assert!(a.preemptions > 0 && a.recomputed_tokens > 0, "{a:?}");
        }
        if let Workload::MultiTurn(_) = workload {
            // Later turns find their own history, answers included.
            assert!(a.cache_hit_rate > 0.3, "{}", a.cache_hit_rate);
        }
        assert_eq!(
            serde_json::to_string(&run_both().0).unwrap(),
            serde_json::to_string(&a).unwrap()
        );
    }
}
