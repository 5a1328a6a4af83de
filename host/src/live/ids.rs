//! Request ids: the header that carries them and the ids a driver gives requests that arrive
//! without one.

use std::sync::atomic::{AtomicU64, Ordering};

pub const REQUEST_ID: &str = "x-request-id";

/// Ids for requests that arrive without `x-request-id`.
pub struct RequestIds {
    prefix: u64,
    next: AtomicU64,
}

impl RequestIds {
    pub fn new(prefix: u64) -> RequestIds {
        RequestIds {
            prefix,
            next: AtomicU64::new(0),
        }
    }

    pub fn generate(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:012x}-{n}", self.prefix & 0xffff_ffff_ffff)
    }
}

/// Distinguishes the ids this process generates from another's.
pub(crate) fn id_prefix() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 32)
}
