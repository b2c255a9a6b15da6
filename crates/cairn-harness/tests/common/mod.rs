//! Fixtures shared by the consolidation and reliability tests: a harness with the hashing
//! test embedder and a fixed clock, a slow summarizer, and summary trees as comparable
//! strings.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use cairn_core::{
    Embedder, ManualClock, MemoryKind, SummarizeError, Summarizer, SummaryRequest, ThreadId,
};
use cairn_embed::HashEmbedder;
use cairn_harness::{ExtractiveSummarizer, Filter, MemoryHarness, SummaryTree};
use chrono::{DateTime, Utc};

/// The fixed "now" of these tests.
pub fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(1_750_000_000, 0).unwrap()
}

/// The deterministic 64-dimension test embedder.
pub fn embedder() -> Arc<dyn Embedder> {
    Arc::new(HashEmbedder::new(64))
}

/// A harness at `path` with the test embedder, a clock fixed at [`now`], and `summarizer`
/// (the extractive one when `None`).
pub async fn harness(
    path: &std::path::Path,
    summarizer: Option<Arc<dyn Summarizer>>,
) -> MemoryHarness {
    let e = embedder();
    MemoryHarness::builder(path)
        .embedder(e.clone())
        .clock(Arc::new(ManualClock::new(now())))
        .summarizer(summarizer.unwrap_or_else(|| Arc::new(ExtractiveSummarizer::new(e))))
        .build()
        .await
        .unwrap()
}

/// An extractive summarizer that sleeps before answering.
pub struct Slow(pub Duration, pub ExtractiveSummarizer);

#[async_trait]
impl Summarizer for Slow {
    fn name(&self) -> &str {
        "slow"
    }
    async fn summarize(&self, r: &SummaryRequest) -> Result<String, SummarizeError> {
        tokio::time::sleep(self.0).await;
        self.1.summarize(r).await
    }
}

/// A summary tree as a string: content, then the children's strings in order.
pub fn signature(tree: &SummaryTree) -> String {
    if tree.children.is_empty() {
        return tree.memory.content.clone();
    }
    let kids: Vec<String> = tree.children.iter().map(signature).collect();
    format!("{}<{}>", tree.memory.content, kids.join("|"))
}

/// The signatures of the top summaries (those no summary cites), of one thread or of all.
pub async fn forest(mem: &MemoryHarness, thread: Option<&str>) -> BTreeSet<String> {
    let mut filter = Filter::all().kinds([MemoryKind::Summary]);
    if let Some(t) = thread {
        filter = filter.thread(ThreadId::new(t).unwrap());
    }
    let all = mem.list(filter, 0, usize::MAX).await.unwrap();
    let mut out = BTreeSet::new();
    for s in all {
        if mem.summaries_of(s.id).await.unwrap().is_empty() {
            out.insert(signature(&mem.summary_tree(s.id).await.unwrap()));
        }
    }
    out
}
