//! Talking to replicas: the pooled HTTP client, and the relayed response body that passes a
//! replica's bytes through frame by frame and releases the request's charge exactly once when
//! the body ends, fails, times out or is dropped because the client went away. A request with
//! a prefix prediction has its body's usage read on the way, to check the prediction.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use switchyard_plugin_api::Outcome;
use tokio::time::Sleep;

use crate::live::journal::JournalEntry;
use crate::live::metrics::{Metrics, RequestOutcome};
use crate::live::response::BoxError;
use crate::live::usage::UsageScanner;
use crate::live::{InFlight, RealClock};
use crate::pipeline::Predicted;

pub type Client = hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>;

/// Idle connections kept per replica, enough for every concurrent request to reuse one.
const IDLE_PER_REPLICA: usize = 1024;

pub fn client() -> Client {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(5)));
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(IDLE_PER_REPLICA)
        .build(connector)
}

/// What to account for when a relayed request ends.
pub struct Ending {
    pub metrics: Metrics,
    pub endpoint: String,
    /// Set at the drain deadline: a body dropped after it was cut by the shutdown.
    pub cut: tokio::sync::watch::Receiver<bool>,
    pub clock: RealClock,
    pub journal: Option<JournalEntry>,
    /// The request's prefix prediction and the reader of its usage, when there is one.
    pub check: Option<Box<PrefixCheck>>,
}

/// A prefix prediction waiting for the response's usage.
pub struct PrefixCheck {
    predicted: Predicted,
    usage: UsageScanner,
}

impl PrefixCheck {
    /// `None` when there is nothing to check.
    pub fn new(predicted: Predicted) -> Option<Box<PrefixCheck>> {
        (!predicted.is_empty()).then(|| {
            Box::new(PrefixCheck {
                predicted,
                usage: UsageScanner::default(),
            })
        })
    }
}

impl Ending {
    fn close(mut self, outcome: RequestOutcome) {
        self.metrics.request(outcome, &self.endpoint);
        if let (RequestOutcome::Completed, Some(check)) = (outcome, &self.check) {
            let cached = check.usage.cached_tokens();
            self.metrics
                .prefix_checked(&self.endpoint, &check.predicted, cached);
            if let (Some(entry), Some(cached)) = (self.journal.as_mut(), cached) {
                entry.set_prefix_check(&self.endpoint, &check.predicted, cached);
            }
        }
        if let Some(entry) = self.journal {
            entry.write(Some(self.clock.now_ms()));
        }
    }
}

/// A replica's response body on its way to the client.
pub struct RelayedBody {
    inner: Incoming,
    charge: Option<InFlight>,
    deadline: Option<Pin<Box<Sleep>>>,
    ending: Option<Ending>,
}

impl RelayedBody {
    pub fn new(
        inner: Incoming,
        charge: InFlight,
        deadline: Option<tokio::time::Instant>,
        ending: Ending,
    ) -> RelayedBody {
        RelayedBody {
            inner,
            charge: Some(charge),
            deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
            ending: Some(ending),
        }
    }

    fn end(&mut self, outcome: RequestOutcome) {
        let released = match outcome {
            RequestOutcome::Completed => Outcome::Finished,
            RequestOutcome::ClientDisconnected | RequestOutcome::ShuttingDown => Outcome::Cancelled,
            _ => Outcome::Failed,
        };
        if let Some(charge) = self.charge.take() {
            charge.finish(released);
        }
        if let Some(ending) = self.ending.take() {
            match outcome {
                RequestOutcome::UpstreamError => {
                    ending.metrics.upstream_error(&ending.endpoint, "body")
                }
                RequestOutcome::Timeout => {
                    ending.metrics.upstream_error(&ending.endpoint, "timeout")
                }
                _ => {}
            }
            ending.close(outcome);
        }
    }
}

impl Body for RelayedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.ending.is_none() {
            return Pin::new(&mut this.inner)
                .poll_frame(cx)
                .map_err(|e| e.into());
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.end(RequestOutcome::Completed);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(frame))) => {
                let check = this.ending.as_mut().and_then(|e| e.check.as_mut());
                if let (Some(check), Some(data)) = (check, frame.data_ref()) {
                    check.usage.feed(data);
                }
                // With a known length the server may stop polling after the last byte.
                if this.inner.is_end_stream() {
                    this.end(RequestOutcome::Completed);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                this.end(RequestOutcome::UpstreamError);
                Poll::Ready(Some(Err(Box::new(error))))
            }
            Poll::Pending => {
                if let Some(deadline) = this.deadline.as_mut() {
                    if deadline.as_mut().poll(cx).is_ready() {
                        this.end(RequestOutcome::Timeout);
                        return Poll::Ready(Some(Err("request_timeout_ms reached".into())));
                    }
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Ended only once the end was seen, so the release happens in `poll_frame`.
        self.ending.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for RelayedBody {
    fn drop(&mut self) {
        let cut = self.ending.as_ref().map(|ending| *ending.cut.borrow());
        match cut {
            Some(true) => self.end(RequestOutcome::ShuttingDown),
            Some(false) => self.end(RequestOutcome::ClientDisconnected),
            None => {}
        }
    }
}
