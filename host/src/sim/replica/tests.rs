use super::*;

/// 16-token blocks, 16000 prefill tokens/s (1/16 ms per token), 50 decode tokens/s (20 ms).
fn fleet(max_running: u32) -> FleetConfig {
    FleetConfig {
        replicas: 1,
        block_size_tokens: 16,
        cache_capacity_blocks: 1000,
        prefill_tokens_per_second: 16_000.0,
        decode_tokens_per_second: 50.0,
        max_running_sequences: max_running,
    }
}

/// Appends a chain to `store` and returns the job over it.
fn job(store: &mut Vec<u64>, request: usize, prompt: u32, output: u32, chain: &[u64]) -> Job {
    job_in(store, request, prompt, output, chain, chain.len())
}

fn chain(range: std::ops::Range<u64>) -> Vec<u64> {
    range.collect()
}

#[test]
fn prefill_time_is_uncached_tokens_over_rate() {
    let mut store = Vec::new();
    let j = job(&mut store, 0, 1600, 11, &chain(1..101));
    let mut r = Replica::new(&fleet(64));
    let start = r.dispatch(0.0, j, &store).unwrap();
    assert_eq!(
        start,
        PrefillStart {
            request: 0,
            cached_tokens: 0,
            computed_tokens: 1600,
            done_at: 100.0
        }
    );
    let (end, next) = r.finish_prefill(100.0, &store);
    // 10 more tokens after the first, 20 ms each.
    assert_eq!(
        end,
        Some(PrefillEnd {
            request: 0,
            done_at: 300.0
        })
    );
    assert_eq!(next, None);
}

#[test]
fn cached_prefix_is_not_prefilled_again() {
    let mut store = Vec::new();
    let first = job(&mut store, 0, 1600, 1, &chain(1..101));
    let mut half: Vec<u64> = chain(1..51);
    half.extend(1001..1051);
    let shares_half = job(&mut store, 1, 1600, 1, &half);
    let same = job(&mut store, 2, 1600, 1, &chain(1..101));
    // Same 100 blocks plus an 8-token partial block, which is never cached.
    let with_tail = job(&mut store, 3, 1608, 1, &chain(1..101));

    let mut r = Replica::new(&fleet(64));
    r.dispatch(0.0, first.clone(), &store).unwrap();
    r.finish_prefill(100.0, &store);
    r.complete(100.0, &first, &store);

    let s = r.dispatch(100.0, shares_half.clone(), &store).unwrap();
    assert_eq!(
        (s.cached_tokens, s.computed_tokens, s.done_at),
        (800, 800, 150.0)
    );
    r.finish_prefill(150.0, &store);
    r.complete(150.0, &shares_half, &store);

    let s = r.dispatch(150.0, same.clone(), &store).unwrap();
    assert_eq!(
        (s.cached_tokens, s.computed_tokens, s.done_at),
        (1600, 0, 150.0)
    );
    r.finish_prefill(150.0, &store);
    r.complete(150.0, &same, &store);

    let s = r.dispatch(200.0, with_tail, &store).unwrap();
    assert_eq!(
        (s.cached_tokens, s.computed_tokens, s.done_at),
        (1600, 8, 200.5)
    );

    assert_eq!(r.stats().prefill_tokens_computed, 1600 + 800 + 8);
    assert_eq!(r.stats().cached_tokens, 800 + 1600 + 1600);
    assert_eq!(r.stats().served, 4);
}

#[test]
fn continuous_batching_queues_when_full() {
    let mut store = Vec::new();
    let a = job(&mut store, 0, 1600, 6, &chain(1..101));
    let b = job(&mut store, 1, 1600, 1, &chain(201..301));
    let c = job(&mut store, 2, 1600, 1, &chain(301..401));
    let mut r = Replica::new(&fleet(2));

    assert_eq!(
        r.dispatch(0.0, a.clone(), &store).map(|s| s.done_at),
        Some(100.0)
    );
    // The prefill engine is busy: b is admitted but not started.
    assert_eq!(r.dispatch(0.0, b.clone(), &store), None);
    // Both slots taken: c waits for one.
    assert_eq!(r.dispatch(0.0, c.clone(), &store), None);
    let s = r.state();
    assert_eq!((s.running, s.waiting, s.in_flight_tokens), (2, 1, 4800));
    assert_eq!(r.load(), 3);

    // a's prefill ends; b's starts and queues behind it.
    let (end, next) = r.finish_prefill(100.0, &store);
    assert_eq!(end.map(|e| e.done_at), Some(200.0));
    assert_eq!(next.map(|s| (s.request, s.done_at)), Some((1, 200.0)));

    // b finishes at 200 (one output token): c takes its slot and starts at once.
    let (end, next) = r.finish_prefill(200.0, &store);
    assert_eq!(end.map(|e| (e.request, e.done_at)), Some((1, 200.0)));
    assert_eq!(next, None);
    let started = r.complete(200.0, &b, &store);
    assert_eq!(started.map(|s| (s.request, s.done_at)), Some((2, 300.0)));
    let s = r.state();
    assert_eq!((s.running, s.waiting, s.in_flight_tokens), (2, 0, 3200));

    r.complete(200.0, &a, &store);
    r.finish_prefill(300.0, &store);
    r.complete(300.0, &c, &store);
    let s = r.state();
    assert_eq!((s.running, s.waiting, s.in_flight_tokens), (0, 0, 0));
    assert_eq!(s.kv_usage, 0.0);
    assert_eq!(r.stats().peak_load, 3);
    assert_eq!(
        r.stats().load_points,
        vec![(0.0, 3), (200.0, 1), (300.0, 0)]
    );
}

#[test]
fn kv_usage_counts_admitted_blocks() {
    let mut store = Vec::new();
    // (1600 + 10) tokens → 101 blocks of 16 out of 1000.
    let a = job(&mut store, 0, 1600, 10, &chain(1..101));
    let mut r = Replica::new(&fleet(64));
    r.dispatch(0.0, a, &store);
    assert_eq!(r.state().kv_usage, 0.101);
}

#[test]
fn finishing_without_a_prefill_is_a_no_op() {
    let mut r = Replica::new(&fleet(1));
    assert_eq!(r.finish_prefill(5.0, &Vec::new()), (None, None));
}

#[test]
fn cancel_withdraws_a_request_wherever_it_is() {
    let mut store = Vec::new();
    let a = job(&mut store, 0, 1600, 6, &chain(1..101));
    let b = job(&mut store, 1, 1600, 6, &chain(201..301));
    let c = job(&mut store, 2, 1600, 6, &chain(301..401));
    let d = job(&mut store, 3, 1600, 6, &chain(401..501));
    let mut r = Replica::new(&fleet(2));
    r.dispatch(0.0, a.clone(), &store);
    r.dispatch(0.0, b.clone(), &store);
    r.dispatch(0.0, c.clone(), &store);
    r.dispatch(0.0, d.clone(), &store);
    // a prefills, b is admitted behind it, c and d wait.
    assert_eq!(r.cancel(10.0, &d, &store), None);
    assert_eq!((r.state().running, r.state().waiting), (2, 1));

    // Cancelling b (admitted, prefill queued) admits c; a's prefill keeps running.
    assert_eq!(r.cancel(20.0, &b, &store), None);
    assert_eq!((r.state().running, r.state().waiting), (2, 0));
    assert_eq!(r.prefilling(), Some(0));

    // Cancelling the running prefill starts c's at once and caches nothing of a.
    let started = r.cancel(30.0, &a, &store).expect("c starts");
    assert_eq!((started.request, started.done_at), (2, 130.0));
    assert_eq!(r.prefilling(), Some(2));
    assert_eq!(r.state().running, 1);

    // Cancelling a decoding request frees its slot like a completion.
    let (end, next) = r.finish_prefill(130.0, &store);
    assert_eq!((end.map(|e| e.request), next), (Some(2), None));
    assert_eq!(r.cancel(140.0, &c, &store), None);
    let s = r.state();
    assert_eq!((s.running, s.waiting, s.in_flight_tokens), (0, 0, 0));
    assert_eq!(s.kv_usage, 0.0);

    let again = job(&mut store, 4, 1600, 1, &chain(1..101));
    let s = r.dispatch(150.0, again, &store).unwrap();
    assert_eq!(s.cached_tokens, 0, "an abandoned prefill caches nothing");
}

#[test]
fn without_load_history_keeps_the_peak_only() {
    let mut store = Vec::new();
    let a = job(&mut store, 0, 16, 1, &chain(1..2));
    let mut r = Replica::new(&fleet(4)).without_load_history();
    r.dispatch(0.0, a.clone(), &store);
    r.finish_prefill(1.0, &store);
    r.complete(1.0, &a, &store);
    assert_eq!(r.stats().peak_load, 1);
    assert!(r.stats().load_points.is_empty());
}
