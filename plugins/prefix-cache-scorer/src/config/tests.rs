use serde_json::json;
use switchyard_plugin_api::sdk::parse_parameters;

use super::*;

/// Decodes (which must succeed) and validates.
fn parse(v: serde_json::Value) -> Result<ScorerConfig, ParamError> {
    let cfg = ScorerConfig::deserialize(v).expect("decodes");
    cfg.validate().map(|()| cfg)
}

#[test]
fn s5a_empty_object_keeps_defaults() {
    let cfg = parse(json!({})).unwrap();
    assert_eq!(cfg.match_length_weight, 0.0);
    assert_eq!(cfg.match_length_scale_tokens, 8192);
    assert_eq!(cfg.prefix_match_info_producer_name, "");
}

#[test]
fn null_or_absent_parameters_keep_defaults() {
    assert_eq!(
        parse_parameters::<ScorerConfig>("").unwrap(),
        ScorerConfig::default()
    );
    assert_eq!(
        parse_parameters::<ScorerConfig>("null").unwrap(),
        ScorerConfig::default()
    );
}

#[test]
fn s5b_weight_and_scale() {
    let cfg = parse(json!({"matchLengthWeight": 0.5, "matchLengthScaleTokens": 100})).unwrap();
    assert_eq!(cfg.match_length_weight, 0.5);
    assert_eq!(cfg.match_length_scale_tokens, 100);
}

#[test]
fn s5c_negative_weight_rejected() {
    let err = parse(json!({"matchLengthWeight": -0.1, "matchLengthScaleTokens": 100})).unwrap_err();
    assert_eq!(err.field, "matchLengthWeight");
    assert_eq!(
        err.message,
        "matchLengthWeight must be in [0, 1] (got -0.1)"
    );
}

#[test]
fn s5d_weight_above_one_rejected() {
    let err = parse(json!({"matchLengthWeight": 1.1, "matchLengthScaleTokens": 100})).unwrap_err();
    assert_eq!(err.field, "matchLengthWeight");
    assert_eq!(err.message, "matchLengthWeight must be in [0, 1] (got 1.1)");
}

#[test]
fn s5e_zero_scale_with_weight_rejected() {
    let err = parse(json!({"matchLengthWeight": 0.5, "matchLengthScaleTokens": 0})).unwrap_err();
    assert_eq!(err.field, "matchLengthScaleTokens");
    assert_eq!(
        err.message,
        "matchLengthScaleTokens must be > 0 when matchLengthWeight is > 0 (got 0)"
    );
}

#[test]
fn s5f_weight_only_keeps_default_scale() {
    let cfg = parse(json!({"matchLengthWeight": 0.5})).unwrap();
    assert_eq!(cfg.match_length_weight, 0.5);
    assert_eq!(cfg.match_length_scale_tokens, 8192);
}

#[test]
fn s5g_zero_weight() {
    let cfg = parse(json!({"matchLengthWeight": 0.0})).unwrap();
    assert_eq!(cfg.match_length_weight, 0.0);
    assert_eq!(cfg.match_length_scale_tokens, 8192);
}

#[test]
fn scale_is_not_checked_when_weight_is_zero() {
    let cfg = parse(json!({"matchLengthWeight": 0.0, "matchLengthScaleTokens": -5})).unwrap();
    assert_eq!(cfg.match_length_scale_tokens, -5);
}

#[test]
fn unknown_field_rejected_by_decoding() {
    let err = ScorerConfig::deserialize(json!({"matchLengthWieght": 0.5})).unwrap_err();
    assert!(
        err.to_string()
            .contains("unknown field `matchLengthWieght`"),
        "{err}"
    );
}

#[test]
fn empty_producer_name_binds_the_default_producer() {
    assert_eq!(
        ScorerConfig::default().prefix_match_info_producer(),
        "approx-prefix-cache-producer"
    );
}

#[test]
fn named_producer_is_bound_as_given() {
    let cfg = parse(json!({"prefixMatchInfoProducerName": "burst"})).unwrap();
    assert_eq!(cfg.prefix_match_info_producer(), "burst");
}
