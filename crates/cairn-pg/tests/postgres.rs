//! PostgreSQL-specific behaviour: filtered HNSW walks that come back short, several
//! processes on one database, schemas as separate stores, model identity.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

use cairn_core::{MemoryKind, NewMemory};
use cairn_pg::{PgOptions, PgStore};
use cairn_store::conformance::{vector, DIM};
use cairn_store::{Filter, MemoryBackend, MetaFilter, StoreError};
use serde_json::json;

fn options() -> PgOptions {
    cairn_pg::testing::server().options("pg-tests", DIM)
}

/// A metadata filter the planner cannot see through sends the query down the HNSW index,
/// whose walk (ef_search candidates, filtered afterwards) finds few of the 1% admitted:
/// the search notices the short answer and scores the admitted rows exactly.
#[test]
fn short_index_walks_fall_back_to_an_exact_scan() {
    let mut o = options();
    o.exact_scan_max = 0;
    let store = PgStore::open(o).unwrap();
    let mut rare = Vec::new();
    for chunk in 0..8u64 {
        let items: Vec<(NewMemory, Vec<f32>)> = (0..1_000u64)
            .map(|j| {
                let i = chunk * 1_000 + j;
                let mut meta = cairn_core::Metadata::new();
                meta.insert(
                    "tag".into(),
                    json!(if i % 100 == 3 { "rare" } else { "common" }),
                );
                (
                    NewMemory::new(MemoryKind::Knowledge, format!("fact {i}")).with_metadata(meta),
                    vector(i),
                )
            })
            .collect();
        let stored = store.insert_batch(items).unwrap();
        rare.extend(
            stored
                .iter()
                .filter(|m| m.metadata["tag"] == json!("rare"))
                .map(|m| m.id),
        );
    }
    assert_eq!(rare.len(), 80);
    let f = Filter::all().meta(MetaFilter::eq("tag", "rare"));
    for probe in 0..5 {
        let hits = store
            .search_vector(vector(1_000_000 + probe), 10, &f)
            .unwrap();
        assert_eq!(hits.len(), 10);
        assert!(hits.iter().all(|h| rare.contains(&h.memory.id)));
    }
    store.drop_schema().unwrap();
}

/// Two stores in two schemas of one database are separate; reopening a schema with another
/// model is refused.
#[test]
fn schemas_are_separate_stores_bound_to_one_model() {
    let a = options();
    let b = options();
    let sa = PgStore::open(a.clone()).unwrap();
    let sb = PgStore::open(b).unwrap();
    sa.insert(
        NewMemory::new(MemoryKind::Knowledge, "only in a"),
        vector(1),
    )
    .unwrap();
    assert_eq!(sa.recent(&Filter::all(), 10).unwrap().len(), 1);
    assert!(sb.recent(&Filter::all(), 10).unwrap().is_empty());
    let mut other = a.clone();
    other.model_id = "another-model".into();
    assert!(matches!(
        PgStore::open(other),
        Err(StoreError::ModelMismatch { .. })
    ));
    let mut bad = a;
    bad.schema = "Robert'); DROP TABLE x;--".into();
    assert!(matches!(PgStore::open(bad), Err(StoreError::Config(_))));
    // Reopening finds what was written.
    let again = PgStore::open(sa.options().clone()).unwrap();
    assert_eq!(again.recent(&Filter::all(), 10).unwrap().len(), 1);
}

const CHILD_URL: &str = "CAIRN_PG_CHILD_URL";
const CHILD_SCHEMA: &str = "CAIRN_PG_CHILD_SCHEMA";
const CHILD_ROLE: &str = "CAIRN_PG_CHILD_ROLE";

fn child_store() -> Option<(String, PgStore)> {
    let url = std::env::var(CHILD_URL).ok()?;
    let schema = std::env::var(CHILD_SCHEMA).ok()?;
    let role = std::env::var(CHILD_ROLE).ok()?;
    let store = PgStore::open(PgOptions::new(url, "pg-tests", DIM).schema(schema)).unwrap();
    Some((role, store))
}

fn spawn_child(test: &str, o: &PgOptions, role: &str) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(CHILD_URL, &o.url)
        .env(CHILD_SCHEMA, &o.schema)
        .env(CHILD_ROLE, role)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn thread(name: &str) -> cairn_core::ThreadId {
    cairn_core::ThreadId::new(name).unwrap()
}

/// The child side of `two_processes_share_one_store`: writes its thread's turns in batches
/// (plus keyed memories both children write), summarizes them, marks itself done, then waits
/// until it reads the other child's mark. Does nothing unless started by that test.
#[test]
fn sharing_child() {
    use std::io::Write;
    let Some((role, store)) = child_store() else {
        return;
    };
    let other = if role == "a" { "b" } else { "a" };
    let t = thread(&format!("thread-{role}"));
    let mut out = std::io::stdout().lock();
    let mut mine = Vec::new();
    for batch in 0..20u64 {
        let mut items: Vec<(NewMemory, Vec<f32>)> = (0..10u64)
            .map(|j| {
                let i = batch * 10 + j;
                (
                    NewMemory::conversational(
                        t.clone(),
                        cairn_core::Role::User,
                        format!("{role} says {i}"),
                    ),
                    vector(i + if role == "a" { 0 } else { 10_000 }),
                )
            })
            .collect();
        // Both children write the same keyed facts: one copy each in the end.
        items.push((
            NewMemory::new(MemoryKind::Knowledge, format!("shared fact {batch}"))
                .with_key(&format!("shared/{batch}")),
            vector(50_000 + batch),
        ));
        for m in store.insert_batch(items).unwrap() {
            writeln!(out, "M {}", m.id).unwrap();
            if m.kind == MemoryKind::Conversational {
                mine.push(m.id);
            }
        }
        if batch % 5 == 4 {
            let s = store
                .add_summary(
                    cairn_store::NewSummary::new(
                        format!("{role} part {batch}"),
                        mine[mine.len() - 50..].to_vec(),
                    )
                    .with_thread(Some(t.clone())),
                    vector(60_000 + batch),
                )
                .unwrap();
            writeln!(out, "S {}", s.id).unwrap();
        }
    }
    store
        .insert(
            NewMemory::new(MemoryKind::Knowledge, format!("done {role}"))
                .with_key(&format!("done/{role}")),
            vector(1),
        )
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let theirs = cairn_core::MemoryId::from_key(&format!("done/{other}"));
    while store.get(theirs).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "never saw {other}'s writes"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let seen = store
        .recent(
            &Filter::all().thread(thread(&format!("thread-{other}"))),
            1_000,
        )
        .unwrap();
    writeln!(out, "SAW {}", seen.len()).unwrap();
}

/// Two processes write to one store at once: each sees all of the other's writes, keyed
/// memories both wrote exist once, and every thread keeps to itself in search and links.
#[test]
fn two_processes_share_one_store() {
    use std::io::BufRead;
    let o = options();
    let parent = PgStore::open(o.clone()).unwrap();
    let children: Vec<_> = ["a", "b"]
        .iter()
        .map(|r| spawn_child("sharing_child", &o, r))
        .collect();
    let mut acked = std::collections::HashSet::new();
    let mut summaries = Vec::new();
    for mut child in children {
        let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut saw = None;
        for line in lines {
            let line = line.unwrap();
            // libtest prints `test NAME ... ` before the child's first line.
            let line = line.rsplit("... ").next().unwrap_or_default();
            let mut parts = line.split(' ');
            match (parts.next(), parts.next()) {
                (Some("M"), Some(id)) => {
                    acked.insert(id.parse::<cairn_core::MemoryId>().unwrap());
                }
                (Some("S"), Some(id)) => {
                    summaries.push(id.parse::<cairn_core::MemoryId>().unwrap())
                }
                (Some("SAW"), Some(n)) => saw = Some(n.parse::<usize>().unwrap()),
                _ => {}
            }
        }
        assert!(child.wait().unwrap().success());
        // Each child saw the other's 200 turns and 4 summaries.
        assert_eq!(saw, Some(204));
    }
    // 2 x 200 turns, 20 shared facts once, 2 done marks, 2 x 4 summaries.
    assert_eq!(acked.len(), 400 + 20);
    let all = parent.recent(&Filter::all(), 10_000).unwrap();
    assert_eq!(all.len(), 400 + 20 + 2 + 8);
    for id in &acked {
        parent.get(*id).unwrap();
    }
    for role in ["a", "b"] {
        let t = thread(&format!("thread-{role}"));
        let f = Filter::all().thread(t.clone());
        for probe in 0..5 {
            let hits = parent
                .search_vector(vector(70_000 + probe), 20, &f)
                .unwrap();
            assert_eq!(hits.len(), 20);
            assert!(hits.iter().all(|h| h.memory.thread_id.as_ref() == Some(&t)));
        }
    }
    for s in &summaries {
        let s = parent.get(*s).unwrap();
        for leaf in parent.leaves(s.id).unwrap() {
            assert_eq!(leaf.thread_id, s.thread_id);
        }
    }
    parent.drop_schema().unwrap();
}

/// The child side of `sigkill_mid_write_loses_nothing_acknowledged`: writes batches (each
/// tagged with its number and size) and summaries forever, printing what was acknowledged.
/// Does nothing unless started by that test.
#[test]
fn crash_child() {
    use std::io::Write;
    let Some((role, store)) = child_store() else {
        return;
    };
    let round: u64 = role.parse().unwrap();
    let mut out = std::io::stdout().lock();
    let mut recent = Vec::new();
    for b in 0u64.. {
        let n = 1 + (b * 7 + round) % 25;
        let items: Vec<(NewMemory, Vec<f32>)> = (0..n)
            .map(|j| {
                let mut meta = cairn_core::Metadata::new();
                meta.insert("batch".into(), json!(format!("{round}/{b}")));
                meta.insert("size".into(), json!(n));
                (
                    NewMemory::new(
                        MemoryKind::Knowledge,
                        format!("round {round} batch {b} item {j}"),
                    )
                    .with_metadata(meta),
                    vector(round * 1_000_000 + b * 100 + j),
                )
            })
            .collect();
        for m in store.insert_batch(items).unwrap() {
            writeln!(out, "M {}", m.id).unwrap();
            recent.push(m.id);
        }
        if b % 3 == 2 {
            let srcs = recent[recent.len().saturating_sub(4)..].to_vec();
            let s = store
                .add_summary(
                    cairn_store::NewSummary::new("summary", srcs.clone()),
                    vector(b),
                )
                .unwrap();
            let list: Vec<String> = srcs.iter().map(ToString::to_string).collect();
            writeln!(out, "S {} {}", s.id, list.join(",")).unwrap();
        }
        out.flush().unwrap();
    }
}

/// A writer process is SIGKILLed mid-write (5 rounds, one store): every acknowledged memory
/// and summary (with its links) is there afterwards, and every batch is whole or absent.
#[test]
fn sigkill_mid_write_loses_nothing_acknowledged() {
    use std::io::BufRead;
    let o = options();
    let store = PgStore::open(o.clone()).unwrap();
    let mut acked = Vec::new();
    let mut acked_s: Vec<(cairn_core::MemoryId, Vec<cairn_core::MemoryId>)> = Vec::new();
    for round in 0..5u32 {
        let mut child = spawn_child("crash_child", &o, &round.to_string());
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let kill_after = 100 + 37 * round as usize;
        let mut n = 0;
        while let Some(Ok(line)) = lines.next() {
            let line = line.rsplit("... ").next().unwrap_or_default();
            let mut parts = line.split(' ');
            match parts.next() {
                Some("M") => acked.push(
                    parts
                        .next()
                        .unwrap()
                        .parse::<cairn_core::MemoryId>()
                        .unwrap(),
                ),
                Some("S") => {
                    let id = parts.next().unwrap().parse().unwrap();
                    let srcs = parts
                        .next()
                        .unwrap()
                        .split(',')
                        .map(|x| x.parse().unwrap())
                        .collect();
                    acked_s.push((id, srcs));
                }
                _ => continue,
            }
            n += 1;
            if n >= kill_after {
                break;
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        for id in &acked {
            store
                .get(*id)
                .unwrap_or_else(|e| panic!("round {round}: acknowledged {id} lost: {e}"));
        }
        for (id, srcs) in &acked_s {
            let got: Vec<_> = store.sources(*id).unwrap().iter().map(|m| m.id).collect();
            assert_eq!(&got, srcs, "round {round}: summary {id} keeps its links");
        }
        let mut batches: std::collections::HashMap<String, (usize, usize)> = Default::default();
        for m in store
            .recent(&Filter::all().kinds([MemoryKind::Knowledge]), 1_000_000)
            .unwrap()
        {
            let e = batches
                .entry(m.metadata["batch"].as_str().unwrap().to_owned())
                .or_insert((0, m.metadata["size"].as_u64().unwrap() as usize));
            e.0 += 1;
        }
        for (b, (got, size)) in batches {
            assert_eq!(got, size, "round {round}: batch {b} is whole");
        }
    }
    store.drop_schema().unwrap();
}

/// A runtime for the tests' own connections.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A connection of the test's own on the store's schema (inside [`runtime`]).
async fn connect(o: &PgOptions) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(&o.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    c.batch_execute(&format!("SET search_path = {}, public", o.schema))
        .await
        .unwrap();
    c
}

/// Runs `text` on the store's schema with a connection of its own; the rows' first two
/// columns as integers.
fn sql(o: &PgOptions, text: &str) -> Vec<(i64, i64)> {
    runtime().block_on(async {
        let c = connect(o).await;
        let mut out = Vec::new();
        for m in c.simple_query(text).await.unwrap() {
            if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                let n = |i: usize| r.get(i).map_or(0, |v| v.parse::<i64>().unwrap());
                out.push((n(0), if r.len() > 1 { n(1) } else { 0 }));
            }
        }
        out
    })
}

/// 1 when the keyword index keeps a pending list (GIN's `fastupdate`, on by default).
fn fts_fastupdate(o: &PgOptions) -> i64 {
    sql(
        o,
        &format!(
            "SELECT CASE WHEN 'fastupdate=off' = ANY(coalesce(c.reloptions, '{{}}')) THEN 0 ELSE 1 END
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = '{}' AND c.relname = 'memories_fts'",
            o.schema
        ),
    )[0]
    .0
}

/// The BM25 statistics (memories, tokens) as kept, and as recounted from the rows.
fn fts_stats(o: &PgOptions) -> ((i64, i64), (i64, i64)) {
    let kept = sql(o, "SELECT sum(docs), sum(tokens) FROM fts_stats")[0];
    let counted = sql(
        o,
        "SELECT count(*), coalesce(sum(cairn_doclen(fts)), 0) FROM memories",
    )[0];
    (kept, counted)
}

/// The statistics BM25 ranks with stay exact through every kind of write, from two
/// processes' worth of writers at once, and their rows are folded as they accumulate.
#[test]
fn bm25_statistics_follow_every_write() {
    let o = options();
    let store = PgStore::open(o.clone()).unwrap();
    let t = thread("stats");
    let turns = store
        .insert_batch(
            (0..40u64)
                .map(|i| {
                    let text = format!("turn {i} about the garden and the {i} roses");
                    (
                        NewMemory::conversational(t.clone(), cairn_core::Role::User, text),
                        vector(i),
                    )
                })
                .collect(),
        )
        .unwrap();
    let s = store
        .add_summary(
            cairn_store::NewSummary::new(
                "the garden, summed up",
                turns[..10].iter().map(|m| m.id).collect(),
            )
            .with_thread(Some(t.clone())),
            vector(100),
        )
        .unwrap();
    store
        .update(
            turns[3].id,
            "a much longer text than before, with many more words to count".into(),
            None,
            vector(3),
        )
        .unwrap();
    let mut patch = cairn_core::Metadata::new();
    patch.insert("speaker".into(), json!("Ann"));
    store.patch_metadata(turns[20].id, patch).unwrap();
    store
        .delete_many(
            &turns[30..35].iter().map(|m| m.id).collect::<Vec<_>>(),
            cairn_store::DeletePolicy::Restrict,
        )
        .unwrap();
    store
        .delete(s.id, cairn_store::DeletePolicy::Restrict)
        .unwrap();
    let (kept, counted) = fts_stats(&o);
    assert_eq!(kept, counted);
    // Two writers at once, one statement each per memory: 2 x 80 delta rows, folded.
    std::thread::scope(|scope| {
        for w in 0..2u64 {
            let o = o.clone();
            let t = t.clone();
            scope.spawn(move || {
                let store = PgStore::open(o).unwrap();
                for i in 0..80u64 {
                    store
                        .insert(
                            NewMemory::conversational(
                                t.clone(),
                                cairn_core::Role::Assistant,
                                format!("writer {w} line {i} on tulips"),
                            ),
                            vector(1_000 + w * 100 + i),
                        )
                        .unwrap();
                }
            });
        }
    });
    let (kept, counted) = fts_stats(&o);
    assert_eq!(kept, counted);
    assert_eq!(counted.0, 40 - 5 + 160);
    let rows = sql(&o, "SELECT count(*) FROM fts_stats")[0].0;
    assert!(
        rows < 100,
        "{rows} delta rows: they are folded as they come"
    );
    store.drop_schema().unwrap();
}

/// A store written by schema version 1 (no BM25 statistics, no speaker index) is migrated
/// on open: the statistics are counted from its rows and speakers are read through the index.
#[test]
fn version_1_stores_migrate_to_the_current_version() {
    let o = options();
    let store = PgStore::open(o.clone()).unwrap();
    let t = thread("old");
    let mut items = Vec::new();
    for i in 0..30u64 {
        let mut meta = cairn_core::Metadata::new();
        meta.insert(
            "speaker".into(),
            json!(["Ann", "Bob", "Cy"][usize::try_from(i % 3).unwrap()]),
        );
        items.push((
            NewMemory::conversational(t.clone(), cairn_core::Role::User, format!("line {i} hello"))
                .with_metadata(meta),
            vector(i),
        ));
    }
    store.insert_batch(items).unwrap();
    drop(store);
    // Back to version 1, as a build of that version left it.
    sql(
        &o,
        "DROP TRIGGER memories_fts_stats_insert ON memories;
         DROP TRIGGER memories_fts_stats_update ON memories;
         DROP TRIGGER memories_fts_stats_delete ON memories;
         DROP FUNCTION cairn_fts_stats(); DROP TABLE fts_stats;
         DROP INDEX memories_thread_speaker; DROP INDEX memories_thread_kind_level;
         DROP FUNCTION cairn_doclen(tsvector);
         ALTER INDEX memories_fts RESET (fastupdate);
         UPDATE cairn_meta SET value = '1' WHERE key = 'schema_version';",
    );
    assert_eq!(fts_fastupdate(&o), 1);
    let store = PgStore::open(o.clone()).unwrap();
    assert_eq!(
        sql(
            &o,
            "SELECT value::bigint FROM cairn_meta WHERE key = 'schema_version'"
        )[0]
        .0,
        3
    );
    assert_eq!(fts_fastupdate(&o), 0, "version 3: no pending list");
    let (kept, counted) = fts_stats(&o);
    assert_eq!(kept, counted);
    assert_eq!(kept.0, 30);
    assert_eq!(store.thread_speakers(&t).unwrap(), vec!["Ann", "Bob", "Cy"]);
    assert_eq!(
        store
            .search_keyword("hello", 50, &Filter::all())
            .unwrap()
            .len(),
        30
    );
    store.drop_schema().unwrap();
}

/// Folding the statistics' delta rows never fails a write, even in a repeatable-read
/// transaction whose snapshot still holds rows another writer has folded since.
#[test]
fn folding_statistics_never_fails_a_write() {
    let o = options();
    let store = PgStore::open(o.clone()).unwrap();
    let v = format!(
        "[{}]",
        vector(1)
            .iter()
            .map(f32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    let insert = format!(
        "INSERT INTO memories (id, kind, content, created_at, model_id, embedding)
         VALUES (gen_random_uuid(), 'knowledge', 'a fact about otters', now(), 'pg-tests', '{v}')"
    );
    runtime().block_on(async {
        let a = connect(&o).await;
        let b = connect(&o).await;
        a.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM fts_stats")
            .await
            .unwrap();
        // B writes until its delta row 64 folds every committed row, A's snapshot's included.
        loop {
            b.batch_execute(&insert).await.unwrap();
            let last: i64 = b
                .query_one("SELECT max(id) FROM fts_stats", &[])
                .await
                .unwrap()
                .get(0);
            if last > 64 {
                break;
            }
        }
        // A's next delta row is a folding one; the rows it would fold are gone.
        a.batch_execute("SELECT setval(pg_get_serial_sequence('fts_stats', 'id'), 127)")
            .await
            .unwrap();
        a.batch_execute(&insert).await.unwrap();
        a.batch_execute("COMMIT").await.unwrap();
    });
    let (kept, counted) = fts_stats(&o);
    assert_eq!(kept, counted);
    store.drop_schema().unwrap();
}

/// The oid of the store's HNSW index, 0 when it has none.
fn index_oid(o: &PgOptions) -> i64 {
    sql(
        o,
        &format!(
            "SELECT coalesce((SELECT c.oid::bigint FROM pg_class c
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = '{}' AND c.relname = 'memories_embedding'), 0)",
            o.schema
        ),
    )[0]
    .0
}

/// A bulk load large beside the store takes the HNSW index down and builds it again; a
/// small one keeps it; a store left without the index (a loader that died part way) gets
/// it back when it is next opened.
#[test]
fn bulk_loads_rebuild_the_vector_index() {
    assert!(matches!(
        PgStore::open(options().index_build_memory_mb(0)),
        Err(StoreError::Config(_))
    ));
    let o = options().index_build_memory_mb(64);
    let store = PgStore::open(o.clone()).unwrap();
    let first = index_oid(&o);
    assert_ne!(first, 0);
    let n = cairn_pg::BULK_REBUILD_MIN;
    let items = (0..n as u64)
        .map(|i| {
            (
                NewMemory::new(MemoryKind::Knowledge, format!("fact {i}")),
                vector(i),
            )
        })
        .collect();
    let units = store.insert_bulk(items).unwrap();
    assert_eq!(units.len(), n);
    let rebuilt = index_oid(&o);
    assert!(rebuilt != 0 && rebuilt != first, "{first} -> {rebuilt}");
    for i in (0..n).step_by(997) {
        let hits = store
            .search_vector(vector(i as u64), 3, &Filter::all())
            .unwrap();
        assert_eq!(hits[0].memory.id, units[i].id);
    }
    let small = (0..100u64)
        .map(|i| {
            (
                NewMemory::new(MemoryKind::Knowledge, format!("more {i}")),
                vector(50_000 + i),
            )
        })
        .collect();
    store.insert_bulk(small).unwrap();
    assert_eq!(index_oid(&o), rebuilt, "a small load keeps the index");
    sql(&o, "DROP INDEX memories_embedding");
    assert_eq!(index_oid(&o), 0);
    let reopened = PgStore::open(o.clone()).unwrap();
    assert_ne!(index_oid(&o), 0, "the next open builds the index");
    let hits = reopened
        .search_vector(vector(50_042), 1, &Filter::all())
        .unwrap();
    assert_eq!(hits[0].memory.content, "more 42");
    store.drop_schema().unwrap();
}

/// A handle that inserts a thousand rows or more has the tables analyzed at once (a manual
/// `ANALYZE`, counted apart from autovacuum's), so the planner does not take a table grown
/// in bulk for an empty one until autovacuum gets to it; fewer rows, or rows already
/// stored, do not count.
#[test]
fn bulk_inserts_are_analyzed_at_once() {
    let o = options();
    let store = PgStore::open(o.clone()).unwrap();
    let stats = || {
        sql(
            &o,
            &format!(
                "SELECT s.analyze_count, c.reltuples::bigint
                   FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
                  WHERE s.schemaname = '{}' AND s.relname = 'memories'",
                o.schema
            ),
        )[0]
    };
    // Fixed ids, so a batch sent again is a retry.
    let batch = |from: u64| -> Vec<(NewMemory, Vec<f32>)> {
        (from..from + 100)
            .map(|i| {
                let id = cairn_core::MemoryId::from_bytes(u128::from(i + 1).to_be_bytes());
                (
                    NewMemory::new(MemoryKind::Knowledge, format!("fact {i}")).with_id(id),
                    vector(i),
                )
            })
            .collect()
    };
    for b in 0..9 {
        store.insert_batch(batch(b * 100)).unwrap();
    }
    assert_eq!(stats().0, 0, "analyzed before a thousand rows");
    store.insert_batch(batch(900)).unwrap();
    assert_eq!(stats(), (1, 1_000));
    // A retry of stored rows inserts nothing; a hundred more are not enough.
    store.insert_batch(batch(900)).unwrap();
    store.insert_batch(batch(1_000)).unwrap();
    assert_eq!(stats().0, 1);
    for b in 11..19 {
        store.insert_batch(batch(b * 100)).unwrap();
    }
    assert_eq!(stats().0, 1, "analyzed before a thousand more rows");
    store.insert_batch(batch(1_900)).unwrap();
    assert_eq!(stats(), (2, 2_000));
    assert_eq!(sql(&o, "SELECT count(*) FROM memories")[0].0, 2_000);
    store.drop_schema().unwrap();
}
