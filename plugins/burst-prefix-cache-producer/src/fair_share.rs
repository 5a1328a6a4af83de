//! Fair-share placement of one sealed batch (`assignment = "fairShare"`, a switchyard
//! extension; the reference's placement is in [`crate::assign`]).
//!
//! Every request with prompt blocks is placed, lone ones included. Requests with identical hash
//! lists form groups; groups are laid end to end, largest first, and the line is cut into one
//! share per replica. The shares are water-filled over the load the replicas already carry
//! (`running_requests`), so a batch tops up the least loaded replicas first and consecutive
//! batches balance too. Each cut splits at most one group, so P groups over R replicas make at
//! most P + R − 1 (group, replica) placements, and exactly P when whole groups fill the shares.
//!
//! A cut that falls inside a group moves to the group's nearer end when that is within 5% of
//! the neighbouring shares (or one request's weight, when larger) — [`ALLOWANCE`] — so small
//! remainders do not cost a second prefill; each replica's part stays within 10% of its share
//! (or two requests). With [`BalanceBy::Tokens`] a request weighs its block count and the
//! replicas' carried load is counted in the batch's mean weight per request.

use crate::assign::Replica;
use crate::config::BalanceBy;

/// Places the requests of one batch. `entries[i]` are request `i`'s block hashes (empty when
/// it was not hashed), `blocks[i]` its block count; requests without blocks, and every request
/// when `replicas` is empty, get `None`. With `min_colocate_blocks > 0`, groups whose first
/// `min_colocate_blocks` hashes agree are laid next to each other, so a cut seldom parts them.
pub fn assign_fair_share(
    entries: &[&[u64]],
    blocks: &[usize],
    replicas: &[Replica<'_>],
    min_colocate_blocks: usize,
    balance_by: BalanceBy,
) -> Vec<Option<usize>> {
    let mut assigned = vec![None; entries.len()];
    if replicas.is_empty() {
        return assigned;
    }
    let line = lay_out(entries, blocks, min_colocate_blocks);
    if line.is_empty() {
        return assigned;
    }
    let weight = |i: usize| match balance_by {
        BalanceBy::Requests => 1.0,
        BalanceBy::Tokens => blocks[i] as f64,
    };
    let total: f64 = line.iter().map(|&i| weight(i)).sum();
    let per_request = total / line.len() as f64;
    let carried: Vec<f64> = replicas
        .iter()
        .map(|r| r.running_requests as f64 * per_request)
        .collect();
    let shares = water_fill(&carried, total);
    // Replicas in the order the line is cut: least carried load first, then id.
    let mut order: Vec<usize> = (0..replicas.len()).collect();
    order.sort_by(|&a, &b| {
        carried[a]
            .total_cmp(&carried[b])
            .then_with(|| replicas[a].id.cmp(replicas[b].id))
    });
    // laid[k]: the weight of line[..k].
    let mut laid = Vec::with_capacity(line.len() + 1);
    laid.push(0.0);
    for &i in &line {
        laid.push(laid.last().copied().unwrap_or(0.0) + weight(i));
    }
    let ends = group_ends(&line, entries);
    let mut from = 0;
    let mut boundary = 0.0;
    for (slot, pair) in order.windows(2).enumerate() {
        let (here, next) = (pair[0], pair[1]);
        boundary += shares[here];
        let slack = (ALLOWANCE / 2.0 * shares[here].min(shares[next])).max(per_request);
        let cut = cut_near(boundary, slack, &laid, &ends).max(from);
        for &i in &line[from..cut] {
            assigned[i] = Some(order[slot]);
        }
        from = cut;
    }
    let last = order[order.len() - 1];
    for &i in &line[from..] {
        assigned[i] = Some(last);
    }
    assigned
}

/// How far a replica's part may stray from its share to keep groups whole, as a fraction of
/// the share: each cut moves to a group boundary within half of it (or within one request's
/// weight, when that is larger) of the exact cut.
pub const ALLOWANCE: f64 = 0.1;

/// Where to cut the line for a boundary at weight `at`: the nearer end of the group it falls in
/// when that is within `slack`, else between the members of that group where the weights'
/// midpoints cross `at`.
fn cut_near(at: f64, slack: f64, laid: &[f64], ends: &[usize]) -> usize {
    let n = ends.len();
    // The first member whose weight reaches past the boundary.
    let k = laid[1..]
        .partition_point(|&end| end <= at)
        .min(n.saturating_sub(1));
    if n == 0 {
        return 0;
    }
    let end = ends[k];
    let start = ends[..k]
        .iter()
        .rposition(|&e| e <= k)
        .map_or(0, |p| ends[p]);
    let (below, above) = (at - laid[start], laid[end] - at);
    if below <= slack && below <= above {
        return start;
    }
    if above <= slack {
        return end;
    }
    if below <= slack {
        return start;
    }
    (start..end)
        .find(|&m| (laid[m] + laid[m + 1]) / 2.0 > at)
        .unwrap_or(end)
}

/// Where each request's group ends in the line: `ends[k]` is the line position after the
/// group of `line[k]`.
fn group_ends(line: &[usize], entries: &[&[u64]]) -> Vec<usize> {
    let mut ends = vec![line.len(); line.len()];
    let mut start = 0;
    for k in 1..=line.len() {
        let boundary = k == line.len() || {
            let (a, b) = (entries[line[k - 1]], entries[line[k]]);
            a.is_empty() || a != b
        };
        if boundary {
            for end in &mut ends[start..k] {
                *end = k;
            }
            start = k;
        }
    }
    ends
}

/// The requests to place, in line order: groups of identical hash lists (a request without
/// hashes is a group of its own) largest first, ties in arrival order; with `min_blocks > 0`,
/// groups sharing their first `min_blocks` hashes kept together, the family with the largest
/// group first.
fn lay_out(entries: &[&[u64]], blocks: &[usize], min_blocks: usize) -> Vec<usize> {
    use std::collections::HashMap;
    // Groups are looked up by length and last hash, which stands for the whole chain, so a
    // lookup hashes two words instead of the list; the list itself is then compared, and a
    // different list under the same key (a hash collision) is found by a scan.
    let mut group_of_key: HashMap<(usize, u64), usize> = HashMap::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, key) in entries.iter().enumerate() {
        if blocks[i] == 0 {
            continue;
        }
        let g = match key.last() {
            None => groups.len(),
            Some(&last) => {
                let first = *group_of_key
                    .entry((key.len(), last))
                    .or_insert(groups.len());
                if first == groups.len() || entries[groups[first][0]] == *key {
                    first
                } else {
                    groups
                        .iter()
                        .position(|members| entries[members[0]] == *key)
                        .unwrap_or(groups.len())
                }
            }
        };
        if g == groups.len() {
            groups.push(Vec::new());
        }
        groups[g].push(i);
    }
    // Family: the first group with the same leading hashes (each group its own when off).
    let mut family_of_prefix: HashMap<&[u64], usize> = HashMap::new();
    let family: Vec<usize> = groups
        .iter()
        .enumerate()
        .map(|(g, members)| {
            let key = entries[members[0]];
            if min_blocks == 0 || key.len() < min_blocks {
                g
            } else {
                *family_of_prefix.entry(&key[..min_blocks]).or_insert(g)
            }
        })
        .collect();
    let mut family_size = vec![0usize; groups.len()];
    for (g, members) in groups.iter().enumerate() {
        family_size[family[g]] = family_size[family[g]].max(members.len());
    }
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by_key(|&g| {
        (
            std::cmp::Reverse(family_size[family[g]]),
            family[g],
            std::cmp::Reverse(groups[g].len()),
            g,
        )
    });
    order
        .into_iter()
        .flat_map(|g| groups[g].iter().copied())
        .collect()
}

/// Shares that bring every replica as close as possible to one common level: the least loaded
/// are topped up first, and a replica already above the level gets nothing.
fn water_fill(carried: &[f64], total: f64) -> Vec<f64> {
    let mut sorted: Vec<f64> = carried.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut level = sorted[0] + total;
    let mut below = 0.0;
    for (k, &load) in sorted.iter().enumerate() {
        below += load;
        // The level if the first k + 1 replicas share the batch.
        let candidate = (total + below) / (k + 1) as f64;
        level = candidate;
        if sorted.get(k + 1).is_none_or(|&next| candidate <= next) {
            break;
        }
    }
    carried.iter().map(|&c| (level - c).max(0.0)).collect()
}

#[cfg(test)]
mod tests;
