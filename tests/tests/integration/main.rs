//! The integration tests, as modules of one test binary, so the host, the test support and
//! their dependencies are linked once. One module alone: `cargo test -p switchyard-tests --test
//! integration serve::` (a filter matches anywhere in `module::test_name`).
//!
//! Tests marked `#[ignore = "slow tier: ..."]` run only with `--include-ignored`, as the
//! README's test command and CI run them; see the README's testing section.

mod affinity_conformance;
mod broken_inputs;
mod burst_conformance;
mod cli;
mod compatibility;
mod config_errors;
mod config_import;
mod config_properties;
mod containment;
mod example_plugin;
mod extproc;
mod fair_share;
mod faults;
mod handover;
mod hashing_through_libraries;
mod kv_events;
mod library_refusals;
mod mock_replica;
mod plugin_readmes;
mod predictions;
mod reload;
mod replay_matches_simulate;
mod scorer_conformance;
mod serve;
mod serve_connections;
mod serve_failures;
mod simulate_kv_events;
mod supply_chain;
mod tokenizer;
