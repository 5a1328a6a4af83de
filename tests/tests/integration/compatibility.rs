//! A host built against plugin API 1.N loads libraries built against 1.M with M ≤ N, and
//! refuses libraries of another major version or with different boundary layouts, with a
//! short message.

use switchyard_plugin_api::ffi::{RSlice, RStr, RString};
use switchyard_plugin_api::loading::{load_library, LoadProblem, LoadedLibrary};
use switchyard_plugin_api::sdk::extensions;
use switchyard_plugin_api::{
    ApiVersion, AttrView, EndpointMetrics, EndpointView, PluginInstance, RequestView,
};
use switchyard_tests::{fixture_library, plugin_dir};

fn endpoint(slot: u32) -> EndpointView<'static> {
    EndpointView {
        slot,
        host_index: slot,
        id: RStr::from("/pod"),
        address: RStr::from("127.0.0.1:9000"),
        role: RStr::from(""),
        metrics: EndpointMetrics::default(),
    }
}

fn request() -> RequestView<'static> {
    RequestView {
        id: RStr::from("r"),
        model: RStr::from("m"),
        cache_salt: RStr::from(""),
        prompts: RSlice::from_slice(&[]),
        max_output_tokens: -1,
        now_ms: 0,
        random_seed: 1,
        explain: false,
    }
}

#[test]
fn a_library_built_against_an_older_minor_loads_and_works() {
    const { assert!(ApiVersion::CURRENT.minor >= 1, "the host is at least 1.1") };
    let library = load_older_minor("older-minor-plugin", 0);
    let types = library.types();
    assert_eq!(types.len(), 1);
    assert_eq!(types[0].type_name.as_str(), "older-minor-scorer");

    let scorer = library
        .create("older-minor-scorer", "old", "null")
        .expect("creates");
    let endpoints = [endpoint(0), endpoint(1)];
    let mut scores = [0.0; 2];
    let mut note = RString::new();
    scorer
        .score(
            &request(),
            &endpoints,
            &AttrView::EMPTY,
            &mut scores,
            &mut note,
        )
        .expect("scores");
    assert_eq!(scores, [0.5, 0.5]);

    // The `state` capability arrived in 1.1 and `batch_quiet` in 1.2: a 1.0 library knows
    // neither, and says so instead of failing to load.
    assert_unsupported(&scorer, extensions::STATE);
    assert_unsupported(&scorer, extensions::BATCH_QUIET);
    assert_unsupported(&scorer, extensions::KV_EVENTS);
    assert_unsupported(&scorer, extensions::IMPORT_STATE);
    assert_unsupported(&scorer, extensions::EXPORT_STATE);
}

/// Loads a fixture library and checks that it was built against API 1.`minor`.
fn load_older_minor(fixture: &str, minor: u32) -> LoadedLibrary {
    let library = load_library(&fixture_library(fixture)).expect("loads");
    let version = library.api_version();
    assert_eq!((version.major, version.minor), (1, minor), "{fixture}");
    library
}

/// The instance answers that it does not provide the capability `name`.
fn assert_unsupported(instance: &PluginInstance, name: &str) {
    let error = instance.extension(name, "").expect_err(name);
    assert_eq!(
        error.kind,
        switchyard_plugin_api::ErrorKind::Unsupported,
        "{name}"
    );
}

#[test]
fn a_library_built_against_1_1_loads_and_keeps_the_fixed_window() {
    const { assert!(ApiVersion::CURRENT.minor >= 2, "the host is at least 1.2") };
    let library = load_older_minor("minor-1-1-plugin", 1);
    let producer = library
        .create("minor-1-1-producer", "batching", "null")
        .expect("creates");
    let declared = producer.declarations();
    assert_eq!(declared.batch().map(|b| b.window_ms), Some(50));
    // 1.1's own capability works.
    let state = producer
        .extension(extensions::STATE, "")
        .expect("known to 1.1");
    assert_eq!(state, r#"{"built against":"1.1"}"#);
    // The quiet gap arrived in 1.2: a 1.1 library does not know it, so its window stays fixed.
    assert_unsupported(&producer, extensions::BATCH_QUIET);
    assert_unsupported(&producer, extensions::KV_EVENTS);
    assert_unsupported(&producer, extensions::IMPORT_STATE);
    assert_unsupported(&producer, extensions::EXPORT_STATE);
}

#[test]
fn a_library_built_against_1_2_loads_and_takes_no_kv_events() {
    const { assert!(ApiVersion::CURRENT.minor >= 3, "the host is at least 1.3") };
    let library = load_older_minor("minor-1-2-plugin", 2);
    let producer = library
        .create("minor-1-2-producer", "batching", "null")
        .expect("creates");
    assert_eq!(
        producer.declarations().batch().map(|b| b.window_ms),
        Some(50)
    );
    // 1.1's and 1.2's capabilities work.
    let state = producer
        .extension(extensions::STATE, "")
        .expect("known to 1.2");
    assert_eq!(state, r#"{"built against":"1.2"}"#);
    let quiet = producer
        .extension(extensions::BATCH_QUIET, "")
        .expect("known to 1.2");
    assert_eq!(quiet, "5");
    // KV events and state import arrived in 1.3: asked at wiring, a 1.2 library answers that
    // it knows neither, so the host neither feeds it events nor hands it an older state.
    assert_unsupported(&producer, extensions::KV_EVENTS);
    let batch = r#"{"host_index":0,"events":["AllBlocksCleared"]}"#;
    let error = producer
        .extension(extensions::KV_EVENTS, batch)
        .expect_err("a 1.2 library takes no KV events");
    assert_eq!(error.kind, switchyard_plugin_api::ErrorKind::Unsupported);
    assert_unsupported(&producer, extensions::IMPORT_STATE);
    assert_unsupported(&producer, extensions::EXPORT_STATE);
}

#[test]
fn current_libraries_answer_the_state_capability() {
    let path = plugin_dir().join(switchyard::config::library_file_name("panicking_plugin"));
    let library = load_library(&path).expect("loads");
    assert_eq!(library.api_version(), ApiVersion::CURRENT);
    let scorer = library.create("panicking-scorer", "p", "null").unwrap();
    assert_eq!(scorer.extension(extensions::STATE, "").unwrap(), "null");
    // 1.3: it takes no KV events and cannot take over a state; both are said, not failed.
    assert_eq!(
        scorer.extension(extensions::KV_EVENTS, "").unwrap(),
        "false"
    );
    let error = scorer
        .extension(extensions::IMPORT_STATE, "{}")
        .expect_err("keeps no state");
    assert_eq!(error.kind, switchyard_plugin_api::ErrorKind::Unsupported);
}

#[test]
fn a_library_of_another_major_is_refused_in_a_few_lines() {
    let path = fixture_library("future-major-plugin");
    let error = load_library(&path).err().expect("refused");
    assert!(
        matches!(&error.problem, LoadProblem::Version { library, .. } if library == "2.0.0"),
        "{:?}",
        error.problem
    );
    let message = error.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("plugin API 2.0.0"), "{message}");
    assert!(message.contains("rebuild the library"), "{message}");
    assert!(message.lines().count() <= 4, "{message}");
}

#[test]
fn a_library_with_a_different_layout_is_refused_in_a_few_lines() {
    let path = fixture_library("mismatched-layout-plugin");
    let error = load_library(&path).err().expect("refused");
    let LoadProblem::Layout(lines) = &error.problem else {
        panic!("expected a layout refusal, got {:?}", error.problem);
    };
    assert!(!lines.is_empty());
    let message = error.to_string();
    assert!(message.contains("boundary types differ"), "{message}");
    assert!(message.lines().count() <= 7, "{message}");
    assert!(
        error.detail.lines().count() > message.lines().count(),
        "the full report is kept for debug output"
    );
}

#[test]
fn a_file_that_is_not_a_library_is_refused() {
    let path = switchyard_tests::workspace_root().join("README.md");
    let error = load_library(&path).err().expect("refused");
    assert!(
        matches!(error.problem, LoadProblem::Open(_)),
        "{:?}",
        error.problem
    );
    assert!(error.to_string().contains("cannot open plugin library"));
}
