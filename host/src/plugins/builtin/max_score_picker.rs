//! `max-score-picker`: the highest-scoring candidates, ties broken uniformly at random with a
//! generator seeded from the request, so a given seed always gives the same pick.

use std::cmp::Ordering;

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use switchyard_plugin_api::sdk::{Instance, PluginFactory};
use switchyard_plugin_api::{
    EndpointView, Picker, PluginError, PluginKind, RequestView, Stability,
};

use super::picking::{candidate_count, positions, PickerConfig, MAX_NUM_OF_ENDPOINTS};
use super::Builtin;

pub static FACTORY: PluginFactory = PluginFactory {
    type_name: "max-score-picker",
    kind: PluginKind::Picker,
    stability: Stability::Beta,
    description: "Picks the highest-scoring endpoints, breaking ties uniformly at random.",
    parameters: &[MAX_NUM_OF_ENDPOINTS],
    create,
};

inventory::submit! { Builtin(&FACTORY) }

fn create(_instance_name: &str, parameters: &str) -> Result<Instance, PluginError> {
    let config = PickerConfig::from_json(parameters)?;
    Ok(Instance::picker(MaxScorePicker {
        max_picks: config.max_picks(),
    }))
}

pub struct MaxScorePicker {
    max_picks: usize,
}

impl Picker for MaxScorePicker {
    fn pick(
        &self,
        request: &RequestView<'_>,
        endpoints: &[EndpointView<'_>],
        scores: &[f64],
        picked: &mut [u32],
    ) -> Result<usize, PluginError> {
        let n = candidate_count(endpoints, scores, picked);
        if n == 0 {
            return Ok(0);
        }
        let mut rng = SmallRng::seed_from_u64(request.random_seed);
        if self.max_picks == 1 {
            picked[0] = best(&scores[..n], &mut rng) as u32;
            return Ok(1);
        }
        // A uniformly shuffled start makes any deterministic comparison-based selection break
        // ties uniformly: swapping two tied positions in the input swaps them in the output.
        let picked = positions(endpoints, scores, picked);
        picked.shuffle(&mut rng);
        let k = self.max_picks.min(n);
        let higher_first = |a: &u32, b: &u32| by_rank(scores[*b as usize], scores[*a as usize]);
        if k < n {
            picked.select_nth_unstable_by(k - 1, higher_first);
        }
        picked[..k].sort_unstable_by(higher_first);
        Ok(k)
    }
}

/// The position of a highest score, each tied position equally likely.
fn best(scores: &[f64], rng: &mut SmallRng) -> usize {
    let mut best = 0;
    let mut ties = 1u32;
    for position in 1..scores.len() {
        match by_rank(scores[position], scores[best]) {
            Ordering::Greater => {
                best = position;
                ties = 1;
            }
            Ordering::Equal => {
                ties += 1;
                if rng.random_range(0..ties) == 0 {
                    best = position;
                }
            }
            Ordering::Less => {}
        }
    }
    best
}

/// Orders scores with NaN below every number (it carries no preference).
fn by_rank(a: f64, b: f64) -> Ordering {
    let rank = |s: f64| if s.is_nan() { f64::NEG_INFINITY } else { s };
    rank(a).partial_cmp(&rank(b)).unwrap_or(Ordering::Equal)
}

#[cfg(test)]
mod tests;
