//! Progressive detail: 50 messages, the first 30 compressed into a summary, a search over
//! summaries, then expansion back to the exact turns.
//!
//! `cargo run --release --example progressive_detail` (uses the local MiniLM model; the store
//! lives in a temporary directory).

use anyhow::Context;
use cairn::{MemoryHarness, Role, SearchOptions};

const TOPICS: [&str; 5] = [
    "the Python GIL and why CPU-bound threads do not speed up",
    "switching the hot loop to multiprocessing with a process pool",
    "asyncio for the network calls instead of threads",
    "measuring the speed-up with perf counters",
    "deploying the new worker with a systemd unit",
];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mem = MemoryHarness::open(dir.path().join("progressive.db")).await?;
    let thread = "chat-42";
    let mut ids = Vec::new();
    for i in 0..50 {
        let topic = TOPICS[i / 10];
        let (role, text) = if i % 2 == 0 {
            (
                Role::User,
                format!("Question {i}: can you explain more about {topic}?"),
            )
        } else {
            (
                Role::Assistant,
                format!("Answer {i}: here is how {topic} works in practice."),
            )
        };
        ids.push(mem.add_conversational(thread, role, text).await?);
    }
    println!("added 50 messages to {thread}");

    // Compress the first 30 turns into one summary.
    let summary = "The user asked about the Python GIL (CPU-bound threads do not speed up), \
                   moved the hot loop to a multiprocessing pool, and used asyncio for network calls.";
    let sid = mem.add_summary(summary, &ids[..30], Some(thread)).await?;
    let s = mem.get(sid).await?;
    let info = s.summary.as_ref().context("not a summary")?;
    println!(
        "summary {sid}: level {}, {} sources, {} .. {}",
        s.level, info.source_count, info.time_range_start, info.time_range_end
    );

    // The compressed context: the summary plus the 20 turns after it.
    let recent = mem.get_conversational(thread, 20).await?;
    println!(
        "context = 1 summary + {} recent turns (instead of 50 turns)",
        recent.len()
    );

    // Search over summaries (k = 3 by default) finds it by meaning.
    let hits = mem
        .search(
            "python threading and the interpreter lock",
            SearchOptions::summaries(),
        )
        .await?;
    println!(
        "search over summaries: {} hit(s); best {:.3}: {}",
        hits.len(),
        hits[0].score,
        hits[0].memory.content
    );
    assert_eq!(hits[0].memory.id, sid);

    // Drill down: the exact turns behind the summary, in order.
    let details = mem.expand_summary(sid).await?;
    println!("expanded to {} turns; first and last:", details.len());
    println!("  {}", details[0].content);
    println!("  {}", details[details.len() - 1].content);
    assert_eq!(details.iter().map(|m| m.id).collect::<Vec<_>>(), ids[..30]);
    Ok(())
}
