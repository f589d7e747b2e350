//! The read plane: the gRPC and HTTP servers that answer from the index (through
//! `crate::index_handle`), their TLS, and the routers' shared in-flight load. It names nothing
//! of the write plane: what it hands the workers goes through `crate::queue`.

pub mod grpc;
pub mod http;
pub mod reservations;
pub mod tls;
