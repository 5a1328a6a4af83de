//! Plugin types compiled into the host. They implement the same SDK traits as library
//! plugins and cross the same boundary objects, so the pipeline treats both alike.

pub mod inflight_load_producer;
pub mod kv_cache_utilization_scorer;
pub mod load_aware_scorer;
pub mod max_score_picker;
pub mod picking;
pub mod queue_scorer;
pub mod random_picker;
#[cfg(test)]
mod testing;
pub mod weighted_random_picker;

use switchyard_plugin_api::sdk::PluginFactory;

/// A built-in plugin type, registered with `inventory::submit!`.
pub struct Builtin(pub &'static PluginFactory);

inventory::collect!(Builtin);

/// For plugin types without parameters: accepts none (`null` or `{}`) and refuses any
/// given, naming it.
pub(crate) fn refuse_parameters(
    parameters: &str,
) -> Result<(), switchyard_plugin_api::PluginError> {
    #[derive(Debug, Default, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct NoParameters {}
    switchyard_plugin_api::sdk::parse_parameters::<NoParameters>(parameters).map(|_| ())
}

/// Every built-in plugin type, in a stable order (by type name).
pub fn all() -> Vec<&'static PluginFactory> {
    let mut types: Vec<&'static PluginFactory> = inventory::iter::<Builtin>
        .into_iter()
        .map(|b| b.0)
        .collect();
    types.sort_by_key(|f| f.type_name);
    types
}
