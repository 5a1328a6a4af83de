use super::*;
use serde_json::json;

fn small_rl() -> RlRolloutParams {
    RlRolloutParams {
        prompts: 3,
        samples: 4,
        steps: 2,
        step_interval_ms: 1000.0,
        prompt_tokens_min: 20,
        prompt_tokens_max: 40,
        output_tokens_min: 5,
        output_tokens_max: 9,
        arrival_spread_ms: 0.0,
        arrival_jitter_ms: 0.0,
        ..RlRolloutParams::default()
    }
}

#[test]
fn rl_defaults_are_32_prompts_by_16_samples_over_4_steps() {
    let p = RlRolloutParams::default();
    assert_eq!((p.prompts, p.samples, p.steps), (32, 16, 4));
    assert_eq!((p.prompt_tokens_min, p.prompt_tokens_max), (1024, 4096));
    assert_eq!((p.output_tokens_min, p.output_tokens_max), (128, 512));
    assert_eq!((p.arrival_spread_ms, p.arrival_jitter_ms), (30.0, 1.0));
    p.validate().unwrap();
    let w = p.generate();
    assert_eq!(w.len(), 32 * 16 * 4);
    for step in 0..4u32 {
        let in_step: Vec<_> = w.iter().filter(|r| r.step == Some(step)).collect();
        assert_eq!(in_step.len(), 512);
        let start = f64::from(step) * 30_000.0;
        assert!(in_step
            .iter()
            .all(|r| (start..start + 30.0 + JITTER_BOUND).contains(&r.arrival_ms)));
    }
}

#[test]
fn rl_samples_of_a_prompt_are_identical_and_prompts_differ() {
    let p = small_rl();
    let w = p.generate();
    assert_eq!(w.len(), 3 * 4 * 2);
    assert_eq!(
        w.iter().map(|r| r.id).collect::<Vec<_>>(),
        (0..24).collect::<Vec<_>>()
    );
    for r in &w {
        assert!((20..=40).contains(&r.tokens.len()));
        assert!((5..=9).contains(&r.output_tokens));
        let step = r.step.unwrap();
        assert_eq!(r.arrival_ms, f64::from(step) * 1000.0);
        assert_eq!(r.group / 3, u64::from(step));
        assert_eq!(r.model, "sim-model");
    }
    for g in 0..6u64 {
        let members: Vec<_> = w.iter().filter(|r| r.group == g).collect();
        assert_eq!(members.len(), 4);
        assert!(members.iter().all(|r| r.tokens == members[0].tokens));
    }
    let firsts: Vec<&crate::sim::Tokens> = (0..6u64)
        .map(|g| &w.iter().find(|r| r.group == g).unwrap().tokens)
        .collect();
    for i in 0..6 {
        for j in i + 1..6 {
            assert_ne!(firsts[i], firsts[j]);
        }
    }
}

#[test]
fn rl_samples_share_their_prompts_buffer() {
    for interleaved in [false, true] {
        let w = RlRolloutParams {
            interleaved,
            ..small_rl()
        }
        .generate();
        for g in 0..6u64 {
            let members: Vec<_> = w.iter().filter(|r| r.group == g).collect();
            assert!(members
                .iter()
                .all(|r| r.tokens.shares_buffer_with(&members[0].tokens)));
        }
        let first = &w[0].tokens;
        assert!(w
            .iter()
            .filter(|r| r.group != w[0].group)
            .all(|r| !r.tokens.shares_buffer_with(first)));
    }
}

#[test]
fn streamed_requests_are_numbered_in_arrival_order_and_sized_ahead() {
    let rl = Workload::RlRollout(RlRolloutParams {
        interleaved: true,
        ..small_rl()
    });
    let sp =
        Workload::from_name("shared-prefix", json!({"groups": 3, "promptsPerGroup": 5})).unwrap();
    let mt = Workload::MultiTurn(MultiTurnParams::default());
    for w in [rl, sp, mt] {
        let requests = w.generate();
        assert_eq!(requests.len(), w.len());
        assert_eq!(w.requests().size_hint(), (w.len(), Some(w.len())));
        for (i, r) in requests.iter().enumerate() {
            assert_eq!(r.id, i as u64);
        }
        assert!(requests
            .windows(2)
            .all(|p| p[0].arrival_ms <= p[1].arrival_ms));
        assert_eq!(requests, w.requests().collect::<Vec<_>>(), "{}", w.name());
    }
}

#[test]
fn rl_arrival_order_is_grouped_or_interleaved() {
    let grouped = small_rl().generate();
    let groups: Vec<u64> = grouped.iter().take(12).map(|r| r.group).collect();
    assert_eq!(groups, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
    let interleaved = RlRolloutParams {
        interleaved: true,
        ..small_rl()
    }
    .generate();
    let groups: Vec<u64> = interleaved.iter().take(12).map(|r| r.group).collect();
    assert_eq!(groups, [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]);
}

#[test]
fn shared_prefix_groups_share_exactly_the_system_prompt() {
    let p = SharedPrefixParams {
        groups: 3,
        prompts_per_group: 4,
        system_prompt_tokens: 32,
        question_tokens: 8,
        output_tokens: 7,
        requests_per_second: 100.0,
        arrival_spread_ms: 0.0,
        arrival_jitter_ms: 0.0,
        ..SharedPrefixParams::default()
    };
    p.validate().unwrap();
    let w = p.generate();
    assert_eq!(w.len(), 12);
    assert_eq!(w[0].arrival_ms, 0.0);
    assert!(w.windows(2).all(|p| p[0].arrival_ms <= p[1].arrival_ms));
    for g in 0..3u64 {
        let members: Vec<_> = w.iter().filter(|r| r.group == g).collect();
        assert_eq!(members.len(), 4);
        for r in &members {
            assert_eq!(r.tokens.len(), 40);
            assert_eq!(r.tokens[..32], members[0].tokens[..32]);
            assert_eq!(r.output_tokens, 7);
            assert_eq!(r.step, None);
        }
        for i in 0..4 {
            for j in i + 1..4 {
                assert_ne!(members[i].tokens[32..], members[j].tokens[32..]);
            }
        }
    }
    let system = |g: u64| w.iter().find(|r| r.group == g).unwrap().tokens[..32].to_vec();
    assert_ne!(system(0), system(1));
    assert_ne!(system(1), system(2));
}

#[test]
fn shared_prefix_defaults() {
    let p = SharedPrefixParams::default();
    assert_eq!((p.groups, p.prompts_per_group), (64, 16));
    assert_eq!(
        (p.system_prompt_tokens, p.question_tokens, p.output_tokens),
        (2048, 128, 256)
    );
    p.validate().unwrap();
}

#[test]
fn kv_pressure_requests_are_a_tenants_prefix_and_a_question_of_their_own() {
    let p = KvPressureParams {
        tenants: 3,
        prefix_tokens: 32,
        question_tokens_min: 4,
        question_tokens_max: 9,
        output_tokens_min: 2,
        output_tokens_max: 5,
        requests: 60,
        requests_per_second: 100.0,
        arrival_spread_ms: 0.0,
        arrival_jitter_ms: 0.0,
        ..KvPressureParams::default()
    };
    p.validate().unwrap();
    let w = p.generate();
    assert_eq!(w.len(), 60);
    assert_eq!(w[0].arrival_ms, 0.0);
    assert_numbered_in_arrival_order(&w, "kv-pressure");
    // 60 gaps of mean 10 ms.
    let last = w.last().unwrap().arrival_ms;
    assert!((300.0..1200.0).contains(&last), "{last}");
    for r in &w {
        assert!((36..=41).contains(&r.tokens.len()), "{}", r.tokens.len());
        assert!((2..=5).contains(&r.output_tokens));
        assert_eq!(r.step, None);
        assert!(r.group < 3);
    }
    for t in 0..3u64 {
        let members: Vec<_> = w.iter().filter(|r| r.group == t).collect();
        assert!(members.len() >= 5, "tenant {t}: {}", members.len());
        for r in &members {
            assert_eq!(r.tokens[..32], members[0].tokens[..32]);
        }
    }
    let prefix = |t: u64| w.iter().find(|r| r.group == t).unwrap().tokens[..32].to_vec();
    assert_ne!(prefix(0), prefix(1));
    assert_ne!(prefix(1), prefix(2));
    let questions: std::collections::HashSet<Vec<u32>> =
        w.iter().map(|r| r.tokens[32..].to_vec()).collect();
    assert_eq!(questions.len(), 60, "every question is its own");
    assert_eq!(p.generate(), w, "the same seed, the same requests");
}

#[test]
fn kv_pressure_defaults_and_ranges() {
    let p = KvPressureParams::default();
    assert_eq!((p.tenants, p.prefix_tokens, p.requests), (200, 6000, 2000));
    assert_eq!((p.question_tokens_min, p.question_tokens_max), (600, 1200));
    assert_eq!((p.output_tokens_min, p.output_tokens_max), (1000, 2000));
    assert_eq!(p.requests_per_second, 8.0);
    p.validate().unwrap();
    let err = |set: serde_json::Value| {
        Workload::from_name("kv-pressure", set)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(json!({"tenants": 0})),
        "workload kv-pressure: tenants must be in 1..=100000 (got 0)"
    );
    assert_eq!(
        err(json!({"prefixTokens": 0})),
        "workload kv-pressure: prefixTokens must be in 1..=1000000 (got 0)"
    );
    assert_eq!(
        err(json!({"questionTokensMin": 50, "questionTokensMax": 10})),
        "workload kv-pressure: questionTokensMax must be >= questionTokensMin (50) (got 10)"
    );
    assert_eq!(
        err(json!({"requests": 20000000})),
        "workload kv-pressure: requests must be in 1..=10000000 (got 20000000)"
    );
    assert_eq!(
        err(json!({"requestsPerSecond": 0})),
        "workload kv-pressure: requestsPerSecond must be in (0, 1000000] (got 0)"
    );
    assert_eq!(
        err(json!({"tenants": "many"})),
        r#"workload kv-pressure: tenants must be an integer in 1..=100000 (got "many")"#
    );
    let w = Workload::from_name("kv-pressure", json!({"requests": 3})).unwrap();
    assert_eq!(w.len(), 3);
    assert_eq!(w.parameters()["tenants"], 200);
    let big = Workload::from_name(
        "kv-pressure",
        json!({"requests": 10000000, "prefixTokens": 1000000}),
    )
    .unwrap();
    let message = big.check_memory(1 << 30, "test").unwrap_err().to_string();
    assert!(
        message.contains("lower requests, tenants, prefixTokens or questionTokensMax"),
        "{message}"
    );
}

#[test]
fn multi_turn_prompts_extend_the_previous_turn() {
    let p = MultiTurnParams {
        sessions: 2,
        turns: 3,
        system_prompt_tokens: 16,
        user_tokens_min: 4,
        user_tokens_max: 8,
        output_tokens_min: 2,
        output_tokens_max: 5,
        think_time_ms: 1000.0,
        arrival_spread_ms: 0.0,
        arrival_jitter_ms: 0.0,
        ..MultiTurnParams::default()
    };
    p.validate().unwrap();
    let w = p.generate();
    assert_eq!(w.len(), 6);
    for s in 0..2u64 {
        let turns: Vec<_> = w.iter().filter(|r| r.group == s).collect();
        assert_eq!(turns.len(), 3);
        assert!((16 + 4..=16 + 8).contains(&turns[0].tokens.len()));
        for t in 1..3 {
            let (prev, next) = (turns[t - 1], turns[t]);
            assert!(next.tokens.starts_with(&prev.tokens));
            assert!(next.tokens.shares_buffer_with(&prev.tokens));
            let added = next.tokens.len() - prev.tokens.len() - prev.output_tokens as usize;
            assert!((4..=8).contains(&added), "user message of {added} tokens");
            let gap = next.arrival_ms - prev.arrival_ms;
            assert!((500.0..=1500.0).contains(&gap), "think time {gap}");
        }
    }
}

#[test]
fn same_seed_same_requests_other_seed_other_requests() {
    let a = Workload::from_name("shared-prefix", json!({"groups": 2, "seed": 3})).unwrap();
    let b = Workload::from_name("shared-prefix", json!({"groups": 2, "seed": 3})).unwrap();
    let c = Workload::from_name("shared-prefix", json!({"groups": 2, "seed": 4})).unwrap();
    assert_eq!(a.generate(), b.generate());
    assert_ne!(a.generate(), c.generate());
    let m = MultiTurnParams::default();
    assert_eq!(m.generate(), m.generate());
}

#[test]
fn workloads_by_name_with_overrides() {
    let w = Workload::from_name(
        "rl-rollout",
        json!({"prompts": 2, "samples": 3, "steps": 1}),
    )
    .unwrap();
    assert_eq!(w.name(), "rl-rollout");
    assert_eq!(w.generate().len(), 6);
    let w = Workload::from_name("multi-turn", serde_json::Value::Null).unwrap();
    assert_eq!(w, Workload::MultiTurn(MultiTurnParams::default()));

    let err = Workload::from_name("rl", json!({})).unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown workload `rl` (expected one of: rl-rollout, shared-prefix, multi-turn, \
         kv-pressure)"
    );
    let err = Workload::from_name("rl-rollout", json!({"prompt": 2})).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("workload rl-rollout: unknown parameter \"prompt\" in --set"),
        "{err}"
    );
}

#[test]
fn invalid_parameters_name_field_value_and_range() {
    let err = Workload::from_name("rl-rollout", json!({"samples": 0})).unwrap_err();
    let WorkloadError::Invalid { source, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(source.field, "samples");
    assert_eq!(
        err.to_string(),
        "workload rl-rollout: samples must be in 1..=10000 (got 0)"
    );

    let err = RlRolloutParams {
        prompt_tokens_max: 10,
        ..RlRolloutParams::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(err.field, "promptTokensMax");
    assert_eq!(
        err.message,
        "promptTokensMax must be >= promptTokensMin (1024) (got 10)"
    );

    let err = SharedPrefixParams {
        requests_per_second: 0.0,
        ..SharedPrefixParams::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(
        err.message,
        "requestsPerSecond must be in (0, 1000000] (got 0)"
    );

    let err = MultiTurnParams {
        think_time_ms: -1.0,
        ..MultiTurnParams::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(
        err.message,
        "thinkTimeMs must be in [0, 1000000000] (got -1)"
    );
}

#[test]
fn trace_comments_byte_order_mark_and_invalid_utf8_are_handled_like_replay_input() {
    let bytes =
        b"\xEF\xBB\xBF# a trace\n{\"arrival_ms\": 0, \"tokens\": [1], \"output_tokens\": 1}\n";
    let w = super::trace::parse_trace_bytes(bytes).unwrap();
    assert_eq!(w.len(), 1);
    let error = super::trace::parse_trace_bytes(b"# ok\n{\"prompt\": \"\xff\"}\n").unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("trace line 2: not valid UTF-8"),
        "{error}"
    );
}

#[test]
fn trace_lines_become_requests_in_arrival_order() {
    let text = r#"{"arrival_ms": 5, "model": "m", "prompt": "hello world", "output_tokens": 3}

{"arrival_ms": 1.5, "tokens": [1, 2, 3], "cache_salt": "s", "output_tokens": 9, "group": 4, "step": 2}
"#;
    let w = parse_trace(text).unwrap();
    assert_eq!(w.len(), 2);
    assert_eq!(w[0].id, 0);
    assert_eq!(w[0].arrival_ms, 1.5);
    assert_eq!(*w[0].tokens, [1, 2, 3]);
    assert_eq!(
        (w[0].cache_salt.as_str(), w[0].group, w[0].step),
        ("s", 4, Some(2))
    );
    assert_eq!(w[0].model, "");
    assert_eq!(w[1].id, 1);
    assert_eq!(w[1].model, "m");
    assert_eq!(*w[1].tokens, [1819043176, 1870078063, 6581362]);
    assert_eq!(w[1].output_tokens, 3);
}

#[test]
fn prompt_estimate_pads_the_last_word_with_zeros() {
    let estimate = crate::pipeline::tokenize::PromptTokenizer::estimate();
    let tokens = |text: &str| prompt_to_tokens(text.to_string(), &estimate);
    assert_eq!(tokens("abcd"), vec![u32::from_le_bytes(*b"abcd")]);
    assert_eq!(tokens("abcde"), vec![u32::from_le_bytes(*b"abcd"), 0x65]);
    assert_eq!(tokens(""), Vec::<u32>::new());
}

#[test]
fn trace_errors_name_the_line() {
    let good = r#"{"arrival_ms": 0, "tokens": [1], "output_tokens": 1}"#;
    let cases = [
        (r#"{"arrival_ms": 0, "tokens": [1]}"#, "trace line 3: missing field `output_tokens` (column 32)"),
        (r#"{"arrival_ms": 0, "output_tokens": 1}"#, "trace line 3: missing `tokens` or `prompt`"),
        (
            r#"{"arrival_ms": 0, "tokens": [1], "prompt": "x", "output_tokens": 1}"#,
            "trace line 3: give either `tokens` or `prompt`, not both",
        ),
        (
            r#"{"arrival_ms": -2, "tokens": [1], "output_tokens": 1}"#,
            "trace line 3: arrival_ms must be a finite number >= 0 (got -2)",
        ),
        (
            r#"{"arrival_ms": 0, "tokens": [1], "output_tokens": 0}"#,
            "trace line 3: output_tokens must be in 1..=4294967295 (got 0)",
        ),
        (r#"{"arrival_ms": 0, "prompt": "", "output_tokens": 1}"#, "trace line 3: the prompt is empty"),
        (
            r#"{"arrival_ms": 0, "tokens": [1], "output_tokens": 1, "extra": 1}"#,
            "trace line 3: extra: unknown field `extra`, expected one of `arrival_ms`, `output_tokens`, `tokens`, `prompt`, `model`, `cache_salt`, `group`, `step` (column 60)",
        ),
        ("not json", "trace line 3: expected ident (column 2)"),
    ];
    for (bad, expected) in cases {
        let text = format!("{good}\n\n{bad}\n{good}\n");
        let err = parse_trace(&text).unwrap_err();
        assert!(matches!(err, TraceError::Line { line: 3, .. }));
        assert_eq!(err.to_string(), expected);
    }
}

#[test]
fn missing_trace_file_names_the_path() {
    let path = std::path::Path::new("no-such-dir/trace.jsonl");
    let err = read_trace(path, &Default::default()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("cannot read trace no-such-dir/trace.jsonl: "),
        "{err}"
    );
}

#[test]
fn trace_text_is_tokenized_by_the_given_tokenizer() {
    let dir = std::env::temp_dir().join(format!("switchyard-trace-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.jsonl");
    std::fs::write(
        &path,
        "{\"arrival_ms\": 0, \"prompt\": \"hello world\", \"output_tokens\": 1}\n",
    )
    .unwrap();
    let tokenizer = crate::pipeline::tokenize::tests::loaded(true, 1 << 20);
    let exact = read_trace(&path, &tokenizer).unwrap();
    assert_eq!(*exact[0].tokens, [0, 2, 3]);
    let estimated = read_trace(&path, &Default::default()).unwrap();
    assert_eq!(*estimated[0].tokens, [1819043176, 1870078063, 6581362]);
}

#[test]
fn memory_estimates_grow_with_the_work_and_refuse_over_the_limit() {
    let rl = |set: serde_json::Value| Workload::from_name("rl-rollout", set).unwrap();
    let small = rl(json!({}));
    let million = rl(json!({"steps": 1954}));
    let huge = rl(json!({"steps": 19000}));
    assert!(small.memory_estimate() < 64 << 20);
    assert!(million.memory_estimate() < 1 << 30);
    assert!(huge.memory_estimate() > 4 * million.memory_estimate());
    // Every step at once keeps every prompt of every request in flight.
    let burst = rl(json!({"steps": 1954, "stepIntervalMs": 0}));
    assert!(burst.memory_estimate() > 8 << 30);
    million.check_memory(1 << 30, "test").unwrap();
    let message = huge.check_memory(1 << 30, "test").unwrap_err().to_string();
    assert!(
        message.starts_with("workload rl-rollout: this run needs an estimated ")
            && message.contains("over the limit of 1.0 GiB (test)")
            && message.contains("lower steps, prompts, samples or promptTokensMax"),
        "{message}"
    );
    let long = Workload::from_name("multi-turn", json!({"turns": 1000})).unwrap();
    assert!(long.memory_estimate() < 1 << 30);
    let wide = Workload::from_name(
        "shared-prefix",
        json!({"groups": 100000, "systemPromptTokens": 1000000}),
    )
    .unwrap();
    assert!(wide.memory_estimate() > 100 << 30);
}

#[test]
fn a_mistyped_parameter_is_named_with_what_it_takes() {
    let err = |name: &str, set: serde_json::Value| {
        Workload::from_name(name, set).unwrap_err().to_string()
    };
    assert_eq!(
        err("rl-rollout", json!({"prompts": "abc"})),
        r#"workload rl-rollout: prompts must be an integer in 1..=100000 (got "abc")"#
    );
    assert_eq!(
        err("multi-turn", json!({"turns": -1})),
        "workload multi-turn: turns must be an integer in 1..=1000 (got -1)"
    );
    assert_eq!(
        err("shared-prefix", json!({"requestsPerSecond": "fast"})),
        r#"workload shared-prefix: requestsPerSecond must be a number in (0, 1e6] (got "fast")"#
    );
    assert_eq!(
        err("rl-rollout", json!({"interleaved": 1})),
        "workload rl-rollout: interleaved must be true or false (got 1)"
    );
    assert!(err("rl-rollout", json!({"nope": 1})).contains("unknown parameter \"nope\""));
    assert_eq!(format_bytes(3 << 29), "1.5 GiB");
    assert_eq!(parse_bytes("4G"), Some(4 << 30));
    assert_eq!(parse_bytes("512MiB"), Some(512 << 20));
    assert_eq!(parse_bytes("1024"), Some(1024));
    assert_eq!(parse_bytes("lots"), None);
}

#[test]
fn rl_steps_that_outlast_their_interval_count_every_prompt_in_flight() {
    let huge = Workload::from_name(
        "rl-rollout",
        json!({"promptTokensMin": 1000000, "promptTokensMax": 1000000}),
    )
    .unwrap();
    // 2048 prompts of 4 MB, all in flight: a pipeline holds a copy of each.
    assert!(huge.memory_estimate() > 8 << 30);
}

/// The field names serde lists for an unknown field of `T`.
fn declared_fields<T: serde::de::DeserializeOwned>() -> Vec<String> {
    let message = serde_json::from_value::<T>(json!({ "notAParameter": 1 }))
        .err()
        .expect("an unknown field is refused")
        .to_string();
    let list = message
        .split("expected one of")
        .nth(1)
        .expect("fields listed");
    list.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn every_declared_parameter_is_known_and_an_unknown_one_lists_them() {
    let declared = [
        ("rl-rollout", declared_fields::<RlRolloutParams>()),
        ("shared-prefix", declared_fields::<SharedPrefixParams>()),
        ("multi-turn", declared_fields::<MultiTurnParams>()),
        ("kv-pressure", declared_fields::<KvPressureParams>()),
    ];
    for (workload, fields) in declared {
        assert!(fields.len() >= 5, "{workload}: {fields:?}");
        assert!(fields.iter().any(|f| f == "arrivalSpreadMs"), "{workload}");
        for field in &fields {
            assert!(
                valid_values(workload, field).is_some(),
                "{workload}: {field} has no documented range"
            );
        }
        let error = Workload::from_name(workload, json!({ "nosuch": 1 }))
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown parameter \"nosuch\""), "{error}");
        for field in &fields {
            assert!(
                error.contains(field.as_str()),
                "{workload}: {field} in {error}"
            );
        }
    }
}

/// Beyond any exponential jitter of mean 1 ms these tests draw (probability e^-40 each).
const JITTER_BOUND: f64 = 40.0;

/// `(workload name, overrides)` of small instances of every generator, steps overlapping.
fn small_workloads() -> Vec<(&'static str, serde_json::Value)> {
    vec![
        (
            "rl-rollout",
            json!({"prompts": 5, "samples": 8, "steps": 3, "stepIntervalMs": 1000,
                   "promptTokensMin": 20, "promptTokensMax": 40}),
        ),
        (
            "rl-rollout",
            json!({"prompts": 3, "samples": 4, "steps": 4, "stepIntervalMs": 10,
                   "interleaved": true, "promptTokensMin": 20, "promptTokensMax": 40}),
        ),
        (
            "rl-rollout",
            json!({"prompts": 2, "samples": 3, "steps": 3, "stepIntervalMs": 0,
                   "promptTokensMin": 20, "promptTokensMax": 40}),
        ),
        (
            "shared-prefix",
            json!({"groups": 4, "promptsPerGroup": 10, "systemPromptTokens": 32,
                   "requestsPerSecond": 200}),
        ),
        (
            "multi-turn",
            json!({"sessions": 5, "turns": 4, "thinkTimeMs": 20}),
        ),
        (
            "multi-turn",
            json!({"sessions": 3, "turns": 4, "thinkTimeMs": 0}),
        ),
        (
            "kv-pressure",
            json!({"tenants": 4, "prefixTokens": 32, "questionTokensMin": 4,
                   "questionTokensMax": 12, "requests": 40, "requestsPerSecond": 200}),
        ),
    ]
}

fn with_arrivals(set: &serde_json::Value, spread: f64, jitter: f64) -> serde_json::Value {
    let mut set = set.clone();
    set["arrivalSpreadMs"] = json!(spread);
    set["arrivalJitterMs"] = json!(jitter);
    set
}

fn workload(name: &str, set: serde_json::Value) -> Workload {
    Workload::from_name(name, set).unwrap()
}

/// A request without its arrival and id.
fn content(r: &SimRequest) -> (u64, Vec<u32>, u32, Option<u32>) {
    (r.group, r.tokens.to_vec(), r.output_tokens, r.step)
}

fn assert_numbered_in_arrival_order(requests: &[SimRequest], what: &str) {
    for (i, r) in requests.iter().enumerate() {
        assert_eq!(r.id, i as u64, "{what}");
    }
    assert!(
        requests
            .windows(2)
            .all(|p| p[0].arrival_ms <= p[1].arrival_ms),
        "{what}"
    );
}

#[test]
fn arrivals_fall_between_their_nominal_time_and_its_spread_and_jitter() {
    for (name, set) in small_workloads() {
        let nominal = workload(name, with_arrivals(&set, 0.0, 0.0)).generate();
        let spread = workload(name, with_arrivals(&set, 30.0, 1.0)).generate();
        let what = format!("{name} {set}");
        assert_numbered_in_arrival_order(&spread, &what);
        assert_eq!(spread.len(), nominal.len(), "{what}");
        // The same requests: the arrival model changes no prompt, output or tag.
        let mut a: Vec<_> = nominal.iter().map(content).collect();
        let mut b: Vec<_> = spread.iter().map(content).collect();
        a.sort();
        b.sort();
        assert!(a == b, "{what}: requests differ");
        // Every copy of a request's content has one nominal time (samples share theirs).
        let at: std::collections::HashMap<_, f64> =
            nominal.iter().map(|r| (content(r), r.arrival_ms)).collect();
        for r in &spread {
            let t = at[&content(r)];
            assert!(
                (t..=t + 30.0 + JITTER_BOUND).contains(&r.arrival_ms),
                "{what}: request {} nominal {t} arrived {}",
                r.id,
                r.arrival_ms
            );
        }
        assert!(
            spread
                .iter()
                .zip(&nominal)
                .any(|(s, n)| s.arrival_ms != n.arrival_ms),
            "{what}: nothing moved"
        );
        let streamed: Vec<_> = workload(name, with_arrivals(&set, 30.0, 1.0))
            .requests()
            .collect();
        assert!(streamed == spread, "{what}");
    }
}

#[test]
fn a_burst_is_spread_over_the_window_in_the_generators_order() {
    let step = |interleaved: bool, jitter: f64| {
        let set = json!({"prompts": 32, "samples": 16, "steps": 1, "interleaved": interleaved,
                         "promptTokensMin": 20, "promptTokensMax": 40});
        workload("rl-rollout", with_arrivals(&set, 30.0, jitter)).generate()
    };
    for interleaved in [false, true] {
        let nominal = {
            let set = json!({"prompts": 32, "samples": 16, "steps": 1,
                             "interleaved": interleaved,
                             "promptTokensMin": 20, "promptTokensMax": 40});
            workload("rl-rollout", with_arrivals(&set, 0.0, 0.0)).generate()
        };
        let spread = step(interleaved, 0.0);
        let groups = |w: &[SimRequest]| w.iter().map(|r| r.group).collect::<Vec<_>>();
        assert_eq!(groups(&spread), groups(&nominal));
        let first = spread[0].arrival_ms;
        let last = spread[spread.len() - 1].arrival_ms;
        assert!(first < 1.0 && last > 29.0 && last < 30.0, "{first}..{last}");
        let mean = spread.iter().map(|r| r.arrival_ms).sum::<f64>() / spread.len() as f64;
        assert!((13.0..17.0).contains(&mean), "mean offset {mean}");
        // Jitter on top swaps some neighbours, no more than a few milliseconds apart.
        let jittered = step(interleaved, 1.0);
        assert_ne!(groups(&jittered), groups(&nominal));
        let mean_jitter =
            jittered.iter().map(|r| r.arrival_ms).sum::<f64>() / jittered.len() as f64 - mean;
        assert!(
            (0.8..1.2).contains(&mean_jitter),
            "mean jitter {mean_jitter}"
        );
    }
}

#[test]
fn arrivals_are_the_same_for_a_seed_and_leave_the_prompts_alone() {
    for (name, set) in small_workloads() {
        let a = workload(name, set.clone()).generate();
        let b = workload(name, set.clone()).generate();
        assert!(a == b, "{name} {set}");
        let mut other = set.clone();
        other["seed"] = json!(2);
        let c = workload(name, other).generate();
        assert!(a != c, "{name} {set}");
        // Another spread moves the requests, not their prompts.
        let wider = workload(name, with_arrivals(&set, 50.0, 1.0)).generate();
        let mut x: Vec<_> = a.iter().map(content).collect();
        let mut y: Vec<_> = wider.iter().map(content).collect();
        x.sort();
        y.sort();
        assert!(x == y, "{name} {set}");
    }
}

/// A digest of requests, ids and arrival bits included.
fn fingerprint(requests: &[SimRequest]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |v: u64| {
        h ^= v;
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    for r in requests {
        mix(r.id);
        mix(r.arrival_ms.to_bits());
        mix(r.group);
        mix(u64::from(r.output_tokens));
        mix(r.step.map_or(u64::MAX, u64::from));
        for &t in r.tokens.iter() {
            mix(u64::from(t));
        }
    }
    h
}

#[test]
fn no_spread_and_no_jitter_give_the_nominal_arrivals_bit_for_bit() {
    // Digests of what the generators made before the arrival model existed.
    let zero = |w: Workload| match w {
        Workload::RlRollout(p) => Workload::RlRollout(RlRolloutParams {
            arrival_spread_ms: 0.0,
            arrival_jitter_ms: 0.0,
            ..p
        }),
        Workload::SharedPrefix(p) => Workload::SharedPrefix(SharedPrefixParams {
            arrival_spread_ms: 0.0,
            arrival_jitter_ms: 0.0,
            ..p
        }),
        Workload::MultiTurn(p) => Workload::MultiTurn(MultiTurnParams {
            arrival_spread_ms: 0.0,
            arrival_jitter_ms: 0.0,
            ..p
        }),
        kv @ Workload::KvPressure(_) => kv,
    };
    let cases = [
        (
            Workload::RlRollout(RlRolloutParams::default()),
            0xd19f_3ded_6fba_1250,
        ),
        (
            Workload::RlRollout(RlRolloutParams {
                interleaved: true,
                step_interval_ms: 0.0,
                ..small_rl()
            }),
            0xfb88_de0d_09e3_849a,
        ),
        (
            Workload::SharedPrefix(SharedPrefixParams::default()),
            0xbaa7_e7b0_b23c_4e2f,
        ),
        (
            Workload::MultiTurn(MultiTurnParams::default()),
            0xbfe0_63b0_2be2_574f,
        ),
        (
            Workload::MultiTurn(MultiTurnParams {
                think_time_ms: 0.0,
                ..MultiTurnParams::default()
            }),
            0xb6c4_a867_78e6_75d1,
        ),
    ];
    for (w, digest) in cases {
        let w = zero(w);
        assert_eq!(fingerprint(&w.generate()), digest, "{w:?}");
        assert_eq!(
            fingerprint(&w.requests().collect::<Vec<_>>()),
            digest,
            "{w:?}"
        );
    }
    let text = "{\"arrival_ms\": 5, \"tokens\": [1], \"output_tokens\": 1}\n\
                {\"arrival_ms\": 5, \"tokens\": [2], \"output_tokens\": 1}\n\
                {\"arrival_ms\": 1.5, \"tokens\": [3], \"output_tokens\": 1}\n";
    let still = TraceParams {
        arrival_jitter_ms: 0.0,
        ..TraceParams::default()
    };
    let trace = still.deliver(parse_trace(text).unwrap());
    assert_eq!(fingerprint(&trace), 0x4c55_8e78_a401_e10a);
}

#[test]
fn trace_arrivals_default_to_jitter_alone_and_spread_bursts_when_asked() {
    let text: String = (0..200)
        .map(|i| {
            format!(
                "{{\"arrival_ms\": {}, \"tokens\": [{i}], \"output_tokens\": 1}}\n",
                (i / 50) * 100
            )
        })
        .collect();
    let nominal = parse_trace(&text).unwrap();
    let at = |r: &SimRequest| f64::from(r.tokens[0] / 50 * 100);
    let defaults = TraceParams::from_overrides(serde_json::Value::Null).unwrap();
    assert_eq!(defaults, TraceParams::default());
    assert_eq!(
        (
            defaults.seed,
            defaults.arrival_spread_ms,
            defaults.arrival_jitter_ms
        ),
        (1, 0.0, 1.0)
    );
    for (params, spread) in [
        (defaults, 0.0),
        (
            TraceParams::from_overrides(json!({"arrivalSpreadMs": 20, "seed": 5})).unwrap(),
            20.0,
        ),
    ] {
        let w = params.deliver(nominal.clone());
        assert_eq!(w.len(), 200);
        assert_numbered_in_arrival_order(&w, "trace");
        for r in &w {
            let t = at(r);
            assert!((t..=t + spread + JITTER_BOUND).contains(&r.arrival_ms));
        }
        let mut tokens: Vec<u32> = w.iter().map(|r| r.tokens[0]).collect();
        tokens.sort();
        assert_eq!(tokens, (0..200).collect::<Vec<_>>());
        assert!(w == params.deliver(nominal.clone()));
    }
}

#[test]
fn a_session_turn_never_arrives_before_the_previous_one() {
    let w = workload(
        "multi-turn",
        json!({"sessions": 20, "turns": 5, "thinkTimeMs": 2, "arrivalSpreadMs": 30,
               "arrivalJitterMs": 5}),
    )
    .generate();
    for s in 0..20u64 {
        let lengths: Vec<usize> = w
            .iter()
            .filter(|r| r.group == s)
            .map(|r| r.tokens.len())
            .collect();
        assert!(lengths.windows(2).all(|p| p[0] < p[1]), "{lengths:?}");
    }
}

#[test]
fn arrival_parameters_out_of_range_are_refused_by_name() {
    for name in Workload::NAMES {
        for (set, message) in [
            (
                json!({"arrivalSpreadMs": -1}),
                "arrivalSpreadMs must be in [0, 1000000000] (got -1)",
            ),
            (
                json!({"arrivalJitterMs": -0.5}),
                "arrivalJitterMs must be in [0, 1000000000] (got -0.5)",
            ),
            (
                json!({"arrivalSpreadMs": 2e9}),
                "arrivalSpreadMs must be in [0, 1000000000] (got 2000000000)",
            ),
        ] {
            let err = Workload::from_name(name, set).unwrap_err();
            assert_eq!(err.to_string(), format!("workload {name}: {message}"));
        }
        let err = Workload::from_name(name, json!({"arrivalJitterMs": "noisy"})).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                r#"workload {name}: arrivalJitterMs must be a number in 0..=1e9 (got "noisy")"#
            )
        );
    }
    let nan = [
        RlRolloutParams {
            arrival_spread_ms: f64::NAN,
            ..RlRolloutParams::default()
        }
        .validate(),
        SharedPrefixParams {
            arrival_jitter_ms: f64::NAN,
            ..SharedPrefixParams::default()
        }
        .validate(),
        MultiTurnParams {
            arrival_spread_ms: f64::NAN,
            ..MultiTurnParams::default()
        }
        .validate(),
        KvPressureParams {
            arrival_jitter_ms: f64::NAN,
            ..KvPressureParams::default()
        }
        .validate(),
        TraceParams {
            arrival_jitter_ms: f64::NAN,
            ..TraceParams::default()
        }
        .validate(),
    ];
    for err in nan {
        let err = err.unwrap_err();
        assert!(
            err.message
                .ends_with("must be in [0, 1000000000] (got NaN)"),
            "{err}"
        );
        assert!(err.field.starts_with("arrival"), "{err}");
    }
    let err = TraceParams::from_overrides(json!({"arrivalSpreadMs": -3})).unwrap_err();
    assert_eq!(
        err.to_string(),
        "workload trace: arrivalSpreadMs must be in [0, 1000000000] (got -3)"
    );
    let err = TraceParams::from_overrides(json!({"steps": 3})).unwrap_err();
    assert_eq!(
        err.to_string(),
        "workload trace: unknown parameter \"steps\" in --set; parameters of trace: seed, \
         arrivalSpreadMs, arrivalJitterMs"
    );
}
