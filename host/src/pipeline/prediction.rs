//! What a decision predicted about the prefix cache of the endpoint it chose: which attribute
//! rows hold `PrefixCacheMatchInfo` (found once, when the pipeline is wired) and, per decision,
//! the prompt tokens each of their producers expected the chosen endpoint to hold already. The
//! values are kept inline, so taking them allocates nothing. [`Sums`] is how a prediction is
//! scored against what the endpoint really held, for every driver that checks them.

use std::sync::Arc;

use switchyard_plugin_api::keys::PREFIX_CACHE_MATCH_INFO;
use switchyard_plugin_api::{AttrValue, DataKey};

/// Producers of `PrefixCacheMatchInfo` whose predictions are taken; further ones (rare: each
/// is a separate prefix model of the same fleet) are not checked.
pub const MAX_CHECKED: usize = 4;

/// The `PrefixCacheMatchInfo` rows of a pipeline and the names of their producers.
#[derive(Debug, Clone, Default)]
pub struct PrefixRows {
    rows: Vec<u32>,
    /// `None` when the pipeline has no such row: nothing to take or check.
    producers: Option<Arc<[String]>>,
}

impl PrefixRows {
    /// Finds the rows among a pipeline's attribute rows, in row order.
    pub fn find(rows: &[DataKey]) -> PrefixRows {
        let found: Vec<(u32, String)> = rows
            .iter()
            .enumerate()
            .filter(|(_, key)| key.data_type.as_str() == PREFIX_CACHE_MATCH_INFO)
            .map(|(row, key)| (row as u32, key.producer.to_string()))
            .collect();
        if found.len() > MAX_CHECKED {
            tracing::warn!(
                "{} producers of {PREFIX_CACHE_MATCH_INFO}; the predictions of the first \
                 {MAX_CHECKED} are checked against the replicas' usage, not those of {}",
                found.len(),
                found[MAX_CHECKED..]
                    .iter()
                    .map(|(_, name)| name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let found = &found[..found.len().min(MAX_CHECKED)];
        PrefixRows {
            rows: found.iter().map(|(row, _)| *row).collect(),
            producers: (!found.is_empty())
                .then(|| found.iter().map(|(_, name)| name.clone()).collect()),
        }
    }

    /// The predictions for the endpoint at `slot` in a store of rows × `stride` candidates.
    #[inline]
    pub fn take(&self, store: &[AttrValue], stride: usize, slot: usize) -> Predicted {
        let Some(producers) = &self.producers else {
            return Predicted::default();
        };
        let mut tokens = [None; MAX_CHECKED];
        for (value, &row) in tokens.iter_mut().zip(&self.rows) {
            *value = store
                .get(row as usize * stride + slot)
                .and_then(AttrValue::prefix_cache_match)
                .map(|info| info.match_blocks.saturating_mul(info.block_size_tokens));
        }
        Predicted {
            producers: Some(producers.clone()),
            tokens,
        }
    }
}

/// Per producer of `PrefixCacheMatchInfo`, the prompt tokens it expected the chosen endpoint
/// to hold; a producer that wrote nothing for that endpoint predicted nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Predicted {
    producers: Option<Arc<[String]>>,
    tokens: [Option<u64>; MAX_CHECKED],
}

impl Predicted {
    /// Whether there is no prediction to check.
    pub fn is_empty(&self) -> bool {
        self.tokens.iter().all(Option::is_none)
    }

    /// Each producer's name with its predicted tokens.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.producers
            .iter()
            .flat_map(|names| names.iter())
            .zip(&self.tokens)
            .filter_map(|(name, tokens)| tokens.map(|t| (name.as_str(), t)))
    }

    /// A prediction made by hand, for tests.
    #[cfg(test)]
    pub fn of(pairs: &[(&str, u64)]) -> Predicted {
        let mut tokens = [None; MAX_CHECKED];
        for (value, (_, t)) in tokens.iter_mut().zip(pairs) {
            *value = Some(*t);
        }
        Predicted {
            producers: Some(pairs.iter().map(|(name, _)| name.to_string()).collect()),
            tokens,
        }
    }
}

/// Token sums of some checked predictions. Correct tokens are those both predicted and cached: the smaller
/// of the two, since both count a prefix of the prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sums {
    pub predicted: u64,
    pub cached: u64,
    pub correct: u64,
}

impl Sums {
    pub fn one(predicted: u64, cached: u64) -> Sums {
        Sums {
            predicted,
            cached,
            correct: predicted.min(cached),
        }
    }

    pub fn add(&mut self, other: Sums) {
        self.predicted += other.predicted;
        self.cached += other.cached;
        self.correct += other.correct;
    }

    pub fn remove(&mut self, other: Sums) {
        self.predicted -= other.predicted;
        self.cached -= other.cached;
        self.correct -= other.correct;
    }

    /// Of the tokens predicted, the share that was cached; `None` when none were predicted.
    pub fn precision(&self) -> Option<f64> {
        (self.predicted > 0).then(|| self.correct as f64 / self.predicted as f64)
    }

    /// Of the tokens cached, the share that was predicted; `None` when none were cached.
    pub fn recall(&self) -> Option<f64> {
        (self.cached > 0).then(|| self.correct as f64 / self.cached as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_plugin_api::{InFlightLoad, PrefixCacheMatchInfo};

    fn info(match_blocks: u64, block_size_tokens: u64) -> AttrValue {
        AttrValue::PrefixCacheMatch(PrefixCacheMatchInfo {
            match_blocks,
            total_blocks: 8,
            block_size_tokens,
        })
    }

    #[test]
    fn takes_each_producers_tokens_on_the_chosen_endpoint_only() {
        let rows = vec![
            DataKey::new("InFlightLoad", "load"),
            DataKey::new(PREFIX_CACHE_MATCH_INFO, "approx"),
            DataKey::new(PREFIX_CACHE_MATCH_INFO, "burst"),
        ];
        let found = PrefixRows::find(&rows);
        // Three candidates; row 0 is not a prefix row, row 2 has nothing on slot 1.
        let load = AttrValue::InFlightLoad(InFlightLoad::default());
        let store = vec![
            load.clone(),
            load.clone(),
            load,
            info(1, 64),
            info(2, 64),
            info(0, 64),
            info(5, 4),
            AttrValue::Absent,
            info(3, 4),
        ];
        let on_1 = found.take(&store, 3, 1);
        assert_eq!(on_1.iter().collect::<Vec<_>>(), vec![("approx", 128)]);
        let on_2 = found.take(&store, 3, 2);
        assert_eq!(
            on_2.iter().collect::<Vec<_>>(),
            vec![("approx", 0), ("burst", 12)]
        );
        assert!(!on_2.is_empty());
    }

    #[test]
    fn a_pipeline_without_prefix_rows_predicts_nothing() {
        let found = PrefixRows::find(&[DataKey::new("InFlightLoad", "load")]);
        let taken = found.take(&[AttrValue::Absent], 1, 0);
        assert!(taken.is_empty());
        assert_eq!(taken, Predicted::default());
    }
}
