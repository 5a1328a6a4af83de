//! Helpers for tests of `switchyard ext-proc`: the picker run as a real process on 127.0.0.1,
//! and a client that speaks ext_proc the way Envoy and the RL trainers do, from stubs of the
//! same proto crate.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Phase;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    CommonResponse, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use envoy_types::pb::google::protobuf::value::Kind;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::live::{binary, free_port, wait_healthy, Process, START_ATTEMPTS};
use crate::plugin_dir;

/// A running `switchyard ext-proc`.
pub struct Picker {
    pub process: Process,
    pub health: SocketAddr,
    pub metrics: SocketAddr,
    pub dir: PathBuf,
}

impl Picker {
    pub fn grpc(&self) -> SocketAddr {
        self.process.addr
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("ext-proc.log")).unwrap_or_default()
    }
}

/// Writes `config` to a file in `dir`, starts `switchyard ext-proc` on free loopback ports
/// with `flags` (plain gRPC unless the flags say otherwise) and waits until `/health`
/// answers.
pub async fn start_picker(dir: &Path, config: &str, flags: &[&str]) -> Picker {
    let path = dir.join("ext-proc.toml");
    std::fs::write(&path, config).expect("config written");
    let mut last = String::new();
    for _ in 0..START_ATTEMPTS {
        let ports = [free_port(), free_port(), free_port()];
        let log = dir.join("ext-proc.log");
        let mut child = picker_command(&path, ports, &log, flags)
            .spawn()
            .expect("ext-proc starts");
        let [grpc, health, metrics] = ports.map(|port| SocketAddr::from(([127, 0, 0, 1], port)));
        match wait_healthy(&mut child, metrics, "/health").await {
            Ok(()) => {
                return Picker {
                    process: Process { child, addr: grpc },
                    health,
                    metrics,
                    dir: dir.to_path_buf(),
                }
            }
            Err(status) => {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                last = format!("{status}\n{log}");
            }
        }
    }
    panic!("ext-proc exited early {START_ATTEMPTS} times, last: {last}");
}

/// `switchyard ext-proc` with the config file `config` on the loopback ports `[grpc, health,
/// metrics]` and `flags` (plain gRPC unless they say otherwise), logging to `log`.
pub fn picker_command(config: &Path, ports: [u16; 3], log: &Path, flags: &[&str]) -> Command {
    let [grpc, health, metrics] = ports;
    let mut command = Command::new(binary());
    command
        .arg("ext-proc")
        .arg("--config-file")
        .arg(config)
        .args(["--grpc-port", &grpc.to_string()])
        .args(["--grpc-health-port", &health.to_string()])
        .args(["--metrics-port", &metrics.to_string()])
        .args(["--bind-address", "127.0.0.1"])
        .arg("--plugin-dir")
        .arg(plugin_dir());
    if !flags.iter().any(|f| f.starts_with("--secure-serving")) {
        command.arg("--secure-serving=false");
    }
    command
        .args(flags)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"));
    command
}

/// A plain-text gRPC channel.
pub async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("ext_proc port accepts")
}

/// How long a test waits for one message from the picker.
const MESSAGE_WAIT: Duration = Duration::from_secs(15);

/// One `Process` stream, as Envoy or a trainer holds it.
pub struct Stream {
    pub sender: Option<mpsc::Sender<ProcessingRequest>>,
    pub inbound: tonic::Streaming<ProcessingResponse>,
}

impl Stream {
    pub async fn open(channel: Channel) -> Result<Stream, tonic::Status> {
        let (sender, receiver) = mpsc::channel(64);
        let mut client = ExternalProcessorClient::new(channel);
        let response = client.process(ReceiverStream::new(receiver)).await?;
        Ok(Stream {
            sender: Some(sender),
            inbound: response.into_inner(),
        })
    }

    pub async fn send(&self, message: ProcessingRequest) {
        self.sender
            .as_ref()
            .expect("stream not half-closed")
            .send(message)
            .await
            .expect("stream open");
    }

    /// Ends the client's side of the stream.
    pub fn half_close(&mut self) {
        self.sender = None;
    }

    /// The next message, `Ok(None)` at the end of the stream, `Err` on a gRPC error.
    pub async fn next(&mut self) -> Result<Option<ProcessingResponse>, tonic::Status> {
        tokio::time::timeout(MESSAGE_WAIT, self.inbound.message())
            .await
            .expect("the picker answers in time")
    }
}

/// Request headers for `path`, with `extra` headers and, when given, metadata.
pub fn request_headers(
    path: &str,
    extra: &[(&str, &str)],
    end_of_stream: bool,
    metadata: Option<Metadata>,
) -> ProcessingRequest {
    let mut headers = vec![
        header(":method", if end_of_stream { "GET" } else { "POST" }),
        header(":path", path),
        header("content-type", "application/json"),
    ];
    headers.extend(extra.iter().map(|(k, v)| header(k, v)));
    ProcessingRequest {
        request: Some(Phase::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap { headers }),
            end_of_stream,
            ..HttpHeaders::default()
        })),
        metadata_context: metadata,
        ..ProcessingRequest::default()
    }
}

pub fn response_headers(status: u16) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Phase::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![header(":status", &status.to_string())],
            }),
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    }
}

fn header(key: &str, value: &str) -> HeaderValue {
    HeaderValue {
        key: key.to_string(),
        value: String::new(),
        raw_value: value.as_bytes().to_vec(),
    }
}

pub fn request_body(body: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Phase::RequestBody(HttpBody {
            body: body.to_vec(),
            end_of_stream,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    }
}

pub fn response_body(body: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Phase::ResponseBody(HttpBody {
            body: body.to_vec(),
            end_of_stream,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    }
}

/// What the picker answered to one request.
#[derive(Debug, Default)]
pub struct Pick {
    /// `x-gateway-destination-endpoint` as set in the header mutation.
    pub header: String,
    /// The same key in the `envoy.lb` dynamic metadata.
    pub metadata: String,
    /// Every header the mutation sets.
    pub set_headers: Vec<(String, String)>,
    pub clear_route_cache: bool,
    /// The request body as echoed back.
    pub echoed: Vec<u8>,
    /// `envoy.lb` `x-gateway-destination-endpoint-scores`, by address.
    pub scores: Vec<(String, f64)>,
    /// An immediate response instead.
    pub immediate: Option<Immediate>,
}

/// An answer Envoy sends to the client on the picker's behalf.
#[derive(Debug)]
pub struct Immediate {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// Sends request headers and the body in one message with end_of_stream, then reads the
/// destination and the echoed body (or an immediate response).
pub async fn pick(stream: &mut Stream, path: &str, extra: &[(&str, &str)], body: &str) -> Pick {
    pick_with(stream, request_headers(path, extra, false, None), body).await
}

pub async fn pick_with(stream: &mut Stream, headers: ProcessingRequest, body: &str) -> Pick {
    stream.send(headers).await;
    stream.send(request_body(body.as_bytes(), true)).await;
    read_pick(stream).await
}

/// Reads the answer to a request whose headers and body were sent.
pub async fn read_pick(stream: &mut Stream) -> Pick {
    let mut pick = Pick::default();
    loop {
        let message = stream
            .next()
            .await
            .expect("no gRPC error")
            .expect("the picker answers before ending the stream");
        match message.response {
            Some(Answer::RequestHeaders(headers)) => {
                let common = headers.response.unwrap_or_default();
                pick.clear_route_cache = common.clear_route_cache;
                pick.set_headers = set_headers(&common);
                pick.header = pick
                    .set_headers
                    .iter()
                    .find(|(k, _)| k == "x-gateway-destination-endpoint")
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default();
                let lb = message
                    .dynamic_metadata
                    .and_then(|m| m.fields.get("envoy.lb").cloned())
                    .and_then(|v| match v.kind {
                        Some(Kind::StructValue(s)) => Some(s),
                        _ => None,
                    })
                    .unwrap_or_default();
                if let Some(Kind::StringValue(value)) = lb
                    .fields
                    .get("x-gateway-destination-endpoint")
                    .and_then(|v| v.kind.clone())
                {
                    pick.metadata = value;
                }
                if let Some(Kind::StructValue(scores)) = lb
                    .fields
                    .get("x-gateway-destination-endpoint-scores")
                    .and_then(|v| v.kind.clone())
                {
                    for (address, value) in scores.fields {
                        if let Some(Kind::NumberValue(score)) = value.kind {
                            pick.scores.push((address, score));
                        }
                    }
                    pick.scores.sort_by(|a, b| a.0.cmp(&b.0));
                }
            }
            Some(Answer::RequestBody(body)) => {
                let common = body.response.unwrap_or_default();
                match common.body_mutation.and_then(|m| m.mutation) {
                    Some(Mutation::StreamedResponse(chunk)) => {
                        pick.echoed.extend_from_slice(&chunk.body);
                        if chunk.end_of_stream {
                            return pick;
                        }
                    }
                    other => panic!("a request body answer that is not streamed: {other:?}"),
                }
            }
            Some(Answer::ImmediateResponse(immediate)) => {
                let status = immediate.status.map_or(0, |s| s.code as u16);
                let headers = immediate
                    .headers
                    .map(|h| {
                        h.set_headers
                            .into_iter()
                            .filter_map(|o| o.header)
                            .map(|h| (h.key, String::from_utf8_lossy(&h.raw_value).into_owned()))
                            .collect()
                    })
                    .unwrap_or_default();
                pick.immediate = Some(Immediate {
                    status,
                    headers,
                    body: String::from_utf8_lossy(&immediate.body).into_owned(),
                });
                return pick;
            }
            other => panic!("unexpected answer while picking: {other:?}"),
        }
    }
}

fn set_headers(common: &CommonResponse) -> Vec<(String, String)> {
    common
        .header_mutation
        .iter()
        .flat_map(|m| &m.set_headers)
        .filter_map(|o| o.header.as_ref())
        .map(|h| {
            (
                h.key.clone(),
                String::from_utf8_lossy(&h.raw_value).into_owned(),
            )
        })
        .collect()
}

/// The tracked client's end of a request: response headers, then the usage in one body
/// message with end_of_stream; returns the echoed response body.
pub async fn report_completion(stream: &mut Stream, completion_tokens: u64) -> Vec<u8> {
    stream.send(response_headers(200)).await;
    match stream
        .next()
        .await
        .expect("no gRPC error")
        .and_then(|m| m.response)
    {
        Some(Answer::ResponseHeaders(_)) => {}
        other => panic!("expected a response-headers answer, got {other:?}"),
    }
    let body =
        format!(r#"{{"usage":{{"prompt_tokens":5,"completion_tokens":{completion_tokens}}}}}"#);
    stream.send(response_body(body.as_bytes(), true)).await;
    match stream
        .next()
        .await
        .expect("no gRPC error")
        .and_then(|m| m.response)
    {
        Some(Answer::ResponseBody(answer)) => {
            match answer
                .response
                .and_then(|c| c.body_mutation)
                .and_then(|m| m.mutation)
            {
                Some(Mutation::StreamedResponse(chunk)) => {
                    assert!(chunk.end_of_stream, "the echo ends the body");
                    chunk.body
                }
                other => panic!("a response body answer that is not streamed: {other:?}"),
            }
        }
        other => panic!("expected a response-body answer, got {other:?}"),
    }
}

/// One HTTP/2 connection to the ext_proc port, spoken to frame by frame: every stream opened
/// here shares it, and a stream can carry bytes no gRPC client would send.
#[derive(Clone)]
pub struct RawConnection {
    requests: h2::client::SendRequest<bytes::Bytes>,
    authority: String,
}

impl RawConnection {
    pub async fn connect(addr: SocketAddr) -> RawConnection {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .expect("ext_proc port accepts");
        let (requests, connection) = h2::client::Builder::new()
            .max_concurrent_reset_streams(4096)
            .handshake(tcp)
            .await
            .expect("HTTP/2 handshake");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        RawConnection {
            requests,
            authority: addr.to_string(),
        }
    }

    /// Starts a `Process` call; the picker's response headers are not awaited.
    pub async fn open(&self) -> Result<RawStream, h2::Error> {
        let mut requests = self.requests.clone().ready().await?;
        let request = http::Request::post(format!(
            "http://{}/envoy.service.ext_proc.v3.ExternalProcessor/Process",
            self.authority
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
        let (response, body) = requests.send_request(request, false)?;
        Ok(RawStream {
            response: Some(response),
            body,
            inbound: None,
            received: bytes::BytesMut::new(),
            trailers: None,
        })
    }
}

/// A `Process` call on a [`RawConnection`].
pub struct RawStream {
    response: Option<h2::client::ResponseFuture>,
    body: h2::SendStream<bytes::Bytes>,
    inbound: Option<h2::RecvStream>,
    received: bytes::BytesMut,
    trailers: Option<http::HeaderMap>,
}

impl RawStream {
    /// Sends `payload` as one length-prefixed gRPC message, whatever it holds.
    pub fn send_frame(&mut self, payload: &[u8]) {
        let mut frame = Vec::with_capacity(payload.len() + 5);
        frame.push(0);
        frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        frame.extend_from_slice(payload);
        self.body
            .send_data(frame.into(), false)
            .expect("stream open");
    }

    pub fn send(&mut self, message: ProcessingRequest) {
        self.send_frame(&prost::Message::encode_to_vec(&message));
    }

    pub fn half_close(&mut self) {
        self.body
            .send_data(bytes::Bytes::new(), true)
            .expect("stream open");
    }

    /// The next message, or `None` once the picker ended the stream (its status is then in
    /// [`RawStream::status`]).
    pub async fn next(&mut self) -> Option<ProcessingResponse> {
        tokio::time::timeout(MESSAGE_WAIT, self.read())
            .await
            .expect("the picker answers in time")
    }

    async fn read(&mut self) -> Option<ProcessingResponse> {
        if let Some(response) = self.response.take() {
            let response = response.await.expect("response headers");
            assert_eq!(response.status(), 200);
            let (head, inbound) = response.into_parts();
            if head.headers.contains_key("grpc-status") {
                self.trailers = Some(head.headers);
                return None;
            }
            self.inbound = Some(inbound);
        }
        loop {
            if self.received.len() >= 5 {
                let len = u32::from_be_bytes(self.received[1..5].try_into().expect("4 bytes"));
                if self.received.len() >= 5 + len as usize {
                    let frame = self.received.split_to(5 + len as usize);
                    let message =
                        prost::Message::decode(&frame[5..]).expect("a ProcessingResponse");
                    return Some(message);
                }
            }
            let inbound = self.inbound.as_mut()?;
            match inbound.data().await {
                Some(Ok(chunk)) => {
                    let _ = inbound.flow_control().release_capacity(chunk.len());
                    self.received.extend_from_slice(&chunk);
                }
                Some(Err(error)) => panic!("the stream broke: {error}"),
                None => {
                    self.trailers = inbound.trailers().await.expect("trailers");
                    self.inbound = None;
                    return None;
                }
            }
        }
    }

    /// Reads to the end of the stream and returns its grpc-status and grpc-message.
    pub async fn status(&mut self) -> (i32, String) {
        while self.next().await.is_some() {}
        let trailers = self.trailers.take().expect("a status");
        let text = |name: &str| {
            trailers
                .get(name)
                .map(|v| v.to_str().expect("ASCII").to_string())
                .unwrap_or_default()
        };
        let code = text("grpc-status").parse().expect("a numeric grpc-status");
        (code, text("grpc-message"))
    }
}
