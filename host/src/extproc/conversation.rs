//! One ext_proc stream: one HTTP request as Envoy (or a trainer speaking for Envoy) shows
//! it, from request headers to the end of the response.
//!
//! Under `FULL_DUPLEX_STREAMED` the request body arrives without waiting for an answer to the
//! headers, so the request-headers answer (the destination) goes out once the whole body is
//! in, followed by the body echoed back in chunks. The request is charged when placed and
//! released once: at the end of the response body in tracked use, or when the stream ends
//! (a client that only wanted the pick abandons it after reading the destination).

use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Phase;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use hyper::StatusCode;
use switchyard_plugin_api::Outcome;
use tokio::sync::mpsc;
use tonic::{Code, Status};

use super::messages::{self, header};
use super::Picker;
use crate::live::body::{self, Api};
use crate::live::metrics::RequestOutcome;
use crate::live::response::ApiError;
use crate::live::usage::UsageScanner;
use crate::live::{InFlight, Subset};
use crate::pipeline;
use crate::pipeline::Predicted;

type Out = mpsc::Sender<Result<ProcessingResponse, Status>>;

/// Whether the stream goes on after a message.
enum Flow {
    Continue,
    End,
}

/// What one stream has seen so far.
struct Conversation {
    picker: Arc<Picker>,
    out: Out,
    path: String,
    request_id: Option<String>,
    subset: Option<Subset>,
    body: Vec<u8>,
    decided: bool,
    charge: Option<InFlight>,
    destination: String,
    response_status: Option<u16>,
    response_started: bool,
    response_done: bool,
    /// False when Envoy said it sends no response bodies: the response headers end the
    /// request then.
    response_bodies: bool,
    usage: UsageScanner,
    /// The prefix prediction for the picked endpoint, checked against the response's usage
    /// (dropped when the data plane served the request elsewhere).
    predicted: Predicted,
    /// Whether this stream's request was counted in `switchyard_requests_total`.
    counted: bool,
}

/// Serves one stream until either side ends it.
pub async fn converse(
    picker: Arc<Picker>,
    mut inbound: tonic::Streaming<ProcessingRequest>,
    out: Out,
) {
    let mut conversation = Conversation {
        picker,
        out,
        path: String::new(),
        request_id: None,
        subset: None,
        body: Vec::new(),
        decided: false,
        charge: None,
        destination: String::new(),
        response_status: None,
        response_started: false,
        response_done: false,
        response_bodies: true,
        usage: UsageScanner::default(),
        predicted: Predicted::default(),
        counted: false,
    };
    let mut first = true;
    loop {
        let next = tokio::select! {
            next = inbound.message() => next,
            () = conversation.out.closed() => break,
        };
        let message = match next {
            Ok(Some(message)) => message,
            Ok(None) => break,
            Err(status) => {
                conversation.unreadable(status).await;
                break;
            }
        };
        if std::mem::take(&mut first) {
            match check_protocol(&message) {
                Ok(response_bodies) => conversation.response_bodies = response_bodies,
                Err(status) => {
                    tracing::warn!("ext_proc stream refused: {}", status.message());
                    let _ = conversation.out.send(Err(status)).await;
                    return;
                }
            }
        }
        if let Flow::End = conversation.handle(message).await {
            break;
        }
    }
    conversation.end();
}

/// Envoy (1.32 and later) says on the first message how it sends bodies. The picker needs
/// the whole request body streamed without waiting for answers; anything else would stall
/// until Envoy's message timeout, so it is refused at once. Returns whether response bodies
/// will be sent.
fn check_protocol(message: &ProcessingRequest) -> Result<bool, Status> {
    use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
    let Some(config) = &message.protocol_config else {
        return Ok(true);
    };
    let name = |mode: i32| {
        BodySendMode::try_from(mode)
            .map_or_else(|_| format!("mode {mode}"), |m| m.as_str_name().to_string())
    };
    let full_duplex = BodySendMode::FullDuplexStreamed as i32;
    if config.request_body_mode != full_duplex {
        return Err(Status::failed_precondition(format!(
            "switchyard needs request_body_mode FULL_DUPLEX_STREAMED in Envoy's ext_proc \
             processing_mode; this filter sends {}",
            name(config.request_body_mode)
        )));
    }
    let none = BodySendMode::None as i32;
    if config.response_body_mode != full_duplex && config.response_body_mode != none {
        return Err(Status::failed_precondition(format!(
            "switchyard needs response_body_mode FULL_DUPLEX_STREAMED (or NONE) in Envoy's \
             ext_proc processing_mode; this filter sends {}",
            name(config.response_body_mode)
        )));
    }
    Ok(config.response_body_mode != none)
}

impl Conversation {
    /// The inbound stream failed. A message that could not be read is answered with the
    /// status that says why; a broken transport has nobody left to answer.
    async fn unreadable(&mut self, status: Status) {
        if std::error::Error::source(&status).is_some() {
            tracing::debug!("ext_proc stream broke: {status}");
            return;
        }
        let (answer, code) = match status.code() {
            Code::OutOfRange | Code::ResourceExhausted => (
                Status::resource_exhausted(status.message()),
                "resource_exhausted",
            ),
            Code::Internal => (status, "internal"),
            _ => {
                tracing::debug!("ext_proc stream broke: {status}");
                return;
            }
        };
        tracing::warn!(
            code,
            request_id = self.request_id.as_deref().unwrap_or(""),
            "ext_proc message refused, stream ended: {}",
            answer.message()
        );
        self.picker.metrics.broken_message(code);
        let outcome = if code == "internal" {
            RequestOutcome::BadRequest
        } else {
            RequestOutcome::BodyTooLarge
        };
        self.count(outcome, "");
        let _ = self.out.send(Err(answer)).await;
    }

    async fn handle(&mut self, message: ProcessingRequest) -> Flow {
        let Some(phase) = message.request else {
            return Flow::Continue;
        };
        match phase {
            Phase::RequestHeaders(headers) => {
                self.request_headers(&headers, message.metadata_context.as_ref());
                if headers.end_of_stream {
                    return self.bodiless().await;
                }
                Flow::Continue
            }
            Phase::RequestBody(chunk) => {
                if self.decided {
                    return Flow::Continue;
                }
                let limit = self.picker.max_body_bytes;
                if (self.body.len() + chunk.body.len()) as u64 > limit {
                    return self
                        .reject(ApiError::new(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            "body_too_large",
                            RequestOutcome::BodyTooLarge,
                            format!("the request body is larger than max_body_bytes = {limit}"),
                        ))
                        .await;
                }
                self.body.extend_from_slice(&chunk.body);
                if chunk.end_of_stream {
                    return self.decide().await;
                }
                Flow::Continue
            }
            Phase::RequestTrailers(_) => {
                if !self.decided {
                    if let Flow::End = self.decide().await {
                        return Flow::End;
                    }
                }
                self.send(messages::trailers(true)).await
            }
            Phase::ResponseHeaders(headers) => {
                self.response_started = true;
                self.response_status =
                    header(headers.headers.as_ref(), ":status").and_then(|s| s.parse().ok());
                if let Some(served) = messages::served(message.metadata_context.as_ref()) {
                    let primary = self.destination.split(',').next().unwrap_or("");
                    if served != primary {
                        self.predicted = Predicted::default();
                        self.picker.metrics.served_elsewhere();
                        tracing::debug!(
                            picked = %primary,
                            served = %served,
                            "the data plane served the request on another endpoint"
                        );
                    }
                }
                let flow = self.send(messages::response_headers_continue()).await;
                if headers.end_of_stream || !self.response_bodies {
                    self.response_done = true;
                    self.finish();
                }
                flow
            }
            Phase::ResponseBody(chunk) => {
                self.response_started = true;
                self.usage.feed(&chunk.body);
                let end = chunk.end_of_stream;
                let flow = self
                    .send(messages::response_body_echo(chunk.body, end))
                    .await;
                if end {
                    self.response_done = true;
                    self.finish();
                }
                flow
            }
            Phase::ResponseTrailers(_) => {
                self.response_done = true;
                self.finish();
                self.send(messages::trailers(false)).await
            }
        }
    }

    fn request_headers(
        &mut self,
        headers: &HttpHeaders,
        metadata: Option<&envoy_types::pb::envoy::config::core::v3::Metadata>,
    ) {
        let map = headers.headers.as_ref();
        self.path = header(map, ":path").unwrap_or("").to_string();
        self.request_id = header(map, messages::REQUEST_ID)
            .filter(|v| !v.is_empty() && v.len() <= 256)
            .map(str::to_string);
        self.subset = messages::subset_hint(metadata);
    }

    /// A request without a body (`GET /v1/models` and the like): any allowed endpoint,
    /// fresh ones first, in turn; nothing is charged.
    async fn bodiless(&mut self) -> Flow {
        self.decided = true;
        let fleet = self.picker.fleet.current();
        let allowed: Vec<(&str, bool)> = fleet
            .members
            .iter()
            .filter(|m| {
                self.subset
                    .as_ref()
                    .is_none_or(|s| s.allows(&m.endpoint.address))
            })
            .map(|m| (m.endpoint.address.as_str(), m.fresh))
            .collect();
        let fresh: Vec<&str> = allowed.iter().filter(|a| a.1).map(|a| a.0).collect();
        let allowed = if fresh.is_empty() {
            allowed.iter().map(|a| a.0).collect()
        } else {
            fresh
        };
        if allowed.is_empty() {
            return self
                .reject(ApiError::rejected(&pipeline::Rejection::NoEndpoints))
                .await;
        }
        let turn = self.picker.next_bodiless();
        self.destination = allowed[turn % allowed.len()].to_string();
        let generated = self.generated_id();
        let answer = messages::destination(&self.destination, generated.as_deref(), None);
        self.send(answer).await
    }

    /// The whole body is in: place the request and tell Envoy where it goes.
    async fn decide(&mut self) -> Flow {
        self.decided = true;
        let path = self.path.split('?').next().unwrap_or("");
        let api = match path {
            "/v1/completions" => Api::Completions,
            "/v1/chat/completions" => Api::ChatCompletions,
            "/inference/v1/generate" => Api::Generate,
            other => {
                let error = ApiError::new(
                    StatusCode::NOT_FOUND,
                    "unknown_route",
                    RequestOutcome::BadRequest,
                    format!(
                        "no route {other}; the picker places POST /v1/completions, \
                         /v1/chat/completions and /inference/v1/generate"
                    ),
                );
                return self.reject(error).await;
            }
        };
        let parsed = match body::parse(api, &self.body) {
            Ok(parsed) => parsed,
            Err(error) => return self.reject(ApiError::bad_request(error.message)).await,
        };
        let generated = self.generated_id();
        let id = self
            .request_id
            .clone()
            .or_else(|| generated.clone())
            .unwrap_or_default();
        let request = pipeline::Request {
            id,
            model: parsed.model,
            cache_salt: parsed.cache_salt,
            prompt: parsed.prompt,
            max_output_tokens: parsed.max_output_tokens,
        };
        let live = self.picker.live.clone();
        let subset = self.subset.clone();
        let placement = tokio::select! {
            placement = live.place_within(request, subset.as_ref()) => placement,
            // The stream went away while the request waited in a window: withdrawn.
            () = self.out.closed() => return Flow::End,
        };
        self.picker.metrics.decision(
            placement.cost.as_secs_f64(),
            (placement.decided_ms - placement.arrival_ms).max(0.0) / 1000.0,
        );
        if let Some(tokenizing) = placement.tokenizing {
            self.picker.metrics.tokenized(tokenizing.as_secs_f64());
        }
        let (placed, charge) = match placement.result {
            Ok(placed) => placed,
            Err(rejection) => return self.reject(ApiError::rejected(&rejection)).await,
        };
        let mut destination = placed.address.clone();
        for fallback in &placed.fallbacks {
            destination.push(',');
            destination.push_str(fallback);
        }
        let scores = self
            .picker
            .emit_scores
            .then(|| placement.record.as_deref().map(|r| self.picker.scores(r)))
            .flatten();
        self.destination = destination;
        self.charge = Some(charge);
        self.predicted = placement.predicted;
        if let Flow::End = self
            .send(messages::destination(
                &self.destination,
                generated.as_deref(),
                scores,
            ))
            .await
        {
            return Flow::End;
        }
        let body = std::mem::take(&mut self.body);
        for echo in messages::request_body_echo(body) {
            if let Flow::End = self.send(echo).await {
                return Flow::End;
            }
        }
        Flow::Continue
    }

    /// A request id for a request that came without one.
    fn generated_id(&self) -> Option<String> {
        self.request_id
            .is_none()
            .then(|| self.picker.ids.generate())
    }

    /// Counts the stream's request once, however many ways its end is seen.
    fn count(&mut self, outcome: RequestOutcome, endpoint: &str) {
        if !std::mem::replace(&mut self.counted, true) {
            self.picker.metrics.request(outcome, endpoint);
        }
    }

    async fn reject(&mut self, error: ApiError) -> Flow {
        self.count(error.outcome, "");
        let request_id = match &self.request_id {
            Some(id) => id.clone(),
            None => self.picker.ids.generate(),
        };
        let _ = self.send(messages::immediate(&error, &request_id)).await;
        Flow::End
    }

    async fn send(&mut self, response: ProcessingResponse) -> Flow {
        match self.out.send(Ok(response)).await {
            Ok(()) => Flow::Continue,
            Err(_) => Flow::End,
        }
    }

    /// The response ended: release the charge as finished (or failed, for a 5xx).
    fn finish(&mut self) {
        let Some(charge) = self.charge.take() else {
            // A request sent on without a charge (no body), once its response ended or the
            // stream did.
            if !self.destination.is_empty() {
                self.count(RequestOutcome::Completed, "");
            }
            return;
        };
        let endpoint = charge.endpoint_id().to_string();
        let failed = self.response_status.is_some_and(|s| s >= 500);
        let outcome = if failed {
            Outcome::Failed
        } else {
            Outcome::Finished
        };
        if let Some(tokens) = self.usage.completion_tokens() {
            self.picker.metrics.completion_tokens(tokens);
        }
        let succeeded = self
            .response_status
            .is_some_and(|s| (200..300).contains(&s));
        if succeeded && self.response_bodies && !self.predicted.is_empty() {
            self.picker.metrics.prefix_checked(
                &endpoint,
                &self.predicted,
                self.usage.cached_tokens(),
            );
        }
        charge.finish(outcome);
        self.count(RequestOutcome::Completed, &endpoint);
    }

    /// The stream ended. A request picked and then left (the pick-only client) counts as
    /// finished; one whose response was under way when the stream broke, or that ended before
    /// it was placed, as a client that went away.
    fn end(&mut self) {
        if self.response_started && !self.response_done {
            if let Some(charge) = self.charge.take() {
                let endpoint = charge.endpoint_id().to_string();
                charge.finish(Outcome::Cancelled);
                self.count(RequestOutcome::ClientDisconnected, &endpoint);
            }
        } else {
            self.finish();
        }
        if self.started() {
            self.count(RequestOutcome::ClientDisconnected, "");
        }
    }

    /// Whether the stream carried a request (its headers arrived).
    fn started(&self) -> bool {
        !self.path.is_empty() || self.decided
    }
}
