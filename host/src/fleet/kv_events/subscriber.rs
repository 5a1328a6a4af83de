//! One endpoint's subscription: connects a SUB socket to its publisher, reconnects when the
//! connection drops, checks every message's sequence number and turns messages into
//! deliveries, recovering lost ones through the replay socket when there is one.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use switchyard_plugin_api::kv::{KvEvent, Reset, ResetReason};
use tokio::sync::mpsc;
use zeromq::{Socket, SocketEvent, SocketRecv, SubSocket, ZmqMessage};

use super::decode;
use super::replay::replay;
use super::sequence::{Sequence, Step};
use super::{Delivery, EndpointStats, Settings, Subscription};

/// Runs until the task is aborted or the deliveries' receiver is gone.
pub async fn run(
    subscription: Subscription,
    settings: Settings,
    out: mpsc::Sender<Delivery>,
    stats: Arc<EndpointStats>,
) {
    let mut subscriber = Subscriber {
        subscription,
        settings,
        out,
        stats,
        sequence: Sequence::default(),
    };
    let mut connected_before = false;
    // A connection opened ahead of an idle spell's swap.
    let mut ready: Option<Handover> = None;
    loop {
        let mut same_publisher = false;
        let mut first = None;
        let (mut socket, mut monitor) = match ready.take() {
            Some(handover) => {
                same_publisher = handover.alive;
                first = handover.first;
                handover.connection
            }
            None => match subscriber.open().await {
                Ok(connection) => connection,
                Err(e) => {
                    if let Some(e) = e {
                        subscriber.note_connect_failure(&e);
                    }
                    tokio::time::sleep(subscriber.settings.reconnect).await;
                    continue;
                }
            },
        };
        if same_publisher {
            subscriber.sequence.overlapped();
        } else if connected_before {
            subscriber.sequence.reconnected();
        }
        connected_before = true;
        subscriber.stats.connected.store(true, Relaxed);
        subscriber.stats.connects.fetch_add(1, Relaxed);
        if !subscriber.catch_up().await {
            return;
        }
        if let Some(message) = first {
            if !subscriber.handle(message).await {
                return;
            }
        }
        loop {
            tokio::select! {
                message = socket.recv() => match message {
                    Ok(message) => {
                        if !subscriber.handle(message).await {
                            return;
                        }
                    }
                    Err(_) => break,
                },
                event = monitor.next() => match event {
                    Some(SocketEvent::Disconnected(_)) | None => break,
                    Some(_) => {}
                },
                () = idle(subscriber.settings.idle_reconnect) => {
                    // A publisher silent this long may have restarted unnoticed. The new
                    // connection is made while the old one is still read, so a healthy
                    // publisher loses nothing to the check.
                    match subscriber.open_beside(&mut socket).await {
                        Swap::Ready(handover) => {
                            ready = Some(handover);
                            break;
                        }
                        Swap::Failed => {}
                        Swap::Closed => return,
                    }
                }
            }
        }
        subscriber.stats.connected.store(false, Relaxed);
        drop(socket);
        if ready.is_none() {
            tokio::time::sleep(subscriber.settings.reconnect).await;
        }
    }
}

/// A subscribed, connected socket and its monitor.
type Connection = (SubSocket, futures_channel::mpsc::Receiver<SocketEvent>);

/// A new connection taking over from a live one.
struct Handover {
    connection: Connection,
    /// The old connection still delivered while the new one was made: the new one reaches
    /// the same publisher, and its first messages may repeat what the old one delivered.
    alive: bool,
    /// The new connection's first message, when one came before the handover.
    first: Option<ZmqMessage>,
}

/// The longest an old connection is still read once its successor is connected, waiting for
/// the successor's subscription to reach the publisher.
const OVERLAP_MAX: std::time::Duration = std::time::Duration::from_millis(250);

/// How opening a new connection beside a live one ended.
enum Swap {
    Ready(Handover),
    /// The new connection could not be made; the old one stays.
    Failed,
    /// Nobody takes deliveries any more.
    Closed,
}

/// Resolves after `limit`, or never.
async fn idle(limit: Option<std::time::Duration>) {
    match limit {
        Some(limit) => tokio::time::sleep(limit).await,
        None => std::future::pending().await,
    }
}

struct Subscriber {
    subscription: Subscription,
    settings: Settings,
    out: mpsc::Sender<Delivery>,
    stats: Arc<EndpointStats>,
    sequence: Sequence,
}

impl Subscriber {
    /// Opens a connection to the publisher. `Err(None)`: the attempt timed out.
    async fn open(&self) -> Result<Connection, Option<String>> {
        let mut socket = SubSocket::new();
        let monitor = socket.monitor();
        socket
            .subscribe(&self.subscription.topic)
            .await
            .map_err(|e| Some(e.to_string()))?;
        let address = self.subscription.address.as_str();
        match tokio::time::timeout(self.settings.reconnect * 10, socket.connect(address)).await {
            Ok(Ok(())) => Ok((socket, monitor)),
            Ok(Err(e)) => Err(Some(e.to_string())),
            Err(_) => Err(None),
        }
    }

    /// Opens a new connection while still taking the messages `live` receives, and keeps
    /// reading `live` after, while the new subscription reaches the publisher: until the new
    /// connection delivers its first message (from then on it gets everything), or for one
    /// reconnect period, at most [`OVERLAP_MAX`]. What `live` has received by then is taken
    /// before it is given up. The new connection is read meanwhile too, so a publisher that
    /// sends much at once finds no full queue on it.
    async fn open_beside(&mut self, live: &mut SubSocket) -> Swap {
        let mut taken = Vec::new();
        let opened = {
            let opening = self.open();
            tokio::pin!(opening);
            loop {
                tokio::select! {
                    opened = &mut opening => break opened,
                    message = live.recv() => match message {
                        Ok(message) => taken.push(message),
                        Err(_) => break (&mut opening).await,
                    },
                }
            }
        };
        let mut alive = !taken.is_empty();
        for message in taken {
            if !self.handle(message).await {
                return Swap::Closed;
            }
        }
        let connection = match opened {
            Ok(connection) => connection,
            Err(e) => {
                if let Some(e) = e {
                    self.note_connect_failure(&e);
                }
                return Swap::Failed;
            }
        };
        let (mut socket, monitor) = connection;
        let overlap = tokio::time::sleep(self.settings.reconnect.min(OVERLAP_MAX));
        tokio::pin!(overlap);
        let first = loop {
            tokio::select! {
                () = &mut overlap => break None,
                message = socket.recv() => break message.ok(),
                message = live.recv() => match message {
                    Ok(message) => {
                        alive = true;
                        if !self.handle(message).await {
                            return Swap::Closed;
                        }
                    }
                    Err(_) => break None,
                },
            }
        };
        while let Some(Ok(message)) = live.recv().now_or_never() {
            alive = true;
            if !self.handle(message).await {
                return Swap::Closed;
            }
        }
        Swap::Ready(Handover {
            connection: (socket, monitor),
            alive,
            first,
        })
    }

    fn note_connect_failure(&self, error: &str) {
        if self.stats.connect_failures.fetch_add(1, Relaxed) == 0 {
            tracing::warn!(
                endpoint = %self.subscription.endpoint_id,
                "cannot subscribe to KV events at {}: {error}; retrying",
                self.subscription.address
            );
        }
    }

    /// Counts a message that could not be read, and logs the first one of this endpoint.
    fn malformed(&self, error: &str) {
        if self.stats.malformed.fetch_add(1, Relaxed) == 0 {
            tracing::warn!(
                endpoint = %self.subscription.endpoint_id,
                "a KV event message from {} could not be read and was skipped: {error} \
                 (later ones are only counted)",
                self.subscription.address
            );
        }
    }

    /// Handles one message; `false` once nobody takes deliveries any more.
    async fn handle(&mut self, message: ZmqMessage) -> bool {
        self.stats.messages.fetch_add(1, Relaxed);
        let frames = message.into_vec();
        let views: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
        let (seq, payload) = match decode::split_frames(&views) {
            Ok((seq, at)) => (seq, frames[at].clone()),
            Err(e) => {
                self.malformed(&e);
                return true;
            }
        };
        self.take(seq, payload).await
    }

    /// After a (re)connection: fetches what the publisher sent since the last message seen,
    /// which a connection that dropped or had not yet subscribed missed, and would otherwise
    /// be noticed only at the next message. `false` once nobody takes deliveries any more.
    async fn catch_up(&mut self) -> bool {
        let (Some(endpoint), Some(last)) = (self.subscription.replay.clone(), self.sequence.last())
        else {
            return true;
        };
        match replay(&endpoint, last + 1, self.settings.replay_idle).await {
            Ok(mut messages) => {
                self.stats.replays.fetch_add(1, Relaxed);
                messages.sort_by_key(|(seq, _)| *seq);
                for (seq, payload) in messages {
                    if !self.take(seq, payload).await {
                        return false;
                    }
                }
            }
            Err(e) => {
                if self.stats.replay_failures.fetch_add(1, Relaxed) == 0 {
                    tracing::warn!(
                        endpoint = %self.subscription.endpoint_id,
                        "KV event replay from {endpoint} failed: {e}"
                    );
                }
            }
        }
        true
    }

    /// Takes message `seq`: checks its place in the sequence, recovers what is missing before
    /// it, and delivers its events.
    async fn take(&mut self, seq: u64, payload: Bytes) -> bool {
        let step = self.sequence.observe(seq);
        let mut events = Vec::new();
        match step {
            Step::Duplicate => {
                self.stats.duplicates.fetch_add(1, Relaxed);
                return true;
            }
            Step::Repeated => return true,
            Step::Next => {}
            Step::Gap { from } => {
                self.stats.gaps.fetch_add(1, Relaxed);
                self.recover(from, seq, ResetReason::Gap, &mut events).await;
            }
            Step::Restart => {
                self.stats.restarts.fetch_add(1, Relaxed);
                self.recover(0, seq, ResetReason::Restart, &mut events)
                    .await;
            }
            Step::FirstContact => {
                self.recover(0, seq, ResetReason::FirstContact, &mut events)
                    .await;
            }
        }
        match decode::events(&payload) {
            Ok(decoded) => events.extend(decoded),
            Err(e) => self.malformed(&e),
        }
        self.stats.last_seq.store(seq, Relaxed);
        self.stats.events.fetch_add(events.len() as u64, Relaxed);
        let delivery = Delivery {
            endpoint_id: self.subscription.endpoint_id.clone(),
            seq,
            events,
            stats: self.stats.clone(),
        };
        self.out.send(delivery).await.is_ok()
    }

    /// Messages `from..seq` were not seen: fetches them from the replay socket when there is
    /// one and puts into `events` what the index needs before the message `seq`: a reset
    /// unless the replay filled the hole, then whatever was replayed.
    async fn recover(
        &mut self,
        from: u64,
        seq: u64,
        reason: ResetReason,
        events: &mut Vec<KvEvent>,
    ) {
        let mut replayed = Vec::new();
        let mut complete = false;
        if let Some(endpoint) = self.subscription.replay.clone() {
            match replay(&endpoint, from, self.settings.replay_idle).await {
                Ok(messages) => {
                    self.stats.replays.fetch_add(1, Relaxed);
                    complete = self.take_replayed(messages, from, seq, &mut replayed);
                }
                Err(e) => {
                    if self.stats.replay_failures.fetch_add(1, Relaxed) == 0 {
                        tracing::warn!(
                            endpoint = %self.subscription.endpoint_id,
                            "KV event replay from {endpoint} failed: {e}; the endpoint's index \
                             rebuilds from live events"
                        );
                    }
                }
            }
        }
        let known = complete || (reason == ResetReason::Restart && seq <= 1);
        if !(reason == ResetReason::Gap && complete) {
            if !known {
                self.stats.lost.fetch_add(1, Relaxed);
            }
            events.push(KvEvent::Reset(Reset { reason, known }));
        }
        events.append(&mut replayed);
    }

    /// Decodes the replayed messages before `seq`, in order, into `events`; returns whether
    /// they are every message from `from` (or the publisher's first) up to `seq`.
    fn take_replayed(
        &self,
        mut messages: Vec<(u64, Bytes)>,
        from: u64,
        seq: u64,
        events: &mut Vec<KvEvent>,
    ) -> bool {
        messages.retain(|(s, _)| *s >= from && *s < seq);
        messages.sort_by_key(|(s, _)| *s);
        messages.dedup_by_key(|(s, _)| *s);
        let first = messages.first().map_or(seq, |(s, _)| *s);
        // A publisher counts from 0 or from 1.
        let mut complete = first == from || (from == 0 && first == 1);
        let mut expected = first;
        for (s, payload) in &messages {
            complete &= *s == expected;
            expected = s + 1;
            match decode::events(payload) {
                Ok(decoded) => events.extend(decoded),
                Err(e) => {
                    complete = false;
                    self.malformed(&e);
                }
            }
        }
        complete && expected == seq
    }
}
