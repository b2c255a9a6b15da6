use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{EmbedError, MemoryKind, Role, SummarizeError};

/// Turns text into unit-length vectors.
///
/// `embed` blocks (model inference): async callers must run it off the runtime's worker
/// threads, for example with `tokio::task::spawn_blocking`.
pub trait Embedder: Send + Sync {
    /// Identifies the model; stored in the database as part of its identity.
    fn model_id(&self) -> &str;

    /// Number of dimensions of every vector.
    fn dim(&self) -> usize;

    /// Embeds a batch of texts, one L2-normalised vector per text, in order. Empty or blank
    /// text is an [`EmbedError::Input`] error.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError>;

    /// Embeds one text.
    fn embed_one(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        self.embed_checked(&[text])?
            .pop()
            .ok_or_else(|| EmbedError::Inference("the embedder returned no vector".into()))
    }

    /// [`Self::embed`], checked: one vector per text, each of [`Self::dim`] dimensions, or
    /// an [`EmbedError::Inference`] saying what came back (never a short or ragged batch).
    fn embed_checked(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let vectors = self.embed(texts)?;
        if vectors.len() != texts.len() {
            return Err(EmbedError::Inference(format!(
                "the embedder returned {} vectors for {} texts",
                vectors.len(),
                texts.len()
            )));
        }
        if let Some(v) = vectors.iter().find(|v| v.len() != self.dim()) {
            return Err(EmbedError::Inference(format!(
                "the embedder returned a vector of {} dimensions, expected {}",
                v.len(),
                self.dim()
            )));
        }
        Ok(vectors)
    }
}

/// One item handed to a summarizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryItem {
    /// What the item is.
    pub kind: MemoryKind,
    /// Who said it, when known.
    pub role: Option<Role>,
    /// A speaker name, when known (from metadata).
    pub speaker: Option<String>,
    /// When it happened (for a summary: when its newest source happened).
    pub created_at: DateTime<Utc>,
    /// For a summary, when its oldest source happened; `None` for a single moment.
    #[serde(default)]
    pub time_start: Option<DateTime<Utc>>,
    /// The text.
    pub content: String,
}

/// How many documents (turns) of a body of text (a thread) each word occurs in: the rarity
/// of words, for summarizers that weigh what a sentence tells.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TermStats {
    docs: u32,
    df: HashMap<String, u32>,
}

impl TermStats {
    /// Empty statistics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one document given its words (repeats within it count once).
    pub fn add_doc<I, S>(&mut self, words: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.docs = self.docs.saturating_add(1);
        let mut seen: Vec<String> = words.into_iter().map(Into::into).collect();
        seen.sort_unstable();
        seen.dedup();
        for w in seen {
            let n = self.df.entry(w).or_default();
            *n = n.saturating_add(1);
        }
    }

    /// Documents counted.
    pub fn docs(&self) -> u32 {
        self.docs
    }

    /// Documents that hold `word`.
    pub fn doc_freq(&self, word: &str) -> u32 {
        self.df.get(word).copied().unwrap_or(0)
    }

    /// Inverse document frequency `ln((docs + 1) / (df + 0.5))`: about 0 for a word in every
    /// document, highest for a word never seen.
    pub fn idf(&self, word: &str) -> f32 {
        let docs = f64::from(self.docs) + 1.0;
        let df = f64::from(self.doc_freq(word)) + 0.5;
        #[allow(clippy::cast_possible_truncation)]
        let v = (docs / df).ln().max(0.0) as f32;
        v
    }
}

/// What a summarizer is asked to do.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SummaryRequest {
    /// A summary to extend, if there is one (a moving summary).
    pub previous: Option<String>,
    /// The new items, in order.
    pub items: Vec<SummaryItem>,
    /// The most tokens the summary should take.
    pub max_tokens: usize,
    /// The level of the summary being written: 1 over raw memories, 2 and up over summaries;
    /// 0 when it is not part of a tree (a moving summary).
    #[serde(default)]
    pub level: u32,
    /// The rarity of words in the thread the items come from, when the caller knows it
    /// (consolidation does); summarizers that need it otherwise count the items themselves.
    #[serde(skip)]
    pub term_stats: Option<Arc<TermStats>>,
}

impl SummaryRequest {
    /// The time span the items cover: the earliest start and the latest time.
    pub fn time_range(&self) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        let start = self
            .items
            .iter()
            .map(|i| i.time_start.unwrap_or(i.created_at).min(i.created_at))
            .min()?;
        let end = self.items.iter().map(|i| i.created_at).max()?;
        Some((start, end))
    }
}

/// Turns (previous summary, items) into summary text.
#[async_trait]
pub trait Summarizer: Send + Sync {
    /// A short name for reports.
    fn name(&self) -> &str;

    /// Writes the summary. A failure must leave the caller's data untouched; callers never
    /// delete or hide sources because of a summary that was not produced.
    async fn summarize(&self, request: &SummaryRequest) -> Result<String, SummarizeError>;
}

/// Counts tokens the way a given model does.
pub trait TokenCounter: Send + Sync {
    /// A short name (the encoding or tokenizer).
    fn name(&self) -> &str;

    /// Tokens in `text`.
    fn count(&self, text: &str) -> usize;

    /// Extra tokens each chat message costs (role markers); 0 by default.
    fn message_overhead(&self) -> usize {
        0
    }

    /// Whether lines that each end in a newline (and hold something besides whitespace)
    /// count, joined, as the sum of their counts: true for BPE encodings whose
    /// pre-tokenizer ends a piece at every newline (cl100k_base; not o200k_base, whose
    /// punctuation pieces take the slashes that start the next line). Context
    /// assembly then adds line counts instead of recounting a block of recalled turns.
    /// Default false.
    fn newline_additive(&self) -> bool {
        false
    }

    /// Tokens for one chat message of `text`: the text plus the overhead.
    fn count_message(&self, text: &str) -> usize {
        self.count(text) + self.message_overhead()
    }
}

/// The rough estimate of one token per four characters (rounded up).
#[derive(Debug, Clone, Copy, Default)]
pub struct CharEstimateCounter {
    /// Extra tokens per message.
    pub overhead: usize,
}

impl TokenCounter for CharEstimateCounter {
    fn name(&self) -> &str {
        "chars/4"
    }

    fn count(&self, text: &str) -> usize {
        text.chars().count().div_ceil(4)
    }

    fn message_overhead(&self) -> usize {
        self.overhead
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn term_stats_count_documents_once_per_word() {
        let mut s = TermStats::new();
        s.add_doc(["dog", "dog", "park"]);
        s.add_doc(["dog"]);
        s.add_doc(["cat"]);
        assert_eq!(s.docs(), 3);
        assert_eq!(s.doc_freq("dog"), 2);
        assert_eq!(s.doc_freq("park"), 1);
        assert_eq!(s.doc_freq("fish"), 0);
        // Rarer words weigh more; none is negative.
        assert!(s.idf("fish") > s.idf("park") && s.idf("park") > s.idf("dog"));
        assert!(s.idf("dog") >= 0.0);
        assert_eq!(TermStats::new().docs(), 0);
    }

    #[test]
    fn time_range_spans_summary_items() {
        let at = |d: i64| chrono::DateTime::from_timestamp(1_700_000_000 + d * 86_400, 0).unwrap();
        let item = |start: Option<i64>, end: i64| SummaryItem {
            kind: MemoryKind::Summary,
            role: None,
            speaker: None,
            created_at: at(end),
            time_start: start.map(at),
            content: "x".into(),
        };
        let r = SummaryRequest {
            items: vec![item(Some(2), 3), item(None, 1), item(Some(5), 9)],
            ..Default::default()
        };
        assert_eq!(r.time_range(), Some((at(1), at(9))));
        assert_eq!(SummaryRequest::default().time_range(), None);
    }

    #[test]
    fn char_estimate() {
        let c = CharEstimateCounter { overhead: 3 };
        assert_eq!(c.count(""), 0);
        assert_eq!(c.count("abcd"), 1);
        assert_eq!(c.count("abcde"), 2);
        assert_eq!(c.count_message("abcd"), 4);
    }
}
