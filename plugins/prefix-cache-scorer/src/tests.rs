use switchyard_plugin_api::ffi::{RSlice, RStr, RString};
use switchyard_plugin_api::{
    AttrValue, AttrView, ConsumedKey, DataKey, EndpointMetrics, EndpointView, ErrorKind,
    InFlightLoad, PluginError, PluginInstance, PrefixCacheMatchInfo, RequestView,
};

use super::*;

fn instance(parameters: &str) -> PluginInstance {
    match (FACTORY.create)("prefix-scorer", parameters) {
        Ok(instance) => instance.into_ffi(),
        Err(e) => panic!("refused {parameters}: {e:?}"),
    }
}

fn refused(parameters: &str) -> PluginError {
    match (FACTORY.create)("prefix-scorer", parameters) {
        Ok(_) => panic!("accepted {parameters}"),
        Err(e) => e,
    }
}

const IDS: [&str; 4] = ["default/a", "default/b", "default/c", "default/d"];

fn endpoints(n: usize) -> Vec<EndpointView<'static>> {
    (0..n)
        .map(|i| EndpointView {
            slot: i as u32,
            host_index: 10 + i as u32,
            id: RStr::from_str(IDS[i]),
            address: RStr::from_str("10.0.0.1:8000"),
            role: RStr::from_str(""),
            metrics: EndpointMetrics::default(),
        })
        .collect()
}

fn request(explain: bool) -> RequestView<'static> {
    RequestView {
        id: RStr::from_str("r1"),
        model: RStr::from_str("m"),
        cache_salt: RStr::from_str(""),
        prompts: RSlice::from_slice(&[]),
        max_output_tokens: -1,
        now_ms: 0,
        random_seed: 1,
        explain,
    }
}

fn pmi(match_blocks: u64, total_blocks: u64, block_size_tokens: u64) -> AttrValue {
    AttrValue::PrefixCacheMatch(PrefixCacheMatchInfo {
        match_blocks,
        total_blocks,
        block_size_tokens,
    })
}

/// Scores `endpoints` whose match info sits in `row` of a two-row table.
fn score_row(
    scorer: &PluginInstance,
    explain: bool,
    values: &[AttrValue],
    rows: &[u32],
) -> (Vec<f64>, String) {
    let endpoints = endpoints(values.len() / 2);
    let attrs = AttrView {
        values: RSlice::from_slice(values),
        stride: endpoints.len() as u32,
        rows: RSlice::from_slice(rows),
    };
    let mut scores = vec![0.0; endpoints.len()];
    let mut note = RString::new();
    scorer
        .score(
            &request(explain),
            &endpoints,
            &attrs,
            &mut scores,
            &mut note,
        )
        .expect("scores");
    (scores, note.into_string())
}

/// Row 0 holds another key's values; row 1 the match info: a PMI(5, 10, 1), b nothing,
/// c PMI(2, 10, 1), d a value of another kind.
fn mixed_table() -> Vec<AttrValue> {
    let load = AttrValue::InFlightLoad(InFlightLoad {
        requests: 1,
        tokens: 100,
    });
    vec![
        pmi(10, 10, 1),
        pmi(10, 10, 1),
        pmi(10, 10, 1),
        pmi(10, 10, 1),
        pmi(5, 10, 1),
        AttrValue::Absent,
        pmi(2, 10, 1),
        load,
    ]
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
    let declared = instance("null").declarations();
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
    let declared = instance(r#"{"prefixMatchInfoProducerName": "burst-prefix-cache-producer"}"#)
        .declarations();
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
    let scorer = instance("{}");
    let (scores, note) = score_row(&scorer, false, &mixed_table(), &[1]);
    // S1: the matched fraction; absent and wrong-kind values score 0.
    assert_eq!(scores, [0.5, 0.0, 0.2, 0.0]);
    assert_eq!(note, "");
}

#[test]
fn explained_request_notes_the_endpoints_scored_zero() {
    let scorer = instance("{}");
    let (_, note) = score_row(&scorer, true, &mixed_table(), &[1]);
    assert_eq!(
        note,
        "scored 0: 2 of 4 endpoints without match info, 0 with an empty prompt"
    );
}

#[test]
fn explained_request_with_full_info_leaves_no_note() {
    let scorer = instance("{}");
    let mut table = mixed_table();
    table[5] = pmi(0, 10, 1);
    table[7] = pmi(10, 10, 1);
    let (scores, note) = score_row(&scorer, true, &table, &[1]);
    assert_eq!(scores, [0.5, 0.0, 0.2, 1.0]);
    assert_eq!(note, "");
}

#[test]
fn length_weight_applies_through_the_boundary() {
    let scorer = instance(r#"{"matchLengthWeight": 0.5, "matchLengthScaleTokens": 100}"#);
    let table = [
        AttrValue::Absent,
        AttrValue::Absent,
        pmi(5, 10, 1),
        pmi(50, 100, 1),
    ];
    let (scores, _) = score_row(&scorer, false, &table, &[1]);
    // S4: 0.5 × (5/100)² + 0.5 × 0.5 and 0.5 × (50/100)² + 0.5 × 0.5.
    assert!((scores[0] - 0.25125).abs() < 1e-12, "{scores:?}");
    assert!((scores[1] - 0.375).abs() < 1e-12, "{scores:?}");
}

#[test]
fn unproduced_key_scores_every_endpoint_zero() {
    let scorer = instance("null");
    let (scores, _) = score_row(&scorer, false, &mixed_table(), &[u32::MAX]);
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
