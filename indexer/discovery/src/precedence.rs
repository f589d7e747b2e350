//! Which source of a pod entry wins when two name the same pod id. Both services take pods
//! from the operator (command line or config, a watched pods file), from Kubernetes discovery
//! and from registration calls; one rule, here, so the router and the server cannot come to
//! disagree about who owns a pod: the operator's own word beats what discovery saw, which beats
//! what a caller registered. Pure: no I/O, no state.

/// Where a pod entry came from, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PodOrigin {
    /// The command line or the config file: the operator, explicitly.
    Static,
    /// A pods file the operator's tooling rewrites.
    File,
    /// Kubernetes pod discovery.
    Discovered,
    /// A registration call (`POST /pods`, the control API).
    Registered,
}

/// Whether an entry from `incoming` may replace (update) the entry `held` came from: a source
/// always updates its own entries, and never those of a stronger source.
pub fn may_replace(held: PodOrigin, incoming: PodOrigin) -> bool {
    incoming <= held
}

#[cfg(test)]
mod tests {
    use super::*;
    use PodOrigin::*;

    #[test]
    fn static_beats_file_beats_discovered_beats_registered() {
        let order = [Static, File, Discovered, Registered];
        for (i, &held) in order.iter().enumerate() {
            for (j, &incoming) in order.iter().enumerate() {
                assert_eq!(may_replace(held, incoming), j <= i, "{incoming:?} over {held:?}");
            }
        }
        assert!(!may_replace(Static, Registered) && !may_replace(Discovered, Registered));
        assert!(may_replace(Registered, Discovered) && may_replace(Discovered, Static));
    }
}
