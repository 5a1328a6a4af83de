//! Supply-chain checks at load: a library that group or others can write (or that sits in a
//! directory they can write) is refused unless the config allows it, and a library pinned by
//! SHA-256 loads only when its bytes match.

#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use switchyard::plugins::supply::sha256_hex;
use switchyard_tests::live::binary;
use switchyard_tests::{endpoints, plugin_dir, try_pipeline};

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("switchyard-supply-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A copy of the scorer library in `dir`, with mode 0755 whatever the umask.
fn scorer_copy(dir: &Path) -> PathBuf {
    let name = switchyard::config::library_file_name("prefix_cache_scorer");
    let copy = dir.join(&name);
    std::fs::copy(plugin_dir().join(&name), &copy).expect("copy the scorer library");
    chmod(&copy, 0o755);
    copy
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn config_with(library: &str, allow: bool) -> String {
    format!(
        "allow_writable_libraries = {allow}\n\
         libraries = [{library}, \"approx_prefix_cache_producer\"]\n{}\n\
         [[plugins]]\ntype = \"prefix-cache-scorer\"\n",
        endpoints(1)
    )
}

fn quoted(path: &Path) -> String {
    format!("{:?}", path.to_str().unwrap())
}

#[test]
fn a_world_writable_library_is_refused_unless_allowed() {
    let dir = temp_dir("file");
    let library = scorer_copy(&dir);
    assert!(try_pipeline("tidy-mode", &config_with(&quoted(&library), false)).is_ok());

    chmod(&library, 0o777);
    let error = try_pipeline("writable-file", &config_with(&quoted(&library), false))
        .err()
        .expect("refused");
    assert!(
        error.contains(&format!(
            "writable-file.toml:2: refused plugin library {}: it is writable by group and \
             others (mode 0777)",
            library.display()
        )),
        "{error}"
    );
    assert!(
        error.contains("chmod go-w it, or set allow_writable_libraries = true"),
        "{error}"
    );
    chmod(&library, 0o775);
    let error = try_pipeline("group-writable", &config_with(&quoted(&library), false))
        .err()
        .expect("refused");
    assert!(error.contains("writable by group (mode 0775)"), "{error}");

    chmod(&library, 0o777);
    try_pipeline("allowed", &config_with(&quoted(&library), true))
        .unwrap_or_else(|e| panic!("allowed explicitly: {e}"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_library_in_a_writable_directory_is_refused_unless_the_directory_is_sticky() {
    let dir = temp_dir("dir");
    let library = scorer_copy(&dir);
    chmod(&dir, 0o777);
    let error = try_pipeline("writable-dir", &config_with(&quoted(&library), false))
        .err()
        .expect("refused");
    let canonical = dir.canonicalize().unwrap();
    assert!(
        error.contains(&format!(
            "its directory {} is writable by group and others (mode 0777)",
            canonical.display()
        )),
        "{error}"
    );
    assert!(
        error.contains(&format!("chmod go-w {}", canonical.display())),
        "{error}"
    );
    // With the sticky bit only the owner of a file may replace it.
    chmod(&dir, 0o1777);
    try_pipeline("sticky-dir", &config_with(&quoted(&library), false))
        .unwrap_or_else(|e| panic!("a sticky directory is fine: {e}"));
    chmod(&dir, 0o755);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_pinned_library_loads_only_with_the_pinned_digest() {
    let dir = temp_dir("pin");
    let library = scorer_copy(&dir);
    let digest = sha256_hex(&std::fs::read(&library).unwrap());
    let pinned = |sha256: &str| format!("{{ path = {}, sha256 = \"{sha256}\" }}", quoted(&library));
    try_pipeline("pinned", &config_with(&pinned(&digest), false))
        .unwrap_or_else(|e| panic!("the right digest loads: {e}"));
    try_pipeline(
        "pinned-upper",
        &config_with(&pinned(&digest.to_ascii_uppercase()), false),
    )
    .unwrap_or_else(|e| panic!("hex digits in either case: {e}"));
    // Bare names take a pin too.
    let by_name = format!(
        "{{ path = \"prefix_cache_scorer\", sha256 = \"{}\" }}",
        sha256_hex(
            &std::fs::read(
                plugin_dir().join(switchyard::config::library_file_name("prefix_cache_scorer"))
            )
            .unwrap()
        )
    );
    try_pipeline("pinned-by-name", &config_with(&by_name, false))
        .unwrap_or_else(|e| panic!("a bare name with its digest loads: {e}"));

    let wrong = "0".repeat(64);
    let error = try_pipeline("mismatch", &config_with(&pinned(&wrong), false))
        .err()
        .expect("refused");
    assert!(
        error.contains(&format!(
            "mismatch.toml:2: refused plugin library {}: its SHA-256 is {digest}, but the \
             config pins sha256 = \"{wrong}\"",
            library.display()
        )),
        "{error}"
    );

    let error = try_pipeline("not-hex", &config_with(&pinned("abc"), false))
        .err()
        .expect("refused");
    assert!(
        error.contains("not-hex.toml:2: sha256 of library")
            && error.contains("must be 64 hexadecimal digits (got \"abc\")"),
        "{error}"
    );
    let error = try_pipeline(
        "unknown-key",
        &config_with("{ path = \"prefix_cache_scorer\", sha = \"x\" }", false),
    )
    .err()
    .expect("refused");
    assert!(error.contains("unknown field `sha`"), "{error}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_prints_a_pinned_entry_that_checks_again() {
    let dir = temp_dir("round-trip");
    let library = scorer_copy(&dir);
    let digest = sha256_hex(&std::fs::read(&library).unwrap());
    let first_config = dir.join("pipeline.toml");
    std::fs::write(
        &first_config,
        config_with(
            &format!(
                "{{ path = \"{}\", sha256 = \"{digest}\" }}",
                library.file_name().unwrap().to_str().unwrap()
            ),
            false,
        ),
    )
    .unwrap();
    let check = |config: &Path| {
        let output = Command::new(binary())
            .args(["check", "--config"])
            .arg(config)
            .arg("--plugin-dir")
            .arg(plugin_dir())
            .output()
            .expect("switchyard runs");
        assert!(
            output.status.success(),
            "{}: {}",
            config.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    let first = check(&first_config);
    assert!(
        first.contains(&format!(
            "libraries = [{{ path = {}, sha256 = \"{digest}\" }}, \"approx_prefix_cache_producer\"]",
            quoted(&library.canonicalize().unwrap())
        )),
        "{first}"
    );
    assert!(
        first.contains("allow_writable_libraries = false"),
        "{first}"
    );
    let second_config = dir.join("effective.toml");
    std::fs::write(&second_config, &first).unwrap();
    let second = check(&second_config);
    // The second rendering marks defaults and created producers differently; the library
    // keys must come out the same.
    let library_keys = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("libraries = ") || l.starts_with("allow_writable_"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(library_keys(&first), library_keys(&second));
    let _ = std::fs::remove_dir_all(&dir);
}
