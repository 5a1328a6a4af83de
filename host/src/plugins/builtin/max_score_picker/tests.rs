use std::collections::BTreeSet;

use super::FACTORY;
use crate::plugins::builtin::testing::{
    assert_frequencies, assert_registered, create, create_error, pick, pick_frequencies,
};

fn picker(max: i64) -> switchyard_plugin_api::PluginInstance {
    create(&FACTORY, &format!(r#"{{"maxNumOfEndpoints": {max}}}"#))
}

/// Picks with seeds 0..50 and checks each against `expected`, where the first `tie` entries
/// may come in any order; returns the distinct orders seen.
fn check(max: i64, scores: &[f64], expected: &[&str], tie: usize) -> BTreeSet<Vec<&'static str>> {
    let instance = picker(max);
    let mut orders = BTreeSet::new();
    for seed in 0..50 {
        let got = pick(&instance, seed, scores);
        assert_eq!(got.len(), expected.len(), "seed {seed}: {got:?}");
        let got_ties: BTreeSet<_> = got[..tie].iter().collect();
        let want_ties: BTreeSet<_> = expected[..tie].iter().collect();
        assert_eq!(got_ties, want_ties, "seed {seed}: {got:?}");
        assert_eq!(&got[tie..], &expected[tie..], "seed {seed}: {got:?}");
        orders.insert(got);
    }
    orders
}

#[test]
fn single_max_score() {
    check(1, &[10.0, 25.0, 15.0], &["/pod2"], 0);
}

#[test]
fn all_equally_scored_top() {
    let orders = check(2, &[50.0, 50.0, 30.0], &["/pod1", "/pod2"], 2);
    assert_eq!(orders.len(), 2, "tie order never varies: {orders:?}");
}

#[test]
fn more_pods_than_needed() {
    check(2, &[20.0, 25.0, 30.0], &["/pod3", "/pod2"], 0);
}

#[test]
fn fewer_pods_than_needed() {
    check(4, &[20.0, 25.0, 30.0], &["/pod3", "/pod2", "/pod1"], 0);
}

#[test]
fn exactly_as_many() {
    let orders = check(3, &[30.0, 25.0, 30.0], &["/pod1", "/pod3", "/pod2"], 2);
    assert_eq!(orders.len(), 2, "tie order never varies: {orders:?}");
}

#[test]
fn a_tie_for_one_pick_is_uniform() {
    let frequencies = pick_frequencies(&picker(1), &[50.0, 50.0, 30.0, 50.0]);
    assert_frequencies(&frequencies, &[1.0 / 3.0, 1.0 / 3.0, 0.0, 1.0 / 3.0]);
}

#[test]
fn a_tie_across_the_cut_is_uniform() {
    // Two of four tied endpoints make the cut, each with probability 1/2.
    let frequencies = pick_frequencies(&picker(2), &[1.0, 7.0, 7.0, 7.0, 7.0]);
    assert_frequencies(&frequencies, &[0.0, 0.5, 0.5, 0.5, 0.5]);
}

#[test]
fn a_seed_reproduces_its_pick() {
    for max in [1, 3] {
        let instance = picker(max);
        let scores = [5.0, 5.0, 5.0, 5.0, 5.0];
        let picks: Vec<_> = (0..20).map(|seed| pick(&instance, seed, &scores)).collect();
        let again: Vec<_> = (0..20).map(|seed| pick(&instance, seed, &scores)).collect();
        assert_eq!(picks, again);
        let distinct: BTreeSet<_> = picks.iter().collect();
        assert!(distinct.len() > 1, "the seed has no effect: {picks:?}");
    }
}

#[test]
fn nan_ranks_below_every_score() {
    for max in [1, 2] {
        let got = pick(&picker(max), 0, &[f64::NAN, -3.0, f64::NAN]);
        assert_eq!(got[0], "/pod2");
    }
}

#[test]
fn no_candidates_picks_nothing() {
    assert!(pick(&picker(2), 0, &[]).is_empty());
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
fn defaults_to_one_pick() {
    let instance = create(&FACTORY, "null");
    assert_eq!(pick(&instance, 0, &[1.0, 3.0, 2.0]), ["/pod2"]);
}

#[test]
fn is_registered() {
    assert_registered(&FACTORY);
}
