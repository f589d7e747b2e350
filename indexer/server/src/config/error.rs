//! A configuration error names the key at fault and where its value came from: a flag, an
//! environment variable, the config file, the pods file or a registration request.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// Where a configuration value came from (what a [`ConfigError`] names beside its key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueOrigin {
    /// A command-line flag, e.g. `--block-size`.
    Flag(String),
    /// An environment variable, e.g. `KVINDEX_BLOCK_SIZE`.
    Env(String),
    /// The `--config` file, or the watched pods file.
    File(PathBuf),
    /// A registration request (`grpc` or `http`).
    Request(&'static str),
    /// Nothing set it.
    Default,
}

impl fmt::Display for ValueOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueOrigin::Flag(flag) => write!(f, "flag {flag}"),
            ValueOrigin::Env(var) => write!(f, "env {var}"),
            ValueOrigin::File(path) => write!(f, "file {}", path.display()),
            ValueOrigin::Request(api) => write!(f, "{api} request"),
            ValueOrigin::Default => f.write_str("default"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config error: {key} ({origin}): {message}")]
pub struct ConfigError {
    /// The key as the config file spells it (`block_size`, `pods[0].endpoint`).
    pub key: String,
    pub origin: ValueOrigin,
    pub message: String,
}

impl ConfigError {
    pub fn new(key: impl Into<String>, origin: ValueOrigin, message: impl Into<String>) -> Self {
        ConfigError { key: key.into(), origin, message: message.into() }
    }

    /// The config error behind a clap value error of `kvindex serve` (a flag or env var whose
    /// value does not parse), or `None` for other command-line errors. clap names the flag
    /// even when the value came from its env var; `argv` tells the two apart.
    /// `command` is `serve`'s (`config::serve_command`), whose arguments name the settings.
    pub fn from_clap(
        error: &clap::Error,
        argv: impl IntoIterator<Item = impl Into<OsString>>,
        command: &clap::Command,
    ) -> Option<Self> {
        if !matches!(error.kind(), ErrorKind::ValueValidation | ErrorKind::InvalidValue) {
            return None;
        }
        let Some(ContextValue::String(arg)) = error.get(ContextKind::InvalidArg) else { return None };
        let flag = arg.split_whitespace().next()?.trim_start_matches("--");
        let spec = command.get_arguments().find(|a| a.get_long() == Some(flag))?;
        let long = format!("--{flag}");
        let on_command_line = argv.into_iter().map(Into::into).any(|a: OsString| {
            a.to_str()
                .is_some_and(|a| a == long || a.strip_prefix(long.as_str()).is_some_and(|rest| rest.starts_with('=')))
        });
        let origin = match spec.get_env() {
            Some(var) if !on_command_line => ValueOrigin::Env(var.to_string_lossy().into_owned()),
            _ => ValueOrigin::Flag(long),
        };
        let value = match error.get(ContextKind::InvalidValue) {
            Some(ContextValue::String(v)) => v.clone(),
            _ => String::new(),
        };
        let reason = std::error::Error::source(error).map_or_else(|| "invalid value".to_string(), |e| e.to_string());
        Some(ConfigError::new(spec.get_id().as_str(), origin, format!("{reason} (got {value:?})")))
    }
}
