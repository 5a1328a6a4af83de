use serde_json::json;

use super::*;

fn decode(params: serde_json::Value) -> Result<BurstConfig, PluginError> {
    BurstConfig::parse(&params.to_string())
}

fn rejected(params: serde_json::Value) -> (String, String) {
    let err = decode(params).expect_err("parameters should be rejected");
    assert_eq!(err.kind, switchyard_plugin_api::ErrorKind::InvalidParameter);
    (err.field.into(), err.message.into())
}

fn expected(field: &str, message: &str) -> (String, String) {
    (field.to_owned(), message.to_owned())
}

#[test]
fn defaults_match_the_reference() {
    let config = decode(json!({})).unwrap();
    assert_eq!(config, BurstConfig::default());
    assert_eq!(config.window_duration_ms, 100);
    assert_eq!(config.max_per_replica, -1);
    assert_eq!(config.block_size_tokens, 64);
    assert_eq!(config.max_prefix_tokens_to_match, 0);
    assert_eq!(config.min_colocate_blocks, 0);
    assert_eq!(config.max_batch_size, 1000);
    assert_eq!(config.balance(), BalanceBy::Requests);
    assert_eq!(config.max_blocks(), 2048);
    assert_eq!(config.per_replica_cap(), None);
    assert_eq!(config.batch_cap(), Some(1000));
    assert_eq!(config.colocate_blocks(), 0);
    assert_eq!(config.window_ms(), 100);
    assert_eq!(config.block_size(), 64);
    assert_eq!(decode(serde_json::Value::Null).unwrap(), config);
    assert_eq!(BurstConfig::parse("").unwrap(), config);
}

#[test]
fn explicit_values_override_defaults() {
    let config = decode(json!({
        "windowDurationMs": 1000,
        "maxPerReplica": 4,
        "blockSizeTokens": 16,
        "maxPrefixTokensToMatch": 100,
        "minColocateBlocks": 1,
        "maxBatchSize": -1,
        "balanceBy": "tokens"
    }))
    .unwrap();
    assert_eq!(config.window_ms(), 1000);
    assert_eq!(config.per_replica_cap(), Some(4));
    assert_eq!(config.block_size(), 16);
    assert_eq!(config.max_blocks(), 6);
    assert_eq!(config.colocate_blocks(), 1);
    assert_eq!(config.batch_cap(), None);
    assert_eq!(config.balance(), BalanceBy::Tokens);
}

#[test]
fn p1a_zero_window() {
    assert_eq!(
        rejected(json!({"windowDurationMs": 0, "maxPerReplica": -1, "blockSizeTokens": 64})),
        expected(
            "windowDurationMs",
            "windowDurationMs must be in 1..=10000 (got 0)"
        )
    );
}

#[test]
fn window_upper_bound() {
    assert!(decode(json!({"windowDurationMs": 10000})).is_ok());
    assert_eq!(
        rejected(json!({"windowDurationMs": 10001})).1,
        "windowDurationMs must be in 1..=10000 (got 10001)"
    );
}

#[test]
fn window_quiet_ms_is_ours_off_by_default_and_within_the_window() {
    let config = decode(json!({})).unwrap();
    assert_eq!((config.window_quiet_ms, config.quiet_ms()), (0, None));
    assert_eq!(config.cached_match_producer(), None);
    let config = decode(json!({"windowDurationMs": 50, "windowQuietMs": 3})).unwrap();
    assert_eq!(config.quiet_ms(), Some(3));
    // A gap as long as the window seals no earlier than the window.
    let config = decode(json!({"windowDurationMs": 50, "windowQuietMs": 50})).unwrap();
    assert_eq!(config.quiet_ms(), None);
    assert_eq!(
        rejected(json!({"windowDurationMs": 50, "windowQuietMs": 51})),
        expected(
            "windowQuietMs",
            "windowQuietMs must be in 0..=windowDurationMs (50) (got 51); 0 keeps the fixed \
             window"
        )
    );
    assert_eq!(rejected(json!({"windowQuietMs": -1})).0, "windowQuietMs");
    let config = decode(json!({"cachedMatchProducerName": "approx"})).unwrap();
    assert_eq!(config.cached_match_producer(), Some("approx"));
}

#[test]
fn p1b_zero_max_per_replica() {
    assert_eq!(
        rejected(json!({"windowDurationMs": 100, "maxPerReplica": 0, "blockSizeTokens": 64})),
        expected(
            "maxPerReplica",
            "maxPerReplica must be -1 (unlimited) or >= 1 (got 0)"
        )
    );
    assert_eq!(
        rejected(json!({"maxPerReplica": -2})).1,
        "maxPerReplica must be -1 (unlimited) or >= 1 (got -2)"
    );
}

#[test]
fn p1c_zero_block_size() {
    assert_eq!(
        rejected(json!({"windowDurationMs": 100, "maxPerReplica": -1, "blockSizeTokens": 0})),
        expected("blockSizeTokens", "blockSizeTokens must be >= 1 (got 0)")
    );
}

#[test]
fn p1d_bogus_balance_by_through_defaults() {
    assert_eq!(
        rejected(json!({
            "windowDurationMs": 100, "maxPerReplica": -1, "blockSizeTokens": 64,
            "balanceBy": "bogus"
        })),
        expected(
            "balanceBy",
            "balanceBy must be \"requests\" or \"tokens\" (got \"bogus\")"
        )
    );
}

#[test]
fn p1d_as_the_reference_wrote_it_fails_on_max_batch_size_first() {
    assert_eq!(
        rejected(json!({
            "windowDurationMs": 100, "maxPerReplica": -1, "blockSizeTokens": 64,
            "maxBatchSize": 0, "balanceBy": "bogus"
        })),
        expected(
            "maxBatchSize",
            "maxBatchSize must be -1 (unlimited) or >= 1 (got 0)"
        )
    );
}

#[test]
fn first_failure_in_table_order_wins() {
    let (field, _) = rejected(json!({
        "balanceBy": "bogus",
        "minColocateBlocks": -1,
        "windowDurationMs": 0
    }));
    assert_eq!(field, "windowDurationMs");
    let (field, _) = rejected(json!({"balanceBy": "bogus", "minColocateBlocks": -1}));
    assert_eq!(field, "minColocateBlocks");
}

#[test]
fn max_prefix_tokens_to_match_bounds() {
    assert_eq!(
        rejected(json!({"maxPrefixTokensToMatch": -1})).1,
        "maxPrefixTokensToMatch must be >= 0 (got -1)"
    );
    assert_eq!(
        rejected(json!({"maxPrefixTokensToMatch": 63})),
        expected(
            "maxPrefixTokensToMatch",
            "maxPrefixTokensToMatch must be 0 or >= blockSizeTokens (64) (got 63); \
             a smaller positive value would hash no block"
        )
    );
    assert_eq!(
        decode(json!({"maxPrefixTokensToMatch": 64}))
            .unwrap()
            .max_blocks(),
        1
    );
    assert_eq!(
        decode(json!({"maxPrefixTokensToMatch": 131072}))
            .unwrap()
            .max_blocks(),
        2048
    );
}

#[test]
fn min_colocate_blocks_and_max_batch_size_bounds() {
    assert_eq!(
        rejected(json!({"minColocateBlocks": -1})).1,
        "minColocateBlocks must be >= 0 (got -1)"
    );
    assert_eq!(
        rejected(json!({"maxBatchSize": -5})).1,
        "maxBatchSize must be -1 (unlimited) or >= 1 (got -5)"
    );
    assert_eq!(
        decode(json!({"maxBatchSize": 1})).unwrap().batch_cap(),
        Some(1)
    );
}

#[test]
fn empty_balance_by_means_requests() {
    let config = decode(json!({"balanceBy": ""})).unwrap();
    assert_eq!(config.balance(), BalanceBy::Requests);
    assert_eq!(
        decode(json!({"balanceBy": "requests"})).unwrap().balance(),
        BalanceBy::Requests
    );
}

#[test]
fn unknown_field_rejected() {
    let (field, message) = rejected(json!({"windowDuration": 100}));
    assert_eq!(field, "windowDuration");
    assert!(
        message.contains("unknown field `windowDuration`"),
        "{message}"
    );
}

#[test]
fn wrong_type_rejected() {
    let (field, message) = rejected(json!({"windowDurationMs": "100"}));
    assert_eq!(field, "windowDurationMs");
    assert!(message.contains("invalid type"), "{message}");
}
