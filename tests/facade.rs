//! The facade crate end to end: everything a user needs is reachable through `cairn::`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use cairn::embed::HashEmbedder;
use cairn::{
    ConsolidationPolicy, ManualClock, MemoryHarness, NewMemory, Role, SearchOptions, ThreadId,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_through_the_facade() {
    let dir = tempfile::tempdir().unwrap();
    let now = chrono::DateTime::from_timestamp(1_750_000_000, 0).unwrap();
    let mem = MemoryHarness::builder(dir.path().join("facade.db"))
        .embedder(Arc::new(HashEmbedder::new(64)))
        .clock(Arc::new(ManualClock::new(now)))
        .build()
        .await
        .unwrap();
    let thread = ThreadId::new("f").unwrap();
    let turns = (0..30)
        .map(|i| {
            NewMemory::conversational(
                thread.clone(),
                Role::User,
                format!("turn {i} about gardening."),
            )
            .at(now - chrono::Duration::days(9) + chrono::Duration::minutes(i))
        })
        .collect();
    let ids = mem.add_many(turns).await.unwrap();
    let report = mem
        .consolidate(ConsolidationPolicy::older_than(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert_eq!(report.chunks(), 2, "{report}");
    let top = report.summaries[0];
    assert_eq!(mem.expand_summary(top).await.unwrap()[0].id, ids[0]);
    assert_eq!(mem.summaries_of(ids[0]).await.unwrap()[0].id, top);
    let hits = mem
        .search("gardening", SearchOptions::summaries())
        .await
        .unwrap();
    assert!(!hits.is_empty() && hits.len() <= 3);
    let ctx = mem.assemble_context("f", "gardening", 200).await.unwrap();
    assert!(ctx.tokens <= 200);
    assert_eq!(ctx.items.last().unwrap().id, ids[29]);
}
