//! Maps keyed by chained prefix-block hashes, which are XXH64 outputs and already uniformly
//! spread, so the map uses them as they are instead of hashing them again.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default)]
pub struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

pub type HashBuild = BuildHasherDefault<PassThroughHasher>;

/// A map from block hash to `V`.
pub type BlockHashMap<V> = HashMap<u64, V, HashBuild>;
