//! Generated gRPC types for kvindex's own API and the llm-d compatible services.
//! Each module mirrors one protobuf package; the `.proto` files are the contract.

pub mod score_query;
pub mod score_route;

/// Encoded `FileDescriptorSet` of every service here, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor.bin"));

/// `kvindex.v1`: ScoreTokens and pod registration.
pub mod kvindex {
    pub mod v1 {
        tonic::include_proto!("kvindex.v1");
    }
}

/// `tokenization`: llm-d's tokenizer sidecar contract (`TokenizationService`).
pub mod tokenization {
    tonic::include_proto!("tokenization");
}

/// `indexer.v1`: llm-d's prompt-based scoring contract (`IndexerService/GetPodScores`).
pub mod indexer {
    pub mod v1 {
        tonic::include_proto!("indexer.v1");
    }
}
