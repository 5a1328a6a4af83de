//! Cases A1–A16 of the reference catalogue, asserting the exact derived placement.

use super::*;

const IDS: [&str; 4] = ["/pod1", "/pod2", "/pod3", "/pod4"];

fn replicas(n: usize) -> Vec<Replica<'static>> {
    IDS[..n]
        .iter()
        .map(|&id| Replica {
            id,
            running_requests: 0,
        })
        .collect()
}

/// Entries for `(count, hashes)` groups, in the listed order.
fn entries<'a>(groups: &[(usize, &'a [u64])]) -> Vec<&'a [u64]> {
    groups
        .iter()
        .flat_map(|&(count, hashes)| std::iter::repeat_n(hashes, count))
        .collect()
}

/// Runs the assignment and names each entry's replica (`"-"` for no affinity).
fn placed(
    groups: &[(usize, &[u64])],
    replica_count: usize,
    k: Option<usize>,
    m: usize,
    balance_by: BalanceBy,
) -> Vec<&'static str> {
    let reps = replicas(replica_count);
    assign(&entries(groups), &reps, k, m, balance_by)
        .into_iter()
        .map(|r| r.map_or("-", |r| reps[r].id))
        .collect()
}

fn repeat(id: &'static str, n: usize) -> Vec<&'static str> {
    vec![id; n]
}

fn concat(parts: &[Vec<&'static str>]) -> Vec<&'static str> {
    parts.concat()
}

use BalanceBy::{Requests, Tokens};

#[test]
fn a1_unlimited_colocates_whole_group() {
    assert_eq!(
        placed(&[(8, &[1, 2, 3])], 4, None, 0, Requests),
        repeat("/pod1", 8)
    );
}

#[test]
fn a2_cap_spreads_evenly() {
    assert_eq!(
        placed(&[(8, &[1, 2, 3])], 4, Some(2), 0, Requests),
        ["/pod1", "/pod1", "/pod2", "/pod2", "/pod3", "/pod3", "/pod4", "/pod4"]
    );
}

#[test]
fn a3_cap_fills_before_spilling() {
    assert_eq!(
        placed(&[(8, &[1, 2, 3])], 4, Some(4), 0, Requests),
        concat(&[repeat("/pod1", 4), repeat("/pod2", 4)])
    );
}

#[test]
fn a4_singleton_gets_no_affinity() {
    assert_eq!(placed(&[(1, &[1, 2, 3])], 2, None, 0, Requests), ["-"]);
}

#[test]
fn a5_empty_prefix_gets_no_affinity() {
    assert_eq!(placed(&[(2, &[])], 2, None, 0, Requests), ["-", "-"]);
}

#[test]
fn a6_distinct_groups_spread_across_replicas() {
    assert_eq!(
        placed(&[(8, &[1, 2, 3]), (8, &[9, 9, 9])], 4, None, 0, Requests),
        concat(&[repeat("/pod1", 8), repeat("/pod2", 8)])
    );
}

const X1: &[u64] = &[1, 2, 3];
const X2: &[u64] = &[1, 2, 4];
const Y1: &[u64] = &[7, 8, 5];
const Y2: &[u64] = &[7, 8, 6];

#[test]
fn a7_shared_prefix_families_colocate_within_fair_share() {
    assert_eq!(
        placed(&[(2, X1), (2, X2), (2, Y1), (2, Y2)], 2, None, 2, Requests),
        concat(&[repeat("/pod1", 4), repeat("/pod2", 4)])
    );
}

#[test]
fn a8_fair_share_spreads_prefix_sharing_groups() {
    let groups: [(usize, &[u64]); 4] = [
        (2, &[1, 2, 3]),
        (2, &[1, 2, 4]),
        (2, &[1, 2, 5]),
        (2, &[1, 2, 6]),
    ];
    assert_eq!(
        placed(&groups, 4, None, 2, Requests),
        ["/pod1", "/pod1", "/pod2", "/pod2", "/pod3", "/pod3", "/pod4", "/pod4"]
    );
}

#[test]
fn a9_singleton_attaches_to_overlapping_group() {
    let groups: [(usize, &[u64]); 4] = [
        (2, &[1, 2, 3]),
        (1, &[1, 2, 8]),
        (2, &[7, 8, 5]),
        (1, &[7, 8, 9]),
    ];
    assert_eq!(
        placed(&groups, 2, None, 2, Requests),
        ["/pod1", "/pod1", "/pod1", "/pod2", "/pod2", "/pod2"]
    );
}

#[test]
fn a10_lone_singleton_gets_no_affinity() {
    assert_eq!(
        placed(&[(2, &[1, 2, 3]), (1, &[5, 5, 5])], 2, None, 2, Requests),
        ["/pod1", "/pod1", "-"]
    );
}

#[test]
fn a11_overlapping_singletons_colocate_without_groups() {
    let groups: [(usize, &[u64]); 4] = [
        (1, &[1, 2, 3]),
        (1, &[1, 2, 4]),
        (1, &[1, 2, 5]),
        (1, &[1, 2, 6]),
    ];
    assert_eq!(
        placed(&groups, 2, None, 2, Requests),
        ["/pod1", "/pod1", "/pod2", "/pod2"]
    );
}

#[test]
fn a12_shared_prefix_below_threshold_does_not_colocate() {
    assert_eq!(
        placed(&[(2, X1), (2, X2), (2, Y1), (2, Y2)], 2, None, 3, Requests),
        ["/pod1", "/pod1", "/pod2", "/pod2", "/pod1", "/pod1", "/pod2", "/pod2"]
    );
}

#[test]
fn a13_single_replica_places_everything() {
    assert_eq!(
        placed(&[(4, &[1, 2, 3]), (4, &[9, 9, 9])], 1, None, 2, Requests),
        repeat("/pod1", 8)
    );
}

const LONG: &[u64] = &[1, 2, 3, 4];
const SHORT1: &[u64] = &[5];
const SHORT2: &[u64] = &[6];

#[test]
fn a14a_balance_by_requests() {
    assert_eq!(
        placed(&[(2, LONG), (2, SHORT1), (2, SHORT2)], 2, None, 0, Requests),
        ["/pod1", "/pod1", "/pod2", "/pod2", "/pod1", "/pod1"]
    );
}

#[test]
fn a14b_balance_by_tokens_spreads_large_prefix() {
    assert_eq!(
        placed(&[(2, LONG), (2, SHORT1), (2, SHORT2)], 2, None, 0, Tokens),
        ["/pod1", "/pod1", "/pod2", "/pod2", "/pod2", "/pod2"]
    );
}

const A1: &[u64] = &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
const A2: &[u64] = &[1, 2, 3, 4, 5, 6, 7, 8, 9, 11];
const A3: &[u64] = &[1, 2, 3, 4, 5, 6, 7, 8, 9, 12];

#[test]
fn a15_balance_by_tokens_discounts_shared_prefix() {
    // Loads on pod1: 10, then 1 and 1 for the unmatched last blocks; fair share 15.
    assert_eq!(
        placed(&[(2, A1), (2, A2), (2, A3)], 2, None, 9, Tokens),
        repeat("/pod1", 6)
    );
}

#[test]
fn a15_contrast_balance_by_requests_spills_third_family() {
    // Fair share is 3 requests; pod1 holds 4 after a1 and a2, so a3 goes to pod2.
    assert_eq!(
        placed(&[(2, A1), (2, A2), (2, A3)], 2, None, 9, Requests),
        concat(&[repeat("/pod1", 4), repeat("/pod2", 2)])
    );
}

#[test]
fn a16_overflow_guard_balances_beyond_cap() {
    assert_eq!(
        placed(&[(8, &[1, 2, 3])], 2, Some(2), 0, Requests),
        ["/pod1", "/pod1", "/pod2", "/pod2", "/pod1", "/pod2", "/pod1", "/pod2"]
    );
}

#[test]
fn entries_without_blocks_are_never_assigned() {
    let groups: [(usize, &[u64]); 3] = [(1, &[]), (3, &[1, 2]), (2, &[])];
    assert_eq!(
        placed(&groups, 2, None, 1, Requests),
        ["-", "/pod1", "/pod1", "/pod1", "-", "-"]
    );
}

#[test]
fn no_replicas_means_no_affinity() {
    let batch = entries(&[(4, &[1, 2, 3])]);
    assert_eq!(
        assign(&batch, &[], None, 0, Requests),
        [None, None, None, None]
    );
    assert!(assign(&[], &replicas(2), None, 0, Requests).is_empty());
}

#[test]
fn cap_applies_per_unit() {
    // The first group leaves pod1 with 2 and pod2 with 1; the second group starts its own
    // count, so both of its members fit on the less-loaded pod2.
    assert_eq!(
        placed(&[(3, &[1, 2, 3]), (2, &[9])], 2, Some(2), 0, Requests),
        ["/pod1", "/pod1", "/pod2", "/pod2", "/pod2"]
    );
}

#[test]
fn ties_prefer_fewer_running_requests_then_smaller_id() {
    let batch = entries(&[(2, &[1, 2])]);
    let busy_first = [
        Replica {
            id: "/pod1",
            running_requests: 5,
        },
        Replica {
            id: "/pod2",
            running_requests: 0,
        },
    ];
    assert_eq!(
        assign(&batch, &busy_first, None, 0, Requests),
        [Some(1), Some(1)]
    );
    let reversed = [
        Replica {
            id: "/pod2",
            running_requests: 0,
        },
        Replica {
            id: "/pod1",
            running_requests: 0,
        },
    ];
    assert_eq!(
        assign(&batch, &reversed, None, 0, Requests),
        [Some(1), Some(1)]
    );
}

#[test]
fn multi_prompt_entries_group_on_the_flattened_list() {
    // Two prompts [1,2] + [3] flattened equal a single [1,2,3] list: they group together.
    let first: Vec<u64> = [&[1u64, 2][..], &[3]].concat();
    let batch: Vec<&[u64]> = vec![&first, &[1, 2, 3], &[1, 2]];
    assert_eq!(
        assign(&batch, &replicas(2), None, 0, Requests),
        [Some(0), Some(0), None]
    );
}

#[test]
fn large_batch_gives_each_family_its_own_replica() {
    // 256 families of 8 identical 128-block prompts over 256 replicas, sharing one long system
    // prompt of 64 blocks: each family lands whole on its own replica, in id order.
    let ids: Vec<String> = (0..256).map(|i| format!("/pod{i:03}")).collect();
    let reps: Vec<Replica<'_>> = ids
        .iter()
        .map(|id| Replica {
            id,
            running_requests: 0,
        })
        .collect();
    let families: Vec<Vec<u64>> = (0..256u64)
        .map(|f| {
            (0..128u64)
                .map(|b| if b < 64 { b } else { f << 32 | b })
                .collect()
        })
        .collect();
    let batch: Vec<&[u64]> = families
        .iter()
        .flat_map(|f| std::iter::repeat_n(f.as_slice(), 8))
        .collect();
    for balance_by in [Requests, Tokens] {
        let result = assign(&batch, &reps, None, 64, balance_by);
        let expected: Vec<Option<usize>> = (0..256).flat_map(|f| [Some(f); 8]).collect();
        assert_eq!(result, expected, "{balance_by:?}");
    }
}
