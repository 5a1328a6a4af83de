//! The prefix-cache scorer's reference cases (S1–S5) and the extra cases, against the real
//! loaded library.

use std::sync::OnceLock;

use switchyard::config::library_file_name;
use switchyard_plugin_api::ffi::{RSlice, RStr, RString};
use switchyard_plugin_api::loading::{load_library, LoadedLibrary};
use switchyard_plugin_api::{
    AttrValue, AttrView, EndpointMetrics, EndpointView, PluginError, PluginInstance,
    PrefixCacheMatchInfo, RequestView,
};
use switchyard_tests::plugin_dir;

const TYPE: &str = "prefix-cache-scorer";

fn library() -> &'static LoadedLibrary {
    static LIB: OnceLock<LoadedLibrary> = OnceLock::new();
    LIB.get_or_init(|| {
        load_library(&plugin_dir().join(library_file_name("prefix_cache_scorer")))
            .unwrap_or_else(|e| panic!("{e}"))
    })
}

fn create(json: &str) -> Result<PluginInstance, PluginError> {
    library().create(TYPE, "test", json)
}

fn scorer(json: &str) -> PluginInstance {
    create(json).unwrap_or_else(|e| panic!("{json}: {}", e.message))
}

fn pmi(m: u64, t: u64, b: u64) -> Option<PrefixCacheMatchInfo> {
    Some(PrefixCacheMatchInfo {
        match_blocks: m,
        total_blocks: t,
        block_size_tokens: b,
    })
}

fn consumed(instance: &PluginInstance) -> Vec<String> {
    instance
        .declarations()
        .consumes
        .iter()
        .map(|c| c.key.to_string())
        .collect()
}

/// Scores endpoints pod1..podN whose match info (under the scorer's one consumed key) is
/// given, `None` meaning absent.
fn score(instance: &PluginInstance, infos: &[Option<PrefixCacheMatchInfo>]) -> Vec<f64> {
    assert_eq!(instance.declarations().consumes.len(), 1);
    let ids: Vec<String> = (1..=infos.len()).map(|i| format!("/pod{i}")).collect();
    let views: Vec<EndpointView<'_>> = ids
        .iter()
        .enumerate()
        .map(|(slot, id)| EndpointView {
            slot: slot as u32,
            host_index: slot as u32,
            id: RStr::from(id.as_str()),
            address: RStr::from(""),
            role: RStr::from(""),
            metrics: EndpointMetrics::default(),
        })
        .collect();
    let values: Vec<AttrValue> = infos
        .iter()
        .map(|i| i.map_or(AttrValue::Absent, AttrValue::PrefixCacheMatch))
        .collect();
    let rows = [0u32];
    let attrs = AttrView {
        values: RSlice::from_slice(&values),
        stride: infos.len() as u32,
        rows: RSlice::from_slice(&rows),
    };
    let request = RequestView {
        id: RStr::from("req"),
        model: RStr::from(""),
        cache_salt: RStr::from(""),
        prompts: RSlice::from_slice(&[]),
        max_output_tokens: -1,
        now_ms: 0,
        random_seed: 0,
        explain: false,
    };
    let mut scores = vec![f64::NAN; infos.len()];
    let mut note = RString::new();
    instance
        .score(&request, &views, &attrs, &mut scores, &mut note)
        .unwrap_or_else(|e| panic!("score failed: {}", e.message));
    scores
}

fn close(got: f64, want: f64, tolerance: f64) {
    assert!((got - want).abs() <= tolerance, "got {got}, want {want}");
}

#[test]
fn s1_score_is_the_matched_fraction() {
    let instance = scorer(r#"{"prefixMatchInfoProducerName":"approx-prefix-cache-producer"}"#);
    assert_eq!(
        consumed(&instance),
        ["PrefixCacheMatchInfo/approx-prefix-cache-producer"]
    );
    assert_eq!(
        score(&instance, &[pmi(5, 10, 1), pmi(2, 10, 1)]),
        [0.5, 0.2]
    );
}

#[test]
fn s2_missing_match_info_scores_zero() {
    let instance = scorer(r#"{"prefixMatchInfoProducerName":"precise-prefix-cache-producer"}"#);
    assert_eq!(
        consumed(&instance),
        ["PrefixCacheMatchInfo/precise-prefix-cache-producer"]
    );
    assert_eq!(score(&instance, &[None, None, None]), [0.0, 0.0, 0.0]);
}

#[test]
fn s3_mixed_missing_match_info() {
    let instance = scorer(r#"{"prefixMatchInfoProducerName":"precise-prefix-cache-producer"}"#);
    let got = score(&instance, &[pmi(5, 10, 1), None, None]);
    close(got[0], 0.5, 1e-4);
    assert_eq!(&got[1..], [0.0, 0.0]);
}

#[test]
fn s4_match_length_weight() {
    let instance = scorer(r#"{"matchLengthWeight":0.5,"matchLengthScaleTokens":100}"#);
    let got = score(&instance, &[pmi(5, 10, 1), pmi(50, 100, 1)]);
    close(got[0], 0.25125, 1e-6);
    close(got[1], 0.375, 1e-6);
}

fn factory_error(json: &str) -> (String, String) {
    match create(json) {
        Ok(_) => panic!("{json} is refused"),
        Err(e) => (e.field.to_string(), e.message.to_string()),
    }
}

#[test]
fn s5_factory_validation() {
    // a: defaults are weight 0 (plain fraction) and the default key.
    let defaults = scorer("{}");
    assert_eq!(
        consumed(&defaults),
        ["PrefixCacheMatchInfo/approx-prefix-cache-producer"]
    );
    assert_eq!(score(&defaults, &[pmi(5, 10, 1)]), [0.5]);
    // b: accepted.
    assert!(create(r#"{"matchLengthWeight":0.5,"matchLengthScaleTokens":100}"#).is_ok());
    // c, d: weight outside [0, 1].
    let (field, message) =
        factory_error(r#"{"matchLengthWeight":-0.1,"matchLengthScaleTokens":100}"#);
    assert_eq!(field, "matchLengthWeight");
    assert_eq!(message, "matchLengthWeight must be in [0, 1] (got -0.1)");
    let (field, message) =
        factory_error(r#"{"matchLengthWeight":1.1,"matchLengthScaleTokens":100}"#);
    assert_eq!(field, "matchLengthWeight");
    assert_eq!(message, "matchLengthWeight must be in [0, 1] (got 1.1)");
    // e: a zero scale with a positive weight.
    let (field, message) = factory_error(r#"{"matchLengthWeight":0.5,"matchLengthScaleTokens":0}"#);
    assert_eq!(field, "matchLengthScaleTokens");
    assert!(
        message
            .contains("matchLengthScaleTokens must be > 0 when matchLengthWeight is > 0 (got 0)"),
        "{message}"
    );
    // f: the scale defaults to 8192: 8192 matched tokens saturate the length term.
    let weighted = scorer(r#"{"matchLengthWeight":0.5}"#);
    close(
        score(&weighted, &[pmi(128, 256, 64)])[0],
        0.5 * 1.0 + 0.5 * 0.5,
        1e-12,
    );
    // g: weight 0 explicitly is the plain fraction.
    assert_eq!(
        score(&scorer(r#"{"matchLengthWeight":0.0}"#), &[pmi(2, 10, 1)]),
        [0.2]
    );
}

#[test]
fn empty_prompt_scores_zero() {
    assert_eq!(score(&scorer("{}"), &[pmi(0, 0, 64)]), [0.0]);
}

#[test]
fn full_length_weight_uses_matched_tokens() {
    let instance = scorer(r#"{"matchLengthWeight":1.0}"#);
    assert_eq!(score(&instance, &[pmi(10, 10, 64)]), [0.006103515625]);
}

#[test]
fn named_producer_reads_only_its_own_key() {
    let instance = scorer(r#"{"prefixMatchInfoProducerName":"burst"}"#);
    assert_eq!(consumed(&instance), ["PrefixCacheMatchInfo/burst"]);
    assert!(consumed(&instance)
        .iter()
        .all(|k| !k.ends_with("approx-prefix-cache-producer")));
}

#[test]
fn unknown_parameter_is_rejected() {
    let (_, message) = factory_error(r#"{"matchLengthWeigth":0.5}"#);
    assert!(message.contains("matchLengthWeigth"), "{message}");
}
