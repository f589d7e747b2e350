//! The one error a configuration mistake becomes, naming the flag; its own file so every part of
//! the configuration (the proxy's flags, the endpoint picker's) can report one without naming
//! the others.

/// A configuration mistake, naming the flag.
#[derive(Debug, thiserror::Error)]
#[error("{flag}: {message}")]
pub struct ConfigError {
    pub flag: &'static str,
    pub message: String,
}
