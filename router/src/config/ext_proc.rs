//! The endpoint picker's flags (`--ext-proc-*`), kept apart from the proxy's so the door can be
//! read, documented and validated on its own; flattened into `kvindex-router serve`.

use clap::Args;

use super::error::ConfigError;

/// `kvindex-router serve` flags of the Gateway API endpoint picker (Envoy ext_proc).
#[derive(Debug, Clone, Args)]
pub struct ExtProcArgs {
    /// Serve `envoy.service.ext_proc.v3.ExternalProcessor` (and `grpc.health.v1`) here: the
    /// endpoint picker an InferencePool's `endpointPickerRef` points at. Off unless given.
    #[arg(long, value_name = "HOST:PORT")]
    pub ext_proc_addr: Option<String>,
    /// `grpc.health.v1` on its own address as well (llm-d's port 9003); the ext_proc address
    /// always serves it too.
    #[arg(long, value_name = "HOST:PORT", requires = "ext_proc_addr")]
    pub ext_proc_health_addr: Option<String>,
    /// `endpoint-picker`: name the destination (x-gateway-destination-endpoint).
    /// `prefilter`: ahead of an existing EPP, narrow its candidates through the
    /// `envoy.lb.subset_hint` metadata to the pods holding the longest prefix within the load
    /// band, and name no destination.
    #[arg(long, value_enum, default_value_t = Mode::EndpointPicker)]
    pub ext_proc_mode: Mode,
    /// Request bytes buffered at once over all ext_proc streams; a stream that would go past it
    /// is shed with a 429 (each body is also bounded by --max-body-bytes, answered with 413).
    #[arg(long, default_value_t = 1 << 30, value_name = "BYTES")]
    pub ext_proc_max_buffered_bytes: usize,
    /// A stream must bring its whole request (headers, then body to `end_of_stream` or
    /// trailers) within this many ms of opening; past it the request is answered 408 and the
    /// stream ends, so streams that stop after their headers cannot pile up.
    #[arg(long, default_value_t = 30_000, value_name = "MS")]
    pub ext_proc_request_timeout_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    EndpointPicker,
    Prefilter,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Mode::EndpointPicker => "endpoint-picker",
            Mode::Prefilter => "prefilter",
        }
    }
}

/// The validated endpoint picker settings (present when `--ext-proc-addr` is given).
#[derive(Debug, Clone)]
pub struct ExtProcConfig {
    pub addr: String,
    pub health_addr: Option<String>,
    pub mode: Mode,
    pub max_buffered_bytes: usize,
    /// From the stream's start to the end of its request (`--ext-proc-request-timeout-ms`).
    pub request_timeout: std::time::Duration,
}

impl ExtProcArgs {
    /// `None` when the endpoint picker is off.
    pub fn into_config(
        self,
        check_host_port: impl Fn(&'static str, &str) -> Result<(), ConfigError>,
        max_body_bytes: usize,
    ) -> Result<Option<ExtProcConfig>, ConfigError> {
        let Some(addr) = self.ext_proc_addr else { return Ok(None) };
        check_host_port("--ext-proc-addr", &addr)?;
        if let Some(health) = &self.ext_proc_health_addr {
            check_host_port("--ext-proc-health-addr", health)?;
        }
        if self.ext_proc_max_buffered_bytes < max_body_bytes {
            return Err(ConfigError {
                flag: "--ext-proc-max-buffered-bytes",
                message: format!("must be at least --max-body-bytes ({max_body_bytes})"),
            });
        }
        if self.ext_proc_request_timeout_ms == 0 {
            return Err(ConfigError { flag: "--ext-proc-request-timeout-ms", message: "must be at least 1".into() });
        }
        Ok(Some(ExtProcConfig {
            addr,
            health_addr: self.ext_proc_health_addr,
            mode: self.ext_proc_mode,
            max_buffered_bytes: self.ext_proc_max_buffered_bytes,
            request_timeout: std::time::Duration::from_millis(self.ext_proc_request_timeout_ms),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<Option<ExtProcConfig>, String> {
        let base = ["--http-addr", "127.0.0.1:8080", "--pod", "10.0.0.1:8000=http://10.0.0.1:8000"];
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        crate::config::tests::parse(&args).map(|c| c.ext_proc)
    }

    #[test]
    fn the_picker_is_off_unless_its_address_is_given_and_mistakes_name_the_flag() {
        assert!(parse(&[]).unwrap().is_none());
        let on = parse(&["--ext-proc-addr", "0.0.0.0:9002", "--ext-proc-mode", "prefilter"]).unwrap().unwrap();
        assert_eq!((on.addr.as_str(), on.mode, on.health_addr), ("0.0.0.0:9002", Mode::Prefilter, None));
        assert_eq!(on.request_timeout, std::time::Duration::from_secs(30), "the default request timeout");
        let cases: &[(&[&str], &str)] = &[
            (&["--ext-proc-addr", "9002"], "--ext-proc-addr: expected <host>:<port>"),
            (&["--ext-proc-addr", "0.0.0.0:9002", "--ext-proc-health-addr", "x"], "--ext-proc-health-addr"),
            (&["--ext-proc-health-addr", "0.0.0.0:9003"], "--ext-proc-addr"),
            (&["--ext-proc-addr", "0.0.0.0:9002", "--ext-proc-max-buffered-bytes", "1024"], "--max-body-bytes"),
            (&["--ext-proc-addr", "0.0.0.0:9002", "--ext-proc-mode", "both"], "--ext-proc-mode"),
            (
                &["--ext-proc-addr", "0.0.0.0:9002", "--ext-proc-request-timeout-ms", "0"],
                "--ext-proc-request-timeout-ms",
            ),
        ];
        for (args, expected) in cases {
            let error = parse(args).expect_err(expected);
            assert!(error.contains(expected), "{args:?}: {error}");
        }
    }
}
