//! Carrying state across a reload: a new instance that replaces one of the same name and
//! type (another library version or other parameters) takes its predecessor's state over —
//! a prefix index, in-flight charges — so a reload does not route on an empty view. Runs
//! while the decisions stand still, so nothing changes the predecessor between its export
//! and the successor's import.

use switchyard_plugin_api::sdk::extensions;
use switchyard_plugin_api::ErrorKind;

use super::Pipeline;

/// What became of one replaced instance's state.
#[derive(Debug, Clone, PartialEq)]
pub enum Carried {
    /// The new instance took the state over; requests its predecessor placed complete on it.
    Taken,
    /// The new instance starts empty, and why.
    Fresh(String),
}

/// Hands every replaced instance's state to its successor in `pipeline`; returns, per
/// successor's label, what became of it (nothing for a predecessor that kept no state).
pub fn carry_state(pipeline: &mut Pipeline) -> Vec<(String, Carried)> {
    let mut outcomes = Vec::new();
    for plugin in &mut pipeline.plugins {
        let Some((predecessor, lineage)) = plugin.predecessor.take() else {
            continue;
        };
        let snapshot = match predecessor.extension(extensions::EXPORT_STATE, "") {
            Err(e) if e.kind == ErrorKind::Unsupported => {
                predecessor.extension(extensions::STATE, "")
            }
            answer => answer,
        };
        let carried = match snapshot {
            Err(e) if e.kind == ErrorKind::Unsupported => {
                Carried::Fresh("its predecessor's library cannot export its state".into())
            }
            Err(e) => Carried::Fresh(format!("its predecessor failed to export: {}", e.message)),
            // Nothing to lose: not worth a word.
            Ok(text) if text.trim() == "null" => continue,
            Ok(text) => match plugin.object.extension(extensions::IMPORT_STATE, &text) {
                Ok(_) => Carried::Taken,
                Err(e) if e.kind == ErrorKind::Unsupported => {
                    Carried::Fresh("its library cannot take a state over".into())
                }
                Err(e) => {
                    Carried::Fresh(format!("it refused its predecessor's state: {}", e.message))
                }
            },
        };
        if carried == Carried::Taken {
            plugin.lineage = lineage;
        }
        outcomes.push((plugin.label(), carried));
    }
    outcomes
}
