//! gRPC: `kvindex.v1.Indexer` ([`indexer`]), llm-d's `indexer.v1.IndexerService` ([`llmd`]),
//! `grpc.health.v1` and server reflection (so `grpcurl` works without the proto file). Both
//! scoring contracts answer through one [`score::Scorer`], behind one [`admission::Admission`]
//! that bounds the large requests computed and waiting at once. RecordRoute's reservations and
//! ReleaseRoute share one [`in_flight::InFlightLoad`], which ScoreTokens' answers read.

pub mod admission;
pub mod in_flight;
pub mod indexer;
pub mod limits;
pub mod llmd;
pub mod record_route;
pub mod release_route;
pub mod replica;
pub mod score;
pub mod tokenizer;

use std::sync::Arc;

use kvindex_proto::indexer::v1::indexer_service_server::IndexerServiceServer;
use kvindex_proto::kvindex::v1::indexer_server::IndexerServer;
use kvindex_proto::kvindex::v1::replica_server::ReplicaServer;
use kvindex_proto::score_route::IndexerRoutes;

use self::admission::Admission;
use self::in_flight::InFlightLoad;
use self::indexer::IndexerService;
use self::llmd::LlmdScores;
use self::score::Scorer;
use self::tokenizer::PromptTokenizer;
use crate::config::Config;
use crate::error::ServerError;
use crate::index_handle::IndexHandle;
use crate::pods::auth::ControlPlane;
use crate::pods::lifecycle::Pods;
use crate::shutdown::Shutdown;

/// What the gRPC services use of the rest of the service: the index they score from, the pods
/// they register, the control plane's gate, and where GetPodScores prompts are tokenized (none:
/// FAILED_PRECONDITION).
pub struct Handles {
    pub index: IndexHandle,
    pub pods: Pods,
    pub control: ControlPlane,
    pub tokenizer: Option<PromptTokenizer>,
    /// `kvindex.v1.Replica`: exports to bootstrapping siblings, digests.
    pub replica: replica::ReplicaService,
}

/// The bounds of gRPC requests: their size, their tokens, and the admission of large ones.
#[derive(Debug, Clone)]
pub struct Bounds {
    pub max_message_bytes: usize,
    pub max_tokens: usize,
    pub admission: crate::config::admission::AdmissionConfig,
    /// RecordRoute's reservations (the routers' shared in-flight load).
    pub reservations: crate::config::reservations::ReservationConfig,
}

impl Bounds {
    pub fn of(config: &Config) -> Bounds {
        Bounds {
            max_message_bytes: config.max_message_bytes,
            max_tokens: config.max_tokens,
            admission: config.grpc_admission.clone(),
            reservations: config.reservations.clone(),
        }
    }
}

/// The largest HTTP/2 frame a client may send (HTTP/2's default is 16 KiB): a router's prompt
/// of up to ~20k token ids (~64 kB of varints) then travels as one DATA frame, written at once
/// and read at one wake, instead of as 16 KiB frames the server wakes for one by one. A peer
/// can make a connection buffer one frame: 64 KiB, far below the largest message decoded.
pub const MAX_FRAME_BYTES: u32 = 1 << 16;

/// Serves gRPC on `listener` (over TLS with `tls`) until `shutdown`, then lets requests in
/// flight finish.
pub async fn serve(
    handles: Handles,
    bounds: Bounds,
    listener: tokio::net::TcpListener,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    shutdown: Shutdown,
) -> Result<(), ServerError> {
    let Handles { index, pods, control, tokenizer, replica } = handles;
    let (health, health_service) = tonic_health::server::health_reporter();
    let max = bounds.max_message_bytes;
    let scorer = Arc::new(Scorer::new(index.clone(), bounds.max_tokens));
    let admission = Arc::new(Admission::new(bounds.admission));
    let in_flight = Arc::new(InFlightLoad::new(bounds.reservations, index.clone(), pods.clone(), bounds.max_tokens));
    let service =
        IndexerService { index, pods, control, scorer: scorer.clone(), admission: admission.clone(), in_flight };
    // ScoreTokens' packed ids decoded in one pass (the rest as the generated server does).
    let indexer = IndexerRoutes::new(service).max_decoding_message_size(max);
    let replica = ReplicaServer::new(replica).max_decoding_message_size(max);
    let llmd = LlmdScores::new(scorer, tokenizer, admission).into_server().max_decoding_message_size(max);
    health.set_serving::<IndexerServer<IndexerService>>().await;
    health.set_serving::<IndexerServiceServer<LlmdScores>>().await;
    health.set_serving::<ReplicaServer<replica::ReplicaService>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(kvindex_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ServerError::Grpc(e.to_string()))?;
    let router = tonic::transport::Server::builder()
        .max_frame_size(MAX_FRAME_BYTES)
        .layer(limits::layer())
        .add_service(health_service)
        .add_service(reflection)
        .add_service(indexer)
        .add_service(replica)
        .add_service(llmd);
    let served = match tls {
        None => {
            let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            router.serve_with_incoming_shutdown(incoming, shutdown.stopped()).await
        }
        Some(config) => {
            use tokio_stream::StreamExt;
            let handshaken =
                tokio_stream::wrappers::ReceiverStream::new(crate::read::tls::accept(listener, config, "grpc"));
            let incoming = handshaken.map(|(stream, _peer)| Ok::<_, std::io::Error>(stream));
            router.serve_with_incoming_shutdown(incoming, shutdown.stopped()).await
        }
    };
    served.map_err(|e| ServerError::Grpc(e.to_string()))
}
