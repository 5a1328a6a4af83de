//! What the real-time drivers share: the real clock, reading inference bodies, the owner of
//! the scheduler on the real clock, and the lifecycle of a dispatched request (charged at
//! dispatch, released exactly once).

pub(crate) mod admin;
pub mod body;
pub mod clock;
pub(crate) mod connection;
pub mod dispatch;
pub(crate) mod ids;
pub mod journal;
pub(crate) mod lifecycle;
pub(crate) mod listen;
pub(crate) mod metrics;
pub(crate) mod response;

pub use clock::RealClock;
pub use dispatch::{InFlight, Limits, LiveScheduler, Placed, Placement, Subset};
