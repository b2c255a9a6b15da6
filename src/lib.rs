//! Cairn: a hierarchical, vector-backed memory store for LLM agents.
//!
//! Every memory (conversation turns, knowledge, tool logs, ...) is a row in SQLite with its
//! embedding; an HNSW index serves semantic search; summaries over memories — and summaries
//! over summaries — are linked both ways, so an agent works with a compressed context and
//! drills down to the exact source turns on demand.
//!
//! This crate only re-exports the workspace's crates:
//! [`cairn_core`] (types and traits), [`cairn_store`] (SQLite + HNSW engine),
//! [`cairn_embed`] (local MiniLM embeddings) and [`cairn_harness`] (the async API).
//!
//! ```no_run
//! use cairn::{MemoryHarness, Role, SearchOptions};
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mem = MemoryHarness::open("memory.db").await?; // SQLite file + local MiniLM model
//! let q = mem.add_conversational("chat-123", Role::User, "What is the GIL?").await?;
//! let a = mem.add_conversational("chat-123", Role::Assistant, "Python's global interpreter lock.").await?;
//! let s = mem.add_summary("User asked about the GIL.", &[q, a], Some("chat-123")).await?;
//! let sources = mem.expand_summary(s).await?;
//! let hits = mem.search("python concurrency", SearchOptions::summaries()).await?;
//! # Ok(())
//! # }
//! ```

pub use cairn_core as core;
pub use cairn_embed as embed;
pub use cairn_harness as harness;
pub use cairn_store as store;

pub use cairn_core::{
    Clock, Embedder, InputError, ManualClock, MemoryId, MemoryKind, MemoryUnit, Metadata,
    NewMemory, Role, SummarizeError, Summarizer, SummaryInfo, SummaryItem, SummaryRequest,
    SummaryType, SystemClock, ThreadId, TokenCounter,
};
pub use cairn_embed::{CachedEmbedder, FastEmbedder};
pub use cairn_harness::*;
pub use cairn_store::{Store, StoreError, StoreOptions};
