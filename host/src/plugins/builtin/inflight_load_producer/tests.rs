use switchyard_plugin_api::__abi_stable::std_types::RSlice;
use switchyard_plugin_api::{
    AttrValue, AttrView, ConsumedKey, DataKey, EndpointMetrics, EndpointView, InFlightLoad,
    Outcome, PluginInstance, ProduceItem, PromptTokens,
};

use super::FACTORY;
use crate::plugins::builtin::testing::{
    assert_registered, create, create_error, endpoint, request, seeded,
};

const ONE_HUNDRED: [u32; 100] = [7; 100];
const OTHER_HUNDRED: [u32; 100] = [8; 100];
const THREE: [u32; 3] = [1, 2, 3];

/// Three candidates whose host indexes differ from their slots.
fn candidates() -> Vec<EndpointView<'static>> {
    vec![
        endpoint(0, 5, EndpointMetrics::default()),
        endpoint(1, 2, EndpointMetrics::default()),
        endpoint(2, 9, EndpointMetrics::default()),
    ]
}

/// The `(requests, tokens)` one produce call reports for `endpoints`.
fn loads(instance: &PluginInstance, endpoints: &[EndpointView<'_>]) -> Vec<(i64, i64)> {
    let items = [ProduceItem {
        request: seeded(0),
        endpoints: RSlice::from_slice(endpoints),
        attrs: AttrView::EMPTY,
        out_offset: 0,
    }];
    let mut out = vec![AttrValue::Absent; endpoints.len()];
    instance.produce(&items, &mut out).unwrap();
    out.iter()
        .map(|value| {
            let load = value
                .in_flight_load()
                .expect("an InFlightLoad for every candidate");
            (load.requests, load.tokens)
        })
        .collect()
}

/// The tokens a dispatch of a request with `tokens` prompt tokens charges.
fn charged(parameters: &str, tokens: &[u32], max_output_tokens: i64) -> i64 {
    let instance = create(&FACTORY, parameters);
    let prompts = [PromptTokens {
        tokens: RSlice::from_slice(tokens),
    }];
    let target = endpoint(0, 0, EndpointMetrics::default());
    instance
        .dispatched(&request("a", &prompts, max_output_tokens, 0), &target)
        .unwrap();
    loads(&instance, &[target])[0].1
}

#[test]
fn idle_endpoints_report_zero() {
    let instance = create(&FACTORY, "null");
    assert_eq!(loads(&instance, &candidates()), [(0, 0); 3]);
}

#[test]
fn a_dispatch_is_visible_to_the_next_produce() {
    let instance = create(&FACTORY, "null");
    let endpoints = candidates();
    let long = [PromptTokens {
        tokens: RSlice::from_slice(&ONE_HUNDRED),
    }];
    let short = [PromptTokens {
        tokens: RSlice::from_slice(&THREE),
    }];
    instance
        .dispatched(&request("a", &long, -1, 0), &endpoints[1])
        .unwrap();
    assert_eq!(loads(&instance, &endpoints), [(0, 0), (1, 100), (0, 0)]);
    instance
        .dispatched(&request("b", &short, -1, 0), &endpoints[1])
        .unwrap();
    instance
        .dispatched(&request("c", &short, -1, 0), &endpoints[2])
        .unwrap();
    assert_eq!(loads(&instance, &endpoints), [(0, 0), (2, 103), (1, 3)]);
}

#[test]
fn counts_follow_the_host_index_not_the_slot() {
    let instance = create(&FACTORY, "null");
    let prompts = [PromptTokens {
        tokens: RSlice::from_slice(&THREE),
    }];
    instance
        .dispatched(&request("a", &prompts, -1, 0), &candidates()[2])
        .unwrap();
    // Host index 9 in another request's slot 0.
    let reordered = [
        endpoint(0, 9, EndpointMetrics::default()),
        endpoint(1, 5, EndpointMetrics::default()),
    ];
    assert_eq!(loads(&instance, &reordered), [(1, 3), (0, 0)]);
}

#[test]
fn a_completion_releases_its_own_charge_once() {
    let instance = create(&FACTORY, "null");
    let endpoints = candidates();
    let long = [PromptTokens {
        tokens: RSlice::from_slice(&ONE_HUNDRED),
    }];
    let short = [PromptTokens {
        tokens: RSlice::from_slice(&THREE),
    }];
    let a = request("a", &long, -1, 0);
    let b = request("b", &short, -1, 0);
    instance.dispatched(&a, &endpoints[0]).unwrap();
    instance.dispatched(&b, &endpoints[0]).unwrap();
    assert_eq!(loads(&instance, &endpoints)[0], (2, 103));

    instance
        .completed(&a, &endpoints[0], Outcome::Finished)
        .unwrap();
    assert_eq!(loads(&instance, &endpoints)[0], (1, 3));
    instance
        .completed(&a, &endpoints[0], Outcome::Finished)
        .unwrap();
    assert_eq!(loads(&instance, &endpoints)[0], (1, 3));

    instance
        .completed(&b, &endpoints[0], Outcome::Cancelled)
        .unwrap();
    assert_eq!(loads(&instance, &endpoints)[0], (0, 0));
}

#[test]
fn unknown_completions_change_nothing() {
    let instance = create(&FACTORY, "null");
    let endpoints = candidates();
    let prompts = [PromptTokens {
        tokens: RSlice::from_slice(&THREE),
    }];
    let a = request("a", &prompts, -1, 0);
    instance.dispatched(&a, &endpoints[0]).unwrap();
    let stranger = request("z", &prompts, -1, 0);
    instance
        .completed(&stranger, &endpoints[0], Outcome::Failed)
        .unwrap();
    // The right request on an endpoint it was never sent to.
    instance
        .completed(&a, &endpoints[1], Outcome::Finished)
        .unwrap();
    assert_eq!(loads(&instance, &endpoints), [(1, 3), (0, 0), (0, 0)]);
}

#[test]
fn a_repeated_dispatch_charges_once() {
    let instance = create(&FACTORY, "null");
    let endpoints = candidates();
    let prompts = [PromptTokens {
        tokens: RSlice::from_slice(&THREE),
    }];
    let a = request("a", &prompts, -1, 0);
    instance.dispatched(&a, &endpoints[0]).unwrap();
    instance.dispatched(&a, &endpoints[0]).unwrap();
    assert_eq!(loads(&instance, &endpoints)[0], (1, 3));
    instance
        .completed(&a, &endpoints[0], Outcome::Finished)
        .unwrap();
    assert_eq!(loads(&instance, &endpoints)[0], (0, 0));
}

#[test]
fn one_request_on_two_endpoints_is_released_per_endpoint() {
    let instance = create(&FACTORY, "null");
    let endpoints = candidates();
    let prompts = [PromptTokens {
        tokens: RSlice::from_slice(&THREE),
    }];
    let a = request("a", &prompts, -1, 0);
    instance.dispatched(&a, &endpoints[0]).unwrap();
    instance.dispatched(&a, &endpoints[2]).unwrap();
    assert_eq!(loads(&instance, &endpoints), [(1, 3), (0, 0), (1, 3)]);
    instance
        .completed(&a, &endpoints[2], Outcome::Finished)
        .unwrap();
    assert_eq!(loads(&instance, &endpoints), [(1, 3), (0, 0), (0, 0)]);
    instance
        .completed(&a, &endpoints[0], Outcome::Finished)
        .unwrap();
    assert_eq!(loads(&instance, &endpoints), [(0, 0); 3]);
}

#[test]
fn output_estimate_is_off_by_default() {
    assert_eq!(charged("null", &ONE_HUNDRED, -1), 100);
    assert_eq!(charged("null", &ONE_HUNDRED, 5), 100);
}

#[test]
fn output_estimate_adds_rounded_ratio_of_the_prompt() {
    let on = r#"{"addEstimatedOutputTokens": true}"#;
    assert_eq!(charged(on, &ONE_HUNDRED, -1), 100 + 150);
    // 3 × 1.5 = 4.5 rounds away from zero.
    assert_eq!(charged(on, &THREE, -1), 3 + 5);
    assert_eq!(charged(on, &[], -1), 0);
    let ratio = r#"{"addEstimatedOutputTokens": true, "outputRatio": 0.25}"#;
    assert_eq!(charged(ratio, &ONE_HUNDRED, -1), 100 + 25);
}

#[test]
fn output_estimate_caps() {
    let on = r#"{"addEstimatedOutputTokens": true}"#;
    assert_eq!(charged(on, &ONE_HUNDRED, 20), 100 + 20);
    assert_eq!(charged(on, &ONE_HUNDRED, 0), 100);
    let capped = r#"{"addEstimatedOutputTokens": true, "maxEstimatedOutputTokens": 10}"#;
    assert_eq!(charged(capped, &ONE_HUNDRED, -1), 100 + 10);
    assert_eq!(charged(capped, &ONE_HUNDRED, 20), 100 + 10);
    assert_eq!(charged(capped, &ONE_HUNDRED, 4), 100 + 4);
    let unset = r#"{"addEstimatedOutputTokens": true, "maxEstimatedOutputTokens": null}"#;
    assert_eq!(charged(unset, &ONE_HUNDRED, -1), 100 + 150);
}

#[test]
fn a_release_subtracts_the_estimate_it_added() {
    let instance = create(
        &FACTORY,
        r#"{"addEstimatedOutputTokens": true, "maxEstimatedOutputTokens": 40}"#,
    );
    let endpoints = candidates();
    let prompts = [PromptTokens {
        tokens: RSlice::from_slice(&ONE_HUNDRED),
    }];
    let other = [PromptTokens {
        tokens: RSlice::from_slice(&OTHER_HUNDRED),
    }];
    let a = request("a", &prompts, -1, 0);
    let b = request("b", &other, 7, 0);
    instance.dispatched(&a, &endpoints[1]).unwrap();
    instance.dispatched(&b, &endpoints[1]).unwrap();
    assert_eq!(loads(&instance, &endpoints)[1], (2, 140 + 107));
    instance
        .completed(&a, &endpoints[1], Outcome::Finished)
        .unwrap();
    assert_eq!(loads(&instance, &endpoints)[1], (1, 107));
}

#[test]
fn a_successor_with_other_parameters_releases_the_charges_it_took_over() {
    // The predecessor charged the output estimate; its successor does not, yet releases what
    // was charged.
    let before = create(
        &FACTORY,
        r#"{"addEstimatedOutputTokens": true, "maxEstimatedOutputTokens": 40}"#,
    );
    let endpoints = candidates();
    let prompts = [PromptTokens {
        tokens: RSlice::from_slice(&ONE_HUNDRED),
    }];
    let other = [PromptTokens {
        tokens: RSlice::from_slice(&OTHER_HUNDRED),
    }];
    let a = request("a", &prompts, -1, 0);
    let b = request("b", &other, -1, 0);
    before.dispatched(&a, &endpoints[1]).unwrap();
    before.dispatched(&a, &endpoints[2]).unwrap();
    before.dispatched(&b, &endpoints[1]).unwrap();
    let exported = before.extension("export_state", "").unwrap();

    let after = create(&FACTORY, "null");
    after.extension("import_state", &exported).unwrap();
    assert_eq!(loads(&after, &endpoints), loads(&before, &endpoints));
    assert_eq!(loads(&after, &endpoints)[1], (2, 280));
    after
        .completed(&a, &endpoints[1], Outcome::Finished)
        .unwrap();
    after
        .completed(&a, &endpoints[2], Outcome::Finished)
        .unwrap();
    assert_eq!(loads(&after, &endpoints), [(0, 0), (1, 140), (0, 0)]);
    // New dispatches charge by the successor's own parameters.
    let c = request("c", &prompts, -1, 0);
    after.dispatched(&c, &endpoints[0]).unwrap();
    assert_eq!(loads(&after, &endpoints)[0], (1, 100));

    let error = after
        .extension("import_state", r#"{"open": 3}"#)
        .unwrap_err();
    assert!(error.message.contains("open charges"), "{error}");
}

#[test]
fn declares_its_key_and_the_tokenized_prompt() {
    let declarations = create(&FACTORY, "null").declarations();
    assert_eq!(
        declarations.produces.as_slice(),
        [DataKey::new("InFlightLoad", "test")]
    );
    assert_eq!(
        declarations.consumes.as_slice(),
        [ConsumedKey {
            key: DataKey::new("TokenizedPrompt", "token-producer"),
            required: true,
        }]
    );
    assert!(declarations.batch().is_none());
}

#[test]
fn state_lists_busy_endpoints() {
    let instance = create(&FACTORY, "null");
    let prompts = [PromptTokens {
        tokens: RSlice::from_slice(&THREE),
    }];
    instance
        .dispatched(&request("a", &prompts, -1, 0), &candidates()[1])
        .unwrap();
    let state: serde_json::Value =
        serde_json::from_str(&instance.extension("state", "").unwrap()).unwrap();
    assert_eq!(
        state,
        serde_json::json!({
            "openRequests": 1,
            "endpoints": [{"hostIndex": 2, "requests": 1, "tokens": 3}],
        })
    );
}

#[test]
fn accepts_every_reference_parameter() {
    create(
        &FACTORY,
        r#"{"addEstimatedOutputTokens": true, "outputRatio": 0, "maxEstimatedOutputTokens": 0,
            "prefixMatchInfoProducerName": "burst", "syncCrossReplicaState": false}"#,
    );
}

#[test]
fn refuses_a_negative_output_ratio() {
    let error = create_error(&FACTORY, r#"{"outputRatio": -0.5}"#);
    assert_eq!(error.field.as_str(), "outputRatio");
    assert_eq!(
        error.message.as_str(),
        "outputRatio must be a finite number >= 0 (got -0.5)"
    );
}

#[test]
fn refuses_a_negative_output_cap() {
    let error = create_error(&FACTORY, r#"{"maxEstimatedOutputTokens": -1}"#);
    assert_eq!(error.field.as_str(), "maxEstimatedOutputTokens");
    assert_eq!(
        error.message.as_str(),
        "maxEstimatedOutputTokens must be >= 0 (got -1)"
    );
}

#[test]
fn refuses_cross_replica_sync() {
    let error = create_error(&FACTORY, r#"{"syncCrossReplicaState": true}"#);
    assert_eq!(error.field.as_str(), "syncCrossReplicaState");
    assert_eq!(
        error.message.as_str(),
        "syncCrossReplicaState is not supported (got true): in-flight counts are kept per \
         router replica; set it to false or remove it"
    );
}

#[test]
fn refuses_unknown_parameters() {
    let error = create_error(&FACTORY, r#"{"outputRatios": 1}"#);
    assert_eq!(error.field.as_str(), "outputRatios");
}

#[test]
fn the_produced_value_is_an_in_flight_load() {
    let instance = create(&FACTORY, "null");
    let endpoints = candidates();
    let items = [ProduceItem {
        request: seeded(0),
        endpoints: RSlice::from_slice(&endpoints[..1]),
        attrs: AttrView::EMPTY,
        out_offset: 1,
    }];
    let mut out = vec![AttrValue::Absent; 2];
    instance.produce(&items, &mut out).unwrap();
    assert_eq!(
        out,
        [
            AttrValue::Absent,
            AttrValue::InFlightLoad(InFlightLoad::default())
        ]
    );
}

#[test]
fn is_registered() {
    assert_registered(&FACTORY);
}

/// `n` distinct token ids starting at `from`.
fn tokens(from: u32, n: u32) -> Vec<u32> {
    (from..from + n).collect()
}

#[test]
fn samples_of_one_prompt_on_one_endpoint_charge_its_tokens_once() {
    let instance = create(&FACTORY, r#"{"blockSizeTokens": 16}"#);
    let endpoints = candidates();
    let prompt = tokens(0, 100);
    let prompts = [PromptTokens {
        tokens: RSlice::from_slice(&prompt),
    }];
    for id in ["a", "b", "c"] {
        instance
            .dispatched(&request(id, &prompts, -1, 0), &endpoints[1])
            .unwrap();
    }
    instance
        .dispatched(&request("d", &prompts, -1, 0), &endpoints[2])
        .unwrap();
    assert_eq!(loads(&instance, &endpoints), [(0, 0), (3, 100), (1, 100)]);

    // The first sample leaving releases its charge; the others still hold the prompt, so a new
    // sample there is not charged again.
    let a = request("a", &prompts, -1, 0);
    instance
        .completed(&a, &endpoints[1], Outcome::Finished)
        .unwrap();
    assert_eq!(loads(&instance, &endpoints)[1], (2, 0));
    instance
        .dispatched(&request("e", &prompts, -1, 0), &endpoints[1])
        .unwrap();
    assert_eq!(loads(&instance, &endpoints)[1], (3, 0));
    // Once none of them is in flight, the prompt is charged whole again.
    for id in ["b", "c", "e"] {
        instance
            .completed(
                &request(id, &prompts, -1, 0),
                &endpoints[1],
                Outcome::Finished,
            )
            .unwrap();
    }
    assert_eq!(loads(&instance, &endpoints)[1], (0, 0));
    instance
        .dispatched(&request("f", &prompts, -1, 0), &endpoints[1])
        .unwrap();
    assert_eq!(loads(&instance, &endpoints)[1], (1, 100));
}

#[test]
fn a_prompt_sharing_leading_blocks_is_charged_from_its_first_new_block() {
    let instance = create(&FACTORY, r#"{"blockSizeTokens": 16}"#);
    let endpoints = candidates();
    let system = tokens(0, 100);
    let mut question = tokens(0, 40);
    question.extend(tokens(5_000, 60));
    let (first, second) = (
        [PromptTokens {
            tokens: RSlice::from_slice(&system),
        }],
        [PromptTokens {
            tokens: RSlice::from_slice(&question),
        }],
    );
    instance
        .dispatched(&request("a", &first, -1, 0), &endpoints[0])
        .unwrap();
    instance
        .dispatched(&request("b", &second, -1, 0), &endpoints[0])
        .unwrap();
    // Two whole blocks of 16 are shared; the third differs from its 9th token on.
    assert_eq!(loads(&instance, &endpoints)[0], (2, 100 + 100 - 32));
}

#[test]
fn another_model_or_salt_shares_nothing() {
    let instance = create(&FACTORY, r#"{"blockSizeTokens": 16}"#);
    let endpoints = candidates();
    let prompt = tokens(0, 64);
    let prompts = [PromptTokens {
        tokens: RSlice::from_slice(&prompt),
    }];
    instance
        .dispatched(&request("a", &prompts, -1, 0), &endpoints[0])
        .unwrap();
    let mut salted = request("b", &prompts, -1, 0);
    salted.cache_salt = "tenant".into();
    instance.dispatched(&salted, &endpoints[0]).unwrap();
    assert_eq!(loads(&instance, &endpoints)[0], (2, 128));
}

#[test]
fn block_size_zero_charges_every_prompt_whole() {
    let instance = create(&FACTORY, r#"{"blockSizeTokens": 0}"#);
    let endpoints = candidates();
    let prompts = [PromptTokens {
        tokens: RSlice::from_slice(&ONE_HUNDRED),
    }];
    for id in ["a", "b"] {
        instance
            .dispatched(&request(id, &prompts, -1, 0), &endpoints[0])
            .unwrap();
    }
    assert_eq!(loads(&instance, &endpoints)[0], (2, 200));
    let error = create_error(&FACTORY, r#"{"blockSizeTokens": 2000000}"#);
    assert_eq!(error.field.as_str(), "blockSizeTokens");
    assert!(error.message.contains("0..=1048576"), "{error}");
}

#[test]
fn a_successor_keeps_the_shared_blocks_it_took_over() {
    let before = create(&FACTORY, "null");
    let endpoints = candidates();
    let prompt = tokens(0, 200);
    let prompts = [PromptTokens {
        tokens: RSlice::from_slice(&prompt),
    }];
    before
        .dispatched(&request("a", &prompts, -1, 0), &endpoints[0])
        .unwrap();
    let exported = before.extension("export_state", "").unwrap();
    let after = create(&FACTORY, "null");
    after.extension("import_state", &exported).unwrap();
    after
        .dispatched(&request("b", &prompts, -1, 0), &endpoints[0])
        .unwrap();
    assert_eq!(loads(&after, &endpoints)[0], (2, 200));

    // An export without blocks (from a version that kept none) still loads and releases.
    let plain = r#"{"open": [{"request": "a", "charges": [[5, 200]]}]}"#;
    let older = create(&FACTORY, "null");
    older.extension("import_state", plain).unwrap();
    assert_eq!(loads(&older, &endpoints)[0], (1, 200));
    older
        .completed(
            &request("a", &prompts, -1, 0),
            &endpoints[0],
            Outcome::Finished,
        )
        .unwrap();
    assert_eq!(loads(&older, &endpoints)[0], (0, 0));
}
