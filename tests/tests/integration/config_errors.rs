//! Configuration errors as an operator meets them: each names the file, the line, the plugin
//! and the field where it can, and no configuration, however malformed, panics the loader.

use std::panic::{catch_unwind, AssertUnwindSafe};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use switchyard_tests::{endpoints, generated_path, try_pipeline};

const LIBRARIES: &str = "allow_experimental_plugins = true\nlibraries = [\"burst_prefix_cache_producer\", \
     \"prefix_cache_affinity_filter\", \"prefix_cache_scorer\", \"approx_prefix_cache_producer\"]\n";

fn path_of(name: &str) -> String {
    generated_path(name).display().to_string()
}

/// 1-based line of the first line of `toml` that starts with `needle`.
fn line_of(toml: &str, needle: &str) -> usize {
    toml.lines()
        .position(|l| l.trim_start().starts_with(needle))
        .expect("needle in the document")
        + 1
}

fn error(name: &str, toml: &str) -> String {
    match try_pipeline(name, toml) {
        Ok(_) => panic!("{name}: the configuration is refused"),
        Err(e) => {
            assert!(e.starts_with(&path_of(name)), "{name}: names the file: {e}");
            e
        }
    }
}

fn base(extra_plugins: &str, profile: &str) -> String {
    format!(
        "{LIBRARIES}{}\n\
         [[plugins]]\ntype = \"token-producer\"\n\
         [[plugins]]\ntype = \"approx-prefix-cache-producer\"\n\
         {extra_plugins}\
         [[plugins]]\ntype = \"prefix-cache-scorer\"\n\
         [[plugins]]\ntype = \"max-score-picker\"\n\
         {profile}",
        endpoints(2)
    )
}

#[test]
fn the_base_configuration_is_valid() {
    let pipeline = try_pipeline("base", &base("", "")).expect("valid");
    assert!(pipeline.find("prefix-cache-scorer").is_some());
}

#[test]
fn out_of_range_parameter_names_file_line_plugin_field_and_range() {
    let toml = base(
        "[[plugins]]\ntype = \"burst-prefix-cache-producer\"\n[plugins.parameters]\n\
         maxPerReplica = -1\nwindowDurationMs = 0\n",
        "",
    );
    let e = error("window-zero", &toml);
    let line = line_of(&toml, "windowDurationMs");
    assert!(
        e.starts_with(&format!("{}:{line}:", path_of("window-zero"))),
        "line {line}: {e}"
    );
    assert!(e.contains("burst-prefix-cache-producer"), "{e}");
    assert!(
        e.contains("windowDurationMs must be in 1..=10000 (got 0)"),
        "{e}"
    );
}

#[test]
fn token_producer_backends_are_exclusive_and_its_file_must_load() {
    let with = |parameters: &str| {
        base("", "").replace(
            "type = \"token-producer\"\n",
            &format!("type = \"token-producer\"\n[plugins.parameters]\n{parameters}\n"),
        )
    };
    let toml = with("estimate = {}\ntokenizer = { path = \"tokenizer.json\" }");
    let e = error("two-tokenizers", &toml);
    let line = line_of(&toml, "tokenizer =");
    assert_eq!(
        e,
        format!(
            "{}:{line}: plugin 'token-producer': `estimate` and `tokenizer` are two backends; \
             set one of them, not both (tokenizer = {{ path = \"FILE\", chatTemplate = \
             \"FILE\" }} for a model's tokenizer.json and, optionally, its chat template)",
            path_of("two-tokenizers")
        )
    );
    // The path is taken relative to the config's directory, and named in full.
    let toml = with("tokenizer = { path = \"models/absent.json\" }");
    let e = error("absent-tokenizer", &toml);
    let line = line_of(&toml, "tokenizer =");
    let file = generated_path("absent-tokenizer")
        .with_file_name("models/absent.json")
        .display()
        .to_string();
    assert!(
        e.starts_with(&format!(
            "{}:{line}: plugin 'token-producer': cannot read tokenizer file {file}: ",
            path_of("absent-tokenizer")
        )),
        "{e}"
    );
    let toml = with("maxPromptBytes = 0");
    let e = error("prompt-bound", &toml);
    assert!(
        e.ends_with("maxPromptBytes must be in 1..=67108864 (got 0)"),
        "{e}"
    );
}

#[test]
fn unknown_parameter_field_is_named() {
    let toml = base(
        "[[plugins]]\ntype = \"inflight-load-producer\"\n",
        "",
    )
    .replace(
        "type = \"approx-prefix-cache-producer\"\n",
        "type = \"approx-prefix-cache-producer\"\n[plugins.parameters]\nautoTune = true\nlruCapacity = 5\n",
    );
    let e = error("unknown-field", &toml);
    assert!(e.contains("approx-prefix-cache-producer"), "{e}");
    assert!(e.contains("lruCapacity"), "{e}");
    let line = line_of(&toml, "lruCapacity ");
    assert!(
        e.starts_with(&format!("{}:{line}:", path_of("unknown-field"))),
        "line {line}: {e}"
    );
}

#[test]
fn unknown_plugin_type_lists_the_known_types() {
    let toml = base("[[plugins]]\ntype = \"prefix-cache-scorrer\"\n", "");
    let e = error("unknown-type", &toml);
    assert!(e.contains("prefix-cache-scorrer"), "{e}");
    for known in [
        "token-producer",
        "approx-prefix-cache-producer",
        "burst-prefix-cache-producer",
        "prefix-cache-affinity-filter",
        "prefix-cache-scorer",
        "max-score-picker",
        "inflight-load-producer",
    ] {
        assert!(e.contains(known), "lists {known}: {e}");
    }
    // The error points at the plugin's table, the line before its type.
    let line = line_of(&toml, "type = \"prefix-cache-scorrer\"") - 1;
    assert!(
        e.starts_with(&format!("{}:{line}:", path_of("unknown-type"))),
        "line {line}: {e}"
    );
}

#[test]
fn producer_used_as_a_filter_is_refused() {
    let profile = "[[profiles]]\nname = \"default\"\nfilters = [\"token-producer\"]\n\
                   scorers = [{ plugin = \"prefix-cache-scorer\", weight = 1.0 }]\n\
                   picker = \"max-score-picker\"\n";
    let e = error("producer-as-filter", &base("", profile));
    assert!(e.contains("token-producer"), "{e}");
    assert!(e.contains("filter"), "{e}");
    assert!(e.contains("producer"), "{e}");
}

#[test]
fn unknown_name_in_a_profile_is_refused() {
    let profile = "[[profiles]]\nname = \"default\"\n\
                   scorers = [{ plugin = \"prefix-cache-scorer\", weight = 1.0 }, \
                   { plugin = \"no-such-scorer\", weight = 1.0 }]\n\
                   picker = \"max-score-picker\"\n";
    let e = error("unknown-in-profile", &base("", profile));
    assert!(e.contains("no-such-scorer"), "{e}");
}

#[test]
fn duplicate_plugin_name_is_refused() {
    let toml = base(
        "[[plugins]]\nname = \"load\"\ntype = \"inflight-load-producer\"\n\
         [[plugins]]\nname = \"load\"\ntype = \"load-aware-scorer\"\n",
        "",
    );
    let e = error("duplicate-name", &toml);
    assert!(e.contains("'load'") || e.contains("\"load\""), "{e}");
    assert!(e.to_lowercase().contains("duplicate"), "{e}");
}

#[test]
fn required_key_without_a_producer_is_refused() {
    let toml = base("", "").replace(
        "type = \"prefix-cache-scorer\"\n",
        "type = \"prefix-cache-scorer\"\n[plugins.parameters]\nprefixMatchInfoProducerName = \"ghost\"\n",
    );
    let e = error("missing-producer", &toml);
    assert!(e.contains("PrefixCacheMatchInfo/ghost"), "{e}");
    assert!(e.contains("prefix-cache-scorer"), "{e}");
}

#[test]
fn affinity_filter_auto_creates_the_inflight_load_producer() {
    let toml = base("[[plugins]]\ntype = \"prefix-cache-affinity-filter\"\n", "");
    let pipeline = try_pipeline("auto-create", &toml).expect("valid");
    let index = pipeline
        .find("inflight-load-producer")
        .expect("the in-flight load producer is there");
    let plugin = pipeline.plugin(index);
    assert!(plugin.auto_created);
    assert_eq!(plugin.type_name, "inflight-load-producer");
    assert!(pipeline.producers.contains(&index));
    let listed = pipeline.find("approx-prefix-cache-producer").unwrap();
    assert!(!pipeline.plugin(listed).auto_created);
    let filter = pipeline.find("prefix-cache-affinity-filter").unwrap();
    assert_eq!(pipeline.filters, [filter]);
}

#[test]
fn producers_run_in_dependency_order_with_ties_in_config_order() {
    // The approx producer is listed before the token producer it depends on; the load
    // producer depends on nothing and is listed last.
    let toml = format!(
        "{LIBRARIES}{}\n\
         [[plugins]]\ntype = \"approx-prefix-cache-producer\"\n\
         [[plugins]]\ntype = \"token-producer\"\n\
         [[plugins]]\nname = \"burst\"\ntype = \"burst-prefix-cache-producer\"\n\
         [[plugins]]\ntype = \"inflight-load-producer\"\n\
         [[plugins]]\ntype = \"prefix-cache-scorer\"\n\
         [[plugins]]\ntype = \"max-score-picker\"\n",
        endpoints(2)
    );
    let pipeline = try_pipeline("topo", &toml).expect("valid");
    let order: Vec<&str> = pipeline
        .producers
        .iter()
        .map(|&i| pipeline.plugin(i).name.as_str())
        .collect();
    let pos = |n: &str| order.iter().position(|o| *o == n).unwrap();
    assert!(
        pos("token-producer") < pos("approx-prefix-cache-producer"),
        "{order:?}"
    );
    assert!(pos("token-producer") < pos("burst"), "{order:?}");
    assert!(
        pos("approx-prefix-cache-producer") < pos("burst"),
        "ties in config order: {order:?}"
    );
    assert!(
        pos("burst") < pos("inflight-load-producer"),
        "ties in config order: {order:?}"
    );
    assert_eq!(order.len(), 4, "{order:?}");
}

// A dependency cycle cannot be built from the shipped plugins (none consumes what a later
// one produces in a loop), so it is not tested here.

const TYPES: &[&str] = &[
    "token-producer",
    "burst-prefix-cache-producer",
    "approx-prefix-cache-producer",
    "inflight-load-producer",
    "prefix-cache-affinity-filter",
    "prefix-cache-scorer",
    "load-aware-scorer",
    "queue-scorer",
    "kv-cache-utilization-scorer",
    "max-score-picker",
    "random-picker",
    "weighted-random-picker",
    "no-such-type",
];

const FIELDS: &[&str] = &[
    "windowDurationMs",
    "maxPerReplica",
    "blockSizeTokens",
    "minColocateBlocks",
    "maxBatchSize",
    "balanceBy",
    "maxPrefixTokensToMatch",
    "affinityThreshold",
    "explorationProbability",
    "maxTTFTPenaltyMs",
    "ttftSource",
    "peakPrefillThroughput",
    "penaltyMode",
    "prefixMatchInfoProducerName",
    "inFlightLoadProducerName",
    "matchLengthWeight",
    "matchLengthScaleTokens",
    "autoTune",
    "blockSize",
    "maxPrefixBlocksToMatch",
    "lruCapacityPerServer",
    "maxNumOfEndpoints",
    "bogus",
];

fn random_value(rng: &mut SmallRng, depth: u32) -> String {
    match rng.random_range(0..12) {
        0 => rng.random_range(-5i64..5).to_string(),
        1 => i64::MAX.to_string(),
        2 => i64::MIN.to_string(),
        3 => format!("{:e}", rng.random::<f64>() * 1e300),
        4 => "-0.5".to_string(),
        5 => "nan".to_string(),
        6 => "inf".to_string(),
        7 => "true".to_string(),
        8 => format!(
            "\"{}\"",
            ["", "tokens", "requests", "static", "x\\u0000y", "é"][rng.random_range(0..6)]
        ),
        9 if depth < 2 => format!(
            "{{ {} = {} }}",
            FIELDS[rng.random_range(0..FIELDS.len())],
            random_value(rng, depth + 1)
        ),
        10 if depth < 2 => format!(
            "[{}, {}]",
            random_value(rng, depth + 1),
            random_value(rng, depth + 1)
        ),
        _ => rng.random_range(0u64..20_000).to_string(),
    }
}

fn random_document(rng: &mut SmallRng) -> String {
    let mut doc = String::new();
    if rng.random_bool(0.8) {
        doc.push_str(LIBRARIES);
    }
    if rng.random_bool(0.2) {
        doc.push_str("libraries = [\"no_such_library\"]\n");
    }
    if rng.random_bool(0.1) {
        doc.push_str("unknownTopLevel = 1\n");
    }
    doc.push_str(&endpoints(rng.random_range(0..4)));
    doc.push('\n');
    let mut names = Vec::new();
    for _ in 0..rng.random_range(0..7) {
        let type_name = TYPES[rng.random_range(0..TYPES.len())];
        doc.push_str("[[plugins]]\n");
        if rng.random_bool(0.9) {
            doc.push_str(&format!("type = \"{type_name}\"\n"));
        }
        if rng.random_bool(0.3) {
            let name = format!("p{}", rng.random_range(0..3));
            doc.push_str(&format!("name = \"{name}\"\n"));
            names.push(name);
        } else {
            names.push(type_name.to_string());
        }
        if rng.random_bool(0.6) {
            doc.push_str("[plugins.parameters]\n");
            for _ in 0..rng.random_range(0..4) {
                let field = FIELDS[rng.random_range(0..FIELDS.len())];
                doc.push_str(&format!("{field} = {}\n", random_value(rng, 0)));
            }
        }
    }
    if rng.random_bool(0.4) && !names.is_empty() {
        let pick = |rng: &mut SmallRng| names[rng.random_range(0..names.len())].clone();
        let filter = pick(rng);
        let scorer = pick(rng);
        let picker = pick(rng);
        let weight = random_value(rng, 1);
        doc.push_str(&format!(
            "[[profiles]]\nname = \"default\"\nfilters = [\"{filter}\"]\n\
             scorers = [{{ plugin = \"{scorer}\", weight = {weight} }}]\npicker = \"{picker}\"\n"
        ));
    }
    if rng.random_bool(0.05) {
        doc.push_str("[[plugins\n");
    }
    doc
}

#[test]
fn random_documents_never_panic_and_errors_name_the_file() {
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    let path = path_of("fuzz");
    let mut accepted = 0;
    for iteration in 0..300 {
        let doc = random_document(&mut rng);
        let result = catch_unwind(AssertUnwindSafe(|| try_pipeline("fuzz", &doc).map(|_| ())));
        match result {
            Err(_) => panic!("iteration {iteration} panicked on:\n{doc}"),
            Ok(Ok(())) => accepted += 1,
            Ok(Err(e)) => assert!(
                e.starts_with(&path),
                "iteration {iteration}: error does not start with the file path: {e}\n{doc}"
            ),
        }
    }
    // The generator is not so hostile that nothing passes, nor so tame that everything does.
    assert!(accepted < 300, "accepted {accepted}");
}
