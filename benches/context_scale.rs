//! `assemble_context` as a thread grows, exhaustive and bounded (issue 18).
//!
//! For each thread size (`CAIRN_BENCH_THREAD_SIZES`, default `1000,10000,50000`; add
//! `200000` for the largest): a fresh store holds one thread of that many turns (30 s
//! apart, a new session every 20 turns, four a day from 2015, two speakers, seeded vocabulary), built
//! with the hashing test embedder and consolidated (level-1 summaries of 20 turns, roll-ups
//! above). Then a child process (so its memory is the reading process's own) opens the store
//! and asks 100 queries at a 2,000-token budget (after 10 warm-ups), each through the
//! bounded path (the default above 5,000 turns) and through exhaustive scoring, alternating:
//! - without the model: the hashing embedder embeds the query (the harness's own work);
//! - with the model in the call: an embedder that runs MiniLM on the query (its full cost,
//!   on the call's thread) and returns the hashing vector, so the store built with the
//!   hashing embedder still answers; the embedding cache is off.
//!
//! Reported per size: p50/p99 per path, the share of the exhaustive path's recalled turns the
//! bounded path recalls too (the hashing vectors carry no meaning, so this measures what the
//! bound leaves out, not answer quality: `cairn eval locomo --haystack` does that), and the
//! reading process's resident memory (and its proportional share, which counts a page of
//! the database file once however many reader connections map it) against the store's size
//! on disk; and the database work of a call on each path (SQLite VM instructions, counted
//! by `StoreOptions::count_sql_work` on a handle opened after the timed calls: a count, so
//! it does not depend on the machine's load).
//!
//! `cargo bench --bench context_scale` (`CAIRN_BENCH_STORE_DIR=DIR` keeps the stores there
//! and reuses them on the next run; `CAIRN_BENCH_PG=postgres://...` builds each store in a
//! fresh schema of that PostgreSQL database instead, and reports no size on disk). The child
//! can be run on its own, on a kept store: `CONTEXT_SCALE_CHILD=DB CONTEXT_SCALE_N=N
//! CONTEXT_SCALE_MODEL=0|1 target/release/deps/context_scale-*` (add
//! `CONTEXT_SCALE_BOUNDED_ONLY=1` to time the bounded path alone, for a profile).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use cairn::embed::HashEmbedder;
use cairn::{ConsolidationPolicy, ContextOptions, MemoryHarness, NewMemory, Role, ThreadId};

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

/// A `Name: value kB` field of a /proc file's text, in KiB (0 when absent).
fn kib_field(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Resident memory of this process, in KiB (Linux), and its peak.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    (kib_field(&status, "VmRSS:"), kib_field(&status, "VmHWM:"))
}

/// Proportional resident memory of this process, in KiB (Linux): a page mapped twice (each
/// pooled reader connection maps the database file on its own) counts once, where the
/// resident set counts it once per mapping.
fn pss_kib() -> u64 {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    kib_field(&rollup, "Pss:")
}

/// Bytes of a store on disk: the database, its write-ahead log, the index snapshot.
fn store_bytes(db: &std::path::Path) -> u64 {
    fn dir_bytes(d: &std::path::Path) -> u64 {
        std::fs::read_dir(d)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| {
                        let p = e.path();
                        if p.is_dir() {
                            dir_bytes(&p)
                        } else {
                            e.metadata().map(|m| m.len()).unwrap_or(0)
                        }
                    })
                    .sum()
            })
            .unwrap_or(0)
    }
    let file = |p: std::path::PathBuf| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let name = db.file_name().unwrap().to_string_lossy().to_string();
    file(db.to_path_buf())
        + file(db.with_file_name(format!("{name}-wal")))
        + dir_bytes(&cairn::store::snapshot_dir(db))
}

/// Hashing vectors, at the model's cost: MiniLM embeds the text first (result unused).
struct ModelCost {
    hash: HashEmbedder,
    model: cairn::FastEmbedder,
}

impl cairn::Embedder for ModelCost {
    fn model_id(&self) -> &str {
        self.hash.model_id()
    }
    fn dim(&self) -> usize {
        self.hash.dim()
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, cairn::core::EmbedError> {
        self.model.embed(texts)?;
        self.hash.embed(texts)
    }
}

fn queries(n: usize) -> Vec<String> {
    let mut rng = Lcg(7 + n as u64);
    (0..110)
        .map(|i| {
            let who = if i % 3 == 0 { "Ann " } else { "" };
            format!("What did {who}say about the {}?", rng.words(3))
        })
        .collect()
}

/// The child: opens the store at `db`, asks the queries both ways, prints one result line.
async fn child(db: &str, n: usize, model: bool) {
    let embedder: Arc<dyn cairn::Embedder> = if model {
        Arc::new(ModelCost {
            hash: HashEmbedder::new(384),
            model: cairn::FastEmbedder::new().unwrap(),
        })
    } else {
        Arc::new(HashEmbedder::new(384))
    };
    let mem = MemoryHarness::builder(db)
        .embedder(embedder)
        .embedding_cache(false)
        .build()
        .await
        .unwrap();
    let bounded = ContextOptions::default();
    let exhaustive = ContextOptions {
        bounded_above: usize::MAX,
        ..ContextOptions::default()
    };
    // For a profile of the bounded path: `CONTEXT_SCALE_BOUNDED_ONLY=1` skips exhaustive
    // scoring (its figures then read 0).
    let bounded_only = std::env::var("CONTEXT_SCALE_BOUNDED_ONLY").as_deref() == Ok("1");
    let (mut tb, mut te) = (Vec::new(), Vec::new());
    let (mut shared, mut of) = (0usize, 0usize);
    for (i, q) in queries(n).iter().enumerate() {
        let recalled = |ctx: &cairn::AssembledContext| -> HashSet<cairn::MemoryId> {
            ctx.items
                .iter()
                .filter(|i| i.section == cairn::Section::Recalled)
                .map(|i| i.id)
                .collect()
        };
        // Alternate which path goes first.
        let run = |opts: ContextOptions| {
            let mem = &mem;
            async move {
                let t = Instant::now();
                let ctx = mem
                    .assemble_context_with("t", q, 2_000, opts)
                    .await
                    .unwrap();
                (t.elapsed().as_secs_f64() * 1e3, ctx)
            }
        };
        let ((b_ms, b), (e_ms, e)) = if bounded_only {
            let (ms, b) = run(bounded).await;
            ((ms, b.clone()), (0.0, b))
        } else if i % 2 == 0 {
            let b = run(bounded).await;
            (b, run(exhaustive).await)
        } else {
            let e = run(exhaustive).await;
            (run(bounded).await, e)
        };
        if i >= 10 {
            tb.push(b_ms);
            te.push(e_ms);
            let (rb, re) = (recalled(&b), recalled(&e));
            shared += rb.intersection(&re).count();
            of += re.len();
        }
    }
    let (rss, peak) = rss_kib();
    let pss = pss_kib();
    // The database work of a call, counted (not timed) on a handle of its own, after the
    // timed calls and the memory readings: median over 21 queries per path.
    let (work_b, work_e) = if model || mem.sqlite().is_none() {
        (0, 0)
    } else {
        mem.close().await.unwrap();
        let counted = MemoryHarness::builder(db)
            .embedder(Arc::new(HashEmbedder::new(384)))
            .embedding_cache(false)
            .store_options(|o| o.count_sql_work = true)
            .build()
            .await
            .unwrap();
        let store = counted.sqlite().unwrap().clone();
        let mut work = [Vec::new(), Vec::new()];
        for q in queries(n).iter().skip(10).take(21) {
            for (path, opts) in [bounded, exhaustive].into_iter().enumerate() {
                let before = store.sql_work().unwrap();
                counted
                    .assemble_context_with("t", q, 2_000, opts)
                    .await
                    .unwrap();
                work[path].push(store.sql_work().unwrap() - before);
            }
        }
        let [mut b, mut e] = work;
        b.sort_unstable();
        e.sort_unstable();
        (b[b.len() / 2], e[e.len() / 2])
    };
    println!(
        "RESULT {} {} {} {} {} {} {} {} {} {work_b} {work_e}",
        pct(&tb, 0.5),
        pct(&tb, 0.99),
        pct(&te, 0.5),
        pct(&te, 0.99),
        shared as f64 / of.max(1) as f64,
        rss,
        peak,
        store_bytes(std::path::Path::new(db)),
        pss
    );
}

fn run_child(db: &std::path::Path, n: usize, model: bool) -> Vec<f64> {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .env("CONTEXT_SCALE_CHILD", db)
        .env("CONTEXT_SCALE_N", n.to_string())
        .env("CONTEXT_SCALE_MODEL", if model { "1" } else { "0" })
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("child failed: {text}"));
    line.split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect()
}

#[tokio::main]
async fn main() {
    if let Ok(db) = std::env::var("CONTEXT_SCALE_CHILD") {
        let n = std::env::var("CONTEXT_SCALE_N").unwrap().parse().unwrap();
        let model = std::env::var("CONTEXT_SCALE_MODEL").as_deref() == Ok("1");
        child(&db, n, model).await;
        return;
    }
    let sizes: Vec<usize> = std::env::var("CAIRN_BENCH_THREAD_SIZES")
        .unwrap_or_else(|_| "1000,10000,50000".to_owned())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    println!(
        "| turns | build + consolidate (s) | bounded p50 / p99 (ms) | exhaustive p50 / p99 (ms) | with the model: bounded p50 / p99 | exhaustive p50 / p99 | bounded recalls of exhaustive's | reader RSS / peak (MiB) | reader PSS (MiB) | store on disk (MiB) | SQL work a call, bounded / exhaustive (10³ VM instructions) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in sizes {
        let tmp = tempfile::tempdir().unwrap();
        // `CAIRN_BENCH_STORE_DIR` keeps the stores there and reuses them (build time 0).
        let keep = std::env::var("CAIRN_BENCH_STORE_DIR").ok();
        let pg = std::env::var("CAIRN_BENCH_PG").ok();
        let db = match (&pg, &keep) {
            (Some(url), _) => std::path::PathBuf::from(cairn_harness::with_schema(
                url,
                &format!("bench_scale_{n}_{}", std::process::id()),
            )),
            (None, Some(d)) => std::path::Path::new(d).join(format!("scale-{n}.db")),
            (None, None) => tmp.path().join("scale.db"),
        };
        let built = Instant::now();
        if pg.is_some() || !db.exists() {
            let mem = MemoryHarness::builder(&db)
                .embedder(Arc::new(HashEmbedder::new(384)))
                .build()
                .await
                .unwrap();
            let thread = ThreadId::new("t").unwrap();
            let mut rng = Lcg(42);
            // 2015-01-01: four sessions a day, so 200,000 turns end in 2021, in the past
            // (consolidation summarizes what is older than now).
            let t0 = chrono::DateTime::from_timestamp(1_420_070_400, 0).unwrap();
            for start in (0..n).step_by(1_000) {
                let batch: Vec<NewMemory> = (start..(start + 1_000).min(n))
                    .map(|i| {
                        let who = if i % 2 == 0 { "Ann" } else { "Bob" };
                        let len = 6 + rng.next() % 20;
                        let at = t0
                            + chrono::Duration::days((i / 80) as i64)
                            + chrono::Duration::hours(6 * ((i / 20) % 4) as i64)
                            + chrono::Duration::seconds(30 * (i % 20) as i64);
                        NewMemory::conversational(
                            thread.clone(),
                            Role::User,
                            format!("{who}: {}.", rng.words(len)),
                        )
                        .at(at)
                        .with_speaker(who)
                    })
                    .collect();
                mem.add_many(batch).await.unwrap();
            }
            mem.consolidate(
                ConsolidationPolicy::older_than(std::time::Duration::ZERO)
                    .max_age(std::time::Duration::ZERO),
            )
            .await
            .unwrap();
        }
        let build_s = built.elapsed().as_secs_f64();
        let plain = run_child(&db, n, false);
        let model = run_child(&db, n, true);
        let mib = |kib: f64| kib / 1024.0;
        println!(
            "| {n} | {build_s:.0} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {:.3} | {:.0} / {:.0} | {:.0} | {:.0} | {:.0} / {:.0} |",
            plain[0],
            plain[1],
            plain[2],
            plain[3],
            model[0],
            model[1],
            model[2],
            model[3],
            plain[4],
            mib(plain[5]),
            mib(plain[6]),
            mib(plain[8]),
            plain[7] / 1_048_576.0,
            plain[9] / 1e3,
            plain[10] / 1e3
        );
    }
}
