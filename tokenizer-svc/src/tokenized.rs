//! What tokenizing a text gives: [`TokenizedText`] (ids and offsets) and [`Bounded`] (ids under
//! a token limit). A leaf that the model, incremental tokenization and the gRPC shell all name.

/// Token ids of a text and, per token, its `(start, end)` character offsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizedText {
    pub ids: Vec<u32>,
    pub offsets: Vec<(u32, u32)>,
}

/// Ids of a text tokenized against a token limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bounded {
    /// The text's ids, at most the limit.
    Ids(Vec<u32>),
    /// The text has more tokens than the limit; `counted` of them (more than the limit) were
    /// counted before tokenization stopped (at the first cut point past the limit, or the whole
    /// text when it has none).
    OverLimit { counted: usize },
}
