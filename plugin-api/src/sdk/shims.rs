//! The vtable the SDK hands to the host, and the panic containment around every entry.

use std::any::Any;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use abi_stable::std_types::{RResult, RSlice, RSliceMut, RStr, RString};

use super::{Declare, Filter, FilterOutput, Picker, ProduceBatch, Producer, ScoreOutput, Scorer};
use crate::abi::{
    AttrValue, AttrView, Declarations, EndpointView, ErrorKind, InstanceVTable, Outcome,
    PluginError, PluginInstance, ProduceItem, RequestView,
};

/// An author's implementation, ready to cross the boundary.
pub enum Instance {
    Producer(Box<dyn Producer>),
    Filter(Box<dyn Filter>),
    Scorer(Box<dyn Scorer>),
    Picker(Box<dyn Picker>),
}

impl Instance {
    pub fn producer(p: impl Producer) -> Self {
        Instance::Producer(Box::new(p))
    }
    pub fn filter(f: impl Filter) -> Self {
        Instance::Filter(Box::new(f))
    }
    pub fn scorer(s: impl Scorer) -> Self {
        Instance::Scorer(Box::new(s))
    }
    pub fn picker(p: impl Picker) -> Self {
        Instance::Picker(Box::new(p))
    }

    /// Hands the implementation over as a boundary object (the host does this for its
    /// built-in plugins; libraries do it through [`crate::export_plugins!`]).
    pub fn into_ffi(self) -> PluginInstance {
        self.into_ffi_named("")
    }

    /// As [`Instance::into_ffi`], remembering the instance's name for the messages the SDK
    /// sends on its behalf (a panicking `declare`).
    pub fn into_ffi_named(self, label: &str) -> PluginInstance {
        let hosted = Hosted {
            label: label.to_string(),
            inner: self,
        };
        let state = Box::into_raw(Box::new(hosted)).cast::<c_void>();
        // SAFETY: `state` is a leaked `Box<Hosted>` released only by `drop_instance`;
        // `Hosted` is `Send + Sync` because every trait object in it is.
        unsafe { PluginInstance::from_raw(state, &VTABLE) }
    }

    fn declare(&self) -> Declare {
        match self {
            Instance::Producer(p) => p.declare(),
            Instance::Filter(f) => f.declare(),
            Instance::Scorer(s) => s.declare(),
            Instance::Picker(_) => Declare::default(),
        }
    }

    #[cfg_attr(feature = "api-1-0", allow(dead_code))]
    fn state(&self) -> Option<serde_json::Value> {
        match self {
            Instance::Producer(p) => p.state(),
            Instance::Filter(f) => f.state(),
            Instance::Scorer(s) => s.state(),
            Instance::Picker(_) => None,
        }
    }

    #[cfg(not(feature = "api-1-2"))]
    fn import_state(&self, state: serde_json::Value) -> Result<(), PluginError> {
        match self {
            Instance::Producer(p) => p.import_state(state),
            Instance::Filter(f) => f.import_state(state),
            Instance::Scorer(s) => s.import_state(state),
            Instance::Picker(_) => Err(wrong_kind("import_state")),
        }
    }

    #[cfg(not(feature = "api-1-2"))]
    fn kv_events(&self, input: &str) -> Result<RString, PluginError> {
        let Instance::Producer(p) = self else {
            return if input.is_empty() {
                Ok("false".into())
            } else {
                Err(wrong_kind("kv_events"))
            };
        };
        if input.is_empty() {
            return Ok(if p.declare().kv_events {
                "true"
            } else {
                "false"
            }
            .into());
        }
        let batch: crate::kv::KvEventBatch = serde_json::from_str(input).map_err(|e| {
            PluginError::failed(format!("a KV event batch that does not parse: {e}"))
        })?;
        p.kv_events(&batch).map(|()| "null".into())
    }
}

/// What an instance's state pointer points at.
struct Hosted {
    /// `name` or `name (type)`; empty when unknown.
    label: String,
    inner: Instance,
}

static VTABLE: InstanceVTable = InstanceVTable {
    declarations,
    produce,
    filter,
    score,
    pick,
    dispatched,
    completed,
    extension,
    drop: drop_instance,
};

/// Turns a panic payload into the message it carried.
pub(crate) fn panic_message(payload: Box<dyn Any + Send>) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Runs `body` with panics contained.
pub(crate) fn guarded<T>(body: impl FnOnce() -> Result<T, PluginError>) -> RResult<T, PluginError> {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => result.into(),
        Err(payload) => RResult::RErr(PluginError {
            kind: ErrorKind::Panicked,
            field: RString::new(),
            message: format!("plugin panicked: {}", panic_message(payload)).into(),
        }),
    }
}

/// # Safety
/// `this` must come from [`Instance::into_ffi_named`] and not be dropped yet.
unsafe fn hosted<'a>(this: *const c_void) -> &'a Hosted {
    &*this.cast::<Hosted>()
}

/// # Safety
/// As [`hosted`].
unsafe fn instance<'a>(this: *const c_void) -> &'a Instance {
    &hosted(this).inner
}

fn wrong_kind(call: &str) -> PluginError {
    PluginError::unsupported(format!("this plugin does not provide `{call}`"))
}

unsafe extern "C" fn declarations(this: *const c_void) -> Declarations {
    let hosted = hosted(this);
    let declared =
        catch_unwind(AssertUnwindSafe(|| hosted.inner.declare())).unwrap_or_else(|payload| {
            // The host reads declarations once per instance, so this is said once.
            let target = if hosted.label.is_empty() {
                "plugin-panic"
            } else {
                &hosted.label
            };
            super::log::emit(
                crate::abi::LogLevel::Error,
                target,
                &format!(
                    "declare panicked: {}; this instance declares nothing (it reads and writes no \
                 data and gets no batch window)",
                    panic_message(payload)
                ),
            );
            Declare::default()
        });
    Declarations {
        produces: declared.produces.into(),
        consumes: declared.consumes.into(),
        batch_window_ms: declared.batch.map_or(0, |b| b.window_ms),
        batch_max: declared.batch.map_or(-1, |b| b.max_batch),
        timeout_ms: declared.timeout_ms.unwrap_or(0),
    }
}

unsafe extern "C" fn produce(
    this: *const c_void,
    items: RSlice<'_, ProduceItem<'_>>,
    mut out: RSliceMut<'_, AttrValue>,
) -> RResult<(), PluginError> {
    guarded(|| match instance(this) {
        Instance::Producer(p) => {
            let items = items.as_slice();
            p.produce(items, &mut ProduceBatch::new(&mut out, items))
        }
        _ => Err(wrong_kind("produce")),
    })
}

unsafe extern "C" fn filter(
    this: *const c_void,
    request: &RequestView<'_>,
    endpoints: RSlice<'_, EndpointView<'_>>,
    attrs: &AttrView<'_>,
    mut keep: RSliceMut<'_, bool>,
    note: &mut RString,
) -> RResult<(), PluginError> {
    guarded(|| match instance(this) {
        Instance::Filter(f) => f.filter(
            request,
            endpoints.as_slice(),
            attrs,
            FilterOutput {
                keep: &mut keep,
                note,
            },
        ),
        _ => Err(wrong_kind("filter")),
    })
}

unsafe extern "C" fn score(
    this: *const c_void,
    request: &RequestView<'_>,
    endpoints: RSlice<'_, EndpointView<'_>>,
    attrs: &AttrView<'_>,
    mut scores: RSliceMut<'_, f64>,
    note: &mut RString,
) -> RResult<(), PluginError> {
    guarded(|| match instance(this) {
        Instance::Scorer(s) => s.score(
            request,
            endpoints.as_slice(),
            attrs,
            ScoreOutput {
                scores: &mut scores,
                note,
            },
        ),
        _ => Err(wrong_kind("score")),
    })
}

unsafe extern "C" fn pick(
    this: *const c_void,
    request: &RequestView<'_>,
    endpoints: RSlice<'_, EndpointView<'_>>,
    scores: RSlice<'_, f64>,
    mut picked: RSliceMut<'_, u32>,
) -> RResult<u32, PluginError> {
    guarded(|| match instance(this) {
        Instance::Picker(p) => p
            .pick(
                request,
                endpoints.as_slice(),
                scores.as_slice(),
                &mut picked,
            )
            .map(|count| count as u32),
        _ => Err(wrong_kind("pick")),
    })
}

unsafe extern "C" fn dispatched(
    this: *const c_void,
    request: &RequestView<'_>,
    endpoint: &EndpointView<'_>,
) -> RResult<(), PluginError> {
    guarded(|| {
        if let Instance::Producer(p) = instance(this) {
            p.dispatched(request, endpoint);
        }
        Ok(())
    })
}

unsafe extern "C" fn completed(
    this: *const c_void,
    request: &RequestView<'_>,
    endpoint: &EndpointView<'_>,
    outcome: Outcome,
) -> RResult<(), PluginError> {
    guarded(|| {
        if let Instance::Producer(p) = instance(this) {
            p.completed(request, endpoint, outcome);
        }
        Ok(())
    })
}

unsafe extern "C" fn extension(
    this: *const c_void,
    name: RStr<'_>,
    input: RStr<'_>,
) -> RResult<RString, PluginError> {
    guarded(|| {
        let this = instance(this);
        match name.as_str() {
            #[cfg(not(feature = "api-1-0"))]
            super::extensions::STATE => Ok(this
                .state()
                .unwrap_or(serde_json::Value::Null)
                .to_string()
                .into()),
            #[cfg(not(feature = "api-1-1"))]
            super::extensions::BATCH_QUIET => {
                let declared = this.declare();
                Ok(match (declared.batch, declared.batch_quiet_ms) {
                    (Some(_), Some(ms)) => ms.to_string().into(),
                    _ => "null".into(),
                })
            }
            #[cfg(not(feature = "api-1-2"))]
            super::extensions::KV_EVENTS => this.kv_events(input.as_str()),
            #[cfg(not(feature = "api-1-2"))]
            super::extensions::IMPORT_STATE => {
                let state = serde_json::from_str(input.as_str()).map_err(|e| {
                    PluginError::failed(format!("a state snapshot that is not JSON: {e}"))
                })?;
                this.import_state(state).map(|()| "null".into())
            }
            other => {
                let _ = (this, input);
                Err(PluginError::unsupported(format!(
                    "unknown extension `{other}`"
                )))
            }
        }
    })
}

unsafe extern "C" fn drop_instance(this: *mut c_void) {
    // A panicking destructor must not unwind into the host; the instance is gone either way.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        drop(Box::from_raw(this.cast::<Hosted>()))
    }));
}
