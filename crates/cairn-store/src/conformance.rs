//! The behaviour every [`MemoryBackend`] shares, as checks a backend's tests run
//! (feature `conformance`). Each check takes an empty backend of dimension [`DIM`] and
//! panics with a message on the first difference; [`conformance_suite!`](crate::conformance_suite)
//! makes one `#[test]` per check from a function that opens an empty backend.
//!
//! ```ignore
//! fn open() -> (tempfile::TempDir, cairn_store::Store) {
//!     let dir = tempfile::tempdir().unwrap();
//!     let options = cairn_store::StoreOptions::new("m", cairn_store::conformance::DIM);
//!     let store = cairn_store::Store::open(dir.path().join("m.db"), options).unwrap();
//!     (dir, store)
//! }
//! cairn_store::conformance_suite!(open);
//! ```
//!
//! The checks are about behaviour, not files: rows and their fields, ordered links both
//! ways, the link rules, vector search (exact top k against a brute-force ranking, k hits
//! under filters admitting few memories), keyword search, thread reads, delete policies,
//! metadata filters, and atomic batches.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_sign_loss,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    missing_docs
)]

use std::collections::HashSet;

use chrono::{DateTime, Duration, TimeZone, Utc};
use serde_json::json;

use cairn_core::{MemoryId, MemoryKind, MemoryUnit, NewMemory, Role, ThreadId};

use crate::{
    Cursor, DeletePolicy, Filter, MemoryBackend, MetaFilter, NewSummary, StoreError, ThreadState,
};

mod reads;
mod spans;
mod writes;
pub use reads::*;
pub use spans::*;
pub use writes::*;

/// The embedding dimension the checks use.
pub const DIM: usize = 8;

/// One `#[test]` per conformance check, each on a fresh backend from `$open`: a function
/// or closure returning `(guard, backend)`, where the guard (a temporary directory, say) is
/// dropped after the backend.
#[macro_export]
macro_rules! conformance_suite {
    ($open:expr) => {
        $crate::conformance_suite!(@each $open;
            rows_round_trip, batches_are_atomic, bulk_loads_check_first_and_keep_order,
            keyed_retries_are_idempotent,
            summaries_link_both_ways, link_rules_write_nothing,
            vector_search_is_exact_at_small_sizes, filtered_vector_search_returns_k,
            keyword_search_matches_any_word, keyword_ranking_is_bm25, recent_and_threads,
            delete_policies, detach_keeps_levels_in_step_and_deletes_empty_summaries,
            thread_isolation_is_checked_through_every_level,
            metadata_filters, lifetimes, paging_lists_each_memory_once, metadata_patches,
            thread_state_round_trips, versions_reads_and_expiry,
            bad_input_gets_typed_errors_and_writes_nothing,
            // Context reads by index id (conformance/spans.rs).
            spans_times_and_deleted_texts,
            // Reads the harness uses (conformance/reads.rs).
            index_id_searches_agree, timelines_with_ties, thread_reads, hierarchy_by_index_id,
            consolidation_scans, sequence_numbers_grow,
            // Writes the harness uses (conformance/writes.rs).
            update_marks_every_summary_above_stale,
            refresh_summary_recomputes_and_clears_stale,
            set_metadata_replaces_whole,
            extend_summary_propagates_and_refuses_cycles,
            place_source_orders_by_time,
            continuations_chain_and_write_state,
            backup_and_restore_round_trip,
        );
    };
    (@each $open:expr; $($name:ident,)*) => {
        $(
            #[test]
            fn $name() {
                let (_guard, backend) = ($open)();
                $crate::conformance::$name(&backend);
            }
        )*
    };
}

pub(crate) fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 3, 1, 9, 0, 0).unwrap()
}

/// A deterministic vector for `i` (a splitmix64 stream), not all zero.
pub fn vector(i: u64) -> Vec<f32> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    (0..DIM)
        .map(|_| {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            #[allow(clippy::cast_precision_loss)]
            let f = (z >> 11) as f32 / (1u64 << 53) as f32;
            f * 2.0 - 1.0
        })
        .collect()
}

pub(crate) fn unit(v: &[f32]) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / n).collect()
}

pub(crate) fn thread(name: &str) -> ThreadId {
    ThreadId::new(name).unwrap()
}

pub(crate) fn turn(t: &str, i: i64, text: &str) -> NewMemory {
    NewMemory::conversational(
        thread(t),
        if i % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        },
        text,
    )
    .at(t0() + Duration::seconds(i * 60))
}

pub(crate) fn ids(ms: &[MemoryUnit]) -> Vec<MemoryId> {
    ms.iter().map(|m| m.id).collect()
}

pub(crate) fn count(b: &dyn MemoryBackend) -> usize {
    b.recent(&Filter::all(), 1_000_000).unwrap().len()
}

/// Every field of a memory comes back as written; an unknown id is `NotFound`.
pub fn rows_round_trip(b: &dyn MemoryBackend) {
    assert_eq!(b.dimension(), DIM);
    let t = thread("rt");
    let mut meta = cairn_core::Metadata::new();
    meta.insert("speaker".into(), json!("Ada"));
    meta.insert("nested".into(), json!({"a": [1, 2.5, "x"], "b": null}));
    let when = t0() + Duration::microseconds(123_457);
    let written = vec![
        NewMemory::conversational(t.clone(), Role::User, "Ünïcode turn — 你好")
            .with_metadata(meta.clone())
            .at(when),
        NewMemory::new(MemoryKind::Knowledge, "water boils at 100 C").at(when),
        NewMemory::new(MemoryKind::ToolLog, "ls -la").with_thread(t.clone()),
    ];
    let stored = b
        .insert_batch(
            written
                .into_iter()
                .enumerate()
                .map(|(i, m)| (m, vector(i as u64)))
                .collect(),
        )
        .unwrap();
    assert_eq!(stored.len(), 3);
    for s in &stored {
        let g = b.get(s.id).unwrap();
        assert_eq!(&g, s, "{} reads back as written", s.id);
        assert_eq!(g.level, 0);
        assert!(g.summary.is_none());
    }
    assert_eq!(stored[0].metadata, meta);
    assert_eq!(stored[0].created_at, when);
    assert_eq!(stored[0].role, Some(Role::User));
    assert_eq!(stored[1].thread_id, None);
    let unknown = MemoryId::new();
    assert!(matches!(b.get(unknown), Err(StoreError::NotFound { id }) if id == unknown));
}

/// A batch is written whole or not at all: a repeated id, a bad vector, a summary kind or a
/// taken id anywhere in it writes nothing.
pub fn batches_are_atomic(b: &dyn MemoryBackend) {
    let first = b.insert(turn("at", 0, "kept"), vector(0)).unwrap();
    let id = MemoryId::new();
    let r = b.insert_batch(vec![
        (turn("at", 1, "a").with_id(id), vector(1)),
        (turn("at", 2, "b").with_id(id), vector(2)),
    ]);
    assert!(matches!(r, Err(StoreError::DuplicateId { .. })), "{r:?}");
    let r = b.insert_batch(vec![
        (turn("at", 1, "a"), vector(1)),
        (turn("at", 2, "b"), vec![1.0; DIM + 1]),
    ]);
    assert!(matches!(r, Err(StoreError::Input(_))), "{r:?}");
    let r = b.insert_batch(vec![
        (turn("at", 1, "a"), vector(1)),
        (turn("at", 2, "b"), vec![0.0; DIM]),
    ]);
    assert!(matches!(r, Err(StoreError::Input(_))), "{r:?}");
    let r = b.insert_batch(vec![
        (turn("at", 1, "a"), vector(1)),
        (turn("at", 2, "other text").with_id(first.id), vector(2)),
    ]);
    assert!(
        matches!(r, Err(StoreError::DuplicateId { id }) if id == first.id),
        "{r:?}"
    );
    let r = b.insert(NewMemory::new(MemoryKind::Summary, "no"), vector(3));
    assert!(r.is_err());
    let r = b.insert(turn("at", 3, ""), vector(3));
    assert!(matches!(r, Err(StoreError::Input(_))), "{r:?}");
    assert_eq!(count(b), 1, "failed batches wrote nothing");
    assert_eq!(b.get(first.id).unwrap().content, "kept");
}

/// A bulk load checks every item before writing any (a bad vector or an id twice, in
/// another chunk than the first, writes nothing), then stores every memory, in order,
/// across several chunks; searches find them, and a retry of the same keyed load returns
/// the stored copies and writes none.
pub fn bulk_loads_check_first_and_keep_order(b: &dyn MemoryBackend) {
    let n = crate::backend::BULK_CHUNK * 2 + 500;
    let load = || -> Vec<(NewMemory, Vec<f32>)> {
        (0..n)
            .map(|i| {
                let at = i64::try_from(i).unwrap();
                let m =
                    turn("bulk", at, &format!("bulk memory {i}")).with_key(&format!("bulk/{i}"));
                (m, vector(u64::try_from(i).unwrap()))
            })
            .collect()
    };
    let mut bad = load();
    bad[n - 1].1 = vec![0.0; DIM];
    let r = b.insert_bulk(bad);
    assert!(matches!(r, Err(StoreError::Input(_))), "{r:?}");
    let mut twice = load();
    twice[n - 1].0 = twice[n - 1].0.clone().with_key("bulk/0");
    let r = b.insert_bulk(twice);
    assert!(matches!(r, Err(StoreError::DuplicateId { .. })), "{r:?}");
    let mut summary = load();
    summary[n - 1].0.kind = MemoryKind::Summary;
    assert!(b.insert_bulk(summary).is_err());
    assert_eq!(count(b), 0, "refused loads wrote nothing");

    let units = b.insert_bulk(load()).unwrap();
    assert_eq!(units.len(), n);
    for (i, u) in units.iter().enumerate() {
        assert_eq!(u.content, format!("bulk memory {i}"));
        assert_eq!(u.id, MemoryId::from_key(&format!("bulk/{i}")));
    }
    assert_eq!(count(b), n);
    let timeline = b.recent(&Filter::all().thread(thread("bulk")), n).unwrap();
    assert_eq!(timeline.len(), n);
    for i in [0, 999, 1_000, 2_345] {
        let hits = b
            .search_vector(vector(u64::try_from(i).unwrap()), 1, &Filter::all())
            .unwrap();
        assert_eq!(hits[0].memory.id, units[i].id);
    }
    let again = b.insert_bulk(load()).unwrap();
    assert_eq!(again, units);
    assert_eq!(count(b), n, "a retried load wrote no copy");
    assert!(b.insert_bulk(Vec::new()).unwrap().is_empty());
}

/// Deleting with `Detach` keeps every level in step: a summary left without sources is
/// deleted, the summaries above it step down a level (searches by level see the new
/// levels), refresh rewrites a stale summary and marks those above stale, and a chain of
/// summaries each left empty goes at once.
pub fn detach_keeps_levels_in_step_and_deletes_empty_summaries(b: &dyn MemoryBackend) {
    let t = thread("t");
    let ids: Vec<MemoryId> = (0..4)
        .map(|i| {
            b.insert(
                turn("t", i, &format!("turn {i}")),
                vector(u64::try_from(i).unwrap()),
            )
            .unwrap()
            .id
        })
        .collect();
    let low = b
        .add_summary(
            NewSummary::new("low", vec![ids[0]]).with_thread(Some(t.clone())),
            vector(10),
        )
        .unwrap();
    let mid = b
        .add_summary(
            NewSummary::new("mid", vec![low.id, ids[1]]).with_thread(Some(t.clone())),
            vector(11),
        )
        .unwrap();
    let top = b
        .add_summary(
            NewSummary::new("top", vec![mid.id, ids[2]]).with_thread(Some(t.clone())),
            vector(12),
        )
        .unwrap();
    assert_eq!((low.level, mid.level, top.level), (1, 2, 3));
    // Deleting the only source of `low` deletes `low`; `mid` keeps ids[1] and steps down to
    // level 1, `top` to level 2.
    let report = b.delete(ids[0], DeletePolicy::Detach).unwrap();
    assert_eq!(report.deleted, vec![ids[0], low.id]);
    assert_eq!(report.detached, vec![mid.id]);
    assert!(matches!(b.get(low.id), Err(StoreError::NotFound { .. })));
    let mid_now = b.get(mid.id).unwrap();
    let top_now = b.get(top.id).unwrap();
    assert_eq!((mid_now.level, top_now.level), (1, 2));
    let info = mid_now.summary.as_ref().unwrap();
    assert!(info.stale);
    assert_eq!(info.source_ids, vec![ids[1]]);
    let level = |l: u32| {
        b.search_vector(
            vector(99),
            5,
            &Filter::all().kinds([MemoryKind::Summary]).levels(l, l),
        )
        .unwrap()
        .into_iter()
        .map(|h| h.memory.id)
        .collect::<Vec<_>>()
    };
    assert_eq!(level(1), vec![mid.id]);
    assert_eq!(level(2), vec![top.id]);
    assert!(level(3).is_empty());
    // Refresh: `mid` is rewritten from what it cites now, no longer stale; `top` (whose
    // source changed) is.
    assert!(matches!(
        b.refresh_summary(ids[1], "x".into(), None, vector(13)),
        Err(StoreError::NotASummary { .. })
    ));
    let fresh = b
        .refresh_summary(mid.id, "mid, rewritten".into(), None, vector(14))
        .unwrap();
    assert!(!fresh.summary.as_ref().unwrap().stale);
    assert_eq!(fresh.content, "mid, rewritten");
    assert_eq!(fresh.level, 1);
    assert!(b.get(top.id).unwrap().summary.unwrap().stale);
    let hits = b.search_vector(vector(14), 1, &Filter::all()).unwrap();
    assert_eq!(hits[0].memory.id, mid.id);
    // A chain of only-sources goes at once: top cites mid and ids[2]; deleting ids[2], then
    // ids[1], empties mid and then top.
    b.delete(ids[2], DeletePolicy::Detach).unwrap();
    let report = b.delete(ids[1], DeletePolicy::Detach).unwrap();
    assert_eq!(report.deleted, vec![ids[1], mid.id, top.id]);
    assert!(report.detached.is_empty());
    assert_eq!(b.stats().unwrap().by_kind.get("summary"), None);
    assert_eq!(count(b), 1);
}

/// A thread's summary reaches no other thread's memory through any number of thread-less
/// summaries, whether it is added or extended; a refused write writes nothing.
pub fn thread_isolation_is_checked_through_every_level(b: &dyn MemoryBackend) {
    let t = thread("t");
    let own = b.insert(turn("t", 0, "own"), vector(1)).unwrap();
    let other = b.insert(turn("u", 1, "other"), vector(2)).unwrap();
    // Thread-less summaries: one over U's turn, two levels deep; one over T's turn.
    let s0 = b
        .add_summary(NewSummary::new("u's turn", vec![other.id]), vector(3))
        .unwrap();
    let s1 = b
        .add_summary(NewSummary::new("above it", vec![s0.id]), vector(4))
        .unwrap();
    let fine = b
        .add_summary(NewSummary::new("t's turn", vec![own.id]), vector(5))
        .unwrap();
    let before = count(b);
    for via in [s0.id, s1.id] {
        let r = b.add_summary(
            NewSummary::new("t reaches u", vec![own.id, via]).with_thread(Some(t.clone())),
            vector(6),
        );
        match r {
            Err(StoreError::ThreadMismatch {
                id,
                source_thread,
                summary_thread,
            }) => assert_eq!(
                (id, source_thread.as_str(), summary_thread.as_str()),
                (other.id, "u", "t")
            ),
            r => panic!("{r:?}"),
        }
    }
    assert_eq!(count(b), before, "nothing written");
    let ts = b
        .add_summary(
            NewSummary::new("t over t", vec![own.id, fine.id]).with_thread(Some(t.clone())),
            vector(7),
        )
        .unwrap();
    assert!(matches!(
        b.extend_summary(ts.id, vec![s1.id]),
        Err(StoreError::ThreadMismatch { .. })
    ));
    assert_eq!(
        b.sources(ts.id).unwrap().len(),
        2,
        "the failed extension wrote nothing"
    );
}

/// Adding the same keyed memory again returns the stored one and writes no copy.
pub fn keyed_retries_are_idempotent(b: &dyn MemoryBackend) {
    let m = turn("key", 0, "the locker code is 4512").with_key("user-1/locker");
    let a = b.insert(m.clone(), vector(7)).unwrap();
    let again = b.insert(m.clone(), vector(7)).unwrap();
    assert_eq!(a, again);
    let batch = b
        .insert_batch(vec![(m, vector(7)), (turn("key", 1, "new"), vector(8))])
        .unwrap();
    assert_eq!(batch[0], a);
    assert_eq!(count(b), 2);
    assert_eq!(a.id, MemoryId::from_key("user-1/locker"));
}

/// Summaries keep their sources in order, link back from each source, stack in levels,
/// span their sources' times, and expand to their leaves once each, in time order.
pub fn summaries_link_both_ways(b: &dyn MemoryBackend) {
    let t = thread("sum");
    let turns = b
        .insert_batch(
            (0..6)
                .map(|i| (turn("sum", i, &format!("turn {i}")), vector(i as u64)))
                .collect(),
        )
        .unwrap();
    // Sources out of time order: the order given is kept.
    let order = vec![turns[2].id, turns[0].id, turns[1].id];
    let s1 = b
        .add_summary(
            NewSummary::new("first part", order.clone()).with_thread(Some(t.clone())),
            vector(100),
        )
        .unwrap();
    assert_eq!(s1.level, 1);
    assert_eq!(s1.kind, MemoryKind::Summary);
    let info = s1.summary.clone().unwrap();
    assert_eq!(info.source_ids, order);
    assert_eq!(info.source_count, 3);
    assert_eq!(info.time_range_start, turns[0].created_at);
    assert_eq!(info.time_range_end, turns[2].created_at);
    assert!(!info.stale);
    assert_eq!(b.get(s1.id).unwrap(), s1);
    assert_eq!(ids(&b.sources(s1.id).unwrap()), order);
    // turns[2] is cited by two level-1 summaries.
    let s2 = b
        .add_summary(
            NewSummary::new("second part", vec![turns[2].id, turns[3].id, turns[4].id])
                .with_thread(Some(t.clone())),
            vector(101),
        )
        .unwrap();
    assert_eq!(
        ids(&b.summaries_of(turns[2].id).unwrap()),
        vec![s1.id, s2.id]
    );
    assert!(b.summaries_of(turns[5].id).unwrap().is_empty());
    let top = b
        .add_summary(
            NewSummary::new("everything", vec![s2.id, s1.id, turns[5].id])
                .with_thread(Some(t.clone())),
            vector(102),
        )
        .unwrap();
    assert_eq!(top.level, 2);
    let span = top.summary.clone().unwrap();
    assert_eq!(span.time_range_start, turns[0].created_at);
    assert_eq!(span.time_range_end, turns[5].created_at);
    assert_eq!(
        ids(&b.sources(top.id).unwrap()),
        vec![s2.id, s1.id, turns[5].id]
    );
    assert_eq!(ids(&b.leaves(top.id).unwrap()), ids(&turns));
    assert_eq!(ids(&b.leaves(s2.id).unwrap()), ids(&turns[2..5]));
    let up = b.ancestors(turns[2].id).unwrap();
    assert_eq!(up.len(), 3);
    assert_eq!(up[2].id, top.id, "lowest level first");
    assert_eq!(
        up[..2].iter().map(|m| m.id).collect::<HashSet<_>>(),
        HashSet::from([s1.id, s2.id])
    );
    assert!(b.ancestors(top.id).unwrap().is_empty());
    assert!(matches!(
        b.sources(turns[0].id),
        Err(StoreError::NotASummary { .. })
    ));
    assert!(matches!(
        b.leaves(MemoryId::new()),
        Err(StoreError::NotFound { .. })
    ));
}

/// Every link rule is a typed error, and a refused summary writes nothing.
pub fn link_rules_write_nothing(b: &dyn MemoryBackend) {
    let a = b.insert(turn("la", 0, "a"), vector(1)).unwrap();
    let other = b.insert(turn("lb", 0, "b"), vector(2)).unwrap();
    let before = count(b);
    let ta = Some(thread("la"));
    let r = b.add_summary(NewSummary::new("s", vec![]), vector(3));
    assert!(matches!(r, Err(StoreError::EmptySources)), "{r:?}");
    let r = b.add_summary(NewSummary::new("s", vec![a.id, a.id]), vector(3));
    assert!(
        matches!(r, Err(StoreError::DuplicateSource { .. })),
        "{r:?}"
    );
    let unknown = MemoryId::new();
    let r = b.add_summary(NewSummary::new("s", vec![a.id, unknown]), vector(3));
    assert!(
        matches!(r, Err(StoreError::NotFound { id }) if id == unknown),
        "{r:?}"
    );
    let mut own = NewSummary::new("s", vec![a.id]);
    let sid = MemoryId::new();
    own.id = Some(sid);
    own.source_ids.push(sid);
    let r = b.add_summary(own, vector(3));
    assert!(matches!(r, Err(StoreError::SelfReference { .. })), "{r:?}");
    let r = b.add_summary(
        NewSummary::new("s", vec![a.id, other.id]).with_thread(ta.clone()),
        vector(3),
    );
    assert!(
        matches!(r, Err(StoreError::ThreadMismatch { id, .. }) if id == other.id),
        "{r:?}"
    );
    let r = b.add_summary(NewSummary::new("s", vec![a.id]), vec![0.0; DIM]);
    assert!(matches!(r, Err(StoreError::Input(_))), "{r:?}");
    let r = b.add_summary(NewSummary::new("", vec![a.id]), vector(3));
    assert!(matches!(r, Err(StoreError::Input(_))), "{r:?}");
    assert_eq!(count(b), before, "refused summaries wrote nothing");
    // Through a thread-less summary, another thread's memory is still out of reach.
    let bridge = b
        .add_summary(NewSummary::new("bridge", vec![other.id]), vector(4))
        .unwrap();
    assert_eq!(bridge.thread_id, None);
    let r = b.add_summary(
        NewSummary::new("s", vec![a.id, bridge.id]).with_thread(ta.clone()),
        vector(5),
    );
    assert!(
        matches!(r, Err(StoreError::ThreadMismatch { id, .. }) if id == other.id),
        "{r:?}"
    );
    // A thread-less memory may be cited by any thread's summary.
    let k = b
        .insert(
            NewMemory::new(MemoryKind::Knowledge, "shared fact"),
            vector(6),
        )
        .unwrap();
    let ok = b
        .add_summary(
            NewSummary::new("ok", vec![a.id, k.id]).with_thread(ta),
            vector(7),
        )
        .unwrap();
    assert_eq!(ok.level, 1);
    // A taken id is refused.
    let mut dup = NewSummary::new("dup", vec![a.id]);
    dup.id = Some(ok.id);
    assert!(matches!(
        b.add_summary(dup, vector(8)),
        Err(StoreError::DuplicateId { .. })
    ));
    assert_eq!(count(b), before + 3);
}

fn brute_force(
    all: &[(MemoryId, Vec<f32>)],
    q: &[f32],
    k: usize,
    admit: impl Fn(usize) -> bool,
) -> Vec<MemoryId> {
    let q = unit(q);
    let mut scored: Vec<(f32, MemoryId)> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| admit(*i))
        .map(|(_, (id, v))| (unit(v).iter().zip(&q).map(|(a, b)| a * b).sum(), *id))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.into_iter().take(k).map(|(_, id)| id).collect()
}

/// At a few hundred memories, vector search returns the exact top k (cosine), best first,
/// with similarity scores; filters by thread, kind and level hold.
pub fn vector_search_is_exact_at_small_sizes(b: &dyn MemoryBackend) {
    let threads = ["va", "vb", "vc", "vd"];
    let items: Vec<(NewMemory, Vec<f32>)> = (0..240)
        .map(|i| {
            let t = threads[i % 4];
            (
                turn(t, i as i64, &format!("memory {i}")),
                vector(1_000 + i as u64),
            )
        })
        .collect();
    let vecs: Vec<Vec<f32>> = items.iter().map(|(_, v)| v.clone()).collect();
    let stored = b.insert_batch(items).unwrap();
    let all: Vec<(MemoryId, Vec<f32>)> = stored.iter().map(|m| m.id).zip(vecs).collect();
    for probe in [0u64, 17, 99] {
        let q = vector(50_000 + probe);
        let hits = b.search_vector(q.clone(), 10, &Filter::all()).unwrap();
        assert_eq!(
            hits.iter().map(|h| h.memory.id).collect::<Vec<_>>(),
            brute_force(&all, &q, 10, |_| true),
            "probe {probe}"
        );
        assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
        let expect = brute_force(&all, &q, 1, |_| true)[0];
        let best = &all.iter().find(|(id, _)| *id == expect).unwrap().1;
        let cos: f32 = unit(best).iter().zip(unit(&q)).map(|(a, b)| a * b).sum();
        assert!(
            (hits[0].score - cos).abs() < 1e-3,
            "{} vs {cos}",
            hits[0].score
        );
        let hits = b
            .search_vector(q.clone(), 7, &Filter::all().thread(thread("vc")))
            .unwrap();
        assert_eq!(
            hits.iter().map(|h| h.memory.id).collect::<Vec<_>>(),
            brute_force(&all, &q, 7, |i| i % 4 == 2)
        );
    }
    // The memory itself is its own best match.
    let hits = b
        .search_vector(all[33].1.clone(), 1, &Filter::all())
        .unwrap();
    assert_eq!(hits[0].memory.id, all[33].0);
    assert!((hits[0].score - 1.0).abs() < 1e-3);
    // Kind and level filters.
    let s = b
        .add_summary(
            NewSummary::new("a summary", vec![all[0].0, all[4].0]).with_thread(Some(thread("va"))),
            vector(1_000),
        )
        .unwrap();
    let hits = b
        .search_vector(
            vector(1_000),
            3,
            &Filter::all().kinds([MemoryKind::Summary]),
        )
        .unwrap();
    assert_eq!(
        ids(&hits.iter().map(|h| h.memory.clone()).collect::<Vec<_>>()),
        vec![s.id]
    );
    let hits = b
        .search_vector(vector(1_000), 3, &Filter::all().levels(0, 0))
        .unwrap();
    assert_eq!(hits.len(), 3);
    assert!(hits.iter().all(|h| h.memory.level == 0));
    assert_eq!(hits[0].memory.id, all[0].0);
    assert!(b
        .search_vector(vector(1), 5, &Filter::all().thread(thread("nobody")))
        .unwrap()
        .is_empty());
    assert!(matches!(
        b.search_vector(vec![1.0; DIM + 2], 3, &Filter::all()),
        Err(StoreError::Input(_))
    ));
}

/// A filter admitting a few memories among thousands still gets k hits (the exact top k
/// of the admitted ones), and one admitting fewer than k gets them all.
pub fn filtered_vector_search_returns_k(b: &dyn MemoryBackend) {
    let mut items = Vec::new();
    let mut vecs = Vec::new();
    for i in 0..3_000i64 {
        let t = if i % 100 == 7 { "needle" } else { "hay" };
        let v = vector(7_000 + i as u64);
        vecs.push(v.clone());
        items.push((turn(t, i, &format!("row {i}")), v));
    }
    let mut all = Vec::new();
    for chunk in items.chunks(500) {
        let stored = b.insert_batch(chunk.to_vec()).unwrap();
        all.extend(stored.into_iter().map(|m| m.id));
    }
    let all: Vec<(MemoryId, Vec<f32>)> = all.into_iter().zip(vecs).collect();
    let rare = b.insert(turn("rare", 0, "only two"), vector(1)).unwrap();
    b.insert(turn("rare", 1, "of them"), vector(2)).unwrap();
    for probe in 0..5u64 {
        let q = vector(90_000 + probe);
        let hits = b
            .search_vector(q.clone(), 10, &Filter::all().thread(thread("needle")))
            .unwrap();
        assert_eq!(
            hits.len(),
            10,
            "k hits under a filter admitting 30 of 3,000"
        );
        assert_eq!(
            hits.iter().map(|h| h.memory.id).collect::<Vec<_>>(),
            brute_force(&all, &q, 10, |i| i % 100 == 7)
        );
        let hits = b
            .search_vector(q.clone(), 10, &Filter::all().thread(thread("rare")))
            .unwrap();
        assert_eq!(hits.len(), 2);
        assert!(hits.iter().any(|h| h.memory.id == rare.id));
        let hits = b.search_vector(q, 50, &Filter::all()).unwrap();
        assert_eq!(hits.len(), 50);
    }
}

/// Keyword search matches any word of the query (stemmed), ranks the best match first and
/// honours filters; a query of no known word finds nothing.
pub fn keyword_search_matches_any_word(b: &dyn MemoryBackend) {
    let texts = [
        ("ka", "The zebra crossed the savanna at dawn"),
        ("ka", "Giraffes eat leaves from tall trees"),
        ("ka", "She runs every morning before work"),
        ("kb", "The zebra and the zebra foal rested"),
        ("kb", "Quarterly report numbers were late"),
    ];
    let stored = b
        .insert_batch(
            texts
                .iter()
                .enumerate()
                .map(|(i, (t, s))| (turn(t, i as i64, s), vector(i as u64)))
                .collect(),
        )
        .unwrap();
    let hits = b.search_keyword("zebra", 10, &Filter::all()).unwrap();
    assert_eq!(
        hits.iter().map(|h| h.memory.id).collect::<HashSet<_>>(),
        HashSet::from([stored[0].id, stored[3].id])
    );
    assert_eq!(hits[0].memory.id, stored[3].id, "two mentions rank first");
    assert!(hits[0].score >= hits[1].score);
    let hits = b
        .search_keyword("zebra giraffe", 10, &Filter::all())
        .unwrap();
    assert_eq!(hits.len(), 3, "any word matches");
    let hits = b.search_keyword("running", 10, &Filter::all()).unwrap();
    assert_eq!(
        ids(&hits.iter().map(|h| h.memory.clone()).collect::<Vec<_>>()),
        vec![stored[2].id]
    );
    let hits = b
        .search_keyword("zebra", 10, &Filter::all().thread(thread("ka")))
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].memory.id, stored[0].id);
    assert!(b
        .search_keyword("xylophone", 10, &Filter::all())
        .unwrap()
        .is_empty());
    assert!(b.search_keyword("zebra", 1, &Filter::all()).unwrap().len() == 1);
    // Punctuation and operators in a query are words, not syntax.
    let hits = b
        .search_keyword(
            "zebra's \"foal\" OR (report) -numbers* :",
            10,
            &Filter::all(),
        )
        .unwrap();
    assert!(hits.iter().any(|h| h.memory.id == stored[4].id));
}

/// FTS5's `bm25()` of one memory for one query word, as the keyword checks expect it.
fn bm25(n: f64, df: f64, tf: f64, dl: f64, avgdl: f64) -> f64 {
    let idf = ((n - df + 0.5) / (df + 0.5)).ln().max(1e-6);
    idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * dl / avgdl))
}

/// Keyword hits are ranked by BM25 over the whole store: a rare word outweighs a common
/// one, a short memory outranks a long one, and the collection statistics follow deletes.
/// The scores equal FTS5's `bm25()` (negated: higher is better) on every backend.
pub fn keyword_ranking_is_bm25(b: &dyn MemoryBackend) {
    let filler = (0..30)
        .map(|i| format!("filler{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    let mut texts = vec!["apple".to_owned()];
    texts.extend((1..=12).map(|_| "apple orchard".to_owned()));
    texts.push("zebra".to_owned());
    texts.push(format!("zebra {filler}"));
    let stored = b
        .insert_batch(
            texts
                .iter()
                .enumerate()
                .map(|(i, s)| (turn("bm", i as i64, s), vector(i as u64)))
                .collect(),
        )
        .unwrap();
    let (z1, z2, a0) = (stored[13].id, stored[14].id, stored[0].id);
    let close = |got: f32, want: f64| {
        assert!(
            (f64::from(got) - want).abs() <= 1e-4 * want.abs().max(1e-3),
            "score {got}, BM25 {want}"
        );
    };
    // 15 memories of 57 tokens; "apple" in 13 of them, "zebra" in 2.
    let hits = b.search_keyword("apple zebra", 3, &Filter::all()).unwrap();
    assert_eq!(
        hits.iter().map(|h| h.memory.id).collect::<Vec<_>>(),
        vec![z1, z2, a0],
        "the rare word first, the short memory before the long one"
    );
    let avgdl = 57.0 / 15.0;
    close(hits[0].score, bm25(15.0, 2.0, 1.0, 1.0, avgdl));
    close(hits[1].score, bm25(15.0, 2.0, 1.0, 31.0, avgdl));
    close(hits[2].score, bm25(15.0, 13.0, 1.0, 1.0, avgdl));
    // Deleting ten "apple orchard" memories leaves 5 memories of 37 tokens.
    let gone: Vec<MemoryId> = stored[1..=10].iter().map(|m| m.id).collect();
    b.delete_many(&gone, DeletePolicy::Restrict).unwrap();
    let hits = b
        .search_keyword("zebra orchard", 10, &Filter::all())
        .unwrap();
    let avgdl = 37.0 / 5.0;
    assert_eq!(hits.len(), 4);
    assert_eq!(hits[0].memory.id, z1);
    close(hits[0].score, bm25(5.0, 2.0, 1.0, 1.0, avgdl));
    let orchard = hits.iter().find(|h| h.memory.id == stored[11].id).unwrap();
    close(orchard.score, bm25(5.0, 2.0, 1.0, 2.0, avgdl));
    // The capped search leaves out words more memories hold than the cap.
    let capped = b
        .search_keyword_ids_capped("zebra apple", 10, &Filter::all(), 2)
        .unwrap();
    assert_eq!(
        capped.len(),
        2,
        "apple (3 memories) is over the cap, zebra (2) is not"
    );
}

/// Bad input gets a typed error and writes nothing: empty, oversized or mistyped memories,
/// vectors of the wrong size or not finite or zero, unknown ids, inverted ranges, and a
/// batch holding one bad item or a duplicate id.
pub fn bad_input_gets_typed_errors_and_writes_nothing(b: &dyn MemoryBackend) {
    use cairn_core::InputError;
    let knowledge = |s: &str| NewMemory::new(MemoryKind::Knowledge, s);
    let v = vector(1);
    let input = |r: crate::Result<MemoryUnit>| match r {
        Err(StoreError::Input(e)) => e,
        other => panic!("expected an input error, got {other:?}"),
    };
    assert!(matches!(
        input(b.insert(knowledge(""), v.clone())),
        InputError::EmptyContent
    ));
    assert!(matches!(
        input(b.insert(knowledge("   "), v.clone())),
        InputError::EmptyContent
    ));
    assert!(matches!(
        input(b.insert(knowledge(&"x".repeat(2 << 20)), v.clone())),
        InputError::ContentTooLarge { .. }
    ));
    assert!(matches!(
        input(b.insert(knowledge("a"), vec![1.0, 0.0])),
        InputError::DimensionMismatch {
            expected: DIM,
            got: 2
        }
    ));
    let mut nan = v.clone();
    nan[3] = f32::NAN;
    assert!(matches!(
        input(b.insert(knowledge("a"), nan)),
        InputError::NonFiniteVector { position: 3 }
    ));
    assert!(matches!(
        input(b.insert(knowledge("a"), vec![0.0; DIM])),
        InputError::ZeroVector
    ));
    input(b.insert(NewMemory::new(MemoryKind::Summary, "s"), v.clone()));
    let unknown = MemoryId::new();
    let not_found = |r: crate::Result<()>| {
        assert!(
            matches!(r, Err(StoreError::NotFound { id }) if id == unknown),
            "{r:?}"
        );
    };
    not_found(b.get(unknown).map(drop));
    not_found(b.sources(unknown).map(drop));
    not_found(b.summaries_of(unknown).map(drop));
    not_found(b.delete(unknown, DeletePolicy::Cascade).map(drop));
    not_found(b.update(unknown, "x".into(), None, v.clone()).map(drop));
    let (t0, t1) = (t0(), t0() - Duration::hours(1));
    assert!(matches!(
        b.recent(&Filter::all().between(t0, t1), 5),
        Err(StoreError::Input(InputError::InvalidTimeRange))
    ));
    assert!(matches!(
        b.search_vector(v.clone(), 3, &Filter::all().levels(3, 1)),
        Err(StoreError::Input(InputError::OutOfRange { .. }))
    ));
    // A batch with one bad item, or with an id already stored, writes none of its items.
    let kept = b.insert(knowledge("kept"), v.clone()).unwrap();
    assert!(b
        .insert_batch(vec![
            (knowledge("ok"), v.clone()),
            (knowledge(""), v.clone())
        ])
        .is_err());
    assert!(matches!(
        b.insert_batch(vec![
            (knowledge("fresh"), v.clone()),
            (knowledge("dup").with_id(kept.id), vector(2)),
        ]),
        Err(StoreError::DuplicateId { .. })
    ));
    assert_eq!(ids(&b.recent(&Filter::all(), 10).unwrap()), vec![kept.id]);
    assert_eq!(b.stats().unwrap().total, 1);
}

/// `recent` returns the newest memories a filter admits, oldest first; `threads` lists
/// every thread once.
pub fn recent_and_threads(b: &dyn MemoryBackend) {
    for t in ["rz", "ra", "rm"] {
        b.insert_batch(
            (0..30)
                .map(|i| (turn(t, i, &format!("{t} {i}")), vector(i as u64)))
                .collect(),
        )
        .unwrap();
    }
    b.insert(
        NewMemory::new(MemoryKind::Knowledge, "no thread"),
        vector(1),
    )
    .unwrap();
    let r = b.recent(&Filter::all().thread(thread("ra")), 5).unwrap();
    assert_eq!(
        r.iter().map(|m| m.content.as_str()).collect::<Vec<_>>(),
        ["ra 25", "ra 26", "ra 27", "ra 28", "ra 29"]
    );
    let r = b.recent(&Filter::all().thread(thread("rm")), 100).unwrap();
    assert_eq!(r.len(), 30);
    assert!(r.windows(2).all(|w| w[0].created_at <= w[1].created_at));
    assert_eq!(b.recent(&Filter::all().thread_less(), 10).unwrap().len(), 1);
    let r = b
        .recent(
            &Filter::all().thread(thread("rz")).between(
                t0() + Duration::seconds(60 * 10),
                t0() + Duration::seconds(60 * 12),
            ),
            10,
        )
        .unwrap();
    assert_eq!(
        r.iter().map(|m| m.content.as_str()).collect::<Vec<_>>(),
        ["rz 10", "rz 11"]
    );
    assert_eq!(
        b.threads().unwrap(),
        vec![thread("ra"), thread("rm"), thread("rz")]
    );
}

/// Restrict refuses while a summary cites the memory; Cascade removes the summaries above;
/// Detach unlinks, marks the citing summaries stale and recounts them, and deletes a
/// summary left with no source. A delete naming an unknown id deletes nothing.
pub fn delete_policies(b: &dyn MemoryBackend) {
    let t = Some(thread("del"));
    let turns = b
        .insert_batch(
            (0..4)
                .map(|i| (turn("del", i, &format!("d {i}")), vector(i as u64)))
                .collect(),
        )
        .unwrap();
    let s1 = b
        .add_summary(
            NewSummary::new("s1", vec![turns[0].id, turns[1].id]).with_thread(t.clone()),
            vector(10),
        )
        .unwrap();
    let s2 = b
        .add_summary(
            NewSummary::new("s2", vec![s1.id, turns[2].id]).with_thread(t.clone()),
            vector(11),
        )
        .unwrap();
    let r = b.delete(turns[0].id, DeletePolicy::Restrict);
    assert!(
        matches!(&r, Err(StoreError::CitedBySummaries { id, summaries }) if *id == turns[0].id && summaries == &vec![s1.id]),
        "{r:?}"
    );
    let r = b.delete_many(&[turns[3].id, MemoryId::new()], DeletePolicy::Cascade);
    assert!(matches!(r, Err(StoreError::NotFound { .. })), "{r:?}");
    assert_eq!(count(b), 6, "nothing deleted");
    // Restrict deletes an uncited memory.
    let rep = b.delete(turns[3].id, DeletePolicy::Restrict).unwrap();
    assert_eq!(rep.deleted, vec![turns[3].id]);
    assert!(matches!(
        b.get(turns[3].id),
        Err(StoreError::NotFound { .. })
    ));
    // Detach: s1 keeps one source, is stale and recounted; its parent stays.
    let rep = b.delete(turns[0].id, DeletePolicy::Detach).unwrap();
    assert_eq!(rep.deleted, vec![turns[0].id]);
    assert_eq!(rep.detached, vec![s1.id]);
    let s1_now = b.get(s1.id).unwrap();
    let info = s1_now.summary.unwrap();
    assert!(info.stale);
    assert_eq!(info.source_ids, vec![turns[1].id]);
    assert_eq!(info.source_count, 1);
    assert_eq!(info.time_range_start, turns[1].created_at);
    assert_eq!(
        ids(&b.leaves(s2.id).unwrap()),
        vec![turns[1].id, turns[2].id]
    );
    assert!(b
        .search_vector(vector(0), 10, &Filter::all())
        .unwrap()
        .iter()
        .all(|h| h.memory.id != turns[0].id));
    // Detach of s1's last source deletes s1 as well; s2 keeps turns[2].
    let rep = b.delete(turns[1].id, DeletePolicy::Detach).unwrap();
    assert_eq!(rep.deleted, vec![turns[1].id, s1.id]);
    assert_eq!(ids(&b.sources(s2.id).unwrap()), vec![turns[2].id]);
    assert_eq!(
        b.get(s2.id).unwrap().level,
        1,
        "s2's level follows its sources"
    );
    // Cascade takes the summaries above.
    let rep = b.delete(turns[2].id, DeletePolicy::Cascade).unwrap();
    assert_eq!(rep.deleted, vec![turns[2].id, s2.id]);
    assert_eq!(count(b), 0);
    assert!(b
        .search_keyword("s2", 5, &Filter::all())
        .unwrap()
        .is_empty());
}

/// Metadata conditions hold in listing and in search.
pub fn metadata_filters(b: &dyn MemoryBackend) {
    let mut items = Vec::new();
    for i in 0..60i64 {
        let mut meta = cairn_core::Metadata::new();
        meta.insert(
            "user_id".into(),
            json!(if i % 3 == 0 { "alice" } else { "bob" }),
        );
        meta.insert("priority".into(), json!(i % 5));
        if i % 10 == 0 {
            meta.insert("pinned".into(), json!(true));
        }
        items.push((
            turn("meta", i, &format!("note {i} about zebra")).with_metadata(meta),
            vector(i as u64),
        ));
    }
    b.insert_batch(items).unwrap();
    let f = |c: MetaFilter| Filter::all().meta(c);
    let n = |filter: Filter| b.recent(&filter, 1_000).unwrap().len();
    assert_eq!(n(f(MetaFilter::eq("user_id", "alice"))), 20);
    assert_eq!(n(f(MetaFilter::new("user_id").ne("alice"))), 40);
    assert_eq!(n(f(MetaFilter::new("priority").gte(3))), 24);
    assert_eq!(n(f(MetaFilter::new("priority").gt(1).lt(3))), 12);
    assert_eq!(n(f(MetaFilter::new("priority").one_of([0, 4]))), 24);
    assert_eq!(n(f(MetaFilter::new("pinned").exists(true))), 6);
    assert_eq!(n(f(MetaFilter::new("pinned").exists(false))), 54);
    assert_eq!(n(f(MetaFilter::eq("user_id", "carol"))), 0);
    let both = Filter::all()
        .meta(MetaFilter::eq("user_id", "alice"))
        .meta(MetaFilter::new("priority").lte(1));
    let expect = (0..60).filter(|i| i % 3 == 0 && i % 5 <= 1).count();
    assert_eq!(n(both.clone()), expect);
    let hits = b.search_vector(vector(3), 100, &both).unwrap();
    assert_eq!(hits.len(), expect);
    let hits = b.search_keyword("zebra", 100, &both).unwrap();
    assert_eq!(hits.len(), expect);
    assert!(hits
        .iter()
        .all(|h| h.memory.metadata["user_id"] == json!("alice")));
}

/// Expired memories are hidden from listing and search but readable by id; a superseding
/// fact ends the old one's validity, `as_of` and history read the past, only the current
/// version can be superseded, and deleting the current version makes the old one current.
pub fn lifetimes(b: &dyn MemoryBackend) {
    let t = thread("life");
    let day = Duration::days(1);
    let paris = b
        .insert(turn("life", 0, "Ada lives in Paris"), vector(1))
        .unwrap();
    let berlin = b
        .insert(
            turn("life", 1, "Ada lives in Berlin")
                .supersedes(paris.id)
                .valid_from(t0() + day * 10),
            vector(2),
        )
        .unwrap();
    assert_eq!(berlin.lifetime.supersedes, Some(paris.id));
    assert_eq!(
        b.get(paris.id).unwrap().lifetime.valid_to,
        Some(t0() + day * 10)
    );
    assert_eq!(
        b.get(berlin.id).unwrap().lifetime.supersedes,
        Some(paris.id)
    );
    let contents = |f: Filter| -> Vec<String> {
        b.recent(&f, 100)
            .unwrap()
            .into_iter()
            .map(|m| m.content)
            .collect()
    };
    let f = || Filter::all().thread(t.clone());
    assert_eq!(contents(f()), ["Ada lives in Berlin"]);
    assert_eq!(contents(f().as_of(t0() + day * 5)), ["Ada lives in Paris"]);
    assert_eq!(
        contents(f().as_of(t0() + day * 20)),
        ["Ada lives in Berlin"]
    );
    assert_eq!(contents(f().with_history()).len(), 2);
    let hits = b.search_vector(vector(1), 5, &f()).unwrap();
    assert_eq!(hits.len(), 1, "the superseded fact is not found");
    let r = b.insert(
        turn("life", 2, "Ada lives in Rome").supersedes(paris.id),
        vector(3),
    );
    assert!(
        matches!(r, Err(StoreError::CannotSupersede { id, .. }) if id == paris.id),
        "{r:?}"
    );
    let r = b.insert(turn("life", 2, "x").supersedes(MemoryId::new()), vector(3));
    assert!(matches!(r, Err(StoreError::NotFound { .. })), "{r:?}");
    let s = b
        .add_summary(
            NewSummary::new("moves", vec![paris.id]).with_thread(Some(t.clone())),
            vector(4),
        )
        .unwrap();
    let r = b.insert(turn("life", 3, "y").supersedes(s.id), vector(5));
    assert!(
        matches!(r, Err(StoreError::CannotSupersede { .. })),
        "{r:?}"
    );
    // Expiry, against the real clock: an hour ago is past, a day ahead is not.
    let now = Utc::now();
    let gone = b
        .insert(
            NewMemory::new(MemoryKind::Knowledge, "the door code is 1234")
                .expires_at(now - Duration::hours(1)),
            vector(6),
        )
        .unwrap();
    let kept = b
        .insert(
            NewMemory::new(MemoryKind::Knowledge, "the door code is 9876").expires_at(now + day),
            vector(7),
        )
        .unwrap();
    let knowledge = || Filter::all().kinds([MemoryKind::Knowledge]);
    assert_eq!(ids(&b.recent(&knowledge(), 10).unwrap()), vec![kept.id]);
    let found: Vec<MemoryId> = b
        .search_vector(vector(6), 10, &knowledge())
        .unwrap()
        .iter()
        .map(|h| h.memory.id)
        .collect();
    assert_eq!(found, vec![kept.id]);
    let words = b.search_keyword("door code", 10, &Filter::all()).unwrap();
    assert_eq!(words.len(), 1);
    assert_eq!(words[0].memory.id, kept.id);
    assert_eq!(
        b.get(gone.id).unwrap().lifetime.expires_at,
        gone.lifetime.expires_at
    );
    let mut with_expired = knowledge();
    with_expired.expired = true;
    assert_eq!(b.recent(&with_expired, 10).unwrap().len(), 2);
    // Deleting the current version makes the earlier one current again.
    b.delete(berlin.id, DeletePolicy::Restrict).unwrap();
    assert_eq!(b.get(paris.id).unwrap().lifetime.valid_to, None);
    assert_eq!(
        contents(f().kinds([MemoryKind::Conversational])),
        ["Ada lives in Paris"]
    );
}

/// Paging a thread 40 at a time lists every memory once, in time order, while memories are
/// added before, at and after the cursor between pages; the cursor survives its text form.
pub fn paging_lists_each_memory_once(b: &dyn MemoryBackend) {
    let originals: Vec<MemoryId> = b
        .insert_batch(
            (0..250)
                .map(|i| (turn("pg", i, &format!("p {i}")), vector(i as u64)))
                .collect(),
        )
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    let f = Filter::all().thread(thread("pg"));
    let mut seen = Vec::new();
    let mut cursor: Option<Cursor> = None;
    let mut pages = 0;
    loop {
        let page = b.page(&f, cursor, 40).unwrap();
        assert!(page.items.len() <= 40);
        assert!(page
            .items
            .windows(2)
            .all(|w| w[0].created_at <= w[1].created_at));
        seen.extend(page.items.iter().map(|m| m.id));
        pages += 1;
        let Some(next) = page.next else { break };
        let last = page.items.last().unwrap().created_at;
        // One before the cursor, one at its time, one after the end.
        b.insert_batch(vec![
            (turn("pg", -1 - pages, "early"), vector(900)),
            (turn("pg", 0, "same time").at(last), vector(901)),
            (turn("pg", 10_000 + pages, "late"), vector(902)),
        ])
        .unwrap();
        cursor = Some(next.to_string().parse().unwrap());
        assert!(pages < 50, "paging ends");
    }
    for id in &originals {
        assert_eq!(
            seen.iter().filter(|x| *x == id).count(),
            1,
            "{id} listed once"
        );
    }
    let pos: Vec<usize> = originals
        .iter()
        .map(|id| seen.iter().position(|x| x == id).unwrap())
        .collect();
    assert!(pos.windows(2).all(|w| w[0] < w[1]), "in time order");
    assert!(b.page(&f, None, 0).unwrap().items.is_empty());
}

/// A merge patch adds, replaces and removes fields (nested objects merge) without touching
/// content or embedding; an unknown id is `NotFound` and a bad patch changes nothing.
pub fn metadata_patches(b: &dyn MemoryBackend) {
    let mut meta = cairn_core::Metadata::new();
    meta.insert("user_id".into(), json!("alice"));
    meta.insert("prefs".into(), json!({"tea": "green", "cups": 2}));
    meta.insert("old".into(), json!(true));
    let m = b
        .insert(turn("patch", 0, "likes tea").with_metadata(meta), vector(5))
        .unwrap();
    let patch = json!({"prefs": {"cups": 3, "sugar": null}, "old": null, "tier": "gold"});
    let serde_json::Value::Object(patch) = patch else {
        unreachable!()
    };
    let out = b.patch_metadata(m.id, patch).unwrap();
    let want = json!({"user_id": "alice", "prefs": {"tea": "green", "cups": 3}, "tier": "gold"});
    assert_eq!(serde_json::Value::Object(out.metadata.clone()), want);
    let stored = b.get(m.id).unwrap();
    assert_eq!(stored.metadata, out.metadata);
    assert_eq!(stored.content, "likes tea");
    let hits = b.search_vector(vector(5), 1, &Filter::all()).unwrap();
    assert_eq!(hits[0].memory.id, m.id);
    assert!(
        (hits[0].score - 1.0).abs() < 1e-3,
        "the embedding is unchanged"
    );
    assert!(matches!(
        b.patch_metadata(MemoryId::new(), cairn_core::Metadata::new()),
        Err(StoreError::NotFound { .. })
    ));
    let mut deep = json!(1);
    for _ in 0..70 {
        deep = json!([deep]);
    }
    let mut bad = cairn_core::Metadata::new();
    bad.insert("deep".into(), deep);
    assert!(matches!(
        b.patch_metadata(m.id, bad),
        Err(StoreError::Input(_))
    ));
    assert_eq!(b.get(m.id).unwrap().metadata, out.metadata);
}

/// Thread state values are written, replaced and read per thread and name; bad names are
/// refused.
pub fn thread_state_round_trips(b: &dyn MemoryBackend) {
    let put = |t: &str, n: &str, v: &str| {
        b.set_thread_state(ThreadState {
            thread: thread(t),
            name: n.into(),
            value: v.into(),
        })
    };
    assert_eq!(b.thread_state(&thread("ts"), "head").unwrap(), None);
    put("ts", "head", "one").unwrap();
    put("ts", "head", "two").unwrap();
    put("ts", "tail", "x").unwrap();
    put("other", "head", "y").unwrap();
    assert_eq!(
        b.thread_state(&thread("ts"), "head").unwrap().as_deref(),
        Some("two")
    );
    assert_eq!(
        b.thread_state(&thread("ts"), "tail").unwrap().as_deref(),
        Some("x")
    );
    assert_eq!(
        b.thread_state(&thread("other"), "head").unwrap().as_deref(),
        Some("y")
    );
    assert!(put("ts", "", "v").is_err());
    assert!(put("ts", "big", &"v".repeat(70_000)).is_err());
    assert_eq!(b.thread_state(&thread("ts"), "big").unwrap(), None);
}

/// A fact's versions come back oldest first from any of them; `existing` and `get_many`
/// answer for several ids; an expiry set later hides a memory and lists it as expired, and
/// removing it shows the memory again.
pub fn versions_reads_and_expiry(b: &dyn MemoryBackend) {
    let day = Duration::days(1);
    let a = b.insert(turn("ver", 0, "v1"), vector(1)).unwrap();
    let v2 = b
        .insert(
            turn("ver", 1, "v2").supersedes(a.id).valid_from(t0() + day),
            vector(2),
        )
        .unwrap();
    let v3 = b
        .insert(
            turn("ver", 2, "v3")
                .supersedes(v2.id)
                .valid_from(t0() + day * 2),
            vector(3),
        )
        .unwrap();
    let other = b.insert(turn("ver", 3, "unrelated"), vector(4)).unwrap();
    for id in [a.id, v2.id, v3.id] {
        assert_eq!(ids(&b.versions(id).unwrap()), vec![a.id, v2.id, v3.id]);
    }
    assert_eq!(ids(&b.versions(other.id).unwrap()), vec![other.id]);
    assert!(matches!(
        b.versions(MemoryId::new()),
        Err(StoreError::NotFound { .. })
    ));
    let unknown = MemoryId::new();
    assert_eq!(
        b.existing(&[a.id, unknown, v3.id]).unwrap(),
        HashSet::from([a.id, v3.id])
    );
    assert_eq!(ids(&b.get_many(&[v3.id, a.id]).unwrap()), vec![v3.id, a.id]);
    assert!(matches!(
        b.get_many(&[a.id, unknown]),
        Err(StoreError::NotFound { id }) if id == unknown
    ));
    let e = b
        .insert(
            NewMemory::new(MemoryKind::Knowledge, "temporary"),
            vector(5),
        )
        .unwrap();
    assert!(b.expired(10).unwrap().is_empty());
    let past = Utc::now() - Duration::hours(1);
    let set = b.set_expiry(e.id, Some(past)).unwrap();
    assert_eq!(
        set.lifetime.expires_at,
        Some(crate::backend::to_stored_time(past))
    );
    assert_eq!(b.expired(10).unwrap(), vec![e.id]);
    let knowledge = Filter::all().kinds([MemoryKind::Knowledge]);
    assert!(b.recent(&knowledge, 10).unwrap().is_empty());
    let back = b.set_expiry(e.id, None).unwrap();
    assert_eq!(back.lifetime.expires_at, None);
    assert!(b.expired(10).unwrap().is_empty());
    assert_eq!(ids(&b.recent(&knowledge, 10).unwrap()), vec![e.id]);
    assert!(matches!(
        b.set_expiry(MemoryId::new(), None),
        Err(StoreError::NotFound { .. })
    ));
}
