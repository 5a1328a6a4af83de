//! Well-known data types and the producers that write them by default.
//!
//! A [`DataKey`](crate::DataKey) pairs one of these data types with the name of the producer
//! instance that writes it. Consumers bind to a producer by name (usually a
//! `...ProducerName` parameter); an empty name means the type's default producer below.

/// [`PrefixCacheMatchInfo`](crate::PrefixCacheMatchInfo) per endpoint.
pub const PREFIX_CACHE_MATCH_INFO: &str = "PrefixCacheMatchInfo";
/// [`InFlightLoad`](crate::InFlightLoad) per endpoint.
pub const IN_FLIGHT_LOAD: &str = "InFlightLoad";
/// [`LatencyPrediction`](crate::LatencyPrediction) per endpoint.
pub const LATENCY_PREDICTION: &str = "LatencyPrediction";
/// The request's token ids ([`RequestView::prompts`](crate::RequestView::prompts)). Consuming
/// it orders a producer after tokenization. Since 1.3 it carries one value: when the prompt
/// came as text and was not encoded by the model's tokenizer, an
/// [`AttrValue::Custom`](crate::AttrValue::Custom) on every candidate says the ids are the
/// host's estimate (4 bytes per token), not an engine tokenizer's. The value is empty, or, for
/// a recorded decision, UTF-8 text naming why (hosts before this note wrote it empty). It is
/// absent for token ids the client sent and for text the model's tokenizer encoded.
pub const TOKENIZED_PROMPT: &str = "TokenizedPrompt";

/// The content hashes of a request's prompt blocks, published by a producer that hashed them
/// so a producer keyed on blocks of the same size chains them instead of hashing the prompt
/// again. One value per request, an [`AttrValue::Custom`](crate::AttrValue::Custom) on the
/// first candidate only; its encoding is documented with the prefix-hashing crate's
/// `published` module (a tag, the block size, each prompt's block count, then XXH64 of each
/// block's tokens). Has no default producer.
pub const BLOCK_CONTENT_HASHES: &str = "BlockContentHashes";

pub const APPROX_PREFIX_CACHE_PRODUCER: &str = "approx-prefix-cache-producer";
pub const INFLIGHT_LOAD_PRODUCER: &str = "inflight-load-producer";
pub const PREDICTED_LATENCY_PRODUCER: &str = "predicted-latency-producer";
pub const TOKEN_PRODUCER: &str = "token-producer";

/// The producer a consumer binds to: `configured` when set, else the data type's default.
pub fn producer_or_default<'a>(configured: &'a str, default_producer: &'a str) -> &'a str {
    if configured.is_empty() {
        default_producer
    } else {
        configured
    }
}

/// The default producer type of a well-known data type, if it has one.
pub fn default_producer(data_type: &str) -> Option<&'static str> {
    match data_type {
        PREFIX_CACHE_MATCH_INFO => Some(APPROX_PREFIX_CACHE_PRODUCER),
        IN_FLIGHT_LOAD => Some(INFLIGHT_LOAD_PRODUCER),
        TOKENIZED_PROMPT => Some(TOKEN_PRODUCER),
        _ => None,
    }
}
