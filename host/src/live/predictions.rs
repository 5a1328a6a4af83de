//! Checking prefix predictions against what replicas report: per producer of
//! `PrefixCacheMatchInfo` and endpoint, the prompt tokens the pipeline expected the endpoint to
//! hold against `usage.prompt_tokens_details.cached_tokens`, as running totals (for the metrics
//! and the admin API) and over a sliding window of the latest checks (for the drift warning).
//!
//! Drift rule: once a window holds [`DRIFT_WINDOW`] checks, a precision or a recall below
//! [`DRIFT_BELOW`] over it logs one warning for that producer and endpoint; once both are back
//! at [`RECOVERED_AT`] or more, one info line says so and the next drift warns again. A
//! measure whose denominator is 0 over the window (nothing predicted, or nothing cached) is
//! not judged.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::{json, Value};

use crate::pipeline::{Predicted, Sums};

/// Checks a drift judgement is made over: the latest of one producer on one endpoint.
pub const DRIFT_WINDOW: usize = 50;
/// Precision or recall under this over a full window is drift.
pub const DRIFT_BELOW: f64 = 0.5;
/// Both at this or more over a full window ends a drift.
pub const RECOVERED_AT: f64 = 0.6;

/// One producer's record on one endpoint.
#[derive(Debug, Default)]
struct Account {
    checked: u64,
    total: Sums,
    window: VecDeque<Sums>,
    in_window: Sums,
    drifting: bool,
}

/// What a check changed about drift.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Turn {
    Drifted,
    Recovered,
}

impl Account {
    fn check(&mut self, predicted: u64, cached: u64) -> Option<Turn> {
        let one = Sums::one(predicted, cached);
        self.checked += 1;
        self.total.add(one);
        if self.window.len() == DRIFT_WINDOW {
            if let Some(old) = self.window.pop_front() {
                self.in_window.remove(old);
            }
        }
        self.window.push_back(one);
        self.in_window.add(one);
        if self.window.len() < DRIFT_WINDOW {
            return None;
        }
        let (precision, recall) = (self.in_window.precision(), self.in_window.recall());
        let below = |v: Option<f64>| v.is_some_and(|v| v < DRIFT_BELOW);
        let fine = |v: Option<f64>| v.is_none_or(|v| v >= RECOVERED_AT);
        if !self.drifting && (below(precision) || below(recall)) {
            self.drifting = true;
            return Some(Turn::Drifted);
        }
        if self.drifting && fine(precision) && fine(recall) {
            self.drifting = false;
            return Some(Turn::Recovered);
        }
        None
    }
}

/// One producer's figures on one endpoint, as shown.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub producer: String,
    pub endpoint: String,
    pub checked: u64,
    pub total: Sums,
    pub window: Sums,
    pub window_checks: usize,
    pub drifting: bool,
}

/// Every producer's record on every endpoint it was checked on.
#[derive(Debug, Default)]
pub struct PredictionBook {
    /// Producer, then endpoint.
    accounts: Mutex<HashMap<String, HashMap<String, Account>>>,
}

impl PredictionBook {
    /// Checks each producer's prediction for a request `endpoint` served with `cached` prompt
    /// tokens found in its cache.
    pub fn check(&self, endpoint: &str, predicted: &Predicted, cached: u64) {
        let mut turns = Vec::new();
        {
            let mut accounts = self.accounts.lock().unwrap_or_else(|e| e.into_inner());
            for (producer, tokens) in predicted.iter() {
                let per_endpoint = match accounts.get_mut(producer) {
                    Some(map) => map,
                    None => accounts.entry(producer.to_string()).or_default(),
                };
                let account = match per_endpoint.get_mut(endpoint) {
                    Some(account) => account,
                    None => per_endpoint.entry(endpoint.to_string()).or_default(),
                };
                if let Some(turn) = account.check(tokens, cached) {
                    turns.push((producer, turn, account.in_window));
                }
            }
        }
        for (producer, turn, window) in turns {
            let shown = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.2}"));
            let (precision, recall) = (shown(window.precision()), shown(window.recall()));
            match turn {
                Turn::Drifted => tracing::warn!(
                    producer,
                    endpoint,
                    precision,
                    recall,
                    "prefix predictions drifted: over the last {DRIFT_WINDOW} checked requests \
                     {} tokens were predicted cached and {} were ({} of them predicted); the \
                     producer's view of this replica's cache is off (logged once until it \
                     recovers)",
                    window.predicted,
                    window.cached,
                    window.correct
                ),
                Turn::Recovered => tracing::info!(
                    producer,
                    endpoint,
                    precision,
                    recall,
                    "prefix predictions recovered over the last {DRIFT_WINDOW} checked requests"
                ),
            }
        }
    }

    /// Every account, by producer then endpoint.
    pub fn figures(&self) -> Vec<Figures> {
        let accounts = self.accounts.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<Figures> = accounts
            .iter()
            .flat_map(|(producer, per_endpoint)| {
                per_endpoint.iter().map(move |(endpoint, account)| Figures {
                    producer: producer.clone(),
                    endpoint: endpoint.clone(),
                    checked: account.checked,
                    total: account.total,
                    window: account.in_window,
                    window_checks: account.window.len(),
                    drifting: account.drifting,
                })
            })
            .collect();
        all.sort_by(|a, b| (&a.producer, &a.endpoint).cmp(&(&b.producer, &b.endpoint)));
        all
    }

    /// The admin API's view: one entry per producer and endpoint.
    pub fn to_json(&self) -> Value {
        let entries: Vec<Value> = self
            .figures()
            .into_iter()
            .map(|f| {
                json!({
                    "producer": f.producer,
                    "endpoint": f.endpoint,
                    "checked_requests": f.checked,
                    "predicted_tokens": f.total.predicted,
                    "cached_tokens": f.total.cached,
                    "correct_tokens": f.total.correct,
                    "precision": f.total.precision(),
                    "recall": f.total.recall(),
                    "window": {
                        "checked_requests": f.window_checks,
                        "predicted_tokens": f.window.predicted,
                        "cached_tokens": f.window.cached,
                        "correct_tokens": f.window.correct,
                        "precision": f.window.precision(),
                        "recall": f.window.recall(),
                    },
                    "drifting": f.drifting,
                })
            })
            .collect();
        json!({
            "drift_rule": {
                "window_checks": DRIFT_WINDOW,
                "drift_below": DRIFT_BELOW,
                "recovered_at": RECOVERED_AT,
            },
            "predictions": entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn correct_tokens_are_the_smaller_of_predicted_and_cached() {
        let book = PredictionBook::default();
        let predicted = |t| Predicted::of(&[("approx", t)]);
        book.check("r0", &predicted(128), 128);
        book.check("r0", &predicted(128), 32);
        book.check("r0", &predicted(0), 64);
        book.check("r0", &predicted(0), 0);
        let figures = book.figures();
        assert_eq!(figures.len(), 1);
        let f = &figures[0];
        assert_eq!((f.producer.as_str(), f.endpoint.as_str()), ("approx", "r0"));
        assert_eq!(f.checked, 4);
        assert_eq!(
            f.total,
            Sums {
                predicted: 256,
                cached: 224,
                correct: 160
            }
        );
        assert_eq!(f.total.precision(), Some(160.0 / 256.0));
        assert_eq!(f.total.recall(), Some(160.0 / 224.0));
        assert_eq!(Sums::default().precision(), None);
        assert_eq!(Sums::default().recall(), None);
    }

    #[test]
    fn each_producer_and_endpoint_is_accounted_apart() {
        let book = PredictionBook::default();
        book.check("r0", &Predicted::of(&[("approx", 64), ("burst", 0)]), 64);
        book.check("r1", &Predicted::of(&[("approx", 64), ("burst", 64)]), 0);
        let shown: Vec<(String, String, Sums)> = book
            .figures()
            .into_iter()
            .map(|f| (f.producer, f.endpoint, f.total))
            .collect();
        assert_eq!(
            shown,
            vec![
                ("approx".into(), "r0".into(), Sums::one(64, 64)),
                ("approx".into(), "r1".into(), Sums::one(64, 0)),
                ("burst".into(), "r0".into(), Sums::one(0, 64)),
                ("burst".into(), "r1".into(), Sums::one(64, 0)),
            ]
        );
    }

    #[test]
    fn drift_turns_once_on_a_full_window_and_recovers_once() {
        let mut account = Account::default();
        // Right, then wrong: no judgement before the window is full.
        for _ in 0..10 {
            assert_eq!(account.check(100, 100), None);
        }
        let mut turns = Vec::new();
        for _ in 0..100 {
            turns.extend(account.check(100, 20));
        }
        assert_eq!(turns, vec![Turn::Drifted]);
        assert!(account.drifting);
        // Right again: recovers once precision over the window reaches RECOVERED_AT.
        let mut turns = Vec::new();
        let mut after = 0;
        for i in 0..100 {
            if let Some(turn) = account.check(100, 100) {
                turns.push(turn);
                after = i + 1;
            }
        }
        assert_eq!(turns, vec![Turn::Recovered]);
        // 0.2 × (50 - k) + k >= 0.6 × 50 first at k = 25.
        assert_eq!(after, 25);
        assert_eq!(account.window.len(), DRIFT_WINDOW);
        assert_eq!(account.checked, 210);
    }

    #[test]
    fn recall_drifts_when_the_cache_holds_more_than_predicted() {
        let mut account = Account::default();
        let turns: Vec<Turn> = (0..DRIFT_WINDOW)
            .filter_map(|_| account.check(10, 100))
            .collect();
        assert_eq!(turns, vec![Turn::Drifted]);
        assert_eq!(account.in_window.precision(), Some(1.0));
        assert_eq!(account.in_window.recall(), Some(0.1));
    }

    #[test]
    fn nothing_predicted_and_nothing_cached_is_never_drift() {
        let mut account = Account::default();
        assert!((0..200).all(|_| account.check(0, 0).is_none()));
        assert_eq!(account.checked, 200);
        assert!(!account.drifting);
    }
}
