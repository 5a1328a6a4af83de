//! Reloading the config in place, for both live drivers: on SIGHUP or the admin API's
//! `POST /reload`, the config file is read again and checked as `switchyard check` checks
//! it; a config that passes replaces the pipeline and the endpoints between two decisions, a
//! config that fails is refused and the running pipeline stays. Owns the config generation,
//! the reload counters and what the operator routes show of the running config (its
//! effective rendering and the digests of its libraries).
//!
//! What carries over: an instance whose name, type, library bytes and parameters are
//! unchanged is the same instance in the new pipeline, with its state and its counters. One
//! whose name and type are unchanged but whose library or parameters changed is a new
//! instance that takes over its predecessor's state (`export_state` → `import_state`, plugin
//! API 1.3), while the decisions stand still; when either library cannot, it starts empty and
//! the reload says why. Requests dispatched before the reload complete on the instance of
//! their lineage: the kept one, or the one that took the state over. Everything else starts
//! fresh. The `[serve]` section, the `[fleet]` scrape settings and
//! the command line are read at start only.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use serde_json::{json, Value};

use crate::config::LoadedConfig;
use crate::fleet::Membership;
use crate::live::LiveScheduler;
use crate::pipeline::carry::Carried;
use crate::pipeline::{build_from, load_registry, Options, Pipeline};
use crate::plugins::{LibraryFile, Registry};

/// What a reload did.
#[derive(Debug, Clone, PartialEq)]
pub enum Reloaded {
    Applied {
        generation: u64,
        /// Instances taken over from the previous pipeline, by label.
        kept: Vec<String>,
        /// New instances that took over the state of the one they replace (same name and
        /// type, another library or other parameters), by label.
        carried: Vec<String>,
        /// Instances created for this pipeline that start empty, by label.
        created: Vec<String>,
        /// Of those, the ones that replace an instance whose state could not carry over,
        /// with why.
        fresh: Vec<(String, String)>,
    },
    Refused {
        /// The generation still running.
        generation: u64,
        reason: String,
    },
}

impl Reloaded {
    pub fn to_json(&self, libraries: &[LibraryFile]) -> Value {
        match self {
            Reloaded::Applied {
                generation,
                kept,
                carried,
                created,
                fresh,
            } => json!({
                "result": "applied",
                "generation": generation,
                "kept": kept,
                "carried": carried,
                "created": created,
                "fresh": fresh
                    .iter()
                    .map(|(label, why)| (label.clone(), Value::from(why.as_str())))
                    .collect::<serde_json::Map<_, _>>(),
                "libraries": libraries_json(libraries),
            }),
            Reloaded::Refused { generation, reason } => json!({
                "result": "refused",
                "generation": generation,
                "reason": reason,
            }),
        }
    }
}

/// The libraries of a registry, for the admin API.
pub fn libraries_json(libraries: &[LibraryFile]) -> Value {
    libraries
        .iter()
        .map(|l| json!({"path": l.path.display().to_string(), "sha256": l.digest}))
        .collect()
}

/// The running config and what it was built from.
struct Running {
    registry: Registry,
    effective: Arc<String>,
}

/// Reloads a live driver's config; one per driver.
pub struct Reloader {
    config_path: PathBuf,
    options: Options,
    live: Arc<LiveScheduler>,
    membership: Membership,
    /// Held for the whole of a reload, so two reloads never interleave.
    running: Mutex<Running>,
    generation: AtomicU64,
    applied: AtomicU64,
    refused: AtomicU64,
}

impl Reloader {
    /// The reloader of a driver started on `config` (generation 1).
    pub fn new(
        config: &LoadedConfig,
        options: &Options,
        live: Arc<LiveScheduler>,
        membership: Membership,
        registry: Registry,
        effective: Arc<String>,
    ) -> Reloader {
        Reloader {
            config_path: config.path.clone(),
            options: options.clone(),
            live,
            membership,
            running: Mutex::new(Running {
                registry,
                effective,
            }),
            generation: AtomicU64::new(1),
            applied: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Running> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Reloads applied and refused since start.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.applied.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
        )
    }

    /// The effective config of the running generation.
    pub fn effective(&self) -> Arc<String> {
        self.running().effective.clone()
    }

    /// The library files the running generation loaded, with their digests.
    pub fn libraries(&self) -> Vec<LibraryFile> {
        self.running().registry.libraries().to_vec()
    }

    /// Reloads on a blocking thread (reading files and creating instances may take a while),
    /// `cause` naming what asked for it in the log.
    pub async fn reload_async(self: &Arc<Self>, cause: &'static str) -> Reloaded {
        let reloader = self.clone();
        tokio::task::spawn_blocking(move || reloader.reload(cause))
            .await
            .unwrap_or_else(|e| Reloaded::Refused {
                generation: self.generation(),
                reason: format!("the reload failed: {e}"),
            })
    }

    /// Reads the config file again and, if `switchyard check` would accept it, switches the
    /// driver to it; else keeps the running pipeline. Logged and counted either way.
    pub fn reload(&self, cause: &str) -> Reloaded {
        let mut running = self.running();
        let previous = self.live.pipeline();
        match self.prepare(&previous) {
            Ok((registry, pipeline, effective, members)) => {
                let (kept, mut created) = compare(&previous, &pipeline);
                self.membership.apply(members);
                let mut carried = Vec::new();
                let mut fresh = Vec::new();
                for (label, outcome) in self.live.replace_pipeline(pipeline) {
                    match outcome {
                        Carried::Taken => {
                            created.retain(|c| *c != label);
                            carried.push(label);
                        }
                        Carried::Fresh(why) => fresh.push((label, why)),
                    }
                }
                *running = Running {
                    registry,
                    effective: Arc::new(effective),
                };
                let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
                self.applied.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    generation,
                    kept = %kept.join(", "),
                    carried = %carried.join(", "),
                    created = %created.join(", "),
                    "{cause}: reloaded {}",
                    self.config_path.display()
                );
                for (label, why) in &fresh {
                    tracing::warn!(
                        generation,
                        plugin = %label,
                        "{cause}: {label} starts with an empty state: {why}"
                    );
                }
                Reloaded::Applied {
                    generation,
                    kept,
                    carried,
                    created,
                    fresh,
                }
            }
            Err(reason) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                let generation = self.generation();
                tracing::warn!(
                    generation,
                    "{cause}: reload of {} refused, generation {generation} keeps running: \
                     {reason}",
                    self.config_path.display()
                );
                Reloaded::Refused { generation, reason }
            }
        }
    }

    /// Everything a reload needs, checked as `switchyard check` checks a config.
    /// Instances of `previous` whose name, type, library and parameters are unchanged are
    /// taken over.
    fn prepare(
        &self,
        previous: &Pipeline,
    ) -> Result<(Registry, Pipeline, String, crate::fleet::NewMembers), String> {
        let config = LoadedConfig::read(&self.config_path).map_err(|e| e.to_string())?;
        config.check_serve().map_err(|e| e.to_string())?;
        let registry = load_registry(&config, &self.options).map_err(|e| e.to_string())?;
        let pipeline = build_from(&config, &registry, &self.options, Some(previous))
            .map_err(|e| e.to_string())?;
        let effective = crate::effective::render(&config, &registry, &pipeline);
        let members = self.membership.read(&config)?;
        Ok((registry, pipeline, effective, members))
    }
}

/// The labels of `next`'s instances taken over from `previous`, and of those created anew.
fn compare(previous: &Pipeline, next: &Pipeline) -> (Vec<String>, Vec<String>) {
    next.plugins.iter().fold(
        (Vec::new(), Vec::new()),
        |(mut kept, mut created), plugin| {
            let shared = previous
                .plugins
                .iter()
                .any(|p| Arc::ptr_eq(&p.object, &plugin.object));
            if shared {
                kept.push(plugin.label());
            } else {
                created.push(plugin.label());
            }
            (kept, created)
        },
    )
}

/// Reloads on every SIGHUP for as long as the reloader lives.
pub(crate) fn reload_on_hangup(reloader: Weak<Reloader>) -> Result<(), String> {
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| format!("cannot watch SIGHUP: {e}"))?;
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            let Some(reloader) = reloader.upgrade() else {
                return;
            };
            reloader.reload_async("SIGHUP").await;
        }
    });
    Ok(())
}
