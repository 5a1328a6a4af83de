//! The effective configuration `switchyard check` prints: every plugin with its parameters
//! (documented defaults filled in), the producers created automatically, the producer order
//! and the resolved profile, libraries and endpoints included: the output is itself a config
//! that `check` accepts and renders the same.

use std::fmt::Write;

use std::path::Path;

use crate::config::{is_library_path, EndpointConfig, LoadedConfig};
use crate::pipeline::Pipeline;
use crate::plugins::Registry;

pub fn render(config: &LoadedConfig, registry: &Registry, pipeline: &Pipeline) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# effective configuration of {}",
        config.path.display()
    );
    let _ = writeln!(
        out,
        "allow_experimental_plugins = {}",
        config.config.allow_experimental_plugins
    );
    // Paths resolved against the config's directory, so the output works from anywhere.
    let base = config.base_dir();
    let _ = writeln!(
        out,
        "allow_writable_libraries = {}",
        config.config.allow_writable_libraries
    );
    let libraries: Vec<String> = config
        .config
        .libraries
        .iter()
        .map(|entry| {
            let path = if is_library_path(&entry.path) {
                toml_string(&absolute(&base.join(&entry.path)))
            } else {
                toml_string(&entry.path)
            };
            match &entry.sha256 {
                Some(sha256) => format!("{{ path = {path}, sha256 = {} }}", toml_string(sha256)),
                None => path,
            }
        })
        .collect();
    let _ = writeln!(out, "libraries = [{}]", libraries.join(", "));
    let plugin_dirs: Vec<String> = config
        .config
        .plugin_dirs
        .iter()
        .map(|dir| toml_string(&absolute(&base.join(dir))))
        .collect();
    let _ = writeln!(out, "plugin_dirs = [{}]", plugin_dirs.join(", "));
    let given_parameters: std::collections::HashMap<&str, &Option<toml::Table>> = config
        .config
        .plugins
        .iter()
        .map(|p| (p.name.as_str(), &p.parameters))
        .collect();
    for plugin in &pipeline.plugins {
        let _ = writeln!(out, "\n[[plugins]]");
        let _ = writeln!(out, "type = {}", toml_string(&plugin.type_name));
        let _ = writeln!(out, "name = {}", toml_string(&plugin.name));
        let _ = writeln!(
            out,
            "# kind {}, stability {}, source {}{}",
            plugin.kind,
            plugin.stability,
            plugin.source,
            if plugin.auto_created {
                ", created automatically"
            } else {
                ""
            }
        );
        let given = given_parameters
            .get(plugin.name.as_str())
            .and_then(|p| (*p).clone())
            .unwrap_or_default();
        let docs = registry
            .get(&plugin.type_name)
            .map(|t| t.parameters().to_vec())
            .unwrap_or_default();
        if docs.is_empty() && given.is_empty() {
            continue;
        }
        let _ = writeln!(out, "[plugins.parameters]");
        for doc in &docs {
            match given.get(doc.name.as_str()) {
                Some(toml::Value::Table(file)) if plugin.host_native && doc.name == "tokenizer" => {
                    // Both files by their absolute paths, so the output checks from anywhere.
                    let path = file.get("path").and_then(toml::Value::as_str).unwrap_or("");
                    let path = toml_string(&absolute(&base.join(path)));
                    let chat = file
                        .get("chatTemplate")
                        .and_then(toml::Value::as_str)
                        .map(|t| {
                            format!(", chatTemplate = {}", toml_string(&absolute(&base.join(t))))
                        })
                        .unwrap_or_default();
                    let _ = writeln!(out, "tokenizer = {{ path = {path}{chat} }}");
                }
                Some(value) => {
                    let _ = writeln!(out, "{} = {}", doc.name, value);
                }
                None if is_toml_value(&doc.default) => {
                    let _ = writeln!(out, "{} = {}  # default", doc.name, doc.default);
                }
                None => {
                    let _ = writeln!(out, "# {} is unset by default ({})", doc.name, doc.default);
                }
            }
        }
        for (key, value) in &given {
            if !docs.iter().any(|d| d.name.as_str() == key) {
                let _ = writeln!(out, "{key} = {value}");
            }
        }
    }
    let _ = writeln!(out, "\n[[profiles]]");
    let _ = writeln!(out, "name = {}", toml_string(&pipeline.profile));
    let names = |indices: &[usize]| {
        indices
            .iter()
            .map(|&i| toml_string(&pipeline.plugins[i].name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(out, "filters = [{}]", names(&pipeline.filters));
    let scorers: Vec<String> = pipeline
        .scorers
        .iter()
        .map(|s| {
            format!(
                "{{ plugin = {}, weight = {:?} }}",
                toml_string(&pipeline.plugins[s.plugin].name),
                s.weight
            )
        })
        .collect();
    let _ = writeln!(out, "scorers = [{}]", scorers.join(", "));
    let _ = writeln!(
        out,
        "picker = {}",
        toml_string(&pipeline.plugins[pipeline.picker].name)
    );
    // The live drivers' tables, every default filled in.
    for (table, text) in [
        ("fleet", toml::to_string(&config.config.fleet)),
        ("serve", toml::to_string(&config.config.serve)),
    ] {
        if let Ok(text) = text {
            let _ = write!(out, "\n[{table}]\n{text}");
        }
    }
    if !config.config.endpoints.is_empty() {
        #[derive(serde::Serialize)]
        struct Endpoints<'a> {
            endpoints: &'a [EndpointConfig],
        }
        if let Ok(text) = toml::to_string(&Endpoints {
            endpoints: &config.config.endpoints,
        }) {
            let _ = write!(out, "\n{text}");
        }
    }
    let _ = writeln!(out, "\n# producer order: {}", names(&pipeline.producers));
    let keys: Vec<String> = pipeline.rows.iter().map(|k| k.to_string()).collect();
    let _ = writeln!(out, "# data keys: {}", keys.join(", "));
    out
}

fn absolute(path: &Path) -> String {
    std::fs::canonicalize(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

fn is_toml_value(text: &str) -> bool {
    format!("value = {text}").parse::<toml::Table>().is_ok()
}
