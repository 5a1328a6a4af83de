//! Maps keyed by chained prefix-block hashes, which are already uniformly spread, so the map
//! uses them as they are instead of hashing them again.

use std::collections::HashMap;

pub use switchyard_prefix_hashing::BlockHashBuild as HashBuild;

/// A map from block hash to `V`.
pub type BlockHashMap<V> = HashMap<u64, V, HashBuild>;
