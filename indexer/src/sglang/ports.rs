//! SGLang's data-parallel endpoint rule: every rank's publisher offsets both its PUB and its
//! replay endpoint by the rank (`offset_endpoint_port`): a `tcp://` port plus the rank, an
//! `inproc://` name plus `_dp<rank>`; any other transport with a rank above 0 is refused. So
//! with the usual `replay = pub + 1`, rank 1's PUB port is rank 0's replay port.

/// Why SGLang refuses an endpoint for a rank.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("Invalid endpoint: must contain 'inproc' or 'tcp'")]
    Transport,
    #[error("endpoint port is not a number: {0:?}")]
    Port(String),
}

/// The endpoint rank `rank` binds for a configured `endpoint` (SGLang's
/// `ZmqEventPublisher.offset_endpoint_port`, matched on substrings as SGLang does).
pub fn rank_endpoint(endpoint: &str, rank: u32) -> Result<String, EndpointError> {
    if endpoint.is_empty() || rank == 0 {
        return Ok(endpoint.to_string());
    }
    if endpoint.contains("inproc") {
        return Ok(format!("{endpoint}_dp{rank}"));
    }
    if endpoint.contains("tcp") {
        let Some((base, port)) = endpoint.rsplit_once(':') else { return Ok(endpoint.to_string()) };
        let port: i64 = port.trim().parse().map_err(|_| EndpointError::Port(port.to_string()))?;
        return Ok(format!("{base}:{}", port + i64::from(rank)));
    }
    Err(EndpointError::Transport)
}

/// Which rank a scheduler's publisher is offset by (`select_kv_publisher_dp_rank`, 0.5.22+):
/// the attention-DP rank under DP attention, else the data-parallel replica index.
pub fn publisher_rank(attn_dp_size: u32, attn_dp_rank: u32, dp_rank: Option<u32>) -> u32 {
    if attn_dp_size > 1 {
        attn_dp_rank
    } else {
        dp_rank.unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_one_pub_is_rank_zero_replay() {
        assert_eq!(rank_endpoint("tcp://*:5557", 1).unwrap(), "tcp://*:5558");
        assert_eq!(rank_endpoint("tcp://[::1]:5557", 2).unwrap(), "tcp://[::1]:5559");
        assert_eq!(rank_endpoint("inproc://cache", 1).unwrap(), "inproc://cache_dp1");
        assert_eq!(rank_endpoint("ipc:///run/x", 0).unwrap(), "ipc:///run/x");
        assert_eq!(rank_endpoint("ipc:///run/x", 1), Err(EndpointError::Transport));
        assert_eq!(publisher_rank(2, 1, Some(0)), 1);
        assert_eq!(publisher_rank(1, 0, Some(3)), 3);
    }
}
