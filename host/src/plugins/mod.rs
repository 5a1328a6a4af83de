//! Plugin types: the built-in ones, the libraries named by the config, and the registry that
//! holds both.

pub mod builtin;
pub mod crash_note;
pub mod inspect;
pub mod loaded;
pub mod registry;
pub mod supply;

pub use registry::{LibraryChecks, LibraryFile, PluginType, Registry, RegistryError, Source};
