//! Chained block hashing of one 8k-token prompt in 64-token blocks.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use switchyard_prefix_hashing::{block_hashes, hash_prompt_into, prompt_seed};
use xxhash_rust::xxh64::xxh64;

const TOKENS: usize = 8 * 1024;
const BLOCK: usize = 64;

fn hash(c: &mut Criterion) {
    let tokens: Vec<u32> = (0..TOKENS as u32)
        .map(|t| t.wrapping_mul(2_654_435_761))
        .collect();
    let seed = prompt_seed("bench-model", "");
    let mut group = c.benchmark_group("hash/8k_tokens_64_block");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    let mut out = Vec::with_capacity(TOKENS / BLOCK);
    group.bench_function("hash_prompt_into", |b| {
        b.iter(|| {
            out.clear();
            let n = hash_prompt_into(
                black_box(seed),
                black_box(&tokens),
                BLOCK,
                usize::MAX,
                &mut out,
            );
            black_box(&out);
            n
        })
    });
    let prompts: [&[u32]; 1] = [&tokens];
    group.bench_function("block_hashes", |b| {
        b.iter(|| {
            block_hashes(
                black_box("bench-model"),
                "",
                black_box(&prompts),
                BLOCK,
                usize::MAX,
            )
        })
    });
    // This machine's floor for the same bytes: one XXH64 pass over the prompt, no chaining.
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    group.bench_function("xxh64_one_pass_floor", |b| {
        b.iter(|| xxh64(black_box(&bytes), 0))
    });
    group.finish();
}

criterion_group!(benches, hash);
criterion_main!(benches);
