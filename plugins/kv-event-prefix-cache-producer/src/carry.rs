//! What a reload carries over: the whole index as `export_state` writes it and `import_state`
//! reads it back, and the checks that refuse an index this instance could not use.
//!
//! None of the instance's parameters changes how entries are keyed: a block's request key is
//! hashed with the block size its store event carried, and each endpoint's block size travels
//! with it. What does change them is the hashing itself, so the export carries `keyProbe`, the
//! request key of a fixed chain: a library that hashes otherwise computes another and refuses
//! the index. `format` names the layout below; a change to it, or to how the plugin derives a
//! chain's seed from an event, needs a new one.
//!
//! Each endpoint's blocks are listed per tier as one hex string, 32 digits a block: its engine
//! hash, then its request key, ordered by engine hash. A block stored more than once in a tier
//! (removals are counted per store) is listed once there, and its count is in `repeats`.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::Deserialize;
use serde_json::{json, Value};
use switchyard_plugin_api::PluginError;
use switchyard_prefix_hashing::{hash_prompt_into, prompt_seed};

use crate::index::{KvIndex, Status, TIERS};

/// The layout this library writes and reads.
pub const FORMAT: u64 = 1;

/// Tier names in the order the index counts them, as the state names them.
const TIER_NAMES: [&str; TIERS] = ["gpu", "cpu", "other"];

/// Hex digits of one block in a tier's list.
const RECORD: usize = 32;

/// The request key of a fixed two-block chain, salted and under an adapter name, as this
/// library computes it.
pub fn key_probe() -> u64 {
    let tokens: Vec<u32> = (0..8).collect();
    let mut keys = Vec::with_capacity(2);
    hash_prompt_into(
        prompt_seed("probe-adapter", "probe-salt"),
        &tokens,
        4,
        2,
        &mut keys,
    );
    keys.last().copied().unwrap_or(0)
}

/// The whole index, in the layout described above.
pub fn export(index: &KvIndex) -> Value {
    let mut loras: Vec<&str> = index.loras().collect();
    loras.sort_unstable();
    let endpoints: Vec<Value> = index
        .endpoints()
        .filter(|(_, e)| !e.is_untouched())
        .map(|(host_index, e)| {
            let blocks = e.engine_blocks();
            let mut counts = [0usize; TIERS];
            for (_, _, stored) in &blocks {
                for (count, &n) in counts.iter_mut().zip(stored) {
                    *count += usize::from(n > 0);
                }
            }
            let mut lists = counts.map(|n| String::with_capacity(n * RECORD));
            let mut repeats = Vec::new();
            for &(engine, ours, stored) in &blocks {
                for (tier, &n) in stored.iter().enumerate() {
                    if n == 0 {
                        continue;
                    }
                    let _ = write!(lists[tier], "{engine:016x}{ours:016x}");
                    if n > 1 {
                        repeats.push(json!({
                            "tier": TIER_NAMES[tier],
                            "engineHash": format!("{engine:016x}"),
                            "stores": n,
                        }));
                    }
                }
            }
            let [gpu, cpu, other] = lists;
            let status = e.status.to_json();
            json!({
                "hostIndex": host_index,
                "id": e.id,
                "blockSizeTokens": e.told_block_size(),
                "status": status,
                "dropped": {
                    "unknownParents": e.unknown_parents,
                    "storesWithoutTokens": e.without_tokens,
                    "unknownRemovals": e.unknown_removals,
                    "malformed": e.malformed,
                },
                "blocks": {"gpu": gpu, "cpu": cpu, "other": other},
                "repeats": repeats,
            })
        })
        .collect();
    json!({
        "format": FORMAT,
        "keyProbe": format!("{:016x}", key_probe()),
        "loras": loras,
        "endpoints": endpoints,
    })
}

/// Reads an index [`export`] wrote into a new index whose endpoints default to
/// `default_block_size`; refuses one keyed otherwise than this library keys, or garbled.
pub fn import(state: Value, default_block_size: u32) -> Result<KvIndex, PluginError> {
    if !state.is_object() {
        return Err(garbled("not a JSON object"));
    }
    let Some(format) = state.get("format") else {
        return Err(garbled("no format"));
    };
    if format.as_u64() != Some(FORMAT) {
        return Err(PluginError::failed(format!(
            "the index is written in format = {format}; this instance reads format = {FORMAT}"
        )));
    }
    let ours = format!("{:016x}", key_probe());
    match state.get("keyProbe").and_then(Value::as_str) {
        None => return Err(garbled("no keyProbe")),
        Some(theirs) if theirs != ours => {
            return Err(PluginError::failed(format!(
                "the index was keyed with keyProbe = {theirs}; this instance keys with \
                 keyProbe = {ours}: its requests would never match those entries"
            )));
        }
        Some(_) => {}
    }
    let snapshot: Snapshot = serde_json::from_value(state).map_err(|e| garbled(&e.to_string()))?;
    let mut index = KvIndex::new(default_block_size);
    for name in &snapshot.loras {
        index.add_lora(name);
    }
    let mut seen = Vec::with_capacity(snapshot.endpoints.len());
    for endpoint in &snapshot.endpoints {
        if seen.contains(&endpoint.host_index) {
            return Err(garbled(&format!(
                "host index {} is listed twice",
                endpoint.host_index
            )));
        }
        seen.push(endpoint.host_index);
        restore_endpoint(&mut index, endpoint)?;
    }
    Ok(index)
}

fn restore_endpoint(index: &mut KvIndex, snapshot: &SnapshotEndpoint) -> Result<(), PluginError> {
    let id = &snapshot.id;
    if snapshot.block_size_tokens == Some(0) {
        return Err(garbled(&format!("endpoint {id} has block size 0")));
    }
    let status = match &snapshot.status {
        SnapshotStatus::Exact(word) if word == "exact" => Status::Exact,
        SnapshotStatus::Exact(word) => {
            return Err(garbled(&format!("endpoint {id} has status {word:?}")));
        }
        SnapshotStatus::Rebuilding(r) => Status::Rebuilding {
            since_ms: r.rebuilding_since_ms,
            reason: r.reason.clone(),
        },
    };
    // Engine hash → request key and stores per tier, checked before anything is restored.
    let mut blocks: HashMap<u64, (u64, [u32; TIERS])> = HashMap::new();
    for (tier, list) in snapshot.blocks.tiers().into_iter().enumerate() {
        let records = parse_records(list).ok_or_else(|| {
            garbled(&format!(
                "the {} blocks of endpoint {id} are not 32-digit hex records",
                TIER_NAMES[tier]
            ))
        })?;
        for (engine, ours) in records {
            let (key, stored) = blocks.entry(engine).or_insert((ours, [0; TIERS]));
            if *key != ours {
                return Err(garbled(&format!(
                    "engine block {engine:016x} of endpoint {id} has two request keys"
                )));
            }
            if stored[tier] > 0 {
                return Err(garbled(&format!(
                    "engine block {engine:016x} of endpoint {id} is listed twice in {}",
                    TIER_NAMES[tier]
                )));
            }
            stored[tier] = 1;
        }
    }
    for repeat in &snapshot.repeats {
        let tier = TIER_NAMES.iter().position(|&t| t == repeat.tier);
        let engine = parse_hash(&repeat.engine_hash);
        let block = tier.zip(engine).and_then(|(tier, engine)| {
            let (_, stored) = blocks.get_mut(&engine)?;
            (stored[tier] == 1 && repeat.stores > 1).then_some(&mut stored[tier])
        });
        let Some(stores) = block else {
            return Err(garbled(&format!(
                "endpoint {id} repeats {} {} stores of engine block {}, which it does not list",
                repeat.stores, repeat.tier, repeat.engine_hash
            )));
        };
        *stores = repeat.stores;
    }
    let host_index = snapshot.host_index as usize;
    let endpoint = index.restore_endpoint(host_index, id, snapshot.block_size_tokens);
    endpoint.status = status;
    endpoint.unknown_parents = snapshot.dropped.unknown_parents;
    endpoint.without_tokens = snapshot.dropped.stores_without_tokens;
    endpoint.unknown_removals = snapshot.dropped.unknown_removals;
    endpoint.malformed = snapshot.dropped.malformed;
    for (engine, (ours, stored)) in blocks {
        index.restore_block(host_index, engine, ours, stored);
    }
    Ok(())
}

fn garbled(what: &str) -> PluginError {
    PluginError::failed(format!("not an exported KV-event index: {what}"))
}

/// A tier's list: consecutive pairs of 16-digit hex numbers.
fn parse_records(hex: &str) -> Option<Vec<(u64, u64)>> {
    if !hex.is_ascii() || !hex.len().is_multiple_of(RECORD) {
        return None;
    }
    (0..hex.len())
        .step_by(RECORD)
        .map(|at| {
            let record = hex.get(at..at + RECORD)?;
            Some((parse_hash(&record[..16])?, parse_hash(&record[16..])?))
        })
        .collect()
}

/// Exactly 16 hex digits.
fn parse_hash(hex: &str) -> Option<u64> {
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// An index as [`export`] writes it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Snapshot {
    loras: Vec<String>,
    endpoints: Vec<SnapshotEndpoint>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SnapshotEndpoint {
    host_index: u32,
    id: String,
    block_size_tokens: Option<u32>,
    status: SnapshotStatus,
    dropped: Dropped,
    blocks: TierLists,
    repeats: Vec<Repeat>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SnapshotStatus {
    Exact(String),
    Rebuilding(Rebuilding),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rebuilding {
    rebuilding_since_ms: u64,
    reason: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Dropped {
    unknown_parents: u64,
    stores_without_tokens: u64,
    unknown_removals: u64,
    malformed: u64,
}

#[derive(Deserialize)]
struct TierLists {
    gpu: String,
    cpu: String,
    other: String,
}

impl TierLists {
    fn tiers(&self) -> [&str; TIERS] {
        [&self.gpu, &self.cpu, &self.other]
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Repeat {
    tier: String,
    engine_hash: String,
    stores: u32,
}
