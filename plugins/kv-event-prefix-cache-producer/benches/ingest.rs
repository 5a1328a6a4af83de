//! What the KV-event index costs: applying stored and removed blocks (directly, and through
//! the plugin boundary as the host delivers them, JSON included), and one decision's lookup
//! for an 8k-token prompt over 64 endpoints, beside the floor of hashing that prompt.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kv_event_prefix_cache_producer::config::KvEventPrefixCacheConfig;
use kv_event_prefix_cache_producer::KvEventProducer;
use switchyard_plugin_api::ffi::{RSlice, RStr};
use switchyard_plugin_api::kv::{KvEvent, KvEventBatch, Medium, RemovedBlocks, StoredBlocks};
use switchyard_plugin_api::sdk::{extensions, Instance, Producer};
use switchyard_plugin_api::testing::Harness;
use switchyard_plugin_api::{
    AttrValue, AttrView, EndpointMetrics, EndpointView, ProduceItem, PromptTokens, RequestView,
};
use switchyard_prefix_hashing::hash_prompt_into;

const BLOCK: u32 = 16;
/// Blocks per stored event (one request's new blocks).
const CHAIN: usize = 32;
const ENDPOINTS: u32 = 64;
const PROMPT_TOKENS: usize = 8192;

fn config() -> KvEventPrefixCacheConfig {
    KvEventPrefixCacheConfig {
        block_size_tokens: BLOCK as i64,
        ..KvEventPrefixCacheConfig::default()
    }
}

/// A batch storing `CHAIN` blocks of chain `n` on `host_index`, then removing them.
fn store_and_remove(n: u64, host_index: u32) -> (KvEventBatch, KvEventBatch) {
    let hashes: Vec<u64> = (0..CHAIN as u64)
        .map(|i| (n << 20) | i | (1 << 63))
        .collect();
    let tokens: Vec<u32> = (0..CHAIN as u32 * BLOCK)
        .map(|t| t.wrapping_mul(2_654_435_761) ^ n as u32)
        .collect();
    let stored = KvEvent::BlockStored(StoredBlocks {
        block_hashes: hashes.clone(),
        parent_block_hash: None,
        token_ids: tokens,
        block_size: BLOCK,
        ..StoredBlocks::default()
    });
    let removed = KvEvent::BlockRemoved(RemovedBlocks {
        block_hashes: hashes,
        medium: Medium::Gpu,
    });
    let batch = |events| KvEventBatch {
        host_index,
        endpoint: format!("bench/pod{host_index}"),
        now_ms: 0,
        events,
    };
    (batch(vec![stored]), batch(vec![removed]))
}

fn ingest(c: &mut Criterion) {
    let mut group = c.benchmark_group("kv_ingest");
    group.throughput(Throughput::Elements(2 * CHAIN as u64));
    let batches: Vec<_> = (0..256)
        .map(|n| store_and_remove(n, (n % 64) as u32))
        .collect();

    let producer = KvEventProducer::new("kv", config());
    group.bench_function("store+remove 32 blocks, direct", |b| {
        let mut i = 0;
        b.iter(|| {
            let (stored, removed) = &batches[i % batches.len()];
            i += 1;
            producer.kv_events(black_box(stored)).unwrap();
            producer.kv_events(black_box(removed)).unwrap();
        })
    });

    let instance = Instance::producer(KvEventProducer::new("kv", config())).into_ffi();
    let json: Vec<(String, String)> = batches
        .iter()
        .map(|(s, r)| {
            (
                serde_json::to_string(s).unwrap(),
                serde_json::to_string(r).unwrap(),
            )
        })
        .collect();
    group.bench_function("store+remove 32 blocks, through the boundary", |b| {
        let mut i = 0;
        b.iter(|| {
            let (stored, removed) = &json[i % json.len()];
            i += 1;
            instance
                .extension(extensions::KV_EVENTS, black_box(stored))
                .unwrap();
            instance
                .extension(extensions::KV_EVENTS, black_box(removed))
                .unwrap();
        })
    });
    group.bench_function("store+remove 32 blocks, JSON read only", |b| {
        let mut i = 0;
        b.iter(|| {
            let (stored, removed) = &json[i % json.len()];
            i += 1;
            let s: KvEventBatch = serde_json::from_str(black_box(stored)).unwrap();
            let r: KvEventBatch = serde_json::from_str(black_box(removed)).unwrap();
            (s, r)
        })
    });
    group.bench_function("JSON read, store only", |b| {
        b.iter(|| serde_json::from_str::<KvEventBatch>(black_box(&json[0].0)).unwrap())
    });
    group.bench_function("JSON read, removal only", |b| {
        b.iter(|| serde_json::from_str::<KvEventBatch>(black_box(&json[0].1)).unwrap())
    });
    group.bench_function("store+remove 32 blocks, JSON encoded and delivered", |b| {
        let mut i = 0;
        b.iter(|| {
            let (stored, removed) = &batches[i % batches.len()];
            i += 1;
            for batch in [stored, removed] {
                let text = serde_json::to_string(black_box(batch)).unwrap();
                instance.extension(extensions::KV_EVENTS, &text).unwrap();
            }
        })
    });
    group.finish();
}

fn decision(c: &mut Criterion) {
    let harness = Harness::new(
        &kv_event_prefix_cache_producer::FACTORY,
        &format!("{{\"blockSizeTokens\": {BLOCK}, \"maxPrefixBlocksToMatch\": 4096}}"),
    )
    .unwrap();
    let prompt: Vec<u32> = (0..PROMPT_TOKENS as u32).collect();
    // Every endpoint holds a different share of the prompt's prefix.
    for e in 0..ENDPOINTS {
        let blocks = (PROMPT_TOKENS / BLOCK as usize) * e as usize / ENDPOINTS as usize;
        if blocks == 0 {
            continue;
        }
        let hashes: Vec<u64> = (0..blocks as u64)
            .map(|i| (u64::from(e) << 32) | i)
            .collect();
        harness
            .kv_events(&KvEventBatch {
                host_index: e,
                endpoint: format!("bench/pod{e}"),
                now_ms: 0,
                events: vec![KvEvent::BlockStored(StoredBlocks {
                    block_hashes: hashes,
                    parent_block_hash: None,
                    token_ids: prompt[..blocks * BLOCK as usize].to_vec(),
                    block_size: BLOCK,
                    ..StoredBlocks::default()
                })],
            })
            .unwrap();
    }
    let ids: Vec<String> = (0..ENDPOINTS).map(|i| format!("bench/pod{i}")).collect();
    let endpoints: Vec<EndpointView<'_>> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| EndpointView {
            slot: i as u32,
            host_index: i as u32,
            id: RStr::from(id.as_str()),
            address: RStr::from("127.0.0.1:8000"),
            role: RStr::from(""),
            metrics: EndpointMetrics::default(),
        })
        .collect();
    let prompts = [PromptTokens {
        tokens: RSlice::from_slice(&prompt),
    }];
    let item = ProduceItem {
        request: RequestView {
            id: RStr::from("r1"),
            model: RStr::from("m"),
            cache_salt: RStr::from(""),
            prompts: RSlice::from_slice(&prompts),
            max_output_tokens: -1,
            now_ms: 0,
            random_seed: 1,
            explain: false,
        },
        endpoints: RSlice::from_slice(&endpoints),
        attrs: AttrView::EMPTY,
        out_offset: 0,
    };
    let keys = harness.declarations().produces.len();
    let mut out = vec![AttrValue::Absent; keys * endpoints.len()];
    harness.instance().produce(&[item], &mut out).unwrap();
    let matched: u64 = out
        .iter()
        .filter_map(AttrValue::prefix_cache_match)
        .map(|m| m.match_blocks)
        .sum();
    assert!(matched > 0, "the index matches");
    let mut group = c.benchmark_group("kv_decision");
    group.bench_function("produce, 8k tokens x 64 endpoints", |b| {
        b.iter(|| {
            harness
                .instance()
                .produce(black_box(&[item]), &mut out)
                .unwrap()
        })
    });
    group.bench_function("hashing floor, 8k tokens in 16-token blocks", |b| {
        let mut out = Vec::with_capacity(PROMPT_TOKENS);
        b.iter(|| {
            out.clear();
            hash_prompt_into(0, black_box(&prompt), BLOCK as usize, usize::MAX, &mut out);
            black_box(out.len())
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = ingest, decision
}
criterion_main!(benches);
