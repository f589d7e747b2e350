//! The network an address counts against for the per-network caps, one rule for every listener
//! (the HTTP listeners here, the central ZeroMQ SUB in `kvindex-zmtp`).

use std::net::IpAddr;

/// The network an address belongs to for the per-network caps: its IPv4 /24 or its IPv6 /64
/// (an IPv4 address written as IPv6 is the IPv4 one). Addresses one owner holds usually share
/// one (a Kubernetes node's pod range, a host's block), so a cap per network bounds what a few
/// addresses together can take, where a cap per address bounds one.
pub fn network_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4((u32::from(v4) & 0xffff_ff00).into()),
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_are_slash_24_and_slash_64() {
        let net = |s: &str| network_of(s.parse().unwrap()).to_string();
        assert_eq!(net("10.1.2.3"), "10.1.2.0");
        assert_eq!(net("::ffff:10.1.2.3"), "10.1.2.0");
        assert_eq!(net("2001:db8:1:2:3:4:5:6"), "2001:db8:1:2::");
    }
}
