//! `load-aware-scorer`: favours endpoints with short waiting queues, reaching zero at a
//! configured queue length.
//!
//! An idle queue scores 0.5 and a queue of `q` requests scores `0.5 · (1 − min(q, threshold) /
//! threshold)`; the reference's curve, kept so weights carry over.

use serde::Deserialize;
use switchyard_plugin_api::sdk::{parse_parameters, Instance, Param, PluginFactory};
use switchyard_plugin_api::{
    AttrView, EndpointView, PluginError, PluginKind, RequestView, ScoreOutput, Scorer, Stability,
};

use super::Builtin;

pub static FACTORY: PluginFactory = PluginFactory {
    type_name: "load-aware-scorer",
    kind: PluginKind::Scorer,
    stability: Stability::Beta,
    description: "Scores endpoints by how far their waiting queue is below a threshold.",
    parameters: &[Param {
        name: "threshold",
        value_type: "integer",
        default: "128",
        range: ">= 1",
        description: "Waiting requests at which an endpoint's score reaches 0.",
    }],
    create,
};

inventory::submit! { Builtin(&FACTORY) }

/// `load-aware-scorer` parameters.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LoadAwareConfig {
    pub threshold: i64,
}

impl Default for LoadAwareConfig {
    fn default() -> Self {
        LoadAwareConfig { threshold: 128 }
    }
}

impl LoadAwareConfig {
    /// The reference replaces `threshold <= 0` by the default; here it is refused.
    pub fn validate(&self) -> Result<(), PluginError> {
        if self.threshold < 1 {
            return Err(PluginError::invalid_parameter(
                "threshold",
                format!("threshold must be >= 1 (got {})", self.threshold),
            ));
        }
        Ok(())
    }
}

fn create(_instance_name: &str, parameters: &str) -> Result<Instance, PluginError> {
    let config: LoadAwareConfig = parse_parameters(parameters)?;
    config.validate()?;
    Ok(Instance::scorer(LoadAwareScorer {
        threshold: config.threshold as f64,
    }))
}

pub struct LoadAwareScorer {
    threshold: f64,
}

impl Scorer for LoadAwareScorer {
    fn score(
        &self,
        _request: &RequestView<'_>,
        endpoints: &[EndpointView<'_>],
        _attrs: &AttrView<'_>,
        out: ScoreOutput<'_>,
    ) -> Result<(), PluginError> {
        for (score, endpoint) in out.scores.iter_mut().zip(endpoints) {
            let waiting = f64::from(endpoint.metrics.waiting_requests);
            *score = 0.5 * (1.0 - waiting.min(self.threshold) / self.threshold);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::FACTORY;
    use crate::plugins::builtin::testing::{
        assert_registered, create, create_error, score, with_waiting,
    };

    #[test]
    fn default_threshold_is_128() {
        let instance = create(&FACTORY, "null");
        let scores = score(&instance, &with_waiting(&[0, 1, 32, 64, 128, 500]));
        assert_eq!(scores, [0.5, 0.49609375, 0.375, 0.25, 0.0, 0.0]);
    }

    #[test]
    fn configured_threshold() {
        let instance = create(&FACTORY, r#"{"threshold": 10}"#);
        let scores = score(&instance, &with_waiting(&[0, 5, 10, 11]));
        assert_eq!(scores, [0.5, 0.25, 0.0, 0.0]);
    }

    #[test]
    fn refuses_a_threshold_below_one() {
        for value in [0, -4] {
            let error = create_error(&FACTORY, &format!(r#"{{"threshold": {value}}}"#));
            assert_eq!(error.field.as_str(), "threshold");
            assert_eq!(
                error.message.as_str(),
                format!("threshold must be >= 1 (got {value})")
            );
        }
    }

    #[test]
    fn refuses_unknown_parameters() {
        let error = create_error(&FACTORY, r#"{"treshold": 10}"#);
        assert_eq!(error.field.as_str(), "treshold");
    }

    #[test]
    fn is_registered() {
        assert_registered(&FACTORY);
    }
}
