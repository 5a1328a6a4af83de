//! What the built-in pickers share: the `maxNumOfEndpoints` parameter and the number of
//! candidates a pick works over.
//!
//! The reference silently turns `maxNumOfEndpoints <= 0` into 1; here such a value is refused,
//! since it is almost certainly a typo the operator wants to hear about.

use rand::rngs::SmallRng;
use rand::Rng;
use serde::Deserialize;
use switchyard_plugin_api::sdk::{parse_parameters, Param};
use switchyard_plugin_api::{EndpointView, PluginError};

/// Documentation of `maxNumOfEndpoints`, listed by every built-in picker.
pub const MAX_NUM_OF_ENDPOINTS: Param = Param {
    name: "maxNumOfEndpoints",
    value_type: "integer",
    default: "1",
    range: ">= 1",
    description: "How many endpoints to return, first choice first; fewer when there are \
                  fewer candidates.",
};

/// Parameters of every built-in picker.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PickerConfig {
    pub max_num_of_endpoints: i64,
}

impl Default for PickerConfig {
    fn default() -> Self {
        PickerConfig {
            max_num_of_endpoints: 1,
        }
    }
}

impl PickerConfig {
    /// Decodes JSON parameters over the defaults and validates them.
    pub fn from_json(parameters: &str) -> Result<Self, PluginError> {
        let config: PickerConfig = parse_parameters(parameters)?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), PluginError> {
        if self.max_num_of_endpoints < 1 {
            return Err(PluginError::invalid_parameter(
                "maxNumOfEndpoints",
                format!(
                    "maxNumOfEndpoints must be >= 1 (got {})",
                    self.max_num_of_endpoints
                ),
            ));
        }
        Ok(())
    }

    /// The most endpoints one pick returns.
    pub fn max_picks(&self) -> usize {
        usize::try_from(self.max_num_of_endpoints.max(1)).unwrap_or(usize::MAX)
    }
}

/// How many candidates a pick can consider: the host passes one score and one output position
/// per endpoint, so the three lengths agree unless the caller is broken.
pub fn candidate_count(endpoints: &[EndpointView<'_>], scores: &[f64], picked: &[u32]) -> usize {
    endpoints.len().min(scores.len()).min(picked.len())
}

/// The positions a pick permutes in place: `picked` cut to the candidate count and filled
/// with `0..n`.
pub fn positions<'p>(
    endpoints: &[EndpointView<'_>],
    scores: &[f64],
    picked: &'p mut [u32],
) -> &'p mut [u32] {
    let n = candidate_count(endpoints, scores, picked);
    let picked = &mut picked[..n];
    for (position, slot) in picked.iter_mut().enumerate() {
        *slot = position as u32;
    }
    picked
}

/// Moves `count` positions chosen uniformly from `picked[from..]` into
/// `picked[from..from + count]`, in a uniformly random order.
pub fn choose_uniformly(picked: &mut [u32], from: usize, count: usize, rng: &mut SmallRng) {
    let end = (from + count).min(picked.len());
    for i in from..end {
        let j = rng.random_range(i..picked.len());
        picked.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_to_one_endpoint() {
        assert_eq!(PickerConfig::from_json("null").unwrap().max_picks(), 1);
        assert_eq!(PickerConfig::from_json("{}").unwrap().max_picks(), 1);
        assert_eq!(
            PickerConfig::from_json(r#"{"maxNumOfEndpoints": 3}"#)
                .unwrap()
                .max_picks(),
            3
        );
    }

    #[test]
    fn refuses_counts_below_one() {
        for value in [0, -2] {
            let error = PickerConfig::from_json(&format!(r#"{{"maxNumOfEndpoints": {value}}}"#))
                .unwrap_err();
            assert_eq!(
                error.kind,
                switchyard_plugin_api::ErrorKind::InvalidParameter
            );
            assert_eq!(error.field.as_str(), "maxNumOfEndpoints");
            assert_eq!(
                error.message.as_str(),
                format!("maxNumOfEndpoints must be >= 1 (got {value})")
            );
        }
    }

    #[test]
    fn refuses_unknown_fields_and_wrong_types() {
        let error = PickerConfig::from_json(r#"{"maxEndpoints": 2}"#).unwrap_err();
        assert_eq!(error.field.as_str(), "maxEndpoints");
        let error = PickerConfig::from_json(r#"{"maxNumOfEndpoints": "two"}"#).unwrap_err();
        assert_eq!(error.field.as_str(), "maxNumOfEndpoints");
    }
}
