//! Write latency while the index is rebuilt after deletes (issue 16, item 7): the rebuild on
//! its own thread (`background_rebuild`, the default) against the rebuild inside the write
//! that crossed the tombstone threshold.
//!
//! `cargo bench -p cairn-store --bench rebuild_writes` (size: `CAIRN_BENCH_SIZE`, default
//! 50,000 vectors of 384 dimensions). For each mode: insert the vectors, delete a fifth of
//! them one by one (the last delete crosses the threshold and starts the rebuild), then keep
//! inserting single memories until the rebuilt index is in place and 500 writes more; the
//! table gives the latencies of those writes (the threshold-crossing delete included) and
//! the time from that delete until the rebuilt index answered.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

mod common;

use std::time::{Duration, Instant};

use cairn_core::{MemoryKind, NewMemory};
use cairn_store::{DeletePolicy, Store, StoreOptions};
use common::{Clusters, DIM};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let n: usize = std::env::var("CAIRN_BENCH_SIZE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50_000);
    println!("| rebuild | vectors | writes measured | write p50 (ms) | write p99 (ms) | write max (ms) | trigger to new index (s) |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for background in [true, false] {
        let mut rng = StdRng::seed_from_u64(7);
        let clusters = Clusters::new(&mut rng, 500, 0.06);
        let dir = tempfile::tempdir().unwrap();
        let mut opts = StoreOptions::new("bench", DIM);
        opts.background_rebuild = background;
        let store = Store::open(dir.path().join("rb.db"), opts).unwrap();
        let mut ids = Vec::with_capacity(n);
        while ids.len() < n {
            let b = 1_000.min(n - ids.len());
            let items = (0..b)
                .map(|i| {
                    (
                        NewMemory::new(MemoryKind::Knowledge, format!("memory {}", ids.len() + i)),
                        clusters.draw(&mut rng),
                    )
                })
                .collect();
            ids.extend(store.insert_batch(items).unwrap().into_iter().map(|m| m.id));
        }
        // The threshold is max(20% of the graph, 1,000) deleted entries: one delete short.
        let limit = (n / 5).max(1_000);
        for id in &ids[..limit] {
            store.delete(*id, DeletePolicy::Restrict).unwrap();
        }
        assert_eq!(store.stats().unwrap().rebuilds, 0);
        let mut lat = Vec::new();
        let start = Instant::now();
        let t = Instant::now();
        store.delete(ids[limit], DeletePolicy::Restrict).unwrap();
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        let mut swapped: Option<Duration> = None;
        let mut after = 0;
        let mut i = 0;
        while after < 500 {
            let t = Instant::now();
            store
                .insert(
                    NewMemory::new(MemoryKind::Knowledge, format!("during {i}")),
                    clusters.draw(&mut rng),
                )
                .unwrap();
            lat.push(t.elapsed().as_secs_f64() * 1e3);
            i += 1;
            if swapped.is_none() && store.stats().unwrap().rebuilds > 0 {
                swapped = Some(start.elapsed());
            }
            if swapped.is_some() {
                after += 1;
            }
        }
        let max = lat.iter().copied().fold(0.0, f64::max);
        println!(
            "| {} | {n} | {} | {:.2} | {:.2} | {:.0} | {:.1} |",
            if background {
                "own thread"
            } else {
                "inside the write"
            },
            lat.len(),
            pct(lat.clone(), 0.5),
            pct(lat.clone(), 0.99),
            max,
            swapped.map_or(0.0, |d| d.as_secs_f64())
        );
        store.close().unwrap();
    }
}
