//! Token counters: exact BPE counts for OpenAI encodings, counts from any Hugging Face
//! `tokenizer.json`, and the characters/4 estimate ([`cairn_core::CharEstimateCounter`]).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::Mutex;

use cairn_core::TokenCounter;

use crate::{HarnessError, Result};

/// Exact counts for an OpenAI encoding (tiktoken-rs; the BPE ranks ship inside the crate).
///
/// Counts of texts up to `MEMO_MAX_TEXT` bytes are remembered (keyed by a 64-bit hash of
/// the text, at most `MEMO_ENTRIES` of them, forgotten all at once when full): context
/// assembly counts the same turns and summaries again on every call, and the regex
/// pre-tokenizer was a third of its time.
pub struct TiktokenCounter {
    bpe: tiktoken_rs::CoreBPE,
    name: &'static str,
    overhead: usize,
    memo: Mutex<HashMap<u64, usize>>,
}

/// Texts longer than this are counted every time.
pub const MEMO_MAX_TEXT: usize = 16 * 1024;
/// The most counts remembered.
pub const MEMO_ENTRIES: usize = 1 << 16;

impl std::fmt::Debug for TiktokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TiktokenCounter")
            .field("encoding", &self.name)
            .field("overhead", &self.overhead)
            .finish()
    }
}

impl TiktokenCounter {
    /// cl100k_base (GPT-4, GPT-3.5), with the chat format's 4 tokens per message.
    pub fn cl100k() -> Result<Self> {
        Ok(Self {
            bpe: tiktoken_rs::cl100k_base().map_err(|e| HarnessError::Config(e.to_string()))?,
            name: "cl100k_base",
            overhead: 4,
            memo: Mutex::default(),
        })
    }

    /// o200k_base (GPT-4o and later), with 4 tokens per message.
    pub fn o200k() -> Result<Self> {
        Ok(Self {
            bpe: tiktoken_rs::o200k_base().map_err(|e| HarnessError::Config(e.to_string()))?,
            name: "o200k_base",
            overhead: 4,
            memo: Mutex::default(),
        })
    }

    /// Sets the per-message overhead.
    pub fn with_overhead(mut self, tokens: usize) -> Self {
        self.overhead = tokens;
        self
    }
}

impl TokenCounter for TiktokenCounter {
    fn name(&self) -> &str {
        self.name
    }

    fn count(&self, text: &str) -> usize {
        if text.len() > MEMO_MAX_TEXT {
            return self.bpe.encode_ordinary(text).len();
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        let key = h.finish();
        let lock = || self.memo.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = lock().get(&key) {
            return *n;
        }
        let n = self.bpe.encode_ordinary(text).len();
        let mut m = lock();
        if m.len() >= MEMO_ENTRIES {
            m.clear();
        }
        m.insert(key, n);
        n
    }

    fn newline_additive(&self) -> bool {
        // cl100k_base ends a pre-token piece at every newline
        // (`newline_additive_on_awkward_lines` checks it). o200k_base does not: a piece of
        // punctuation takes the newline after it and the slashes that start the next line
        // (`]\n/reset` is one piece less than `]\n` and `/reset` apart), so a context
        // counted with it is counted again whole.
        self.name == "cl100k_base"
    }

    fn message_overhead(&self) -> usize {
        self.overhead
    }
}

/// Counts with a Hugging Face `tokenizer.json` (for example the embedding model's, or a
/// local LLM's), without special tokens.
pub struct HfTokenCounter {
    tokenizer: tokenizers::Tokenizer,
    name: String,
    overhead: usize,
}

impl std::fmt::Debug for HfTokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenCounter")
            .field("name", &self.name)
            .finish()
    }
}

impl HfTokenCounter {
    /// Loads `tokenizer.json`; truncation and padding are turned off so counts are exact.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let mut tokenizer = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| HarnessError::Config(format!("{}: {e}", path.display())))?;
        tokenizer
            .with_truncation(None)
            .map_err(|e| HarnessError::Config(e.to_string()))?;
        tokenizer.with_padding(None);
        Ok(Self {
            tokenizer,
            name: path.display().to_string(),
            overhead: 0,
        })
    }

    /// Sets the per-message overhead.
    pub fn with_overhead(mut self, tokens: usize) -> Self {
        self.overhead = tokens;
        self
    }
}

impl TokenCounter for HfTokenCounter {
    fn name(&self) -> &str {
        &self.name
    }

    fn count(&self, text: &str) -> usize {
        self.tokenizer
            .encode(text, false)
            .map(|e| e.len())
            // A text the tokenizer rejects is counted by the estimate rather than as zero.
            .unwrap_or_else(|_| text.chars().count().div_ceil(4))
    }

    fn message_overhead(&self) -> usize {
        self.overhead
    }
}

/// A running total of message token counts: adding or removing a message costs one count
/// of that message, never a recount of the buffer.
#[derive(Debug, Clone, Default)]
pub struct RunningTotal {
    counts: std::collections::VecDeque<usize>,
    total: usize,
}

impl RunningTotal {
    /// Appends a message's count.
    pub fn push(&mut self, tokens: usize) {
        self.counts.push_back(tokens);
        self.total += tokens;
    }

    /// Removes the oldest message's count.
    pub fn pop_front(&mut self) -> Option<usize> {
        let c = self.counts.pop_front()?;
        self.total -= c;
        Some(c)
    }

    /// The sum.
    pub fn total(&self) -> usize {
        self.total
    }

    /// How many messages are counted.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// True when nothing is counted.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.counts.clear();
        self.total = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as context assembly writes them (one line each, ending in a newline, not blank)
    /// count the same joined as apart, however they start and end.
    #[test]
    fn newline_additive_on_awkward_lines() {
        let lines = [
            "Caroline: Hey Mel!\n",
            " leading space\n",
            "\t tab first\n",
            "trailing spaces   \n",
            "?!\n",
            "123\n",
            " 456\n",
            "émoji 🎉 ok\n",
            "\u{a0}no-break space\n",
            "'s a contraction\n",
            "'ll\n",
            "ends with punctuation...\n",
            "x\n",
            "[2023-05-08]\n",
            "[2023-05-08; also on Jun 1]\n",
            "[2023-05-08; also on May 9,31, Jun 1]\n",
            "[2022-12-30; also on 2023: May 8,9, Jun 1; 2024: Jan 5]\n",
            "/reset\n",
            "//comment\n",
        ];
        let o200k = TiktokenCounter::o200k().unwrap();
        assert!(!o200k.newline_additive());
        assert_ne!(
            o200k.count("[2023-05-08]\n/reset\n"),
            o200k.count("[2023-05-08]\n") + o200k.count("/reset\n")
        );
        let c = TiktokenCounter::cl100k().unwrap();
        assert!(c.newline_additive());
        for a in lines {
            for b in lines {
                let joined = format!("{a}{b}");
                assert_eq!(c.count(&joined), c.count(a) + c.count(b), "{joined:?}");
            }
        }
        // A blank line would merge with the newline before it (which is why blank
        // contents are refused).
        assert_ne!(c.count("a\n  \n"), c.count("a\n") + c.count("  \n"));
    }

    #[test]
    fn exact_openai_counts() {
        let c = TiktokenCounter::cl100k().unwrap();
        assert_eq!(c.count("hello world"), 2);
        assert_eq!(c.count(""), 0);
        assert_eq!(c.count_message("hello world"), 6);
        let o = TiktokenCounter::o200k().unwrap();
        assert_eq!(o.count("hello world"), 2);
        // The encodings differ on real text.
        let text = "Reciprocal rank fusion merges rankings from BM25 and dense retrieval.";
        assert!(c.count(text) > 8 && o.count(text) > 8);
    }

    #[test]
    fn running_total_is_incremental() {
        let mut r = RunningTotal::default();
        r.push(3);
        r.push(5);
        assert_eq!(r.total(), 8);
        assert_eq!(r.pop_front(), Some(3));
        assert_eq!(r.total(), 5);
        r.clear();
        assert!(r.is_empty());
    }
}
