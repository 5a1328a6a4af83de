use serde_json::Value;
use switchyard_plugin_api::keys::{
    APPROX_PREFIX_CACHE_PRODUCER, BLOCK_CONTENT_HASHES, PREFIX_CACHE_MATCH_INFO,
};
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

fn removed(hashes: &[u64], medium: Medium) -> KvEvent {
    KvEvent::BlockRemoved(RemovedBlocks {
        block_hashes: hashes.to_vec(),
        medium,
    })
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
    send(&h, 0, 0, vec![removed(&[2, 77], Medium::Gpu)]);
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
        let evict = removed(&[2], Medium::Gpu);
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
    send(&h, 0, 0, vec![removed(&[1], Medium::Gpu)]);
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
    // 70 first, so the index widens again for 130 with a second word already in use.
    send(&h, 70, 0, vec![stored(&[5, 6], None, tokens(0, 2))]);
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
    assert_eq!(blocks[70], 2);
    assert_eq!(blocks[3], 1);
    assert_eq!(blocks.iter().sum::<u64>(), 5);
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
    let request = prompt(2).explain(true);
    // The host marks estimated ids with a custom value: empty, or naming why.
    let note_on = |host_note: &[u8]| {
        let estimated = Attributes::new()
            .set(
                DataKey::new(TOKENIZED_PROMPT, TOKEN_PRODUCER),
                vec![AttrValue::Custom(host_note.into()); 3],
            )
            .set(
                DataKey::new(PREFIX_CACHE_MATCH_INFO, APPROX_PREFIX_CACHE_PRODUCER),
                vec![Attributes::prefix_match(5, 8, 64); 3],
            );
        assert_eq!(matched_with(&h, &request, &estimated), [5, 5, 5]);
        let produced = h
            .produce(&request, &TestEndpoint::several(3), &estimated)
            .unwrap();
        let AttrValue::Custom(text) = &produced.get(super::PREFIX_CACHE_SOURCE).unwrap()[0] else {
            panic!("no note");
        };
        String::from_utf8(text.to_vec()).unwrap()
    };
    let text = note_on(b"");
    assert!(text.contains("a text prompt"), "{text}");
    assert!(text.ends_with("which no engine stored"), "{text}");
    let text = note_on(b"estimated: chat: no chat template");
    assert!(
        text.ends_with("which no engine stored (estimated: chat: no chat template)"),
        "{text}"
    );
    // Token ids the client sent are matched exactly.
    assert_eq!(matched(&h, &prompt(2)), [2, 0, 0]);
}

/// Host indices the takeover tests ask about: past 64 too, so the holder sets are two words.
const TAKEOVER_HOSTS: [u32; 6] = [0, 1, 2, 3, 4, 70];

/// Everything `harness` answers for `request` on [`TAKEOVER_HOSTS`], with an estimate
/// standing by: match info and notes per endpoint.
fn answers(harness: &Harness, request: &TestRequest) -> Vec<(AttrValue, AttrValue)> {
    let endpoints: Vec<_> = TAKEOVER_HOSTS
        .iter()
        .map(|&i| TestEndpoint::new(&format!("e{i}")).host_index(i))
        .collect();
    let estimate = Attributes::new().set(
        DataKey::new(PREFIX_CACHE_MATCH_INFO, APPROX_PREFIX_CACHE_PRODUCER),
        vec![Attributes::prefix_match(7, 8, 64); endpoints.len()],
    );
    let produced = harness
        .produce(request, &endpoints, &estimate)
        .expect("produces");
    let infos = produced.get(PREFIX_CACHE_MATCH_INFO).expect("declared");
    let notes = produced.get(super::PREFIX_CACHE_SOURCE).expect("declared");
    infos.iter().cloned().zip(notes.iter().cloned()).collect()
}

/// An index with every kind of entry: chains on several endpoints, a salted chain, an
/// adapter's chain, a block offloaded to CPU, a block stored twice, an endpoint rebuilding
/// after a gap, one that only heard of a gap, and dropped events counted.
fn varied_index(h: &Harness) {
    send(h, 0, 0, vec![stored(&[1, 2, 3], None, tokens(0, 3))]);
    send(h, 0, 0, vec![stored(&[9], Some(999), tokens(40, 1))]);
    let salted = KvEvent::BlockStored(StoredBlocks {
        block_hashes: vec![11, 12],
        token_ids: tokens(0, 2),
        block_size: BLOCK,
        extra_keys: vec![Some(vec!["tenant-a".into()]), None],
        ..StoredBlocks::default()
    });
    let adapter = KvEvent::BlockStored(StoredBlocks {
        block_hashes: vec![13, 14],
        token_ids: tokens(0, 2),
        block_size: BLOCK,
        lora_id: Some(1),
        lora_name: Some("sql-adapter".into()),
        extra_keys: vec![Some(vec!["sql-adapter".into()]), None],
        ..StoredBlocks::default()
    });
    send(h, 1, 0, vec![salted, adapter]);
    let offload = KvEvent::BlockStored(StoredBlocks {
        block_hashes: vec![21, 22],
        block_size: BLOCK,
        medium: Medium::Cpu,
        ..StoredBlocks::default()
    });
    send(
        h,
        2,
        0,
        vec![
            stored(&[21, 22], None, tokens(0, 2)),
            stored(&[21], None, tokens(0, 1)),
            offload,
            removed(&[22, 404], Medium::Gpu),
        ],
    );
    let gap = || {
        KvEvent::Reset(Reset {
            reason: ResetReason::Gap,
            known: false,
        })
    };
    send(h, 3, 1_000, vec![gap()]);
    send(h, 4, 1_000, vec![gap(), stored(&[31], None, tokens(0, 1))]);
    send(
        h,
        70,
        0,
        vec![stored(&[41, 42, 43, 44], None, tokens(0, 4))],
    );
}

/// Requests that tell the entries apart: plain, salted, under the adapter, diverging, and
/// one explained while endpoints 3 and 4 are still rebuilding.
fn takeover_requests() -> Vec<TestRequest> {
    vec![
        prompt(4).now_ms(100_000),
        prompt(2).cache_salt("tenant-a").now_ms(100_000),
        prompt(2).cache_salt("tenant-b").now_ms(100_000),
        TestRequest::new("sql-adapter")
            .tokens(&tokens(0, 2))
            .now_ms(100_000),
        TestRequest::new("base-model")
            .tokens(&tokens(100, 3))
            .now_ms(100_000),
        prompt(3).now_ms(1_500).explain(true),
    ]
}

#[test]
fn a_successor_with_other_parameters_takes_the_whole_index_over() {
    let h = harness(r#"{"rebuildMs": 10000}"#);
    varied_index(&h);
    let exported = h.export_state().expect("exports").expect("an index");
    assert_eq!(exported["format"], 1);
    assert_eq!(exported["loras"], serde_json::json!(["sql-adapter"]));
    let ep2 = &exported["endpoints"][2];
    assert_eq!(ep2["hostIndex"], 2, "{exported}");
    // Blocks 21 and 22 offloaded, 22 evicted from GPU, 21 stored twice there: one record per
    // block and tier, 32 hex digits each, and the second store of 21 as a repeat.
    assert_eq!(ep2["blocks"]["gpu"].as_str().unwrap().len(), 32, "{ep2}");
    assert_eq!(ep2["blocks"]["cpu"].as_str().unwrap().len(), 64, "{ep2}");
    assert_eq!(
        ep2["repeats"],
        serde_json::json!([{"tier": "gpu", "engineHash": format!("{:016x}", 21), "stores": 2}])
    );
    // An endpoint that only heard of a gap keeps no block size of its own.
    assert_eq!(exported["endpoints"][3]["blockSizeTokens"], Value::Null);

    // Another default block size, rebuild window and match limit: none keys entries.
    let successor =
        harness(r#"{"blockSizeTokens": 8, "rebuildMs": 20000, "maxPrefixBlocksToMatch": 64}"#);
    successor.import_state(&exported).expect("takes it over");
    for request in takeover_requests() {
        let (before, after) = (answers(&h, &request), answers(&successor, &request));
        for position in [0, 1, 2, 4, 5] {
            assert_eq!(after[position], before[position], "position {position}");
        }
        // Endpoint 3 was sized by the default, which the successor changed; while it
        // rebuilds, both answer with the estimate.
        if after[3].1.is_absent() {
            let sized = after[3].0.prefix_cache_match().expect("written");
            assert_eq!(sized.block_size_tokens, 8);
        } else {
            assert_eq!(after[3], before[3]);
        }
    }
    let explained = answers(&successor, &takeover_requests()[5]);
    let AttrValue::Custom(note) = &explained[4].1 else {
        panic!("endpoint 4 still rebuilds: {:?}", explained[4]);
    };
    assert!(String::from_utf8_lossy(note).contains("gap"));
    assert_eq!(
        matched(&successor, &prompt(4).now_ms(100_000)),
        [3, 0, 1],
        "a non-empty index"
    );

    let (mut before, after) = (
        h.state().unwrap().unwrap(),
        successor.state().unwrap().unwrap(),
    );
    before["endpoints"][3]["blockSizeTokens"] = 8.into();
    assert_eq!(after, before);
    assert_eq!(successor.export_state().unwrap(), Some(exported));
}

#[test]
fn removals_and_continuations_by_engine_hash_resolve_after_a_takeover() {
    let h = harness("null");
    varied_index(&h);
    let successor = harness(r#"{"includeCpuTier": true}"#);
    successor
        .import_state(&h.export_state().unwrap().unwrap())
        .expect("takes it over");
    // Block 21 was stored twice on GPU: it is held until removed twice.
    let state_of = |h: &Harness, i: usize| h.state().unwrap().unwrap()["endpoints"][i].clone();
    assert_eq!(state_of(&successor, 2)["blocks"]["gpu"], 1);
    assert_eq!(state_of(&successor, 2)["blocks"]["cpu"], 2);
    send(&successor, 2, 0, vec![removed(&[21], Medium::Gpu)]);
    assert_eq!(state_of(&successor, 2)["blocks"]["gpu"], 1);
    send(&successor, 2, 0, vec![removed(&[21], Medium::Gpu)]);
    assert_eq!(state_of(&successor, 2)["blocks"]["gpu"], 0);
    // The CPU copies still count with includeCpuTier.
    assert_eq!(matched(&successor, &prompt(2)), [2, 0, 2]);
    send(&successor, 2, 0, vec![removed(&[21, 22], Medium::Cpu)]);
    assert_eq!(state_of(&successor, 2)["engineKeys"], 0);
    assert_eq!(state_of(&successor, 2)["unknownRemovals"], 1, "none new");

    // A removal in the middle of endpoint 0's chain cuts it there...
    send(&successor, 0, 0, vec![removed(&[2], Medium::Gpu)]);
    assert_eq!(matched(&successor, &prompt(3))[0], 1);
    // ...and a store naming a carried block as its parent fills the gap again, under a new
    // engine hash.
    send(&successor, 0, 0, vec![stored(&[5], Some(1), tokens(4, 1))]);
    assert_eq!(matched(&successor, &prompt(3))[0], 3);
    let ep0 = state_of(&successor, 0);
    assert_eq!(
        ep0["unknownParents"], 1,
        "only the one counted before: {ep0}"
    );
    assert_eq!(ep0["unknownRemovals"], 0, "{ep0}");
    // The adapter's blocks on endpoint 1 are removed by their engine hashes too.
    send(&successor, 1, 0, vec![removed(&[13, 14], Medium::Gpu)]);
    let lora = TestRequest::new("sql-adapter").tokens(&tokens(0, 2));
    assert_eq!(matched(&successor, &lora), [0, 0, 0]);
    assert_eq!(state_of(&successor, 1)["blocks"]["gpu"], 2);
}

#[test]
fn an_index_keyed_otherwise_is_refused_naming_what_differs() {
    let h = harness("null");
    varied_index(&h);
    let exported = h.export_state().unwrap().unwrap();
    let ours = exported["keyProbe"].as_str().unwrap().to_owned();
    assert_eq!(ours.len(), 16);

    let successor = harness("null");
    let mut other_hashing = exported.clone();
    other_hashing["keyProbe"] = "0123456789abcdef".into();
    let refused = successor.import_state(&other_hashing).unwrap_err();
    assert!(
        refused.message.contains("keyProbe = 0123456789abcdef")
            && refused.message.contains(&format!("keyProbe = {ours}")),
        "{refused}"
    );
    let mut other_layout = exported.clone();
    other_layout["format"] = 2.into();
    let refused = successor.import_state(&other_layout).unwrap_err();
    assert!(
        refused.message.contains("format = 2") && refused.message.contains("format = 1"),
        "{refused}"
    );
    assert_eq!(
        matched(&successor, &prompt(4)),
        [0, 0, 0],
        "nothing taken over"
    );
    assert_eq!(
        successor.state().unwrap().unwrap()["endpoints"],
        serde_json::json!([])
    );
}

#[test]
fn a_garbled_index_is_refused_and_the_instance_keeps_working() {
    let h = harness("null");
    send(&h, 0, 0, vec![stored(&[1, 2], None, tokens(0, 2))]);
    let exported = h.export_state().unwrap().unwrap();
    let gpu = exported["endpoints"][0]["blocks"]["gpu"]
        .as_str()
        .unwrap()
        .to_owned();
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut value = exported.clone();
        edit(&mut value);
        value
    };
    let record = |engine: u64, ours: &str| format!("{engine:016x}{ours}");
    let garbled = [
        serde_json::json!("an index"),
        with(&|v| {
            v.as_object_mut().unwrap().remove("endpoints");
        }),
        with(&|v| v["endpoints"][0]["blocks"]["gpu"] = "12z4".into()),
        with(&|v| v["endpoints"][0]["blocks"]["gpu"] = format!("+{}", &gpu[1..]).into()),
        with(&|v| v["endpoints"][0]["blocks"]["gpu"] = "é".repeat(16).into()),
        // Engine block 1 under two request keys.
        with(&|v| {
            v["endpoints"][0]["blocks"]["cpu"] = record(1, &"f".repeat(16)).into();
        }),
        with(&|v| {
            v["endpoints"][0]["repeats"] = serde_json::json!([{"tier": "cpu", "engineHash": format!("{:016x}", 1), "stores": 2}]);
        }),
        with(&|v| v["endpoints"][0]["status"] = "fine".into()),
        with(&|v| {
            let copy = v["endpoints"][0].clone();
            v["endpoints"].as_array_mut().unwrap().push(copy);
        }),
    ];
    let successor = harness("null");
    send(&successor, 1, 0, vec![stored(&[7], None, tokens(0, 1))]);
    for value in &garbled {
        let refused = successor.import_state(value).expect_err("garbled");
        assert!(
            refused.message.contains("not an exported KV-event index"),
            "{value}: {refused}"
        );
        // What the instance held stays, and it goes on taking events.
        assert_eq!(matched(&successor, &prompt(2)), [0, 1, 0], "{value}");
    }
    send(&successor, 2, 0, vec![stored(&[8, 9], None, tokens(0, 2))]);
    assert_eq!(matched(&successor, &prompt(2)), [0, 1, 2]);
}

/// Engines of `BLOCK` tokens per block, before any event tells it.
const BLOCK_PARAMETERS: &str = r#"{"blockSizeTokens": 4}"#;

/// Produces for `request` (as the host does before dispatching it) and dispatches it to
/// endpoint `slot` of three.
fn produce_and_dispatch(h: &Harness, request: &TestRequest, slot: usize) {
    let endpoints = TestEndpoint::several(3);
    h.produce(request, &endpoints, &Attributes::new())
        .expect("produces");
    h.dispatched(request, &endpoints[slot], slot)
        .expect("dispatched");
}

fn complete(h: &Harness, request: &TestRequest, slot: usize) {
    let endpoints = TestEndpoint::several(3);
    h.completed(
        request,
        &endpoints[slot],
        slot,
        switchyard_plugin_api::Outcome::Finished,
    )
    .expect("completed");
}

/// A count of endpoint `host_index` in the state, 0 for an endpoint the state leaves out.
fn endpoint_count(h: &Harness, host_index: usize, field: &str) -> u64 {
    let state = h.state().unwrap().unwrap();
    state["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["hostIndex"] == host_index)
        .map_or(0, |e| e[field].as_u64().unwrap())
}

fn in_flight_keys(h: &Harness, host_index: usize) -> u64 {
    endpoint_count(h, host_index, "inFlightKeys")
}

#[test]
fn a_dispatched_requests_blocks_count_on_its_endpoint_until_it_completes() {
    let h = harness(BLOCK_PARAMETERS);
    let first = prompt(3).id("first");
    let second = prompt(3).id("second");
    produce_and_dispatch(&h, &first, 1);
    // Queued at endpoint 1, not yet prefilled: its engine announced nothing, yet the next
    // request for the same prompt finds it there.
    assert_eq!(matched(&h, &second), [0, 3, 0]);
    assert_eq!(in_flight_keys(&h, 1), 3);
    // Its engine stores the blocks, it completes: the events alone answer.
    send(&h, 1, 0, vec![stored(&[1, 2], None, tokens(0, 2))]);
    complete(&h, &first, 1);
    assert_eq!(matched(&h, &second), [0, 2, 0]);
    assert_eq!(in_flight_keys(&h, 1), 0);
}

#[test]
fn only_blocks_the_endpoint_lacks_are_counted_and_a_prefix_it_holds_costs_nothing() {
    let h = harness(BLOCK_PARAMETERS);
    send(&h, 0, 0, vec![stored(&[1, 2], None, tokens(0, 2))]);
    let whole = prompt(2).id("whole");
    produce_and_dispatch(&h, &whole, 0);
    assert_eq!(in_flight_keys(&h, 0), 0, "a prompt held whole adds nothing");
    let longer = prompt(4).id("longer");
    produce_and_dispatch(&h, &longer, 0);
    assert_eq!(
        in_flight_keys(&h, 0),
        2,
        "the two blocks beyond the held ones"
    );
    // Two requests in flight carry the same new blocks: both must complete to release them.
    let again = prompt(4).id("again");
    produce_and_dispatch(&h, &again, 0);
    complete(&h, &longer, 0);
    assert_eq!(matched(&h, &prompt(4)), [4, 0, 0]);
    complete(&h, &again, 0);
    assert_eq!(matched(&h, &prompt(4)), [2, 0, 0]);
    // A request produced for as part of another call (not the last one produced) is hashed
    // afresh at its dispatch.
    let other = prompt(3).id("other");
    let endpoints = TestEndpoint::several(3);
    h.produce(&other, &endpoints, &Attributes::new()).unwrap();
    h.produce(&whole, &endpoints, &Attributes::new()).unwrap();
    h.dispatched(&other, &endpoints[2], 2).unwrap();
    assert_eq!(matched(&h, &prompt(3)), [2, 0, 3]);
}

#[test]
fn in_flight_blocks_go_with_a_cleared_endpoint_and_can_be_turned_off() {
    let h = harness(BLOCK_PARAMETERS);
    let first = prompt(3).id("first");
    produce_and_dispatch(&h, &first, 2);
    send(&h, 2, 0, vec![KvEvent::AllBlocksCleared]);
    assert_eq!(matched(&h, &prompt(3)), [0, 0, 0]);
    complete(&h, &first, 2);
    assert_eq!(in_flight_keys(&h, 2), 0);

    let off = harness(r#"{"blockSizeTokens": 4, "inFlightBlocks": false}"#);
    produce_and_dispatch(&off, &first, 2);
    assert_eq!(matched(&off, &prompt(3)), [0, 0, 0]);
}

#[test]
fn a_request_id_dispatched_again_before_it_completed_leaves_no_count_behind() {
    let h = harness(BLOCK_PARAMETERS);
    let request = prompt(3).id("same");
    produce_and_dispatch(&h, &request, 0);
    produce_and_dispatch(&h, &request, 1);
    assert_eq!(
        in_flight_keys(&h, 0),
        0,
        "the first count went with the second dispatch"
    );
    complete(&h, &request, 1);
    assert_eq!((in_flight_keys(&h, 0), in_flight_keys(&h, 1)), (0, 0));
    assert_eq!(matched(&h, &prompt(3)), [0, 0, 0]);
}

#[test]
fn a_request_whose_token_ids_were_estimated_counts_nothing_in_flight() {
    use switchyard_plugin_api::keys::{TOKENIZED_PROMPT, TOKEN_PRODUCER};
    let h = harness(BLOCK_PARAMETERS);
    let endpoints = TestEndpoint::several(3);
    let estimated = Attributes::new().set(
        DataKey::new(TOKENIZED_PROMPT, TOKEN_PRODUCER),
        vec![AttrValue::Custom(b"estimated"[..].into()); 3],
    );
    let request = prompt(3).id("text");
    h.produce(&request, &endpoints, &estimated).unwrap();
    h.dispatched(&request, &endpoints[0], 0).unwrap();
    // No engine stores the host's estimate: counting it would only make other estimates match.
    assert_eq!(in_flight_keys(&h, 0), 0);
    complete(&h, &request, 0);
}

fn pending_blocks(h: &Harness, host_index: usize) -> u64 {
    endpoint_count(h, host_index, "pendingBlocks")
}

#[test]
fn blocks_not_stored_yet_are_pending_and_a_prompts_short_last_block_never_is() {
    let h = harness(BLOCK_PARAMETERS);
    // Two full blocks and a short third: the engine will store two.
    let short = TestRequest::new("base-model")
        .tokens(&tokens(0, 3)[..2 * BLOCK as usize + 1])
        .id("short");
    produce_and_dispatch(&h, &short, 0);
    assert_eq!((in_flight_keys(&h, 0), pending_blocks(&h, 0)), (3, 2));
    send(&h, 0, 0, vec![stored(&[1], None, tokens(0, 1))]);
    assert_eq!(pending_blocks(&h, 0), 1, "one of the two stored");
    send(&h, 0, 1, vec![stored(&[2], Some(1), tokens(BLOCK, 1))]);
    assert_eq!(pending_blocks(&h, 0), 0);
    // Evicted while the request still runs: the engine would store it again.
    send(&h, 0, 2, vec![removed(&[2], Medium::Gpu)]);
    assert_eq!(pending_blocks(&h, 0), 1);
    complete(&h, &short, 0);
    assert_eq!((in_flight_keys(&h, 0), pending_blocks(&h, 0)), (0, 0));
}

#[test]
fn behind_a_queue_a_held_prompt_counts_in_flight_and_survives_its_eviction() {
    let h = harness(BLOCK_PARAMETERS);
    send(&h, 0, 0, vec![stored(&[1, 2], None, tokens(0, 2))]);
    // Nothing queued at endpoint 0: a prompt it holds whole is prefilled at once.
    let at_once = prompt(2).id("at-once");
    produce_and_dispatch(&h, &at_once, 0);
    assert_eq!(in_flight_keys(&h, 0), 0);
    complete(&h, &at_once, 0);

    // A request whose blocks the engine lacks queues there first.
    let ahead = TestRequest::new("base-model")
        .tokens(&tokens(1000, 2))
        .id("ahead");
    produce_and_dispatch(&h, &ahead, 0);
    assert_eq!(pending_blocks(&h, 0), 2);
    // The held prompt's request waits behind it: its blocks count in flight.
    let behind = prompt(2).id("behind");
    produce_and_dispatch(&h, &behind, 0);
    assert_eq!(in_flight_keys(&h, 0), 4);
    // Storing the queued request's blocks evicts the held prompt; the request behind will
    // prefill and store it again, so the next one for that prompt still goes there.
    send(&h, 0, 1, vec![removed(&[1, 2], Medium::Gpu)]);
    assert_eq!(matched(&h, &prompt(2)), [2, 0, 0]);
    assert_eq!(pending_blocks(&h, 0), 4);
    complete(&h, &behind, 0);
    assert_eq!(matched(&h, &prompt(2)), [0, 0, 0]);
    complete(&h, &ahead, 0);
    assert_eq!((in_flight_keys(&h, 0), pending_blocks(&h, 0)), (0, 0));
}

/// The fallback's published content hashes of `prompts`' pieces of `piece` tokens, as the
/// other producers' values of one request on three candidates.
fn published(prompts: &[&[u32]], piece: usize, max_pieces: usize) -> Attributes {
    use switchyard_prefix_hashing::{content_hashes_into, published::encode_content_hashes};
    let (mut contents, mut ends) = (Vec::new(), Vec::new());
    for prompt in prompts {
        content_hashes_into(prompt, piece, max_pieces, &mut contents);
        ends.push(contents.len());
    }
    let mut bytes = Vec::new();
    encode_content_hashes(piece as u32, &contents, &ends, &mut bytes);
    Attributes::new().set_on(
        DataKey::new(BLOCK_CONTENT_HASHES, APPROX_PREFIX_CACHE_PRODUCER),
        0,
        AttrValue::Custom(bytes.into()),
    )
}

#[test]
fn the_fallbacks_published_content_hashes_are_chained_instead_of_the_prompt() {
    let h = harness("null");
    assert!(h.declarations().consumes.iter().any(|c| c.key
        == DataKey::new(BLOCK_CONTENT_HASHES, APPROX_PREFIX_CACHE_PRODUCER)
        && !c.required));
    send(&h, 1, 0, vec![stored(&[1, 2, 3], None, tokens(0, 3))]);
    let held = tokens(0, 3);
    let other = TestRequest::new("base-model").tokens(&tokens(100, 3));
    assert_eq!(matched(&h, &other), [0, 0, 0]);
    // Published hashes are what is matched: here those of the held prompt, not of the request's
    // own tokens (a publisher never lies like this; it shows the prompt was not read again).
    assert_eq!(
        matched_with(&h, &other, &published(&[&held], 4, 99)),
        [0, 3, 0]
    );
    assert_eq!(
        matched_with(&h, &prompt(3), &published(&[&held], 4, 99)),
        [0, 3, 0]
    );
    // Hashes the producer cannot use are passed over, and the prompt hashed as always: pieces
    // of another size, too few of them, another number of prompts, bytes that are not a value.
    for unusable in [
        published(&[&held], 8, 99),
        published(&[&held], 4, 2),
        published(&[&held, &held], 4, 99),
        Attributes::new().set_on(
            DataKey::new(BLOCK_CONTENT_HASHES, APPROX_PREFIX_CACHE_PRODUCER),
            0,
            AttrValue::Custom(b"not hashes".to_vec().into()),
        ),
    ] {
        assert_eq!(matched_with(&h, &other, &unusable), [0, 0, 0]);
        assert_eq!(matched_with(&h, &prompt(3), &unusable), [0, 3, 0]);
    }
}
