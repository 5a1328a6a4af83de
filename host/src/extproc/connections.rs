//! The ext_proc listener's connection cap: at most N connections are served at once. The
//! next one is accepted and then held, unserved, until one of them closes; the ones after it
//! wait in the kernel's backlog.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::live::metrics::Metrics;

/// A served connection; dropping it frees its place under the cap.
pub struct Admitted {
    stream: TcpStream,
    metrics: Metrics,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.metrics.connections_open(-1);
    }
}

/// The connections of `listener`, at most `cap` of them open at once.
pub fn admit(
    listener: TcpListener,
    cap: usize,
    metrics: Metrics,
) -> ReceiverStream<io::Result<Admitted>> {
    let (sender, receiver) = mpsc::channel(1);
    tokio::spawn(accept(listener, cap, metrics, sender));
    ReceiverStream::new(receiver)
}

async fn accept(
    listener: TcpListener,
    cap: usize,
    metrics: Metrics,
    sender: mpsc::Sender<io::Result<Admitted>>,
) {
    let places = Arc::new(Semaphore::new(cap));
    // Logged once each time the cap is reached, not once per waiting connection.
    let mut at_cap = false;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = sender.closed() => return,
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
        let permit = match places.clone().try_acquire_owned() {
            Ok(permit) => {
                at_cap = false;
                permit
            }
            Err(_) => {
                metrics.connection_cap_reached();
                if !at_cap {
                    tracing::warn!(
                        "ext_proc connection limit reached (--grpc-max-connections = {cap}); new \
                         connections wait for one to close"
                    );
                }
                at_cap = true;
                tokio::select! {
                    permit = places.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => return,
                    },
                    () = sender.closed() => return,
                }
            }
        };
        metrics.connections_open(1);
        let admitted = Admitted {
            stream,
            metrics: metrics.clone(),
            _permit: permit,
        };
        if sender.send(Ok(admitted)).await.is_err() {
            return;
        }
    }
}

impl Connected for Admitted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Admitted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
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
