//! The real clock, expressed the way the scheduler takes time: milliseconds since the driver
//! started, as `replay` and `simulate` express virtual time. Windows therefore open and seal
//! on the same arithmetic in every driver.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub struct RealClock {
    start: Instant,
}

impl RealClock {
    pub fn start() -> RealClock {
        RealClock {
            start: Instant::now(),
        }
    }

    pub fn now_ms(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1000.0
    }

    /// The instant a scheduler time stands for.
    pub fn instant_at(&self, ms: f64) -> Instant {
        self.start + Duration::from_secs_f64(ms.max(0.0) / 1000.0)
    }
}

impl Default for RealClock {
    fn default() -> Self {
        RealClock::start()
    }
}
