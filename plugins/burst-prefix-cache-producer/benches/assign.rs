//! Joint placement of one sealed batch: `prompts × 16` samples of 8k-token prompts (128 blocks
//! of 64 tokens each) over 8 and 64 replicas, with the default parameters, by the reference's
//! placement and by fair share.

use std::hint::black_box;
use std::time::Duration;

use burst_prefix_cache_producer::assign::{assign, Replica};
use burst_prefix_cache_producer::config::BalanceBy;
use burst_prefix_cache_producer::fair_share::assign_fair_share;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

const SAMPLES: usize = 16;
const BLOCKS: usize = 128;

/// Block hashes of prompt `p`: distinct for every prompt.
fn hashes(p: usize) -> Vec<u64> {
    (0..BLOCKS as u64)
        .map(|b| {
            (p as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ b.wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("assign");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    for prompts in [32usize, 128] {
        let lists: Vec<Vec<u64>> = (0..prompts).map(hashes).collect();
        // Samples of one prompt arrive interleaved with the others, as a rollout step does.
        let entries: Vec<&[u64]> = (0..prompts * SAMPLES)
            .map(|i| lists[i % prompts].as_slice())
            .collect();
        for replicas in [8usize, 64] {
            let ids: Vec<String> = (0..replicas).map(|r| format!("bench/pod{r}")).collect();
            let fleet: Vec<Replica<'_>> = ids
                .iter()
                .enumerate()
                .map(|(r, id)| Replica {
                    id,
                    running_requests: (r % 5) as u64,
                })
                .collect();
            for (label, balance_by) in [
                ("requests", BalanceBy::Requests),
                ("tokens", BalanceBy::Tokens),
            ] {
                let id = BenchmarkId::new(
                    format!("{}_requests/{label}", entries.len()),
                    format!("{replicas}_replicas"),
                );
                group.bench_function(id, |b| {
                    b.iter(|| assign(black_box(&entries), black_box(&fleet), None, 0, balance_by))
                });
                let blocks = vec![BLOCKS; entries.len()];
                let id = BenchmarkId::new(
                    format!("{}_requests/fair_share_{label}", entries.len()),
                    format!("{replicas}_replicas"),
                );
                group.bench_function(id, |b| {
                    b.iter(|| {
                        assign_fair_share(
                            black_box(&entries),
                            black_box(&blocks),
                            black_box(&fleet),
                            0,
                            balance_by,
                        )
                    })
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
