//! Measures the search modes on the LoCoMo dev conversations: for every question of
//! categories 1-4, are its evidence turns among the top k turns of its conversation?
//!
//! `cargo run --release --example locomo_search_modes -- [DIR] [--k 10]` (DIR defaults to
//! `../shared/data/locomo-dev`). Uses the local MiniLM model; the store is temporary.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Instant;

use cairn::harness::import::parse_locomo;
use cairn::{MemoryHarness, MemoryKind, SearchMode, SearchOptions, ThreadId};
use clap::Parser;

#[derive(Parser)]
struct Args {
    #[arg(default_value = "../shared/data/locomo-dev")]
    dir: PathBuf,
    #[arg(long, default_value_t = 10)]
    k: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let tmp = tempfile::tempdir()?;
    let mem = MemoryHarness::open(tmp.path().join("locomo.db")).await?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&args.dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut questions = Vec::new();
    let t = Instant::now();
    for f in &files {
        let stem = f
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("conv")
            .to_owned();
        let thread = ThreadId::new(format!("locomo-{stem}"))?;
        let conv = parse_locomo(&std::fs::read_to_string(f)?, &thread)?;
        mem.add_many(conv.turns).await?;
        for q in conv
            .questions
            .into_iter()
            .filter(|q| (1..=4).contains(&q.category))
        {
            questions.push((thread.clone(), q));
        }
    }
    println!(
        "imported {} conversations in {:.1} s; {} questions (categories 1-4)",
        files.len(),
        t.elapsed().as_secs_f64(),
        questions.len()
    );
    println!(
        "| mode | evidence recall@{k} | full-hit@{k} | any-hit@{k} | mean latency (ms) |",
        k = args.k
    );
    println!("|---|---:|---:|---:|---:|");
    for mode in [SearchMode::Keyword, SearchMode::Vector, SearchMode::Hybrid] {
        let (mut recall, mut full, mut any, mut ms) = (0.0, 0.0, 0.0, 0.0);
        for (thread, q) in &questions {
            let opts = SearchOptions::all()
                .thread(thread.clone())
                .kinds([MemoryKind::Conversational])
                .k(args.k)
                .mode(mode);
            let t = Instant::now();
            let hits = mem.search(&q.question, opts).await?;
            ms += t.elapsed().as_secs_f64() * 1000.0;
            let found: HashSet<&str> = hits
                .iter()
                .filter_map(|h| h.memory.metadata.get("dia_id").and_then(|v| v.as_str()))
                .collect();
            let n = q
                .evidence
                .iter()
                .filter(|e| found.contains(e.as_str()))
                .count();
            recall += n as f64 / q.evidence.len() as f64;
            full += f64::from(u8::from(n == q.evidence.len()));
            any += f64::from(u8::from(n > 0));
        }
        let nq = questions.len() as f64;
        println!(
            "| {mode:?} | {:.3} | {:.3} | {:.3} | {:.1} |",
            recall / nq,
            full / nq,
            any / nq,
            ms / nq
        );
    }
    Ok(())
}
