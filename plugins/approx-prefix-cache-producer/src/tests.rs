//! The producer through the plugin boundary: factory → instance → `produce` / `dispatched` /
//! `state`, called with the plugin API's testing harness.

use switchyard_plugin_api::keys::{
    BLOCK_CONTENT_HASHES, PREFIX_CACHE_MATCH_INFO, TOKENIZED_PROMPT, TOKEN_PRODUCER,
};
use switchyard_plugin_api::testing::{Attributes, Harness, TestEndpoint, TestRequest};
use switchyard_plugin_api::{ConsumedKey, DataKey, ErrorKind, PluginError};

use super::*;

fn instance(parameters: &str) -> Harness {
    match Harness::named(&FACTORY, "approx", parameters) {
        Ok(harness) => harness,
        Err(error) => panic!("create failed: {error}"),
    }
}

fn refused(parameters: &str) -> PluginError {
    match Harness::named(&FACTORY, "approx", parameters) {
        Ok(_) => panic!("accepted {parameters}"),
        Err(error) => error,
    }
}

/// A candidate with the given host index and id, reporting `block_size`-token cache blocks
/// (0 = unknown) and `num_blocks` of them.
fn endpoint(host_index: u32, id: &str, block_size: u32, num_blocks: u64) -> TestEndpoint {
    TestEndpoint::new(id)
        .address("10.0.0.1:8000")
        .host_index(host_index)
        .cache(block_size, num_blocks)
}

fn request(prompts: &[&[u32]]) -> TestRequest {
    prompts.iter().fold(
        TestRequest::new("test-model").id("request").random_seed(0),
        |request, tokens| request.prompt(tokens),
    )
}

/// Produces for one request and returns the value written on each candidate.
fn produce(
    producer: &Harness,
    prompts: &[&[u32]],
    endpoints: &[&TestEndpoint],
) -> Vec<PrefixCacheMatchInfo> {
    let endpoints: Vec<TestEndpoint> = endpoints.iter().map(|&e| e.clone()).collect();
    let produced = producer
        .produce(&request(prompts), &endpoints, &Attributes::new())
        .expect("produce");
    produced
        .get(PREFIX_CACHE_MATCH_INFO)
        .expect("the declared key")
        .iter()
        .map(|value| {
            value
                .prefix_cache_match()
                .expect("written on every candidate")
        })
        .collect()
}

fn dispatch(producer: &Harness, prompts: &[&[u32]], to: &TestEndpoint) {
    producer
        .dispatched(&request(prompts), to, 0)
        .expect("dispatched");
}

fn pmi(match_blocks: u64, total_blocks: u64, block_size_tokens: u64) -> PrefixCacheMatchInfo {
    PrefixCacheMatchInfo {
        match_blocks,
        total_blocks,
        block_size_tokens,
    }
}

/// 192 tokens: three 64-token blocks.
fn three_blocks() -> Vec<u32> {
    (0..192).collect()
}

#[test]
fn declarations_name_the_instance_and_the_token_producer() {
    let producer = instance("null");
    let declared = producer.declarations();
    assert_eq!(
        declared.produces.as_slice(),
        [DataKey::new(PREFIX_CACHE_MATCH_INFO, "approx")]
    );
    assert_eq!(
        declared.consumes.as_slice(),
        [ConsumedKey {
            key: DataKey::new(TOKENIZED_PROMPT, TOKEN_PRODUCER),
            required: true,
        }]
    );
    assert_eq!(declared.batch(), None);
    assert_eq!(declared.timeout_ms, 0);
}

#[test]
fn dispatched_requests_are_matched_on_their_endpoint() {
    let producer = instance("null");
    let a = endpoint(4, "ns/a", 16, 0);
    let b = endpoint(1, "ns/b", 16, 0);
    let first = three_blocks();
    assert_eq!(
        produce(&producer, &[&first], &[&a, &b]),
        [pmi(0, 3, 64), pmi(0, 3, 64)]
    );

    dispatch(&producer, &[&first], &a);
    assert_eq!(
        produce(&producer, &[&first], &[&a, &b]),
        [pmi(3, 3, 64), pmi(0, 3, 64)]
    );
    assert_eq!(
        produce(&producer, &[&first], &[&b, &a]),
        [pmi(0, 3, 64), pmi(3, 3, 64)],
        "found by host index in any slot"
    );

    let mut second = first.clone();
    second[150] = 999_999;
    assert_eq!(
        produce(&producer, &[&second], &[&a, &b]),
        [pmi(2, 3, 64), pmi(0, 3, 64)]
    );
}

#[test]
fn the_first_candidates_reported_block_size_is_used_under_auto_tune() {
    let producer = instance("null");
    let big = endpoint(0, "ns/a", 128, 0);
    let tokens = three_blocks();
    assert_eq!(produce(&producer, &[&tokens], &[&big]), [pmi(0, 2, 128)]);

    let fixed = instance(r#"{"autoTune": false, "blockSizeTokens": 96}"#);
    assert_eq!(produce(&fixed, &[&tokens], &[&big]), [pmi(0, 2, 96)]);
}

#[test]
fn capacity_follows_the_endpoints_cache_size() {
    let producer = instance("null");
    // Two server blocks of 64 tokens hold two of our blocks; the first two survive.
    let small = endpoint(0, "ns/a", 64, 2);
    let tokens = three_blocks();
    dispatch(&producer, &[&tokens], &small);
    assert_eq!(produce(&producer, &[&tokens], &[&small]), [pmi(2, 3, 64)]);
}

#[test]
fn matches_sum_over_prompts() {
    let producer = instance("null");
    let a = endpoint(0, "ns/a", 0, 0);
    let first = three_blocks();
    let second: Vec<u32> = (1000..1064).collect();
    dispatch(&producer, &[&first, &second], &a);
    assert_eq!(
        produce(&producer, &[&first, &second], &[&a]),
        [pmi(4, 4, 64)]
    );
    assert_eq!(produce(&producer, &[&second], &[&a]), [pmi(1, 1, 64)]);
}

#[test]
fn a_request_without_tokens_gets_zero_blocks() {
    let producer = instance("null");
    let a = endpoint(0, "ns/a", 0, 0);
    dispatch(&producer, &[], &a);
    assert_eq!(produce(&producer, &[], &[&a]), [pmi(0, 0, 64)]);
    assert_eq!(produce(&producer, &[&[]], &[&a]), [pmi(0, 0, 64)]);
}

#[test]
fn another_endpoint_taking_over_a_host_index_starts_empty() {
    let producer = instance("null");
    let tokens = three_blocks();
    dispatch(&producer, &[&tokens], &endpoint(0, "ns/old", 0, 0));
    dispatch(&producer, &[&[7; 64]], &endpoint(0, "ns/new", 0, 0));
    assert_eq!(
        produce(&producer, &[&tokens], &[&endpoint(0, "ns/new", 0, 0)]),
        [pmi(0, 3, 64)]
    );
}

#[test]
fn state_lists_endpoints_and_distinct_blocks() {
    let producer = instance("null");
    let shared = three_blocks();
    dispatch(&producer, &[&shared], &endpoint(2, "ns/a", 0, 0));
    dispatch(&producer, &[&shared[..64]], &endpoint(0, "ns/b", 0, 0));
    let state = producer.state().expect("state").expect("a state");
    assert_eq!(
        state,
        json!({
            "endpoints": [
                {"hostIndex": 0, "id": "ns/b", "blocks": 1},
                {"hostIndex": 2, "id": "ns/a", "blocks": 3},
            ],
            "distinctBlocks": 3,
        })
    );
}

#[test]
fn a_successor_with_other_parameters_takes_the_index_over() {
    let producer = instance("null");
    let a = endpoint(4, "ns/a", 16, 0);
    let b = endpoint(1, "ns/b", 16, 0);
    let (first, mut second) = (three_blocks(), three_blocks());
    second[0] = 999_999;
    dispatch(&producer, &[&first], &a);
    dispatch(&producer, &[&second], &b);
    dispatch(&producer, &[&first[..128]], &b);
    let exported = producer.export_state().expect("exports").expect("an index");

    // Another capacity, the same hashing: every match is as before.
    let successor = instance(r#"{"lruCapacityPerServer": 1000}"#);
    successor.import_state(&exported).expect("takes it over");
    for prompt in [&first, &second] {
        assert_eq!(
            produce(&successor, &[prompt], &[&a, &b]),
            produce(&producer, &[prompt], &[&a, &b])
        );
    }
    assert_eq!(successor.state().unwrap(), producer.state().unwrap());
    assert_eq!(successor.export_state().unwrap(), Some(exported.clone()));

    // Blocks of another size would never match: refused, and the successor stays empty.
    let other = instance(r#"{"autoTune": false, "blockSizeTokens": 128}"#);
    let refused = other.import_state(&exported).unwrap_err();
    assert!(
        refused.message.contains("blockSizeTokens = 16"),
        "{refused}"
    );
    assert_eq!(
        produce(&other, &[&first], &[&a]),
        [pmi(0, 2, 128)],
        "nothing taken over"
    );
    let garbled = json!({"autoTune": true, "blockSizeTokens": 64,
        "endpoints": [{"hostIndex": 0, "id": "x", "capacity": 4, "blocks": "12z4"}]});
    assert!(successor.import_state(&garbled).is_err());
}

#[test]
fn unknown_parameter_is_refused_with_its_name() {
    let error = refused(r#"{"blockSizeToken": 64}"#);
    assert_eq!(error.kind, ErrorKind::InvalidParameter);
    assert_eq!(error.field.as_str(), "blockSizeToken");
}

#[test]
fn out_of_range_parameter_is_refused_with_its_name_and_range() {
    let error = refused(r#"{"lruCapacityPerServer": 0}"#);
    assert_eq!(error.kind, ErrorKind::InvalidParameter);
    assert_eq!(error.field.as_str(), "lruCapacityPerServer");
    assert_eq!(
        error.message.as_str(),
        "lruCapacityPerServer must be >= 1 (got 0)"
    );
    let error = refused(r#"{"hashBlockSizeTokens": 65}"#);
    assert_eq!(error.field.as_str(), "hashBlockSizeTokens");
    assert_eq!(
        error.message.as_str(),
        "hashBlockSizeTokens must be in 0..=64 (got 65)"
    );
}

#[test]
fn documented_parameters_are_the_config_fields_with_their_defaults() {
    assert_eq!(FACTORY.parameters.len(), 7);
    for param in FACTORY.parameters {
        let json = format!("{{\"{}\": {}}}", param.name, param.default);
        assert_eq!(
            ApproxPrefixCacheConfig::parse(&json).expect(&json),
            ApproxPrefixCacheConfig::default(),
            "{}",
            param.name
        );
    }
}

/// `hash_request` as it was before it remembered its last hashing: hashing every time.
fn hash_afresh(
    config: &ApproxPrefixCacheConfig,
    request: &RequestView<'_>,
    server: u32,
) -> PromptHashes {
    let block_size = config.effective_block_size(Some(server));
    let max_blocks = config.max_blocks(block_size);
    let mut out = PromptHashes::new();
    let pieces = config.pieces_per_block(block_size);
    hash_into(
        request,
        block_size,
        max_blocks,
        pieces,
        &mut out,
        &mut Contents::default(),
    );
    out
}

#[test]
fn a_remembered_hashing_is_reused_only_for_the_same_request_and_parameters() {
    let mut next = switchyard_plugin_api::testing::numbers(0x9e37_79b9_7f4a_7c15);
    for parameters in [
        // Block sizes are at least 64 tokens.
        r#"{"autoTune": false}"#,
        r#"{"maxPrefixTokensToMatch": 128}"#,
        r#"{"maxPrefixBlocksToMatch": 1}"#,
        r#"{"hashBlockSizeTokens": 16, "maxPrefixTokensToMatch": 200}"#,
    ] {
        let config = ApproxPrefixCacheConfig::parse(parameters).expect("valid parameters");
        let producer = ApproxProducer {
            name: "approx".to_string(),
            config: ApproxPrefixCacheConfig::parse(parameters).expect("valid parameters"),
            index: Mutex::new(PrefixIndex::new()),
            scratch: Mutex::new(Vec::new()),
            last: Mutex::new(LastHashed::default()),
        };
        let mut out = PromptHashes::new();
        for _ in 0..2000 {
            // Few shapes, so similar requests come back often, and near misses too: another
            // model or salt, another length, a token changed early or past the hashed part.
            // Two requests are live at once: the one produced and possibly another dispatched.
            let prompts: Vec<Vec<Vec<u32>>> = (0..2)
                .map(|_| {
                    (0..1 + next(2))
                        .map(|_| {
                            let len = [0, 30, 64, 65, 128, 200][next(6) as usize];
                            let changed = next(220) as u32;
                            (0..len)
                                .map(|t| if t == changed { 99 } else { t })
                                .collect()
                        })
                        .collect()
                })
                .collect();
            let requests: Vec<TestRequest> = prompts
                .iter()
                .map(|request| TestRequest {
                    id: ["r", "q"][next(2) as usize].to_string(),
                    model: ["", "m", "ab"][next(3) as usize].to_string(),
                    cache_salt: ["", "s", "c"][next(3) as usize].to_string(),
                    prompts: request.clone(),
                    max_output_tokens: -1,
                    now_ms: 0,
                    random_seed: next(2),
                    explain: false,
                })
                .collect();
            requests[0].with_view(|first| {
                requests[1].with_view(|second| {
                    let server = [0, 64, 128][next(3) as usize];
                    let block_size =
                        producer.hash_request(first, server, &mut out, &mut Contents::default());
                    assert_eq!(block_size, config.effective_block_size(Some(server)));
                    assert_eq!(out, hash_afresh(&config, first, server), "{parameters}");
                    // Dispatched: usually the request just produced, sometimes twice or
                    // another one.
                    for _ in 0..1 + next(2) {
                        let request = [first, second][usize::from(next(4) == 0)];
                        let server = [0, 64, 128, server, server][next(5) as usize];
                        let block_size = producer.hashes_for_dispatch(request, server, &mut out);
                        assert_eq!(block_size, config.effective_block_size(Some(server)));
                        assert_eq!(out, hash_afresh(&config, request, server), "{parameters}");
                    }
                })
            });
        }
    }
}

#[test]
fn an_endpoint_known_to_hold_nothing_is_forgotten_and_a_lost_event_changes_nothing() {
    use switchyard_plugin_api::kv::{KvEvent, KvEventBatch, Reset, ResetReason};
    let producer = instance("null");
    assert!(producer.wants_kv_events().unwrap());
    let a = endpoint(0, "a", 64, 1000);
    let b = endpoint(1, "b", 64, 1000);
    let prompt: Vec<u32> = (0..256).collect();
    for e in [&a, &b] {
        producer
            .dispatched(&request(&[&prompt]), e, e.host_index as usize)
            .unwrap();
    }
    let held = |p: &Harness| -> Vec<u64> {
        produce(p, &[&prompt], &[&a, &b])
            .iter()
            .map(|m| m.match_blocks)
            .collect()
    };
    assert_eq!(held(&producer), [4, 4]);
    let batch = |host_index: u32, event: KvEvent| KvEventBatch {
        host_index,
        endpoint: String::new(),
        now_ms: 0,
        events: vec![event],
    };
    let lost = KvEvent::Reset(Reset {
        reason: ResetReason::Gap,
        known: false,
    });
    producer.kv_events(&batch(0, lost)).unwrap();
    assert_eq!(held(&producer), [4, 4]);
    let admin = KvEvent::Reset(Reset {
        reason: ResetReason::Admin,
        known: true,
    });
    producer.kv_events(&batch(0, admin)).unwrap();
    assert_eq!(held(&producer), [0, 4]);
    producer
        .kv_events(&batch(1, KvEvent::AllBlocksCleared))
        .unwrap();
    assert_eq!(held(&producer), [0, 0]);
}

#[test]
fn blocks_hashed_in_pieces_are_matched_as_whole_blocks_and_their_pieces_published() {
    let whole = instance("null");
    let pieces = instance(r#"{"hashBlockSizeTokens": 16}"#);
    assert_eq!(whole.declarations().produces.len(), 1);
    assert_eq!(
        pieces.declarations().produces[1],
        DataKey::new(BLOCK_CONTENT_HASHES, "approx")
    );
    let a = endpoint(4, "ns/a", 16, 0);
    let b = endpoint(1, "ns/b", 16, 0);
    let first = three_blocks();
    let mut second = three_blocks();
    second[150] = 999_999;
    let third: Vec<u32> = (0..200).collect();
    for producer in [&whole, &pieces] {
        dispatch(producer, &[&first], &a);
        dispatch(producer, &[&second[..100]], &b);
    }
    // The same matches either way: pieces change the keys, not what they mean.
    for prompt in [&first, &second, &third] {
        assert_eq!(
            produce(&pieces, &[prompt], &[&a, &b]),
            produce(&whole, &[prompt], &[&a, &b])
        );
    }
    assert_eq!(
        produce(&pieces, &[&second], &[&a, &b]),
        [pmi(2, 3, 64), pmi(1, 3, 64)]
    );

    // The pieces' content hashes, on the first candidate only.
    let empty: &[u32] = &[];
    let request = request(&[&third, empty, &first]);
    let produced = pieces
        .produce(&request, &[a.clone(), b.clone()], &Attributes::new())
        .expect("produce");
    let values = produced.get(BLOCK_CONTENT_HASHES).expect("declared");
    assert!(values[1].is_absent());
    let AttrValue::Custom(bytes) = &values[0] else {
        panic!("{:?}", values[0]);
    };
    let published =
        switchyard_prefix_hashing::published::ContentHashes::parse(bytes).expect("a value");
    assert_eq!(published.block_tokens(), 16);
    assert_eq!(published.prompts(), 3);
    assert_eq!([0, 1, 2].map(|p| published.blocks(p)), [13, 0, 12]);
    let mut chained = Vec::new();
    let mut expected = Vec::new();
    let seed = prompt_seed("", "");
    let shape = (16, 3);
    assert!(published.chain_into(seed, shape, |p| published.blocks(p), &mut chained, |_| {}));
    for prompt in [&third, &first] {
        hash_prompt_into(seed, prompt, 16, usize::MAX, &mut expected);
    }
    assert_eq!(chained, expected);
    let produced = whole
        .produce(&request, std::slice::from_ref(&a), &Attributes::new())
        .expect("produce");
    assert!(produced.get(BLOCK_CONTENT_HASHES).is_none());
}

#[test]
fn blocks_that_pieces_do_not_divide_are_hashed_whole() {
    let config = ApproxPrefixCacheConfig::parse(r#"{"hashBlockSizeTokens": 48}"#).expect("valid");
    assert_eq!(config.pieces_per_block(64), None);
    assert_eq!(config.pieces_per_block(96), Some(2));
    let producer = instance(r#"{"hashBlockSizeTokens": 48}"#);
    let a = endpoint(0, "ns/a", 16, 0);
    dispatch(&producer, &[&three_blocks()], &a);
    assert_eq!(
        produce(&producer, &[&three_blocks()], &[&a]),
        [pmi(3, 3, 64)]
    );
    let produced = producer
        .produce(&request(&[&three_blocks()]), &[a], &Attributes::new())
        .expect("produce");
    assert!(produced.get(BLOCK_CONTENT_HASHES).expect("declared")[0].is_absent());
}

#[test]
fn an_index_hashed_in_pieces_is_taken_over_only_by_the_same_hashing() {
    let producer = instance(r#"{"hashBlockSizeTokens": 16}"#);
    let a = endpoint(0, "ns/a", 16, 0);
    dispatch(&producer, &[&three_blocks()], &a);
    let exported = producer.export_state().expect("exports").expect("an index");
    let same = instance(r#"{"hashBlockSizeTokens": 16, "lruCapacityPerServer": 9}"#);
    same.import_state(&exported).expect("takes it over");
    assert_eq!(produce(&same, &[&three_blocks()], &[&a]), [pmi(3, 3, 64)]);
    let refused = instance("null").import_state(&exported).unwrap_err();
    assert!(
        refused.message.contains("hashBlockSizeTokens = 16"),
        "{refused}"
    );
    // A snapshot from before pieces existed hashed whole blocks.
    let mut old = producer.export_state().unwrap().unwrap();
    old.as_object_mut().unwrap().remove("hashBlockSizeTokens");
    assert!(instance("null").import_state(&old).is_ok());
    assert!(instance(r#"{"hashBlockSizeTokens": 16}"#)
        .import_state(&old)
        .is_err());
}
