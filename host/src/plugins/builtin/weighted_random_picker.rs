//! `weighted-random-picker`: candidates drawn with probability proportional to their score,
//! with a generator seeded from the request.
//!
//! Picks are drawn one at a time without replacement, each in proportion to the scores of the
//! candidates not yet drawn. That is the distribution of the reference's A-Res keys
//! (`u^(1/score)`, highest first) — exactly `score / Σscore` for a single pick — without storing
//! a key per endpoint, and without the underflow of `u^(1/score)` for small scores that would
//! tie them with zero. Candidates scoring zero, less or NaN are drawn only after every
//! positive one, uniformly at random; when none scores above zero the pick is uniform.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use switchyard_plugin_api::sdk::{Instance, PluginFactory};
use switchyard_plugin_api::{
    EndpointView, Picker, PluginError, PluginKind, RequestView, Stability,
};

use super::picking::{choose_uniformly, positions, PickerConfig, MAX_NUM_OF_ENDPOINTS};
use super::Builtin;

pub static FACTORY: PluginFactory = PluginFactory {
    type_name: "weighted-random-picker",
    kind: PluginKind::Picker,
    stability: Stability::Beta,
    description: "Picks endpoints at random with probability proportional to their score.",
    parameters: &[MAX_NUM_OF_ENDPOINTS],
    create,
};

inventory::submit! { Builtin(&FACTORY) }

fn create(_instance_name: &str, parameters: &str) -> Result<Instance, PluginError> {
    let config = PickerConfig::from_json(parameters)?;
    Ok(Instance::picker(WeightedRandomPicker {
        max_picks: config.max_picks(),
    }))
}

pub struct WeightedRandomPicker {
    max_picks: usize,
}

impl Picker for WeightedRandomPicker {
    fn pick(
        &self,
        request: &RequestView<'_>,
        endpoints: &[EndpointView<'_>],
        scores: &[f64],
        picked: &mut [u32],
    ) -> Result<usize, PluginError> {
        let picked = positions(endpoints, scores, picked);
        let n = picked.len();
        let k = self.max_picks.min(n);
        let mut rng = SmallRng::seed_from_u64(request.random_seed);
        // Capping each weight keeps the sum finite; an infinite score shares the cap.
        let cap = f64::MAX / n.max(1) as f64;
        let weight = |position: u32| {
            let score = scores[position as usize];
            if score > 0.0 {
                score.min(cap)
            } else {
                0.0
            }
        };
        for round in 0..k {
            let total: f64 = picked[round..].iter().map(|&p| weight(p)).sum();
            if total <= 0.0 {
                choose_uniformly(picked, round, k - round, &mut rng);
                break;
            }
            let target = rng.random::<f64>() * total;
            let mut reached = 0.0;
            let mut chosen = round;
            for (offset, &position) in picked[round..].iter().enumerate() {
                let w = weight(position);
                if w > 0.0 {
                    chosen = round + offset;
                    reached += w;
                    if target < reached {
                        break;
                    }
                }
            }
            picked.swap(round, chosen);
        }
        Ok(k)
    }
}

#[cfg(test)]
mod tests;
