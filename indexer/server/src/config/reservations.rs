//! The bounds of RecordRoute's reservations (the routers' shared in-flight load): their
//! lifetimes and how many are held in all, per pod and per caller.

/// The `reservation_*` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationConfig {
    /// TTL of a reservation whose request names none.
    pub default_ttl_ms: u64,
    /// Longest TTL a request may ask for (longer is capped).
    pub max_ttl_ms: u64,
    /// Reservations held at once, all pods together (0 = off).
    pub max_entries: usize,
    /// Reservations held for one pod.
    pub max_entries_per_pod: usize,
    /// Reservations one caller may hold, all pods together.
    pub max_entries_per_caller: usize,
}

impl Default for ReservationConfig {
    fn default() -> Self {
        ReservationConfig {
            default_ttl_ms: 30_000,
            max_ttl_ms: 300_000,
            max_entries: 1 << 18,
            max_entries_per_pod: 1 << 14,
            max_entries_per_caller: 1 << 16,
        }
    }
}
