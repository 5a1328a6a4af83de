//! The answers a live driver makes itself: errors in the OpenAI shape
//! `{"error": {"message", "type", "code"}}`, each with its HTTP status, and JSON and text
//! responses. They are built on any response body that can be made from bytes.

use bytes::Bytes;
use hyper::header::{HeaderValue, CONNECTION, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Response, StatusCode};

use crate::live::metrics::RequestOutcome;
use crate::pipeline::Rejection;

/// Header naming why a request was dropped, with the reference's values.
pub const DROPPED_REASON: &str = "x-llm-d-request-dropped-reason";

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request a live driver answers itself, with an error.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's error `type`.
    pub kind: &'static str,
    /// A stable machine-readable `code`.
    pub code: &'static str,
    pub message: String,
    pub outcome: RequestOutcome,
    /// `x-llm-d-request-dropped-reason`, for rejections.
    pub dropped_reason: Option<&'static str>,
    pub retry_after_seconds: Option<u32>,
    /// The replica the error happened at, for the outcome's `endpoint` label.
    pub endpoint: Option<String>,
    /// Close the connection after this answer.
    pub close: bool,
}

impl ApiError {
    pub fn new(
        status: StatusCode,
        code: &'static str,
        outcome: RequestOutcome,
        message: impl Into<String>,
    ) -> ApiError {
        let kind = if status.is_client_error() {
            "invalid_request_error"
        } else {
            "server_error"
        };
        ApiError {
            status,
            kind,
            code,
            message: message.into(),
            outcome,
            dropped_reason: None,
            retry_after_seconds: None,
            endpoint: None,
            close: false,
        }
    }

    /// The same error, counted against `endpoint`.
    pub fn at(mut self, endpoint: &str) -> ApiError {
        self.endpoint = Some(endpoint.to_string());
        self
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            RequestOutcome::BadRequest,
            message,
        )
    }

    /// The response for a scheduler's rejection.
    pub fn rejected(rejection: &Rejection) -> ApiError {
        let message = rejection.to_string();
        match rejection {
            Rejection::NoEndpoints => ApiError {
                dropped_reason: Some("rejected-no-endpoints"),
                ..ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "no_endpoints",
                    RequestOutcome::NoEndpoints,
                    message,
                )
            },
            Rejection::FilteredOut { .. } => ApiError {
                dropped_reason: Some("rejected-saturated"),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "filtered_out",
                    RequestOutcome::FilteredOut,
                    message,
                )
            },
            Rejection::Saturated { .. } => ApiError {
                dropped_reason: Some("rejected-saturated"),
                retry_after_seconds: Some(1),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "saturated",
                    RequestOutcome::Saturated,
                    message,
                )
            },
            Rejection::PickerFailed { .. } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "picker_failed",
                RequestOutcome::PickerFailed,
                message,
            ),
        }
    }

    /// The JSON body: `{"error": {"message", "type", "code"}}`.
    pub fn body(&self) -> String {
        serde_json::json!({
            "error": {"message": self.message, "type": self.kind, "code": self.code}
        })
        .to_string()
    }

    pub fn into_response<B: From<Bytes>>(self) -> Response<B> {
        let mut response = Response::new(B::from(Bytes::from(self.body())));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(reason) = self.dropped_reason {
            headers.insert(DROPPED_REASON, HeaderValue::from_static(reason));
        }
        if let Some(seconds) = self.retry_after_seconds {
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.close {
            headers.insert(CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// A JSON response made here.
pub fn json<B: From<Bytes>>(status: StatusCode, value: &serde_json::Value) -> Response<B> {
    let mut response = Response::new(B::from(Bytes::from(value.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A plain-text response made here.
pub fn text<B: From<Bytes>>(
    status: StatusCode,
    body: String,
    content_type: &'static str,
) -> Response<B> {
    let mut response = Response::new(B::from(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
