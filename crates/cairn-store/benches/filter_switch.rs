//! Where a filtered search should stop walking the graph and scan the admitted rows exactly.
//!
//! `cargo bench -p cairn-store --bench filter_switch` builds one store of 50,000 clustered
//! 384-d vectors spread over threads of 100 to 20,000 memories, then times a thread-filtered
//! top-10 search both ways (the graph with the filter inside the traversal, ef 64; an exact
//! scan of the thread's rows) and reports p50 latency and recall@10 against brute force.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_precision_loss)]

mod common;

use std::time::Instant;

use cairn_core::{MemoryKind, NewMemory, ThreadId};
use cairn_store::{Filter, Store, StoreOptions};
use common::{Clusters, DIM};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn main() {
    let mut rng = StdRng::seed_from_u64(42);
    let clusters = Clusters::new(&mut rng, 200, 0.08);
    let draw = |rng: &mut StdRng| clusters.draw(rng);
    let sizes = [100usize, 300, 1_000, 2_000, 5_000, 10_000, 31_600];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("switch.db");
    let mut per_thread: Vec<Vec<Vec<f32>>> = Vec::new();
    {
        let store = Store::open(&path, StoreOptions::new("bench", DIM)).unwrap();
        let t = Instant::now();
        for (ti, n) in sizes.iter().enumerate() {
            let thread = ThreadId::new(format!("t{ti}")).unwrap();
            let vecs: Vec<Vec<f32>> = (0..*n).map(|_| draw(&mut rng)).collect();
            for chunk in vecs.chunks(2_000) {
                let items = chunk
                    .iter()
                    .map(|v| {
                        (
                            NewMemory::new(MemoryKind::Knowledge, "x").with_thread(thread.clone()),
                            v.clone(),
                        )
                    })
                    .collect();
                store.insert_batch(items).unwrap();
            }
            per_thread.push(vecs);
        }
        eprintln!(
            "built {} memories in {:.1} s",
            sizes.iter().sum::<usize>(),
            t.elapsed().as_secs_f64()
        );
        store.close().unwrap();
    }
    let queries: Vec<Vec<f32>> = (0..200).map(|_| draw(&mut rng)).collect();
    println!("50,000 memories, 384-d, k = 10, 200 queries per cell, single thread");
    println!("| thread size | graph p50 (µs) | graph recall@10 | exact scan p50 (µs) |");
    println!("|---:|---:|---:|---:|");
    let open = |max: usize| {
        let mut o = StoreOptions::new("bench", DIM);
        o.exact_scan_max = max;
        o.exact_scan_factor = if max == 0 { 0.0 } else { f64::MAX };
        Store::open(&path, o).unwrap()
    };
    let graph = open(0);
    let exact = open(usize::MAX);
    for (ti, n) in sizes.iter().enumerate() {
        let f = Filter::all().thread(ThreadId::new(format!("t{ti}")).unwrap());
        let mut tg = Vec::new();
        let mut te = Vec::new();
        let mut found = 0usize;
        for q in &queries {
            let t = Instant::now();
            let e = exact.search_vector(q.clone(), 10, &f, None).unwrap();
            te.push(t.elapsed().as_secs_f64() * 1e6);
            let t = Instant::now();
            let g = graph.search_vector(q.clone(), 10, &f, None).unwrap();
            tg.push(t.elapsed().as_secs_f64() * 1e6);
            let truth: std::collections::HashSet<_> = e.iter().map(|h| h.memory.id).collect();
            found += g.iter().filter(|h| truth.contains(&h.memory.id)).count();
        }
        tg.sort_by(f64::total_cmp);
        te.sort_by(f64::total_cmp);
        println!(
            "| {n} | {:.0} | {:.3} | {:.0} |",
            tg[tg.len() / 2],
            found as f64 / (10.0 * queries.len() as f64),
            te[te.len() / 2]
        );
    }
    let _ = per_thread;
}
