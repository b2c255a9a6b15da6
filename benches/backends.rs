//! The two backends side by side on the same data: a bulk load (`insert_bulk`), then
//! through `MemoryBackend` a batch of 1,000 more (the write rate at that size), vector
//! search p50/p99 (unfiltered and thread-filtered) with recall@10 against an exact
//! ranking, keyword search and `leaves` (the store side of `expand_to_leaves`); then
//! through `MemoryHarness` on the same store, `assemble_context` on one thread (N/100
//! memories) at 2,000 tokens.
//!
//! `cargo bench --bench backends` (sizes: `CAIRN_BENCH_SIZES=10000,100000`; 1,000,000 takes
//! about an hour on 2 cores). PostgreSQL is the throwaway test server (`cairn_pg::testing`:
//! PostgreSQL 16.2 + pgvector 0.6.2 on 127.0.0.1, fsync off), so its figures include a local
//! round trip per call and exclude disk flushes; SQLite runs in the process with its
//! defaults.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    missing_docs
)]

#[path = "../crates/cairn-store/benches/common/mod.rs"]
mod common;

use std::time::Instant;

use cairn_core::{MemoryId, MemoryKind, NewMemory, ThreadId};
use cairn_store::{Filter, MemoryBackend, NewSummary, Store, StoreOptions};
use common::{Clusters, DIM};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let out = f();
    (out, t.elapsed().as_secs_f64() * 1e3)
}

struct Data {
    items: Vec<(NewMemory, Vec<f32>)>,
    more: Vec<(NewMemory, Vec<f32>)>,
    queries: Vec<Vec<f32>>,
    words: Vec<String>,
    threads: Vec<ThreadId>,
}

fn data(n: usize) -> Data {
    let mut rng = StdRng::seed_from_u64(n as u64);
    let clusters = Clusters::new(&mut rng, 500, 0.06);
    let threads: Vec<ThreadId> = (0..100)
        .map(|t| ThreadId::new(format!("t{t}")).unwrap())
        .collect();
    let words: Vec<String> = (0..2_000).map(|i| format!("w{i:04}x")).collect();
    let mut item = |i: usize| {
        let text = format!(
            "memory {i} about {} and {}",
            words[rng.random_range(0..words.len())],
            words[rng.random_range(0..words.len())]
        );
        (
            NewMemory::new(MemoryKind::Conversational, text)
                .with_thread(threads[i % threads.len()].clone()),
            clusters.draw(&mut rng),
        )
    };
    let items: Vec<_> = (0..n).map(&mut item).collect();
    let more: Vec<_> = (n..n + 1_000).map(&mut item).collect();
    let queries = (0..300).map(|_| clusters.draw(&mut rng)).collect();
    Data {
        items,
        more,
        queries,
        words,
        threads,
    }
}

fn exact_top(data: &Data, q: &[f32], k: usize) -> Vec<usize> {
    let mut scored: Vec<(f32, usize)> = data
        .items
        .iter()
        .enumerate()
        .map(|(i, (_, v))| (v.iter().zip(q).map(|(a, b)| a * b).sum(), i))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.into_iter().take(k).map(|(_, i)| i).collect()
}

/// One backend's figures at one size.
struct Row {
    bulk: f64,
    more: f64,
    plain: Vec<f64>,
    recall: f64,
    filtered: Vec<f64>,
    keyword: Vec<f64>,
    leaves20: Vec<f64>,
    leaves400: Vec<f64>,
    context: Vec<f64>,
}

fn progress(what: &str, n: usize, name: &str) {
    eprintln!(
        "backends: {n} {name}: {what} ({})",
        chrono::Utc::now().format("%H:%M:%S")
    );
}

fn run(name: &str, b: &dyn MemoryBackend, data: &Data, exact: &[Vec<usize>]) -> Row {
    let n = data.items.len();
    progress("bulk load", n, name);
    let t = Instant::now();
    let ids: Vec<MemoryId> = b
        .insert_bulk(data.items.clone())
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    let bulk = n as f64 / t.elapsed().as_secs_f64();
    progress("searches", n, name);
    let mut plain = Vec::new();
    let mut filtered = Vec::new();
    let mut found = 0usize;
    for (i, q) in data.queries.iter().enumerate() {
        let (hits, ms) = timed(|| b.search_vector(q.clone(), 10, &Filter::all()).unwrap());
        plain.push(ms);
        if let Some(top) = exact.get(i) {
            let want: std::collections::HashSet<MemoryId> = top.iter().map(|j| ids[*j]).collect();
            found += hits.iter().filter(|h| want.contains(&h.memory.id)).count();
        }
        let f = Filter::all().thread(data.threads[i % data.threads.len()].clone());
        let (hits, ms) = timed(|| b.search_vector(q.clone(), 10, &f).unwrap());
        assert_eq!(hits.len(), 10);
        filtered.push(ms);
    }
    let recall = found as f64 / (exact.len() * 10) as f64;
    let mut keyword = Vec::new();
    for i in 0..300 {
        let w = &data.words[(i * 7) % data.words.len()];
        let (_, ms) = timed(|| b.search_keyword(w, 10, &Filter::all()).unwrap());
        keyword.push(ms);
    }
    // The write rate at this size: a batch of 1,000 more (after the searches, which are
    // checked against an exact ranking of the load).
    let t = Instant::now();
    b.insert_batch(data.more.clone()).unwrap();
    let more = data.more.len() as f64 / t.elapsed().as_secs_f64();
    // Up to 20 level-1 summaries of 20 turns of one thread, one level-2 summary over them
    // (400 leaves from 40,000 memories on).
    let t0 = &data.threads[0];
    let m = (n / data.threads.len()).min(400) / 20 * 20;
    let turns: Vec<MemoryId> = (0..m).map(|i| ids[i * data.threads.len()]).collect();
    let firsts: Vec<MemoryId> = turns
        .chunks(20)
        .map(|c| {
            let s = NewSummary::new("part", c.to_vec()).with_thread(Some(t0.clone()));
            b.add_summary(s, data.queries[0].clone()).unwrap().id
        })
        .collect();
    let top = b
        .add_summary(
            NewSummary::new("whole", firsts.clone()).with_thread(Some(t0.clone())),
            data.queries[1].clone(),
        )
        .unwrap();
    let mut leaves20 = Vec::new();
    let mut leaves400 = Vec::new();
    for i in 0..100 {
        let (l, ms) = timed(|| b.leaves(firsts[i % firsts.len()]).unwrap());
        assert_eq!(l.len(), 20);
        leaves20.push(ms);
        let (l, ms) = timed(|| b.leaves(top.id).unwrap());
        assert_eq!(l.len(), m);
        leaves400.push(ms);
    }
    Row {
        bulk,
        more,
        plain,
        recall,
        filtered,
        keyword,
        leaves20,
        leaves400,
        context: Vec::new(),
    }
}

/// The bench's query vectors for the harness's query texts: `what about <word>?` asks
/// with query vector i.
struct Lookup(std::collections::HashMap<String, Vec<f32>>);

impl Lookup {
    fn new(data: &Data) -> (Self, Vec<String>) {
        let texts: Vec<String> = (0..110)
            .map(|i| format!("what about {}?", data.words[(i * 13) % data.words.len()]))
            .collect();
        let map = texts
            .iter()
            .cloned()
            .zip(data.queries.iter().cloned())
            .collect();
        (Self(map), texts)
    }
}

impl cairn::Embedder for Lookup {
    fn model_id(&self) -> &str {
        "bench"
    }
    fn dim(&self) -> usize {
        DIM
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, cairn::core::EmbedError> {
        texts
            .iter()
            .map(|t| {
                self.0.get(*t).cloned().ok_or_else(|| {
                    cairn::core::EmbedError::Inference(format!("no bench vector for {t:?}"))
                })
            })
            .collect()
    }
}

/// `assemble_context` on the bench's first thread through a harness on the store at
/// `location`, 100 queries at 2,000 tokens after 10 warm-ups; the times in ms.
fn context(location: &str, data: &Data) -> Vec<f64> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (embedder, texts) = Lookup::new(data);
        let mem = cairn::MemoryHarness::builder(std::path::PathBuf::from(location))
            .embedder(std::sync::Arc::new(embedder))
            .embedding_cache(false)
            .build()
            .await
            .unwrap();
        let thread = data.threads[0].as_str();
        let mut out = Vec::new();
        for (i, q) in texts.iter().enumerate() {
            let t = Instant::now();
            let ctx = mem.assemble_context(thread, q, 2_000).await.unwrap();
            assert!(!ctx.items.is_empty());
            if i >= 10 {
                out.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        out
    })
}

fn print(n: usize, name: &str, r: Row) {
    println!(
        "| {n} | {name} | {:.0} | {:.0} | {:.2} / {:.2} | {:.3} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} | {:.2} | {:.2} / {:.2} |",
        r.bulk,
        r.more,
        pct(r.plain.clone(), 0.5),
        pct(r.plain, 0.99),
        r.recall,
        pct(r.filtered.clone(), 0.5),
        pct(r.filtered, 0.99),
        pct(r.keyword.clone(), 0.5),
        pct(r.keyword, 0.99),
        pct(r.leaves20, 0.5),
        pct(r.leaves400, 0.5),
        pct(r.context.clone(), 0.5),
        pct(r.context, 0.99),
    );
}

fn main() {
    let sizes = common::sizes("10000,100000");
    let server = cairn_pg::testing::server();
    println!("| memories | backend | bulk load (mem/s) | 1,000 more (mem/s) | search p50 / p99 (ms) | recall@10 | thread-filtered p50 / p99 (ms) | keyword p50 / p99 (ms) | leaves of 20 p50 (ms) | leaves of min(400, N/100) p50 (ms) | assemble_context p50 / p99 (ms) |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in sizes {
        let data = data(n);
        let exact: Vec<Vec<usize>> = data.queries[..50]
            .iter()
            .map(|q| exact_top(&data, q, 10))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.db");
        let sqlite = Store::open(&path, StoreOptions::new("bench", DIM)).unwrap();
        let mut row = run("sqlite", &sqlite, &data, &exact);
        sqlite.close().unwrap();
        progress("assemble_context", n, "sqlite");
        row.context = context(path.to_str().unwrap(), &data);
        print(n, "sqlite", row);
        // Room for the HNSW graph of a million memories while the index builds.
        let options = server.options("bench", DIM).index_build_memory_mb(4_096);
        let schema = options.schema.clone();
        let pg = cairn_pg::PgStore::open(options).unwrap();
        let mut row = run("postgres", &pg, &data, &exact);
        progress("assemble_context", n, "postgres");
        let url = format!(
            "postgres://cairn@127.0.0.1:{}/postgres?schema={schema}",
            server.port
        );
        row.context = context(&url, &data);
        print(n, "postgres", row);
        pg.drop_schema().unwrap();
    }
}
