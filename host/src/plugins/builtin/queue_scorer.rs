//! `queue-scorer`: favours endpoints with fewer waiting requests, relative to the other
//! candidates of the same request.
//!
//! The shortest queue scores 1 and the longest 0, linearly in between; when every queue has
//! the same length every endpoint scores 1.

use switchyard_plugin_api::sdk::{Instance, PluginFactory};
use switchyard_plugin_api::{
    AttrView, EndpointView, PluginError, PluginKind, RequestView, ScoreOutput, Scorer, Stability,
};

use super::Builtin;

pub static FACTORY: PluginFactory = PluginFactory {
    type_name: "queue-scorer",
    kind: PluginKind::Scorer,
    stability: Stability::Stable,
    description: "Scores endpoints from 1 for the shortest waiting queue to 0 for the longest.",
    parameters: &[],
    create,
};

inventory::submit! { Builtin(&FACTORY) }

fn create(_instance_name: &str, parameters: &str) -> Result<Instance, PluginError> {
    super::refuse_parameters(parameters)?;
    Ok(Instance::scorer(QueueScorer))
}

pub struct QueueScorer;

impl Scorer for QueueScorer {
    fn score(
        &self,
        _request: &RequestView<'_>,
        endpoints: &[EndpointView<'_>],
        _attrs: &AttrView<'_>,
        out: ScoreOutput<'_>,
    ) -> Result<(), PluginError> {
        let waiting = |e: &EndpointView<'_>| e.metrics.waiting_requests;
        let shortest = endpoints.iter().map(waiting).min().unwrap_or(0);
        let longest = endpoints.iter().map(waiting).max().unwrap_or(0);
        let span = f64::from(longest - shortest);
        for (score, endpoint) in out.scores.iter_mut().zip(endpoints) {
            *score = if span == 0.0 {
                1.0
            } else {
                f64::from(longest - waiting(endpoint)) / span
            };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::FACTORY;
    use crate::plugins::builtin::testing::{
        assert_registered, create, create_error, score, with_waiting,
    };

    #[test]
    fn scales_between_shortest_and_longest_queue() {
        let instance = create(&FACTORY, "null");
        let scores = score(&instance, &with_waiting(&[0, 0, 10]));
        assert_eq!(scores, [1.0, 1.0, 0.0]);
        let scores = score(&instance, &with_waiting(&[4, 8, 12, 6]));
        assert_eq!(scores, [1.0, 0.5, 0.0, 0.75]);
    }

    #[test]
    fn equal_queues_all_score_one() {
        let instance = create(&FACTORY, "{}");
        assert_eq!(score(&instance, &with_waiting(&[3, 3, 3])), [1.0, 1.0, 1.0]);
        assert_eq!(score(&instance, &with_waiting(&[7])), [1.0]);
        assert!(score(&instance, &with_waiting(&[])).is_empty());
    }

    #[test]
    fn refuses_parameters() {
        let error = create_error(&FACTORY, r#"{"threshold": 3}"#);
        assert_eq!(error.field.as_str(), "threshold");
    }

    #[test]
    fn is_registered() {
        assert_registered(&FACTORY);
    }
}
