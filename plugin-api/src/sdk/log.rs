//! Logging from inside a library, forwarded to the host's `tracing` output.
//!
//! A library has its own copy of every crate, `tracing` included, so its events would never
//! reach the host's subscriber. The host hands over a callback at load time instead; these
//! functions and macros send through it. Before the host has connected, lines are dropped.

use std::sync::OnceLock;

use crate::abi::{HostCallbacks, LogLevel};

static HOST: OnceLock<HostCallbacks> = OnceLock::new();

pub(crate) fn connect(host: HostCallbacks) {
    let _ = HOST.set(host);
}

/// Sends one line to the host's log under `target`.
pub fn emit(level: LogLevel, target: &str, message: &str) {
    if let Some(host) = HOST.get() {
        (host.log)(level, target.into(), message.into());
    }
}

/// `plugin_log!(Level, "fmt", args…)`: formats and sends one line, targeted at the calling
/// module.
#[macro_export]
macro_rules! plugin_log {
    ($level:ident, $($arg:tt)+) => {
        $crate::sdk::log::emit($crate::LogLevel::$level, module_path!(), &format!($($arg)+))
    };
}
