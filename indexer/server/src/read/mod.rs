//! The read plane: the gRPC and HTTP servers that answer from the index.

pub mod grpc;
pub mod http;
pub mod reservations;
pub mod tls;
