//! Reading one published message: its frames, and its msgpack payload in either event shape
//! vLLM has used (tagged arrays, and since June 2026 maps tagged by `type`).
//!
//! Unknown map keys and trailing array elements are ignored; a field that is present but of
//! the wrong kind makes the whole message malformed.

use rmpv::Value;
use switchyard_plugin_api::kv::{KvEvent, Medium, RemovedBlocks, StoredBlocks};

/// The sequence number that ends a replay.
pub const END_OF_REPLAY: u64 = u64::MAX;

/// A message's sequence number and payload, from its frames: `[topic, seq, payload]` as
/// published, or `[seq, payload]` as some replays send them.
pub fn split_frames(frames: &[&[u8]]) -> Result<(u64, usize), String> {
    let (seq, payload) = match frames.len() {
        3 => (1, 2),
        2 => (0, 1),
        n => {
            return Err(format!(
                "{n} frames; a KV event message has 3 (topic, sequence, payload)"
            ))
        }
    };
    Ok((sequence(frames[seq])?, payload))
}

/// An 8-byte big-endian sequence number.
pub fn sequence(frame: &[u8]) -> Result<u64, String> {
    let bytes: [u8; 8] = frame
        .try_into()
        .map_err(|_| format!("a sequence frame of {} bytes, not 8", frame.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// The events of one payload, in order.
pub fn events(payload: &[u8]) -> Result<Vec<KvEvent>, String> {
    let mut reader = payload;
    let value = rmpv::decode::read_value(&mut reader).map_err(|e| format!("not msgpack: {e}"))?;
    let list = match &value {
        Value::Array(items) => items.get(1),
        Value::Map(_) => field(&value, "events"),
        _ => None,
    }
    .ok_or("the payload is not a batch [ts, events, ...]")?;
    let Value::Array(list) = list else {
        return Err("the batch's events are not a list".into());
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, event) in list.iter().enumerate() {
        if let Some(event) = decode_event(event).map_err(|e| format!("event {i}: {e}"))? {
            out.push(event);
        }
    }
    Ok(out)
}

/// One event; `None` for a kind this host does not use.
fn decode_event(event: &Value) -> Result<Option<KvEvent>, String> {
    let shape = Shape::of(event)?;
    Ok(Some(match shape.tag()? {
        "BlockStored" => KvEvent::BlockStored(StoredBlocks {
            block_hashes: hashes(shape.get(1, "block_hashes"))?,
            parent_block_hash: match shape.get(2, "parent_block_hash") {
                None | Some(Value::Nil) => None,
                // Some publishers write 0 for "no parent".
                Some(v) => Some(hash(v)?).filter(|&h| h != 0),
            },
            token_ids: tokens(shape.get(3, "token_ids"))?,
            block_size: match shape.get(4, "block_size") {
                Some(v) => uint(v, "block_size")? as u32,
                None => return Err("BlockStored without block_size".into()),
            },
            lora_id: optional(shape.get(5, "lora_id"), |v| {
                v.as_i64().ok_or("lora_id is not an integer".to_string())
            })?,
            medium: medium(shape.get(6, "medium"))?,
            lora_name: optional(shape.get(7, "lora_name"), |v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or("lora_name is not text".to_string())
            })?,
            extra_keys: extra_keys(shape.get(8, "extra_keys"))?,
        }),
        "BlockRemoved" => KvEvent::BlockRemoved(RemovedBlocks {
            block_hashes: hashes(shape.get(1, "block_hashes"))?,
            medium: medium(shape.get(2, "medium"))?,
        }),
        "AllBlocksCleared" => KvEvent::AllBlocksCleared,
        _ => return Ok(None),
    }))
}

/// Where an event keeps its fields.
enum Shape<'a> {
    Array(&'a [Value]),
    Map(&'a Value),
}

impl<'a> Shape<'a> {
    fn of(event: &'a Value) -> Result<Shape<'a>, String> {
        match event {
            Value::Array(items) => Ok(Shape::Array(items)),
            Value::Map(_) => Ok(Shape::Map(event)),
            _ => Err("neither a tagged array nor a map".into()),
        }
    }

    fn tag(&self) -> Result<&'a str, String> {
        let tag = match self {
            Shape::Array(items) => items.first(),
            Shape::Map(map) => field(map, "type"),
        };
        tag.and_then(Value::as_str)
            .ok_or_else(|| "no event type".into())
    }

    /// The field at `position` of an array, or under `key` of a map.
    fn get(&self, position: usize, key: &str) -> Option<&'a Value> {
        match self {
            Shape::Array(items) => items.get(position),
            Shape::Map(map) => field(map, key),
        }
    }
}

fn field<'a>(map: &'a Value, key: &str) -> Option<&'a Value> {
    let Value::Map(entries) = map else {
        return None;
    };
    entries
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

fn optional<T>(
    value: Option<&Value>,
    read: impl FnOnce(&Value) -> Result<T, String>,
) -> Result<Option<T>, String> {
    match value {
        None | Some(Value::Nil) => Ok(None),
        Some(v) => read(v).map(Some),
    }
}

fn uint(value: &Value, what: &str) -> Result<u64, String> {
    value
        .as_u64()
        .ok_or_else(|| format!("{what} is not a non-negative integer"))
}

/// A block hash: a 64-bit integer, or a digest's bytes folded to their last 8 read
/// big-endian (as vLLM's integer hashes are).
fn hash(value: &Value) -> Result<u64, String> {
    match value {
        Value::Integer(n) => n
            .as_u64()
            .or_else(|| n.as_i64().map(|i| i as u64))
            .ok_or_else(|| "a block hash out of range".into()),
        Value::Binary(bytes) if !bytes.is_empty() => {
            let tail = &bytes[bytes.len().saturating_sub(8)..];
            Ok(tail.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
        }
        _ => Err("a block hash that is neither an integer nor bytes".into()),
    }
}

fn hashes(value: Option<&Value>) -> Result<Vec<u64>, String> {
    match value {
        Some(Value::Array(items)) => items.iter().map(hash).collect(),
        _ => Err("block_hashes is not a list".into()),
    }
}

fn tokens(value: Option<&Value>) -> Result<Vec<u32>, String> {
    match value {
        None | Some(Value::Nil) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| "a token id that is not a 32-bit integer".to_string())
            })
            .collect(),
        Some(_) => Err("token_ids is not a list".into()),
    }
}

fn medium(value: Option<&Value>) -> Result<Medium, String> {
    Ok(match value {
        None | Some(Value::Nil) => Medium::Gpu,
        Some(v) => match v.as_str().ok_or("medium is not text")? {
            m if m.eq_ignore_ascii_case("GPU") => Medium::Gpu,
            m if m.eq_ignore_ascii_case("CPU") => Medium::Cpu,
            _ => Medium::Other,
        },
    })
}

/// Per block, its extra keys as text; `[]` when the event has none.
fn extra_keys(value: Option<&Value>) -> Result<Vec<Option<Vec<String>>>, String> {
    let items = match value {
        None | Some(Value::Nil) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err("extra_keys is not a list".into()),
    };
    items
        .iter()
        .map(|block| match block {
            Value::Nil => Ok(None),
            Value::Array(keys) => Ok(Some(keys.iter().map(text).collect())),
            other => Ok(Some(vec![text(other)])),
        })
        .collect()
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.as_str().map_or_else(|| value.to_string(), str::to_owned),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value as V;

    fn encode(value: &V) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, value).unwrap();
        out
    }

    fn batch(events: Vec<V>) -> Vec<u8> {
        encode(&V::Array(vec![V::F64(1.5), V::Array(events), V::from(0)]))
    }

    fn ints(values: &[u64]) -> V {
        V::Array(values.iter().map(|&v| V::from(v)).collect())
    }

    #[test]
    fn both_shapes_decode_to_the_same_events() {
        let array = V::Array(vec![
            V::from("BlockStored"),
            ints(&[u64::MAX - 1]),
            V::from(0),
            ints(&[1, 2, 3, 4]),
            V::from(4),
            V::Nil,
            V::from("GPU"),
            V::Nil,
            V::Nil,
        ]);
        let map = V::Map(vec![
            (V::from("type"), V::from("BlockStored")),
            (V::from("block_hashes"), ints(&[u64::MAX - 1])),
            (V::from("parent_block_hash"), V::Nil),
            (V::from("token_ids"), ints(&[1, 2, 3, 4])),
            (V::from("block_size"), V::from(4)),
            (V::from("medium"), V::from("GPU")),
            (V::from("group_idx"), V::from(0)),
            (V::from("kv_cache_spec_kind"), V::from("full_attention")),
        ]);
        let from_array = events(&batch(vec![array])).unwrap();
        let from_map = events(&batch(vec![map])).unwrap();
        assert_eq!(from_array, from_map);
        let KvEvent::BlockStored(stored) = &from_array[0] else {
            panic!("{from_array:?}");
        };
        assert_eq!(stored.block_hashes, [u64::MAX - 1]);
        assert_eq!(stored.parent_block_hash, None, "0 reads as no parent");
        assert_eq!(stored.token_ids, [1, 2, 3, 4]);
    }

    #[test]
    fn removals_clears_digests_and_extra_keys_decode() {
        let digest: Vec<u8> = (1..=32).collect();
        let removed = V::Map(vec![
            (V::from("type"), V::from("BlockRemoved")),
            (V::from("block_hashes"), V::Array(vec![V::Binary(digest)])),
            (V::from("medium"), V::from("CPU")),
        ]);
        let stored = V::Array(vec![
            V::from("BlockStored"),
            ints(&[7]),
            V::from(9),
            ints(&[1, 2]),
            V::from(2),
            V::from(3),
            V::from("GPU"),
            V::from("adapter"),
            V::Array(vec![V::Array(vec![
                V::from("adapter"),
                V::from("salt"),
                V::from(12),
            ])]),
        ]);
        let cleared = V::Array(vec![V::from("AllBlocksCleared")]);
        let unknown = V::Map(vec![(V::from("type"), V::from("SomethingNew"))]);
        let decoded = events(&batch(vec![removed, stored, cleared, unknown])).unwrap();
        assert_eq!(decoded.len(), 3);
        let KvEvent::BlockRemoved(removed) = &decoded[0] else {
            panic!("{decoded:?}");
        };
        assert_eq!(
            removed.block_hashes,
            [u64::from_be_bytes([25, 26, 27, 28, 29, 30, 31, 32])]
        );
        assert_eq!(removed.medium, Medium::Cpu);
        let KvEvent::BlockStored(stored) = &decoded[1] else {
            panic!("{decoded:?}");
        };
        assert_eq!(stored.parent_block_hash, Some(9));
        assert_eq!(stored.lora_id, Some(3));
        assert_eq!(stored.lora_name.as_deref(), Some("adapter"));
        assert_eq!(
            stored.extra_keys,
            [Some(vec![
                "adapter".to_string(),
                "salt".into(),
                "12".into()
            ])]
        );
        assert_eq!(decoded[2], KvEvent::AllBlocksCleared);
    }

    #[test]
    fn malformed_payloads_and_frames_are_errors_not_panics() {
        assert!(events(b"\xc1garbage").is_err());
        assert!(events(&encode(&V::from(3))).is_err());
        let no_size = V::Array(vec![V::from("BlockStored"), ints(&[1]), V::Nil, ints(&[1])]);
        assert!(events(&batch(vec![no_size])).is_err());
        assert!(split_frames(&[b"kv", b"short", b""]).is_err());
        assert!(split_frames(&[b"only one"]).is_err());
        assert_eq!(split_frames(&[b"kv", &7u64.to_be_bytes(), b""]), Ok((7, 2)));
    }
}
