//! The load a replica carries besides this router's own requests in flight, when
//! `inFlightProducerName` says what those are: how far its reported running count exceeds
//! them.
//!
//! A report is a scrape, up to a scrape interval old. Right after requests of ours finished,
//! the last scrape still counts them, and taking that excess as other traffic would send the
//! next burst away from every replica but the one scraped last. So an excess counts only as far
//! as it held over the recent past: the least excess seen within the last [`MEMORY_MS`] to
//! twice that, where a replica not looked at for longer starts from none. This router's own
//! load is exact at once; traffic from elsewhere counts from at most twice [`MEMORY_MS`] after
//! it started, or after a quiet spell.

/// How long an excess must hold before it is taken in full.
pub const MEMORY_MS: u64 = 2000;

#[derive(Debug, Default)]
pub struct OtherTraffic {
    /// By host index.
    tracks: Vec<Option<Track>>,
}

#[derive(Debug, Clone, Copy)]
struct Track {
    /// The least excess seen since `current_from_ms`.
    current: u64,
    current_from_ms: u64,
    /// The least excess of the period before, when it ended less than a period ago.
    previous: Option<u64>,
    last_ms: u64,
}

impl OtherTraffic {
    /// Notes that `host_index` reports `excess` running requests beyond this router's own at
    /// `now_ms`, and returns how many of them it is taken to carry.
    pub fn observe(&mut self, host_index: usize, now_ms: u64, excess: u64) -> u64 {
        if self.tracks.len() <= host_index {
            self.tracks.resize(host_index + 1, None);
        }
        let slot = &mut self.tracks[host_index];
        let track = match slot {
            Some(track) if now_ms.saturating_sub(track.last_ms) <= MEMORY_MS => track,
            _ => {
                *slot = Some(Track {
                    current: 0,
                    current_from_ms: now_ms,
                    previous: None,
                    last_ms: now_ms,
                });
                return 0;
            }
        };
        if now_ms.saturating_sub(track.current_from_ms) >= MEMORY_MS {
            track.previous = Some(track.current);
            track.current = excess;
            track.current_from_ms = now_ms;
        } else {
            track.current = track.current.min(excess);
        }
        track.last_ms = track.last_ms.max(now_ms);
        track
            .previous
            .map_or(track.current, |p| p.min(track.current))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_report_right_after_our_own_burst_counts_nothing() {
        let mut other = OtherTraffic::default();
        // Our burst went out while the replica reported nothing beyond it...
        assert_eq!(other.observe(3, 1_000, 0), 0);
        // ...and finished; the last scrape still counts 40 of its requests.
        assert_eq!(other.observe(3, 1_900, 40), 0);
        assert_eq!(other.observe(3, 1_950, 40), 0);
    }

    #[test]
    fn an_excess_that_holds_is_taken_once_its_quiet_past_is_forgotten() {
        let mut other = OtherTraffic::default();
        assert_eq!(other.observe(0, 0, 0), 0);
        let mut now = 100;
        let mut taken = 0;
        while now <= 4 * MEMORY_MS + 100 {
            taken = other.observe(0, now, 12);
            now += 100;
        }
        assert_eq!(taken, 12, "another router's steady 12 requests");
        // And it falls at once when the report falls.
        assert_eq!(other.observe(0, now, 5), 5);
    }

    #[test]
    fn after_a_quiet_spell_a_report_counts_only_once_it_held() {
        let mut other = OtherTraffic::default();
        assert_eq!(other.observe(1, 0, 0), 0);
        // The last scrape may still count requests that finished during the quiet spell.
        assert_eq!(other.observe(1, MEMORY_MS + 1, 7), 0);
        // A replica seen for the first time too, and each replica on its own.
        assert_eq!(other.observe(5, 10, 9), 0);
        assert_eq!(other.observe(5, MEMORY_MS + 10, 9), 0);
        assert_eq!(other.observe(5, 2 * MEMORY_MS + 10, 9), 9);
        assert_eq!(other.observe(1, MEMORY_MS + 2, 8), 0);
    }
}
