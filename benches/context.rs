//! `assemble_context` with the real model on an imported LoCoMo dev conversation, and
//! consolidation throughput with the extractive summarizer on the same turns.
//!
//! One conversation (the first `.json` of `CAIRN_LOCOMO_DIR`, default
//! `../shared/data/locomo-dev`) is imported into a fresh store and consolidated; then every
//! question of categories 1-4 is asked at a 2,000-token budget, three ways:
//! - the query embedding alone (`Embedder::embed_one`, the model);
//! - `assemble_context` on a harness without the embedding cache, so each call embeds its
//!   query with the model (what an agent's fresh question costs);
//! - `assemble_context` again with a warm cache (the query's vector looked up).
//!
//! `cargo bench --bench context`

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn::harness::import::parse_locomo;
use cairn::{ConsolidationPolicy, Embedder, FastEmbedder, MemoryHarness, ThreadId};

fn pct(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() {
    let dir = std::env::var_os("CAIRN_LOCOMO_DIR")
        .map_or_else(|| PathBuf::from("../shared/data/locomo-dev"), PathBuf::from);
    let Some(file) = std::fs::read_dir(&dir).ok().and_then(|d| {
        let mut files: Vec<PathBuf> = d
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        files.into_iter().next()
    }) else {
        eprintln!(
            "context: no LoCoMo .json file in {} (skipped)",
            dir.display()
        );
        return;
    };
    let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
    let thread = ThreadId::new(stem.clone()).unwrap();
    let conv = parse_locomo(&std::fs::read_to_string(&file).unwrap(), &thread).unwrap();
    let questions: Vec<String> = conv
        .questions
        .iter()
        .filter(|q| (1..=4).contains(&q.category))
        .map(|q| q.question.clone())
        .collect();
    let turns = conv.turns.len();

    let embedder: Arc<dyn Embedder> = Arc::new(FastEmbedder::builder().build().unwrap());
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("context.db");
    let mem = MemoryHarness::builder(&path)
        .embedder(embedder.clone())
        .embedding_cache(false)
        .build()
        .await
        .unwrap();
    mem.add_many(conv.turns).await.unwrap();
    let t = Instant::now();
    let report = mem
        .consolidate(ConsolidationPolicy::older_than(Duration::ZERO).max_age(Duration::ZERO))
        .await
        .unwrap();
    let consolidate_s = t.elapsed().as_secs_f64();
    println!(
        "conversation {stem}: {turns} turns, {} questions (categories 1-4)\n",
        questions.len()
    );
    println!("| consolidation (extractive) | seconds | turns/s | summaries written |");
    println!("|---|---:|---:|---:|");
    println!(
        "| {turns} turns, chunks of 20, roll-ups | {consolidate_s:.1} | {:.0} | {} |\n",
        turns as f64 / consolidate_s,
        report.summaries.len()
    );

    // Warm up the model and the read connections.
    for q in questions.iter().take(5) {
        mem.assemble_context(thread.as_str(), q, 2_000)
            .await
            .unwrap();
    }
    let one_thread = FastEmbedder::builder().threads(1).build().unwrap();
    one_thread.embed_one("warm up").unwrap();
    let mut embed = Vec::new();
    let mut embed1 = Vec::new();
    let mut cold = Vec::new();
    for q in &questions {
        let t = Instant::now();
        embedder.embed_one(q).unwrap();
        embed.push(ms(t));
        let t = Instant::now();
        one_thread.embed_one(q).unwrap();
        embed1.push(ms(t));
        let t = Instant::now();
        mem.assemble_context(thread.as_str(), q, 2_000)
            .await
            .unwrap();
        cold.push(ms(t));
    }
    drop(mem);
    let cached = MemoryHarness::builder(&path)
        .embedder(embedder.clone())
        .build()
        .await
        .unwrap();
    for q in &questions {
        cached
            .assemble_context(thread.as_str(), q, 2_000)
            .await
            .unwrap();
    }
    let mut warm = Vec::new();
    // `CAIRN_BENCH_REPEAT=N` asks the warm questions N times (for a profiler).
    let repeat: usize = std::env::var("CAIRN_BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for q in questions.iter().cycle().take(questions.len() * repeat) {
        let t = Instant::now();
        cached
            .assemble_context(thread.as_str(), q, 2_000)
            .await
            .unwrap();
        warm.push(ms(t));
    }
    println!("| 2,000-token budget | p50 (ms) | p99 (ms) | mean (ms) |");
    println!("|---|---:|---:|---:|");
    for (name, v) in [
        ("query embedding alone (model, every core)", &embed),
        ("query embedding alone (model, one thread)", &embed1),
        ("assemble_context, query embedded by the model", &cold),
        ("assemble_context, query vector from the cache", &warm),
    ] {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} |",
            pct(v, 0.5),
            pct(v, 0.99),
            v.iter().sum::<f64>() / v.len() as f64
        );
    }
}
