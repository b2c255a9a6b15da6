//! `MemoryHarness`, the async API of Cairn: memories of every kind, summaries linked both
//! ways to their sources, expansion through every level, search (vector, keyword, hybrid),
//! deletion policies, and the summarizers and token counters they use.
//!
//! Everything blocking (SQLite, ONNX inference, index work) runs on tokio's blocking pool.
//!
//! ```
//! use std::sync::Arc;
//! use cairn_core::Role;
//! use cairn_harness::{MemoryHarness, SearchOptions};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! # let embedder = Arc::new(cairn_embed::HashEmbedder::new(64));
//! // `MemoryHarness::open(path)` uses the local MiniLM model; this example uses a test embedder.
//! let mem = MemoryHarness::builder(dir.path().join("memory.db")).embedder(embedder).build().await?;
//! let q = mem.add_conversational("chat-1", Role::User, "What is the GIL?").await?;
//! let a = mem.add_conversational("chat-1", Role::Assistant, "Python's global interpreter lock.").await?;
//! let s = mem.add_summary("User asked about the GIL; it is Python's global interpreter lock.", &[q, a], Some("chat-1")).await?;
//! assert_eq!(mem.expand_summary(s).await?.len(), 2);
//! assert_eq!(mem.summaries_of(q).await?[0].id, s);
//! let hits = mem.search("interpreter lock", SearchOptions::summaries()).await?;
//! assert_eq!(hits[0].memory.id, s);
//! # Ok(())
//! # }
//! ```

pub mod backup;
mod consolidate;
mod context;
mod conversation;
mod error;
mod extractive;
mod forget;
mod harness;
pub mod import;
mod openai;
mod recall;
pub mod text;
mod tokens;

pub use backup::{BackupError, BackupHeader, BackupImport, BackupRecord, BACKUP_VERSION};
pub use consolidate::{parse_duration, ChunkFailure, ConsolidationPolicy, ConsolidationReport};
pub use context::{
    AssembledContext, ChatMessage, ContextItem, ContextOptions, ContextScope, RecalledBlockCost,
    Repeat, Section,
};
pub use conversation::{
    AutoContextOptions, AutoContextSummarizer, CompletedSummary, ContextMessage, ConversationStats,
    MemoryValue, PendingSummary, RunningSummaryMemory, RunningSummaryOptions, SummarizeOutcome,
    SummaryBufferMemory, SummaryBufferOptions, ToolCall, SUMMARY_SEPARATOR,
};
pub use error::{HarnessError, Result};
pub use extractive::{sentences, summary_keywords, ExtractiveSummarizer};
pub use forget::{Forget, ForgetReport, UpsertOutcome, Upserted};
pub use harness::{
    display_location, fuse, fuse_ids, fuse_weighted, infer_summary_type, is_postgres_url,
    schema_of, with_schema, HarnessBuilder, HarnessStats, MemoryHarness, SearchHit, SearchMode,
    SearchOptions, SummaryTree, MAX_TREE_DEPTH, RRF_K,
};
pub use openai::{
    render_transcript, OpenAiBuilder, OpenAiSummarizer, PromptTemplate, RollupTemplate, DATE_RANGE,
    DEFAULT_ROLLUP_TEMPLATE, DEFAULT_TEMPLATE, LEVEL, NEW_LINES, PREVIOUS,
};
pub use recall::RecallWeights;
pub use tokens::{HfTokenCounter, RunningTotal, TiktokenCounter};

pub use cairn_store::{
    Cursor, DeletePolicy, DeleteReport, Filter, HnswParams, MetaFilter, NewSummary, Page,
    StoreStats,
};
