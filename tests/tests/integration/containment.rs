//! What a misbehaving plugin library can and cannot do to the host, through the real library
//! (`tests/fixtures/panicking-plugin`) and the real binary: bad outputs are that call's error,
//! a panicking entry point is switched off, writes stay inside the call's own values,
//! failures are logged once, and a plugin that ends the process is named.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use switchyard::pipeline::scheduler::PluginStats;
use switchyard::pipeline::scheduler::POISON_AFTER_PANICS;
use switchyard::pipeline::{Prompt, Rejection, Request, Scheduler};
use switchyard_tests::live::binary;
use switchyard_tests::{endpoints, plugin_dir, scheduler};

const LIBRARY: &str = "libraries = [\"panicking_plugin\"]\n";

fn request(id: &str) -> Request {
    Request {
        id: id.into(),
        model: "m".into(),
        cache_salt: String::new(),
        prompt: Prompt::Tokens(vec![vec![1, 2, 3, 4]]),
        max_output_tokens: None,
    }
}

fn stats_of(scheduler: &Scheduler, name: &str) -> PluginStats {
    scheduler
        .stats()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no stats for {name}"))
        .1
}

fn with_picker(behaviour: &str) -> String {
    format!(
        "{LIBRARY}{}\n[[plugins]]\ntype = \"misbehaving-picker\"\n\
         parameters = {{ behaviour = \"{behaviour}\" }}\n",
        endpoints(3)
    )
}

#[test]
fn a_picker_answering_positions_that_are_not_distinct_candidates_fails_only_that_request() {
    for (behaviour, expected) in [
        ("out-of-range", "position 8, out of range for 3 candidates"),
        ("more-than-written", "returned 6 positions for 3 candidates"),
        ("unwritten", "returned 2 positions but wrote only 1"),
        ("duplicates", "chose position 1 twice"),
    ] {
        let mut scheduler = scheduler(behaviour, &with_picker(behaviour), 1);
        let decisions = scheduler.submit(request("a"), 0.0);
        assert_eq!(decisions.len(), 1, "{behaviour}");
        match &decisions[0].result {
            Err(Rejection::PickerFailed { picker, reason }) => {
                assert_eq!(picker, "misbehaving-picker");
                assert!(reason.starts_with("bad output: "), "{behaviour}: {reason}");
                assert!(reason.contains(expected), "{behaviour}: {reason}");
            }
            other => panic!("{behaviour}: expected a picker failure, got {other:?}"),
        }
        let stats = stats_of(&scheduler, "misbehaving-picker");
        assert_eq!((stats.calls, stats.errors, stats.panics), (1, 1, 0));
        // Nothing was dispatched: completing the request changes nothing.
        assert!(!scheduler.complete("a", switchyard_plugin_api::Outcome::Finished, 1.0));
    }
}

#[test]
fn a_well_behaved_pick_through_the_same_picker_is_placed() {
    let mut scheduler = scheduler("good-pick", &with_picker("first"), 1);
    let decisions = scheduler.submit(request("a"), 0.0);
    assert_eq!(decisions[0].result, Ok(vec![0]));
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "switchyard-containment-{tag}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Runs `switchyard replay` over `requests` requests with the given config text.
fn replay(tag: &str, config: &str, requests: usize) -> Output {
    let dir = temp_dir(tag);
    std::fs::write(dir.join("pipeline.toml"), config).unwrap();
    let input: String = (0..requests)
        .map(|i| format!("{{\"arrival_ms\": {i}, \"tokens\": [1, 2, 3]}}\n"))
        .collect();
    std::fs::write(dir.join("requests.jsonl"), input).unwrap();
    let output = Command::new(binary())
        .args(["replay", "--brief", "--config", "pipeline.toml"])
        .args(["--input", "requests.jsonl", "--plugin-dir"])
        .arg(plugin_dir())
        .current_dir(&dir)
        .env_remove("RUST_LOG")
        .env_remove("SWITCHYARD_PLUGIN_DIR")
        .output()
        .expect("switchyard runs");
    let _ = std::fs::remove_dir_all(&dir);
    output
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn replay_with_an_out_of_range_picker_runs_to_the_end_and_writes_every_decision() {
    let output = replay("replay-picker", &with_picker("out-of-range"), 3);
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stdout.lines().count(), 3, "{stdout}");
    assert!(stdout.contains("bad output"), "{stdout}");
    assert!(stderr.contains("0 requests placed, 3 rejected"), "{stderr}");
}

fn with_producer(name: &str, behaviour: &str) -> String {
    format!(
        "{LIBRARY}{}\n[[plugins]]\nname = \"{name}\"\ntype = \"misbehaving-producer\"\n\
         parameters = {{ behaviour = \"{behaviour}\" }}\n",
        endpoints(3)
    )
}

#[test]
fn a_producer_that_panics_on_every_call_is_switched_off_although_its_hooks_succeed() {
    let mut scheduler = scheduler("panic-produce", &with_producer("p", "panic-produce"), 1);
    for i in 0..POISON_AFTER_PANICS {
        let decisions = scheduler.submit(request(&format!("r{i}")), i as f64);
        assert!(decisions[0].result.is_ok(), "the request is still placed");
    }
    let stats = stats_of(&scheduler, "p (misbehaving-producer)");
    assert!(stats.poisoned, "{stats:?}");
    // Each request made a produce call, which panicked, and all but the last a dispatch
    // call, which succeeded.
    assert_eq!(stats.panics, u64::from(POISON_AFTER_PANICS));
    assert_eq!(stats.calls, 2 * u64::from(POISON_AFTER_PANICS) - 1);

    let decisions = scheduler.submit(request("after"), 10.0);
    assert!(decisions[0].result.is_ok());
    assert_eq!(
        stats_of(&scheduler, "p (misbehaving-producer)").calls,
        stats.calls,
        "a switched-off producer is called no more, hooks included"
    );
}

#[test]
fn a_put_past_the_declared_keys_never_reaches_another_requests_values() {
    let mut scheduler = scheduler("put-past", &with_producer("batch", "put-past-keys"), 1);
    scheduler.set_explain(true);
    assert!(scheduler.submit(request("first"), 0.0).is_empty());
    assert!(scheduler.submit(request("second"), 1.0).is_empty());
    let decisions = scheduler.advance(10.0);
    assert_eq!(decisions.len(), 2);
    for (index, decision) in decisions.iter().enumerate() {
        let record = decision.record.as_ref().expect("explained").render();
        let producer = record
            .producers
            .iter()
            .find(|p| p.name.starts_with("batch"))
            .expect("the producer ran");
        assert_eq!(producer.error, None);
        // Each request holds exactly what was put for it: one byte on its last endpoint.
        let written: Vec<(&str, &serde_json::Value)> = producer
            .attributes
            .iter()
            .map(|a| (a.endpoint.as_str(), &a.value))
            .collect();
        assert_eq!(
            written,
            vec![("/pod3", &serde_json::json!({ "customBytes": 1 }))],
            "request {index}"
        );
    }
}

#[test]
fn a_produced_value_of_another_type_than_its_key_discards_the_call() {
    let mut scheduler = scheduler("wrong-variant", &with_producer("w", "wrong-variant"), 1);
    scheduler.set_explain(true);
    let decisions = scheduler.submit(request("a"), 0.0);
    assert!(decisions[0].result.is_ok());
    let record = decisions[0].record.as_ref().unwrap().render();
    let producer = record
        .producers
        .iter()
        .find(|p| p.name.starts_with("w "))
        .unwrap();
    let error = producer.error.as_deref().expect("the call is an error");
    assert!(
        error.contains("bad output: it wrote a InFlightLoad value under PrefixCacheMatchInfo/w"),
        "{error}"
    );
    assert!(producer.attributes.is_empty(), "{:?}", producer.attributes);
    let stats = stats_of(&scheduler, "w (misbehaving-producer)");
    assert_eq!((stats.errors, stats.panics), (1, 0));
}

fn with_scorer(behaviour: &str) -> String {
    format!(
        "{LIBRARY}{}\n[[plugins]]\nname = \"shaky\"\ntype = \"misbehaving-scorer\"\n\
         parameters = {{ behaviour = \"{behaviour}\" }}\n",
        endpoints(2)
    )
}

#[test]
fn a_plugin_error_is_logged_once_at_the_default_level_with_the_plugins_name() {
    let output = replay("fail-once", &with_scorer("fail"), 5);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("the fixture's model file is missing"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    assert!(
        lines[0].contains("shaky (misbehaving-scorer)"),
        "{}",
        lines[0]
    );
    assert!(stderr.contains("5 requests placed, 0 rejected"), "{stderr}");
}

#[test]
fn a_panic_in_declare_is_logged_with_the_instance_name() {
    let output = replay("declare", &with_producer("wobbly", "panic-declare"), 1);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("declare panicked"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("ERROR"), "{}", lines[0]);
    assert!(
        lines[0].contains("wobbly (misbehaving-producer)"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("cannot make up its mind"), "{}", lines[0]);
}

#[test]
fn a_plugin_that_ends_the_process_is_named() {
    for (behaviour, how) in [("exit", "exited"), ("abort", "aborted")] {
        let output = replay(behaviour, &with_scorer(behaviour), 1);
        let stderr = text(&output.stderr);
        assert!(!output.status.success(), "{behaviour}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "switchyard: the process {how} inside a call to plugin 'shaky \
                 (misbehaving-scorer)' (score)"
            )),
            "{behaviour}: {stderr}"
        );
    }
}

#[test]
fn a_normal_exit_names_no_plugin() {
    let output = replay("normal", &with_scorer("fail"), 1);
    assert!(output.status.success());
    assert!(!text(&output.stderr).contains("inside a call to plugin"));
}

/// The library file of the fixture, as built.
fn fixture_library() -> PathBuf {
    plugin_dir().join(switchyard::config::library_file_name("panicking_plugin"))
}

#[test]
fn overwriting_a_loaded_library_in_place_leaves_the_running_host_unharmed() {
    use switchyard_plugin_api::ffi::RString;
    let dir = temp_dir("overwrite");
    let path = dir.join(fixture_library().file_name().unwrap());
    std::fs::copy(fixture_library(), &path).unwrap();
    let library = switchyard_plugin_api::loading::load_library(&path).expect("loads");
    let scorer = library.create("panicking-scorer", "p", "null").unwrap();

    // `cp` over the file: truncated and rewritten in place, same inode.
    overwrite_in_place(&path, b"not a library any more");
    overwrite_in_place(&path, &[0u8; 4096]);

    let endpoints = switchyard_tests::endpoint_views(2);
    let mut scores = [0.0; 2];
    scorer
        .score(
            &switchyard_tests::request_view("fine"),
            &endpoints,
            &switchyard_plugin_api::AttrView::EMPTY,
            &mut scores,
            &mut RString::new(),
        )
        .expect("the loaded code still runs");
    assert_eq!(scores, [1.0, 1.0]);
    // New instances too: the library's constructor is still the loaded one.
    assert!(library.create("panicking-scorer", "q", "null").is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

fn overwrite_in_place(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap();
    file.write_all(bytes).unwrap();
    file.sync_all().unwrap();
}

#[test]
fn loading_leaves_no_private_copy_behind() {
    let before = private_copies();
    switchyard_plugin_api::loading::load_library(&fixture_library()).expect("loads");
    // Other tests of this binary load libraries at the same time, and their copies exist for
    // the moment of opening; a copy left behind is still there after they are done.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let after = private_copies();
        if after.iter().all(|p| before.contains(p)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "left behind: {after:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn private_copies() -> Vec<PathBuf> {
    let prefix = format!("switchyard-plugin-{}-", std::process::id());
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .collect()
}
