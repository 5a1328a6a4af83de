//! A record of the traffic a live driver placed, written as `replay` input: one line per
//! request with its arrival time, prompt and completion time (and, when its prefix prediction
//! was checked, the prediction and what the replica reported), so anything `serve` saw can be
//! replayed and explained offline. Lines are written when a request ends (so they are not in
//! arrival order; `replay` orders them by `arrival_ms`).

use std::path::Path;

use serde_json::{Map, Value};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::pipeline::{Predicted, Prompt};
use crate::replay::prompt_fields;

/// The writer of a journal file; cheap to clone.
#[derive(Clone)]
pub struct Journal {
    lines: mpsc::UnboundedSender<Vec<u8>>,
}

/// Flushes and closes the journal file once every [`Journal`] is gone.
pub struct JournalTask(tokio::task::JoinHandle<()>);

impl JournalTask {
    pub async fn finish(self) {
        let _ = self.0.await;
    }
}

/// One request's line: begun when its body is read, given the arrival time and id the
/// scheduler used, and written when the request ends.
pub struct JournalEntry {
    journal: Journal,
    fields: Map<String, Value>,
}

impl JournalEntry {
    /// The arrival time and id the scheduler used (the id may differ from the client's when
    /// that was in use).
    pub fn set_placement(&mut self, arrival_ms: f64, id: &str) {
        self.fields
            .insert("arrival_ms".into(), round_ms(arrival_ms));
        self.fields.insert("id".into(), id.into());
    }

    /// The prompt tokens each producer predicted `endpoint` held, and the `cached` tokens it
    /// reported; `replay` reads past this field.
    pub fn set_prefix_check(&mut self, endpoint: &str, predicted: &Predicted, cached: u64) {
        let by_producer: Map<String, Value> = predicted
            .iter()
            .map(|(producer, tokens)| (producer.to_string(), tokens.into()))
            .collect();
        self.fields.insert(
            "prefix_check".into(),
            serde_json::json!({
                "endpoint": endpoint,
                "predicted_tokens": by_producer,
                "cached_tokens": cached,
            }),
        );
    }

    /// Writes the line, with `completion_ms` when the request was placed and has ended.
    pub fn write(mut self, completion_ms: Option<f64>) {
        if let Some(done) = completion_ms {
            self.fields.insert("completion_ms".into(), round_ms(done));
        }
        let mut line = serde_json::to_vec(&Value::Object(self.fields)).unwrap_or_default();
        line.push(b'\n');
        let _ = self.journal.lines.send(line);
    }
}

/// Milliseconds to the microsecond: enough to keep every order the scheduler saw.
fn round_ms(ms: f64) -> Value {
    ((ms * 1000.0).round() / 1000.0).into()
}

impl Journal {
    /// Creates (truncates) `path` and starts its writer on the current runtime.
    pub async fn create(path: &Path) -> Result<(Journal, JournalTask), String> {
        let file = tokio::fs::File::create(path)
            .await
            .map_err(|e| format!("cannot write the journal {}: {e}", path.display()))?;
        let (lines, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let shown = path.display().to_string();
        let task = tokio::spawn(async move {
            let mut out = tokio::io::BufWriter::new(file);
            while let Some(line) = rx.recv().await {
                let mut result = out.write_all(&line).await;
                // Flush whenever the queue is drained, so the file is current when idle.
                if result.is_ok() && rx.is_empty() {
                    result = out.flush().await;
                }
                if let Err(e) = result {
                    tracing::error!("journal {shown}: {e}; no further lines are written");
                    return;
                }
            }
            let _ = out.flush().await;
        });
        Ok((Journal { lines }, JournalTask(task)))
    }

    /// Begins the line of a request whose body was just read.
    pub fn entry(
        &self,
        model: &str,
        cache_salt: &str,
        prompt: &Prompt,
        max_output_tokens: Option<u64>,
    ) -> JournalEntry {
        let mut fields = Map::new();
        fields.insert("model".into(), model.into());
        if !cache_salt.is_empty() {
            fields.insert("cache_salt".into(), cache_salt.into());
        }
        let (key, value) = prompt_fields(prompt);
        fields.insert(key.into(), value);
        if let Some(max) = max_output_tokens {
            fields.insert("max_output_tokens".into(), max.into());
        }
        JournalEntry {
            journal: self.clone(),
            fields,
        }
    }
}
