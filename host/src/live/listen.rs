//! The listeners of a live driver: socket addresses from the config and the command line,
//! binding, and the HTTP/1.1 accept loop that serves each connection behind the connection
//! guard and, once stopped, drains: requests under way are answered, and a connection accepted
//! before the stop whose first request has not arrived yet gets a moment to send it (so a
//! client is not reset just because its connection was accepted at the stop). Each accept loop
//! holds an [`Accepting`] token until it stops accepting, so a driver handing its sockets over
//! knows when its successor alone takes new connections.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http_body::Body;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use super::connection::{self, Guard, GuardedIo, Progress, Tracked};
use super::response::BoxError;

/// `text` as a socket address, with its port replaced by `port` when given.
pub(crate) fn address(key: &str, text: &str, port: Option<u16>) -> Result<SocketAddr, String> {
    let mut addr: SocketAddr = text
        .parse()
        .map_err(|_| format!("{key} = '{text}' is not an address like 0.0.0.0:8080"))?;
    if let Some(port) = port {
        addr.set_port(port);
    }
    Ok(addr)
}

/// Held by an accept loop while it may still accept; released when it stops.
pub(crate) struct Accepting {
    _held: mpsc::Sender<()>,
}

/// The accept loops of one process: each holds a token from [`AcceptLoops::token`].
pub(crate) struct AcceptLoops {
    token: mpsc::Sender<()>,
    released: mpsc::Receiver<()>,
}

impl AcceptLoops {
    pub fn new() -> AcceptLoops {
        let (token, released) = mpsc::channel(1);
        AcceptLoops { token, released }
    }

    pub fn token(&self) -> Accepting {
        Accepting {
            _held: self.token.clone(),
        }
    }

    /// Waits for every accept loop to stop accepting (they stop within a scheduling round of
    /// their stop signal); warns if one has not after a second.
    pub async fn stopped(self) {
        let AcceptLoops {
            token,
            mut released,
        } = self;
        drop(token);
        let within = Duration::from_secs(1);
        if tokio::time::timeout(within, released.recv()).await.is_err() {
            tracing::warn!("a listener still accepts {within:?} after its stop");
        }
    }
}

/// The connections `listener` accepts until `stop` turns true; then the stream ends.
pub(crate) fn incoming_until(
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
    accepting: Accepting,
) -> ReceiverStream<std::io::Result<TcpStream>> {
    let (sender, receiver) = mpsc::channel(1);
    tokio::spawn(async move {
        let _accepting = accepting;
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted.map(|(stream, _)| stream),
                _ = stop.wait_for(|stop| *stop) => return,
                () = sender.closed() => return,
            };
            if sender.send(accepted).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(receiver)
}

/// How long a connection accepted before the stop may take to begin its first request.
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(2);

pub(crate) async fn bind(what: &str, addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen for the {what} on {addr}: {e}"))
}

pub(crate) fn local(listener: &TcpListener) -> String {
    listener
        .local_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string())
}

/// Serves HTTP/1.1 connections with `handler`, each behind `guard`, until `stop`, then waits
/// up to `drain` for the connections' requests to finish. With a `cap`, at most that many
/// connections are open; further clients wait in the kernel's backlog until one closes.
pub(crate) async fn accept<H, F, B>(
    listener: TcpListener,
    accepting: Accepting,
    mut stop: watch::Receiver<bool>,
    drain: Duration,
    guard: Arc<Guard>,
    cap: Option<usize>,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    // Each connection's task holds a sender; the drain ends when all are dropped.
    let (open_connections, mut all_closed) = mpsc::channel::<()>(1);
    let mut slots = cap.map(|cap| guard.slots(cap, "max_connections"));
    loop {
        let slot = match slots.as_mut() {
            None => None,
            Some(slots) => tokio::select! {
                slot = slots.acquire() => slot,
                _ = stop.changed() => break,
            },
        };
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        // Out of descriptors and the like: back off rather than spin.
                        tracing::warn!("accept failed: {error}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let open = guard.open();
                let progress = Arc::new(Progress::default());
                let handler = handler.clone();
                let service = {
                    let progress = progress.clone();
                    service_fn(move |request| {
                        progress.request_started();
                        let response = handler(request);
                        let progress = progress.clone();
                        async move {
                            Ok::<_, Infallible>(response.await.map(|body| Tracked::new(body, progress)))
                        }
                    })
                };
                let io = GuardedIo::new(stream, guard.clone(), progress.clone());
                let connection = http1::Builder::new()
                    .max_buf_size(connection::MAX_HEAD_BYTES)
                    .serve_connection(TokioIo::new(io), service);
                let stop = stop.clone();
                let open_connections = open_connections.clone();
                tokio::spawn(async move {
                    serve_until_stopped(connection, progress, stop).await;
                    drop(open);
                    drop(slot);
                    drop(open_connections);
                });
            }
            _ = stop.changed() => break,
        }
    }
    drop(listener);
    drop(accepting);
    drop(open_connections);
    if tokio::time::timeout(drain, all_closed.recv())
        .await
        .is_err()
    {
        tracing::warn!("drain deadline reached; closing the remaining connections");
    }
}

/// A served connection the drain can close gracefully.
trait GracefulConnection: Future {
    /// Finishes the request under way, then closes; closes at once when idle.
    fn graceful_shutdown(self: std::pin::Pin<&mut Self>);
}

impl<I, S, B> GracefulConnection for http1::Connection<I, S>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<BoxError>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: Body + 'static,
    B::Error: Into<BoxError>,
{
    fn graceful_shutdown(self: std::pin::Pin<&mut Self>) {
        http1::Connection::graceful_shutdown(self);
    }
}

/// Runs `connection` until it ends; once `stop` turns true, lets the request under way finish
/// and closes it, after giving a connection with no request yet [`FIRST_REQUEST_GRACE`] to
/// begin one.
async fn serve_until_stopped<C>(
    connection: C,
    progress: Arc<Progress>,
    mut stop: watch::Receiver<bool>,
) where
    C: GracefulConnection,
{
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => return,
        _ = stop.wait_for(|stop| *stop) => {}
    }
    if !progress.has_begun() {
        let mut grace = std::pin::pin!(tokio::time::sleep(FIRST_REQUEST_GRACE));
        let ended = std::future::poll_fn(|cx| {
            if connection.as_mut().poll(cx).is_ready() {
                return Poll::Ready(true);
            }
            if progress.has_begun() || grace.as_mut().poll(cx).is_ready() {
                return Poll::Ready(false);
            }
            Poll::Pending
        })
        .await;
        if ended {
            return;
        }
    }
    connection.as_mut().graceful_shutdown();
    let _ = connection.await;
}
