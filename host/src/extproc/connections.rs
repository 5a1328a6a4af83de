//! The ext_proc listener's connections: at most N served at once (the next one is accepted
//! and then held, unserved, until one of them closes; the ones after it wait in the kernel's
//! backlog), a connection with no stream open for the idle timeout closed, and accepting
//! stopped without dropping a connection already accepted.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit};
use tokio::time::{Instant, Sleep};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

use crate::live::connection::ConnectionSlots;
use crate::live::listen::Accepting;
use crate::live::metrics::Metrics;

/// A served connection; dropping it frees its place under the cap.
pub struct Admitted {
    stream: TcpStream,
    metrics: Metrics,
    _permit: OwnedSemaphorePermit,
    activity: Arc<Activity>,
    /// Closes the connection once no stream has been open this long; `None`: never.
    idle: Option<(Duration, Pin<Box<Sleep>>)>,
}

/// The streams open on one connection, and since when none is.
#[derive(Debug)]
pub struct Activity {
    open: AtomicUsize,
    idle_since: Mutex<Option<Instant>>,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            open: AtomicUsize::new(0),
            idle_since: Mutex::new(Some(Instant::now())),
        }
    }

    fn idle_since(&self) -> Option<Instant> {
        *self.idle_since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks a stream open until the returned guard is dropped.
    pub fn stream_opened(self: &Arc<Self>) -> OpenStream {
        if self.open.fetch_add(1, Ordering::AcqRel) == 0 {
            *self.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        OpenStream(self.clone())
    }
}

/// One open stream of a connection.
pub struct OpenStream(Arc<Activity>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        let mut idle_since = self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner());
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            *idle_since = Some(Instant::now());
        }
    }
}

/// What a stream's request knows of its connection.
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    pub activity: Arc<Activity>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.metrics.connections_open(-1);
    }
}

/// The connections of `listener`, at most `cap` of them open at once, each closed after
/// `idle_timeout` without a stream (zero: never). Once `stop` turns true nothing more is
/// accepted and the stream ends after the connections already accepted, so the server takes
/// every one of them up before it drains.
pub fn admit(
    listener: TcpListener,
    accepting: Accepting,
    cap: usize,
    idle_timeout: Duration,
    metrics: Metrics,
    stop: watch::Receiver<bool>,
) -> ReceiverStream<io::Result<Admitted>> {
    let (sender, receiver) = mpsc::channel(1);
    tokio::spawn(async move {
        let _accepting = accepting;
        accept(listener, cap, idle_timeout, metrics, sender, stop).await;
    });
    ReceiverStream::new(receiver)
}

async fn accept(
    listener: TcpListener,
    cap: usize,
    idle_timeout: Duration,
    metrics: Metrics,
    sender: mpsc::Sender<io::Result<Admitted>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut slots = ConnectionSlots::new(cap, "--grpc-max-connections", Some(metrics.clone()));
    let stopped = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    tokio::pin!(stopped);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = sender.closed() => return,
            () = &mut stopped => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                if sender.send(Err(error)).await.is_err() {
                    return;
                }
                continue;
            }
        };
        let permit = tokio::select! {
            permit = slots.acquire() => match permit {
                Some(permit) => permit,
                None => return,
            },
            () = sender.closed() => return,
        };
        metrics.connections_open(1);
        let admitted = Admitted {
            stream,
            metrics: metrics.clone(),
            _permit: permit,
            activity: Arc::new(Activity::new()),
            idle: (idle_timeout > Duration::ZERO)
                .then(|| (idle_timeout, Box::pin(tokio::time::sleep(idle_timeout)))),
        };
        if sender.send(Ok(admitted)).await.is_err() {
            return;
        }
    }
}

impl Connected for Admitted {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnectionInfo {
            activity: self.activity.clone(),
        }
    }
}

impl Admitted {
    /// Whether the connection has had no stream for its idle timeout. Keeps a timer armed
    /// for the moment that would be true, so the connection's task looks again then.
    fn idled_out(&mut self, cx: &mut Context<'_>) -> bool {
        let Some((timeout, timer)) = self.idle.as_mut() else {
            return false;
        };
        let since = self.activity.idle_since();
        let deadline = since.unwrap_or_else(Instant::now) + *timeout;
        if since.is_some_and(|since| since.elapsed() >= *timeout) {
            tracing::debug!("ext_proc connection idle for {timeout:?}: closed");
            return true;
        }
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        // Registers the wake-up; it cannot be due yet.
        let _ = timer.as_mut().poll(cx);
        false
    }
}

impl AsyncRead for Admitted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.idled_out(cx) {
            // The end of the stream: the connection closes as if the peer had closed it.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
