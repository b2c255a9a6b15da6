//! Ingest with the real model: memories per second through `MemoryHarness::add_many`
//! (embedding, SQLite, HNSW) beside the embedder alone, on the same 1,000 sentences, in
//! alternating runs.
//!
//! `cargo bench --bench ingest`

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_precision_loss)]

use std::sync::Arc;
use std::time::Instant;

use cairn::{Embedder, FastEmbedder, MemoryHarness, NewMemory, Role, ThreadId};

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

fn sentences(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            format!(
                "Message {i}: we talked again about {} and what to do next week, number {}.",
                TOPICS[i % TOPICS.len()],
                i * 7919 % 1000
            )
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let embedder: Arc<dyn Embedder> =
        Arc::new(FastEmbedder::builder().batch_size(32).build().unwrap());
    let texts = sentences(1_000);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    embedder.embed(&refs[..32]).unwrap();
    let (mut alone, mut ingest) = (Vec::new(), Vec::new());
    for run in 0..3 {
        let t = Instant::now();
        embedder.embed(&refs).unwrap();
        alone.push(refs.len() as f64 / t.elapsed().as_secs_f64());
        // A fresh store each run, cache off, so every text goes through the model.
        let dir = tempfile::tempdir().unwrap();
        let mem = MemoryHarness::builder(dir.path().join("ingest.db"))
            .embedder(embedder.clone())
            .embedding_cache(false)
            .build()
            .await
            .unwrap();
        let thread = ThreadId::new(format!("run-{run}")).unwrap();
        let batch: Vec<NewMemory> = texts
            .iter()
            .map(|t| NewMemory::conversational(thread.clone(), Role::User, t.clone()))
            .collect();
        let t = Instant::now();
        for chunk in batch.chunks(250) {
            mem.add_many(chunk.to_vec()).await.unwrap();
        }
        ingest.push(texts.len() as f64 / t.elapsed().as_secs_f64());
    }
    let (a, i) = (median(alone), median(ingest));
    println!("1,000 sentences, batches of 250, median of 3 alternating runs");
    println!("| embedder alone (mem/s) | MemoryHarness::add_many (mem/s) | ratio |");
    println!("|---:|---:|---:|");
    println!("| {a:.0} | {i:.0} | {:.2}x |", i / a);
}
