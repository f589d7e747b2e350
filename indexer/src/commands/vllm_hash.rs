//! placeholder until the vLLM hash command lands
pub fn run(_input: impl std::io::BufRead, _output: impl std::io::Write) -> Result<(), Box<dyn std::error::Error>> {
    Err("vllm-hash is not built yet".into())
}
