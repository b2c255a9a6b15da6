//! Hierarchical summaries: daily summaries, a weekly summary over them, expansion down to the
//! raw messages, and back-links up from a raw message to the weekly summary.
//!
//! `cargo run --release --example hierarchical` (local MiniLM model, temporary store).

use anyhow::Context;
use cairn::{MemoryHarness, NewMemory, NewSummary, Role, SummaryType, ThreadId};

const DAYS: [(&str, [&str; 4]); 5] = [
    (
        "Monday",
        [
            "Kickoff for the search feature.",
            "We agreed to use BM25 plus vectors.",
            "Alice owns the ranking code.",
            "Deadline is Friday.",
        ],
    ),
    (
        "Tuesday",
        [
            "Alice benchmarked BM25 on the test set.",
            "Recall was 0.74.",
            "Bob tried dense retrieval.",
            "Dense got 0.73.",
        ],
    ),
    (
        "Wednesday",
        [
            "We fused both with reciprocal rank fusion.",
            "Fusion reached 0.83 recall.",
            "Latency stayed under 10 ms.",
            "Bob wrote the docs.",
        ],
    ),
    (
        "Thursday",
        [
            "Code review of the fusion module.",
            "Two bugs fixed in tokenization.",
            "Carol added tests.",
            "Staging deploy went fine.",
        ],
    ),
    (
        "Friday",
        [
            "Release to production.",
            "Monitoring shows no errors.",
            "The team demoed it to sales.",
            "Retro scheduled for Monday.",
        ],
    ),
];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mem = MemoryHarness::open(dir.path().join("hierarchical.db")).await?;
    let thread = ThreadId::new("team-chat")?;
    let monday =
        chrono::DateTime::parse_from_rfc3339("2026-11-02T09:00:00Z")?.with_timezone(&chrono::Utc);
    let mut daily = Vec::new();
    let mut first_raw = None;
    for (d, (day, lines)) in DAYS.iter().enumerate() {
        let batch = lines
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let at = monday
                    + chrono::Duration::days(d as i64)
                    + chrono::Duration::minutes(i as i64 * 30);
                NewMemory::conversational(thread.clone(), Role::User, *text).at(at)
            })
            .collect();
        let ids = mem.add_many(batch).await?;
        first_raw.get_or_insert(ids[0]);
        let text = format!("{day}: {}", lines.join(" "));
        let s = mem
            .add_summary_with(
                NewSummary::new(text, ids)
                    .with_thread(Some(thread.clone()))
                    .with_type(SummaryType::Session),
            )
            .await?;
        println!("daily summary for {day}: level {}", s.level);
        daily.push(s.id);
    }
    let weekly = mem
        .add_summary(
            "Week of Nov 2: the search feature shipped; BM25 (0.74) and dense (0.73) were fused with RRF (0.83), reviewed, tested and released Friday.",
            &daily,
            Some(thread.as_str()),
        )
        .await?;
    let w = mem.get(weekly).await?;
    println!(
        "weekly summary: level {}, covers {} .. {}",
        w.level,
        w.summary
            .as_ref()
            .map(|s| s.time_range_start)
            .unwrap_or_default(),
        w.summary
            .as_ref()
            .map(|s| s.time_range_end)
            .unwrap_or_default()
    );

    let tree = mem.summary_tree(weekly).await?;
    println!("tree: depth {}, {} nodes", tree.depth(), tree.len());
    let leaves = mem.expand_to_leaves(weekly).await?;
    println!(
        "expand_to_leaves: {} raw messages, first {:?}, last {:?}",
        leaves.len(),
        leaves[0].content,
        leaves[leaves.len() - 1].content
    );
    assert_eq!(leaves.len(), 20);

    let raw = first_raw.context("no messages were added")?;
    let up = mem.ancestors(raw).await?;
    println!("back-links from {:?}:", mem.get(raw).await?.content);
    for s in &up {
        println!(
            "  level {}: {}",
            s.level,
            s.content.chars().take(70).collect::<String>()
        );
    }
    assert_eq!(up.last().map(|s| s.id), Some(weekly));
    assert_eq!(mem.summaries_of(raw).await?[0].id, daily[0]);
    Ok(())
}
