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
        self.embed(&[text])?
            .pop()
            .ok_or_else(|| EmbedError::Inference("the embedder returned no vector".into()))
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
    /// When it happened.
    pub created_at: DateTime<Utc>,
    /// The text.
    pub content: String,
}

/// What a summarizer is asked to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryRequest {
    /// A summary to extend, if there is one (a moving summary).
    pub previous: Option<String>,
    /// The new items, in order.
    pub items: Vec<SummaryItem>,
    /// The most tokens the summary should take.
    pub max_tokens: usize,
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
    /// pre-tokenizer ends a piece at every newline (cl100k_base, o200k_base). Context
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
    fn char_estimate() {
        let c = CharEstimateCounter { overhead: 3 };
        assert_eq!(c.count(""), 0);
        assert_eq!(c.count("abcd"), 1);
        assert_eq!(c.count("abcde"), 2);
        assert_eq!(c.count_message("abcd"), 4);
    }
}
