//! What the real-time drivers share: the thread that owns the scheduler on the real clock,
//! and the lifecycle of a dispatched request (charged at dispatch, released exactly once).
