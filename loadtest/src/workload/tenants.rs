//! llm-d's benchmark shape: many tenants, each with a long system prompt shared by all its
//! requests, and a fresh question per request (150 tenants × 6k-token context, 1.2k-token
//! questions). Open loop: requests arrive as a Poisson process, tenants chosen uniformly.
//! Each request is a one-turn [`Conversation`] whose opening is its tenant's prompt.

use super::multi_turn::{Conversation, Turn};
use super::rng::Rng;

#[derive(Debug, Clone)]
pub struct TenantsConfig {
    pub tenants: usize,
    pub system_tokens: usize,
    pub question_tokens: usize,
    /// Answer length (`max_tokens`), inclusive range.
    pub output_tokens: (usize, usize),
    pub requests: usize,
    /// Mean arrivals per second.
    pub rate_per_s: f64,
    pub seed: u64,
}

impl TenantsConfig {
    pub fn llm_d_benchmark() -> Self {
        TenantsConfig {
            tenants: 150,
            system_tokens: 6000,
            question_tokens: 1200,
            output_tokens: (100, 300),
            requests: 1500,
            rate_per_s: 5.0,
            seed: 42,
        }
    }

    /// Token counts divided by `divisor` (the arrival rate is left to the caller).
    pub fn scaled_down(&self, divisor: usize) -> Self {
        let d = divisor.max(1);
        TenantsConfig {
            system_tokens: self.system_tokens / d,
            question_tokens: (self.question_tokens / d).max(1),
            output_tokens: ((self.output_tokens.0 / d).max(1), (self.output_tokens.1 / d).max(1)),
            ..self.clone()
        }
    }

    pub fn generate(&self) -> Vec<Conversation> {
        let mut rng = Rng::new(self.seed);
        let prompts: Vec<Vec<u32>> =
            (0..self.tenants.max(1)).map(|_| rng.tokens(self.system_tokens, 1000, 150_000)).collect();
        let mut at = 0.0;
        (0..self.requests)
            .map(|_| {
                // Exponential inter-arrival times: −ln(U) / λ.
                at += -(1.0 - rng.uniform(0.0, 1.0)).ln() / self.rate_per_s.max(f64::MIN_POSITIVE);
                let tenant = rng.range(0, prompts.len() - 1);
                Conversation {
                    opening: prompts[tenant].clone(),
                    turns: vec![Turn {
                        user: rng.tokens(self.question_tokens, 1000, 150_000),
                        max_tokens: rng.range(self.output_tokens.0, self.output_tokens.1).max(1),
                        think_time_s: 0.0,
                    }],
                    start_at: at,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_share_their_prompt_and_arrive_in_order() {
        let requests = TenantsConfig { requests: 200, ..TenantsConfig::llm_d_benchmark() }.generate();
        assert_eq!(requests.len(), 200);
        assert!(requests.windows(2).all(|w| w[0].start_at <= w[1].start_at));
        let distinct: std::collections::HashSet<&[u32]> = requests.iter().map(|r| r.opening.as_slice()).collect();
        assert!(distinct.len() > 50 && distinct.len() <= 150);
        let mean_gap = requests.last().unwrap().start_at / 200.0;
        assert!((0.1..0.4).contains(&mean_gap), "{mean_gap}");
    }
}
