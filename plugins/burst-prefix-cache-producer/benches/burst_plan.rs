//! The burst plan over a whole step: 12 unequal prompt groups (512 requests) over 8 replicas in
//! 16 windows of 32 requests, after a step like it, as `groupMemoryMs` places a burst that a
//! client spread over many windows. One iteration places the second step's 16 windows.

use std::hint::black_box;
use std::time::Duration;

use burst_prefix_cache_producer::assign::Replica;
use burst_prefix_cache_producer::burst_plan::{BurstPlan, GroupKey, WindowGroup};
use criterion::{criterion_group, criterion_main, Criterion};

const SIZES: [usize; 12] = [96, 8, 64, 24, 80, 16, 56, 32, 48, 40, 36, 12];
const WINDOW: usize = 32;

/// The groups of one step in a fixed shuffled order.
fn arrivals(seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = SIZES
        .iter()
        .enumerate()
        .flat_map(|(g, &n)| std::iter::repeat_n(g, n))
        .collect();
    let mut state = seed;
    for i in (1..order.len()).rev() {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        order.swap(i, (state >> 33) as usize % (i + 1));
    }
    order
}

/// Places one step through `plan`, window by window, from `from_ms`, group keys by `step`.
fn place_step(plan: &mut BurstPlan, ids: &[String], step: u64, from_ms: u64) {
    let order = arrivals(step);
    let mut load = vec![0u64; ids.len()];
    for (w, window) in order.chunks(WINDOW).enumerate() {
        let mut positions: Vec<Vec<usize>> = vec![Vec::new(); SIZES.len()];
        for (p, &g) in window.iter().enumerate() {
            positions[g].push(p);
        }
        let groups: Vec<WindowGroup<'_>> = positions
            .iter()
            .enumerate()
            .map(|(g, positions)| WindowGroup {
                key: GroupKey {
                    blocks: 4,
                    digest: step << 32 | g as u64,
                },
                positions,
                weight: 1.0,
                cached_on: &[],
            })
            .collect();
        let fleet: Vec<Replica<'_>> = ids
            .iter()
            .zip(&load)
            .map(|(id, &running_requests)| Replica {
                id,
                running_requests,
            })
            .collect();
        let placed = plan.place(from_ms + 3 * w as u64, &groups, &fleet);
        for targets in placed {
            for r in targets {
                load[r] += 1;
            }
        }
    }
}

fn bench(c: &mut Criterion) {
    let ids: Vec<String> = (0..8).map(|r| format!("bench/pod{r}")).collect();
    let mut group = c.benchmark_group("burst_plan");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("second_step_512_requests_16_windows/8_replicas", |b| {
        b.iter_batched(
            || {
                let mut plan = BurstPlan::new(2000, 100);
                place_step(&mut plan, &ids, 1, 0);
                plan
            },
            |mut plan| {
                place_step(black_box(&mut plan), &ids, 2, 1000);
                plan
            },
            criterion::BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
