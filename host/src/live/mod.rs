//! What the real-time drivers, `serve` and `ext-proc`, share: the real clock, reading
//! inference bodies, the owner of the scheduler on the real clock and the lifecycle of a
//! dispatched request (charged at dispatch, released exactly once); reading a response's usage
//! and checking prefix predictions against it; the metrics, request ids
//! and the errors a driver answers itself; the operator routes; starting, reloading the config
//! in place and stopping (hand-over restarts included), the listeners with their accept loop
//! and connection guard. The drivers sit side by side on this layer: neither imports from the
//! other.

pub(crate) mod admin;
pub mod body;
pub mod clock;
pub(crate) mod connection;
pub mod dispatch;
mod fd_passing;
pub(crate) mod handover;
pub(crate) mod ids;
pub mod journal;
pub mod kv_feed;
pub(crate) mod lifecycle;
pub(crate) mod listen;
pub(crate) mod metrics;
pub mod predictions;
pub mod reload;
pub(crate) mod response;
pub mod usage;

pub use clock::RealClock;
pub use dispatch::{InFlight, Limits, LiveScheduler, Placed, Placement, Subset};

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The `.rs` files under `dir` whose text contains `needle`.
    fn files_naming(dir: &Path, needle: &str, found: &mut Vec<String>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                files_naming(&path, needle, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("source file");
                if text.contains(needle) {
                    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
                    let shown = path.strip_prefix(root).unwrap_or(&path);
                    found.push(shown.display().to_string());
                }
            }
        }
    }

    #[test]
    fn the_drivers_import_nothing_from_each_other() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for (driver, other) in [("extproc", "crate::serve"), ("serve", "crate::extproc")] {
            let mut found = Vec::new();
            files_naming(&src.join(driver), other, &mut found);
            assert!(
                found.is_empty(),
                "{found:?} use {other}; what both drivers need belongs in live/"
            );
        }
    }
}
