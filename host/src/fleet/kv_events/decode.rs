//! Reading one published message: its frames, and its msgpack payload in either event shape
//! vLLM has used (tagged arrays, and since June 2026 maps tagged by `type`).
//!
//! Unknown map keys and trailing array elements are ignored; a field that is present but of
//! the wrong kind makes the whole message malformed.

use rmpv::Value;
use switchyard_plugin_api::kv::{KvEvent, Medium, RemovedBlocks, StoredBlocks};

use super::msgpack::{Kind, Reader};

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
    const NOT_A_BATCH: &str = "the payload is not a batch [ts, events, ...]";
    let mut reader = Reader::new(payload);
    match reader.peek()? {
        Kind::Array(_) => {
            if reader.array()? < 2 {
                return Err(NOT_A_BATCH.into());
            }
            reader.skip()?;
            read_events(&mut reader)
        }
        Kind::Map(_) => {
            let mut events = None;
            for _ in 0..reader.map()? {
                if reader.str()? == "events" {
                    events = Some(read_events(&mut reader)?);
                } else {
                    reader.skip()?;
                }
            }
            events.ok_or_else(|| NOT_A_BATCH.into())
        }
        _ => Err(NOT_A_BATCH.into()),
    }
}

fn read_events(reader: &mut Reader<'_>) -> Result<Vec<KvEvent>, String> {
    let count = reader
        .array()
        .map_err(|_| "the batch's events are not a list".to_string())?;
    let mut out = Vec::with_capacity(count.min(4096));
    for i in 0..count {
        if let Some(event) = read_event(reader).map_err(|e| format!("event {i}: {e}"))? {
            out.push(event);
        }
    }
    Ok(out)
}

/// The field at `position` of a tagged array, by the name the map shape gives it.
fn field_at(tag: &str, position: usize) -> &'static str {
    const REMOVED: [&str; 3] = ["type", "block_hashes", "medium"];
    let names: &[&str] = match tag {
        "BlockStored" => &STORED,
        "BlockRemoved" => &REMOVED,
        _ => &[],
    };
    names.get(position).copied().unwrap_or("")
}

/// One event, in either shape; `None` for a kind this host does not use.
fn read_event(reader: &mut Reader<'_>) -> Result<Option<KvEvent>, String> {
    let mut fields = Fields::default();
    let tag = match reader.peek()? {
        Kind::Array(_) => {
            let count = reader.array()?;
            if count == 0 {
                return Err("no event type".into());
            }
            let tag = reader.str()?;
            for position in 1..count {
                fields.read(field_at(tag, position), reader)?;
            }
            tag
        }
        Kind::Map(_) => {
            let mut tag = None;
            for _ in 0..reader.map()? {
                match reader.str()? {
                    "type" => tag = Some(reader.str()?),
                    key => fields.read(key, reader)?,
                }
            }
            tag.ok_or("no event type")?
        }
        _ => return Err("neither a tagged array nor a map".into()),
    };
    fields.into_event(tag)
}

/// The fields of one event, whatever order they came in.
#[derive(Default)]
struct Fields {
    block_hashes: Option<Vec<u64>>,
    parent: Option<u64>,
    token_ids: Vec<u32>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    medium: Medium,
    lora_name: Option<String>,
    extra_keys: Vec<Option<Vec<String>>>,
}

impl Fields {
    fn read(&mut self, name: &str, reader: &mut Reader<'_>) -> Result<(), String> {
        if name.is_empty() || !KNOWN.contains(&name) {
            return reader.skip();
        }
        if reader.nil()? {
            return Ok(());
        }
        match name {
            "block_hashes" => {
                let count = reader
                    .array()
                    .map_err(|_| "block_hashes is not a list".to_string())?;
                let mut hashes = Vec::with_capacity(count.min(65_536));
                for _ in 0..count {
                    hashes.push(hash(reader)?);
                }
                self.block_hashes = Some(hashes);
            }
            // Some publishers write 0 for "no parent".
            "parent_block_hash" => self.parent = Some(hash(reader)?).filter(|&h| h != 0),
            "token_ids" => {
                let count = reader
                    .array()
                    .map_err(|_| "token_ids is not a list".to_string())?;
                self.token_ids.reserve(count.min(1 << 20));
                for _ in 0..count {
                    let token = u32::try_from(reader.uint()?)
                        .map_err(|_| "a token id that is not a 32-bit integer".to_string())?;
                    self.token_ids.push(token);
                }
            }
            "block_size" => {
                let size = reader.uint().map_err(|_| "block_size is not a count")?;
                self.block_size = Some(u32::try_from(size).map_err(|_| "block_size is too large")?);
            }
            "lora_id" => {
                self.lora_id = Some(reader.int().map_err(|_| "lora_id is not an integer")? as i64)
            }
            "medium" => self.medium = medium(reader.str().map_err(|_| "medium is not text")?),
            "lora_name" => {
                self.lora_name = Some(
                    reader
                        .str()
                        .map_err(|_| "lora_name is not text")?
                        .to_owned(),
                )
            }
            _ => {
                // extra_keys: per block, nil or a list of keys of any kind.
                let count = reader
                    .array()
                    .map_err(|_| "extra_keys is not a list".to_string())?;
                for _ in 0..count {
                    let keys = match reader.peek()? {
                        Kind::Nil => {
                            reader.nil()?;
                            None
                        }
                        Kind::Array(_) => {
                            let n = reader.array()?;
                            let mut keys = Vec::with_capacity(n.min(64));
                            for _ in 0..n {
                                keys.push(text(&reader.value()?));
                            }
                            Some(keys)
                        }
                        _ => Some(vec![text(&reader.value()?)]),
                    };
                    self.extra_keys.push(keys);
                }
            }
        }
        Ok(())
    }

    fn into_event(self, tag: &str) -> Result<Option<KvEvent>, String> {
        Ok(Some(match tag {
            "BlockStored" => KvEvent::BlockStored(StoredBlocks {
                block_hashes: self.block_hashes.ok_or("block_hashes is not a list")?,
                parent_block_hash: self.parent,
                token_ids: self.token_ids,
                block_size: self.block_size.ok_or("BlockStored without block_size")?,
                lora_id: self.lora_id,
                medium: self.medium,
                lora_name: self.lora_name,
                extra_keys: self.extra_keys,
            }),
            "BlockRemoved" => KvEvent::BlockRemoved(RemovedBlocks {
                block_hashes: self.block_hashes.ok_or("block_hashes is not a list")?,
                medium: self.medium,
            }),
            "AllBlocksCleared" => KvEvent::AllBlocksCleared,
            _ => return Ok(None),
        }))
    }
}

/// A store's fields in the order of the tagged-array shape, after its tag.
const STORED: [&str; 9] = [
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
];

/// The fields read (a store's; a removal's are among them); any other key is skipped.
const KNOWN: &[&str] = STORED.split_at(1).1;

/// A block hash: a 64-bit integer, or a digest's bytes folded to their last 8 read
/// big-endian (as vLLM's integer hashes are).
fn hash(reader: &mut Reader<'_>) -> Result<u64, String> {
    match reader.bin()? {
        Some([]) => Err("a block hash of no bytes".into()),
        Some(bytes) => {
            let tail = &bytes[bytes.len().saturating_sub(8)..];
            Ok(tail.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
        }
        None => reader
            .int()
            .map_err(|_| "a block hash that is neither an integer nor bytes".into()),
    }
}

fn medium(name: &str) -> Medium {
    match name {
        m if m.eq_ignore_ascii_case("GPU") => Medium::Gpu,
        m if m.eq_ignore_ascii_case("CPU") => Medium::Cpu,
        _ => Medium::Other,
    }
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
    fn unknown_keys_of_any_kind_are_skipped() {
        let nested = V::Map(vec![
            (
                V::from("a"),
                V::Array(vec![V::F32(1.5), V::Binary(vec![1; 300]), V::Nil]),
            ),
            (V::from("b"), V::Ext(7, vec![1, 2, 3])),
            (V::from("c"), V::from(-5)),
            (V::from("d"), V::from("x".repeat(40))),
        ]);
        let event = V::Map(vec![
            (V::from("future"), nested),
            (V::from("block_hashes"), ints(&[9])),
            (V::from("type"), V::from("BlockRemoved")),
            (V::from("medium"), V::from("cpu")),
        ]);
        let mut batch_map = Vec::new();
        rmpv::encode::write_value(
            &mut batch_map,
            &V::Map(vec![
                (V::from("ts"), V::F64(0.5)),
                (V::from("events"), V::Array(vec![event])),
                (V::from("data_parallel_rank"), V::Nil),
            ]),
        )
        .unwrap();
        assert_eq!(
            events(&batch_map).unwrap(),
            [KvEvent::BlockRemoved(RemovedBlocks {
                block_hashes: vec![9],
                medium: Medium::Cpu,
            })]
        );
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
