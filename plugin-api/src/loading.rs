//! Opening a plugin library and checking that it can be trusted to match this build.
//!
//! Order of checks: the file opens and carries a switchyard root module; the API version it
//! was built against is one this build loads ([`ApiVersion::can_load`]); every boundary type
//! has the same layout on both sides; the library contains panics (`panic = "unwind"`). Each
//! failure is a [`LoadError`] whose `Display` is a few lines; the full layout report is kept
//! in [`LoadError::detail`] for debug logs.

use std::fmt;
use std::path::{Path, PathBuf};

use abi_stable::library::{lib_header_from_path, LibraryError};
use abi_stable::std_types::RStr;

use crate::abi::{
    ApiVersion, HostCallbacks, PluginError, PluginInstance, PluginLibraryRef, PluginTypeInfo,
};

/// A loaded, verified plugin library. Libraries are never unloaded.
#[derive(Clone, Copy)]
pub struct LoadedLibrary {
    module: PluginLibraryRef,
    api_version: ApiVersion,
}

impl LoadedLibrary {
    /// The plugin API version the library was built against.
    pub fn api_version(&self) -> ApiVersion {
        self.api_version
    }

    pub fn types(&self) -> Vec<PluginTypeInfo> {
        (self.module.plugin_types())().into_vec()
    }

    pub fn connect_host(&self, host: HostCallbacks) {
        (self.module.set_host())(host)
    }

    pub fn create(
        &self,
        type_name: &str,
        instance_name: &str,
        parameters_json: &str,
    ) -> Result<PluginInstance, PluginError> {
        (self.module.create())(
            RStr::from(type_name),
            RStr::from(instance_name),
            RStr::from(parameters_json),
        )
        .into_result()
    }
}

/// Why a library was refused.
#[derive(Debug)]
pub struct LoadError {
    pub path: PathBuf,
    pub problem: LoadProblem,
    /// The loader's full report, for debug output.
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadProblem {
    /// The file could not be opened as a shared library.
    Open(String),
    /// The library exports no switchyard root module.
    NotAPlugin,
    /// Built against an API version this host does not load.
    Version {
        library: String,
        host: ApiVersion,
    },
    /// Boundary types differ; one line per difference.
    Layout(Vec<String>),
    /// Built with `panic = "abort"`: a panic would end the host.
    AbortsOnPanic,
    Other(String),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.display();
        match &self.problem {
            LoadProblem::Open(reason) => write!(
                f,
                "cannot open plugin library {path}: {reason}\n  \
                 check the path (relative paths are resolved against the config file) and \
                 that the library was built (cargo build --workspace)"
            ),
            LoadProblem::NotAPlugin => write!(
                f,
                "{path} is not a switchyard plugin library (it exports no root module)\n  \
                 a plugin library calls switchyard_plugin_api::export_plugins!"
            ),
            LoadProblem::Version { library, host } => {
                let advice = if ApiVersion::parse(library).is_some_and(|v| v.major == host.major) {
                    format!(
                        "it is newer than this switchyard: upgrade switchyard, or rebuild the \
                         library against switchyard-plugin-api {}.{}",
                        host.major, host.minor
                    )
                } else {
                    format!(
                        "rebuild the library against switchyard-plugin-api {}.x",
                        host.major
                    )
                };
                write!(
                    f,
                    "refused plugin library {path}: built against plugin API {library}, this \
                     switchyard loads {}.0 to {}.{}\n  {advice}",
                    host.major, host.major, host.minor
                )
            }
            LoadProblem::Layout(lines) => {
                write!(
                    f,
                    "refused plugin library {path}: its boundary types differ from this \
                     switchyard's although the API versions match"
                )?;
                for line in lines.iter().take(4) {
                    write!(f, "\n  {line}")?;
                }
                write!(
                    f,
                    "\n  rebuild the library against the released switchyard-plugin-api \
                     (run with RUST_LOG=debug for the full report)"
                )
            }
            LoadProblem::AbortsOnPanic => write!(
                f,
                "refused plugin library {path}: built with panic = \"abort\", so a panic in \
                 it would end switchyard\n  build it with panic = \"unwind\" (the default)"
            ),
            LoadProblem::Other(reason) => write!(f, "refused plugin library {path}: {reason}"),
        }
    }
}

impl std::error::Error for LoadError {}

impl ApiVersion {
    /// Parses `major.minor.patch` (pre-release and build suffixes ignored).
    pub fn parse(text: &str) -> Option<ApiVersion> {
        let core = text.split(['-', '+']).next()?;
        let mut parts = core.split('.').map(|p| p.trim().parse::<u32>().ok());
        Some(ApiVersion {
            major: parts.next()??,
            minor: parts.next()??,
            patch: parts.next().flatten().unwrap_or(0),
        })
    }
}

/// Opens and verifies the plugin library at `path`.
pub fn load_library(path: &Path) -> Result<LoadedLibrary, LoadError> {
    let refuse = |problem: LoadProblem, detail: String| LoadError {
        path: path.to_path_buf(),
        problem,
        detail,
    };
    let header = lib_header_from_path(path).map_err(|error| {
        let detail = error.to_string();
        let problem = match error {
            LibraryError::OpenError { .. } => LoadProblem::Open(first_line(&detail)),
            LibraryError::GetSymbolError { .. } => LoadProblem::NotAPlugin,
            LibraryError::InvalidAbiHeader(_) => LoadProblem::Other(
                "it was built with an incompatible abi_stable version".to_string(),
            ),
            _ => LoadProblem::Other(first_line(&detail)),
        };
        refuse(problem, detail)
    })?;

    let declared = header.version_strings();
    let library_version = declared.version.as_str();
    let host = ApiVersion::CURRENT;
    match ApiVersion::parse(library_version) {
        Some(version) if host.can_load(version) => {}
        _ => {
            return Err(refuse(
                LoadProblem::Version {
                    library: library_version.to_string(),
                    host,
                },
                format!("library version strings: {declared:?}"),
            ))
        }
    }

    let module = header
        .init_root_module::<PluginLibraryRef>()
        .map_err(|error| {
            let detail = error.to_string();
            let problem = match &error {
                LibraryError::AbiInstability(_) => LoadProblem::Layout(layout_summary(&detail)),
                LibraryError::IncompatibleVersionNumber { .. } => LoadProblem::Version {
                    library: library_version.to_string(),
                    host,
                },
                LibraryError::RootModule { .. } => LoadProblem::Other(format!(
                    "its root module failed to initialise: {}",
                    first_line(&detail)
                )),
                _ => LoadProblem::Other(first_line(&detail)),
            };
            refuse(problem, detail)
        })?;

    if !module.unwinding() {
        return Err(refuse(LoadProblem::AbortsOnPanic, String::new()));
    }
    Ok(LoadedLibrary {
        module,
        api_version: module.api_version(),
    })
}

fn first_line(text: &str) -> String {
    text.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}

/// The loader's report lists every difference as an `Error:` line among hundreds of lines of
/// layout dump; those lines are the useful part.
fn layout_summary(report: &str) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let all: Vec<&str> = report
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    for (i, line) in all.iter().enumerate() {
        let Some(rest) = line.strip_prefix("Error:") else {
            continue;
        };
        // The values follow the `Error:` line as `Expected:`/`Found:` blocks.
        let mut entry = rest.trim().to_string();
        for next in all[i + 1..].iter().take(4) {
            if next.starts_with("Error:") {
                break;
            }
            entry.push(' ');
            entry.push_str(next);
        }
        let entry: String = entry.chars().take(160).collect();
        if !lines.contains(&entry) {
            lines.push(entry);
        }
    }
    if lines.is_empty() {
        lines.push(first_line(report));
    }
    lines
}
