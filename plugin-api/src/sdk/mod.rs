//! The safe side of the interface: what a plugin author implements.
//!
//! Implement one of [`Producer`], [`Filter`], [`Scorer`] or [`Picker`], describe the type in a
//! `static` [`PluginFactory`], and list the factories with [`crate::export_plugins!`]. Every
//! entry point runs under `catch_unwind` inside the library, so a panic becomes an
//! [`ErrorKind::Panicked`](crate::ErrorKind::Panicked) error for that one call.

mod export;
pub mod extensions;
pub mod log;
mod params;
mod shims;

pub use export::{create_instance, describe_types, install_host};
pub use params::parse_parameters;
pub use shims::Instance;

use abi_stable::std_types::RString;

use crate::abi::{
    AttrValue, AttrView, BatchPolicy, ConsumedKey, DataKey, EndpointView, Outcome, PluginError,
    PluginKind, ProduceItem, RequestView, Stability,
};

/// What an instance reads and writes, and how it wants to be called.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Declare {
    pub produces: Vec<DataKey>,
    pub consumes: Vec<ConsumedKey>,
    pub batch: Option<BatchPolicy>,
    /// Time budget of one produce call in milliseconds; `None` keeps the host's default.
    pub timeout_ms: Option<u64>,
    /// Since 1.2, with `batch` set: seal the window once no request has joined it for this
    /// many milliseconds (still at most `window_ms` after it opened); `None` keeps the fixed
    /// window. A host older than 1.2 never asks and keeps the fixed window.
    #[cfg(not(feature = "api-1-1"))]
    pub batch_quiet_ms: Option<u64>,
    /// Since 1.3: the instance wants the endpoints' KV-cache events
    /// ([`Producer::kv_events`]). A host older than 1.3 never delivers them.
    #[cfg(not(feature = "api-1-2"))]
    pub kv_events: bool,
}

impl Declare {
    pub fn produces(mut self, data_type: &str, producer: &str) -> Self {
        self.produces.push(DataKey::new(data_type, producer));
        self
    }

    pub fn requires(mut self, data_type: &str, producer: &str) -> Self {
        self.consumes.push(ConsumedKey {
            key: DataKey::new(data_type, producer),
            required: true,
        });
        self
    }

    pub fn optionally(mut self, data_type: &str, producer: &str) -> Self {
        self.consumes.push(ConsumedKey {
            key: DataKey::new(data_type, producer),
            required: false,
        });
        self
    }
}

/// The outputs of one produce call: values per item, per declared produced key, per endpoint.
pub struct ProduceBatch<'a> {
    out: &'a mut [AttrValue],
    /// How many keys the producer declared, read off the buffer the host sized for them.
    keys: usize,
}

impl<'a> ProduceBatch<'a> {
    #[inline]
    pub(crate) fn new(out: &'a mut [AttrValue], items: &[ProduceItem<'_>]) -> Self {
        // The host gives every item `keys × endpoints` values.
        let width: usize = items.iter().map(|item| item.endpoints.len()).sum();
        let keys = out.len().checked_div(width).unwrap_or(0);
        ProduceBatch { out, keys }
    }

    /// Sets the `key`-th declared produced value of `item` on its `endpoint`-th candidate.
    /// A key past the declared ones, or an endpoint past the item's candidates, is ignored:
    /// a write never reaches another key's or another request's values.
    #[inline]
    pub fn put(&mut self, item: &ProduceItem<'_>, key: usize, endpoint: usize, value: AttrValue) {
        let width = item.endpoints.len();
        if endpoint >= width || key >= self.keys {
            return;
        }
        let index = item.out_offset as usize + key * width + endpoint;
        if let Some(slot) = self.out.get_mut(index) {
            *slot = value;
        }
    }
}

/// A data producer: attaches facts to the candidate endpoints of requests.
pub trait Producer: Send + Sync + 'static {
    fn declare(&self) -> Declare;

    /// Called once per request, or once per sealed batch when [`Declare::batch`] is set.
    fn produce(
        &self,
        items: &[ProduceItem<'_>],
        out: &mut ProduceBatch<'_>,
    ) -> Result<(), PluginError>;

    /// The request was sent to `endpoint`.
    fn dispatched(&self, _request: &RequestView<'_>, _endpoint: &EndpointView<'_>) {}

    /// A dispatched request finished, failed or was cancelled.
    fn completed(
        &self,
        _request: &RequestView<'_>,
        _endpoint: &EndpointView<'_>,
        _outcome: Outcome,
    ) {
    }

    /// A JSON snapshot of the instance's state for operators (the `state` extension).
    fn state(&self) -> Option<serde_json::Value> {
        None
    }

    /// Since 1.3: takes over a snapshot an earlier instance answered from [`Producer::state`]
    /// (the `import_state` extension), e.g. across a reload that changed the library or the
    /// parameters. The default cannot.
    #[cfg(not(feature = "api-1-2"))]
    fn import_state(&self, _state: serde_json::Value) -> Result<(), PluginError> {
        Err(cannot_import())
    }

    /// Since 1.3, with [`Declare::kv_events`]: one endpoint's KV-cache events, in the order
    /// the engine published them, or a reset from the host. Called off the decision path,
    /// possibly from another thread than `produce`.
    #[cfg(not(feature = "api-1-2"))]
    fn kv_events(&self, _batch: &crate::kv::KvEventBatch) -> Result<(), PluginError> {
        Err(PluginError::unsupported("this plugin takes no KV events"))
    }
}

#[cfg(not(feature = "api-1-2"))]
fn cannot_import() -> PluginError {
    PluginError::unsupported("this plugin cannot take over an earlier instance's state")
}

/// What a filter writes besides its keep mask.
pub struct FilterOutput<'a> {
    pub keep: &'a mut [bool],
    /// Free text for the decision record; written only when the request is explained.
    pub note: &'a mut RString,
}

/// A filter: narrows the candidates. `keep` starts all `true`.
pub trait Filter: Send + Sync + 'static {
    fn declare(&self) -> Declare {
        Declare::default()
    }

    fn filter(
        &self,
        request: &RequestView<'_>,
        endpoints: &[EndpointView<'_>],
        attrs: &AttrView<'_>,
        out: FilterOutput<'_>,
    ) -> Result<(), PluginError>;

    fn state(&self) -> Option<serde_json::Value> {
        None
    }

    /// Since 1.3: as [`Producer::import_state`].
    #[cfg(not(feature = "api-1-2"))]
    fn import_state(&self, _state: serde_json::Value) -> Result<(), PluginError> {
        Err(cannot_import())
    }
}

/// What a scorer writes.
pub struct ScoreOutput<'a> {
    /// One score per endpoint, starting at 0. The host clamps them to [0, 1].
    pub scores: &'a mut [f64],
    pub note: &'a mut RString,
}

/// A scorer: rates every remaining candidate.
pub trait Scorer: Send + Sync + 'static {
    fn declare(&self) -> Declare {
        Declare::default()
    }

    fn score(
        &self,
        request: &RequestView<'_>,
        endpoints: &[EndpointView<'_>],
        attrs: &AttrView<'_>,
        out: ScoreOutput<'_>,
    ) -> Result<(), PluginError>;

    fn state(&self) -> Option<serde_json::Value> {
        None
    }

    /// Since 1.3: as [`Producer::import_state`].
    #[cfg(not(feature = "api-1-2"))]
    fn import_state(&self, _state: serde_json::Value) -> Result<(), PluginError> {
        Err(cannot_import())
    }
}

/// A picker: chooses among the scored candidates.
pub trait Picker: Send + Sync + 'static {
    /// Writes chosen positions into `picked` (its length is the candidate count) and returns
    /// how many it chose.
    fn pick(
        &self,
        request: &RequestView<'_>,
        endpoints: &[EndpointView<'_>],
        scores: &[f64],
        picked: &mut [u32],
    ) -> Result<usize, PluginError>;
}

/// Documentation of one parameter, as `static` data.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    pub name: &'static str,
    pub value_type: &'static str,
    pub default: &'static str,
    pub range: &'static str,
    pub description: &'static str,
}

/// One plugin type a library carries.
pub struct PluginFactory {
    pub type_name: &'static str,
    pub kind: PluginKind,
    pub stability: Stability,
    pub description: &'static str,
    pub parameters: &'static [Param],
    /// Builds an instance from its name and JSON parameters (`null` when none were given).
    pub create: fn(instance_name: &str, parameters: &str) -> Result<Instance, PluginError>,
}
