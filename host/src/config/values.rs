//! Checks of values a TOML file can hold but a pipeline cannot use: names that are empty or
//! carry control characters, endpoint addresses that are not `host:port`, load facts out of
//! range, weights that are negative, not finite or sum past the largest float, a plugin listed
//! twice in one profile, and `nan`, `inf` or datetimes among plugin parameters. Each refusal
//! names the file, the line and what to write instead.

use std::collections::HashSet;

use super::locate::{line_of, Step};
use super::{ConfigError, LoadedConfig};

/// How a name is shown in messages: quoted, with control characters escaped so that a name
/// never reaches a terminal raw.
pub fn shown(name: &str) -> String {
    format!("{name:?}")
}

fn name_problem(name: &str) -> Option<&'static str> {
    if name.trim().is_empty() {
        Some("must not be empty")
    } else if name.chars().any(char::is_control) {
        Some("must not contain control characters (tabs, newlines, escapes)")
    } else {
        None
    }
}

/// A `host:port` address with a port in 1..=65535 and a host without spaces.
fn address_problem(address: &str) -> Option<String> {
    let Some((host, port)) = address.rsplit_once(':') else {
        return Some("needs a port, like 10.0.0.7:8000".into());
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("needs a host before the port, like 10.0.0.7:8000".into());
    }
    match port.parse::<u32>() {
        Ok(1..=65535) => None,
        _ => Some(format!(
            "has port {port:?}; a port is a number in 1..=65535"
        )),
    }
}

impl LoadedConfig {
    fn error_at(&self, path: &[Step<'_>], message: String) -> ConfigError {
        ConfigError::new(&self.path, message).at_line(line_of(&self.source, path))
    }

    pub(super) fn check_values(&self) -> Result<(), ConfigError> {
        self.check_libraries()?;
        self.check_plugin_entries()?;
        self.check_endpoints()?;
        self.check_kv_events()?;
        self.check_profiles()
    }

    /// Publisher and replay addresses: `tcp://` or `ipc://` with a target, and no placeholder
    /// other than `{host}` and `{port}`; timings above 0.
    fn check_kv_events(&self) -> Result<(), ConfigError> {
        let kv = &self.config.kv_events;
        for (key, value) in [
            ("endpoint", &kv.endpoint),
            ("replay_endpoint", &kv.replay_endpoint),
        ] {
            if let Some(problem) = zmq_address_problem(value) {
                return Err(self.error_at(
                    &[Step::Key("kv_events"), Step::Key(key)],
                    format!("kv_events.{key} {} {problem}", shown(value)),
                ));
            }
        }
        for (key, value) in [
            ("replay_timeout_ms", kv.replay_timeout_ms),
            ("reconnect_ms", kv.reconnect_ms),
            ("idle_reconnect_ms", kv.idle_reconnect_ms.max(1)),
        ] {
            if !(1..=3_600_000).contains(&value) {
                return Err(self.error_at(
                    &[Step::Key("kv_events"), Step::Key(key)],
                    format!("kv_events.{key} must be in 1..=3600000 milliseconds (got {value})"),
                ));
            }
        }
        for (index, endpoint) in self.config.endpoints.iter().enumerate() {
            for (key, value) in [
                ("kv_events_endpoint", &endpoint.kv_events_endpoint),
                ("kv_replay_endpoint", &endpoint.kv_replay_endpoint),
            ] {
                let Some(value) = value else { continue };
                if let Some(problem) = zmq_address_problem(value) {
                    return Err(self.error_at(
                        &[Step::Key("endpoints"), Step::Index(index), Step::Key(key)],
                        format!(
                            "endpoint {}: {key} {} {problem}",
                            shown(&endpoint.id()),
                            shown(value)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn check_libraries(&self) -> Result<(), ConfigError> {
        for (index, entry) in self.config.libraries.iter().enumerate() {
            let error = |field: &str, message: String| {
                ConfigError::new(&self.path, message)
                    .field(field)
                    .at_line(self.library_line(index))
            };
            if entry.path.trim().is_empty() {
                return Err(error(
                    "path",
                    "a library entry needs a non-empty name or path".into(),
                ));
            }
            if let Some(sha256) = &entry.sha256 {
                if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(error(
                        "sha256",
                        format!(
                            "sha256 of library {} must be 64 hexadecimal digits (got {}); \
                             compute it with `sha256sum FILE`",
                            shown(&entry.path),
                            shown(sha256)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn check_plugin_entries(&self) -> Result<(), ConfigError> {
        for (index, plugin) in self.config.plugins.iter().enumerate() {
            for (key, value) in [("type", &plugin.type_name), ("name", &plugin.name)] {
                if let Some(problem) = name_problem(value) {
                    return Err(self.error_at(
                        &[Step::Key("plugins"), Step::Index(index), Step::Key(key)],
                        format!("plugins[{index}].{key} {problem} (got {})", shown(value)),
                    ));
                }
            }
            if let Some(parameters) = &plugin.parameters {
                let mut path = Vec::new();
                if let Some((field, message)) = bad_parameter(parameters, &mut path) {
                    return Err(ConfigError::new(&self.path, message)
                        .plugin(&plugin.name, &plugin.type_name)
                        .field(field.clone())
                        .at_line(self.plugin_line(index, Some(&field))));
                }
            }
        }
        Ok(())
    }

    fn check_endpoints(&self) -> Result<(), ConfigError> {
        for (index, endpoint) in self.config.endpoints.iter().enumerate() {
            let at =
                |key: &'static str| [Step::Key("endpoints"), Step::Index(index), Step::Key(key)];
            if let Some(problem) = name_problem(&endpoint.name) {
                return Err(self.error_at(
                    &at("name"),
                    format!(
                        "endpoints[{index}].name {problem} (got {})",
                        shown(&endpoint.name)
                    ),
                ));
            }
            if endpoint.namespace.chars().any(char::is_control) {
                return Err(self.error_at(
                    &at("namespace"),
                    format!(
                        "endpoints[{index}].namespace must not contain control characters (got {})",
                        shown(&endpoint.namespace)
                    ),
                ));
            }
            if let Some(problem) = address_problem(&endpoint.address) {
                return Err(self.error_at(
                    &at("address"),
                    format!(
                        "endpoint {}: address {} {problem}",
                        shown(&endpoint.id()),
                        shown(&endpoint.address)
                    ),
                ));
            }
            let usage = endpoint.metrics.kv_cache_usage;
            if !(0.0..=1.0).contains(&usage) {
                return Err(ConfigError::new(
                    &self.path,
                    format!(
                        "endpoint {}: metrics.kv_cache_usage must be a number in 0..=1 (got {usage})",
                        shown(&endpoint.id())
                    ),
                )
                .at_line(line_of(
                    &self.source,
                    &[
                        Step::Key("endpoints"),
                        Step::Index(index),
                        Step::Key("metrics"),
                        Step::Key("kv_cache_usage"),
                    ],
                )));
            }
        }
        Ok(())
    }

    fn check_profiles(&self) -> Result<(), ConfigError> {
        for (index, profile) in self.config.profiles.iter().enumerate() {
            if let Some(problem) = name_problem(&profile.name) {
                return Err(ConfigError::new(
                    &self.path,
                    format!(
                        "profiles[{index}].name {problem} (got {})",
                        shown(&profile.name)
                    ),
                )
                .at_line(self.profile_line(index, Some("name"))));
            }
            let mut listed = HashSet::new();
            let uses = profile
                .filters
                .iter()
                .map(|f| ("filters", f.as_str()))
                .chain(
                    profile
                        .scorers
                        .iter()
                        .map(|s| ("scorers", s.plugin.as_str())),
                );
            for (key, plugin) in uses {
                if !listed.insert(plugin) {
                    return Err(ConfigError::new(
                        &self.path,
                        format!(
                            "profile {}: plugin {} is listed twice; remove one (a plugin runs \
                             once per decision)",
                            shown(&profile.name),
                            shown(plugin)
                        ),
                    )
                    .at_line(self.profile_line(index, Some(key))));
                }
            }
            let mut sum = 0.0_f64;
            for scorer in &profile.scorers {
                let weight = scorer.weight;
                let problem = if !weight.is_finite() {
                    Some(format!("must be a finite number (got {weight})"))
                } else if weight < 0.0 {
                    Some(format!(
                        "must be >= 0 (got {weight}); to stop a scorer counting, remove it"
                    ))
                } else {
                    None
                };
                sum += weight;
                let problem = problem.or_else(|| {
                    (!sum.is_finite()).then(|| {
                        "makes the sum of the profile's weights overflow; scale the weights \
                         down (only their ratios matter)"
                            .to_string()
                    })
                });
                if let Some(problem) = problem {
                    return Err(ConfigError::new(
                        &self.path,
                        format!(
                            "profile {}: the weight of scorer {} {problem}",
                            shown(&profile.name),
                            shown(&scorer.plugin)
                        ),
                    )
                    .at_line(self.profile_line(index, Some("scorers"))));
                }
            }
        }
        Ok(())
    }
}

/// The first parameter (as a dotted path) holding a value no plugin can be given, and why.
fn bad_parameter(table: &toml::Table, path: &mut Vec<String>) -> Option<(String, String)> {
    for (key, value) in table {
        path.push(key.clone());
        let found = bad_value(value, path);
        if found.is_some() {
            return found;
        }
        path.pop();
    }
    None
}

fn bad_value(value: &toml::Value, path: &mut Vec<String>) -> Option<(String, String)> {
    let field = || path.join(".");
    match value {
        toml::Value::Float(f) if !f.is_finite() => Some((
            field(),
            format!("{} must be a finite number (got {f})", field()),
        )),
        toml::Value::Datetime(d) => Some((
            field(),
            format!(
                "{}: a datetime is not valid here (got {d}); write a number or a quoted string",
                field()
            ),
        )),
        toml::Value::Table(table) => bad_parameter(table, path),
        toml::Value::Array(items) => items.iter().find_map(|item| bad_value(item, path)),
        _ => None,
    }
}

/// Why `value` is not a ZMQ address a subscriber can connect to, if it is not (empty is
/// allowed: none).
fn zmq_address_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return None;
    }
    let Some(rest) = value
        .strip_prefix("tcp://")
        .or_else(|| value.strip_prefix("ipc://"))
    else {
        return Some("must start with tcp:// or ipc:// (e.g. \"tcp://{host}:5557\")".into());
    };
    if rest.is_empty() || rest.contains('*') {
        return Some(
            "must name the publisher to connect to (a host and port, `{host}` for the \
             endpoint's host), not a wildcard"
                .into(),
        );
    }
    let mut placeholders = rest;
    while let Some(open) = placeholders.find('{') {
        let tail = &placeholders[open..];
        let close = tail.find('}')?;
        let name = &tail[..=close];
        if name != "{host}" && name != "{port}" {
            return Some(format!(
                "has the placeholder {name}; valid placeholders are {{host}} and {{port}}"
            ));
        }
        placeholders = &tail[close + 1..];
    }
    None
}
