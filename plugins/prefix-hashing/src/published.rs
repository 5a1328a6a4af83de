//! The `BlockContentHashes` value one producer publishes so another keyed on the same blocks
//! chains the hashes instead of reading the prompt again.
//!
//! The content hashes of a request's prompts, cut in blocks of one size, are written as little
//! endian numbers:
//!
//! | bytes | what |
//! |---|---|
//! | 4 | the tag `BCH1` |
//! | 4 | tokens per block (`u32`) |
//! | 4 | the request's prompt count (`u32`), empty prompts included |
//! | 4 per prompt | how many blocks of that prompt follow (`u32`), in prompt order |
//! | 8 per block | the blocks' content hashes (`u64`), prompt after prompt |
//!
//! A prompt may carry fewer blocks than it has (the publisher's block limit); a consumer that
//! needs more hashes its prompt itself.

use crate::chain;

const TAG: &[u8; 4] = b"BCH1";
const HEADER: usize = 12;

/// Writes the value for `block_tokens`-token blocks into `out` (cleared first): `contents`
/// holds every prompt's content hashes one after the other, and `ends[i]` is where prompt
/// `i`'s end in it.
pub fn encode_content_hashes(
    block_tokens: u32,
    contents: &[u64],
    ends: &[usize],
    out: &mut Vec<u8>,
) {
    out.clear();
    out.reserve(HEADER + 4 * ends.len() + 8 * contents.len());
    out.extend_from_slice(TAG);
    out.extend_from_slice(&block_tokens.to_le_bytes());
    out.extend_from_slice(&to_u32(ends.len()).to_le_bytes());
    let mut start = 0;
    for &end in ends {
        out.extend_from_slice(&to_u32(end - start).to_le_bytes());
        start = end;
    }
    for content in &contents[..start] {
        out.extend_from_slice(&content.to_le_bytes());
    }
}

/// A published value, checked and ready to read.
#[derive(Debug, Clone, Copy)]
pub struct ContentHashes<'a> {
    block_tokens: u32,
    counts: &'a [u8],
    hashes: &'a [u8],
}

impl<'a> ContentHashes<'a> {
    /// Reads a value written by [`encode_content_hashes`]; `None` when the bytes are not one
    /// (another tag, or lengths that do not add up).
    pub fn parse(bytes: &'a [u8]) -> Option<Self> {
        if bytes.len() < HEADER || &bytes[..4] != TAG {
            return None;
        }
        let block_tokens = read_u32(bytes, 4);
        let prompts = read_u32(bytes, 8) as usize;
        let counts = bytes.get(HEADER..HEADER.checked_add(prompts.checked_mul(4)?)?)?;
        let blocks: usize = counts
            .chunks_exact(4)
            .map(|c| read_u32(c, 0) as usize)
            .sum();
        let hashes = &bytes[HEADER + counts.len()..];
        (hashes.len() == blocks.checked_mul(8)?).then_some(ContentHashes {
            block_tokens,
            counts,
            hashes,
        })
    }

    /// Tokens per block.
    pub fn block_tokens(&self) -> u32 {
        self.block_tokens
    }

    /// How many prompts the request has.
    pub fn prompts(&self) -> usize {
        self.counts.len() / 4
    }

    /// How many blocks of prompt `prompt` were published.
    pub fn blocks(&self, prompt: usize) -> usize {
        self.counts
            .get(prompt * 4..prompt * 4 + 4)
            .map_or(0, |c| read_u32(c, 0) as usize)
    }

    /// Appends the chained hashes of the first `blocks(prompt)` blocks of every prompt to `out`,
    /// as [`crate::hash_prompt_into`] would from the tokens, calling `prompt_end` with `out`'s
    /// length after each prompt. `shape` is the consumer's block size and the request's prompt
    /// count. Returns `false`, having appended nothing and called nothing, when the value does
    /// not serve it: blocks of another size, another number of prompts, or a prompt that needs
    /// more blocks than were published.
    pub fn chain_into(
        &self,
        seed: u64,
        shape: (u32, usize),
        blocks: impl Fn(usize) -> usize,
        out: &mut Vec<u64>,
        mut prompt_end: impl FnMut(usize),
    ) -> bool {
        let (block_tokens, prompts) = shape;
        if block_tokens != self.block_tokens
            || prompts != self.prompts()
            || (0..prompts).any(|prompt| blocks(prompt) > self.blocks(prompt))
        {
            return false;
        }
        let mut at = 0;
        for prompt in 0..self.prompts() {
            let needed = blocks(prompt);
            let mut prev = seed;
            out.extend(
                self.hashes[at * 8..(at + needed) * 8]
                    .chunks_exact(8)
                    .map(|bytes| {
                        let content = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
                        prev = chain(content, prev);
                        prev
                    }),
            );
            at += self.blocks(prompt);
            prompt_end(out.len());
        }
        true
    }
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn to_u32(value: usize) -> u32 {
    u32::try_from(value).expect("a prompt's block count fits in 32 bits")
}
