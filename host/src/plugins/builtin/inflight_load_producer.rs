//! `inflight-load-producer`: the requests and tokens dispatched to each endpoint and not yet
//! completed, published as `InFlightLoad` (the data type's default producer).
//!
//! A dispatch charges the endpoint one request and the request's prompt tokens (plus an
//! estimate of its output when `addEstimatedOutputTokens` is set); the completion of that
//! request on that endpoint, whatever its outcome, releases exactly that charge, once. The
//! charge is held until completion, since the host reports no earlier event (the reference
//! drops the prompt tokens at the first response byte), and it is the whole prompt: no prefix
//! cache discount is applied, so `prefixMatchInfoProducerName` has no effect.
//! Counts are kept per host index of the endpoint, so a produce call reads them without
//! hashing any name.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::Deserialize;
use serde_json::json;
use switchyard_plugin_api::keys::{IN_FLIGHT_LOAD, TOKENIZED_PROMPT, TOKEN_PRODUCER};
use switchyard_plugin_api::sdk::{
    parse_parameters, Declare, Instance, Param, PluginFactory, ProduceBatch, Producer,
};
use switchyard_plugin_api::{
    AttrValue, EndpointView, InFlightLoad, Outcome, PluginError, PluginKind, ProduceItem,
    RequestView, Stability,
};

use super::Builtin;

pub static FACTORY: PluginFactory = PluginFactory {
    type_name: "inflight-load-producer",
    kind: PluginKind::Producer,
    stability: Stability::Beta,
    description: "Tracks the requests and tokens dispatched to each endpoint and not yet \
                  completed.",
    parameters: &[
        Param {
            name: "addEstimatedOutputTokens",
            value_type: "bool",
            default: "false",
            range: "true | false",
            description: "Also charge an estimate of the output tokens: the prompt tokens \
                          times outputRatio, rounded, capped by the request's max output \
                          tokens and by maxEstimatedOutputTokens.",
        },
        Param {
            name: "outputRatio",
            value_type: "number",
            default: "1.5",
            range: ">= 0",
            description: "Estimated output tokens per prompt token.",
        },
        Param {
            name: "maxEstimatedOutputTokens",
            value_type: "integer",
            default: "unset",
            range: ">= 0",
            description: "Upper bound of the estimated output tokens; unset means no bound.",
        },
        Param {
            name: "prefixMatchInfoProducerName",
            value_type: "string",
            default: "\"\"",
            range: "a producer instance name",
            description: "Accepted for compatibility; no effect, as the whole prompt is \
                          charged.",
        },
        Param {
            name: "syncCrossReplicaState",
            value_type: "bool",
            default: "false",
            range: "false",
            description: "Sharing counts across router replicas is not supported; true is \
                          refused.",
        },
    ],
    create,
};

inventory::submit! { Builtin(&FACTORY) }

/// `inflight-load-producer` parameters.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct InFlightLoadConfig {
    pub add_estimated_output_tokens: bool,
    pub output_ratio: f64,
    pub max_estimated_output_tokens: Option<i64>,
    pub prefix_match_info_producer_name: String,
    /// The reference defaults to `true`; this producer keeps its counts to itself.
    pub sync_cross_replica_state: bool,
}

impl Default for InFlightLoadConfig {
    fn default() -> Self {
        InFlightLoadConfig {
            add_estimated_output_tokens: false,
            output_ratio: 1.5,
            max_estimated_output_tokens: None,
            prefix_match_info_producer_name: String::new(),
            sync_cross_replica_state: false,
        }
    }
}

impl InFlightLoadConfig {
    pub fn validate(&self) -> Result<(), PluginError> {
        if !(self.output_ratio >= 0.0 && self.output_ratio.is_finite()) {
            return Err(PluginError::invalid_parameter(
                "outputRatio",
                format!(
                    "outputRatio must be a finite number >= 0 (got {})",
                    self.output_ratio
                ),
            ));
        }
        if let Some(cap) = self.max_estimated_output_tokens.filter(|cap| *cap < 0) {
            return Err(PluginError::invalid_parameter(
                "maxEstimatedOutputTokens",
                format!("maxEstimatedOutputTokens must be >= 0 (got {cap})"),
            ));
        }
        if self.sync_cross_replica_state {
            return Err(PluginError::invalid_parameter(
                "syncCrossReplicaState",
                "syncCrossReplicaState is not supported (got true): in-flight counts are \
                 kept per router replica; set it to false or remove it",
            ));
        }
        Ok(())
    }

    /// The tokens one dispatch of `request` charges.
    pub fn charge(&self, request: &RequestView<'_>) -> i64 {
        let input = i64::try_from(request.token_count()).unwrap_or(i64::MAX);
        if !self.add_estimated_output_tokens || input <= 0 {
            return input;
        }
        // `as` saturates; the ratio is finite and non-negative.
        let mut output = (input as f64 * self.output_ratio).round() as i64;
        if request.max_output_tokens >= 0 {
            output = output.min(request.max_output_tokens);
        }
        if let Some(cap) = self.max_estimated_output_tokens {
            output = output.min(cap);
        }
        input.saturating_add(output)
    }
}

fn create(instance_name: &str, parameters: &str) -> Result<Instance, PluginError> {
    let config: InFlightLoadConfig = parse_parameters(parameters)?;
    config.validate()?;
    Ok(Instance::producer(InFlightLoadProducer {
        name: instance_name.to_string(),
        config,
        ledger: Mutex::new(Ledger::default()),
    }))
}

pub struct InFlightLoadProducer {
    name: String,
    config: InFlightLoadConfig,
    ledger: Mutex<Ledger>,
}

/// What one dispatch added to one endpoint.
#[derive(Debug, Clone, Copy)]
struct Charge {
    host_index: u32,
    tokens: i64,
}

#[derive(Default)]
struct Ledger {
    /// Live counts by host index, grown on demand.
    loads: Vec<InFlightLoad>,
    /// Open charges by request id (usually one; more when a request goes to several
    /// endpoints).
    open: HashMap<String, Vec<Charge>>,
}

impl InFlightLoadProducer {
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // The ledger is consistent after every statement that can panic; keep using it.
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Producer for InFlightLoadProducer {
    fn declare(&self) -> Declare {
        Declare::default()
            .produces(IN_FLIGHT_LOAD, &self.name)
            .requires(TOKENIZED_PROMPT, TOKEN_PRODUCER)
    }

    fn produce(
        &self,
        items: &[ProduceItem<'_>],
        out: &mut ProduceBatch<'_>,
    ) -> Result<(), PluginError> {
        let ledger = self.ledger();
        for item in items {
            for (position, endpoint) in item.endpoints.iter().enumerate() {
                let load = ledger
                    .loads
                    .get(endpoint.host_index as usize)
                    .copied()
                    .unwrap_or_default();
                out.put(item, 0, position, AttrValue::InFlightLoad(load));
            }
        }
        Ok(())
    }

    /// A second dispatch of a request to an endpoint it is already charged to adds nothing.
    fn dispatched(&self, request: &RequestView<'_>, endpoint: &EndpointView<'_>) {
        let charge = Charge {
            host_index: endpoint.host_index,
            tokens: self.config.charge(request),
        };
        let mut guard = self.ledger();
        let Ledger { loads, open } = &mut *guard;
        match open.get_mut(request.id.as_str()) {
            Some(charges) if charges.iter().any(|c| c.host_index == charge.host_index) => return,
            Some(charges) => charges.push(charge),
            None => {
                open.insert(request.id.as_str().to_owned(), vec![charge]);
            }
        }
        add_load(loads, charge);
    }

    fn completed(&self, request: &RequestView<'_>, endpoint: &EndpointView<'_>, _: Outcome) {
        let mut guard = self.ledger();
        let Ledger { loads, open } = &mut *guard;
        let Some(charges) = open.get_mut(request.id.as_str()) else {
            return;
        };
        let Some(at) = charges
            .iter()
            .position(|c| c.host_index == endpoint.host_index)
        else {
            return;
        };
        let charge = charges.swap_remove(at);
        if charges.is_empty() {
            open.remove(request.id.as_str());
        }
        if let Some(load) = loads.get_mut(charge.host_index as usize) {
            load.requests = (load.requests - 1).max(0);
            load.tokens = load.tokens.saturating_sub(charge.tokens).max(0);
        }
    }

    /// Every open charge, so a successor releases them as this instance would have.
    fn export_state(&self) -> Option<serde_json::Value> {
        let ledger = self.ledger();
        let open: Vec<_> = ledger
            .open
            .iter()
            .map(|(request, charges)| {
                let charges: Vec<_> = charges.iter().map(|c| (c.host_index, c.tokens)).collect();
                json!({"request": request, "charges": charges})
            })
            .collect();
        Some(json!({ "open": open }))
    }

    /// Takes over the open charges of a predecessor: each is released, with the tokens it
    /// charged, when its request completes here.
    fn import_state(&self, state: serde_json::Value) -> Result<(), PluginError> {
        let snapshot: Snapshot = serde_json::from_value(state).map_err(|e| {
            PluginError::failed(format!(
                "not the open charges of an in-flight producer: {e}"
            ))
        })?;
        let mut ledger = Ledger::default();
        for open in snapshot.open {
            let charges: Vec<Charge> = open
                .charges
                .into_iter()
                .map(|(host_index, tokens)| Charge { host_index, tokens })
                .collect();
            for &charge in &charges {
                add_load(&mut ledger.loads, charge);
            }
            ledger.open.insert(open.request, charges);
        }
        *self.ledger() = ledger;
        Ok(())
    }

    fn state(&self) -> Option<serde_json::Value> {
        let ledger = self.ledger();
        let endpoints: Vec<_> = (0u32..)
            .zip(&ledger.loads)
            .filter(|(_, load)| **load != InFlightLoad::default())
            .map(|(host_index, load)| {
                json!({
                    "hostIndex": host_index,
                    "requests": load.requests,
                    "tokens": load.tokens,
                })
            })
            .collect();
        Some(json!({
            "openRequests": ledger.open.len(),
            "endpoints": endpoints,
        }))
    }
}

/// Adds one charge to the live counts of its endpoint, growing them on demand.
fn add_load(loads: &mut Vec<InFlightLoad>, charge: Charge) {
    let index = charge.host_index as usize;
    if loads.len() <= index {
        loads.resize(index + 1, InFlightLoad::default());
    }
    let load = &mut loads[index];
    load.requests = load.requests.saturating_add(1);
    load.tokens = load.tokens.saturating_add(charge.tokens);
}

/// The open charges [`Producer::export_state`] writes.
#[derive(Deserialize)]
struct Snapshot {
    open: Vec<OpenCharges>,
}

#[derive(Deserialize)]
struct OpenCharges {
    request: String,
    /// `(host index, tokens)` per endpoint charged.
    charges: Vec<(u32, i64)>,
}

#[cfg(test)]
mod tests;
