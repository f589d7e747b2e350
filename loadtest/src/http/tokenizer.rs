//! The simulator's tokenizer: one token per UTF-8 byte (id = byte value).
//!
//! Trivial, deterministic and exactly reversible, so text prompts and generated text
//! round-trip: a client that sends a conversation back as text gets the same token ids, and
//! therefore the same block hashes, as the pod generated. Real vocabularies (`--tokenizer`
//! with a `tokenizer.json`) are not supported yet; clients that need real token ids send them
//! as `prompt: [ids]`.

pub fn encode(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// Bytes are decoded as UTF-8 (invalid sequences as U+FFFD). Token ids above 255 (sent as
/// ids, not text) have no byte and decode as U+FFFD.
pub fn decode(tokens: &[u32]) -> String {
    let mut text = String::new();
    // Runs of byte tokens between ids above 255; each boundary becomes one U+FFFD.
    for run in tokens.split(|&token| token > 255) {
        let bytes: Vec<u8> = run.iter().map(|&token| token as u8).collect();
        text.push_str(&String::from_utf8_lossy(&bytes));
        text.push('\u{fffd}');
    }
    text.pop(); // n boundaries give n + 1 runs: drop the marker after the last one
    text
}

/// The chat template: each message as `<|role|>\n{content}\n`, then `<|assistant|>\n`.
pub fn render_chat(messages: &[(String, String)]) -> String {
    let mut text = String::new();
    for (role, content) in messages {
        text.push_str("<|");
        text.push_str(role);
        text.push_str("|>\n");
        text.push_str(content);
        text.push('\n');
    }
    text.push_str("<|assistant|>\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips() {
        let text = "héllo wörld";
        assert_eq!(decode(&encode(text)), text);
        assert_eq!(encode("ab"), vec![97, 98]);
        assert_eq!(decode(&[104, 1000, 105]), "h\u{fffd}i");
    }
}
