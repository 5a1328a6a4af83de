//! The corpus of broken configs and replay inputs under `tests/data/broken`: each file says, in
//! a `# expect:` comment on its first line, a fragment of the message it must be refused with.
//! Every one is refused by the real binary, with that fragment and with `file:line`; traces
//! through `simulate --trace`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use switchyard_tests::live::{binary, temp_dir};
use switchyard_tests::workspace_root;

fn corpus(kind: &str, extension: &str) -> Vec<PathBuf> {
    let dir = workspace_root().join("tests/data/broken").join(kind);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == extension))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "the {kind} corpus is missing");
    files
}

fn expectation(file: &Path) -> String {
    let text = std::fs::read(file).expect("corpus file");
    let first = text.split(|b| *b == b'\n').next().unwrap_or_default();
    String::from_utf8_lossy(first)
        .strip_prefix("# expect: ")
        .unwrap_or_else(|| panic!("{}: first line must be `# expect: ...`", file.display()))
        .trim()
        .to_string()
}

fn run(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .current_dir(workspace_root())
        .env_remove("SWITCHYARD_PLUGIN_DIR")
        .output()
        .expect("switchyard runs")
}

/// Checks a refusal: failed, the expected fragment, and `file:line:` in front of it.
fn assert_refused(file: &Path, output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let name = file.file_name().unwrap().to_string_lossy();
    assert!(!output.status.success(), "{name} was accepted");
    assert!(
        !stderr.contains("panicked"),
        "{name}: the binary panicked: {stderr}"
    );
    let expected = expectation(file);
    assert!(
        stderr.contains(&expected),
        "{name}: expected {expected:?} in: {stderr}"
    );
    let located = stderr.lines().any(|line| {
        line.split_once(&format!("{name}:"))
            .and_then(|(_, rest)| rest.split_once(':'))
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    assert!(located, "{name}: no file:line in: {stderr}");
}

#[test]
fn every_broken_config_is_refused_with_its_line_and_message() {
    for file in corpus("config", "toml") {
        let output = run(&["check", "--config", file.to_str().unwrap()]);
        assert_refused(&file, &output);
    }
}

/// Runs `COMMAND --config <fleet> FLAG FILE LAST` on every file of the `kind` corpus: each is
/// refused, and nothing is written to standard output.
fn refuses_every(kind: &str, command: &str, flag: &str, last: &str) {
    let fleet = workspace_root().join("tests/data/broken/replay-fleet.toml");
    for file in corpus(kind, "jsonl") {
        let output = run(&[
            command,
            "--config",
            fleet.to_str().unwrap(),
            flag,
            file.to_str().unwrap(),
            last,
        ]);
        assert!(
            output.stdout.is_empty(),
            "{}: output written",
            file.display()
        );
        assert_refused(&file, &output);
    }
}

#[test]
fn every_broken_replay_input_is_refused_with_its_line_and_message() {
    refuses_every("replay", "replay", "--input", "--brief");
}

#[test]
fn every_broken_trace_is_refused_with_its_line_and_message() {
    refuses_every("trace", "simulate", "--trace", "--no-baselines");
}

#[test]
fn replay_input_with_a_byte_order_mark_and_comments_is_read() {
    let dir = temp_dir("bom");
    let input = dir.join("requests.jsonl");
    std::fs::write(
        &input,
        b"\xEF\xBB\xBF{\"arrival_ms\": 0, \"id\": \"first\", \"tokens\": [1, 2]}\n\
          # a comment\n\
          {\"arrival_ms\": 1, \"prompt\": \"hello\"}\n",
    )
    .unwrap();
    let fleet = workspace_root().join("tests/data/broken/replay-fleet.toml");
    let output = run(&[
        "replay",
        "--config",
        fleet.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--brief",
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let ids: Vec<String> = stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].to_string())
        .collect();
    assert_eq!(ids, ["\"first\"", "\"req-1\""]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn replay_refuses_to_write_over_its_input() {
    let dir = temp_dir("same-file");
    let input = dir.join("requests.jsonl");
    let original = "{\"arrival_ms\": 0, \"tokens\": [1]}\n";
    std::fs::write(&input, original).unwrap();
    let fleet = workspace_root().join("tests/data/broken/replay-fleet.toml");
    // The same file reached through another spelling of its path.
    let other_spelling = dir.join(".").join("requests.jsonl");
    let output = run(&[
        "replay",
        "--config",
        fleet.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--output",
        other_spelling.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("is the input file"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&input).unwrap(), original);
    let _ = std::fs::remove_dir_all(dir);
}
