//! The cost of one API call from Rust, to set beside the same calls from Python
//! (`scripts/bench_python.py`): `add` one memory at a time, then `search` (hybrid and vector,
//! k = 10) at 10,000 memories, with the deterministic hash embedder (384 dimensions) so no
//! model time hides the call's own.
//!
//! `cargo bench -p cairn-harness --bench api_calls [-- N]`

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

use std::sync::Arc;
use std::time::Instant;

use cairn_embed::HashEmbedder;
use cairn_harness::{MemoryHarness, SearchMode, SearchOptions};

const TOPICS: &[&str] = &[
    "the train to Porto",
    "my sister's wedding",
    "a bug in the parser",
    "sourdough that collapsed",
    "the quarterly budget",
    "a hiking trip in the Alps",
    "the new puppy",
    "learning Spanish",
];

fn text(i: usize) -> String {
    format!(
        "Message {i}: we talked again about {} and what to do next week, number {}.",
        TOPICS[i % TOPICS.len()],
        i * 7919 % 1000
    )
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10_000);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let h = MemoryHarness::builder(dir.path().join("b.db"))
            .embedder(Arc::new(HashEmbedder::new(384)))
            .embedding_cache(false)
            .build()
            .await
            .unwrap();
        let start = Instant::now();
        for i in 0..n {
            h.add_conversational("bench", cairn_core::Role::User, text(i))
                .await
                .unwrap();
        }
        let add_s = start.elapsed().as_secs_f64();
        println!("| store | memories | add (µs per call) | adds/s |");
        println!("|---|---:|---:|---:|");
        println!(
            "| Rust `MemoryHarness::add` | {n} | {:.0} | {:.0} |",
            add_s * 1e6 / n as f64,
            n as f64 / add_s
        );
        println!();
        println!("| search (k = 10) | p50 ms | p99 ms |");
        println!("|---|---:|---:|");
        for mode in [SearchMode::Hybrid, SearchMode::Vector] {
            let mut times = Vec::new();
            for q in 0..200 {
                let query = format!("what about {} again", TOPICS[q % TOPICS.len()]);
                let t = Instant::now();
                let hits = h
                    .search(&query, SearchOptions::all().mode(mode).k(10))
                    .await
                    .unwrap();
                times.push(t.elapsed().as_secs_f64() * 1e3);
                assert!(!hits.is_empty());
            }
            println!(
                "| Rust {mode:?} | {:.3} | {:.3} |",
                pct(&mut times.clone(), 0.5),
                pct(&mut times, 0.99)
            );
        }
    });
}
