//! The control plane's lock: who may change what the index believes through an API.
//! Registration (`POST /pods`, `DELETE /pods/{pod}`, gRPC `RegisterPod` / `UnregisterPod`)
//! re-points or erases pods, so it is off unless the operator configures a bearer token
//! (`admin_token_file`), and then every call must present it. Pods the operator configured
//! (config file, `--pod`, pods file, Kubernetes discovery) cannot be replaced or removed
//! through the API at all: that is the precedence rule ([`super::precedence`]), checked by
//! [`super::Pods::may_change`].
//! RecordRoute steers traffic (its credit moves new prompts to the pod it names), so it takes
//! the same token ([`ControlPlane::check`]), counted with its own outcomes (`read/grpc/record_route.rs`).
//! Reads (ScoreTokens, GetPodScores, health, `/metrics`, `/debug`) are not gated here.
//! Registered endpoints obey a host policy (`register_allow`): resolved once, checked, and
//! pinned to the checked address, so registration cannot make the server dial just any host.

use crate::config::admin_token::AdminToken;
use crate::config::cidr::Cidr;
use crate::config::pod::PodConfig;
use crate::telemetry as m;
use crate::write::transport::escape;

/// Why a control-plane call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("pod registration is disabled: start kvindex serve with admin_token_file to enable it")]
    Disabled,
    #[error("missing bearer token (Authorization: Bearer <token>)")]
    MissingToken,
    #[error("wrong bearer token")]
    WrongToken,
}

impl Denied {
    pub fn label(self) -> &'static str {
        match self {
            Denied::Disabled => "disabled",
            Denied::MissingToken => "missing_token",
            Denied::WrongToken => "wrong_token",
        }
    }
}

/// The handle of the control plane's gate: the operator's token and the registration host
/// policy, cloned into each API that changes pods or steers placement.
#[derive(Debug, Clone, Default)]
pub struct ControlPlane {
    admin_token: Option<AdminToken>,
    register_allow: Vec<Cidr>,
}

impl ControlPlane {
    /// The gate of `admin_token` (`None`: registration and RecordRoute disabled), with the host
    /// policy `register_allow` (empty: any host).
    pub fn new(admin_token: Option<AdminToken>, register_allow: Vec<Cidr>) -> Self {
        ControlPlane { admin_token, register_allow }
    }

    /// Whether a call that presented the `authorization` value (header or metadata) holds the
    /// control plane's token; neither counts nor logs.
    pub fn check(&self, authorization: Option<&str>) -> Result<(), Denied> {
        match &self.admin_token {
            None => Err(Denied::Disabled),
            Some(token) => match authorization.and_then(|v| v.strip_prefix("Bearer ")) {
                None => Err(Denied::MissingToken),
                Some(presented) if token.matches(presented.trim()) => Ok(()),
                Some(_) => Err(Denied::WrongToken),
            },
        }
    }

    /// Checks a control-plane call on `api` (`http` or `grpc`) that presented the
    /// `authorization` value (header or metadata); counts and logs a refusal.
    pub fn authorize(&self, api: &'static str, authorization: Option<&str>) -> Result<(), Denied> {
        let outcome = self.check(authorization);
        if let Err(denied) = outcome {
            metrics::counter!(m::CONTROL_DENIED, "api" => api, "reason" => denied.label()).increment(1);
            tracing::warn!(api, reason = denied.label(), "control-plane call refused");
        }
        outcome
    }

    /// Applies the host policy (`register_allow`) to a registration's endpoints: each `tcp://`
    /// host is resolved, every address it resolves to must lie in an allowed range, and the
    /// endpoint is rewritten to the first of them (a later DNS answer cannot move the dial).
    /// With a policy, `ipc://` endpoints are refused. Counts and logs a refusal.
    pub async fn pin_endpoints(&self, api: &'static str, pod: &mut PodConfig) -> Result<(), HostRefused> {
        let allow = &self.register_allow;
        if allow.is_empty() {
            return Ok(());
        }
        for endpoint in [&mut pod.endpoint, &mut pod.replay_endpoint].into_iter().flatten() {
            match pin(allow, endpoint).await {
                Ok(pinned) => *endpoint = pinned,
                Err(message) => {
                    metrics::counter!(m::CONTROL_DENIED, "api" => api, "reason" => "host_not_allowed").increment(1);
                    tracing::warn!(api, endpoint = %escape(endpoint), "registered endpoint refused by register_allow");
                    return Err(message);
                }
            }
        }
        Ok(())
    }
}

/// How long resolving a registered endpoint's host may take.
const RESOLVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// A registered endpoint the host policy (`register_allow`) refused, and why.
#[derive(Debug, thiserror::Error)]
#[error("endpoint {endpoint:?} refused by register_allow: {why}")]
pub struct HostRefused {
    pub endpoint: String,
    pub why: HostRefusal,
}

/// Why the host policy refused an endpoint.
#[derive(Debug, thiserror::Error)]
pub enum HostRefusal {
    #[error("only tcp://host:port endpoints may be registered")]
    NotTcp,
    #[error("the host did not resolve in time")]
    ResolveTimeout,
    #[error("cannot resolve: {0}")]
    Resolve(std::io::Error),
    #[error("the host resolves to no address")]
    NoAddress,
    #[error("{0} is outside the allowed ranges")]
    Outside(std::net::IpAddr),
}

async fn pin(allow: &[Cidr], endpoint: &str) -> Result<String, HostRefused> {
    let refuse = |why| HostRefused { endpoint: endpoint.to_string(), why };
    let Some(host_port) = endpoint.strip_prefix("tcp://") else { return Err(refuse(HostRefusal::NotTcp)) };
    let resolved = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host(host_port.to_string()))
        .await
        .map_err(|_| refuse(HostRefusal::ResolveTimeout))?
        .map_err(|e| refuse(HostRefusal::Resolve(e)))?
        .collect::<Vec<_>>();
    let Some(first) = resolved.first() else { return Err(refuse(HostRefusal::NoAddress)) };
    if let Some(outside) = resolved.iter().find(|a| !allow.iter().any(|c| c.contains(a.ip()))) {
        return Err(refuse(HostRefusal::Outside(outside.ip())));
    }
    Ok(format!("tcp://{first}"))
}
