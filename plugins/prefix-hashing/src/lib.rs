//! Chained prefix-block hashing shared by the prefix-cache plugins.
//!
//! A prompt's token ids are cut into fixed-size blocks (the trailing partial block counts as a
//! block) and each block hash covers the whole prefix up to and including that block, so two
//! prompts share a block hash exactly when they share that prefix. The scheme is bit-compatible
//! with the reference endpoint picker: XXH64 with seed 0 throughout, the chain starting from the
//! hash of the model name followed by the cache salt.

use std::hash::{BuildHasherDefault, Hasher};

use xxhash_rust::xxh64::{xxh64, Xxh64};

pub mod published;

/// Tokens converted per step by the portable path.
#[cfg(any(test, not(target_endian = "little")))]
const BUF_TOKENS: usize = 256;

/// Block hashes are already uniform 64-bit values: a map keyed by them uses them as they are
/// instead of hashing them again (`HashMap<u64, V, BlockHashBuild>`).
#[derive(Default)]
pub struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

/// The hasher builder of maps keyed by block hashes.
pub type BlockHashBuild = BuildHasherDefault<PassThroughHasher>;

/// Start of the hash chain for every prompt of a request: XXH64 of the model name's bytes
/// followed by the cache salt's bytes (nothing is appended when the salt is empty).
///
/// There is no separator, so model `"ab"` with salt `"c"` seeds the same chain as model `"a"`
/// with salt `"bc"`; this is kept so hashes match the reference.
pub fn prompt_seed(model: &str, cache_salt: &str) -> u64 {
    let mut state = Xxh64::new(0);
    state.update(model.as_bytes());
    if !cache_salt.is_empty() {
        state.update(cache_salt.as_bytes());
    }
    state.digest()
}

/// Appends the chained block hashes of one prompt to `out` and returns how many were appended.
///
/// Blocks hold `block_size` tokens, the last one possibly fewer. At most `max_blocks` hashes are
/// produced; nothing is produced when `block_size` or `max_blocks` is 0 or the prompt is empty.
pub fn hash_prompt_into(
    seed: u64,
    tokens: &[u32],
    block_size: usize,
    max_blocks: usize,
    out: &mut Vec<u64>,
) -> usize {
    chain_blocks_into(seed, tokens, block_size, max_blocks, content_hash, out)
}

/// Like [`hash_prompt_into`] (same blocks, same chaining, no block limit), but each block's
/// content is hashed with XXH3, about twice as fast on long prompts. The hashes agree with
/// nothing outside this process: for comparing prompts with each other, never with the
/// reference's or an engine's hashes.
pub fn hash_prompt_local_into(
    seed: u64,
    tokens: &[u32],
    block_size: usize,
    out: &mut Vec<u64>,
) -> usize {
    chain_blocks_into(
        seed,
        tokens,
        block_size,
        usize::MAX,
        local_content_hash,
        out,
    )
}

/// The chained hashes of at most `max_blocks` blocks of `block_size` tokens, each block's
/// content hashed by `content`; see [`hash_prompt_into`].
#[inline(always)]
fn chain_blocks_into(
    seed: u64,
    tokens: &[u32],
    block_size: usize,
    max_blocks: usize,
    content: impl Fn(&[u32]) -> u64,
    out: &mut Vec<u64>,
) -> usize {
    let count = block_count(tokens.len(), block_size, max_blocks);
    if count == 0 {
        return 0;
    }
    out.reserve(count);
    let mut prev = seed;
    for block in tokens.chunks(block_size).take(count) {
        prev = chain(content(block), prev);
        out.push(prev);
    }
    count
}

/// Appends the content hash of each `piece`-token piece of `tokens` to `out` (the trailing
/// partial piece counts), at most `max_pieces`, and returns how many were appended. These are
/// the hashes [`hash_prompt_into`] chains: [`chain_pieces_into`] turns them into its block
/// hashes without reading the tokens again.
pub fn content_hashes_into(
    tokens: &[u32],
    piece: usize,
    max_pieces: usize,
    out: &mut Vec<u64>,
) -> usize {
    let count = block_count(tokens.len(), piece, max_pieces);
    if count == 0 {
        return 0;
    }
    out.extend(tokens.chunks(piece).take(count).map(content_hash));
    count
}

/// Appends the chained hashes of blocks of `pieces_per_block` consecutive pieces whose
/// content hashes are `contents` (one prompt's, from [`content_hashes_into`]), the last block
/// possibly shorter, and returns how many were appended (none when `pieces_per_block` is 0).
///
/// A block's content hash is its first piece's, with each further piece's folded in by one
/// XXH64 lane round; blocks are then chained as [`hash_prompt_into`] chains them. Blocks of one
/// piece therefore get exactly [`hash_prompt_into`]'s hashes of the same blocks, and a block of
/// several pieces costs one chaining, not one per piece.
pub fn chain_pieces_into(
    seed: u64,
    contents: &[u64],
    pieces_per_block: usize,
    out: &mut Vec<u64>,
) -> usize {
    if pieces_per_block == 0 {
        return 0;
    }
    let count = contents.len().div_ceil(pieces_per_block);
    out.reserve(count);
    let mut prev = seed;
    for block in contents.chunks(pieces_per_block) {
        let content = block[1..]
            .iter()
            .fold(block[0], |folded, &piece| lane(folded, piece));
        prev = chain(content, prev);
        out.push(prev);
    }
    count
}

/// How many hashes [`hash_prompt_into`] appends for a prompt of `tokens` tokens, without
/// hashing: one per started block of `block_size` tokens, at most `max_blocks`, and none when
/// `block_size` or `max_blocks` is 0 or the prompt is empty.
pub fn block_count(tokens: usize, block_size: usize, max_blocks: usize) -> usize {
    if block_size == 0 || max_blocks == 0 || tokens == 0 {
        return 0;
    }
    tokens.div_ceil(block_size).min(max_blocks)
}

/// Block hashes of every prompt of a request, one list per prompt in order. Prompts that yield
/// no hash (empty prompts) are left out, so list positions need not match prompt positions.
pub fn block_hashes(
    model: &str,
    cache_salt: &str,
    prompts: &[&[u32]],
    block_size: usize,
    max_blocks: usize,
) -> Vec<Vec<u64>> {
    let seed = prompt_seed(model, cache_salt);
    let mut lists = Vec::new();
    for tokens in prompts {
        let mut hashes = Vec::new();
        if hash_prompt_into(seed, tokens, block_size, max_blocks, &mut hashes) > 0 {
            lists.push(hashes);
        }
    }
    lists
}

/// XXH64 of a block's tokens as little-endian `u32` bytes; an empty block hashes to 0.
fn content_hash(tokens: &[u32]) -> u64 {
    if tokens.is_empty() {
        return 0;
    }
    #[cfg(target_endian = "little")]
    {
        // SAFETY: `u32` has no padding and every byte pattern is a valid `u8`; the byte slice
        // covers exactly the tokens' memory and lives no longer than the borrow of `tokens`.
        let bytes = unsafe {
            std::slice::from_raw_parts(tokens.as_ptr().cast::<u8>(), std::mem::size_of_val(tokens))
        };
        xxh64(bytes, 0)
    }
    #[cfg(not(target_endian = "little"))]
    {
        content_hash_portable(tokens)
    }
}

/// XXH3 of a block's tokens as little-endian `u32` bytes where that is their memory layout;
/// elsewhere [`content_hash`].
fn local_content_hash(tokens: &[u32]) -> u64 {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: as in `content_hash`.
        let bytes = unsafe {
            std::slice::from_raw_parts(tokens.as_ptr().cast::<u8>(), std::mem::size_of_val(tokens))
        };
        xxhash_rust::xxh3::xxh3_64(bytes)
    }
    #[cfg(not(target_endian = "little"))]
    {
        content_hash(tokens)
    }
}

/// [`content_hash`] for any byte order: converts the tokens through a stack buffer.
#[cfg(any(test, not(target_endian = "little")))]
fn content_hash_portable(tokens: &[u32]) -> u64 {
    let mut buf = [0u8; BUF_TOKENS * 4];
    if tokens.len() <= BUF_TOKENS {
        return xxh64(fill_le(&mut buf, tokens), 0);
    }
    let mut state = Xxh64::new(0);
    for part in tokens.chunks(BUF_TOKENS) {
        state.update(fill_le(&mut buf, part));
    }
    state.digest()
}

/// Writes `tokens` (at most `BUF_TOKENS`) into `buf` as little-endian bytes.
#[cfg(any(test, not(target_endian = "little")))]
fn fill_le<'b>(buf: &'b mut [u8; BUF_TOKENS * 4], tokens: &[u32]) -> &'b [u8] {
    for (dst, token) in buf.chunks_exact_mut(4).zip(tokens) {
        dst.copy_from_slice(&token.to_le_bytes());
    }
    &buf[..tokens.len() * 4]
}

const PRIME_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME_5: u64 = 0x27D4_EB2F_1656_67C5;

/// XXH64's round for one 8-byte lane of input folded into `hash`.
#[inline(always)]
fn lane(hash: u64, value: u64) -> u64 {
    let k = value
        .wrapping_mul(PRIME_2)
        .rotate_left(31)
        .wrapping_mul(PRIME_1);
    (hash ^ k)
        .rotate_left(27)
        .wrapping_mul(PRIME_1)
        .wrapping_add(PRIME_4)
}

/// Hash of a block given its content hash and the previous block's hash (or the seed): XXH64,
/// seed 0, of the 16 bytes `content` then `prev`, both little-endian.
///
/// Written out for this one input length (XXH64's short-input path: two 8-byte lanes, then the
/// avalanche), which skips the general function's length dispatch; `chain_reference` in the
/// tests checks it against the general function.
#[inline]
fn chain(content: u64, prev: u64) -> u64 {
    // Seed 0, 16 bytes.
    let mut hash = PRIME_5.wrapping_add(16);
    hash = lane(hash, content);
    hash = lane(hash, prev);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(PRIME_2);
    hash ^= hash >> 29;
    hash = hash.wrapping_mul(PRIME_3);
    hash ^ (hash >> 32)
}

#[cfg(test)]
mod tests;
