use super::*;

fn pmi(match_blocks: u64, total_blocks: u64, block_size_tokens: u64) -> Option<MatchInfo> {
    Some(MatchInfo {
        match_blocks,
        total_blocks,
        block_size_tokens,
    })
}

fn weighted(weight: f64, scale: i64) -> ScorerConfig {
    ScorerConfig {
        match_length_weight: weight,
        match_length_scale_tokens: scale,
        ..ScorerConfig::default()
    }
}

#[test]
fn s1_default_config_scores_matched_fraction_exactly() {
    let cfg = ScorerConfig::default();
    assert_eq!(score(&cfg, pmi(5, 10, 1)), 0.5);
    assert_eq!(score(&cfg, pmi(2, 10, 1)), 0.2);
}

#[test]
fn s2_all_missing_scores_zero_and_counts_three() {
    let cfg = ScorerConfig::default();
    let mut out = [f64::NAN; 3];
    let summary = score_into(&cfg, [None, None, None], &mut out);
    assert_eq!(out, [0.0, 0.0, 0.0]);
    assert_eq!(
        summary,
        ScoreSummary {
            missing: 3,
            empty_prompt: 0
        }
    );
}

#[test]
fn s3_mixed_missing_counts_two() {
    let cfg = ScorerConfig::default();
    let mut out = [f64::NAN; 3];
    let summary = score_into(&cfg, [pmi(5, 10, 1), None, None], &mut out);
    assert_eq!(out, [0.5, 0.0, 0.0]);
    assert_eq!(summary.missing, 2);
    assert_eq!(summary.empty_prompt, 0);
}

#[test]
fn s4_length_weight_blends_both_terms() {
    let cfg = weighted(0.5, 100);
    assert!((score(&cfg, pmi(5, 10, 1)) - 0.25125).abs() < 1e-12);
    assert!((score(&cfg, pmi(50, 100, 1)) - 0.375).abs() < 1e-12);
}

#[test]
fn empty_prompt_scores_zero_and_is_counted() {
    let cfg = weighted(0.5, 100);
    assert_eq!(score(&cfg, pmi(0, 0, 64)), 0.0);
    let mut out = [f64::NAN; 1];
    let summary = score_into(&cfg, [pmi(0, 0, 64)], &mut out);
    assert_eq!(out, [0.0]);
    assert_eq!(summary.empty_prompt, 1);
    assert_eq!(summary.missing, 0);
}

#[test]
fn full_length_weight_uses_squared_saturation_only() {
    let cfg = weighted(1.0, 8192);
    assert_eq!(score(&cfg, pmi(10, 10, 64)), 0.006103515625);
}

#[test]
fn length_term_saturates_at_scale() {
    let cfg = weighted(1.0, 100);
    assert_eq!(score(&cfg, pmi(3, 10, 64)), 1.0);
}

#[test]
fn zero_block_size_drops_length_term() {
    let cfg = weighted(0.5, 100);
    assert_eq!(score(&cfg, pmi(5, 10, 0)), 0.25);
}

#[test]
fn match_beyond_prompt_is_capped_at_one() {
    assert_eq!(score(&ScorerConfig::default(), pmi(12, 10, 16)), 1.0);
    assert_eq!(score(&weighted(0.5, 100), pmi(120, 100, 16)), 1.0);
}

#[test]
fn scores_stay_finite_and_in_unit_range() {
    for weight in [0.0, 0.25, 0.5, 1.0] {
        for scale in [1, 100, 8192] {
            let cfg = weighted(weight, scale);
            for (m, t, b) in [(0, 1, 16), (1, 1, 0), (7, 3, 64), (u64::MAX, 1, u64::MAX)] {
                let s = score(&cfg, pmi(m, t, b));
                assert!(
                    s.is_finite() && (0.0..=1.0).contains(&s),
                    "{s} for {m}/{t}/{b}"
                );
            }
        }
    }
}

#[test]
fn score_into_leaves_extra_slots_untouched() {
    let cfg = ScorerConfig::default();
    let mut out = [9.0; 3];
    score_into(&cfg, [pmi(1, 4, 16)], &mut out);
    assert_eq!(out, [0.25, 9.0, 9.0]);
}
