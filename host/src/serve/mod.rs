//! `switchyard serve`: the OpenAI-compatible HTTP router.

use crate::config::LoadedConfig;
use crate::pipeline::Options;

/// Command-line overrides of `[serve]`.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    pub port: Option<u16>,
    pub metrics_port: Option<u16>,
    pub admin_port: Option<u16>,
    pub seed: u64,
}

/// Serves until SIGTERM/SIGINT, then drains.
pub async fn run(
    config: LoadedConfig,
    options: Options,
    serve: ServeOptions,
) -> Result<(), String> {
    let _ = (config, options, serve);
    Err("serve is not built yet".into())
}
