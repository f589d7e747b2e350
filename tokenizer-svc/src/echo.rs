//! Client text (a model or tool name) as it may be quoted back in an error message or a log
//! line: cut after [`MAX_ECHO_BYTES`] with a marker giving its real length, control and
//! bidi-override characters escaped, so a 1 MB name is not echoed whole and a newline or ANSI
//! escape cannot forge a line where the message is shown or logged. The router quotes client
//! text the same way (it uses this function).

/// Most bytes of client text quoted back (see [`echo`]).
pub const MAX_ECHO_BYTES: usize = 256;

/// `text`, bounded and escaped for quoting (see the module doc).
pub fn echo(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_ECHO_BYTES + 32));
    for c in text.chars() {
        if out.len() >= MAX_ECHO_BYTES {
            out.push_str(&format!("… ({} bytes)", text.len()));
            break;
        }
        let invisible = matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || invisible {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoed_text_is_bounded_and_escaped() {
        assert_eq!(echo("Qwen/Qwen3-8B"), "Qwen/Qwen3-8B");
        assert_eq!(echo("a\nb\u{1b}[31m\u{202e}c"), "a\\nb\\u{1b}[31m\\u{202e}c");
        let huge = "é".repeat(500_000);
        let echoed = echo(&huge);
        assert!(echoed.len() < MAX_ECHO_BYTES + 32, "{}", echoed.len());
        assert!(echoed.starts_with("éé") && echoed.ends_with("… (1000000 bytes)"), "{echoed}");
    }
}
