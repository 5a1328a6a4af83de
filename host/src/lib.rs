//! switchyard: an endpoint picker for LLM inference fleets.

pub mod config;
pub mod effective;
pub mod pipeline;
pub mod plugins;
pub mod replay;
pub mod sim;
pub mod simulate;
