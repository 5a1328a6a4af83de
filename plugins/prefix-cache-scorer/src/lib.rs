//! prefix-cache-scorer: rates each candidate endpoint by how much of the request's prompt it
//! already holds in its prefix cache, as reported by a prefix-cache producer.
//!
//! This module owns the plugin's face to the host: its type description, the factory that
//! turns JSON parameters into an instance, and the [`Scorer`] implementation that reads the
//! match info of every candidate and writes its score.

pub mod config;
pub mod scorer;

use std::fmt::Write as _;

use switchyard_plugin_api::keys;
use switchyard_plugin_api::sdk::{parse_parameters, Declare, Instance, Param, PluginFactory};
use switchyard_plugin_api::{
    AttrValue, AttrView, EndpointView, PluginError, PluginKind, RequestView, ScoreOutput, Scorer,
    Stability,
};

use crate::config::ScorerConfig;
use crate::scorer::{score_into, MatchInfo};

pub const TYPE_NAME: &str = "prefix-cache-scorer";

/// Position of the match-info key in the declared consumed keys.
const PREFIX_MATCH: usize = 0;

pub static FACTORY: PluginFactory = PluginFactory {
    type_name: TYPE_NAME,
    kind: PluginKind::Scorer,
    stability: Stability::Beta,
    description: "Scores endpoints by the share of the request's prompt already in their \
                  prefix cache, optionally rewarding long absolute matches.",
    parameters: &[
        Param {
            name: "prefixMatchInfoProducerName",
            value_type: "string",
            default: "\"\"",
            range: "any producer instance name",
            description: "Producer whose match info is read; empty means \
                          approx-prefix-cache-producer.",
        },
        Param {
            name: "matchLengthWeight",
            value_type: "number",
            default: "0.0",
            range: "[0, 1]",
            description: "Share of the score given to the absolute matched length; the rest \
                          goes to the matched fraction of the prompt.",
        },
        Param {
            name: "matchLengthScaleTokens",
            value_type: "integer",
            default: "8192",
            range: "> 0 when matchLengthWeight > 0 (not checked otherwise)",
            description: "Matched tokens at which the length term reaches 1.",
        },
    ],
    create,
};

/// Decodes and validates the parameters of one instance.
fn parse_config(parameters: &str) -> Result<ScorerConfig, PluginError> {
    let config: ScorerConfig = parse_parameters(parameters)?;
    config
        .validate()
        .map_err(|e| PluginError::invalid_parameter(e.field, e.message))?;
    Ok(config)
}

fn create(_instance_name: &str, parameters: &str) -> Result<Instance, PluginError> {
    Ok(Instance::scorer(PrefixCacheScorer {
        config: parse_config(parameters)?,
    }))
}

struct PrefixCacheScorer {
    config: ScorerConfig,
}

impl Scorer for PrefixCacheScorer {
    fn declare(&self) -> Declare {
        Declare::default().requires(
            keys::PREFIX_CACHE_MATCH_INFO,
            self.config.prefix_match_info_producer(),
        )
    }

    fn score(
        &self,
        request: &RequestView<'_>,
        endpoints: &[EndpointView<'_>],
        attrs: &AttrView<'_>,
        out: ScoreOutput<'_>,
    ) -> Result<(), PluginError> {
        // The key's row, resolved once; per endpoint this reads what `attrs.get` reads.
        let values = attrs.values.as_slice();
        let base = attrs
            .rows
            .as_slice()
            .get(PREFIX_MATCH)
            .filter(|&&row| row != u32::MAX)
            .map(|&row| row as usize * attrs.stride as usize);
        let infos = endpoints.iter().map(|endpoint| {
            base.and_then(|base| values.get(base + endpoint.slot as usize))
                .and_then(AttrValue::prefix_cache_match)
                .map(MatchInfo::from)
        });
        let summary = score_into(&self.config, infos, out.scores);
        if request.explain && (summary.missing > 0 || summary.empty_prompt > 0) {
            let _ = write!(
                out.note,
                "scored 0: {} of {} endpoints without match info, {} with an empty prompt",
                summary.missing,
                endpoints.len(),
                summary.empty_prompt
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

switchyard_plugin_api::export_plugins!(FACTORY);
