//! The scheduling pipeline: wiring a config into instances, and running requests through
//! producers, filters, scorers and the picker, noting what each decision predicted about the
//! chosen endpoint's prefix cache.

pub mod carry;
pub mod chat_template;
pub mod prediction;
pub mod record;
pub mod request;
pub mod scheduler;
pub mod tokenize;
pub mod wiring;

pub use prediction::{Predicted, PrefixRows, Sums};
pub use request::{ChatMessage, Endpoint, Fleet, Prompt, Request};
pub use scheduler::{Decision, Rejection, Scheduler};
pub use wiring::{build, build_from, load_registry, Options, Pipeline};
