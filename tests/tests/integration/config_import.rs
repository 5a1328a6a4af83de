//! `switchyard config import` through the binary: the reference's EndpointPickerConfig files
//! (its example pipelines and the RL tooling's rendered profiles) become TOML that
//! `switchyard check` accepts, with what cannot be mapped left as comments.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use switchyard_tests::live::binary;
use switchyard_tests::{plugin_dir, workspace_root};

fn run(args: &[&str]) -> Output {
    let mut command = Command::new(binary());
    command
        .args(args)
        .args(["--plugin-dir", &plugin_dir().display().to_string()])
        .current_dir(workspace_root())
        .env_remove("SWITCHYARD_PLUGIN_DIR");
    command.output().expect("switchyard runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn fixture(name: &str) -> String {
    format!("tests/data/epp/{name}.yaml")
}

/// A fresh directory under the system temp dir.
fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("switchyard-import-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Imports a fixture to a file, checks it with the binary, and returns the TOML and the
/// output of `check`.
fn import_and_check(name: &str) -> (String, String) {
    let dir = temp_dir(name);
    let out = dir.join("imported.toml");
    let imported = run(&[
        "config",
        "import",
        &fixture(name),
        "--output",
        &out.display().to_string(),
    ]);
    assert!(imported.status.success(), "{name}: {}", stderr(&imported));
    let toml = std::fs::read_to_string(&out).expect("output written");
    let check = run(&["check", "--config", &out.display().to_string()]);
    assert!(
        check.status.success(),
        "{name}: check refused the import:\n{}\n{toml}",
        stderr(&check)
    );
    (toml, stdout(&check))
}

#[test]
fn the_reference_example_pipelines_import_and_pass_check() {
    let (toml, check) = import_and_check("reference-burst-affinity");
    assert!(
        toml.starts_with(
            "# Imported from tests/data/epp/reference-burst-affinity.yaml by `switchyard config import`."
        ),
        "{toml}"
    );
    // Names, types, parameters, order and weights carry over.
    assert!(toml.contains("name = \"burst-affinity\"\ntype = \"prefix-cache-affinity-filter\""));
    assert!(toml.contains("peakPrefillThroughput = 15928\n"), "{toml}");
    assert!(toml.contains("filters = [\"burst-affinity\"]"), "{toml}");
    assert!(
        toml.contains(
            "    { plugin = \"prefix-cache-scorer\", weight = 2.0 },\n    \
             { plugin = \"load-aware-scorer\", weight = 1.0 },"
        ),
        "{toml}"
    );
    assert!(toml.contains("allow_experimental_plugins = true"), "{toml}");
    assert!(
        toml.contains("# not mapped: plugin 'single-profile-handler' (type single-profile-handler): switchyard runs exactly one scheduling profile"),
        "{toml}"
    );
    // The imported parameters reach the plugins.
    assert!(check.contains("\nwindowDurationMs = 100\n"), "{check}");
    assert!(check.contains("\naffinityThreshold = 0.8\n"), "{check}");

    let (toml, check) = import_and_check("reference-burst-sample");
    assert!(
        toml.contains("# not mapped: parameter modelName: switchyard's token-producer has no such parameter (it has: estimate, tokenizer, maxPromptBytes)\n#   was: \"hf-repo/model-name\""),
        "{toml}"
    );
    assert!(
        toml.contains(
            "# not mapped: parameter vllm: switchyard's token-producer has no such parameter"
        ),
        "{toml}"
    );
    assert!(
        toml.contains("# not mapped: plugin 'decode-filter' (type decode-filter): switchyard has no role filter; the reference's decode-filter keeps"),
        "{toml}"
    );
    assert!(
        toml.contains("# not mapped: profile entry 'decode-filter': its plugin is not mapped"),
        "{toml}"
    );
    assert!(check.contains("\nminColocateBlocks = 0\n"), "{check}");

    // A scorer of the approximate producer the reference creates by itself brings that
    // producer's library along.
    let (toml, check) = import_and_check("reference-prefix-only");
    assert!(
        toml.contains(
            "    \"approx_prefix_cache_producer\",  # for approx-prefix-cache-producer, which \
             'prefix-cache-scorer' requires and the pipeline creates by itself"
        ),
        "{toml}"
    );
    assert!(
        toml.contains("# not mapped: plugin 'models-responder' (type models-responder): `switchyard serve` answers GET /v1/models itself"),
        "{toml}"
    );
    assert!(check.contains(", created automatically"), "{check}");

    let (toml, check) = import_and_check("reference-approx");
    assert!(toml.contains("maxPrefixTokensToMatch = 4096\n"), "{toml}");
    assert!(
        check.contains("\nlruCapacityPerServer = 31250\n"),
        "{check}"
    );
    assert!(toml.contains("    { plugin = \"prefix-cache-scorer\", weight = 2.0 },"));
}

#[test]
fn the_rl_tooling_profiles_import_and_pass_check() {
    for name in ["rl-burst", "rl-persistent", "rl-inflight", "rl-load-only"] {
        let (toml, check) = import_and_check(name);
        // File discovery becomes the fleet's discovery file.
        assert!(
            toml.contains("[fleet]\n")
                && toml.contains("discovery_file = \"./epp-endpoints.yaml\"\n"),
            "{name}: {toml}"
        );
        assert!(
            toml.contains("# not mapped: plugin 'vllmhttp-parser' (type vllmhttp-parser): request parsing is built into switchyard's drivers"),
            "{name}: {toml}"
        );
        assert!(
            toml.contains("# not mapped: plugin 'metrics-source' (type metrics-data-source)"),
            "{name}: {toml}"
        );
        assert!(
            toml.contains("# not mapped: dataLayer.sources:"),
            "{name}: {toml}"
        );
        assert!(
            toml.contains("picker = \"max-score-picker\""),
            "{name}: {toml}"
        );
        assert!(
            check.contains("[[profiles]]\nname = \"default\"\n"),
            "{name}: {check}"
        );
        assert!(
            check.contains("[fleet]\ndiscovery_file = \"./epp-endpoints.yaml\"\n"),
            "{name}: {check}"
        );
    }

    let (toml, check) = import_and_check("rl-burst");
    assert!(check.contains("\nwindowDurationMs = 1000\n"), "{check}");
    assert!(check.contains("\nbalanceBy = \"tokens\"\n"), "{check}");
    assert!(check.contains("\nminColocateBlocks = 1\n"), "{check}");
    assert!(toml.contains("maxBatchSize = 10000\n"), "{toml}");

    let (toml, check) = import_and_check("rl-persistent");
    assert!(
        toml.contains(
            "    { plugin = \"burst-prefix-scorer\", weight = 2.0 },\n    \
                       { plugin = \"persistent-prefix-scorer\", weight = 1.0 },"
        ),
        "{toml}"
    );
    assert!(
        check.contains("\nmaxPrefixTokensToMatch = 131072\n"),
        "{check}"
    );

    let (toml, check) = import_and_check("rl-inflight");
    assert!(
        toml.contains("# not mapped: plugin 'token-load-scorer' (type token-load-scorer): switchyard has no plugin type 'token-load-scorer' (neither built in nor in the plugin libraries it ships)\n#   was: {\"queueThresholdTokens\": 4194304}"),
        "{toml}"
    );
    assert!(
        check.contains("\naddEstimatedOutputTokens = true\n"),
        "{check}"
    );

    let (_, check) = import_and_check("rl-load-only");
    assert!(check.contains("\nthreshold = 128\n"), "{check}");
}

#[test]
fn unmappable_pieces_become_comments_saying_why() {
    let (toml, check) = import_and_check("unmappable");
    for expected in [
        "# not mapped: feature gate 'flowControl': switchyard has no feature gates",
        "# not mapped: flowControl: switchyard has no flow control",
        "#   was: {\"maxRequests\": 100}",
        "# not mapped: saturationDetector: switchyard has no saturation detector",
        "# not mapped: parameter hashSeed: switchyard's approx-prefix-cache-producer has no such parameter",
        "# not mapped: plugin 'active-request-scorer' (type active-request-scorer)",
        "# not mapped: plugin 'utilization-detector' (type utilization-detector)",
        "# not mapped: profile entry 'approx-prefix-cache-producer': it is a producer",
        "# not mapped: profile entry 'active-request-scorer': its plugin is not mapped",
        "# not mapped: dataLayer.discovery: it does not name a file-discovery plugin of this file",
        "# not mapped: plugin 'custom-discovery' (type custom-discovery)",
        "# No file discovery: the reference then watches an InferencePool",
    ] {
        assert!(toml.contains(expected), "missing {expected:?} in\n{toml}");
    }
    // What maps is kept: the picker's parameter and the scorer weights in profile order.
    assert!(check.contains("\nmaxNumOfEndpoints = 2\n"), "{check}");
    assert!(
        toml.contains(
            "    { plugin = \"prefix-cache-scorer\", weight = 3.0 },\n    \
                       { plugin = \"queue-scorer\", weight = 1.0 },"
        ),
        "{toml}"
    );
    // The stderr summary counts the comments.
    let imported = run(&["config", "import", &fixture("unmappable")]);
    assert!(imported.status.success(), "{}", stderr(&imported));
    assert_eq!(stdout(&imported), toml);
    assert!(
        stderr(&imported).contains("10 item(s) not mapped"),
        "{}",
        stderr(&imported)
    );
}

#[test]
fn several_profiles_need_a_choice() {
    let refused = run(&["config", "import", &fixture("two-profiles")]);
    assert!(!refused.status.success());
    let message = stderr(&refused);
    assert!(
        message.contains(
            "no valid switchyard pipeline could be formed: the file has 2 scheduling profiles \
             (prefill, decode); switchyard runs exactly one per pipeline: pass --profile NAME"
        ),
        "{message}"
    );
    // The best-effort TOML is still printed, with both profiles as comments.
    assert!(
        stdout(&refused).contains("# not mapped: scheduling profile 'decode'"),
        "{}",
        stdout(&refused)
    );

    let chosen = run(&[
        "config",
        "import",
        &fixture("two-profiles"),
        "--profile",
        "decode",
    ]);
    assert!(chosen.status.success(), "{}", stderr(&chosen));
    let toml = stdout(&chosen);
    assert!(toml.contains("[[profiles]]\nname = \"decode\""), "{toml}");
    assert!(
        toml.contains("# not mapped: scheduling profile 'prefill': switchyard runs exactly one"),
        "{toml}"
    );
    assert!(
        toml.contains("# not mapped: plugin 'disagg-profile-handler' (type disagg-profile-handler): a profile handler chooses among several"),
        "{toml}"
    );
}

#[test]
fn input_errors_name_the_file_line_and_field() {
    let dir = temp_dir("errors");
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("written");
        path.display().to_string()
    };
    let cases = [
        (
            "bad.yaml",
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: a\n  \
             parameters: {x: [1, 2}\n",
            ":5:",
            "",
        ),
        (
            "kind.yaml",
            "apiVersion: llm-d.ai/v1alpha1\nkind: InferencePool\nplugins: []\n",
            ":2:",
            "kind: must be EndpointPickerConfig (got \"InferencePool\")",
        ),
        (
            "type.yaml",
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: \
             load-aware-scorer\n- name: second\n  parameters: {threshold: 3}\n",
            ":5:",
            "plugins[1]: missing field `type`",
        ),
        (
            "ref.yaml",
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins: []\n\
             schedulingProfiles:\n- name: default\n  plugins:\n  - weight: 2\n",
            ":7:",
            "schedulingProfiles[0].plugins[0]: missing field `pluginRef`",
        ),
    ];
    for (name, text, line, message) in cases {
        let path = write(name, text);
        let refused = run(&["config", "import", &path]);
        assert!(!refused.status.success(), "{name} was accepted");
        let error = stderr(&refused);
        assert!(
            error.starts_with(&format!("error: {path}{line}")),
            "{name}: {error}"
        );
        assert!(error.contains(message), "{name}: {error}");
        assert!(stdout(&refused).is_empty(), "{name}: {}", stdout(&refused));
    }
}

#[test]
fn the_output_file_is_never_the_input_nor_overwritten_unasked() {
    let dir = temp_dir("output");
    let input = dir.join("epp.yaml");
    std::fs::copy(workspace_root().join(fixture("rl-load-only")), &input).expect("copied");
    let input_arg = input.display().to_string();
    let same = run(&["config", "import", &input_arg, "--output", &input_arg]);
    assert!(!same.status.success());
    assert!(
        stderr(&same).contains("is the input file"),
        "{}",
        stderr(&same)
    );
    let original =
        std::fs::read_to_string(workspace_root().join(fixture("rl-load-only"))).expect("read");
    assert_eq!(std::fs::read_to_string(&input).expect("read"), original);

    let output = dir.join("out.toml");
    std::fs::write(&output, "kept").expect("written");
    let output_arg = output.display().to_string();
    let refused = run(&["config", "import", &input_arg, "--output", &output_arg]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("exists; pass --force to overwrite it"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(std::fs::read_to_string(&output).expect("read"), "kept");

    let forced = run(&[
        "config",
        "import",
        &input_arg,
        "--output",
        &output_arg,
        "--force",
    ]);
    assert!(forced.status.success(), "{}", stderr(&forced));
    assert!(stdout(&forced).is_empty());
    let text = std::fs::read_to_string(&output).expect("read");
    assert!(
        text.starts_with(&format!("# Imported from {input_arg} by")),
        "{text}"
    );
    assert!(Path::new(&output).exists());
}

#[test]
fn a_value_switchyard_refuses_fails_the_import_naming_it() {
    let dir = temp_dir("value");
    let input = dir.join("epp.yaml");
    std::fs::write(
        &input,
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: \
         burst-prefix-cache-producer\n  parameters:\n    windowDurationMs: 20000\n- type: \
         prefix-cache-scorer\n  parameters:\n    prefixMatchInfoProducerName: \
         burst-prefix-cache-producer\n",
    )
    .expect("written");
    let output = dir.join("epp.toml");
    let refused = run(&[
        "config",
        "import",
        &input.display().to_string(),
        "--output",
        &output.display().to_string(),
    ]);
    assert!(!refused.status.success());
    let message = stderr(&refused);
    assert!(
        message.contains(&format!(
            "no valid switchyard pipeline could be formed: the imported pipeline does not \
             build: {}:",
            output.display()
        )),
        "{message}"
    );
    assert!(
        message.contains("windowDurationMs must be in 1..=10000 (got 20000)"),
        "{message}"
    );
    // The value is kept as given in the best-effort file, not replaced.
    let text = std::fs::read_to_string(&output).expect("best effort written");
    assert!(text.contains("windowDurationMs = 20000\n"), "{text}");
}
