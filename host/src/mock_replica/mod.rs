//! `switchyard mock-replica`: an OpenAI-compatible stand-in for a model server, for tests and
//! demos. It runs the simulator's replica model on the real clock.

/// Command-line options of `mock-replica`.
#[derive(Debug, Clone)]
pub struct MockOptions {
    pub port: u16,
    pub name: String,
    pub model: String,
}

/// Serves until SIGTERM/SIGINT.
pub async fn run(options: MockOptions) -> Result<(), String> {
    let _ = options;
    Err("mock-replica is not built yet".into())
}
