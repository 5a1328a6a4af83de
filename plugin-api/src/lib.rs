//! The stable plugin interface of switchyard, and the SDK plugin authors build on.
//!
//! A plugin library is a `cdylib` that exports one root module ([`PluginLibrary`]) listing the
//! plugin types it carries. The host loads it at start-up, checks that it was built against a
//! compatible version of this crate with identical boundary layouts, and creates plugin
//! instances from the operator's TOML parameters.
//!
//! Authors never touch the boundary types directly: they implement one of the safe traits in
//! [`sdk`] ([`Producer`], [`Filter`], [`Scorer`], [`Picker`]) and list their types with
//! [`export_plugins!`]. The SDK catches every panic inside the library and turns it into an
//! error, and forwards log lines to the host.
//!
//! # Compatibility
//! The boundary types in [`abi`] are frozen for the whole 1.x line: a host built against 1.N
//! loads libraries built against any 1.M with M ≤ N. Capabilities added in later minors travel
//! through [`PluginInstance::extension`], looked up by name, so an older library simply answers
//! that it does not know them. See `docs/plugin-abi.md` for the rules.
#![allow(non_local_definitions)]

pub mod abi;
pub mod keys;
#[cfg(not(feature = "api-1-2"))]
pub mod kv;
pub mod loading;
pub mod sdk;
#[cfg(feature = "testing")]
pub mod testing;

pub use abi::*;
pub use sdk::{
    log, Filter, FilterOutput, Picker, PluginFactory, ProduceBatch, Producer, ScoreOutput, Scorer,
};

/// Re-exported so that [`export_plugins!`] expands without the library naming abi_stable.
#[doc(hidden)]
pub use abi_stable as __abi_stable;

/// The FFI-safe containers that appear in the boundary types.
pub mod ffi {
    pub use abi_stable::std_types::{RResult, RSlice, RSliceMut, RStr, RString, RVec};
}
