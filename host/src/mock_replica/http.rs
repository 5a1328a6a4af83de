//! Request handling: routes, the `x-mock-fault` header, the replica-backed inference
//! answers (whole or streamed as server-sent events), `/metrics`, and the refuse switch.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use switchyard_prefix_hashing::{hash_prompt_into, prompt_seed};
use tokio::sync::{mpsc, oneshot, Notify};

use super::api::{self, Api, ApiError, Parsed, Render, Usage};
use super::kv_publish::Publish;
use super::model::{self, Command, NewJob, Progress, Snapshot};
use super::Shared;

pub type ResponseBody = BoxBody<Bytes, Infallible>;

/// Largest request body read.
const MAX_BODY_BYTES: usize = 32 << 20;
/// Stream chunks are at least this far apart; faster tokens share a chunk.
const MIN_CHUNK_GAP_MS: f64 = 5.0;
/// After the last chunk before a reset has left the channel, time for it to reach the socket.
const RESET_GRACE: Duration = Duration::from_millis(50);
/// Longest `first-byte-delay-ms` and `/mock/refuse` time honoured.
const MAX_FAULT_MS: u64 = 600_000;

/// Failures asked for by a request's `x-mock-fault` header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Stream this many chunks, then reset the connection.
    pub reset_after: Option<usize>,
    pub first_byte_delay_ms: Option<u64>,
    pub status: Option<u16>,
}

/// `key=value` items separated by `,` or `;`.
pub fn parse_faults(spec: &str) -> Result<Faults, String> {
    let mut faults = Faults::default();
    for item in spec
        .split([',', ';'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let (key, value) = item
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .ok_or_else(|| format!("x-mock-fault item '{item}' is not key=value"))?;
        let number = |what: &str| {
            value
                .parse::<u64>()
                .map_err(|_| format!("x-mock-fault {key} wants {what} (got '{value}')"))
        };
        match key {
            "reset-after" => {
                faults.reset_after = Some(number("a chunk count")?.min(1 << 20) as usize)
            }
            "first-byte-delay-ms" => {
                faults.first_byte_delay_ms = Some(number("milliseconds")?.min(MAX_FAULT_MS))
            }
            "status" => match number("an HTTP status") {
                Ok(code @ 400..=599) => faults.status = Some(code as u16),
                _ => {
                    return Err(format!(
                        "x-mock-fault status must be in 400..=599 (got '{value}')"
                    ))
                }
            },
            _ => {
                return Err(format!(
                    "unknown x-mock-fault '{key}' (known: reset-after, first-byte-delay-ms, \
                     status)"
                ))
            }
        }
    }
    Ok(faults)
}

/// Answers one request. A reset fault never returns: the connection's task drops it.
pub async fn handle(
    request: Request<Incoming>,
    shared: Arc<Shared>,
    kill: Arc<Notify>,
) -> Response<ResponseBody> {
    let request_id = request.headers().get("x-request-id").cloned();
    let mut response = route(request, &shared, &kill).await;
    let headers = response.headers_mut();
    if let Ok(name) = HeaderValue::from_str(&shared.name) {
        headers.insert("x-mock-replica", name);
    }
    if let Some(id) = request_id {
        headers.insert("x-request-id", id);
    }
    response
}

async fn route(
    request: Request<Incoming>,
    shared: &Arc<Shared>,
    kill: &Arc<Notify>,
) -> Response<ResponseBody> {
    let spec: Vec<&str> = request
        .headers()
        .get_all("x-mock-fault")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let faults = match parse_faults(&spec.join(",")) {
        Ok(faults) => faults,
        Err(message) => return error(ApiError::bad_request(message)),
    };
    if let Some(ms) = faults.first_byte_delay_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(status) = faults.status {
        return error(ApiError {
            status,
            message: format!("status {status} injected by x-mock-fault"),
        });
    }
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let api = match path.as_str() {
        "/v1/completions" => Some(Api::Completions),
        "/v1/chat/completions" => Some(Api::Chat),
        "/inference/v1/generate" => Some(Api::Generate),
        _ => None,
    };
    if let Some(api) = api {
        if method != Method::POST {
            return not_allowed(&path);
        }
        return match inference(api, request, shared, kill, faults).await {
            Ok(response) => response,
            Err(e) => error(e),
        };
    }
    if faults.reset_after.is_some() {
        return reset(kill).await;
    }
    match (path.as_str(), method == Method::GET, method == Method::POST) {
        ("/health", true, _) => respond(StatusCode::OK, "text/plain", Bytes::new()),
        ("/v1/models", true, _) => models(shared),
        ("/metrics", true, _) => metrics(shared).await,
        ("/mock/refuse", _, true) => refuse(request.uri().query(), shared).await,
        ("/mock/kv-events", _, true) => kv_events(request.uri().query(), shared),
        ("/reset_prefix_cache", _, true) => {
            let _ = shared.owner.send(Command::ClearCache);
            respond(
                StatusCode::OK,
                "application/json",
                Bytes::from_static(b"{}"),
            )
        }
        (
            "/health"
            | "/v1/models"
            | "/metrics"
            | "/mock/refuse"
            | "/mock/kv-events"
            | "/reset_prefix_cache",
            _,
            _,
        ) => not_allowed(&path),
        _ => error(ApiError {
            status: 404,
            message: format!("no route {method} {path}"),
        }),
    }
}

/// Withdraws a request's sequences from the model unless they all finished.
struct Release {
    ids: Vec<usize>,
    owner: mpsc::UnboundedSender<Command>,
    armed: bool,
}

impl Drop for Release {
    fn drop(&mut self) {
        if self.armed {
            let _ = self
                .owner
                .send(Command::Cancel(std::mem::take(&mut self.ids)));
        }
    }
}

async fn inference(
    api: Api,
    request: Request<Incoming>,
    shared: &Arc<Shared>,
    kill: &Arc<Notify>,
    faults: Faults,
) -> Result<Response<ResponseBody>, ApiError> {
    let body = match Limited::new(request.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(ApiError {
                status: 413,
                message: format!("the body is over {MAX_BODY_BYTES} bytes"),
            })
        }
        Err(e) => return Err(ApiError::bad_request(format!("reading the body: {e}"))),
    };
    let parsed = api::parse(api, &body, &shared.tokenizer)?;
    let (jobs, prompt_tokens) = jobs_of(&parsed, shared);
    let ids: Vec<usize> = jobs.iter().map(|j| j.id).collect();
    let (progress_tx, mut progress) = mpsc::unbounded_channel();
    shared
        .owner
        .send(Command::Submit {
            jobs,
            progress: progress_tx,
        })
        .map_err(|_| unavailable())?;
    let mut release = Release {
        ids,
        owner: shared.owner.clone(),
        armed: true,
    };
    let n = shared.next_response.fetch_add(1, Ordering::Relaxed);
    let render = Render {
        api,
        id: match api {
            Api::Completions => format!("cmpl-{}-{n}", shared.name),
            Api::Chat => format!("chatcmpl-{}-{n}", shared.name),
            Api::Generate => format!("gen-{}-{n}", shared.name),
        },
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: shared.model.clone(),
    };
    let usage = Usage {
        prompt_tokens,
        ..Usage::default()
    };
    if parsed.stream {
        let (tx, rx) = mpsc::channel(1);
        let stream = Stream {
            render,
            parsed,
            usage,
            decode_ms_per_token: shared.decode_ms_per_token,
            start: shared.start,
            out: Sink {
                tx,
                sent: 0,
                reset_after: faults.reset_after,
                kill: kill.clone(),
            },
        };
        tokio::spawn(stream.run(progress, release));
        let mut response = Response::new(ChannelBody { rx }.boxed());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok(response);
    }
    let mut usage = usage;
    let mut left = parsed.prompts.len();
    while left > 0 {
        match progress.recv().await {
            Some(Progress::First { cached_tokens, .. }) => {
                usage.cached_tokens += u64::from(cached_tokens)
            }
            Some(Progress::Done { .. }) => left -= 1,
            None => return Err(unavailable()),
        }
    }
    release.armed = false;
    if faults.reset_after.is_some() {
        return Ok(reset(kill).await);
    }
    let outputs = vec![parsed.output_tokens; parsed.prompts.len()];
    usage.completion_tokens = u64::from(parsed.output_tokens) * outputs.len() as u64;
    Ok(respond(
        StatusCode::OK,
        "application/json",
        render.full(&outputs, usage),
    ))
}

/// One model job per prompt, hashed over its full blocks; also the request's prompt tokens.
fn jobs_of(parsed: &Parsed, shared: &Shared) -> (Vec<NewJob>, u64) {
    let seed = prompt_seed(&shared.model, &parsed.cache_salt);
    let block_size = shared.block_size;
    let mut total = 0;
    let jobs = parsed
        .prompts
        .iter()
        .enumerate()
        .map(|(index, tokens)| {
            let mut chain = Vec::new();
            hash_prompt_into(
                seed,
                tokens,
                block_size,
                tokens.len() / block_size.max(1),
                &mut chain,
            );
            let prompt_tokens = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
            total += u64::from(prompt_tokens);
            let full = if shared.kv_events.is_some() {
                tokens[..chain.len() * block_size].to_vec()
            } else {
                Vec::new()
            };
            NewJob {
                id: shared.next_job.fetch_add(1, Ordering::Relaxed),
                index,
                prompt_tokens,
                output_tokens: parsed.output_tokens,
                chain,
                tokens: full,
                cache_salt: parsed.cache_salt.clone(),
            }
        })
        .collect();
    (jobs, total)
}

/// The sending side of a streamed body, counting chunks for `reset-after`.
struct Sink {
    tx: mpsc::Sender<Bytes>,
    sent: usize,
    reset_after: Option<usize>,
    kill: Arc<Notify>,
}

impl Sink {
    /// Sends one chunk; false when the stream must stop (client gone, or reset).
    async fn send(&mut self, chunk: Bytes) -> bool {
        if self.reset_after == Some(self.sent) {
            self.reset().await;
            return false;
        }
        if self.tx.send(chunk).await.is_err() {
            return false;
        }
        self.sent += 1;
        if self.reset_after == Some(self.sent) {
            self.reset().await;
            return false;
        }
        true
    }

    async fn reset(&self) {
        // With room for one chunk, a free slot means the connection has taken the last one.
        let _ = tokio::time::timeout(Duration::from_secs(1), self.tx.reserve()).await;
        tokio::time::sleep(RESET_GRACE).await;
        self.kill.notify_one();
        // Ending the body before the connection is gone would let it close cleanly.
        let _ = tokio::time::timeout(Duration::from_secs(1), self.tx.closed()).await;
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct ChoiceState {
    first_at: Option<f64>,
    sent: u32,
    done: bool,
}

/// A streamed answer: chunks paced by the model's first and last token and the decode rate.
struct Stream {
    render: Render,
    parsed: Parsed,
    usage: Usage,
    decode_ms_per_token: f64,
    start: tokio::time::Instant,
    out: Sink,
}

impl Stream {
    async fn run(mut self, mut progress: mpsc::UnboundedReceiver<Progress>, mut release: Release) {
        let total = self.parsed.output_tokens;
        let mut choices = vec![ChoiceState::default(); self.parsed.prompts.len()];
        let mut last_chunk_at = f64::NEG_INFINITY;
        while choices.iter().any(|c| !c.done) {
            let wake = choices
                .iter()
                .filter(|c| !c.done && c.sent + 1 < total)
                .filter_map(|c| {
                    c.first_at
                        .map(|f| f + f64::from(c.sent) * self.decode_ms_per_token)
                })
                .min_by(f64::total_cmp)
                .map(|t| model::instant_at(self.start, t.max(last_chunk_at + MIN_CHUNK_GAP_MS)));
            let tx = self.out.tx.clone();
            tokio::select! {
                _ = tx.closed() => return,
                event = progress.recv() => match event {
                    None => return,
                    Some(Progress::First { index, at_ms, cached_tokens }) => {
                        let Some(c) = choices.get_mut(index) else { continue };
                        self.usage.cached_tokens += u64::from(cached_tokens);
                        c.first_at = Some(at_ms);
                        if c.sent == 0 && total > 0 {
                            c.sent = 1;
                            last_chunk_at = model::ms_since(self.start);
                            if !self.out.send(self.render.tokens_chunk(index, 0, 1)).await {
                                return;
                            }
                        }
                    }
                    Some(Progress::Done { index, .. }) => {
                        let Some(c) = choices.get_mut(index) else { continue };
                        c.done = true;
                        let from = c.sent;
                        c.sent = total;
                        if from < total {
                            last_chunk_at = model::ms_since(self.start);
                            if !self.out.send(self.render.tokens_chunk(index, from, total)).await {
                                return;
                            }
                        }
                    }
                },
                _ = async {
                    match wake {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {
                    let now = model::ms_since(self.start);
                    for (index, c) in choices.iter_mut().enumerate() {
                        let Some(first) = c.first_at else { continue };
                        if c.done {
                            continue;
                        }
                        // The last token waits for the model's word that the sequence is done.
                        let decoded = 1.0 + ((now - first) / self.decode_ms_per_token).floor();
                        let due = decoded.clamp(0.0, f64::from(total.saturating_sub(1))) as u32;
                        if due > c.sent {
                            let from = c.sent;
                            c.sent = due;
                            if !self.out.send(self.render.tokens_chunk(index, from, due)).await {
                                return;
                            }
                        }
                    }
                    last_chunk_at = now;
                }
            }
        }
        release.armed = false;
        for index in 0..choices.len() {
            if !self.out.send(self.render.finish_chunk(index)).await {
                return;
            }
        }
        if self.parsed.include_usage {
            self.usage.completion_tokens = u64::from(total) * choices.len() as u64;
            if !self.out.send(self.render.usage_chunk(self.usage)).await {
                return;
            }
        }
        self.out.send(Bytes::from_static(api::SSE_DONE)).await;
    }
}

/// A response body fed by a channel; it ends when the sender is dropped.
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }
}

/// Cuts the connection (its task drops it with a zero linger, so the peer sees a reset) and
/// waits to be dropped with it.
async fn reset(kill: &Notify) -> Response<ResponseBody> {
    kill.notify_one();
    std::future::pending().await
}

fn models(shared: &Shared) -> Response<ResponseBody> {
    let body = serde_json::json!({
        "object": "list",
        "data": [{
            "id": shared.model, "object": "model", "created": shared.created,
            "owned_by": "switchyard", "root": shared.model, "parent": null,
        }],
    });
    respond(
        StatusCode::OK,
        "application/json",
        Bytes::from(body.to_string()),
    )
}

async fn metrics(shared: &Shared) -> Response<ResponseBody> {
    let (reply, answer) = oneshot::channel();
    if shared.owner.send(Command::Snapshot(reply)).is_err() {
        return error(unavailable());
    }
    match answer.await {
        Ok(snapshot) => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            Bytes::from(render_metrics(shared, &snapshot)),
        ),
        Err(_) => error(unavailable()),
    }
}

/// The Prometheus text page, with vLLM's metric names.
pub fn render_metrics(shared: &Shared, s: &Snapshot) -> String {
    let model = escape_label(&shared.model);
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, labels: &str, value: String| {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}model_name=\"{model}\"}} {value}\n"
        ));
    };
    metric(
        "vllm:num_requests_running",
        "gauge",
        "Requests in the running batch.",
        "",
        s.running.to_string(),
    );
    metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Requests waiting for a batch slot.",
        "",
        s.waiting.to_string(),
    );
    metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage, 0 to 1.",
        "",
        s.kv_usage.to_string(),
    );
    metric(
        "vllm:cache_config_info",
        "gauge",
        "Cache configuration.",
        &format!(
            "block_size=\"{}\",num_gpu_blocks=\"{}\",",
            shared.block_size, shared.cache_blocks
        ),
        "1".into(),
    );
    metric(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        "",
        s.prefix_queries.to_string(),
    );
    metric(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prompt tokens found in the prefix cache.",
        "",
        s.prefix_hits.to_string(),
    );
    metric(
        "vllm:request_success_total",
        "counter",
        "Requests finished.",
        "",
        s.successes.to_string(),
    );
    metric(
        "vllm:prompt_tokens_total",
        "counter",
        "Prompt tokens prefilled or found cached.",
        "",
        s.prompt_tokens.to_string(),
    );
    metric(
        "vllm:generation_tokens_total",
        "counter",
        "Tokens generated.",
        "",
        s.generation_tokens.to_string(),
    );
    if let Some(publisher) = &shared.kv_events {
        out.push_str(&format!(
            "# HELP mock_kv_event_messages_total KV event messages queued for publishing (withheld ones included).\n\
             # TYPE mock_kv_event_messages_total counter\nmock_kv_event_messages_total {}\n",
            publisher.queued()
        ));
    }
    out
}

fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `POST /mock/kv-events?withhold=N`, `?malformed` or `?flood=N`: a fault in the KV-event
/// stream (the next N messages kept from subscribers but not from the replay; one unreadable
/// message; N messages at once).
fn kv_events(query: Option<&str>, shared: &Shared) -> Response<ResponseBody> {
    let Some(publish) = &shared.kv_events else {
        return error(ApiError::bad_request(
            "this replica publishes no KV events (start it with --kv-events-port)",
        ));
    };
    let query = query.unwrap_or("");
    let number = |key: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(key))
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&n| n <= 1_000_000)
    };
    let command = if let Some(n) = number("withhold=") {
        Publish::Withhold(n)
    } else if let Some(n) = number("flood=") {
        Publish::Flood(n)
    } else if query.split('&').any(|kv| kv == "malformed") {
        Publish::Malformed
    } else {
        return error(ApiError::bad_request(
            "/mock/kv-events wants ?withhold=N, ?flood=N (N up to 1000000) or ?malformed",
        ));
    };
    if !publish.send(command) {
        return error(unavailable());
    }
    respond(
        StatusCode::OK,
        "application/json",
        Bytes::from_static(b"{}"),
    )
}

/// `POST /mock/refuse?ms=N`: the listener closes for N ms; answered once it is closed.
async fn refuse(query: Option<&str>, shared: &Shared) -> Response<ResponseBody> {
    let ms = query
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("ms="))
        .and_then(|v| v.parse::<u64>().ok());
    let Some(ms) = ms.filter(|&ms| ms <= MAX_FAULT_MS) else {
        return error(ApiError::bad_request(format!(
            "/mock/refuse wants ?ms=N with N in 0..={MAX_FAULT_MS}"
        )));
    };
    let (ack, closed) = oneshot::channel();
    if shared.refuse.send((ms, ack)).await.is_err() {
        return error(unavailable());
    }
    match tokio::time::timeout(Duration::from_secs(5), closed).await {
        Ok(Ok(())) => respond(
            StatusCode::OK,
            "application/json",
            Bytes::from(format!("{{\"refusing_ms\":{ms}}}")),
        ),
        _ => error(unavailable()),
    }
}

fn unavailable() -> ApiError {
    ApiError {
        status: 503,
        message: "the replica model has stopped".into(),
    }
}

fn not_allowed(path: &str) -> Response<ResponseBody> {
    error(ApiError {
        status: 405,
        message: format!("method not allowed on {path}"),
    })
}

fn error(e: ApiError) -> Response<ResponseBody> {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    respond(status, "application/json", e.body())
}

fn respond(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<ResponseBody> {
    let mut response = Response::new(Full::new(body).boxed());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_from_one_or_several_items() {
        assert_eq!(parse_faults(""), Ok(Faults::default()));
        assert_eq!(
            parse_faults("reset-after=2; first-byte-delay-ms=30 , status=503"),
            Ok(Faults {
                reset_after: Some(2),
                first_byte_delay_ms: Some(30),
                status: Some(503),
            })
        );
        assert!(parse_faults("status=200")
            .unwrap_err()
            .contains("400..=599"));
        assert!(parse_faults("reset-after=x")
            .unwrap_err()
            .contains("chunk count"));
        assert!(parse_faults("explode=1").unwrap_err().contains("unknown"));
        assert!(parse_faults("status").unwrap_err().contains("key=value"));
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(escape_label(r#"a"b\c"#), r#"a\"b\\c"#);
    }
}
