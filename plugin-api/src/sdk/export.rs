//! Building the root module of a library from its list of [`PluginFactory`]s.

use std::panic::{catch_unwind, AssertUnwindSafe};

use abi_stable::std_types::{RResult, RVec};

use super::shims::{guarded, panic_message};
use super::{log, PluginFactory};
use crate::abi::{HostCallbacks, LogLevel, ParamDoc, PluginError, PluginInstance, PluginTypeInfo};

/// Lists the types of a library for the host.
pub fn describe_types(factories: &[&PluginFactory]) -> RVec<PluginTypeInfo> {
    factories
        .iter()
        .map(|f| PluginTypeInfo {
            type_name: f.type_name.into(),
            kind: f.kind,
            stability: f.stability,
            description: f.description.into(),
            parameters: f
                .parameters
                .iter()
                .map(|p| ParamDoc {
                    name: p.name.into(),
                    value_type: p.value_type.into(),
                    default: p.default.into(),
                    range: p.range.into(),
                    description: p.description.into(),
                })
                .collect(),
        })
        .collect()
}

/// Creates an instance of the named type, containing any panic of its constructor.
pub fn create_instance(
    factories: &[&PluginFactory],
    type_name: &str,
    instance_name: &str,
    parameters: &str,
) -> RResult<PluginInstance, PluginError> {
    guarded(|| {
        let factory = factories
            .iter()
            .find(|f| f.type_name == type_name)
            .ok_or_else(|| {
                PluginError::unsupported(format!("this library has no plugin type `{type_name}`"))
            })?;
        let label = if instance_name == type_name {
            instance_name.to_string()
        } else {
            format!("{instance_name} ({type_name})")
        };
        (factory.create)(instance_name, parameters).map(|instance| instance.into_ffi_named(&label))
    })
}

/// Connects the library's logging to the host, and routes the library's panic messages there
/// too (they would otherwise go to stderr through the library's own copy of std).
pub fn install_host(host: HostCallbacks) {
    log::connect(host);
    let _ = catch_unwind(AssertUnwindSafe(|| {
        std::panic::set_hook(Box::new(|info| {
            let location = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let message = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string payload".into());
            log::emit(
                LogLevel::Debug,
                "plugin-panic",
                &format!("panic{location}: {message}"),
            );
        }));
    }))
    .map_err(panic_message);
}

/// Exports a library's root module listing the given `static` [`PluginFactory`]s.
///
/// ```text
/// switchyard_plugin_api::export_plugins!(MY_SCORER, MY_FILTER);
/// ```
#[macro_export]
macro_rules! export_plugins {
    ($($factory:ident),+ $(,)?) => {
        #[doc(hidden)]
        pub mod __switchyard_export {
            use $crate::__abi_stable::std_types::{RResult, RStr, RVec};

            static FACTORIES: &[&$crate::sdk::PluginFactory] = &[$(&super::$factory),+];

            extern "C" fn plugin_types() -> RVec<$crate::PluginTypeInfo> {
                $crate::sdk::describe_types(FACTORIES)
            }

            extern "C" fn set_host(host: $crate::HostCallbacks) {
                $crate::sdk::install_host(host)
            }

            extern "C" fn create(
                type_name: RStr<'_>,
                instance_name: RStr<'_>,
                parameters: RStr<'_>,
            ) -> RResult<$crate::PluginInstance, $crate::PluginError> {
                $crate::sdk::create_instance(
                    FACTORIES,
                    type_name.as_str(),
                    instance_name.as_str(),
                    parameters.as_str(),
                )
            }

            fn root_module() -> $crate::PluginLibraryRef {
                use $crate::__abi_stable::prefix_type::PrefixTypeTrait;
                $crate::PluginLibrary {
                    api_version: $crate::ApiVersion::CURRENT,
                    unwinding: cfg!(panic = "unwind"),
                    plugin_types,
                    set_host,
                    create,
                }
                .leak_into_prefix()
            }

            #[no_mangle]
            pub static _1as_0lib_1header_0root_bmodule_bloader:
                $crate::__abi_stable::library::LibHeader = {
                extern "C" fn erased_root_module() -> $crate::__abi_stable::library::RootModuleResult {
                    $crate::__abi_stable::library::__call_root_module_loader(root_module)
                }
                // SAFETY: this is the header abi_stable's loader looks for, built the way its
                // `export_root_module` attribute builds it, for our root module type.
                unsafe {
                    $crate::__abi_stable::library::LibHeader::from_constructor::<
                        $crate::PluginLibraryRef,
                    >(
                        erased_root_module,
                        $crate::__abi_stable::library::CheckTypeLayout::Yes,
                    )
                }
            };
        }
    };
}
