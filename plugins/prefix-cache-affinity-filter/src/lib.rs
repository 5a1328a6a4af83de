//! prefix-cache-affinity-filter: keeps a request on the endpoints that already hold most of
//! its prompt, unless a load gate finds them too busy compared with the alternatives.
//!
//! This module owns the plugin's face to the host: its type description, the factory that
//! turns JSON parameters into an instance, and the [`Filter`] implementation that reads each
//! candidate's attributes and applies the decision of [`filter`].

pub mod config;
pub mod filter;

use std::fmt::Write as _;

use rand::rngs::SmallRng;
use rand::SeedableRng;
use switchyard_plugin_api::keys;
use switchyard_plugin_api::sdk::{parse_parameters, Declare, Instance, Param, PluginFactory};
use switchyard_plugin_api::{
    AttrValue, AttrView, EndpointView, Filter, FilterOutput, PluginError, PluginKind, RequestView,
    Stability,
};

use crate::config::{AffinityConfig, GateInput};
use crate::filter::{
    exploration_draw, filter_with_prefix, EndpointFacts, FilterOutcome, MatchInfo,
};

pub const TYPE_NAME: &str = "prefix-cache-affinity-filter";

/// Position of the match-info key in the declared consumed keys.
const PREFIX_MATCH: usize = 0;
/// Position of the gate's load key (in-flight load or latency prediction, whichever the
/// configuration reads; never both), declared only when a gate runs.
const GATE_LOAD: usize = 1;

pub static FACTORY: PluginFactory = PluginFactory {
    type_name: TYPE_NAME,
    kind: PluginKind::Filter,
    stability: Stability::Beta,
    description: "Narrows the candidates to the endpoints holding most of the request's prompt \
                  in their prefix cache, unless they are too loaded compared with the others.",
    parameters: &[
        Param {
            name: "affinityThreshold",
            value_type: "number",
            default: "0.80",
            range: "<= 1.0; <= 0 disables the filter",
            description: "Matched fraction of the prompt at which an endpoint is sticky.",
        },
        Param {
            name: "explorationProbability",
            value_type: "number",
            default: "0",
            range: "[0, 1]",
            description: "Probability of keeping every candidate for a request.",
        },
        Param {
            name: "maxTTFTPenaltyMs",
            value_type: "number",
            default: "18000",
            range: ">= 0",
            description: "static mode: TTFT gap (ms) beyond which the pin is released, 0 = no \
                          gate; matchedTokens mode: an absolute ceiling, 0 = none.",
        },
        Param {
            name: "ttftSource",
            value_type: "string",
            default: "\"prefillThroughput\"",
            range: "\"prefillThroughput\" | \"latencyPredictor\"",
            description: "Where the gate's TTFT comes from: in-flight tokens over \
                          peakPrefillThroughput, or the latency predictor.",
        },
        Param {
            name: "peakPrefillThroughput",
            value_type: "number",
            default: "15928",
            range: ">= 0; > 0 when ttftSource is prefillThroughput and maxTTFTPenaltyMs > 0",
            description: "Prefill tokens per second of one endpoint; the default was measured \
                          on one model and GPU setup, so retune it for yours.",
        },
        Param {
            name: "penaltyMode",
            value_type: "string",
            default: "\"static\"",
            range: "\"static\" | \"matchedTokens\" (matchedTokens requires ttftSource \
                    prefillThroughput)",
            description: "What the gate compares the sticky endpoints' extra load against: \
                          maxTTFTPenaltyMs, or the prompt tokens the request would prefill \
                          again elsewhere.",
        },
        Param {
            name: "prefixMatchInfoProducerName",
            value_type: "string",
            default: "\"\"",
            range: "any producer instance name",
            description: "Producer whose match info is read; empty means \
                          approx-prefix-cache-producer.",
        },
        Param {
            name: "inFlightLoadProducerName",
            value_type: "string",
            default: "\"\"",
            range: "any producer instance name",
            description: "Producer whose in-flight load is read; empty means \
                          inflight-load-producer.",
        },
        Param {
            name: "latencyPredictionInfoProducerName",
            value_type: "string",
            default: "\"\"",
            range: "any producer instance name",
            description: "Producer whose TTFT prediction is read; empty means \
                          predicted-latency-producer.",
        },
    ],
    create,
};

/// Decodes and validates the parameters of one instance.
fn parse_config(parameters: &str) -> Result<AffinityConfig, PluginError> {
    let config: AffinityConfig = parse_parameters(parameters)?;
    config
        .validate()
        .map_err(|e| PluginError::invalid_parameter(e.field, e.message))?;
    Ok(config)
}

fn create(_instance_name: &str, parameters: &str) -> Result<Instance, PluginError> {
    let config = parse_config(parameters)?;
    Ok(Instance::filter(AffinityFilter {
        gate_input: config.gate_input(),
        config,
    }))
}

struct AffinityFilter {
    config: AffinityConfig,
    gate_input: Option<GateInput>,
}

/// The values of one consumed key, its row resolved once per call rather than per endpoint.
/// Reads exactly what [`AttrView::get`] reads.
#[derive(Clone, Copy)]
struct Column<'a> {
    values: &'a [AttrValue],
    /// Start of the key's row in `values`; `None` when nothing produces the key.
    base: Option<usize>,
}

impl<'a> Column<'a> {
    fn resolve(attrs: &AttrView<'a>, consumed: usize) -> Self {
        let base = attrs
            .rows
            .as_slice()
            .get(consumed)
            .filter(|&&row| row != u32::MAX)
            .map(|&row| row as usize * attrs.stride as usize);
        Column {
            values: attrs.values.as_slice(),
            base,
        }
    }

    #[inline]
    fn get(&self, endpoint: &EndpointView<'_>) -> Option<&'a AttrValue> {
        let index = self.base? + endpoint.slot as usize;
        self.values.get(index).filter(|value| !value.is_absent())
    }
}

/// The match info of `endpoint` in the prefix column.
#[inline]
fn prefix_info(prefix: Column<'_>, endpoint: &EndpointView<'_>) -> Option<MatchInfo> {
    prefix
        .get(endpoint)
        .and_then(AttrValue::prefix_cache_match)
        .map(MatchInfo::from)
}

impl AffinityFilter {
    #[inline]
    fn facts(
        &self,
        prefix: Column<'_>,
        load: Column<'_>,
        endpoint: &EndpointView<'_>,
    ) -> EndpointFacts {
        let prefix = prefix_info(prefix, endpoint);
        let load = || load.get(endpoint);
        match self.gate_input {
            Some(GateInput::InFlightLoad) => EndpointFacts {
                prefix,
                ttft_ms: None,
                in_flight_tokens: load().and_then(AttrValue::in_flight_load).map(|l| l.tokens),
            },
            Some(GateInput::LatencyPrediction) => EndpointFacts {
                prefix,
                ttft_ms: load()
                    .and_then(AttrValue::latency_prediction)
                    .map(|p| p.ttft_ms),
                in_flight_tokens: None,
            },
            None => EndpointFacts {
                prefix,
                ..EndpointFacts::default()
            },
        }
    }
}

impl Filter for AffinityFilter {
    fn declare(&self) -> Declare {
        let declare = Declare::default().requires(
            keys::PREFIX_CACHE_MATCH_INFO,
            self.config.prefix_match_info_producer(),
        );
        match self.gate_input {
            Some(GateInput::InFlightLoad) => {
                declare.requires(keys::IN_FLIGHT_LOAD, self.config.in_flight_load_producer())
            }
            Some(GateInput::LatencyPrediction) => declare.requires(
                keys::LATENCY_PREDICTION,
                self.config.latency_prediction_producer(),
            ),
            None => declare,
        }
    }

    fn filter(
        &self,
        request: &RequestView<'_>,
        endpoints: &[EndpointView<'_>],
        attrs: &AttrView<'_>,
        out: FilterOutput<'_>,
    ) -> Result<(), PluginError> {
        let draw = if self.config.exploration_probability > 0.0 {
            exploration_draw(&mut SmallRng::seed_from_u64(request.random_seed))
        } else {
            1.0
        };
        let prefix = Column::resolve(attrs, PREFIX_MATCH);
        let load = Column::resolve(attrs, GATE_LOAD);
        let outcome = filter_with_prefix(
            &self.config,
            endpoints.len(),
            |i| prefix_info(prefix, &endpoints[i]),
            |i| self.facts(prefix, load, &endpoints[i]),
            draw,
            out.keep,
        );
        if request.explain {
            let _ = write!(out.note, "{outcome}");
            let gate = match outcome {
                FilterOutcome::Narrowed { gate, .. } => gate,
                FilterOutcome::Released(reading) => Some(reading),
                FilterOutcome::PassAll(_) => None,
            };
            if let Some(g) = gate {
                let _ = write!(
                    out.note,
                    " [compared sticky {} with non-sticky {}]",
                    endpoints[g.best_sticky].id, endpoints[g.best_non_sticky].id
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

switchyard_plugin_api::export_plugins!(FACTORY);
