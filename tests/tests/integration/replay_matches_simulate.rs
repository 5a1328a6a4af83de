//! One algorithm, two drivers: the default pipeline places every request of the burst shapes
//! on the same replica whether `simulate` drives it against the modelled fleet or `replay`
//! drives it from a JSONL file of the same requests over the same endpoints.

use std::collections::BTreeMap;
use std::sync::Arc;

use switchyard::pipeline::{build, load_registry, Scheduler};
use switchyard::sim::{self, Decision, ReplicaState, SimFleet, SimRequest, SimRouter, Workload};
use switchyard::simulate::{pipeline_router, sim_fleet, PipelineRouter};
use switchyard_tests::live::replay_placements;
use switchyard_tests::{config, options, workspace_root};

/// Passes everything to the pipeline and keeps a copy of its decisions.
struct Recording {
    inner: PipelineRouter,
    placed: BTreeMap<u64, usize>,
}

impl SimRouter for Recording {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn submit(&mut self, now_ms: f64, req: &SimRequest, fleet: &[ReplicaState]) {
        self.inner.submit(now_ms, req, fleet);
    }

    fn next_wakeup(&self) -> Option<f64> {
        self.inner.next_wakeup()
    }

    fn poll(&mut self, now_ms: f64, fleet: &[ReplicaState], out: &mut Vec<Decision>) {
        let from = out.len();
        self.inner.poll(now_ms, fleet, out);
        for decision in &out[from..] {
            if let Some(replica) = decision.replica {
                self.placed.insert(decision.request, replica);
            }
        }
    }

    fn on_complete(&mut self, now_ms: f64, request: u64, replica: usize) {
        self.inner.on_complete(now_ms, request, replica);
    }
}

fn default_config() -> switchyard::config::LoadedConfig {
    let text = std::fs::read_to_string(workspace_root().join("configs/default.toml")).unwrap();
    config("default", &text)
}

/// Request id → replica index, as `simulate` places the workload.
fn simulated(requests: &[SimRequest], fleet: &SimFleet) -> BTreeMap<u64, usize> {
    let router = pipeline_router("default", &default_config(), &options(), fleet, 0).unwrap();
    let mut recording = Recording {
        inner: router,
        placed: BTreeMap::new(),
    };
    let report = sim::run(requests, fleet.clone(), &mut recording, &mut |_, _| {});
    assert_eq!(report.completed as usize, requests.len());
    recording.placed
}

/// Request id → replica index, as `replay` places the same requests over the same endpoints.
fn replayed(requests: &[SimRequest], fleet: &SimFleet) -> BTreeMap<u64, usize> {
    let config = default_config();
    let registry = load_registry(&config, &options()).unwrap();
    let pipeline = build(&config, &registry, &options()).unwrap();
    let mut scheduler = Scheduler::new(Arc::new(pipeline), sim_fleet(fleet), 0);
    let lines: String = requests
        .iter()
        .map(|r| {
            let line = serde_json::json!({
                "arrival_ms": r.arrival_ms,
                "id": r.id.to_string(),
                "model": r.model,
                "cache_salt": r.cache_salt,
                "tokens": &*r.tokens,
                "max_output_tokens": r.output_tokens,
            });
            line.to_string() + "\n"
        })
        .collect();
    let input = switchyard::replay::read_input(lines.as_bytes()).unwrap();
    replay_placements(&mut scheduler, &input)
        .into_iter()
        .map(|(id, endpoint)| {
            let replica = endpoint.strip_prefix("/replica-").expect("placed");
            (id.parse().unwrap(), replica.parse().unwrap())
        })
        .collect()
}

#[test]
#[ignore = "slow tier: drives every burst shape through simulate and replay (about 40 s)"]
fn replay_places_the_burst_shapes_as_simulate_does() {
    for (prompts, samples) in [(32, 16), (2, 256), (4, 128), (3, 100), (5, 100), (256, 1)] {
        let workload = Workload::from_name(
            "rl-rollout",
            serde_json::json!({"prompts": prompts, "samples": samples, "steps": 1}),
        )
        .unwrap();
        let requests = workload.generate();
        for replicas in [8, 12, 16] {
            let fleet = SimFleet::default_fleet(replicas);
            let simulated = simulated(&requests, &fleet);
            assert_eq!(simulated.len(), requests.len());
            let replayed = replayed(&requests, &fleet);
            assert!(
                simulated == replayed,
                "{prompts}×{samples} on {replicas}: the drivers placed requests differently"
            );
            // Every replica takes part: the shapes are balanced, not piled up.
            let mut used = vec![0usize; replicas];
            for &replica in simulated.values() {
                used[replica] += 1;
            }
            assert!(
                used.iter().all(|&n| n > 0),
                "{prompts}×{samples} on {replicas}"
            );
        }
    }
}
