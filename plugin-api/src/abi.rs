//! Boundary types: everything that crosses between the host and a plugin library.
//!
//! Every type here is `#[repr(C)]` and derives `StableAbi`, so the host's loader compares its
//! own view of each layout with the library's and refuses a library whose layouts differ.
//! These types are frozen for the 1.x line: fields are never added, removed or reordered
//! within a major version. Growth goes through [`PluginInstance::extension`] and
//! [`AttrValue::Custom`].
//!
//! Calls are per request (or per sealed batch), over all candidate endpoints at once. Outputs
//! are written into buffers the host owns, so a warm call allocates nothing per endpoint.

use std::ffi::c_void;
use std::fmt;

use abi_stable::library::RootModule;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{RResult, RSlice, RSliceMut, RStr, RString, RVec};
use abi_stable::StableAbi;

/// The version of this crate a library was built against, as `major.minor.patch`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl ApiVersion {
    /// The version of the plugin API this code was compiled against.
    pub const CURRENT: ApiVersion = ApiVersion {
        major: parse_u32(env!("CARGO_PKG_VERSION_MAJOR")),
        minor: parse_u32(env!("CARGO_PKG_VERSION_MINOR")),
        patch: parse_u32(env!("CARGO_PKG_VERSION_PATCH")),
    };

    /// Whether a host built against `self` can load a library built against `library`:
    /// same major, and the library's minor no newer than the host's.
    pub const fn can_load(self, library: ApiVersion) -> bool {
        self.major == library.major && library.minor <= self.minor
    }
}

const fn parse_u32(digits: &str) -> u32 {
    let bytes = digits.as_bytes();
    let mut value = 0u32;
    let mut i = 0;
    while i < bytes.len() {
        value = value * 10 + (bytes[i] - b'0') as u32;
        i += 1;
    }
    value
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The stage of the pipeline a plugin type serves.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PluginKind {
    Producer,
    Filter,
    Scorer,
    Picker,
}

impl PluginKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PluginKind::Producer => "producer",
            PluginKind::Filter => "filter",
            PluginKind::Scorer => "scorer",
            PluginKind::Picker => "picker",
        }
    }
}

impl fmt::Display for PluginKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How settled a plugin type is. Alpha types load only when experimental plugins are allowed.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stability {
    Alpha,
    Beta,
    Stable,
}

impl Stability {
    pub fn as_str(self) -> &'static str {
        match self {
            Stability::Alpha => "alpha",
            Stability::Beta => "beta",
            Stability::Stable => "stable",
        }
    }
}

impl fmt::Display for Stability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Documentation of one parameter of a plugin type.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct ParamDoc {
    /// The parameter's name in TOML, camelCase.
    pub name: RString,
    /// The value type, e.g. `integer`, `number`, `string`, `bool`.
    pub value_type: RString,
    /// The default, rendered as TOML.
    pub default: RString,
    /// The valid values, e.g. `1..=10000` or `"requests" | "tokens"`.
    pub range: RString,
    pub description: RString,
}

/// What a library says about one plugin type it carries.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct PluginTypeInfo {
    pub type_name: RString,
    pub kind: PluginKind,
    pub stability: Stability,
    pub description: RString,
    pub parameters: RVec<ParamDoc>,
}

/// Identifies a piece of data: its type (e.g. `PrefixCacheMatchInfo`) and the name of the
/// producer instance that writes it. See [`crate::keys`] for the well-known names.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub struct DataKey {
    pub data_type: RString,
    pub producer: RString,
}

impl DataKey {
    pub fn new(data_type: &str, producer: &str) -> Self {
        DataKey {
            data_type: data_type.into(),
            producer: producer.into(),
        }
    }
}

impl fmt::Display for DataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.data_type, self.producer)
    }
}

/// A key a plugin reads. A required key without a producer is a start-up error (or makes the
/// host create the key's default producer); an optional key without one is absent.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct ConsumedKey {
    pub key: DataKey,
    pub required: bool,
}

/// A producer's request to be called once per batch of requests gathered over a window.
/// The window opens at the first request, seals `window_ms` later and does not slide; since
/// 1.2 a producer may also declare a quiet gap that seals it sooner (the `batch_quiet`
/// capability), without changing this type.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPolicy {
    pub window_ms: u64,
    /// The most requests one window holds; a later request in the same window gets this
    /// producer's error. `-1` means unlimited.
    pub max_batch: i64,
}

/// What an instance declares once, when it is created. The host resolves every key to an
/// index at wiring time; nothing here is looked at per request.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct Declarations {
    pub produces: RVec<DataKey>,
    pub consumes: RVec<ConsumedKey>,
    /// `batch_window_ms > 0` makes this a batching producer (see [`BatchPolicy`]).
    pub batch_window_ms: u64,
    pub batch_max: i64,
    /// How long one produce call may take; 0 leaves the host's default.
    pub timeout_ms: u64,
}

impl Declarations {
    #[inline]
    pub fn batch(&self) -> Option<BatchPolicy> {
        (self.batch_window_ms > 0).then_some(BatchPolicy {
            window_ms: self.batch_window_ms,
            max_batch: self.batch_max,
        })
    }
}

/// Load and cache facts of one candidate endpoint, as the host last saw them.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Default)]
pub struct EndpointMetrics {
    pub running_requests: u32,
    pub waiting_requests: u32,
    /// KV-cache utilisation in [0, 1].
    pub kv_cache_usage: f64,
    /// Tokens per KV block on the model server; 0 when unknown.
    pub cache_block_size: u32,
    /// KV blocks on the model server; 0 when unknown.
    pub cache_num_blocks: u64,
    /// Only in the layout-mismatch test fixture, never in a release.
    #[cfg(feature = "layout-drift-fixture")]
    pub cache_hit_rate: f64,
}

/// One candidate endpoint of a request.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct EndpointView<'a> {
    /// The endpoint's position in the request's candidate list; indexes [`AttrView`].
    pub slot: u32,
    /// The host's index of this endpoint, the same for every request while the endpoint is
    /// known; stateful plugins index their per-endpoint state with it.
    pub host_index: u32,
    /// Stable identity, `namespace/name` (namespace may be empty).
    pub id: RStr<'a>,
    /// `host:port` the request would be sent to.
    pub address: RStr<'a>,
    /// The value of the endpoint's `role` label, empty when absent.
    pub role: RStr<'a>,
    pub metrics: EndpointMetrics,
}

/// The token ids of one prompt of a request.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct PromptTokens<'a> {
    pub tokens: RSlice<'a, u32>,
}

/// One request being scheduled.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct RequestView<'a> {
    pub id: RStr<'a>,
    pub model: RStr<'a>,
    pub cache_salt: RStr<'a>,
    /// The tokenized prompts (one for chat and most completions); empty when the request
    /// could not be tokenized.
    pub prompts: RSlice<'a, PromptTokens<'a>>,
    /// `-1` when the request does not say.
    pub max_output_tokens: i64,
    /// The host's clock in milliseconds (virtual in replay and simulation).
    pub now_ms: u64,
    /// Seed for any randomness of this decision, drawn from the host's seeded generator.
    pub random_seed: u64,
    /// Whether the host records this decision; plugins then fill their notes.
    pub explain: bool,
}

impl<'a> RequestView<'a> {
    /// Total number of prompt tokens over all prompts.
    #[inline]
    pub fn token_count(&self) -> usize {
        self.prompts.iter().map(|p| p.tokens.len()).sum()
    }
}

/// How much of a request's prompt an endpoint already holds, in blocks.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixCacheMatchInfo {
    pub match_blocks: u64,
    pub total_blocks: u64,
    pub block_size_tokens: u64,
}

/// Requests and tokens dispatched to an endpoint and not yet completed.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InFlightLoad {
    pub requests: i64,
    pub tokens: i64,
}

/// A latency model's prediction for this request on an endpoint.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Default)]
pub struct LatencyPrediction {
    pub ttft_ms: f64,
    pub tpot_ms: f64,
}

/// One attribute value of one endpoint for one request.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, PartialEq, Default)]
pub enum AttrValue {
    #[default]
    Absent,
    PrefixCacheMatch(PrefixCacheMatchInfo),
    InFlightLoad(InFlightLoad),
    LatencyPrediction(LatencyPrediction),
    /// A third party's own value, encoded as its producer and consumers agree (the key's
    /// data type names the encoding).
    Custom(RVec<u8>),
}

impl AttrValue {
    #[inline]
    pub fn prefix_cache_match(&self) -> Option<PrefixCacheMatchInfo> {
        match self {
            AttrValue::PrefixCacheMatch(v) => Some(*v),
            _ => None,
        }
    }

    #[inline]
    pub fn in_flight_load(&self) -> Option<InFlightLoad> {
        match self {
            AttrValue::InFlightLoad(v) => Some(*v),
            _ => None,
        }
    }

    #[inline]
    pub fn latency_prediction(&self) -> Option<LatencyPrediction> {
        match self {
            AttrValue::LatencyPrediction(v) => Some(*v),
            _ => None,
        }
    }

    #[inline]
    pub fn is_absent(&self) -> bool {
        matches!(self, AttrValue::Absent)
    }

    /// The bytes of a [`AttrValue::Custom`] value.
    #[inline]
    pub fn custom(&self) -> Option<&[u8]> {
        match self {
            AttrValue::Custom(bytes) => Some(bytes.as_slice()),
            _ => None,
        }
    }
}

/// A plugin's read access to the attributes of one request's candidates.
///
/// `values` holds one row of `stride` values per data key the host knows; `rows` maps each key
/// the plugin declared in [`Declarations::consumes`] (same order) to its row, or `u32::MAX`
/// when nothing produces it.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct AttrView<'a> {
    pub values: RSlice<'a, AttrValue>,
    pub stride: u32,
    pub rows: RSlice<'a, u32>,
}

impl<'a> AttrView<'a> {
    /// An empty view, for plugins that consume nothing.
    pub const EMPTY: AttrView<'static> = AttrView {
        values: RSlice::from_slice(&[]),
        stride: 0,
        rows: RSlice::from_slice(&[]),
    };

    /// The value of the `consumed`-th declared key on `endpoint`, if one was produced.
    #[inline]
    pub fn get(&self, consumed: usize, endpoint: &EndpointView<'_>) -> Option<&'a AttrValue> {
        let row = *self.rows.as_slice().get(consumed)?;
        if row == u32::MAX {
            return None;
        }
        let index = row as usize * self.stride as usize + endpoint.slot as usize;
        self.values
            .as_slice()
            .get(index)
            .filter(|value| !value.is_absent())
    }

    /// The value of the `consumed`-th declared key when it is one per request rather than one
    /// per endpoint: such values sit on the first candidate only.
    #[inline]
    pub fn of_request(
        &self,
        consumed: usize,
        endpoints: &[EndpointView<'_>],
    ) -> Option<&'a AttrValue> {
        self.get(consumed, endpoints.first()?)
    }
}

/// One request of a produce call. A non-batching producer gets exactly one item per call.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct ProduceItem<'a> {
    pub request: RequestView<'a>,
    pub endpoints: RSlice<'a, EndpointView<'a>>,
    pub attrs: AttrView<'a>,
    /// Where this item's outputs start in the call's output buffer. The item owns
    /// `produces.len() × endpoints.len()` values from there, key-major.
    pub out_offset: u32,
}

/// How a dispatched request ended.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Finished,
    Failed,
    Cancelled,
}

/// Why a plugin call failed.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A parameter is invalid; `field` names it.
    InvalidParameter,
    /// The call could not do its work.
    Failed,
    /// The plugin panicked; the SDK caught it.
    Panicked,
    /// The call or extension is not provided by this plugin.
    Unsupported,
}

/// An error returned across the boundary.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct PluginError {
    pub kind: ErrorKind,
    /// The parameter at fault (camelCase, dotted for nested fields), or empty.
    pub field: RString,
    pub message: RString,
}

impl PluginError {
    pub fn failed(message: impl fmt::Display) -> Self {
        PluginError {
            kind: ErrorKind::Failed,
            field: RString::new(),
            message: message.to_string().into(),
        }
    }

    pub fn invalid_parameter(field: &str, message: impl fmt::Display) -> Self {
        PluginError {
            kind: ErrorKind::InvalidParameter,
            field: field.into(),
            message: message.to_string().into(),
        }
    }

    pub fn unsupported(message: impl fmt::Display) -> Self {
        PluginError {
            kind: ErrorKind::Unsupported,
            field: RString::new(),
            message: message.to_string().into(),
        }
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PluginError {}

/// Severity of a log line sent by a plugin.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// Functions the host lends to a library, handed over once right after loading.
#[repr(C)]
#[derive(StableAbi, Clone, Copy)]
pub struct HostCallbacks {
    /// Emits one log line under the host's logging, with the plugin's target.
    pub log: extern "C" fn(level: LogLevel, target: RStr<'_>, message: RStr<'_>),
}

/// The entry points of one plugin instance. Frozen for the 1.x line.
#[repr(C)]
#[derive(StableAbi)]
pub struct InstanceVTable {
    pub declarations: unsafe extern "C" fn(this: *const c_void) -> Declarations,
    pub produce: unsafe extern "C" fn(
        this: *const c_void,
        items: RSlice<'_, ProduceItem<'_>>,
        out: RSliceMut<'_, AttrValue>,
    ) -> RResult<(), PluginError>,
    pub filter: unsafe extern "C" fn(
        this: *const c_void,
        request: &RequestView<'_>,
        endpoints: RSlice<'_, EndpointView<'_>>,
        attrs: &AttrView<'_>,
        keep: RSliceMut<'_, bool>,
        note: &mut RString,
    ) -> RResult<(), PluginError>,
    pub score: unsafe extern "C" fn(
        this: *const c_void,
        request: &RequestView<'_>,
        endpoints: RSlice<'_, EndpointView<'_>>,
        attrs: &AttrView<'_>,
        scores: RSliceMut<'_, f64>,
        note: &mut RString,
    ) -> RResult<(), PluginError>,
    pub pick: unsafe extern "C" fn(
        this: *const c_void,
        request: &RequestView<'_>,
        endpoints: RSlice<'_, EndpointView<'_>>,
        scores: RSlice<'_, f64>,
        picked: RSliceMut<'_, u32>,
    ) -> RResult<u32, PluginError>,
    pub dispatched: unsafe extern "C" fn(
        this: *const c_void,
        request: &RequestView<'_>,
        endpoint: &EndpointView<'_>,
    ) -> RResult<(), PluginError>,
    pub completed: unsafe extern "C" fn(
        this: *const c_void,
        request: &RequestView<'_>,
        endpoint: &EndpointView<'_>,
        outcome: Outcome,
    ) -> RResult<(), PluginError>,
    /// Optional capabilities by name, JSON in and out. Unknown names answer
    /// [`ErrorKind::Unsupported`]; this is how later minors add features without changing
    /// any layout.
    pub extension: unsafe extern "C" fn(
        this: *const c_void,
        name: RStr<'_>,
        input: RStr<'_>,
    ) -> RResult<RString, PluginError>,
    pub drop: unsafe extern "C" fn(this: *mut c_void),
}

/// An owned plugin instance living in a library. Dropping it releases the instance inside the
/// library that created it.
#[repr(C)]
#[derive(StableAbi)]
pub struct PluginInstance {
    state: *mut c_void,
    vtable: &'static InstanceVTable,
}

// SAFETY: the SDK only builds instances from `Send + Sync` implementations, and every entry
// point takes the state by shared reference.
unsafe impl Send for PluginInstance {}
unsafe impl Sync for PluginInstance {}

impl PluginInstance {
    /// Wraps a state pointer and the vtable that knows how to use it.
    ///
    /// # Safety
    /// `state` must stay valid until `vtable.drop` is called on it, and every vtable entry
    /// must be sound for it when called from any thread.
    pub unsafe fn from_raw(state: *mut c_void, vtable: &'static InstanceVTable) -> Self {
        PluginInstance { state, vtable }
    }

    pub fn declarations(&self) -> Declarations {
        // SAFETY: the state is valid for the lifetime of `self` (see `from_raw`).
        unsafe { (self.vtable.declarations)(self.state) }
    }

    #[inline]
    pub fn produce(
        &self,
        items: &[ProduceItem<'_>],
        out: &mut [AttrValue],
    ) -> Result<(), PluginError> {
        // SAFETY: as in `declarations`.
        unsafe { (self.vtable.produce)(self.state, items.into(), out.into()) }.into_result()
    }

    #[inline]
    pub fn filter(
        &self,
        request: &RequestView<'_>,
        endpoints: &[EndpointView<'_>],
        attrs: &AttrView<'_>,
        keep: &mut [bool],
        note: &mut RString,
    ) -> Result<(), PluginError> {
        // SAFETY: as in `declarations`.
        unsafe {
            (self.vtable.filter)(
                self.state,
                request,
                endpoints.into(),
                attrs,
                keep.into(),
                note,
            )
        }
        .into_result()
    }

    #[inline]
    pub fn score(
        &self,
        request: &RequestView<'_>,
        endpoints: &[EndpointView<'_>],
        attrs: &AttrView<'_>,
        scores: &mut [f64],
        note: &mut RString,
    ) -> Result<(), PluginError> {
        // SAFETY: as in `declarations`.
        unsafe {
            (self.vtable.score)(
                self.state,
                request,
                endpoints.into(),
                attrs,
                scores.into(),
                note,
            )
        }
        .into_result()
    }

    /// Writes the positions of the chosen endpoints into `picked` and returns how many, as
    /// the plugin said: the caller checks that the count fits `picked` and that every
    /// position is a distinct candidate.
    #[inline]
    pub fn pick(
        &self,
        request: &RequestView<'_>,
        endpoints: &[EndpointView<'_>],
        scores: &[f64],
        picked: &mut [u32],
    ) -> Result<usize, PluginError> {
        // SAFETY: as in `declarations`.
        unsafe {
            (self.vtable.pick)(
                self.state,
                request,
                endpoints.into(),
                scores.into(),
                picked.into(),
            )
        }
        .into_result()
        .map(|count| count as usize)
    }

    #[inline]
    pub fn dispatched(
        &self,
        request: &RequestView<'_>,
        endpoint: &EndpointView<'_>,
    ) -> Result<(), PluginError> {
        // SAFETY: as in `declarations`.
        unsafe { (self.vtable.dispatched)(self.state, request, endpoint) }.into_result()
    }

    #[inline]
    pub fn completed(
        &self,
        request: &RequestView<'_>,
        endpoint: &EndpointView<'_>,
        outcome: Outcome,
    ) -> Result<(), PluginError> {
        // SAFETY: as in `declarations`.
        unsafe { (self.vtable.completed)(self.state, request, endpoint, outcome) }.into_result()
    }

    /// Calls an optional capability by name (see [`crate::sdk::extensions`]).
    pub fn extension(&self, name: &str, input: &str) -> Result<String, PluginError> {
        // SAFETY: as in `declarations`.
        unsafe { (self.vtable.extension)(self.state, name.into(), input.into()) }
            .into_result()
            .map(String::from)
    }
}

impl Drop for PluginInstance {
    fn drop(&mut self) {
        // SAFETY: called once; the state is not used afterwards.
        unsafe { (self.vtable.drop)(self.state) }
    }
}

/// The root module every plugin library exports (through [`crate::export_plugins!`]).
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginLibraryRef)))]
#[sabi(missing_field(panic))]
pub struct PluginLibrary {
    /// The plugin API version the library was built against.
    pub api_version: ApiVersion,
    /// Whether the library was built with `panic = "unwind"`; the SDK can only contain a
    /// panic when it was.
    pub unwinding: bool,
    pub plugin_types: extern "C" fn() -> RVec<PluginTypeInfo>,
    pub set_host: extern "C" fn(host: HostCallbacks),
    /// Creates an instance of `type_name` named `instance_name` from JSON parameters (`null`
    /// when the operator gave none).
    #[sabi(last_prefix_field)]
    pub create: extern "C" fn(
        type_name: RStr<'_>,
        instance_name: RStr<'_>,
        parameters: RStr<'_>,
    ) -> RResult<PluginInstance, PluginError>,
}

impl RootModule for PluginLibraryRef {
    abi_stable::declare_root_module_statics! {PluginLibraryRef}
    const BASE_NAME: &'static str = "switchyard_plugin";
    const NAME: &'static str = "switchyard plugin library";
    const VERSION_STRINGS: VersionStrings = abi_stable::package_version_strings!();
}
