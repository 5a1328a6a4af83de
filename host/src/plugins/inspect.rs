//! What `switchyard plugins` and `switchyard plugins inspect` print: the plugin types a config
//! makes available, and everything one library exports.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use switchyard_plugin_api::loading::{LoadError, LoadProblem};
use switchyard_plugin_api::{ApiVersion, Stability};

use crate::config::{bare_library_candidates, is_library_path};

use super::registry::{PluginType, Registry, RegistryError};

/// The plugin API versions this host loads, e.g. `1.0 to 1.1`.
pub fn loadable_api_versions() -> String {
    let host = ApiVersion::CURRENT;
    if host.minor == 0 {
        format!("{}.0", host.major)
    } else {
        format!("{}.0 to {}.{}", host.major, host.major, host.minor)
    }
}

/// The text of `switchyard --version` after the program's own version.
pub fn version_text() -> String {
    let host = ApiVersion::CURRENT;
    format!(
        "{}\nplugin API {}.{}.{}: loads plugin libraries built against {}",
        env!("CARGO_PKG_VERSION"),
        host.major,
        host.minor,
        host.patch,
        loadable_api_versions()
    )
}

fn api(version: ApiVersion) -> String {
    format!("{}.{}.{}", version.major, version.minor, version.patch)
}

/// One row per type (kind, stability, API version, source), each followed by its description
/// and the names of its parameters.
pub fn render_list(registry: &Registry) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<34} {:<9} {:<9} {:<5} SOURCE",
        "TYPE", "KIND", "STABILITY", "API"
    );
    for t in registry.iter() {
        let _ = writeln!(
            out,
            "{:<34} {:<9} {:<9} {:<5} {}",
            t.name(),
            t.kind().as_str(),
            t.stability().as_str(),
            format!("{}.{}", t.api_version.major, t.api_version.minor),
            t.source
        );
        let description = t.info.description.as_str().trim();
        if !description.is_empty() {
            let _ = writeln!(out, "    {description}");
        }
        let names: Vec<&str> = t.parameters().iter().map(|p| p.name.as_str()).collect();
        if names.is_empty() {
            let _ = writeln!(out, "    parameters: none");
        } else {
            let _ = writeln!(out, "    parameters: {}", names.join(", "));
        }
    }
    let _ = write!(
        out,
        "\n`switchyard plugins inspect LIBRARY` shows each parameter's type, default, valid range \
         and meaning.\n"
    );
    out
}

/// The file `plugins inspect` loads for `entry`: a path (an entry with `/` or an extension)
/// relative to the current directory, or a bare name looked up as a config's bare names are,
/// with `plugin_dirs` searched first.
pub fn resolve_library(entry: &Path, plugin_dirs: &[PathBuf]) -> Result<PathBuf, String> {
    let text = entry.to_string_lossy();
    if is_library_path(&text) {
        return match std::fs::metadata(entry) {
            Ok(_) => Ok(entry.to_path_buf()),
            Err(e) => Err(format!(
                "cannot open plugin library {}: {e}\n  a path is taken relative to the current \
                 directory; a bare name such as prefix_cache_scorer is looked up in \
                 --plugin-dir, SWITCHYARD_PLUGIN_DIR and the directory of the switchyard binary",
                entry.display()
            )),
        };
    }
    let candidates = bare_library_candidates(&text, plugin_dirs.to_vec());
    match candidates.iter().find(|p| p.exists()) {
        Some(path) => Ok(path.clone()),
        None => {
            let mut message = RegistryError::NotFound {
                entry: text.to_string(),
                searched: candidates,
            }
            .to_string();
            if text.contains('-') {
                let _ = write!(
                    message,
                    "\n  library names are written with underscores, as the file is named: {}",
                    text.replace('-', "_")
                );
            }
            Err(message)
        }
    }
}

/// Loads the library at `path` on its own (no config, no built-ins) and describes every
/// type it exports.
pub fn inspect_library(path: &Path) -> Result<String, String> {
    let mut registry = Registry::default();
    registry
        .load_path(path, &super::LibraryChecks::inspect_only())
        .map_err(|e| match e {
            RegistryError::Refused(LoadError {
                path,
                problem: LoadProblem::Open(reason),
                ..
            }) => format!(
                "cannot open plugin library {}: {reason}\n  is it a plugin library built for \
                 this platform (cargo build --workspace)?",
                path.display()
            ),
            other => other.to_string(),
        })?;
    let types: Vec<&PluginType> = registry.iter().collect();
    let mut out = String::new();
    let shown = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let _ = writeln!(out, "library     {}", shown.display());
    if let Some(first) = types.first() {
        let _ = writeln!(
            out,
            "plugin API  {} (this switchyard loads {})",
            api(first.api_version),
            loadable_api_versions()
        );
    }
    let _ = writeln!(out, "types       {}", types.len());
    for t in types {
        render_type(&mut out, t);
    }
    Ok(out)
}

fn render_type(out: &mut String, t: &PluginType) {
    let _ = writeln!(out, "\n{}", t.name());
    let _ = writeln!(out, "  kind         {}", t.kind().as_str());
    let note = if t.stability() == Stability::Alpha {
        " (loads only with allow_experimental_plugins)"
    } else {
        ""
    };
    let _ = writeln!(out, "  stability    {}{note}", t.stability().as_str());
    let _ = writeln!(out, "  description  {}", t.info.description.as_str().trim());
    let parameters = t.parameters();
    if parameters.is_empty() {
        let _ = writeln!(out, "  parameters   none");
        return;
    }
    let _ = writeln!(out, "  parameters");
    let width = parameters
        .iter()
        .map(|p| p.name.as_str().len())
        .max()
        .unwrap_or(0);
    for p in parameters {
        let _ = writeln!(
            out,
            "    {:<width$}  {}, default {}",
            p.name.as_str(),
            p.value_type.as_str(),
            p.default.as_str()
        );
        let indent = " ".repeat(width + 6);
        if !p.range.as_str().is_empty() {
            let _ = writeln!(out, "{indent}valid: {}", p.range.as_str());
        }
        if !p.description.as_str().is_empty() {
            let _ = writeln!(out, "{indent}{}", p.description.as_str());
        }
    }
}
