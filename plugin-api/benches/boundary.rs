//! Cost of crossing the plugin boundary once: a trivial scorer over 16 endpoints, called
//! through `PluginInstance::score` (vtable, `catch_unwind`, result conversion) and through the
//! trait method directly.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use switchyard_plugin_api::ffi::{RSlice, RStr, RString};
use switchyard_plugin_api::sdk::{Instance, ScoreOutput, Scorer};
use switchyard_plugin_api::{
    AttrView, EndpointMetrics, EndpointView, PluginError, PromptTokens, RequestView,
};

const ENDPOINTS: usize = 16;

/// Scores each endpoint by how few requests it runs.
struct FewestRunning;

impl Scorer for FewestRunning {
    fn score(
        &self,
        _request: &RequestView<'_>,
        endpoints: &[EndpointView<'_>],
        _attrs: &AttrView<'_>,
        out: ScoreOutput<'_>,
    ) -> Result<(), PluginError> {
        for (score, endpoint) in out.scores.iter_mut().zip(endpoints) {
            *score = 1.0 / (1.0 + f64::from(endpoint.metrics.running_requests));
        }
        Ok(())
    }
}

fn boundary(c: &mut Criterion) {
    let ids: Vec<String> = (0..ENDPOINTS).map(|i| format!("bench/pod{i}")).collect();
    let endpoints: Vec<EndpointView<'_>> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| EndpointView {
            slot: i as u32,
            host_index: i as u32,
            id: RStr::from(id.as_str()),
            address: RStr::from("127.0.0.1:8000"),
            role: RStr::from(""),
            metrics: EndpointMetrics {
                running_requests: i as u32,
                ..EndpointMetrics::default()
            },
        })
        .collect();
    let tokens: Vec<u32> = (0..256).collect();
    let prompts = [PromptTokens {
        tokens: RSlice::from_slice(&tokens),
    }];
    let request = RequestView {
        id: RStr::from("r1"),
        model: RStr::from("m"),
        cache_salt: RStr::from(""),
        prompts: RSlice::from_slice(&prompts),
        max_output_tokens: -1,
        now_ms: 0,
        random_seed: 0,
        explain: false,
    };
    let attrs = AttrView::EMPTY;
    let mut scores = vec![0.0f64; ENDPOINTS];
    let mut note = RString::new();

    let mut group = c.benchmark_group("boundary/score_16_endpoints");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));

    let direct = FewestRunning;
    group.bench_function("direct_trait_call", |b| {
        b.iter(|| {
            let result = Scorer::score(
                black_box(&direct),
                black_box(&request),
                black_box(&endpoints),
                &attrs,
                ScoreOutput {
                    scores: &mut scores,
                    note: &mut note,
                },
            );
            black_box(&scores);
            result
        })
    });

    let instance = Instance::scorer(FewestRunning).into_ffi();
    group.bench_function("plugin_instance_vtable", |b| {
        b.iter(|| {
            let result = black_box(&instance).score(
                black_box(&request),
                black_box(&endpoints),
                &attrs,
                &mut scores,
                &mut note,
            );
            black_box(&scores);
            result
        })
    });
    group.finish();
}

criterion_group!(benches, boundary);
criterion_main!(benches);
