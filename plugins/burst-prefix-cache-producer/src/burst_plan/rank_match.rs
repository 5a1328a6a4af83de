//! Which of the previous burst's group sizes each group of this one has, told by counts alone.
//!
//! The groups of a step seen so far are a sample of sizes the plan already knows (the last
//! step's), in an unknown order. Matching sorted counts to sorted sizes rank by rank gives two
//! groups of close counts the sizes of their ranks, and the two swap sizes whenever their
//! counts swap ranks: a whole size difference moves between their replicas from one window to
//! the next, and the plan splits groups on it. Here every count weighs every size that makes
//! it likely enough by how likely, and the weights are scaled (alternately by count and by size,
//! until both add up) so that each size is held by as many groups as it has ranks: the
//! expected size of a group under every matching of counts to sizes, approximately. Counts far
//! apart keep their ranks' sizes; close ones share the sizes they could each have.

/// The fewest a count's variance is taken to be (a count is a whole number).
const LEAST_VARIANCE: f64 = 0.5;

/// How much less likely than a count's likeliest size (in natural log) a size may make it
/// and still be weighed; beyond that the count is not taken for a group of that size.
const UNLIKELY: f64 = 20.0;

/// Most distinct counts times distinct sizes weighed; a larger burst keeps its ranks' sizes.
const MOST_CELLS: usize = 4096;

/// Scaling rounds at most, and how near every count's total must come to its groups (a
/// share): the estimates only weigh replicas against each other, to about a request. On the
/// recorded live steps a call takes about 22 rounds.
const ROUNDS: usize = 30;
const TOLERANCE: f64 = 1e-2;

/// The expected size of a group with each distinct count, the counts `counts` (distinct,
/// largest first, each with its number of groups) and the sizes `sizes` (each the count a
/// group of that size is expected to have by now, distinct, largest first, each with its
/// number of ranks; as many ranks as groups). A count varies around its expected value by
/// `noise` times that value. `None` when the problem is too large to weigh.
pub(super) fn expected_sizes(
    counts: &[(usize, usize)],
    sizes: &[(f64, usize)],
    noise: f64,
) -> Option<Vec<(usize, f64)>> {
    let (rows, cols) = (counts.len(), sizes.len());
    if rows == 0 || cols == 0 || rows * cols > MOST_CELLS {
        return None;
    }
    // Per size: its expected count, one over twice its variance, half the log of it.
    let spreads: Vec<(f64, f64, f64)> = sizes
        .iter()
        .map(|&(expected, _)| {
            let variance = (expected * noise).max(LEAST_VARIANCE);
            (expected, 0.5 / variance, 0.5 * variance.ln())
        })
        .collect();
    let mut logs = vec![0.0; cols];
    // Each count weighs the sizes from `first` to `last`: those that make it likely enough,
    // and always the sizes of its own ranks, so that matching rank by rank stays possible.
    let mut bands: Vec<(usize, usize, usize)> = Vec::with_capacity(rows);
    let mut weight: Vec<f64> = Vec::new();
    // The ranks before the count's, the size holding its first rank, and the ranks up to that
    // size's last.
    let (mut rank, mut col, mut col_end) = (0, 0, sizes[0].1);
    for &(count, groups) in counts {
        let own_first = col;
        while col_end < rank + groups {
            col += 1;
            col_end += sizes[col].1;
        }
        let own_last = col;
        rank += groups;
        if col_end == rank && col + 1 < cols {
            col += 1;
            col_end += sizes[col].1;
        }
        for (log, &(expected, inverse, half_log)) in logs.iter_mut().zip(&spreads) {
            *log = -(count as f64 - expected).powi(2) * inverse - half_log;
        }
        let most = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let likely = |c: &usize| logs[*c] >= most - UNLIKELY;
        let first = (0..cols).find(likely).unwrap_or(own_first).min(own_first);
        let last = (0..cols)
            .rev()
            .find(likely)
            .unwrap_or(own_last)
            .max(own_last);
        bands.push((first, last, weight.len()));
        weight.extend(logs[first..=last].iter().map(|log| (log - most).exp()));
    }
    if bands.iter().all(|&(first, last, _)| first == last) {
        // Every count far from every size but its ranks': the ranks decide.
        return Some(
            counts
                .iter()
                .zip(&bands)
                .map(|(&(count, _), &(first, _, _))| (count, sizes[first].0))
                .collect(),
        );
    }
    let mut by_count = vec![1.0; rows];
    let mut by_size = vec![1.0; cols];
    let mut held = vec![0.0; cols];
    for _ in 0..ROUNDS {
        held.fill(0.0);
        for (&(first, last, at), scale) in bands.iter().zip(&by_count) {
            for (cell, w) in held[first..=last].iter_mut().zip(&weight[at..]) {
                *cell += scale * w;
            }
        }
        for ((scale, &(_, ranks)), &h) in by_size.iter_mut().zip(sizes).zip(&held) {
            *scale = ranks as f64 / h;
        }
        let mut worst = 0.0_f64;
        for ((&(first, last, at), scale), &(_, groups)) in
            bands.iter().zip(by_count.iter_mut()).zip(counts)
        {
            let total: f64 = weight[at..=at + last - first]
                .iter()
                .zip(&by_size[first..=last])
                .map(|(w, s)| w * s)
                .sum::<f64>()
                * *scale;
            let groups = groups as f64;
            worst = worst.max((total / groups - 1.0).abs());
            *scale *= groups / total;
        }
        if worst < TOLERANCE {
            break;
        }
    }
    Some(
        counts
            .iter()
            .zip(&bands)
            .map(|(&(count, _), &(first, last, at))| {
                let (mass, sum) = weight[at..=at + last - first]
                    .iter()
                    .zip(&by_size[first..=last])
                    .zip(&sizes[first..=last])
                    .fold((0.0, 0.0), |(mass, sum), ((w, s), &(expected, _))| {
                        (mass + w * s, sum + w * s * expected)
                    });
                (count, sum / mass)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_far_apart_keep_their_ranks_sizes() {
        let sizes = expected_sizes(
            &[(40, 1), (20, 1), (5, 1)],
            &[(40.0, 1), (20.0, 1), (5.0, 1)],
            0.5,
        )
        .expect("small");
        for ((count, size), expected) in sizes.iter().zip([40.0, 20.0, 5.0]) {
            assert!((size - expected).abs() < 0.01, "count {count}: {size}");
        }
    }

    #[test]
    fn close_counts_share_the_sizes_they_could_each_have() {
        // Two groups of 96 and 80 a quarter of the way in: 24 and 20 expected, 22 and 21 seen.
        let sizes =
            expected_sizes(&[(22, 1), (21, 1)], &[(24.0, 1), (20.0, 1)], 0.75).expect("small");
        let (larger, smaller) = (sizes[0].1, sizes[1].1);
        assert!(larger > smaller, "{sizes:?}");
        assert!(larger < 23.0 && smaller > 21.0, "{sizes:?}");
        // The sizes are only shared out: together they still hold both ranks.
        assert!((larger + smaller - 44.0).abs() < 0.25, "{sizes:?}");
    }

    #[test]
    fn groups_with_equal_counts_get_equal_sizes_and_every_rank_is_held() {
        let counts = [(9, 1), (6, 2), (2, 1)];
        let sizes = [(10.0, 1), (6.0, 1), (5.0, 1), (2.0, 1)];
        let got = expected_sizes(&counts, &sizes, 0.6).expect("small");
        let held: f64 = got
            .iter()
            .zip(&counts)
            .map(|((_, s), &(_, n))| s * n as f64)
            .sum();
        assert!((held - 23.0).abs() < 0.25, "{got:?}");
        assert!(got[0].1 > got[1].1 && got[1].1 > got[2].1, "{got:?}");
    }

    #[test]
    fn a_problem_too_large_to_weigh_is_left_to_the_ranks() {
        let counts: Vec<(usize, usize)> = (1..=100).rev().map(|c| (c, 1)).collect();
        let sizes: Vec<(f64, usize)> = (1..=100).rev().map(|s| (s as f64, 1)).collect();
        assert!(expected_sizes(&counts, &sizes, 0.5).is_none());
        assert!(expected_sizes(&[], &sizes, 0.5).is_none());
    }
}
