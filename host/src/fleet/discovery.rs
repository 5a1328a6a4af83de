//! Which endpoints exist: the static `[[endpoints]]` of the config, or a discovery file
//! (YAML or JSON) that is re-read whenever its content changes.
//!
//! The file is `endpoints: [{name, namespace, address, port, labels}]`. Reading it is
//! lenient: unknown fields are ignored, and an entry that cannot be used is reported and
//! skipped while the others are taken. A file that cannot be read or parsed as a whole (also
//! an empty one, as seen half-way through a rewrite in place) leaves the previous set in force.

use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};

use serde_norway::Value;
use switchyard_plugin_api::EndpointMetrics;

use super::Engine;
use crate::config::EndpointConfig;

/// Largest discovery file read.
pub(crate) const MAX_FILE_BYTES: usize = 1024 * 1024;

/// Label carrying the endpoint's role.
pub const ROLE_LABEL: &str = "llm-d.ai/role";
/// Label choosing the metric names scraped.
pub const ENGINE_LABEL: &str = "llm-d.ai/engine-type";

/// One endpoint as discovery describes it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Target {
    /// `namespace/name`.
    pub id: String,
    /// `host:port`.
    pub address: String,
    pub role: String,
    pub engine: Engine,
    pub labels: BTreeMap<String, String>,
    /// Facts from the config, used when scraping is off.
    pub metrics: EndpointMetrics,
}

/// A discovery file's endpoints, and what was wrong with the entries left out.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    pub targets: Vec<Target>,
    /// One line per skipped entry or questionable value.
    pub notes: Vec<String>,
}

impl Engine {
    /// The engine named by an endpoint's labels; an unknown name reads as vLLM, with a note.
    pub(crate) fn from_labels(labels: &BTreeMap<String, String>) -> (Engine, Option<String>) {
        match labels.get(ENGINE_LABEL).map(|v| v.trim()) {
            None | Some("") | Some("vllm") => (Engine::Vllm, None),
            Some("sglang") => (Engine::Sglang, None),
            Some(other) => (
                Engine::Vllm,
                Some(format!(
                    "unknown {ENGINE_LABEL} '{other}' (known: vllm, sglang); vLLM metric names \
                     are scraped"
                )),
            ),
        }
    }
}

/// The static endpoints of the config, with the notes about them.
pub(crate) fn from_config(endpoints: &[EndpointConfig]) -> Parsed {
    let mut parsed = Parsed::default();
    for endpoint in endpoints {
        let id = endpoint.id();
        let (engine, note) = Engine::from_labels(&endpoint.labels);
        if let Some(note) = note {
            parsed.notes.push(format!("endpoint '{id}': {note}"));
        }
        let role = if endpoint.role.is_empty() {
            endpoint.labels.get(ROLE_LABEL).cloned().unwrap_or_default()
        } else {
            endpoint.role.clone()
        };
        parsed.targets.push(Target {
            id,
            address: endpoint.address.clone(),
            role,
            engine,
            labels: endpoint.labels.clone(),
            metrics: endpoint.metrics.into(),
        });
    }
    parsed
}

/// Reads a discovery file: at most [`MAX_FILE_BYTES`], UTF-8.
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() > MAX_FILE_BYTES {
        return Err("larger than 1 MiB".into());
    }
    Ok(bytes)
}

/// Parses a discovery file's content.
pub(crate) fn parse(bytes: &[u8]) -> Result<Parsed, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    if text.trim().is_empty() {
        return Err("the file is empty".into());
    }
    let document: Value = serde_norway::from_str(text).map_err(|e| format!("not YAML: {e}"))?;
    let Value::Mapping(top) = document else {
        return Err("expected a mapping with an `endpoints` list at the top".into());
    };
    let entries = match top.get("endpoints") {
        None => return Err("no `endpoints` key".into()),
        Some(Value::Null) => return Ok(Parsed::default()),
        Some(Value::Sequence(entries)) => entries,
        Some(_) => return Err("`endpoints` is not a list".into()),
    };
    let mut parsed = Parsed::default();
    let mut seen = HashSet::new();
    for (index, entry) in entries.iter().enumerate() {
        match parse_entry(entry) {
            Ok((target, note)) => {
                if let Some(note) = note {
                    parsed
                        .notes
                        .push(format!("endpoint '{}': {note}", target.id));
                }
                if seen.insert(target.id.clone()) {
                    parsed.targets.push(target);
                } else {
                    parsed.notes.push(format!(
                        "entry {index}: duplicate endpoint '{}' skipped (the first is kept)",
                        target.id
                    ));
                }
            }
            Err(reason) => parsed
                .notes
                .push(format!("entry {index} skipped: {reason}")),
        }
    }
    Ok(parsed)
}

fn parse_entry(entry: &Value) -> Result<(Target, Option<String>), String> {
    let Value::Mapping(fields) = entry else {
        return Err("not a mapping".into());
    };
    let text_field = |key: &str| -> Result<Option<String>, String> {
        match fields.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => scalar_text(value)
                .map(Some)
                .ok_or_else(|| format!("`{key}` is not a string")),
        }
    };
    let name = text_field("name")?
        .filter(|n| !n.trim().is_empty())
        .ok_or("no `name`")?;
    let namespace = text_field("namespace")?.unwrap_or_default();
    let host = text_field("address")?
        .filter(|a| !a.trim().is_empty())
        .ok_or_else(|| format!("'{name}' has no `address`"))?;
    let port = text_field("port")?.ok_or_else(|| format!("'{name}' has no `port`"))?;
    let address = join_address(host.trim(), port.trim()).map_err(|e| format!("'{name}': {e}"))?;
    let labels = match fields.get("labels") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Mapping(map)) => {
            let mut labels = BTreeMap::new();
            for (key, value) in map {
                let (Some(key), Some(value)) = (scalar_text(key), scalar_text(value)) else {
                    return Err(format!("'{name}': `labels` must map strings to strings"));
                };
                labels.insert(key, value);
            }
            labels
        }
        Some(_) => return Err(format!("'{name}': `labels` is not a mapping")),
    };
    let (engine, note) = Engine::from_labels(&labels);
    let target = Target {
        id: format!("{namespace}/{name}"),
        address,
        role: labels.get(ROLE_LABEL).cloned().unwrap_or_default(),
        engine,
        labels,
        metrics: EndpointMetrics::default(),
    };
    Ok((target, note))
}

/// A YAML scalar as text (`port: 8000` and `port: "8000"` read alike).
fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `host:port`, with an IPv6 literal in brackets.
fn join_address(host: &str, port: &str) -> Result<String, String> {
    let port: u16 = port
        .parse()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| format!("port '{port}' is not a number in 1-65535"))?;
    if host.contains(|c: char| c.is_whitespace() || c == '/' || c == '@') {
        return Err(format!("address '{host}' is not a host name or IP address"));
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if bare.parse::<Ipv6Addr>().is_ok() {
        return Ok(format!("[{bare}]:{port}"));
    }
    if host.contains(':') {
        return Err(format!(
            "address '{host}' holds a ':'; give the port in `port` only"
        ));
    }
    Ok(format!("{host}:{port}"))
}

/// Re-reads a discovery file on every poll and hands out its endpoints when they change.
/// Comparing the content (at most 1 MiB) rather than the modification time catches edits in
/// place and renames over the file alike, however coarse the file system's clock.
pub(crate) struct FileWatch {
    path: PathBuf,
    /// The content last parsed, good or bad.
    last_content: Vec<u8>,
    /// Whether `last_content` parsed.
    last_content_good: bool,
    /// The problem last logged, so each distinct one is logged once.
    error: Option<String>,
}

impl FileWatch {
    /// Starts from the content read at start-up, which parsed.
    pub(crate) fn new(path: PathBuf, content: Vec<u8>) -> FileWatch {
        FileWatch {
            path,
            last_content: content,
            last_content_good: true,
            error: None,
        }
    }

    /// The endpoints, when the file changed and parses.
    pub(crate) async fn poll(&mut self) -> Option<Vec<Target>> {
        let path = self.path.clone();
        let read = tokio::task::spawn_blocking(move || read_file(&path))
            .await
            .unwrap_or_else(|e| Err(format!("reading failed: {e}")));
        let content = match read {
            Ok(content) => content,
            Err(problem) => {
                self.report(problem);
                return None;
            }
        };
        if content == self.last_content {
            if self.last_content_good {
                self.recovered();
            }
            return None;
        }
        let parsed = parse(&content);
        self.last_content = content;
        match parsed {
            Ok(parsed) => {
                self.last_content_good = true;
                self.recovered();
                for note in &parsed.notes {
                    tracing::warn!("discovery file {}: {note}", self.path.display());
                }
                tracing::info!(
                    "discovery file {}: {} endpoints",
                    self.path.display(),
                    parsed.targets.len()
                );
                Some(parsed.targets)
            }
            Err(problem) => {
                self.last_content_good = false;
                self.report(problem);
                None
            }
        }
    }

    fn report(&mut self, problem: String) {
        if self.error.as_ref() != Some(&problem) {
            tracing::warn!(
                "discovery file {}: {problem}; keeping the previous endpoints",
                self.path.display()
            );
            self.error = Some(problem);
        }
    }

    fn recovered(&mut self) {
        if self.error.take().is_some() {
            tracing::info!("discovery file {}: readable again", self.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(parsed: &Parsed) -> Vec<(&str, &str)> {
        parsed
            .targets
            .iter()
            .map(|t| (t.id.as_str(), t.address.as_str()))
            .collect()
    }

    #[test]
    fn yaml_with_unknown_fields_and_both_port_forms() {
        let parsed = parse(
            br#"
endpoints:
  - name: vllm-replica-0
    namespace: default
    address: "10.0.0.1"
    port: "8000"
    rankIndex: 0
    labels: {llm-d.ai/engine-type: vllm, llm-d.ai/role: decode, model: llama}
  - name: sglang-replica-1
    address: replica-1.local
    port: 30000
    labels:
      llm-d.ai/engine-type: sglang
      gpus: 8
extra: ignored
"#,
        )
        .unwrap();
        assert_eq!(
            ids(&parsed),
            [
                ("default/vllm-replica-0", "10.0.0.1:8000"),
                ("/sglang-replica-1", "replica-1.local:30000")
            ]
        );
        let first = &parsed.targets[0];
        assert_eq!(
            (first.role.as_str(), first.engine),
            ("decode", Engine::Vllm)
        );
        assert_eq!(first.labels["model"], "llama");
        let second = &parsed.targets[1];
        assert_eq!((second.role.as_str(), second.engine), ("", Engine::Sglang));
        assert_eq!(second.labels["gpus"], "8");
        assert!(parsed.notes.is_empty(), "{:?}", parsed.notes);
    }

    #[test]
    fn json_is_read_as_yaml() {
        let parsed = parse(
            br#"{"endpoints": [{"name": "a", "address": "::1", "port": 8000, "rankIndex": 3}]}"#,
        )
        .unwrap();
        assert_eq!(ids(&parsed), [("/a", "[::1]:8000")]);
    }

    #[test]
    fn bad_entries_and_duplicates_are_skipped_with_a_note() {
        let parsed = parse(
            br#"
endpoints:
  - {name: ok, address: 10.0.0.1, port: 8000}
  - {name: no-port, address: 10.0.0.2}
  - {name: bad-port, address: 10.0.0.3, port: "80a"}
  - {name: zero-port, address: 10.0.0.3, port: 0}
  - {address: 10.0.0.4, port: 8000}
  - {name: host-with-port, address: "10.0.0.5:8000", port: 8000}
  - {name: bad-labels, address: 10.0.0.6, port: 8000, labels: [a, b]}
  - just a string
  - {name: ok, address: 10.0.0.7, port: 8001}
  - {name: odd-engine, address: 10.0.0.8, port: 8000, labels: {llm-d.ai/engine-type: trtllm}}
"#,
        )
        .unwrap();
        assert_eq!(
            ids(&parsed),
            [("/ok", "10.0.0.1:8000"), ("/odd-engine", "10.0.0.8:8000")]
        );
        assert_eq!(parsed.targets[1].engine, Engine::Vllm);
        let notes = parsed.notes.join("\n");
        for expected in [
            "entry 1 skipped: 'no-port' has no `port`",
            "entry 2 skipped: 'bad-port': port '80a'",
            "entry 3 skipped: 'zero-port': port '0'",
            "entry 4 skipped: no `name`",
            "entry 5 skipped: 'host-with-port': address '10.0.0.5:8000' holds a ':'",
            "entry 6 skipped: 'bad-labels': `labels` is not a mapping",
            "entry 7 skipped: not a mapping",
            "entry 8: duplicate endpoint '/ok' skipped",
            "endpoint '/odd-engine': unknown llm-d.ai/engine-type 'trtllm'",
        ] {
            assert!(
                notes.contains(expected),
                "missing '{expected}' in:\n{notes}"
            );
        }
    }

    #[test]
    fn whole_file_problems_are_errors() {
        assert_eq!(parse(b"").unwrap_err(), "the file is empty");
        assert_eq!(parse(b"  \n").unwrap_err(), "the file is empty");
        assert_eq!(parse(b"servers: []").unwrap_err(), "no `endpoints` key");
        assert!(parse(b"endpoints: [").unwrap_err().starts_with("not YAML"));
        assert!(parse(b"- a\n- b\n").is_err());
        assert_eq!(
            parse(b"endpoints: 3").unwrap_err(),
            "`endpoints` is not a list"
        );
        assert!(parse(b"endpoints:\n").unwrap().targets.is_empty());
        assert!(parse(b"endpoints: []").unwrap().targets.is_empty());
        assert!(parse(&[0xff, 0xfe]).unwrap_err().starts_with("not UTF-8"));
    }

    #[test]
    fn the_size_cap_applies() {
        let dir = std::env::temp_dir().join(format!("switchyard-cap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("big.yaml");
        std::fs::write(&path, vec![b' '; MAX_FILE_BYTES + 1]).unwrap();
        assert_eq!(read_file(&path).unwrap_err(), "larger than 1 MiB");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn static_endpoints_take_role_and_engine() {
        let config: crate::config::Config = toml::from_str(
            r#"
[[endpoints]]
name = "a"
address = "127.0.0.1:8000"
labels = { "llm-d.ai/role" = "prefill", "llm-d.ai/engine-type" = "sglang" }
metrics = { waiting_requests = 4 }

[[endpoints]]
name = "b"
namespace = "ns"
role = "decode"
address = "127.0.0.1:8001"
labels = { "llm-d.ai/role" = "prefill" }
"#,
        )
        .unwrap();
        let parsed = from_config(&config.endpoints);
        let a = &parsed.targets[0];
        assert_eq!((a.id.as_str(), a.role.as_str()), ("/a", "prefill"));
        assert_eq!(a.engine, Engine::Sglang);
        assert_eq!(a.metrics.waiting_requests, 4);
        let b = &parsed.targets[1];
        assert_eq!((b.id.as_str(), b.role.as_str()), ("ns/b", "decode"));
    }
}
