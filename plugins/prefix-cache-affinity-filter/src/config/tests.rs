use serde_json::json;
use switchyard_plugin_api::sdk::parse_parameters;

use super::*;

/// Decodes (which must succeed) and validates.
fn parse(v: serde_json::Value) -> Result<AffinityConfig, ParamError> {
    let cfg = AffinityConfig::deserialize(v).expect("decodes");
    cfg.validate().map(|()| cfg)
}

fn null_parameters() -> AffinityConfig {
    let cfg = parse_parameters::<AffinityConfig>("null").expect("decodes");
    cfg.validate().expect("valid");
    cfg
}

fn rejected(v: serde_json::Value) -> ParamError {
    match parse(v) {
        Ok(cfg) => panic!("accepted {cfg:?}"),
        Err(e) => e,
    }
}

#[test]
fn f11_null_parameters_give_defaults() {
    let cfg = null_parameters();
    assert_eq!(cfg, AffinityConfig::default());
    assert_eq!(cfg.affinity_threshold, 0.80);
    assert_eq!(cfg.exploration_probability, 0.0);
    assert_eq!(cfg.max_ttft_penalty_ms, 18000.0);
    assert_eq!(cfg.ttft_source, TtftSource::PrefillThroughput);
    assert_eq!(cfg.peak_prefill_throughput, 15928.0);
    assert_eq!(cfg.prefix_match_info_producer_name, "");
    assert_eq!(cfg.latency_prediction_info_producer_name, "");
    assert_eq!(cfg.in_flight_load_producer_name, "");
    assert_eq!(cfg.penalty_mode, PenaltyMode::Static);
}

#[test]
fn f12_partial_config_preserves_defaults() {
    let cfg = parse(json!({"affinityThreshold": 0.95})).unwrap();
    assert_eq!(
        (
            cfg.affinity_threshold,
            cfg.exploration_probability,
            cfg.max_ttft_penalty_ms
        ),
        (0.95, 0.0, 18000.0)
    );

    let cfg = parse(json!({"explorationProbability": 0.05})).unwrap();
    assert_eq!(
        (
            cfg.affinity_threshold,
            cfg.exploration_probability,
            cfg.max_ttft_penalty_ms
        ),
        (0.80, 0.05, 18000.0)
    );

    let cfg = parse(json!({"maxTTFTPenaltyMs": 10000})).unwrap();
    assert_eq!(
        (
            cfg.affinity_threshold,
            cfg.exploration_probability,
            cfg.max_ttft_penalty_ms
        ),
        (0.80, 0.0, 10000.0)
    );
    assert_eq!(cfg.ttft_source, TtftSource::PrefillThroughput);
    assert_eq!(cfg.peak_prefill_throughput, 15928.0);
}

#[test]
fn f13_threshold_above_one_rejected() {
    let e = rejected(json!({"affinityThreshold": 1.5}));
    assert_eq!(e.field, "affinityThreshold");
    assert_eq!(
        e.message,
        "affinityThreshold must be <= 1.0 (got 1.5); a value <= 0 disables the filter"
    );
}

#[test]
fn f14_negative_exploration_rejected() {
    let e = rejected(json!({"explorationProbability": -0.1}));
    assert_eq!(e.field, "explorationProbability");
    assert_eq!(
        e.message,
        "explorationProbability must be in [0, 1] (got -0.1)"
    );
}

#[test]
fn exploration_above_one_rejected() {
    let e = rejected(json!({"explorationProbability": 1.01}));
    assert_eq!(
        e.message,
        "explorationProbability must be in [0, 1] (got 1.01)"
    );
}

#[test]
fn negative_penalty_rejected() {
    let e = rejected(json!({"maxTTFTPenaltyMs": -1}));
    assert_eq!(e.field, "maxTTFTPenaltyMs");
    assert_eq!(
        e.message,
        "maxTTFTPenaltyMs must be >= 0 (got -1); 0 disables the TTFT limit"
    );
}

#[test]
fn f15_negative_peak_rejected() {
    let e = rejected(json!({"peakPrefillThroughput": -1}));
    assert_eq!(e.field, "peakPrefillThroughput");
    assert_eq!(e.message, "peakPrefillThroughput must be >= 0 (got -1)");
}

#[test]
fn f16_throughput_mode_requires_peak() {
    let e = rejected(json!({"ttftSource": "prefillThroughput", "peakPrefillThroughput": 0}));
    assert_eq!(e.field, "peakPrefillThroughput");
    assert_eq!(
        e.message,
        "peakPrefillThroughput must be > 0 when ttftSource is prefillThroughput and \
         maxTTFTPenaltyMs > 0 (got 0)"
    );
}

#[test]
fn f17_throughput_mode_valid() {
    let cfg =
        parse(json!({"ttftSource": "prefillThroughput", "peakPrefillThroughput": 1000})).unwrap();
    assert_eq!(cfg.ttft_source, TtftSource::PrefillThroughput);
    assert_eq!(cfg.peak_prefill_throughput, 1000.0);
}

#[test]
fn f18_unknown_ttft_source_rejected() {
    let e = rejected(json!({"ttftSource": "bogus"}));
    assert_eq!(e.field, "ttftSource");
    assert_eq!(
        e.message,
        "ttftSource must be \"prefillThroughput\" or \"latencyPredictor\" (got \"bogus\")"
    );
}

#[test]
fn f19_explicit_empty_ttft_source_rejected() {
    let e = rejected(json!({"ttftSource": ""}));
    assert_eq!(e.field, "ttftSource");
    assert_eq!(
        e.message,
        "ttftSource must be \"prefillThroughput\" or \"latencyPredictor\" (got \"\")"
    );
}

#[test]
fn f20_zero_peak_allowed_when_unused() {
    let cfg = parse(json!({
        "maxTTFTPenaltyMs": 0, "ttftSource": "prefillThroughput", "peakPrefillThroughput": 0
    }))
    .unwrap();
    assert_eq!(cfg.peak_prefill_throughput, 0.0);
    let cfg = parse(json!({"ttftSource": "latencyPredictor", "peakPrefillThroughput": 0})).unwrap();
    assert_eq!(cfg.ttft_source, TtftSource::LatencyPredictor);
}

#[test]
fn f21_defaults_to_prefill_throughput() {
    assert_eq!(
        AffinityConfig::default().ttft_source,
        TtftSource::PrefillThroughput
    );
    assert_eq!(null_parameters().ttft_source, TtftSource::PrefillThroughput);
    let e = rejected(json!({"peakPrefillThroughput": 0}));
    assert!(
        e.message.starts_with("peakPrefillThroughput must be > 0"),
        "{}",
        e.message
    );
}

#[test]
fn negative_threshold_accepted() {
    let cfg = parse(json!({"affinityThreshold": -0.5})).unwrap();
    assert!(!cfg.enabled());
    let cfg = parse(json!({"affinityThreshold": 0})).unwrap();
    assert!(!cfg.enabled());
}

#[test]
fn unknown_field_rejected_by_decoding() {
    let e = AffinityConfig::deserialize(json!({"affinityThreshhold": 0.9})).unwrap_err();
    assert!(
        e.to_string().contains("unknown field `affinityThreshhold`"),
        "{e}"
    );
}

#[test]
fn reference_order_first_failure_wins() {
    let e = rejected(json!({
        "affinityThreshold": 2, "explorationProbability": 2, "ttftSource": "bogus"
    }));
    assert_eq!(e.field, "affinityThreshold");
    let e = rejected(json!({"ttftSource": "bogus", "penaltyMode": "bogus"}));
    assert_eq!(e.field, "ttftSource");
}

#[test]
fn default_penalty_mode_is_static() {
    assert_eq!(AffinityConfig::default().penalty_mode, PenaltyMode::Static);
    assert_eq!(parse(json!({})).unwrap().penalty_mode, PenaltyMode::Static);
    assert_eq!(
        parse(json!({"penaltyMode": "static"}))
            .unwrap()
            .penalty_mode,
        PenaltyMode::Static
    );
    assert_eq!(
        parse(json!({"penaltyMode": "matchedTokens"}))
            .unwrap()
            .penalty_mode,
        PenaltyMode::MatchedTokens
    );
}

#[test]
fn matched_tokens_rejects_latency_predictor() {
    let e = rejected(json!({"penaltyMode": "matchedTokens", "ttftSource": "latencyPredictor"}));
    assert_eq!(e.field, "penaltyMode");
    assert_eq!(
        e.message,
        "penaltyMode \"matchedTokens\" requires ttftSource \"prefillThroughput\" (got \
         \"latencyPredictor\"): a predicted TTFT is in milliseconds and has no token \
         interpretation, so it cannot be compared with matched prefix tokens"
    );
    // Also with the ceiling disabled: the predictor is never a token source.
    let e = rejected(json!({
        "penaltyMode": "matchedTokens", "ttftSource": "latencyPredictor", "maxTTFTPenaltyMs": 0
    }));
    assert_eq!(e.field, "penaltyMode");
}

#[test]
fn rejects_unknown_penalty_mode() {
    let e = rejected(json!({"penaltyMode": "dynamic"}));
    assert_eq!(e.field, "penaltyMode");
    assert_eq!(
        e.message,
        "penaltyMode must be \"static\" or \"matchedTokens\" (got \"dynamic\")"
    );
    let e = rejected(json!({"penaltyMode": ""}));
    assert_eq!(
        e.message,
        "penaltyMode must be \"static\" or \"matchedTokens\" (got \"\")"
    );
}

#[test]
fn matched_tokens_with_zero_ceiling_needs_no_peak() {
    let cfg = parse(json!({
        "penaltyMode": "matchedTokens", "maxTTFTPenaltyMs": 0, "peakPrefillThroughput": 0
    }))
    .unwrap();
    assert_eq!(cfg.penalty_mode, PenaltyMode::MatchedTokens);
}

#[test]
fn f10_gate_input_only_when_gate_active() {
    let off = parse(json!({"maxTTFTPenaltyMs": 0})).unwrap();
    assert_eq!(off.gate_input(), None);

    let predictor =
        parse(json!({"maxTTFTPenaltyMs": 5000, "ttftSource": "latencyPredictor"})).unwrap();
    assert_eq!(predictor.gate_input(), Some(GateInput::LatencyPrediction));

    let throughput = parse(json!({
        "maxTTFTPenaltyMs": 5000, "ttftSource": "prefillThroughput", "peakPrefillThroughput": 1000
    }))
    .unwrap();
    assert_eq!(throughput.gate_input(), Some(GateInput::InFlightLoad));
}

#[test]
fn matched_tokens_reads_in_flight_load_even_without_ceiling() {
    let cfg = parse(json!({"penaltyMode": "matchedTokens", "maxTTFTPenaltyMs": 0})).unwrap();
    assert_eq!(cfg.gate_input(), Some(GateInput::InFlightLoad));
}

#[test]
fn empty_producer_names_bind_the_default_producers() {
    let cfg = AffinityConfig::default();
    assert_eq!(
        cfg.prefix_match_info_producer(),
        "approx-prefix-cache-producer"
    );
    assert_eq!(cfg.in_flight_load_producer(), "inflight-load-producer");
    assert_eq!(
        cfg.latency_prediction_producer(),
        "predicted-latency-producer"
    );
}

#[test]
fn named_producers_are_bound_as_given() {
    let cfg = parse(json!({
        "prefixMatchInfoProducerName": "burst-prefix-cache-producer",
        "inFlightLoadProducerName": "load",
        "latencyPredictionInfoProducerName": "predictor"
    }))
    .unwrap();
    assert_eq!(
        cfg.prefix_match_info_producer(),
        "burst-prefix-cache-producer"
    );
    assert_eq!(cfg.in_flight_load_producer(), "load");
    assert_eq!(cfg.latency_prediction_producer(), "predictor");
}
