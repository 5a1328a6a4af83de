use rand::rngs::SmallRng;
use rand::SeedableRng;
use switchyard_plugin_api::testing::{Attributes, Harness, TestEndpoint, TestRequest};
use switchyard_plugin_api::{AttrValue, ConsumedKey, DataKey, ErrorKind, PluginError};

use super::*;

fn instance(parameters: &str) -> Harness {
    Harness::new(&FACTORY, parameters).unwrap_or_else(|e| panic!("refused {parameters}: {e:?}"))
}

fn refused(parameters: &str) -> PluginError {
    match Harness::new(&FACTORY, parameters) {
        Ok(_) => panic!("accepted {parameters}"),
        Err(e) => e,
    }
}

/// The catalogue's endpoint: `PMI(matched, 100, 16)`, predicted TTFT and in-flight tokens; a
/// negative value leaves that attribute absent.
#[derive(Clone, Copy)]
struct Ep(i64, f64, i64);

const IDS: [&str; 4] = ["default/a", "default/b", "default/c", "default/d"];

/// The keys of the default producers, which these tests fill.
fn load_key() -> DataKey {
    DataKey::new("InFlightLoad", "inflight-load-producer")
}

fn prefix_key() -> DataKey {
    DataKey::new("PrefixCacheMatchInfo", "approx-prefix-cache-producer")
}

fn latency_key() -> DataKey {
    DataKey::new("LatencyPrediction", "predicted-latency-producer")
}

/// The attributes of `eps`, under every default key (absent where an `Ep` field is negative).
fn table(eps: &[Ep]) -> Attributes {
    let mut load = vec![AttrValue::Absent; eps.len()];
    let mut prefix = vec![AttrValue::Absent; eps.len()];
    let mut latency = vec![AttrValue::Absent; eps.len()];
    for (i, &Ep(matched, ttft, tokens)) in eps.iter().enumerate() {
        if tokens >= 0 {
            load[i] = Attributes::in_flight(0, tokens);
        }
        if matched >= 0 {
            prefix[i] = Attributes::prefix_match(matched as u64, 100, 16);
        }
        if ttft >= 0.0 {
            latency[i] = Attributes::latency(ttft, 0.0);
        }
    }
    Attributes::new()
        .set(load_key(), load)
        .set(prefix_key(), prefix)
        .set(latency_key(), latency)
}

/// One candidate per value of `table`'s prefix row, named after `IDS`.
fn endpoints(table: &Attributes) -> Vec<TestEndpoint> {
    let n = table.get(&prefix_key()).map_or(0, <[AttrValue]>::len);
    (0..n)
        .map(|i| {
            TestEndpoint::new(IDS[i])
                .address("10.0.0.1:8000")
                .host_index(7 + i as u32)
        })
        .collect()
}

fn request(random_seed: u64, explain: bool) -> TestRequest {
    TestRequest::new("m")
        .random_seed(random_seed)
        .explain(explain)
}

/// Runs one request through the boundary: the keep mask and the note.
fn run_with(filter: &Harness, table: &Attributes, seed: u64, explain: bool) -> (Vec<bool>, String) {
    let endpoints = endpoints(table);
    // Deliberately not all `true`: the filter must write every entry.
    let start = vec![false; endpoints.len()];
    let filtered = filter
        .filter_from(&request(seed, explain), &endpoints, table, start)
        .expect("filters");
    (filtered.keep, filtered.note)
}

fn run(parameters: &str, eps: &[Ep]) -> (Vec<bool>, String) {
    run_with(&instance(parameters), &table(eps), 1, true)
}

fn required(data_type: &str, producer: &str) -> ConsumedKey {
    ConsumedKey {
        key: DataKey::new(data_type, producer),
        required: true,
    }
}

fn consumes(parameters: &str) -> Vec<ConsumedKey> {
    let filter = instance(parameters);
    let declared = filter.declarations();
    assert!(declared.produces.is_empty());
    assert_eq!(declared.batch(), None);
    declared.consumes.to_vec()
}

const LATENCY_5000: &str = r#"{"maxTTFTPenaltyMs": 5000, "ttftSource": "latencyPredictor"}"#;

#[test]
fn f11_factory_describes_a_beta_filter() {
    assert_eq!(FACTORY.type_name, "prefix-cache-affinity-filter");
    assert_eq!(FACTORY.kind, PluginKind::Filter);
    assert_eq!(FACTORY.stability, Stability::Beta);
    let names: Vec<_> = FACTORY.parameters.iter().map(|p| p.name).collect();
    assert_eq!(
        names,
        [
            "affinityThreshold",
            "explorationProbability",
            "maxTTFTPenaltyMs",
            "ttftSource",
            "peakPrefillThroughput",
            "penaltyMode",
            "prefixMatchInfoProducerName",
            "inFlightLoadProducerName",
            "latencyPredictionInfoProducerName"
        ]
    );
    assert_eq!(parse_config("null").unwrap(), AffinityConfig::default());
}

#[test]
fn documented_defaults_decode_to_the_defaults() {
    for param in FACTORY.parameters {
        let value: serde_json::Value = serde_json::from_str(param.default).expect(param.name);
        let json = serde_json::json!({ param.name: value }).to_string();
        assert_eq!(
            parse_config(&json).expect(param.name),
            AffinityConfig::default(),
            "{}",
            param.name
        );
    }
}

#[test]
fn f10_declared_keys_follow_the_gate() {
    let prefix = required("PrefixCacheMatchInfo", "approx-prefix-cache-producer");
    assert_eq!(
        consumes(r#"{"maxTTFTPenaltyMs": 0}"#),
        std::slice::from_ref(&prefix)
    );
    assert_eq!(
        consumes(LATENCY_5000),
        [
            prefix.clone(),
            required("LatencyPrediction", "predicted-latency-producer")
        ]
    );
    let in_flight = required("InFlightLoad", "inflight-load-producer");
    assert_eq!(
        consumes(
            r#"{"maxTTFTPenaltyMs": 5000, "ttftSource": "prefillThroughput",
                "peakPrefillThroughput": 1000}"#
        ),
        [prefix.clone(), in_flight.clone()]
    );
    assert_eq!(consumes("null"), [prefix.clone(), in_flight.clone()]);
    assert_eq!(
        consumes(r#"{"penaltyMode": "matchedTokens", "maxTTFTPenaltyMs": 0}"#),
        [prefix, in_flight]
    );
}

#[test]
fn declared_keys_name_the_configured_producers() {
    let names = r#""prefixMatchInfoProducerName": "burst-prefix-cache-producer",
        "inFlightLoadProducerName": "load", "latencyPredictionInfoProducerName": "predictor""#;
    assert_eq!(
        consumes(&format!("{{{names}}}")),
        [
            required("PrefixCacheMatchInfo", "burst-prefix-cache-producer"),
            required("InFlightLoad", "load")
        ]
    );
    assert_eq!(
        consumes(&format!(
            "{{{names}, \"ttftSource\": \"latencyPredictor\"}}"
        )),
        [
            required("PrefixCacheMatchInfo", "burst-prefix-cache-producer"),
            required("LatencyPrediction", "predictor")
        ]
    );
}

#[test]
fn f4_narrows_to_sticky_through_the_boundary() {
    let eps = [Ep(90, 100.0, 0), Ep(85, 120.0, 0), Ep(10, 50.0, 0)];
    let (keep, note) = run(LATENCY_5000, &eps);
    assert_eq!(keep, [true, true, false]);
    assert_eq!(
        note,
        "narrowed to 2 sticky endpoints; TTFT gate held: TTFT gap 50 ms <= limit 5000 ms \
         (sticky 100 ms, non-sticky 50 ms) [compared sticky default/a with non-sticky default/c]"
    );
}

#[test]
fn f5_predicted_ttft_gap_releases() {
    let (keep, note) = run(
        r#"{"maxTTFTPenaltyMs": 100, "ttftSource": "latencyPredictor"}"#,
        &[Ep(90, 500.0, 0), Ep(10, 50.0, 0)],
    );
    assert_eq!(keep, [true, true]);
    assert_eq!(
        note,
        "TTFT gate released: TTFT gap 450 ms > limit 100 ms (sticky 500 ms, non-sticky 50 ms) \
         [compared sticky default/a with non-sticky default/b]"
    );
}

#[test]
fn f6_f7_throughput_gate_reads_in_flight_load() {
    let eps = [Ep(90, 10.0, 500), Ep(10, 10.0, 50)];
    let base = r#""ttftSource": "prefillThroughput", "peakPrefillThroughput": 1000"#;
    let (keep, _) = run(&format!("{{\"maxTTFTPenaltyMs\": 100, {base}}}"), &eps);
    assert_eq!(keep, [true, true]);
    let (keep, _) = run(&format!("{{\"maxTTFTPenaltyMs\": 1000, {base}}}"), &eps);
    assert_eq!(keep, [true, false]);
}

#[test]
fn f8_no_gate_without_penalty() {
    let (keep, note) = run(
        r#"{"maxTTFTPenaltyMs": 0, "peakPrefillThroughput": 1000}"#,
        &[Ep(90, 10.0, 5000), Ep(10, 10.0, 50)],
    );
    assert_eq!(keep, [true, false]);
    assert_eq!(note, "narrowed to 1 sticky endpoint");
}

#[test]
fn matched_tokens_gate_through_the_boundary() {
    // PMI(90, 100, 16) holds 1440 tokens; the gap is 1000 tokens.
    let (keep, note) = run(
        r#"{"penaltyMode": "matchedTokens"}"#,
        &[Ep(90, -1.0, 2000), Ep(10, -1.0, 1000)],
    );
    assert_eq!(keep, [true, false]);
    assert_eq!(
        note,
        "narrowed to 1 sticky endpoint; TTFT gate held: gap 1000 tokens <= matched 1440 \
         [compared sticky default/a with non-sticky default/b]"
    );
}

#[test]
fn note_is_written_only_for_explained_requests() {
    let filter = instance(LATENCY_5000);
    let table = table(&[Ep(90, 100.0, 0), Ep(85, 120.0, 0), Ep(10, 50.0, 0)]);
    let (keep, note) = run_with(&filter, &table, 1, false);
    assert_eq!(keep, [true, true, false]);
    assert_eq!(note, "");
}

#[test]
fn f9_exploration_keeps_all() {
    let (keep, note) = run(
        r#"{"explorationProbability": 1.0}"#,
        &[Ep(90, 100.0, 0), Ep(10, 50.0, 0)],
    );
    assert_eq!(keep, [true, true]);
    assert_eq!(note, "kept all: exploration");
}

#[test]
fn exploration_follows_the_request_seed() {
    let filter = instance(r#"{"explorationProbability": 0.5, "maxTTFTPenaltyMs": 0}"#);
    let table = table(&[Ep(90, 100.0, 0), Ep(10, 50.0, 0)]);
    let mut explored = 0;
    for seed in 0..32 {
        let expected = exploration_draw(&mut SmallRng::seed_from_u64(seed)) < 0.5;
        let (keep, _) = run_with(&filter, &table, seed, false);
        assert_eq!(keep, [true, expected], "seed {seed}");
        assert_eq!(
            run_with(&filter, &table, seed, false).0,
            keep,
            "seed {seed}"
        );
        explored += usize::from(expected);
    }
    assert!(0 < explored && explored < 32, "{explored}");
}

#[test]
fn wrong_variant_under_the_prefix_key_is_absent() {
    let filter = instance(r#"{"maxTTFTPenaltyMs": 0}"#);
    let mut table = table(&[Ep(90, -1.0, -1), Ep(10, -1.0, -1)]);
    assert_eq!(run_with(&filter, &table, 1, false).0, [true, false]);
    table = table.set_on(prefix_key(), 0, Attributes::in_flight(90, 100));
    let (keep, note) = run_with(&filter, &table, 1, true);
    assert_eq!(keep, [true, true]);
    assert_eq!(note, "kept all: no endpoint reaches affinityThreshold");
}

#[test]
fn wrong_variant_under_the_gate_key_is_absent() {
    let filter = instance(r#"{"maxTTFTPenaltyMs": 100, "ttftSource": "latencyPredictor"}"#);
    let mut table = table(&[Ep(90, 10.0, -1), Ep(10, 50.0, -1)]);
    assert_eq!(run_with(&filter, &table, 1, false).0, [true, false]);
    table = table.set_on(latency_key(), 0, Attributes::in_flight(0, 0));
    let (keep, note) = run_with(&filter, &table, 1, true);
    assert_eq!(keep, [true, true]);
    assert_eq!(
        note,
        "TTFT gate released: no TTFT prediction for the best sticky endpoint (non-sticky 50 ms) \
         [compared sticky default/a with non-sticky default/b]"
    );
}

#[test]
fn unproduced_prefix_key_keeps_all() {
    let filter = instance(r#"{"maxTTFTPenaltyMs": 0}"#);
    let endpoints: Vec<TestEndpoint> = (0..2)
        .map(|i| TestEndpoint::new(IDS[i]).address("").host_index(i as u32))
        .collect();
    // Nothing under the prefix key: the host hands the filter no row for it.
    let filtered = filter
        .filter_from(
            &request(1, false),
            &endpoints,
            &Attributes::new(),
            vec![false; 2],
        )
        .expect("filters");
    assert_eq!(filtered.keep, [true, true]);
}

#[test]
fn unknown_parameter_is_refused_by_name() {
    let e = refused(r#"{"affinityThreshhold": 0.9}"#);
    assert_eq!(e.kind, ErrorKind::InvalidParameter);
    assert_eq!(e.field.as_str(), "affinityThreshhold");
    assert!(
        e.message.contains("unknown field `affinityThreshhold`"),
        "{}",
        e.message
    );
}

#[test]
fn type_error_names_the_parameter() {
    let e = refused(r#"{"maxTTFTPenaltyMs": "soon"}"#);
    assert_eq!(e.kind, ErrorKind::InvalidParameter);
    assert_eq!(e.field.as_str(), "maxTTFTPenaltyMs");
}

#[test]
fn f13_validation_error_names_the_parameter() {
    let e = refused(r#"{"affinityThreshold": 1.5}"#);
    assert_eq!(e.kind, ErrorKind::InvalidParameter);
    assert_eq!(e.field.as_str(), "affinityThreshold");
    assert_eq!(
        e.message.as_str(),
        "affinityThreshold must be <= 1.0 (got 1.5); a value <= 0 disables the filter"
    );
    let e = refused(r#"{"penaltyMode": "matchedTokens", "ttftSource": "latencyPredictor"}"#);
    assert_eq!(e.field.as_str(), "penaltyMode");
}
