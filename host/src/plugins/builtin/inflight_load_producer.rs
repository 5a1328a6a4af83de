//! `inflight-load-producer`: the requests and tokens dispatched to each endpoint and not yet
//! completed, published as `InFlightLoad` (the data type's default producer).
//!
//! A dispatch charges the endpoint one request and the prompt tokens it brings that no request
//! already in flight there shares (plus an estimate of its output when
//! `addEstimatedOutputTokens` is set); the completion of that request on that endpoint,
//! whatever its outcome, releases exactly that charge, once. Shared tokens are found by
//! chained block hashes of `blockSizeTokens` tokens, so the samples of one prompt sent to one
//! replica count its prompt once — the prefill they cause — instead of once per sample.
//! The charge is held until completion, since the host reports no earlier event (the reference
//! drops the prompt tokens at the first response byte); no discount for blocks the endpoint's
//! cache already holds is applied, so `prefixMatchInfoProducerName` has no effect.
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

use switchyard_prefix_hashing::{block_count, hash_prompt_local_into, prompt_seed, BlockHashBuild};

use super::Builtin;

/// A map from block hash to `V`.
type BlockHashMap<V> = HashMap<u64, V, BlockHashBuild>;

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
            name: "blockSizeTokens",
            value_type: "integer",
            default: "256",
            range: "0..=1048576",
            description: "switchyard's: tokens per block when finding the prompt blocks a \
                          dispatch shares with requests already in flight to the same \
                          endpoint (those are not charged again); 0 charges every prompt \
                          whole, as the reference's count without a prefix producer.",
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
    pub block_size_tokens: u32,
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
            block_size_tokens: DEFAULT_BLOCK_SIZE_TOKENS,
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
        if self.block_size_tokens > MAX_BLOCK_SIZE_TOKENS {
            return Err(PluginError::invalid_parameter(
                "blockSizeTokens",
                format!(
                    "blockSizeTokens must be in 0..={MAX_BLOCK_SIZE_TOKENS} (got {})",
                    self.block_size_tokens
                ),
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

    /// The tokens one dispatch of `request` charges when `unshared` of its prompt tokens are
    /// not already in flight to the endpoint.
    pub fn charge(&self, request: &RequestView<'_>, unshared: usize) -> i64 {
        let unshared = i64::try_from(unshared).unwrap_or(i64::MAX);
        let input = i64::try_from(request.token_count()).unwrap_or(i64::MAX);
        if !self.add_estimated_output_tokens || input <= 0 {
            return unshared;
        }
        // `as` saturates; the ratio is finite and non-negative.
        let mut output = (input as f64 * self.output_ratio).round() as i64;
        if request.max_output_tokens >= 0 {
            output = output.min(request.max_output_tokens);
        }
        if let Some(cap) = self.max_estimated_output_tokens {
            output = output.min(cap);
        }
        unshared.saturating_add(output)
    }
}

const DEFAULT_BLOCK_SIZE_TOKENS: u32 = 256;
const MAX_BLOCK_SIZE_TOKENS: u32 = 1 << 20;

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
#[derive(Debug, Clone)]
struct Charge {
    host_index: u32,
    tokens: i64,
    /// The prompt's block hashes, each counted once more on the endpoint.
    blocks: Vec<u64>,
}

#[derive(Default)]
struct Ledger {
    /// Live counts by host index, grown on demand.
    loads: Vec<InFlightLoad>,
    /// By host index: the prompt blocks of the requests in flight there, with how many of
    /// them carry each.
    blocks: Vec<BlockHashMap<u32>>,
    /// Open charges by request id (usually one; more when a request goes to several
    /// endpoints).
    open: HashMap<String, Vec<Charge>>,
}

impl InFlightLoadProducer {
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // The ledger is consistent after every statement that can panic; keep using it.
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The block hashes of every prompt of `request`, one prompt after the other; none when
    /// `blockSizeTokens` is 0.
    fn prompt_blocks(&self, request: &RequestView<'_>) -> Vec<u64> {
        let block_size = self.config.block_size_tokens as usize;
        let mut hashes = Vec::new();
        if block_size > 0 {
            let seed = prompt_seed(&request.model, &request.cache_salt);
            for prompt in request.prompts.iter() {
                hash_prompt_local_into(seed, &prompt.tokens, block_size, &mut hashes);
            }
        }
        hashes
    }
}

/// The prompt tokens of `request` from each prompt's first block that `in_flight` does not
/// hold; `hashes` are its prompts' blocks of `block_size` tokens, one prompt after the other.
fn unshared_tokens(
    request: &RequestView<'_>,
    in_flight: Option<&BlockHashMap<u32>>,
    hashes: &[u64],
    block_size: usize,
) -> usize {
    let mut unshared = 0;
    let mut from = 0;
    for prompt in request.prompts.iter() {
        let tokens = prompt.tokens.len();
        let blocks = block_count(tokens, block_size, usize::MAX).min(hashes.len() - from);
        let own = &hashes[from..from + blocks];
        from += blocks;
        let shared = in_flight.map_or(0, |held| {
            own.iter().take_while(|h| held.contains_key(h)).count()
        });
        unshared += tokens.saturating_sub(shared * block_size);
    }
    unshared
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
        let hashes = self.prompt_blocks(request);
        let host_index = endpoint.host_index;
        let mut guard = self.ledger();
        let Ledger {
            loads,
            blocks,
            open,
        } = &mut *guard;
        let charged = open.get(request.id.as_str());
        if charged.is_some_and(|charges| charges.iter().any(|c| c.host_index == host_index)) {
            return;
        }
        let unshared = if hashes.is_empty() {
            request.token_count()
        } else {
            unshared_tokens(
                request,
                blocks.get(host_index as usize),
                &hashes,
                self.config.block_size_tokens as usize,
            )
        };
        let charge = Charge {
            host_index,
            tokens: self.config.charge(request, unshared),
            blocks: hashes,
        };
        add_load(loads, blocks, &charge);
        open.entry(request.id.as_str().to_owned())
            .or_default()
            .push(charge);
    }

    fn completed(&self, request: &RequestView<'_>, endpoint: &EndpointView<'_>, _: Outcome) {
        let mut guard = self.ledger();
        let Ledger {
            loads,
            blocks,
            open,
        } = &mut *guard;
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
        if let Some(held) = blocks.get_mut(charge.host_index as usize) {
            for hash in &charge.blocks {
                if let Some(count) = held.get_mut(hash) {
                    *count -= 1;
                    if *count == 0 {
                        held.remove(hash);
                    }
                }
            }
        }
    }

    /// Every open charge, so a successor releases them as this instance would have.
    fn export_state(&self) -> Option<serde_json::Value> {
        let ledger = self.ledger();
        let open: Vec<_> = ledger
            .open
            .iter()
            .map(|(request, charges)| {
                let charges: Vec<_> = charges
                    .iter()
                    .map(|c| json!([c.host_index, c.tokens, c.blocks]))
                    .collect();
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
            let charges: Vec<Charge> = open.charges.into_iter().map(Charge::from).collect();
            for charge in &charges {
                add_load(&mut ledger.loads, &mut ledger.blocks, charge);
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
fn add_load(loads: &mut Vec<InFlightLoad>, blocks: &mut Vec<BlockHashMap<u32>>, charge: &Charge) {
    let index = charge.host_index as usize;
    if loads.len() <= index {
        loads.resize(index + 1, InFlightLoad::default());
    }
    let load = &mut loads[index];
    load.requests = load.requests.saturating_add(1);
    load.tokens = load.tokens.saturating_add(charge.tokens);
    if charge.blocks.is_empty() {
        return;
    }
    if blocks.len() <= index {
        blocks.resize_with(index + 1, BlockHashMap::default);
    }
    for &hash in &charge.blocks {
        *blocks[index].entry(hash).or_default() += 1;
    }
}

/// The open charges [`Producer::export_state`] writes.
#[derive(Deserialize)]
struct Snapshot {
    open: Vec<OpenCharges>,
}

#[derive(Deserialize)]
struct OpenCharges {
    request: String,
    /// `[host index, tokens, prompt blocks]` per endpoint charged; a predecessor that kept no
    /// blocks wrote `[host index, tokens]`.
    charges: Vec<ChargeState>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ChargeState {
    WithBlocks(u32, i64, Vec<u64>),
    Plain(u32, i64),
}

impl From<ChargeState> for Charge {
    fn from(state: ChargeState) -> Self {
        let (host_index, tokens, blocks) = match state {
            ChargeState::WithBlocks(host_index, tokens, blocks) => (host_index, tokens, blocks),
            ChargeState::Plain(host_index, tokens) => (host_index, tokens, Vec::new()),
        };
        Charge {
            host_index,
            tokens,
            blocks,
        }
    }
}

#[cfg(test)]
mod tests;
