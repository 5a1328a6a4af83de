//! preferred-endpoint-scorer: an example plugin built outside the switchyard workspace.
//!
//! It rates the candidate endpoint named by its `endpoint` parameter with `score` and every
//! other candidate with 0, so with a high enough weight the picker sends requests there while
//! it is a candidate. The default of `endpoint` is fixed when the library is built (see
//! `build.rs`).

use serde::Deserialize;
use switchyard_plugin_api::sdk::{parse_parameters, Instance, Param, PluginFactory};
use switchyard_plugin_api::{
    AttrView, EndpointView, PluginError, PluginKind, RequestView, ScoreOutput, Scorer, Stability,
};

/// The default preferred endpoint, chosen at build time (empty: none).
const DEFAULT_ENDPOINT: &str = env!("PREFERRED_ENDPOINT_DEFAULT");

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
struct Config {
    endpoint: String,
    score: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            endpoint: DEFAULT_ENDPOINT.to_string(),
            score: 1.0,
        }
    }
}

struct PreferredEndpointScorer {
    endpoint: String,
    score: f64,
}

impl PreferredEndpointScorer {
    /// An endpoint matches by its full id (`namespace/name`) or by its name alone.
    fn matches(&self, endpoint: &EndpointView<'_>) -> bool {
        let id = endpoint.id.as_str();
        !self.endpoint.is_empty()
            && (id == self.endpoint || id.rsplit('/').next() == Some(self.endpoint.as_str()))
    }
}

impl Scorer for PreferredEndpointScorer {
    fn score(
        &self,
        request: &RequestView<'_>,
        endpoints: &[EndpointView<'_>],
        _attrs: &AttrView<'_>,
        out: ScoreOutput<'_>,
    ) -> Result<(), PluginError> {
        let mut matched = 0;
        for (score, endpoint) in out.scores.iter_mut().zip(endpoints) {
            if self.matches(endpoint) {
                *score = self.score;
                matched += 1;
            }
        }
        if request.explain {
            let note = if matched == 0 {
                format!("'{}' is not among the candidates", self.endpoint)
            } else {
                format!("favoured '{}'", self.endpoint)
            };
            *out.note = note.as_str().into();
        }
        Ok(())
    }
}

fn create(instance_name: &str, parameters: &str) -> Result<Instance, PluginError> {
    let config: Config = parse_parameters(parameters)?;
    if !(0.0..=1.0).contains(&config.score) {
        return Err(PluginError::invalid_parameter(
            "score",
            format!("score must be in [0, 1] (got {})", config.score),
        ));
    }
    switchyard_plugin_api::plugin_log!(
        Info,
        "{instance_name}: favouring '{}' with {}",
        config.endpoint,
        config.score
    );
    Ok(Instance::scorer(PreferredEndpointScorer {
        endpoint: config.endpoint,
        score: config.score,
    }))
}

pub static PREFERRED_ENDPOINT_SCORER: PluginFactory = PluginFactory {
    type_name: "preferred-endpoint-scorer",
    kind: PluginKind::Scorer,
    stability: Stability::Beta,
    description: "Example plugin: scores one named endpoint, 0 elsewhere.",
    parameters: &[
        Param {
            name: "endpoint",
            value_type: "string",
            default: concat!("\"", env!("PREFERRED_ENDPOINT_DEFAULT"), "\""),
            range: "an endpoint name or namespace/name; empty favours none",
            description: "The endpoint to favour; its default is fixed at build time.",
        },
        Param {
            name: "score",
            value_type: "number",
            default: "1.0",
            range: "[0, 1]",
            description: "The score given to the favoured endpoint.",
        },
    ],
    create,
};

switchyard_plugin_api::export_plugins!(PREFERRED_ENDPOINT_SCORER);
