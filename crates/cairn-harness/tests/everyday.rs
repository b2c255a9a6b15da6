//! The everyday API of a memory store: metadata filters, upsert by external key, metadata
//! patches, cursor paging, and forgetting that reaches summaries (real model where meaning
//! matters).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::sync::Arc;

use cairn_core::{Embedder, InputError, ManualClock, MemoryId, MemoryKind, NewMemory, Role};
use cairn_embed::{FastEmbedder, HashEmbedder};
use cairn_harness::{
    ContextOptions, ContextScope, Filter, Forget, HarnessError, MemoryHarness, MetaFilter,
    SearchMode, SearchOptions, UpsertOutcome,
};
use cairn_store::StoreError;
use chrono::{DateTime, Duration, Utc};
use serde_json::json;

fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(1_750_000_000, 0).unwrap()
}

async fn open(dir: &tempfile::TempDir, e: Arc<dyn Embedder>) -> MemoryHarness {
    MemoryHarness::builder(dir.path().join("e.db"))
        .embedder(e)
        .clock(Arc::new(ManualClock::new(now())))
        .build()
        .await
        .unwrap()
}

fn hash() -> Arc<dyn Embedder> {
    Arc::new(HashEmbedder::new(64))
}

fn knowledge(text: String, meta: serde_json::Value) -> NewMemory {
    let mut m = NewMemory::new(MemoryKind::Knowledge, text);
    m.metadata = meta.as_object().unwrap().clone();
    m
}

/// Metadata filters hold inside the graph walk: a filter admitting a third of 6,000
/// memories (past the exact-scan threshold) and one admitting 40 both return k results,
/// every one matching; equality, sets, numeric and text ranges, `ne` and `exists` each
/// select exactly the rows they name, in search and in listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_filters_in_search_and_listing() {
    let dir = tempfile::tempdir().unwrap();
    let mem = open(&dir, hash()).await;
    let batch: Vec<NewMemory> = (0..6_000)
        .map(|i| {
            let mut meta = json!({
                "user_id": format!("u{}", i % 3),
                "priority": i % 10,
                "seen": format!("2026-0{}-15T00:00:00Z", 1 + i % 9),
            });
            if i % 150 == 0 {
                meta["tag"] = json!("rare");
            }
            knowledge(
                format!("note {i} about topic {} and subject {}", i % 17, i % 23),
                meta,
            )
        })
        .collect();
    for chunk in batch.chunks(1_000) {
        mem.add_many(chunk.to_vec()).await.unwrap();
    }
    for (cond, expect) in [
        (MetaFilter::eq("user_id", "u1"), 2_000usize),
        (MetaFilter::eq("tag", "rare"), 40),
        (MetaFilter::new("tag").exists(true), 40),
        (MetaFilter::new("tag").exists(false), 5_960),
        (MetaFilter::new("priority").gte(3).lt(5), 1_200),
        (MetaFilter::new("priority").one_of([0, 9]), 1_200),
        (MetaFilter::new("user_id").ne("u0"), 4_000),
        (
            MetaFilter::new("seen")
                .gte("2026-02-01T00:00:00Z")
                .lt("2026-04-01T00:00:00Z"),
            1_334,
        ),
    ] {
        for mode in [SearchMode::Vector, SearchMode::Keyword, SearchMode::Hybrid] {
            let hits = mem
                .search(
                    "note about topic 5 and subject 7",
                    SearchOptions::all().k(10).mode(mode).meta(cond.clone()),
                )
                .await
                .unwrap();
            assert_eq!(hits.len(), 10, "{cond:?} {mode:?}");
            for h in &hits {
                assert!(
                    matches(&h.memory.metadata, &cond),
                    "{cond:?}: {:?}",
                    h.memory.metadata
                );
            }
        }
        let mut seen = 0;
        let mut cursor = None;
        loop {
            let page = mem
                .list_page(Filter::all().meta(cond.clone()), cursor, 700)
                .await
                .unwrap();
            for m in &page.items {
                assert!(matches(&m.metadata, &cond));
            }
            seen += page.items.len();
            match page.next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(seen, expect, "{cond:?}");
    }
    // Conditions combine with each other and with kinds.
    let both = mem
        .list_page(
            Filter::all()
                .kinds([MemoryKind::Knowledge])
                .meta(MetaFilter::eq("user_id", "u0"))
                .meta(MetaFilter::eq("tag", "rare")),
            None,
            100,
        )
        .await
        .unwrap();
    assert_eq!(both.items.len(), 40);
    assert!(mem
        .list_page(
            Filter::all()
                .kinds([MemoryKind::Conversational])
                .meta(MetaFilter::eq("user_id", "u0")),
            None,
            10
        )
        .await
        .unwrap()
        .items
        .is_empty());
    // Bad conditions are typed errors.
    for bad in [
        MetaFilter::new("user_id"),
        MetaFilter::eq("", "x"),
        MetaFilter::eq("a\"b", "x"),
        MetaFilter::eq("user_id", json!({"nested": 1})),
        MetaFilter::new("priority").gt(json!(true)),
        MetaFilter::new("tag").one_of(Vec::<String>::new()),
    ] {
        let r = mem
            .search("note", SearchOptions::all().meta(bad.clone()))
            .await;
        assert!(
            matches!(
                r,
                Err(HarnessError::Input(InputError::BadMetadataFilter { .. }))
            ),
            "{bad:?}: {r:?}"
        );
    }
}

/// What a condition admits, computed here independently of SQL.
fn matches(meta: &cairn_core::Metadata, c: &MetaFilter) -> bool {
    let v = meta.get(&c.key);
    let num = |x: &serde_json::Value| x.as_f64();
    let cmp = |a: &serde_json::Value, b: &serde_json::Value| match (num(a), num(b)) {
        (Some(x), Some(y)) => x.partial_cmp(&y),
        _ => a.as_str().zip(b.as_str()).map(|(x, y)| x.cmp(y)),
    };
    if let Some(e) = c.exists {
        if v.is_some() != e {
            return false;
        }
    }
    let Some(v) = v else {
        return c.exists == Some(false);
    };
    use std::cmp::Ordering::*;
    c.eq.as_ref().is_none_or(|e| v == e)
        && c.ne.as_ref().is_none_or(|e| v != e)
        && c.one_of.as_ref().is_none_or(|s| s.contains(v))
        && c.gt.as_ref().is_none_or(|b| cmp(v, b) == Some(Greater))
        && c.gte
            .as_ref()
            .is_none_or(|b| matches!(cmp(v, b), Some(Greater | Equal)))
        && c.lt.as_ref().is_none_or(|b| cmp(v, b) == Some(Less))
        && c.lte
            .as_ref()
            .is_none_or(|b| matches!(cmp(v, b), Some(Less | Equal)))
}

/// A caller-given key makes adds idempotent and upserts update in place: the same add twice
/// is one memory; an upsert with new metadata keeps the vector; one with new content
/// re-embeds it and marks the summary above stale; a different memory under a used key is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_make_adds_idempotent_and_upserts_update() {
    let dir = tempfile::tempdir().unwrap();
    let mem = open(&dir, hash()).await;
    let fact = |text: &str, city: &str| {
        knowledge(text.to_owned(), json!({ "city": city })).with_key("user-42/address")
    };
    let a = mem
        .add(fact("Lives at 1 Rue de Rivoli", "Paris"))
        .await
        .unwrap();
    // A retried request: the same memory, not a second one.
    let b = mem
        .add(fact("Lives at 1 Rue de Rivoli", "Paris"))
        .await
        .unwrap();
    assert_eq!(a, b);
    assert_eq!(a, MemoryId::from_key("user-42/address"));
    assert_eq!(mem.stats().await.unwrap().store.total, 1);
    // The same key with other content through `add` is a conflict, and changes nothing.
    let r = mem.add(fact("Lives at 5 Main St", "Boston")).await;
    assert!(
        matches!(r, Err(HarnessError::Store(StoreError::DuplicateId { .. }))),
        "{r:?}"
    );

    let summary = mem
        .add_summary("Where the user lives", &[a], None)
        .await
        .unwrap();
    let before = mem.store().embedding(a).unwrap();
    let up = mem
        .upsert(fact("Lives at 1 Rue de Rivoli", "Paris"))
        .await
        .unwrap();
    assert_eq!(up.outcome, UpsertOutcome::Unchanged);
    let up = mem
        .upsert(
            knowledge(
                "Lives at 1 Rue de Rivoli".into(),
                json!({"city": "Paris", "verified": true}),
            )
            .with_key("user-42/address"),
        )
        .await
        .unwrap();
    assert_eq!(up.outcome, UpsertOutcome::MetadataUpdated);
    assert_eq!(up.memory.metadata["verified"], json!(true));
    assert_eq!(mem.store().embedding(a).unwrap(), before);
    assert!(!mem.get(summary).await.unwrap().summary.unwrap().stale);
    let up = mem
        .upsert(fact("Lives at 5 Main St", "Boston"))
        .await
        .unwrap();
    assert_eq!(up.outcome, UpsertOutcome::ContentUpdated);
    assert_eq!(up.memory.content, "Lives at 5 Main St");
    assert!(!up.memory.metadata.contains_key("verified"));
    assert_ne!(mem.store().embedding(a).unwrap(), before);
    assert!(mem.get(summary).await.unwrap().summary.unwrap().stale);
    assert_eq!(mem.stats().await.unwrap().store.total, 2);
    let hits = mem
        .search("Main St", SearchOptions::all().mode(SearchMode::Keyword))
        .await
        .unwrap();
    assert_eq!(hits[0].memory.id, a);
    // Another kind under the same key is another memory: refused.
    let r = mem
        .upsert(NewMemory::new(MemoryKind::Entity, "x").with_key("user-42/address"))
        .await;
    assert!(matches!(
        r,
        Err(HarnessError::Store(StoreError::DuplicateId { .. }))
    ));
    // A new key inserts.
    let up = mem
        .upsert(fact("Lives in Oslo", "Oslo").with_key("user-7/address"))
        .await
        .unwrap();
    assert_eq!(up.outcome, UpsertOutcome::Inserted);

    // Patches merge; null removes; the vector stays.
    let v = mem.store().embedding(a).unwrap();
    let patched = mem
        .patch_metadata(
            a,
            json!({"city": null, "zip": "02101", "geo": {"lat": 42}})
                .as_object()
                .unwrap()
                .clone(),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.metadata,
        *json!({"zip": "02101", "geo": {"lat": 42}})
            .as_object()
            .unwrap()
    );
    let patched = mem
        .patch_metadata(a, json!({"geo": {"lon": -71}}).as_object().unwrap().clone())
        .await
        .unwrap();
    assert_eq!(patched.metadata["geo"], json!({"lat": 42, "lon": -71}));
    assert_eq!(mem.get(a).await.unwrap().metadata, patched.metadata);
    assert_eq!(mem.store().embedding(a).unwrap(), v);
    let r = mem
        .patch_metadata(MemoryId::new(), Default::default())
        .await;
    assert!(matches!(r, Err(HarnessError::NotFound { .. })));
}

/// Cursor paging lists every memory that was there exactly once, in time order, while
/// memories are added before and after the cursor between pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_paging_is_stable_under_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mem = open(&dir, hash()).await;
    let t0 = now() - Duration::days(10);
    let thread = cairn_core::ThreadId::new("p").unwrap();
    // Several memories share a time: ties are broken by insertion order.
    let batch: Vec<NewMemory> = (0..250)
        .map(|i| {
            NewMemory::conversational(thread.clone(), Role::User, format!("turn {i}"))
                .at(t0 + Duration::minutes(i / 3))
        })
        .collect();
    let original: Vec<MemoryId> = mem.add_many(batch).await.unwrap();
    let mut seen = Vec::new();
    let mut cursor = None;
    let mut round = 0;
    loop {
        let page = mem
            .list_page(Filter::all().thread(thread.clone()), cursor, 40)
            .await
            .unwrap();
        assert!(page.items.len() <= 40);
        seen.extend(page.items.iter().map(|m| (m.created_at, m.id)));
        // Writes between pages: one long before the cursor, one at the cursor's time, one
        // far after.
        round += 1;
        let at = page.items.last().map(|m| m.created_at).unwrap_or(t0);
        for (i, when) in [t0 - Duration::days(1), at, t0 + Duration::days(30)]
            .into_iter()
            .enumerate()
        {
            mem.add(
                NewMemory::conversational(thread.clone(), Role::User, format!("late {round} {i}"))
                    .at(when),
            )
            .await
            .unwrap();
        }
        match page.next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let ids: Vec<MemoryId> = seen.iter().map(|(_, id)| *id).collect();
    let unique: HashSet<MemoryId> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "a memory was listed twice");
    for id in &original {
        assert!(unique.contains(id), "memory {id} was skipped");
    }
    assert!(
        seen.windows(2).all(|w| w[0].0 <= w[1].0),
        "not in time order"
    );
    // A cursor survives its text form; a bad one is a typed error.
    let page = mem.list_page(Filter::all(), None, 1).await.unwrap();
    let c = page.next.unwrap();
    assert_eq!(c.to_string().parse::<cairn_harness::Cursor>().unwrap(), c);
    assert!("nonsense".parse::<cairn_harness::Cursor>().is_err());
}

/// Forgetting a fact reaches everything derived from it (real model): the turn that said
/// it is gone, the summaries quoting it are written again from what remains, up the tree,
/// and no search in any mode, no context, no expansion, no summary text and no cached
/// embedding returns it afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgotten_is_not_recalled() {
    let dir = tempfile::tempdir().unwrap();
    let model: Arc<dyn Embedder> = Arc::new(FastEmbedder::new().unwrap());
    let mem = open(&dir, model.clone()).await;
    let t0 = now() - Duration::days(3);
    let lines = [
        "I started running again this week, three times around the park.",
        "My knees felt fine, which surprised me.",
        "The gym locker combination is 4417, I keep forgetting it.",
        "I want to sign up for a 10k race in the spring.",
        "My sister says I should buy proper running shoes.",
        "We might go to the coast for Easter.",
        "I have been reading a novel about a lighthouse keeper.",
        "Work has been quiet, the release slipped to next month.",
    ];
    let mut turns = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let m = NewMemory::conversational(cairn_core::ThreadId::new("me").unwrap(), Role::User, *l)
            .at(t0 + Duration::minutes(i as i64));
        turns.push(mem.add(m).await.unwrap());
    }
    let secret = turns[2];
    // Summaries as an LLM would write them, quoting the fact, two levels deep.
    let s1 = mem
        .add_summary(
            "The user is running again and keeps the gym locker combination 4417; knees fine.",
            &turns[..4],
            Some("me"),
        )
        .await
        .unwrap();
    let s1b = mem
        .add_summary(
            "Family advice on shoes, Easter plans, a novel, quiet work.",
            &turns[4..],
            Some("me"),
        )
        .await
        .unwrap();
    let s2 = mem
        .add_summary(
            "Running (locker 4417), family, reading and work.",
            &[s1, s1b],
            Some("me"),
        )
        .await
        .unwrap();
    let leak = |s: &str| s.contains("4417");
    // Before: the fact is found.
    let hits = mem
        .search(
            "what is my gym locker code",
            SearchOptions::all().k(5).mode(SearchMode::Vector),
        )
        .await
        .unwrap();
    assert!(hits.iter().any(|h| leak(&h.memory.content)));
    let cache = mem.embedding_cache().unwrap().clone();
    assert!(cache.contains(lines[2]).unwrap());

    // What the files hold: the turn's text and summaries' (rows), its vector (the row, the
    // embedding cache).
    let vector = leading_bytes(model.as_ref(), lines[2]);
    let needles: [&[u8]; 4] = [
        lines[2].as_bytes(),
        b"combination 4417; knees",
        b"(locker 4417)",
        &vector,
    ];
    for n in needles {
        assert!(!holding(dir.path(), n).is_empty(), "before: {n:?}");
    }

    let report = mem.forget(Forget::Ids(vec![secret])).await.unwrap();
    assert_eq!(report.deleted, vec![secret]);
    assert_eq!(report.resummarized, vec![s1, s2], "lowest level first");
    assert!(report.dropped.is_empty());
    assert!(report.erased, "no other reader: the files are scrubbed");
    for n in needles {
        assert_eq!(
            holding(dir.path(), n),
            Vec::<std::path::PathBuf>::new(),
            "{n:?}"
        );
    }

    for mode in [SearchMode::Vector, SearchMode::Keyword, SearchMode::Hybrid] {
        for q in ["what is my gym locker code", "4417", "locker combination"] {
            for opts in [SearchOptions::all().k(50), SearchOptions::summaries().k(50)] {
                let hits = mem.search(q, opts.mode(mode)).await.unwrap();
                assert!(
                    hits.iter().all(|h| !leak(&h.memory.content)),
                    "{mode:?} {q}"
                );
            }
        }
    }
    let ctx = mem
        .assemble_context("me", "what is my gym locker code?", 2_000)
        .await
        .unwrap();
    assert!(!leak(&ctx.render()));
    for s in [s1, s1b, s2] {
        let unit = mem.get(s).await.unwrap();
        assert!(!leak(&unit.content), "{}", unit.content);
        assert!(!unit.summary.as_ref().unwrap().stale);
        assert!(!unit.summary.unwrap().source_ids.contains(&secret));
        for m in mem.expand_to_leaves(s).await.unwrap() {
            assert!(!leak(&m.content));
        }
    }
    assert!(matches!(
        mem.get(secret).await,
        Err(HarnessError::NotFound { .. })
    ));
    assert!(!cache.contains(lines[2]).unwrap());
    for old in [
        "The user is running again and keeps the gym locker combination 4417; knees fine.",
        "Running (locker 4417), family, reading and work.",
    ] {
        assert!(!cache.contains(old).unwrap());
    }
    let all = mem.list_page(Filter::all(), None, 1_000).await.unwrap();
    assert_eq!(all.items.len(), 10);
    assert!(all.items.iter().all(|m| !leak(&m.content)));
    // Closed (the index snapshot written), the files still hold none of it.
    mem.close().await.unwrap();
    for n in needles {
        assert_eq!(
            holding(dir.path(), n),
            Vec::<std::path::PathBuf>::new(),
            "closed: {n:?}"
        );
    }
}

/// The files under `dir` (recursively) that hold `needle`.
/// A plain delete is cheap and leaves bytes in the keyword index and the log;
/// `erase_deleted` scrubs them, and what was not deleted stays searchable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_is_scrubbed_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let model = hash();
    let mem = open(&dir, model.clone()).await;
    let thread = cairn_core::ThreadId::new("d").unwrap();
    let lines = [
        "The courier code for the side gate is quorzantel.",
        "The garden hose leaks near the tap.",
        "Remember to water the basil on Fridays.",
    ];
    let mut ids = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let m = NewMemory::conversational(thread.clone(), Role::User, *l)
            .at(now() - Duration::minutes(10 - i as i64));
        ids.push(mem.add(m).await.unwrap());
    }
    let vector = leading_bytes(model.as_ref(), lines[0]);
    mem.delete(ids[0]).await.unwrap();
    // The row is overwritten, but the keyword index keeps the term until a merge.
    assert!(!holding(dir.path(), b"quorzantel").is_empty());
    assert!(mem.erase_deleted().await.unwrap(), "no other reader");
    for n in [&b"quorzantel"[..], lines[0].as_bytes(), &vector] {
        assert!(holding(dir.path(), n).is_empty(), "after: {n:?}");
    }
    // The rest is still found, by its words and by its vector.
    let hits = mem
        .search("basil", SearchOptions::all().k(3).mode(SearchMode::Keyword))
        .await
        .unwrap();
    assert_eq!(hits.first().map(|h| h.memory.id), Some(ids[2]));
    let hits = mem
        .search(lines[1], SearchOptions::all().k(1).mode(SearchMode::Vector))
        .await
        .unwrap();
    assert_eq!(hits.first().map(|h| h.memory.id), Some(ids[1]));
    // Nothing deleted since: erasing again is done at once.
    assert!(mem.erase_deleted().await.unwrap());
}

/// A forget whose erase could not finish (here another connection reads an older
/// snapshot, so the log stays; a process killed between its deletes and its erase is the
/// same) leaves the store marked, and the next open runs the erase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_erase_is_finished_by_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let mem = open(&dir, hash()).await;
    let thread = cairn_core::ThreadId::new("u").unwrap();
    let mut ids = Vec::new();
    for (i, l) in ["My old pin was wexlomantic.", "The bus leaves at nine."]
        .iter()
        .enumerate()
    {
        let m = NewMemory::conversational(thread.clone(), Role::User, *l)
            .at(now() - Duration::minutes(5 - i as i64));
        ids.push(mem.add(m).await.unwrap());
    }
    let db = dir.path().join("e.db");
    let marked = |c: &rusqlite::Connection| -> bool {
        c.query_row(
            "SELECT EXISTS (SELECT 1 FROM store_meta WHERE key = 'erase_pending')",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    let reader = rusqlite::Connection::open(&db).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    assert!(!marked(&reader));
    let report = mem.forget(Forget::Ids(vec![ids[0]])).await.unwrap();
    assert_eq!(report.deleted, vec![ids[0]]);
    assert!(!report.erased, "the reader holds the log");
    reader.execute_batch("COMMIT").unwrap();
    assert!(marked(&reader));
    drop(reader);
    mem.close().await.unwrap();
    let mem = open(&dir, hash()).await;
    assert!(holding(dir.path(), b"wexlomantic").is_empty());
    let check = rusqlite::Connection::open(&db).unwrap();
    assert!(!marked(&check));
    assert_eq!(mem.get(ids[1]).await.unwrap().id, ids[1]);
}

/// A summarizer that lets `pass` calls through (to the extractive one) and then never
/// answers, and says so: the forget stops there, after its deletes, as if its process had
/// been killed.
struct Stuck {
    entered: tokio::sync::Notify,
    pass: std::sync::atomic::AtomicUsize,
    inner: cairn_harness::ExtractiveSummarizer,
}

impl Stuck {
    fn new(model: Arc<dyn Embedder>, pass: usize) -> Arc<Self> {
        Arc::new(Stuck {
            entered: tokio::sync::Notify::new(),
            pass: pass.into(),
            inner: cairn_harness::ExtractiveSummarizer::new(model),
        })
    }
}

#[async_trait::async_trait]
impl cairn_core::Summarizer for Stuck {
    fn name(&self) -> &str {
        "stuck"
    }
    async fn summarize(
        &self,
        r: &cairn_core::SummaryRequest,
    ) -> Result<String, cairn_core::SummarizeError> {
        use std::sync::atomic::Ordering;
        if self
            .pass
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return self.inner.summarize(r).await;
        }
        self.entered.notify_one();
        std::future::pending().await
    }
}

/// The `forget:` marks in the store file at `db`, with the summaries each names.
fn forget_marks(db: &std::path::Path) -> Vec<(String, HashSet<MemoryId>)> {
    let c = rusqlite::Connection::open(db).unwrap();
    let mut stmt = c
        .prepare("SELECT key, value FROM store_meta WHERE key LIKE 'forget:%'")
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .unwrap()
        .map(|r| {
            let (k, v) = r.unwrap();
            (
                k,
                serde_json::from_str::<Vec<MemoryId>>(&v)
                    .unwrap()
                    .into_iter()
                    .collect(),
            )
        })
        .collect();
    rows
}

/// Four turns under two summaries, and one summary above both, all quoting the first
/// turn's secret ("plorvanite") where they cover it.
struct Quoted {
    turns: Vec<MemoryId>,
    s1: MemoryId,
    s1b: MemoryId,
    s2: MemoryId,
}

const QUOTED_LINES: [&str; 4] = [
    "The spare key is under the blue plorvanite pot.",
    "The plumber comes on Tuesday.",
    "Dinner with Ana on Friday.",
    "The car needs new tyres.",
];
const QUOTING: &str = "Key under the plorvanite pot; plumber on Tuesday.";

async fn quoted(mem: &MemoryHarness) -> Quoted {
    let thread = cairn_core::ThreadId::new("k").unwrap();
    let mut turns = Vec::new();
    for (i, l) in QUOTED_LINES.iter().enumerate() {
        let m = NewMemory::conversational(thread.clone(), Role::User, *l)
            .at(now() - Duration::minutes(10 - i as i64));
        turns.push(mem.add(m).await.unwrap());
    }
    let s1 = mem
        .add_summary(QUOTING, &turns[..2], Some("k"))
        .await
        .unwrap();
    let s1b = mem
        .add_summary("Dinner with Ana; tyres.", &turns[2..], Some("k"))
        .await
        .unwrap();
    let s2 = mem
        .add_summary(
            "The plorvanite pot hides the key; errands.",
            &[s1, s1b],
            Some("k"),
        )
        .await
        .unwrap();
    Quoted { turns, s1, s1b, s2 }
}

/// A forget cut short after its deletes (the task is dropped while the summarizer is
/// writing the first summary again: nothing after that point runs, as when the process is
/// killed) left the summaries quoting the forgotten turn and the turn's vector in the
/// embedding cache. The next open, with its own cache off, finishes it: those summaries are
/// deleted (their other sources stay), the cache table keeps only the store's texts, no
/// file holds the forgotten words or vector, and no mark is left. An open while the forget
/// is still under way leaves it alone. A forget that finishes leaves no mark, and one that
/// deletes nothing (an unknown id) neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forget_cut_short_is_finished_by_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let model = hash();
    let stuck = Stuck::new(model.clone(), 0);
    let build = |s: Option<Arc<Stuck>>, cache: bool| {
        let mut b = MemoryHarness::builder(dir.path().join("e.db"))
            .embedder(model.clone())
            .embedding_cache(cache)
            .clock(Arc::new(ManualClock::new(now())));
        if let Some(s) = s {
            b = b.summarizer(s);
        }
        b.build()
    };
    let mem = build(Some(stuck.clone()), true).await.unwrap();
    let db = dir.path().join("e.db");
    let Quoted { turns, s1, s1b, s2 } = quoted(&mem).await;
    let cache = mem.embedding_cache().unwrap().clone();
    // A forget that finishes (of a turn under no summary) leaves no mark.
    let thread = cairn_core::ThreadId::new("k").unwrap();
    let lone = NewMemory::conversational(thread.clone(), Role::User, "I lost my umbrella.")
        .at(now() - Duration::minutes(1));
    let lone = mem.add(lone).await.unwrap();
    let report = mem.forget(Forget::Ids(vec![lone])).await.unwrap();
    assert_eq!(report.deleted, vec![lone]);
    assert!(report.erased);
    assert!(forget_marks(&db).is_empty());
    assert!(!cache.contains("I lost my umbrella.").unwrap());
    // Nor does one that deletes nothing.
    let unknown = MemoryId::new();
    assert!(matches!(
        mem.forget(Forget::Ids(vec![turns[1], unknown])).await,
        Err(HarnessError::NotFound { .. })
    ));
    assert!(forget_marks(&db).is_empty());
    assert_eq!(mem.get(turns[1]).await.unwrap().id, turns[1]);

    let vector = leading_bytes(model.as_ref(), QUOTED_LINES[0]);
    assert!(cache.contains(QUOTED_LINES[0]).unwrap());
    assert!(cache.contains(QUOTING).unwrap());
    for n in [&b"plorvanite"[..], QUOTED_LINES[0].as_bytes(), &vector] {
        assert!(!holding(dir.path(), n).is_empty(), "before: {n:?}");
    }
    let cut = {
        let (mem, secret) = (mem.clone(), turns[0]);
        tokio::spawn(async move { mem.forget(Forget::Ids(vec![secret])).await })
    };
    stuck.entered.notified().await;
    // While it is under way, another open leaves its mark and summaries alone.
    let other = build(None, true).await.unwrap();
    assert_eq!(forget_marks(&db).len(), 1);
    assert!(other.get(s1).await.unwrap().content.contains("plorvanite"));
    other.close().await.unwrap();
    cut.abort();
    assert!(cut.await.unwrap_err().is_cancelled());
    // Cut short: the turn is gone from reads, but the summaries above it still quote it,
    // the cache still holds its vector, and the mark names the summaries to write again.
    assert!(matches!(
        mem.get(turns[0]).await,
        Err(HarnessError::NotFound { .. })
    ));
    assert!(mem.get(s1).await.unwrap().content.contains("plorvanite"));
    assert!(cache.contains(QUOTED_LINES[0]).unwrap());
    let left = forget_marks(&db);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].1, HashSet::from([s1, s2]));
    drop(cache);
    mem.close().await.unwrap();

    let mem = build(None, false).await.unwrap();
    assert!(forget_marks(&db).is_empty());
    for s in [s1, s2] {
        assert!(matches!(
            mem.get(s).await,
            Err(HarnessError::NotFound { .. })
        ));
    }
    // What the forget did not touch stays: the other sources, the summary of the others.
    assert_eq!(mem.get(turns[1]).await.unwrap().content, QUOTED_LINES[1]);
    assert_eq!(mem.get(s1b).await.unwrap().id, s1b);
    for n in [&b"plorvanite"[..], QUOTED_LINES[0].as_bytes(), &vector] {
        assert!(holding(dir.path(), n).is_empty(), "after the open: {n:?}");
    }
    mem.close().await.unwrap();
    // The cache table, read by a harness with the cache on: the store's texts only.
    let mem = build(None, true).await.unwrap();
    let cache = mem.embedding_cache().unwrap().clone();
    assert!(!cache.contains(QUOTED_LINES[0]).unwrap());
    assert!(!cache.contains(QUOTING).unwrap());
    assert!(cache.contains(QUOTED_LINES[1]).unwrap());
    drop(cache);
    mem.close().await.unwrap();
}

/// Content replaced by an update (and a summary's text written again) is not the store's
/// any more: the cache forgets it, so a later forget of the memory leaves none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_text_leaves_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let mem = open(&dir, hash()).await;
    let t = cairn_core::ThreadId::new("u").unwrap();
    let first = "My locker code is 3141.";
    let id = mem
        .add(NewMemory::conversational(t.clone(), Role::User, first))
        .await
        .unwrap();
    let other = mem
        .add(NewMemory::conversational(t, Role::User, "Tea at four."))
        .await
        .unwrap();
    let s = mem
        .add_summary("Locker 3141; tea.", &[id, other], Some("u"))
        .await
        .unwrap();
    let cache = mem.embedding_cache().unwrap().clone();
    assert!(cache.contains(first).unwrap());
    mem.update(id, "My locker code changed to 2718.")
        .await
        .unwrap();
    assert!(!cache.contains(first).unwrap());
    assert!(cache.contains("My locker code changed to 2718.").unwrap());
    // The summary became stale; written again, its old text leaves the cache too.
    assert!(mem.get(s).await.unwrap().summary.unwrap().stale);
    assert!(cache.contains("Locker 3141; tea.").unwrap());
    mem.refresh_summary(s).await.unwrap();
    assert!(!cache.contains("Locker 3141; tea.").unwrap());
    assert!(cache.contains("Tea at four.").unwrap());
}

/// A summarizer that holds its first call until released (saying first that it was
/// entered) and answers it with every item's text, kept; the later calls are extractive.
struct Gate {
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
    held: std::sync::atomic::AtomicBool,
    first: std::sync::Mutex<Option<String>>,
    inner: cairn_harness::ExtractiveSummarizer,
}

#[async_trait::async_trait]
impl cairn_core::Summarizer for Gate {
    fn name(&self) -> &str {
        "gate"
    }
    async fn summarize(
        &self,
        r: &cairn_core::SummaryRequest,
    ) -> Result<String, cairn_core::SummarizeError> {
        if self.held.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return self.inner.summarize(r).await;
        }
        self.entered.notify_one();
        self.release.notified().await;
        // (Every item quoted: the forgotten one among them.)
        let text: Vec<&str> = r.items.iter().map(|i| i.content.as_str()).collect();
        let text = text.join(" ");
        *self.first.lock().unwrap() = Some(text.clone());
        Ok(text)
    }
}

/// A consolidation refreshes a stale summary while a forget (another handle on the file)
/// deletes one of its sources and writes it again: the text the refresh had made from the
/// sources it read (quoting the forgotten turn) is not written over the forget's; the
/// summary is written again from what remains, the pass goes on, and that text leaves the
/// cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_racing_a_forget_is_written_from_what_remains() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(&dir, hash()).await;
    let t = cairn_core::ThreadId::new("r").unwrap();
    let mut turns = Vec::new();
    for (i, l) in [
        "The safe opens with the plorvanite dial.",
        "The plumber comes on Tuesday.",
        "Dinner with Ana on Friday.",
    ]
    .into_iter()
    .enumerate()
    {
        let m = NewMemory::conversational(t.clone(), Role::User, l)
            .at(now() - Duration::minutes(10 - i as i64));
        turns.push(b.add(m).await.unwrap());
    }
    let s = b
        .add_summary("Safe: plorvanite dial; plumber; dinner.", &turns, Some("r"))
        .await
        .unwrap();
    b.update(turns[1], "The plumber comes on Wednesday.")
        .await
        .unwrap();
    let gate = Arc::new(Gate {
        entered: tokio::sync::Notify::new(),
        release: tokio::sync::Notify::new(),
        held: false.into(),
        first: std::sync::Mutex::new(None),
        inner: cairn_harness::ExtractiveSummarizer::new(hash()),
    });
    let a = MemoryHarness::builder(dir.path().join("e.db"))
        .embedder(hash())
        .clock(Arc::new(ManualClock::new(now())))
        .summarizer(gate.clone())
        .build()
        .await
        .unwrap();
    let task = tokio::spawn(async move {
        let r = a
            .consolidate(cairn_harness::ConsolidationPolicy::older_than(
                std::time::Duration::ZERO,
            ))
            .await;
        (a, r)
    });
    gate.entered.notified().await;
    b.forget(Forget::Ids(vec![turns[0]])).await.unwrap();
    gate.release.notify_one();
    let (a, report) = task.await.unwrap();
    let report = report.unwrap();
    assert!(report.refreshed.contains(&s), "{report:?}");
    let first = gate.first.lock().unwrap().clone().unwrap();
    assert!(first.contains("plorvanite"), "{first}");
    let now_text = b.get(s).await.unwrap().content;
    assert!(!now_text.contains("plorvanite"), "{now_text}");
    let sources: Vec<MemoryId> = b
        .expand_summary(s)
        .await
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(sources, turns[1..].to_vec());
    assert!(!a.embedding_cache().unwrap().contains(&first).unwrap());
}

/// A forget stopped after it had written one summary again (the lower one) and while it
/// wrote the next: the next open deletes only the one left, not the one already written
/// again without the forgotten words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_keeps_what_a_cut_forget_had_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let model = hash();
    let stuck = Stuck::new(model.clone(), 1);
    let mem = MemoryHarness::builder(dir.path().join("e.db"))
        .embedder(model.clone())
        .summarizer(stuck.clone())
        .clock(Arc::new(ManualClock::new(now())))
        .build()
        .await
        .unwrap();
    let db = dir.path().join("e.db");
    let Quoted { turns, s1, s1b, s2 } = quoted(&mem).await;
    let cut = {
        let (mem, secret) = (mem.clone(), turns[0]);
        tokio::spawn(async move { mem.forget(Forget::Ids(vec![secret])).await })
    };
    stuck.entered.notified().await;
    cut.abort();
    assert!(cut.await.unwrap_err().is_cancelled());
    let rewritten = mem.get(s1).await.unwrap();
    assert!(
        !rewritten.content.contains("plorvanite"),
        "{}",
        rewritten.content
    );
    assert_eq!(forget_marks(&db)[0].1, HashSet::from([s2]));
    mem.close().await.unwrap();

    let mem = open(&dir, model).await;
    assert!(forget_marks(&db).is_empty());
    assert_eq!(mem.get(s1).await.unwrap().content, rewritten.content);
    assert_eq!(mem.get(s1b).await.unwrap().id, s1b);
    assert!(matches!(
        mem.get(s2).await,
        Err(HarnessError::NotFound { .. })
    ));
    assert!(holding(dir.path(), b"plorvanite").is_empty());
    mem.close().await.unwrap();
}

/// The extractive summarizer weighs the sentences of what it summarizes (a photo's
/// caption among them) through the embedding cache without storing them: after a
/// consolidation the cache holds the memories' texts, not their sentences. Entries an
/// earlier version stored for sentences are purged with their memory: after forgetting a
/// turn (or deleting it under `Detach` and erasing), none of its sentences is in the cache or
/// in any file (its vector), while a kept turn's are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forget_purges_the_sentences_the_summarizer_embedded() {
    for forget in [true, false] {
        sentences_purged(forget).await;
    }
}

async fn sentences_purged(forget: bool) {
    let dir = tempfile::tempdir().unwrap();
    let model = hash();
    let mem = MemoryHarness::builder(dir.path().join("e.db"))
        .embedder(model.clone())
        .delete_policy(cairn_store::DeletePolicy::Detach)
        .clock(Arc::new(ManualClock::new(now())))
        .build()
        .await
        .unwrap();
    let thread = cairn_core::ThreadId::new("s").unwrap();
    let lines = [
        "Ana: I moved to Lisbon in March. My new flat overlooks the river. The rent is fine.",
        "Ben: My password hint is the name of my first dog. It was called Quibbleton. Do not tell anyone.",
        "Ana: We should hike the coast trail in June. I will bring the big tent. Bring snacks.",
        "Ben: The garage door sticks when it rains. I keep meaning to oil it. Maybe this weekend.",
    ];
    let mut ids = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let mut m = NewMemory::conversational(thread.clone(), Role::User, *l)
            .at(now() - Duration::hours(5) + Duration::minutes(i as i64));
        m.metadata
            .insert("speaker".into(), json!(l.split(':').next().unwrap()));
        if i == 1 {
            m.metadata
                .insert("blip_caption".into(), json!("a puppy on a beach"));
        }
        ids.push(mem.add(m).await.unwrap());
    }
    let r = mem
        .consolidate(
            cairn_harness::ConsolidationPolicy::older_than(std::time::Duration::ZERO)
                .max_age(std::time::Duration::ZERO)
                .max_level(1),
        )
        .await
        .unwrap();
    assert_eq!(r.summaries.len(), 1);
    let summary = mem.get(r.summaries[0]).await.unwrap().content;
    assert!(
        summary.contains("puppy"),
        "the caption is quoted: {summary}"
    );
    let cache = mem.embedding_cache().unwrap().clone();
    let secret = [
        "It was called Quibbleton.",
        "My password hint is the name of my first dog.",
    ];
    // Weighed, not stored: only the memories' own texts are.
    for t in secret
        .iter()
        .copied()
        .chain(["[shares a photo: a puppy on a beach]"])
    {
        assert!(!cache.contains(t).unwrap(), "{t:?}");
    }
    for l in lines {
        assert!(cache.contains(l).unwrap());
    }
    // What an earlier version stored for the summarizer's sentences.
    let kept = "I will bring the big tent.";
    cache.embed(&[secret[0], secret[1], kept]).unwrap();
    // Whole vectors: the hashing model's leading floats are mostly zeros, too common a
    // pattern to look for.
    let vectors: Vec<Vec<u8>> = secret
        .iter()
        .map(|t| {
            model.embed(&[*t]).unwrap()[0]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect()
        })
        .collect();
    mem.snapshot().await.unwrap();
    for v in &vectors {
        assert!(
            !holding(dir.path(), v).is_empty(),
            "the scan finds the vector before"
        );
    }
    if forget {
        let report = mem.forget(Forget::Ids(vec![ids[1]])).await.unwrap();
        assert!(report.erased);
    } else {
        mem.delete(ids[1]).await.unwrap();
        assert!(mem.erase_deleted().await.unwrap());
    }
    for t in secret {
        assert!(!cache.contains(t).unwrap(), "{t:?} (forget: {forget})");
    }
    assert!(
        cache.contains(kept).unwrap(),
        "the turns kept keep their sentences"
    );
    for v in &vectors {
        assert!(holding(dir.path(), v).is_empty());
    }
    // A plain delete leaves the summary quoting it stale until consolidation writes it
    // again; a forget writes it again at once.
    assert_eq!(holding(dir.path(), b"puppy").is_empty(), forget);
    if forget {
        assert!(holding(dir.path(), b"Quibbleton").is_empty());
    }
    drop(cache);
    mem.close().await.unwrap();
}

/// The first four floats of `text`'s vector as a file stores them: what a scan for the
/// vector looks for.
fn leading_bytes(model: &dyn Embedder, text: &str) -> Vec<u8> {
    model.embed(&[text]).unwrap()[0][..4]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect()
}

fn holding(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(holding(&p, needle));
        } else if std::fs::read(&p)
            .unwrap()
            .windows(needle.len())
            .any(|w| w == needle)
        {
            out.push(p);
        }
    }
    out
}

/// Forgetting by thread, by metadata (a user) and everything: summaries left with no
/// source go, summaries keeping some are written again, other users' memories stay; a
/// metadata scope recalls one user's memories from other threads into a context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_by_thread_user_and_everything() {
    let dir = tempfile::tempdir().unwrap();
    let mem = open(&dir, hash()).await;
    let t0 = now() - Duration::days(3);
    let mut by_user: Vec<(String, MemoryId)> = Vec::new();
    for (t, user) in [("a1", "alice"), ("a2", "alice"), ("b1", "bob")] {
        let thread = cairn_core::ThreadId::new(t).unwrap();
        for i in 0..6 {
            let mut m = NewMemory::conversational(
                thread.clone(),
                Role::User,
                format!("{user} says thing {i} in {t} about gardening"),
            )
            .at(t0 + Duration::minutes(i));
            m.metadata.insert("user_id".into(), json!(user));
            by_user.push((user.to_owned(), mem.add(m).await.unwrap()));
        }
    }
    let alice: Vec<MemoryId> = by_user
        .iter()
        .filter(|(u, _)| u == "alice")
        .map(|(_, id)| *id)
        .collect();
    let bob: Vec<MemoryId> = by_user
        .iter()
        .filter(|(u, _)| u == "bob")
        .map(|(_, id)| *id)
        .collect();
    // A thread-less summary over both users' memories, and one over alice's alone.
    let mixed = mem
        .add_summary("alice and bob both garden", &[alice[0], bob[0]], None)
        .await
        .unwrap();
    let only_alice = mem
        .add_summary("alice gardens a lot", &alice[..3], None)
        .await
        .unwrap();

    // A metadata scope brings alice's other threads into a1's context.
    let ctx = mem
        .assemble_context_scoped(
            "a1",
            "gardening",
            2_000,
            ContextOptions::default(),
            ContextScope::metadata(MetaFilter::eq("user_id", "alice")),
        )
        .await
        .unwrap();
    let related: Vec<_> = ctx
        .items
        .iter()
        .filter(|i| i.section == cairn_harness::Section::Related)
        .collect();
    assert!(!related.is_empty());
    assert!(
        related
            .iter()
            .all(|i| i.thread_id.as_ref().map(|t| t.as_str()) == Some("a2")),
        "{related:?}"
    );

    let r = mem
        .forget(Forget::Filter(
            Filter::all().meta(MetaFilter::eq("user_id", "alice")),
        ))
        .await
        .unwrap();
    assert_eq!(
        r.deleted.len(),
        12 + 1,
        "alice's 12 turns and the summary of nothing left"
    );
    assert!(r.deleted.contains(&only_alice));
    assert_eq!(r.resummarized, vec![mixed]);
    let m = mem.get(mixed).await.unwrap();
    assert_eq!(m.summary.unwrap().source_ids, vec![bob[0]]);
    assert!(!m.content.contains("alice"), "{}", m.content);
    assert_eq!(mem.stats().await.unwrap().store.total, 6 + 1);

    // By thread: its turns, and the summary citing only them.
    let r = mem
        .forget(Forget::Thread(cairn_core::ThreadId::new("b1").unwrap()))
        .await
        .unwrap();
    assert_eq!(r.deleted.len(), 6 + 1);
    assert_eq!(mem.stats().await.unwrap().store.total, 0);
    mem.add_knowledge("something").await.unwrap();
    let r = mem.forget(Forget::Everything).await.unwrap();
    assert_eq!(r.deleted.len(), 1);
    // Unknown ids forget nothing.
    let keep = mem.add_knowledge("kept").await.unwrap();
    let r = mem.forget(Forget::Ids(vec![keep, MemoryId::new()])).await;
    assert!(matches!(r, Err(HarnessError::NotFound { .. })));
    assert!(mem.get(keep).await.is_ok());
}

async fn open_clocked(dir: &tempfile::TempDir, clock: Arc<ManualClock>) -> MemoryHarness {
    MemoryHarness::builder(dir.path().join("t.db"))
        .embedder(hash())
        .clock(clock)
        .build()
        .await
        .unwrap()
}

/// A memory with an expiry is read until then, hidden from every search (graph walk and
/// exact scan), listing and context after it, and deleted by the next consolidation, which
/// rewrites the summary built on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_memories_are_hidden_then_swept() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(now()));
    let mem = open_clocked(&dir, clock.clone()).await;
    // 3,000 memories, every other one expiring in an hour: unfiltered searches walk the
    // graph (past the exact-scan threshold), thread searches scan exactly.
    let batch: Vec<NewMemory> = (0..3_000)
        .map(|i| {
            let m = NewMemory::conversational(
                cairn_core::ThreadId::new("t").unwrap(),
                Role::User,
                format!("message {i} about topic {}", i % 13),
            )
            .at(now() - Duration::days(2) + Duration::seconds(i));
            if i % 2 == 0 {
                m.expires_at(now() + Duration::hours(1))
            } else {
                m
            }
        })
        .collect();
    let ids = mem.add_many(batch).await.unwrap();
    let summary = mem
        .add_summary("messages about topics", &ids[..2], Some("t"))
        .await
        .unwrap();
    let q = "message about topic 4";
    let even = |h: &cairn_harness::SearchHit| {
        ids.iter()
            .position(|i| *i == h.memory.id)
            .is_some_and(|p| p % 2 == 0)
    };
    let before = mem
        .search(q, SearchOptions::all().k(20).mode(SearchMode::Vector))
        .await
        .unwrap();
    assert!(before.iter().any(even));
    clock.advance(Duration::hours(2));
    for opts in [
        SearchOptions::all().k(20),
        SearchOptions::all()
            .k(20)
            .kinds([MemoryKind::Conversational]),
        SearchOptions::all()
            .k(20)
            .thread(cairn_core::ThreadId::new("t").unwrap()),
    ] {
        for mode in [SearchMode::Vector, SearchMode::Keyword, SearchMode::Hybrid] {
            let hits = mem.search(q, opts.clone().mode(mode)).await.unwrap();
            assert_eq!(
                hits.iter().filter(|h| h.memory.level == 0).count(),
                20 - hits.iter().filter(|h| h.memory.level > 0).count()
            );
            assert!(
                !hits.iter().any(even),
                "{mode:?}: an expired memory was found"
            );
        }
    }
    let page = mem
        .list_page(
            Filter::all().kinds([MemoryKind::Conversational]),
            None,
            10_000,
        )
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1_500);
    let ctx = mem.assemble_context("t", q, 4_000).await.unwrap();
    assert!(ctx.items.iter().all(|i| ids
        .iter()
        .position(|x| *x == i.id)
        .is_none_or(|p| p % 2 == 1)));
    // Still there by id until swept.
    assert!(mem.get(ids[0]).await.is_ok());
    let report = mem
        .consolidate(
            cairn_harness::ConsolidationPolicy::older_than(std::time::Duration::from_secs(3600))
                .max_level(1),
        )
        .await
        .unwrap();
    assert_eq!(report.expired.len(), 1_500);
    assert!(matches!(
        mem.get(ids[0]).await,
        Err(HarnessError::NotFound { .. })
    ));
    let s = mem.get(summary).await.unwrap();
    assert_eq!(
        s.summary.unwrap().source_ids,
        vec![ids[1]],
        "rewritten from what remains"
    );
}

/// A fact superseded by a later one is hidden by default, returned with `history`, and the
/// one that held at a past time is what `as_of` reads; deleting the newer version makes
/// the older one current again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn superseded_facts_keep_their_history() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(now()));
    let mem = open_clocked(&dir, clock.clone()).await;
    let march = now() - Duration::days(90);
    let june = now() - Duration::days(10);
    let oslo = mem
        .add(
            NewMemory::new(
                MemoryKind::Knowledge,
                "The user's address is Storgata 1, Oslo",
            )
            .at(march),
        )
        .await
        .unwrap();
    let bergen = mem
        .add(
            NewMemory::new(
                MemoryKind::Knowledge,
                "The user's address is Bryggen 3, Bergen",
            )
            .at(june)
            .supersedes(oslo),
        )
        .await
        .unwrap();
    let address = |f: Filter| {
        let mem = mem.clone();
        async move {
            let hits = mem
                .search(
                    "user address",
                    SearchOptions {
                        filter: f,
                        ..SearchOptions::all()
                    }
                    .mode(SearchMode::Keyword),
                )
                .await
                .unwrap();
            hits.into_iter()
                .map(|h| h.memory.id)
                .collect::<HashSet<_>>()
        }
    };
    assert_eq!(address(Filter::all()).await, HashSet::from([bergen]));
    assert_eq!(
        address(Filter::all().with_history()).await,
        HashSet::from([oslo, bergen])
    );
    assert_eq!(
        address(Filter::all().as_of(march + Duration::days(30))).await,
        HashSet::from([oslo])
    );
    assert_eq!(
        address(Filter::all().as_of(march - Duration::days(1))).await,
        HashSet::new()
    );
    let h = mem.history(bergen).await.unwrap();
    assert_eq!(
        h.iter().map(|m| m.id).collect::<Vec<_>>(),
        vec![oslo, bergen]
    );
    assert_eq!(h[0].lifetime.valid_to, Some(june));
    assert_eq!(h[1].lifetime.supersedes, Some(oslo));
    assert_eq!(mem.history(oslo).await.unwrap().len(), 2);
    // Only the current version can be superseded, and not by itself.
    let r = mem
        .add(NewMemory::new(MemoryKind::Knowledge, "Tromsø").supersedes(oslo))
        .await;
    assert!(
        matches!(
            r,
            Err(HarnessError::Store(StoreError::CannotSupersede { .. }))
        ),
        "{r:?}"
    );
    let r = mem
        .add(NewMemory::new(MemoryKind::Knowledge, "x").supersedes(MemoryId::new()))
        .await;
    assert!(matches!(r, Err(HarnessError::NotFound { .. })));
    // Deleting the newer version makes the older one current again.
    mem.delete(bergen).await.unwrap();
    assert_eq!(address(Filter::all()).await, HashSet::from([oslo]));
    assert_eq!(mem.get(oslo).await.unwrap().lifetime.valid_to, None);
    // Forgetting everything reaches superseded and expired memories too.
    mem.add(NewMemory::new(MemoryKind::Knowledge, "Lives in Tromsø").supersedes(oslo))
        .await
        .unwrap();
    mem.add(
        NewMemory::new(MemoryKind::Knowledge, "gone soon").expires_at(now() + Duration::minutes(1)),
    )
    .await
    .unwrap();
    clock.advance(Duration::minutes(2));
    let r = mem.forget(Forget::Everything).await.unwrap();
    assert_eq!(r.deleted.len(), 3);
    assert_eq!(mem.stats().await.unwrap().store.total, 0);
}

/// Recency decay ranks the newer of two equally matching memories first; without it, the
/// order is the store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recency_decay_prefers_newer_memories() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(now()));
    let mem = open_clocked(&dir, clock).await;
    let old = mem
        .add(
            NewMemory::new(MemoryKind::Knowledge, "The team meets on Mondays")
                .at(now() - Duration::days(60)),
        )
        .await
        .unwrap();
    let new = mem
        .add(
            NewMemory::new(MemoryKind::Knowledge, "The team meets on Mondays!")
                .at(now() - Duration::days(1)),
        )
        .await
        .unwrap();
    let hits = mem
        .search(
            "team meets Mondays",
            SearchOptions::all()
                .k(1)
                .half_life(std::time::Duration::from_secs(7 * 86_400)),
        )
        .await
        .unwrap();
    assert_eq!(hits[0].memory.id, new);
    let all = mem
        .search(
            "team meets Mondays",
            SearchOptions::all()
                .k(2)
                .half_life(std::time::Duration::from_secs(7 * 86_400)),
        )
        .await
        .unwrap();
    assert_eq!(
        all.iter().map(|h| h.memory.id).collect::<Vec<_>>(),
        vec![new, old]
    );
    assert!(
        all[1].score < all[0].score / 100.0,
        "60 days at a 7-day half-life: under 1/256"
    );
    let r = mem
        .search(
            "team",
            SearchOptions::all().half_life(std::time::Duration::ZERO),
        )
        .await;
    assert!(matches!(r, Err(HarnessError::Config(_))));
    let bad = ContextOptions {
        half_life_secs: Some(-1.0),
        ..ContextOptions::default()
    };
    assert!(bad.validate().is_err());
}

/// A turn that arrives late, dated inside a stretch already summarized, joins the summary
/// of its time at its place (and the summary is rewritten) instead of becoming a chunk of
/// its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_turns_join_the_chunk_of_their_time() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(now()));
    let mem = open_clocked(&dir, clock).await;
    let thread = cairn_core::ThreadId::new("late").unwrap();
    let t0 = now() - Duration::days(2);
    let turns: Vec<NewMemory> = (0..40)
        .map(|i| {
            NewMemory::conversational(
                thread.clone(),
                Role::User,
                format!("turn {i} on subject {}", i % 5),
            )
            .at(t0 + Duration::minutes(i))
        })
        .collect();
    mem.add_many(turns).await.unwrap();
    let policy =
        cairn_harness::ConsolidationPolicy::older_than(std::time::Duration::from_secs(3600))
            .max_level(1);
    let first = mem.consolidate(policy.clone()).await.unwrap();
    assert_eq!(first.chunks_per_level[&1], 2);
    let s1 = first.summaries[0];
    let late = mem
        .add(
            NewMemory::conversational(thread.clone(), Role::User, "a late turn about subject 2")
                .at(t0 + Duration::seconds(5 * 60 + 30)),
        )
        .await
        .unwrap();
    let again = mem.consolidate(policy).await.unwrap();
    assert_eq!(again.placed, vec![late]);
    assert_eq!(again.chunks(), 0, "no chunk of its own");
    assert_eq!(again.refreshed, vec![s1]);
    let sources = mem.expand_summary(s1).await.unwrap();
    assert_eq!(sources.len(), 21);
    assert_eq!(sources[6].id, late, "at its place in time");
    assert!(sources
        .windows(2)
        .all(|w| w[0].created_at <= w[1].created_at));
    assert!(!mem.get(s1).await.unwrap().summary.unwrap().stale);
}

/// Review cases: deleting a middle version keeps one current version and the chain whole;
/// a version superseded in the same batch is hidden; upsert replaces nested metadata whole,
/// sets expiries and revives an expired copy; forgetting every source of a summary drops the
/// summary's text from the embedding cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_upserts_and_cache_edge_cases() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(now()));
    let mem = MemoryHarness::builder(dir.path().join("r.db"))
        .embedder(hash())
        .clock(clock.clone())
        .build()
        .await
        .unwrap();
    let k = |t: &str, days: i64| {
        NewMemory::new(MemoryKind::Knowledge, t).at(now() - Duration::days(days))
    };
    let a = mem.add(k("Team lead is Ada", 30)).await.unwrap();
    let b = mem
        .add(k("Team lead is Bo", 20).supersedes(a))
        .await
        .unwrap();
    let c = mem
        .add(k("Team lead is Cy", 10).supersedes(b))
        .await
        .unwrap();
    mem.forget(Forget::Ids(vec![b])).await.unwrap();
    let current: Vec<MemoryId> = mem
        .search("team lead", SearchOptions::all().mode(SearchMode::Keyword))
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.memory.id)
        .collect();
    assert_eq!(current, vec![c]);
    let h = mem.history(c).await.unwrap();
    assert_eq!(h.iter().map(|m| m.id).collect::<Vec<_>>(), vec![a, c]);
    assert_eq!(h[0].lifetime.valid_to, Some(now() - Duration::days(10)));
    assert_eq!(h[1].lifetime.supersedes, Some(a));

    // Superseded within one batch.
    let x = MemoryId::from_key("batch/x");
    mem.add_many(vec![
        k("Office in Leeds", 5).with_id(x),
        k("Office in York", 1).supersedes(x),
    ])
    .await
    .unwrap();
    assert!(mem.get(x).await.unwrap().lifetime.valid_to.is_some());
    let hits = mem
        .search(
            "office",
            SearchOptions::all().mode(SearchMode::Vector).k(10),
        )
        .await
        .unwrap();
    assert!(hits.iter().all(|h| h.memory.id != x));

    // Upsert replaces nested metadata whole, and is then unchanged.
    let with = |meta: serde_json::Value| knowledge("prefs".into(), meta).with_key("prefs");
    mem.upsert(with(json!({"prefs": {"a": 1, "b": 2}})))
        .await
        .unwrap();
    let up = mem.upsert(with(json!({"prefs": {"a": 1}}))).await.unwrap();
    assert_eq!(up.outcome, UpsertOutcome::MetadataUpdated);
    assert_eq!(
        up.memory.metadata,
        *json!({"prefs": {"a": 1}}).as_object().unwrap()
    );
    let up = mem.upsert(with(json!({"prefs": {"a": 1}}))).await.unwrap();
    assert_eq!(up.outcome, UpsertOutcome::Unchanged);
    // Expiry: set by an upsert; an expired copy is a conflict for add and revived by upsert.
    let soon = now() + Duration::hours(1);
    let up = mem
        .upsert(with(json!({"prefs": {"a": 1}})).expires_at(soon))
        .await
        .unwrap();
    assert_eq!(up.outcome, UpsertOutcome::ExpiryUpdated);
    assert_eq!(up.memory.lifetime.expires_at, Some(soon));
    clock.advance(Duration::hours(2));
    let r = mem
        .add(with(json!({"prefs": {"a": 1}})).expires_at(soon))
        .await;
    assert!(
        matches!(r, Err(HarnessError::Store(StoreError::DuplicateId { .. }))),
        "{r:?}"
    );
    let later = now() + Duration::days(1);
    let up = mem
        .upsert(with(json!({"prefs": {"a": 1}})).expires_at(later))
        .await
        .unwrap();
    assert_eq!(up.outcome, UpsertOutcome::ContentUpdated);
    assert_eq!(up.memory.lifetime.expires_at, Some(later));
    assert_eq!(
        mem.list_page(
            Filter::all().meta(MetaFilter::new("prefs").exists(true)),
            None,
            10
        )
        .await
        .unwrap()
        .items
        .len(),
        1,
        "revived: visible again"
    );

    // Forgetting every source of a summary drops the summary's text from the cache too.
    let s1 = mem.add_knowledge("a fact to forget").await.unwrap();
    let sum = mem
        .add_summary("a summary quoting the fact to forget", &[s1], None)
        .await
        .unwrap();
    let cache = mem.embedding_cache().unwrap().clone();
    assert!(cache
        .contains("a summary quoting the fact to forget")
        .unwrap());
    let r = mem.forget(Forget::Ids(vec![s1])).await.unwrap();
    assert!(r.deleted.contains(&sum));
    assert!(!cache
        .contains("a summary quoting the fact to forget")
        .unwrap());
    // A huge half-life is refused, not a panic.
    let bad = ContextOptions {
        half_life_secs: Some(1e20),
        ..ContextOptions::default()
    };
    assert!(bad.validate().is_err());
}
