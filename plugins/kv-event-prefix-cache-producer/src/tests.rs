use switchyard_plugin_api::keys::{APPROX_PREFIX_CACHE_PRODUCER, PREFIX_CACHE_MATCH_INFO};
use switchyard_plugin_api::kv::{
    KvEvent, KvEventBatch, Medium, RemovedBlocks, Reset, ResetReason, StoredBlocks,
};
use switchyard_plugin_api::testing::{Attributes, Harness, TestEndpoint, TestRequest};
use switchyard_plugin_api::{AttrValue, DataKey, ErrorKind};

use super::FACTORY;

const BLOCK: u32 = 4;

fn harness(parameters: &str) -> Harness {
    Harness::new(&FACTORY, parameters).expect("valid parameters")
}

/// Tokens `start..start + blocks × BLOCK`.
fn tokens(start: u32, blocks: u32) -> Vec<u32> {
    (start..start + blocks * BLOCK).collect()
}

fn stored(hashes: &[u64], parent: Option<u64>, tokens: Vec<u32>) -> KvEvent {
    KvEvent::BlockStored(StoredBlocks {
        block_hashes: hashes.to_vec(),
        parent_block_hash: parent,
        token_ids: tokens,
        block_size: BLOCK,
        ..StoredBlocks::default()
    })
}

fn send(harness: &Harness, host_index: u32, now_ms: u64, events: Vec<KvEvent>) {
    harness
        .kv_events(&KvEventBatch {
            host_index,
            endpoint: format!("default/pod{}", host_index + 1),
            now_ms,
            events,
        })
        .expect("applied");
}

/// Matched blocks per endpoint for `request`, with `attrs` as the other producers' values.
fn matched_with(harness: &Harness, request: &TestRequest, attrs: &Attributes) -> Vec<u64> {
    let produced = harness
        .produce(request, &TestEndpoint::several(3), attrs)
        .expect("produces");
    produced
        .get(PREFIX_CACHE_MATCH_INFO)
        .expect("declared")
        .iter()
        .map(|v| v.prefix_cache_match().expect("written").match_blocks)
        .collect()
}

fn matched(harness: &Harness, request: &TestRequest) -> Vec<u64> {
    matched_with(harness, request, &Attributes::new())
}

fn prompt(blocks: u32) -> TestRequest {
    TestRequest::new("base-model").tokens(&tokens(0, blocks))
}

#[test]
fn a_stored_chain_matches_the_prompts_leading_blocks_on_that_endpoint_only() {
    let h = harness("null");
    assert!(h.wants_kv_events().unwrap());
    send(&h, 1, 0, vec![stored(&[11, 12], None, tokens(0, 2))]);
    // Three full blocks and a partial one: two are held by endpoint 1.
    let request = TestRequest::new("base-model").tokens(&tokens(0, 3)[..3 * 4 - 1]);
    assert_eq!(matched(&h, &request), [0, 2, 0]);
    // A continuation names its parent by engine hash and extends the chain.
    send(&h, 1, 0, vec![stored(&[13], Some(12), tokens(8, 1))]);
    assert_eq!(matched(&h, &prompt(4)), [0, 3, 0]);
    // Another prompt that diverges in its first block matches nothing.
    let other = TestRequest::new("base-model").tokens(&tokens(100, 3));
    assert_eq!(matched(&h, &other), [0, 0, 0]);
    let produced = h
        .produce(&prompt(4), &TestEndpoint::several(3), &Attributes::new())
        .unwrap();
    let info = produced.get(PREFIX_CACHE_MATCH_INFO).unwrap()[1]
        .prefix_cache_match()
        .unwrap();
    assert_eq!((info.total_blocks, info.block_size_tokens), (4, 4));
}

#[test]
fn an_event_whose_parent_is_unknown_is_dropped_and_counted() {
    let h = harness("null");
    send(&h, 0, 0, vec![stored(&[21], Some(999), tokens(4, 1))]);
    assert_eq!(matched(&h, &prompt(2)), [0, 0, 0]);
    let state = h.state().unwrap().unwrap();
    assert_eq!(state["endpoints"][0]["unknownParents"], 1);
}

#[test]
fn a_removal_by_engine_hash_cuts_the_chain_where_the_block_was() {
    let h = harness("null");
    send(&h, 0, 0, vec![stored(&[1, 2, 3], None, tokens(0, 3))]);
    assert_eq!(matched(&h, &prompt(3)), [3, 0, 0]);
    send(
        &h,
        0,
        0,
        vec![KvEvent::BlockRemoved(RemovedBlocks {
            block_hashes: vec![2, 77],
            medium: Medium::Gpu,
        })],
    );
    assert_eq!(matched(&h, &prompt(3)), [1, 0, 0]);
    let state = h.state().unwrap().unwrap();
    assert_eq!(state["endpoints"][0]["blocks"]["gpu"], 2);
    assert_eq!(state["endpoints"][0]["unknownRemovals"], 1);
}

#[test]
fn gpu_and_cpu_tiers_are_counted_apart() {
    let gpu_only = harness("null");
    let both = harness(r#"{"includeCpuTier": true}"#);
    for h in [&gpu_only, &both] {
        send(h, 0, 0, vec![stored(&[1, 2], None, tokens(0, 2))]);
        // Offloaded to CPU without tokens (the blocks are known), then evicted from GPU.
        let offload = KvEvent::BlockStored(StoredBlocks {
            block_hashes: vec![1, 2],
            parent_block_hash: None,
            block_size: BLOCK,
            medium: Medium::Cpu,
            ..StoredBlocks::default()
        });
        let evict = KvEvent::BlockRemoved(RemovedBlocks {
            block_hashes: vec![2],
            medium: Medium::Gpu,
        });
        send(h, 0, 0, vec![offload, evict]);
        let state = h.state().unwrap().unwrap();
        assert_eq!(state["endpoints"][0]["blocks"]["gpu"], 1);
        assert_eq!(state["endpoints"][0]["blocks"]["cpu"], 2);
    }
    assert_eq!(matched(&gpu_only, &prompt(2)), [1, 0, 0]);
    assert_eq!(matched(&both, &prompt(2)), [2, 0, 0]);
}

#[test]
fn cache_salt_and_lora_adapters_keep_their_blocks_apart() {
    let h = harness("null");
    let salted = KvEvent::BlockStored(StoredBlocks {
        block_hashes: vec![1, 2],
        token_ids: tokens(0, 2),
        block_size: BLOCK,
        extra_keys: vec![Some(vec!["tenant-a".into()]), None],
        ..StoredBlocks::default()
    });
    let adapter = KvEvent::BlockStored(StoredBlocks {
        block_hashes: vec![3, 4],
        token_ids: tokens(0, 2),
        block_size: BLOCK,
        lora_id: Some(1),
        lora_name: Some("sql-adapter".into()),
        extra_keys: vec![
            Some(vec!["sql-adapter".into()]),
            Some(vec!["sql-adapter".into()]),
        ],
        ..StoredBlocks::default()
    });
    send(&h, 0, 0, vec![salted]);
    send(&h, 1, 0, vec![adapter]);
    assert_eq!(matched(&h, &prompt(2)), [0, 0, 0]);
    assert_eq!(matched(&h, &prompt(2).cache_salt("tenant-a")), [2, 0, 0]);
    assert_eq!(matched(&h, &prompt(2).cache_salt("tenant-b")), [0, 0, 0]);
    let lora = TestRequest::new("sql-adapter").tokens(&tokens(0, 2));
    assert_eq!(matched(&h, &lora), [0, 2, 0]);
}

#[test]
fn all_blocks_cleared_empties_the_endpoint_and_nothing_else() {
    let h = harness("null");
    send(&h, 0, 0, vec![stored(&[1, 2], None, tokens(0, 2))]);
    send(&h, 1, 0, vec![stored(&[5, 6], None, tokens(0, 2))]);
    send(&h, 0, 0, vec![KvEvent::AllBlocksCleared]);
    assert_eq!(matched(&h, &prompt(2)), [0, 2, 0]);
    // The old engine hashes are gone too: a removal of one is unknown.
    send(
        &h,
        0,
        0,
        vec![KvEvent::BlockRemoved(RemovedBlocks {
            block_hashes: vec![1],
            medium: Medium::Gpu,
        })],
    );
    let state = h.state().unwrap().unwrap();
    assert_eq!(state["endpoints"][0]["unknownRemovals"], 1);
    assert_eq!(state["distinctBlocks"], 2);
}

#[test]
fn an_incomplete_index_falls_back_to_the_estimate_and_says_so_until_it_is_rebuilt() {
    let h = harness(r#"{"rebuildMs": 1000}"#);
    send(&h, 0, 0, vec![stored(&[1, 2], None, tokens(0, 2))]);
    let lost = KvEvent::Reset(Reset {
        reason: ResetReason::Gap,
        known: false,
    });
    send(&h, 0, 5_000, vec![lost, stored(&[1], None, tokens(0, 1))]);
    let estimate = Attributes::new().set(
        DataKey::new(PREFIX_CACHE_MATCH_INFO, APPROX_PREFIX_CACHE_PRODUCER),
        vec![Attributes::prefix_match(7, 8, 64); 3],
    );
    let request = prompt(2).now_ms(5_500).explain(true);
    assert_eq!(matched_with(&h, &request, &estimate), [7, 0, 0]);
    let produced = h
        .produce(&request, &TestEndpoint::several(3), &estimate)
        .unwrap();
    let sources = produced.get(super::PREFIX_CACHE_SOURCE).unwrap();
    let AttrValue::Custom(text) = &sources[0] else {
        panic!("no note: {:?}", sources[0]);
    };
    let text = String::from_utf8(text.to_vec()).unwrap();
    assert!(
        text.contains("approx-prefix-cache-producer") && text.contains("gap"),
        "{text}"
    );
    assert!(sources[1].is_absent(), "exact endpoints carry no note");
    // Without an estimate, what was rebuilt so far is the answer.
    assert_eq!(matched(&h, &prompt(2).now_ms(5_500)), [1, 0, 0]);
    // Once rebuilt for rebuildMs, the index is trusted again.
    assert_eq!(
        matched_with(&h, &prompt(2).now_ms(6_000), &estimate),
        [1, 0, 0]
    );
}

#[test]
fn an_operator_reset_empties_the_endpoint_and_keeps_it_exact() {
    let h = harness("null");
    send(&h, 2, 0, vec![stored(&[1, 2], None, tokens(0, 2))]);
    let reset = KvEvent::Reset(Reset {
        reason: ResetReason::Admin,
        known: true,
    });
    send(&h, 2, 10, vec![reset]);
    let estimate = Attributes::new().set(
        DataKey::new(PREFIX_CACHE_MATCH_INFO, APPROX_PREFIX_CACHE_PRODUCER),
        vec![Attributes::prefix_match(7, 8, 64); 3],
    );
    assert_eq!(
        matched_with(&h, &prompt(2).now_ms(20), &estimate),
        [0, 0, 0]
    );
    assert_eq!(
        h.state().unwrap().unwrap()["endpoints"][0]["status"],
        "exact"
    );
}

#[test]
fn many_endpoints_past_64_are_matched() {
    let h = harness("null");
    send(&h, 130, 0, vec![stored(&[1, 2], None, tokens(0, 2))]);
    send(&h, 3, 0, vec![stored(&[8], None, tokens(0, 1))]);
    let endpoints: Vec<_> = (0..131u32)
        .map(|i| TestEndpoint::new(&format!("e{i}")).host_index(i))
        .collect();
    let produced = h
        .produce(&prompt(2), &endpoints, &Attributes::new())
        .unwrap();
    let values = produced.get(PREFIX_CACHE_MATCH_INFO).unwrap();
    let blocks: Vec<u64> = values
        .iter()
        .map(|v| v.prefix_cache_match().unwrap().match_blocks)
        .collect();
    assert_eq!(blocks[130], 2);
    assert_eq!(blocks[3], 1);
    assert_eq!(blocks.iter().sum::<u64>(), 3);
}

#[test]
fn bad_parameters_name_the_field_and_the_range() {
    for (parameters, field) in [
        (r#"{"blockSizeTokens": 0}"#, "blockSizeTokens"),
        (r#"{"maxPrefixBlocksToMatch": 0}"#, "maxPrefixBlocksToMatch"),
        (r#"{"rebuildMs": -1}"#, "rebuildMs"),
    ] {
        let error = Harness::new(&FACTORY, parameters).err().expect(parameters);
        assert_eq!(error.kind, ErrorKind::InvalidParameter);
        assert_eq!(error.field.as_str(), field);
        assert!(error.message.contains(field), "{}", error.message);
    }
}

#[test]
fn a_text_prompt_takes_the_estimate_and_says_why() {
    use switchyard_plugin_api::keys::{TOKENIZED_PROMPT, TOKEN_PRODUCER};
    let h = harness("null");
    send(&h, 0, 0, vec![stored(&[1, 2], None, tokens(0, 2))]);
    let estimated = Attributes::new()
        .set(
            DataKey::new(TOKENIZED_PROMPT, TOKEN_PRODUCER),
            vec![AttrValue::Custom(Default::default()); 3],
        )
        .set(
            DataKey::new(PREFIX_CACHE_MATCH_INFO, APPROX_PREFIX_CACHE_PRODUCER),
            vec![Attributes::prefix_match(5, 8, 64); 3],
        );
    let request = prompt(2).explain(true);
    assert_eq!(matched_with(&h, &request, &estimated), [5, 5, 5]);
    let produced = h
        .produce(&request, &TestEndpoint::several(3), &estimated)
        .unwrap();
    let AttrValue::Custom(text) = &produced.get(super::PREFIX_CACHE_SOURCE).unwrap()[0] else {
        panic!("no note");
    };
    let text = String::from_utf8(text.to_vec()).unwrap();
    assert!(text.contains("a text prompt"), "{text}");
    // Token ids the client sent are matched exactly.
    assert_eq!(matched(&h, &prompt(2)), [2, 0, 0]);
}
