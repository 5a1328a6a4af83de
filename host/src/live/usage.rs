//! Reading a response's `usage` out of a body that arrives in chunks (a JSON document, or an
//! SSE stream whose last event carries the usage), without keeping the body: the latest
//! `completion_tokens` and `prompt_tokens_details.cached_tokens` seen.

/// The keys read, in the order of [`UsageScanner::latest`].
const KEYS: [&[u8]; 2] = [b"\"completion_tokens\"", b"\"cached_tokens\""];
const COMPLETION: usize = 0;
const CACHED: usize = 1;
/// Bytes kept from one chunk to the next: enough for a key, spaces, a colon and a number.
const CARRY: usize = 64;

/// The latest value of each key seen so far.
#[derive(Debug, Default)]
pub struct UsageScanner {
    carry: Vec<u8>,
    latest: [Option<u64>; 2],
}

impl UsageScanner {
    pub fn feed(&mut self, chunk: &[u8]) {
        if chunk.is_empty() {
            return;
        }
        let joined;
        let window: &[u8] = if self.carry.is_empty() {
            chunk
        } else {
            self.carry.extend_from_slice(chunk);
            joined = std::mem::take(&mut self.carry);
            &joined
        };
        let mut pending_from: Option<usize> = None;
        for (slot, key) in KEYS.iter().enumerate() {
            let mut from = 0;
            while let Some(at) = find(&window[from..], key) {
                let start = from + at;
                match number_after(&window[start + key.len()..]) {
                    Some(Some(n)) => self.latest[slot] = Some(n),
                    // Cut off by the chunk's end: look again once more arrives.
                    None => pending_from = Some(pending_from.map_or(start, |p| p.min(start))),
                    Some(None) => {}
                }
                from = start + key.len();
            }
        }
        let keep_from = pending_from.unwrap_or_else(|| window.len().saturating_sub(CARRY));
        let end = window.len().min(keep_from + 4 * CARRY);
        self.carry = window[keep_from..end].to_vec();
    }

    pub fn completion_tokens(&self) -> Option<u64> {
        self.latest[COMPLETION]
    }

    /// `usage.prompt_tokens_details.cached_tokens`: prompt tokens the replica found cached.
    pub fn cached_tokens(&self) -> Option<u64> {
        self.latest[CACHED]
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The number after `: `: `Some(Some(n))`, `Some(None)` when something else follows, `None`
/// when the text ends before the number does.
fn number_after(rest: &[u8]) -> Option<Option<u64>> {
    let mut i = 0;
    while i < rest.len() && rest[i].is_ascii_whitespace() {
        i += 1;
    }
    if i == rest.len() {
        return None;
    }
    if rest[i] != b':' {
        return Some(None);
    }
    i += 1;
    while i < rest.len() && rest[i].is_ascii_whitespace() {
        i += 1;
    }
    let digits = rest[i..].iter().take_while(|b| b.is_ascii_digit()).count();
    if i + digits == rest.len() {
        return None;
    }
    if digits == 0 {
        return Some(None);
    }
    Some(std::str::from_utf8(&rest[i..i + digits]).ok()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_whole_json_body() {
        let mut scanner = UsageScanner::default();
        scanner.feed(br#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":42}}"#);
        assert_eq!(scanner.completion_tokens(), Some(42));
        assert_eq!(scanner.cached_tokens(), None);
    }

    #[test]
    fn reads_cached_tokens_across_every_split_of_an_sse_stream() {
        let body = b"data: {\"choices\":[{\"text\":\"a\"}]}\n\n\
                     data: {\"choices\":[],\"usage\":{\"prompt_tokens\":130,\"completion_tokens\":7,\
                     \"prompt_tokens_details\":{\"cached_tokens\": 128}}}\n\ndata: [DONE]\n\n";
        for split in 0..body.len() {
            let mut scanner = UsageScanner::default();
            scanner.feed(&body[..split]);
            scanner.feed(&body[split..]);
            assert_eq!(scanner.cached_tokens(), Some(128), "split at {split}");
            assert_eq!(scanner.completion_tokens(), Some(7), "split at {split}");
        }
    }

    #[test]
    fn a_null_details_object_leaves_cached_tokens_unknown() {
        let mut scanner = UsageScanner::default();
        scanner.feed(br#"{"usage":{"completion_tokens":3,"prompt_tokens_details":null}}"#);
        assert_eq!(scanner.cached_tokens(), None);
        assert_eq!(scanner.completion_tokens(), Some(3));
    }

    #[test]
    fn reads_across_every_split_of_an_sse_stream() {
        let body = b"data: {\"choices\":[{\"text\":\"a\"}]}\n\n\
                     data: {\"choices\":[],\"usage\":{\"completion_tokens\" : 1234}}\n\ndata: [DONE]\n\n";
        for split in 0..body.len() {
            let mut scanner = UsageScanner::default();
            scanner.feed(&body[..split]);
            scanner.feed(&body[split..]);
            assert_eq!(scanner.completion_tokens(), Some(1234), "split at {split}");
        }
        let mut bytewise = UsageScanner::default();
        for b in body.iter() {
            bytewise.feed(std::slice::from_ref(b));
        }
        assert_eq!(bytewise.completion_tokens(), Some(1234));
    }

    #[test]
    fn a_body_without_usage_reports_none_and_stays_small() {
        let mut scanner = UsageScanner::default();
        for _ in 0..1000 {
            scanner.feed(&[b'x'; 1000]);
        }
        assert_eq!(scanner.completion_tokens(), None);
        assert!(scanner.carry.len() <= 4 * CARRY);
    }
}
