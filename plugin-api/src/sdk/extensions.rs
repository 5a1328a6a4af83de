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
