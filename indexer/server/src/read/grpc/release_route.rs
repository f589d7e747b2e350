//! ReleaseRoute: a router's note that requests it reserved (RecordRoute's reservations) got
//! their first response byte (the prefill part ends) or ended (the whole reservation ends),
//! sent in batches. Gated like RecordRoute ([`super::record_route::gate`]): it changes the load
//! every router places by. A caller (peer address) releases only its own reservations; a
//! release that finds none is answered as such, never an error (the reservation expired, was
//! refused, or is still on its way: [`crate::read::reservations`]).

use tonic::Status;

use kvindex_proto::kvindex::v1 as pb;

use super::in_flight::InFlightLoad;
use super::record_route::gate;
use crate::pods::auth::ControlPlane;
use crate::telemetry as m;

/// The gate, counted in `kvindex_release_route_requests_total`.
pub fn authorize(control: &ControlPlane, authorization: Option<&str>, caller: &str) -> Result<(), Status> {
    gate(control, authorization, caller, "ReleaseRoute", m::RELEASE_ROUTE_REQUESTS)
}

/// Releases `req`'s entries for `caller` (authorized already); INVALID_ARGUMENT, counted, for
/// a batch out of bounds (nothing is released then).
pub fn release(
    in_flight: &InFlightLoad,
    caller: &str,
    req: &pb::ReleaseRouteRequest,
) -> Result<pb::ReleaseRouteResponse, Status> {
    match in_flight.release(caller, &req.releases) {
        Ok(released) => {
            metrics::counter!(m::RELEASE_ROUTE_REQUESTS, "outcome" => "ok").increment(1);
            Ok(pb::ReleaseRouteResponse { released })
        }
        Err(invalid) => {
            metrics::counter!(m::RELEASE_ROUTE_REQUESTS, "outcome" => "invalid").increment(1);
            Err(Status::invalid_argument(invalid.to_string()))
        }
    }
}
