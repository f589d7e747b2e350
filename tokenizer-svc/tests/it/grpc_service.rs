//! llm-d's TokenizationService end to end over real gRPC on loopback TCP and a Unix socket,
//! with a tonic client: every method, the `success=false` error contract (and `INVALID_ARGUMENT`
//! for a client chat template while they are off), health and reflection.
use crate::common;

use std::sync::Arc;

use crate::common::trained;
use kvindex_proto::tokenization as pb;
use kvindex_proto::tokenization::tokenization_service_client::TokenizationServiceClient;
use kvindex_tokenizer::server::{serve, BoundListeners};
use kvindex_tokenizer::{RegistryConfig, TokenizerRegistry};
use tonic::transport::{Channel, Endpoint};

struct Server {
    tcp: std::net::SocketAddr,
    uds: std::path::PathBuf,
    registry: Arc<TokenizerRegistry>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

async fn start(name: &str) -> Server {
    start_with(name, &[]).await
}

/// [`start`] with more `(name, dir)` models beside the trained ones.
async fn start_with(name: &str, models: &[(&str, std::path::PathBuf)]) -> Server {
    let root = common::scratch_dir(name);
    let mut config = RegistryConfig::default();
    config.add_model("chatml", trained::chatml_model(&root, "chatml")).unwrap();
    config.add_model("strict", trained::raising_model(&root, "strict")).unwrap();
    for (model, dir) in models {
        config.add_model(model, dir).unwrap();
    }
    let registry = Arc::new(TokenizerRegistry::new(config));
    let uds = root.join("tokenizer.sock");
    let listeners = BoundListeners::bind("127.0.0.1:0".parse().unwrap(), Some(uds.clone())).await.unwrap();
    let tcp = listeners.tcp_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn({
        let registry = registry.clone();
        async move {
            serve(registry, listeners, async {
                let _ = stopped.await;
            })
            .await
            .expect("server runs");
        }
    });
    Server { tcp, uds, registry, stop: Some(stop), task }
}

async fn tcp_client(server: &Server) -> TokenizationServiceClient<Channel> {
    TokenizationServiceClient::connect(format!("http://{}", server.tcp)).await.unwrap()
}

async fn uds_channel(path: std::path::PathBuf) -> Channel {
    Endpoint::try_from("http://uds.invalid")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .unwrap()
}

fn user(text: &str) -> pb::ChatMessage {
    pb::ChatMessage { role: "user".into(), content: Some(text.into()), content_parts: vec![] }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_works_over_tcp_and_unix_socket() {
    let mut server = start("grpc-ok").await;
    let mut client = tcp_client(&server).await;

    let init = client
        .initialize_tokenizer(pb::InitializeTokenizerRequest { model_name: "chatml".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(init.success, "{}", init.error_message);
    assert_eq!(server.registry.loaded_model_names(), vec!["chatml"]);

    let text = "Hello world! café";
    let tok = client
        .tokenize(pb::TokenizeRequest { input: text.into(), model_name: "chatml".into(), add_special_tokens: true })
        .await
        .unwrap()
        .into_inner();
    assert!(tok.success);
    let expected = server.registry.tokenize("chatml", text, true).unwrap();
    assert_eq!(tok.input_ids, expected.ids);
    assert_eq!(tok.offset_pairs, expected.offsets.iter().flat_map(|&(s, e)| [s, e]).collect::<Vec<_>>());

    let completion = client
        .render_completion(pb::RenderCompletionRequest { model_name: "chatml".into(), prompt: text.into() })
        .await
        .unwrap()
        .into_inner();
    assert!(completion.success && !completion.request_id.is_empty());
    assert_eq!(completion.token_ids, expected.ids);

    let chat_req = pb::RenderChatCompletionRequest {
        model_name: "chatml".into(),
        messages: vec![
            pb::ChatMessage {
                role: "system".into(),
                content: None,
                content_parts: vec![pb::ContentPart {
                    r#type: "text".into(),
                    text: Some("Be brief.".into()),
                    image_url: None,
                }],
            },
            user("Hi"),
        ],
        add_generation_prompt: true,
        chat_template_kwargs: Some(r#"{"enable_thinking": false}"#.into()),
        ..Default::default()
    };
    let chat = client.render_chat_completion(chat_req.clone()).await.unwrap().into_inner();
    assert!(chat.success, "{}", chat.error_message);
    let rendered = "<|im_start|>system\n[{'type': 'text', 'text': 'Be brief.'}]<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(chat.token_ids, server.registry.tokenize("chatml", rendered, false).unwrap().ids);

    let old = client
        .render_chat_template(pb::ChatTemplateRequest {
            model_name: "chatml".into(),
            conversation_turns: vec![pb::ConversationTurn { messages: vec![user("Hi")] }],
            add_generation_prompt: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(old.success);
    assert_eq!(old.rendered_prompt, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");

    // Same answers over the Unix socket.
    let mut unix = TokenizationServiceClient::new(uds_channel(server.uds.clone()).await);
    let over_uds = unix.render_chat_completion(chat_req).await.unwrap().into_inner();
    assert_eq!(over_uds.token_ids, chat.token_ids);

    server.stop.take().unwrap().send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), &mut server.task).await.expect("server stops").unwrap();
    assert!(!server.uds.exists(), "socket file removed on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_follow_llm_d_success_false_contract() {
    let server = start("grpc-errors").await;
    let mut client = tcp_client(&server).await;

    let unknown = client
        .tokenize(pb::TokenizeRequest { input: "x".into(), model_name: "missing".into(), add_special_tokens: false })
        .await
        .unwrap()
        .into_inner();
    assert!(
        !unknown.success && unknown.error_message.contains("unknown model \"missing\""),
        "{}",
        unknown.error_message
    );

    let init = client
        .initialize_tokenizer(pb::InitializeTokenizerRequest { model_name: "missing".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(!init.success);

    let bad_kwargs = client
        .render_chat_completion(pb::RenderChatCompletionRequest {
            model_name: "chatml".into(),
            messages: vec![user("Hi")],
            chat_template_kwargs: Some("{not json".into()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        !bad_kwargs.success && bad_kwargs.error_message.contains("chat_template_kwargs"),
        "{}",
        bad_kwargs.error_message
    );

    let raised = client
        .render_chat_completion(pb::RenderChatCompletionRequest {
            model_name: "strict".into(),
            messages: vec![pb::ChatMessage {
                role: "system".into(),
                content: Some("secret prompt".into()),
                content_parts: vec![],
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!raised.success);
    assert!(
        raised.error_message.contains("\"strict/default\" line 3")
            && raised.error_message.contains("System role not supported"),
        "{}",
        raised.error_message
    );
    assert!(!raised.error_message.contains("secret prompt"), "errors never echo the prompt");

    // Client templates are off by default: refused before anything is compiled
    // (tests/client_templates.rs renders them when allowed).
    let client_template = client
        .render_chat_completion(pb::RenderChatCompletionRequest {
            model_name: "chatml".into(),
            messages: vec![user("Hi")],
            chat_template: "{% for %}".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(client_template.code(), tonic::Code::InvalidArgument, "{client_template:?}");
    assert!(client_template.message().contains("chatml/request"), "{}", client_template.message());

    let bad_tool = client
        .render_chat_completion(pb::RenderChatCompletionRequest {
            model_name: "chatml".into(),
            messages: vec![user("Hi")],
            tools: vec![pb::ChatCompletionTool {
                r#type: "function".into(),
                function: Some(pb::FunctionDefinition {
                    name: "f".into(),
                    parameters_json: Some("[oops".into()),
                    ..Default::default()
                }),
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!bad_tool.success && bad_tool.error_message.contains("parameters_json"), "{}", bad_tool.error_message);

    let empty = client
        .render_chat_completion(pb::RenderChatCompletionRequest { model_name: "chatml".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(!empty.success);
}

/// With a token limit in the metadata (the router sends its `--max-prompt-tokens`), a chat far
/// over it is tokenized only up to the first turn marker past the limit and answered
/// `OUT_OF_RANGE` with the count; within the limit, or without one (llm-d), the ids come back.
/// On the deepseek fixture, whose turn markers are cut points.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_limit_in_the_metadata_stops_tokenizing_past_it() {
    // The wire names, as a client knows them (`grpc_service::MAX_TOKENS_METADATA`, ...).
    const MAX_TOKENS_METADATA: &str = "x-kvindex-max-tokens";
    const COUNTED_METADATA: &str = "x-kvindex-tokens-counted";
    let Some(fixtures) = common::fixtures() else { return };
    let server = start_with("grpc-limit", &[("deepseek", fixtures.join("models/deepseek"))]).await;
    let mut client = tcp_client(&server).await;
    let chat = pb::RenderChatCompletionRequest {
        model_name: "deepseek".into(),
        // Alternating turns: every turn opens with a marker.
        messages: (0..400)
            .map(|i| pb::ChatMessage {
                role: if i % 2 == 0 { "user" } else { "assistant" }.into(),
                content: Some(format!("message {i}")),
                content_parts: vec![],
            })
            .collect(),
        add_generation_prompt: true,
        ..Default::default()
    };
    fn limited<T>(message: T, limit: usize) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.metadata_mut().insert(MAX_TOKENS_METADATA, limit.to_string().parse().unwrap());
        request
    }
    // Limited first: a prompt tokenized before is reused from the prefix cache, not tokenized.
    let limit = 100;
    let over = client.render_chat_completion(limited(chat.clone(), limit)).await.unwrap_err();
    assert_eq!(over.code(), tonic::Code::OutOfRange, "{over:?}");
    let counted: usize = over.metadata().get(COUNTED_METADATA).unwrap().to_str().unwrap().parse().unwrap();
    assert!(over.message().contains(&format!("more than {limit} tokens")), "{}", over.message());

    let full = client.render_chat_completion(chat.clone()).await.unwrap().into_inner();
    assert!(full.success, "no limit, no change: {}", full.error_message);
    let full = full.token_ids.len();
    assert!(full > 10 * limit, "the chat is far over the limit: {full}");
    assert!(counted > limit && counted < 2 * limit, "stopped soon past the limit: {counted} of {full}");

    let within = client.render_chat_completion(limited(chat, full)).await.unwrap().into_inner();
    assert_eq!(within.token_ids.len(), full, "within the limit: every id");
    let prompt = pb::RenderCompletionRequest { model_name: "deepseek".into(), prompt: "word ".repeat(500) };
    let over = client.render_completion(limited(prompt.clone(), 10)).await.unwrap_err();
    assert_eq!(over.code(), tonic::Code::OutOfRange, "{over:?}");
    assert!(client.render_completion(prompt).await.unwrap().into_inner().success);
}

/// A client's model or tool name comes back in `error_message` cut to 256 bytes with its
/// length, and escaped (a 1 MB name was echoed whole), by every method.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_names_in_errors_are_cut_and_escaped() {
    let server = start("grpc-echo").await;
    let mut client = tcp_client(&server).await;
    let name = format!("evil\nINFO forged{}", "x".repeat(1 << 20));
    let bounded = |message: &str| {
        assert!(message.len() < 400, "{} bytes echoed", message.len());
        assert!(message.contains(&format!("({} bytes)", name.len())), "{message}");
        assert!(!message.contains('\n') && message.contains("evil\\nINFO"), "{message}");
    };
    let model_name = name.clone();
    let messages = [
        client
            .tokenize(pb::TokenizeRequest {
                input: "x".into(),
                model_name: model_name.clone(),
                add_special_tokens: false,
            })
            .await
            .unwrap()
            .into_inner()
            .error_message,
        client
            .initialize_tokenizer(pb::InitializeTokenizerRequest {
                model_name: model_name.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .error_message,
        client
            .render_completion(pb::RenderCompletionRequest { model_name: model_name.clone(), prompt: "x".into() })
            .await
            .unwrap()
            .into_inner()
            .error_message,
        client
            .render_chat_completion(pb::RenderChatCompletionRequest {
                model_name: model_name.clone(),
                messages: vec![user("Hi")],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .error_message,
    ];
    for message in &messages {
        assert!(message.starts_with("unknown model \"evil"), "{}", &message[..message.len().min(300)]);
        bounded(message);
    }
    let bad_tool = client
        .render_chat_completion(pb::RenderChatCompletionRequest {
            model_name: "chatml".into(),
            messages: vec![user("Hi")],
            tools: vec![pb::ChatCompletionTool {
                r#type: "function".into(),
                function: Some(pb::FunctionDefinition {
                    name: name.clone(),
                    parameters_json: Some("[oops".into()),
                    ..Default::default()
                }),
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(bad_tool.error_message.contains("parameters_json"), "{}", &bad_tool.error_message[..300]);
    bounded(&bad_tool.error_message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_are_served() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let server = start("grpc-health").await;
    let channel = Endpoint::try_from(format!("http://{}", server.tcp)).unwrap().connect().await.unwrap();
    let mut health = HealthClient::new(channel.clone());
    for service in ["", "tokenization.TokenizationService"] {
        let status = health.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner().status;
        assert_eq!(status, 1, "SERVING for {service:?}");
    }

    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = reflection.server_reflection_info(tokio_stream::iter(vec![request])).await.unwrap().into_inner();
    let response = stream.message().await.unwrap().expect("one response");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection response")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in ["tokenization.TokenizationService", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == expected), "{expected} missing from {names:?}");
    }
}
