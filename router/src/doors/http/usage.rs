//! The engine's own account of a response, read from its body as it streams past (never
//! buffered): `usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens`, which
//! vLLM returns with `--enable-prompt-tokens-details` (streams: with
//! `stream_options.include_usage`) and `kvindex-sim` always. At the end of the body the
//! engine's cached tokens are compared with what the router predicted for that pod, so an
//! operator can tell reuse the index promised but the engine did not deliver (eviction races,
//! speculative credit that did not come true, a false positive) from reuse that was never on
//! offer (`kvindex_router_engine_*`, `kvindex_router_cache_prediction_total`).
//!
//! The scanner follows JSON strings (escapes included) so that text inside a completion can
//! never pass for a key; it keeps a few bytes of state whatever the body's size, and jumps over
//! what cannot be a key with `memchr`.

use crate::metrics as m;
use crate::place::decision::CreditUnit;

/// Longest key the scanner compares; longer strings are skipped without being kept.
const MAX_KEY: usize = 16;
/// Digits past this are ignored (a count of tokens fits in far fewer).
const MAX_DIGITS: u8 = 19;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    PromptTokens,
    CachedTokens,
}

impl Key {
    fn from(bytes: &[u8]) -> Option<Key> {
        match bytes {
            b"prompt_tokens" => Some(Key::PromptTokens),
            b"cached_tokens" => Some(Key::CachedTokens),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Outside any string.
    Outside,
    /// Inside a string that may be a key we want: its first `len` bytes.
    Key { key: [u8; MAX_KEY], len: usize },
    /// Inside a string that is not one (too long, escaped): skipped to its closing quote.
    Skip,
    /// Inside a skipped string, right after a backslash: the next byte is not its end.
    Escaped,
    /// After a key we want, before its colon.
    AfterKey(Key),
    /// After the colon, before the value.
    Colon(Key),
    /// Reading an unsigned integer value.
    Digits { key: Key, value: u64, digits: u8 },
}

/// The last `prompt_tokens` and `cached_tokens` a JSON (or SSE of JSON) body carried.
#[derive(Debug, Clone)]
pub struct UsageScanner {
    state: State,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
}

impl Default for UsageScanner {
    fn default() -> Self {
        UsageScanner { state: State::Outside, prompt_tokens: None, cached_tokens: None }
    }
}

impl UsageScanner {
    /// Reads the next bytes of the body. Outside strings and across whole strings it jumps to
    /// the next quote (or backslash) with `memchr`, so most bytes cost a vectorised scan; only
    /// a key's colon and number, and a string cut by a frame boundary, go byte by byte.
    pub fn feed(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            match self.state {
                State::Outside => {
                    let Some(open) = memchr::memchr(b'"', &bytes[i..]) else { return };
                    let start = i + open + 1;
                    match memchr::memchr2(b'"', b'\\', &bytes[start..]) {
                        // The whole string is here and has no escape: compare it at once.
                        Some(end) if bytes[start + end] == b'"' => {
                            self.state = match Key::from(&bytes[start..start + end]) {
                                Some(wanted) => State::AfterKey(wanted),
                                None => State::Outside,
                            };
                            i = start + end + 1;
                        }
                        // An escape: not a key of ours; skip past the escaped byte.
                        Some(end) => {
                            self.state = State::Escaped;
                            i = start + end + 1;
                        }
                        // Cut by the end of this frame: keep what a key needs.
                        None => {
                            let rest = &bytes[start..];
                            self.state = if rest.len() <= MAX_KEY {
                                let mut key = [0; MAX_KEY];
                                key[..rest.len()].copy_from_slice(rest);
                                State::Key { key, len: rest.len() }
                            } else {
                                State::Skip
                            };
                            return;
                        }
                    }
                }
                State::Skip => match memchr::memchr2(b'"', b'\\', &bytes[i..]) {
                    Some(at) => {
                        self.state = if bytes[i + at] == b'"' { State::Outside } else { State::Escaped };
                        i += at + 1;
                    }
                    None => return,
                },
                State::Escaped => {
                    self.state = State::Skip;
                    i += 1;
                }
                _ => {
                    self.step(bytes[i]);
                    i += 1;
                }
            }
        }
    }

    /// The body ended: a number running to the very end counts.
    pub fn finish(&mut self) {
        if let State::Digits { key, value, .. } = self.state {
            self.commit(key, value);
        }
        self.state = State::Outside;
    }

    fn commit(&mut self, key: Key, value: u64) {
        match key {
            Key::PromptTokens => self.prompt_tokens = Some(value),
            Key::CachedTokens => self.cached_tokens = Some(value),
        }
    }

    /// One byte in the states that look at every byte (a short string, a key's colon, a number).
    fn step(&mut self, b: u8) {
        self.state = match self.state {
            State::Outside => match b {
                b'"' => State::Key { key: [0; MAX_KEY], len: 0 },
                _ => State::Outside,
            },
            State::Skip => match b {
                b'"' => State::Outside,
                b'\\' => State::Escaped,
                _ => State::Skip,
            },
            State::Escaped => State::Skip,
            State::Key { mut key, len } => match b {
                b'\\' => State::Escaped,
                b'"' => match Key::from(&key[..len]) {
                    Some(wanted) => State::AfterKey(wanted),
                    None => State::Outside,
                },
                _ if len < MAX_KEY => {
                    key[len] = b;
                    State::Key { key, len: len + 1 }
                }
                _ => State::Skip,
            },
            State::AfterKey(key) => match b {
                b' ' | b'\t' | b'\r' | b'\n' => State::AfterKey(key),
                b':' => State::Colon(key),
                _ => return self.restart(b),
            },
            State::Colon(key) => match b {
                b' ' | b'\t' | b'\r' | b'\n' => State::Colon(key),
                b'0'..=b'9' => State::Digits { key, value: u64::from(b - b'0'), digits: 1 },
                _ => return self.restart(b),
            },
            State::Digits { key, value, digits } => match b {
                b'0'..=b'9' if digits < MAX_DIGITS => {
                    State::Digits { key, value: value * 10 + u64::from(b - b'0'), digits: digits + 1 }
                }
                b'0'..=b'9' => State::Digits { key, value, digits },
                _ => {
                    self.commit(key, value);
                    return self.restart(b);
                }
            },
        };
    }

    /// A byte that ended what was being read, read again from outside any string.
    fn restart(&mut self, b: u8) {
        self.state = State::Outside;
        self.step(b);
    }
}

/// What the router predicted for the pod that served, to compare with the engine's usage.
#[derive(Debug, Clone, Copy)]
pub struct Prediction {
    /// Cached blocks the cost used for that pod (exact match or speculative credit).
    pub cached_blocks: u32,
    pub block_size: u32,
    /// The unit the indexer credited that pod in (its engine's block; EAGLE).
    pub unit: CreditUnit,
    /// The router's own count of the prompt, if it tokenized it.
    pub prompt_tokens: Option<usize>,
}

impl Prediction {
    /// Predicted cached tokens, capped as the engine caps a hit of a prompt of the engine's own
    /// length: at least its last token is computed, the hit is whole engine blocks, and with
    /// EAGLE one block fewer, so at most `⌊(prompt − 1) / unit⌋ · unit` (less a unit).
    /// `cached_blocks` already obeys these for the router's count of the prompt; the cap
    /// matters when the engine counted fewer tokens.
    pub fn cached_tokens(&self, prompt_tokens: Option<u64>) -> u64 {
        let bs = u64::from(self.block_size.max(1));
        let unit = u64::from(self.unit.tokens).max(bs);
        let predicted = u64::from(self.cached_blocks) * bs;
        match prompt_tokens.or(self.prompt_tokens.map(|p| p as u64)) {
            Some(prompt) if prompt > 0 => {
                let whole = (prompt - 1) / unit * unit;
                predicted.min(if self.unit.eagle { whole.saturating_sub(unit) } else { whole })
            }
            _ => predicted,
        }
    }
}

/// How the engine's cached tokens compare with the prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PredictionOutcome {
    Exact,
    /// The engine reused fewer tokens than predicted.
    Over,
    /// The engine reused more than predicted.
    Under,
    /// The response carried no `cached_tokens`.
    Unreported,
}

impl PredictionOutcome {
    pub fn label(self) -> &'static str {
        match self {
            PredictionOutcome::Exact => "exact",
            PredictionOutcome::Over => "over",
            PredictionOutcome::Under => "under",
            PredictionOutcome::Unreported => "unreported",
        }
    }
}

/// A response body's usage watcher: fed every data frame, recorded once at the end.
#[derive(Debug, Clone)]
pub struct UsageTap {
    scanner: UsageScanner,
    prediction: Prediction,
}

impl UsageTap {
    pub fn new(prediction: Prediction) -> UsageTap {
        UsageTap { scanner: UsageScanner::default(), prediction }
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        self.scanner.feed(bytes);
    }

    /// The body ended: compares and counts.
    pub fn finish(mut self) -> PredictionOutcome {
        self.scanner.finish();
        let Some(achieved) = self.scanner.cached_tokens else {
            metrics::counter!(m::CACHE_PREDICTION, "outcome" => PredictionOutcome::Unreported.label()).increment(1);
            return PredictionOutcome::Unreported;
        };
        let prompt = self.scanner.prompt_tokens.or(self.prediction.prompt_tokens.map(|p| p as u64));
        let predicted = self.prediction.cached_tokens(prompt);
        let outcome = match achieved.cmp(&predicted) {
            std::cmp::Ordering::Equal => PredictionOutcome::Exact,
            std::cmp::Ordering::Less => PredictionOutcome::Over,
            std::cmp::Ordering::Greater => PredictionOutcome::Under,
        };
        metrics::counter!(m::CACHE_PREDICTION, "outcome" => outcome.label()).increment(1);
        metrics::counter!(m::ENGINE_CACHED_TOKENS).increment(achieved);
        metrics::counter!(m::PREDICTED_CACHED_TOKENS).increment(predicted);
        if let Some(prompt) = prompt {
            metrics::counter!(m::ENGINE_PROMPT_TOKENS).increment(prompt);
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(chunks: &[&str]) -> (Option<u64>, Option<u64>) {
        let mut s = UsageScanner::default();
        for c in chunks {
            s.feed(c.as_bytes());
        }
        s.finish();
        (s.prompt_tokens, s.cached_tokens)
    }

    #[test]
    fn reads_a_json_body_and_the_last_usage_of_a_stream_split_anywhere() {
        let body = r#"{"id":"x","choices":[{"text":"hi"}],"usage":{"prompt_tokens":120,"total_tokens":126,"completion_tokens":6,"prompt_tokens_details":{"cached_tokens":96}}}"#;
        assert_eq!(scan(&[body]), (Some(120), Some(96)));
        // Every split point, byte by byte.
        for cut in 0..body.len() {
            assert_eq!(scan(&[&body[..cut], &body[cut..]]), (Some(120), Some(96)), "cut at {cut}");
        }
        let sse = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n\
                   data: {\"choices\":[],\"usage\": {\"prompt_tokens\" : 33, \"prompt_tokens_details\": {\"cached_tokens\": 32}}}\n\n\
                   data: [DONE]\n\n";
        assert_eq!(scan(&[sse]), (Some(33), Some(32)));
        assert_eq!(scan(&["{\"usage\":{\"prompt_tokens\":7"]), (Some(7), None), "a number at the very end");
        // One byte at a time: every state carried across frames.
        let bytes: Vec<String> = sse.chars().map(String::from).collect();
        let bytes: Vec<&str> = bytes.iter().map(String::as_str).collect();
        assert_eq!(scan(&bytes), (Some(33), Some(32)));
    }

    /// Scanned whole, byte by byte, and cut at every point: all must agree.
    fn scan_every_way(body: &str) -> (Option<u64>, Option<u64>) {
        let whole = scan(&[body]);
        let bytes: Vec<String> = body.chars().map(String::from).collect();
        assert_eq!(scan(&bytes.iter().map(String::as_str).collect::<Vec<_>>()), whole, "byte by byte: {body}");
        for cut in 0..body.len() {
            assert_eq!(scan(&[&body[..cut], &body[cut..]]), whole, "cut at {cut}: {body}");
        }
        whole
    }

    #[test]
    fn text_inside_strings_never_passes_for_a_key() {
        let sneaky = r#"{"choices":[{"text":"\"cached_tokens\":999 and \\\"prompt_tokens\":5"}],"usage":{"prompt_tokens_details":null}}"#;
        assert_eq!(scan_every_way(sneaky), (None, None));
        let long_key = r#"{"cached_tokens_but_longer_than_sixteen":1,"x_cached_tokens":2}"#;
        assert_eq!(scan_every_way(long_key), (None, None));
        assert_eq!(scan_every_way(r#"{"cached_tokens":null,"cached_tokens":"4"}"#), (None, None));
        let escaped_then_real = r#"{"t":"a\\","cached_tokens":3,"u":"\u0022cached_tokens\u0022:9"}"#;
        assert_eq!(scan_every_way(escaped_then_real), (None, Some(3)));
        assert_eq!(scan(&[r#"{"cached_tokens":123456789012345678901234567890}"#]).1, Some(1_234_567_890_123_456_789));
    }

    #[test]
    fn the_prediction_is_capped_as_the_engine_caps_a_hit() {
        let p = Prediction { cached_blocks: 4, block_size: 16, unit: CreditUnit::default(), prompt_tokens: Some(64) };
        // 64 tokens: at most 3 blocks can be hit (the last token is always computed).
        assert_eq!(p.cached_tokens(None), 48);
        assert_eq!(p.cached_tokens(Some(65)), 64);
        assert_eq!(Prediction { prompt_tokens: None, ..p }.cached_tokens(None), 64);
        assert_eq!(Prediction { unit: CreditUnit { tokens: 16, eagle: false }, ..p }.cached_tokens(None), 48);
    }

    #[test]
    fn the_prediction_is_cut_to_the_engines_blocks_when_the_engine_counts_fewer_tokens() {
        // 8 blocks of 16 predicted on a pod of engine blocks of 64 (two whole engine blocks),
        // for a prompt the router counted at 200 tokens.
        let p = Prediction {
            cached_blocks: 8,
            block_size: 16,
            unit: CreditUnit { tokens: 64, eagle: false },
            prompt_tokens: Some(200),
        };
        assert_eq!(p.cached_tokens(None), 128);
        // The engine counted 120 tokens: it reuses one engine block of 64, not 112 tokens.
        assert_eq!(p.cached_tokens(Some(120)), 64);
        assert_eq!(p.cached_tokens(Some(129)), 128);
        assert_eq!(p.cached_tokens(Some(128)), 64);
        // EAGLE (the prediction has already dropped a block for 200 tokens): a hit capped at
        // 128 tokens drops one more block, as the engine does.
        let eagle = Prediction { cached_blocks: 4, unit: CreditUnit { tokens: 64, eagle: true }, ..p };
        assert_eq!(
            (eagle.cached_tokens(None), eagle.cached_tokens(Some(129)), eagle.cached_tokens(Some(120))),
            (64, 64, 0)
        );
    }
}
