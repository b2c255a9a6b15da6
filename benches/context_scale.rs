//! `assemble_context` as a thread grows: the recall ranker scores every turn of the thread
//! (its timeline, two rankings 1,000 deep), so its cost grows with the thread. The hashing
//! test embedder stands in for the model (its vectors carry no meaning, but cost what the
//! store does with any vector), so the figures are the harness's own work.
//!
//! For each thread size (`CAIRN_BENCH_THREAD_SIZES`, default `1000,10000,50000`): a fresh
//! store holds one thread of that many turns (30 s apart, a new session every 20 turns, two
//! speakers, seeded vocabulary), then 100 queries are asked at a 2,000-token budget.
//!
//! `cargo bench --bench context_scale`

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use std::sync::Arc;
use std::time::Instant;

use cairn::embed::HashEmbedder;
use cairn::{MemoryHarness, NewMemory, Role, ThreadId};

const WORDS: [&str; 48] = [
    "garden",
    "violin",
    "puppy",
    "marathon",
    "recipe",
    "camping",
    "museum",
    "painting",
    "pottery",
    "guitar",
    "novel",
    "budget",
    "promotion",
    "vacation",
    "sister",
    "brother",
    "tournament",
    "adoption",
    "festival",
    "concert",
    "bakery",
    "sunset",
    "mountain",
    "river",
    "school",
    "charity",
    "project",
    "interview",
    "surgery",
    "birthday",
    "wedding",
    "garage",
    "kitten",
    "turtle",
    "screenplay",
    "podcast",
    "workshop",
    "volunteer",
    "soccer",
    "poetry",
    "library",
    "coffee",
    "beach",
    "hiking",
    "photograph",
    "sculpture",
    "market",
    "theatre",
];

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as usize
    }
    fn words(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| WORDS[self.next() % WORDS.len()])
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let sizes: Vec<usize> = std::env::var("CAIRN_BENCH_THREAD_SIZES")
        .unwrap_or_else(|_| "1000,10000,50000".to_owned())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    println!("| turns in the thread | build (s) | p50 (ms) | p99 (ms) | recalled turns (mean) |");
    println!("|---:|---:|---:|---:|---:|");
    for n in sizes {
        let tmp = tempfile::tempdir().unwrap();
        let mem = MemoryHarness::builder(tmp.path().join("scale.db"))
            .embedder(Arc::new(HashEmbedder::new(384)))
            .build()
            .await
            .unwrap();
        let thread = ThreadId::new("t").unwrap();
        let mut rng = Lcg(42);
        let t0 = chrono::DateTime::from_timestamp(1_600_000_000, 0).unwrap();
        let built = Instant::now();
        for start in (0..n).step_by(1_000) {
            let batch: Vec<NewMemory> = (start..(start + 1_000).min(n))
                .map(|i| {
                    let who = if i % 2 == 0 { "Ann" } else { "Bob" };
                    let mut meta = cairn::core::Metadata::new();
                    meta.insert("speaker".into(), who.into());
                    let len = 6 + rng.next() % 20;
                    let at = t0
                        + chrono::Duration::days((i / 20) as i64)
                        + chrono::Duration::seconds(30 * (i % 20) as i64);
                    NewMemory::conversational(
                        thread.clone(),
                        Role::User,
                        format!("{who}: {}.", rng.words(len)),
                    )
                    .at(at)
                    .with_metadata(meta)
                })
                .collect();
            mem.add_many(batch).await.unwrap();
        }
        let build_s = built.elapsed().as_secs_f64();
        let queries: Vec<String> = (0..110)
            .map(|i| {
                let who = if i % 3 == 0 { "Ann " } else { "" };
                format!("What did {who}say about the {}?", rng.words(3))
            })
            .collect();
        let mut took = Vec::new();
        let mut recalled = 0usize;
        for (i, q) in queries.iter().enumerate() {
            let t = Instant::now();
            let ctx = mem.assemble_context("t", q, 2_000).await.unwrap();
            // The first ten warm the caches.
            if i >= 10 {
                took.push(t.elapsed().as_secs_f64() * 1e3);
                recalled += ctx
                    .items
                    .iter()
                    .filter(|i| i.section == cairn::Section::Recalled)
                    .count();
            }
        }
        println!(
            "| {n} | {build_s:.1} | {:.2} | {:.2} | {:.0} |",
            pct(&took, 0.5),
            pct(&took, 0.99),
            recalled as f64 / took.len() as f64
        );
    }
}
