//! Asking a publisher's replay socket for the messages it still buffers.
//!
//! The request is `["", start_seq as 8 bytes big-endian]` from a DEALER socket to the
//! publisher's ROUTER; the answer is one message per buffered batch with a sequence number
//! at or past the start, `["", (topic,) seq, payload]`, then one whose sequence is all ones.

use std::time::Duration;

use bytes::Bytes;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::decode::{sequence, END_OF_REPLAY};

/// Most messages one replay takes, whatever the publisher sends.
pub const MAX_REPLAYED: usize = 100_000;

/// Buffered `(seq, payload)` messages from `start` on, in the publisher's order. Gives up
/// when a reply does not come within `idle`.
pub async fn replay(
    endpoint: &str,
    start: u64,
    idle: Duration,
) -> Result<Vec<(u64, Bytes)>, String> {
    let mut socket = DealerSocket::new();
    tokio::time::timeout(idle, socket.connect(endpoint))
        .await
        .map_err(|_| format!("no connection to {endpoint} within {} ms", idle.as_millis()))?
        .map_err(|e| format!("cannot connect to {endpoint}: {e}"))?;
    let mut request = ZmqMessage::from(Bytes::new());
    request.push_back(Bytes::copy_from_slice(&start.to_be_bytes()));
    socket
        .send(request)
        .await
        .map_err(|e| format!("cannot send the replay request: {e}"))?;
    let mut replayed = Vec::new();
    while replayed.len() < MAX_REPLAYED {
        let message = tokio::time::timeout(idle, socket.recv())
            .await
            .map_err(|_| {
                format!(
                    "the replay stopped answering after {} messages",
                    replayed.len()
                )
            })?
            .map_err(|e| format!("the replay failed: {e}"))?;
        let mut frames = message.into_vec();
        if frames.first().is_some_and(|f| f.is_empty()) {
            frames.remove(0);
        }
        // `[seq, payload]`, or `[topic, seq, payload]` from newer publishers.
        let (seq, payload) = match frames.len() {
            2 => (sequence(&frames[0])?, frames.swap_remove(1)),
            3 => (sequence(&frames[1])?, frames.swap_remove(2)),
            n => return Err(format!("a replay message of {n} frames")),
        };
        if seq == END_OF_REPLAY {
            return Ok(replayed);
        }
        replayed.push((seq, payload));
    }
    Err(format!("the replay sent more than {MAX_REPLAYED} messages"))
}
