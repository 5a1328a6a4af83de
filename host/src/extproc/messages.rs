//! The ext_proc messages the picker reads and writes: headers and metadata in, the
//! destination, body echoes and immediate responses out.

use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{
    HeaderMap, HeaderValue, HeaderValueOption, Metadata,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value};

use crate::live::response::ApiError;
use crate::live::Subset;

/// The header and `envoy.lb` metadata key naming where Envoy sends the request.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The `envoy.lb` metadata key of the weighted totals (`--emit-endpoint-scores`).
pub const DESTINATION_SCORES: &str = "x-gateway-destination-endpoint-scores";
/// The `envoy.lb` metadata key where the data plane reports the endpoint that served.
pub const SERVED: &str = "x-gateway-destination-endpoint-served";
pub const LB_NAMESPACE: &str = "envoy.lb";
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
pub use crate::live::ids::REQUEST_ID;
pub use crate::live::response::DROPPED_REASON;
/// Largest body chunk echoed back in one message, as the reference and Envoy's peers use.
pub const BODY_CHUNK: usize = 62_000;

/// The value of header `name` (lower-case), from `value` or `raw_value`.
pub fn header<'a>(headers: Option<&'a HeaderMap>, name: &str) -> Option<&'a str> {
    headers?.headers.iter().find(|h| h.key == name).map(|h| {
        if h.raw_value.is_empty() {
            h.value.as_str()
        } else {
            std::str::from_utf8(&h.raw_value).unwrap_or("")
        }
    })
}

/// The gateway's subset hint: absent means the whole pool. A list of strings and a
/// comma-separated string are both accepted.
pub fn subset_hint(metadata: Option<&Metadata>) -> Option<Subset> {
    let value = metadata?
        .filter_metadata
        .get(SUBSET_NAMESPACE)?
        .fields
        .get(SUBSET_KEY)?;
    let mut entries = Vec::new();
    collect_entries(value, &mut entries);
    Some(Subset { entries })
}

fn collect_entries(value: &Value, into: &mut Vec<String>) {
    match &value.kind {
        Some(Kind::StringValue(text)) => into.extend(
            text.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        ),
        Some(Kind::ListValue(list)) => {
            for item in &list.values {
                collect_entries(item, into);
            }
        }
        _ => {}
    }
}

/// The endpoint the data plane reports as having served the response, if it says.
pub fn served(metadata: Option<&Metadata>) -> Option<String> {
    let value = metadata?
        .filter_metadata
        .get(LB_NAMESPACE)?
        .fields
        .get(SERVED)?;
    match &value.kind {
        // A list of attempts: the last one served.
        Some(Kind::StringValue(text)) => text.rsplit(',').next().map(|s| s.trim().to_string()),
        _ => None,
    }
}

fn string(text: impl Into<String>) -> Value {
    Value {
        kind: Some(Kind::StringValue(text.into())),
    }
}

fn set_header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            value: String::new(),
            raw_value: value.as_bytes().to_vec(),
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..HeaderValueOption::default()
    }
}

/// The request-headers answer that routes the request: `destination` (`ip:port`, fallbacks
/// after commas) in the header and in `envoy.lb` metadata, the route cache cleared.
pub fn destination(
    destination: &str,
    generated_request_id: Option<&str>,
    scores: Option<Vec<(String, f64)>>,
) -> ProcessingResponse {
    let mut set_headers = vec![set_header(DESTINATION, destination)];
    if let Some(id) = generated_request_id {
        set_headers.push(set_header(REQUEST_ID, id));
    }
    let mut lb = Struct::default();
    lb.fields
        .insert(DESTINATION.to_string(), string(destination));
    if let Some(scores) = scores {
        let fields = scores
            .into_iter()
            .map(|(address, score)| {
                (
                    address,
                    Value {
                        kind: Some(Kind::NumberValue(score)),
                    },
                )
            })
            .collect();
        lb.fields.insert(
            DESTINATION_SCORES.to_string(),
            Value {
                kind: Some(Kind::StructValue(Struct { fields })),
            },
        );
    }
    let mut metadata = Struct::default();
    metadata.fields.insert(
        LB_NAMESPACE.to_string(),
        Value {
            kind: Some(Kind::StructValue(lb)),
        },
    );
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(HeaderMutation {
                    set_headers,
                    remove_headers: Vec::new(),
                }),
                clear_route_cache: true,
                ..CommonResponse::default()
            }),
        })),
        dynamic_metadata: Some(metadata),
        ..ProcessingResponse::default()
    }
}

fn streamed(body: Vec<u8>, end_of_stream: bool) -> Option<CommonResponse> {
    Some(CommonResponse {
        body_mutation: Some(BodyMutation {
            mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                body,
                end_of_stream,
                ..StreamedBodyResponse::default()
            })),
        }),
        ..CommonResponse::default()
    })
}

/// The request body handed back to Envoy in chunks of at most [`BODY_CHUNK`] bytes, the last
/// one ending the stream (one empty chunk for an empty body). A body that fits one chunk is
/// moved, not copied.
pub fn request_body_echo(body: Vec<u8>) -> Vec<ProcessingResponse> {
    let echo = |chunk: Vec<u8>, last: bool| ProcessingResponse {
        response: Some(Response::RequestBody(BodyResponse {
            response: streamed(chunk, last),
        })),
        ..ProcessingResponse::default()
    };
    if body.len() <= BODY_CHUNK {
        return vec![echo(body, true)];
    }
    let count = body.len().div_ceil(BODY_CHUNK);
    body.chunks(BODY_CHUNK)
        .enumerate()
        .map(|(i, chunk)| echo(chunk.to_vec(), i + 1 == count))
        .collect()
}

/// One response-body chunk handed back unchanged.
pub fn response_body_echo(chunk: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ResponseBody(BodyResponse {
            response: streamed(chunk, end_of_stream),
        })),
        ..ProcessingResponse::default()
    }
}

/// Response headers let through unchanged.
pub fn response_headers_continue() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ResponseHeaders(HeadersResponse {
            response: Some(CommonResponse::default()),
        })),
        ..ProcessingResponse::default()
    }
}

/// Trailers let through unchanged.
pub fn trailers(request_side: bool) -> ProcessingResponse {
    let answer = TrailersResponse::default();
    ProcessingResponse {
        response: Some(if request_side {
            Response::RequestTrailers(answer)
        } else {
            Response::ResponseTrailers(answer)
        }),
        ..ProcessingResponse::default()
    }
}

/// An error answered by Envoy on the picker's behalf: the same status, headers and
/// OpenAI-shaped JSON body `serve` sends.
pub fn immediate(error: &ApiError, request_id: &str) -> ProcessingResponse {
    let body = serde_json::json!({
        "error": {"message": error.message, "type": error.kind, "code": error.code}
    });
    let mut set_headers = vec![
        set_header("content-type", "application/json"),
        set_header(REQUEST_ID, request_id),
    ];
    if let Some(reason) = error.dropped_reason {
        set_headers.push(set_header(DROPPED_REASON, reason));
    }
    if let Some(seconds) = error.retry_after_seconds {
        set_headers.push(set_header("retry-after", &seconds.to_string()));
    }
    ProcessingResponse {
        response: Some(Response::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(error.status.as_u16()),
            }),
            headers: Some(HeaderMutation {
                set_headers,
                remove_headers: Vec::new(),
            }),
            body: body.to_string().into_bytes(),
            details: error.code.to_string(),
            ..ImmediateResponse::default()
        })),
        ..ProcessingResponse::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::ListValue;

    fn metadata(namespace: &str, key: &str, value: Value) -> Metadata {
        let mut inner = Struct::default();
        inner.fields.insert(key.to_string(), value);
        let mut metadata = Metadata::default();
        metadata
            .filter_metadata
            .insert(namespace.to_string(), inner);
        metadata
    }

    #[test]
    fn subset_hint_reads_lists_and_comma_strings() {
        let list = Value {
            kind: Some(Kind::ListValue(ListValue {
                values: vec![string("10.0.0.1:8000"), string("10.0.0.2")],
            })),
        };
        let hint = subset_hint(Some(&metadata(SUBSET_NAMESPACE, SUBSET_KEY, list))).unwrap();
        assert_eq!(hint.entries, ["10.0.0.1:8000", "10.0.0.2"]);
        assert!(hint.allows("10.0.0.1:8000"));
        assert!(!hint.allows("10.0.0.1:8001"));
        assert!(hint.allows("10.0.0.2:9999"), "a bare IP allows every port");

        let text = string("10.0.0.3:1, 10.0.0.4:2");
        let hint = subset_hint(Some(&metadata(SUBSET_NAMESPACE, SUBSET_KEY, text))).unwrap();
        assert_eq!(hint.entries, ["10.0.0.3:1", "10.0.0.4:2"]);

        let empty = string("");
        let hint = subset_hint(Some(&metadata(SUBSET_NAMESPACE, SUBSET_KEY, empty))).unwrap();
        assert!(hint.entries.is_empty(), "present but empty allows nothing");
        assert!(subset_hint(None).is_none());
        assert!(subset_hint(Some(&Metadata::default())).is_none());
    }

    #[test]
    fn bodies_echo_in_bounded_chunks_ending_the_stream_once() {
        let body = vec![7u8; BODY_CHUNK * 2 + 5];
        let echoes = request_body_echo(body.clone());
        assert_eq!(echoes.len(), 3);
        let mut total = 0;
        for (i, echo) in echoes.iter().enumerate() {
            let Some(Response::RequestBody(BodyResponse {
                response: Some(common),
            })) = &echo.response
            else {
                panic!("not a body response: {echo:?}");
            };
            let Some(Mutation::StreamedResponse(chunk)) = common
                .body_mutation
                .as_ref()
                .and_then(|m| m.mutation.as_ref())
            else {
                panic!("not streamed");
            };
            assert!(chunk.body.len() <= BODY_CHUNK);
            assert_eq!(chunk.end_of_stream, i == 2);
            total += chunk.body.len();
        }
        assert_eq!(total, body.len());
        assert_eq!(request_body_echo(Vec::new()).len(), 1);
    }

    #[test]
    fn served_reads_the_last_attempt() {
        let value = string("10.0.0.1:8000,10.0.0.2:8000");
        let served = served(Some(&metadata(LB_NAMESPACE, SERVED, value)));
        assert_eq!(served.as_deref(), Some("10.0.0.2:8000"));
    }
}
