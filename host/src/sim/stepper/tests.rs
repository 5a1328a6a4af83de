//! The step engine pinned to cases worked out by hand, step by step.

use super::*;

/// `job(store, request, prompt, output, chain, prompt_blocks)`: a job whose chain (its first
/// `prompt_blocks` blocks the prompt's, the rest the known output blocks) is appended to
/// `store`.
use crate::sim::replica::job_in as job;

/// 1 ms per step, 0.25 ms per prefill token, 0.5 ms per decoding sequence, no context cost;
/// 64 tokens and 4 sequences per step, 16-token blocks.
fn params(kv_blocks: usize) -> EngineParams {
    EngineParams::round_numbers(kv_blocks)
}

/// Runs `arrivals` (time, job) on one replica and returns every step event with its time.
fn drive(
    replica: &mut StepReplica,
    store: &[u64],
    mut arrivals: Vec<(f64, Job)>,
) -> Vec<(f64, StepEvent)> {
    arrivals.reverse();
    let mut due: Option<f64> = None;
    let mut seen = Vec::new();
    let mut out = Vec::new();
    loop {
        let take_arrival = match (arrivals.last(), due) {
            (None, None) => break,
            (Some(a), Some(d)) => a.0 <= d,
            (Some(_), None) => true,
            (None, Some(_)) => false,
        };
        if take_arrival {
            let (at, job) = arrivals.pop().unwrap();
            if let Some(end) = replica.dispatch(at, job) {
                due = Some(end);
            }
        } else if let Some(d) = due {
            due = replica.finish_step(d, store, &mut out);
            seen.extend(out.drain(..).map(|e| (d, e)));
        }
    }
    replica.check_drained().unwrap();
    seen
}

fn first_token(request: usize, cached: u32, computed: u32, scheduled_at: f64) -> StepEvent {
    StepEvent::FirstToken {
        request,
        cached_tokens: cached,
        computed_tokens: computed,
        scheduled_at,
        full_hit: cached >= (cached + computed - 1) / 16 * 16,
    }
}

#[test]
fn a_long_prompt_is_prefilled_in_chunks_then_decoded_one_token_per_step() {
    let mut store = Vec::new();
    let j = job(&mut store, 0, 100, 3, &[1, 2, 3, 4, 5, 6], 6);
    let mut r = StepReplica::new(&params(100), 16);
    let events = drive(&mut r, &store, vec![(0.0, j)]);
    // Step 1: 64 prompt tokens, 1 + 64 × 0.25 = 17 ms. Step 2: the other 36, 10 ms; the
    // first token is out at 27. Steps 3 and 4: one decode each, 1.5 ms.
    assert_eq!(
        events,
        vec![
            (27.0, first_token(0, 0, 100, 0.0)),
            (30.0, StepEvent::Done { request: 0 }),
        ]
    );
    assert_eq!(r.totals().steps, 4);
    assert_eq!(r.totals().step_tokens, 100 + 2);
    assert_eq!(r.stats().busy_ms, 30.0);
    assert_eq!(r.pool().in_use(), 0);
    // The six full prompt blocks stay cached.
    assert_eq!(r.pool().cached_blocks(), 6);
}

#[test]
fn the_context_read_adds_to_every_step() {
    let mut store = Vec::new();
    let j = job(&mut store, 0, 100, 3, &[1, 2, 3, 4, 5, 6], 6);
    let p = EngineParams {
        context_ms_per_kilo_token: 250.0,
        ..params(100)
    };
    let mut r = StepReplica::new(&p, 16);
    let events = drive(&mut r, &store, vec![(0.0, j)]);
    // Context read per step: 64, 100, 101, 102 tokens at 0.25 ms each.
    // 17 + 16 = 33; + 10 + 25 = 68; + 1.5 + 25.25 = 94.75; + 1.5 + 25.5 = 121.75.
    assert_eq!(events[0].0, 68.0);
    assert_eq!(events[1], (121.75, StepEvent::Done { request: 0 }));
}

#[test]
fn a_prefill_chunk_slows_the_decode_beside_it() {
    let mut store = Vec::new();
    let a = job(&mut store, 0, 32, 4, &[1, 2], 2);
    let b = job(&mut store, 1, 64, 2, &[11, 12, 13, 14], 4);
    let mut r = StepReplica::new(&params(100), 16);
    let events = drive(&mut r, &store, vec![(0.0, a), (5.0, b)]);
    // Step 1 (0..9): A's 32 prompt tokens. B arrives at 5 and waits for the step to end.
    // Step 2 (9..26.25): A decodes (0.5) beside 63 of B's tokens (the budget left): 17.25 ms.
    // Step 3 (26.25..28): A decodes, B's last prompt token: 1.75 ms; B's first token.
    // Step 4 (28..30): both decode: 2 ms; A's 4th and B's 2nd token end them.
    assert_eq!(
        events,
        vec![
            (9.0, first_token(0, 0, 32, 0.0)),
            (28.0, first_token(1, 0, 64, 9.0)),
            (30.0, StepEvent::Done { request: 0 }),
            (30.0, StepEvent::Done { request: 1 }),
        ]
    );
    assert_eq!(r.totals().steps, 4);
    // Time-averaged batch: 9 × 1 + 17.25 × 2 + 1.75 × 2 + 2 × 2.
    assert_eq!(r.stats().batch_seq_ms, 9.0 + 34.5 + 3.5 + 4.0);
}

#[test]
fn a_prefix_hit_finds_the_blocks_still_in_the_pool() {
    let mut store = Vec::new();
    let chain = [7, 8, 9];
    let x = job(&mut store, 0, 48, 1, &chain, 3);
    let early = job(&mut store, 1, 48, 1, &chain, 3);
    let late = job(&mut store, 2, 48, 1, &chain, 3);
    let mut r = StepReplica::new(&params(100), 16);
    let events = drive(&mut r, &store, vec![(0.0, x), (5.0, early), (40.0, late)]);
    // X computes 48 tokens (0..13). The copy arriving at 5 waits for X's step to end; at 13
    // it hits 2 of 3 blocks (the last token is always computed, so never the whole prompt)
    // and computes 16 tokens (13..18). The one arriving at 40 hits the same 32 tokens
    // (40..45): X's blocks are free by then, but still cached.
    assert_eq!(
        events,
        vec![
            (13.0, first_token(0, 0, 48, 0.0)),
            (13.0, StepEvent::Done { request: 0 }),
            (18.0, first_token(1, 32, 16, 13.0)),
            (18.0, StepEvent::Done { request: 1 }),
            (45.0, first_token(2, 32, 16, 40.0)),
            (45.0, StepEvent::Done { request: 2 }),
        ]
    );
    assert_eq!(r.stats().cached_tokens, 64);
    assert_eq!(r.stats().prefill_tokens_computed, 80);
}

#[test]
fn identical_requests_scheduled_in_one_step_share_the_prefill() {
    let mut store = Vec::new();
    let chain = [7, 8, 9];
    let a = job(&mut store, 0, 48, 1, &chain, 3);
    let b = job(&mut store, 1, 48, 1, &chain, 3);
    let p = EngineParams {
        max_num_batched_tokens: 128,
        ..params(100)
    };
    let mut r = StepReplica::new(&p, 16);
    let events = drive(&mut r, &store, vec![(0.0, a), (0.0, b)]);
    // Both arrive before the first step. A's blocks are registered when scheduled, so B,
    // scheduled after it in the same step, hits two of them and computes 16 tokens: one step
    // of 64 prompt tokens, 1 + 16 = 17 ms.
    assert_eq!(events[0], (17.0, first_token(0, 0, 48, 0.0)));
    assert_eq!(events[2], (17.0, first_token(1, 32, 16, 0.0)));
    assert_eq!(r.stats().prefill_tokens_computed, 64);
    // B's own third block holds the same content as A's; it is not registered twice.
    assert_eq!(r.pool().cached_blocks(), 3);
}

#[test]
fn output_blocks_are_cached_for_the_next_turn() {
    let mut store = Vec::new();
    // Turn 1: 32 prompt tokens (2 blocks) and 17 output tokens, of which the first 16 fill
    // a third block whose content the next turn repeats.
    let turn1 = job(&mut store, 0, 32, 17, &[1, 2, 3], 2);
    let turn2 = job(&mut store, 1, 64, 1, &[1, 2, 3, 4], 4);
    let mut r = StepReplica::new(&params(100), 16);
    let events = drive(&mut r, &store, vec![(0.0, turn1), (100.0, turn2)]);
    // Turn 1: 9 ms prefill, 16 decodes of 1.5 ms: done at 33. Its KV covers 32 + 16 tokens.
    assert_eq!(events[1], (33.0, StepEvent::Done { request: 0 }));
    // Turn 2 hits all three (limit (64 − 1) / 16 = 3 blocks) and computes 16: 1 + 4 = 5 ms.
    assert_eq!(events[2], (105.0, first_token(1, 48, 16, 100.0)));
}

#[test]
fn a_sequence_short_of_blocks_preempts_the_newest_and_it_is_recomputed() {
    let mut store = Vec::new();
    let a = job(&mut store, 0, 16, 20, &[1], 1);
    let b = job(&mut store, 1, 16, 2, &[2], 1);
    let mut r = StepReplica::new(&params(3), 16);
    let events = drive(&mut r, &store, vec![(0.0, a), (0.0, b)]);
    // Step 1 (0..9): both prompts, one block each; both first tokens.
    // Step 2: A takes the last free block for its 17th token; B, the newest, cannot and is
    // preempted (its prompt block stays cached). A decodes alone (9..10.5).
    // B cannot come back while only its cached block is free (it needs that one and one
    // more). A's 33rd token takes that block (an eviction); A ends at 10.5 + 18 × 1.5 = 37.5.
    // B is then recomputed from nothing, 17 tokens (1 + 4.25 ms), and emits its 2nd token.
    assert_eq!(
        events,
        vec![
            (9.0, first_token(0, 0, 16, 0.0)),
            (9.0, first_token(1, 0, 16, 0.0)),
            (37.5, StepEvent::Done { request: 0 }),
            (42.75, StepEvent::Done { request: 1 }),
        ]
    );
    assert_eq!(r.stats().preemptions, 1);
    assert_eq!(r.stats().evictions, 1);
    assert_eq!(r.stats().recomputed_tokens, 17);
    assert_eq!(r.totals().peak_blocks, 3);
}

#[test]
fn the_sequence_limit_holds_requests_back() {
    let mut store = Vec::new();
    let p = EngineParams {
        max_num_seqs: 1,
        ..params(100)
    };
    let a = job(&mut store, 0, 16, 2, &[1], 1);
    let b = job(&mut store, 1, 16, 1, &[2], 1);
    let mut r = StepReplica::new(&p, 16);
    let events = drive(&mut r, &store, vec![(0.0, a), (0.0, b)]);
    // A: prefill 0..5, decode 5..6.5. B only then: 6.5..11.5.
    assert_eq!(events[2], (11.5, first_token(1, 0, 16, 6.5)));
}

#[test]
fn a_request_larger_than_the_pool_does_not_fit() {
    let r = StepReplica::new(&params(2), 16);
    let fits = |prompt, output| {
        r.fits(&Job {
            request: 0,
            prompt_tokens: prompt,
            output_tokens: output,
            blocks: 0..0,
            chain_end: 0,
        })
    };
    assert!(fits(16, 16));
    assert!(!fits(16, 17));
}
