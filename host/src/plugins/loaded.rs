//! The plugin libraries this process has opened, by the SHA-256 of their bytes.
//!
//! A library is opened once per content: from a private copy named after its digest, so the
//! file it came from can be overwritten (even in place, by `cp`) without touching code that
//! runs. Another content at the same path is another library, opened beside the first, so an
//! old pipeline and a reloaded one can both be live. Libraries are never closed: an instance,
//! a decision record or a request in flight may still run code of one, and nothing tracks
//! when the last of them is gone, so a replaced library stays mapped (leaked) until the
//! process exits.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use switchyard_plugin_api::loading::{load_library_bytes, LoadError, LoadedLibrary};
use switchyard_plugin_api::HostCallbacks;

fn opened() -> &'static Mutex<HashMap<String, LoadedLibrary>> {
    static OPENED: OnceLock<Mutex<HashMap<String, LoadedLibrary>>> = OnceLock::new();
    OPENED.get_or_init(Default::default)
}

/// The library whose bytes are `bytes` (read from `path`, with SHA-256 `digest`): the one
/// opened before for the same digest, or a newly opened and connected one.
pub fn open(
    path: &Path,
    bytes: &[u8],
    digest: &str,
    host: HostCallbacks,
) -> Result<LoadedLibrary, LoadError> {
    let mut opened = opened().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(library) = opened.get(digest) {
        return Ok(*library);
    }
    let library = load_library_bytes(path, bytes, &format!("{digest}.so"))?;
    library.connect_host(host);
    opened.insert(digest.to_string(), library);
    Ok(library)
}
