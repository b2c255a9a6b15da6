//! The harness on PostgreSQL (`postgres://` locations) behaves as on SQLite: the same
//! script — turns over several threads, consolidation, context assembly, search, an edit
//! and its refresh, a late turn, a summary-buffer conversation, forgetting, a backup moved
//! between the backends — gives the same observable results on both.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{forest, harness, now};

use std::collections::BTreeSet;
use std::time::Duration;

use cairn_core::{MemoryKind, NewMemory, Role, ThreadId};
use cairn_harness::{
    ConsolidationPolicy, Filter, Forget, MemoryHarness, SearchMode, SearchOptions,
    SummaryBufferMemory, SummaryBufferOptions,
};

/// A `postgres://` URL of the test server, with a fresh schema.
fn pg_url(tag: &str) -> String {
    let s = cairn_pg::testing::server();
    format!(
        "postgres://cairn@127.0.0.1:{}/postgres?schema=h{}_{tag}",
        s.port,
        std::process::id()
    )
}

/// Two threads of turns with speakers, 20 days old, and a few from the last hour.
async fn seed(mem: &MemoryHarness) {
    for t in 0..2 {
        let thread = ThreadId::new(format!("thread-{t}")).unwrap();
        let batch: Vec<NewMemory> = (0..90usize)
            .map(|i| {
                let at = if i >= 86 {
                    now() - chrono::Duration::minutes(((90 - i) as i64) * 5)
                } else {
                    now() - chrono::Duration::days(20) + chrono::Duration::minutes(i as i64 * 10)
                };
                let role = if i % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                };
                let topic = [
                    "sailing", "bread", "chess", "violin", "gardens", "trains", "tea",
                ];
                let mut m = NewMemory::conversational(
                    thread.clone(),
                    role,
                    format!(
                        "In thread {t}, turn {i} is about {}. Detail number {i} follows.",
                        topic[i % 7]
                    ),
                )
                .at(at);
                m.metadata
                    .insert("speaker".into(), serde_json::json!(["Ana", "Bo"][i % 2]));
                m
            })
            .collect();
        mem.add_many(batch).await.unwrap();
    }
}

fn contents(ms: &[cairn_core::MemoryUnit]) -> Vec<String> {
    ms.iter().map(|m| m.content.clone()).collect()
}

/// Runs the script and returns what it observed, one line per observation.
async fn script(mem: &MemoryHarness) -> Vec<String> {
    let mut seen = Vec::new();
    seed(mem).await;
    let policy = ConsolidationPolicy::older_than(Duration::from_secs(3600)).fanout(3);
    let r = mem.consolidate(policy.clone()).await.unwrap();
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    seen.push(format!(
        "consolidated {:?} covering {}",
        r.chunks_per_level, r.memories_covered
    ));
    seen.push(format!("forest {:?}", forest(mem, None).await));

    // Context assembly: summaries, recalled turns, recent turns.
    let ctx = mem
        .assemble_context("thread-0", "What did Bo say about chess?", 700)
        .await
        .unwrap();
    seen.push(format!("context {} tokens:\n{}", ctx.tokens, ctx.render()));

    // Search in every mode, and over summaries only.
    for mode in [SearchMode::Vector, SearchMode::Keyword, SearchMode::Hybrid] {
        let hits = mem
            .search(
                "violin detail",
                SearchOptions {
                    k: Some(5),
                    mode,
                    filter: Filter::all().thread(ThreadId::new("thread-1").unwrap()),
                    ..SearchOptions::default()
                },
            )
            .await
            .unwrap();
        let found: Vec<&str> = hits.iter().map(|h| h.memory.content.as_str()).collect();
        seen.push(format!("search {mode:?} {found:?}"));
    }

    // An edit marks the summaries above stale; consolidation refreshes them.
    let turns = mem
        .list(
            Filter::all()
                .thread(ThreadId::new("thread-0").unwrap())
                .kinds([MemoryKind::Conversational]),
            0,
            usize::MAX,
        )
        .await
        .unwrap();
    mem.update(
        turns[3].id,
        "In thread 0, turn 3 was corrected: it is about kites.",
    )
    .await
    .unwrap();
    let stale = mem.stats().await.unwrap().store.stale_summaries;
    seen.push(format!("stale after edit {stale}"));
    // A turn arriving late, dated inside a summarized stretch, joins its chunk.
    let late = NewMemory::conversational(
        ThreadId::new("thread-0").unwrap(),
        Role::User,
        "A late note in thread 0 about kites and harbours.",
    )
    .at(now() - chrono::Duration::days(20) + chrono::Duration::minutes(125));
    mem.add_many(vec![late]).await.unwrap();
    let r = mem.consolidate(policy).await.unwrap();
    seen.push(format!(
        "refreshed {} placed {} new {:?}",
        r.refreshed.len(),
        r.placed.len(),
        r.chunks_per_level
    ));
    seen.push(format!(
        "forest after refresh {:?}",
        forest(mem, None).await
    ));

    // A summary-buffer conversation folds its oldest turns into a moving summary.
    let buf = SummaryBufferMemory::open(
        mem.clone(),
        "buffer",
        SummaryBufferOptions {
            max_token_limit: 120,
            ..SummaryBufferOptions::default()
        },
    )
    .await
    .unwrap();
    for i in 0..12 {
        buf.save_context(
            &format!("Question {i}: how do I keep sourdough starter {i} alive?"),
            &format!("Answer {i}: feed it flour and water, sample {i}."),
        )
        .await
        .unwrap();
    }
    let vars: BTreeSet<String> = buf
        .load_memory_variables()
        .await
        .into_iter()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect();
    seen.push(format!("buffer {vars:?}"));
    let recent = mem.get_conversational("buffer", 6).await.unwrap();
    seen.push(format!("buffer recent {:?}", contents(&recent)));

    // Forgetting a turn rewrites the summaries that cited it.
    let turns = mem
        .list(
            Filter::all()
                .thread(ThreadId::new("thread-1").unwrap())
                .kinds([MemoryKind::Conversational]),
            0,
            usize::MAX,
        )
        .await
        .unwrap();
    let report = mem.forget(Forget::Ids(vec![turns[10].id])).await.unwrap();
    seen.push(format!(
        "forgot {} resummarized {}",
        report.deleted.len(),
        report.resummarized.len()
    ));
    seen.push(format!(
        "forest after forget {:?}",
        forest(mem, Some("thread-1")).await
    ));
    let s = mem.stats().await.unwrap().store;
    let mut kinds: Vec<_> = s.by_kind.into_iter().collect();
    kinds.sort();
    let mut levels: Vec<_> = s.by_level.into_iter().collect();
    levels.sort();
    seen.push(format!(
        "stats {} {kinds:?} {levels:?} links {}",
        s.total, s.links
    ));
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_behaves_the_same_on_both_backends() {
    let dir = tempfile::tempdir().unwrap();
    let lite = harness(&dir.path().join("s.db"), None).await;
    let url = pg_url("same");
    let pg = harness(std::path::Path::new(&url), None).await;
    assert_eq!(pg.store().backend_name(), "postgres");
    assert!(pg.sqlite().is_none());
    assert!(!pg.location().contains("password"));

    let a = script(&lite).await;
    let b = script(&pg).await;
    if std::env::var_os("CAIRN_SHOW").is_some() {
        eprintln!("{}", a.join("\n"));
    }
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x, y, "sqlite and postgres differ");
    }
    assert_eq!(a.len(), b.len());

    // A backup of the PostgreSQL store restores into a fresh SQLite store, and back.
    let file = dir.path().join("pg.jsonl");
    let out = std::fs::File::create(&file).unwrap();
    let n = pg.export_backup(out, true).await.unwrap();
    let copy = harness(&dir.path().join("copy.db"), None).await;
    let imported = copy.import_backup(&file).await.unwrap();
    assert_eq!(imported.added, n);
    assert_eq!(forest(&copy, None).await, forest(&pg, None).await);
    let again = harness(std::path::Path::new(&pg_url("again")), None).await;
    let file2 = dir.path().join("lite.jsonl");
    let n2 = copy
        .export_backup(std::fs::File::create(&file2).unwrap(), true)
        .await
        .unwrap();
    assert_eq!(n2, n);
    assert_eq!(again.import_backup(&file2).await.unwrap().added, n);
    assert_eq!(forest(&again, None).await, forest(&pg, None).await);
}
