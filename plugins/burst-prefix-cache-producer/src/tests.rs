//! The producer through the plugin boundary: factory → instance → `produce`, called with the
//! plugin API's testing harness, with expected placements from the reference catalogue (P2,
//! P3, A2, A5, A6).

use switchyard_plugin_api::keys::{
    IN_FLIGHT_LOAD, PREFIX_CACHE_MATCH_INFO, TOKENIZED_PROMPT, TOKEN_PRODUCER,
};
use switchyard_plugin_api::testing::{numbers, Attributes, Harness, TestEndpoint, TestRequest};
use switchyard_plugin_api::{AttrValue, BatchPolicy, ConsumedKey, DataKey, ErrorKind, PluginError};

use super::*;
use std::collections::BTreeSet;

/// Every endpoint the tests know; an endpoint's host index is its position here.
const PODS: [&str; 4] = ["/pod1", "/pod2", "/pod3", "/pod4"];

fn instance(parameters: &str) -> Harness {
    match Harness::named(&FACTORY, "burst", parameters) {
        Ok(harness) => harness,
        Err(error) => panic!("create failed: {error}"),
    }
}

fn create_error(parameters: &str) -> PluginError {
    match Harness::named(&FACTORY, "burst", parameters) {
        Ok(_) => panic!("parameters {parameters} should be refused"),
        Err(error) => error,
    }
}

/// One request of a batch and its candidates, in slot order.
struct Request {
    request: TestRequest,
    candidates: Vec<TestEndpoint>,
}

/// A request for `model` without prompts.
fn base(model: &str) -> TestRequest {
    TestRequest::new(model).id("request").random_seed(0)
}

/// The known pods `ids`, each running the given number of requests.
fn pods(ids: &[&str], running: &[u32]) -> Vec<TestEndpoint> {
    ids.iter()
        .zip(running)
        .map(|(&id, &running)| {
            TestEndpoint::new(id)
                .address("10.0.0.1:8000")
                .host_index(PODS.iter().position(|&pod| pod == id).expect("known pod") as u32)
                .queue(running, 0)
        })
        .collect()
}

fn request(tokens: &[u32], candidates: &[&str]) -> Request {
    Request {
        request: base("").tokens(tokens),
        candidates: pods(candidates, &vec![0; candidates.len()]),
    }
}

fn copies(count: usize, tokens: &[u32], candidates: &[&str]) -> Vec<Request> {
    (0..count).map(|_| request(tokens, candidates)).collect()
}

/// Runs one sealed batch and returns, per request, the value written on each candidate.
fn produce(instance: &Harness, batch: &[Request]) -> Vec<Vec<AttrValue>> {
    produce_seeing(instance, batch, &vec![Attributes::new(); batch.len()])
}

fn pmi(match_blocks: u64, total_blocks: u64, block_size_tokens: u64) -> AttrValue {
    Attributes::prefix_match(match_blocks, total_blocks, block_size_tokens)
}

/// The candidate with a positive match in each request's values (`"-"` when none), checking
/// that every candidate got a value.
fn assigned<'a>(batch: &'a [Request], values: &[Vec<AttrValue>]) -> Vec<&'a str> {
    batch
        .iter()
        .zip(values)
        .map(|(request, values)| {
            let mut chosen = "-";
            for (endpoint, value) in request.candidates.iter().zip(values) {
                let info = value
                    .prefix_cache_match()
                    .expect("written on every candidate");
                if info.match_blocks > 0 {
                    assert_eq!(chosen, "-", "at most one candidate matches");
                    chosen = &endpoint.id;
                }
            }
            chosen
        })
        .collect()
}

#[test]
fn declarations_carry_keys_batch_policy_and_timeout() {
    let producer = instance("null");
    let declared = producer.declarations();
    assert_eq!(
        declared.produces.as_slice(),
        [DataKey::new(PREFIX_CACHE_MATCH_INFO, "burst")]
    );
    assert_eq!(
        declared.consumes.as_slice(),
        [ConsumedKey {
            key: DataKey::new(TOKENIZED_PROMPT, TOKEN_PRODUCER),
            required: true,
        }]
    );
    assert_eq!(
        declared.batch(),
        Some(BatchPolicy {
            window_ms: 100,
            max_batch: 1000
        })
    );
    assert_eq!(declared.timeout_ms, 400);

    let producer = instance(r#"{"windowDurationMs": 250, "maxBatchSize": -1}"#);
    let declared = producer.declarations();
    assert_eq!(
        declared.batch(),
        Some(BatchPolicy {
            window_ms: 250,
            max_batch: -1
        })
    );
    assert_eq!(declared.timeout_ms, 550);
}

#[test]
fn p2_identical_burst_lands_on_one_replica() {
    let producer = instance(
        r#"{"windowDurationMs": 100, "maxPerReplica": -1, "blockSizeTokens": 4,
            "maxBatchSize": -1}"#,
    );
    let batch = copies(8, &[1, 2, 3, 4, 5, 6, 7, 8], &PODS);
    let values = produce(&producer, &batch);
    for request_values in &values {
        assert_eq!(
            request_values,
            &[pmi(2, 2, 4), pmi(0, 2, 4), pmi(0, 2, 4), pmi(0, 2, 4)]
        );
    }
}

#[test]
fn p3_singleton_has_no_affinity() {
    let producer = instance(
        r#"{"windowDurationMs": 50, "maxPerReplica": -1, "blockSizeTokens": 4,
            "maxBatchSize": -1}"#,
    );
    let batch = [request(&[1, 2, 3, 4], &["/pod1", "/pod2"])];
    assert_eq!(produce(&producer, &batch), [[pmi(0, 1, 4), pmi(0, 1, 4)]]);
}

#[test]
fn a5_requests_without_tokens_get_zero_everywhere() {
    let producer = instance(r#"{"blockSizeTokens": 4}"#);
    let batch = copies(2, &[], &["/pod1", "/pod2"]);
    assert_eq!(
        produce(&producer, &batch),
        [[pmi(0, 0, 4), pmi(0, 0, 4)], [pmi(0, 0, 4), pmi(0, 0, 4)]]
    );
}

#[test]
fn a6_distinct_groups_spread_across_replicas() {
    let producer = instance(r#"{"blockSizeTokens": 1, "maxBatchSize": -1}"#);
    let mut batch = copies(8, &[1, 2, 3], &PODS);
    batch.extend(copies(8, &[9, 9, 9], &PODS));
    let values = produce(&producer, &batch);
    let mut expected = vec!["/pod1"; 8];
    expected.extend(["/pod2"; 8]);
    assert_eq!(assigned(&batch, &values), expected);
    assert_eq!(
        values[8],
        [pmi(0, 3, 1), pmi(3, 3, 1), pmi(0, 3, 1), pmi(0, 3, 1)]
    );
}

#[test]
fn a2_cap_spreads_a_group_evenly() {
    let producer = instance(r#"{"blockSizeTokens": 1, "maxPerReplica": 2}"#);
    let batch = copies(8, &[1, 2, 3], &PODS);
    let values = produce(&producer, &batch);
    assert_eq!(
        assigned(&batch, &values),
        ["/pod1", "/pod1", "/pod2", "/pod2", "/pod3", "/pod3", "/pod4", "/pod4"]
    );
}

#[test]
fn running_requests_break_ties_before_ids() {
    let producer = instance(r#"{"blockSizeTokens": 4}"#);
    let mut batch = copies(2, &[1, 2, 3, 4], &PODS);
    batch[0].candidates = pods(&PODS, &[3, 1, 1, 2]);
    let values = produce(&producer, &batch);
    assert_eq!(assigned(&batch, &values), ["/pod2", "/pod2"]);
}

#[test]
fn the_assigned_replica_is_found_by_host_index_in_any_slot() {
    let producer = instance(r#"{"blockSizeTokens": 4}"#);
    let batch = [
        request(&[1, 2, 3, 4], &PODS),
        request(&[1, 2, 3, 4], &["/pod3", "/pod1"]),
        request(&[1, 2, 3, 4], &["/pod2", "/pod3", "/pod4"]),
    ];
    let values = produce(&producer, &batch);
    assert_eq!(values[1], [pmi(0, 1, 4), pmi(1, 1, 4)]);
    assert_eq!(values[2], [pmi(0, 1, 4), pmi(0, 1, 4), pmi(0, 1, 4)]);
}

#[test]
fn every_prompt_of_a_request_counts_towards_its_blocks() {
    let producer = instance(r#"{"blockSizeTokens": 4}"#);
    let two_prompts = || Request {
        request: base("").prompt(&[1, 2, 3, 4]).prompt(&[5, 6, 7, 8, 9]),
        candidates: pods(&["/pod1", "/pod2"], &[0, 0]),
    };
    let batch = [two_prompts(), two_prompts()];
    let values = produce(&producer, &batch);
    assert_eq!(values[0], [pmi(3, 3, 4), pmi(0, 3, 4)]);
    assert_eq!(values[1], [pmi(3, 3, 4), pmi(0, 3, 4)]);
}

#[test]
fn prompts_equal_up_to_the_token_limit_form_one_group() {
    let producer = instance(r#"{"blockSizeTokens": 4, "maxPrefixTokensToMatch": 4}"#);
    let batch = [
        request(&[1, 2, 3, 4, 5, 6, 7, 8], &["/pod1", "/pod2"]),
        request(&[1, 2, 3, 4, 9, 9, 9, 9], &["/pod1", "/pod2"]),
    ];
    let values = produce(&producer, &batch);
    assert_eq!(
        values,
        [[pmi(1, 1, 4), pmi(0, 1, 4)], [pmi(1, 1, 4), pmi(0, 1, 4)]]
    );
}

#[test]
fn unknown_parameter_is_refused_with_its_name() {
    let error = create_error(r#"{"windowDuration": 100}"#);
    assert_eq!(error.kind, ErrorKind::InvalidParameter);
    assert_eq!(error.field.as_str(), "windowDuration");
}

#[test]
fn out_of_range_parameter_is_refused_with_its_name_and_range() {
    let error = create_error(r#"{"windowDurationMs": 0}"#);
    assert_eq!(error.kind, ErrorKind::InvalidParameter);
    assert_eq!(error.field.as_str(), "windowDurationMs");
    assert_eq!(
        error.message.as_str(),
        "windowDurationMs must be in 1..=10000 (got 0)"
    );
    let error = create_error(r#"{"maxPerReplica": "two"}"#);
    assert_eq!(error.field.as_str(), "maxPerReplica");
}

#[test]
fn documented_parameters_are_the_config_fields_with_their_defaults() {
    assert_eq!(FACTORY.parameters.len(), 12);
    for param in FACTORY.parameters {
        let json = format!("{{\"{}\": {}}}", param.name, param.default);
        assert_eq!(
            BurstConfig::parse(&json).expect(&json),
            BurstConfig::default(),
            "{}",
            param.name
        );
    }
}

/// What `produce` wrote before requests with a block count of their own went unhashed: every
/// request hashed, the whole batch through `assign`.
fn produce_hashing_everything(parameters: &str, batch: &[Request]) -> Vec<Vec<AttrValue>> {
    let config = BurstConfig::parse(parameters).expect("valid parameters");
    let (block_size, max_blocks) = (config.block_size(), config.max_blocks());
    let hashes: Vec<Vec<u64>> = batch
        .iter()
        .map(|r| {
            let seed = prompt_seed(&r.request.model, &r.request.cache_salt);
            let mut hashes = Vec::new();
            for tokens in &r.request.prompts {
                hash_prompt_into(seed, tokens, block_size, max_blocks, &mut hashes);
            }
            hashes
        })
        .collect();
    let entries: Vec<&[u64]> = hashes.iter().map(Vec::as_slice).collect();
    let spread_over = batch
        .iter()
        .zip(&entries)
        .find(|(_, e)| !e.is_empty())
        .map(|(r, _)| r.candidates.as_slice())
        .unwrap_or_default();
    let replicas: Vec<Replica<'_>> = spread_over
        .iter()
        .map(|e| Replica {
            id: e.id.as_str(),
            running_requests: u64::from(e.metrics.running_requests),
        })
        .collect();
    let targets = assign(
        &entries,
        &replicas,
        config.per_replica_cap(),
        config.colocate_blocks(),
        config.balance(),
    );
    batch
        .iter()
        .zip(&entries)
        .zip(&targets)
        .map(|((r, entry), target)| {
            let target = target.map(|t| spread_over[t].host_index);
            let total = entry.len() as u64;
            r.candidates
                .iter()
                .map(|e| {
                    let matched = if target == Some(e.host_index) {
                        total
                    } else {
                        0
                    };
                    pmi(matched, total, block_size as u64)
                })
                .collect()
        })
        .collect()
}

#[test]
fn requests_left_unhashed_get_what_hashing_them_gives() {
    let mut next = numbers(0x2545_f491_4f6c_dd1d);
    let parameter_sets = [
        r#"{"minColocateBlocks": 0}"#,
        r#"{"minColocateBlocks": 0, "blockSizeTokens": 4, "balanceBy": "tokens"}"#,
        r#"{"minColocateBlocks": 0, "blockSizeTokens": 4, "maxPrefixTokensToMatch": 8}"#,
        r#"{"minColocateBlocks": 0, "blockSizeTokens": 2, "maxPerReplica": 1}"#,
        r#"{"minColocateBlocks": 2, "blockSizeTokens": 4}"#,
    ];
    for parameters in parameter_sets {
        let instance = instance(parameters);
        for _ in 0..300 {
            // A few prompt shapes, so equal lengths with different contents, identical
            // prompts, shared prefixes, prompts differing only in the middle or only past the
            // hashed tokens, empty prompts, and other models and salts all turn up.
            let size = 1 + next(8) as usize;
            let batch: Vec<Request> = (0..size)
                .map(|_| {
                    let prompts = (0..1 + next(2))
                        .map(|_| {
                            let long = next(4) == 0;
                            let len = if long { 100 + next(2) } else { next(12) } as u32;
                            let variant = next(3) as u32;
                            let changed = if long { 10 } else { 5 };
                            (0..len)
                                .map(|t| match t.cmp(&changed) {
                                    std::cmp::Ordering::Less => t,
                                    std::cmp::Ordering::Equal => t + variant,
                                    std::cmp::Ordering::Greater if long => t,
                                    std::cmp::Ordering::Greater => t + variant,
                                })
                                .collect()
                        })
                        .collect();
                    let candidates = &PODS[..2 + next(3) as usize];
                    let running: Vec<u32> = candidates.iter().map(|_| next(3) as u32).collect();
                    let model = ["", "m", "ab"][next(3) as usize];
                    let cache_salt = ["", "s", "c"][next(3) as usize];
                    let mut request = base(model).cache_salt(cache_salt);
                    request.prompts = prompts;
                    Request {
                        request,
                        candidates: pods(candidates, &running),
                    }
                })
                .collect();
            assert_eq!(
                produce(&instance, &batch),
                produce_hashing_everything(parameters, &batch),
                "parameters {parameters}"
            );
        }
    }
}

#[test]
fn a_quiet_gap_is_declared_only_when_it_seals_earlier_than_the_window() {
    assert_eq!(instance("null").batch_quiet_ms().unwrap(), None);
    let quiet = instance(r#"{"windowDurationMs": 100, "windowQuietMs": 2}"#);
    assert_eq!(quiet.batch_quiet_ms().unwrap(), Some(2));
    assert_eq!(
        quiet.declarations().batch(),
        Some(BatchPolicy {
            window_ms: 100,
            max_batch: 1000
        }),
        "the window stays the upper bound"
    );
    let whole = instance(r#"{"windowDurationMs": 100, "windowQuietMs": 100}"#);
    assert_eq!(whole.batch_quiet_ms().unwrap(), None);
}

/// Runs one sealed batch in which request `i` sees the attributes `attrs[i]`.
fn produce_seeing(
    instance: &Harness,
    batch: &[Request],
    attrs: &[Attributes],
) -> Vec<Vec<AttrValue>> {
    let items: Vec<(&TestRequest, &[TestEndpoint], &Attributes)> = batch
        .iter()
        .zip(attrs)
        .map(|(r, attrs)| (&r.request, r.candidates.as_slice(), attrs))
        .collect();
    instance
        .produce_batch(&items)
        .expect("produce")
        .iter()
        .map(|produced| produced.get(PREFIX_CACHE_MATCH_INFO).unwrap().to_vec())
        .collect()
}

/// Runs one sealed batch in which request `i` is believed cached on `cached[i]` candidates'
/// first blocks (`Some(position)`), through the cache-estimate producer `approx`.
fn produce_with_cache(
    instance: &Harness,
    batch: &[Request],
    cached: &[Option<usize>],
) -> Vec<Vec<AttrValue>> {
    let key = DataKey::new(PREFIX_CACHE_MATCH_INFO, "approx");
    let attrs: Vec<Attributes> = batch
        .iter()
        .zip(cached)
        .map(|(request, cached)| {
            let values = (0..request.candidates.len())
                .map(|position| pmi(u64::from(*cached == Some(position)), 2, 4))
                .collect();
            Attributes::new().set(key.clone(), values)
        })
        .collect();
    produce_seeing(instance, batch, &attrs)
}

#[test]
fn lone_requests_already_cached_are_left_to_the_scorers() {
    let parameters = r#"{"blockSizeTokens": 4, "assignment": "fairShare",
        "cachedMatchProducerName": "approx"}"#;
    let producer = instance(parameters);
    assert_eq!(
        producer.declarations().consumes.as_slice(),
        [
            ConsumedKey {
                key: DataKey::new(TOKENIZED_PROMPT, TOKEN_PRODUCER),
                required: true,
            },
            ConsumedKey {
                key: DataKey::new(PREFIX_CACHE_MATCH_INFO, "approx"),
                required: true,
            },
            ConsumedKey {
                key: DataKey::new(BLOCK_CONTENT_HASHES, "approx"),
                required: false,
            },
        ]
    );
    // Two lone prompts, the first believed cached on /pod3; a pair of identical prompts, also
    // cached on /pod3; a lone prompt cached nowhere.
    let mut batch = vec![
        request(&[1, 2, 3, 4, 5, 6, 7, 8], &PODS),
        request(&[9, 9, 9, 9, 9, 9, 9, 9], &PODS),
    ];
    batch.extend(copies(2, &[3, 3, 3, 3, 3, 3, 3, 3], &PODS));
    batch.push(request(&[7, 7, 7, 7, 7, 7, 7, 7], &PODS));
    let cached = [Some(2), None, Some(2), Some(2), None];
    let values = produce_with_cache(&producer, &batch, &cached);
    let placed = assigned(&batch, &values);
    assert_eq!(placed[0], "-", "lone and cached: no affinity");
    assert_eq!(
        values[0][0],
        pmi(0, 2, 4),
        "the block count is still reported"
    );
    assert_ne!(placed[1], "-", "lone, cached nowhere: placed for balance");
    assert_ne!(placed[2], "-", "a group is co-located even when cached");
    assert_eq!(placed[2], placed[3]);
    assert_ne!(placed[4], "-");

    // Without the parameter every request is placed.
    let plain = instance(r#"{"blockSizeTokens": 4, "assignment": "fairShare"}"#);
    let values = produce(&plain, &batch);
    assert!(assigned(&batch, &values).iter().all(|&pod| pod != "-"));
}

#[test]
fn with_min_colocate_blocks_requests_sharing_leading_blocks_are_not_lone() {
    let producer = instance(
        r#"{"blockSizeTokens": 4, "assignment": "fairShare", "minColocateBlocks": 1,
            "cachedMatchProducerName": "approx"}"#,
    );
    // The same first block, different second blocks: placed here, whatever the cache holds;
    // a third request sharing nothing is lone.
    let batch = [
        request(&[1, 2, 3, 4, 5, 6, 7, 8], &PODS),
        request(&[1, 2, 3, 4, 8, 7, 6, 5], &PODS),
        request(&[9, 2, 3, 4, 5, 6, 7, 8], &PODS),
    ];
    let values = produce_with_cache(&producer, &batch, &[Some(1), Some(1), Some(1)]);
    assert_eq!(assigned(&batch, &values)[2], "-");
    assert!(assigned(&batch, &values)[..2].iter().all(|&pod| pod != "-"));
}

/// Runs one sealed batch whose requests all see `in_flight[position]` requests in flight to
/// each candidate, through the in-flight producer `inflight`, and optionally cache estimates
/// of `approx` that hold nothing.
fn produce_with_in_flight(
    instance: &Harness,
    batch: &[Request],
    in_flight: &[i64],
    with_cache_estimates: bool,
) -> Vec<Vec<AttrValue>> {
    let load = DataKey::new(IN_FLIGHT_LOAD, "inflight");
    let cache = DataKey::new(PREFIX_CACHE_MATCH_INFO, "approx");
    let attrs: Vec<Attributes> = batch
        .iter()
        .map(|request| {
            let loads = (0..request.candidates.len())
                .map(|position| Attributes::in_flight(in_flight[position], 0))
                .collect();
            let attrs = Attributes::new().set(load.clone(), loads);
            if with_cache_estimates {
                let nothing = (0..request.candidates.len())
                    .map(|_| pmi(0, 2, 4))
                    .collect();
                attrs.set(cache.clone(), nothing)
            } else {
                attrs
            }
        })
        .collect();
    produce_seeing(instance, batch, &attrs)
}

#[test]
fn in_flight_counts_add_to_the_reported_load() {
    let producer = instance(
        r#"{"blockSizeTokens": 4, "assignment": "fairShare",
            "inFlightProducerName": "inflight"}"#,
    );
    assert_eq!(
        producer.declarations().consumes[1],
        ConsumedKey {
            key: DataKey::new(IN_FLIGHT_LOAD, "inflight"),
            required: true,
        }
    );
    // Every replica reports nothing running (a scrape from before the last dispatches), but
    // five requests are in flight to each replica except /pod3.
    let batch = vec![request(&[1, 2, 3, 4, 5, 6, 7, 8], &PODS)];
    let in_flight = [5, 5, 0, 5];
    let values = produce_with_in_flight(&producer, &batch, &in_flight, false);
    assert_eq!(assigned(&batch, &values), ["/pod3"]);

    // With the cache estimates consumed as well, the in-flight counts are the third key.
    let both = instance(
        r#"{"blockSizeTokens": 4, "assignment": "fairShare",
            "cachedMatchProducerName": "approx", "inFlightProducerName": "inflight"}"#,
    );
    assert_eq!(
        both.declarations().consumes[2].key,
        DataKey::new(IN_FLIGHT_LOAD, "inflight")
    );
    let values = produce_with_in_flight(&both, &batch, &in_flight, true);
    assert_eq!(assigned(&batch, &values), ["/pod3"]);

    // A reported load above the in-flight count still counts: the larger one is used.
    let reported = vec![Request {
        request: base("").tokens(&[1, 2, 3, 4, 5, 6, 7, 8]),
        candidates: pods(&PODS, &[9, 9, 0, 9]),
    }];
    let values = produce_with_in_flight(&producer, &reported, &[0, 0, 4, 0], false);
    assert_eq!(assigned(&reported, &values), ["/pod3"]);

    // Only the reports count without the parameter: /pod1 reports the least, though twenty
    // requests are in flight to it.
    let stale = vec![Request {
        request: base("").tokens(&[1, 2, 3, 4, 5, 6, 7, 8]),
        candidates: pods(&PODS, &[0, 9, 9, 9]),
    }];
    let plain = instance(r#"{"blockSizeTokens": 4, "assignment": "fairShare"}"#);
    let values = produce_with_in_flight(&plain, &stale, &[20, 0, 0, 0], false);
    assert_eq!(assigned(&stale, &values), ["/pod1"]);
    let values = produce_with_in_flight(&producer, &stale, &[20, 0, 0, 0], false);
    assert_ne!(assigned(&stale, &values), ["/pod1"]);
}

#[test]
fn the_next_sample_of_a_prompt_placed_alone_follows_it() {
    // A client that lagged at its start: the first sample of a burst comes alone, then the
    // next one, also alone, after the replicas' loads changed. The plan remembered where the
    // first went, and the second follows it rather than the least loaded replica.
    let producer = instance(r#"{"blockSizeTokens": 4, "assignment": "fairShare"}"#);
    let at = |now_ms: u64, running: &[u32]| -> Vec<Request> {
        vec![Request {
            request: base("").tokens(&[1, 2, 3, 4, 5, 6, 7, 8]).now_ms(now_ms),
            candidates: pods(&PODS, running),
        }]
    };
    let first = at(0, &[0, 3, 3, 3]);
    assert_eq!(assigned(&first, &produce(&producer, &first)), ["/pod1"]);
    let second = at(3, &[1, 0, 3, 3]);
    assert_eq!(assigned(&second, &produce(&producer, &second)), ["/pod1"]);
    // A fresh instance places the same request by load.
    let fresh = instance(r#"{"blockSizeTokens": 4, "assignment": "fairShare"}"#);
    assert_eq!(assigned(&second, &produce(&fresh, &second)), ["/pod2"]);
}

#[test]
fn a_batch_of_one_is_placed_where_the_fair_share_line_puts_it() {
    let mut next = numbers(0x9e37_79b9_7f4a_7c15);
    for parameters in [
        r#"{"blockSizeTokens": 4, "assignment": "fairShare"}"#,
        r#"{"blockSizeTokens": 4, "assignment": "fairShare", "balanceBy": "tokens"}"#,
        r#"{"blockSizeTokens": 2, "assignment": "fairShare", "minColocateBlocks": 2}"#,
    ] {
        let config = BurstConfig::parse(parameters).expect("valid parameters");
        for _ in 0..200 {
            // A fresh instance: one that saw the prompt alone before continues its group.
            let producer = instance(parameters);
            let tokens: Vec<u32> = (0..next(14) as u32).collect();
            let candidates = &PODS[..1 + next(4) as usize];
            let running: Vec<u32> = candidates.iter().map(|_| next(4) as u32).collect();
            let batch = [Request {
                request: base("").tokens(&tokens),
                candidates: pods(candidates, &running),
            }];
            let count = block_count(tokens.len(), config.block_size(), config.max_blocks());
            let mut hashes = Vec::new();
            hash_prompt_into(
                prompt_seed("", ""),
                &tokens,
                config.block_size(),
                config.max_blocks(),
                &mut hashes,
            );
            let replicas: Vec<Replica<'_>> = candidates
                .iter()
                .zip(&running)
                .map(|(id, &load)| Replica {
                    id,
                    running_requests: u64::from(load),
                })
                .collect();
            let line = assign_fair_share(
                &[&hashes],
                &[count],
                &replicas,
                config.colocate_blocks(),
                config.balance(),
            );
            let expected = line[0].map_or("-", |replica| candidates[replica]);
            let values = produce(&producer, &batch);
            assert_eq!(
                assigned(&batch, &values)[0],
                expected,
                "{parameters}: {} tokens, loads {running:?}",
                tokens.len()
            );
        }
    }
}

/// Requests at `now_ms`: `count` samples of `tokens` over every pod, each pod running
/// `running[position]` requests.
fn samples_at(now_ms: u64, count: usize, tokens: &[u32], running: &[u32]) -> Vec<Request> {
    (0..count)
        .map(|_| Request {
            request: base("").tokens(tokens).now_ms(now_ms),
            candidates: pods(&PODS, running),
        })
        .collect()
}

/// Requests per pod among `placed`, in pod order.
fn per_pod(placed: &[&str]) -> Vec<u32> {
    PODS.iter()
        .map(|pod| placed.iter().filter(|&&p| p == *pod).count() as u32)
        .collect()
}

#[test]
fn later_windows_continue_the_groups_earlier_windows_placed() {
    let prompts: Vec<Vec<u32>> = (1..=4).map(|p| vec![p; 8]).collect();
    let continuing = instance(r#"{"blockSizeTokens": 4, "assignment": "fairShare"}"#);
    let alone =
        instance(r#"{"blockSizeTokens": 4, "assignment": "fairShare", "groupMemoryMs": 0}"#);
    for (producer, remembers) in [(&continuing, true), (&alone, false)] {
        // Window 1: two samples of each of four prompts; each prompt lands whole on a pod.
        let first: Vec<Request> = prompts
            .iter()
            .flat_map(|tokens| samples_at(0, 2, tokens, &[0; 4]))
            .collect();
        let placed = assigned(&first, &produce(producer, &first));
        let homes: Vec<&str> = (0..4).map(|p| placed[2 * p]).collect();
        assert!((0..4).all(|p| placed[2 * p + 1] == homes[p]));
        assert_eq!(homes.iter().collect::<BTreeSet<_>>().len(), 4);
        let mut running = per_pod(&placed);

        // Windows 2 to 9, 5 ms apart, each with one more sample of one prompt. With the plan
        // a sample follows its group, though its pod carries more than the others (the
        // groups are equal, so the plan stays balanced); placed alone, it goes to a least
        // loaded pod.
        for step in 0..8 {
            let p = [0, 0, 1, 2, 0, 3, 1, 1][step];
            let window = samples_at(5 * (step as u64 + 1), 1, &prompts[p], &running);
            let placed = assigned(&window, &produce(producer, &window))[0];
            let pod = PODS.iter().position(|&pod| pod == placed).unwrap();
            if remembers {
                assert_eq!(placed, homes[p], "step {step}");
            } else {
                assert_eq!(running[pod], *running.iter().min().unwrap(), "step {step}");
            }
            running[pod] += 1;
        }
    }

    // Past the memory (2 s by default) a group is placed afresh: the least loaded pod.
    let late = samples_at(10_000, 1, &prompts[0], &[5, 5, 0, 5]);
    assert_eq!(assigned(&late, &produce(&continuing, &late)), ["/pod3"]);
}

#[test]
fn a_group_that_outgrows_its_share_gets_a_second_home_and_the_fleet_stays_balanced() {
    // One prompt's 64 samples in windows of 4 over 4 pods: the plan first puts the group on
    // one pod, then spreads it as the balance requires, each new home kept for its part.
    let producer = instance(r#"{"blockSizeTokens": 4, "assignment": "fairShare"}"#);
    let mut running = vec![0u32; 4];
    let mut homes = BTreeSet::new();
    for window in 0..16 {
        let batch = samples_at(window, 4, &[1, 2, 3, 4, 5, 6, 7, 8], &running);
        for pod in assigned(&batch, &produce(&producer, &batch)) {
            homes.insert(pod.to_string());
            running[PODS.iter().position(|&p| p == pod).unwrap()] += 1;
        }
    }
    assert_eq!(running.iter().sum::<u32>(), 64);
    assert!(running.iter().all(|&n| n.abs_diff(16) <= 2), "{running:?}");
    assert_eq!(homes.len(), 4);
}

#[test]
fn new_prompts_sharing_most_blocks_in_one_window_land_together() {
    // Four system prompts of 8 blocks, each asked two different one-block questions, all in
    // one window before any is cached: the second question of a system prompt goes where the
    // first went, and each system prompt gets a pod of its own.
    let system = |s: u32| -> Vec<u32> { (0..32).map(|t| 1000 * s + t).collect() };
    let asked = |s: u32, q: u32| -> Vec<u32> {
        let mut tokens = system(s);
        tokens.extend([7000 + 10 * s + q; 4]);
        tokens
    };
    let producer = instance(r#"{"blockSizeTokens": 4, "assignment": "fairShare"}"#);
    let window: Vec<Request> = (1..=4u32)
        .flat_map(|s| [(s, 0), (s, 1)])
        .map(|(s, q)| Request {
            request: base("").tokens(&asked(s, q)).now_ms(0),
            candidates: pods(&PODS, &[0; 4]),
        })
        .collect();
    let placed = assigned(&window, &produce(&producer, &window));
    for s in 0..4 {
        assert_eq!(placed[2 * s], placed[2 * s + 1], "{placed:?}");
    }
    assert_eq!(per_pod(&placed), [2, 2, 2, 2], "{placed:?}");

    // Prompts that share only half their blocks are not relatives: three of them, each a
    // group of its own, spread over three pods.
    let halves: Vec<Request> = (0..3u32)
        .map(|q| {
            let mut tokens = system(3)[..16].to_vec();
            tokens.extend((0..16).map(|t| 9000 + 100 * q + t));
            Request {
                request: base("").tokens(&tokens).now_ms(10_000),
                candidates: pods(&PODS, &[0; 4]),
            }
        })
        .collect();
    let fresh = instance(r#"{"blockSizeTokens": 4, "assignment": "fairShare"}"#);
    let placed = assigned(&halves, &produce(&fresh, &halves));
    assert_eq!(
        placed.iter().collect::<BTreeSet<_>>().len(),
        3,
        "{placed:?}"
    );
}

/// The burst plan in `producer`'s state.
fn plan_state(producer: &Harness) -> serde_json::Value {
    let state = producer.state().expect("state").expect("a plan");
    state["plan"].clone()
}

#[test]
fn state_shows_the_groups_parts_and_the_loads_the_plan_saw() {
    let producer = instance(r#"{"blockSizeTokens": 4, "assignment": "fairShare"}"#);
    let reference = instance(r#"{"blockSizeTokens": 4}"#);
    assert_eq!(reference.state().expect("state"), None, "no plan, no state");

    // A burst's first window: pod4 carries 3 requests of other traffic; two prompts, three
    // samples each.
    let prompts: Vec<Vec<u32>> = (1..=2).map(|p| vec![p; 8]).collect();
    let first: Vec<Request> = prompts
        .iter()
        .flat_map(|tokens| samples_at(0, 3, tokens, &[0, 0, 0, 3]))
        .collect();
    let placed = assigned(&first, &produce(&producer, &first));
    // A later window of the same burst: one more sample of the first prompt.
    let later = samples_at(5, 1, &prompts[0], &[3, 3, 0, 3]);
    let followed = assigned(&later, &produce(&producer, &later));
    assert_eq!(followed[0], placed[0]);

    let plan = &plan_state(&producer);
    assert_eq!(plan["groupsRemembered"], 2, "{plan}");
    let groups = plan["groups"].as_array().expect("groups");
    assert_eq!(groups[0]["seen"], 4, "the most seen first: {plan}");
    assert_eq!(groups[1]["seen"], 3, "{plan}");
    assert_eq!(groups[0]["active"], true, "{plan}");
    assert_eq!(groups[0]["parts"][0]["replica"], placed[0], "{plan}");
    assert_eq!(groups[0]["parts"][0]["sent"], 4, "{plan}");
    assert_eq!(groups[1]["parts"][0]["replica"], placed[3], "{plan}");

    let start = &plan["burstStart"];
    assert_eq!(start["atMs"], 0, "{plan}");
    assert_eq!(start["requests"], 6, "{plan}");
    assert_eq!(start["groups"], 2, "{plan}");
    let pod4 = &start["replicas"][3];
    assert_eq!(pod4["id"], "/pod4", "{plan}");
    assert_eq!(pod4["carried"], 3, "{plan}");
    assert_eq!(
        pod4["unexplained"], 3.0,
        "other traffic, no group's: {plan}"
    );
    let latest = &plan["latestWindow"];
    assert_eq!(latest["atMs"], 5, "{plan}");
    assert_eq!(latest["requests"], 1, "{plan}");
    let home = PODS.iter().position(|&pod| pod == placed[0]).unwrap();
    assert_eq!(
        latest["replicas"][home]["unexplained"], 0.0,
        "what the pod carries is the group's: {plan}"
    );
    let planned: f64 = latest["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["planned"].as_f64().unwrap())
        .sum();
    assert!(planned > 0.0, "{plan}");
    assert_eq!(plan["previousBurstSizes"], serde_json::json!([]), "{plan}");
    assert_eq!(plan["previousBurst"], serde_json::Value::Null, "{plan}");
    assert_eq!(
        latest["newHomesWaitUpTo"],
        serde_json::Value::Null,
        "no burst to measure by: {plan}"
    );

    // A burst long after, its groups forgotten by then: the last one's sizes are kept.
    let next = samples_at(10_000, 2, &[9; 8], &[0; 4]);
    produce(&producer, &next);
    let plan = &plan_state(&producer);
    assert_eq!(
        plan["previousBurstSizes"],
        serde_json::json!([4, 3]),
        "{plan}"
    );
    assert_eq!(
        plan["previousBurst"],
        serde_json::json!({ "requests": 7, "lengthMs": 5 }),
        "its requests, from its first window to its last: {plan}"
    );
    assert_eq!(plan["burstStart"]["atMs"], 10_000, "{plan}");
    assert_eq!(plan["groupsRemembered"], 1, "{plan}");
}

#[test]
fn requests_the_plan_does_not_place_take_no_place_in_its_count_of_a_burst() {
    // A burst's window that begins with five requests without tokens (no affinity,
    // not placed by the plan), then two prompts of three samples each. The next burst, a
    // second later (the groups still remembered), takes the last one's sizes and requests as
    // its measure: six requests of two groups of three, however many unplaced requests came
    // before them in their window.
    let producer = instance(r#"{"blockSizeTokens": 4, "assignment": "fairShare"}"#);
    let mut window = samples_at(0, 5, &[], &[0; 4]);
    for tokens in [[1; 8], [2; 8]] {
        window.extend(samples_at(0, 3, &tokens, &[0; 4]));
    }
    let values = produce(&producer, &window);
    assert_eq!(assigned(&window, &values)[..5], ["-"; 5]);
    let next = samples_at(1_000, 2, &[9; 8], &[0; 4]);
    produce(&producer, &next);
    let plan = &plan_state(&producer);
    assert_eq!(
        plan["previousBurstSizes"],
        serde_json::json!([3, 3]),
        "{plan}"
    );
    assert_eq!(plan["previousBurst"]["requests"], 6, "{plan}");
}

/// Other producers' values for one request: `approx`'s published content hashes of `tokens`
/// in `block`-token blocks.
fn published_hashes(tokens: &[u32], block: usize) -> Attributes {
    use switchyard_prefix_hashing::{content_hashes_into, published::encode_content_hashes};
    let mut contents = Vec::new();
    content_hashes_into(tokens, block, usize::MAX, &mut contents);
    let mut bytes = Vec::new();
    encode_content_hashes(block as u32, &contents, &[contents.len()], &mut bytes);
    Attributes::new().set_on(
        DataKey::new(BLOCK_CONTENT_HASHES, "approx"),
        0,
        AttrValue::Custom(bytes.into()),
    )
}

#[test]
fn the_cache_estimators_published_content_hashes_are_chained_instead_of_the_prompt() {
    let parameters = r#"{"blockSizeTokens": 4, "assignment": "fairShare",
        "cachedMatchProducerName": "approx"}"#;
    let groups_seen = |attrs: &dyn Fn(usize) -> Attributes| {
        let producer = instance(parameters);
        // Four requests with four different prompts.
        let batch: Vec<Request> = (0..4u32)
            .map(|r| request(&[r + 1; 8], &["/pod1", "/pod2"]))
            .collect();
        let attrs: Vec<Attributes> = (0..4).map(attrs).collect();
        produce_seeing(&producer, &batch, &attrs);
        plan_state(&producer)["groupsRemembered"].clone()
    };
    assert_eq!(groups_seen(&|_| Attributes::new()), 4);
    // Published hashes are what is grouped: here every request's are those of one prompt (a
    // publisher never lies like this; it shows the prompts were not read again).
    assert_eq!(groups_seen(&|_| published_hashes(&[9; 8], 4)), 1);
    // Hashes of other blocks are passed over and the prompts hashed as always.
    assert_eq!(groups_seen(&|_| published_hashes(&[9; 8], 8)), 4);
    assert_eq!(
        groups_seen(&|r| published_hashes(&[r as u32 + 1; 8], 4)),
        4,
        "honest hashes group as the prompts do"
    );
}
