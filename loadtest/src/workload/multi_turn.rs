//! The reference scenario's workload (`docs/reference/anchors.md`): multi-turn conversations
//! that each grow to about 8k tokens of context over 6 turns, sharing one system prompt.
//!
//! Each conversation is a shared system prompt, its own document, then per turn a user
//! message; the driver appends every answer the pod generated before the next turn, so a
//! turn's prompt is the whole conversation so far. Turns are closed loop: a conversation sends
//! its next turn a think time after the previous answer finished.

use super::rng::Rng;

#[derive(Debug, Clone)]
pub struct MultiTurnConfig {
    pub conversations: usize,
    pub turns: usize,
    /// Tokens of the system prompt every conversation starts with.
    pub system_tokens: usize,
    /// Tokens of each conversation's own document, after the system prompt.
    pub document_tokens: usize,
    /// User message length per turn, inclusive range.
    pub user_tokens: (usize, usize),
    /// Answer length (`max_tokens`) per turn, inclusive range.
    pub output_tokens: (usize, usize),
    /// Pause between an answer and the next turn, seconds.
    pub think_time_s: (f64, f64),
    /// Conversations start uniformly within this many seconds.
    pub start_window_s: f64,
    pub seed: u64,
}

impl MultiTurnConfig {
    /// 64 conversations × 6 turns, growing to ~8k tokens: 1k system + 3.5k document +
    /// 6 × (~500 user + ~150 answer).
    pub fn reference() -> Self {
        MultiTurnConfig {
            conversations: 64,
            turns: 6,
            system_tokens: 1000,
            document_tokens: 3500,
            user_tokens: (300, 700),
            output_tokens: (100, 200),
            think_time_s: (1.0, 5.0),
            start_window_s: 10.0,
            seed: 42,
        }
    }

    /// An agentic long-context trace: 16 agents, each a tool loop of 30 short steps (tool
    /// output in, a short action out) over a 2k-token opening, growing to ~17k tokens.
    pub fn agentic() -> Self {
        MultiTurnConfig {
            conversations: 16,
            turns: 30,
            system_tokens: 1500,
            document_tokens: 500,
            user_tokens: (200, 600),
            output_tokens: (50, 150),
            think_time_s: (0.2, 1.0),
            start_window_s: 5.0,
            seed: 42,
        }
    }

    /// The reference shape with 4× the conversations: a working set (~2M tokens) far above
    /// the reference fleet's 640k tokens of KV, so every policy evicts.
    pub fn overflow() -> Self {
        MultiTurnConfig { conversations: 256, start_window_s: 40.0, ..MultiTurnConfig::reference() }
    }

    /// The same shape with every token count divided by `divisor` (CI-sized runs).
    pub fn scaled_down(&self, divisor: usize) -> Self {
        let d = divisor.max(1);
        MultiTurnConfig {
            system_tokens: self.system_tokens / d,
            document_tokens: self.document_tokens / d,
            user_tokens: (self.user_tokens.0 / d, self.user_tokens.1 / d),
            output_tokens: ((self.output_tokens.0 / d).max(1), (self.output_tokens.1 / d).max(1)),
            ..self.clone()
        }
    }

    pub fn generate(&self) -> Vec<Conversation> {
        let mut rng = Rng::new(self.seed);
        // Ids from 1000 up so they never collide with the byte ids of generated answers.
        let system = rng.tokens(self.system_tokens, 1000, 150_000);
        (0..self.conversations)
            .map(|_| {
                let mut opening = system.clone();
                opening.extend(rng.tokens(self.document_tokens, 1000, 150_000));
                let turns = (0..self.turns)
                    .map(|_| Turn {
                        user: {
                            let len = rng.range(self.user_tokens.0, self.user_tokens.1).max(1);
                            rng.tokens(len, 1000, 150_000)
                        },
                        max_tokens: rng.range(self.output_tokens.0, self.output_tokens.1).max(1),
                        think_time_s: rng.uniform(self.think_time_s.0, self.think_time_s.1),
                    })
                    .collect();
                Conversation { opening, turns, start_at: rng.uniform(0.0, self.start_window_s) }
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
pub struct Turn {
    pub user: Vec<u32>,
    pub max_tokens: usize,
    /// Wait after the previous answer before sending this turn.
    pub think_time_s: f64,
}

#[derive(Debug, Clone)]
pub struct Conversation {
    /// System prompt + document: the start of every turn's prompt.
    pub opening: Vec<u32>,
    pub turns: Vec<Turn>,
    pub start_at: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reproducible_and_shaped_like_the_reference() {
        let config = MultiTurnConfig::reference();
        let (a, b) = (config.generate(), config.generate());
        assert_eq!(a.len(), 64);
        assert_eq!(a[3].turns[2].user, b[3].turns[2].user);
        assert_eq!(a[0].opening[..1000], a[1].opening[..1000]);
        assert_ne!(a[0].opening[1000..], a[1].opening[1000..]);
        let final_context: usize =
            a[0].opening.len() + a[0].turns.iter().map(|t| t.user.len() + t.max_tokens).sum::<usize>();
        assert!((7000..10_000).contains(&final_context), "{final_context}");
    }

    #[test]
    fn presets_have_their_documented_shape() {
        let context =
            |c: &Conversation| c.opening.len() + c.turns.iter().map(|t| t.user.len() + t.max_tokens).sum::<usize>();
        let agents = MultiTurnConfig::agentic().generate();
        assert_eq!((agents.len(), agents[0].turns.len()), (16, 30));
        assert!((13_000..21_000).contains(&context(&agents[0])), "{}", context(&agents[0]));
        let overflow = MultiTurnConfig::overflow().generate();
        let working_set: usize = overflow.iter().map(context).sum();
        assert!(working_set > 3 * 640_000, "{working_set} tokens against 640k of fleet KV");
    }
}
