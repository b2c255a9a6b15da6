//! Conversation memories stay linear: 10,000 `save_context` calls on one thread.
//!
//! `cargo bench -p cairn-harness --bench conversation_linear [-- N]` saves N exchanges
//! (default 10,000) to a `SummaryBufferMemory` whose buffer folds on almost every save,
//! with the deterministic hashing embedder (64-d) and a fast deterministic summarizer (no
//! model, no network), and prints, per tenth of the run, the mean wall time and CPU time (all
//! threads of the process, from `/proc/self/stat` on Linux) per call, the summary links
//! written per call, and the time to open the memory again (restore) at that point.
//! Flat columns mean linear totals: each fold writes the previous version plus the folded
//! turns, and opening reads the state, the newest version and the turns after it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::print_stdout
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cairn_core::{Embedder, SummarizeError, Summarizer, SummaryRequest};
use cairn_embed::HashEmbedder;
use cairn_harness::{MemoryHarness, SummaryBufferMemory, SummaryBufferOptions};

/// Deterministic and bounded: the fold count, the first word of each item, and the tail of
/// the previous summary cut to a few words.
struct Fast;

#[async_trait]
impl Summarizer for Fast {
    fn name(&self) -> &str {
        "fast"
    }
    async fn summarize(&self, r: &SummaryRequest) -> Result<String, SummarizeError> {
        let prev: Vec<&str> = r
            .previous
            .as_deref()
            .unwrap_or("")
            .split_whitespace()
            .rev()
            .take(12)
            .collect();
        let firsts: Vec<&str> = r
            .items
            .iter()
            .filter_map(|i| i.content.split_whitespace().next())
            .collect();
        Ok(format!(
            "Earlier: {}. Then {} turns: {}.",
            prev.into_iter().rev().collect::<Vec<_>>().join(" "),
            r.items.len(),
            firsts.join(" ")
        ))
    }
}

/// CPU seconds (user + system, every thread) of this process; 0 where `/proc` is missing.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) end with ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f
        .get(11)
        .and_then(|u| u.parse::<f64>().ok())
        .zip(f.get(12).and_then(|s| s.parse::<f64>().ok()))
        .map_or(0.0, |(u, s)| u + s);
    ticks / 100.0
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(n));
}

async fn run(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let e: Arc<dyn Embedder> = Arc::new(HashEmbedder::new(64));
    let mem = MemoryHarness::builder(dir.path().join("conv.db"))
        .embedder(e)
        .summarizer(Arc::new(Fast))
        .build()
        .await
        .unwrap();
    let opts = SummaryBufferOptions {
        max_token_limit: 200,
        ..Default::default()
    };
    let buf = SummaryBufferMemory::open(mem.clone(), "bench", opts.clone())
        .await
        .unwrap();
    let step = (n / 10).max(1);
    println!(
        "{n} save_context calls, one thread, buffer limit 200 tokens, hashing embedder (64-d)"
    );
    println!(
        "| calls | wall µs per call | CPU µs per call | links per call | summaries written | restore (ms) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut links_before = mem.stats().await.unwrap().store.links;
    let mut window = Duration::ZERO;
    let mut cpu_before = cpu_seconds();
    for i in 1..=n {
        let t = Instant::now();
        buf.save_context(
            &format!("question {i}: what about the harbour on day {}?", i % 97),
            &format!(
                "answer {i}: the boats came in at {} and left at dusk",
                i % 24
            ),
        )
        .await
        .unwrap();
        window += t.elapsed();
        if i % step == 0 || i == n {
            let calls = if i % step == 0 { step } else { i % step };
            let cpu = cpu_seconds() - cpu_before;
            let links = mem.stats().await.unwrap().store.links;
            let t = Instant::now();
            let again = SummaryBufferMemory::open(mem.clone(), "bench", opts.clone())
                .await
                .unwrap();
            let restore = t.elapsed();
            assert_eq!(again.moving_summary().await, buf.moving_summary().await);
            println!(
                "| {i} | {:.0} | {:.0} | {:.2} | {} | {:.2} |",
                window.as_secs_f64() * 1e6 / calls as f64,
                cpu * 1e6 / calls as f64,
                (links - links_before) as f64 / calls as f64,
                buf.stats().await.summaries_written,
                restore.as_secs_f64() * 1e3
            );
            links_before = links;
            window = Duration::ZERO;
            cpu_before = cpu_seconds();
        }
    }
}
