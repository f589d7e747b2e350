//! `kvindex replay --grpc-addr`: a rebuilt index behind the normal gRPC API, read-only.
//!
//! Nothing feeds it: there are no sources, and the apply queues have no workers, so requests
//! that would change what the index believes (UnregisterPod) change nothing.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use kvindex::speculative::SpeculativeCredits;
use kvindex::KvIndex;

use crate::clock::Clock;
use crate::config::Config;
use crate::error::ServerError;
use crate::index_handle::IndexHandle;
use crate::pods::auth::ControlPlane;
use crate::pods::lifecycle::Pods;
use crate::pods::PodsConfig;
use crate::queue::Queues;
use crate::read::grpc::replica::{instance_id, ReplicaService};
use crate::read::grpc::{Bounds, Handles};
use crate::readiness::Readiness;
use crate::shutdown::ShutdownSignal;

/// Serves `index` at `addr` until `shutdown`; `on_bound` gets the bound address.
pub async fn serve_index(
    index: KvIndex,
    addr: &str,
    on_bound: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let block_size = index.block_size().to_string();
    let config = Config::from_args(["--grpc-addr", addr, "--http-addr", "127.0.0.1:0", "--block-size", &block_size])?;
    let listener = tokio::net::TcpListener::bind(config.grpc_addr).await.map_err(|source| ServerError::Bind {
        key: "grpc_addr",
        addr: addr.to_string(),
        source,
    })?;
    on_bound(listener.local_addr().map_err(|source| ServerError::Io { what: "grpc listener", source })?);
    let (queues, _no_workers) = Queues::new(1, 1);
    let queues = Arc::new(queues);
    let pods = Pods::new(&PodsConfig::of(&config), queues.clone(), Arc::new(Readiness::default()));
    let index = IndexHandle::new(index, SpeculativeCredits::new(config.speculative.clone()), Clock::start());
    // No admin token: a rebuilt index is not exported to anyone.
    let replica = ReplicaService::new(
        index.clone(),
        queues,
        ControlPlane::default(),
        config.sibling_export,
        config.block_size,
        instance_id(),
    );
    let handles = Handles { index, pods, control: ControlPlane::default(), tokenizer: None, replica };
    let (signal, stopped) = ShutdownSignal::new();
    let serve = crate::read::grpc::serve(handles, Bounds::of(&config), listener, None, stopped);
    tokio::pin!(serve);
    tokio::select! {
        served = &mut serve => served,
        () = shutdown => {
            signal.trigger();
            serve.await
        }
    }
}
