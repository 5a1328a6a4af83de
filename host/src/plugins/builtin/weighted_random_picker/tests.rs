use std::collections::BTreeSet;

use super::FACTORY;
use crate::plugins::builtin::testing::{
    assert_frequencies, assert_registered, create, create_error, pick, pick_frequencies,
};

fn picker(max: i64) -> switchyard_plugin_api::PluginInstance {
    create(&FACTORY, &format!(r#"{{"maxNumOfEndpoints": {max}}}"#))
}

fn proportional(scores: &[f64]) -> Vec<f64> {
    let total: f64 = scores.iter().sum();
    scores.iter().map(|s| s / total).collect()
}

#[test]
fn high_weight_dominance() {
    let scores = [10.0, 90.0];
    assert_frequencies(&pick_frequencies(&picker(1), &scores), &[0.1, 0.9]);
}

#[test]
fn equal_weights() {
    let scores = [100.0, 100.0, 100.0];
    assert_frequencies(&pick_frequencies(&picker(1), &scores), &[1.0 / 3.0; 3]);
}

#[test]
fn zero_weight_exclusion() {
    let frequencies = pick_frequencies(&picker(1), &[30.0, 0.0]);
    assert_eq!(frequencies, [1.0, 0.0]);
}

#[test]
fn multi_tier() {
    let scores = [100.0, 90.0, 50.0, 30.0, 20.0];
    let frequencies = pick_frequencies(&picker(1), &scores);
    assert_frequencies(&frequencies, &[0.3448, 0.3103, 0.1724, 0.1034, 0.0690]);
    assert_frequencies(&frequencies, &proportional(&scores));
}

#[test]
fn all_zero_scores_pick_uniformly() {
    let frequencies = pick_frequencies(&picker(1), &[0.0, 0.0, 0.0, 0.0]);
    assert_frequencies(&frequencies, &[0.25; 4]);
}

#[test]
fn two_picks_follow_sampling_without_replacement() {
    // P(i among two) = p_i + Σ_{j≠i} p_j·p_i/(1−p_j) with p = (0.5, 0.3, 0.2).
    let frequencies = pick_frequencies(&picker(2), &[50.0, 30.0, 20.0]);
    assert_frequencies(&frequencies, &[0.8393, 0.675, 0.4857]);
}

#[test]
fn zero_scores_come_after_every_positive_one() {
    let instance = picker(3);
    for seed in 0..200 {
        let got = pick(&instance, seed, &[0.0, 2.0, 0.0, 1.0]);
        let head: BTreeSet<_> = got[..2].iter().copied().collect();
        assert_eq!(head, BTreeSet::from(["/pod2", "/pod4"]), "seed {seed}");
        assert!(["/pod1", "/pod3"].contains(&got[2]), "seed {seed}: {got:?}");
    }
}

#[test]
fn tiny_scores_still_beat_zero() {
    let instance = picker(2);
    for seed in 0..200 {
        assert_eq!(
            pick(&instance, seed, &[0.0, 1e-9])[0],
            "/pod2",
            "seed {seed}"
        );
    }
}

#[test]
fn infinite_and_nan_scores_do_not_break_the_draw() {
    let instance = picker(1);
    for seed in 0..200 {
        let got = pick(&instance, seed, &[f64::NAN, f64::INFINITY, 1.0]);
        assert_eq!(got.len(), 1);
        assert_ne!(got[0], "/pod1", "seed {seed}");
    }
}

#[test]
fn a_seed_reproduces_its_pick() {
    let instance = picker(2);
    let scores = [3.0, 1.0, 2.0, 4.0];
    let picks: Vec<_> = (0..20).map(|seed| pick(&instance, seed, &scores)).collect();
    let again: Vec<_> = (0..20).map(|seed| pick(&instance, seed, &scores)).collect();
    assert_eq!(picks, again);
    assert!(picks.iter().collect::<BTreeSet<_>>().len() > 1, "{picks:?}");
}

#[test]
fn no_candidates_picks_nothing() {
    assert!(pick(&picker(1), 0, &[]).is_empty());
}

#[test]
fn refuses_a_count_below_one() {
    let error = create_error(&FACTORY, r#"{"maxNumOfEndpoints": 0}"#);
    assert_eq!(error.field.as_str(), "maxNumOfEndpoints");
    assert_eq!(
        error.message.as_str(),
        "maxNumOfEndpoints must be >= 1 (got 0)"
    );
}

#[test]
fn is_registered() {
    assert_registered(&FACTORY);
}
