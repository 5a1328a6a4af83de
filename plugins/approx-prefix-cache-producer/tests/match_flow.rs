//! Tokens to match counts through the public API: configured block size and limits, chained
//! hashing, recording on dispatch, matching the next request.

use approx_prefix_cache_producer::config::ApproxPrefixCacheConfig;
use approx_prefix_cache_producer::index::{PrefixIndex, PromptHashes};
use switchyard_prefix_hashing::{hash_prompt_into, prompt_seed};

fn hash_request(
    config: &ApproxPrefixCacheConfig,
    server_block_size: Option<u32>,
    prompts: &[&[u32]],
    out: &mut PromptHashes,
) -> u32 {
    let block = config.effective_block_size(server_block_size);
    let max_blocks = config.max_blocks(block);
    let seed = prompt_seed("test-model", "");
    out.clear();
    for tokens in prompts {
        out.push_prompt_with(|hashes| {
            hash_prompt_into(seed, tokens, block as usize, max_blocks, hashes);
        });
    }
    block
}

#[test]
fn a_request_sharing_two_blocks_matches_two_on_the_endpoint_that_served_the_first() {
    let config = ApproxPrefixCacheConfig::default();
    let first: Vec<u32> = (0..200).collect();
    let mut second = first.clone();
    second[130] = 999_999;

    let mut index = PrefixIndex::new();
    let mut request = PromptHashes::new();
    let block = hash_request(&config, Some(16), &[&first], &mut request);
    assert_eq!(block, 64);
    assert_eq!(
        request.total_blocks(),
        4,
        "three full blocks and a partial one"
    );
    let capacity = config.lru_capacity(Some(4096), Some(16), block);
    assert_eq!(capacity, 1024);
    index.record(1, "ns/pod-b", capacity, &request);

    hash_request(&config, Some(16), &[&second], &mut request);
    let mut matched = [0; 3];
    index.match_into(&request, &mut matched);
    assert_eq!(matched, [0, 2, 0]);
    assert_eq!(request.total_blocks(), 4);
}

#[test]
fn the_token_limit_caps_hashed_and_matched_blocks() {
    let config = ApproxPrefixCacheConfig::parse(r#"{"maxPrefixTokensToMatch": 128}"#).unwrap();
    let tokens: Vec<u32> = (0..1000).collect();
    let mut index = PrefixIndex::new();
    let mut request = PromptHashes::new();
    hash_request(&config, None, &[&tokens], &mut request);
    assert_eq!(request.total_blocks(), 2);
    index.record(0, "ns/pod-a", 100, &request);
    let mut matched = [0; 1];
    index.match_into(&request, &mut matched);
    assert_eq!(matched, [2]);
}
