//! Refusals at start-up say why: the operating system's reason a file does not open, the
//! boundary type and field whose layout differs, and the parameters a type really has.

use std::path::{Path, PathBuf};
use std::process::Command;

use switchyard_plugin_api::loading::{load_library, LoadProblem};
use switchyard_tests::live::binary;
use switchyard_tests::{endpoints, fixture_library, try_pipeline};

fn temp_dir(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("switchyard-refusals-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn open_reason(path: &Path) -> String {
    let error = load_library(path).err().expect("refused");
    let LoadProblem::Open(reason) = &error.problem else {
        panic!(
            "{}: expected an open failure, got {:?}",
            path.display(),
            error.problem
        );
    };
    let first = error.to_string().lines().next().unwrap().to_string();
    assert_eq!(
        first,
        format!("cannot open plugin library {}: {reason}", path.display())
    );
    reason.clone()
}

#[cfg(target_os = "linux")]
#[test]
fn a_file_that_does_not_open_is_refused_with_the_reason() {
    let dir = temp_dir("open");
    let text = dir.join("notes.so");
    std::fs::write(
        &text,
        "just some text, long enough to be read as a header\n".repeat(8),
    )
    .unwrap();
    let empty = dir.join("empty.so");
    std::fs::write(&empty, "").unwrap();

    assert_eq!(
        open_reason(&dir.join("missing.so")),
        "No such file or directory"
    );
    assert_eq!(open_reason(&dir), "Is a directory");
    assert_eq!(open_reason(&text), "invalid ELF header");
    assert_eq!(open_reason(&empty), "file too short");
    // An executable is a valid ELF file the loader still will not open; its reason is
    // the loader's own.
    let executable = std::env::current_exe().unwrap();
    let reason = open_reason(&executable);
    assert!(reason.contains("executable"), "{reason}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn library_paths_are_printed_without_dot_components() {
    let dir = temp_dir("tidy");
    std::fs::write(
        dir.join("pipeline.toml"),
        "libraries = [\"./libgone.so\"]\n",
    )
    .unwrap();
    let output = Command::new(binary())
        .args(["check", "--config", "./pipeline.toml"])
        .current_dir(&dir)
        .output()
        .expect("switchyard runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.starts_with(
            "error: ./pipeline.toml:1: cannot open plugin library ./libgone.so: No such file or \
             directory"
        ),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_layout_refusal_names_the_boundary_type_and_field_that_differ() {
    let path = fixture_library("drifted-layout-plugin");
    let error = load_library(&path).err().expect("refused");
    assert!(
        matches!(error.problem, LoadProblem::Layout(_)),
        "{:?}",
        error.problem
    );
    let message = error.to_string();
    assert!(message.lines().count() <= 6, "{message}");
    assert!(
        message.contains("in `EndpointMetrics`, the library has an extra field `cache_hit_rate`"),
        "{message}"
    );
    assert!(
        message.contains("in `EndpointView`, field `metrics` (EndpointMetrics)"),
        "{message}"
    );
    assert!(
        message.contains("incompatible type size expected 32, found 40"),
        "{message}"
    );
    assert!(
        error.detail.lines().count() > 100,
        "the full report is kept for debug output"
    );

    let error = load_library(&fixture_library("mismatched-layout-plugin"))
        .err()
        .expect("refused");
    let message = error.to_string();
    assert!(
        message.contains(
            "in `PluginLibrary`, field `api_version` is `ApiVersion` here and `u64` in the library"
        ),
        "{message}"
    );
}

fn scorer_with(type_name: &str, parameters: &str) -> String {
    format!(
        "libraries = [\"panicking_plugin\"]\n{}\n[[plugins]]\ntype = \"{type_name}\"\n\
         [plugins.parameters]\n{parameters}\n",
        endpoints(1)
    )
}

#[test]
fn a_parameter_the_type_does_not_declare_is_refused_even_when_the_plugin_would_take_it() {
    // `lax-scorer` declares `weightHint` and accepts anything.
    let config = scorer_with("lax-scorer", "weightHint = 2.0\nweightHnit = 3.0");
    let error = try_pipeline("undeclared", &config).err().expect("refused");
    assert!(
        error.ends_with(
            "undeclared.toml:10: plugin 'lax-scorer': unknown parameter `weightHnit`; valid \
             parameters of type 'lax-scorer': weightHint"
        ),
        "{error}"
    );
    assert!(try_pipeline("declared", &scorer_with("lax-scorer", "weightHint = 2.0")).is_ok());

    let config = scorer_with("panicking-scorer", "mode = \"quiet\"");
    let error = try_pipeline("none-declared", &config)
        .err()
        .expect("refused");
    assert!(
        error.ends_with(
            "none-declared.toml:9: plugin 'panicking-scorer': unknown parameter `mode`; type \
             'panicking-scorer' takes no parameters"
        ),
        "{error}"
    );

    // Built-in types are held to the same rule.
    let config = scorer_with("load-aware-scorer", "treshold = 2");
    let error = try_pipeline("builtin", &config).err().expect("refused");
    assert!(
        error.contains(
            "unknown parameter `treshold`; valid parameters of type 'load-aware-scorer': threshold"
        ),
        "{error}"
    );
}
