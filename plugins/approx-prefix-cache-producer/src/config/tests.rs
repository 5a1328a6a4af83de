use serde_json::json;

use switchyard_plugin_api::{ErrorKind, PluginError};

use super::{ApproxPrefixCacheConfig, MIN_BLOCK_SIZE_TOKENS};

fn parse(params: serde_json::Value) -> Result<ApproxPrefixCacheConfig, PluginError> {
    ApproxPrefixCacheConfig::parse(&params.to_string())
}

fn rejected(params: serde_json::Value) -> (String, String) {
    let error = parse(params).expect_err("parameters should be rejected");
    assert_eq!(error.kind, ErrorKind::InvalidParameter);
    (error.field.into(), error.message.into())
}

#[test]
fn defaults_match_the_reference() {
    let config = ApproxPrefixCacheConfig::default();
    assert!(config.auto_tune);
    assert_eq!(config.block_size_tokens, 16);
    assert_eq!(config.block_size, 0);
    assert_eq!(config.max_prefix_blocks_to_match, 2048);
    assert_eq!(config.max_prefix_tokens_to_match, 131_072);
    assert_eq!(config.lru_capacity_per_server, 31_250);
    assert_eq!(MIN_BLOCK_SIZE_TOKENS, 64);
}

#[test]
fn null_and_empty_object_decode_to_defaults() {
    assert_eq!(
        parse(json!(null)).unwrap(),
        ApproxPrefixCacheConfig::default()
    );
    assert_eq!(
        parse(json!({})).unwrap(),
        ApproxPrefixCacheConfig::default()
    );
    assert_eq!(
        ApproxPrefixCacheConfig::parse("").unwrap(),
        ApproxPrefixCacheConfig::default()
    );
}

#[test]
fn given_fields_override_only_themselves() {
    let config = parse(json!({"autoTune": false, "lruCapacityPerServer": 500})).unwrap();
    assert_eq!(
        config,
        ApproxPrefixCacheConfig {
            auto_tune: false,
            lru_capacity_per_server: 500,
            ..ApproxPrefixCacheConfig::default()
        }
    );
}

#[test]
fn unknown_fields_are_rejected() {
    let (field, message) = rejected(json!({"blockSizeToken": 64}));
    assert_eq!(field, "blockSizeToken");
    assert!(
        message.starts_with("unknown field `blockSizeToken`"),
        "{message}"
    );
}

#[test]
fn wrong_types_are_rejected() {
    let (field, message) = rejected(json!({"autoTune": "yes"}));
    assert_eq!(field, "autoTune");
    assert!(
        message.contains("invalid type: string \"yes\", expected a boolean"),
        "{message}"
    );
}

#[test]
fn each_field_reports_its_value_and_range() {
    let cases = [
        (
            json!({"blockSizeTokens": 0}),
            "blockSizeTokens",
            "blockSizeTokens must be in 1..=4294967295 (got 0)",
        ),
        (
            json!({"blockSizeTokens": -3, "autoTune": true}),
            "blockSizeTokens",
            "blockSizeTokens must be in 1..=4294967295 (got -3)",
        ),
        (
            json!({"blockSizeTokens": 4_294_967_296_i64}),
            "blockSizeTokens",
            "blockSizeTokens must be in 1..=4294967295 (got 4294967296)",
        ),
        (
            json!({"blockSize": -1}),
            "blockSize",
            "blockSize must be in 0..=4294967295 (got -1)",
        ),
        (
            json!({"maxPrefixBlocksToMatch": -1}),
            "maxPrefixBlocksToMatch",
            "maxPrefixBlocksToMatch must be >= 0 (got -1)",
        ),
        (
            json!({"maxPrefixTokensToMatch": -64}),
            "maxPrefixTokensToMatch",
            "maxPrefixTokensToMatch must be >= 0 (got -64)",
        ),
        (
            json!({"lruCapacityPerServer": 0}),
            "lruCapacityPerServer",
            "lruCapacityPerServer must be >= 1 (got 0)",
        ),
        (
            json!({"lruCapacityPerServer": -5}),
            "lruCapacityPerServer",
            "lruCapacityPerServer must be >= 1 (got -5)",
        ),
    ];
    for (params, field, message) in cases {
        assert_eq!(rejected(params), (field.to_owned(), message.to_owned()));
    }
}

#[test]
fn the_first_failing_field_in_declaration_order_wins() {
    let (field, _) = rejected(
        json!({"lruCapacityPerServer": 0, "maxPrefixTokensToMatch": -1, "blockSizeTokens": 0}),
    );
    assert_eq!(field, "blockSizeTokens");
    let (field, _) = rejected(json!({"lruCapacityPerServer": 0, "maxPrefixTokensToMatch": -1}));
    assert_eq!(field, "maxPrefixTokensToMatch");
}

#[test]
fn zero_limits_are_accepted() {
    let config = parse(json!({"maxPrefixBlocksToMatch": 0, "maxPrefixTokensToMatch": 0})).unwrap();
    assert_eq!(config.max_blocks(64), usize::MAX);
}

#[test]
fn effective_block_size_prefers_the_reported_size_under_auto_tune() {
    let config = ApproxPrefixCacheConfig::default();
    assert_eq!(config.effective_block_size(Some(128)), 128);
    assert_eq!(
        config.effective_block_size(Some(16)),
        64,
        "raised to the minimum"
    );
    assert_eq!(
        config.effective_block_size(Some(0)),
        64,
        "0 reports nothing"
    );
    assert_eq!(
        config.effective_block_size(None),
        64,
        "configured 16, raised to 64"
    );

    let fixed = parse(json!({"autoTune": false, "blockSizeTokens": 256})).unwrap();
    assert_eq!(fixed.effective_block_size(Some(128)), 256);
    assert_eq!(fixed.effective_block_size(None), 256);
}

#[test]
fn deprecated_block_size_applies_only_while_block_size_tokens_is_default() {
    let legacy = parse(json!({"autoTune": false, "blockSize": 100})).unwrap();
    assert_eq!(legacy.effective_block_size(None), 100);
    let both = parse(json!({"autoTune": false, "blockSize": 100, "blockSizeTokens": 128})).unwrap();
    assert_eq!(both.effective_block_size(None), 128);
    let small = parse(json!({"autoTune": false, "blockSize": 32})).unwrap();
    assert_eq!(small.effective_block_size(None), 64);
}

#[test]
fn max_blocks_follows_the_token_limit_then_the_block_limit() {
    let config = ApproxPrefixCacheConfig::default();
    assert_eq!(config.max_blocks(64), 2048);
    assert_eq!(config.max_blocks(128), 1024);
    assert_eq!(config.max_blocks(100), 1310);

    let blocks_only =
        parse(json!({"maxPrefixTokensToMatch": 0, "maxPrefixBlocksToMatch": 7})).unwrap();
    assert_eq!(blocks_only.max_blocks(64), 7);

    let tokens_win =
        parse(json!({"maxPrefixTokensToMatch": 640, "maxPrefixBlocksToMatch": 7})).unwrap();
    assert_eq!(tokens_win.max_blocks(64), 10);
}

#[test]
fn a_token_limit_below_one_block_still_matches_one_block() {
    let config = parse(json!({"maxPrefixTokensToMatch": 32})).unwrap();
    assert_eq!(config.max_blocks(64), 1);
    assert_eq!(config.max_blocks(128), 1);
}

#[test]
fn lru_capacity_converts_server_blocks_to_our_blocks() {
    let config = ApproxPrefixCacheConfig::default();
    assert_eq!(config.lru_capacity(Some(1000), Some(16), 64), 250);
    assert_eq!(config.lru_capacity(Some(1000), Some(128), 128), 1000);
    assert_eq!(
        config.lru_capacity(Some(3), Some(16), 64),
        1,
        "never below one block"
    );
}

#[test]
fn lru_capacity_falls_back_to_the_configured_value() {
    let config = ApproxPrefixCacheConfig::default();
    assert_eq!(config.lru_capacity(None, Some(16), 64), 31_250);
    assert_eq!(
        config.lru_capacity(Some(1000), None, 64),
        31_250,
        "unknown server block size"
    );
    assert_eq!(config.lru_capacity(Some(0), Some(16), 64), 31_250);

    let fixed = parse(json!({"autoTune": false, "lruCapacityPerServer": 900})).unwrap();
    assert_eq!(fixed.lru_capacity(Some(1000), Some(16), 64), 900);
}
