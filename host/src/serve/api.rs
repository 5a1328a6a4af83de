//! The OpenAI-compatible routes: read the body, place the request, forward it unchanged to
//! the chosen replica and relay the answer. Connection failures before anything was sent go to
//! the next candidate, a bounded number of times.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH, HOST};
use hyper::{Method, Request, Response, StatusCode};
use switchyard_plugin_api::Outcome;
use tokio::sync::watch;

use super::response::ServeBody;
use super::upstream::{Client, Ending, PrefixCheck, RelayedBody};
use crate::config::ServeConfig;
use crate::fleet::{FleetState, LiveFleet};
use crate::live::admin::Observed;
use crate::live::body::{self, Api};
use crate::live::ids::{RequestIds, REQUEST_ID};
use crate::live::journal::Journal;
use crate::live::metrics::{CloseReason, Metrics, RequestOutcome, Tally};
use crate::live::reload::Reloader;
use crate::live::response::{json, ApiError};
use crate::live::LiveScheduler;
use crate::pipeline;
use crate::replay::ReplayOutput;

/// The opt-in header carrying the pick and the top scores.
pub const DECISION_HEADER: &str = "x-switchyard-decision";
/// Totals shown in the decision header.
const TOP_SCORES: usize = 3;
/// How long `GET /v1/models` waits for each replica.
const MODELS_TIMEOUT: Duration = Duration::from_secs(2);

/// Everything a request handler needs; shared by every connection.
pub struct Router {
    pub live: Arc<LiveScheduler>,
    pub reloader: Arc<Reloader>,
    pub fleet: LiveFleet,
    pub client: Client,
    pub metrics: Metrics,
    pub settings: ServeConfig,
    pub journal: Option<Journal>,
    pub ids: Arc<RequestIds>,
    /// Becomes `true` at the drain deadline: requests still unanswered get 503.
    pub cut: watch::Receiver<bool>,
}

impl Observed for Router {
    fn live(&self) -> &Arc<LiveScheduler> {
        &self.live
    }
    fn reloader(&self) -> &Arc<Reloader> {
        &self.reloader
    }
    fn fleet(&self) -> Arc<FleetState> {
        self.fleet.current()
    }
    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

impl Router {
    pub async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Response<ServeBody> {
        // Every answer carries the request's id, the router's own errors included.
        let request_id =
            client_request_id(request.headers()).unwrap_or_else(|| self.ids.generate());
        let mut tally = Tally::new(&self.metrics, &self.cut);
        let answered = {
            let answer = self.answer(request, &request_id, &mut tally);
            let mut cut = self.cut.clone();
            tokio::select! {
                biased;
                response = answer => Some(response),
                () = drain_deadline(&mut cut) => None,
            }
        };
        let mut response = answered.unwrap_or_else(|| {
            let error = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                RequestOutcome::ShuttingDown,
                format!(
                    "the router is shutting down and drain_timeout_ms = {} has passed",
                    self.settings.drain_timeout_ms
                ),
            );
            tally.settle(error.outcome, "");
            error.into_response()
        });
        if let Ok(value) = HeaderValue::from_str(&request_id) {
            response.headers_mut().insert(REQUEST_ID, value);
        }
        response
    }

    async fn answer(
        &self,
        request: Request<Incoming>,
        request_id: &str,
        tally: &mut Tally<'_>,
    ) -> Response<ServeBody> {
        let api = match request.uri().path() {
            "/v1/completions" => Api::Completions,
            "/v1/chat/completions" => Api::ChatCompletions,
            "/inference/v1/generate" => Api::Generate,
            "/v1/models" if request.method() == Method::GET => {
                let (response, outcome) = self.models().await;
                tally.settle(outcome, "");
                return response;
            }
            "/v1/models" => {
                tally.settle(RequestOutcome::MethodNotAllowed, "");
                return method_not_allowed("GET");
            }
            path => {
                tally.settle(RequestOutcome::BadRequest, "");
                return not_found(path).into_response();
            }
        };
        if request.method() != Method::POST {
            tally.settle(RequestOutcome::MethodNotAllowed, "");
            return method_not_allowed("POST");
        }
        match self.inference(api, request, request_id, tally).await {
            Ok(response) => response,
            Err(error) => {
                tally.settle(error.outcome, error.endpoint.as_deref().unwrap_or(""));
                error.into_response()
            }
        }
    }

    async fn inference(
        &self,
        api: Api,
        request: Request<Incoming>,
        request_id: &str,
        tally: &mut Tally<'_>,
    ) -> Result<Response<ServeBody>, ApiError> {
        let (parts, incoming) = request.into_parts();
        let bytes = self.read_body(&parts.headers, incoming).await?;
        let parsed = body::parse(api, &bytes).map_err(|e| ApiError::bad_request(e.message))?;
        let client_id = request_id.to_string();
        let mut journal = self.journal.as_ref().map(|j| {
            j.entry(
                &parsed.model,
                &parsed.cache_salt,
                &parsed.prompt,
                parsed.max_output_tokens,
            )
        });
        let deadline = (self.settings.request_timeout_ms > 0).then(|| {
            tokio::time::Instant::now() + Duration::from_millis(self.settings.request_timeout_ms)
        });
        let path = parts
            .uri
            .path_and_query()
            .map_or(api.path(), |p| p.as_str())
            .to_string();
        let mut prompt = Some(parsed.prompt);
        let mut attempt = 0;
        // The last refused connection (endpoint, error), once a retry is under way.
        let mut refused: Option<(String, String)> = None;
        loop {
            let prompt = match prompt.take() {
                Some(prompt) => prompt,
                // A retry: the first prompt went into the scheduler; the body parsed before.
                None => {
                    body::parse(api, &bytes)
                        .map_err(|e| ApiError::bad_request(e.message))?
                        .prompt
                }
            };
            let placement = self
                .live
                .place(pipeline::Request {
                    id: client_id.clone(),
                    model: parsed.model.clone(),
                    cache_salt: parsed.cache_salt.clone(),
                    prompt,
                    max_output_tokens: parsed.max_output_tokens,
                })
                .await;
            self.metrics.decision(
                placement.cost.as_secs_f64(),
                (placement.decided_ms - placement.arrival_ms).max(0.0) / 1000.0,
            );
            if let Some(tokenizing) = placement.tokenizing {
                self.metrics.tokenized(tokenizing.as_secs_f64());
            }
            if attempt == 0 {
                if let Some(entry) = journal.as_mut() {
                    entry.set_placement(placement.arrival_ms, &placement.request_id);
                }
            }
            let (placed, charge) = match placement.result {
                Ok(placed) => placed,
                Err(rejection) => {
                    if let Some(entry) = journal {
                        entry.write(None);
                    }
                    // Every candidate left refused and is ejected: still unreachable.
                    if let (Some((endpoint, failure)), pipeline::Rejection::NoEndpoints) =
                        (&refused, &rejection)
                    {
                        return Err(unreachable(attempt, endpoint, failure));
                    }
                    return Err(ApiError::rejected(&rejection));
                }
            };
            tally.sent_to(&placed.endpoint_id);
            let upstream = forward_request(&parts, &placed.address, &path, &client_id, &bytes);
            let sent = match deadline {
                Some(at) => tokio::time::timeout_at(at, self.client.request(upstream)).await,
                None => Ok(self.client.request(upstream).await),
            };
            let failure = match sent {
                Ok(Ok(response)) => {
                    let decision = self
                        .settings
                        .decision_header
                        .then(|| placement.record.as_deref().and_then(decision_header))
                        .flatten();
                    let ending = Ending {
                        metrics: self.metrics.clone(),
                        endpoint: tally.hand_over(),
                        cut: self.cut.clone(),
                        clock: self.live.clock(),
                        journal,
                        // Only a successful answer carries the usage that checks a prediction.
                        check: response
                            .status()
                            .is_success()
                            .then(|| PrefixCheck::new(placement.predicted))
                            .flatten(),
                    };
                    let (head, incoming) = response.into_parts();
                    return Ok(relay(
                        head,
                        RelayedBody::new(incoming, charge, deadline, ending),
                        &client_id,
                        decision,
                    ));
                }
                Ok(Err(error)) => error,
                Err(_) => {
                    charge.finish(Outcome::Failed);
                    self.metrics.upstream_error(&placed.endpoint_id, "timeout");
                    if let Some(entry) = journal {
                        entry.write(Some(self.live.clock().now_ms()));
                    }
                    return Err(ApiError::new(
                        StatusCode::GATEWAY_TIMEOUT,
                        "upstream_timeout",
                        RequestOutcome::Timeout,
                        format!(
                            "{} did not answer within request_timeout_ms = {}",
                            placed.endpoint_id, self.settings.request_timeout_ms
                        ),
                    )
                    .at(&placed.endpoint_id));
                }
            };
            charge.finish(Outcome::Failed);
            if !failure.is_connect() {
                self.metrics.upstream_error(&placed.endpoint_id, "response");
                if let Some(entry) = journal {
                    entry.write(Some(self.live.clock().now_ms()));
                }
                return Err(ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "upstream_error",
                    RequestOutcome::UpstreamError,
                    format!("{} failed before answering: {failure}", placed.endpoint_id),
                )
                .at(&placed.endpoint_id));
            }
            self.metrics.upstream_error(&placed.endpoint_id, "connect");
            self.live.eject(&placed.endpoint_id);
            tracing::warn!(
                endpoint = %placed.endpoint_id,
                request_id = %client_id,
                "connection failed ({failure}); left out of decisions for a while"
            );
            if attempt >= self.settings.max_retries {
                if let Some(entry) = journal {
                    entry.write(None);
                }
                return Err(unreachable(
                    attempt + 1,
                    &placed.endpoint_id,
                    &failure.to_string(),
                ));
            }
            refused = Some((placed.endpoint_id.clone(), failure.to_string()));
            attempt += 1;
            self.metrics.retry();
        }
    }

    /// The whole request body, within `max_body_bytes`, each piece within
    /// `body_idle_timeout_ms` of the one before.
    async fn read_body(&self, headers: &HeaderMap, body: Incoming) -> Result<Bytes, ApiError> {
        let limit = self.settings.max_body_bytes;
        let too_large = || {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                RequestOutcome::BodyTooLarge,
                format!("the request body is larger than max_body_bytes = {limit}"),
            )
        };
        let declared = headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit) {
            return Err(too_large());
        }
        let idle = Duration::from_millis(self.settings.body_idle_timeout_ms);
        let mut body = Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX));
        let mut pieces: Vec<Bytes> = Vec::new();
        loop {
            // The timer is only registered when the next piece is not there yet.
            let Ok(frame) = tokio::time::timeout(idle, body.frame()).await else {
                self.metrics.connection_closed(CloseReason::BodyTimeout);
                return Err(ApiError {
                    close: true,
                    ..ApiError::new(
                        StatusCode::REQUEST_TIMEOUT,
                        "body_timeout",
                        RequestOutcome::BodyTimeout,
                        format!(
                            "the request body paused for longer than body_idle_timeout_ms = {}",
                            self.settings.body_idle_timeout_ms
                        ),
                    )
                });
            };
            match frame {
                None => break,
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        if !data.is_empty() {
                            pieces.push(data);
                        }
                    }
                }
                Some(Err(error)) if error.downcast_ref::<LengthLimitError>().is_some() => {
                    return Err(too_large())
                }
                Some(Err(error)) => {
                    return Err(ApiError::bad_request(format!(
                        "the request body could not be read: {error}"
                    )))
                }
            }
        }
        Ok(match pieces.len() {
            0 => Bytes::new(),
            1 => pieces.swap_remove(0),
            _ => {
                let mut whole = BytesMut::with_capacity(pieces.iter().map(Bytes::len).sum());
                for piece in &pieces {
                    whole.extend_from_slice(piece);
                }
                whole.freeze()
            }
        })
    }

    /// `GET /v1/models`: the union of what the fleet's replicas serve, and how it ended.
    async fn models(&self) -> (Response<ServeBody>, RequestOutcome) {
        let members = self.fleet.current().members.clone();
        let asks: Vec<_> = members
            .iter()
            .map(|member| {
                let uri = format!("http://{}/v1/models", member.endpoint.address);
                let client = self.client.clone();
                tokio::spawn(async move {
                    let request = Request::get(uri).body(Full::new(Bytes::new())).ok()?;
                    let response = tokio::time::timeout(MODELS_TIMEOUT, client.request(request))
                        .await
                        .ok()?
                        .ok()?;
                    if !response.status().is_success() {
                        return None;
                    }
                    let bytes =
                        tokio::time::timeout(MODELS_TIMEOUT, response.into_body().collect())
                            .await
                            .ok()?
                            .ok()?
                            .to_bytes();
                    serde_json::from_slice::<serde_json::Value>(&bytes).ok()
                })
            })
            .collect();
        let mut seen = std::collections::BTreeMap::new();
        for ask in asks {
            let Ok(Some(answer)) = ask.await else {
                continue;
            };
            for model in answer["data"].as_array().into_iter().flatten() {
                if let Some(id) = model["id"].as_str() {
                    seen.entry(id.to_string()).or_insert_with(|| model.clone());
                }
            }
        }
        if seen.is_empty() {
            let error = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "no_endpoints",
                RequestOutcome::NoEndpoints,
                "no replica answered GET /v1/models",
            );
            let outcome = error.outcome;
            return (error.into_response(), outcome);
        }
        let data: Vec<serde_json::Value> = seen.into_values().collect();
        let response = json(
            StatusCode::OK,
            &serde_json::json!({"object": "list", "data": data}),
        );
        (response, RequestOutcome::Completed)
    }
}

/// The client's `x-request-id` when it is usable: 1 to 256 visible ASCII characters (no space
/// or tab, which would not survive being logged and forwarded as one token).
fn client_request_id(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(REQUEST_ID)?.as_bytes();
    let visible = |b: &u8| (0x21..=0x7e).contains(b);
    (!value.is_empty() && value.len() <= 256 && value.iter().all(visible))
        .then(|| String::from_utf8_lossy(value).into_owned())
}

/// Resolves once the drain deadline passed; never while the router runs.
async fn drain_deadline(cut: &mut watch::Receiver<bool>) {
    if cut.wait_for(|&cut| cut).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// No candidate accepted a connection; `last` refused with `failure`.
fn unreachable(attempts: u32, last: &str, failure: &str) -> ApiError {
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "upstream_unreachable",
        RequestOutcome::Unreachable,
        format!(
            "no replica could be reached after {attempts} attempt(s); last: {last} ({failure})"
        ),
    )
}

fn not_found(path: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_route",
        RequestOutcome::BadRequest,
        format!(
            "no route {path}; serve answers POST /v1/completions, /v1/chat/completions, \
             /inference/v1/generate and GET /v1/models"
        ),
    )
}

fn method_not_allowed(allowed: &'static str) -> Response<ServeBody> {
    let mut response = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        RequestOutcome::MethodNotAllowed,
        format!("this route takes {allowed}"),
    )
    .into_response();
    response
        .headers_mut()
        .insert(hyper::header::ALLOW, HeaderValue::from_static(allowed));
    response
}

/// Headers that belong to one hop and are never forwarded.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "upgrade"
            | "te"
            | "trailer"
            | "proxy-authenticate"
            | "proxy-authorization"
    )
}

/// The client's request as the replica gets it: same method, path, headers and body.
fn forward_request(
    parts: &hyper::http::request::Parts,
    address: &str,
    path: &str,
    request_id: &str,
    body: &Bytes,
) -> Request<Full<Bytes>> {
    let mut request = Request::new(Full::new(body.clone()));
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = format!("http://{address}{path}")
        .parse()
        .unwrap_or_else(|_| hyper::Uri::from_static("http://invalid/"));
    let headers = request.headers_mut();
    for (name, value) in parts.headers.iter() {
        if !hop_by_hop(name) && name != HOST && name != CONTENT_LENGTH {
            headers.append(name.clone(), value.clone());
        }
    }
    if let Ok(value) = HeaderValue::from_str(address) {
        headers.insert(HOST, value);
    }
    if let Ok(value) = HeaderValue::from_str(request_id) {
        headers.insert(REQUEST_ID, value);
    }
    request
}

/// The replica's response with its status and headers, relaying its body.
fn relay(
    parts: hyper::http::response::Parts,
    body: RelayedBody,
    request_id: &str,
    decision: Option<HeaderValue>,
) -> Response<ServeBody> {
    let mut response = Response::new(ServeBody::Relayed(body));
    *response.status_mut() = parts.status;
    let headers = response.headers_mut();
    for (name, value) in parts.headers.iter() {
        if !hop_by_hop(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    if let Ok(value) = HeaderValue::from_str(request_id) {
        headers.insert(REQUEST_ID, value);
    }
    if let Some(value) = decision {
        headers.insert(DECISION_HEADER, value);
    }
    response
}

/// `endpoint=<pick>; top=<id>:<total>,...` from a decision record.
fn decision_header(record: &ReplayOutput) -> Option<HeaderValue> {
    let pick = record.endpoints.first()?;
    let mut value = format!("endpoint={pick}");
    if let Some(decision) = &record.decision {
        let mut totals: Vec<_> = decision.totals().collect();
        totals.sort_by(|a, b| b.1.total_cmp(&a.1));
        let top: Vec<String> = totals
            .iter()
            .take(TOP_SCORES)
            .map(|(endpoint, score)| format!("{endpoint}:{score:.3}"))
            .collect();
        if !top.is_empty() {
            value.push_str("; top=");
            value.push_str(&top.join(","));
        }
    }
    HeaderValue::from_str(&value).ok()
}
