//! Debugging aid: renders one `ChatRequest` JSON (stdin) with a model directory and prints the
//! prompt text, so a template divergence can be diffed against `apply_chat_template` by hand.
//! Usage: cargo run -p kvindex-tokenizer --example render_chat -- <model-dir> < request.json
use std::io::Read;

use kvindex_tokenizer::{ChatRequest, ClientTemplates, RegistryConfig, TokenizerRegistry};

fn main() {
    let dir = std::env::args().nth(1).expect("usage: render_chat <model-dir> < request.json");
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read stdin");
    let request: ChatRequest = serde_json::from_str(&input).expect("request JSON");
    // The request's own `chat_template`, if any, is the user's: render it in process.
    let mut config = RegistryConfig { client_templates: ClientTemplates::Trusted, ..Default::default() };
    config.add_model("m", &dir).expect("model dir");
    match TokenizerRegistry::new(config).render_chat_text("m", &request) {
        Ok(text) => print!("{text}"),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
