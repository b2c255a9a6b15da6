//! Cairn's vector index on the peers' data: build time and CPU time per insert, then
//! recall@10 and single-thread queries per second for ef_search 16..256 (M = 16,
//! ef_construction = 200), to set beside `../shared/bench/bench_peers.py` (hnswlib, faiss)
//! run on the same files.
//!
//! The index is the store's: an hnsw_rs graph with the store's distance (`DistDot` on unit
//! vectors), parameters and insertion calls (`insert_slice` one by one on one thread,
//! `parallel_insert_slice` for a batch). Rows and the SQLite side are left out, as the peers
//! have none; `store_e2e` measures the store end to end.
//!
//! Data: `python3 ../shared/bench/gen_data.py --out DIR` (and the hard variant with
//! `--clusters 200 --sigma-min 1.2 --sigma-max 2.0`), then
//! `CAIRN_BENCH_DATA=DIR cargo bench -p cairn-store --bench index_peers`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_precision_loss)]

use std::path::Path;
use std::time::Instant;

use cpu_time::ProcessTime;
use hnsw_rs::prelude::{DistDot, Hnsw};

/// A `.npy` file of little-endian `f4` or `i8` values: (rows, columns, values as f64 bits
/// kept in their own type by the caller).
fn read_npy(path: &Path) -> (Vec<usize>, String, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        &bytes[..6],
        b"\x93NUMPY",
        "{} is not a .npy file",
        path.display()
    );
    let (len, start) = if bytes[6] == 1 {
        (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10)
    } else {
        let l = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        (usize::try_from(l).unwrap(), 12)
    };
    let header = std::str::from_utf8(&bytes[start..start + len]).unwrap();
    assert!(header.contains("'fortran_order': False"), "{header}");
    let descr = header
        .split("'descr': '")
        .nth(1)
        .and_then(|s| s.split('\'').next())
        .unwrap()
        .to_owned();
    let shape: Vec<usize> = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap()
        .split(',')
        .filter_map(|x| x.trim().parse().ok())
        .collect();
    (shape, descr, bytes[start + len..].to_vec())
}

fn read_f32(path: &Path) -> (usize, Vec<Vec<f32>>) {
    let (shape, descr, data) = read_npy(path);
    assert_eq!(descr, "<f4");
    let dim = shape[1];
    let rows = data
        .chunks_exact(4 * dim)
        .map(|r| {
            r.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
        .collect();
    (dim, rows)
}

fn read_i64(path: &Path) -> Vec<Vec<usize>> {
    let (shape, descr, data) = read_npy(path);
    assert_eq!(descr, "<i8");
    data.chunks_exact(8 * shape[1])
        .map(|r| {
            r.chunks_exact(8)
                .map(|c| usize::try_from(i64::from_le_bytes(c.try_into().unwrap())).unwrap())
                .collect()
        })
        .collect()
}

fn graph(n: usize) -> Hnsw<'static, f32, DistDot> {
    // The store's `HnswParams::default()`: M 16, max_layer 16, ef_construction 200.
    Hnsw::new(16, n, 16, 200, DistDot {})
}

fn main() {
    let Ok(dir) = std::env::var("CAIRN_BENCH_DATA") else {
        eprintln!(
            "index_peers: set CAIRN_BENCH_DATA to a directory written by \
             ../shared/bench/gen_data.py (skipped)"
        );
        return;
    };
    let dir = Path::new(&dir);
    let (dim, base) = read_f32(&dir.join("base.npy"));
    let (_, queries) = read_f32(&dir.join("queries.npy"));
    let gt = read_i64(&dir.join("gt_ids.npy"));
    let n = base.len();
    println!(
        "data {}: {n} x {dim}, {} queries",
        dir.display(),
        queries.len()
    );

    // One thread, one insert at a time.
    let g1 = graph(n);
    let (w, c) = (Instant::now(), ProcessTime::now());
    for (i, v) in base.iter().enumerate() {
        g1.insert_slice((v.as_slice(), i));
    }
    let (build1, cpu1) = (w.elapsed().as_secs_f64(), c.elapsed().as_secs_f64());
    // Both cores, one batch.
    let g2 = graph(n);
    let batch: Vec<(&[f32], usize)> = base
        .iter()
        .enumerate()
        .map(|(i, v)| (v.as_slice(), i))
        .collect();
    let (w, c) = (Instant::now(), ProcessTime::now());
    g2.parallel_insert_slice(&batch);
    let (build2, cpu2) = (w.elapsed().as_secs_f64(), c.elapsed().as_secs_f64());
    drop(g2);
    println!("\n| build | wall (s) | CPU (s) | inserts/s (wall) | CPU µs per insert |");
    println!("|---|---:|---:|---:|---:|");
    for (name, wall, cpu) in [("1 thread", build1, cpu1), ("2 threads", build2, cpu2)] {
        println!(
            "| {name} | {wall:.1} | {cpu:.1} | {:.0} | {:.1} |",
            n as f64 / wall,
            cpu * 1e6 / n as f64
        );
    }

    println!(
        "\n| ef_search | recall@10 | QPS 1 thread (wall) | QPS 1 thread (CPU) | µs per query (CPU) |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for ef in [16usize, 32, 64, 128, 256] {
        // Warm-up, then every query once, timed.
        for q in queries.iter().take(20) {
            g1.search(q, 10, ef);
        }
        let (w, c) = (Instant::now(), ProcessTime::now());
        let found: Vec<Vec<usize>> = queries
            .iter()
            .map(|q| g1.search(q, 10, ef).iter().map(|n| n.d_id).collect())
            .collect();
        let (wall, cpu) = (w.elapsed().as_secs_f64(), c.elapsed().as_secs_f64());
        let hits: usize = found
            .iter()
            .zip(&gt)
            .map(|(f, g)| f.iter().filter(|id| g[..10].contains(id)).count())
            .sum();
        let nq = queries.len() as f64;
        println!(
            "| {ef} | {:.4} | {:.0} | {:.0} | {:.1} |",
            hits as f64 / (nq * 10.0),
            nq / wall,
            nq / cpu,
            cpu * 1e6 / nq
        );
    }
}
