//! gRPC: `kvindex.v1.Indexer` ([`indexer`]), llm-d's `indexer.v1.IndexerService` ([`llmd`]),
//! `grpc.health.v1` and server reflection (so `grpcurl` works without the proto file). Both
//! scoring contracts answer through one [`score::Scorer`], behind one [`admission::Admission`]
//! that bounds the large requests computed and waiting at once.

pub mod admission;
pub mod indexer;
pub mod limits;
pub mod llmd;
pub mod record_route;
pub mod score;
pub mod tokenizer;

use std::future::Future;
use std::sync::Arc;

use kvindex_proto::indexer::v1::indexer_service_server::IndexerServiceServer;
use kvindex_proto::kvindex::v1::indexer_server::IndexerServer;

use self::admission::Admission;
use self::indexer::IndexerService;
use self::llmd::LlmdScores;
use self::score::Scorer;
use self::tokenizer::PromptTokenizer;
use crate::error::ServerError;
use crate::state::ServiceState;

/// Serves gRPC on `listener` (over TLS with `tls`) until `shutdown` resolves, then lets
/// requests in flight finish. GetPodScores prompts go to `tokenizer` (none: FAILED_PRECONDITION).
pub async fn serve(
    state: Arc<ServiceState>,
    tokenizer: Option<PromptTokenizer>,
    listener: tokio::net::TcpListener,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    let max = state.config().max_message_bytes;
    let scorer = Arc::new(Scorer::new(state.clone()));
    let admission = Arc::new(Admission::new(state.config().grpc_admission.clone()));
    let indexer = IndexerServer::new(IndexerService::new(state, scorer.clone(), admission.clone()))
        .max_decoding_message_size(max);
    let llmd = LlmdScores::new(scorer, tokenizer, admission).into_server().max_decoding_message_size(max);
    health.set_serving::<IndexerServer<IndexerService>>().await;
    health.set_serving::<IndexerServiceServer<LlmdScores>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(kvindex_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ServerError::Grpc(e.to_string()))?;
    let router = tonic::transport::Server::builder()
        .layer(limits::layer())
        .add_service(health_service)
        .add_service(reflection)
        .add_service(indexer)
        .add_service(llmd);
    let served = match tls {
        None => {
            let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            router.serve_with_incoming_shutdown(incoming, shutdown).await
        }
        Some(config) => {
            use tokio_stream::StreamExt;
            let handshaken = tokio_stream::wrappers::ReceiverStream::new(crate::tls::accept(listener, config, "grpc"));
            let incoming = handshaken.map(|(stream, _peer)| Ok::<_, std::io::Error>(stream));
            router.serve_with_incoming_shutdown(incoming, shutdown).await
        }
    };
    served.map_err(|e| ServerError::Grpc(e.to_string()))
}
