//! The `kvindex-sim` command line. The flags of the fixed contract are `--pods`,
//! `--model`, `--block-size`, `--kv-blocks`, `--http-base-port`, `--zmq-connect` |
//! `--zmq-bind-base-port`, `--replay-base-port`, `--wire`, `--hash-seed`, `--tokenizer`;
//! scripts rely on them. The others tune the timing model and are free to change. `--engine
//! sglang` makes the pods speak SGLang's event layout (`--wire` then names an SGLang release).

use std::path::PathBuf;

use clap::{ArgGroup, Parser};

use crate::engine::EngineConfig;
use crate::fleet::{FleetConfig, ZmqMode};
use crate::http::tokenizer::PromptTokenizer;
use crate::wire::WireVersion;

#[derive(Debug, Parser)]
#[command(
    name = "kvindex-sim",
    version,
    about = "A simulated vLLM fleet speaking vLLM's KV-event wire format and OpenAI API"
)]
#[command(group(ArgGroup::new("zmq").required(true).args(["zmq_connect", "zmq_bind_base_port"])))]
pub struct Cli {
    /// Number of simulated pods (vLLM engines).
    #[arg(long)]
    pub pods: usize,
    /// Served model name (also the last part of each pod's topic).
    #[arg(long)]
    pub model: String,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV blocks per pod (vLLM's num_gpu_blocks, the reserved null block included).
    #[arg(long, default_value_t = 10_000)]
    pub kv_blocks: usize,
    /// Pod i serves HTTP on this port + i (0: OS-assigned ports, printed at start).
    #[arg(long)]
    pub http_base_port: u16,
    /// Every pod's PUB dials this endpoint (a central SUB such as `kvindex serve`).
    #[arg(long)]
    pub zmq_connect: Option<String>,
    /// Pod i binds its PUB on tcp://<host>:<port + i>.
    #[arg(long)]
    pub zmq_bind_base_port: Option<u16>,
    /// Pod i binds a replay ROUTER on tcp://<host>:<port + i>.
    #[arg(long)]
    pub replay_base_port: Option<u16>,
    /// Engine whose KV-event layout the pods speak: vllm or sglang.
    #[arg(long, default_value = "vllm", value_parser = ["vllm", "sglang"])]
    pub engine: String,
    /// Event layout: for vLLM 0.33 (map-form events, topic frame in replay, the default) or
    /// 0.23 (array form); for SGLang a release from 0.5.6 on (default 0.5.23: map-form events,
    /// topic frame in replay; before 0.5.20 array form, before 0.5.22 no topic frame).
    #[arg(long)]
    pub wire: Option<String>,
    /// The engines' PYTHONHASHSEED for block hashes; "unset" = vLLM ≥0.29's default seed.
    #[arg(long, default_value = "0")]
    pub hash_seed: String,
    /// Directory with a tokenizer.json (and tokenizer_config.json for chats): text prompts and
    /// chats tokenize as vLLM does for that model. Without it, one token per UTF-8 byte.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Host the pods listen on; it is also the pod id's host in the topic.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Continuous-batching limit on running requests per pod.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Token budget of one engine step (prefill chunks + decodes).
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,
    /// Maximum prompt + completion length (default: the whole KV cache).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Prefill throughput, tokens per simulated second.
    #[arg(long, default_value_t = 16_000.0)]
    pub prefill_tokens_per_s: f64,
    /// Duration of a decode step (one token per running request), simulated milliseconds.
    #[arg(long, default_value_t = 20.0)]
    pub decode_ms_per_token: f64,
    /// Simulated seconds per wall-clock second (10 = ten times faster than real time).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Replay window in batches (vLLM's buffer_steps).
    #[arg(long, default_value_t = 10_000)]
    pub buffer_steps: usize,
    /// Engines per pod (vLLM's --data-parallel-size): rank r of pod i binds base + i·d + r.
    #[arg(long, default_value_t = 1)]
    pub data_parallel_size: usize,
    /// Seed of the generated tokens.
    #[arg(long, default_value_t = 0x5eed)]
    pub output_seed: u64,
}

fn parse_wire(engine: &str, text: Option<&str>) -> Result<WireVersion, String> {
    match engine {
        "sglang" => {
            let text = text.unwrap_or("0.5.23");
            WireVersion::parse_sglang(text)
                .ok_or_else(|| format!("unsupported SGLang release {text:?} (expected 0.5.6 or later)"))
        }
        _ => {
            let text = text.unwrap_or("0.33");
            WireVersion::parse(text).ok_or_else(|| format!("unsupported wire version {text:?} (expected 0.33 or 0.23)"))
        }
    }
}

impl Cli {
    /// Checks what clap cannot and builds the fleet's configuration.
    pub fn fleet_config(&self) -> Result<FleetConfig, String> {
        if self.pods == 0 {
            return Err("--pods must be at least 1".into());
        }
        if self.block_size == 0 {
            return Err("--block-size must be at least 1".into());
        }
        if self.kv_blocks < 2 {
            return Err("--kv-blocks must be at least 2 (block 0 is reserved)".into());
        }
        let positive = |value: f64| value.is_finite() && value > 0.0;
        let non_negative = |value: f64| value.is_finite() && value >= 0.0;
        if !positive(self.prefill_tokens_per_s) || !non_negative(self.decode_ms_per_token) || !positive(self.time_scale)
        {
            return Err(
                "--prefill-tokens-per-s and --time-scale must be positive, --decode-ms-per-token non-negative".into()
            );
        }
        let zmq = match (&self.zmq_connect, self.zmq_bind_base_port) {
            (Some(endpoint), None) => ZmqMode::Connect(endpoint.clone()),
            (None, Some(port)) => ZmqMode::BindBasePort(port),
            _ => return Err("give exactly one of --zmq-connect and --zmq-bind-base-port".into()),
        };
        let hash_seed = if self.hash_seed == "unset" { None } else { Some(self.hash_seed.clone()) };
        // Last: loading a real vocabulary takes a while, so the cheap checks fail first.
        let tokenizer = match &self.tokenizer {
            Some(dir) => PromptTokenizer::load(&self.model, dir)?,
            None => PromptTokenizer::Bytes,
        };
        Ok(FleetConfig {
            pods: self.pods,
            model: self.model.clone(),
            host: self.host.clone(),
            engine: EngineConfig {
                block_size: self.block_size,
                num_gpu_blocks: self.kv_blocks,
                max_num_seqs: self.max_num_seqs.max(1),
                max_num_batched_tokens: self.max_num_batched_tokens.max(1),
                max_model_len: self.max_model_len,
                prefill_tokens_per_s: self.prefill_tokens_per_s,
                decode_s_per_token: self.decode_ms_per_token / 1000.0,
                hash_seed,
                output_seed: self.output_seed,
                ..EngineConfig::default()
            },
            http_base_port: self.http_base_port,
            zmq,
            replay_base_port: self.replay_base_port,
            wire: parse_wire(&self.engine, self.wire.as_deref())?,
            buffer_steps: self.buffer_steps,
            time_scale: self.time_scale,
            data_parallel_size: self.data_parallel_size.max(1),
            tokenizer,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_parses() {
        let cli = Cli::try_parse_from([
            "kvindex-sim",
            "--pods",
            "4",
            "--model",
            "m",
            "--block-size",
            "16",
            "--kv-blocks",
            "10000",
            "--http-base-port",
            "8000",
            "--zmq-bind-base-port",
            "5557",
            "--replay-base-port",
            "5600",
            "--wire",
            "0.23",
            "--hash-seed",
            "42",
        ])
        .unwrap();
        let config = cli.fleet_config().unwrap();
        assert_eq!(config.zmq, ZmqMode::BindBasePort(5557));
        assert_eq!(config.wire, WireVersion::V0_23);
        assert_eq!(config.engine.hash_seed.as_deref(), Some("42"));
        assert!(Cli::try_parse_from(["kvindex-sim", "--pods", "1", "--model", "m", "--http-base-port", "1"]).is_err());
        let sglang = |wire: Option<&str>| {
            let mut args = vec!["kvindex-sim", "--pods", "1", "--model", "m", "--http-base-port", "0"];
            args.extend(["--zmq-bind-base-port", "5557", "--engine", "sglang"]);
            if let Some(w) = wire {
                args.extend(["--wire", w]);
            }
            Cli::try_parse_from(args).unwrap().fleet_config().map(|c| c.wire)
        };
        assert_eq!(sglang(None), Ok(WireVersion::parse_sglang("0.5.23").unwrap()));
        assert_eq!(sglang(Some("0.5.19")), Ok(WireVersion::parse_sglang("0.5.19").unwrap()));
        assert!(sglang(Some("0.5.5")).is_err(), "no reproducible ids before 0.5.6");
        assert!(sglang(Some("latest")).is_err());
        assert!(Cli::try_parse_from([
            "kvindex-sim",
            "--pods",
            "1",
            "--model",
            "m",
            "--http-base-port",
            "1",
            "--zmq-connect",
            "tcp://x:1",
            "--zmq-bind-base-port",
            "2"
        ])
        .is_err());
    }
}
