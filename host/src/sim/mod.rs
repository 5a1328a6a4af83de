//! Discrete-event simulation of a replica fleet.
//!
//! A workload ([`workload`]) is replayed in virtual time against modelled model-server
//! replicas ([`replica`], [`stepper`]), with a [`SimRouter`] deciding where each request goes
//! (a router that reads KV-cache events hears the replicas' own, [`kv_events`]; several
//! routers of one policy can stand [side by side](side_by_side)); [`run`]
//! drives the events and returns a [`PipelineReport`], which [`write_reports`] and
//! [`render_table`] present.

pub mod config;
pub mod engine;
pub mod fleet;
mod index_list;
pub mod kv_cache;
pub mod kv_events;
pub mod kv_pool;
pub mod profile;
pub mod replica;
pub mod report;
pub mod router;
pub mod side_by_side;
pub mod stepper;
pub mod workload;

pub use config::{FleetConfig, ParamError};
pub use engine::{run, run_stream};
pub use fleet::{Profile, ReplicaGroup, SimFleet};
pub use report::{
    render_predictions_table, render_serving_table, render_table, write_reports, ConfigFile,
    PipelineReport, PrefixPrediction, ProfileGroup, RunContext,
};
pub use router::{
    Decision, LeastInFlight, ReplicaState, RoundRobin, SimRequest, SimRouter, Tokens,
};
pub use side_by_side::SideBySide;
pub use workload::{
    default_memory_limit, format_bytes, parse_bytes, parse_trace, read_trace, TraceError,
    TraceParams, Workload, WorkloadError,
};
