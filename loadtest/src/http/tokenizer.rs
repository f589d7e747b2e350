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

/// Token ids above 255 (sent as ids, not text) have no byte; they decode as U+FFFD.
pub fn decode(tokens: &[u32]) -> String {
    let bytes: Vec<u8> = tokens.iter().map(|&t| u8::try_from(t).unwrap_or(b'?')).collect();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if tokens.iter().any(|&t| t > 255) {
        let mut out = String::new();
        for &token in tokens {
            match u8::try_from(token) {
                Ok(byte) if byte.is_ascii() => out.push(char::from(byte)),
                _ => out.push('\u{fffd}'),
            }
        }
        return out;
    }
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
