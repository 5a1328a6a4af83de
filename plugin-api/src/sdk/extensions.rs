//! Names of the optional capabilities reachable through
//! [`PluginInstance::extension`](crate::PluginInstance::extension).
//!
//! Each entry says the minor version that introduced it. A library built against an older
//! minor answers [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) for it, which the
//! host treats as "not provided".

/// Since 1.1: a JSON snapshot of the instance's state (`null` when it keeps none). Input is
/// ignored.
#[cfg(not(feature = "api-1-0"))]
pub const STATE: &str = "state";

/// Since 1.2: when a batching producer seals its window early, the quiet gap in milliseconds
/// (`Declare::batch_quiet_ms`): the host seals an open window once no request has joined it
/// for that long, and still no later than the declared window after it opened. Answers a JSON
/// number, or `null` for the fixed window. Input is ignored.
#[cfg(not(feature = "api-1-1"))]
pub const BATCH_QUIET: &str = "batch_quiet";

/// Since 1.3: KV-cache events for one endpoint. With empty input, whether the instance wants
/// them (`true` or `false`; the host asks once, at wiring). Otherwise the input is a
/// [`KvEventBatch`](crate::kv::KvEventBatch) as JSON and the answer `null`.
#[cfg(not(feature = "api-1-2"))]
pub const KV_EVENTS: &str = "kv_events";

/// Since 1.3: the counterpart of [`STATE`]: the input is a JSON snapshot an earlier instance
/// of the same plugin answered for `state`, possibly from another version of the library or
/// with other parameters. Answers `null` once the instance has taken it over;
/// `Unsupported` when it cannot take state over, an error when this snapshot does not fit.
#[cfg(not(feature = "api-1-2"))]
pub const IMPORT_STATE: &str = "import_state";
