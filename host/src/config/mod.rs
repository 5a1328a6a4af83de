//! The TOML pipeline configuration: its model, loading, and the first checks that need no
//! plugin (unknown keys, duplicate names, dangling references).
//!
//! Keys that belong to switchyard are snake_case; plugin `parameters` keep the reference
//! implementation's camelCase names so configs carry over. Paths are relative to the file.

mod error;
pub mod import;
pub mod locate;
mod values;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use switchyard_plugin_api::EndpointMetrics;

pub use error::ConfigError;
use locate::{line_of, Step};

/// The configuration file used when none is named.
pub const DEFAULT_CONFIG: &str = "configs/default.toml";

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Load plugin types of stability alpha.
    #[serde(default)]
    pub allow_experimental_plugins: bool,
    /// Load libraries whose file or directory is writable by group or others.
    #[serde(default)]
    pub allow_writable_libraries: bool,
    /// Plugin libraries: a bare name (`burst_prefix_cache_producer`) is looked up as
    /// `lib<name>.so` in the plugin directories; anything with a `/` or a file extension is a
    /// path relative to this file. An entry is a string, or a table that also pins the file's
    /// SHA-256 (`{ path = "...", sha256 = "..." }`).
    #[serde(default)]
    pub libraries: Vec<LibraryEntry>,
    /// Extra directories to search for libraries named by bare name, relative to this file.
    #[serde(default)]
    pub plugin_dirs: Vec<String>,
    #[serde(default)]
    pub endpoints: Vec<EndpointConfig>,
    #[serde(default)]
    pub plugins: Vec<PluginConfig>,
    #[serde(default)]
    pub profiles: Vec<ProfileConfig>,
    /// Live fleet: discovery file and model-server metrics scraping (`serve`, `ext-proc`).
    #[serde(default)]
    pub fleet: FleetConfig,
    /// The HTTP router (`serve`).
    #[serde(default)]
    pub serve: ServeConfig,
    /// KV-cache event subscriptions (`serve`, `ext-proc`; `docs/kv-events.md`).
    #[serde(default, skip_serializing_if = "KvEventsConfig::is_default")]
    pub kv_events: KvEventsConfig,
}

/// Where the live drivers subscribe to the engines' KV-cache events.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KvEventsConfig {
    /// Every endpoint's publisher, e.g. `tcp://{host}:5557` (`{host}` and `{port}` are the
    /// endpoint's); empty: only endpoints that name their own.
    pub endpoint: String,
    /// Every endpoint's replay socket, e.g. `tcp://{host}:5558`; empty: no replay.
    pub replay_endpoint: String,
    /// Topic prefix subscribed to; empty: every topic.
    pub topic: String,
    /// A replay that sends nothing for this long has failed.
    pub replay_timeout_ms: u64,
    /// Wait between connection attempts to a publisher.
    pub reconnect_ms: u64,
    /// Reconnect to a publisher that sent nothing for this long, so one that restarted is
    /// found again; 0: never.
    pub idle_reconnect_ms: u64,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        KvEventsConfig {
            endpoint: String::new(),
            replay_endpoint: String::new(),
            topic: String::new(),
            replay_timeout_ms: 2000,
            reconnect_ms: 1000,
            idle_reconnect_ms: 5000,
        }
    }
}

impl KvEventsConfig {
    fn is_default(&self) -> bool {
        *self == KvEventsConfig::default()
    }
}

/// One `libraries` entry: a bare name or a path, optionally with the SHA-256 the file must have.
#[derive(Debug, Clone, PartialEq)]
pub struct LibraryEntry {
    pub path: String,
    /// Lowercase hex, when pinned.
    pub sha256: Option<String>,
}

impl From<&str> for LibraryEntry {
    fn from(path: &str) -> Self {
        LibraryEntry {
            path: path.to_string(),
            sha256: None,
        }
    }
}

/// The table form of a library entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PinnedLibrary {
    path: String,
    #[serde(default)]
    sha256: Option<String>,
}

impl<'de> Deserialize<'de> for LibraryEntry {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = LibraryEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "a library name or path, or a table { path = \"...\", sha256 = \"...\" }",
                )
            }
            fn visit_str<E: serde::de::Error>(self, path: &str) -> Result<LibraryEntry, E> {
                Ok(LibraryEntry::from(path))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<LibraryEntry, A::Error> {
                let pinned =
                    PinnedLibrary::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(LibraryEntry {
                    path: pinned.path,
                    sha256: pinned.sha256,
                })
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl Serialize for LibraryEntry {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        match &self.sha256 {
            None => serializer.serialize_str(&self.path),
            Some(sha256) => {
                let mut table = serializer.serialize_struct("LibraryEntry", 2)?;
                table.serialize_field("path", &self.path)?;
                table.serialize_field("sha256", sha256)?;
                table.end()
            }
        }
    }
}

/// Where the live drivers find endpoints and how they keep their load facts fresh.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    /// A discovery file (YAML or JSON, `endpoints: [{name, namespace, address, port, labels}]`),
    /// watched for changes; relative to the config file. When set, `[[endpoints]]` must be empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discovery_file: Option<String>,
    /// How often each endpoint's `/metrics` is scraped; 0 turns scraping off.
    pub scrape_interval_ms: u64,
    /// A scrape that has not answered within this is a failure.
    pub scrape_timeout_ms: u64,
    /// Metrics older than this mark the endpoint stale.
    pub stale_after_ms: u64,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            discovery_file: None,
            scrape_interval_ms: 50,
            scrape_timeout_ms: 1000,
            stale_after_ms: 2000,
        }
    }
}

/// Upper bound of `[serve]`'s connection timeouts (one hour).
const MAX_CONNECTION_TIMEOUT_MS: u64 = 3_600_000;

/// The HTTP router's limits and behaviour.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServeConfig {
    /// Address the OpenAI-compatible API listens on (`--port` overrides the port).
    pub listen: String,
    /// Address of `/metrics`, `/health`, `/ready` (`--metrics-port` overrides the port).
    pub metrics_listen: String,
    /// Address of the admin API (decisions, plugin counters and state, config); loopback by
    /// default. Empty turns it off.
    pub admin_listen: String,
    /// Largest request body accepted; larger ones get 413.
    pub max_body_bytes: u64,
    /// Other candidates tried when an endpoint refuses the connection before the request was
    /// sent.
    pub max_retries: u32,
    /// Requests in flight per endpoint before new ones get 429; 0 means no limit.
    pub max_in_flight_per_endpoint: u32,
    /// Requests in flight in total before new ones get 429; 0 means no limit.
    pub max_in_flight: u32,
    /// A request whose response has not ended after this is cut and released; 0 means never.
    pub request_timeout_ms: u64,
    /// On SIGTERM/SIGINT, how long in-flight requests may take to finish.
    pub drain_timeout_ms: u64,
    /// Add `x-switchyard-decision` (the pick and the top scores) to every response.
    pub decision_header: bool,
    /// Decision records kept for the admin API.
    pub decision_records: usize,
    /// A request head must be complete this long after the connection opened, or after its
    /// first byte on a kept-alive connection.
    pub header_timeout_ms: u64,
    /// Longest pause between two pieces of a request body while the router reads it.
    pub body_idle_timeout_ms: u64,
    /// A kept-alive connection with no request under way is closed after this.
    pub keepalive_idle_timeout_ms: u64,
    /// Open connections on the API listener; past it new ones wait in the kernel's backlog.
    /// 0 derives it from the open-file limit.
    pub max_connections: usize,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            listen: "0.0.0.0:8080".into(),
            metrics_listen: "0.0.0.0:9090".into(),
            admin_listen: "127.0.0.1:9091".into(),
            max_body_bytes: 32 * 1024 * 1024,
            max_retries: 2,
            max_in_flight_per_endpoint: 0,
            max_in_flight: 0,
            request_timeout_ms: 600_000,
            drain_timeout_ms: 30_000,
            decision_header: false,
            decision_records: 1024,
            header_timeout_ms: 30_000,
            body_idle_timeout_ms: 30_000,
            keepalive_idle_timeout_ms: 75_000,
            max_connections: 0,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    /// `host:port` of the model server.
    pub address: String,
    /// The endpoint's role label (e.g. `decode`), empty when none.
    #[serde(default)]
    pub role: String,
    /// Load facts for offline use (replay, check); live drivers scrape them.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Free-form labels; `llm-d.ai/engine-type` (`vllm`, default, or `sglang`) selects the
    /// metric names scraped.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// This endpoint's KV-event publisher, instead of `[kv_events] endpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_events_endpoint: Option<String>,
    /// This endpoint's KV-event replay socket, instead of `[kv_events] replay_endpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_replay_endpoint: Option<String>,
}

impl EndpointConfig {
    /// The endpoint's identity, `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    pub running_requests: u32,
    pub waiting_requests: u32,
    pub kv_cache_usage: f64,
    pub cache_block_size: u32,
    pub cache_num_blocks: u64,
}

impl From<MetricsConfig> for EndpointMetrics {
    fn from(m: MetricsConfig) -> Self {
        EndpointMetrics {
            running_requests: m.running_requests,
            waiting_requests: m.waiting_requests,
            kv_cache_usage: m.kv_cache_usage,
            cache_block_size: m.cache_block_size,
            cache_num_blocks: m.cache_num_blocks,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    #[serde(rename = "type")]
    pub type_name: String,
    /// Instance name; defaults to the type.
    #[serde(default)]
    pub name: String,
    /// Handed to the plugin as JSON; the plugin decodes it strictly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<toml::Table>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProfileConfig {
    pub name: String,
    /// Filter instance names, run in this order.
    #[serde(default)]
    pub filters: Vec<String>,
    #[serde(default)]
    pub scorers: Vec<WeightedScorer>,
    /// The picker instance; `max-score-picker` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub picker: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WeightedScorer {
    pub plugin: String,
    #[serde(default = "default_weight")]
    pub weight: f64,
}

fn default_weight() -> f64 {
    1.0
}

/// A parsed config file, with its text kept for locating errors.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub path: PathBuf,
    pub source: String,
    pub config: Config,
}

impl LoadedConfig {
    pub fn read(path: &Path) -> Result<LoadedConfig, ConfigError> {
        let source = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(path, format!("cannot read the config file: {e}")))?;
        Self::parse(path, source)
    }

    pub fn parse(path: &Path, source: String) -> Result<LoadedConfig, ConfigError> {
        let config: Config = toml::from_str(&source).map_err(|e| {
            let line = e.span().map(|s| locate::line_at(&source, s.start));
            let written = e.span().and_then(|s| source.get(s)).unwrap_or("");
            ConfigError::new(path, toml_message(e.message(), written)).at_line(line)
        })?;
        let mut loaded = LoadedConfig {
            path: path.to_path_buf(),
            source,
            config,
        };
        loaded.apply_defaults();
        loaded.check_values()?;
        loaded.check_names()?;
        Ok(loaded)
    }

    /// The directory relative paths are resolved against.
    pub fn base_dir(&self) -> PathBuf {
        match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }

    /// The line of `plugins[index]`, or of one of its parameters.
    pub fn plugin_line(&self, index: usize, parameter: Option<&str>) -> Option<usize> {
        let mut path = vec![Step::Key("plugins"), Step::Index(index)];
        if let Some(parameter) = parameter.filter(|p| !p.is_empty()) {
            path.push(Step::Key("parameters"));
            // A dotted path names a nested parameter.
            path.extend(parameter.split('.').map(Step::Key));
        }
        line_of(&self.source, &path)
    }

    pub fn profile_line(&self, index: usize, key: Option<&str>) -> Option<usize> {
        let mut path = vec![Step::Key("profiles"), Step::Index(index)];
        if let Some(key) = key {
            path.push(Step::Key(key));
        }
        line_of(&self.source, &path)
    }

    /// The line of `libraries[index]`.
    pub fn library_line(&self, index: usize) -> Option<usize> {
        line_of(&self.source, &[Step::Key("libraries"), Step::Index(index)])
    }

    pub fn key_line(&self, key: &str) -> Option<usize> {
        line_of(&self.source, &[Step::Key(key)])
    }

    fn apply_defaults(&mut self) {
        for plugin in &mut self.config.plugins {
            if plugin.name.is_empty() {
                plugin.name = plugin.type_name.clone();
            }
        }
    }

    fn check_names(&self) -> Result<(), ConfigError> {
        for (index, plugin) in self.config.plugins.iter().enumerate() {
            if plugin.type_name.trim().is_empty() {
                return Err(
                    ConfigError::new(&self.path, "a plugin needs a non-empty `type`")
                        .at_line(self.plugin_line(index, None)),
                );
            }
        }
        let plugins = self.config.plugins.iter().map(|p| p.name.clone());
        self.refuse_repeats("plugins", plugins, |name, first| {
            format!(
                "duplicate plugin name {name}, first used on {first}: every [[plugins]] entry \
                 needs its own `name` (it defaults to the type); rename one or remove it"
            )
        })?;
        let endpoints = self.config.endpoints.iter().map(EndpointConfig::id);
        self.refuse_repeats("endpoints", endpoints, |id, first| {
            format!(
                "duplicate endpoint {id} (namespace/name), first given on {first}: every \
                 endpoint needs its own name within its namespace; rename one or remove it"
            )
        })?;
        let profiles = self.config.profiles.iter().map(|p| p.name.clone());
        self.refuse_repeats("profiles", profiles, |name, first| {
            format!("duplicate profile name {name}, first used on {first}; rename one or remove it")
        })?;
        if self.config.profiles.len() > 1 {
            return Err(ConfigError::new(
                &self.path,
                format!(
                    "{} [[profiles]] given; switchyard runs exactly one scheduling profile per \
                     pipeline: merge them or run one config per profile",
                    self.config.profiles.len()
                ),
            )
            .at_line(self.profile_line(1, None)));
        }
        Ok(())
    }

    /// Refuses the second entry of `table` with a name already used by an earlier one, citing
    /// both lines; `message` gets the shown name and where it was first used.
    fn refuse_repeats(
        &self,
        table: &str,
        names: impl Iterator<Item = String>,
        message: impl Fn(&str, &str) -> String,
    ) -> Result<(), ConfigError> {
        let mut seen = std::collections::HashMap::new();
        for (index, name) in names.enumerate() {
            if let Some(first) = seen.insert(name.clone(), index) {
                let line = |i: usize| line_of(&self.source, &[Step::Key(table), Step::Index(i)]);
                let first = match line(first) {
                    Some(n) => format!("line {n}"),
                    None => format!("{table}[{first}]"),
                };
                return Err(
                    ConfigError::new(&self.path, message(&values::shown(&name), &first))
                        .at_line(line(index)),
                );
            }
        }
        Ok(())
    }

    /// The line of `table.key` (or of the table when the key is absent).
    pub fn table_line(&self, table: &str, key: &str) -> Option<usize> {
        line_of(&self.source, &[Step::Key(table), Step::Key(key)])
    }

    /// Checks `[serve]` for the live router: addresses that parse and limits in range.
    pub fn check_serve(&self) -> Result<(), ConfigError> {
        let serve = &self.config.serve;
        let error = |key: &str, message: String| {
            ConfigError::new(&self.path, message)
                .field(format!("serve.{key}"))
                .at_line(self.table_line("serve", key))
        };
        for (key, value, may_be_empty) in [
            ("listen", &serve.listen, false),
            ("metrics_listen", &serve.metrics_listen, false),
            ("admin_listen", &serve.admin_listen, true),
        ] {
            if may_be_empty && value.is_empty() {
                continue;
            }
            if value.parse::<std::net::SocketAddr>().is_err() {
                return Err(error(
                    key,
                    format!(
                        "serve.{key} must be an IP address and port like 127.0.0.1:8080{} (got {value:?})",
                        if may_be_empty { ", or \"\" to turn it off" } else { "" }
                    ),
                ));
            }
        }
        if serve.max_body_bytes == 0 {
            return Err(error(
                "max_body_bytes",
                "serve.max_body_bytes must be at least 1 (got 0)".into(),
            ));
        }
        if serve.max_retries > 16 {
            return Err(error(
                "max_retries",
                format!(
                    "serve.max_retries must be in 0..=16 (got {})",
                    serve.max_retries
                ),
            ));
        }
        if serve.decision_records > 1_000_000 {
            return Err(error(
                "decision_records",
                format!(
                    "serve.decision_records must be in 0..=1000000 (got {})",
                    serve.decision_records
                ),
            ));
        }
        for (key, value) in [
            ("header_timeout_ms", serve.header_timeout_ms),
            ("body_idle_timeout_ms", serve.body_idle_timeout_ms),
            ("keepalive_idle_timeout_ms", serve.keepalive_idle_timeout_ms),
        ] {
            if !(1..=MAX_CONNECTION_TIMEOUT_MS).contains(&value) {
                return Err(error(
                    key,
                    format!("serve.{key} must be in 1..={MAX_CONNECTION_TIMEOUT_MS} (got {value})"),
                ));
            }
        }
        if serve.max_connections > 1_000_000 {
            return Err(error(
                "max_connections",
                format!(
                    "serve.max_connections must be in 0..=1000000, 0 for one derived from the \
                     open-file limit (got {})",
                    serve.max_connections
                ),
            ));
        }
        Ok(())
    }

    /// Resolves a library entry to the file to load.
    pub fn library_candidates(&self, entry: &str, extra_dirs: &[PathBuf]) -> Vec<PathBuf> {
        let base = self.base_dir();
        if is_library_path(entry) {
            return vec![base.join(entry)];
        }
        let mut dirs: Vec<PathBuf> = extra_dirs.to_vec();
        dirs.extend(self.config.plugin_dirs.iter().map(|d| base.join(d)));
        bare_library_candidates(entry, dirs)
    }
}

/// Where a library named by bare name is looked for, in order: `dirs`, then the directory of
/// the running binary.
pub fn bare_library_candidates(name: &str, mut dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    let file = library_file_name(name);
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
    {
        dirs.push(exe_dir.clone());
        // Test and bench binaries live one level below the profile directory.
        if exe_dir.ends_with("deps") {
            if let Some(parent) = exe_dir.parent() {
                dirs.push(parent.to_path_buf());
            }
        }
    }
    dirs.into_iter().map(|d| d.join(&file)).collect()
}

/// Whether a `libraries` entry is a path (else a bare library name).
pub fn is_library_path(entry: &str) -> bool {
    entry.contains('/') || Path::new(entry).extension().is_some()
}

/// `lib<name>.so`, `lib<name>.dylib` or `<name>.dll`.
pub fn library_file_name(name: &str) -> String {
    format!(
        "{}{}{}",
        std::env::consts::DLL_PREFIX,
        name,
        std::env::consts::DLL_SUFFIX
    )
}

/// The TOML library's message in the words of this file's other errors: a datetime where a
/// number or string belongs is called a datetime (the library calls it a map).
fn toml_message(message: &str, written: &str) -> String {
    let message = message.trim();
    let looks_like_datetime = {
        let b = written.trim().as_bytes();
        (b.len() >= 10 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-')
            || (b.len() >= 8 && b[..2].iter().all(u8::is_ascii_digit) && b[2] == b':')
    };
    if looks_like_datetime && message.starts_with("invalid type: map") {
        let expected = message
            .split_once(", expected ")
            .map_or(String::new(), |(_, e)| format!(" (expected {e})"));
        return format!("a datetime is not valid here{expected}; quote it if it is meant as text");
    }
    if let Some(rest) = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))
    {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            return mistyped(found, expected);
        }
    }
    let syntax = [
        "unclosed",
        "expected",
        "invalid table header",
        "invalid key",
        "invalid string",
    ];
    if syntax.iter().any(|p| message.starts_with(p)) {
        return format!("TOML syntax: {message}");
    }
    message.to_string()
}

/// "this is a string ("high"), but a number is expected here" for serde's
/// "string \"high\", expected f64".
fn mistyped(found: &str, expected: &str) -> String {
    let (kind, value) = match found.split_once(' ') {
        Some((kind, value)) if !kind.is_empty() => (kind, value.trim()),
        _ => (found, ""),
    };
    let kind = match kind {
        "string" => "a string",
        "integer" => "an integer",
        "floating" => "a number",
        "boolean" => "a boolean",
        "map" => "a table",
        "sequence" => "an array",
        other => other,
    };
    let value = value
        .trim_start_matches("point ")
        .trim_matches('`')
        .to_string();
    let wanted = match expected.trim() {
        "f64" | "f32" => "a number".to_string(),
        "u8" => "a whole number in 0..=255".to_string(),
        "u16" => "a whole number in 0..=65535".to_string(),
        "u32" => format!("a whole number in 0..={}", u32::MAX),
        "u64" | "usize" => format!("a whole number in 0..={}", u64::MAX),
        "i64" => "a whole number".to_string(),
        "a boolean" | "bool" => "true or false".to_string(),
        other => other.to_string(),
    };
    if value.is_empty() {
        format!("this is {kind}, but {wanted} is expected here")
    } else {
        format!("this is {kind} ({value}), but {wanted} is expected here")
    }
}

/// Converts plugin parameters to the JSON the plugin decodes.
pub fn parameters_json(parameters: &Option<toml::Table>) -> String {
    match parameters {
        None => "null".to_string(),
        Some(table) => serde_json::to_string(table).unwrap_or_else(|_| "null".to_string()),
    }
}

#[cfg(test)]
mod message_tests {
    use super::toml_message;

    #[test]
    fn serde_type_errors_are_rephrased() {
        assert_eq!(
            toml_message(r#"invalid type: string "high", expected f64"#, "\"high\""),
            r#"this is a string ("high"), but a number is expected here"#
        );
        assert_eq!(
            toml_message("invalid type: floating point `1e30`, expected u32", "1e30"),
            "this is a number (1e30), but a whole number in 0..=4294967295 is expected here"
        );
        assert_eq!(
            toml_message("invalid type: map, expected a string", "{ a = 1 }"),
            "this is a table, but a string is expected here"
        );
        assert_eq!(
            toml_message("invalid value: integer `-1`, expected u32", "-1"),
            "this is an integer (-1), but a whole number in 0..=4294967295 is expected here"
        );
        assert_eq!(
            toml_message("unclosed array table, expected `]`", "[[plugins"),
            "TOML syntax: unclosed array table, expected `]`"
        );
        assert_eq!(
            toml_message("missing field `type`", ""),
            "missing field `type`"
        );
    }
}

#[cfg(test)]
mod serve_tests {
    use super::*;

    fn check(text: &str) -> Result<(), ConfigError> {
        LoadedConfig::parse(Path::new("live.toml"), text.to_string())?.check_serve()
    }

    #[test]
    fn serve_defaults_pass() {
        assert_eq!(check(""), Ok(()));
        assert_eq!(check("[serve]\nadmin_listen = \"\"\n"), Ok(()));
    }

    #[test]
    fn serve_mistakes_name_the_line_key_and_value() {
        let error = check("[serve]\nmax_retries = 1\nlisten = \"localhost:80\"\n")
            .expect_err("refused")
            .to_string();
        assert!(
            error.starts_with("live.toml:3: serve.listen must be an IP address and port"),
            "{error}"
        );
        assert!(error.contains("\"localhost:80\""), "{error}");
        let error = check("[serve]\nmax_body_bytes = 0\n")
            .expect_err("refused")
            .to_string();
        assert_eq!(
            error,
            "live.toml:2: serve.max_body_bytes must be at least 1 (got 0)"
        );
        let error = check("[serve]\ndecision_records = 2000000\n")
            .expect_err("refused")
            .to_string();
        assert!(error.contains("0..=1000000 (got 2000000)"), "{error}");
        let error = check("[serve]\nheader_timeout_ms = 0\n")
            .expect_err("refused")
            .to_string();
        assert_eq!(
            error,
            "live.toml:2: serve.header_timeout_ms must be in 1..=3600000 (got 0)"
        );
        let error = check("[serve]\n\nkeepalive_idle_timeout_ms = 3600001\n")
            .expect_err("refused")
            .to_string();
        assert!(
            error.starts_with("live.toml:3: serve.keepalive_idle_timeout_ms must be in 1..="),
            "{error}"
        );
        let error = check("[serve]\nmax_connections = 2000000\n")
            .expect_err("refused")
            .to_string();
        assert!(error.contains("(got 2000000)"), "{error}");
        let unknown = check("[serve]\nport = 80\n")
            .expect_err("refused")
            .to_string();
        assert!(unknown.contains("port"), "{unknown}");
    }
}
