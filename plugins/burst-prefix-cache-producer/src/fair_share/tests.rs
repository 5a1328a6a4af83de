//! Fair-share placement: balance within one request of the water-filled share, and at most
//! P + R − 1 (group, replica) placements, on the named shapes and on random ones.

use super::*;
use std::collections::BTreeSet;

struct Shape {
    /// Members per group; each group's requests share one hash list of `blocks[g]` blocks.
    groups: Vec<usize>,
    blocks: Vec<usize>,
    carried: Vec<u64>,
}

struct Outcome {
    per_replica: Vec<usize>,
    weight_per_replica: Vec<f64>,
    placements: usize,
    shares: Vec<f64>,
}

fn run(shape: &Shape, balance_by: BalanceBy) -> Outcome {
    let keys: Vec<Vec<u64>> = shape
        .groups
        .iter()
        .enumerate()
        .map(|(g, _)| {
            (0..shape.blocks[g] as u64)
                .map(|b| (g as u64) << 32 | b)
                .collect()
        })
        .collect();
    let mut entries: Vec<&[u64]> = Vec::new();
    let mut blocks = Vec::new();
    let mut group_of = Vec::new();
    for (g, &size) in shape.groups.iter().enumerate() {
        for _ in 0..size {
            entries.push(&keys[g]);
            blocks.push(shape.blocks[g]);
            group_of.push(g);
        }
    }
    let ids: Vec<String> = (0..shape.carried.len())
        .map(|r| format!("/r{r:02}"))
        .collect();
    let replicas: Vec<Replica<'_>> = ids
        .iter()
        .zip(&shape.carried)
        .map(|(id, &running)| Replica {
            id,
            running_requests: running,
        })
        .collect();
    let assigned = assign_fair_share(&entries, &blocks, &replicas, 0, balance_by);
    let mut per_replica = vec![0; replicas.len()];
    let mut weight_per_replica = vec![0.0; replicas.len()];
    let mut pairs = BTreeSet::new();
    for (i, target) in assigned.iter().enumerate() {
        let r = target.expect("every request with blocks is placed");
        per_replica[r] += 1;
        weight_per_replica[r] += match balance_by {
            BalanceBy::Requests => 1.0,
            BalanceBy::Tokens => blocks[i] as f64,
        };
        pairs.insert((group_of[i], r));
    }
    let total: f64 = weight_per_replica.iter().sum();
    let per_request = total / entries.len() as f64;
    let carried: Vec<f64> = shape
        .carried
        .iter()
        .map(|&c| c as f64 * per_request)
        .collect();
    Outcome {
        per_replica,
        weight_per_replica,
        placements: pairs.len(),
        shares: water_fill(&carried, total),
    }
}

fn uniform(p: usize, size: usize, replicas: usize) -> Shape {
    Shape {
        groups: vec![size; p],
        blocks: vec![8; p],
        carried: vec![0; replicas],
    }
}

/// Every replica within the allowance (10% of its share, or one request when larger) plus one
/// request of its share, and the placement bound.
fn assert_fair(shape: &Shape, balance_by: BalanceBy) -> Outcome {
    let outcome = run(shape, balance_by);
    let heaviest = match balance_by {
        BalanceBy::Requests => 1.0,
        BalanceBy::Tokens => *shape.blocks.iter().max().unwrap() as f64,
    };
    let requests: usize = shape.groups.iter().sum();
    let per_request = outcome.weight_per_replica.iter().sum::<f64>() / requests as f64;
    for (r, (&got, &share)) in outcome
        .weight_per_replica
        .iter()
        .zip(&outcome.shares)
        .enumerate()
    {
        let allowance = (ALLOWANCE * share).max(per_request);
        assert!(
            (got - share).abs() <= allowance + heaviest + 1e-9,
            "replica {r}: {got} against share {share} ({:?})",
            outcome.weight_per_replica
        );
    }
    let p = shape.groups.iter().filter(|&&s| s > 0).count();
    assert!(
        outcome.placements < p + shape.carried.len(),
        "{} placements for {p} groups over {} replicas, more than P + R - 1",
        outcome.placements,
        shape.carried.len()
    );
    outcome
}

#[test]
fn whole_groups_that_pack_evenly_are_never_split() {
    let outcome = assert_fair(&uniform(32, 16, 8), BalanceBy::Requests);
    assert_eq!(outcome.per_replica, vec![64; 8]);
    assert_eq!(outcome.placements, 32);
}

#[test]
fn skewed_bursts_fill_every_replica_evenly() {
    for (p, size, replicas) in [
        (2, 256, 8),
        (4, 128, 8),
        (3, 100, 8),
        (5, 100, 12),
        (4, 128, 6),
    ] {
        let outcome = assert_fair(&uniform(p, size, replicas), BalanceBy::Requests);
        let (min, max) = (
            outcome.per_replica.iter().min().unwrap(),
            outcome.per_replica.iter().max().unwrap(),
        );
        assert!(
            max - min <= 1,
            "{p}x{size} on {replicas}: {:?}",
            outcome.per_replica
        );
    }
}

#[test]
fn requests_that_share_nothing_are_spread_evenly() {
    let outcome = assert_fair(&uniform(256, 1, 8), BalanceBy::Requests);
    assert_eq!(outcome.per_replica, vec![32; 8]);
}

#[test]
fn load_already_carried_is_topped_up_first() {
    let shape = Shape {
        groups: vec![30],
        blocks: vec![4],
        carried: vec![10, 0, 0, 0],
    };
    let outcome = assert_fair(&shape, BalanceBy::Requests);
    assert_eq!(outcome.per_replica, vec![0, 10, 10, 10]);
}

#[test]
fn balancing_by_tokens_never_piles_overflow_onto_one_replica() {
    let shape = Shape {
        groups: vec![512],
        blocks: vec![16],
        carried: vec![0; 8],
    };
    let outcome = assert_fair(&shape, BalanceBy::Tokens);
    assert_eq!(outcome.per_replica, vec![64; 8]);
    let mixed = Shape {
        groups: vec![100, 60, 30, 5, 1],
        blocks: vec![4, 32, 8, 64, 2],
        carried: vec![0; 8],
    };
    let outcome = assert_fair(&mixed, BalanceBy::Tokens);
    let fair = outcome.weight_per_replica.iter().sum::<f64>() / 8.0;
    for &w in &outcome.weight_per_replica {
        assert!(w <= 1.1 * fair + 64.0, "{:?}", outcome.weight_per_replica);
    }
}

#[test]
fn random_shapes_stay_within_the_share_and_the_placement_bound() {
    let mut next = switchyard_plugin_api::testing::numbers(0x9e37_79b9_7f4a_7c15);
    for case in 0..500 {
        let p = 1 + next(40) as usize;
        let replicas = 1 + next(16) as usize;
        let shape = Shape {
            groups: (0..p).map(|_| 1 + next(64) as usize).collect(),
            blocks: (0..p).map(|_| 1 + next(32) as usize).collect(),
            carried: (0..replicas).map(|_| next(20)).collect(),
        };
        for balance_by in [BalanceBy::Requests, BalanceBy::Tokens] {
            let outcome = assert_fair(&shape, balance_by);
            let total: usize = outcome.per_replica.iter().sum();
            assert_eq!(total, shape.groups.iter().sum::<usize>(), "case {case}");
        }
    }
}

#[test]
fn requests_without_blocks_get_no_affinity() {
    let key = [1u64, 2];
    let entries: Vec<&[u64]> = vec![&key, &[], &key];
    let replicas = [Replica {
        id: "/a",
        running_requests: 0,
    }];
    let got = assign_fair_share(&entries, &[2, 0, 2], &replicas, 0, BalanceBy::Requests);
    assert_eq!(got, vec![Some(0), None, Some(0)]);
    assert_eq!(
        assign_fair_share(&entries, &[2, 0, 2], &[], 0, BalanceBy::Requests),
        vec![None; 3]
    );
}

#[test]
fn lists_that_end_alike_are_still_told_apart() {
    // Same length and last hash, different lists: two groups, each kept together.
    let (a, b): (&[u64], &[u64]) = (&[1, 5], &[2, 5]);
    let entries = [a, b, a, b, a];
    assert_eq!(lay_out(&entries, &[2; 5], 0), [0, 2, 4, 1, 3]);
}
