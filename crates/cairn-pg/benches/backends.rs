//! The two backends side by side on the same data, through `MemoryBackend`: batched insert
//! throughput, vector search p50/p99 (unfiltered and thread-filtered) with recall@10 against
//! an exact ranking, keyword search, and `leaves` (the store side of `expand_to_leaves`).
//!
//! `cargo bench -p cairn-pg --bench backends` (sizes: `CAIRN_BENCH_SIZES=10000,100000`).
//! PostgreSQL is the throwaway test server (`cairn_pg::testing`: PostgreSQL 16.2 +
//! pgvector 0.6.2 on 127.0.0.1, fsync off), so its figures include a local round trip
//! per call and exclude disk flushes; SQLite runs in the process with its defaults.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    missing_docs
)]

#[path = "../../cairn-store/benches/common/mod.rs"]
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
    let items = (0..n)
        .map(|i| {
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
        })
        .collect();
    let queries = (0..300).map(|_| clusters.draw(&mut rng)).collect();
    Data {
        items,
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

fn run(name: &str, b: &dyn MemoryBackend, data: &Data, exact: &[Vec<usize>]) {
    let n = data.items.len();
    let t = Instant::now();
    let mut ids: Vec<MemoryId> = Vec::with_capacity(n);
    for chunk in data.items.chunks(1_000) {
        ids.extend(b.insert_batch(chunk.to_vec()).unwrap().iter().map(|m| m.id));
    }
    let insert = n as f64 / t.elapsed().as_secs_f64();
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
    println!(
        "| {n} | {name} | {insert:.0} | {:.2} / {:.2} | {recall:.3} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} | {:.2} |",
        pct(plain.clone(), 0.5),
        pct(plain, 0.99),
        pct(filtered.clone(), 0.5),
        pct(filtered, 0.99),
        pct(keyword.clone(), 0.5),
        pct(keyword, 0.99),
        pct(leaves20, 0.5),
        pct(leaves400, 0.5),
    );
}

fn main() {
    let sizes: Vec<usize> = std::env::var("CAIRN_BENCH_SIZES")
        .unwrap_or_else(|_| "10000,100000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let server = cairn_pg::testing::server();
    println!("| memories | backend | batched insert (mem/s) | search p50 / p99 (ms) | recall@10 | thread-filtered p50 / p99 (ms) | keyword p50 / p99 (ms) | leaves of 20 p50 (ms) | leaves of min(400, N/100) p50 (ms) |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for n in sizes {
        let data = data(n);
        let exact: Vec<Vec<usize>> = data.queries[..50]
            .iter()
            .map(|q| exact_top(&data, q, 10))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let sqlite = Store::open(dir.path().join("b.db"), StoreOptions::new("bench", DIM)).unwrap();
        run("sqlite", &sqlite, &data, &exact);
        sqlite.close().unwrap();
        let pg = server.store("bench", DIM);
        run("postgres", &pg, &data, &exact);
        pg.drop_schema().unwrap();
    }
}
