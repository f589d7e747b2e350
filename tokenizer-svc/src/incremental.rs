//! Incremental tokenization: a chat re-sends its whole history every turn, so the ids of a
//! prefix tokenized before are reused and only the new text is tokenized, with results
//! identical to tokenizing the whole text. Used transparently by every `TokenizerRegistry`
//! method; the stored prefixes live in [`crate::prefix_cache`].
//!
//! # Why cutting is exact
//!
//! HF `tokenizers` (0.23, pinned by the workspace; re-check this argument on upgrades) encodes
//! a text in four steps:
//! 1. **Pass 1**: added tokens with `normalized = false` are found in the raw text by one
//!    leftmost-longest Aho-Corasick scan (`AddedVocabulary::find_matches`): each accepted match
//!    becomes a split carrying its id, the text between matches becomes splits. Flags act per
//!    match: `single_word` discards it unless the characters just outside it are not word
//!    characters, `lstrip`/`rstrip` widen it over adjacent whitespace (never before the previous
//!    split's end), and with `encode_special_tokens` special matches are discarded. A discarded
//!    match still consumes its text in the scan.
//! 2. **Pass 2**: each text split from pass 1 is normalized on its own, then scanned the same
//!    way for added tokens with `normalized = true`.
//! 3. Each remaining split is pre-tokenized and run through the model on its own.
//! 4. The post-processor (BOS/EOS, templates), truncation and padding act on the whole sequence.
//!
//! A **cut token** is an added token `m` such that: no flag applies to it (`single_word`,
//! `lstrip`, `rstrip` false; not special while `encode_special_tokens` is on); its content
//! neither starts nor ends with whitespace, nor ends with a word character when any added token
//! is `single_word`; its content occurs inside no other added token; and, when `m` is
//! `normalized`, the normalizer is the identity and no `normalized = false` token begins with a
//! proper suffix of `m`. A text `P` **ends at a cut point** when its last split is a match of a
//! cut token `m` (found by the library itself, in pass 1 or 2).
//!
//! **Claim.** If `P` ends at a cut point with token `m`, then for every text `S` the splits of
//! `P + S` are the splits of `P` followed by the splits `m + S` has after its leading `m`. So,
//! before post-processing, `ids(P + S) = ids(P) ++ ids(m + S)[1..]`, and the character offsets
//! of the tail are those of `m + S` shifted by `chars(P) - chars(m)`.
//!
//! *Proof.* (a) *Up to the cut.* A scan of `P + S` can differ from a scan of `P` only through a
//! candidate ending beyond `|P|`. Leftmost-longest takes, at each step, the candidate starting
//! first and, among those, the longest. A crossing candidate starting at or before `m`'s start
//! would contain `m`'s content with more after it, which no cut token allows; one starting
//! inside `m` loses to `m` when both are in the same scan (pass-1 `m`) and, for a pass-2 `m`
//! that pass 1 does not see, would be a pass-1 token beginning with a proper suffix of `m`,
//! excluded too; and no pass-1 candidate lies inside a pass-2 `m`, or it would have split `m`'s
//! text in `P`. So every pick up to and including `m` is the same. The flag checks on those
//! picks read only characters of `P`: `single_word` reads one character on each side, and an
//! `rstrip` cannot run past `m`, which starts with non-whitespace. (b) *After the cut.* In
//! `P + S` and in `m + S` (where `m`, at offset 0, is the longest candidate there since it lies
//! inside no other token) nothing is picked inside or across `m`, so in both the next picks are
//! the leftmost-longest candidates of the same text after `m`, and the checks that look back see
//! `m`'s last character in both: `single_word` is excluded by the word-character rule when it
//! exists, `lstrip` stops at `m`'s end (not whitespace, and the previous split's end). (c)
//! Normalization (per pass-1 split, so untouched by a pass-1 cut, and the identity for a pass-2
//! cut), pre-tokenization and the model act on one split at a time. The one component of 0.23
//! that asks where a split lies is `Metaspace` with `prepend_scheme: first` (does the split
//! start at offset 0?); in `P + S` and in `m + S` the splits after `m` start past 0 — which is
//! why the new text is tokenized behind its cut token rather than alone, and also keeps the
//! byte-level `trim_offsets` first-token rule out of play. Offsets are positions in the input,
//! so they shift by a constant. ∎
//!
//! By (a), whether a prefix ends at a cut point depends on the prefix alone. Applying the claim
//! at successive cut points, a text is tokenized as segments between cut points, and a cached
//! chain of segments stands for a prefix of a request exactly when its bytes are equal.
//!
//! **Post-processing** is applied once to the concatenation. With `add_special_tokens = false`
//! it must leave ids (and, for offset requests, offsets) unchanged, and with `true` it must wrap
//! any sequence in one fixed frame (e.g. `BOS ...`): both are checked at load by running the
//! model's own post-processor on sentinel ids (every `PostProcessorWrapper` of 0.23 — Template,
//! Bert, Roberta, ByteLevel, Sequence — passes). Processors with `trim_offsets` rewrite offsets
//! based on token text, so offset requests fall back on them.
//!
//! **Fall-backs** (full tokenization, counted as `bypassed`): truncation or padding configured in
//! `tokenizer.json`; a random model (BPE dropout, Unigram sampling); a post-processor that is not
//! a frame; no cut token in the vocabulary; a text without any cut token (e.g. a completion
//! prompt of plain text) or with more than 65,536 occurrences of cut tokens; offset requests on
//! `trim_offsets` processors; the cache disabled. If a segment ever failed to start with its cut
//! token (the claim rules it out), the request falls back to full tokenization and a warning
//! without content is logged.
use std::collections::HashSet;

use aho_corasick::AhoCorasick;
use serde_json::Value as Json;
use tokenizers::{AddedToken, Encoding, ModelWrapper, OffsetReferential, OffsetType, Token, Tokenizer};

use crate::cut_finder::CutFinder;
use crate::prefix_cache::{CachedPrefix, Node, PrefixCache};
use crate::tokenized::TokenizedText;

/// A cut point closer than this to the previous stored node does not start a new node: fewer,
/// longer segments make lookups cheaper. The last cut point of every request is stored
/// regardless, so a conversation's next turn reuses everything up to its new text; this only
/// coarsens reuse after an edit in the middle or between conversations that share a beginning.
const MIN_NODE_BYTES: usize = 512;

/// Candidate cut points probed per lookup, longest first (bounds work on adversarial texts).
const MAX_PROBES: usize = 1024;

/// A text with more occurrences of cut tokens than this is tokenized in full: it bounds the
/// memory a request can make the lookup allocate (about 32 bytes per candidate).
const MAX_CANDIDATES: usize = 1 << 16;

/// What a model's tokenizer allows: its cut tokens and its post-processor's frame.
pub struct CutPlan {
    /// Contents of the cut tokens, for finding candidate cut points in a request.
    finder: CutFinder,
    cut_ids: HashSet<u32>,
    frame: Frame,
}

impl std::fmt::Debug for CutPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CutPlan").field("cut_tokens", &self.cut_ids.len()).finish_non_exhaustive()
    }
}

/// What `post_process(_, add_special_tokens = true)` adds around any sequence.
struct Frame {
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    prefix_offsets: Vec<(u32, u32)>,
    suffix_offsets: Vec<(u32, u32)>,
    /// Offsets pass through the post-processor unchanged.
    offsets_exact: bool,
}

/// A cut point found by the library in a request: token `id` spans `m_start..end`.
#[derive(Clone, Copy)]
struct Cut {
    m_start: usize,
    end: usize,
    id: u32,
}

impl CutPlan {
    /// The plan for `tokenizer`, or why its texts must always be tokenized in full.
    pub fn analyze(tokenizer: &Tokenizer) -> Result<Self, String> {
        if tokenizer.get_truncation().is_some() || tokenizer.get_padding().is_some() {
            return Err("tokenizer.json configures truncation or padding".into());
        }
        match tokenizer.get_model() {
            ModelWrapper::BPE(bpe) if bpe.dropout.is_some_and(|p| p > 0.0) => {
                return Err("BPE dropout makes tokenization random".into())
            }
            ModelWrapper::Unigram(unigram) if unigram.alpha.is_some() => {
                return Err("Unigram sampling makes tokenization random".into())
            }
            _ => {}
        }
        let frame = Frame::probe(tokenizer)?;
        let cut_tokens = cut_tokens(tokenizer);
        if cut_tokens.is_empty() {
            return Err("no added token can serve as a cut point".into());
        }
        let contents: Vec<&str> = cut_tokens.iter().map(|(_, content)| content.as_str()).collect();
        let finder = CutFinder::new(&contents).map_err(|e| format!("cut token automaton: {e}"))?;
        Ok(Self { finder, cut_ids: cut_tokens.iter().map(|(id, _)| *id).collect(), frame })
    }

    /// How many added tokens can serve as cut points.
    pub fn cut_token_count(&self) -> usize {
        self.cut_ids.len()
    }

    /// The cut points past `after` that the library itself finds when it splits `text[from..]`
    /// (`from` is `after`, or the start of the cut token ending at `after`, as the claim reads).
    fn cuts_after(&self, tokenizer: &Tokenizer, text: &str, from: usize, after: usize) -> Vec<Cut> {
        let splits = tokenizer.get_added_vocabulary().extract_and_normalize(tokenizer.get_normalizer(), &text[from..]);
        splits
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .filter_map(|(_, (start, end), tokens)| match tokens.as_deref() {
                Some([token]) if from + end > after && self.cut_ids.contains(&token.id) => {
                    Some(Cut { m_start: from + start, end: from + end, id: token.id })
                }
                _ => None,
            })
            .collect()
    }
}

impl Frame {
    /// Runs the model's post-processor on sentinel sequences to learn what it adds.
    fn probe(tokenizer: &Tokenizer) -> Result<Self, String> {
        const A: u32 = u32::MAX - 1;
        const B: u32 = u32::MAX;
        let run = |ids: &[u32], add: bool| -> Result<Encoding, String> {
            let tokens =
                ids.iter().enumerate().map(|(i, &id)| Token::new(id, String::new(), (3 * i + 1, 3 * i + 2))).collect();
            tokenizer
                .post_process(Encoding::from_tokens(tokens, 0), None, add)
                .map_err(|e| format!("post-processor: {e}"))
        };
        let inputs: [&[u32]; 2] = [&[A], &[A, B]];
        let mut offsets_exact = !has_trim_offsets(tokenizer);
        for ids in inputs {
            let plain = run(ids, false)?;
            if plain.get_ids() != ids {
                return Err("the post-processor changes ids without special tokens".into());
            }
            offsets_exact &= plain.get_offsets() == &[(1, 2), (4, 5)][..ids.len()];
        }
        let one = run(&[A], true)?;
        let ids = one.get_ids();
        let at = match ids.iter().position(|&id| id == A) {
            Some(at) if ids.iter().filter(|&&id| id == A || id == B).count() == 1 => at,
            _ => return Err("the post-processor does not wrap the sequence".into()),
        };
        let (prefix, suffix) = (ids[..at].to_vec(), ids[at + 1..].to_vec());
        let two = run(&[A, B], true)?;
        let expected: Vec<u32> = [&prefix[..], &[A, B], &suffix[..]].concat();
        if two.get_ids() != expected {
            return Err("the post-processor's special tokens depend on the sequence".into());
        }
        let offsets = |enc: &Encoding| -> Vec<(u32, u32)> {
            enc.get_offsets().iter().map(|&(s, e)| (s as u32, e as u32)).collect()
        };
        let all = offsets(&one);
        offsets_exact &= two.get_offsets()[at..at + 2] == [(1, 2), (4, 5)];
        Ok(Self {
            prefix_offsets: all[..at].to_vec(),
            suffix_offsets: all[at + 1..].to_vec(),
            prefix,
            suffix,
            offsets_exact,
        })
    }

    fn wrap(&self, mut out: TokenizedText, with_offsets: bool) -> TokenizedText {
        if self.prefix.is_empty() && self.suffix.is_empty() {
            return out;
        }
        out.ids = [&self.prefix[..], &out.ids, &self.suffix[..]].concat();
        if with_offsets {
            out.offsets = [&self.prefix_offsets[..], &out.offsets, &self.suffix_offsets[..]].concat();
        }
        out
    }
}

/// `trim_offsets` anywhere in the post-processor (ByteLevel, Roberta, inside a Sequence).
fn has_trim_offsets(tokenizer: &Tokenizer) -> bool {
    fn any_trim(value: &Json) -> bool {
        match value {
            Json::Object(map) => {
                map.iter().any(|(k, v)| (k == "trim_offsets" && v == &Json::Bool(true)) || any_trim(v))
            }
            Json::Array(items) => items.iter().any(any_trim),
            _ => false,
        }
    }
    tokenizer.get_post_processor().map(|p| serde_json::to_value(p).map_or(true, |v| any_trim(&v))).unwrap_or(false)
}

/// No normalizer, or a `Sequence` of nothing (tokenizer.json's `{"type":"Sequence",
/// "normalizers":[]}`): normalized added tokens then match the raw text.
fn normalizer_is_identity(tokenizer: &Tokenizer) -> bool {
    fn identity(value: &Json) -> bool {
        value.get("type").and_then(Json::as_str) == Some("Sequence")
            && value.get("normalizers").and_then(Json::as_array).is_some_and(|list| list.iter().all(identity))
    }
    match tokenizer.get_normalizer() {
        None => true,
        Some(n) => serde_json::to_value(n).is_ok_and(|v| identity(&v)),
    }
}

/// `\w` for the regex `single_word` uses, conservatively: every non-ASCII character counts.
fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || !c.is_ascii()
}

/// The added tokens that satisfy the cut-token rules of the module doc: `(id, content)`.
fn cut_tokens(tokenizer: &Tokenizer) -> Vec<(u32, String)> {
    let added = tokenizer.get_added_tokens_decoder();
    let tokens: Vec<_> = added.iter().filter(|(_, t)| !t.content.is_empty()).collect();
    let identity_normalizer = normalizer_is_identity(tokenizer);
    let encode_special = tokenizer.get_encode_special_tokens();
    let any_single_word = tokens.iter().any(|(_, t)| t.single_word);
    // Tokens whose content occurs inside another token's content.
    let Ok(all) = AhoCorasick::new(tokens.iter().map(|(_, t)| &t.content)) else {
        return Vec::new();
    };
    let mut inside = vec![false; tokens.len()];
    for (j, (_, t)) in tokens.iter().enumerate() {
        for found in all.find_overlapping_iter(&t.content) {
            if found.pattern().as_usize() != j {
                inside[found.pattern().as_usize()] = true;
            }
        }
    }
    // Every prefix of every pass-1 token, for the proper-suffix rule of pass-2 cut tokens.
    let pass1_prefixes: HashSet<&str> = tokens
        .iter()
        .filter(|(_, t)| !t.normalized)
        .flat_map(|(_, t)| t.content.char_indices().map(|(i, c)| &t.content[..i + c.len_utf8()]))
        .collect();
    let context = CutContext { identity_normalizer, encode_special, any_single_word, pass1_prefixes };
    tokens
        .iter()
        .enumerate()
        .filter(|&(i, (_, t))| !inside[i] && context.allows(t))
        .map(|(_, (id, t))| (**id, t.content.clone()))
        .collect()
}

/// What the cut-token rules need to know about the rest of the vocabulary.
struct CutContext<'a> {
    identity_normalizer: bool,
    encode_special: bool,
    any_single_word: bool,
    pass1_prefixes: HashSet<&'a str>,
}

impl CutContext<'_> {
    /// The per-token rules (the substring rule is checked by the caller).
    fn allows(&self, t: &AddedToken) -> bool {
        let (Some(first), Some(last)) = (t.content.chars().next(), t.content.chars().last()) else {
            return false;
        };
        if t.single_word || t.lstrip || t.rstrip || (t.special && self.encode_special) {
            return false;
        }
        if first.is_whitespace() || last.is_whitespace() || (self.any_single_word && is_word_char(last)) {
            return false;
        }
        if !t.normalized {
            return true;
        }
        // A pass-2 token: matched on the raw text only under the identity normalizer, and no
        // pass-1 token may start inside it.
        self.identity_normalizer
            && !t.content.char_indices().skip(1).any(|(k, _)| self.pass1_prefixes.contains(&t.content[k..]))
    }
}

/// What [`encode`] made of a text.
pub(crate) enum Encoded {
    Done(TokenizedText),
    /// The text has more than the limit's tokens: segments were tokenized (exactly, by the
    /// claim) until the running count passed it, and the rest was not tokenized. `counted` is
    /// a lower bound on the text's tokens (the frame included).
    OverLimit {
        counted: usize,
    },
}

/// Tokenizes `text` reusing cached prefixes, or `None` when the text cannot be cut (the caller
/// then tokenizes in full and counts a bypass). With `limit`, stops at the first cut point past
/// `limit` tokens: the ids up to a cut point are the whole text's first ids, so the count there
/// is exact and the text is over the limit whatever follows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode(
    plan: &CutPlan,
    tokenizer: &Tokenizer,
    cache: &PrefixCache,
    model: u64,
    text: &str,
    add_special_tokens: bool,
    with_offsets: bool,
    limit: Option<usize>,
) -> tokenizers::Result<Option<Encoded>> {
    if !cache.enabled() || (with_offsets && !plan.frame.offsets_exact) {
        return Ok(None);
    }
    // Candidates: every occurrence of a cut token's content (a superset of the cut points).
    let mut candidates = plan.finder.occurrences(text, MAX_CANDIDATES + 1);
    if candidates.is_empty() || candidates.len() > MAX_CANDIDATES {
        return Ok(None);
    }
    candidates.sort_unstable_by_key(|&(_, end)| end);
    candidates.dedup_by_key(|&mut (_, end)| end);
    let mut hasher = cache.prefix_hasher(model, with_offsets);
    let mut hashed = 0;
    let keys: Vec<(usize, u64)> = candidates
        .iter()
        .map(|&(_, end)| {
            hasher.update(&text.as_bytes()[hashed..end]);
            hashed = end;
            (end, hasher.digest())
        })
        .collect();
    let key_at = |end: usize| keys.binary_search_by_key(&end, |&(e, _)| e).ok().map(|i| keys[i].1);

    let hit = cache.longest_prefix(model, with_offsets, text, &keys, MAX_PROBES);
    let mut out = TokenizedText { ids: Vec::new(), offsets: Vec::new() };
    // The position and character count the next segment starts at, and the cut token before it.
    let (mut at, mut at_chars) = (0usize, 0usize);
    let mut lead: Option<(usize, u32)> = None;
    if let Some(CachedPrefix { end, chain, .. }) = &hit {
        // The reused ids in one allocation (the new text's few are appended after).
        out.ids.reserve(chain.iter().map(|node| node.ids.len()).sum::<usize>() + (text.len() - end) / 2);
        for node in chain {
            out.ids.extend_from_slice(&node.ids);
            if with_offsets {
                let base = at_chars as u32;
                out.offsets.extend(node.offsets.iter().map(|&(s, e)| (s + base, e + base)));
                at_chars += node.text.chars().count();
            }
        }
        at = *end;
        let m_start = candidates.binary_search_by_key(end, |&(_, e)| e).ok().map(|i| candidates[i].0);
        match (m_start, out.ids.last()) {
            (Some(m_start), Some(&id)) => lead = Some((m_start, id)),
            _ => return Ok(None),
        }
    }
    let reused = out.ids.len();
    let frame_len = if add_special_tokens { plan.frame.prefix.len() + plan.frame.suffix.len() } else { 0 };
    let over = |n: usize| limit.is_some_and(|limit| n + frame_len > limit);
    if over(reused) {
        return Ok(Some(Encoded::OverLimit { counted: reused + frame_len }));
    }

    let cuts = if candidates.iter().any(|&(start, _)| start >= at) {
        plan.cuts_after(tokenizer, text, lead.map_or(at, |(m_start, _)| m_start), at)
    } else {
        Vec::new()
    };
    // Segments ending at these cut points become cache nodes; the rest of the text is a tail.
    let mut bounds: Vec<Cut> = Vec::new();
    let mut last = at;
    for (i, cut) in cuts.iter().enumerate() {
        if cut.end - last >= MIN_NODE_BYTES || i + 1 == cuts.len() {
            bounds.push(*cut);
            last = cut.end;
        }
    }

    let mut new_nodes: Vec<(u64, Node)> = Vec::with_capacity(bounds.len());
    let mut parent = hit.as_ref().and_then(|h| h.keys.last().copied());
    let mut storing = true;
    let segment_ends = bounds.iter().map(|c| Some(*c)).chain((last < text.len()).then_some(None));
    for bound in segment_ends {
        let end = bound.map_or(text.len(), |c| c.end);
        let Some(segment) = encode_segment(tokenizer, text, at, end, lead, with_offsets)? else {
            tracing::warn!("incremental tokenization: a segment did not start with its cut token; tokenizing in full");
            return Ok(None);
        };
        let base = at_chars as u32;
        out.ids.extend_from_slice(&segment.ids);
        if over(out.ids.len()) {
            match &hit {
                Some(_) => cache.record_hit(reused, out.ids.len() - reused),
                None => cache.record_miss(out.ids.len() - reused),
            }
            return Ok(Some(Encoded::OverLimit { counted: out.ids.len() + frame_len }));
        }
        if with_offsets {
            out.offsets.extend(segment.offsets.iter().map(|&(s, e)| (s + base, e + base)));
            at_chars += text[at..end].chars().count();
        }
        if let Some(cut) = bound {
            let key = key_at(cut.end);
            storing &= key.is_some();
            if let (true, Some(key)) = (storing, key) {
                new_nodes.push((
                    key,
                    Node {
                        model,
                        with_offsets,
                        start: at,
                        parent,
                        text: text[at..end].into(),
                        ids: segment.ids.into_boxed_slice(),
                        offsets: segment.offsets.into_boxed_slice(),
                    },
                ));
                parent = Some(key);
            }
            lead = Some((cut.m_start, cut.id));
        }
        at = end;
    }

    let tokenized = out.ids.len() - reused;
    match &hit {
        Some(h) => {
            cache.record_hit(reused, tokenized);
            cache.store(new_nodes, &h.keys);
        }
        None => {
            cache.record_miss(tokenized);
            cache.store(new_nodes, &[]);
        }
    }
    Ok(Some(Encoded::Done(if add_special_tokens { plan.frame.wrap(out, with_offsets) } else { out })))
}

/// Ids (and offsets relative to `start`, in characters) of `text[start..end]`, tokenized behind
/// its cut token `lead` (`(m_start, id)`) when it does not begin the text. `None` if the first
/// token is not the cut token, which the module's claim rules out.
fn encode_segment(
    tokenizer: &Tokenizer,
    text: &str,
    start: usize,
    end: usize,
    lead: Option<(usize, u32)>,
    with_offsets: bool,
) -> tokenizers::Result<Option<TokenizedText>> {
    let from = lead.map_or(start, |(m_start, _)| m_start);
    let piece = &text[from..end];
    let encoding = if with_offsets {
        tokenizer.encode_char_offsets(piece, false)?
    } else {
        tokenizer.encode_fast(piece, false)?
    };
    let mut ids = encoding.get_ids();
    let mut offsets = encoding.get_offsets();
    let mut shift = 0u32;
    if let Some((m_start, id)) = lead {
        if ids.first() != Some(&id) {
            return Ok(None);
        }
        ids = &ids[1..];
        offsets = &offsets[1..];
        shift = text[m_start..start].chars().count() as u32;
    }
    let offsets = if with_offsets {
        let shifted: Option<Vec<(u32, u32)>> = offsets
            .iter()
            .map(|&(s, e)| Some(((s as u32).checked_sub(shift)?, (e as u32).checked_sub(shift)?)))
            .collect();
        match shifted {
            Some(shifted) => shifted,
            None => return Ok(None),
        }
    } else {
        Vec::new()
    };
    Ok(Some(TokenizedText { ids: ids.to_vec(), offsets }))
}
