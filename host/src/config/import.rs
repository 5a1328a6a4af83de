//! `switchyard config import`: turns the reference endpoint picker's `EndpointPickerConfig`
//! YAML into a switchyard TOML pipeline.
//!
//! Plugin types, instance names, parameter names and values, and the profile's plugin order
//! and weights carry over unchanged wherever switchyard has the same plugin type (built in, or
//! in the plugin libraries it ships). File discovery becomes `[fleet] discovery_file`.
//! Everything else — unknown types, profile handlers, parsers, data sources, feature gates,
//! flow control, the saturation detector, parameters a switchyard plugin does not have — is
//! written as a `# not mapped:` comment that says what it was and why it was left out. The
//! result is then built as a pipeline, so an import that cannot run says so.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::path::Path;

use serde::de::{self, Deserializer};
use serde::Deserialize;
use serde_norway::Value as Yaml;
use switchyard_plugin_api::{keys, PluginKind, Stability};

use super::{ConfigError, LoadedConfig};
use crate::pipeline::{build, load_registry, Options};
use crate::plugins::Registry;

/// The plugin libraries switchyard ships, looked up like a config's bare library names.
pub const STANDARD_LIBRARIES: &[&str] = &[
    "burst_prefix_cache_producer",
    "prefix_cache_affinity_filter",
    "prefix_cache_scorer",
    "approx_prefix_cache_producer",
];

/// The `apiVersion`s of the reference's config format.
const API_VERSIONS: &[&str] = &[
    "llm-d.ai/v1alpha1",
    "llm-d.ai/v1",
    "inference.networking.x-k8s.io/v1alpha1",
];

/// The marker every comment about something left out starts with.
pub const NOT_MAPPED: &str = "# not mapped:";

/// What the import produced.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The TOML text, best effort when `problem` is set.
    pub toml: String,
    /// How many `# not mapped:` comments the text holds.
    pub not_mapped: usize,
    /// Why the result is not a valid pipeline, when it is not.
    pub problem: Option<String>,
}

/// Choices the YAML cannot make by itself.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Which scheduling profile to import when the file has several.
    pub profile: Option<String>,
    /// Where the plugin libraries are looked up (as for `check`).
    pub plugin_dirs: Vec<std::path::PathBuf>,
    /// Where the TOML goes, to name it in messages about its lines (standard output when
    /// none).
    pub output: Option<std::path::PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct EppConfig {
    // Checked while reading; nothing else depends on them.
    #[serde(rename = "apiVersion", deserialize_with = "api_version")]
    _api_version: String,
    #[serde(rename = "kind", deserialize_with = "kind")]
    _kind: String,
    #[serde(default)]
    feature_gates: Option<Vec<String>>,
    #[serde(default)]
    plugins: Vec<PluginSpec>,
    #[serde(default)]
    scheduling_profiles: Vec<ProfileSpec>,
    #[serde(default)]
    data_layer: Option<Yaml>,
    #[serde(default)]
    flow_control: Option<Yaml>,
    #[serde(default)]
    request_handler: Option<Yaml>,
    #[serde(default)]
    saturation_detector: Option<Yaml>,
    #[serde(default)]
    parser: Option<Yaml>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PluginSpec {
    #[serde(default)]
    name: Option<String>,
    #[serde(rename = "type", deserialize_with = "non_empty")]
    type_name: String,
    #[serde(default, deserialize_with = "parameters")]
    parameters: Option<Yaml>,
}

impl PluginSpec {
    fn instance_name(&self) -> &str {
        match self.name.as_deref() {
            Some(name) if !name.is_empty() => name,
            _ => &self.type_name,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileSpec {
    #[serde(deserialize_with = "non_empty")]
    name: String,
    #[serde(default)]
    plugins: Vec<ProfileRef>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ProfileRef {
    #[serde(deserialize_with = "non_empty")]
    plugin_ref: String,
    #[serde(default)]
    weight: Option<f64>,
}

/// Reads a string and checks it while the deserializer still knows where it is, so a refusal
/// carries the value's line.
struct CheckedStr(fn(&str) -> Result<(), String>);

impl<'de> de::Visitor<'de> for CheckedStr {
    type Value = String;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<String, E> {
        (self.0)(value).map_err(E::custom)?;
        Ok(value.to_string())
    }
}

fn api_version<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    deserializer.deserialize_str(CheckedStr(|value| {
        if API_VERSIONS.contains(&value) {
            Ok(())
        } else {
            Err(format!(
                "must be one of {} (got \"{value}\")",
                API_VERSIONS.join(", ")
            ))
        }
    }))
}

fn kind<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    deserializer.deserialize_str(CheckedStr(|value| {
        if value == "EndpointPickerConfig" {
            Ok(())
        } else {
            Err(format!(
                "must be EndpointPickerConfig (got \"{value}\"); only endpoint picker \
                 configs can be imported"
            ))
        }
    }))
}

/// A plugin's `parameters`: a mapping, or nothing.
fn parameters<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Yaml>, D::Error> {
    struct Parameters;

    impl<'de> de::Visitor<'de> for Parameters {
        type Value = Option<Yaml>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a mapping of parameter names to values")
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            Yaml::deserialize(de::value::MapAccessDeserializer::new(map)).map(Some)
        }
    }

    deserializer.deserialize_any(Parameters)
}

fn non_empty<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    deserializer.deserialize_str(CheckedStr(|value| {
        if value.trim().is_empty() {
            Err("must not be empty".into())
        } else {
            Ok(())
        }
    }))
}

/// Parses the YAML, naming the file and line of the first problem.
fn parse(file: &Path, text: &str) -> Result<EppConfig, ConfigError> {
    if text.trim().is_empty() {
        return Err(ConfigError::new(
            file,
            "the file is empty; an EndpointPickerConfig needs at least `apiVersion`, `kind` and \
             `plugins`",
        ));
    }
    serde_norway::from_str(text).map_err(|error| {
        let mut message = error.to_string();
        let line = error.location().map(|l| l.line());
        if let Some(location) = error.location() {
            let suffix = format!(" at line {} column {}", location.line(), location.column());
            if let Some(stripped) = message.strip_suffix(&suffix) {
                message = stripped.to_string();
            }
        }
        ConfigError::new(file, message).at_line(line)
    })
}

/// The line of the second `name: <name>` in the text, where a duplicate name is given
/// explicitly.
fn second_name_line(text: &str, name: &str) -> Option<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let line = line.trim_start().trim_start_matches("- ").trim();
            line.strip_prefix("name:")
                .is_some_and(|value| value.trim().trim_matches(|c| c == '"' || c == '\'') == name)
        })
        .nth(1)
        .map(|(index, _)| index + 1)
}

/// A reason for leaving out a plugin type that has no switchyard equivalent.
fn unmapped_type_reason(type_name: &str) -> String {
    match type_name {
        "single-profile-handler" => "switchyard runs exactly one scheduling profile per pipeline, \
                                     which is what this handler does; no handler is needed"
            .into(),
        "header-profile-handler"
        | "disagg-profile-handler"
        | "pd-profile-handler"
        | "data-parallel-profile-handler" => "a profile handler chooses among several \
                                              scheduling profiles; switchyard runs exactly one \
                                              profile per pipeline"
            .into(),
        "openai-parser" | "anthropic-parser" | "vllmhttp-parser" | "vllmgrpc-parser"
        | "passthrough-parser" => "request parsing is built into switchyard's drivers (OpenAI \
                                   completions and chat, /inference/v1/generate with token_ids); \
                                   there are no parser plugins"
            .into(),
        "decode-filter" => "switchyard has no role filter; the reference's decode-filter keeps \
                            endpoints whose llm-d.ai/role label is decode, prefill-decode, both \
                            or encode-prefill-decode, or that have no role label, so in a fleet \
                            without roles it keeps every endpoint"
            .into(),
        "models-responder" => "`switchyard serve` answers GET /v1/models itself".into(),
        "metrics-data-source" | "core-metrics-extractor" => "switchyard scrapes each endpoint's \
                                                              /metrics itself ([fleet] \
                                                              scrape_interval_ms); there are no \
                                                              data-source plugins"
            .into(),
        _ => format!(
            "switchyard has no plugin type '{type_name}' (neither built in nor in the plugin \
             libraries it ships)"
        ),
    }
}

/// One line of YAML for a comment.
fn yaml_inline(value: &Yaml) -> String {
    match value {
        Yaml::Null => "null".into(),
        Yaml::Bool(b) => b.to_string(),
        Yaml::Number(n) => n.to_string(),
        Yaml::String(s) => serde_json::to_string(s).unwrap_or_else(|_| s.clone()),
        Yaml::Sequence(items) => format!(
            "[{}]",
            items.iter().map(yaml_inline).collect::<Vec<_>>().join(", ")
        ),
        Yaml::Mapping(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("{}: {}", yaml_inline(k), yaml_inline(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Yaml::Tagged(tagged) => format!("{} {}", tagged.tag, yaml_inline(&tagged.value)),
    }
}

/// The TOML form of a YAML value; `Err` says why there is none.
fn to_toml(value: &Yaml) -> Result<toml::Value, String> {
    Ok(match value {
        Yaml::Null => return Err("null has no TOML form".into()),
        Yaml::Bool(b) => toml::Value::Boolean(*b),
        Yaml::Number(n) => {
            if let Some(i) = n.as_i64() {
                toml::Value::Integer(i)
            } else if let Some(f) = n.as_f64().filter(|_| !n.is_u64()) {
                toml::Value::Float(f)
            } else {
                return Err(format!("{n} does not fit a TOML integer"));
            }
        }
        Yaml::String(s) => toml::Value::String(s.clone()),
        Yaml::Sequence(items) => {
            toml::Value::Array(items.iter().map(to_toml).collect::<Result<_, _>>()?)
        }
        Yaml::Mapping(map) => {
            let mut table = toml::Table::new();
            for (k, v) in map {
                let Yaml::String(key) = k else {
                    return Err(format!("the key {} is not a string", yaml_inline(k)));
                };
                table.insert(key.clone(), to_toml(v)?);
            }
            toml::Value::Table(table)
        }
        Yaml::Tagged(tagged) => {
            return Err(format!("the YAML tag {} has no TOML form", tagged.tag))
        }
    })
}

/// A TOML key, quoted when it is not bare.
fn toml_key(key: &str) -> String {
    if !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        key.to_string()
    } else {
        toml::Value::String(key.to_string()).to_string()
    }
}

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// A plugin that maps to a switchyard type.
struct Mapped {
    name: String,
    type_name: String,
    kind: PluginKind,
    alpha: bool,
    parameters: Vec<(String, toml::Value)>,
    /// Comments written inside the entry: parameters left out, notes.
    comments: Vec<String>,
}

/// One `[[plugins]]` entry or a comment in its place, in the YAML's order.
enum Entry {
    Plugin(Mapped),
    Comment(Vec<String>),
}

impl Entry {
    fn render(&self, toml: &mut String) {
        match self {
            Entry::Comment(lines) => {
                for line in lines {
                    let _ = writeln!(toml, "{line}");
                }
            }
            Entry::Plugin(plugin) => {
                let _ = writeln!(toml, "[[plugins]]");
                let _ = writeln!(toml, "name = {}", toml_str(&plugin.name));
                let _ = writeln!(toml, "type = {}", toml_str(&plugin.type_name));
                if !plugin.parameters.is_empty() {
                    let _ = writeln!(toml, "[plugins.parameters]");
                    for (key, value) in &plugin.parameters {
                        let _ = writeln!(toml, "{} = {value}", toml_key(key));
                    }
                }
                for line in &plugin.comments {
                    let _ = writeln!(toml, "{line}");
                }
            }
        }
    }
}

/// Counts the `# not mapped:` comments as they are made.
#[derive(Default)]
struct Out {
    not_mapped: usize,
}

impl Out {
    /// A `# not mapped:` comment, with the original YAML on the following lines when given.
    fn not_mapped(&mut self, what: &str, why: &str, yaml: Option<&Yaml>) -> Vec<String> {
        self.not_mapped += 1;
        let mut lines = vec![format!("{NOT_MAPPED} {what}: {why}")];
        if let Some(yaml) = yaml {
            lines.push(format!("#   was: {}", yaml_inline(yaml)));
        }
        lines
    }
}

/// Loads the built-in types and the standard libraries; returns the registry and the library
/// each library type comes from.
fn standard_registry(
    options: &ImportOptions,
) -> Result<(Registry, BTreeMap<String, String>), String> {
    let mut registry = Registry::with_builtins();
    let mut library_of = BTreeMap::new();
    let anchor =
        LoadedConfig::parse(Path::new("import.toml"), String::new()).map_err(|e| e.to_string())?;
    for library in STANDARD_LIBRARIES {
        let before: BTreeSet<String> = registry
            .type_names()
            .into_iter()
            .map(String::from)
            .collect();
        let candidates = anchor.library_candidates(library, &options.plugin_dirs);
        registry
            .load_library(library, &candidates, false, &Default::default())
            .map_err(|e| {
                format!("the import needs switchyard's plugin libraries to know their types: {e}")
            })?;
        for name in registry.type_names() {
            if !before.contains(name) {
                library_of.insert(name.to_string(), library.to_string());
            }
        }
    }
    Ok((registry, library_of))
}

/// Imports `text`, read from `file` (named as the user gave it).
pub fn import(file: &Path, text: &str, options: &ImportOptions) -> Result<Imported, ConfigError> {
    let epp = parse(file, text)?;
    check_names(file, text, &epp)?;
    let (registry, library_of) =
        standard_registry(options).map_err(|e| ConfigError::new(file, e))?;
    let mut out = Out::default();
    let mut problems: Vec<String> = Vec::new();

    let discovery_ref = epp
        .data_layer
        .as_ref()
        .and_then(|layer| layer.get("discovery"))
        .and_then(|d| d.get("pluginRef"))
        .and_then(Yaml::as_str);
    let mut general = data_layer_comments(&mut out, &epp, discovery_ref);
    general.extend(top_level_comments(&mut out, &epp));

    let mut entries = Vec::new();
    let mut discovery_file = None;
    for spec in &epp.plugins {
        if spec.type_name == "file-discovery" && discovery_ref == Some(spec.instance_name()) {
            match discovery(&mut out, spec) {
                Ok(found) => discovery_file = Some(found),
                Err(lines) => {
                    problems.push(format!(
                        "plugin '{}' (type file-discovery) has no `path`",
                        spec.instance_name()
                    ));
                    entries.push(Entry::Comment(lines));
                }
            }
            continue;
        }
        entries.push(map_plugin(&mut out, &registry, spec));
    }

    let plugins: Vec<&Mapped> = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Plugin(m) => Some(m),
            Entry::Comment(_) => None,
        })
        .collect();
    let profile = profile(&mut out, &epp, &plugins, options, &mut problems);
    let libraries = libraries(&registry, &library_of, &plugins);

    let mut toml = String::new();
    let _ = writeln!(
        toml,
        "# Imported from {} by `switchyard config import`.",
        file.display()
    );
    let _ = writeln!(
        toml,
        "# Parameter names and values, plugin names, and the profile's order and weights are \
         the\n# reference's. Lines starting with \"{NOT_MAPPED}\" say what was left out, and why.\n"
    );
    let alpha: BTreeSet<&str> = plugins
        .iter()
        .filter(|p| p.alpha)
        .map(|p| p.type_name.as_str())
        .collect();
    if !alpha.is_empty() {
        let alpha: Vec<&str> = alpha.into_iter().collect();
        let _ = writeln!(
            toml,
            "# {} {} alpha (experimental); the reference needs --allow-experimental-plugins \
             too.\nallow_experimental_plugins = true\n",
            alpha.join(", "),
            if alpha.len() == 1 { "is" } else { "are" },
        );
    }
    if !libraries.is_empty() {
        let _ = writeln!(toml, "libraries = [");
        for (library, note) in &libraries {
            let _ = match note {
                Some(note) => writeln!(toml, "    {},  # {note}", toml_str(library)),
                None => writeln!(toml, "    {},", toml_str(library)),
            };
        }
        let _ = writeln!(toml, "]\n");
    }
    match &discovery_file {
        Some((path, notes)) => {
            let _ = writeln!(toml, "[fleet]");
            for note in notes {
                let _ = writeln!(toml, "{note}");
            }
            let _ = writeln!(toml, "discovery_file = {}\n", toml_str(path));
        }
        None => {
            let _ = writeln!(
                toml,
                "# No file discovery: the reference then watches an InferencePool through the \
                 Kubernetes API,\n# which switchyard does not. List the model servers in \
                 [[endpoints]] or set [fleet] discovery_file.\n"
            );
        }
    }
    if !general.is_empty() {
        for line in &general {
            let _ = writeln!(toml, "{line}");
        }
        toml.push('\n');
    }
    for entry in &entries {
        entry.render(&mut toml);
        toml.push('\n');
    }
    toml.push_str(&profile);
    while toml.ends_with("\n\n") {
        toml.pop();
    }

    if problems.is_empty() {
        if let Err(error) = validate(&toml, options) {
            problems.push(error);
        }
    }
    Ok(Imported {
        toml,
        not_mapped: out.not_mapped,
        problem: (!problems.is_empty()).then(|| problems.join("; ")),
    })
}

/// Refuses a plugin name given twice, as the reference does.
fn check_names(file: &Path, text: &str, epp: &EppConfig) -> Result<(), ConfigError> {
    let mut seen = BTreeSet::new();
    for (index, plugin) in epp.plugins.iter().enumerate() {
        if !seen.insert(plugin.instance_name()) {
            return Err(ConfigError::new(
                file,
                format!(
                    "duplicate plugin name '{}': every plugin needs its own `name` (it defaults \
                     to the type)",
                    plugin.instance_name()
                ),
            )
            .at_line(second_name_line(text, plugin.instance_name()))
            .field(format!("plugins[{index}].name")));
        }
    }
    Ok(())
}

/// Comments for the `dataLayer` settings, except a discovery reference to a file-discovery
/// plugin (which becomes `[fleet] discovery_file`).
fn data_layer_comments(out: &mut Out, epp: &EppConfig, discovery_ref: Option<&str>) -> Vec<String> {
    let file_discovery_named = epp
        .plugins
        .iter()
        .any(|p| p.type_name == "file-discovery" && discovery_ref == Some(p.instance_name()));
    let mut lines = Vec::new();
    let Some(layer) = epp.data_layer.as_ref().and_then(Yaml::as_mapping) else {
        return lines;
    };
    for (key, value) in layer {
        let key = key.as_str().unwrap_or_default();
        if key == "discovery" && file_discovery_named {
            continue;
        }
        let why = match key {
            "discovery" => {
                "it does not name a file-discovery plugin of this file; switchyard finds \
                 endpoints in [[endpoints]] or a discovery file ([fleet] discovery_file) only"
            }
            "sources" => {
                "switchyard scrapes each endpoint's /metrics itself ([fleet] \
                 scrape_interval_ms); data sources and extractors are not plugins"
            }
            "injectDefaults" => "switchyard has no data-source plugins to inject",
            _ => "switchyard has no equivalent of this data-layer setting",
        };
        lines.extend(out.not_mapped(&format!("dataLayer.{key}"), why, Some(value)));
    }
    lines
}

/// Comments for the feature gates, flow control, saturation detector and parsers.
fn top_level_comments(out: &mut Out, epp: &EppConfig) -> Vec<String> {
    let mut lines = Vec::new();
    for gate in epp.feature_gates.iter().flatten() {
        lines.extend(out.not_mapped(
            &format!("feature gate '{gate}'"),
            "switchyard has no feature gates",
            None,
        ));
    }
    let parsing = "request parsing is built into switchyard's drivers; there are no parser plugins";
    for (key, value, why) in [
        (
            "flowControl",
            &epp.flow_control,
            "switchyard has no flow control (request queueing by priority and fairness); \
             [serve] max_in_flight and max_in_flight_per_endpoint are its only admission limits",
        ),
        (
            "saturationDetector",
            &epp.saturation_detector,
            "switchyard has no saturation detector",
        ),
        ("requestHandler", &epp.request_handler, parsing),
        ("parser", &epp.parser, parsing),
    ] {
        if let Some(value) = value {
            lines.extend(out.not_mapped(key, why, Some(value)));
        }
    }
    lines
}

/// A plugin of a type switchyard has, with the parameters it has; otherwise a comment.
fn map_plugin(out: &mut Out, registry: &Registry, spec: &PluginSpec) -> Entry {
    let name = spec.instance_name().to_string();
    if spec.type_name == "file-discovery" {
        return Entry::Comment(out.not_mapped(
            &format!("plugin '{name}' (type file-discovery)"),
            "not named by dataLayer.discovery, so the reference does not use it for discovery \
             either",
            spec.parameters.as_ref(),
        ));
    }
    let (type_name, alias_note) = match spec.type_name.as_str() {
        "tokenizer" => (
            "token-producer",
            Some("# type 'tokenizer' is the reference's deprecated name of token-producer"),
        ),
        other => (other, None),
    };
    let Some(plugin_type) = registry.get(type_name) else {
        return Entry::Comment(out.not_mapped(
            &format!("plugin '{name}' (type {})", spec.type_name),
            &unmapped_type_reason(&spec.type_name),
            spec.parameters.as_ref(),
        ));
    };
    let mut mapped = Mapped {
        name,
        type_name: type_name.to_string(),
        kind: plugin_type.kind(),
        alpha: plugin_type.stability() == Stability::Alpha,
        parameters: Vec::new(),
        comments: alias_note.map(String::from).into_iter().collect(),
    };
    let known: Vec<&str> = plugin_type
        .parameters()
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    let Some(Yaml::Mapping(map)) = &spec.parameters else {
        return Entry::Plugin(mapped);
    };
    for (key, value) in map {
        let key_text = key
            .as_str()
            .map(String::from)
            .unwrap_or_else(|| yaml_inline(key));
        let what = format!("parameter {key_text}");
        if !known.contains(&key_text.as_str()) {
            let why = if known.is_empty() {
                format!("switchyard's {type_name} takes no parameters")
            } else {
                format!(
                    "switchyard's {type_name} has no such parameter (it has: {})",
                    known.join(", ")
                )
            };
            mapped
                .comments
                .extend(out.not_mapped(&what, &why, Some(value)));
            continue;
        }
        match to_toml(value) {
            Ok(v) => mapped.parameters.push((key_text, v)),
            Err(why) => mapped
                .comments
                .extend(out.not_mapped(&what, &why, Some(value))),
        }
    }
    Entry::Plugin(mapped)
}

/// The `libraries` entries: those of the mapped types, then those of default producers the
/// mapped plugins require (created by the pipeline, as by the reference), with a note why.
fn libraries(
    registry: &Registry,
    library_of: &BTreeMap<String, String>,
    plugins: &[&Mapped],
) -> Vec<(String, Option<String>)> {
    let mut libraries: Vec<(String, Option<String>)> = Vec::new();
    let mut add = |library: &str, note: Option<String>| {
        if !libraries.iter().any(|(l, _)| l == library) {
            libraries.push((library.to_string(), note));
        }
    };
    for plugin in plugins {
        if let Some(library) = library_of.get(&plugin.type_name) {
            add(library, None);
        }
    }
    for (library, producer, consumer) in default_producer_libraries(registry, library_of, plugins) {
        add(
            &library,
            Some(format!(
                "for {producer}, which '{consumer}' requires and the pipeline creates by itself"
            )),
        );
    }
    libraries
}

/// `[fleet] discovery_file` from a file-discovery plugin: the path and the comment lines to
/// write above it; `Err` holds the comment lines when it cannot be mapped.
fn discovery(out: &mut Out, spec: &PluginSpec) -> Result<(String, Vec<String>), Vec<String>> {
    let what = format!("plugin '{}' (type file-discovery)", spec.instance_name());
    let map = spec.parameters.as_ref().and_then(Yaml::as_mapping);
    let Some(path) = map.and_then(|m| m.get("path")).and_then(Yaml::as_str) else {
        return Err(out.not_mapped(
            &what,
            "it has no `path` parameter naming the endpoints file",
            spec.parameters.as_ref(),
        ));
    };
    let mut notes = vec![format!(
        "# From plugin '{}' (file-discovery), named by dataLayer.discovery.",
        spec.instance_name()
    )];
    if !Path::new(path).is_absolute() {
        notes.push(
            "# The reference resolves a relative path against its working directory; \
             switchyard\n# resolves it against this file's directory."
                .to_string(),
        );
    }
    for (key, value) in map.into_iter().flatten() {
        match key.as_str().unwrap_or_default() {
            "path" => {}
            "watchFile" if value.as_bool() == Some(true) => {}
            "watchFile" => notes.extend(out.not_mapped(
                "file-discovery parameter watchFile",
                "switchyard always watches the discovery file (re-read every 200 ms)",
                Some(value),
            )),
            other => notes.extend(out.not_mapped(
                &format!("file-discovery parameter {other}"),
                "switchyard's discovery file has no such setting",
                Some(value),
            )),
        }
    }
    Ok((path.to_string(), notes))
}

/// The `[[profiles]]` text.
fn profile(
    out: &mut Out,
    epp: &EppConfig,
    plugins: &[&Mapped],
    options: &ImportOptions,
    problems: &mut Vec<String>,
) -> String {
    let mut text = String::new();
    let profiles = &epp.scheduling_profiles;
    let names: Vec<&str> = profiles.iter().map(|p| p.name.as_str()).collect();
    let chosen = match (&options.profile, profiles.len()) {
        (Some(wanted), _) => match profiles.iter().position(|p| &p.name == wanted) {
            Some(index) => Some(index),
            None => {
                problems.push(format!(
                    "--profile {wanted}: the file has no such scheduling profile (it has: {})",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ));
                None
            }
        },
        (None, 0) => {
            let _ = writeln!(
                text,
                "# No schedulingProfiles: switchyard builds its implicit profile (every filter in\n\
                 # order, every scorer with weight 1.0, the first picker), as the reference builds \
                 its default one."
            );
            return text;
        }
        (None, 1) => Some(0),
        (None, _) => {
            problems.push(format!(
                "the file has {} scheduling profiles ({}); switchyard runs exactly one per \
                 pipeline: pass --profile NAME to import one of them",
                profiles.len(),
                names.join(", ")
            ));
            None
        }
    };
    for (index, spec) in profiles.iter().enumerate() {
        if Some(index) != chosen {
            let refs: Vec<String> = spec
                .plugins
                .iter()
                .map(|r| match r.weight {
                    Some(w) => format!("{} (weight {w})", r.plugin_ref),
                    None => r.plugin_ref.clone(),
                })
                .collect();
            let why = if chosen.is_some() {
                "switchyard runs exactly one scheduling profile per pipeline; another one was \
                 chosen with --profile"
            } else {
                "switchyard runs exactly one scheduling profile per pipeline and none was chosen"
            };
            for line in out.not_mapped(&format!("scheduling profile '{}'", spec.name), why, None) {
                let _ = writeln!(text, "{line}");
            }
            let _ = writeln!(text, "#   plugins: {}\n", refs.join(", "));
        }
    }
    let Some(index) = chosen else {
        return text;
    };
    let spec = &profiles[index];
    let mut filters = Vec::new();
    let mut scorers = Vec::new();
    let mut picker: Option<String> = None;
    let mut notes = Vec::new();
    for r in &spec.plugins {
        let what = format!("profile entry '{}'", r.plugin_ref);
        let Some(plugin) = plugins.iter().find(|p| p.name == r.plugin_ref) else {
            let why = if epp
                .plugins
                .iter()
                .any(|p| p.instance_name() == r.plugin_ref)
            {
                "its plugin is not mapped (see above)"
            } else {
                "no plugin has this name"
            };
            notes.extend(out.not_mapped(&what, why, None));
            continue;
        };
        if r.weight.is_some() && plugin.kind != PluginKind::Scorer {
            notes.extend(out.not_mapped(
                &format!("weight of '{}'", r.plugin_ref),
                &format!("only scorers have weights, and it is a {}", plugin.kind),
                None,
            ));
        }
        match plugin.kind {
            PluginKind::Filter => filters.push(toml_str(&plugin.name)),
            PluginKind::Scorer => scorers.push(match r.weight {
                Some(w) => format!(
                    "{{ plugin = {}, weight = {} }}",
                    toml_str(&plugin.name),
                    toml::Value::Float(w)
                ),
                None => format!("{{ plugin = {} }}", toml_str(&plugin.name)),
            }),
            PluginKind::Picker => {
                if let Some(first) = &picker {
                    problems.push(format!(
                        "profile '{}' names two pickers, {first} and {}; a profile has one",
                        spec.name,
                        toml_str(&plugin.name)
                    ));
                } else {
                    picker = Some(toml_str(&plugin.name));
                }
            }
            PluginKind::Producer => notes.extend(out.not_mapped(
                &what,
                "it is a producer; producers are not listed in profiles, every configured \
                 producer runs",
                None,
            )),
        }
    }
    if picker.is_none() {
        let pickers: Vec<&&Mapped> = plugins
            .iter()
            .filter(|p| p.kind == PluginKind::Picker)
            .collect();
        if let [only] = pickers.as_slice() {
            notes.push(
                "# The profile names no picker; the reference then uses the one configured."
                    .to_string(),
            );
            picker = Some(toml_str(&only.name));
        }
    }
    let _ = writeln!(text, "[[profiles]]");
    let _ = writeln!(text, "name = {}", toml_str(&spec.name));
    if !filters.is_empty() {
        let _ = writeln!(text, "filters = [{}]", filters.join(", "));
    }
    if !scorers.is_empty() {
        let _ = writeln!(text, "scorers = [");
        for scorer in &scorers {
            let _ = writeln!(text, "    {scorer},");
        }
        let _ = writeln!(text, "]");
    }
    if let Some(picker) = picker {
        let _ = writeln!(text, "picker = {picker}");
    }
    for note in notes {
        let _ = writeln!(text, "{note}");
    }
    text
}

/// Libraries of the default producers the mapped plugins require and nothing mapped
/// produces: `(library, producer type, consumer name)`.
fn default_producer_libraries(
    registry: &Registry,
    library_of: &BTreeMap<String, String>,
    plugins: &[&Mapped],
) -> Vec<(String, String, String)> {
    let mut produced = std::collections::HashSet::new();
    let mut required = Vec::new();
    for plugin in plugins {
        let Some(plugin_type) = registry.get(&plugin.type_name) else {
            continue;
        };
        let parameters: toml::Table = plugin.parameters.iter().cloned().collect();
        let json = super::parameters_json(&Some(parameters));
        // A plugin refusing its parameters is reported when the result is validated.
        let Ok(instance) = plugin_type.create(&plugin.name, &json) else {
            continue;
        };
        let declarations = instance.declarations();
        produced.extend(declarations.produces.iter().cloned());
        for consumed in declarations.consumes.iter().filter(|c| c.required) {
            required.push((consumed.key.clone(), plugin.name.clone()));
        }
    }
    let mut found = Vec::new();
    for (key, consumer) in required {
        if produced.contains(&key) {
            continue;
        }
        let producer = key.producer.as_str();
        if keys::default_producer(key.data_type.as_str()) != Some(producer) {
            continue;
        }
        if let Some(library) = library_of.get(producer) {
            found.push((library.clone(), producer.to_string(), consumer));
        }
    }
    found
}

/// Builds the imported text as a pipeline, as `switchyard check` would.
fn validate(toml: &str, options: &ImportOptions) -> Result<(), String> {
    let name = options
        .output
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("<stdout>"));
    let loaded = LoadedConfig::parse(&name, toml.to_string())
        .map_err(|e| format!("the imported TOML does not load: {e}"))?;
    let options = Options {
        allow_experimental_plugins: false,
        plugin_dirs: options.plugin_dirs.clone(),
    };
    let registry = load_registry(&loaded, &options).map_err(|e| e.to_string())?;
    build(&loaded, &registry, &options)
        .map(|_| ())
        .map_err(|e| format!("the imported pipeline does not build: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> String {
        parse(Path::new("epp.yaml"), text)
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn input_errors_name_file_line_and_field() {
        let wrong_kind = error("apiVersion: llm-d.ai/v1alpha1\nkind: Deployment\nplugins: []\n");
        assert!(
            wrong_kind.starts_with("epp.yaml:2: kind: must be EndpointPickerConfig"),
            "{wrong_kind}"
        );
        let missing_type = error(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- name: a\n  \
             type: x\n- name: b\n  parameters: {}\n",
        );
        assert!(
            missing_type.starts_with("epp.yaml:6: plugins[1]: missing field `type`"),
            "{missing_type}"
        );
        let bad_yaml =
            error("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins: a: b\n");
        assert!(bad_yaml.starts_with("epp.yaml:3:"), "{bad_yaml}");
        let unknown = error(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nschedulingProfile: []\n",
        );
        assert!(
            unknown.starts_with("epp.yaml:3: unknown field `schedulingProfile`"),
            "{unknown}"
        );
        assert!(error("\n").contains("the file is empty"));
        let parameters = error(
            "apiVersion: llm-d.ai/v1\nkind: EndpointPickerConfig\nplugins:\n- type: a\n  \
             parameters: 5\n",
        );
        assert!(
            parameters.starts_with(
                "epp.yaml:5: plugins[0].parameters: invalid type: integer `5`, expected a \
                 mapping of parameter names to values"
            ),
            "{parameters}"
        );
    }

    #[test]
    fn a_duplicate_name_points_at_its_second_use() {
        let text = "apiVersion: llm-d.ai/v1\nkind: EndpointPickerConfig\nplugins:\n- name: x\n  \
                    type: queue-scorer\n- type: load-aware-scorer\n  name: \"x\"\n";
        let error = import(Path::new("epp.yaml"), text, &ImportOptions::default())
            .expect_err("refused")
            .to_string();
        assert!(
            error.starts_with("epp.yaml:7: plugins[1].name: duplicate plugin name 'x'"),
            "{error}"
        );
    }

    #[test]
    fn values_convert_to_toml_or_say_why_not() {
        let yaml: Yaml =
            serde_norway::from_str("{a: 1, b: 0.8, c: [x, true], d: {e: -1}}").expect("yaml");
        let value = to_toml(&yaml).expect("converts");
        assert_eq!(
            value.to_string(),
            "{ a = 1, b = 0.8, c = [\"x\", true], d = { e = -1 } }"
        );
        assert_eq!(to_toml(&Yaml::Null), Err("null has no TOML form".into()));
        assert_eq!(toml_key("windowDurationMs"), "windowDurationMs");
        assert_eq!(toml_key("a.b"), "\"a.b\"");
    }
}
