//! A panicking plugin costs one decision, not the process.

use switchyard::pipeline::{Prompt, Request};
use switchyard_tests::{endpoints, scheduler};

fn request(id: &str, model: &str) -> Request {
    Request {
        id: id.into(),
        model: model.into(),
        cache_salt: String::new(),
        prompt: Prompt::Tokens(vec![vec![1, 2, 3, 4]]),
        max_output_tokens: None,
    }
}

fn config() -> String {
    format!(
        "libraries = [\"panicking_plugin\"]\n{}\n\
         [[plugins]]\ntype = \"panicking-scorer\"\n\
         [[plugins]]\ntype = \"max-score-picker\"\n",
        endpoints(3)
    )
}

#[test]
fn a_panic_becomes_an_error_and_later_calls_work() {
    let mut scheduler = scheduler("faults", &config(), 7);
    let decisions = scheduler.submit(request("a", "panic"), 0.0);
    assert_eq!(decisions.len(), 1);
    assert!(decisions[0].result.is_ok(), "the request is still placed");
    let stats = scheduler.stats();
    let (_, scorer) = stats
        .iter()
        .find(|(name, _)| name == "panicking-scorer")
        .expect("scorer stats");
    assert_eq!(scorer.panics, 1);
    assert!(!scorer.poisoned);

    let decisions = scheduler.submit(request("b", "fine"), 1.0);
    assert!(decisions[0].result.is_ok());
    let stats = scheduler.stats();
    let (_, scorer) = stats.iter().find(|(n, _)| n == "panicking-scorer").unwrap();
    assert_eq!(scorer.calls, 2);
    assert_eq!(scorer.errors, 1, "the second call succeeded");
}

#[test]
fn repeated_panics_switch_the_plugin_off() {
    let mut scheduler = scheduler("faults-poison", &config(), 7);
    for i in 0..switchyard::pipeline::scheduler::POISON_AFTER_PANICS {
        let decisions = scheduler.submit(request(&format!("p{i}"), "panic"), i as f64);
        assert!(decisions[0].result.is_ok());
    }
    let stats = scheduler.stats();
    let (_, scorer) = stats.iter().find(|(n, _)| n == "panicking-scorer").unwrap();
    assert!(scorer.poisoned);
    let calls_before = scorer.calls;
    let decisions = scheduler.submit(request("after", "panic"), 10.0);
    assert!(decisions[0].result.is_ok());
    let stats = scheduler.stats();
    let (_, scorer) = stats.iter().find(|(n, _)| n == "panicking-scorer").unwrap();
    assert_eq!(
        scorer.calls, calls_before,
        "a switched-off plugin is not called"
    );
}

#[test]
fn every_library_produce_call_is_timed_and_the_hosts_producers_one_decision_in_sixteen() {
    use switchyard::pipeline::scheduler::TIMING_SAMPLE;
    let toml = format!(
        "libraries = [\"panicking_plugin\"]\n{}\n\
         [[plugins]]\nname = \"library\"\ntype = \"misbehaving-producer\"\n\
         [plugins.parameters]\nbehaviour = \"none\"\n\
         [[plugins]]\ntype = \"inflight-load-producer\"\n\
         [[plugins]]\ntype = \"load-aware-scorer\"\n\
         [[plugins]]\ntype = \"max-score-picker\"\n",
        endpoints(3)
    );
    let mut scheduler = scheduler("producer-timing", &toml, 7);
    let decisions = 2 * TIMING_SAMPLE;
    for i in 0..decisions {
        let placed = scheduler.submit(request(&format!("t{i}"), "fine"), i as f64);
        assert!(placed[0].result.is_ok());
    }
    let stats = scheduler.stats();
    let of = |name: &str| stats.iter().find(|(n, _)| n == name).expect(name).1;
    // `calls` counts the dispatch hooks too.
    let library = of("library (misbehaving-producer)");
    assert_eq!(library.timed_calls, decisions);
    let host = of("inflight-load-producer");
    assert!(host.calls >= decisions);
    assert_eq!(host.timed_calls, 2);
}

#[test]
fn one_decision_in_sixteen_times_its_scorer_and_picker_calls() {
    use switchyard::pipeline::scheduler::TIMING_SAMPLE;
    let mut scheduler = scheduler("timing", &config(), 7);
    let decisions = 2 * TIMING_SAMPLE;
    for i in 0..decisions {
        scheduler.submit(request(&format!("t{i}"), "fine"), i as f64);
    }
    let stats = scheduler.stats();
    for name in ["panicking-scorer", "max-score-picker"] {
        let (_, plugin) = stats.iter().find(|(n, _)| n == name).expect(name);
        assert_eq!(plugin.calls, decisions, "{name}");
        assert_eq!(plugin.timed_calls, 2, "{name}");
    }
}
