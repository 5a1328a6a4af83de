use super::*;

fn range(from: u32, to: u32) -> Vec<u32> {
    (from..=to).collect()
}

/// Hashes of a single prompt, as one list.
fn one(model: &str, salt: &str, tokens: &[u32], block: usize, max_blocks: usize) -> Vec<u64> {
    let mut out = Vec::new();
    hash_prompt_into(
        prompt_seed(model, salt),
        tokens,
        block,
        max_blocks,
        &mut out,
    );
    out
}

#[test]
fn seeds_are_xxh64_of_model_and_salt() {
    assert_eq!(prompt_seed("m", ""), 0xba2e567083a2b2e8);
    assert_eq!(prompt_seed("", ""), 0xef46db3751d8e999);
}

#[test]
fn content_hash_matches_golden_and_h6() {
    assert_eq!(content_hash(&[1, 2]), 0xcd3d4c871ee4183a);
    assert_eq!(content_hash(&[1, 2]), content_hash(&[1, 2]));
    assert_ne!(content_hash(&[1, 2]), content_hash(&[1, 3]));
    assert_eq!(content_hash(&[]), 0);
}

#[test]
fn g1_model_only() {
    assert_eq!(
        one("m", "", &[1, 2, 3, 4], 2, 2048),
        [0xbdeada2071943583, 0x7aacfb531261b051]
    );
}

#[test]
fn g2_salt_changes_hashes_and_h3() {
    let salted = one("m", "salt", &[1, 2, 3, 4], 2, 2048);
    assert_eq!(salted, [0x6b0e68c54f9ceac3, 0xf1433d4ff41f4429]);
    let unsalted = block_hashes("m", "", &[&[1, 2, 3, 4]], 2, 2048);
    let with_salt = block_hashes("m", "salt", &[&[1, 2, 3, 4]], 2, 2048);
    assert_eq!(unsalted.len(), with_salt.len());
    assert_ne!(unsalted, with_salt);
}

#[test]
fn g2b_model_salt_concatenation_collides() {
    assert_eq!(
        one("msalt", "", &[1, 2, 3, 4], 2, 2048),
        [0x6b0e68c54f9ceac3, 0xf1433d4ff41f4429]
    );
}

#[test]
fn g3_trailing_partial_block_is_hashed() {
    let g3 = one("test-model", "", &range(1, 10), 4, 2048);
    assert_eq!(
        g3,
        [0xbbaff9ab40b2fc24, 0xaccb2a8863c7324c, 0x2ca6840aac255efb]
    );
    assert_eq!(
        one("test-model", "", &range(1, 8), 4, 2048),
        [0xbbaff9ab40b2fc24, 0xaccb2a8863c7324c]
    );
    assert_eq!(
        one("test-model", "", &range(1, 9), 4, 2048),
        [0xbbaff9ab40b2fc24, 0xaccb2a8863c7324c, 0x9cba7068b5e60fbe]
    );
}

#[test]
fn g4_empty_model() {
    assert_eq!(
        one("", "", &range(1, 8), 4, 2048),
        [0x23e93cf3263c5519, 0x3d65cd20e965730f]
    );
}

#[test]
fn g5_g6_each_prompt_restarts_the_chain() {
    let multi = block_hashes("model", "", &[&[1, 2], &[3, 4]], 2, 2048);
    assert_eq!(multi, [vec![0xffdca57d22906a0b], vec![0xe3c1183459dad609]]);
    let single = block_hashes("model", "", &[&[1, 2, 3, 4]], 2, 2048);
    assert_eq!(single, [vec![0xffdca57d22906a0b, 0x9f53fe5600b4b914]]);
    // H5
    assert_eq!(multi[0][0], single[0][0]);
    assert_ne!(multi[1][0], single[0][1]);
}

#[test]
fn g7_empty_prompt_dropped() {
    let lists = block_hashes("model", "", &[&[1, 2], &[], &[3, 4]], 2, 2048);
    assert_eq!(lists, [vec![0xffdca57d22906a0b], vec![0xe3c1183459dad609]]);
}

#[test]
fn g8_g9_max_blocks() {
    assert_eq!(one("m", "", &[1, 2, 3, 4], 2, 1), [0xbdeada2071943583]);
    assert_eq!(one("m", "", &[1, 2, 3, 4], 2, 0), Vec::<u64>::new());
    assert!(block_hashes("m", "", &[&[1, 2, 3, 4]], 2, 0).is_empty());
}

#[test]
fn estimate_tokenizer_prompt() {
    let hello_world = [1819043176, 1870078063, 6581362];
    assert_eq!(one("m", "", &hello_world, 64, 2048), [0xf6615699d17cb474]);
    assert_eq!(
        one("m", "", &hello_world, 2, 2048),
        [0x08d690f931adb157, 0x9cc3db9a2b8ee849]
    );
}

#[test]
fn h1_block_split_counts() {
    let seed = prompt_seed("", "");
    let mut out = Vec::new();
    assert_eq!(hash_prompt_into(seed, &range(1, 8), 4, 2048, &mut out), 2);
    assert_eq!(hash_prompt_into(seed, &range(1, 10), 4, 2048, &mut out), 3);
    assert_eq!(hash_prompt_into(seed, &[], 4, 2048, &mut out), 0);
    assert_eq!(hash_prompt_into(seed, &[1, 2, 3], 0, 2048, &mut out), 0);
    assert_eq!(out.len(), 5);
    // The partial block [9, 10] is chained onto the two full blocks.
    assert_eq!(out[4], chain(content_hash(&[9, 10]), out[3]));
}

#[test]
fn hash_prompt_into_appends_after_existing_entries() {
    let mut out = vec![7];
    let added = hash_prompt_into(prompt_seed("m", ""), &[1, 2, 3, 4], 2, 2048, &mut out);
    assert_eq!(added, 2);
    assert_eq!(out, [7, 0xbdeada2071943583, 0x7aacfb531261b051]);
}

#[test]
fn h2_total_counts() {
    let total = |lists: Vec<Vec<u64>>| lists.iter().map(Vec::len).sum::<usize>();
    assert_eq!(total(block_hashes("", "", &[&range(1, 10)], 4, 2048)), 3);
    assert_eq!(total(block_hashes("", "", &[], 4, 2048)), 0);
}

#[test]
fn h4_multi_prompt_block_counts() {
    let counts = |prompts: &[&[u32]]| -> Vec<usize> {
        block_hashes("model", "", prompts, 2, 2048)
            .iter()
            .map(Vec::len)
            .collect()
    };
    assert_eq!(counts(&[&[1, 2, 3, 4], &[5, 6, 7, 8]]), [2, 2]);
    assert_eq!(counts(&[&[1, 2, 3], &[4, 5], &[6]]), [2, 1, 1]);
    assert_eq!(counts(&[&[1, 2], &[], &[3, 4]]), [1, 1]);
}

#[test]
fn both_byte_order_paths_hash_alike() {
    // The portable path streams blocks longer than its buffer; both paths must agree with
    // one XXH64 pass over the little-endian bytes.
    let tokens: Vec<u32> = (0..1000u32)
        .map(|t| t.wrapping_mul(2_654_435_761))
        .collect();
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    assert_eq!(content_hash(&tokens), xxh64(&bytes, 0));
    assert_eq!(content_hash_portable(&tokens), xxh64(&bytes, 0));
    assert_eq!(
        content_hash_portable(&tokens[..BUF_TOKENS]),
        xxh64(&bytes[..BUF_TOKENS * 4], 0)
    );
    assert_eq!(
        content_hash(&tokens[..7]),
        content_hash_portable(&tokens[..7])
    );
}

#[test]
fn long_prompt_sanity() {
    // An 8k-token prompt in 64-token blocks: 128 chained hashes, and a prompt that stops half
    // way shares exactly the hashes of its full blocks.
    let tokens: Vec<u32> = (0..8192u32).collect();
    let full = one("m", "", &tokens, 64, 2048);
    assert_eq!(full.len(), 128);
    let half = one("m", "", &tokens[..4096 + 10], 64, 2048);
    assert_eq!(half.len(), 65);
    assert_eq!(half[..64], full[..64]);
    assert_ne!(half[64], full[64]);
    assert_eq!(one("m", "", &tokens, 64, 100).len(), 100);
}

#[test]
fn block_count_is_what_hashing_appends() {
    let tokens = range(0, 300);
    for len in [0, 1, 63, 64, 65, 128, 255, 300] {
        for block in [0, 1, 7, 64, 512] {
            for max_blocks in [0, 1, 3, 2048] {
                let mut out = Vec::new();
                let appended = hash_prompt_into(7, &tokens[..len], block, max_blocks, &mut out);
                assert_eq!(block_count(len, block, max_blocks), appended);
                assert_eq!(out.len(), appended);
            }
        }
    }
}

/// [`chain`] through the general XXH64 function.
fn chain_reference(content: u64, prev: u64) -> u64 {
    let mut pair = [0u8; 16];
    pair[..8].copy_from_slice(&content.to_le_bytes());
    pair[8..].copy_from_slice(&prev.to_le_bytes());
    xxh64(&pair, 0)
}

#[test]
fn chain_is_xxh64_of_the_two_hashes() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for (content, prev) in [(0, 0), (u64::MAX, 0), (0, u64::MAX), (1, 2)] {
        assert_eq!(chain(content, prev), chain_reference(content, prev));
    }
    for _ in 0..10_000 {
        let (content, prev) = (next(), next());
        assert_eq!(chain(content, prev), chain_reference(content, prev));
    }
}

#[test]
fn local_hashes_chain_like_the_reference_hashes_over_the_same_blocks() {
    let tokens: Vec<u32> = (0..300).collect();
    let mut other = tokens.clone();
    other[200] = 7;
    let (mut a, mut b, mut reference) = (Vec::new(), Vec::new(), Vec::new());
    assert_eq!(hash_prompt_local_into(9, &tokens, 64, &mut a), 5);
    assert_eq!(hash_prompt_local_into(9, &other, 64, &mut b), 5);
    hash_prompt_into(9, &tokens, 64, usize::MAX, &mut reference);
    assert_eq!(a.len(), reference.len());
    assert_ne!(a, reference, "another content hash");
    // Shared up to the block holding token 200 (the fourth), different from there on.
    assert_eq!(a[..3], b[..3]);
    assert!(a[3..].iter().zip(&b[3..]).all(|(x, y)| x != y));
    let mut seeded = Vec::new();
    hash_prompt_local_into(10, &tokens, 64, &mut seeded);
    assert!(seeded.iter().zip(&a).all(|(x, y)| x != y));
    assert_eq!(hash_prompt_local_into(9, &[], 64, &mut a), 0);
    assert_eq!(hash_prompt_local_into(9, &tokens, 0, &mut a), 0);
}

/// Content hashes of one prompt in `piece`-token pieces, without a limit.
fn contents(tokens: &[u32], piece: usize) -> Vec<u64> {
    let mut out = Vec::new();
    content_hashes_into(tokens, piece, usize::MAX, &mut out);
    out
}

#[test]
fn chained_content_hashes_are_the_block_hashes() {
    let tokens = range(1, 1000);
    let seed = prompt_seed("m", "s");
    for block in [1, 16, 64, 999, 1000, 1001] {
        let mut chained = Vec::new();
        chain_pieces_into(seed, &contents(&tokens, block), 1, &mut chained);
        assert_eq!(
            chained,
            one("m", "s", &tokens, block, usize::MAX),
            "block {block}"
        );
    }
}

#[test]
fn blocks_of_pieces_share_a_hash_exactly_when_they_share_the_prefix() {
    // 1000 tokens: 63 pieces of 16 (the last of 8 tokens), so 16 blocks of 4 pieces, the last
    // of 3.
    let tokens = range(1, 1000);
    let seed = prompt_seed("m", "");
    let mut blocks = Vec::new();
    assert_eq!(
        chain_pieces_into(seed, &contents(&tokens, 16), 4, &mut blocks),
        16
    );
    let distinct: std::collections::HashSet<u64> = blocks.iter().copied().collect();
    assert_eq!(distinct.len(), 16);
    // One token changed: the blocks from the one holding it on differ, none before.
    for at in [0, 63, 64, 700, 999] {
        let mut other = tokens.clone();
        other[at] += 1;
        let mut changed = Vec::new();
        chain_pieces_into(seed, &contents(&other, 16), 4, &mut changed);
        for (block, (a, b)) in blocks.iter().zip(&changed).enumerate() {
            assert_eq!(a == b, block < at / 64, "token {at}, block {block}");
        }
    }
    // Two pieces swapped within a block: another block.
    let mut swapped = tokens.clone();
    swapped[..32].rotate_left(16);
    let mut changed = Vec::new();
    chain_pieces_into(seed, &contents(&swapped, 16), 4, &mut changed);
    assert_ne!(changed[0], blocks[0]);
    // A prompt ending inside a block gets a hash of its own for that block.
    let mut shorter = Vec::new();
    chain_pieces_into(seed, &contents(&tokens[..950], 16), 4, &mut shorter);
    assert_eq!(shorter[..14], blocks[..14]);
    assert_eq!(shorter.len(), 15);
    assert_ne!(shorter[14], blocks[14]);
    assert_eq!(
        chain_pieces_into(seed, &contents(&tokens, 16), 0, &mut blocks),
        0
    );
}

#[test]
fn content_hashes_stop_at_the_piece_limit() {
    let tokens = range(1, 100);
    let mut out = vec![7];
    assert_eq!(content_hashes_into(&tokens, 16, 3, &mut out), 3);
    assert_eq!(out[1..], contents(&tokens, 16)[..3]);
    assert_eq!(content_hashes_into(&[], 16, 3, &mut out), 0);
    assert_eq!(content_hashes_into(&tokens, 0, 3, &mut out), 0);
}

#[test]
fn published_content_hashes_chain_into_each_prompts_block_hashes() {
    use published::{encode_content_hashes, ContentHashes};
    let prompts = [range(1, 100), Vec::new(), range(500, 533)];
    let mut all = Vec::new();
    let mut ends = Vec::new();
    for prompt in &prompts {
        content_hashes_into(prompt, 16, usize::MAX, &mut all);
        ends.push(all.len());
    }
    let mut bytes = Vec::new();
    encode_content_hashes(16, &all, &ends, &mut bytes);
    let value = ContentHashes::parse(&bytes).expect("a value");
    assert_eq!((value.block_tokens(), value.prompts()), (16, 3));
    assert_eq!(
        [value.blocks(0), value.blocks(1), value.blocks(2)],
        [7, 0, 3]
    );

    let seed = prompt_seed("lora", "");
    let mut chained = vec![1];
    let mut prompt_ends = Vec::new();
    let needed = |p: usize| block_count(prompts[p].len(), 16, 5);
    assert!(
        value.chain_into(seed, (16, 3), needed, &mut chained, |end| prompt_ends
            .push(end))
    );
    let mut expected = vec![1];
    let mut expected_ends = Vec::new();
    for prompt in &prompts {
        hash_prompt_into(seed, prompt, 16, 5, &mut expected);
        expected_ends.push(expected.len());
    }
    assert_eq!(chained, expected);
    assert_eq!(prompt_ends, expected_ends);

    // A prompt that needs more blocks than were published: nothing appended.
    let mut short = vec![1];
    let mut called = false;
    let more_than_published = |p: usize| value.blocks(p) + usize::from(p == 2);
    assert!(
        !value.chain_into(seed, (16, 3), more_than_published, &mut short, |_| called =
            true)
    );
    assert_eq!(short, [1]);
    assert!(!called);
    // Blocks of another size, or another number of prompts: nothing appended either.
    for shape in [(8, 3), (16, 2)] {
        assert!(!value.chain_into(seed, shape, needed, &mut short, |_| called = true));
        assert_eq!(short, [1]);
        assert!(!called);
    }
}

#[test]
fn other_bytes_are_not_a_published_value() {
    use published::{encode_content_hashes, ContentHashes};
    let mut bytes = Vec::new();
    encode_content_hashes(16, &[1, 2, 3], &[2, 3], &mut bytes);
    assert!(ContentHashes::parse(&bytes).is_some());
    assert!(ContentHashes::parse(&bytes[..bytes.len() - 1]).is_none());
    assert!(ContentHashes::parse(b"a text note, not hashes").is_none());
    assert!(ContentHashes::parse(&[]).is_none());
    let mut claims_more = bytes.clone();
    claims_more[8] = 200;
    assert!(ContentHashes::parse(&claims_more).is_none());
}
