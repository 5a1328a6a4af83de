//! `random-picker`: candidates chosen uniformly at random, scores ignored, with a generator
//! seeded from the request.

use rand::rngs::SmallRng;
use rand::SeedableRng;
use switchyard_plugin_api::sdk::{Instance, PluginFactory};
use switchyard_plugin_api::{
    EndpointView, Picker, PluginError, PluginKind, RequestView, Stability,
};

use super::picking::{choose_uniformly, positions, PickerConfig, MAX_NUM_OF_ENDPOINTS};
use super::Builtin;

pub static FACTORY: PluginFactory = PluginFactory {
    type_name: "random-picker",
    kind: PluginKind::Picker,
    stability: Stability::Beta,
    description: "Picks endpoints uniformly at random, ignoring their scores.",
    parameters: &[MAX_NUM_OF_ENDPOINTS],
    create,
};

inventory::submit! { Builtin(&FACTORY) }

fn create(_instance_name: &str, parameters: &str) -> Result<Instance, PluginError> {
    let config = PickerConfig::from_json(parameters)?;
    Ok(Instance::picker(RandomPicker {
        max_picks: config.max_picks(),
    }))
}

pub struct RandomPicker {
    max_picks: usize,
}

impl Picker for RandomPicker {
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
        choose_uniformly(
            picked,
            0,
            k,
            &mut SmallRng::seed_from_u64(request.random_seed),
        );
        Ok(k)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::FACTORY;
    use crate::plugins::builtin::testing::{
        assert_frequencies, assert_registered, create, create_error, pick, pick_frequencies,
    };

    fn picker(max: i64) -> switchyard_plugin_api::PluginInstance {
        create(&FACTORY, &format!(r#"{{"maxNumOfEndpoints": {max}}}"#))
    }

    /// One pick returns `count` distinct endpoints; over 10,000 picks each is chosen with
    /// frequency `each`.
    fn check(max: i64, scores: &[f64], count: usize, each: f64) {
        let instance = picker(max);
        let once = pick(&instance, 7, scores);
        assert_eq!(once.len(), count, "{once:?}");
        assert_eq!(
            once.iter().collect::<BTreeSet<_>>().len(),
            count,
            "{once:?}"
        );
        let frequencies = pick_frequencies(&instance, scores);
        assert_frequencies(&frequencies, &vec![each; scores.len()]);
    }

    #[test]
    fn single_from_multiple() {
        check(1, &[10.0, 20.0, 30.0], 1, 1.0 / 3.0);
    }

    #[test]
    fn more_candidates_than_needed() {
        check(2, &[10.0, 20.0, 30.0], 2, 2.0 / 3.0);
    }

    #[test]
    fn fewer_candidates_than_max() {
        check(5, &[10.0, 20.0], 2, 1.0);
    }

    #[test]
    fn exact() {
        check(3, &[10.0, 20.0, 30.0], 3, 1.0);
    }

    #[test]
    fn a_seed_reproduces_its_pick() {
        let instance = picker(2);
        let scores = [1.0; 5];
        let picks: Vec<_> = (0..20).map(|seed| pick(&instance, seed, &scores)).collect();
        let again: Vec<_> = (0..20).map(|seed| pick(&instance, seed, &scores)).collect();
        assert_eq!(picks, again);
        assert!(picks.iter().collect::<BTreeSet<_>>().len() > 1, "{picks:?}");
    }

    #[test]
    fn no_candidates_picks_nothing() {
        assert!(pick(&picker(1), 0, &[]).is_empty());
    }

    #[test]
    fn refuses_a_negative_count() {
        let error = create_error(&FACTORY, r#"{"maxNumOfEndpoints": -1}"#);
        assert_eq!(error.field.as_str(), "maxNumOfEndpoints");
        assert_eq!(
            error.message.as_str(),
            "maxNumOfEndpoints must be >= 1 (got -1)"
        );
    }

    #[test]
    fn is_registered() {
        assert_registered(&FACTORY);
    }
}
