//! KV-cache events as the host hands them to plugins (since 1.3).
//!
//! The host subscribes to each endpoint's event publisher, decodes whatever shape the engine
//! sends, checks sequence numbers and delivers one [`KvEventBatch`] per endpoint and received
//! message through the `kv_events` capability, as JSON. These types are that JSON; they are
//! not boundary types, so they may gain optional fields within 1.x (unknown fields are
//! ignored when read).

use serde::{Deserialize, Serialize};

/// The events one endpoint published, in order, or a signal from the host about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvEventBatch {
    /// The endpoint's `host_index` (the same number requests carry in `EndpointView`).
    pub host_index: u32,
    /// The endpoint's id, for messages.
    #[serde(default)]
    pub endpoint: String,
    /// The host's clock when the batch was delivered, in milliseconds.
    #[serde(default)]
    pub now_ms: u64,
    pub events: Vec<KvEvent>,
}

/// One event. Engine events keep vLLM's names; `Reset` comes from the host. In JSON an event
/// is `{"BlockStored": {...}}`, `{"BlockRemoved": {...}}`, `{"Reset": {...}}` or
/// `"AllBlocksCleared"` (a tag that names the variant first is read without buffering).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum KvEvent {
    /// Full blocks the engine stored, as one chain: the first block's parent is
    /// `parent_block_hash` (none at the start of a sequence), each next block's parent is
    /// the block before it.
    BlockStored(StoredBlocks),
    /// Blocks the engine evicted, by engine hash.
    BlockRemoved(RemovedBlocks),
    /// The engine emptied its cache (weights reloaded, cache reset).
    AllBlocksCleared,
    /// From the host: forget everything held for this endpoint.
    Reset(Reset),
}

/// The payload of [`KvEvent::BlockStored`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StoredBlocks {
    /// The engine's hash of each block (64-bit; a longer digest is folded to its last 8
    /// bytes read big-endian).
    pub block_hashes: Vec<u64>,
    pub parent_block_hash: Option<u64>,
    /// The tokens of every listed block, concatenated; empty when the engine sent none (a
    /// CPU-offload store may carry none). In JSON, the little-endian bytes of the ids in
    /// base64 (a list of numbers is read as well).
    #[serde(default, with = "packed_tokens")]
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    #[serde(default)]
    pub medium: Medium,
    #[serde(default)]
    pub lora_id: Option<i64>,
    #[serde(default)]
    pub lora_name: Option<String>,
    /// Per block, the engine's extra hash keys (LoRA name, `cache_salt`, multimodal ids),
    /// each rendered as text (strings as they are, other values as compact JSON); `None`
    /// for a block without any. Empty when the engine sent none at all.
    #[serde(default)]
    pub extra_keys: Vec<Option<Vec<String>>>,
}

/// The payload of [`KvEvent::BlockRemoved`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RemovedBlocks {
    pub block_hashes: Vec<u64>,
    #[serde(default)]
    pub medium: Medium,
}

/// Where a block lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Medium {
    #[default]
    #[serde(rename = "GPU")]
    Gpu,
    #[serde(rename = "CPU")]
    Cpu,
    /// Any other tier an engine names (disk, remote); counted apart from GPU and CPU.
    #[serde(other, rename = "other")]
    Other,
}

/// The payload of [`KvEvent::Reset`]: whatever the plugin held for the endpoint is void.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reset {
    pub reason: ResetReason,
    /// `true` when the host knows the endpoint now holds nothing (an operator reset it,
    /// or its publisher restarted and every event since has arrived): the emptied index is
    /// exact. `false` when events were lost: the index is incomplete and rebuilds from the
    /// events that follow.
    pub known: bool,
}

/// Why the host reset an endpoint's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResetReason {
    /// Sequence numbers skipped and no replay filled the hole.
    Gap,
    /// The publisher restarted (its sequence started over).
    Restart,
    /// The first message seen from the publisher was not its first.
    FirstContact,
    /// An operator asked for it (the admin API), e.g. after new weights were loaded.
    Admin,
    /// The instance was created while the publisher was already running (a reload changed
    /// its library or parameters): it saw none of the earlier events.
    NewInstance,
}

/// Token ids in JSON as base64 of their little-endian bytes: a fraction of the size of a list
/// of numbers, and read several times faster, for the tokens are most of an event's bytes.
mod packed_tokens {
    use serde::de::{self, SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn serialize<S: Serializer>(tokens: &[u32], serializer: S) -> Result<S::Ok, S::Error> {
        let mut bytes = Vec::with_capacity(tokens.len() * 4);
        for token in tokens {
            bytes.extend_from_slice(&token.to_le_bytes());
        }
        let mut text = Vec::with_capacity(bytes.len().div_ceil(3) * 4);
        let mut triples = bytes.chunks_exact(3);
        for t in &mut triples {
            let n = (u32::from(t[0]) << 16) | (u32::from(t[1]) << 8) | u32::from(t[2]);
            text.extend_from_slice(&[
                ALPHABET[(n >> 18) as usize & 63],
                ALPHABET[(n >> 12) as usize & 63],
                ALPHABET[(n >> 6) as usize & 63],
                ALPHABET[n as usize & 63],
            ]);
        }
        let rest = triples.remainder();
        if !rest.is_empty() {
            let b = [rest[0], *rest.get(1).unwrap_or(&0), 0];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8);
            text.push(ALPHABET[(n >> 18) as usize & 63]);
            text.push(ALPHABET[(n >> 12) as usize & 63]);
            text.push(if rest.len() == 2 {
                ALPHABET[(n >> 6) as usize & 63]
            } else {
                b'='
            });
            text.push(b'=');
        }
        // Only alphabet characters and `=` were written.
        let text = String::from_utf8(text).unwrap_or_default();
        serializer.serialize_str(&text)
    }

    /// Each base64 character's 6 bits; 0xFF for a byte that is none.
    const DECODE: [u8; 256] = {
        let mut table = [0xFFu8; 256];
        let mut i = 0;
        while i < 64 {
            table[ALPHABET[i] as usize] = i as u8;
            i += 1;
        }
        table
    };

    /// The ids in `text`, or `None` when it is not base64 of whole little-endian `u32`s.
    pub fn unpack(text: &str) -> Option<Vec<u32>> {
        let text = text.trim_end_matches('=').as_bytes();
        let mut bytes = Vec::with_capacity(text.len() / 4 * 3 + 3);
        let mut quads = text.chunks_exact(4);
        for quad in &mut quads {
            let [a, b, c, d] = [quad[0], quad[1], quad[2], quad[3]].map(|x| DECODE[x as usize]);
            if (a | b | c | d) == 0xFF || (a | b | c | d) & 0xC0 != 0 {
                return None;
            }
            let n =
                (u32::from(a) << 18) | (u32::from(b) << 12) | (u32::from(c) << 6) | u32::from(d);
            bytes.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8]);
        }
        let rest = quads.remainder();
        if !rest.is_empty() {
            let mut n = 0u32;
            for (i, &x) in rest.iter().enumerate() {
                let v = DECODE[x as usize];
                if v & 0xC0 != 0 {
                    return None;
                }
                n |= u32::from(v) << (18 - 6 * i);
            }
            let tail = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
            bytes.extend_from_slice(&tail[..rest.len() - 1]);
        }
        if bytes.len() % 4 != 0 {
            return None;
        }
        Some(
            bytes
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        )
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u32>, D::Error> {
        struct Tokens;

        impl<'de> Visitor<'de> for Tokens {
            type Value = Vec<u32>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("token ids: base64 of their little-endian bytes, or a list")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Vec<u32>, E> {
                unpack(text).ok_or_else(|| E::custom("token ids that are not base64 of u32s"))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u32>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(token) = seq.next_element()? {
                    out.push(token);
                }
                Ok(out)
            }
        }

        deserializer.deserialize_any(Tokens)
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn tokens_round_trip_through_base64_and_lists_still_read() {
            for tokens in [
                vec![],
                vec![1],
                vec![0, u32::MAX, 7],
                (0..100).collect::<Vec<u32>>(),
            ] {
                let stored = super::super::StoredBlocks {
                    token_ids: tokens.clone(),
                    ..Default::default()
                };
                let text = serde_json::to_string(&stored).unwrap();
                let back: super::super::StoredBlocks = serde_json::from_str(&text).unwrap();
                assert_eq!(back.token_ids, tokens, "{text}");
            }
            let listed: super::super::StoredBlocks = serde_json::from_str(
                r#"{"block_hashes":[1],"parent_block_hash":null,"token_ids":[5,6],"block_size":2}"#,
            )
            .unwrap();
            assert_eq!(listed.token_ids, [5, 6]);
            assert!(super::unpack("AAA").is_none(), "two bytes are no u32");
            assert!(super::unpack("A*AA").is_none());
        }
    }
}
