use switchyard_plugin_api::testing::{Attributes, Harness, TestEndpoint, TestRequest};
use switchyard_plugin_api::{AttrValue, ConsumedKey, DataKey, ErrorKind, PluginError};

use super::*;

fn harness(parameters: &str) -> Harness {
    Harness::new(&FACTORY, parameters).unwrap_or_else(|e| panic!("refused {parameters}: {e:?}"))
}

fn refused(parameters: &str) -> PluginError {
    match Harness::new(&FACTORY, parameters) {
        Ok(_) => panic!("accepted {parameters}"),
        Err(e) => e,
    }
}

fn pmi(match_blocks: u64, total_blocks: u64, block_size_tokens: u64) -> AttrValue {
    Attributes::prefix_match(match_blocks, total_blocks, block_size_tokens)
}

fn default_key() -> DataKey {
    DataKey::new("PrefixCacheMatchInfo", "approx-prefix-cache-producer")
}

/// Scores one candidate per value of `attrs`' default-producer row (four when it has none).
fn score(scorer: &Harness, explain: bool, attrs: &Attributes) -> (Vec<f64>, String) {
    let width = attrs.get(&default_key()).map_or(4, <[AttrValue]>::len);
    let endpoints = TestEndpoint::several(width);
    let scored = scorer
        .score(&TestRequest::new("m").explain(explain), &endpoints, attrs)
        .expect("scores");
    (scored.scores, scored.note)
}

/// Match info from another producer, which the scorer must not read.
fn other_producer() -> Attributes {
    Attributes::new().set(
        DataKey::new("PrefixCacheMatchInfo", "burst-prefix-cache-producer"),
        vec![pmi(10, 10, 1); 4],
    )
}

/// The default producer's match info: a PMI(5, 10, 1), b nothing, c PMI(2, 10, 1), d a value
/// of another kind; besides another producer's full matches.
fn mixed_table() -> Attributes {
    other_producer().set(
        default_key(),
        vec![
            pmi(5, 10, 1),
            AttrValue::Absent,
            pmi(2, 10, 1),
            Attributes::in_flight(1, 100),
        ],
    )
}

#[test]
fn factory_describes_a_beta_scorer() {
    assert_eq!(FACTORY.type_name, "prefix-cache-scorer");
    assert_eq!(FACTORY.kind, PluginKind::Scorer);
    assert_eq!(FACTORY.stability, Stability::Beta);
    let names: Vec<_> = FACTORY.parameters.iter().map(|p| p.name).collect();
    assert_eq!(
        names,
        [
            "prefixMatchInfoProducerName",
            "matchLengthWeight",
            "matchLengthScaleTokens"
        ]
    );
}

#[test]
fn documented_defaults_decode_to_the_defaults() {
    for param in FACTORY.parameters {
        let value: serde_json::Value = serde_json::from_str(param.default).expect(param.name);
        let json = serde_json::json!({ param.name: value }).to_string();
        assert_eq!(
            parse_config(&json).expect(param.name),
            ScorerConfig::default(),
            "{}",
            param.name
        );
    }
}

#[test]
fn declares_the_default_producer_key() {
    let scorer = harness("null");
    let declared = scorer.declarations();
    assert!(declared.produces.is_empty());
    assert_eq!(
        declared.consumes.as_slice(),
        [ConsumedKey {
            key: DataKey::new("PrefixCacheMatchInfo", "approx-prefix-cache-producer"),
            required: true,
        }]
    );
    assert_eq!(declared.batch(), None);
}

#[test]
fn declares_the_named_producer_key_only() {
    let scorer = harness(r#"{"prefixMatchInfoProducerName": "burst-prefix-cache-producer"}"#);
    let declared = scorer.declarations();
    assert_eq!(
        declared.consumes.as_slice(),
        [ConsumedKey {
            key: DataKey::new("PrefixCacheMatchInfo", "burst-prefix-cache-producer"),
            required: true,
        }]
    );
}

#[test]
fn scores_through_the_boundary() {
    let scorer = harness("{}");
    let (scores, note) = score(&scorer, false, &mixed_table());
    // S1: the matched fraction; absent and wrong-kind values score 0.
    assert_eq!(scores, [0.5, 0.0, 0.2, 0.0]);
    assert_eq!(note, "");
}

#[test]
fn explained_request_notes_the_endpoints_scored_zero() {
    let scorer = harness("{}");
    let (_, note) = score(&scorer, true, &mixed_table());
    assert_eq!(
        note,
        "scored 0: 2 of 4 endpoints without match info, 0 with an empty prompt"
    );
}

#[test]
fn explained_request_with_full_info_leaves_no_note() {
    let scorer = harness("{}");
    let table = mixed_table()
        .set_on(default_key(), 1, pmi(0, 10, 1))
        .set_on(default_key(), 3, pmi(10, 10, 1));
    let (scores, note) = score(&scorer, true, &table);
    assert_eq!(scores, [0.5, 0.0, 0.2, 1.0]);
    assert_eq!(note, "");
}

#[test]
fn length_weight_applies_through_the_boundary() {
    let scorer = harness(r#"{"matchLengthWeight": 0.5, "matchLengthScaleTokens": 100}"#);
    let table = Attributes::new().set(default_key(), vec![pmi(5, 10, 1), pmi(50, 100, 1)]);
    let (scores, _) = score(&scorer, false, &table);
    // S4: 0.5 × (5/100)² + 0.5 × 0.5 and 0.5 × (50/100)² + 0.5 × 0.5.
    assert!((scores[0] - 0.25125).abs() < 1e-12, "{scores:?}");
    assert!((scores[1] - 0.375).abs() < 1e-12, "{scores:?}");
}

#[test]
fn unproduced_key_scores_every_endpoint_zero() {
    let scorer = harness("null");
    let (scores, _) = score(&scorer, false, &other_producer());
    assert_eq!(scores, [0.0; 4]);
}

#[test]
fn unknown_parameter_is_refused_by_name() {
    let e = refused(r#"{"matchLengthWieght": 0.5}"#);
    assert_eq!(e.kind, ErrorKind::InvalidParameter);
    assert_eq!(e.field.as_str(), "matchLengthWieght");
    assert!(
        e.message.contains("unknown field `matchLengthWieght`"),
        "{}",
        e.message
    );
}

#[test]
fn type_error_names_the_parameter() {
    let e = refused(r#"{"matchLengthScaleTokens": "long"}"#);
    assert_eq!(e.kind, ErrorKind::InvalidParameter);
    assert_eq!(e.field.as_str(), "matchLengthScaleTokens");
}

#[test]
fn validation_error_names_the_parameter() {
    let e = refused(r#"{"matchLengthWeight": 1.1, "matchLengthScaleTokens": 100}"#);
    assert_eq!(e.kind, ErrorKind::InvalidParameter);
    assert_eq!(e.field.as_str(), "matchLengthWeight");
    assert_eq!(
        e.message.as_str(),
        "matchLengthWeight must be in [0, 1] (got 1.1)"
    );
    let e = refused(r#"{"matchLengthWeight": 0.5, "matchLengthScaleTokens": 0}"#);
    assert_eq!(e.field.as_str(), "matchLengthScaleTokens");
}
