//! Building a pipeline from a config: instantiate plugins, create missing default producers,
//! resolve every data key to a row index, order the producers, and resolve the profile.
//!
//! Everything named by a string is resolved here, once; the scheduler works with indices.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use switchyard_plugin_api::sdk::extensions;

use switchyard_plugin_api::{
    keys, AttrValue, DataKey, Declarations, PluginInstance, PluginKind, Stability,
};

use crate::config::{parameters_json, ConfigError, LoadedConfig, ProfileConfig, WeightedScorer};
use crate::plugins::{LibraryChecks, Registry, Source};

/// Switches that come from the command line rather than the file.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub allow_experimental_plugins: bool,
    /// Searched first for libraries named by bare name.
    pub plugin_dirs: Vec<PathBuf>,
}

/// Time budget of one produce call when the producer does not declare one.
pub const DEFAULT_PRODUCER_TIMEOUT_MS: u64 = 400;

/// One plugin instance of the pipeline.
pub struct WiredPlugin {
    pub name: String,
    pub type_name: String,
    pub kind: PluginKind,
    pub source: Source,
    pub stability: Stability,
    /// Shared with the pipelines a reload builds while the instance stays unchanged.
    pub object: Arc<PluginInstance>,
    /// The line of instances this one continues: the same as its predecessor's when a reload
    /// kept the instance or when the new instance took its predecessor's state over. Requests
    /// placed before a reload complete on the instance of the same lineage.
    pub lineage: u64,
    /// The instance of the running pipeline this new one replaces (same name and type, other
    /// library or parameters) and its lineage, until a reload hands its state over; `None`
    /// otherwise.
    pub predecessor: Option<(Arc<PluginInstance>, u64)>,
    /// SHA-256 of the library the instance comes from; `None` for a built-in type.
    pub digest: Option<String>,
    /// The JSON parameters the instance was created with.
    pub parameters: String,
    pub declarations: Declarations,
    /// With a batch window: the quiet gap after which the window seals early (the
    /// `batch_quiet` capability, since API 1.2); `None` for the fixed window.
    pub batch_quiet_ms: Option<u64>,
    /// Created because a consumer required its data, not listed in the config.
    pub auto_created: bool,
    /// Its work is done by the host itself (the built-in token producer: the host tokenizes
    /// every request on admission), so the scheduler does not call it.
    pub host_native: bool,
    /// Row of each declared consumed key (same order), `u32::MAX` when nothing produces it.
    pub consumed_rows: Vec<u32>,
    /// Row of each declared produced key (same order).
    pub produced_rows: Vec<u32>,
    /// What a value of each declared produced key may be (same order).
    pub produced_checks: Vec<ValueCheck>,
    /// `name` or `name (type)`, kept for naming the plugin when a call ends the process.
    pub call_label: String,
}

/// Which values a produced key may hold: a well-known data type holds its own variant (or
/// nothing); any other data type is the producer's and its consumers' business.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueCheck {
    Any,
    PrefixCacheMatch,
    InFlightLoad,
    LatencyPrediction,
}

impl ValueCheck {
    pub fn for_data_type(data_type: &str) -> ValueCheck {
        match data_type {
            keys::PREFIX_CACHE_MATCH_INFO => ValueCheck::PrefixCacheMatch,
            keys::IN_FLIGHT_LOAD => ValueCheck::InFlightLoad,
            keys::LATENCY_PREDICTION => ValueCheck::LatencyPrediction,
            _ => ValueCheck::Any,
        }
    }

    #[inline]
    pub fn accepts(self, value: &AttrValue) -> bool {
        matches!(
            (self, value),
            (ValueCheck::Any, _)
                | (_, AttrValue::Absent)
                | (ValueCheck::PrefixCacheMatch, AttrValue::PrefixCacheMatch(_))
                | (ValueCheck::InFlightLoad, AttrValue::InFlightLoad(_))
                | (
                    ValueCheck::LatencyPrediction,
                    AttrValue::LatencyPrediction(_)
                )
        )
    }

    /// The variant a key of this check holds, for messages.
    pub fn expected(self) -> &'static str {
        match self {
            ValueCheck::Any => "any value",
            ValueCheck::PrefixCacheMatch => "PrefixCacheMatch values",
            ValueCheck::InFlightLoad => "InFlightLoad values",
            ValueCheck::LatencyPrediction => "LatencyPrediction values",
        }
    }
}

/// The variant name of a value, for messages.
pub fn variant_name(value: &AttrValue) -> &'static str {
    match value {
        AttrValue::Absent => "Absent",
        AttrValue::PrefixCacheMatch(_) => "PrefixCacheMatch",
        AttrValue::InFlightLoad(_) => "InFlightLoad",
        AttrValue::LatencyPrediction(_) => "LatencyPrediction",
        AttrValue::Custom(_) => "Custom",
    }
}

impl WiredPlugin {
    /// The time budget of one produce call: the declared one, or the default; `None` for the
    /// host's built-in producers, which are host code and not held to one.
    pub fn budget_ms(&self) -> Option<u64> {
        let declared = match self.declarations.timeout_ms {
            0 => DEFAULT_PRODUCER_TIMEOUT_MS,
            ms => ms,
        };
        (self.source != Source::Builtin).then_some(declared)
    }

    pub fn label(&self) -> String {
        label(&self.name, &self.type_name)
    }
}

/// `name`, or `name (type)` when they differ.
pub fn label(name: &str, type_name: &str) -> String {
    if name == type_name {
        name.to_string()
    } else {
        format!("{name} ({type_name})")
    }
}

/// A scorer reference of the profile.
#[derive(Debug, Clone, Copy)]
pub struct ScorerRef {
    pub plugin: usize,
    pub weight: f64,
}

/// A wired pipeline: instances and the order the scheduler runs them in.
pub struct Pipeline {
    pub plugins: Vec<WiredPlugin>,
    /// Producers, dependencies first, ties in config order.
    pub producers: Vec<usize>,
    pub filters: Vec<usize>,
    pub scorers: Vec<ScorerRef>,
    pub picker: usize,
    pub profile: String,
    /// The data key of each attribute row.
    pub rows: Vec<DataKey>,
    /// The rows holding `PrefixCacheMatchInfo`, whose values on the chosen endpoint each
    /// decision keeps.
    pub prefix_rows: super::PrefixRows,
    /// Whether no row can hold a value that owns memory: every row the scheduler fills is of
    /// a well-known data type, whose values the host checks on the way in.
    pub plain_rows: bool,
    /// How the host turns a request's prompt into token ids (the `token-producer`'s backend,
    /// its file read when the pipeline was built).
    pub tokenizer: Arc<super::tokenize::PromptTokenizer>,
}

impl Pipeline {
    pub fn plugin(&self, index: usize) -> &WiredPlugin {
        &self.plugins[index]
    }

    pub fn find(&self, name: &str) -> Option<usize> {
        self.plugins.iter().position(|p| p.name == name)
    }

    /// Positions of the plugins that take KV-cache events: those answering `true` to the
    /// `kv_events` question (plugin API 1.3).
    pub fn kv_event_plugins(&self) -> Vec<usize> {
        self.plugins
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                p.object
                    .extension(extensions::KV_EVENTS, "")
                    .is_ok_and(|answer| answer == "true")
            })
            .map(|(i, _)| i)
            .collect()
    }
}

/// Loads the libraries a config names into a registry that already holds the built-ins.
pub fn load_registry(config: &LoadedConfig, options: &Options) -> Result<Registry, ConfigError> {
    let mut registry = Registry::with_builtins();
    for (index, entry) in config.config.libraries.iter().enumerate() {
        let candidates = config.library_candidates(&entry.path, &options.plugin_dirs);
        let explicit = crate::config::is_library_path(&entry.path);
        let checks = LibraryChecks {
            allow_writable: config.config.allow_writable_libraries,
            sha256: entry.sha256.clone(),
        };
        registry
            .load_library(&entry.path, &candidates, explicit, &checks)
            .map_err(|error| {
                ConfigError::new(&config.path, error.to_string())
                    .at_line(config.library_line(index))
            })?;
    }
    Ok(registry)
}

/// Builds the pipeline the config describes.
pub fn build(
    config: &LoadedConfig,
    registry: &Registry,
    options: &Options,
) -> Result<Pipeline, ConfigError> {
    build_from(config, registry, options, None)
}

/// As [`build`], taking over from `previous` every instance whose name, type, library bytes
/// and parameters are unchanged instead of creating it again, so its state (an index, the
/// charges of requests in flight) carries on. Every other instance is created fresh.
pub fn build_from(
    config: &LoadedConfig,
    registry: &Registry,
    options: &Options,
    previous: Option<&Pipeline>,
) -> Result<Pipeline, ConfigError> {
    let allow_alpha =
        options.allow_experimental_plugins || config.config.allow_experimental_plugins;
    let mut plugins = Vec::new();
    for (index, entry) in config.config.plugins.iter().enumerate() {
        let error = |message: String| {
            ConfigError::new(&config.path, message)
                .at_line(config.plugin_line(index, None))
                .plugin(&entry.name, &entry.type_name)
        };
        let Some(plugin_type) = registry.get(&entry.type_name) else {
            return Err(error(format!(
                "unknown plugin type '{}'; known types: {}. A type from a library needs the \
                 library in `libraries`",
                entry.type_name,
                registry.type_names().join(", ")
            )));
        };
        if plugin_type.stability() == Stability::Alpha && !allow_alpha {
            return Err(error(alpha_refusal(&entry.type_name)));
        }
        if let Some(unknown) = undeclared_parameter(plugin_type, entry.parameters.as_ref()) {
            return Err(ConfigError::new(&config.path, unknown.1)
                .at_line(config.plugin_line(index, Some(&unknown.0)))
                .plugin(&entry.name, &entry.type_name));
        }
        let parameters = parameters_json(&entry.parameters);
        let object =
            reuse_or_create(previous, &entry.name, plugin_type, &parameters).map_err(|e| {
                let field = e.field.as_str();
                let mut message = e.message.to_string();
                if let Some(doc) = plugin_type.parameters().iter().find(|p| p.name == field) {
                    if !message.contains(doc.range.as_str()) && !doc.range.is_empty() {
                        message.push_str(&format!(" (valid: {})", doc.range));
                    }
                }
                ConfigError::new(&config.path, message)
                    .at_line(config.plugin_line(index, Some(field)))
                    .plugin(&entry.name, &entry.type_name)
                    .field(field)
            })?;
        plugins.push(wire_instance(
            entry.name.clone(),
            plugin_type,
            object,
            parameters,
            false,
        ));
    }

    create_default_producers(config, registry, allow_alpha, previous, &mut plugins)?;
    let rows = assign_rows(&mut plugins);
    let producers = order_producers(config, &plugins)?;
    let profile = config.config.profiles.first().cloned();
    let (profile_name, filters, scorers, picker) =
        resolve_profile(config, registry, profile, &mut plugins)?;
    warn_unused(&plugins, &producers, &filters, &scorers, picker);
    let plain_rows = plugins
        .iter()
        .filter(|p| !p.host_native)
        .flat_map(|p| &p.produced_checks)
        .all(|check| *check != ValueCheck::Any);
    let prefix_rows = super::PrefixRows::find(&rows);
    let tokenizer = Arc::new(super::tokenize::PromptTokenizer::for_config(config)?);
    Ok(Pipeline {
        plugins,
        producers,
        filters,
        scorers,
        picker,
        profile: profile_name,
        rows,
        prefix_rows,
        plain_rows,
        tokenizer,
    })
}

/// The first parameter the type does not declare, with the message refusing it. The host
/// checks this itself, so a plugin that ignores unknown parameters cannot let a misspelt one
/// through silently.
fn undeclared_parameter(
    plugin_type: &crate::plugins::PluginType,
    parameters: Option<&toml::Table>,
) -> Option<(String, String)> {
    let declared = plugin_type.parameters();
    let unknown = parameters?
        .keys()
        .find(|key| !declared.iter().any(|p| p.name.as_str() == key.as_str()))?;
    let valid = if declared.is_empty() {
        format!("type '{}' takes no parameters", plugin_type.name())
    } else {
        let names: Vec<&str> = declared.iter().map(|p| p.name.as_str()).collect();
        format!(
            "valid parameters of type '{}': {}",
            plugin_type.name(),
            names.join(", ")
        )
    };
    Some((
        unknown.clone(),
        format!("unknown parameter `{}`; {valid}", unknown.escape_debug()),
    ))
}

fn alpha_refusal(type_name: &str) -> String {
    format!(
        "plugin type '{type_name}' is alpha (experimental); set \
         `allow_experimental_plugins = true` in the config or pass \
         --allow-experimental-plugins to use it"
    )
}

/// A batching producer's quiet gap, asked once at wiring. A library older than API 1.2 answers
/// `Unsupported`, and any answer that is not a whole number of milliseconds in
/// `1..window_ms` leaves the fixed window.
fn batch_quiet_ms(object: &PluginInstance, window_ms: u64) -> Option<u64> {
    let answer = object.extension(extensions::BATCH_QUIET, "").ok()?;
    let quiet: u64 = serde_json::from_str::<Option<u64>>(&answer).ok()??;
    (1..window_ms).contains(&quiet).then_some(quiet)
}

/// An instance for a pipeline being built, and where it comes from.
struct Created {
    object: Arc<PluginInstance>,
    lineage: u64,
    predecessor: Option<(Arc<PluginInstance>, u64)>,
}

/// A lineage no instance has had yet.
fn new_lineage() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The instance of `previous` named `name` when it has the same type, library bytes and
/// parameters, else a new one — noting the instance of that name and type it replaces, so a
/// reload can hand its state over.
fn reuse_or_create(
    previous: Option<&Pipeline>,
    name: &str,
    plugin_type: &crate::plugins::PluginType,
    parameters: &str,
) -> Result<Created, switchyard_plugin_api::PluginError> {
    let namesake = previous.and_then(|pipeline| {
        pipeline
            .plugins
            .iter()
            .find(|p| p.name == name && p.type_name == plugin_type.name())
    });
    if let Some(same) = namesake.filter(|p| {
        p.source == plugin_type.source
            && p.digest == plugin_type.digest
            && p.parameters == parameters
    }) {
        return Ok(Created {
            object: same.object.clone(),
            lineage: same.lineage,
            predecessor: None,
        });
    }
    Ok(Created {
        object: Arc::new(plugin_type.create(name, parameters)?),
        lineage: new_lineage(),
        predecessor: namesake.map(|p| (p.object.clone(), p.lineage)),
    })
}

fn wire_instance(
    name: String,
    plugin_type: &crate::plugins::PluginType,
    created: Created,
    parameters: String,
    auto_created: bool,
) -> WiredPlugin {
    let Created {
        object,
        lineage,
        predecessor,
    } = created;
    let call_label = label(&name, plugin_type.name());
    let declarations = {
        let _call = crate::plugins::crash_note::enter(&call_label, "declare");
        object.declarations()
    };
    let batch_quiet_ms = declarations
        .batch()
        .and_then(|policy| batch_quiet_ms(&object, policy.window_ms));
    let produced_checks = declarations
        .produces
        .iter()
        .map(|key| ValueCheck::for_data_type(key.data_type.as_str()))
        .collect();
    WiredPlugin {
        produced_checks,
        call_label,
        name,
        type_name: plugin_type.name().to_string(),
        kind: plugin_type.kind(),
        source: plugin_type.source.clone(),
        stability: plugin_type.stability(),
        object,
        lineage,
        predecessor,
        digest: plugin_type.digest.clone(),
        parameters,
        declarations,
        batch_quiet_ms,
        auto_created,
        host_native: plugin_type.source == Source::Builtin
            && plugin_type.name() == super::tokenize::TYPE_NAME,
        consumed_rows: Vec::new(),
        produced_rows: Vec::new(),
    }
}

/// Creates, until nothing is missing, the default producer of every required key that no
/// configured plugin produces. A default producer is named after its type, so only keys bound
/// to that name can be satisfied this way.
fn create_default_producers(
    config: &LoadedConfig,
    registry: &Registry,
    allow_alpha: bool,
    previous: Option<&Pipeline>,
    plugins: &mut Vec<WiredPlugin>,
) -> Result<(), ConfigError> {
    loop {
        let produced: std::collections::HashSet<DataKey> = plugins
            .iter()
            .flat_map(|p| p.declarations.produces.iter().cloned())
            .collect();
        let missing = plugins.iter().find_map(|consumer| {
            consumer
                .declarations
                .consumes
                .iter()
                .find(|c| c.required && !produced.contains(&c.key))
                .map(|c| (consumer.name.clone(), consumer.label(), c.key.clone()))
        });
        let Some((consumer_name, consumer, key)) = missing else {
            return Ok(());
        };
        let producer_name = key.producer.as_str();
        let line = consumer_line(config, &consumer_name, producer_name);
        let error = |message: String| ConfigError::new(&config.path, message).at_line(line);
        if let Some(existing) = plugins.iter().find(|p| p.name == producer_name) {
            let producers: Vec<String> = plugins
                .iter()
                .filter(|p| {
                    p.declarations
                        .produces
                        .iter()
                        .any(|k| k.data_type == key.data_type)
                })
                .map(|p| format!("'{}'", p.name.escape_debug()))
                .collect();
            let fix = if producers.is_empty() {
                format!(
                    "add a plugin that produces {} and point the consumer at it",
                    key.data_type
                )
            } else {
                format!(
                    "point the consumer at a plugin that produces {} ({})",
                    key.data_type,
                    producers.join(", ")
                )
            };
            return Err(error(format!(
                "plugin '{consumer}' requires {key}, but plugin '{}' does not produce it; {fix}",
                existing.label()
            )));
        }
        let default_type = keys::default_producer(key.data_type.as_str());
        if default_type != Some(producer_name) {
            return Err(error(format!(
                "plugin '{consumer}' requires {key}, and no plugin named '{producer_name}' \
                 produces it; add a [[plugins]] entry named '{producer_name}' that produces \
                 {}, or point the consumer at an existing producer",
                key.data_type
            )));
        }
        let Some(plugin_type) = registry.get(producer_name) else {
            return Err(error(format!(
                "plugin '{consumer}' requires {key}; its default producer type \
                 '{producer_name}' is not loaded: add its library to `libraries` or configure \
                 another producer"
            )));
        };
        if plugin_type.stability() == Stability::Alpha && !allow_alpha {
            return Err(error(alpha_refusal(producer_name)));
        }
        let object =
            reuse_or_create(previous, producer_name, plugin_type, "null").map_err(|e| {
                error(format!(
                    "creating the default producer '{producer_name}' (required by '{consumer}') \
                 failed: {e}"
                ))
            })?;
        tracing::debug!(producer = producer_name, consumer, %key, "created default producer");
        plugins.push(wire_instance(
            producer_name.to_string(),
            plugin_type,
            object,
            "null".to_string(),
            true,
        ));
    }
}

/// The line of the parameter through which `consumer` names `producer`, else of its entry.
fn consumer_line(config: &LoadedConfig, consumer: &str, producer: &str) -> Option<usize> {
    let index = config
        .config
        .plugins
        .iter()
        .position(|p| p.name == consumer)?;
    let parameter = config.config.plugins[index]
        .parameters
        .iter()
        .flatten()
        .find(|(_, value)| value.as_str() == Some(producer))
        .map(|(key, _)| key.as_str());
    config.plugin_line(index, parameter)
}

/// Gives every produced key a row and maps each consumer's keys to rows.
fn assign_rows(plugins: &mut [WiredPlugin]) -> Vec<DataKey> {
    let mut rows: Vec<DataKey> = Vec::new();
    let mut index: HashMap<DataKey, u32> = HashMap::new();
    for plugin in plugins.iter_mut() {
        plugin.produced_rows = plugin
            .declarations
            .produces
            .iter()
            .map(|key| {
                *index.entry(key.clone()).or_insert_with(|| {
                    rows.push(key.clone());
                    (rows.len() - 1) as u32
                })
            })
            .collect();
    }
    for plugin in plugins.iter_mut() {
        plugin.consumed_rows = plugin
            .declarations
            .consumes
            .iter()
            .map(|c| index.get(&c.key).copied().unwrap_or(u32::MAX))
            .collect();
    }
    rows
}

/// Orders producers so that every producer runs after those whose data it reads (required
/// or optional), ties in config order.
fn order_producers(
    config: &LoadedConfig,
    plugins: &[WiredPlugin],
) -> Result<Vec<usize>, ConfigError> {
    let producers: Vec<usize> = (0..plugins.len())
        .filter(|&i| plugins[i].kind == PluginKind::Producer)
        .collect();
    let mut producers_of_row: HashMap<u32, Vec<usize>> = HashMap::new();
    for &p in &producers {
        for &row in &plugins[p].produced_rows {
            producers_of_row.entry(row).or_default().push(p);
        }
    }
    // Kahn's algorithm, always taking the ready producer that comes first in the config.
    let mut waiting_on: HashMap<usize, usize> = HashMap::new();
    let mut dependents: HashMap<usize, Vec<usize>> = HashMap::new();
    for &consumer in &producers {
        let deps: BTreeSet<usize> = plugins[consumer]
            .consumed_rows
            .iter()
            .filter_map(|row| producers_of_row.get(row))
            .flatten()
            .copied()
            .filter(|&p| p != consumer)
            .collect();
        waiting_on.insert(consumer, deps.len());
        for dep in deps {
            dependents.entry(dep).or_default().push(consumer);
        }
    }
    let mut ready: BTreeSet<usize> = producers
        .iter()
        .copied()
        .filter(|p| waiting_on[p] == 0)
        .collect();
    let mut order = Vec::with_capacity(producers.len());
    while let Some(next) = ready.pop_first() {
        order.push(next);
        for &dependent in dependents.get(&next).into_iter().flatten() {
            let count = waiting_on
                .get_mut(&dependent)
                .expect("every producer counted");
            *count -= 1;
            if *count == 0 {
                ready.insert(dependent);
            }
        }
    }
    if order.len() < producers.len() {
        let placed: BTreeSet<usize> = order.iter().copied().collect();
        let cycle: Vec<String> = producers
            .iter()
            .filter(|p| !placed.contains(*p))
            .map(|&p| plugins[p].label())
            .collect();
        let first = producers.iter().find(|p| !placed.contains(*p));
        let line = first.and_then(|&p| {
            let index = config
                .config
                .plugins
                .iter()
                .position(|c| c.name == plugins[p].name)?;
            config.plugin_line(index, None)
        });
        return Err(ConfigError::new(
            &config.path,
            format!(
                "producers depend on each other in a cycle: {}; break it by changing \
                 which producer one of them reads",
                cycle.join(" -> ")
            ),
        )
        .at_line(line));
    }
    Ok(order)
}

type ResolvedProfile = (String, Vec<usize>, Vec<ScorerRef>, usize);

fn resolve_profile(
    config: &LoadedConfig,
    registry: &Registry,
    profile: Option<ProfileConfig>,
    plugins: &mut Vec<WiredPlugin>,
) -> Result<ResolvedProfile, ConfigError> {
    let explicit = profile.is_some();
    let profile = profile.unwrap_or_else(|| implicit_profile(plugins));
    let line = |key: &str| {
        if explicit {
            config.profile_line(0, Some(key))
        } else {
            None
        }
    };
    let by_name: HashMap<String, usize> = plugins
        .iter()
        .enumerate()
        .map(|(i, p)| (p.name.clone(), i))
        .collect();
    let find = |plugins: &[WiredPlugin], name: &str, role: PluginKind, key: &str| {
        let error = |message: String| {
            ConfigError::new(&config.path, message)
                .at_line(line(key))
                .field(format!("profiles.{key}"))
        };
        let Some(&index) = by_name.get(name) else {
            let configured: Vec<&str> = plugins.iter().map(|p| p.name.as_str()).collect();
            return Err(error(format!(
                "profile '{}' names '{}' as a {role}, but no plugin has that name \
                 (configured: {})",
                profile.name.escape_debug(),
                name.escape_debug(),
                configured.join(", ")
            )));
        };
        let plugin = &plugins[index];
        if plugin.kind != role {
            let hint = if plugin.kind == PluginKind::Producer {
                "; producers run by themselves before the filters and are not listed in profiles"
                    .to_string()
            } else {
                let list = match plugin.kind {
                    PluginKind::Filter => "`filters`",
                    PluginKind::Scorer => "`scorers`",
                    _ => "`picker`",
                };
                format!("; list it under {list}, or name a {role} here")
            };
            return Err(error(format!(
                "profile '{}' uses '{}' as a {role}, but it is a {}{hint}",
                profile.name.escape_debug(),
                plugin.label(),
                plugin.kind
            )));
        }
        Ok(index)
    };
    let mut filters = Vec::new();
    for name in &profile.filters {
        filters.push(find(plugins, name, PluginKind::Filter, "filters")?);
    }
    let mut scorers = Vec::new();
    for WeightedScorer { plugin, weight } in &profile.scorers {
        let index = find(plugins, plugin, PluginKind::Scorer, "scorers")?;
        if !weight.is_finite() {
            return Err(ConfigError::new(
                &config.path,
                format!("scorer '{plugin}' has weight {weight}; a weight must be a finite number"),
            )
            .at_line(line("scorers")));
        }
        scorers.push(ScorerRef {
            plugin: index,
            weight: *weight,
        });
    }
    let picker = match &profile.picker {
        Some(name) => find(plugins, name, PluginKind::Picker, "picker")?,
        None => {
            const DEFAULT_PICKER: &str = "max-score-picker";
            match plugins.iter().position(|p| p.name == DEFAULT_PICKER) {
                Some(index) => {
                    find(plugins, DEFAULT_PICKER, PluginKind::Picker, "picker").map(|_| index)?
                }
                None => {
                    let plugin_type = registry
                        .get(DEFAULT_PICKER)
                        .expect("max-score-picker is built in");
                    let object = plugin_type.create(DEFAULT_PICKER, "null").map_err(|e| {
                        ConfigError::new(&config.path, format!("default picker: {e}"))
                    })?;
                    // A picker keeps no state: a new one each build.
                    let created = Created {
                        object: Arc::new(object),
                        lineage: new_lineage(),
                        predecessor: None,
                    };
                    plugins.push(wire_instance(
                        DEFAULT_PICKER.to_string(),
                        plugin_type,
                        created,
                        "null".to_string(),
                        true,
                    ));
                    plugins.len() - 1
                }
            }
        }
    };
    Ok((profile.name, filters, scorers, picker))
}

/// Without a `[[profiles]]` entry: every filter in config order, every scorer with weight 1,
/// and the first configured picker (the default picker when there is none).
fn implicit_profile(plugins: &[WiredPlugin]) -> ProfileConfig {
    let named = |kind: PluginKind| -> Vec<String> {
        plugins
            .iter()
            .filter(|p| p.kind == kind)
            .map(|p| p.name.clone())
            .collect()
    };
    let pickers = named(PluginKind::Picker);
    ProfileConfig {
        name: "default".to_string(),
        filters: named(PluginKind::Filter),
        scorers: named(PluginKind::Scorer)
            .into_iter()
            .map(|plugin| WeightedScorer {
                plugin,
                weight: 1.0,
            })
            .collect(),
        picker: pickers.first().cloned(),
    }
}

fn warn_unused(
    plugins: &[WiredPlugin],
    producers: &[usize],
    filters: &[usize],
    scorers: &[ScorerRef],
    picker: usize,
) {
    for (index, plugin) in plugins.iter().enumerate() {
        let used = producers.contains(&index)
            || filters.contains(&index)
            || scorers.iter().any(|s| s.plugin == index)
            || picker == index;
        if !used {
            tracing::warn!(plugin = %plugin.label(), "plugin is configured but not used by the profile");
        }
    }
}

#[cfg(test)]
mod tests {
    use switchyard_plugin_api::sdk::{Declare, Instance, ProduceBatch, Producer};
    use switchyard_plugin_api::{BatchPolicy, PluginError, ProduceItem};

    /// A batching producer with a 50 ms window and the given quiet gap.
    struct Quiet(Option<u64>);

    impl Producer for Quiet {
        fn declare(&self) -> Declare {
            Declare {
                batch: Some(BatchPolicy {
                    window_ms: 50,
                    max_batch: -1,
                }),
                batch_quiet_ms: self.0,
                ..Declare::default()
            }
        }

        fn produce(
            &self,
            _: &[ProduceItem<'_>],
            _: &mut ProduceBatch<'_>,
        ) -> Result<(), PluginError> {
            Ok(())
        }
    }

    fn quiet_gap(declared: Option<u64>) -> Option<u64> {
        let object = Instance::producer(Quiet(declared)).into_ffi();
        super::batch_quiet_ms(&object, 50)
    }

    #[test]
    fn a_quiet_gap_inside_the_window_is_kept_and_any_other_answer_means_the_fixed_window() {
        assert_eq!(quiet_gap(Some(10)), Some(10));
        assert_eq!(quiet_gap(Some(49)), Some(49));
        assert_eq!(quiet_gap(None), None);
        assert_eq!(quiet_gap(Some(0)), None);
        assert_eq!(
            quiet_gap(Some(50)),
            None,
            "seals no earlier than the window"
        );
        assert_eq!(quiet_gap(Some(500)), None);
    }

    fn wired(text: &str, previous: Option<&super::Pipeline>) -> super::Pipeline {
        let config =
            crate::config::LoadedConfig::parse(std::path::Path::new("reload.toml"), text.into())
                .expect("parses");
        let registry = crate::plugins::Registry::with_builtins();
        super::build_from(&config, &registry, &super::Options::default(), previous).expect("builds")
    }

    fn shared(a: &super::Pipeline, b: &super::Pipeline, name: &str) -> bool {
        let object = |p: &super::Pipeline| p.plugins[p.find(name).expect("wired")].object.clone();
        std::sync::Arc::ptr_eq(&object(a), &object(b))
    }

    #[test]
    fn a_rebuild_keeps_the_instances_whose_type_name_and_parameters_are_unchanged() {
        let first = wired(
            r#"
            [[plugins]]
            type = "inflight-load-producer"
            [[plugins]]
            type = "load-aware-scorer"
            parameters = { threshold = 10 }
            "#,
            None,
        );
        let second = wired(
            r#"
            [[plugins]]
            type = "inflight-load-producer"
            [[plugins]]
            type = "load-aware-scorer"
            parameters = { threshold = 20 }
            "#,
            Some(&first),
        );
        assert!(shared(&first, &second, "inflight-load-producer"));
        assert!(!shared(&first, &second, "load-aware-scorer"));
        let renamed = wired(
            r#"
            [[plugins]]
            name = "load"
            type = "inflight-load-producer"
            [[plugins]]
            type = "load-aware-scorer"
            parameters = { threshold = 20 }
            "#,
            Some(&second),
        );
        assert!(shared(&second, &renamed, "load-aware-scorer"));
        assert!(renamed.find("inflight-load-producer").is_none());
    }
}
