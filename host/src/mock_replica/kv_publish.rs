//! The mock replica's KV-cache event publisher, in vLLM's wire format: a PUB socket sending
//! `[topic, seq (8 bytes big-endian, from 0), msgpack batch]`, the batch `[ts, events, 0]`
//! with each event a tagged array (vLLM up to 0.23) or a map tagged by `type` (since June
//! 2026), and a ROUTER replay socket answering `["", start_seq]` with every buffered message
//! from `start_seq` on, then an end marker.
//!
//! It also takes faults for tests (`/mock/kv-events`): messages withheld from subscribers
//! (a gap the replay can fill), an unreadable message, and events injected verbatim.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use rmpv::Value;
use switchyard_plugin_api::kv::{KvEvent, Medium};
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// Which event shape to publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// Tagged arrays, as vLLM published them up to 0.23.
    Array,
    /// Maps tagged by `type`, as vLLM publishes them since June 2026.
    Map,
}

/// What the publisher is asked to do.
#[derive(Debug)]
pub enum Publish {
    /// One batch of events.
    Events(Vec<KvEvent>),
    /// Withhold the next `n` messages from subscribers (they stay in the replay buffer).
    Withhold(u64),
    /// Send one message whose payload is not msgpack (its sequence number is valid).
    Malformed,
    /// Publish `n` empty batches as fast as possible.
    Flood(u64),
}

/// Where and how to publish.
#[derive(Debug, Clone)]
pub struct PublishOptions {
    pub port: u16,
    pub replay_port: Option<u16>,
    pub shape: Shape,
    pub topic: String,
    /// Messages kept for replay.
    pub buffer: usize,
}

/// The way to the publisher: queues commands, and counts the messages they will publish at
/// once, so whoever reads the count after an answer that caused a message knows of it.
#[derive(Clone)]
pub struct Publisher {
    commands: mpsc::UnboundedSender<Publish>,
    queued: Arc<AtomicU64>,
}

impl Publisher {
    /// A publisher whose commands go to `commands`.
    pub(crate) fn new(commands: mpsc::UnboundedSender<Publish>) -> Publisher {
        Publisher {
            commands,
            queued: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Queues `command`; false once the publisher has stopped.
    pub fn send(&self, command: Publish) -> bool {
        let messages = match &command {
            Publish::Events(_) | Publish::Malformed => 1,
            Publish::Flood(n) => *n,
            Publish::Withhold(_) => 0,
        };
        self.queued.fetch_add(messages, Ordering::Relaxed);
        self.commands.send(command).is_ok()
    }

    /// Messages queued so far (withheld ones included).
    pub fn queued(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }
}

/// Binds the sockets on 127.0.0.1 and publishes what it is sent until every sender is gone.
pub async fn start(options: PublishOptions) -> Result<Publisher, String> {
    let mut publisher = PubSocket::new();
    let address = format!("tcp://127.0.0.1:{}", options.port);
    publisher
        .bind(&address)
        .await
        .map_err(|e| format!("--kv-events-port: cannot bind {address}: {e}"))?;
    let replay = match options.replay_port {
        Some(port) => {
            let mut router = RouterSocket::new();
            let address = format!("tcp://127.0.0.1:{port}");
            router
                .bind(&address)
                .await
                .map_err(|e| format!("--kv-replay-port: cannot bind {address}: {e}"))?;
            Some(router)
        }
        None => None,
    };
    tracing::info!(
        "publishing KV events on 127.0.0.1:{} ({:?} shape, replay {})",
        options.port,
        options.shape,
        options
            .replay_port
            .map_or("off".to_string(), |p| format!("on 127.0.0.1:{p}"))
    );
    let (sender, receiver) = mpsc::unbounded_channel();
    tokio::spawn(run(publisher, replay, options, receiver));
    Ok(Publisher::new(sender))
}

struct State {
    options: PublishOptions,
    next_seq: u64,
    withheld: u64,
    buffer: VecDeque<(u64, Bytes)>,
}

async fn run(
    mut publisher: PubSocket,
    mut replay: Option<RouterSocket>,
    options: PublishOptions,
    mut receiver: mpsc::UnboundedReceiver<Publish>,
) {
    let mut state = State {
        options,
        next_seq: 0,
        withheld: 0,
        buffer: VecDeque::new(),
    };
    loop {
        tokio::select! {
            command = receiver.recv() => match command {
                Some(command) => state.apply(command, &mut publisher).await,
                None => return,
            },
            request = async {
                match replay.as_mut() {
                    Some(router) => router.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                if let (Ok(request), Some(router)) = (request, replay.as_mut()) {
                    state.answer_replay(request, router).await;
                }
            }
        }
    }
}

impl State {
    async fn apply(&mut self, command: Publish, publisher: &mut PubSocket) {
        match command {
            Publish::Events(events) => {
                let payload = encode_batch(&events, self.options.shape);
                self.send(payload, publisher).await;
            }
            Publish::Withhold(n) => self.withheld += n,
            Publish::Malformed => {
                self.send(Bytes::from_static(b"\xc1 not msgpack"), publisher)
                    .await;
            }
            Publish::Flood(n) => {
                for _ in 0..n {
                    let payload = encode_batch(&[], self.options.shape);
                    self.send(payload, publisher).await;
                }
            }
        }
    }

    async fn send(&mut self, payload: Bytes, publisher: &mut PubSocket) {
        let seq = self.next_seq;
        self.next_seq += 1;

        if self.buffer.len() >= self.options.buffer.max(1) {
            self.buffer.pop_front();
        }
        self.buffer.push_back((seq, payload.clone()));
        if self.withheld > 0 {
            self.withheld -= 1;
            return;
        }
        let mut message = ZmqMessage::from(self.options.topic.clone());
        message.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
        message.push_back(payload);
        if let Err(e) = publisher.send(message).await {
            tracing::debug!("publishing KV events: {e}");
        }
    }

    async fn answer_replay(&mut self, request: ZmqMessage, router: &mut RouterSocket) {
        let frames = request.into_vec();
        let (Some(identity), Some(start)) = (frames.first(), frames.last()) else {
            return;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()).map(u64::from_be_bytes) else {
            return;
        };
        let reply = |seq: u64, payload: Bytes| {
            let mut message = ZmqMessage::from(identity.clone());
            message.push_back(Bytes::new());
            message.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
            message.push_back(payload);
            message
        };
        for (seq, payload) in self.buffer.iter().filter(|(seq, _)| *seq >= start) {
            if router.send(reply(*seq, payload.clone())).await.is_err() {
                return;
            }
        }
        let _ = router.send(reply(u64::MAX, Bytes::new())).await;
    }
}

/// `[ts, events, data_parallel_rank]` as msgpack.
pub fn encode_batch(events: &[KvEvent], shape: Shape) -> Bytes {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let events = events.iter().map(|e| encode_event(e, shape)).collect();
    let batch = Value::Array(vec![Value::F64(ts), Value::Array(events), Value::from(0)]);
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &batch);
    Bytes::from(out)
}

fn medium(medium: Medium) -> Value {
    Value::from(match medium {
        Medium::Gpu => "GPU",
        Medium::Cpu => "CPU",
        Medium::Other => "DISK",
    })
}

fn u64s(values: &[u64]) -> Value {
    Value::Array(values.iter().map(|&v| Value::from(v)).collect())
}

fn encode_event(event: &KvEvent, shape: Shape) -> Value {
    let (tag, fields): (&str, Vec<(&str, Value)>) = match event {
        KvEvent::BlockStored(stored) => {
            let extra = if stored.extra_keys.is_empty() {
                Value::Nil
            } else {
                Value::Array(
                    stored
                        .extra_keys
                        .iter()
                        .map(|keys| match keys {
                            None => Value::Nil,
                            Some(keys) => {
                                Value::Array(keys.iter().map(|k| Value::from(k.as_str())).collect())
                            }
                        })
                        .collect(),
                )
            };
            (
                "BlockStored",
                vec![
                    ("block_hashes", u64s(&stored.block_hashes)),
                    (
                        "parent_block_hash",
                        stored.parent_block_hash.map_or(Value::Nil, Value::from),
                    ),
                    (
                        "token_ids",
                        Value::Array(stored.token_ids.iter().map(|&t| Value::from(t)).collect()),
                    ),
                    ("block_size", Value::from(stored.block_size)),
                    ("lora_id", stored.lora_id.map_or(Value::Nil, Value::from)),
                    ("medium", medium(stored.medium)),
                    (
                        "lora_name",
                        stored.lora_name.as_deref().map_or(Value::Nil, Value::from),
                    ),
                    ("extra_keys", extra),
                ],
            )
        }
        KvEvent::BlockRemoved(removed) => (
            "BlockRemoved",
            vec![
                ("block_hashes", u64s(&removed.block_hashes)),
                ("medium", medium(removed.medium)),
            ],
        ),
        KvEvent::AllBlocksCleared | KvEvent::Reset(_) => ("AllBlocksCleared", Vec::new()),
    };
    match shape {
        Shape::Array => {
            let mut items = vec![Value::from(tag)];
            items.extend(fields.into_iter().map(|(_, v)| v));
            Value::Array(items)
        }
        Shape::Map => {
            let mut entries = vec![(Value::from("type"), Value::from(tag))];
            entries.extend(
                fields
                    .into_iter()
                    .filter(|(_, v)| !v.is_nil())
                    .map(|(k, v)| (Value::from(k), v)),
            );
            // Keys a newer engine adds; a reader ignores what it does not know.
            entries.push((Value::from("group_idx"), Value::from(0)));
            Value::Map(entries)
        }
    }
}
