//! The host's share of KV-event ingest, per message: reading a published msgpack batch (a
//! request's 32 stored blocks of 16 tokens, in either event shape) into events, and encoding
//! them as the JSON batch handed to plugins. The plugin's share (reading that JSON and
//! updating its index) is `plugins/kv-event-prefix-cache-producer/benches/ingest.rs`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use switchyard::fleet::kv_events::decode_payload;
use switchyard::mock_replica::kv_publish::{encode_batch, Shape};
use switchyard_plugin_api::kv::{KvEvent, KvEventBatch, StoredBlocks};

const BLOCK: u32 = 16;
const CHAIN: usize = 32;

fn decode(c: &mut Criterion) {
    let stored = KvEvent::BlockStored(StoredBlocks {
        block_hashes: (0..CHAIN as u64).map(|i| u64::MAX - i * 7919).collect(),
        parent_block_hash: Some(42),
        token_ids: (0..CHAIN as u32 * BLOCK)
            .map(|t| t.wrapping_mul(2_654_435_761) % 151_000)
            .collect(),
        block_size: BLOCK,
        ..StoredBlocks::default()
    });
    let mut group = c.benchmark_group("kv_host");
    group.throughput(Throughput::Elements(CHAIN as u64));
    for (name, shape) in [("array", Shape::Array), ("map", Shape::Map)] {
        let payload = encode_batch(std::slice::from_ref(&stored), shape);
        group.bench_function(format!("msgpack to events, 32 blocks, {name} shape"), |b| {
            b.iter(|| decode_payload(black_box(&payload)).unwrap())
        });
    }
    let payload = encode_batch(std::slice::from_ref(&stored), Shape::Map);
    group.bench_function("msgpack to plugin JSON, 32 blocks", |b| {
        b.iter(|| {
            let events = decode_payload(black_box(&payload)).unwrap();
            let batch = KvEventBatch {
                host_index: 3,
                endpoint: "bench/pod3".into(),
                now_ms: 0,
                events,
            };
            serde_json::to_string(&batch).unwrap()
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = decode
}
criterion_main!(benches);
