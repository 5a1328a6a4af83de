//! Sequence numbers of one publisher: which messages to apply, which are repeats, and when
//! messages were lost or the publisher started over.

/// What to do with a message, by its sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The next message: apply it.
    Next,
    /// Already applied: drop it.
    Duplicate,
    /// Already applied through the connection this one replaced: drop it.
    Repeated,
    /// Messages `from..seq` are missing.
    Gap { from: u64 },
    /// The publisher started over (its sequence went back after a reconnect, or to 0).
    Restart,
    /// The first message seen from this publisher, and not its first message ever.
    FirstContact,
}

/// The last sequence number applied from one publisher.
#[derive(Debug, Default, Clone)]
pub struct Sequence {
    last: Option<u64>,
    /// The connection was re-established since the last message.
    reconnected: bool,
    /// Messages up to this one came through the connection this one replaced while both were
    /// open.
    overlap: Option<u64>,
}

impl Sequence {
    /// Classifies `seq` and, unless it is a duplicate, takes it as the last one applied.
    pub fn observe(&mut self, seq: u64) -> Step {
        if let Some(through) = self.overlap {
            if seq <= through {
                return Step::Repeated;
            }
            self.overlap = None;
        }
        let reconnected = std::mem::replace(&mut self.reconnected, false);
        let step = match self.last {
            // A publisher counts from 0 (vLLM) or 1 (some simulators).
            None if seq <= 1 => Step::Next,
            None => Step::FirstContact,
            Some(last) if seq == last.wrapping_add(1) => Step::Next,
            Some(last) if seq <= last && (reconnected || seq == 0) => Step::Restart,
            Some(last) if seq <= last => Step::Duplicate,
            Some(last) => Step::Gap { from: last + 1 },
        };
        if step != Step::Duplicate {
            self.last = Some(seq);
        }
        step
    }

    /// The connection to the publisher was lost and made again.
    pub fn reconnected(&mut self) {
        self.reconnected = true;
    }

    /// A new connection to the same publisher replaced one that delivered up to the last
    /// message: its first messages may repeat those.
    pub fn overlapped(&mut self) {
        self.reconnected = false;
        self.overlap = self.last;
    }

    pub fn last(&self) -> Option<u64> {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_messages_apply_and_repeats_drop() {
        let mut s = Sequence::default();
        assert_eq!(s.observe(0), Step::Next);
        assert_eq!(s.observe(1), Step::Next);
        assert_eq!(s.observe(1), Step::Duplicate);
        assert_eq!(s.observe(2), Step::Next);
        assert_eq!(s.last(), Some(2));
    }

    #[test]
    fn a_skip_is_a_gap_from_the_first_missing_message() {
        let mut s = Sequence::default();
        s.observe(1);
        assert_eq!(s.observe(5), Step::Gap { from: 2 });
        assert_eq!(s.observe(6), Step::Next);
    }

    #[test]
    fn a_restart_shows_as_a_sequence_that_went_back_after_a_reconnect_or_to_zero() {
        let mut s = Sequence::default();
        s.observe(0);
        s.observe(1);
        s.observe(2);
        s.reconnected();
        assert_eq!(s.observe(1), Step::Restart);
        assert_eq!(s.observe(2), Step::Next);
        assert_eq!(
            s.observe(0),
            Step::Restart,
            "0 again needs no reconnect to tell"
        );
    }

    #[test]
    fn joining_mid_stream_is_first_contact() {
        let mut s = Sequence::default();
        assert_eq!(s.observe(40), Step::FirstContact);
        assert_eq!(s.observe(41), Step::Next);
    }

    #[test]
    fn a_replacing_connection_drops_what_the_old_one_delivered_and_goes_on_from_there() {
        let mut s = Sequence::default();
        s.observe(0);
        s.observe(1);
        s.observe(2);
        s.overlapped();
        assert_eq!(s.observe(1), Step::Repeated);
        assert_eq!(s.observe(2), Step::Repeated);
        assert_eq!(s.observe(3), Step::Next);
        assert_eq!(
            s.observe(2),
            Step::Duplicate,
            "once past, a repeat counts again"
        );
        s.overlapped();
        assert_eq!(s.observe(6), Step::Gap { from: 4 }, "a loss still shows");
    }
}
