//! The plan on bursts cut into windows at random: the placement bound and the balance bound
//! hold per burst, not per window.

use super::*;
use std::collections::BTreeSet;

/// The group of each arrival: `sizes[g]` arrivals of group `g`, shuffled by `next`.
fn shuffled_arrivals(sizes: &[usize], next: &mut impl FnMut(u64) -> u64) -> Vec<usize> {
    let mut arrivals: Vec<usize> = sizes
        .iter()
        .enumerate()
        .flat_map(|(g, &size)| std::iter::repeat_n(g, size))
        .collect();
    for i in (1..arrivals.len()).rev() {
        arrivals.swap(i, next(i as u64 + 1) as usize);
    }
    arrivals
}

/// Groups of `sizes` members arriving in a random order, cut into windows of 1..=`max_window`
/// requests; returns the requests per replica and the (group, replica) placements.
fn burst_over_windows(
    plan: &mut BurstPlan,
    now: &mut u64,
    sizes: &[usize],
    replicas: usize,
    seed: u64,
    max_window: u64,
) -> (Vec<usize>, usize) {
    let (load, pairs, _) = burst_with(
        plan,
        now,
        sizes,
        &vec![0; replicas],
        seed,
        max_window,
        false,
    );
    (load, pairs)
}

/// [`burst_over_windows`] over replicas that carry `carried` requests of other traffic, with
/// one request of a prompt seen nowhere else added to every window when `background`; also
/// returns every placement in order.
#[allow(clippy::too_many_arguments)]
fn burst_with(
    plan: &mut BurstPlan,
    now: &mut u64,
    sizes: &[usize],
    carried: &[u64],
    seed: u64,
    max_window: u64,
    background: bool,
) -> (Vec<usize>, usize, Vec<usize>) {
    let replicas = carried.len();
    let mut next = switchyard_plugin_api::testing::numbers(seed);
    let arrivals = shuffled_arrivals(sizes, &mut next);
    let ids: Vec<String> = (0..replicas).map(|r| format!("/r{r:02}")).collect();
    let mut load = vec![0usize; replicas];
    let mut pairs = BTreeSet::new();
    let mut trace = Vec::new();
    let mut at = 0;
    while at < arrivals.len() {
        let size = (1 + next(max_window) as usize).min(arrivals.len() - at);
        let mut window = arrivals[at..at + size].to_vec();
        at += size;
        *now += 1;
        if background {
            window.push(usize::MAX - *now as usize);
        }
        let running: Vec<u64> = carried
            .iter()
            .zip(&load)
            .map(|(&carried, &sent)| carried + sent as u64)
            .collect();
        let key = |g: usize| GroupKey {
            blocks: 4,
            digest: seed << 32 | g as u64,
        };
        for (&g, r) in window
            .iter()
            .zip(place_window(plan, *now, &window, key, &ids, &running))
        {
            load[r] += 1;
            trace.push(r);
            if g < sizes.len() {
                pairs.insert((g, r));
            }
        }
    }
    (load, pairs.len(), trace)
}

/// Places one window through `plan`: `window[i]` is the group of the window's i-th request,
/// `key` its key, over replicas `ids` running `running` requests. Returns each request's
/// replica, in window order.
fn place_window(
    plan: &mut BurstPlan,
    now: u64,
    window: &[usize],
    key: impl Fn(usize) -> GroupKey,
    ids: &[String],
    running: &[u64],
) -> Vec<usize> {
    let mut members: Vec<(usize, Vec<usize>)> = Vec::new();
    for (position, &g) in window.iter().enumerate() {
        match members.iter_mut().find(|(group, _)| *group == g) {
            Some((_, positions)) => positions.push(position),
            None => members.push((g, vec![position])),
        }
    }
    let groups: Vec<WindowGroup<'_>> = members
        .iter()
        .map(|(g, positions)| WindowGroup {
            key: key(*g),
            positions,
            weight: 1.0,
            cached_on: &[],
        })
        .collect();
    let views: Vec<Replica<'_>> = ids
        .iter()
        .zip(running)
        .map(|(id, &running)| Replica {
            id,
            running_requests: running,
        })
        .collect();
    let mut replica_of = vec![0; window.len()];
    for ((_, positions), targets) in members.iter().zip(plan.place(now, &groups, &views)) {
        assert_eq!(targets.len(), positions.len());
        for (&position, r) in positions.iter().zip(targets) {
            replica_of[position] = r;
        }
    }
    replica_of
}

/// Every shape, over windows of 1..=`max_window`, 20 arrival orders: the mean and worst
/// placements, and the worst deviation of a replica from its fair share.
fn measure(sizes: &[usize], max_window: u64) -> (f64, usize, f64) {
    let fair = sizes.iter().sum::<usize>() as f64 / 8.0;
    let (mut total, mut worst, mut deviation) = (0, 0, 0.0f64);
    for seed in 1..=20 {
        let mut plan = BurstPlan::new(2000, 100);
        let (load, pairs) = burst_over_windows(&mut plan, &mut 0, sizes, 8, seed, max_window);
        assert_eq!(load.iter().sum::<usize>(), sizes.iter().sum::<usize>());
        total += pairs;
        worst = worst.max(pairs);
        for &l in &load {
            deviation = deviation.max((l as f64 - fair).abs() / fair);
        }
    }
    (total as f64 / 20.0, worst, deviation)
}

const UNEQUAL: [usize; 12] = [8, 96, 24, 64, 40, 16, 72, 32, 56, 48, 12, 44];

#[test]
fn equal_groups_land_whole_however_the_burst_is_cut() {
    for max_window in [3, 10, 40, 100, 200] {
        let (mean, worst, deviation) = measure(&[16; 32], max_window);
        assert_eq!((mean, worst), (32.0, 32), "windows of 1..={max_window}");
        assert_eq!(deviation, 0.0, "windows of 1..={max_window}");
    }
    // One request per window: a group can get its second member before every replica has a
    // group, and a few orders split one.
    let (mean, worst, deviation) = measure(&[16; 32], 1);
    assert!(
        mean < 33.0 && worst < 39 && deviation <= 0.1,
        "{mean} {worst} {deviation}"
    );
}

#[test]
fn groups_larger_than_a_share_split_about_once_per_replica_they_need() {
    // 4 groups of 128 over 8 replicas: the least is 8 placements (P + R - 1 = 11).
    for max_window in [10, 40, 100, 200] {
        let (mean, _, deviation) = measure(&[128; 4], max_window);
        assert!(
            mean <= 11.0,
            "windows of 1..={max_window}: {mean} placements"
        );
        assert!(
            deviation <= 0.12,
            "windows of 1..={max_window}: {deviation}"
        );
    }
}

#[test]
fn unequal_groups_stay_near_the_placement_bound_in_windows_of_tens() {
    // P + R - 1 = 19 when the whole burst is known at once.
    for (max_window, most) in [(40, 30.0), (100, 25.0), (200, 23.0)] {
        let (mean, _, deviation) = measure(&UNEQUAL, max_window);
        assert!(
            mean <= most,
            "windows of 1..={max_window}: {mean} placements"
        );
        assert!(
            deviation <= 0.15,
            "windows of 1..={max_window}: {deviation}"
        );
    }
}

#[test]
fn a_burst_in_one_window_keeps_the_single_window_bounds() {
    // At most P + R - 1 placements, each replica within 10% of its share or two requests.
    for sizes in [&[16; 32][..], &[128; 4], &UNEQUAL, &[32; 2], &[7, 7, 7]] {
        let (_, worst, deviation) = measure(sizes, 100_000);
        assert!(worst < sizes.len() + 8, "{sizes:?}: {worst} placements");
        let fair = sizes.iter().sum::<usize>() as f64 / 8.0;
        assert!(
            deviation * fair <= (0.1 * fair).max(2.0),
            "{sizes:?}: {deviation}"
        );
    }
}

#[test]
fn a_first_burst_in_one_window_splits_its_large_groups_as_it_places_them() {
    // The plan's first burst, all in one window: its counts are its sizes, and a group larger
    // than a share splits as it is first placed, before the smaller groups fill in around it.
    // Shape 5 has two such groups (96 and 80 of 64 a replica): 14 placements. Split only by
    // the rebalance once every group was placed, the largest took slivers on several replicas:
    // 17, for both shapes.
    for (sizes, most) in [(&SHAPE_5[..], 14), (&UNEQUAL, 15)] {
        let (mean, worst, deviation) = measure(sizes, 100_000);
        assert!(
            worst <= most,
            "{sizes:?}: {mean} placements, at worst {worst}"
        );
        assert!(deviation <= 0.05, "{sizes:?}: {deviation}");
    }
}

#[test]
fn the_same_burst_is_placed_the_same_by_every_fresh_plan() {
    for (sizes, max_window) in [
        (&UNEQUAL[..], 1),
        (&UNEQUAL, 40),
        (&[128; 4], 10),
        (&[16; 32], 100),
    ] {
        for seed in 1..=5 {
            let run = || {
                let mut plan = BurstPlan::new(2000, 100);
                burst_with(&mut plan, &mut 0, sizes, &[0; 8], seed, max_window, false).2
            };
            assert_eq!(
                run(),
                run(),
                "{sizes:?}, windows of 1..={max_window}, seed {seed}"
            );
        }
    }
}

#[test]
fn a_replica_loaded_by_other_traffic_does_not_stop_the_others_balancing() {
    // One replica carries 1000 requests of other traffic: the burst spreads over the 7 others.
    let mut plan = BurstPlan::new(2000, 100);
    let carried = [1000, 0, 0, 0, 0, 0, 0, 0];
    let (load, pairs, _) = burst_with(&mut plan, &mut 0, &[128; 4], &carried, 3, 40, false);
    assert_eq!(load[0], 0, "{load:?}");
    assert!(load[1..].iter().all(|&n| n.abs_diff(73) <= 8), "{load:?}");
    assert!(pairs < 4 + 7, "{pairs} placements");
}

#[test]
fn lone_requests_beside_a_burst_do_not_hold_its_splits_back() {
    // One request of a prompt nobody else sends joins every window.
    for max_window in [10, 40] {
        let mut plan = BurstPlan::new(2000, 100);
        let (load, pairs, _) =
            burst_with(&mut plan, &mut 0, &[128; 4], &[0; 8], 5, max_window, true);
        let fair = load.iter().sum::<usize>() as f64 / 8.0;
        assert!(
            load.iter().all(|&n| (n as f64 - fair).abs() <= 0.15 * fair),
            "windows of 1..={max_window}: {load:?}"
        );
        assert!(
            pairs < 2 * (4 + 7),
            "windows of 1..={max_window}: {pairs} placements"
        );
    }
}

#[test]
fn a_group_whose_replicas_all_left_goes_on_elsewhere_and_returns_when_they_do() {
    let ids = ["/a", "/b", "/c"];
    let replicas = |names: &[&'static str]| -> Vec<Replica<'static>> {
        names
            .iter()
            .map(|&id| Replica {
                id,
                running_requests: 0,
            })
            .collect()
    };
    let key = GroupKey::of(&[1, 2]).unwrap();
    let group = |positions: &'static [usize]| WindowGroup {
        key,
        positions,
        weight: 1.0,
        cached_on: &[],
    };
    let mut plan = BurstPlan::new(2000, 100);
    let first = plan.place(0, &[group(&[0])], &replicas(&ids));
    let home = ids[first[0][0]];
    let others: Vec<&'static str> = ids.iter().copied().filter(|&id| id != home).collect();
    // Its replica gone for one window: the member goes to one still there.
    let away = plan.place(1, &[group(&[0])], &replicas(&others));
    let stand_in = others[away[0][0]];
    // All back, and the prompt grown past four requests per replica (a prompt alone spreads
    // from there): 27 members over three replicas, none with more than ten, the home among them.
    const BACK: [usize; 25] = {
        let mut positions = [0; 25];
        let mut i = 0;
        while i < 25 {
            positions[i] = i;
            i += 1;
        }
        positions
    };
    let back = plan.place(2, &[group(&BACK)], &replicas(&ids));
    let mut per_replica = [0; 3];
    for &r in first[0].iter().chain(&back[0]) {
        per_replica[r] += 1;
    }
    per_replica[ids.iter().position(|&id| id == stand_in).unwrap()] += 1;
    assert!(
        per_replica.iter().all(|&n| (8..=10).contains(&n)),
        "{first:?} {away:?} {back:?}"
    );
    assert!(back[0].iter().any(|&r| ids[r] == home), "{back:?}");
}

#[test]
fn requests_of_several_prompts_are_one_group_only_when_all_their_blocks_agree() {
    // Two prompts each, the second alike and the first differing after its first block: the
    // flattened lists share their last hash and their length, not their contents.
    let a = [11, 12, 31, 32];
    let b = [11, 13, 31, 32];
    assert_ne!(GroupKey::of(&a), GroupKey::of(&b));
    assert_eq!(GroupKey::of(&a), GroupKey::of(&a.clone()));
    assert_eq!(GroupKey::of(&[]), None);
}

#[test]
fn a_step_after_a_finished_one_is_balanced_afresh() {
    // Step 2 starts 600 ms after step 1's last request, all of step 1 done: the groups step 1
    // left in memory no longer weigh on the replicas they used.
    let mut plan = BurstPlan::new(2000, 100);
    let mut now = 0;
    for (step, sizes) in [&UNEQUAL[..], &[16; 32], &[128; 4]].into_iter().enumerate() {
        let (load, _, _) = burst_with(
            &mut plan,
            &mut now,
            sizes,
            &[0; 8],
            step as u64 + 1,
            40,
            false,
        );
        let fair = sizes.iter().sum::<usize>() as f64 / 8.0;
        if step > 0 {
            assert!(
                load.iter().all(|&n| (n as f64 - fair).abs() <= 0.15 * fair),
                "step {step}: {load:?}"
            );
        }
        now += 600;
    }
}

#[test]
fn a_large_group_that_stopped_arriving_does_not_skew_the_next_burst() {
    // A warm-up of 512 requests of one prompt, done 150 ms before a burst of 32 × 16: the
    // burst is placed as if it were alone.
    let mut plan = BurstPlan::new(2000, 100);
    let mut now = 0;
    burst_with(&mut plan, &mut now, &[512], &[0; 8], 9, 200, false);
    now += 150;
    let (load, pairs, _) = burst_with(&mut plan, &mut now, &[16; 32], &[0; 8], 1, 10, false);
    assert_eq!((load, pairs), (vec![64; 8], 32));
}

/// Steps of `sizes` sent one after another over 8 replicas, each `per_ms` requests a
/// millisecond in a shuffled order, step k + 1 starting when step k has sent `overlap_from` of
/// its requests (windows then hold requests of both); returns the requests per replica and the
/// (group, replica) placements.
fn overlapping_steps(
    sizes: &[usize],
    steps: usize,
    overlap_from: f64,
    per_ms: usize,
    seed: u64,
) -> (Vec<usize>, usize) {
    let mut next = switchyard_plugin_api::testing::numbers(seed);
    let total: usize = sizes.iter().sum();
    let mut arrivals: Vec<(u64, usize)> = Vec::new();
    for step in 0..steps {
        let start = (step as f64 * overlap_from * total as f64) as usize;
        for (k, g) in shuffled_arrivals(sizes, &mut next).into_iter().enumerate() {
            arrivals.push((((start + k) / per_ms) as u64, step << 8 | g));
        }
    }
    arrivals.sort();
    let windows: Vec<(u64, Vec<usize>)> = arrivals
        .chunk_by(|a, b| a.0 == b.0)
        .map(|window| (window[0].0, window.iter().map(|&(_, g)| g).collect()))
        .collect();
    let timed = windows.iter().map(|(at, groups)| (*at, groups.as_slice()));
    place_timed_windows(&mut BurstPlan::new(2000, 100), seed, timed)
}

#[test]
fn overlapping_steps_land_whole_and_balanced() {
    // Steps of 32 × 16, each over 64 ms, the next starting when the last is half-way through
    // (a quarter or three quarters of the way, or sent at a quarter of the pace; three steps
    // in a row): their windows interleave, each holding requests of both. The second step's
    // groups are estimated on their own and expected as large as the first's: estimated with
    // the first step's counts, further along, its groups looked small and crowded onto the
    // replicas the first step's counts left behind, and 34 of 40 orders ended a replica more
    // than 10% off (three steps: 9 of 40, up to 48 off 192).
    let cases = [
        (0.5, 2, 8),
        (0.25, 2, 8),
        (0.75, 2, 8),
        (0.5, 3, 8),
        (0.5, 2, 2),
    ];
    for (overlap_from, steps, per_ms) in cases {
        for seed in 1..=40 {
            let (load, pairs) = overlapping_steps(&[16; 32], steps, overlap_from, per_ms, seed);
            let fair = 64 * steps;
            let case = format!("{steps} steps from {overlap_from}, {per_ms}/ms, order {seed}");
            assert!(
                load.iter().all(|&n| n.abs_diff(fair) * 10 <= fair),
                "{case}: {load:?}"
            );
            assert!(pairs < 32 * steps + 8, "{case}: {pairs} placements");
        }
    }
}

#[test]
fn the_state_shows_a_second_wave_only_while_one_overlaps_the_first() {
    // Half-way through the first of two overlapping steps of 32 × 16 the window sees one wave;
    // once the second step's prompts have begun, two, the second with its own groups.
    let ids: Vec<String> = (0..8).map(|r| format!("/r{r}")).collect();
    let mut plan = BurstPlan::new(2000, 100);
    let key = |g: usize| GroupKey::of(&[g as u64 + 1]).unwrap();
    let mut next = switchyard_plugin_api::testing::numbers(5);
    let first = shuffled_arrivals(&[16; 32], &mut next);
    let second: Vec<usize> = shuffled_arrivals(&[16; 32], &mut next)
        .into_iter()
        .map(|g| 256 | g)
        .collect();
    let mut load = vec![0u64; 8];
    let mut place = |plan: &mut BurstPlan, at: u64, window: &[usize]| {
        for r in place_window(plan, at, window, key, &ids, &load) {
            load[r] += 1;
        }
    };
    for (k, window) in first[..256].chunks(8).enumerate() {
        place(&mut plan, k as u64, window);
    }
    let latest = &plan.describe()["latestWindow"];
    assert_eq!(
        latest["secondWaveGroups"],
        serde_json::Value::Null,
        "{latest}"
    );
    for (k, (old, new)) in first[256..]
        .chunks(4)
        .zip(second[..128].chunks(4))
        .enumerate()
    {
        let window: Vec<usize> = old.iter().chain(new).copied().collect();
        place(&mut plan, 32 + k as u64, &window);
    }
    let latest = &plan.describe()["latestWindow"];
    let groups = latest["secondWaveGroups"].as_u64().expect("a second wave");
    assert!((16..=32).contains(&groups), "{latest}");
}

#[test]
fn one_prompt_alone_spreads_over_the_replicas_as_it_grows() {
    // A single prompt's 256 samples, four a window, over 8 replicas.
    let mut plan = BurstPlan::new(2000, 100);
    let (load, pairs, _) = burst_with(&mut plan, &mut 0, &[256], &[0; 8], 1, 4, false);
    assert!(load.iter().all(|&n| n.abs_diff(32) <= 4), "{load:?}");
    assert_eq!(pairs, 8);
}

#[test]
fn a_pause_of_the_whole_stream_does_not_change_the_placement() {
    // A shuffled step of 16 × 8 over 4 replicas in windows of 1–5 requests a millisecond apart,
    // and the same windows with a stall of 150 ms half-way (nothing arrives in the pause; the
    // 40 requests sent meanwhile come in one window after it): placed alike, request by request.
    let ids: Vec<String> = (0..4).map(|r| format!("/r{r}")).collect();
    for seed in 1..=20 {
        let mut next = switchyard_plugin_api::testing::numbers(seed);
        let mut order: Vec<usize> = (0..128).map(|i| i / 8).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, next(i as u64 + 1) as usize);
        }
        let mut windows = Vec::new();
        let mut at = 0;
        while at < order.len() {
            let size = if at == 48 { 40 } else { 1 + next(4) as usize }.min(order.len() - at);
            windows.push(at..at + size);
            at += size;
        }
        let place = |stall_ms: u64| {
            let mut plan = BurstPlan::new(2000, 100);
            let mut load = [0usize; 4];
            let mut placed = Vec::new();
            let mut now = 0;
            for window in &windows {
                now += if window.start == 48 { stall_ms } else { 1 };
                let running: Vec<u64> = load.iter().map(|&n| n as u64).collect();
                let key = |g: usize| GroupKey::of(&[g as u64 + 1]).unwrap();
                let groups = &order[window.clone()];
                for r in place_window(&mut plan, now, groups, key, &ids, &running) {
                    load[r] += 1;
                    placed.push(r);
                }
            }
            placed
        };
        assert_eq!(place(150), place(1), "seed {seed}");
    }
}

/// Groups arriving one after the other (every member of a group before the next group's),
/// each request displaced by up to `jitter` places, cut into windows of 1..=`max_window`
/// requests a millisecond apart; returns the requests per replica and the placements.
fn prompt_by_prompt(
    sizes: &[usize],
    replicas: usize,
    seed: u64,
    max_window: u64,
    jitter: usize,
) -> (Vec<usize>, usize) {
    let mut next = switchyard_plugin_api::testing::numbers(seed);
    let mut keyed: Vec<(usize, usize)> = sizes
        .iter()
        .enumerate()
        .flat_map(|(g, &size)| std::iter::repeat_n(g, size))
        .enumerate()
        .map(|(i, g)| (i + next(jitter as u64 + 1) as usize, g))
        .collect();
    keyed.sort();
    let arrivals: Vec<usize> = keyed.into_iter().map(|(_, g)| g).collect();
    let ids: Vec<String> = (0..replicas).map(|r| format!("/r{r:02}")).collect();
    let mut load = vec![0usize; replicas];
    let mut pairs = BTreeSet::new();
    let mut plan = BurstPlan::new(2000, 100);
    let (mut at, mut now) = (0, 0);
    while at < arrivals.len() {
        let size = (1 + next(max_window) as usize).min(arrivals.len() - at);
        let window = &arrivals[at..at + size];
        at += size;
        now += 1;
        let running: Vec<u64> = load.iter().map(|&n| n as u64).collect();
        let key = |g: usize| GroupKey {
            blocks: 4,
            digest: seed << 32 | g as u64,
        };
        let placed = place_window(&mut plan, now, window, key, &ids, &running);
        for (&g, r) in window.iter().zip(placed) {
            load[r] += 1;
            pairs.insert((g, r));
        }
    }
    (load, pairs.len())
}

#[test]
fn groups_sent_prompt_by_prompt_land_whole_and_balanced() {
    // Each group is whole before the next starts, so until the burst ends every group looks
    // like the last: a group may run one group ahead of the level while new ones keep coming,
    // and the next goes where the earlier ones left room.
    for (sizes, replicas) in [(&[16usize; 32][..], 8), (&[8; 16], 4)] {
        let fair = sizes.iter().sum::<usize>() as f64 / replicas as f64;
        for max_window in [1, 4] {
            for seed in 1..=10 {
                let (load, pairs) = prompt_by_prompt(sizes, replicas, seed, max_window, 0);
                assert_eq!(
                    pairs,
                    sizes.len(),
                    "{} × {}, windows of 1..={max_window}, seed {seed}: {load:?}",
                    sizes.len(),
                    sizes[0]
                );
                assert!(load.iter().all(|&n| n as f64 == fair), "{load:?}");
            }
        }
        // Windows of up to ten: a window can end a group and open the next, and an order in
        // ten splits one group.
        for seed in 1..=10 {
            let (load, pairs) = prompt_by_prompt(sizes, replicas, seed, 10, 0);
            assert!(pairs <= sizes.len() + 1, "seed {seed}: {load:?}, {pairs}");
            assert!(
                load.iter()
                    .all(|&n| (n as f64 - fair).abs() <= (0.1 * fair).max(2.0)),
                "seed {seed}: {load:?}"
            );
        }
        // Requests displaced by up to half a group, neighbouring groups overlapping: the bounds
        // of one burst still hold.
        for max_window in [4, 40] {
            for seed in 1..=10 {
                let jitter = sizes[0] / 2;
                let (load, pairs) = prompt_by_prompt(sizes, replicas, seed, max_window, jitter);
                let context = format!(
                    "{} × {}, windows of 1..={max_window}, seed {seed}: {load:?}, {pairs}",
                    sizes.len(),
                    sizes[0]
                );
                assert!(pairs < sizes.len() + replicas, "{context}");
                assert!(
                    load.iter()
                        .all(|&n| (n as f64 - fair).abs() <= (0.1 * fair).max(2.0)),
                    "{context}"
                );
            }
        }
    }
}

/// 32 × 16 sent prompt by prompt from 3,000 ms over 250 ms, each request displaced by up to
/// `jitter` places, cut into windows of 1 to 40 requests: when each window is placed, and the
/// group of each of its requests.
fn step_in_turn(seed: u64, jitter: u64) -> Vec<(u64, Vec<usize>)> {
    let mut next = switchyard_plugin_api::testing::numbers(seed);
    let mut keyed: Vec<(usize, usize)> = (0..512)
        .map(|i| {
            let displaced = if jitter > 0 { next(jitter + 1) } else { 0 };
            (i + displaced as usize, i / 16)
        })
        .collect();
    keyed.sort();
    let arrivals: Vec<usize> = keyed.into_iter().map(|(_, g)| g).collect();
    let mut windows = Vec::new();
    let (mut at, mut now) = (0, 3000);
    while at < arrivals.len() {
        let cut = (1 + next(40) as usize).min(arrivals.len() - at);
        at += cut;
        now = (3000 + 250 * at as u64 / 512).max(now + 1);
        windows.push((now, arrivals[at - cut..at].to_vec()));
    }
    windows
}

/// The ids of 8 replicas, `/r0` to `/r7`.
fn eight_replicas() -> Vec<String> {
    (0..8).map(|r| format!("/r{r}")).collect()
}

/// The key of prompt group `g` in the tests of prompts sent in turn.
fn key(g: usize) -> GroupKey {
    GroupKey {
        blocks: 4,
        digest: g as u64 + 1000,
    }
}

/// A fresh plan given one window of `before` (the group of each request), then the step of
/// [`step_in_turn`]; returns the step's requests per replica and its placements.
fn step_in_turn_after(before: &[usize], seed: u64, jitter: u64) -> (Vec<usize>, usize) {
    let ids = eight_replicas();
    let mut plan = BurstPlan::new(2000, 100);
    place_window(&mut plan, 1000, before, key, &ids, &[0; 8]);
    let windows = step_in_turn(seed, jitter);
    let timed = windows.iter().map(|(at, groups)| (*at, groups.as_slice()));
    place_timed_windows(&mut plan, seed, timed)
}

#[test]
fn a_step_sent_prompt_by_prompt_after_a_small_burst_lands_whole() {
    // A burst of two small groups, then 32 × 16 prompt by prompt over 250 ms in windows of up
    // to 40: the step soon has more requests than the small burst, but the counts of prompts
    // still arriving one after the other say nothing of their sizes. Taken as final sizes
    // once the step passed the small burst's requests, 9 of 100 orders split a prompt.
    for seed in 1..=100u64 {
        let (load, pairs) = step_in_turn_after(&[0, 1, 0, 1, 0, 1], seed, 0);
        assert_eq!((load, pairs), (vec![64; 8], 32), "order {seed}");
    }
}

#[test]
fn a_step_sent_prompt_by_prompt_after_unequal_groups_is_not_split_by_their_sizes() {
    // A burst of three unequal groups, then 32 × 16 prompt by prompt over 250 ms in windows
    // of up to 40, each request displaced by up to three places (a client's jitter): the
    // first prompts' counts rank like the last burst's sizes, but a prompt still arriving says
    // nothing of its size. Split when first placed as those sizes said, 10 of 100 orders
    // spread the first prompts over two or three replicas and left a replica up to 11 off its
    // 64 (live: one step at 35 placements, 56–70 requests per replica).
    let before: Vec<usize> = [32, 30, 12]
        .iter()
        .enumerate()
        .flat_map(|(g, &n)| std::iter::repeat_n(g, n))
        .collect();
    for seed in 1..=100u64 {
        let (load, pairs) = step_in_turn_after(&before, seed, 3);
        assert_eq!((load, pairs), (vec![64; 8], 32), "order {seed}");
    }
}

#[test]
fn new_groups_of_one_window_go_to_different_replicas_when_the_plan_allows() {
    // Prompt by prompt, a window can bring several new prompts while the replicas that took
    // the last ones are still running them. Five prompts of 16 after five on 8 replicas: the
    // three idle replicas take one each, and the last two go to replicas that already run a
    // prompt rather than queue behind a prefill on a replica just given one in this window.
    let ids = eight_replicas();
    let mut plan = BurstPlan::new(2000, 100);
    let first: Vec<usize> = (0..80).map(|i| i / 16).collect();
    let placed = place_window(&mut plan, 1000, &first, key, &ids, &[0; 8]);
    let mut running = vec![0u64; 8];
    for &r in &placed {
        running[r] += 1;
    }
    let next: Vec<usize> = (80..160).map(|i| i / 16).collect();
    let placed = place_window(&mut plan, 1010, &next, key, &ids, &running);
    let homes: BTreeSet<usize> = placed.iter().copied().collect();
    assert_eq!(homes.len(), 5, "{placed:?}");
}

#[test]
fn prompts_sent_in_turn_go_round_the_replicas() {
    // 32 × 16 prompt by prompt over 250 ms in windows of up to 40, each request displaced by
    // up to three places: each prompt goes to the replica whose newest prompt came longest
    // ago, so no replica prefills two prompts of any eight in a row. Taking the least planned
    // replica alone, with estimates of the prompts still arriving, put two prompts in a row on
    // one replica in every one of 100 orders, where they queue for prefill.
    let ids = eight_replicas();
    for seed in 1..=100u64 {
        let mut plan = BurstPlan::new(2000, 100);
        let mut running = vec![0u64; 8];
        let mut first_homes = Vec::new();
        let mut seen = BTreeSet::new();
        for (now, window) in step_in_turn(seed, 3) {
            let placed = place_window(&mut plan, now, &window, key, &ids, &running);
            for (&g, r) in window.iter().zip(placed) {
                running[r] += 1;
                if seen.insert(g) {
                    first_homes.push(r);
                }
            }
        }
        assert_eq!(running, vec![64; 8], "order {seed}");
        for eight in first_homes.windows(8) {
            let distinct: BTreeSet<usize> = eight.iter().copied().collect();
            assert_eq!(distinct.len(), 8, "order {seed}: {first_homes:?}");
        }
    }
}

/// 32 prompt lengths in blocks, 64 to 191 (1,024 to 3,071 tokens of 16), drawn by `seed`.
fn prompt_lengths(seed: u64) -> Vec<usize> {
    let mut next = switchyard_plugin_api::testing::numbers(seed ^ 0x5eed);
    (0..32).map(|_| 64 + next(128) as usize).collect()
}

/// Over 100 orders of 32 × 16 whose prompts are [`prompt_lengths`] long, the windows of each
/// from `windows_of(seed)`, placed over 8 replicas that run what the earlier windows sent
/// them by a plan of `window_ms` batch windows: asserts that every prompt lands whole and
/// every replica gets 64 requests, and returns the busiest replica's prefill (the blocks of
/// the prompts it holds) over the mean, on average and at most.
fn busiest_prefill(
    window_ms: u64,
    windows_of: impl Fn(u64) -> Vec<(u64, Vec<usize>)>,
) -> (f64, f64) {
    let ids = eight_replicas();
    let mut busiest = Vec::new();
    for seed in 1..=100u64 {
        let lengths = prompt_lengths(seed);
        let key = |g: usize| GroupKey {
            blocks: lengths[g],
            digest: g as u64 + 1000,
        };
        let mut plan = BurstPlan::new(2000, window_ms);
        let mut running = vec![0u64; 8];
        let mut homes = BTreeSet::new();
        for (now, window) in windows_of(seed) {
            let placed = place_window(&mut plan, now, &window, key, &ids, &running);
            for (&g, r) in window.iter().zip(placed) {
                running[r] += 1;
                homes.insert((g, r));
            }
        }
        assert_eq!((&running, homes.len()), (&vec![64; 8], 32), "order {seed}");
        let mut prefill = [0usize; 8];
        for &(g, r) in &homes {
            prefill[r] += lengths[g];
        }
        let mean = lengths.iter().sum::<usize>() as f64 / 8.0;
        busiest.push(prefill.iter().copied().max().unwrap_or(0) as f64 / mean);
    }
    let mean = busiest.iter().sum::<f64>() / busiest.len() as f64;
    (mean, busiest.iter().copied().fold(0.0, f64::max))
}

#[test]
fn prompts_of_different_lengths_sent_in_turn_even_out_each_replicas_prefill() {
    // 32 × 16 prompt by prompt over 250 ms, the prompts 1,024 to 3,071 tokens long: every
    // replica still takes four whole prompts, and among the replicas due the next one, each
    // goes to the one whose prefill it brings nearest the average. Round the replicas in
    // turn, the busiest replica prefilled 1.20 times the mean on average over 100 orders
    // (1.39 at most), then 1.12 (1.25); a step's slowest requests wait on it. (1.10 and 1.19
    // when prefill came before the number of groups, but a replica could then take a second
    // prompt before another had its first.) Counting only the groups still arriving, the
    // step's first prompts left the tally once a batch window had passed since their last
    // request, and the later ones were placed by the last window's prompts alone: counting
    // every prompt of the burst, 1.075 (1.29).
    let (mean, most) = busiest_prefill(100, |seed| step_in_turn(seed, 3));
    assert!(mean < 1.09 && most < 1.30, "mean {mean:.3}, most {most:.3}");
}

#[test]
fn prompts_sent_in_turn_even_out_each_replicas_prefill_with_a_short_batch_window() {
    // The same steps placed by a plan of 25 ms batch windows: a prompt stops arriving a
    // quarter as long after its last request, and with only the prompts still arriving in the
    // tally, the busiest replica prefilled 1.20 times the mean on average (1.39 at most), as
    // it did live with `windowDurationMs = 25`.
    let (mean, most) = busiest_prefill(25, |seed| step_in_turn(seed, 3));
    assert!(mean < 1.09 && most < 1.30, "mean {mean:.3}, most {most:.3}");
}

#[test]
fn prompts_of_different_lengths_sent_at_once_even_out_each_replicas_prefill() {
    // The same 32 × 16 in one window: the longest prompts are placed first, each where it
    // brings the prefill nearest the average. In arrival order, the busiest replica
    // prefilled 1.20 times the mean on average over 100 orders (1.38 at most), now 1.02
    // (1.04).
    let (mean, most) = busiest_prefill(100, |seed| {
        let mut next = switchyard_plugin_api::testing::numbers(seed);
        vec![(1000, shuffled_arrivals(&[16; 32], &mut next))]
    });
    assert!(mean < 1.04 && most < 1.08, "mean {mean:.3}, most {most:.3}");
}

#[test]
fn a_replica_over_the_ceiling_is_relieved_even_when_its_groups_other_homes_are_full() {
    // A group split early keeps a home on a replica that later fills up to the level; a
    // replica the group overloads must then hand the surplus to the least planned replica,
    // not give up because that home has no room. Over 100 arrival orders each, unequal groups
    // in windows of tens leave few replicas outside 10% of their share.
    for (max_window, most) in [(40, 12), (100, 10)] {
        let fair = UNEQUAL.iter().sum::<usize>() as f64 / 8.0;
        let outside = (1..=100)
            .filter(|&seed| {
                let mut plan = BurstPlan::new(2000, 100);
                let (load, _) =
                    burst_over_windows(&mut plan, &mut 0, &UNEQUAL, 8, seed, max_window);
                load.iter()
                    .any(|&l| (l as f64 - fair).abs() > (0.1 * fair).max(2.0))
            })
            .count();
        assert!(
            outside <= most,
            "windows of 1..={max_window}: {outside} of 100 orders out of balance"
        );
    }
}

/// The sizes of `bench/bursts` shape 5.
const SHAPE_5: [usize; 12] = [96, 8, 64, 24, 80, 16, 56, 32, 48, 40, 36, 12];

/// How long a client takes to send one step in these tests (`bench/bursts` shape 5 spreads
/// its steps over 50 ms).
const STEP_SPREAD_MS: u64 = 50;

/// Groups of `sizes` members arriving in a random order, cut into windows of `cuts` requests
/// (the last one cut short), over 8 replicas; returns the requests per replica and the
/// (group, replica) placements. The requests arrive evenly over [`STEP_SPREAD_MS`], and a
/// window is placed when its last request has come.
fn burst_cut_as(
    plan: &mut BurstPlan,
    sizes: &[usize],
    seed: u64,
    cuts: &[usize],
) -> (Vec<usize>, usize) {
    burst_cut_as_from(plan, sizes, seed, cuts, 0, STEP_SPREAD_MS)
}

/// [`burst_cut_as`] from `from_ms` on the plan's clock, its requests spread over `spread_ms`.
fn burst_cut_as_from(
    plan: &mut BurstPlan,
    sizes: &[usize],
    seed: u64,
    cuts: &[usize],
    from_ms: u64,
    spread_ms: u64,
) -> (Vec<usize>, usize) {
    let mut next = switchyard_plugin_api::testing::numbers(seed);
    let arrivals = shuffled_arrivals(sizes, &mut next);
    let (mut at, mut now) = (0, from_ms);
    let mut windows = Vec::with_capacity(cuts.len());
    for &cut in cuts {
        let window = &arrivals[at..(at + cut).min(arrivals.len())];
        at += window.len();
        now = (from_ms + spread_ms * at as u64 / arrivals.len() as u64).max(now + 1);
        windows.push((now, window));
    }
    assert_eq!(at, arrivals.len());
    place_timed_windows(plan, seed, windows)
}

/// Places `windows` (each the time it is placed and the group of each request) over 8
/// replicas that run what the earlier windows sent them, the groups keyed by `step`; returns
/// the requests per replica and the (group, replica) placements.
fn place_timed_windows<'a>(
    plan: &mut BurstPlan,
    step: u64,
    windows: impl IntoIterator<Item = (u64, &'a [usize])>,
) -> (Vec<usize>, usize) {
    let (load, pairs) = placed_timed_windows(plan, step, windows);
    (load, pairs.len())
}

/// [`place_timed_windows`], returning each (group, replica) placement.
fn placed_timed_windows<'a>(
    plan: &mut BurstPlan,
    step: u64,
    windows: impl IntoIterator<Item = (u64, &'a [usize])>,
) -> (Vec<usize>, BTreeSet<(usize, usize)>) {
    placed_timed_windows_seen(plan, step, windows, |_| {})
}

/// [`placed_timed_windows`], showing the plan to `seen` after each window.
fn placed_timed_windows_seen<'a>(
    plan: &mut BurstPlan,
    step: u64,
    windows: impl IntoIterator<Item = (u64, &'a [usize])>,
    seen: impl FnMut(&BurstPlan),
) -> (Vec<usize>, BTreeSet<(usize, usize)>) {
    placed_timed_windows_of_lengths(plan, step, windows, |_| 4, seen)
}

/// [`placed_timed_windows_seen`], the prompt of group `g` `blocks(g)` blocks long.
fn placed_timed_windows_of_lengths<'a>(
    plan: &mut BurstPlan,
    step: u64,
    windows: impl IntoIterator<Item = (u64, &'a [usize])>,
    blocks: impl Fn(usize) -> usize,
    mut seen: impl FnMut(&BurstPlan),
) -> (Vec<usize>, BTreeSet<(usize, usize)>) {
    let ids: Vec<String> = (0..8).map(|r| format!("/r{r}")).collect();
    let mut load = vec![0usize; 8];
    let mut pairs = BTreeSet::new();
    let key = |g: usize| GroupKey {
        blocks: blocks(g),
        digest: step << 32 | g as u64,
    };
    for (now, window) in windows {
        let running: Vec<u64> = load.iter().map(|&n| n as u64).collect();
        for (&g, r) in window
            .iter()
            .zip(place_window(plan, now, window, key, &ids, &running))
        {
            load[r] += 1;
            pairs.insert((g, r));
        }
        seen(plan);
    }
    (load, pairs)
}

#[test]
fn unequal_groups_in_the_windows_a_live_client_makes_split_along_groups_already_shared() {
    // Shape 5 as one step of it reached the router: 7 windows of 156, 1, 57, 73, 73, 20 and
    // 132 requests. Over 100 arrival orders, a replica over the level first hands load along
    // groups it already shares (what their parts hold beyond the members already sent), and a
    // replica below the floor pulls that way: fewer new homes than moving only the largest
    // group, and tighter balance (moving the largest group alone: 23.4 placements, 6 orders
    // out of balance).
    let cuts = [156, 1, 57, 73, 73, 20, 132];
    let (mut total, mut outside) = (0, 0);
    for seed in 1..=100 {
        let mut plan = BurstPlan::new(2000, 100);
        let (load, pairs) = burst_cut_as(&mut plan, &SHAPE_5, seed, &cuts);
        total += pairs;
        outside += usize::from(load.iter().any(|&l| l.abs_diff(64) > 6));
    }
    let mean = total as f64 / 100.0;
    assert!(mean <= 22.0, "{mean} placements");
    assert!(outside <= 3, "{outside} of 100 orders out of balance");
}

/// Prints the README's table of placements (mean, worst and largest deviation from the fair
/// share, over 20 orders): `cargo test -p burst-prefix-cache-producer placement_table --
/// --ignored --nocapture`.
#[test]
#[ignore]
fn placement_table() {
    for sizes in [&[16; 32][..], &[128; 4], &UNEQUAL, &SHAPE_5] {
        let row: Vec<String> = [1, 10, 40, 100, 200, 100_000]
            .iter()
            .map(|&w| {
                let (mean, worst, dev) = measure(sizes, w);
                format!("{mean:.1} ({worst}, {dev:.2})")
            })
            .collect();
        println!("{:?}: {}", &sizes[..3], row.join(" | "));
    }
}

/// How shape-5 steps reached the router live (`bench/bursts`, 15 steps): the requests of each
/// window the plan placed.
const LIVE_CUTS: [&[usize]; 15] = [
    &[156, 1, 57, 73, 73, 20, 132],
    &[266, 22, 11, 213],
    &[428, 1, 18, 26, 39],
    &[180, 1, 87, 9, 158, 1, 76],
    &[283, 1, 5, 68, 155],
    &[71, 40, 142, 1, 258],
    &[42, 67, 1, 402],
    &[281, 30, 35, 166],
    &[67, 1, 304, 121, 1, 16, 2],
    &[150, 362],
    &[92, 420],
    &[107, 405],
    &[512],
    &[410, 102],
    &[508, 4],
];

/// What [`second_step_over_live_cuts`] measured over its runs.
struct SecondSteps {
    /// Mean (group, replica) placements of a step.
    placements: f64,
    /// Steps with more placements than P + R − 1.
    over_bound: usize,
    /// Steps with a replica off its share by more than the given number of requests.
    outside: usize,
    runs: usize,
}

impl SecondSteps {
    fn assert_over_bound_at_most(&self, most: usize) {
        assert!(
            self.over_bound <= most,
            "{} of {} steps over P + R - 1",
            self.over_bound,
            self.runs
        );
    }

    fn assert_out_of_balance_at_most(&self, most: usize) {
        assert!(
            self.outside <= most,
            "{} of {} steps out of balance",
            self.outside,
            self.runs
        );
    }
}

/// How the first step of [`second_step_over_live_cuts`] reaches the plan.
#[derive(Clone, Copy)]
enum FirstStep<'a> {
    /// Groups of these sizes, cut as the second step is.
    Cut(&'a [usize]),
    /// Groups of these sizes, all in one window.
    AtOnce(&'a [usize]),
}

/// Shape 5 cut as each of [`LIVE_CUTS`], `orders` arrival orders each, as the second step
/// through one plan: the first step teaches it the sizes of a step's groups and how long a
/// step is; the second has `sizes`, cut in windows scaled to its total and sent over
/// `spread_ms`. A replica counts as out of balance when it is off its share by more than
/// `off` requests.
fn second_step_over_live_cuts(
    first: FirstStep<'_>,
    sizes: &[usize],
    off: usize,
    orders: u64,
    spread_ms: u64,
) -> SecondSteps {
    let total: usize = sizes.iter().sum();
    let fair = total / 8;
    let bound = sizes.len() + 8 - 1;
    let (mut pairs_sum, mut over_bound, mut outside, mut runs) = (0, 0, 0, 0);
    for cuts in LIVE_CUTS {
        let scaled: Vec<usize> = cuts.iter().map(|c| (c * total).div_ceil(512)).collect();
        let before = (pairs_sum, over_bound, outside);
        for seed in 1..=orders {
            let mut plan = BurstPlan::new(2000, 100);
            let _ = match first {
                FirstStep::Cut(first) => burst_cut_as(&mut plan, first, seed + 1000, cuts),
                FirstStep::AtOnce(first) => {
                    burst_cut_as(&mut plan, first, seed + 1000, &[first.iter().sum()])
                }
            };
            let (load, pairs) = burst_cut_as_from(&mut plan, sizes, seed, &scaled, 1000, spread_ms);
            pairs_sum += pairs;
            over_bound += usize::from(pairs > bound);
            outside += usize::from(load.iter().any(|&l| l.abs_diff(fair) > off));
            runs += 1;
        }
        if std::env::var_os("LIVE_CUTS_EACH").is_some() {
            println!(
                "{cuts:?}: {:.2} placements, {} over P + R - 1, {} out of balance",
                (pairs_sum - before.0) as f64 / orders as f64,
                over_bound - before.1,
                outside - before.2
            );
        }
    }
    SecondSteps {
        placements: pairs_sum as f64 / runs as f64,
        over_bound,
        outside,
        runs,
    }
}

#[test]
fn unequal_groups_like_the_previous_steps_are_sized_from_it() {
    // A step of shape 5 after another: the previous step's group sizes, by rank, predict the
    // new groups' sizes better than their first counts do (without that prior: 11 of 600
    // orders out of balance), and its length tells how far the new step has come: until 70%
    // of it, a replica may run further over the level before it gets a new home. With new
    // homes opened on the first noisy counts, 166 of 600 steps went over P + R − 1. A group
    // the prior says is larger than a share splits when it is first placed, before smaller
    // groups fill in around it: split only once its replica is over, 17.7 placements a step
    // and 41 of 600 steps over P + R − 1. A new home that closes a cycle of groups and
    // replicas, or goes past P + R − 1 placements, waits until a replica would end outside the
    // balance bound: opened for any excess past the allowance, 14 of 600 over; waiting only
    // when it closes a cycle, 8. A replica under the level gets a new home only for as large
    // a shortfall as an over replica needs for one: rescued from any shortfall below the
    // floor, 16.4 placements and 6 over. Close counts sharing the sizes they could have
    // (`rank_match`) leaves 3 over, as before, and 3 out of balance where none were; a
    // replica left out of the bound and out of reach once the step has brought as many
    // requests as the last getting a new home, 1. A first window must bring 60% of the last
    // step's requests to count as the step at once (not 40%): 1 over.
    let steps =
        second_step_over_live_cuts(FirstStep::Cut(&SHAPE_5), &SHAPE_5, 6, 40, STEP_SPREAD_MS);
    assert!(steps.placements <= 16.2, "{} placements", steps.placements);
    steps.assert_over_bound_at_most(1);
    steps.assert_out_of_balance_at_most(1);
}

#[test]
fn a_step_after_one_sent_at_once_is_measured_by_its_requests() {
    // Shape 5 after a step of it that reached the router in one window: that step had no
    // length, so how far the next has come is read from its requests alone. Read from its
    // time against a length of zero, the wait for new homes ended with the next step's
    // second window: 57 of 600 steps over P + R − 1 (14 with every new home that closes a
    // cycle of groups and replicas opened past the allowance, not only to keep the balance
    // bound; 8 with only those waiting, not the homes past P + R − 1; 6 with a replica under
    // the level rescued from any shortfall below the floor). Close counts sharing the sizes
    // they could have leaves 3 over, as before, and 3 out of balance where none were (1 with
    // the new home of a replica left out of the bound at the end). Since a first window must
    // bring 60% of the last step's requests to count as the step at once, 1 over.
    let steps =
        second_step_over_live_cuts(FirstStep::AtOnce(&SHAPE_5), &SHAPE_5, 6, 40, STEP_SPREAD_MS);
    steps.assert_over_bound_at_most(1);
    steps.assert_out_of_balance_at_most(1);
}

#[test]
fn the_first_unequal_step_waits_for_its_counts_too() {
    // Shape 5 after 4 x 128: no sizes to carry, but the step before still says how long a
    // step is. Opening new homes on the first counts: 178 of 600 steps over P + R − 1, 11
    // out of balance. Near its end the counts are near the final sizes: shrinking them as
    // much as at its start left 16 of 600 out of balance, and opening a new home for any
    // excess over the ceiling, however near the end, 72 over P + R − 1; opening one that
    // closes a cycle of groups and replicas for less than the balance bound, 48; holding
    // those back but not the homes past P + R − 1, 28; rescuing a replica under the level
    // from any shortfall below the floor, 21; 12 before new homes came in rounds, 13 since.
    // Since a group larger than a share splits when first placed in a window that brings the
    // step at once, 12, and 4 out of balance (3 before; none since a replica left out of the
    // bound at the end gets a new home). Since a first window must bring 60% of the last
    // step's requests, not 40%, to count as the step at once, 4: a first window of half the
    // step, balanced at once, spent the placements the second half needed.
    let steps =
        second_step_over_live_cuts(FirstStep::Cut(&[128; 4]), &SHAPE_5, 6, 40, STEP_SPREAD_MS);
    steps.assert_over_bound_at_most(4);
    steps.assert_out_of_balance_at_most(0);
}

#[test]
fn a_smaller_step_with_the_same_proportions_stays_balanced() {
    // Half of shape 5 after a whole one, sent over the same time: the prior is a proportion,
    // not a size (without it: 181 of 600 orders out of balance), and as the step lasts as
    // long as the last one the wait for new homes ends although it brings only half the
    // requests (measured by requests alone: 209 of 600). Sent at once, its one window is
    // balanced at once.
    let half: Vec<usize> = SHAPE_5.iter().map(|s| s / 2).collect();
    let steps = second_step_over_live_cuts(FirstStep::Cut(&SHAPE_5), &half, 3, 40, STEP_SPREAD_MS);
    steps.assert_out_of_balance_at_most(20);
}

#[test]
fn a_smaller_step_sent_at_the_same_pace_ends_near_balance() {
    // Half of shape 5 after a whole one, sent in half the time: it brings half the last
    // step's requests in half its time, so new homes wait all through it, with an allowance
    // down to 12% over the level when it ends. 209 of 600 such steps end with a replica 4 or
    // more off its 32 requests (opening new homes at once: 5); 15 more than 6 off. With sizes
    // matched to counts rank by rank, 22 more than 6 off; 41 since close counts share the
    // sizes they could have (`rank_match`): such a step is further on than its share of the
    // last one's requests says, so its counts are taken for noisier than they are, and its
    // large groups' sizes for nearer their neighbours'.
    let half: Vec<usize> = SHAPE_5.iter().map(|s| s / 2).collect();
    let steps =
        second_step_over_live_cuts(FirstStep::Cut(&SHAPE_5), &half, 6, 40, STEP_SPREAD_MS / 2);
    steps.assert_out_of_balance_at_most(46);
}

/// Shape 5 as the second of two steps through one plan, 100 orders: the first cut as
/// `first_cuts`, the second as `cuts`, each sent over `spread_ms`; `check` sees the plan after
/// each order. Returns the orders over P + R − 1, the orders with a replica more than 6 off
/// 64, and the placements over all orders.
fn shape_5_after_a_step(
    first_cuts: &[usize],
    cuts: &[usize],
    spread_ms: u64,
    mut check: impl FnMut(&BurstPlan, u64),
) -> (usize, usize, usize) {
    let (mut over, mut outside, mut pairs_sum) = (0, 0, 0);
    for seed in 1..=100 {
        let mut plan = BurstPlan::new(2000, 100);
        let _ = burst_cut_as_from(&mut plan, &SHAPE_5, seed + 1000, first_cuts, 0, spread_ms);
        let (load, pairs) = burst_cut_as_from(&mut plan, &SHAPE_5, seed, cuts, 1000, spread_ms);
        check(&plan, seed);
        over += usize::from(pairs > 19);
        outside += usize::from(load.iter().any(|&l| l.abs_diff(64) > 6));
        pairs_sum += pairs;
    }
    (over, outside, pairs_sum)
}

#[test]
fn the_slow_tail_of_a_step_does_not_hide_the_start_of_the_next() {
    // Shape 5 over 250 ms in windows of 40, then, a second after it began, the next step the
    // same way. The last step's smallest groups pace their requests 30 ms or more apart, and
    // a pause of the whole stream keeps such a group for four of its limits; when the stream
    // resumes with none of them, the next step begins (and the last one's requests and
    // length say how far it has come). Kept as if stalled, they made the two steps one
    // burst: no wait for new homes, 63 of 100 orders over P + R − 1 and 18 out of balance.
    // Ended, 34 over and none out; with new homes in rounds, 13 over and 2 out.
    let cuts: Vec<usize> = std::iter::repeat_n(40, 12).chain([32]).collect();
    let (over, outside, _) = shape_5_after_a_step(&cuts, &cuts, 250, |plan, seed| {
        assert_eq!(
            plan.describe()["previousBurst"]["requests"],
            512,
            "order {seed}"
        );
    });
    assert!(over <= 13, "{over} of 100 orders over P + R − 1");
    assert!(outside <= 2, "{outside} of 100 orders out of balance");
}

#[test]
fn new_homes_over_many_small_windows_come_in_rounds() {
    // Shape 5 over 250 ms in windows of 23 requests, after a step sent the same way: each
    // window correcting the last one's guess with a new home of its own, 51 of 100 orders went
    // over P + R − 1 (3 out of balance). Once a window opened one, the next new home waits for
    // another replica's share of the last step's requests, or one and a half of its share of
    // the last step's length.
    let mut cuts = vec![23; 512 / 23];
    cuts.push(512 % 23);
    let (over, outside, _) = shape_5_after_a_step(&cuts, &cuts, 250, |plan, seed| {
        let round = &plan.describe()["nextHomeRound"];
        assert!(
            round["burstRequests"].as_u64() > Some(0),
            "order {seed}: {round}"
        );
    });
    assert!(over <= 21, "{over} of 100 orders over P + R − 1");
    assert!(outside <= 2, "{outside} of 100 orders out of balance");
}

#[test]
fn there_are_no_rounds_of_new_homes_without_a_previous_burst_with_a_length() {
    // The first burst a plan sees has nothing to measure a round by, nor has the step after
    // one that came in one window: their new homes open as the counts call for them.
    let cuts: Vec<usize> = std::iter::repeat_n(40, 12).chain([32]).collect();
    let mut plan = BurstPlan::new(2000, 100);
    let _ = burst_cut_as_from(&mut plan, &SHAPE_5, 1, &cuts, 0, 250);
    assert!(plan.describe()["nextHomeRound"].is_null());
    let _ = burst_cut_as_from(&mut plan, &SHAPE_5, 2, &[512], 1000, 250);
    assert!(!plan.describe()["nextHomeRound"].is_null());
    let _ = burst_cut_as_from(&mut plan, &SHAPE_5, 3, &cuts, 2000, 250);
    assert!(plan.describe()["nextHomeRound"].is_null());
    let _ = burst_cut_as_from(&mut plan, &SHAPE_5, 4, &cuts, 3000, 250);
    assert!(!plan.describe()["nextHomeRound"].is_null());
}

#[test]
fn early_windows_of_one_or_two_groups_a_replica_split_on_later_counts() {
    // Shape 5 after a step that came in one window, cut into windows of 60 requests: the
    // first windows leave each replica one or two groups, and which replica is over is then a
    // matter of which group landed where, not of sizes the counts can tell yet. While the wait
    // is on, an excess of up to a group (fading as the step comes on) gets no new home: with
    // the shares' allowance alone, 27 of 100 orders went over P + R − 1 and 5 ended out of
    // balance.
    let cuts = [60, 60, 60, 60, 60, 60, 60, 92];
    let (over, outside, _) = shape_5_after_a_step(&[512], &cuts, STEP_SPREAD_MS, |_, _| {});
    assert!(over <= 22, "{over} of 100 orders over P + R − 1");
    assert!(outside <= 3, "{outside} of 100 orders out of balance");
}

#[test]
fn equal_groups_after_a_shorter_step_still_land_whole() {
    // 32 × 16 over 250 ms after 32 × 16 over 30 ms, in windows of 1 to 40 requests: a count's
    // noise fades as the step nears the last one's requests, but the spread of 32 counts is
    // itself noisy, so equal groups are only taken as unequal when their counts spread more
    // than twice that noise over the expected. Without that margin 33 of 200 such steps split
    // a group; at once 32 × 16 over 8 replicas needs none.
    for seed in 1..=100 {
        let mut plan = BurstPlan::new(2000, 100);
        let _ = burst_cut_as_from(&mut plan, &[16; 32], seed + 1000, &[512], 0, 30);
        let mut next = switchyard_plugin_api::testing::numbers(seed + 77);
        let mut cuts = Vec::new();
        let mut left = 512;
        while left > 0 {
            let cut = (1 + next(40) as usize).min(left);
            cuts.push(cut);
            left -= cut;
        }
        let (load, pairs) = burst_cut_as_from(&mut plan, &[16; 32], seed, &cuts, 1000, 250);
        assert_eq!((load, pairs), (vec![64; 8], 32), "order {seed}");
    }
}

#[test]
fn equal_groups_after_unequal_ones_are_taken_as_equal() {
    // 32 × 16 after a step of shape 5: the counts spread around "all alike" less than around
    // the previous step's sizes, so that prior is not used, and the groups land whole.
    let steps =
        second_step_over_live_cuts(FirstStep::Cut(&SHAPE_5), &[16; 32], 6, 10, STEP_SPREAD_MS);
    assert!(steps.placements <= 33.0, "{} placements", steps.placements);
    steps.assert_out_of_balance_at_most(0);
}

#[test]
fn the_state_measures_the_latest_burst_against_its_bounds() {
    // A step of half of shape 5 at the pace of the shape-5 step before it: it often ends out of
    // balance (see `live_cuts_table`), so the state must say so as often as it happens. It
    // counts the step's own groups only, not those of the step before, still remembered.
    let half: Vec<usize> = SHAPE_5.iter().map(|s| s / 2).collect();
    let cuts = LIVE_CUTS[0];
    let scaled: Vec<usize> = cuts.iter().map(|c| (c * 256).div_ceil(512)).collect();
    let mut verdicts = [0; 2];
    for seed in 1..=20 {
        let mut plan = BurstPlan::new(2000, 100);
        let _ = burst_cut_as(&mut plan, &SHAPE_5, seed + 1000, cuts);
        let (load, pairs) =
            burst_cut_as_from(&mut plan, &half, seed, &scaled, 1000, STEP_SPREAD_MS / 2);
        let burst = &plan.describe()["burst"];
        let fair = 256.0 / 8.0;
        let balanced = load.iter().all(|&n| (n as f64 - fair).abs() <= 3.2);
        let within = balanced && pairs <= 19;
        assert_eq!(burst["groups"], 12, "{burst}");
        assert_eq!(burst["requests"], 256, "{burst}");
        assert_eq!(burst["placements"], pairs, "{burst}");
        assert_eq!(burst["placementBound"], 19, "{burst}");
        assert_eq!(
            burst["fewestPerReplica"],
            load.iter().min().copied().unwrap_or(0)
        );
        assert_eq!(
            burst["mostPerReplica"],
            load.iter().max().copied().unwrap_or(0)
        );
        assert_eq!(burst["withinBounds"], within, "{burst} {load:?}");
        verdicts[usize::from(within)] += 1;
    }
    assert!(verdicts[0] > 0 && verdicts[1] > 0, "{verdicts:?}");
}

#[test]
fn equal_groups_of_other_counts_after_unequal_ones_are_taken_as_equal() {
    // Equal steps after a step of shape 5 (an evaluation batch between two training steps):
    // 12 × 40 has as many groups as shape 5, so only the counts can tell that its sizes differ
    // from the last step's; its replicas' shares are a group and a half each, so 16 placements
    // at the least. Taking the last step's sizes whenever the counts did not fit "all alike"
    // clearly better (rather than only when they fit those sizes clearly better) made 19.9
    // placements a step of 12 × 40 here; over 40 orders per cut, it left 183 of 600 orders of
    // 12 × 40 out of balance and took 90 of 4 × 128 over P + R − 1.
    for (sizes, least) in [(&[40; 12][..], 16.0), (&[32; 16], 16.0), (&[128; 4], 8.0)] {
        let steps =
            second_step_over_live_cuts(FirstStep::Cut(&SHAPE_5), sizes, 6, 10, STEP_SPREAD_MS);
        assert!(
            steps.placements <= least + 0.25,
            "{} × {}: {} placements",
            sizes.len(),
            sizes[0],
            steps.placements
        );
        steps.assert_over_bound_at_most(1);
        steps.assert_out_of_balance_at_most(1);
    }
}

/// Prints, for shape 5 after a step of it cut the same way, placements and balance over 100
/// orders when both steps come in even windows, spread over 50 or 250 ms (a slow client, or
/// one whose requests the router reads at a steady pace): `cargo test -p
/// burst-prefix-cache-producer even_cuts_table -- --ignored --nocapture`.
#[test]
#[ignore]
fn even_cuts_table() {
    for spread_ms in [STEP_SPREAD_MS, 250] {
        for window in [23, 40, 60, 100] {
            let mut cuts = vec![window; 512 / window];
            if 512 % window > 0 {
                cuts.push(512 % window);
            }
            let (over, outside, pairs_sum) =
                shape_5_after_a_step(&cuts, &cuts, spread_ms, |_, _| {});
            println!(
                "windows of {window} over {spread_ms} ms: {:.2} placements, {over} of 100 over \
                 P + R - 1, {outside} out of balance",
                pairs_sum as f64 / 100.0
            );
        }
    }
}

/// Prints [`second_step_over_live_cuts`] per cut: `LIVE_CUTS_EACH=1 cargo test -p
/// burst-prefix-cache-producer live_cuts_table -- --ignored --nocapture`.
#[test]
#[ignore]
fn live_cuts_table() {
    let half: Vec<usize> = SHAPE_5.iter().map(|s| s / 2).collect();
    let cases: [(&str, FirstStep<'_>, &[usize], u64); 8] = [
        (
            "shape 5 after shape 5",
            FirstStep::Cut(&SHAPE_5),
            &SHAPE_5,
            STEP_SPREAD_MS,
        ),
        // The first unequal step of a series: the step before had equal groups.
        (
            "shape 5 after 4 x 128",
            FirstStep::Cut(&[128; 4]),
            &SHAPE_5,
            STEP_SPREAD_MS,
        ),
        (
            "half of shape 5 over the same time",
            FirstStep::Cut(&SHAPE_5),
            &half,
            STEP_SPREAD_MS,
        ),
        (
            "half of shape 5 at the same pace",
            FirstStep::Cut(&SHAPE_5),
            &half,
            STEP_SPREAD_MS / 2,
        ),
        // After a burst of another shape and twice the size, over the same time or faster.
        (
            "half of shape 5 after 4 x 128",
            FirstStep::Cut(&[128; 4]),
            &half,
            STEP_SPREAD_MS,
        ),
        (
            "half of shape 5 after 4 x 128, at its pace",
            FirstStep::Cut(&[128; 4]),
            &half,
            STEP_SPREAD_MS / 2,
        ),
        // After a step that reached the router in one window: no length to go by.
        (
            "shape 5 after shape 5 at once",
            FirstStep::AtOnce(&SHAPE_5),
            &SHAPE_5,
            STEP_SPREAD_MS,
        ),
        (
            "half of shape 5 after shape 5 at once",
            FirstStep::AtOnce(&SHAPE_5),
            &half,
            STEP_SPREAD_MS,
        ),
    ];
    for (name, first, sizes, spread_ms) in cases {
        let off = if sizes.iter().sum::<usize>() < 512 {
            3
        } else {
            6
        };
        let steps = second_step_over_live_cuts(first, sizes, off, 40, spread_ms);
        println!(
            "{name}: {:.2} placements, {} of {} over P + R - 1, {} out of balance",
            steps.placements, steps.over_bound, steps.runs, steps.outside
        );
    }
}

#[test]
fn a_stream_of_groups_that_never_pauses_keeps_a_bounded_prior() {
    // Every window starts a group and adds to the one before: a burst never ends, and the
    // groups forgotten meanwhile are kept as the next prior only up to a bound.
    let mut plan = BurstPlan::new(2000, 100);
    let ids: Vec<String> = (0..8).map(|r| format!("/r{r}")).collect();
    let key = |g: usize| GroupKey {
        blocks: 4,
        digest: g as u64,
    };
    for g in 1..(PRIOR_GROUPS + 600) {
        let window = [g, g, g - 1];
        place_window(&mut plan, 10 * g as u64, &window, key, &ids, &[0; 8]);
    }
    assert!(plan.forgotten_sizes.len() <= PRIOR_GROUPS);
    assert!(
        plan.forgotten_sizes.len() > PRIOR_GROUPS / 2,
        "the stream's groups were forgotten: {}",
        plan.forgotten_sizes.len()
    );
}

/// Steps of `bench/bursts` shape 5 as they reached the router in nineteen live runs of two or
/// four rounds:
/// for each step, `# run R step S`, then one line per window: the time it was placed (ms, on
/// the router's clock) and the group of each of its requests in arrival order.
const LIVE_STEPS: &str = include_str!("live_steps.txt");

/// One window of a recorded step: when it was placed, and the group of each request.
type LiveWindow = (u64, Vec<usize>);

/// Steps of `bench/bursts` shape 9 (shape 5's groups sent over 250 ms) as they reached the
/// router live, in the format of [`LIVE_STEPS`]: per round, the last step of shape 8 (32 × 16
/// sent prompt by prompt over 250 ms, which the bench sends just before), then shape 9's two
/// steps.
const LIVE_STEPS_250_MS: &str = include_str!("live_steps_250ms.txt");

/// The windows of each step in [`LIVE_STEPS`], after its header.
fn live_steps() -> Vec<(String, Vec<LiveWindow>)> {
    steps_of(LIVE_STEPS)
}

/// The windows of each step of recorded live steps, after its header.
fn steps_of(text: &str) -> Vec<(String, Vec<LiveWindow>)> {
    let mut steps: Vec<(String, Vec<LiveWindow>)> = Vec::new();
    for line in text.lines() {
        if let Some(header) = line.strip_prefix("# ") {
            steps.push((header.to_string(), Vec::new()));
            continue;
        }
        let mut fields = line.split(' ').map(|f| f.parse::<u64>().expect("a number"));
        let at = fields.next().expect("a time");
        let groups = fields.map(|g| g as usize).collect();
        steps
            .last_mut()
            .expect("a step header")
            .1
            .push((at, groups));
    }
    steps
}

#[test]
fn the_live_steps_replayed_stay_within_the_placement_bound() {
    // Every step recorded live, replayed window by window at its recorded times through one
    // plan per round, as in `bench/bursts`: a step of 4 x 128 just before the first (here one
    // sent over 50 ms; live two over 30 ms), then the two steps of shape 5. P + R - 1 = 19
    // per step. Placements live, by when the steps were recorded:
    // - before new homes waited for the counts: 17, 20, 17, 19, 21, 18, 20, 20;
    // - after: 21, 18, 18, 19; 21, 18, 18, 17; 19, 17, 21, 18;
    // - while a count's noise was as large at a step's end as at its start: 17, 19; 17, 17
    //   (the first left a replica at 57 of 64);
    // - after it faded: 17, 17; 19, 17; 17, 17; 17, 17 and 17, 22; 20, 18; 17, 20; 17, 17 (the
    //   22 and 20s after first windows of 40–65% of a step, balanced at once with slivers of
    //   its largest groups, before a group the prior says is larger than a share split when
    //   first placed);
    // - after that: 24, 19; 17, 19; 17, 20; 17, 20 (a first step in 17 windows; the 20s after
    //   a step in one window, whose length of zero ended the wait for new homes at once);
    // - after a step in one window no longer did: 17, 14; 18, 19; 19, 20; 17, 17;
    // - after counts stopped fading while new groups appear, on a loaded machine (load 2.5):
    //   18, 18; 18, 21; 19, 14; 19, 19;
    // - after new homes that close a cycle of groups and replicas waited for the balance
    //   bound: 17, 15; 17, 16; 16, 16; 19, 14 and 18, 18; 17, 19; 17, 14; 16, 18;
    // - after the first prompts of a step sent in turn stopped being split on a prior:
    //   16, 16; 17, 17; 16, 16; 17, 19;
    // - after prompts sent in turn went round the replicas: 19, 15; 17, 17; 17, 15; 17, 14
    //   and 18, 18; 17, 17; 17, 14; 17, 17;
    // - after new homes past P + R − 1 waited too, and a replica out of reach got one only for
    //   as large a shortfall as an over replica needs: 16, 17; 18, 14; 17, 14; 17, 14;
    // - after a second wave of groups got its own estimate: 17, 14; 18, 16; 18, 17; 17, 16
    //   and 16, 15; 16, 16; 17, 15; 17, 22 (the 22 after a step that came in one window, its
    //   first window 46 requests: four groups split on those first counts, five more homes
    //   later; it replays as 19 since an early excess of up to a group waits).
    // Every replica must end within 10% of its share. Over the bound: no second step (with
    // the sizes of the first to go by), and one first step (no sizes to carry), by four.
    // Without the early tolerance of a group, the 22 above replays as 22. Opening new homes
    // that close a cycle of groups and replicas for any excess past the allowance: three
    // second steps over, up to 21, and six first; holding those back but not the homes past
    // P + R − 1, two and three; and those too, but rescuing a replica under the level from
    // any shortfall below the floor, one and two.
    let mut plan = BurstPlan::new(2000, 100);
    let (mut firsts, mut seconds, mut prompts_on_busiest) = (Vec::new(), Vec::new(), Vec::new());
    let mut at_once = Vec::new();
    for (header, windows) in live_steps() {
        let first = header.ends_with("step 0");
        if first {
            plan = BurstPlan::new(2000, 100);
            let from = windows[0].0 - 1000;
            let _ = burst_cut_as_from(&mut plan, &[128; 4], 7, &[100, 150, 120, 142], from, 50);
        }
        let step = windows[0].0;
        let timed = windows.iter().map(|(at, groups)| (*at, groups.as_slice()));
        let (load, placed) = placed_timed_windows(&mut plan, step, timed);
        let pairs = placed.len();
        let busiest = (0..8)
            .map(|r| placed.iter().filter(|&&(_, on)| on == r).count())
            .max()
            .unwrap_or(0);
        prompts_on_busiest.push(busiest);
        assert_eq!(load.iter().sum::<usize>(), 512, "{header}");
        assert!(
            load.iter().all(|&l| l.abs_diff(64) <= 6),
            "{header}: {load:?}"
        );
        if first {
            if windows.len() == 1 {
                at_once.push(pairs);
            }
            firsts.push(pairs);
        } else {
            seconds.push(pairs);
        }
    }
    let over = |steps: &[usize]| steps.iter().filter(|&&p| p > 19).count();
    let most = |steps: &[usize]| steps.iter().copied().max().unwrap_or(0);
    assert!(over(&seconds) == 0, "second steps: {seconds:?}");
    assert!(
        over(&firsts) <= 1 && most(&firsts) <= 23,
        "first steps: {firsts:?}"
    );
    // A first step that came in one window has no prior in the 4 x 128 before it, yet its
    // counts are its sizes: its two groups larger than a share split once each when first
    // placed, 14 placements. Split only by the rebalance, after the smaller groups had filled
    // in around them, the largest took slivers on up to five more replicas: 17 in each of the
    // six (and 1,098 placements over the 64 first steps; 1,040 now).
    assert!(
        !at_once.is_empty() && at_once.iter().all(|&p| p == 14),
        "first steps in one window: {at_once:?}"
    );
    // A replica prefills each prompt it gets a part of, and the step's slowest requests wait
    // on the replica with the most. At most three on each in 97 of the 128 steps, and never
    // more than five (in four); 94 without the early tolerance of a group; rescuing a replica
    // out of reach for any shortfall below the floor, not only one as large as the excess
    // that gets an over replica a new home, four or more in 47 of the first 120 steps and
    // five in six. Since close counts share the sizes they could have: four or more in 36,
    // never more than five.
    let busy = prompts_on_busiest.iter().filter(|&&p| p > 3).count();
    assert!(
        busy <= 36 && most(&prompts_on_busiest) <= 5,
        "most prompts on a replica: {prompts_on_busiest:?}"
    );
}

#[test]
fn an_unequal_step_after_a_burst_of_equal_groups_goes_by_the_last_unequal_sizes() {
    // Shape 5, then two groups of 8 and 2 that came together, then 32 x 16 (an evaluation
    // batch between two training steps, say), then shape 5 again, the last two cut as live
    // steps reached the router, over 50 ms, 40 orders per cut. Going by the equal groups just
    // before it alone, the last burst had no sizes to go by: 12 of 600 over P + R − 1, 2 out
    // of balance, 16.4 placements. Two groups are no step's mix, and do not replace shape 5's.
    let mut mix = SHAPE_5;
    mix.sort_unstable_by(|a, b| b.cmp(a));
    let (mut over, mut outside, mut placements) = (0, 0, 0);
    for (k, cuts) in LIVE_CUTS.iter().enumerate() {
        for seed in 1..=40 {
            let mut plan = BurstPlan::new(2000, 100);
            let _ = burst_cut_as_from(&mut plan, &SHAPE_5, seed + 2000, &[512], 0, 50);
            let _ = burst_cut_as_from(&mut plan, &[8, 2], seed + 3000, &[10], 500, 5);
            let equal_cuts = LIVE_CUTS[(k + 1) % LIVE_CUTS.len()];
            let _ = burst_cut_as_from(&mut plan, &[16; 32], seed + 1000, equal_cuts, 1000, 50);
            let (load, pairs) = burst_cut_as_from(&mut plan, &SHAPE_5, seed, cuts, 2000, 50);
            let state = plan.describe();
            assert_eq!(state["previousBurstSizes"], serde_json::json!(vec![16; 32]));
            assert_eq!(state["unequalBurstSizes"], serde_json::json!(mix));
            over += usize::from(pairs > 19);
            outside += usize::from(load.iter().any(|&l| l.abs_diff(64) > 6));
            placements += pairs;
        }
    }
    // With sizes matched to counts rank by rank: 2 over and none out of balance; since close
    // counts share the sizes they could have, 3 and 3.
    assert!(over <= 3, "{over} of 600 over P + R − 1");
    assert!(outside <= 3, "{outside} of 600 steps out of balance");
    assert!(
        placements <= 600 * 16,
        "{placements} placements in 600 steps"
    );
}

#[test]
fn a_new_home_needs_a_larger_excess_as_a_step_nears_the_size_of_the_last() {
    // A new home costs a prefill: once a step has brought as many requests as the last one,
    // its counts are about its groups' sizes, and a replica up to 8% over the level (within
    // the balance bound) keeps its groups whole, up to 10% when the new home would close a
    // cycle. Without a previous step, 5%: the ceiling's.
    let mut plan = BurstPlan::new(2000, 100);
    let cuts = [150, 150, 112, 100];
    let _ = burst_cut_as(&mut plan, &SHAPE_5, 3, &cuts);
    let latest = &plan.describe()["latestWindow"];
    assert_eq!(latest["newHomesFrom"], 0.05, "{latest}");
    assert_eq!(latest["pastBoundHomesFrom"], 0.05, "{latest}");
    let _ = burst_cut_as_from(&mut plan, &SHAPE_5, 4, &cuts, 1000, STEP_SPREAD_MS);
    let latest = &plan.describe()["latestWindow"];
    assert_eq!(latest["newHomesFrom"], 0.08, "{latest}");
    assert_eq!(latest["pastBoundHomesFrom"], 0.1, "{latest}");
    assert_eq!(
        latest["newHomesWaitUpTo"],
        serde_json::Value::Null,
        "{latest}"
    );
}

#[test]
fn the_live_steps_over_250_ms_replayed_stay_within_the_bounds() {
    // Shape 9 as it reached the router live in fourteen runs of four rounds, in 14 to 33 windows
    // a step, each round through one plan after the shape-8 step the bench sends before it.
    // The 40 steps replayed, before new homes came in rounds: 13 over P + R − 1 (up to 24);
    // after, six (up to 21) and one out of balance. That one (73 and 57 of 64) took the
    // scattered first members of its own unequal groups for a second wave, and sized the
    // "second" ones as large as the first: a second wave now needs the first to have brought
    // four requests per group, and none ends out of balance. A second wave was then still seen
    // in two of the 40 steps, which overlap nothing (four before), one of them 21 placements:
    // its four youngest groups grew fast per group on a few requests each. A second wave now
    // needs its groups to grow fast both per group and pooled: one step sees one, five go
    // over, none above 21.
    //
    // A sixth run added eight steps (48 in all): one of them over (20), and one that took its
    // first two groups for a first wave and the next seven for a second, 25 requests into the
    // step; a first wave now needs four groups. Over the 48: six over, none above 21, none out
    // of balance, one seeing a second wave (two with a first wave of two groups). Three more
    // runs (72 steps): nine over, six of them the first step of a round, whose groups had no
    // sizes to go by in the 32 equal ones of shape 8 before it. Since the sizes of the last
    // unequal burst (shape 5, earlier in the same router) count too: six over, three of them
    // a round's first step. Two more runs (88 steps): nine over (five of them a round's first
    // step), at most 23; without the last unequal sizes, ten (six), at most 22. Three runs
    // with this plan (112 steps) added none over.
    let mut plan = BurstPlan::new(2000, 100);
    let (mut placements, mut outside, mut waves) = (Vec::new(), 0, 0);
    for (header, windows) in steps_of(LIVE_STEPS_250_MS) {
        if header.contains("shape 8") {
            // The bench sends shape 5 earlier in the same router: its sizes are the last
            // unequal ones when shape 9 begins.
            plan = plan_after_shape_5(windows[0].0);
        }
        let step = windows[0].0;
        let timed = windows.iter().map(|(at, groups)| (*at, groups.as_slice()));
        let mut wave = false;
        let (load, placed) = placed_timed_windows_seen(&mut plan, step, timed, |plan| {
            wave |= !plan.describe()["latestWindow"]["secondWaveGroups"].is_null();
        });
        assert_eq!(load.iter().sum::<usize>(), 512, "{header}");
        if header.contains("shape 9") {
            outside += usize::from(load.iter().any(|&l| l.abs_diff(64) > 6));
            waves += usize::from(wave);
            placements.push(placed.len());
        }
    }
    let over = placements.iter().filter(|&&p| p > 19).count();
    assert!(
        over <= 9 && placements.iter().all(|&p| p <= 23),
        "placements: {placements:?}"
    );
    // Since close counts share the sizes they could have (`rank_match`), one step ends a
    // replica 7 off its share; five go over (eight before).
    assert!(outside <= 1, "{outside} steps out of balance");
    assert!(waves <= 1, "{waves} steps took for a second wave");
}

#[test]
fn a_bursts_length_ends_with_its_last_window_not_the_next_steps_lone_first_requests() {
    // A step of four prompts × 8 over 60 ms; a second later the next step's first window
    // brings only two lone first requests, and its second window starts the burst. The last
    // step lasted 60 ms, not until the next step's first window (1,000 ms): measured that
    // long, the next step's progress by time would crawl and its rounds of new homes last
    // four times too long.
    let ids: Vec<String> = (0..8).map(|r| format!("/r{r}")).collect();
    let mut plan = BurstPlan::new(2000, 100);
    let key = |g: usize| GroupKey::of(&[g as u64 + 1]).unwrap();
    let load = vec![0u64; 8];
    let window: Vec<usize> = (0..4).flat_map(|g| [g, g]).collect();
    for at in [0, 20, 40, 60] {
        let _ = place_window(&mut plan, at, &window, key, &ids, &load);
    }
    let _ = place_window(&mut plan, 1000, &[4, 5], key, &ids, &load);
    let _ = place_window(&mut plan, 1010, &[4, 5, 4, 5, 6, 6], key, &ids, &load);
    let previous = &plan.describe()["previousBurst"];
    assert_eq!(previous["requests"], 32, "{previous}");
    assert_eq!(previous["lengthMs"], 60, "{previous}");
}

/// First steps of `bench/bursts` as they reached the router live soon after the bench's
/// warm-up (one prompt's 512 requests), in the format of [`LIVE_STEPS`]: shape 1 (32 x 16 sent
/// at once) 35 ms after a warm-up of 6 ms, then 55 ms after one of a second; shape 8 (32 x 16
/// sent prompt by prompt) 33 ms after one of a second; shape 1 again, its first request alone
/// in a window (times shifted to follow a warm-up of 6 ms by 35 ms).
const LIVE_STEP_AFTER_A_PROMPT_ALONE: &str = include_str!("live_step_after_a_prompt_alone.txt");

/// The recorded step of [`LIVE_STEP_AFTER_A_PROMPT_ALONE`] whose header names `run`.
fn live_step_after_a_prompt_alone(run: &str) -> Vec<LiveWindow> {
    steps_of(LIVE_STEP_AFTER_A_PROMPT_ALONE)
        .into_iter()
        .find(|(header, _)| header.contains(run))
        .map(|(_, windows)| windows)
        .expect("a recorded step")
}

/// One prompt's 512 requests in three windows over 6 ms (the bench's warm-up), then the
/// recorded step of `run`: the step's requests per replica and its placements.
fn step_after_a_quick_warm_up(run: &str) -> (Vec<usize>, usize) {
    let alone: Vec<Vec<usize>> = [150, 200, 162].iter().map(|&n| vec![999; n]).collect();
    let mut plan = BurstPlan::new(2000, 100);
    let windows = [1389, 1392, 1395]
        .into_iter()
        .zip(alone.iter().map(Vec::as_slice));
    let _ = placed_timed_windows(&mut plan, 77, windows);
    let step = live_step_after_a_prompt_alone(run);
    let timed = step.iter().map(|(at, groups)| (*at, groups.as_slice()));
    place_timed_windows(&mut plan, step[0].0, timed)
}

#[test]
fn a_step_soon_after_a_large_prompt_alone_is_a_burst_of_its_own() {
    // One prompt's 512 requests in three windows over 6 ms (the bench's warm-up, opening its
    // connections), then 35 ms later shape 1's first step as it reached the router live. The
    // prompt alone had stopped, but a batch window had not yet passed since its last request:
    // taken for a group still arriving, its whole size weighed in the step's balance, and
    // the step ended at 48 to 112 requests per replica, live and replayed. The stream paused
    // longer than the prompt had lasted and came back with new groups only: the step is a
    // burst of its own.
    let (load, placements) = step_after_a_quick_warm_up("092951");
    assert_eq!(load, vec![64; 8]);
    assert_eq!(placements, 32);
}

#[test]
fn a_step_whose_first_request_comes_alone_soon_after_a_large_prompt_alone_is_a_burst_of_its_own() {
    // As above, but the step's first request reached the router alone, in a window of its own
    // 4 ms before the rest: the stream's pause was measured from that window, too short, and
    // the step counted into the warm-up's burst, with the warm-up's prompt still arriving (live
    // 48 to 80 requests per replica). The pause is measured from the last request of a group of
    // two or more.
    let (load, placements) = step_after_a_quick_warm_up("180351");
    assert_eq!(load, vec![64; 8]);
    assert_eq!(placements, 32);
}

/// The bench's warm-up as it reached one router live: one prompt's (2,048 tokens) first
/// request alone, a second before its other 511, which come in three windows ending at
/// `end_ms`, while one replica runs a request of other traffic. Returns what each replica then
/// runs.
fn slow_warm_up(plan: &mut BurstPlan, end_ms: u64) -> Vec<u64> {
    let ids = eight_replicas();
    let mut running = vec![0, 0, 0, 0, 1, 0, 0, 0];
    let alone = |_: usize| GroupKey {
        blocks: 128,
        digest: 999,
    };
    let windows = [(1015, 1), (19, 150), (9, 200), (0, 161)];
    for (before, requests) in windows {
        let now = end_ms - before;
        for r in place_window(plan, now, &vec![0; requests], alone, &ids, &running) {
            running[r] += 1;
        }
    }
    running
}

#[test]
fn prompts_sent_in_turn_soon_after_a_prompt_alone_go_round_the_replicas() {
    // The warm-up of `slow_warm_up`, then 33 ms later shape 8's first step (32 × 16 sent
    // prompt by prompt) as it reached the router live, with its prompts' lengths. The
    // warm-up's prompt still counts as arriving in the first windows, and the estimates of
    // prompts still arriving leave a replica that just took one within half a group of the
    // least planned. With prefill deciding first among those, the step's first four prompts
    // all went to one replica, live and replayed, and queued for prefill there (their
    // requests took up to 892 ms, the others' 400–690). A replica with the fewest groups
    // comes first now.
    const LENGTHS: [usize; 32] = [
        151, 182, 182, 64, 96, 104, 64, 116, 71, 93, 177, 180, 185, 96, 93, 75, 131, 101, 98, 116,
        131, 137, 140, 114, 89, 143, 86, 178, 78, 144, 139, 188,
    ];
    let key = |g: usize| GroupKey {
        blocks: LENGTHS[g],
        digest: g as u64 + 1000,
    };
    let ids = eight_replicas();
    let mut plan = BurstPlan::new(2000, 100);
    let mut running = slow_warm_up(&mut plan, 1313);
    let mut first_homes = Vec::new();
    let mut seen = BTreeSet::new();
    let mut load = vec![0; 8];
    for (now, window) in live_step_after_a_prompt_alone("143704") {
        for (&g, r) in window
            .iter()
            .zip(place_window(&mut plan, now, &window, key, &ids, &running))
        {
            running[r] += 1;
            load[r] += 1;
            if seen.insert(g) {
                first_homes.push(r);
            }
        }
    }
    assert_eq!(load, vec![64; 8]);
    let first_eight: BTreeSet<usize> = first_homes[..8].iter().copied().collect();
    assert_eq!(first_eight.len(), 8, "{first_homes:?}");
}

#[test]
fn the_step_after_prompts_sent_in_turn_soon_after_a_prompt_alone_goes_by_their_sizes() {
    // The warm-up of `slow_warm_up`, shape 8's first step 33 ms later as it reached the router
    // live, then 1.6 s later its second step (32 × 16 prompt by prompt over 250 ms). The first
    // step brought one new prompt at a time, never four in a window: taken for the warm-up's
    // burst going on, its sizes went into the prior of the second step next to the warm-up's
    // 512, the second step's first prompt was taken for that 512, and live its next three
    // prompts went to the replica the first one was on (p99 822 ms, the step before 699).
    let ids = eight_replicas();
    let mut plan = BurstPlan::new(2000, 100);
    let mut running = slow_warm_up(&mut plan, 1313);
    for (now, window) in live_step_after_a_prompt_alone("143704") {
        for r in place_window(&mut plan, now, &window, key, &ids, &running) {
            running[r] += 1;
        }
    }
    let next_key = |g: usize| GroupKey {
        blocks: 4,
        digest: g as u64 + 2000,
    };
    let mut first_homes = Vec::new();
    let mut seen = BTreeSet::new();
    let mut load = vec![0; 8];
    for (now, window) in step_in_turn(7, 0) {
        for (&g, r) in window
            .iter()
            .zip(place_window(&mut plan, now, &window, next_key, &ids, &load))
        {
            load[r] += 1;
            if seen.insert(g) {
                first_homes.push(r);
            }
        }
    }
    let sizes = &plan.describe()["previousBurstSizes"];
    assert_eq!(*sizes, serde_json::json!(vec![16; 32]), "{sizes}");
    assert_eq!(load, vec![64; 8]);
    let first_eight: BTreeSet<usize> = first_homes[..8].iter().copied().collect();
    assert_eq!(first_eight.len(), 8, "{first_homes:?}");
}

#[test]
fn a_step_soon_after_a_prompt_alone_that_took_long_is_a_burst_of_its_own_too() {
    // The warm-up's first request alone, one second before its other 511, which reach the
    // router in three windows while one replica runs a request of other traffic; 55 ms later
    // shape 1's first step as it reached the router live. The step's pause was shorter than
    // the prompt had lasted, so the prompt counted as still arriving: its parts, one request
    // apart, times its whole size, sent a fifth prompt to one replica and three to another
    // (48 to 80 requests per replica, live and replayed). A burst of fewer groups than a
    // step's is not paused within by a client's stall: a quarter of a batch window is pause
    // enough.
    let ids = eight_replicas();
    let mut plan = BurstPlan::new(2000, 100);
    let running = slow_warm_up(&mut plan, 1359);
    let mut load = vec![0u64; 8];
    let mut placed = BTreeSet::new();
    for (now, window) in live_step_after_a_prompt_alone("134448") {
        let busy: Vec<u64> = running.iter().zip(&load).map(|(a, b)| a + b).collect();
        for (&g, r) in window
            .iter()
            .zip(place_window(&mut plan, now, &window, key, &ids, &busy))
        {
            load[r] += 1;
            placed.insert((g, r));
        }
    }
    assert_eq!(load, vec![64; 8]);
    assert_eq!(placed.len(), 32);
}

#[test]
fn the_live_steps_replayed_with_other_prompt_lengths_stay_mostly_within_the_bounds() {
    // The replays above give every prompt one length, so replicas planned alike are told
    // apart by their ids alone. Live, prompt lengths order them first (see *New groups*), and
    // where a tie breaks decides where later groups fit. Each recorded step is replayed
    // twelve times here, its prompts 64 to 191 blocks long, drawn anew each time (the first
    // time all alike). Shape 9 (112 steps, 1,344 replays) went over P + R − 1 in 133 and out
    // of balance in 23; shape 5 (128 steps, 1,536 replays) in 19 and 11. Most steps over had
    // closed a cycle of groups and replicas 30% to 90% into the step, for an excess that
    // needed only 5% to 9% of the level while the step was young. Since such a home needs the
    // balance bound's 10% from the step's start: shape 9 102 and 23, shape 5 unchanged (on 36
    // other draws of the lengths, shape 9 380 over before and 307 after, 62 out both times).
    // Since close counts share the sizes they could have (`rank_match`), not the sizes of
    // their ranks alone: shape 9 61 and 5, shape 5 12 and 11 (12 and 0 at 87fe733). Since such
    // a home also waits for an excess past the bound by more than the counts' noise
    // (`PAST_BOUND_NOISE`): shape 9 38 and 6 (with the whole noise, 33 and 13), shape 5 12
    // and 0.
    //
    // Tried: new homes waiting until 85% of the last burst's requests (not 70%) once the
    // last two bursts were of one size. Here shape 9 went over in 74 and out in 21, but live
    // it left 2 of 24 shape-9 steps out of balance (54 and 74, 48 and 77 of 64), where none of
    // the 64 before had been: a split made that late has few members left to move, and a
    // group whose size was overestimated hands on more than is still to come.
    let length = |order: u64, g: usize| {
        let scattered = (g as u64 + 1).wrapping_mul(order.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        if order == 0 {
            4
        } else {
            64 + (scattered >> 57) as usize
        }
    };
    let (mut over, mut outside) = ([0; 2], [0; 2]);
    for order in 0..12u64 {
        let blocks = |g: usize| length(order, g);
        let mut plan = BurstPlan::new(2000, 100);
        for (header, windows) in live_steps() {
            if header.ends_with("step 0") {
                plan = BurstPlan::new(2000, 100);
                let from = windows[0].0 - 1000;
                let _ = burst_cut_as_from(&mut plan, &[128; 4], 7, &[100, 150, 120, 142], from, 50);
            }
            let timed = windows.iter().map(|(at, groups)| (*at, groups.as_slice()));
            let (load, placed) =
                placed_timed_windows_of_lengths(&mut plan, windows[0].0, timed, blocks, |_| {});
            over[0] += usize::from(placed.len() > 19);
            outside[0] += usize::from(load.iter().any(|&l| l.abs_diff(64) > 6));
        }
        for (header, windows) in steps_of(LIVE_STEPS_250_MS) {
            if header.contains("shape 8") {
                plan = plan_after_shape_5(windows[0].0);
            }
            let timed = windows.iter().map(|(at, groups)| (*at, groups.as_slice()));
            let (load, placed) =
                placed_timed_windows_of_lengths(&mut plan, windows[0].0, timed, blocks, |_| {});
            if header.contains("shape 9") {
                over[1] += usize::from(placed.len() > 19);
                outside[1] += usize::from(load.iter().any(|&l| l.abs_diff(64) > 6));
            }
        }
    }
    assert!(
        over[0] <= 14 && outside[0] <= 12,
        "shape 5: {over:?} over, {outside:?} out"
    );
    assert!(
        over[1] <= 42 && outside[1] <= 8,
        "shape 9: {over:?} over, {outside:?} out"
    );
}

/// The prompt lengths (in blocks, by group) a recorded step's header lists after `marker`.
fn lengths_in(header: &str, marker: &str) -> Vec<usize> {
    let (_, lengths) = header.split_once(marker).expect("prompt lengths");
    lengths
        .split(' ')
        .map(|l| l.parse().expect("a length"))
        .collect()
}

/// A fresh plan that saw a step of shape 5 five seconds before `first_ms`, as the bench's full
/// runs send it before shapes 8 and 9: its sizes are the last unequal ones there.
fn plan_after_shape_5(first_ms: u64) -> BurstPlan {
    let mut plan = BurstPlan::new(2000, 100);
    let _ = burst_cut_as_from(&mut plan, &SHAPE_5, 5, &[512], first_ms - 5000, 50);
    plan
}

/// Steps of shape 9 as they reached the router live in six runs of `bench/bursts` (two full
/// runs of four rounds after the plan matched sizes to counts, two before, and two runs of
/// shapes 8 and 9 alone, eight rounds each), in the format of [`LIVE_STEPS_250_MS`] with each
/// step's prompt lengths (in blocks, by group) at the end of its header; times are shifted
/// 10 s on so that a burst can be set before them.
const LIVE_STEPS_250_MS_WITH_LENGTHS: &str = include_str!("live_steps_250ms_lengths.txt");

#[test]
fn the_live_steps_replayed_with_their_prompt_lengths_stay_within_the_bounds() {
    // The other replays of shape 9 give every prompt one length, or draw lengths anew, so
    // ties between replicas planned alike break in another order than they did live. With
    // the lengths each step had, replays track the bench: 400 shape-9 steps of 39 runs went
    // over P + R − 1 in 53 and out of balance in 6 live, and in 45 and 4 replayed through the
    // plan that matched sizes to counts rank by rank (17 and 1 through this one); the 16
    // steps of the two runs made with this plan (both in the file), 2 and 1 both ways.
    // Each round's plan first sees shape 5 (the bench's full runs send it earlier), then the
    // last step of shape 8, then shape 9's two steps.
    let mut plan = BurstPlan::new(2000, 100);
    let (mut steps, mut over, mut outside) = (0, 0, 0);
    for (header, windows) in steps_of(LIVE_STEPS_250_MS_WITH_LENGTHS) {
        let blocks = lengths_in(&header, " lengths ");
        if header.contains("shape 8") {
            plan = plan_after_shape_5(windows[0].0);
        }
        let timed = windows.iter().map(|(at, groups)| (*at, groups.as_slice()));
        let (load, placed) =
            placed_timed_windows_of_lengths(&mut plan, windows[0].0, timed, |g| blocks[g], |_| {});
        assert_eq!(load.iter().sum::<usize>(), 512, "{header}");
        if header.contains("shape 9") {
            steps += 1;
            over += usize::from(placed.len() > 19);
            outside += usize::from(load.iter().any(|&l| l.abs_diff(64) > 6));
        }
    }
    assert_eq!(steps, 64);
    // Live, with the plan of the time (48 steps matching sizes to counts rank by rank, 16
    // letting close counts share sizes): 8 over P + R − 1 and 2 out of balance. Replayed,
    // rank by rank: 12 and 2; sharing: 3 and 1.
    assert!(over <= 4, "{over} of {steps} steps over P + R − 1");
    assert!(outside <= 1, "{outside} of {steps} steps out of balance");
}

/// Shape 4's two steps and shape 5's two steps of three rounds of `bench/bursts` as they
/// reached the router live, in the format of [`LIVE_STEPS`] with each step's prompt lengths (in
/// blocks, by group) after `L` in its header.
const LIVE_SHAPES_4_AND_5: &str = include_str!("live_shapes_4_and_5.txt");

/// Shape 5's two steps, shape 8's second and shape 9's two steps of two rounds of
/// `bench/bursts` as they reached the router live, in the format of [`LIVE_SHAPES_4_AND_5`].
const LIVE_SHAPE_9_ROUNDS: &str = include_str!("live_shape_9_rounds.txt");

/// Shape 5's two steps, shape 8's second and shape 9's first of one round of `bench/bursts` as
/// they reached the router live, in the format of [`LIVE_SHAPES_4_AND_5`]: shape 8's step
/// brought its first four prompts, 64 requests, within 3 ms, then paused 30 ms.
const LIVE_STEP_BEGUN_IN_A_CLUMP: &str = include_str!("live_step_begun_in_a_clump.txt");

/// One step replayed by [`replayed_rounds`]: its header, requests per replica,
/// (group, replica) placements, and the plan's state once the step was placed.
struct Replayed {
    header: String,
    load: Vec<usize>,
    placements: usize,
    state: serde_json::Value,
}

impl Replayed {
    /// Within both bounds: at most P + R − 1 placements, every replica within 10% of its share.
    fn within_bounds(&self, groups: usize) -> bool {
        let fair = self.load.iter().sum::<usize>() / self.load.len();
        self.placements < groups + self.load.len()
            && self.load.iter().all(|&n| n.abs_diff(fair) * 10 <= fair)
    }
}

/// Replays recorded steps window by window at their recorded times and prompt lengths, one
/// plan per round: a round starts at each step whose header contains `round_from`.
fn replayed_rounds(text: &str, round_from: &str) -> Vec<Replayed> {
    let mut plan = BurstPlan::new(2000, 100);
    let mut replayed = Vec::new();
    for (k, (header, windows)) in steps_of(text).into_iter().enumerate() {
        if header.contains(round_from) {
            plan = BurstPlan::new(2000, 100);
        }
        let lengths = lengths_in(&header, " L ");
        let (load, placed) = placed_timed_windows_of_lengths(
            &mut plan,
            k as u64 + 1,
            windows.iter().map(|(at, groups)| (*at, groups.as_slice())),
            |g| lengths[g],
            |_| {},
        );
        replayed.push(Replayed {
            header,
            load,
            placements: placed.len(),
            state: plan.describe(),
        });
    }
    replayed
}

#[test]
fn a_replica_left_out_of_the_balance_bound_at_the_end_of_a_measured_step_gets_a_new_home() {
    // Shape 5's second step reached the router in three windows, the last with 391 of its
    // 512 requests and every count final. One replica was planned its two groups whole, 40
    // and 16, eight short of its share and shared with no other; the most planned replicas
    // were 3 over, under the ceiling, and a replica short with none over the ceiling only
    // pulled along shared groups: 56 to 67 requests per replica, live and replayed. Once a
    // step has brought as many requests as the last, a replica out of the bound and out of
    // reach gets a new home from the most planned one.
    let replayed = replayed_rounds(LIVE_SHAPES_4_AND_5, "shape 4 step 0");
    let step = replayed
        .iter()
        .find(|step| step.header.contains("180855-r2 shape 5 step 1"))
        .expect("the recorded step");
    assert!(
        step.within_bounds(12),
        "{:?}, {} placements",
        step.load,
        step.placements
    );
}

#[test]
fn a_first_unequal_step_whose_first_window_brings_half_of_it_is_not_taken_for_a_burst_at_once() {
    // Shape 5's first step of two rounds, after 4 x 128: the client paused once while sending
    // each, and the first window brought 250 and 206 of the step's 512 requests (49% and 40% of
    // the step before). Taken for the step sent at once, its groups were split to the level on
    // the counts of half of it, every placement of P + R − 1 spent on slivers of small groups;
    // the second half, in other proportions, needed one more: 20 placements, live and
    // replayed. A window must bring 60% of the last step's requests to count as a burst at
    // once: 17 placements each.
    let replayed = replayed_rounds(LIVE_SHAPES_4_AND_5, "shape 4 step 0");
    for round in ["184322-r1", "184637-r2"] {
        let step = replayed
            .iter()
            .find(|step| step.header.contains(&format!("{round} shape 5 step 0")))
            .expect("the recorded step");
        assert!(
            step.within_bounds(12),
            "{round}: {:?}, {} placements",
            step.load,
            step.placements
        );
    }
}

#[test]
fn a_step_whose_first_prompts_came_in_a_clump_is_one_burst() {
    // Shape 8's step above: after its clump and the pause, four new prompts came with none of
    // the first four, which looked like the next step resuming the stream. The plan took its
    // last 448 requests for a burst of their own, and measured shape 9's step after it by
    // them: at 448 requests it took that step for complete.
    let replayed = replayed_rounds(LIVE_STEP_BEGUN_IN_A_CLUMP, "shape 5 step 0");
    let step = |shape: &str| {
        replayed
            .iter()
            .find(|step| step.header.contains(shape))
            .expect("the recorded step")
    };
    let clumped = step("shape 8");
    let burst = &clumped.state["burst"];
    assert_eq!(clumped.load, [64; 8], "{}", clumped.header);
    assert_eq!(burst["requests"], 512, "{burst}");
    assert_eq!(burst["placements"], 32, "{burst}");
    let next = step("shape 9");
    assert_eq!(
        next.state["previousBurst"]["requests"], 512,
        "{}",
        next.header
    );
}

#[test]
fn a_new_home_past_the_bound_waits_for_an_excess_beyond_the_noise_of_its_counts() {
    // Two rounds of shapes 5, 8 and 9 as they reached the router live. One shape-9 step of each
    // (512 requests over 250 ms, in 20 and 26 windows) made 20 placements, live and replayed:
    // a new home past P + R − 1 opened at 80% of the step for an estimated excess of 13% of
    // the level, where the replica would have ended 2% over, and early homes on counts of a
    // fifth of the step used the placements a later one needed. Such a home now waits for an
    // excess past the balance bound by 0.75 of the spread a replica's count still has: 19 and
    // 19, every replica within 10% of its share.
    let replayed = replayed_rounds(LIVE_SHAPE_9_ROUNDS, "shape 5 step 0");
    assert_eq!(replayed.len(), 10);
    for step in &replayed {
        let groups = if step.header.contains("shape 8") {
            32
        } else {
            12
        };
        assert!(
            step.within_bounds(groups),
            "{}: {:?}, {} placements",
            step.header,
            step.load,
            step.placements
        );
    }
}
