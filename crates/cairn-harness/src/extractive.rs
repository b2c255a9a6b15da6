//! [`ExtractiveSummarizer`]: the embedded default, no LLM.
//!
//! Method:
//! 1. The items (and the previous summary, when extending one) are split into candidate
//!    units: sentences of raw memories, lines of summaries (a summary's lines already carry
//!    their speaker and date).
//! 2. Every unit is embedded; the centroid of the unit vectors stands for "what the chunk is
//!    about".
//! 3. Units are picked greedily by maximal marginal relevance:
//!    `λ·cos(unit, centroid) − (1 − λ)·max cos(unit, picked)` with λ = 0.7, so the summary
//!    covers the chunk's main content without repeating itself, until the token budget is
//!    spent.
//! 4. The picked units are written in their original order, one per line, each prefixed with
//!    its date and speaker: `[2023-05-08] Caroline: I went to a support group.` Who said
//!    what, and when, survives into every level above.
//!
//! Deterministic: the same input gives the same summary (embeddings are deterministic; ties
//! go to the earlier unit).

use std::sync::Arc;

use async_trait::async_trait;
use cairn_core::{
    CharEstimateCounter, Embedder, MemoryKind, SummarizeError, Summarizer, SummaryItem,
    SummaryRequest, TokenCounter,
};

/// Sentence-selection summarizer (centroid + maximal marginal relevance).
pub struct ExtractiveSummarizer {
    embedder: Arc<dyn Embedder>,
    counter: Arc<dyn TokenCounter>,
    lambda: f32,
}

impl std::fmt::Debug for ExtractiveSummarizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtractiveSummarizer")
            .field("model", &self.embedder.model_id())
            .field("lambda", &self.lambda)
            .finish()
    }
}

struct Unit {
    text: String,
    order: usize,
}

impl ExtractiveSummarizer {
    /// A summarizer that embeds with `embedder` and counts tokens as characters/4.
    pub fn new(embedder: Arc<dyn Embedder>) -> Self {
        Self {
            embedder,
            counter: Arc::new(CharEstimateCounter::default()),
            lambda: 0.7,
        }
    }

    /// Counts the budget with `counter`.
    pub fn with_token_counter(mut self, counter: Arc<dyn TokenCounter>) -> Self {
        self.counter = counter;
        self
    }

    /// Relevance against redundancy, in `[0, 1]` (default 0.7).
    pub fn with_lambda(mut self, lambda: f32) -> Self {
        self.lambda = lambda.clamp(0.0, 1.0);
        self
    }

    fn units(request: &SummaryRequest) -> Vec<Unit> {
        let mut out = Vec::new();
        if let Some(prev) = &request.previous {
            for line in prev.lines().map(str::trim).filter(|l| !l.is_empty()) {
                out.push(Unit {
                    text: line.to_owned(),
                    order: out.len(),
                });
            }
        }
        for item in &request.items {
            if item.kind == MemoryKind::Summary {
                for line in item
                    .content
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                {
                    out.push(Unit {
                        text: line.to_owned(),
                        order: out.len(),
                    });
                }
                continue;
            }
            let prefix = prefix(item);
            for s in sentences(&item.content) {
                out.push(Unit {
                    text: format!("{prefix}{s}"),
                    order: out.len(),
                });
            }
        }
        out
    }

    fn select(&self, units: &[Unit], vectors: &[Vec<f32>], budget: usize) -> Vec<usize> {
        let dim = vectors.first().map_or(0, Vec::len);
        let mut centroid = vec![0f32; dim];
        for v in vectors {
            for (c, x) in centroid.iter_mut().zip(v) {
                *c += x;
            }
        }
        let centroid = cairn_core::normalized(centroid).unwrap_or_else(|_| vec![0.0; dim]);
        let relevance: Vec<f32> = vectors.iter().map(|v| dot(v, &centroid)).collect();
        // 0 = open, 1 = picked, 2 = skipped (does not fit the remaining budget).
        let mut state = vec![0u8; units.len()];
        let mut max_sim = vec![0f32; units.len()];
        let mut picked: Vec<usize> = Vec::new();
        let mut used = 0usize;
        loop {
            let mut best: Option<(usize, f32)> = None;
            for i in (0..units.len()).filter(|i| state[*i] == 0) {
                let score = self.lambda * relevance[i] - (1.0 - self.lambda) * max_sim[i];
                if best.is_none_or(|(_, b)| score > b) {
                    best = Some((i, score));
                }
            }
            let Some((i, _)) = best else { break };
            let cost = self.counter.count(&units[i].text) + 1;
            if used + cost > budget {
                if picked.is_empty() {
                    // Nothing fits: the best unit alone, cut to the budget by the caller.
                    picked.push(i);
                    break;
                }
                state[i] = 2;
                continue;
            }
            used += cost;
            state[i] = 1;
            picked.push(i);
            for j in 0..units.len() {
                max_sim[j] = max_sim[j].max(dot(&vectors[i], &vectors[j]));
            }
        }
        picked.sort_by_key(|i| units[*i].order);
        picked
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn prefix(item: &SummaryItem) -> String {
    let who = item
        .speaker
        .clone()
        .or_else(|| {
            item.role.map(|r| {
                let s = r.as_str();
                let mut c = s.chars();
                c.next()
                    .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                    .unwrap_or_default()
            })
        })
        .unwrap_or_else(|| item.kind.as_str().to_owned());
    format!("[{}] {who}: ", item.created_at.format("%Y-%m-%d"))
}

/// Splits text into sentences at `.`, `!` or `?` followed by whitespace, and at newlines.
pub fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut start = 0;
        let chars: Vec<(usize, char)> = line.char_indices().collect();
        for (k, (i, c)) in chars.iter().enumerate() {
            if matches!(c, '.' | '!' | '?')
                && chars.get(k + 1).is_some_and(|(_, n)| n.is_whitespace())
            {
                let end = i + c.len_utf8();
                let s = line[start..end].trim();
                if !s.is_empty() {
                    out.push(s.to_owned());
                }
                start = end;
            }
        }
        let s = line[start..].trim();
        if !s.is_empty() {
            out.push(s.to_owned());
        }
    }
    out
}

#[async_trait]
impl Summarizer for ExtractiveSummarizer {
    fn name(&self) -> &str {
        "extractive"
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<String, SummarizeError> {
        let units = Self::units(request);
        if units.is_empty() {
            return Err(SummarizeError::NoInput);
        }
        let texts: Vec<String> = units.iter().map(|u| u.text.clone()).collect();
        let embedder = self.embedder.clone();
        let vectors = tokio::task::spawn_blocking(move || {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            embedder.embed(&refs)
        })
        .await
        .map_err(|e| SummarizeError::Other(e.to_string()))?
        .map_err(|e| SummarizeError::Other(format!("embedding sentences: {e}")))?;
        let budget = request.max_tokens.max(1);
        let picked = self.select(&units, &vectors, budget);
        let mut lines: Vec<String> = picked.iter().map(|i| units[*i].text.clone()).collect();
        // A single unit longer than the budget is cut to it.
        if lines.len() == 1 && self.counter.count(&lines[0]) > budget {
            let mut s = lines[0].clone();
            loop {
                let keep = s.chars().count() * 9 / 10;
                s = s.chars().take(keep).collect();
                let cut = format!("{}…", s.trim_end());
                if s.is_empty() || self.counter.count(&cut) <= budget {
                    lines[0] = cut;
                    break;
                }
            }
        }
        let out = lines.join("\n");
        if out.trim().is_empty() {
            return Err(SummarizeError::EmptyOutput);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentence_split() {
        assert_eq!(
            sentences("Hi there. How are you?  Fine!\nNew line e.g. 3.5 works"),
            vec![
                "Hi there.",
                "How are you?",
                "Fine!",
                "New line e.g.",
                "3.5 works"
            ]
        );
        assert!(sentences("   ").is_empty());
    }
}
