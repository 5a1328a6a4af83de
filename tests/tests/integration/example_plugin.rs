//! The example plugin under `examples/`, handled as its author and an operator would: built
//! on its own with cargo (it is not a member of this workspace), loaded into an already-built
//! `switchyard`, then replaced by a second build copied over it, with the host untouched.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use switchyard::config::library_file_name;
use switchyard_tests::live::{binary, temp_dir};
use switchyard_tests::{standalone_library, workspace_root};

const LIB: &str = "preferred_endpoint_scorer";

/// Builds the example with the build-time default of its `endpoint` parameter. The build
/// shares the compatibility fixtures' target directory: the same dependencies, built once.
fn build_example(default_endpoint: &str) -> PathBuf {
    standalone_library(
        &workspace_root().join("examples/preferred-endpoint-scorer"),
        "fixtures",
        LIB,
        &[("PREFERRED_ENDPOINT_DEFAULT", default_endpoint)],
    )
}

/// The SHA-256 of the file at `path`, as the host's library pins spell it.
fn sha256_hex(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    switchyard::plugins::supply::sha256_hex(&bytes)
}

/// Deploys `built` at `deployed` the safe way: a copy next to it, renamed over it.
fn deploy(built: &Path, deployed: &Path) {
    let staged = deployed.with_extension("so.new");
    std::fs::copy(built, &staged).expect("copies the library");
    std::fs::rename(&staged, deployed).expect("renames it into place");
}

fn run(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .env_remove("SWITCHYARD_PLUGIN_DIR")
        .env_remove("RUST_LOG")
        .output()
        .expect("switchyard runs")
}

fn ok(output: &Output) -> String {
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    text
}

/// A pipeline over pod1..pod4 whose only scorer is the example's, with `parameters`.
fn write_config(dir: &Path, name: &str, parameters: &str) -> PathBuf {
    let mut toml = format!(
        "libraries = [\"./{}\"]\n\n{}\n[[plugins]]\ntype = \"preferred-endpoint-scorer\"\n",
        library_file_name(LIB),
        switchyard_tests::endpoints(4)
    );
    if !parameters.is_empty() {
        toml.push_str(&format!("parameters = {parameters}\n"));
    }
    let path = dir.join(name);
    std::fs::write(&path, toml).unwrap();
    path
}

/// Replays six requests and returns the endpoints each was sent to, with the scorer's note.
fn replay(config: &Path, input: &Path) -> Vec<(Vec<String>, String)> {
    let text = ok(&run(&[
        "replay",
        "--config",
        config.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]));
    text.lines()
        .map(|line| {
            let line: Value = serde_json::from_str(line).expect("a JSON line");
            let endpoints = line["endpoints"]
                .as_array()
                .expect("endpoints")
                .iter()
                .map(|e| e.as_str().expect("an endpoint id").to_string())
                .collect();
            (endpoints, line["decision"].to_string())
        })
        .collect()
}

fn all_sent_to(decisions: &[(Vec<String>, String)], endpoint: &str) {
    assert_eq!(decisions.len(), 6);
    for (endpoints, record) in decisions {
        assert_eq!(endpoints, &[endpoint.to_string()], "{record}");
    }
}

#[test]
fn the_example_builds_out_of_tree_loads_and_a_second_build_replaces_it() {
    let host = binary();
    let host_digest = sha256_hex(host);
    let dir = temp_dir("example-plugin");
    let deployed = dir.join(library_file_name(LIB));
    let input = dir.join("requests.jsonl");
    let requests: String = (0..6)
        .map(|i| {
            format!("{{\"arrival_ms\":{i},\"id\":\"r{i}\",\"model\":\"m\",\"tokens\":[1,2,{i}]}}\n")
        })
        .collect();
    std::fs::write(&input, requests).unwrap();
    let defaults = write_config(&dir, "defaults.toml", "");
    let pinned = write_config(&dir, "pinned.toml", "{ endpoint = \"pod4\", score = 0.5 }");

    // The first release favours pod2 unless told otherwise.
    deploy(&build_example("pod2"), &deployed);
    let first_digest = sha256_hex(&deployed);
    let listed = ok(&run(&["plugins", "--config", defaults.to_str().unwrap()]));
    let row = listed
        .lines()
        .find(|l| l.starts_with("preferred-endpoint-scorer "))
        .unwrap_or_else(|| panic!("the example's type is listed:\n{listed}"));
    assert!(row.contains("scorer"), "{row}");
    assert!(
        row.contains(&*deployed.canonicalize().unwrap().to_string_lossy()),
        "{row}"
    );
    let checked = ok(&run(&["check", "--config", defaults.to_str().unwrap()]));
    assert!(
        checked.contains("endpoint = \"pod2\"  # default"),
        "{checked}"
    );
    // The effective config of the example's pipeline is itself a config that checks the same.
    let effective = dir.join("effective.toml");
    std::fs::write(&effective, &checked).unwrap();
    let rechecked = ok(&run(&["check", "--config", effective.to_str().unwrap()]));
    let table = |text: &str| -> toml::Table { text.parse().expect("check prints TOML") };
    assert_eq!(table(&checked), table(&rechecked));
    let inspected = ok(&run(&["plugins", "inspect", deployed.to_str().unwrap()]));
    assert!(
        inspected.contains("\n    endpoint  string, default \"pod2\"\n"),
        "{inspected}"
    );
    assert!(
        inspected.contains("\n    score     number, default 1.0\n"),
        "{inspected}"
    );
    all_sent_to(&replay(&defaults, &input), "/pod2");
    all_sent_to(&replay(&pinned, &input), "/pod4");
    let bad = write_config(&dir, "bad.toml", "{ score = 1.5 }");
    let refused = run(&["check", "--config", bad.to_str().unwrap()]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("score must be in [0, 1] (got 1.5)"), "{err}");

    // The second release favours pod3 by default; it is swapped in at the same path.
    deploy(&build_example("pod3"), &deployed);
    assert_ne!(
        sha256_hex(&deployed),
        first_digest,
        "the second build is another file"
    );
    let checked = ok(&run(&["check", "--config", defaults.to_str().unwrap()]));
    assert!(
        checked.contains("endpoint = \"pod3\"  # default"),
        "{checked}"
    );
    let inspected = ok(&run(&["plugins", "inspect", deployed.to_str().unwrap()]));
    assert!(
        inspected.contains("\n    endpoint  string, default \"pod3\"\n"),
        "{inspected}"
    );
    all_sent_to(&replay(&defaults, &input), "/pod3");
    // An explicit parameter still wins over the new default.
    all_sent_to(&replay(&pinned, &input), "/pod4");

    assert_eq!(
        sha256_hex(host),
        host_digest,
        "the host binary was not rebuilt or touched"
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn the_plugin_api_manifest_stands_alone_outside_the_workspace() {
    // A vendored copy, as a third party would hold it: no switchyard workspace above it.
    let dir = temp_dir("vendored-plugin-api");
    let copy = dir.join("switchyard-plugin-api");
    copy_tree(&workspace_root().join("plugin-api"), &copy);
    let out = switchyard_tests::cargo_command()
        .args([
            "metadata",
            "--offline",
            "--no-deps",
            "--format-version",
            "1",
        ])
        .arg("--manifest-path")
        .arg(copy.join("Cargo.toml"))
        .current_dir(&dir)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "the copied manifest does not parse on its own:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let package = &metadata["packages"][0];
    assert_eq!(package["name"], "switchyard-plugin-api");
    assert_eq!(package["edition"], "2021");
    assert_eq!(package["license"], "Apache-2.0");
    // Its own workspace root, not switchyard's.
    assert_eq!(
        Path::new(metadata["workspace_root"].as_str().unwrap()),
        copy.canonicalize().unwrap()
    );
    let _ = std::fs::remove_dir_all(dir);
}
