//! What the stream table asks of the world around it: the live worker answers from the
//! registry and the central SUB, `kvindex replay` from the dump and its flags.

/// What the table asks of the world around it (the registry, the central SUB).
pub trait Fleet {
    /// The registry's generation: a stream re-reads whether it has a replay endpoint, and a
    /// topic its pod, when it changes.
    fn generation(&self) -> u64;
    /// The pod a central-mode topic id names (the topic map; the id itself by default).
    fn pod_for_topic(&self, id: &str) -> String;
    /// Whether `base`'s rank `rank` has a replay endpoint.
    fn has_replay(&self, base: &str, rank: u32) -> bool;
    /// Whether an operator or a registration configured `base` (never reclaimed).
    fn configured(&self, base: &str) -> bool;
    /// Whether `pod` (a stream's DP-resolved pod) holds a block in the index: a stream whose pod
    /// holds none may be reclaimed even while it talks. The default keeps every stream.
    fn holds_blocks(&self, _pod: &str) -> bool {
        true
    }
    /// The configured pod whose DP ranks name `pod` (itself at rank 0, `dp_size` ranks), and
    /// whether it is dialled: (its id, dialled). Its streams alone may feed `pod`.
    fn pod_of_registration(&self, _pod: &str) -> Option<(String, bool)> {
        None
    }
    /// Central mode: whether `source` holds a connection to the central SUB.
    fn source_connected(&self, source: &kvindex_zmtp::Source) -> bool;
    /// The engine family publishing `base`'s streams (its pod entry's `engine`, else the
    /// server's `default_engine`).
    fn engine(&self, base: &str) -> kvindex::wire::Engine;
    /// `base`'s page size (SGLang's `--page-size`), when its pod entry names one.
    fn page_size(&self, _base: &str) -> Option<usize> {
        None
    }
    /// SGLang's page-hash cross-check for `base`'s streams (its pod entry's release and event
    /// format, else the server's), when it is on.
    fn sglang_check(&self, _base: &str) -> Option<crate::config::SglangCheckConfig> {
        None
    }
}
