//! Why a message could not be decoded: one typed error for frames and payloads, whose
//! `reason()` is the stable label of `kvindex_decode_errors_total{reason}`.

use super::limits::MAX_DEPTH;

/// Why a message could not be decoded. `reason()` is the stable label used in metrics.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    #[error("expected {expected} frames, got {got}")]
    FrameCount { expected: &'static str, got: usize },
    #[error("sequence frame must be 8 or 24 bytes, got {0}")]
    SeqLength(usize),
    #[error("replay reply must start with an empty delimiter frame")]
    MissingDelimiter,
    #[error("payload is empty")]
    EmptyPayload,
    #[error("payload is truncated")]
    Truncated,
    #[error("{0}")]
    Invalid(String),
    #[error("payload nests deeper than {MAX_DEPTH} levels")]
    TooDeep,
}

impl WireError {
    /// Short, fixed label for metrics (`kvindex_decode_errors_total{reason}`).
    pub fn reason(&self) -> &'static str {
        match self {
            WireError::FrameCount { .. } => "frame_count",
            WireError::SeqLength(_) => "seq_length",
            WireError::MissingDelimiter => "replay_delimiter",
            WireError::EmptyPayload => "empty_payload",
            WireError::Truncated => "truncated",
            WireError::Invalid(_) => "invalid",
            WireError::TooDeep => "too_deep",
        }
    }
}
