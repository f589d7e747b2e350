//! `grpc.health.v1` under the names a Gateway API deployment probes: `liveness` (the process
//! answers), `readiness` (the router has pods to pick from, following the pod table) and
//! `envoy.service.ext_proc.v3.ExternalProcessor` (the picker is serving), plus the overall "".

use std::sync::Arc;

use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::pods::fleet::Fleet;

pub const LIVENESS: &str = "liveness";
pub const READINESS: &str = "readiness";
pub const EXT_PROC: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

/// The health service, kept current with the pod table until the fleet is dropped.
pub async fn service(fleet: Arc<Fleet>) -> HealthServer<impl Health> {
    let (reporter, service) = tonic_health::server::health_reporter();
    for name in ["", LIVENESS, EXT_PROC] {
        reporter.set_service_status(name, ServingStatus::Serving).await;
    }
    let mut changes = fleet.subscribe();
    set_readiness(&reporter, &fleet).await;
    let weak = Arc::downgrade(&fleet);
    drop(fleet);
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            let Some(fleet) = weak.upgrade() else { break };
            set_readiness(&reporter, &fleet).await;
        }
    });
    service
}

async fn set_readiness(reporter: &HealthReporter, fleet: &Fleet) {
    let status = if fleet.is_empty() { ServingStatus::NotServing } else { ServingStatus::Serving };
    reporter.set_service_status(READINESS, status).await;
}
