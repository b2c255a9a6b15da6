//! The store end to end with given vectors (the model excluded): insert throughput, search
//! latency with and without a thread filter, expansion, reopen from the snapshot versus a
//! rebuild from SQLite, peak memory.
//!
//! `cargo bench -p cairn-store --bench store_e2e` (sizes: `CAIRN_BENCH_SIZES=10000,100000`;
//! `CAIRN_BENCH_NO_REBUILD=1` skips the rebuild, the longest step at a million).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

mod common;

use std::time::Instant;

use cairn_core::{MemoryKind, NewMemory, ThreadId};
use cairn_store::{snapshot_dir, Filter, NewSummary, Store, StoreOptions};
use common::{Clusters, DIM};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM"))
                .map(str::to_owned)
        })
        .and_then(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

fn main() {
    let sizes = common::sizes("10000,100000");
    println!("| memories | batched insert (mem/s) | single insert (mem/s) | search p50 / p99 (ms) | thread-filtered p50 / p99 (ms) | expand 20 (ms) | reopen from snapshot (s) | rebuild from SQLite (s) | peak RSS (MiB) | database (MiB) | snapshot (MiB) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in sizes {
        let mut rng = StdRng::seed_from_u64(n as u64);
        let clusters = Clusters::new(&mut rng, 500, 0.06);
        let draw = |rng: &mut StdRng| clusters.draw(rng);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e2e.db");
        let store = Store::open(&path, StoreOptions::new("bench", DIM)).unwrap();
        let threads: Vec<ThreadId> = (0..100)
            .map(|t| ThreadId::new(format!("t{t}")).unwrap())
            .collect();
        let t = Instant::now();
        let mut ids = Vec::with_capacity(n);
        let mut done = 0;
        while done < n {
            let b = 1_000.min(n - done);
            let items = (0..b)
                .map(|i| {
                    let th = threads[(done + i) % threads.len()].clone();
                    (
                        NewMemory::new(MemoryKind::Conversational, format!("memory {}", done + i))
                            .with_thread(th),
                        draw(&mut rng),
                    )
                })
                .collect();
            ids.extend(store.insert_batch(items).unwrap().into_iter().map(|m| m.id));
            done += b;
        }
        let batched = n as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        for i in 0..500 {
            store
                .insert(
                    NewMemory::new(MemoryKind::Knowledge, format!("single {i}")),
                    draw(&mut rng),
                )
                .unwrap();
        }
        let single = 500.0 / t.elapsed().as_secs_f64();
        let queries: Vec<Vec<f32>> = (0..500).map(|_| draw(&mut rng)).collect();
        let mut plain = Vec::new();
        let mut filtered = Vec::new();
        for (i, q) in queries.iter().enumerate() {
            let t = Instant::now();
            store
                .search_vector(q.clone(), 10, &Filter::all(), None)
                .unwrap();
            plain.push(t.elapsed().as_secs_f64() * 1e3);
            let f = Filter::all().thread(threads[i % threads.len()].clone());
            let t = Instant::now();
            store.search_vector(q.clone(), 10, &f, None).unwrap();
            filtered.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let s = store
            .add_summary(
                NewSummary::new("summary", ids[..20].to_vec()),
                draw(&mut rng),
            )
            .unwrap();
        let mut expand = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            assert_eq!(store.sources(s.id).unwrap().len(), 20);
            expand.push(t.elapsed().as_secs_f64() * 1e3);
        }
        store.close().unwrap();
        let rss = peak_rss_mib();
        let t = Instant::now();
        let reopened = Store::open(&path, StoreOptions::new("bench", DIM)).unwrap();
        let reopen = t.elapsed().as_secs_f64();
        assert_eq!(reopened.stats().unwrap().rebuilds, 0);
        drop(reopened);
        let mib = |p: &std::path::Path| -> f64 {
            let meta = std::fs::metadata(p).unwrap();
            let bytes = if meta.is_dir() {
                std::fs::read_dir(p)
                    .unwrap()
                    .map(|e| e.unwrap().metadata().unwrap().len())
                    .sum()
            } else {
                meta.len()
            };
            bytes as f64 / (1024.0 * 1024.0)
        };
        let (db_mib, snap_mib) = (mib(&path), mib(&snapshot_dir(&path)));
        let rebuild = if std::env::var_os("CAIRN_BENCH_NO_REBUILD").is_some() {
            f64::NAN
        } else {
            std::fs::remove_dir_all(snapshot_dir(&path)).unwrap();
            let t = Instant::now();
            let rebuilt = Store::open(&path, StoreOptions::new("bench", DIM)).unwrap();
            let rebuild = t.elapsed().as_secs_f64();
            assert_eq!(rebuilt.stats().unwrap().rebuilds, 1);
            drop(rebuilt);
            rebuild
        };
        println!(
            "| {n} | {batched:.0} | {single:.0} | {:.3} / {:.3} | {:.3} / {:.3} | {:.3} | {reopen:.2} | {rebuild:.1} | {rss:.0} | {db_mib:.0} | {snap_mib:.0} |",
            pct(plain.clone(), 0.5),
            pct(plain, 0.99),
            pct(filtered.clone(), 0.5),
            pct(filtered, 0.99),
            pct(expand, 0.5),
        );
    }
    leaves_of_a_deep_tree();
    println!();
    println!("| memories | delete p50 / p99 (ms) | erase after deleting a tenth (ms) |");
    println!("|---:|---:|---:|");
    for n in common::sizes("10000,100000") {
        deletes_and_erase(n);
    }
}

/// What deleting costs one memory at a time (each delete its own transaction, deleted
/// content overwritten), and what erasing what the deletes left costs afterwards
/// (`Store::erase_deleted`: the keyword index merged, the index snapshot written again, the
/// log checkpointed and truncated): `n` sentences of 25 words, a tenth of them deleted.
fn deletes_and_erase(n: usize) {
    let mut rng = StdRng::seed_from_u64(n as u64);
    let clusters = Clusters::new(&mut rng, 500, 0.06);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("del.db");
    let store = Store::open(&path, StoreOptions::new("bench", DIM)).unwrap();
    const WORDS: &[&str] = &[
        "train",
        "Porto",
        "sister",
        "wedding",
        "parser",
        "bug",
        "sourdough",
        "budget",
        "Alps",
        "puppy",
        "Spanish",
        "garden",
        "tomatoes",
        "concert",
        "tickets",
        "deadline",
        "review",
        "bicycle",
        "repair",
        "novel",
        "lighthouse",
        "coast",
        "Easter",
        "running",
        "knees",
    ];
    let mut ids = Vec::new();
    for b in 0..n / 1_000 {
        let items = (0..1_000)
            .map(|i| {
                let k = b * 1_000 + i;
                let text: Vec<&str> = (0..25)
                    .map(|j| WORDS[(k * 31 + j * 7) % WORDS.len()])
                    .collect();
                (
                    NewMemory::new(MemoryKind::Knowledge, format!("{k}: {}", text.join(" "))),
                    clusters.draw(&mut rng),
                )
            })
            .collect();
        ids.extend(store.insert_batch(items).unwrap().into_iter().map(|m| m.id));
    }
    store.snapshot().unwrap();
    let mut times = Vec::new();
    for id in ids.iter().step_by(10) {
        let t = Instant::now();
        store
            .delete(*id, cairn_store::DeletePolicy::Restrict)
            .unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let t = Instant::now();
    let whole = store.erase_deleted().unwrap();
    let erase = t.elapsed().as_secs_f64() * 1e3;
    assert!(whole);
    println!(
        "| {n} | {:.3} / {:.3} | {erase:.1} |",
        pct(times.clone(), 0.5),
        pct(times, 0.99)
    );
}

/// `leaves` (the store side of `expand_to_leaves`) of a 3-level tree over 8,000 leaves:
/// 400 summaries of 20 turns, 20 of 20 summaries, one over those 20.
fn leaves_of_a_deep_tree() {
    let mut rng = StdRng::seed_from_u64(8_000);
    let clusters = Clusters::new(&mut rng, 50, 0.06);
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("tree.db"), StoreOptions::new("bench", DIM)).unwrap();
    let t = ThreadId::new("tree").unwrap();
    let leaves: Vec<_> = (0..8)
        .flat_map(|b| {
            let items = (0..1_000)
                .map(|i| {
                    (
                        NewMemory::new(
                            MemoryKind::Conversational,
                            format!("turn {}", b * 1_000 + i),
                        )
                        .with_thread(t.clone()),
                        clusters.draw(&mut rng),
                    )
                })
                .collect();
            store.insert_batch(items).unwrap()
        })
        .map(|m| m.id)
        .collect();
    let mut level = leaves.clone();
    while level.len() > 1 {
        level = level
            .chunks(20)
            .map(|c| {
                let s = NewSummary::new("summary", c.to_vec()).with_thread(Some(t.clone()));
                store.add_summary(s, clusters.draw(&mut rng)).unwrap().id
            })
            .collect();
    }
    let top = level[0];
    let mut times = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        assert_eq!(store.leaves(top).unwrap().len(), leaves.len());
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!("\n| expand to leaves | leaves | p50 (ms) | p99 (ms) |");
    println!("|---|---:|---:|---:|");
    println!(
        "| 3-level tree (400 + 20 + 1 summaries) | {} | {:.2} | {:.2} |",
        leaves.len(),
        pct(times.clone(), 0.5),
        pct(times, 0.99)
    );
}
