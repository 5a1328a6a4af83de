//! Shared helpers for the integration tests: building the real plugin libraries and the
//! compatibility fixtures, and wiring pipelines from TOML text.

pub mod extproc;
pub mod live;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use switchyard::config::LoadedConfig;
use switchyard::pipeline::{build, load_registry, Fleet, Options, Pipeline, Scheduler};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_path_buf()
}

/// A `cargo` command run from the workspace root, without the variables `cargo test` sets for
/// this test process (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, ...). Build scripts such as
/// `ring`'s watch some of them, so a nested build that inherited them would count those
/// crates as changed and rebuild them — and the next `cargo test` would rebuild them back.
pub fn cargo_command() -> Command {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string()));
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let set_for_tests = name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_")
            || matches!(
                name,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_MANIFEST_LINKS"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "CARGO_RUSTC_CURRENT_DIR"
                    | "OUT_DIR"
            );
        if set_for_tests {
            command.env_remove(name);
        }
    }
    command.current_dir(workspace_root());
    command
}

/// The target directory of this build (`CARGO_TARGET_DIR` aware).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| {
            if p.is_absolute() {
                p
            } else {
                workspace_root().join(p)
            }
        })
        .unwrap_or_else(|| workspace_root().join("target"))
}

const PLUGIN_PACKAGES: &[&str] = &[
    "burst-prefix-cache-producer",
    "prefix-cache-scorer",
    "prefix-cache-affinity-filter",
    "approx-prefix-cache-producer",
    "kv-event-prefix-cache-producer",
    "panicking-plugin",
];

static BUILD_LOCK: Mutex<()> = Mutex::new(());

fn run_cargo(args: &[&str]) {
    let _guard = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let status = cargo_command().args(args).status().expect("cargo runs");
    assert!(status.success(), "cargo {args:?} failed");
}

/// Builds the workspace's plugin libraries (debug) once per test binary and returns the
/// directory holding them.
pub fn plugin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let mut args = vec!["build", "--quiet"];
        for package in PLUGIN_PACKAGES {
            args.extend(["-p", package]);
        }
        run_cargo(&args);
        target_dir().join("debug")
    })
}

/// Builds one compatibility fixture (a workspace of its own under `tests/fixtures`) and
/// returns the path of its library.
pub fn fixture_library(fixture: &str) -> PathBuf {
    let manifest_dir = workspace_root().join("tests/fixtures").join(fixture);
    standalone_library(&manifest_dir, "fixtures", &fixture.replace('-', "_"), &[])
}

/// Builds (debug) the library `lib` of a Cargo project outside this workspace, with its own
/// target directory `<target>/<target_subdir>` and `env` set for the build, and returns the
/// path of the library file.
pub fn standalone_library(
    manifest_dir: &Path,
    target_subdir: &str,
    lib: &str,
    env: &[(&str, &str)],
) -> PathBuf {
    let lock = manifest_dir.join("Cargo.lock");
    if !lock.exists() {
        // Start from the workspace's resolution so the project builds the same dependency
        // versions (and reuses their artifacts).
        let _ = std::fs::copy(workspace_root().join("Cargo.lock"), &lock);
    }
    let target = target_dir().join(target_subdir);
    let manifest = manifest_dir.join("Cargo.toml");
    let _guard = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let status = cargo_command()
        .args(["build", "--quiet", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .envs(env.iter().copied())
        .status()
        .expect("cargo runs");
    assert!(
        status.success(),
        "cargo build of {} failed",
        manifest.display()
    );
    target
        .join("debug")
        .join(switchyard::config::library_file_name(lib))
}

/// Options that find the workspace's plugin libraries.
pub fn options() -> Options {
    Options {
        allow_experimental_plugins: false,
        plugin_dirs: vec![plugin_dir().to_path_buf()],
    }
}

/// Parses TOML text as if it were the file `tests/generated/<name>.toml`.
pub fn config(name: &str, toml: &str) -> LoadedConfig {
    try_config(name, toml).unwrap_or_else(|e| panic!("config {name} is valid: {e}"))
}

pub fn try_config(name: &str, toml: &str) -> Result<LoadedConfig, switchyard::config::ConfigError> {
    LoadedConfig::parse(&generated_path(name), toml.to_string())
}

/// The file TOML text named `name` is taken to come from (it is never written), as messages
/// cite it.
pub fn generated_path(name: &str) -> PathBuf {
    workspace_root().join(format!("tests/generated/{name}.toml"))
}

/// Wires a pipeline from TOML text, or returns the error text.
pub fn try_pipeline(name: &str, toml: &str) -> Result<Pipeline, String> {
    let config = try_config(name, toml).map_err(|e| e.to_string())?;
    let options = options();
    let registry = load_registry(&config, &options).map_err(|e| e.to_string())?;
    build(&config, &registry, &options).map_err(|e| e.to_string())
}

/// A scheduler over the config's endpoints.
pub fn scheduler(name: &str, toml: &str, seed: u64) -> Scheduler {
    let config = config(name, toml);
    let options = options();
    let registry = load_registry(&config, &options).unwrap_or_else(|e| panic!("{e}"));
    let pipeline = build(&config, &registry, &options).unwrap_or_else(|e| panic!("{e}"));
    let fleet: Fleet = switchyard::replay::fleet_from_config(&config.config.endpoints);
    Scheduler::new(Arc::new(pipeline), fleet, seed)
}

/// `[[endpoints]]` entries `pod1..podN` on loopback.
pub fn endpoints(n: usize) -> String {
    (1..=n)
        .map(|i| {
            format!(
                "[[endpoints]]\nname = \"pod{i}\"\naddress = \"127.0.0.1:{}\"\n",
                9000 + i
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Views of `n` candidate endpoints `/pod1..`, for calling a plugin instance directly.
pub fn endpoint_views(n: usize) -> Vec<switchyard_plugin_api::EndpointView<'static>> {
    use switchyard_plugin_api::ffi::RStr;
    (0..n)
        .map(|slot| switchyard_plugin_api::EndpointView {
            slot: slot as u32,
            host_index: slot as u32,
            id: RStr::from("/pod"),
            address: RStr::from("127.0.0.1:9000"),
            role: RStr::from(""),
            metrics: switchyard_plugin_api::EndpointMetrics::default(),
        })
        .collect()
}

/// A request of `model` with no prompt, for calling a plugin instance directly.
pub fn request_view(model: &'static str) -> switchyard_plugin_api::RequestView<'static> {
    use switchyard_plugin_api::ffi::{RSlice, RStr};
    switchyard_plugin_api::RequestView {
        id: RStr::from("r"),
        model: RStr::from(model),
        cache_salt: RStr::from(""),
        prompts: RSlice::from_slice(&[]),
        max_output_tokens: -1,
        now_ms: 0,
        random_seed: 1,
        explain: false,
    }
}
