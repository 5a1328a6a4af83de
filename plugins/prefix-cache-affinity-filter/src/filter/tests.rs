use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::Deserialize;
use serde_json::json;

use super::*;

/// Config from explicit JSON, validated like a factory would.
fn cfg(v: serde_json::Value) -> AffinityConfig {
    let cfg = AffinityConfig::deserialize(v).unwrap();
    cfg.validate().unwrap();
    cfg
}

/// The catalogue's endpoint helper: `PMI(matched, 100, 16)`, predicted TTFT and in-flight
/// tokens; a negative value leaves that attribute absent.
fn ep(matched: i64, ttft_ms: f64, tokens: i64) -> EndpointFacts {
    EndpointFacts {
        prefix: (matched >= 0).then_some(MatchInfo {
            match_blocks: matched as u64,
            total_blocks: 100,
            block_size_tokens: 16,
        }),
        ttft_ms: (ttft_ms >= 0.0).then_some(ttft_ms),
        in_flight_tokens: (tokens >= 0).then_some(tokens),
    }
}

/// An endpoint for the load gate: `PMI(matched, 100, block)` and in-flight tokens.
fn loaded(matched: u64, block: u64, tokens: Option<i64>) -> EndpointFacts {
    EndpointFacts {
        prefix: Some(MatchInfo {
            match_blocks: matched,
            total_blocks: 100,
            block_size_tokens: block,
        }),
        ttft_ms: None,
        in_flight_tokens: tokens,
    }
}

fn run(cfg: &AffinityConfig, endpoints: &[EndpointFacts], draw: f64) -> (FilterOutcome, Vec<bool>) {
    let mut keep = vec![false; endpoints.len()];
    let outcome = filter(cfg, endpoints, draw, &mut keep);
    (outcome, keep)
}

/// Black-box translation of the catalogue's raw test config: unset fields are zero.
fn raw(extra: serde_json::Value) -> AffinityConfig {
    let mut base = json!({
        "explorationProbability": 0,
        "maxTTFTPenaltyMs": 0,
        "ttftSource": "prefillThroughput",
        "peakPrefillThroughput": 0
    });
    if let (Some(base), Some(extra)) = (base.as_object_mut(), extra.as_object()) {
        base.extend(extra.clone());
    }
    cfg(base)
}

#[test]
fn f1_zero_threshold_disables_filter() {
    let c = raw(json!({"affinityThreshold": 0}));
    let (out, keep) = run(&c, &[ep(0, 10.0, 0), ep(90, 20.0, 0)], 0.5);
    assert_eq!(out, FilterOutcome::PassAll(PassReason::Disabled));
    assert_eq!(keep, [true, true]);
}

#[test]
fn f2_single_endpoint_kept() {
    let c = raw(json!({"affinityThreshold": 0.80}));
    let (out, keep) = run(&c, &[ep(90, 10.0, 0)], 0.5);
    assert_eq!(out, FilterOutcome::PassAll(PassReason::SingleEndpoint));
    assert_eq!(keep, [true]);
}

#[test]
fn no_endpoints_is_not_an_error() {
    let (out, keep) = run(&AffinityConfig::default(), &[], 0.5);
    assert_eq!(out, FilterOutcome::PassAll(PassReason::SingleEndpoint));
    assert!(keep.is_empty());
}

#[test]
fn f3_no_sticky_endpoints_keeps_all() {
    let c = raw(json!({"affinityThreshold": 0.80}));
    let eps = [ep(10, 10.0, 0), ep(20, 20.0, 0), ep(50, 30.0, 0)];
    let (out, keep) = run(&c, &eps, 0.5);
    assert_eq!(out, FilterOutcome::PassAll(PassReason::NoSticky));
    assert_eq!(keep, [true, true, true]);
}

#[test]
fn f4_narrows_to_sticky_when_gap_within_penalty() {
    let c = raw(json!({
        "affinityThreshold": 0.80, "maxTTFTPenaltyMs": 5000, "ttftSource": "latencyPredictor"
    }));
    let eps = [ep(90, 100.0, 0), ep(85, 120.0, 0), ep(10, 50.0, 0)];
    let (out, keep) = run(&c, &eps, 0.5);
    assert_eq!(keep, [true, true, false]);
    let gate = GateReading {
        best_sticky: 0,
        best_non_sticky: 2,
        test: GateTest::Ttft(TtftGap {
            sticky_ms: 100.0,
            non_sticky_ms: 50.0,
            limit_ms: 5000.0,
        }),
    };
    assert_eq!(
        out,
        FilterOutcome::Narrowed {
            sticky: 2,
            gate: Some(gate)
        }
    );
    assert_eq!(
        out.to_string(),
        "narrowed to 2 sticky endpoints; TTFT gate held: TTFT gap 50 ms <= limit 5000 ms \
         (sticky 100 ms, non-sticky 50 ms)"
    );
}

#[test]
fn f5_predicted_ttft_gap_breaks_stickiness() {
    let c = raw(json!({
        "affinityThreshold": 0.80, "maxTTFTPenaltyMs": 100, "ttftSource": "latencyPredictor"
    }));
    let (out, keep) = run(&c, &[ep(90, 500.0, 0), ep(10, 50.0, 0)], 0.5);
    assert_eq!(keep, [true, true]);
    let FilterOutcome::Released(reading) = out else {
        panic!("expected a release, got {out:?}")
    };
    assert_eq!(
        reading.test,
        GateTest::Ttft(TtftGap {
            sticky_ms: 500.0,
            non_sticky_ms: 50.0,
            limit_ms: 100.0
        })
    );
    assert_eq!(
        out.to_string(),
        "TTFT gate released: TTFT gap 450 ms > limit 100 ms (sticky 500 ms, non-sticky 50 ms)"
    );
}

#[test]
fn f6_throughput_ttft_breaks_stickiness() {
    let c = raw(json!({
        "affinityThreshold": 0.80, "maxTTFTPenaltyMs": 100, "peakPrefillThroughput": 1000
    }));
    let (out, keep) = run(&c, &[ep(90, 10.0, 500), ep(10, 10.0, 50)], 0.5);
    assert_eq!(keep, [true, true]);
    let FilterOutcome::Released(reading) = out else {
        panic!("expected a release, got {out:?}")
    };
    let GateTest::Ttft(gap) = reading.test else {
        panic!("expected the static gate, got {reading:?}")
    };
    assert_eq!((gap.sticky_ms, gap.non_sticky_ms), (500.0, 50.0));
    assert_eq!((reading.best_sticky, reading.best_non_sticky), (0, 1));
}

#[test]
fn f7_throughput_ttft_within_penalty_keeps_sticky() {
    let c = raw(json!({
        "affinityThreshold": 0.80, "maxTTFTPenaltyMs": 1000, "peakPrefillThroughput": 1000
    }));
    let (out, keep) = run(&c, &[ep(90, 10.0, 500), ep(10, 10.0, 50)], 0.5);
    assert_eq!(keep, [true, false]);
    assert!(matches!(
        out,
        FilterOutcome::Narrowed {
            sticky: 1,
            gate: Some(_)
        }
    ));
}

#[test]
fn f8_zero_penalty_disables_static_gate() {
    let c = raw(json!({
        "affinityThreshold": 0.80, "maxTTFTPenaltyMs": 0, "peakPrefillThroughput": 1000
    }));
    let (out, keep) = run(&c, &[ep(90, 10.0, 5000), ep(10, 10.0, 50)], 0.5);
    assert_eq!(keep, [true, false]);
    assert_eq!(
        out,
        FilterOutcome::Narrowed {
            sticky: 1,
            gate: None
        }
    );
    assert_eq!(out.to_string(), "narrowed to 1 sticky endpoint");
}

#[test]
fn f9_exploration_probability_one_always_explores() {
    let c = raw(json!({"affinityThreshold": 0.80, "explorationProbability": 1.0}));
    for draw in [0.0, 0.5, 0.999_999] {
        let (out, keep) = run(&c, &[ep(90, 100.0, 0), ep(10, 50.0, 0)], draw);
        assert_eq!(out, FilterOutcome::PassAll(PassReason::Explored));
        assert_eq!(keep, [true, true]);
    }
}

#[test]
fn exploration_needs_draw_strictly_below_probability() {
    let c = raw(json!({"affinityThreshold": 0.80, "explorationProbability": 0.3}));
    let eps = [ep(90, 100.0, 0), ep(10, 50.0, 0)];
    assert_eq!(
        run(&c, &eps, 0.29).0,
        FilterOutcome::PassAll(PassReason::Explored)
    );
    assert_eq!(run(&c, &eps, 0.3).1, [true, false]);
}

#[test]
fn exploration_draws_are_seeded_and_in_unit_interval() {
    let mut a = SmallRng::seed_from_u64(7);
    let mut b = SmallRng::seed_from_u64(7);
    for _ in 0..1000 {
        let x = exploration_draw(&mut a);
        assert!((0.0..1.0).contains(&x), "{x}");
        assert_eq!(x, exploration_draw(&mut b));
    }
}

#[test]
fn predictor_missing_everywhere_does_not_break() {
    let c = raw(json!({
        "affinityThreshold": 0.80, "maxTTFTPenaltyMs": 100, "ttftSource": "latencyPredictor"
    }));
    let (out, keep) = run(&c, &[ep(90, -1.0, 0), ep(10, -1.0, 0)], 0.5);
    assert_eq!(keep, [true, false]);
    assert_eq!(
        out.to_string(),
        "narrowed to 1 sticky endpoint; TTFT gate held: no TTFT prediction on either side"
    );
}

#[test]
fn predictor_missing_on_sticky_only_breaks() {
    let c = raw(json!({
        "affinityThreshold": 0.80, "maxTTFTPenaltyMs": 100, "ttftSource": "latencyPredictor"
    }));
    let (out, keep) = run(&c, &[ep(90, -1.0, 0), ep(10, 50.0, 0)], 0.5);
    assert_eq!(keep, [true, true]);
    assert_eq!(
        out.to_string(),
        "TTFT gate released: no TTFT prediction for the best sticky endpoint (non-sticky 50 ms)"
    );
}

#[test]
fn predictor_missing_on_non_sticky_only_holds() {
    let c = raw(json!({
        "affinityThreshold": 0.80, "maxTTFTPenaltyMs": 100, "ttftSource": "latencyPredictor"
    }));
    let (out, keep) = run(&c, &[ep(90, 500.0, 0), ep(10, -1.0, 0)], 0.5);
    assert_eq!(keep, [true, false]);
    assert!(matches!(
        out,
        FilterOutcome::Narrowed {
            sticky: 1,
            gate: Some(_)
        }
    ));
}

#[test]
fn nan_prediction_counts_as_missing() {
    let c = raw(json!({
        "affinityThreshold": 0.80, "maxTTFTPenaltyMs": 100, "ttftSource": "latencyPredictor"
    }));
    let (out, _) = run(&c, &[ep(90, f64::NAN, 0), ep(10, 50.0, 0)], 0.5);
    assert!(matches!(out, FilterOutcome::Released(_)));
}

#[test]
fn negative_threshold_disables_filter() {
    let c = raw(json!({"affinityThreshold": -0.5}));
    let (out, keep) = run(&c, &[ep(90, 10.0, 0), ep(0, 10.0, 0)], 0.5);
    assert_eq!(out, FilterOutcome::PassAll(PassReason::Disabled));
    assert_eq!(keep, [true, true]);
}

#[test]
fn missing_prefix_or_empty_prompt_is_never_sticky() {
    let c = raw(json!({"affinityThreshold": 0.80}));
    let empty = EndpointFacts {
        prefix: Some(MatchInfo {
            match_blocks: 0,
            total_blocks: 0,
            block_size_tokens: 16,
        }),
        ..EndpointFacts::default()
    };
    let (out, keep) = run(&c, &[ep(-1, 10.0, 0), empty, ep(80, 10.0, 0)], 0.5);
    assert_eq!(keep, [false, false, true]);
    assert_eq!(
        out,
        FilterOutcome::Narrowed {
            sticky: 1,
            gate: None
        }
    );
}

#[test]
fn all_sticky_keeps_all_without_gate() {
    let c = cfg(json!({"penaltyMode": "matchedTokens"}));
    let (out, keep) = run(
        &c,
        &[loaded(90, 16, Some(9000)), loaded(95, 16, Some(0))],
        0.5,
    );
    assert_eq!(out, FilterOutcome::PassAll(PassReason::AllSticky));
    assert_eq!(keep, [true, true]);
}

#[test]
fn static_ties_pick_first_in_input_order() {
    let c = raw(json!({
        "affinityThreshold": 0.80, "maxTTFTPenaltyMs": 5000, "ttftSource": "latencyPredictor"
    }));
    let eps = [
        ep(10, 50.0, 0),
        ep(90, 70.0, 0),
        ep(20, 50.0, 0),
        ep(95, 70.0, 0),
    ];
    let (out, _) = run(&c, &eps, 0.5);
    let FilterOutcome::Narrowed { gate: Some(g), .. } = out else {
        panic!("expected a held gate, got {out:?}")
    };
    assert_eq!((g.best_sticky, g.best_non_sticky), (1, 0));
}

#[test]
fn mismatched_keep_length_does_not_panic() {
    let c = AffinityConfig::default();
    let eps = [
        loaded(90, 16, Some(0)),
        loaded(10, 16, Some(0)),
        loaded(10, 16, Some(0)),
    ];
    let mut short = [false; 2];
    let out = filter(&c, &eps, 0.5, &mut short);
    assert!(matches!(
        out,
        FilterOutcome::Narrowed {
            sticky: 1,
            gate: Some(_)
        }
    ));
    assert_eq!(short, [true, false]);
}

// penaltyMode: matchedTokens. PMI(90, 100, 16) matches 90 × 16 = 1440 tokens.

fn matched_tokens() -> AffinityConfig {
    cfg(json!({"penaltyMode": "matchedTokens"}))
}

#[test]
fn keeps_pin_when_gap_below_matched_tokens() {
    let eps = [loaded(90, 16, Some(2000)), loaded(10, 16, Some(1000))];
    let (out, keep) = run(&matched_tokens(), &eps, 0.5);
    assert_eq!(keep, [true, false]);
    let FilterOutcome::Narrowed {
        sticky: 1,
        gate: Some(g),
    } = out
    else {
        panic!("expected a held gate, got {out:?}")
    };
    assert!(!g.break_even_exceeded() && !g.ttft_exceeded());
    assert_eq!(
        out.to_string(),
        "narrowed to 1 sticky endpoint; TTFT gate held: gap 1000 tokens <= matched 1440"
    );
}

#[test]
fn releases_pin_when_gap_exceeds_matched_tokens() {
    let eps = [loaded(90, 16, Some(5000)), loaded(10, 16, Some(1000))];
    let (out, keep) = run(&matched_tokens(), &eps, 0.5);
    assert_eq!(keep, [true, true]);
    let FilterOutcome::Released(g) = out else {
        panic!("expected a release, got {out:?}")
    };
    assert_eq!((g.best_sticky, g.best_non_sticky), (0, 1));
    let GateTest::MatchedTokens {
        gap_tokens,
        matched_tokens,
        ceiling: Some(ceiling),
    } = g.test
    else {
        panic!("expected the matched-tokens gate with a ceiling, got {g:?}")
    };
    assert_eq!((gap_tokens, matched_tokens), (4000, Some(1440)));
    assert!(!ceiling.exceeded());
    assert_eq!(
        out.to_string(),
        "TTFT gate released: gap 4000 tokens > matched 1440"
    );
}

#[test]
fn scales_with_cache_value() {
    // The same 4000-token gap: 90 blocks of 16 tokens are not worth it, of 64 tokens they are.
    let small = [loaded(90, 16, Some(5000)), loaded(10, 16, Some(1000))];
    let large = [loaded(90, 64, Some(5000)), loaded(10, 64, Some(1000))];
    assert!(matches!(
        run(&matched_tokens(), &small, 0.5).0,
        FilterOutcome::Released(_)
    ));
    let (out, keep) = run(&matched_tokens(), &large, 0.5);
    assert_eq!(keep, [true, false]);
    assert_eq!(
        out.to_string(),
        "narrowed to 1 sticky endpoint; TTFT gate held: gap 4000 tokens <= matched 5760"
    );
}

#[test]
fn ceiling_still_applies() {
    // 90 blocks of 1024 tokens (92160) outvalue a 4000-token gap, but at 1000 tokens/s that
    // gap is 4000 ms, above the 100 ms ceiling.
    let c = cfg(json!({
        "penaltyMode": "matchedTokens", "maxTTFTPenaltyMs": 100, "peakPrefillThroughput": 1000
    }));
    let eps = [loaded(90, 1024, Some(5000)), loaded(10, 1024, Some(1000))];
    let (out, keep) = run(&c, &eps, 0.5);
    assert_eq!(keep, [true, true]);
    let FilterOutcome::Released(g) = out else {
        panic!("expected a release, got {out:?}")
    };
    assert!(!g.break_even_exceeded());
    assert!(g.ttft_exceeded());
    assert_eq!(
        out.to_string(),
        "TTFT gate released: gap 4000 tokens <= matched 92160; ceiling: TTFT gap 4000 ms > \
         limit 100 ms (sticky 5000 ms, non-sticky 1000 ms)"
    );
}

#[test]
fn zero_ceiling_leaves_only_the_token_test() {
    // 90000 in-flight tokens is over 5 s of prefill at the default throughput, but less than
    // the 92160 matched tokens; with no ceiling only the token test counts.
    let c = cfg(json!({"penaltyMode": "matchedTokens", "maxTTFTPenaltyMs": 0}));
    let eps = [loaded(90, 1024, Some(90_000)), loaded(10, 1024, Some(0))];
    let (out, keep) = run(&c, &eps, 0.5);
    assert_eq!(keep, [true, false]);
    let FilterOutcome::Narrowed { gate: Some(g), .. } = out else {
        panic!("expected a held gate, got {out:?}")
    };
    assert_eq!(
        g.test,
        GateTest::MatchedTokens {
            gap_tokens: 90_000,
            matched_tokens: Some(92160),
            ceiling: None
        }
    );
    // The default 18000 ms ceiling does not fire either (5650 ms); a 5000 ms one does.
    assert_eq!(run(&matched_tokens(), &eps, 0.5).1, [true, false]);
    let c = cfg(json!({"penaltyMode": "matchedTokens", "maxTTFTPenaltyMs": 5000}));
    assert!(matches!(run(&c, &eps, 0.5).0, FilterOutcome::Released(_)));
}

#[test]
fn no_match_info_is_no_op() {
    // Block size 0 on the best sticky endpoint: matched tokens are unknown, so the token test
    // is skipped even though another sticky endpoint has usable match info.
    let c = cfg(json!({"penaltyMode": "matchedTokens", "maxTTFTPenaltyMs": 0}));
    let eps = [
        loaded(90, 0, Some(5000)),
        loaded(10, 16, Some(1000)),
        loaded(95, 16, Some(6000)),
    ];
    let (out, keep) = run(&c, &eps, 0.5);
    assert_eq!(keep, [true, false, true]);
    assert_eq!(
        out.to_string(),
        "narrowed to 2 sticky endpoints; TTFT gate held: gap 4000 tokens, matched tokens unknown"
    );
}

#[test]
fn static_mode_unchanged() {
    let eps = [loaded(90, 16, Some(5000)), loaded(10, 16, Some(1000))];
    // Defaults (18000 ms at 15928 tokens/s): 251 ms of gap holds, whatever the prefix is worth.
    let (out, keep) = run(&AffinityConfig::default(), &eps, 0.5);
    assert_eq!(keep, [true, false]);
    let FilterOutcome::Narrowed { gate: Some(g), .. } = out else {
        panic!("expected a held gate, got {out:?}")
    };
    assert!(matches!(g.test, GateTest::Ttft(_)));
    // A 200 ms limit releases on the same TTFT comparison.
    let c = cfg(json!({"maxTTFTPenaltyMs": 200}));
    let (out, keep) = run(&c, &eps, 0.5);
    assert_eq!(keep, [true, true]);
    assert_eq!(
        out.to_string(),
        "TTFT gate released: TTFT gap 251.1 ms > limit 200 ms (sticky 313.9 ms, non-sticky 62.8 ms)"
    );
}

#[test]
fn matched_tokens_missing_in_flight_counts_as_zero() {
    let eps = [loaded(90, 16, None), loaded(10, 16, None)];
    let (_, keep) = run(&matched_tokens(), &eps, 0.5);
    assert_eq!(keep, [true, false]);
    let eps = [loaded(90, 16, Some(2000)), loaded(10, 16, None)];
    let (out, keep) = run(&matched_tokens(), &eps, 0.5);
    assert_eq!(keep, [true, true]);
    assert_eq!(
        out.to_string(),
        "TTFT gate released: gap 2000 tokens > matched 1440"
    );
}

#[test]
fn matched_tokens_ties_pick_first_in_input_order() {
    // Two sticky endpoints with equal load: the first one decides which match info is used.
    let unknown_first = [
        loaded(90, 0, Some(3000)),
        loaded(90, 16, Some(3000)),
        loaded(10, 16, Some(0)),
    ];
    let (out, _) = run(&matched_tokens(), &unknown_first, 0.5);
    assert!(matches!(
        out,
        FilterOutcome::Narrowed {
            sticky: 2,
            gate: Some(_)
        }
    ));

    let known_first = [
        loaded(90, 16, Some(3000)),
        loaded(90, 0, Some(3000)),
        loaded(10, 16, Some(0)),
    ];
    let (out, _) = run(&matched_tokens(), &known_first, 0.5);
    assert_eq!(
        out.to_string(),
        "TTFT gate released: gap 3000 tokens > matched 1440"
    );
}

#[test]
fn matched_tokens_uses_least_loaded_on_each_side() {
    let eps = [
        loaded(90, 16, Some(9000)),
        loaded(10, 16, Some(4000)),
        loaded(95, 16, Some(3000)),
        loaded(0, 16, Some(2000)),
    ];
    let (out, keep) = run(&matched_tokens(), &eps, 0.5);
    assert_eq!(keep, [true, false, true, false]);
    let FilterOutcome::Narrowed { gate: Some(g), .. } = out else {
        panic!("expected a held gate, got {out:?}")
    };
    assert_eq!((g.best_sticky, g.best_non_sticky), (2, 3));
    // 95 × 16 = 1520 matched against a 1000-token gap.
    assert_eq!(
        g.to_string(),
        "TTFT gate held: gap 1000 tokens <= matched 1520"
    );
}

#[test]
fn sticky_less_loaded_gives_negative_gap_and_holds() {
    let eps = [loaded(90, 16, Some(100)), loaded(10, 16, Some(1000))];
    let (out, keep) = run(&matched_tokens(), &eps, 0.5);
    assert_eq!(keep, [true, false]);
    assert_eq!(
        out.to_string(),
        "narrowed to 1 sticky endpoint; TTFT gate held: gap -900 tokens <= matched 1440"
    );
}
