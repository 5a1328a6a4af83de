//! The body `serve` answers with: bytes made here, or a replica's body relayed as it arrives.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;

use super::upstream::RelayedBody;
use crate::live::response::BoxError;

/// A response body: bytes made here, or a replica's body relayed as it arrives.
pub enum ServeBody {
    Full(Full<Bytes>),
    Relayed(RelayedBody),
}

impl From<Bytes> for ServeBody {
    fn from(bytes: Bytes) -> ServeBody {
        ServeBody::Full(Full::new(bytes))
    }
}

impl Body for ServeBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ServeBody::Full(full) => Pin::new(full)
                .poll_frame(cx)
                .map_err(|never| match never {}),
            ServeBody::Relayed(relayed) => Pin::new(relayed).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ServeBody::Full(full) => full.is_end_stream(),
            ServeBody::Relayed(relayed) => relayed.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ServeBody::Full(full) => full.size_hint(),
            ServeBody::Relayed(relayed) => relayed.size_hint(),
        }
    }
}
