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
    load_library_checked(path, |_| Ok(()))
}

/// As [`load_library`], with `check` run over the library's bytes before they are opened (a
/// digest pin, for example); its error refuses the library.
pub fn load_library_checked(
    path: &Path,
    check: impl FnOnce(&[u8]) -> Result<(), String>,
) -> Result<LoadedLibrary, LoadError> {
    let bytes = read_library(path)?;
    check(&bytes).map_err(|reason| LoadError {
        path: tidy_path(path),
        problem: LoadProblem::Other(reason),
        detail: String::new(),
    })?;
    let name = path
        .file_name()
        .unwrap_or("library".as_ref())
        .to_string_lossy();
    load_library_bytes(path, &bytes, &name)
}

/// The bytes of the library file at `path`, refused as [`load_library`] refuses a file it
/// cannot read.
pub fn read_library(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|error| LoadError {
        path: tidy_path(path),
        problem: LoadProblem::Open(io_reason(&error)),
        detail: error.to_string(),
    })
}

/// Opens and verifies `bytes`, the content of the library file at `path` (named in errors).
///
/// The library is opened from a private copy of the bytes, called `copy_name` in a directory
/// only this process uses and removed again once opened, so overwriting the file at `path`
/// while switchyard runs cannot change code it is executing, and what was checked is what
/// runs. Each call opens a new copy: two versions of one file can be loaded side by side.
pub fn load_library_bytes(
    path: &Path,
    bytes: &[u8],
    copy_name: &str,
) -> Result<LoadedLibrary, LoadError> {
    let path = tidy_path(path);
    let refuse = |problem: LoadProblem, detail: String| LoadError {
        path: path.clone(),
        problem,
        detail,
    };
    let copy = PrivateCopy::write(copy_name, bytes).map_err(|error| {
        refuse(
            LoadProblem::Other(format!(
                "cannot make a private copy to load from in {}: {} (set TMPDIR to a writable \
                 directory that allows executable files)",
                std::env::temp_dir().display(),
                io_reason(&error)
            )),
            error.to_string(),
        )
    })?;
    let header = lib_header_from_path(copy.path()).map_err(|error| {
        let detail = error
            .to_string()
            .replace(&*copy.path().to_string_lossy(), &path.to_string_lossy());
        let problem = match &error {
            LibraryError::OpenError { err, .. } => {
                LoadProblem::Open(dlopen_reason(&err.to_string(), copy.path()))
            }
            LibraryError::GetSymbolError { .. } => LoadProblem::NotAPlugin,
            LibraryError::InvalidAbiHeader(_) => LoadProblem::Other(
                "it was built with an incompatible abi_stable version".to_string(),
            ),
            _ => LoadProblem::Other(first_line(&detail)),
        };
        refuse(problem, detail)
    })?;
    drop(copy);

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

/// `path` without `.` components (`./././lib.so` is `lib.so`; `./lib.so` stays as given
/// when it is the whole path's only directory).
pub fn tidy_path(path: &Path) -> PathBuf {
    use std::path::Component;
    let tidy: PathBuf = path
        .components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect();
    if tidy.as_os_str().is_empty() {
        PathBuf::from(".")
    } else if path.starts_with(".") && tidy.is_relative() && tidy.components().count() == 1 {
        Path::new(".").join(tidy)
    } else {
        tidy
    }
}

/// An I/O error's reason without the `(os error N)` suffix.
fn io_reason(error: &std::io::Error) -> String {
    let text = error.to_string();
    match text.rfind(" (os error ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// The dynamic loader's reason, without the (private copy's) path it starts with.
fn dlopen_reason(message: &str, opened: &Path) -> String {
    let opened = opened.to_string_lossy();
    let reason = message
        .strip_prefix(&*opened)
        .map(|rest| rest.trim_start_matches(':').trim())
        .unwrap_or(message.trim());
    if reason.is_empty() {
        "the dynamic loader gave no reason".to_string()
    } else {
        reason.to_string()
    }
}

/// A copy of a library in a directory only this process uses, removed on drop. The loader
/// keeps its mapping of the file after the name is gone.
struct PrivateCopy {
    dir: PathBuf,
    file: PathBuf,
}

impl PrivateCopy {
    fn write(name: &str, bytes: &[u8]) -> std::io::Result<PrivateCopy> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "switchyard-plugin-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(&dir)?;
        let copy = PrivateCopy {
            file: dir.join(Path::new(name).file_name().unwrap_or("library".as_ref())),
            dir,
        };
        std::fs::write(&copy.file, bytes)?;
        Ok(copy)
    }

    fn path(&self) -> &Path {
        &self.file
    }
}

impl Drop for PrivateCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn first_line(text: &str) -> String {
    text.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}

/// The loader's report lists every difference as an `Error:` line among hundreds of lines of
/// layout dump. Each error follows the layouts of the types it was comparing, outermost
/// first; the innermost pair whose fields differ names the boundary type and field at fault.
fn layout_summary(report: &str) -> Vec<String> {
    let all: Vec<&str> = report
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let mut lines: Vec<String> = Vec::new();
    // Each place at fault with the loader's errors about it, in the report's order.
    let mut places: Vec<(String, Vec<String>)> = Vec::new();
    let mut expected: Option<Layout> = None;
    let mut pairs: Vec<(Layout, Layout)> = Vec::new();
    let mut i = 0;
    while i < all.len() {
        let line = all[i];
        if line == "Layout of expected type:" || line == "Layout of found type:" {
            let (layout, next) = Layout::parse(&all, i + 1);
            if line.contains("expected") {
                expected = Some(layout);
            } else if let Some(e) = expected.take() {
                pairs.push((e, layout));
            }
            i = next;
            continue;
        }
        i += 1;
        let Some(rest) = line.strip_prefix("Error:") else {
            continue;
        };
        // The values follow the `Error:` line as `Expected:`/`Found:` blocks.
        let mut entry = rest.trim().to_string();
        for next in all[i..].iter().take(4) {
            if next.starts_with("Error:") {
                break;
            }
            entry.push(' ');
            entry.push_str(next);
        }
        let place = pairs
            .iter()
            .rev()
            .find_map(|(e, f)| e.difference(f))
            .or_else(|| pairs.last().map(|(e, _)| format!("in `{}`", e.type_name)));
        entry = entry
            .replace("Expected: ", "expected ")
            .replace(" Found: ", ", found ");
        let place = place.unwrap_or_default();
        match places.iter_mut().find(|(p, _)| *p == place) {
            Some((_, errors)) => {
                if !errors.contains(&entry) {
                    errors.push(entry)
                }
            }
            None => places.push((place, vec![entry])),
        }
    }
    for (place, errors) in places {
        let line = if place.is_empty() {
            errors.join("; ")
        } else {
            format!("{place} ({})", errors.join("; "))
        };
        lines.push(line.chars().take(240).collect());
    }
    if lines.is_empty() {
        lines.push(first_line(report));
    }
    lines
}

/// The parts of one type's layout in the loader's report that name a difference.
#[derive(Debug, Default)]
struct Layout {
    type_name: String,
    /// `(name, type, size)` per field, in order.
    fields: Vec<(String, String, String)>,
}

impl Layout {
    /// Reads a layout block starting at `all[start]`; returns it and where the block ends.
    fn parse(all: &[&str], start: usize) -> (Layout, usize) {
        let mut layout = Layout::default();
        let mut i = start;
        while let Some(&line) = all.get(i) {
            if line.starts_with("Layout of ") || line.starts_with("Error:") {
                break;
            }
            if let Some(name) = line.strip_prefix("field_name:") {
                let ty = all
                    .get(i + 1)
                    .and_then(|l| l.strip_prefix("type:"))
                    .unwrap_or("");
                let size = all
                    .get(i + 2)
                    .filter(|l| l.starts_with("size:"))
                    .copied()
                    .unwrap_or("");
                layout
                    .fields
                    .push((name.to_string(), ty.to_string(), size.to_string()));
            } else if let Some(ty) = line.strip_prefix("type:") {
                if layout.type_name.is_empty() {
                    // `EndpointView<'a>` reads better as `EndpointView`.
                    layout.type_name = ty.split('<').next().unwrap_or(ty).to_string();
                }
            }
            i += 1;
        }
        (layout, i)
    }

    /// Where `found` differs from `self` field by field, as `in `Type`, field ...`.
    fn difference(&self, found: &Layout) -> Option<String> {
        let ty = &self.type_name;
        if *ty != found.type_name {
            return None;
        }
        let count = self.fields.len().max(found.fields.len());
        (0..count).find_map(|k| match (self.fields.get(k), found.fields.get(k)) {
            (Some(e), Some(f)) if e.0 != f.0 => Some(format!(
                "in `{ty}`, field `{}` is `{}` in the library",
                e.0, f.0
            )),
            (Some(e), Some(f)) if e.1 != f.1 => Some(format!(
                "in `{ty}`, field `{}` is `{}` here and `{}` in the library",
                e.0, e.1, f.1
            )),
            (Some(e), Some(f)) if e.2 != f.2 => Some(format!(
                "in `{ty}`, field `{}` ({}) has another size in the library",
                e.0, e.1
            )),
            (Some(e), None) => Some(format!(
                "in `{ty}`, field `{}` is missing from the library",
                e.0
            )),
            (None, Some(f)) => Some(format!(
                "in `{ty}`, the library has an extra field `{}`",
                f.0
            )),
            _ => None,
        })
    }
}
