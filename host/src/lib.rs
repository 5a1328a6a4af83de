//! switchyard: an endpoint picker for LLM inference fleets.

pub mod config;
pub mod effective;
pub mod extproc;
pub mod fleet;
pub mod jsonl;
pub mod live;
pub mod mock_replica;
pub mod pipeline;
pub mod plugins;
pub mod replay;
pub mod serve;
pub mod sim;
pub mod simulate;
