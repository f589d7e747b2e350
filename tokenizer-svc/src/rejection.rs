//! [`Rejection`]: why a chat template sent with a request was not rendered. A leaf of its own
//! because both the sandbox that decides it (`client_template`) and the error that carries it
//! (`error`) name it.

/// Why a client template was not rendered; the `reason` label of
/// [`REJECTED_METRIC`](crate::client_template::REJECTED_METRIC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Client templates are off on this server.
    Disabled,
    /// The rendered text went past the output budget.
    OutputLimit,
    /// The render ran past its wall-clock deadline, its CPU limit or its instruction budget.
    TimeLimit,
    /// The render process ran out of its memory budget (or its stack).
    MemoryLimit,
    /// The render process died some other way.
    Crashed,
    /// Every render process slot stayed taken until the deadline.
    Busy,
    /// No render process could be started (a problem on our side).
    Unavailable,
    /// The server is shutting down.
    ShuttingDown,
}

impl Rejection {
    pub fn label(self) -> &'static str {
        match self {
            Rejection::Disabled => "disabled",
            Rejection::OutputLimit => "output_limit",
            Rejection::TimeLimit => "time_limit",
            Rejection::MemoryLimit => "memory_limit",
            Rejection::Crashed => "crashed",
            Rejection::Busy => "busy",
            Rejection::Unavailable => "unavailable",
            Rejection::ShuttingDown => "shutting_down",
        }
    }

    /// Whether the request is at fault (the others are this server's state).
    pub fn is_client_error(self) -> bool {
        matches!(
            self,
            Rejection::Disabled
                | Rejection::OutputLimit
                | Rejection::TimeLimit
                | Rejection::MemoryLimit
                | Rejection::Crashed
        )
    }
}
