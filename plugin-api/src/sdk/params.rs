//! Strict decoding of a plugin's JSON parameters.

use serde::de::DeserializeOwned;

use crate::abi::PluginError;

/// Decodes parameters over the type's defaults: `null` or an empty string gives
/// `T::default()`, unknown fields are refused (when `T` denies them), and a type error names
/// the field that carries it.
pub fn parse_parameters<T: DeserializeOwned + Default>(json: &str) -> Result<T, PluginError> {
    let trimmed = json.trim();
    if trimmed.is_empty() || trimmed == "null" {
        return Ok(T::default());
    }
    let mut deserializer = serde_json::Deserializer::from_str(trimmed);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        let message = strip_position(&inner.to_string());
        let field = unknown_field_name(&message).unwrap_or(if path == "." { "" } else { &path });
        PluginError::invalid_parameter(field, &message)
    })
}

/// serde_json appends "at line L column C" of the JSON text it was handed; that text is a
/// re-encoding of the operator's TOML, so the position would only mislead.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(at) => message[..at].to_string(),
        None => message.to_string(),
    }
}

fn unknown_field_name(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("unknown field `")?;
    rest.split('`').next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Default, Debug, PartialEq)]
    #[serde(rename_all = "camelCase", deny_unknown_fields, default)]
    struct Sample {
        window_ms: u64,
        mode: String,
    }

    #[test]
    fn null_gives_defaults() {
        assert_eq!(
            parse_parameters::<Sample>("null").unwrap(),
            Sample::default()
        );
        assert_eq!(parse_parameters::<Sample>("").unwrap(), Sample::default());
    }

    #[test]
    fn unknown_field_is_named() {
        let error = parse_parameters::<Sample>(r#"{"windowMs": 1, "bogus": 2}"#).unwrap_err();
        assert_eq!(error.field.as_str(), "bogus");
        assert!(
            error.message.contains("unknown field `bogus`"),
            "{}",
            error.message
        );
        assert!(!error.message.contains("line"), "{}", error.message);
    }

    #[test]
    fn type_error_names_the_field() {
        let error = parse_parameters::<Sample>(r#"{"windowMs": "soon"}"#).unwrap_err();
        assert_eq!(error.field.as_str(), "windowMs");
        assert!(error.message.contains("invalid type"), "{}", error.message);
    }
}
