//! A router started with the endpoint picker on (`--ext-proc-addr`), and a Rust ext_proc
//! client (envoy-types' generated client over tonic) that sends Envoy's message sequence.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request, processing_response, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};
use kvindex_loadtest::process::ChildProcess;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

use super::{deepseek_dir, Bins, Stack};

/// A `kvindex-router serve` with its ext_proc (and ext_proc health) addresses.
pub struct PickerProcess {
    pub process: ChildProcess,
    pub http: String,
    pub ext_proc: String,
    pub health: Option<String>,
}

impl PickerProcess {
    pub fn start(bins: &Bins, args: &[String]) -> PickerProcess {
        let process = ChildProcess::spawn(
            Command::new(&bins.router)
                .args(["serve", "--http-addr", "127.0.0.1:0", "--ext-proc-addr", "127.0.0.1:0"])
                .args(args),
        )
        .expect("kvindex-router");
        let addrs: HashMap<String, String> = process.listening("KVINDEX_ROUTER_LISTENING ").expect("addresses");
        PickerProcess {
            http: addrs["http"].clone(),
            ext_proc: addrs.get("ext_proc").cloned().expect("ext_proc= in KVINDEX_ROUTER_LISTENING"),
            health: addrs.get("ext_proc_health").cloned(),
            process,
        }
    }
}

pub async fn connect(addr: &str) -> ExternalProcessorClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.expect("ext_proc connect");
    ExternalProcessorClient::new(channel).max_decoding_message_size(64 << 20)
}

/// One Process stream, driven message by message.
pub struct Stream {
    pub tx: Option<mpsc::Sender<ProcessingRequest>>,
    pub rx: Streaming<ProcessingResponse>,
}

impl Stream {
    pub async fn open(client: &mut ExternalProcessorClient<Channel>) -> Stream {
        let (tx, rx) = mpsc::channel(64);
        let responses = client.process(ReceiverStream::new(rx)).await.expect("Process").into_inner();
        Stream { tx: Some(tx), rx: responses }
    }

    pub async fn send(&self, message: ProcessingRequest) {
        self.tx.as_ref().expect("open").send(message).await.expect("stream open");
    }

    /// The next answer, `Ok(None)` at the end, `Err` for a gRPC error on this stream.
    pub async fn recv(&mut self) -> Result<Option<ProcessingResponse>, tonic::Status> {
        tokio::time::timeout(Duration::from_secs(30), self.rx.message()).await.expect("an answer in time")
    }
}

pub fn headers(pairs: &[(&str, &str)], end_of_stream: bool) -> ProcessingRequest {
    let map = HeaderMap {
        headers: pairs
            .iter()
            .map(|(k, v)| HeaderValue { key: k.to_string(), value: String::new(), raw_value: v.as_bytes().to_vec() })
            .collect(),
    };
    ProcessingRequest {
        request: Some(processing_request::Request::RequestHeaders(HttpHeaders {
            headers: Some(map),
            end_of_stream,
            ..Default::default()
        })),
        ..Default::default()
    }
}

pub fn post_headers(path: &str) -> ProcessingRequest {
    headers(&[(":method", "POST"), (":path", path), ("content-type", "application/json")], false)
}

pub fn body(bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(processing_request::Request::RequestBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream,
            ..Default::default()
        })),
        ..Default::default()
    }
}

pub fn with_subset(mut message: ProcessingRequest, pods: &[&str]) -> ProcessingRequest {
    let list =
        ListValue { values: pods.iter().map(|p| Value { kind: Some(Kind::StringValue(p.to_string())) }).collect() };
    let inner = Struct {
        fields: HashMap::from([(
            "x-gateway-destination-endpoint-subset".to_string(),
            Value { kind: Some(Kind::ListValue(list)) },
        )]),
    };
    message.metadata_context = Some(Metadata {
        filter_metadata: HashMap::from([("envoy.lb.subset_hint".to_string(), inner)]),
        ..Default::default()
    });
    message
}

/// The destination header of a `request_headers` answer.
pub fn destination(response: &ProcessingResponse) -> Option<String> {
    let Some(processing_response::Response::RequestHeaders(h)) = &response.response else { return None };
    let mutation = h.response.as_ref()?.header_mutation.as_ref()?;
    mutation
        .set_headers
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key == "x-gateway-destination-endpoint")
        .map(|h| String::from_utf8(h.raw_value.clone()).unwrap())
}

/// The status of an `ImmediateResponse`, if that is what this is.
pub fn immediate_status(response: &ProcessingResponse) -> Option<i32> {
    match &response.response {
        Some(processing_response::Response::ImmediateResponse(i)) => i.status.as_ref().map(|s| s.code),
        _ => None,
    }
}

/// Sends a whole request phase and reads the answer through the last body chunk; returns the
/// answers (an ImmediateResponse alone when refused).
pub async fn pick(client: &mut ExternalProcessorClient<Channel>, path: &str, bytes: &[u8]) -> Vec<ProcessingResponse> {
    pick_on(&mut Stream::open(client).await, path, bytes).await
}

/// [`pick`] on an open stream, which stays open for the response phase.
pub async fn pick_on(stream: &mut Stream, path: &str, bytes: &[u8]) -> Vec<ProcessingResponse> {
    stream.send(post_headers(path)).await;
    stream.send(body(bytes, true)).await;
    let mut answers = Vec::new();
    while let Some(answer) = stream.recv().await.expect("no stream error") {
        let last = match &answer.response {
            Some(processing_response::Response::RequestBody(b)) => b
                .response
                .as_ref()
                .and_then(|c| c.body_mutation.as_ref())
                .is_some_and(|m| matches!(&m.mutation, Some(envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation::StreamedResponse(s)) if s.end_of_stream)),
            Some(processing_response::Response::ImmediateResponse(_)) => true,
            _ => false,
        };
        answers.push(answer);
        if last {
            break;
        }
    }
    answers
}

pub fn response_headers(status: &str) -> ProcessingRequest {
    let mut message = headers(&[(":status", status)], false);
    if let Some(processing_request::Request::RequestHeaders(h)) = message.request.take() {
        message.request = Some(processing_request::Request::ResponseHeaders(h));
    }
    message
}

pub fn response_body(bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
    let mut message = body(bytes, end_of_stream);
    if let Some(processing_request::Request::RequestBody(b)) = message.request.take() {
        message.request = Some(processing_request::Request::ResponseBody(b));
    }
    message
}

pub fn trailers() -> ProcessingRequest {
    ProcessingRequest {
        request: Some(processing_request::Request::RequestTrailers(
            envoy_types::pb::envoy::service::ext_proc::v3::HttpTrailers { trailers: Some(HeaderMap::default()) },
        )),
        ..Default::default()
    }
}

/// The model the picker tests' sim pods serve, tokenized with the DeepSeek fixture.
pub const PICKER_MODEL: &str = "deepseek-sim";

/// `pods` sim pods serving [`PICKER_MODEL`] with the DeepSeek fixture's tokenizer, and that
/// tokenizer's directory; `None` (skipped, failed under CI) without the fixture.
pub async fn tokenized_stack(bins: &Bins, pods: usize, decode_ms_per_token: &str) -> Option<(Stack, String)> {
    let dir = deepseek_dir()?.to_str().unwrap().to_string();
    let args = ["--model", PICKER_MODEL, "--tokenizer", &dir, "--decode-ms-per-token", decode_ms_per_token];
    Some((Stack::start(bins, pods, &args).await, dir))
}

/// A picker over `stack`'s pods with their tokenizer, fast scrapes and a generous score deadline
/// (these tests are about placement, not a debug build's latency), plus `extra` flags.
pub fn picker(bins: &Bins, stack: &Stack, dir: &str, extra: &[&str]) -> PickerProcess {
    let mut args = stack.router_args();
    args.extend(
        ["--tokenizer", &format!("{PICKER_MODEL}={dir}"), "--scrape-interval-ms", "20", "--score-deadline-ms", "500"]
            .map(String::from),
    );
    args.extend(extra.iter().map(|s| s.to_string()));
    PickerProcess::start(bins, &args)
}
