//! `kv-cache-utilization-scorer`: favours endpoints with free KV-cache space, scoring
//! `1 − utilisation`.

use switchyard_plugin_api::sdk::{Instance, PluginFactory};
use switchyard_plugin_api::{
    AttrView, EndpointView, PluginError, PluginKind, RequestView, ScoreOutput, Scorer, Stability,
};

use super::Builtin;

pub static FACTORY: PluginFactory = PluginFactory {
    type_name: "kv-cache-utilization-scorer",
    kind: PluginKind::Scorer,
    stability: Stability::Stable,
    description: "Scores endpoints by the share of their KV cache that is free.",
    parameters: &[],
    create,
};

inventory::submit! { Builtin(&FACTORY) }

fn create(_instance_name: &str, parameters: &str) -> Result<Instance, PluginError> {
    super::refuse_parameters(parameters)?;
    Ok(Instance::scorer(KvCacheUtilizationScorer))
}

pub struct KvCacheUtilizationScorer;

impl Scorer for KvCacheUtilizationScorer {
    fn score(
        &self,
        _request: &RequestView<'_>,
        endpoints: &[EndpointView<'_>],
        _attrs: &AttrView<'_>,
        out: ScoreOutput<'_>,
    ) -> Result<(), PluginError> {
        for (score, endpoint) in out.scores.iter_mut().zip(endpoints) {
            let free = 1.0 - endpoint.metrics.kv_cache_usage;
            // A utilisation outside [0, 1] is a reporting glitch; NaN says nothing.
            *score = if free.is_nan() {
                0.0
            } else {
                free.clamp(0.0, 1.0)
            };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::FACTORY;
    use crate::plugins::builtin::testing::{
        assert_registered, create, create_error, score, with_kv_usage,
    };

    #[test]
    fn scores_the_free_share() {
        let instance = create(&FACTORY, "null");
        let scores = score(&instance, &with_kv_usage(&[0.0, 0.25, 0.2, 0.75, 1.0]));
        assert_eq!(scores, [1.0, 0.75, 0.8, 0.25, 0.0]);
    }

    #[test]
    fn out_of_range_usage_is_clamped() {
        let instance = create(&FACTORY, "null");
        let scores = score(&instance, &with_kv_usage(&[1.5, -0.5, f64::NAN]));
        assert_eq!(scores, [0.0, 1.0, 0.0]);
    }

    #[test]
    fn refuses_parameters() {
        let error = create_error(&FACTORY, r#"{"weight": 2}"#);
        assert_eq!(error.field.as_str(), "weight");
    }

    #[test]
    fn is_registered() {
        assert_registered(&FACTORY);
    }
}
