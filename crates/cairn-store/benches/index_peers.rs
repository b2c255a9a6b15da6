//! Cairn's vector index on the peers' data: build time and CPU time per insert, then
//! recall@10 and single-thread queries per second for ef_search 16..256 (M = 16,
//! ef_construction = 200), to set beside `../shared/bench/bench_peers.py` (hnswlib, faiss)
//! run on the same files.
//!
//! The index is the store's graph (`cairn_store::hnsw::Hnsw` with `HnswParams::default()`)
//! called as the store calls it: one memory at a time on one thread, or one batch linked on
//! every core. Rows and the SQLite side are left out, as the peers have none; `store_e2e`
//! measures the store end to end. Each sweep runs three times and keeps the median (the
//! machine is shared).
//!
//! Data: `python3 ../shared/bench/gen_data.py --out DIR` (and the hard variant with
//! `--clusters 200 --sigma-min 1.2 --sigma-max 2.0`), then
//! `CAIRN_BENCH_DATA=DIR cargo bench -p cairn-store --bench index_peers`.
//! `CAIRN_BENCH_BATCH_ONLY=1` skips the one-thread build; `CAIRN_BENCH_HNSW_RS=1` adds
//! hnsw_rs 0.3.5 (the store's index before its own graph) on the same data.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_precision_loss)]

use std::path::Path;
use std::time::Instant;

use cairn_store::hnsw::Hnsw;
use cairn_store::HnswParams;
use cpu_time::ProcessTime;
use hnsw_rs::prelude::DistDot;

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

/// Build figures: (label, wall s, CPU s).
type Builds = Vec<(&'static str, f64, f64)>;

fn cairn_graph(base: &[Vec<f32>], dim: usize) -> (Hnsw, Builds) {
    // The store's `HnswParams::default()`: M 16, max_layer 16, ef_construction 200; the
    // store's calls: reserve + link, one memory at a time or a batch on every core.
    let params = HnswParams::default();
    let mut g1 = Hnsw::new(dim, params);
    let (w, c) = (Instant::now(), ProcessTime::now());
    let serial = std::env::var_os("CAIRN_BENCH_BATCH_ONLY").is_none();
    if serial {
        for (i, v) in base.iter().enumerate() {
            g1.insert(&[(i as u64, v.as_slice())], 1).unwrap();
        }
    }
    let one = (w.elapsed().as_secs_f64(), c.elapsed().as_secs_f64());
    let mut g2 = Hnsw::new(dim, params);
    let batch: Vec<(u64, &[f32])> = base
        .iter()
        .enumerate()
        .map(|(i, v)| (i as u64, v.as_slice()))
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (w, c) = (Instant::now(), ProcessTime::now());
    g2.insert(&batch, threads).unwrap();
    let two = (w.elapsed().as_secs_f64(), c.elapsed().as_secs_f64());
    if !serial {
        return (g2, vec![("all cores, one batch", two.0, two.1)]);
    }
    drop(g2);
    (
        g1,
        vec![
            ("1 thread", one.0, one.1),
            ("all cores, one batch", two.0, two.1),
        ],
    )
}

fn hnsw_rs_graph(base: &[Vec<f32>]) -> (hnsw_rs::hnsw::Hnsw<'static, f32, DistDot>, Builds) {
    let new = || hnsw_rs::hnsw::Hnsw::new(16, base.len(), 16, 200, DistDot {});
    let g1 = new();
    let (w, c) = (Instant::now(), ProcessTime::now());
    for (i, v) in base.iter().enumerate() {
        g1.insert_slice((v.as_slice(), i));
    }
    let one = (w.elapsed().as_secs_f64(), c.elapsed().as_secs_f64());
    let g2 = new();
    let batch: Vec<(&[f32], usize)> = base
        .iter()
        .enumerate()
        .map(|(i, v)| (v.as_slice(), i))
        .collect();
    let (w, c) = (Instant::now(), ProcessTime::now());
    g2.parallel_insert_slice(&batch);
    let two = (w.elapsed().as_secs_f64(), c.elapsed().as_secs_f64());
    drop(g2);
    (
        g1,
        vec![
            ("1 thread", one.0, one.1),
            ("all cores, one batch", two.0, two.1),
        ],
    )
}

fn report(
    name: &str,
    n: usize,
    builds: &Builds,
    queries: &[Vec<f32>],
    gt: &[Vec<usize>],
    search: impl Fn(&[f32], usize) -> Vec<usize>,
) {
    println!("\n### {name}\n");
    println!("| build | wall (s) | CPU (s) | inserts/s (wall) | CPU µs per insert |");
    println!("|---|---:|---:|---:|---:|");
    for (label, wall, cpu) in builds {
        println!(
            "| {label} | {wall:.1} | {cpu:.1} | {:.0} | {:.1} |",
            n as f64 / wall,
            cpu * 1e6 / n as f64
        );
    }
    println!(
        "\n| ef_search | recall@10 | QPS 1 thread (wall) | QPS 1 thread (CPU) | µs per query (CPU) |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for ef in [16usize, 32, 64, 128, 256] {
        // Warm-up, then every query once, timed; three rounds, the median kept (the
        // machine is shared).
        for q in queries.iter().take(20) {
            search(q, ef);
        }
        let mut rounds = Vec::new();
        let mut found: Vec<Vec<usize>> = Vec::new();
        for _ in 0..3 {
            let (w, c) = (Instant::now(), ProcessTime::now());
            found = queries.iter().map(|q| search(q, ef)).collect();
            rounds.push((w.elapsed().as_secs_f64(), c.elapsed().as_secs_f64()));
        }
        rounds.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (wall, cpu) = rounds[1];
        let hits: usize = found
            .iter()
            .zip(gt)
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
    let (g, builds) = cairn_graph(&base, dim);
    report(
        "Cairn (cairn_store::hnsw)",
        n,
        &builds,
        &queries,
        &gt,
        |q, ef| {
            g.search(q, 10, ef, None)
                .into_iter()
                .map(|(l, _)| usize::try_from(l).unwrap())
                .collect()
        },
    );
    drop(g);
    if std::env::var_os("CAIRN_BENCH_HNSW_RS").is_some() {
        let (g, builds) = hnsw_rs_graph(&base);
        report(
            "hnsw_rs 0.3.5 (the store's index before)",
            n,
            &builds,
            &queries,
            &gt,
            |q, ef| g.search(q, 10, ef).iter().map(|n| n.d_id).collect(),
        );
    }
}
