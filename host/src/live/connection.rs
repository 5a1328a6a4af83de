//! The guard between a listener's sockets and hyper: how long a connection may take to send a
//! request head or sit idle between requests, how many connections the API listener holds,
//! and OpenAI-shaped JSON for the heads hyper refuses without reaching a route.
//!
//! The guard wraps each socket ([`GuardedIo`]) and learns where a connection is from two
//! signals of the service it runs: a request head was parsed (the service is called) and the
//! response body was handed over whole (the body is dropped; the next completed flush has
//! written it). Between a written response and the next parsed head the connection waits for
//! a head, and only then do its reads have a deadline:
//!
//! * a new connection must deliver its first head within the header timeout;
//! * a kept-alive connection may stay silent for the idle timeout, and once a byte of the
//!   next head arrives that head must be complete within the header timeout.
//!
//! A head cut short by its deadline is answered 408 (with a JSON body) before the connection
//! closes; a connection that sent nothing is closed without an answer. hyper answers a head it
//! cannot parse (400), a target over its limit (414) or a head over the buffer limit (431) by
//! itself, with an empty body: anything hyper writes while the connection waits for a head is
//! such an answer, so the guard writes its own JSON answer with that status instead.
//!
//! Once a head is parsed the guard only counts: reading the body has its own pause limit in
//! the route, and the request its `request_timeout_ms`. Bytes of a pipelined head read while
//! the previous request was under way are not seen by the guard; such a head, if incomplete,
//! is bounded by the idle timeout instead of the header timeout.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::config::ServeConfig;
use crate::live::ids::{RequestIds, REQUEST_ID};
use crate::live::metrics::{CloseReason, Metrics, RequestOutcome};
use crate::live::response::ApiError;

/// Largest request head hyper buffers before answering 431.
pub const MAX_HEAD_BYTES: usize = 400 * 1024;

/// Open connections allowed when `max_connections` is 0 and the open-file limit is unlimited.
const CONNECTIONS_WITHOUT_FILE_LIMIT: usize = 10_000;
/// Descriptors left for listeners, plugin libraries, logs and the fleet's scrapes.
const RESERVED_FILES: libc::rlim_t = 64;

/// The guard's settings for one listener, shared by its connections.
pub struct Guard {
    header_timeout: Duration,
    idle_timeout: Duration,
    /// Counts the API listener's connections; `None` for the operator listeners.
    metrics: Option<Metrics>,
    /// Ids for the guard's own answers, shared with the routes.
    ids: Option<Arc<RequestIds>>,
}

impl Guard {
    pub fn new(
        settings: &ServeConfig,
        metrics: Option<Metrics>,
        ids: Option<Arc<RequestIds>>,
    ) -> Arc<Guard> {
        Arc::new(Guard {
            header_timeout: Duration::from_millis(settings.header_timeout_ms),
            idle_timeout: Duration::from_millis(settings.keepalive_idle_timeout_ms),
            metrics,
            ids,
        })
    }

    fn closed(&self, reason: CloseReason) {
        if let Some(metrics) = &self.metrics {
            metrics.connection_closed(reason);
        }
    }

    /// A whole HTTP/1.1 response carrying `error`, closing the connection.
    fn answer(&self, error: &ApiError) -> Vec<u8> {
        let body = error.body();
        let mut text = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n",
            error.status.as_u16(),
            error.status.canonical_reason().unwrap_or(""),
            body.len()
        );
        if let Some(ids) = &self.ids {
            text.push_str(REQUEST_ID);
            text.push_str(": ");
            text.push_str(&ids.generate());
            text.push_str("\r\n");
        }
        text.push_str("\r\n");
        text.push_str(&body);
        text.into_bytes()
    }

    /// The listener's connection slots, `cap` of them.
    pub(crate) fn slots(&self, cap: usize, setting: &'static str) -> ConnectionSlots {
        ConnectionSlots::new(cap, setting, self.metrics.clone())
    }

    /// Marks one open connection until the returned value is dropped.
    pub fn open(self: &Arc<Self>) -> OpenConnection {
        if let Some(metrics) = &self.metrics {
            metrics.connections_open(1);
        }
        OpenConnection {
            guard: self.clone(),
        }
    }
}

/// One connection counted in `switchyard_connections_open` while it lives.
pub struct OpenConnection {
    guard: Arc<Guard>,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        if let Some(metrics) = &self.guard.metrics {
            metrics.connections_open(-1);
        }
    }
}

/// `max_connections`, or when it is 0, half the open-file limit left after a reserve (each
/// client connection may need one to a replica), at least 1. The soft open-file limit is
/// raised to the hard one first, as servers that hold many sockets do: the common soft default
/// of 1024 would otherwise cap a router at a few hundred clients.
pub fn connection_cap(max_connections: usize) -> usize {
    let limit = raise_open_file_limit();
    if max_connections > 0 {
        return max_connections;
    }
    let Some(limit) = limit else {
        return CONNECTIONS_WITHOUT_FILE_LIMIT;
    };
    if limit.rlim_cur == libc::RLIM_INFINITY {
        return CONNECTIONS_WITHOUT_FILE_LIMIT;
    }
    let spare = limit.rlim_cur.saturating_sub(RESERVED_FILES) / 2;
    usize::try_from(spare)
        .unwrap_or(usize::MAX)
        .clamp(1, CONNECTIONS_WITHOUT_FILE_LIMIT)
}

/// At most `cap` connections of a listener served at once. Reaching the cap is counted and
/// logged once each time, not once per connection that waits.
pub(crate) struct ConnectionSlots {
    slots: Arc<Semaphore>,
    cap: usize,
    /// The setting that sets the cap, for the log line.
    setting: &'static str,
    metrics: Option<Metrics>,
    /// Whether the cap was reached since a slot was last free at once.
    at_cap: bool,
}

impl ConnectionSlots {
    pub(crate) fn new(cap: usize, setting: &'static str, metrics: Option<Metrics>) -> Self {
        ConnectionSlots {
            slots: Arc::new(Semaphore::new(cap)),
            cap,
            setting,
            metrics,
            at_cap: false,
        }
    }

    /// A slot, held until dropped; at the cap, waits for one to be freed.
    pub(crate) async fn acquire(&mut self) -> Option<OwnedSemaphorePermit> {
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            self.at_cap = false;
            return Some(slot);
        }
        if !std::mem::replace(&mut self.at_cap, true) {
            if let Some(metrics) = &self.metrics {
                metrics.connection_cap_reached();
            }
            tracing::warn!(
                "{} connections open ({} = {}): new connections wait in the backlog until one closes",
                self.cap,
                self.setting,
                self.cap
            );
        }
        self.slots.clone().acquire_owned().await.ok()
    }
}

/// Raises the soft open-file limit to the hard limit; returns the limit in force after.
pub(crate) fn raise_open_file_limit() -> Option<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given and reads nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            tracing::debug!(
                "open-file limit raised from {} to {}",
                limit.rlim_cur,
                raised.rlim_cur
            );
            limit = raised;
        }
    }
    Some(limit)
}

const WAITING_FOR_HEAD: u8 = 0;
const IN_REQUEST: u8 = 1;
/// The response body was dropped by hyper: its last bytes are written by the next flush.
const RESPONSE_HANDED_OVER: u8 = 2;

/// Where a connection is, as its service and response bodies report it to its socket.
#[derive(Default)]
pub struct Progress {
    phase: AtomicU8,
    /// A first request has begun.
    begun: AtomicBool,
}

impl Progress {
    /// hyper parsed a head and called the service.
    pub fn request_started(&self) {
        self.phase.store(IN_REQUEST, Ordering::Relaxed);
        self.begun.store(true, Ordering::Relaxed);
    }

    /// Whether the connection has begun a request.
    pub fn has_begun(&self) -> bool {
        self.begun.load(Ordering::Relaxed)
    }
}

/// A response body that reports to the connection when hyper is done with it.
pub struct Tracked<B> {
    inner: B,
    progress: Arc<Progress>,
}

impl<B> Tracked<B> {
    pub fn new(inner: B, progress: Arc<Progress>) -> Tracked<B> {
        Tracked { inner, progress }
    }
}

impl<B> Drop for Tracked<B> {
    fn drop(&mut self) {
        self.progress
            .phase
            .store(RESPONSE_HANDED_OVER, Ordering::Relaxed);
    }
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What a connection waiting for a head has received of it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waiting {
    /// A new connection, nothing received yet.
    Fresh,
    /// A kept-alive connection, nothing received since the last response.
    Idle,
    /// Part of a head.
    Head,
}

/// A client socket with the guard's deadlines, handed to hyper.
pub struct GuardedIo {
    stream: TcpStream,
    guard: Arc<Guard>,
    progress: Arc<Progress>,
    waiting: Waiting,
    deadline: Instant,
    timer: Pin<Box<Sleep>>,
    /// The guard's own answer and how much of it is written.
    answer: Option<(Bytes, usize)>,
    /// The guard ended the connection: reads see its end, writes go nowhere.
    finished: bool,
}

impl GuardedIo {
    pub fn new(stream: TcpStream, guard: Arc<Guard>, progress: Arc<Progress>) -> GuardedIo {
        let deadline = Instant::now() + guard.header_timeout;
        GuardedIo {
            stream,
            progress,
            waiting: Waiting::Fresh,
            deadline,
            timer: Box::pin(tokio::time::sleep_until(deadline)),
            guard,
            answer: None,
            finished: false,
        }
    }

    fn waiting_for_head(&self) -> bool {
        self.progress.phase.load(Ordering::Relaxed) == WAITING_FOR_HEAD
    }

    /// Writes the guard's answer, then closes the sending side.
    fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = &mut self.answer {
            if *written == bytes.len() {
                self.answer = None;
                self.finished = true;
                let _ = Pin::new(&mut self.stream).poll_shutdown(cx);
                break;
            }
            match ready!(Pin::new(&mut self.stream).poll_write(cx, &bytes[*written..])) {
                Ok(n) if n > 0 => *written += n,
                result => {
                    self.answer = None;
                    self.finished = true;
                    return Poll::Ready(Err(result
                        .err()
                        .unwrap_or_else(|| io::Error::from(io::ErrorKind::WriteZero))));
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    /// The head's deadline passed.
    fn expire(&mut self) {
        match self.waiting {
            Waiting::Fresh => {
                self.guard.closed(CloseReason::HeaderTimeout);
                self.finished = true;
            }
            Waiting::Idle => {
                self.guard.closed(CloseReason::IdleTimeout);
                self.finished = true;
            }
            Waiting::Head => {
                self.guard.closed(CloseReason::HeaderTimeout);
                if let Some(metrics) = &self.guard.metrics {
                    metrics.request(RequestOutcome::HeaderTimeout, "");
                }
                let error = ApiError {
                    close: true,
                    ..ApiError::new(
                        StatusCode::REQUEST_TIMEOUT,
                        "header_timeout",
                        RequestOutcome::HeaderTimeout,
                        format!(
                            "the request head was not complete within header_timeout_ms = {}",
                            self.guard.header_timeout.as_millis()
                        ),
                    )
                };
                self.answer = Some((Bytes::from(self.guard.answer(&error)), 0));
            }
        }
    }

    /// hyper's own answer to a head it refused, starting with its status line, as JSON.
    fn replace_answer(&mut self, written: &[u8]) {
        let status = written
            .get(9..12)
            .and_then(|digits| std::str::from_utf8(digits).ok())
            .and_then(|digits| digits.parse::<u16>().ok())
            .and_then(|code| StatusCode::from_u16(code).ok())
            .unwrap_or(StatusCode::BAD_REQUEST);
        let (code, message) = match status {
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => (
                "head_too_large",
                format!(
                    "the request head is larger than {MAX_HEAD_BYTES} bytes or has more than \
                     100 header fields"
                ),
            ),
            StatusCode::URI_TOO_LONG => (
                "uri_too_long",
                "the request target is longer than 65534 bytes".to_string(),
            ),
            _ => (
                "malformed_request",
                "the request head could not be read as HTTP/1.x (a malformed request line or \
                 header, or a TLS handshake on this plain-HTTP port)"
                    .to_string(),
            ),
        };
        if let Some(metrics) = &self.guard.metrics {
            metrics.head_rejected(status.as_u16());
            metrics.request(RequestOutcome::BadRequest, "");
        }
        let error = ApiError {
            close: true,
            ..ApiError::new(status, code, RequestOutcome::BadRequest, message)
        };
        self.answer = Some((Bytes::from(self.guard.answer(&error)), 0));
    }

    /// A write by hyper while no request is under way: its answer to a refused head, replaced.
    fn poll_write_refusal(
        &mut self,
        cx: &mut Context<'_>,
        first: &[u8],
        len: usize,
    ) -> Poll<io::Result<usize>> {
        if self.answer.is_none() && !self.finished {
            self.replace_answer(first);
        }
        ready!(self.poll_answer(cx))?;
        Poll::Ready(Ok(len))
    }
}

impl AsyncRead for GuardedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.finished || this.answer.is_some() {
            ready!(this.poll_answer(cx))?;
            return Poll::Ready(Ok(()));
        }
        if !this.waiting_for_head() {
            return Pin::new(&mut this.stream).poll_read(cx, buf);
        }
        let before = buf.filled().len();
        if let Poll::Ready(read) = Pin::new(&mut this.stream).poll_read(cx, buf) {
            if read.is_ok() && buf.filled().len() > before {
                match this.waiting {
                    Waiting::Fresh => this.waiting = Waiting::Head,
                    Waiting::Idle => {
                        this.waiting = Waiting::Head;
                        this.deadline = Instant::now() + this.guard.header_timeout;
                    }
                    Waiting::Head => {}
                }
            }
            return Poll::Ready(read);
        }
        if this.timer.deadline() != this.deadline {
            let deadline = this.deadline;
            this.timer.as_mut().reset(deadline);
        }
        ready!(this.timer.as_mut().poll(cx));
        this.expire();
        ready!(this.poll_answer(cx))?;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for GuardedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.finished || this.answer.is_some() || this.waiting_for_head() {
            return this.poll_write_refusal(cx, buf, buf.len());
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.finished || this.answer.is_some() || this.waiting_for_head() {
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &b[..]);
            let len = bufs.iter().map(|b| b.len()).sum();
            return this.poll_write_refusal(cx, first, len);
        }
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(Pin::new(&mut this.stream).poll_flush(cx))?;
        if this.progress.phase.load(Ordering::Relaxed) == RESPONSE_HANDED_OVER {
            this.progress
                .phase
                .store(WAITING_FOR_HEAD, Ordering::Relaxed);
            this.waiting = Waiting::Idle;
            this.deadline = Instant::now() + this.guard.idle_timeout;
            let deadline = this.deadline;
            this.timer.as_mut().reset(deadline);
            // hyper reads again only when woken; the deadline has to wake it.
            let _ = this.timer.as_mut().poll(cx);
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.finished {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_cap_is_kept_and_a_derived_one_is_bounded() {
        assert_eq!(connection_cap(4), 4);
        let derived = connection_cap(0);
        assert!(
            (1..=CONNECTIONS_WITHOUT_FILE_LIMIT).contains(&derived),
            "{derived}"
        );
    }
}
