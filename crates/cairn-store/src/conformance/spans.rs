//! Conformance checks of context assembly's reads by index id (times, summary spans, how far
//! a thread is consolidated) and of deletes that report the texts they removed.

use super::*;

/// `times_of` and `summary_spans` answer by index id in the order asked, leaving out unknown
/// ids and (for spans) memories that are not summaries; `consolidated_until` follows the
/// thread's newest level-1 summary; `delete_many_with_texts` returns each deleted text in
/// the report's order.
pub fn spans_times_and_deleted_texts(b: &dyn MemoryBackend) {
    let t = thread("spans");
    assert_eq!(b.consolidated_until(&t).unwrap(), None);
    let items: Vec<_> = (0..6)
        .map(|i| (turn("spans", i, &format!("turn {i}")), vector(i as u64)))
        .collect();
    let turns = b.insert_batch(items).unwrap();
    let first = b
        .add_summary(
            NewSummary::new("first three", ids(&turns[..3])).with_thread(Some(t.clone())),
            vector(100),
        )
        .unwrap();
    assert_eq!(
        b.consolidated_until(&t).unwrap(),
        Some(turns[2].created_at),
        "the span's end of the only level-1 summary"
    );
    let second = b
        .add_summary(
            NewSummary::new("last three", ids(&turns[3..])).with_thread(Some(t.clone())),
            vector(101),
        )
        .unwrap();
    assert_eq!(b.consolidated_until(&t).unwrap(), Some(turns[5].created_at));
    // A level-2 summary does not move it.
    b.add_summary(
        NewSummary::new("all", vec![first.id, second.id]).with_thread(Some(t.clone())),
        vector(102),
    )
    .unwrap();
    assert_eq!(b.consolidated_until(&t).unwrap(), Some(turns[5].created_at));

    // Index ids from a search over everything.
    let all = b
        .search_vector_ids_exact(vector(0), 100, &Filter::all())
        .unwrap();
    let hits = b.hits(all.clone()).unwrap();
    let vid_of = |id: MemoryId| {
        let at = hits.iter().position(|h| h.memory.id == id).unwrap();
        all[at].0
    };
    let (v1, v2, v0) = (vid_of(second.id), vid_of(first.id), vid_of(turns[4].id));
    let unknown = all.iter().map(|(v, _)| *v).max().unwrap() + 1_000;
    let times = b.times_of(&[v0, unknown, v1]).unwrap();
    assert_eq!(
        times,
        vec![(v0, turns[4].created_at), (v1, second.created_at)]
    );
    let spans = b.summary_spans(&[v1, v0, unknown, v2]).unwrap();
    assert_eq!(
        spans,
        vec![
            (v1, turns[3].created_at, turns[5].created_at),
            (v2, turns[0].created_at, turns[2].created_at),
        ]
    );

    // Deleting with texts: the report's order, every memory removed (cascade included).
    let (report, texts) = b
        .delete_many_with_texts(&[turns[0].id], DeletePolicy::Cascade)
        .unwrap();
    assert_eq!(report.deleted.len(), texts.len());
    assert_eq!(
        report.deleted.len(),
        3,
        "the turn, its summary and the one above"
    );
    for (id, text) in report.deleted.iter().zip(&texts) {
        let expected = if *id == turns[0].id {
            "turn 0"
        } else if *id == first.id {
            "first three"
        } else {
            "all"
        };
        assert_eq!(text, expected);
    }
    assert!(matches!(
        b.get(turns[0].id),
        Err(StoreError::NotFound { .. })
    ));
}
