use super::{PrefixIndex, PromptHashes};

const LARGE: usize = 1000;

fn prompts(list: &[&[u64]]) -> PromptHashes {
    list.iter().collect()
}

fn matches(index: &PrefixIndex, request: &PromptHashes, slots: usize) -> Vec<u64> {
    let mut out = vec![u64::MAX; slots];
    index.match_into(request, &mut out);
    out
}

/// The hashes the endpoint in `slot` holds, most recent first.
fn held(index: &PrefixIndex, slot: usize) -> Vec<u64> {
    match index.endpoints.get(slot) {
        Some(Some(endpoint)) => endpoint.blocks.iter().collect(),
        _ => Vec::new(),
    }
}

fn holders(index: &PrefixIndex, hash: u64) -> Vec<usize> {
    let mut slots = index.holders.get(&hash).cloned().unwrap_or_default();
    slots.sort_unstable();
    slots
}

/// Panics unless every endpoint's set and the reverse map describe the same (hash, slot) pairs.
fn assert_consistent(index: &PrefixIndex) {
    let mut ids = Vec::new();
    for (slot, entry) in index.endpoints.iter().enumerate() {
        let Some(endpoint) = entry else { continue };
        endpoint.blocks.assert_consistent();
        assert!(
            !ids.contains(&endpoint.id),
            "id {} in two slots",
            endpoint.id
        );
        ids.push(endpoint.id.clone());
        for hash in endpoint.blocks.iter() {
            let count = index.holders.get(&hash).map_or(0, |slots| {
                slots.iter().filter(|&&held| held == slot).count()
            });
            assert_eq!(
                count, 1,
                "slot {slot} holds {hash:#x}; reverse map lists it {count} times"
            );
        }
    }
    for (hash, slots) in &index.holders {
        assert!(!slots.is_empty(), "empty holder list for {hash:#x}");
        for &slot in slots {
            let present = matches!(
                index.endpoints.get(slot),
                Some(Some(endpoint)) if endpoint.blocks.contains(*hash)
            );
            assert!(
                present,
                "reverse map lists slot {slot} for {hash:#x}, which it does not hold"
            );
        }
    }
}

#[test]
fn credit_stops_at_the_endpoints_first_missing_block() {
    let mut index = PrefixIndex::new();
    // Slot 0 holds blocks 0, 1 and 3 of the request; slot 1 holds 1, 2 and 3 but not 0.
    index.record(0, "pod-a", LARGE, &prompts(&[&[0xb0, 0xb1]]));
    index.record(0, "pod-a", LARGE, &prompts(&[&[0xb3]]));
    index.record(1, "pod-b", LARGE, &prompts(&[&[0xb1, 0xb2, 0xb3]]));
    let request = prompts(&[&[0xb0, 0xb1, 0xb2, 0xb3]]);
    assert_eq!(matches(&index, &request, 2), [2, 0]);
    assert_consistent(&index);
}

#[test]
fn overflowing_record_keeps_the_first_blocks() {
    let mut index = PrefixIndex::new();
    index.record(0, "pod-a", 3, &prompts(&[&[10, 11, 12, 13, 14]]));
    assert_eq!(held(&index, 0), [10, 11, 12]);
    assert_eq!(holders(&index, 13), Vec::<usize>::new());
    assert_eq!(holders(&index, 14), Vec::<usize>::new());
    assert_eq!(index.distinct_blocks(), 3);
    assert_eq!(index.blocks_held(0), 3);
    assert_eq!(matches(&index, &prompts(&[&[10, 11, 12, 13, 14]]), 1), [3]);
    assert_consistent(&index);
}

#[test]
fn eviction_takes_tails_of_older_requests_first() {
    let mut index = PrefixIndex::new();
    index.record(0, "pod-a", 4, &prompts(&[&[1, 2, 3]]));
    index.record(0, "pod-a", 4, &prompts(&[&[7, 8]]));
    assert_eq!(held(&index, 0), [7, 8, 1, 2]);
    assert_eq!(matches(&index, &prompts(&[&[1, 2, 3]]), 1), [2]);
    assert_consistent(&index);
}

#[test]
fn repeated_record_refreshes_recency() {
    let mut index = PrefixIndex::new();
    let first = prompts(&[&[1, 2]]);
    let second = prompts(&[&[5, 6]]);
    index.record(0, "pod-a", 4, &first);
    index.record(0, "pod-a", 4, &second);
    index.record(0, "pod-a", 4, &first);
    assert_eq!(held(&index, 0), [1, 2, 5, 6]);
    index.record(0, "pod-a", 4, &prompts(&[&[9]]));
    assert_eq!(held(&index, 0), [9, 1, 2, 5]);
    assert_eq!(matches(&index, &first, 1), [2]);
    assert_eq!(matches(&index, &second, 1), [1]);
    assert_consistent(&index);
}

#[test]
fn every_prompts_first_block_outlives_any_deeper_block() {
    let mut index = PrefixIndex::new();
    index.record(0, "pod-a", 2, &prompts(&[&[1, 2, 3], &[7, 8]]));
    assert_eq!(held(&index, 0), [1, 7]);
    index.record(1, "pod-b", 3, &prompts(&[&[1, 2, 3], &[7, 8]]));
    assert_eq!(held(&index, 1), [1, 7, 2]);
    assert_consistent(&index);
}

#[test]
fn matches_sum_over_prompts_and_endpoints_are_independent() {
    let mut index = PrefixIndex::new();
    index.record(0, "pod-a", LARGE, &prompts(&[&[1, 2, 3], &[7]]));
    index.record(2, "pod-c", LARGE, &prompts(&[&[7, 8, 9]]));
    let request = prompts(&[&[1, 2, 3], &[7, 8]]);
    assert_eq!(request.total_blocks(), 5);
    assert_eq!(matches(&index, &request, 3), [4, 0, 2]);
    assert_consistent(&index);
}

#[test]
fn match_overwrites_every_entry_and_skips_slots_past_the_end() {
    let mut index = PrefixIndex::new();
    index.record(0, "pod-a", LARGE, &prompts(&[&[1, 2]]));
    index.record(3, "pod-d", LARGE, &prompts(&[&[1, 2]]));
    assert_eq!(matches(&index, &prompts(&[&[1, 2]]), 2), [2, 0]);
    assert_eq!(matches(&index, &PromptHashes::new(), 4), [0, 0, 0, 0]);
}

#[test]
fn remove_endpoint_forgets_all_its_blocks() {
    let mut index = PrefixIndex::new();
    index.record(0, "pod-a", LARGE, &prompts(&[&[1, 2, 3]]));
    index.record(1, "pod-b", LARGE, &prompts(&[&[1, 2], &[4]]));
    assert_eq!(index.distinct_blocks(), 4);
    assert_eq!(
        index.endpoints().collect::<Vec<_>>(),
        [(0, "pod-a", 3), (1, "pod-b", 3)]
    );

    assert!(index.remove_endpoint("pod-b"));
    assert_eq!(index.endpoint_id(1), None);
    assert_eq!(index.endpoints().collect::<Vec<_>>(), [(0, "pod-a", 3)]);
    assert_eq!(index.blocks_held(1), 0);
    assert_eq!(holders(&index, 1), [0]);
    assert_eq!(holders(&index, 4), Vec::<usize>::new());
    assert_eq!(index.distinct_blocks(), 3);
    assert_eq!(matches(&index, &prompts(&[&[1, 2, 3], &[4]]), 2), [3, 0]);
    assert_consistent(&index);

    assert!(index.remove_endpoint("pod-a"));
    assert_eq!(index.distinct_blocks(), 0);
    assert!(!index.remove_endpoint("pod-a"));
    assert_consistent(&index);
}

#[test]
fn a_new_id_in_a_slot_replaces_the_old_endpoint() {
    let mut index = PrefixIndex::new();
    index.record(0, "pod-a", LARGE, &prompts(&[&[1, 2]]));
    index.record(0, "pod-z", LARGE, &prompts(&[&[5]]));
    assert_eq!(index.endpoint_id(0), Some("pod-z"));
    assert_eq!(held(&index, 0), [5]);
    assert_eq!(matches(&index, &prompts(&[&[1, 2]]), 1), [0]);
    assert!(!index.remove_endpoint("pod-a"));
    assert_consistent(&index);
}

#[test]
fn a_known_id_in_a_new_slot_keeps_its_blocks() {
    let mut index = PrefixIndex::new();
    index.record(0, "pod-a", LARGE, &prompts(&[&[1, 2]]));
    index.record(2, "pod-a", LARGE, &prompts(&[&[5]]));
    assert_eq!(index.endpoint_id(0), None);
    assert_eq!(held(&index, 2), [5, 1, 2]);
    assert_eq!(holders(&index, 1), [2]);
    assert_eq!(matches(&index, &prompts(&[&[1, 2]]), 3), [0, 0, 2]);
    assert_consistent(&index);
}

#[test]
fn a_smaller_capacity_drops_the_least_recent_blocks() {
    let mut index = PrefixIndex::new();
    index.record(0, "pod-a", 4, &prompts(&[&[1, 2, 3, 4]]));
    index.record(0, "pod-a", 2, &prompts(&[&[9]]));
    assert_eq!(held(&index, 0), [9, 1]);
    assert_eq!(index.distinct_blocks(), 2);
    assert_consistent(&index);
}

#[test]
fn recording_nothing_creates_no_endpoint() {
    let mut index = PrefixIndex::new();
    index.record(0, "pod-a", LARGE, &prompts(&[&[]]));
    assert_eq!(index.endpoint_id(0), None);
}

#[test]
fn prompt_hashes_skip_empty_prompts() {
    let mut request = PromptHashes::new();
    request.push_prompt(&[1, 2]);
    request.push_prompt(&[]);
    request.push_prompt_with(|out| out.extend([3, 4, 5]));
    request.push_prompt_with(|_| {});
    assert_eq!(request.len(), 2);
    assert_eq!(request.total_blocks(), 5);
    assert_eq!(
        request.iter().collect::<Vec<_>>(),
        [&[1, 2][..], &[3, 4, 5][..]]
    );
    assert_eq!(request.prompt(2), &[] as &[u64]);
    request.clear();
    assert!(request.is_empty());
}

/// SplitMix64, so the operation sequence is fixed by its seed.
struct Sequence(u64);

impl Sequence {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> usize {
        (self.next() % bound) as usize
    }
}

/// A plain restatement of the index's rules: per slot an id, a capacity and the held hashes
/// most recent first.
#[derive(Default)]
struct Model {
    slots: Vec<Option<(String, Vec<u64>)>>,
}

impl Model {
    fn record(&mut self, slot: usize, id: &str, capacity: usize, request: &PromptHashes) {
        if request.is_empty() {
            return;
        }
        if self.slots.len() <= slot {
            self.slots.resize(slot + 1, None);
        }
        if self.slots[slot]
            .as_ref()
            .is_some_and(|(held_id, _)| held_id != id)
        {
            self.slots[slot] = None;
        }
        if self.slots[slot].is_none() {
            let moved = self
                .slots
                .iter_mut()
                .find(|entry| entry.as_ref().is_some_and(|(held_id, _)| held_id == id))
                .and_then(Option::take);
            self.slots[slot] = Some(moved.unwrap_or_else(|| (id.to_owned(), Vec::new())));
        }
        let Some((_, held)) = self.slots[slot].as_mut() else {
            unreachable!()
        };
        held.truncate(capacity);
        let depth = request.iter().map(<[u64]>::len).max().unwrap_or(0);
        for level in (0..depth).rev() {
            for prompt in (0..request.len()).rev() {
                if let Some(&hash) = request.prompt(prompt).get(level) {
                    held.retain(|&other| other != hash);
                    held.insert(0, hash);
                    held.truncate(capacity);
                }
            }
        }
    }

    fn remove(&mut self, id: &str) -> bool {
        let found = self
            .slots
            .iter_mut()
            .find(|entry| entry.as_ref().is_some_and(|(held_id, _)| held_id == id));
        found.and_then(Option::take).is_some()
    }

    fn matches(&self, request: &PromptHashes, slots: usize) -> Vec<u64> {
        (0..slots)
            .map(|slot| match self.slots.get(slot) {
                Some(Some((_, held))) => request
                    .iter()
                    .map(|prompt| {
                        prompt.iter().take_while(|hash| held.contains(hash)).count() as u64
                    })
                    .sum(),
                _ => 0,
            })
            .collect()
    }
}

fn random_request(sequence: &mut Sequence) -> PromptHashes {
    let mut request = PromptHashes::new();
    for _ in 0..1 + sequence.below(2) {
        let length = sequence.below(9);
        let chain = 1000 * sequence.below(4) as u64;
        let prompt: Vec<u64> = (0..length as u64)
            .map(|block| match sequence.below(8) {
                // Mostly a shared chain, sometimes a stray hash, so gaps and repeats occur.
                0 => sequence.below(6) as u64,
                _ => chain + block,
            })
            .collect();
        request.push_prompt(&prompt);
    }
    request
}

#[test]
fn seeded_operations_keep_index_and_reverse_map_consistent() {
    const IDS: [&str; 6] = ["pod-a", "pod-b", "pod-c", "pod-d", "pod-e", "pod-f"];
    let mut sequence = Sequence(0x5eed_0001);
    let mut index = PrefixIndex::new();
    let mut model = Model::default();
    for step in 0..4000 {
        match sequence.below(10) {
            0 => {
                let id = IDS[sequence.below(6)];
                assert_eq!(index.remove_endpoint(id), model.remove(id), "step {step}");
            }
            _ => {
                let slot = sequence.below(5);
                let id = IDS[sequence.below(6)];
                let capacity = 1 + sequence.below(8);
                let request = random_request(&mut sequence);
                index.record(slot, id, capacity, &request);
                model.record(slot, id, capacity, &request);
            }
        }
        assert_consistent(&index);
        for slot in 0..6 {
            let expected = match model.slots.get(slot) {
                Some(Some((id, held))) => Some((id.as_str(), held.clone())),
                _ => None,
            };
            let actual = index.endpoint_id(slot).map(|id| (id, held(&index, slot)));
            assert_eq!(actual, expected, "step {step}, slot {slot}");
        }
        let request = random_request(&mut sequence);
        assert_eq!(
            matches(&index, &request, 6),
            model.matches(&request, 6),
            "step {step}"
        );
    }
}

#[test]
fn a_prompt_held_by_many_endpoints_matches_as_when_each_is_followed() {
    // Twelve endpoints, most of them holding the same chains in part, with holes from small
    // capacities and stray hashes: the single walk over the prompt (taken when more than a few
    // endpoints hold its first block) must count what following each endpoint counts.
    const IDS: [&str; 12] = [
        "pod-a", "pod-b", "pod-c", "pod-d", "pod-e", "pod-f", "pod-g", "pod-h", "pod-i", "pod-j",
        "pod-k", "pod-l",
    ];
    let mut sequence = Sequence(0x5eed_0002);
    let mut index = PrefixIndex::new();
    let mut model = Model::default();
    let mut walked = 0;
    for step in 0..3000 {
        let slot = sequence.below(12);
        let capacity = 2 + sequence.below(10);
        let request = random_request(&mut sequence);
        index.record(slot, IDS[slot], capacity, &request);
        model.record(slot, IDS[slot], capacity, &request);
        let request = random_request(&mut sequence);
        let first_holders = request
            .prompt(0)
            .first()
            .map_or(0, |first| holders(&index, *first).len());
        if request.len() == 1 && first_holders > super::FOLLOW_EACH_UP_TO {
            walked += 1;
        }
        assert_eq!(
            matches(&index, &request, 12),
            model.matches(&request, 12),
            "step {step}"
        );
    }
    assert!(walked > 500, "only {walked} requests took the single walk");
}
