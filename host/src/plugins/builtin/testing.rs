//! Builders of the boundary views that the built-in plugins' tests hand to instances.

use switchyard_plugin_api::__abi_stable::std_types::{RSlice, RStr, RString};
use switchyard_plugin_api::sdk::PluginFactory;
use switchyard_plugin_api::{
    AttrView, EndpointMetrics, EndpointView, PluginError, PluginInstance, PromptTokens, RequestView,
};

/// Endpoint names by slot.
pub const NAMES: [&str; 8] = [
    "/pod1", "/pod2", "/pod3", "/pod4", "/pod5", "/pod6", "/pod7", "/pod8",
];

/// The candidate in `slot`, named after it, known to the host as `host_index`.
pub fn endpoint(slot: u32, host_index: u32, metrics: EndpointMetrics) -> EndpointView<'static> {
    EndpointView {
        slot,
        host_index,
        id: RStr::from(NAMES[slot as usize]),
        address: RStr::from("10.0.0.1:8000"),
        role: RStr::from(""),
        metrics,
    }
}

/// `n` candidates with all-zero metrics, host index = slot.
pub fn endpoints(n: usize) -> Vec<EndpointView<'static>> {
    (0..n as u32)
        .map(|slot| endpoint(slot, slot, EndpointMetrics::default()))
        .collect()
}

/// One candidate per entry, with that many waiting requests.
pub fn with_waiting(waiting: &[u32]) -> Vec<EndpointView<'static>> {
    (0u32..)
        .zip(waiting)
        .map(|(slot, &waiting_requests)| {
            let metrics = EndpointMetrics {
                waiting_requests,
                ..EndpointMetrics::default()
            };
            endpoint(slot, slot, metrics)
        })
        .collect()
}

/// One candidate per entry, with that KV-cache utilisation.
pub fn with_kv_usage(usage: &[f64]) -> Vec<EndpointView<'static>> {
    (0u32..)
        .zip(usage)
        .map(|(slot, &kv_cache_usage)| {
            let metrics = EndpointMetrics {
                kv_cache_usage,
                ..EndpointMetrics::default()
            };
            endpoint(slot, slot, metrics)
        })
        .collect()
}

/// A request with the given prompts.
pub fn request<'a>(
    id: &'a str,
    prompts: &'a [PromptTokens<'a>],
    max_output_tokens: i64,
    random_seed: u64,
) -> RequestView<'a> {
    RequestView {
        id: RStr::from(id),
        model: RStr::from("m"),
        cache_salt: RStr::from(""),
        prompts: RSlice::from_slice(prompts),
        max_output_tokens,
        now_ms: 0,
        random_seed,
        explain: false,
    }
}

/// A request without prompts, carrying `random_seed`.
pub fn seeded(random_seed: u64) -> RequestView<'static> {
    request("r", &[], -1, random_seed)
}

/// Creates an instance through the factory and hands it over as the host would.
pub fn create(factory: &PluginFactory, parameters: &str) -> PluginInstance {
    match (factory.create)("test", parameters) {
        Ok(instance) => instance.into_ffi(),
        Err(error) => panic!("{} refused {parameters}: {error}", factory.type_name),
    }
}

/// The error the factory returns for `parameters`.
pub fn create_error(factory: &PluginFactory, parameters: &str) -> PluginError {
    match (factory.create)("test", parameters) {
        Ok(_) => panic!("{} accepted {parameters}", factory.type_name),
        Err(error) => error,
    }
}

/// The scores a scorer instance gives `endpoints`.
pub fn score(instance: &PluginInstance, endpoints: &[EndpointView<'_>]) -> Vec<f64> {
    let mut scores = vec![0.0; endpoints.len()];
    let mut note = RString::new();
    instance
        .score(
            &seeded(0),
            endpoints,
            &AttrView::EMPTY,
            &mut scores,
            &mut note,
        )
        .unwrap();
    scores
}

/// The names a picker instance picks, in order, from candidates pod1.. scored `scores`.
pub fn pick(instance: &PluginInstance, random_seed: u64, scores: &[f64]) -> Vec<&'static str> {
    let candidates = endpoints(scores.len());
    let mut picked = vec![u32::MAX; scores.len()];
    let count = instance
        .pick(&seeded(random_seed), &candidates, scores, &mut picked)
        .unwrap();
    picked[..count]
        .iter()
        .map(|&position| NAMES[position as usize])
        .collect()
}

/// How often each of `scores.len()` candidates is picked over 10,000 picks seeded 0..10,000.
pub fn pick_frequencies(instance: &PluginInstance, scores: &[f64]) -> Vec<f64> {
    const DRAWS: u64 = 10_000;
    let mut counts = vec![0u32; scores.len()];
    for seed in 0..DRAWS {
        for name in pick(instance, seed, scores) {
            let position = NAMES.iter().position(|n| *n == name).unwrap();
            counts[position] += 1;
        }
    }
    counts
        .into_iter()
        .map(|count| f64::from(count) / DRAWS as f64)
        .collect()
}

/// Asserts each frequency is within 0.05 of its expectation.
pub fn assert_frequencies(actual: &[f64], expected: &[f64]) {
    assert_eq!(actual.len(), expected.len());
    for (position, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= 0.05,
            "{}: frequency {a} is not within 0.05 of {e} (all: {actual:?})",
            NAMES[position]
        );
    }
}

/// Asserts `factory` is among the registered built-ins.
pub fn assert_registered(factory: &'static PluginFactory) {
    assert!(
        super::all().iter().any(|f| std::ptr::eq(*f, factory)),
        "{} is not registered",
        factory.type_name
    );
}
