//! Helpers for testing a plugin without a host (cargo feature `testing`).
//!
//! Build the inputs with [`TestEndpoint`], [`TestRequest`] and [`Attributes`], create the
//! instance with [`Harness::new`] from the plugin's [`PluginFactory`], and call
//! [`Harness::produce`], [`Harness::filter`], [`Harness::score`] or [`Harness::pick`]. Each
//! call goes through the same boundary the host uses (the instance's vtable, with the SDK's
//! panic containment) and returns plain Rust values.
//!
//! The attribute view a plugin receives is built the way the host builds it: from the keys
//! the instance *declares* it consumes. A value stored under a key the plugin does not
//! declare is invisible to it, so a test also checks the declaration.
//!
//! ```
//! use switchyard_plugin_api::testing::{Attributes, TestEndpoint, TestRequest};
//! use switchyard_plugin_api::DataKey;
//!
//! let endpoints = TestEndpoint::several(3);
//! let request = TestRequest::new("llama").tokens(&[1, 2, 3]);
//! let attrs = Attributes::new().set(
//!     DataKey::new("PrefixCacheMatchInfo", "approx-prefix-cache-producer"),
//!     vec![Attributes::prefix_match(1, 2, 16)],
//! );
//! assert_eq!(request.token_count(), 3);
//! assert_eq!(endpoints[2].id, "default/pod3");
//! # let _ = attrs;
//! ```

use abi_stable::std_types::{RSlice, RStr, RString};

use crate::abi::{
    AttrValue, AttrView, DataKey, Declarations, EndpointMetrics, EndpointView, InFlightLoad,
    LatencyPrediction, Outcome, PluginError, PluginInstance, PrefixCacheMatchInfo, ProduceItem,
    PromptTokens, RequestView,
};
use crate::sdk::{Instance, PluginFactory};

/// One candidate endpoint, owned; [`TestEndpoint::view`] lends it as an [`EndpointView`].
#[derive(Debug, Clone, PartialEq)]
pub struct TestEndpoint {
    pub id: String,
    pub address: String,
    pub role: String,
    /// The host's index of the endpoint (stateful plugins key their state by it).
    pub host_index: u32,
    pub metrics: EndpointMetrics,
}

impl TestEndpoint {
    /// An endpoint with identity `id` (`namespace/name`), host index 0 and no load.
    pub fn new(id: &str) -> TestEndpoint {
        TestEndpoint {
            id: id.to_string(),
            address: "127.0.0.1:8000".to_string(),
            role: String::new(),
            host_index: 0,
            metrics: EndpointMetrics::default(),
        }
    }

    /// `n` endpoints `default/pod1..podN` at `10.0.0.K:8000`, with host indexes `0..n`.
    pub fn several(n: usize) -> Vec<TestEndpoint> {
        (0..n)
            .map(|i| {
                TestEndpoint::new(&format!("default/pod{}", i + 1))
                    .address(&format!("10.0.0.{}:8000", i + 1))
                    .host_index(i as u32)
            })
            .collect()
    }

    pub fn address(mut self, address: &str) -> Self {
        self.address = address.to_string();
        self
    }

    pub fn role(mut self, role: &str) -> Self {
        self.role = role.to_string();
        self
    }

    pub fn host_index(mut self, index: u32) -> Self {
        self.host_index = index;
        self
    }

    pub fn metrics(mut self, metrics: EndpointMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Requests running and waiting on the model server.
    pub fn queue(mut self, running: u32, waiting: u32) -> Self {
        self.metrics.running_requests = running;
        self.metrics.waiting_requests = waiting;
        self
    }

    /// KV-cache utilisation in [0, 1].
    pub fn kv_cache_usage(mut self, usage: f64) -> Self {
        self.metrics.kv_cache_usage = usage;
        self
    }

    /// Tokens per KV block and KV blocks on the model server.
    pub fn cache(mut self, block_size: u32, num_blocks: u64) -> Self {
        self.metrics.cache_block_size = block_size;
        self.metrics.cache_num_blocks = num_blocks;
        self
    }

    /// The endpoint as the `slot`-th candidate of a request.
    pub fn view(&self, slot: usize) -> EndpointView<'_> {
        EndpointView {
            slot: slot as u32,
            host_index: self.host_index,
            id: RStr::from_str(&self.id),
            address: RStr::from_str(&self.address),
            role: RStr::from_str(&self.role),
            metrics: self.metrics,
        }
    }
}

/// A small deterministic generator (xorshift) of numbers below the bound it is called with,
/// for random test cases that reproduce from their seed (which must not be 0).
pub fn numbers(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut state = seed;
    move |bound| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound
    }
}

/// Views of `endpoints` as one request's candidates, slots in order.
pub fn endpoint_views(endpoints: &[TestEndpoint]) -> Vec<EndpointView<'_>> {
    endpoints
        .iter()
        .enumerate()
        .map(|(slot, e)| e.view(slot))
        .collect()
}

/// One request, owned; [`TestRequest::with_view`] lends it as a [`RequestView`].
#[derive(Debug, Clone, PartialEq)]
pub struct TestRequest {
    pub id: String,
    pub model: String,
    pub cache_salt: String,
    /// Token ids, one list per prompt.
    pub prompts: Vec<Vec<u32>>,
    pub max_output_tokens: i64,
    pub now_ms: u64,
    pub random_seed: u64,
    pub explain: bool,
}

impl TestRequest {
    /// A request `r1` for `model`, without prompt, not explained.
    pub fn new(model: &str) -> TestRequest {
        TestRequest {
            id: "r1".to_string(),
            model: model.to_string(),
            cache_salt: String::new(),
            prompts: Vec::new(),
            max_output_tokens: -1,
            now_ms: 0,
            random_seed: 1,
            explain: false,
        }
    }

    pub fn id(mut self, id: &str) -> Self {
        self.id = id.to_string();
        self
    }

    /// Replaces the prompts with one prompt of these token ids.
    pub fn tokens(mut self, tokens: &[u32]) -> Self {
        self.prompts = vec![tokens.to_vec()];
        self
    }

    /// Adds one more prompt.
    pub fn prompt(mut self, tokens: &[u32]) -> Self {
        self.prompts.push(tokens.to_vec());
        self
    }

    pub fn cache_salt(mut self, salt: &str) -> Self {
        self.cache_salt = salt.to_string();
        self
    }

    pub fn max_output_tokens(mut self, tokens: i64) -> Self {
        self.max_output_tokens = tokens;
        self
    }

    /// The host's clock for this decision, in milliseconds.
    pub fn now_ms(mut self, now_ms: u64) -> Self {
        self.now_ms = now_ms;
        self
    }

    pub fn random_seed(mut self, seed: u64) -> Self {
        self.random_seed = seed;
        self
    }

    /// Whether the decision is recorded (plugins then write their notes).
    pub fn explain(mut self, explain: bool) -> Self {
        self.explain = explain;
        self
    }

    pub fn token_count(&self) -> usize {
        self.prompts.iter().map(Vec::len).sum()
    }

    /// Calls `f` with the request as the host would pass it.
    pub fn with_view<T>(&self, f: impl FnOnce(&RequestView<'_>) -> T) -> T {
        let prompts: Vec<PromptTokens<'_>> = self
            .prompts
            .iter()
            .map(|tokens| PromptTokens {
                tokens: RSlice::from_slice(tokens),
            })
            .collect();
        let view = RequestView {
            id: RStr::from_str(&self.id),
            model: RStr::from_str(&self.model),
            cache_salt: RStr::from_str(&self.cache_salt),
            prompts: RSlice::from_slice(&prompts),
            max_output_tokens: self.max_output_tokens,
            now_ms: self.now_ms,
            random_seed: self.random_seed,
            explain: self.explain,
        };
        f(&view)
    }
}

/// Attribute values of one request's candidates, by data key: what producers attached.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attributes {
    rows: Vec<(DataKey, Vec<AttrValue>)>,
}

impl Attributes {
    pub fn new() -> Attributes {
        Attributes::default()
    }

    /// Sets the values of `key`, one per candidate in order; missing ones are absent.
    pub fn set(mut self, key: DataKey, values: Vec<AttrValue>) -> Self {
        match self.rows.iter_mut().find(|(k, _)| *k == key) {
            Some((_, row)) => *row = values,
            None => self.rows.push((key, values)),
        }
        self
    }

    /// Sets the value of `key` on the candidate at `position`.
    pub fn set_on(mut self, key: DataKey, position: usize, value: AttrValue) -> Self {
        let index = match self.rows.iter().position(|(k, _)| *k == key) {
            Some(index) => index,
            None => {
                self.rows.push((key, Vec::new()));
                self.rows.len() - 1
            }
        };
        let row = &mut self.rows[index].1;
        if row.len() <= position {
            row.resize(position + 1, AttrValue::Absent);
        }
        row[position] = value;
        self
    }

    /// Adds everything a producer wrote (see [`Harness::produce`]).
    pub fn with(mut self, produced: &Produced) -> Self {
        for (key, values) in &produced.values {
            self = self.set(key.clone(), values.clone());
        }
        self
    }

    /// The values of `key`, if set.
    pub fn get(&self, key: &DataKey) -> Option<&[AttrValue]> {
        self.rows
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_slice())
    }

    pub fn prefix_match(match_blocks: u64, total_blocks: u64, block_size_tokens: u64) -> AttrValue {
        AttrValue::PrefixCacheMatch(PrefixCacheMatchInfo {
            match_blocks,
            total_blocks,
            block_size_tokens,
        })
    }

    pub fn in_flight(requests: i64, tokens: i64) -> AttrValue {
        AttrValue::InFlightLoad(InFlightLoad { requests, tokens })
    }

    pub fn latency(ttft_ms: f64, tpot_ms: f64) -> AttrValue {
        AttrValue::LatencyPrediction(LatencyPrediction { ttft_ms, tpot_ms })
    }

    /// The table and row map the host would hand to an instance declaring `declared`, for
    /// `width` candidates.
    fn table(&self, declared: &Declarations, width: usize) -> (Vec<AttrValue>, Vec<u32>) {
        let mut values = Vec::new();
        let mut rows = Vec::new();
        for consumed in declared.consumes.iter() {
            match self.get(&consumed.key) {
                Some(row) => {
                    rows.push((values.len() / width.max(1)) as u32);
                    values.extend(
                        (0..width).map(|i| row.get(i).cloned().unwrap_or(AttrValue::Absent)),
                    );
                }
                None => rows.push(u32::MAX),
            }
        }
        (values, rows)
    }
}

/// What a filter returned.
#[derive(Debug, Clone, PartialEq)]
pub struct Filtered {
    /// One flag per candidate, in order.
    pub keep: Vec<bool>,
    pub note: String,
}

impl Filtered {
    /// The positions kept.
    pub fn kept(&self) -> Vec<usize> {
        (0..self.keep.len()).filter(|&i| self.keep[i]).collect()
    }
}

/// What a scorer returned.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// One score per candidate, in order, as the plugin wrote it (the host clamps to [0, 1]).
    pub scores: Vec<f64>,
    pub note: String,
}

/// What a producer wrote for one request: per declared produced key, one value per candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct Produced {
    pub values: Vec<(DataKey, Vec<AttrValue>)>,
}

impl Produced {
    /// The values of the first produced key of `data_type`.
    pub fn get(&self, data_type: &str) -> Option<&[AttrValue]> {
        self.values
            .iter()
            .find(|(k, _)| k.data_type.as_str() == data_type)
            .map(|(_, v)| v.as_slice())
    }
}

/// One plugin instance, called as the host calls it.
pub struct Harness {
    instance: PluginInstance,
    declarations: Declarations,
}

impl Harness {
    /// Creates an instance of the factory's type from JSON parameters (`"null"` for none),
    /// as the host does for a `[[plugins]]` entry.
    /// The instance is named after its type; see [`Harness::named`] for another name.
    pub fn new(factory: &PluginFactory, parameters_json: &str) -> Result<Harness, PluginError> {
        Harness::named(factory, factory.type_name, parameters_json)
    }

    /// Like [`Harness::new`], for an entry named `instance_name` (its `name` in the
    /// configuration). A producer puts its instance name in the keys it declares.
    pub fn named(
        factory: &PluginFactory,
        instance_name: &str,
        parameters_json: &str,
    ) -> Result<Harness, PluginError> {
        let instance = (factory.create)(instance_name, parameters_json)?;
        let label = if instance_name == factory.type_name {
            instance_name.to_string()
        } else {
            format!("{instance_name} ({})", factory.type_name)
        };
        Ok(Harness::from_instance(instance.into_ffi_named(&label)))
    }

    /// Wraps an implementation built directly, without its factory.
    pub fn from_implementation(instance: Instance) -> Harness {
        Harness::from_instance(instance.into_ffi())
    }

    /// Wraps a boundary object (one created from a loaded library, for example).
    pub fn from_instance(instance: PluginInstance) -> Harness {
        let declarations = instance.declarations();
        Harness {
            instance,
            declarations,
        }
    }

    pub fn instance(&self) -> &PluginInstance {
        &self.instance
    }

    /// What the instance declared when it was wrapped.
    pub fn declarations(&self) -> &Declarations {
        &self.declarations
    }

    /// Runs a producer over one request.
    pub fn produce(
        &self,
        request: &TestRequest,
        endpoints: &[TestEndpoint],
        attrs: &Attributes,
    ) -> Result<Produced, PluginError> {
        let mut all = self.produce_batch(&[(request, endpoints, attrs)])?;
        Ok(all.remove(0))
    }

    /// Runs a producer over several requests in one call, as a batching producer is called.
    pub fn produce_batch(
        &self,
        items: &[(&TestRequest, &[TestEndpoint], &Attributes)],
    ) -> Result<Vec<Produced>, PluginError> {
        let keys = self.declarations.produces.len();
        let views: Vec<Vec<EndpointView<'_>>> =
            items.iter().map(|(_, e, _)| endpoint_views(e)).collect();
        let tables: Vec<(Vec<AttrValue>, Vec<u32>)> = items
            .iter()
            .map(|(_, e, a)| a.table(&self.declarations, e.len()))
            .collect();
        let mut offsets = Vec::with_capacity(items.len());
        let mut total = 0usize;
        for (_, endpoints, _) in items {
            offsets.push(total);
            total += keys * endpoints.len();
        }
        let mut out = vec![AttrValue::Absent; total];
        // Request views borrow their prompt lists; build them all, then call once.
        let prompts: Vec<Vec<PromptTokens<'_>>> = items
            .iter()
            .map(|(r, _, _)| {
                r.prompts
                    .iter()
                    .map(|t| PromptTokens {
                        tokens: RSlice::from_slice(t),
                    })
                    .collect()
            })
            .collect();
        let produce_items: Vec<ProduceItem<'_>> = items
            .iter()
            .enumerate()
            .map(|(i, (request, endpoints, _))| ProduceItem {
                request: RequestView {
                    id: RStr::from_str(&request.id),
                    model: RStr::from_str(&request.model),
                    cache_salt: RStr::from_str(&request.cache_salt),
                    prompts: RSlice::from_slice(&prompts[i]),
                    max_output_tokens: request.max_output_tokens,
                    now_ms: request.now_ms,
                    random_seed: request.random_seed,
                    explain: request.explain,
                },
                endpoints: RSlice::from_slice(&views[i]),
                attrs: AttrView {
                    values: RSlice::from_slice(&tables[i].0),
                    stride: endpoints.len() as u32,
                    rows: RSlice::from_slice(&tables[i].1),
                },
                out_offset: offsets[i] as u32,
            })
            .collect();
        self.instance.produce(&produce_items, &mut out)?;
        Ok(items
            .iter()
            .enumerate()
            .map(|(i, (_, endpoints, _))| {
                let width = endpoints.len();
                Produced {
                    values: self
                        .declarations
                        .produces
                        .iter()
                        .enumerate()
                        .map(|(k, key)| {
                            let start = offsets[i] + k * width;
                            (key.clone(), out[start..start + width].to_vec())
                        })
                        .collect(),
                }
            })
            .collect())
    }

    /// Runs a filter; every candidate starts kept.
    pub fn filter(
        &self,
        request: &TestRequest,
        endpoints: &[TestEndpoint],
        attrs: &Attributes,
    ) -> Result<Filtered, PluginError> {
        self.filter_from(request, endpoints, attrs, vec![true; endpoints.len()])
    }

    /// Runs a filter with `keep` as the starting flags instead of the host's all-`true`, to
    /// check that a filter writes every entry rather than relying on the start (pass all
    /// `false`). `keep` must have one flag per candidate.
    pub fn filter_from(
        &self,
        request: &TestRequest,
        endpoints: &[TestEndpoint],
        attrs: &Attributes,
        mut keep: Vec<bool>,
    ) -> Result<Filtered, PluginError> {
        assert_eq!(keep.len(), endpoints.len(), "one keep flag per candidate");
        let views = endpoint_views(endpoints);
        let (values, rows) = attrs.table(&self.declarations, endpoints.len());
        let attrs = attr_view(&values, &rows, endpoints.len());
        let mut note = RString::new();
        request.with_view(|request| {
            self.instance
                .filter(request, &views, &attrs, &mut keep, &mut note)
        })?;
        Ok(Filtered {
            keep,
            note: note.into_string(),
        })
    }

    /// Runs a scorer; every score starts at 0.
    pub fn score(
        &self,
        request: &TestRequest,
        endpoints: &[TestEndpoint],
        attrs: &Attributes,
    ) -> Result<Scored, PluginError> {
        let views = endpoint_views(endpoints);
        let (values, rows) = attrs.table(&self.declarations, endpoints.len());
        let attrs = attr_view(&values, &rows, endpoints.len());
        let mut scores = vec![0.0; endpoints.len()];
        let mut note = RString::new();
        request.with_view(|request| {
            self.instance
                .score(request, &views, &attrs, &mut scores, &mut note)
        })?;
        Ok(Scored {
            scores,
            note: note.into_string(),
        })
    }

    /// Runs a picker over the candidates' combined scores and returns the chosen positions.
    /// An output the host would refuse (a count past the candidates, a position out of
    /// range, a position twice) is returned as an error, as the host would treat it.
    pub fn pick(
        &self,
        request: &TestRequest,
        endpoints: &[TestEndpoint],
        scores: &[f64],
    ) -> Result<Vec<usize>, PluginError> {
        let views = endpoint_views(endpoints);
        let mut picked = vec![0u32; endpoints.len()];
        let count = request
            .with_view(|request| self.instance.pick(request, &views, scores, &mut picked))?;
        if count > picked.len() {
            return Err(PluginError::failed(format!(
                "the picker chose {count} of {} candidates",
                picked.len()
            )));
        }
        let mut chosen: Vec<usize> = Vec::with_capacity(count);
        for &position in &picked[..count] {
            let position = position as usize;
            if position >= endpoints.len() || chosen.contains(&position) {
                return Err(PluginError::failed(format!(
                    "the picker returned position {position} (out of range or twice) among {} \
                     candidates",
                    endpoints.len()
                )));
            }
            chosen.push(position);
        }
        Ok(chosen)
    }

    /// Tells the instance the request was sent to `endpoint` (the `slot`-th candidate).
    pub fn dispatched(
        &self,
        request: &TestRequest,
        endpoint: &TestEndpoint,
        slot: usize,
    ) -> Result<(), PluginError> {
        let view = endpoint.view(slot);
        request.with_view(|request| self.instance.dispatched(request, &view))
    }

    /// Tells the instance a dispatched request ended with `outcome`.
    pub fn completed(
        &self,
        request: &TestRequest,
        endpoint: &TestEndpoint,
        slot: usize,
        outcome: Outcome,
    ) -> Result<(), PluginError> {
        let view = endpoint.view(slot);
        request.with_view(|request| self.instance.completed(request, &view, outcome))
    }

    /// The instance's state snapshot (the `state` extension), `None` when it keeps none.
    #[cfg(not(feature = "api-1-0"))]
    pub fn state(&self) -> Result<Option<serde_json::Value>, PluginError> {
        let text = self.instance.extension(crate::sdk::extensions::STATE, "")?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| PluginError::failed(format!("state is not JSON: {e}")))?;
        Ok((!value.is_null()).then_some(value))
    }

    /// The quiet gap the instance's batch window declares (the `batch_quiet` extension),
    /// `None` for a fixed window.
    #[cfg(not(feature = "api-1-1"))]
    pub fn batch_quiet_ms(&self) -> Result<Option<u64>, PluginError> {
        let text = self
            .instance
            .extension(crate::sdk::extensions::BATCH_QUIET, "")?;
        serde_json::from_str(&text)
            .map_err(|e| PluginError::failed(format!("batch_quiet is not a number: {e}")))
    }

    /// Whether the instance wants KV-cache events (the `kv_events` extension asked without
    /// input, as the host does at wiring).
    #[cfg(not(feature = "api-1-2"))]
    pub fn wants_kv_events(&self) -> Result<bool, PluginError> {
        let text = self
            .instance
            .extension(crate::sdk::extensions::KV_EVENTS, "")?;
        Ok(text == "true")
    }

    /// Delivers one endpoint's KV-cache events, as the host's subscriber does.
    #[cfg(not(feature = "api-1-2"))]
    pub fn kv_events(&self, batch: &crate::kv::KvEventBatch) -> Result<(), PluginError> {
        let text = serde_json::to_string(batch)
            .map_err(|e| PluginError::failed(format!("cannot encode the batch: {e}")))?;
        self.instance
            .extension(crate::sdk::extensions::KV_EVENTS, &text)
            .map(drop)
    }

    /// What a later instance needs to take this one's state over (the `export_state`
    /// extension), `None` when it keeps none.
    #[cfg(not(feature = "api-1-2"))]
    pub fn export_state(&self) -> Result<Option<serde_json::Value>, PluginError> {
        let text = self
            .instance
            .extension(crate::sdk::extensions::EXPORT_STATE, "")?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| PluginError::failed(format!("export_state is not JSON: {e}")))?;
        Ok((!value.is_null()).then_some(value))
    }

    /// Hands the instance a snapshot an earlier instance answered for `export_state`.
    #[cfg(not(feature = "api-1-2"))]
    pub fn import_state(&self, state: &serde_json::Value) -> Result<(), PluginError> {
        self.instance
            .extension(crate::sdk::extensions::IMPORT_STATE, &state.to_string())
            .map(drop)
    }
}

fn attr_view<'a>(values: &'a [AttrValue], rows: &'a [u32], width: usize) -> AttrView<'a> {
    AttrView {
        values: RSlice::from_slice(values),
        stride: width as u32,
        rows: RSlice::from_slice(rows),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::ConsumedKey;
    use crate::sdk::{
        Declare, Filter, FilterOutput, Picker, ProduceBatch, Producer, ScoreOutput, Scorer,
    };

    struct LoadScorer;

    impl Scorer for LoadScorer {
        fn declare(&self) -> Declare {
            Declare::default().optionally("InFlightLoad", "inflight-load-producer")
        }

        fn score(
            &self,
            _request: &RequestView<'_>,
            endpoints: &[EndpointView<'_>],
            attrs: &AttrView<'_>,
            out: ScoreOutput<'_>,
        ) -> Result<(), PluginError> {
            for (score, endpoint) in out.scores.iter_mut().zip(endpoints) {
                let load = attrs
                    .get(0, endpoint)
                    .and_then(AttrValue::in_flight_load)
                    .map_or(0, |l| l.requests);
                *score = 1.0 / (1.0 + load as f64 + endpoint.metrics.waiting_requests as f64);
            }
            Ok(())
        }
    }

    struct Reckless;

    impl Picker for Reckless {
        fn pick(
            &self,
            _request: &RequestView<'_>,
            _endpoints: &[EndpointView<'_>],
            _scores: &[f64],
            picked: &mut [u32],
        ) -> Result<usize, PluginError> {
            picked[0] = 7;
            Ok(1)
        }
    }

    #[test]
    fn a_scorer_sees_declared_attributes_and_metrics() {
        let harness = Harness::from_implementation(Instance::scorer(LoadScorer));
        assert_eq!(
            harness.declarations().consumes.as_slice(),
            [ConsumedKey {
                key: DataKey::new("InFlightLoad", "inflight-load-producer"),
                required: false
            }]
        );
        let mut endpoints = TestEndpoint::several(3);
        endpoints[2] = endpoints[2].clone().queue(0, 1);
        let attrs = Attributes::new().set_on(
            DataKey::new("InFlightLoad", "inflight-load-producer"),
            1,
            Attributes::in_flight(3, 100),
        );
        let scored = harness
            .score(&TestRequest::new("m"), &endpoints, &attrs)
            .unwrap();
        assert_eq!(scored.scores, [1.0, 0.25, 0.5]);
        // A key the scorer does not declare is not visible to it.
        let other = Attributes::new().set(
            DataKey::new("InFlightLoad", "someone-else"),
            vec![Attributes::in_flight(9, 9); 3],
        );
        let scored = harness
            .score(&TestRequest::new("m"), &endpoints, &other)
            .unwrap();
        assert_eq!(scored.scores, [1.0, 1.0, 0.5]);
    }

    /// Keeps the candidates without waiting requests, writing only the ones it drops.
    struct DropsBusy;

    impl Filter for DropsBusy {
        fn filter(
            &self,
            _request: &RequestView<'_>,
            endpoints: &[EndpointView<'_>],
            _attrs: &AttrView<'_>,
            out: FilterOutput<'_>,
        ) -> Result<(), PluginError> {
            for (keep, endpoint) in out.keep.iter_mut().zip(endpoints) {
                if endpoint.metrics.waiting_requests > 0 {
                    *keep = false;
                }
            }
            Ok(())
        }
    }

    #[test]
    fn a_filter_can_start_from_other_flags() {
        let harness = Harness::from_implementation(Instance::filter(DropsBusy));
        let mut endpoints = TestEndpoint::several(3);
        endpoints[1] = endpoints[1].clone().queue(0, 2);
        let request = TestRequest::new("m");
        let attrs = Attributes::new();
        let filtered = harness.filter(&request, &endpoints, &attrs).unwrap();
        assert_eq!(filtered.keep, [true, false, true]);
        assert_eq!(filtered.kept(), [0, 2]);
        // Started from all `false`, the flags it never writes stay `false`.
        let filtered = harness
            .filter_from(&request, &endpoints, &attrs, vec![false; 3])
            .unwrap();
        assert_eq!(filtered.keep, [false; 3]);
    }

    /// Produces nothing, under a key named after its instance.
    struct Named(String);

    impl Producer for Named {
        fn declare(&self) -> Declare {
            Declare::default().produces("Thing", &self.0)
        }

        fn produce(
            &self,
            _items: &[ProduceItem<'_>],
            _out: &mut ProduceBatch<'_>,
        ) -> Result<(), PluginError> {
            Ok(())
        }
    }

    static NAMED: PluginFactory = PluginFactory {
        type_name: "named-producer",
        kind: crate::abi::PluginKind::Producer,
        stability: crate::abi::Stability::Beta,
        description: "",
        parameters: &[],
        create: |name, _| Ok(Instance::producer(Named(name.to_string()))),
    };

    #[test]
    fn an_instance_can_be_created_under_another_name() {
        let by_type = Harness::new(&NAMED, "null").unwrap();
        assert_eq!(
            by_type.declarations().produces.as_slice(),
            [DataKey::new("Thing", "named-producer")]
        );
        let named = Harness::named(&NAMED, "mine", "null").unwrap();
        assert_eq!(
            named.declarations().produces.as_slice(),
            [DataKey::new("Thing", "mine")]
        );
    }

    #[test]
    fn a_picker_output_the_host_would_refuse_is_an_error() {
        let harness = Harness::from_implementation(Instance::picker(Reckless));
        let error = harness
            .pick(
                &TestRequest::new("m"),
                &TestEndpoint::several(2),
                &[0.5, 0.5],
            )
            .unwrap_err();
        assert!(error.message.contains("position 7"), "{error}");
    }

    /// Counts the blocks it was told about and keeps that count as its state.
    struct Listener(std::sync::Mutex<u64>);

    impl Producer for Listener {
        fn declare(&self) -> Declare {
            Declare {
                kv_events: true,
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

        fn kv_events(&self, batch: &crate::kv::KvEventBatch) -> Result<(), PluginError> {
            let mut blocks = self.0.lock().unwrap();
            for event in &batch.events {
                match event {
                    crate::kv::KvEvent::BlockStored(stored) => {
                        *blocks += stored.block_hashes.len() as u64
                    }
                    crate::kv::KvEvent::Reset(_) => *blocks = 0,
                    _ => {}
                }
            }
            Ok(())
        }

        fn state(&self) -> Option<serde_json::Value> {
            Some(serde_json::json!(*self.0.lock().unwrap()))
        }

        fn import_state(&self, state: serde_json::Value) -> Result<(), PluginError> {
            let blocks = state
                .as_u64()
                .ok_or_else(|| PluginError::failed("not a count"))?;
            *self.0.lock().unwrap() = blocks;
            Ok(())
        }
    }

    #[test]
    fn kv_events_and_imported_state_reach_a_producer_that_asks_for_them() {
        use crate::kv::{KvEvent, KvEventBatch, Reset, ResetReason, StoredBlocks};
        let harness =
            Harness::from_implementation(Instance::producer(Listener(Default::default())));
        assert!(harness.wants_kv_events().unwrap());
        let stored = KvEvent::BlockStored(StoredBlocks {
            block_hashes: vec![1, u64::MAX],
            token_ids: vec![7; 32],
            block_size: 16,
            ..StoredBlocks::default()
        });
        let batch = KvEventBatch {
            host_index: 3,
            endpoint: "e".into(),
            now_ms: 5,
            events: vec![stored],
        };
        harness.kv_events(&batch).unwrap();
        assert_eq!(harness.state().unwrap(), Some(serde_json::json!(2)));

        let reset = KvEvent::Reset(Reset {
            reason: ResetReason::Gap,
            known: false,
        });
        harness
            .kv_events(&KvEventBatch {
                events: vec![reset],
                ..batch
            })
            .unwrap();
        assert_eq!(harness.state().unwrap(), Some(serde_json::json!(0)));

        harness.import_state(&serde_json::json!(40)).unwrap();
        assert_eq!(harness.state().unwrap(), Some(serde_json::json!(40)));
        // Without an export of its own, the instance hands over its state.
        assert_eq!(harness.export_state().unwrap(), Some(serde_json::json!(40)));
        let refused = harness
            .import_state(&serde_json::json!("forty"))
            .unwrap_err();
        assert_eq!(refused.kind, crate::ErrorKind::Failed);
    }

    #[test]
    fn a_plugin_that_keeps_no_state_refuses_kv_events_and_imports_as_unsupported() {
        let harness = Harness::from_implementation(Instance::scorer(LoadScorer));
        assert!(!harness.wants_kv_events().unwrap());
        let refused = harness.import_state(&serde_json::json!({})).unwrap_err();
        assert_eq!(refused.kind, crate::ErrorKind::Unsupported);
    }

    #[test]
    fn a_value_of_the_request_is_read_from_the_first_candidate() {
        let values = [
            AttrValue::Custom(b"note".to_vec().into()),
            AttrValue::Absent,
            AttrValue::Absent,
            Attributes::in_flight(1, 2),
        ];
        let attrs = attr_view(&values, &[0, 1], 2);
        let endpoints: Vec<TestEndpoint> = TestEndpoint::several(2);
        let views: Vec<EndpointView<'_>> = endpoints
            .iter()
            .enumerate()
            .map(|(slot, e)| e.view(slot))
            .collect();
        let first = attrs.of_request(0, &views).expect("on the first candidate");
        assert_eq!(first.custom(), Some(&b"note"[..]));
        assert_eq!(
            attrs.of_request(1, &views),
            None,
            "absent on the first candidate"
        );
        assert_eq!(attrs.of_request(0, &[]), None, "no candidates");
        assert_eq!(values[3].custom(), None);
    }
}
