//! The affinity filter's reference cases (F1–F21) and the matchedTokens load-gate cases,
//! against the real loaded library: the instance is created through the library's factory,
//! its declared consumes decide which attribute rows it is handed.

use std::sync::OnceLock;

use switchyard::config::library_file_name;
use switchyard_plugin_api::ffi::{RSlice, RStr, RString};
use switchyard_plugin_api::loading::{load_library, LoadedLibrary};
use switchyard_plugin_api::{
    AttrValue, AttrView, EndpointMetrics, EndpointView, InFlightLoad, LatencyPrediction,
    PluginError, PluginInstance, PrefixCacheMatchInfo, PromptTokens, RequestView,
};
use switchyard_tests::plugin_dir;

const TYPE: &str = "prefix-cache-affinity-filter";

fn library() -> &'static LoadedLibrary {
    static LIB: OnceLock<LoadedLibrary> = OnceLock::new();
    LIB.get_or_init(|| {
        load_library(&plugin_dir().join(library_file_name("prefix_cache_affinity_filter")))
            .unwrap_or_else(|e| panic!("{e}"))
    })
}

fn create(json: &str) -> Result<PluginInstance, PluginError> {
    library().create(TYPE, TYPE, json)
}

fn filter(json: &str) -> PluginInstance {
    create(json).unwrap_or_else(|e| panic!("{json}: {}", e.message))
}

fn create_error(json: &str) -> (String, String) {
    match create(json) {
        Ok(_) => panic!("{json} is refused"),
        Err(e) => (e.field.to_string(), e.message.to_string()),
    }
}

/// One endpoint as in the reference's helper; a negative value leaves that attribute out.
#[derive(Clone, Copy)]
struct Ep {
    name: &'static str,
    matched: i64,
    ttft: f64,
    tokens: i64,
    block_size: u64,
}

fn ep(name: &'static str, matched: i64, ttft: f64, tokens: i64) -> Ep {
    Ep {
        name,
        matched,
        ttft,
        tokens,
        block_size: 16,
    }
}

fn consumed(instance: &PluginInstance) -> Vec<String> {
    instance
        .declarations()
        .consumes
        .iter()
        .map(|c| {
            assert!(c.required, "every consumed key is required");
            c.key.to_string()
        })
        .collect()
}

struct Outcome {
    kept: Vec<&'static str>,
    note: String,
}

/// Runs the filter once over the endpoints, with attribute rows laid out in the order of the
/// instance's declared consumes.
fn run(instance: &PluginInstance, endpoints: &[Ep], seed: u64) -> Outcome {
    let ids: Vec<String> = endpoints
        .iter()
        .map(|e| format!("default/{}", e.name))
        .collect();
    let views: Vec<EndpointView<'_>> = ids
        .iter()
        .enumerate()
        .map(|(slot, id)| EndpointView {
            slot: slot as u32,
            host_index: slot as u32,
            id: RStr::from(id.as_str()),
            address: RStr::from("127.0.0.1:8000"),
            role: RStr::from(""),
            metrics: EndpointMetrics::default(),
        })
        .collect();
    let declarations = instance.declarations();
    let mut values = Vec::new();
    for key in declarations.consumes.iter() {
        for e in endpoints {
            let value = match key.key.data_type.as_str() {
                "PrefixCacheMatchInfo" if e.matched >= 0 => {
                    AttrValue::PrefixCacheMatch(PrefixCacheMatchInfo {
                        match_blocks: e.matched as u64,
                        total_blocks: 100,
                        block_size_tokens: e.block_size,
                    })
                }
                "InFlightLoad" if e.tokens >= 0 => AttrValue::InFlightLoad(InFlightLoad {
                    requests: 0,
                    tokens: e.tokens,
                }),
                "LatencyPrediction" if e.ttft >= 0.0 => {
                    AttrValue::LatencyPrediction(LatencyPrediction {
                        ttft_ms: e.ttft,
                        tpot_ms: 0.0,
                    })
                }
                _ => AttrValue::Absent,
            };
            values.push(value);
        }
    }
    let rows: Vec<u32> = (0..declarations.consumes.len() as u32).collect();
    let attrs = AttrView {
        values: RSlice::from_slice(&values),
        stride: endpoints.len() as u32,
        rows: RSlice::from_slice(&rows),
    };
    let prompt = [1u32, 2, 3, 4];
    let prompts = [PromptTokens {
        tokens: RSlice::from_slice(&prompt),
    }];
    let request = RequestView {
        id: RStr::from("req"),
        model: RStr::from("m"),
        cache_salt: RStr::from(""),
        prompts: RSlice::from_slice(&prompts),
        max_output_tokens: -1,
        now_ms: 0,
        random_seed: seed,
        explain: true,
    };
    let mut keep = vec![true; endpoints.len()];
    let mut note = RString::new();
    instance
        .filter(&request, &views, &attrs, &mut keep, &mut note)
        .unwrap_or_else(|e| panic!("filter failed: {}", e.message));
    Outcome {
        kept: endpoints
            .iter()
            .zip(&keep)
            .filter(|(_, &k)| k)
            .map(|(e, _)| e.name)
            .collect(),
        note: note.to_string(),
    }
}

fn kept(json: &str, endpoints: &[Ep]) -> Vec<&'static str> {
    run(&filter(json), endpoints, 1).kept
}

const INFLIGHT: &str = "InFlightLoad/inflight-load-producer";
const LATENCY: &str = "LatencyPrediction/predicted-latency-producer";
const PREFIX: &str = "PrefixCacheMatchInfo/approx-prefix-cache-producer";

#[test]
fn f1_affinity_threshold_disabled() {
    let got = kept(
        r#"{"affinityThreshold":0,"maxTTFTPenaltyMs":0}"#,
        &[ep("a", 0, 10.0, 0), ep("b", 90, 20.0, 0)],
    );
    assert_eq!(got, ["a", "b"]);
}

#[test]
fn f2_single_endpoint() {
    let got = kept(
        r#"{"affinityThreshold":0.8,"maxTTFTPenaltyMs":0}"#,
        &[ep("a", 90, 10.0, 0)],
    );
    assert_eq!(got, ["a"]);
}

#[test]
fn f3_no_sticky_endpoints() {
    let got = kept(
        r#"{"affinityThreshold":0.8,"explorationProbability":0,"maxTTFTPenaltyMs":0}"#,
        &[
            ep("a", 10, 10.0, 0),
            ep("b", 20, 20.0, 0),
            ep("c", 50, 30.0, 0),
        ],
    );
    assert_eq!(got, ["a", "b", "c"]);
}

const PREDICTOR_5000: &str = r#"{"affinityThreshold":0.8,"explorationProbability":0,
    "maxTTFTPenaltyMs":5000,"ttftSource":"latencyPredictor"}"#;

#[test]
fn f4_narrow_to_sticky() {
    let got = kept(
        PREDICTOR_5000,
        &[
            ep("a", 90, 100.0, 0),
            ep("b", 85, 120.0, 0),
            ep("c", 10, 50.0, 0),
        ],
    );
    assert_eq!(got, ["a", "b"]);
}

#[test]
fn f5_ttft_penalty_breaks_stickiness() {
    let got = kept(
        r#"{"affinityThreshold":0.8,"maxTTFTPenaltyMs":100,"ttftSource":"latencyPredictor"}"#,
        &[ep("a", 90, 500.0, 0), ep("b", 10, 50.0, 0)],
    );
    assert_eq!(got, ["a", "b"]);
}

const THROUGHPUT_100: &str = r#"{"affinityThreshold":0.8,"explorationProbability":0,
    "maxTTFTPenaltyMs":100,"ttftSource":"prefillThroughput","peakPrefillThroughput":1000}"#;

#[test]
fn f6_throughput_ttft_breaks_stickiness() {
    let outcome = run(
        &filter(THROUGHPUT_100),
        &[ep("a", 90, 10.0, 500), ep("b", 10, 10.0, 50)],
        1,
    );
    assert_eq!(outcome.kept, ["a", "b"]);
    assert!(
        outcome
            .note
            .contains("TTFT gap 450 ms > limit 100 ms (sticky 500 ms, non-sticky 50 ms)"),
        "{}",
        outcome.note
    );
}

#[test]
fn f7_throughput_ttft_within_threshold() {
    let json = THROUGHPUT_100.replace("\"maxTTFTPenaltyMs\":100", "\"maxTTFTPenaltyMs\":1000");
    let got = kept(&json, &[ep("a", 90, 10.0, 500), ep("b", 10, 10.0, 50)]);
    assert_eq!(got, ["a"]);
}

#[test]
fn f8_ttft_penalty_disabled() {
    let got = kept(
        r#"{"affinityThreshold":0.8,"maxTTFTPenaltyMs":0,"ttftSource":"prefillThroughput",
            "peakPrefillThroughput":1000}"#,
        &[ep("a", 90, 10.0, 5000), ep("b", 10, 10.0, 50)],
    );
    assert_eq!(got, ["a"]);
}

#[test]
fn f9_exploration_probability_one_keeps_everything() {
    let instance =
        filter(r#"{"affinityThreshold":0.8,"explorationProbability":1.0,"maxTTFTPenaltyMs":0}"#);
    for seed in 0..20 {
        let got = run(
            &instance,
            &[ep("a", 90, 100.0, 0), ep("b", 10, 50.0, 0)],
            seed,
        )
        .kept;
        assert_eq!(got, ["a", "b"], "seed {seed}");
    }
}

#[test]
fn f10_conditional_consumes() {
    assert_eq!(consumed(&filter(r#"{"maxTTFTPenaltyMs":0}"#)), [PREFIX]);
    assert_eq!(
        consumed(&filter(
            r#"{"maxTTFTPenaltyMs":5000,"ttftSource":"latencyPredictor"}"#
        )),
        [PREFIX, LATENCY]
    );
    assert_eq!(
        consumed(&filter(
            r#"{"maxTTFTPenaltyMs":5000,"ttftSource":"prefillThroughput","peakPrefillThroughput":1000}"#
        )),
        [PREFIX, INFLIGHT]
    );
}

#[test]
fn f11_factory_accepts_null_parameters() {
    let instance = filter("null");
    assert!(instance.declarations().produces.is_empty());
    let types = library().types();
    assert!(types.iter().any(|t| t.type_name.as_str() == TYPE));
}

/// Observable consequences of the defaults: threshold 0.80, no exploration, penalty 18000 ms
/// with prefillThroughput at 15928 tokens/s.
#[test]
fn f12_partial_config_preserves_defaults() {
    // Default threshold 0.80: 80/100 is sticky, 79/100 is not.
    let defaults = filter("{}");
    assert_eq!(consumed(&defaults), [PREFIX, INFLIGHT]);
    let endpoints = [ep("a", 80, -1.0, 0), ep("b", 79, -1.0, 0)];
    assert_eq!(run(&defaults, &endpoints, 1).kept, ["a"]);
    // 18000 ms at 15928 tokens/s is 286704 tokens: a gap of exactly that holds, one more
    // token releases.
    let at_limit = [ep("a", 90, -1.0, 286_704), ep("b", 10, -1.0, 0)];
    assert_eq!(run(&defaults, &at_limit, 1).kept, ["a"]);
    let over = [ep("a", 90, -1.0, 286_705), ep("b", 10, -1.0, 0)];
    assert_eq!(run(&defaults, &over, 1).kept, ["a", "b"]);

    // (i) threshold 0.95, penalty still 18000.
    let strict = filter(r#"{"affinityThreshold":0.95}"#);
    assert_eq!(
        run(&strict, &[ep("a", 94, -1.0, 0), ep("b", 0, -1.0, 0)], 1).kept,
        ["a", "b"]
    );
    assert_eq!(
        run(&strict, &[ep("a", 95, -1.0, 0), ep("b", 0, -1.0, 0)], 1).kept,
        ["a"]
    );
    assert_eq!(
        run(
            &strict,
            &[ep("a", 95, -1.0, 286_705), ep("b", 0, -1.0, 0)],
            1
        )
        .kept,
        ["a", "b"]
    );
    // (ii) exploration 0.05 keeps the default threshold; over many seeds some draws explore.
    let exploring = filter(r#"{"explorationProbability":0.05}"#);
    let explored = (0..400)
        .filter(|&seed| run(&exploring, &endpoints, seed).kept.len() == 2)
        .count();
    assert!(explored > 0 && explored < 400, "explored {explored} of 400");
    // (iii) penalty 10000 ms at 15928 tokens/s = 159280 tokens.
    let penalty = filter(r#"{"maxTTFTPenaltyMs":10000}"#);
    assert_eq!(
        run(
            &penalty,
            &[ep("a", 90, -1.0, 159_280), ep("b", 0, -1.0, 0)],
            1
        )
        .kept,
        ["a"]
    );
    assert_eq!(
        run(
            &penalty,
            &[ep("a", 90, -1.0, 159_281), ep("b", 0, -1.0, 0)],
            1
        )
        .kept,
        ["a", "b"]
    );
}

#[test]
fn f13_invalid_affinity_threshold() {
    let (field, message) = create_error(r#"{"affinityThreshold":1.5}"#);
    assert_eq!(field, "affinityThreshold");
    assert!(
        message.contains("affinityThreshold must be <= 1.0 (got 1.5)"),
        "{message}"
    );
}

#[test]
fn f14_invalid_exploration_probability() {
    let (field, message) = create_error(r#"{"explorationProbability":-0.1}"#);
    assert_eq!(field, "explorationProbability");
    assert_eq!(
        message,
        "explorationProbability must be in [0, 1] (got -0.1)"
    );
}

#[test]
fn f15_invalid_peak_prefill_throughput() {
    let (field, message) = create_error(r#"{"peakPrefillThroughput":-1}"#);
    assert_eq!(field, "peakPrefillThroughput");
    assert_eq!(message, "peakPrefillThroughput must be >= 0 (got -1)");
}

#[test]
fn f16_throughput_mode_requires_peak() {
    let (field, message) =
        create_error(r#"{"ttftSource":"prefillThroughput","peakPrefillThroughput":0}"#);
    assert_eq!(field, "peakPrefillThroughput");
    assert!(
        message.contains("peakPrefillThroughput must be > 0 when ttftSource is prefillThroughput"),
        "{message}"
    );
}

#[test]
fn f17_throughput_mode_valid() {
    let instance = filter(r#"{"ttftSource":"prefillThroughput","peakPrefillThroughput":1000}"#);
    assert_eq!(consumed(&instance), [PREFIX, INFLIGHT]);
    // Peak 1000: 18000 ms is 18000 tokens.
    let hold = [ep("a", 90, -1.0, 18_000), ep("b", 0, -1.0, 0)];
    assert_eq!(run(&instance, &hold, 1).kept, ["a"]);
    let release = [ep("a", 90, -1.0, 18_001), ep("b", 0, -1.0, 0)];
    assert_eq!(run(&instance, &release, 1).kept, ["a", "b"]);
}

#[test]
fn f18_invalid_ttft_source() {
    let (field, message) = create_error(r#"{"ttftSource":"bogus"}"#);
    assert_eq!(field, "ttftSource");
    assert!(message.contains("ttftSource must be"), "{message}");
    assert!(message.contains("\"bogus\""), "{message}");
}

#[test]
fn f19_empty_ttft_source_rejected() {
    let (field, message) = create_error(r#"{"ttftSource":""}"#);
    assert_eq!(field, "ttftSource");
    assert!(message.contains("ttftSource must be"), "{message}");
}

#[test]
fn f20_zero_peak_allowed_when_unused() {
    assert!(create(
        r#"{"maxTTFTPenaltyMs":0,"ttftSource":"prefillThroughput","peakPrefillThroughput":0}"#
    )
    .is_ok());
    assert!(create(r#"{"ttftSource":"latencyPredictor","peakPrefillThroughput":0}"#).is_ok());
}

#[test]
fn f21_defaults_to_prefill_throughput() {
    // The default source reads in-flight load, not predictions.
    assert_eq!(consumed(&filter("null")), [PREFIX, INFLIGHT]);
    let (field, message) = create_error(r#"{"peakPrefillThroughput":0}"#);
    assert_eq!(field, "peakPrefillThroughput");
    assert!(
        message.contains("peakPrefillThroughput must be > 0"),
        "{message}"
    );
}

#[test]
fn predictor_without_any_prediction_holds() {
    let got = kept(
        PREDICTOR_5000,
        &[ep("a", 90, -1.0, 0), ep("b", 10, -1.0, 0)],
    );
    assert_eq!(got, ["a"]);
}

#[test]
fn predictor_missing_on_sticky_only_releases() {
    let got = kept(
        PREDICTOR_5000,
        &[ep("a", 90, -1.0, 0), ep("b", 10, 50.0, 0)],
    );
    assert_eq!(got, ["a", "b"]);
}

#[test]
fn negative_threshold_disables_the_filter() {
    let outcome = run(
        &filter(r#"{"affinityThreshold":-0.5}"#),
        &[ep("a", 90, -1.0, 0), ep("b", 0, -1.0, 0)],
        1,
    );
    assert_eq!(outcome.kept, ["a", "b"]);
    assert!(outcome.note.contains("filter disabled"), "{}", outcome.note);
}

#[test]
fn unknown_parameter_is_rejected() {
    let (_, message) = create_error(r#"{"affinityThreshhold":0.5}"#);
    assert!(message.contains("affinityThreshhold"), "{message}");
}

#[test]
fn named_producers_change_the_consumed_keys() {
    let instance =
        filter(r#"{"prefixMatchInfoProducerName":"burst","inFlightLoadProducerName":"load"}"#);
    assert_eq!(
        consumed(&instance),
        ["PrefixCacheMatchInfo/burst", "InFlightLoad/load"]
    );
}

// The nine matchedTokens cases. Sticky `a` holds 90 blocks of 16 tokens = 1440 tokens.

const MATCHED_TOKENS_ONLY: &str = r#"{"penaltyMode":"matchedTokens","maxTTFTPenaltyMs":0}"#;

#[test]
fn keeps_pin_when_gap_below_matched_tokens() {
    let instance = filter(MATCHED_TOKENS_ONLY);
    assert_eq!(consumed(&instance), [PREFIX, INFLIGHT]);
    let outcome = run(
        &instance,
        &[ep("a", 90, -1.0, 1000), ep("b", 10, -1.0, 0)],
        1,
    );
    assert_eq!(outcome.kept, ["a"]);
    assert!(
        outcome
            .note
            .contains("TTFT gate held: gap 1000 tokens <= matched 1440"),
        "{}",
        outcome.note
    );
}

#[test]
fn releases_pin_when_gap_exceeds_matched_tokens() {
    let outcome = run(
        &filter(MATCHED_TOKENS_ONLY),
        &[ep("a", 90, -1.0, 4000), ep("b", 10, -1.0, 0)],
        1,
    );
    assert_eq!(outcome.kept, ["a", "b"]);
    assert!(
        outcome
            .note
            .contains("TTFT gate released: gap 4000 tokens > matched 1440"),
        "{}",
        outcome.note
    );
}

#[test]
fn scales_with_cache_value() {
    let instance = filter(MATCHED_TOKENS_ONLY);
    let small = [ep("a", 90, -1.0, 4000), ep("b", 10, -1.0, 0)];
    assert_eq!(run(&instance, &small, 1).kept, ["a", "b"]);
    // Same gap, 90 blocks of 64 tokens = 5760 tokens cached: worth holding.
    let mut large = small;
    large[0].block_size = 64;
    assert_eq!(run(&instance, &large, 1).kept, ["a"]);
}

#[test]
fn ceiling_still_applies() {
    // 1000 tokens gap < 1440 matched, but at 1000 tokens/s that is 1000 ms > 100 ms.
    let instance = filter(
        r#"{"penaltyMode":"matchedTokens","maxTTFTPenaltyMs":100,"peakPrefillThroughput":1000}"#,
    );
    let got = run(
        &instance,
        &[ep("a", 90, -1.0, 1000), ep("b", 10, -1.0, 0)],
        1,
    )
    .kept;
    assert_eq!(got, ["a", "b"]);
    // Within the ceiling and below the matched tokens: held.
    let got = run(
        &instance,
        &[ep("a", 90, -1.0, 100), ep("b", 10, -1.0, 0)],
        1,
    )
    .kept;
    assert_eq!(got, ["a"]);
}

#[test]
fn no_match_info_is_no_op() {
    // Block size unknown on the sticky endpoint: the token test is skipped, the pin holds.
    let mut endpoints = [ep("a", 90, -1.0, 1_000_000), ep("b", 10, -1.0, 0)];
    endpoints[0].block_size = 0;
    assert_eq!(run(&filter(MATCHED_TOKENS_ONLY), &endpoints, 1).kept, ["a"]);
}

#[test]
fn static_mode_unchanged() {
    let instance =
        filter(r#"{"penaltyMode":"static","maxTTFTPenaltyMs":100,"peakPrefillThroughput":1000}"#);
    assert_eq!(
        run(
            &instance,
            &[ep("a", 90, -1.0, 500), ep("b", 10, -1.0, 50)],
            1
        )
        .kept,
        ["a", "b"]
    );
    assert_eq!(
        run(
            &instance,
            &[ep("a", 90, -1.0, 150), ep("b", 10, -1.0, 50)],
            1
        )
        .kept,
        ["a"]
    );
}

#[test]
fn default_penalty_mode_is_static() {
    // With maxTTFTPenaltyMs 0, static mode has no gate and reads no load; matchedTokens would
    // release this pin (gap 4000 tokens > 1440).
    let endpoints = [ep("a", 90, -1.0, 4000), ep("b", 10, -1.0, 0)];
    let default = filter(r#"{"maxTTFTPenaltyMs":0}"#);
    assert_eq!(consumed(&default), [PREFIX]);
    assert_eq!(run(&default, &endpoints, 1).kept, ["a"]);
    assert_eq!(
        run(&filter(MATCHED_TOKENS_ONLY), &endpoints, 1).kept,
        ["a", "b"]
    );
}

#[test]
fn matched_tokens_rejects_latency_predictor() {
    let (field, message) =
        create_error(r#"{"penaltyMode":"matchedTokens","ttftSource":"latencyPredictor"}"#);
    assert_eq!(field, "penaltyMode");
    assert!(
        message.contains("requires ttftSource \"prefillThroughput\""),
        "{message}"
    );
}

#[test]
fn rejects_unknown_penalty_mode() {
    let (field, message) = create_error(r#"{"penaltyMode":"dynamic"}"#);
    assert_eq!(field, "penaltyMode");
    assert_eq!(
        message,
        "penaltyMode must be \"static\" or \"matchedTokens\" (got \"dynamic\")"
    );
}
