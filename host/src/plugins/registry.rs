//! The registry of plugin types: built-ins (collected through `inventory`) and the types of
//! every library the config names. One type name has exactly one source.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use switchyard_plugin_api::loading::{
    read_library, tidy_path, LoadError, LoadProblem, LoadedLibrary,
};
use switchyard_plugin_api::sdk::PluginFactory;
use switchyard_plugin_api::{
    ApiVersion, HostCallbacks, LogLevel, ParamDoc, PluginError, PluginInstance, PluginKind,
    PluginTypeInfo, Stability,
};

use super::builtin;

/// Where a plugin type comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Builtin,
    Library(PathBuf),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Builtin => f.write_str("built-in"),
            Source::Library(path) => write!(f, "{}", path.display()),
        }
    }
}

#[derive(Clone, Copy)]
enum Maker {
    Builtin(&'static PluginFactory),
    Library(LoadedLibrary),
}

/// One registered plugin type.
#[derive(Clone)]
pub struct PluginType {
    pub info: PluginTypeInfo,
    pub source: Source,
    /// SHA-256 of the library's bytes; `None` for a built-in type.
    pub digest: Option<String>,
    pub api_version: ApiVersion,
    maker: Maker,
}

impl PluginType {
    pub fn name(&self) -> &str {
        self.info.type_name.as_str()
    }

    pub fn kind(&self) -> PluginKind {
        self.info.kind
    }

    pub fn stability(&self) -> Stability {
        self.info.stability
    }

    pub fn parameters(&self) -> &[ParamDoc] {
        self.info.parameters.as_slice()
    }

    /// Creates an instance from JSON parameters (`null` for none).
    pub fn create(
        &self,
        instance_name: &str,
        parameters_json: &str,
    ) -> Result<PluginInstance, PluginError> {
        let label = crate::pipeline::wiring::label(instance_name, self.name());
        let _call = super::crash_note::enter(&label, "create");
        match self.maker {
            Maker::Builtin(factory) => {
                let created =
                    std::panic::catch_unwind(|| (factory.create)(instance_name, parameters_json))
                        .unwrap_or_else(|_| {
                            Err(PluginError::failed("the plugin's constructor panicked"))
                        });
                created.map(|instance| instance.into_ffi_named(&label))
            }
            Maker::Library(library) => library.create(self.name(), instance_name, parameters_json),
        }
    }
}

/// A registry problem that stops start-up.
#[derive(Debug)]
pub enum RegistryError {
    /// A library was refused; the message is the loader's short explanation.
    Refused(switchyard_plugin_api::loading::LoadError),
    /// No file found for a library named by bare name.
    NotFound {
        entry: String,
        searched: Vec<PathBuf>,
    },
    /// Two sources offer one type name.
    Duplicate {
        type_name: String,
        first: Source,
        second: Source,
    },
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistryError::Refused(error) => write!(f, "{error}"),
            RegistryError::NotFound { entry, searched } => {
                write!(
                    f,
                    "plugin library '{}' not found; looked for",
                    entry.escape_debug()
                )?;
                for path in searched {
                    write!(f, "\n  {}", path.display().to_string().escape_debug())?;
                }
                write!(
                    f,
                    "\n  build the plugins (cargo build --workspace, add --release for a release \
                     host) or pass --plugin-dir"
                )
            }
            RegistryError::Duplicate {
                type_name,
                first,
                second,
            } => write!(
                f,
                "plugin type '{type_name}' is offered twice: by {first} and by {second}; \
                 remove one of the two libraries from the config"
            ),
        }
    }
}

impl std::error::Error for RegistryError {}

/// What a library file must satisfy before it is loaded.
#[derive(Debug, Clone, Default)]
pub struct LibraryChecks {
    /// Load a file that group or others can write, or that sits in such a directory.
    pub allow_writable: bool,
    /// The SHA-256 the file must have (hex), when pinned.
    pub sha256: Option<String>,
}

impl LibraryChecks {
    /// Checks for a library named on the command line to be described, not run in a pipeline.
    pub fn inspect_only() -> LibraryChecks {
        LibraryChecks {
            allow_writable: true,
            sha256: None,
        }
    }
}

/// A library file a registry loaded and the SHA-256 of the bytes it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryFile {
    pub path: PathBuf,
    pub digest: String,
}

/// All plugin types known to this run, by type name.
#[derive(Clone, Default)]
pub struct Registry {
    types: BTreeMap<String, PluginType>,
    libraries: Vec<LibraryFile>,
}

impl Registry {
    /// A registry holding the built-in types only.
    pub fn with_builtins() -> Registry {
        let mut registry = Registry::default();
        for factory in builtin::all() {
            let info = switchyard_plugin_api::sdk::describe_types(&[factory])
                .into_iter()
                .next()
                .expect("one factory describes one type");
            let added = registry.add(PluginType {
                info,
                source: Source::Builtin,
                digest: None,
                api_version: ApiVersion::CURRENT,
                maker: Maker::Builtin(factory),
            });
            debug_assert!(added.is_ok(), "built-in type names are unique");
        }
        registry
    }

    fn add(&mut self, plugin_type: PluginType) -> Result<(), RegistryError> {
        if let Some(existing) = self.types.get(plugin_type.name()) {
            return Err(RegistryError::Duplicate {
                type_name: plugin_type.name().to_string(),
                first: existing.source.clone(),
                second: plugin_type.source,
            });
        }
        self.types
            .insert(plugin_type.name().to_string(), plugin_type);
        Ok(())
    }

    /// Loads the first existing file among `candidates` and registers its types.
    pub fn load_library(
        &mut self,
        entry: &str,
        candidates: &[PathBuf],
        explicit_path: bool,
        checks: &LibraryChecks,
    ) -> Result<(), RegistryError> {
        let Some(path) = candidates.iter().find(|p| p.exists()) else {
            if explicit_path && candidates.len() == 1 {
                // An explicit path: let the loader say why it cannot be opened.
                return self.load_path(&candidates[0], checks);
            }
            return Err(RegistryError::NotFound {
                entry: entry.to_string(),
                searched: candidates.to_vec(),
            });
        };
        self.load_path(path, checks)
    }

    pub fn load_path(&mut self, path: &Path, checks: &LibraryChecks) -> Result<(), RegistryError> {
        if !checks.allow_writable {
            if let Some(reason) = super::supply::writable_problem(path) {
                return Err(RegistryError::Refused(LoadError {
                    path: tidy_path(path),
                    problem: LoadProblem::Other(reason),
                    detail: String::new(),
                }));
            }
        }
        let refused = |error: LoadError| {
            tracing::debug!(library = %path.display(), "full loader report:\n{}", error.detail);
            RegistryError::Refused(error)
        };
        let bytes = read_library(path).map_err(refused)?;
        if let Some(expected) = checks.sha256.as_deref() {
            super::supply::check_sha256(&bytes, expected).map_err(|reason| {
                refused(LoadError {
                    path: tidy_path(path),
                    problem: LoadProblem::Other(reason),
                    detail: String::new(),
                })
            })?;
        }
        let digest = super::supply::sha256_hex(&bytes);
        let library = super::loaded::open(path, &bytes, &digest, HostCallbacks { log: plugin_log })
            .map_err(refused)?;
        let file = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        self.libraries.push(LibraryFile {
            path: file.clone(),
            digest: digest.clone(),
        });
        let source = Source::Library(file);
        for info in library.types() {
            self.add(PluginType {
                info,
                source: source.clone(),
                digest: Some(digest.clone()),
                api_version: library.api_version(),
                maker: Maker::Library(library),
            })?;
        }
        Ok(())
    }

    /// The library files loaded, in config order, with the digest of the bytes that run.
    pub fn libraries(&self) -> &[LibraryFile] {
        &self.libraries
    }

    pub fn get(&self, type_name: &str) -> Option<&PluginType> {
        self.types.get(type_name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &PluginType> {
        self.types.values()
    }

    pub fn type_names(&self) -> Vec<&str> {
        self.types.keys().map(String::as_str).collect()
    }
}

/// The host side of the logging bridge: plugin lines join the host's `tracing` output.
extern "C" fn plugin_log(
    level: LogLevel,
    target: switchyard_plugin_api::ffi::RStr<'_>,
    message: switchyard_plugin_api::ffi::RStr<'_>,
) {
    let (target, message) = (target.as_str(), message.as_str());
    match level {
        LogLevel::Error => tracing::error!(plugin = target, "{message}"),
        LogLevel::Warn => tracing::warn!(plugin = target, "{message}"),
        LogLevel::Info => tracing::info!(plugin = target, "{message}"),
        LogLevel::Debug => tracing::debug!(plugin = target, "{message}"),
        LogLevel::Trace => tracing::trace!(plugin = target, "{message}"),
    }
}
