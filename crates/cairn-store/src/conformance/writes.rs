//! Conformance checks of the writes the harness builds on: content and metadata rewrites,
//! summary refreshes and growth, late sources, continuations, backup and restore.

use super::*;

use cairn_core::Metadata;

/// A JSON object as metadata.
fn obj(v: serde_json::Value) -> Metadata {
    match v {
        serde_json::Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

/// A summary of `sources` in thread `t`, with the embedding `vector(v)`.
fn summarize(
    b: &dyn MemoryBackend,
    t: &str,
    text: &str,
    sources: &[&MemoryUnit],
    v: u64,
) -> MemoryUnit {
    b.add_summary(
        NewSummary::new(text, sources.iter().map(|m| m.id).collect()).with_thread(Some(thread(t))),
        vector(v),
    )
    .unwrap()
}

fn stale(b: &dyn MemoryBackend, id: MemoryId) -> bool {
    b.get(id).unwrap().summary.unwrap().stale
}

fn source_ids(b: &dyn MemoryBackend, id: MemoryId) -> Vec<MemoryId> {
    ids(&b.sources(id).unwrap())
}

fn minutes(i: i64) -> DateTime<Utc> {
    t0() + Duration::seconds(i * 60)
}

/// `update` replaces content (and the keyword index), metadata only when given, and the
/// embedding, keeps the id, time and links, and marks every summary above stale (not the
/// others); unknown ids and bad input write nothing.
pub fn update_marks_every_summary_above_stale(b: &dyn MemoryBackend) {
    let meta = obj(json!({"speaker": "Ada", "n": 1}));
    let a = b
        .insert(
            turn("upd", 0, "apples are red").with_metadata(meta.clone()),
            vector(1),
        )
        .unwrap();
    let c = b
        .insert(
            turn("upd", 1, "cherries are dark").with_metadata(meta.clone()),
            vector(2),
        )
        .unwrap();
    let other = b.insert(turn("upd", 2, "plums"), vector(3)).unwrap();
    let s1 = summarize(b, "upd", "fruit", &[&a, &c], 10);
    let s2 = summarize(b, "upd", "food", &[&s1], 11);
    let s3 = summarize(b, "upd", "plums", &[&other], 12);
    assert!(!stale(b, s1.id) && !stale(b, s2.id) && !stale(b, s3.id));

    let new_meta = obj(json!({"edited": true}));
    let out = b
        .update(
            a.id,
            "bananas are yellow".into(),
            Some(new_meta.clone()),
            vector(50),
        )
        .unwrap();
    assert_eq!(out.id, a.id);
    assert_eq!(out.content, "bananas are yellow");
    assert_eq!(out.metadata, new_meta);
    assert_eq!(out.created_at, a.created_at);
    assert_eq!(out.thread_id, a.thread_id);
    assert_eq!(out.role, a.role);
    assert_eq!(out.level, 0);
    assert_eq!(b.get(a.id).unwrap(), out);
    assert!(stale(b, s1.id), "the summary citing it is stale");
    assert!(stale(b, s2.id), "the summary two levels up is stale");
    assert!(!stale(b, s3.id), "an unrelated summary is not");
    assert_eq!(source_ids(b, s1.id), vec![a.id, c.id], "links are kept");
    assert_eq!(b.get(s1.id).unwrap().level, 1);
    assert_eq!(b.get(s2.id).unwrap().level, 2);

    let hits = b.search_vector(vector(50), 1, &Filter::all()).unwrap();
    assert_eq!(hits[0].memory.id, a.id);
    assert!((hits[0].score - 1.0).abs() < 1e-3, "the new embedding");
    let found = b.search_keyword("bananas", 5, &Filter::all()).unwrap();
    assert_eq!(
        found.iter().map(|h| h.memory.id).collect::<Vec<_>>(),
        vec![a.id]
    );
    assert!(b
        .search_keyword("apples", 5, &Filter::all())
        .unwrap()
        .is_empty());

    // Without metadata, the stored metadata stays.
    let out = b
        .update(c.id, "cherries are sour".into(), None, vector(51))
        .unwrap();
    assert_eq!(out.metadata, meta);
    assert_eq!(out.content, "cherries are sour");

    assert!(matches!(
        b.update(MemoryId::new(), "x".into(), None, vector(1)),
        Err(StoreError::NotFound { .. })
    ));
    assert!(b
        .update(c.id, "wrong size".into(), None, vec![1.0; DIM + 1])
        .is_err());
    assert!(b.update(c.id, String::new(), None, vector(52)).is_err());
    assert_eq!(b.get(c.id).unwrap().content, "cherries are sour");
    assert_eq!(count(b), 6, "no memory was added");
}

/// `refresh_summary`: `NotASummary` for a raw memory; a summary loses its stale flag, gets
/// its level, time range and source count recomputed from its links (a restored summary
/// with a wrong span gets the span of its sources), and the summaries above become stale.
pub fn refresh_summary_recomputes_and_clears_stale(b: &dyn MemoryBackend) {
    let a = b.insert(turn("ref", 0, "first"), vector(1)).unwrap();
    let c = b.insert(turn("ref", 3, "second"), vector(2)).unwrap();
    let s1 = summarize(b, "ref", "both", &[&a, &c], 10);
    let s2 = summarize(b, "ref", "above", &[&s1], 11);
    assert!(matches!(
        b.refresh_summary(a.id, "x".into(), None, vector(3)),
        Err(StoreError::NotASummary { .. })
    ));
    assert!(matches!(
        b.refresh_summary(MemoryId::new(), "x".into(), None, vector(3)),
        Err(StoreError::NotFound { .. })
    ));

    b.update(a.id, "first, edited".into(), None, vector(4))
        .unwrap();
    assert!(stale(b, s1.id) && stale(b, s2.id));
    let meta = obj(json!({"model": "m2"}));
    let out = b
        .refresh_summary(s1.id, "both, again".into(), Some(meta.clone()), vector(12))
        .unwrap();
    assert_eq!(out.content, "both, again");
    assert_eq!(out.metadata, meta);
    let info = out.summary.clone().unwrap();
    assert!(!info.stale);
    assert_eq!(info.source_ids, vec![a.id, c.id]);
    assert_eq!((info.level, info.source_count), (1, 2));
    assert_eq!(
        (info.time_range_start, info.time_range_end),
        (minutes(0), minutes(3))
    );
    assert_eq!(b.get(s1.id).unwrap(), out);
    assert!(stale(b, s2.id), "the summary above is still stale");
    let top = b
        .refresh_summary(s2.id, "above, again".into(), None, vector(13))
        .unwrap();
    assert!(!top.summary.unwrap().stale);
    assert!(!stale(b, s1.id));
    // Refreshing a summary that was not stale still marks those above.
    b.refresh_summary(s1.id, "both, third".into(), None, vector(14))
        .unwrap();
    assert!(stale(b, s2.id));
    assert!(!stale(b, s1.id));

    // A summary restored with a span and count that are not its sources': the count is
    // recomputed on restore, the span on refresh.
    let far = t0() - Duration::days(30);
    let r = MemoryUnit {
        id: MemoryId::new(),
        kind: MemoryKind::Summary,
        thread_id: Some(thread("ref")),
        role: None,
        content: "restored".into(),
        created_at: t0() + Duration::days(1),
        metadata: cairn_core::Metadata::new(),
        level: 1,
        summary: Some(cairn_core::SummaryInfo {
            summary_type: cairn_core::SummaryType::Conversation,
            source_ids: vec![c.id, a.id],
            time_range_start: far,
            time_range_end: far + Duration::days(60),
            source_count: 99,
            level: 1,
            stale: true,
            continues: None,
        }),
        lifetime: cairn_core::Lifetime::default(),
    };
    let restored = b.restore(vec![(r.clone(), vector(20))]).unwrap();
    assert_eq!(restored[0].summary.as_ref().unwrap().source_count, 2);
    let got = b.get(r.id).unwrap().summary.unwrap();
    assert!(got.stale);
    assert_eq!(got.source_count, 2);
    assert_eq!(
        got.time_range_start, far,
        "restore keeps the span as it was"
    );
    let above = summarize(b, "ref", "over restored", &[&restored[0]], 21);
    let out = b
        .refresh_summary(r.id, "restored, refreshed".into(), None, vector(22))
        .unwrap();
    let info = out.summary.unwrap();
    assert!(!info.stale);
    assert_eq!(info.source_ids, vec![c.id, a.id], "links keep their order");
    assert_eq!((info.level, info.source_count), (1, 2));
    assert_eq!(
        (info.time_range_start, info.time_range_end),
        (minutes(0), minutes(3))
    );
    assert!(stale(b, above.id));
}

/// `set_metadata` replaces the whole object (where `patch_metadata` merges), leaves the
/// content, embedding and the summaries above as they are; `NotFound` and invalid
/// metadata write nothing.
pub fn set_metadata_replaces_whole(b: &dyn MemoryBackend) {
    let m = b
        .insert(
            turn("meta", 0, "tea time")
                .with_metadata(obj(json!({"a": 1, "nested": {"x": 1, "y": 2}}))),
            vector(5),
        )
        .unwrap();
    let s = summarize(b, "meta", "tea", &[&m], 6);
    let out = b
        .set_metadata(m.id, obj(json!({"nested": {"x": 3}})))
        .unwrap();
    assert_eq!(
        serde_json::Value::Object(out.metadata.clone()),
        json!({"nested": {"x": 3}})
    );
    assert_eq!(out.content, "tea time");
    assert_eq!(b.get(m.id).unwrap(), out);
    let patched = b.patch_metadata(m.id, obj(json!({"b": 2}))).unwrap();
    assert_eq!(
        serde_json::Value::Object(patched.metadata),
        json!({"nested": {"x": 3}, "b": 2})
    );
    let cleared = b.set_metadata(m.id, Metadata::new()).unwrap();
    assert!(cleared.metadata.is_empty());
    assert!(b.get(m.id).unwrap().metadata.is_empty());
    assert!(!stale(b, s.id), "metadata does not make a summary stale");
    let hits = b.search_vector(vector(5), 1, &Filter::all()).unwrap();
    assert_eq!(hits[0].memory.id, m.id);
    assert!(
        (hits[0].score - 1.0).abs() < 1e-3,
        "the embedding is unchanged"
    );

    assert!(matches!(
        b.set_metadata(MemoryId::new(), Metadata::new()),
        Err(StoreError::NotFound { .. })
    ));
    let mut deep = json!(1);
    for _ in 0..70 {
        deep = json!([deep]);
    }
    let mut bad = Metadata::new();
    bad.insert("deep".into(), deep);
    assert!(matches!(
        b.set_metadata(m.id, bad),
        Err(StoreError::Input(_))
    ));
    b.set_metadata(m.id, obj(json!({"kept": true}))).unwrap();
    let s_meta = b.set_metadata(s.id, obj(json!({"on": "summary"}))).unwrap();
    assert_eq!(s_meta.summary.unwrap().source_ids, vec![m.id]);
    assert_eq!(
        serde_json::Value::Object(b.get(m.id).unwrap().metadata),
        json!({"kept": true})
    );
}

/// `extend_summary` appends sources after the last link, updates the level and span of
/// the summary and of every summary above (which become stale; the extended one does
/// not), and refuses, writing nothing: no sources, itself, a source already linked or
/// repeated, an ancestor (a cycle, even after a valid source in the same call), an unknown
/// memory, another thread's memory, a raw memory as the summary.
pub fn extend_summary_propagates_and_refuses_cycles(b: &dyn MemoryBackend) {
    let a = b.insert(turn("ext", 0, "a"), vector(1)).unwrap();
    let c = b.insert(turn("ext", 1, "c"), vector(2)).unwrap();
    let d = b.insert(turn("ext", 5, "d"), vector(3)).unwrap();
    let e = b.insert(turn("ext", 9, "e"), vector(4)).unwrap();
    let f = b.insert(turn("ext", 12, "f"), vector(5)).unwrap();
    let s1 = summarize(b, "ext", "s1", &[&a, &c], 10);
    let s2 = summarize(b, "ext", "s2", &[&s1], 11);

    let out = b.extend_summary(s1.id, vec![d.id]).unwrap();
    let info = out.summary.clone().unwrap();
    assert_eq!(info.source_ids, vec![a.id, c.id, d.id]);
    assert_eq!((out.level, info.level, info.source_count), (1, 1, 3));
    assert_eq!(
        (info.time_range_start, info.time_range_end),
        (minutes(0), minutes(5))
    );
    assert!(!info.stale, "the extended summary itself is not stale");
    assert_eq!(b.get(s1.id).unwrap(), out);
    let top = b.get(s2.id).unwrap();
    let ti = top.summary.unwrap();
    assert!(ti.stale, "the summary above is stale");
    assert_eq!(
        (top.level, ti.time_range_start, ti.time_range_end),
        (2, minutes(0), minutes(5))
    );

    // A level-1 source raises the summary to level 2 and the one above to 3.
    let x = summarize(b, "ext", "x", &[&e], 12);
    let out = b.extend_summary(s1.id, vec![x.id]).unwrap();
    assert_eq!(out.level, 2);
    let info = out.summary.unwrap();
    assert_eq!((info.level, info.source_count), (2, 4));
    assert_eq!(info.time_range_end, minutes(9));
    let top = b.get(s2.id).unwrap();
    assert_eq!(top.level, 3);
    let ti = top.summary.unwrap();
    assert_eq!(
        (ti.level, ti.time_range_end, ti.source_count),
        (3, minutes(9), 1)
    );
    assert_eq!(source_ids(b, s1.id), vec![a.id, c.id, d.id, x.id]);
    assert_eq!(ids(&b.leaves(s2.id).unwrap()), vec![a.id, c.id, d.id, e.id]);

    let before = b.get(s1.id).unwrap();
    assert!(matches!(
        b.extend_summary(s1.id, vec![s2.id]),
        Err(StoreError::Cycle { summary, ancestor }) if summary == s1.id && ancestor == s2.id
    ));
    assert!(matches!(
        b.extend_summary(s1.id, vec![f.id, s2.id]),
        Err(StoreError::Cycle { .. })
    ));
    assert!(matches!(
        b.extend_summary(s1.id, vec![]),
        Err(StoreError::EmptySources)
    ));
    assert!(matches!(
        b.extend_summary(s1.id, vec![s1.id]),
        Err(StoreError::SelfReference { .. })
    ));
    assert!(matches!(
        b.extend_summary(s1.id, vec![a.id]),
        Err(StoreError::DuplicateSource { id }) if id == a.id
    ));
    assert!(matches!(
        b.extend_summary(s1.id, vec![f.id, f.id]),
        Err(StoreError::DuplicateSource { id }) if id == f.id
    ));
    assert!(matches!(
        b.extend_summary(s1.id, vec![f.id, MemoryId::new()]),
        Err(StoreError::NotFound { .. })
    ));
    let stranger = b
        .insert(turn("ext-other", 2, "elsewhere"), vector(6))
        .unwrap();
    assert!(matches!(
        b.extend_summary(s1.id, vec![stranger.id]),
        Err(StoreError::ThreadMismatch { .. })
    ));
    assert!(matches!(
        b.extend_summary(a.id, vec![f.id]),
        Err(StoreError::NotASummary { .. })
    ));
    assert_eq!(
        b.get(s1.id).unwrap(),
        before,
        "refused extensions wrote nothing"
    );
    assert!(b.summaries_of(f.id).unwrap().is_empty());
}

/// `place_source` puts a late source after every source at or before its time (the
/// others keep their order), marks the summary and every summary above stale and updates
/// their spans; repeats, itself, ancestors and raw memories as the summary are refused.
pub fn place_source_orders_by_time(b: &dyn MemoryBackend) {
    let a = b.insert(turn("pl", 0, "a"), vector(1)).unwrap();
    let c = b.insert(turn("pl", 4, "c"), vector(2)).unwrap();
    let s = summarize(b, "pl", "chunk", &[&a, &c], 10);
    let top = summarize(b, "pl", "top", &[&s], 11);
    let other = summarize(b, "pl", "other", &[&a], 12);

    let mid = b.insert(turn("pl", 2, "mid"), vector(3)).unwrap();
    let out = b.place_source(s.id, mid.id).unwrap();
    let info = out.summary.clone().unwrap();
    assert_eq!(info.source_ids, vec![a.id, mid.id, c.id]);
    assert!(info.stale, "the summary is stale");
    assert_eq!((out.level, info.source_count), (1, 3));
    assert_eq!(b.get(s.id).unwrap(), out);
    assert!(stale(b, top.id), "the summary above is stale");
    assert!(!stale(b, other.id));

    let early = b.insert(turn("pl", -2, "early"), vector(4)).unwrap();
    let out = b.place_source(s.id, early.id).unwrap();
    let info = out.summary.unwrap();
    assert_eq!(info.source_ids, vec![early.id, a.id, mid.id, c.id]);
    assert_eq!(
        (info.time_range_start, info.time_range_end),
        (minutes(-2), minutes(4))
    );
    let ti = b.get(top.id).unwrap().summary.unwrap();
    assert_eq!(
        (ti.time_range_start, ti.time_range_end),
        (minutes(-2), minutes(4))
    );

    // A tie goes after the source of the same time; a later one goes last.
    let twin = b.insert(turn("pl", 2, "mid twin"), vector(5)).unwrap();
    let late = b.insert(turn("pl", 8, "late"), vector(6)).unwrap();
    b.place_source(s.id, twin.id).unwrap();
    let out = b.place_source(s.id, late.id).unwrap();
    let want = vec![early.id, a.id, mid.id, twin.id, c.id, late.id];
    assert_eq!(out.summary.as_ref().unwrap().source_ids, want);
    assert_eq!(source_ids(b, s.id), want);
    assert_eq!(out.summary.unwrap().time_range_end, minutes(8));
    assert_eq!(ids(&b.leaves(top.id).unwrap()), want);

    // A level-1 source raises the level of the summary and of those above.
    let lone = b.insert(turn("pl", 20, "lone"), vector(7)).unwrap();
    let low = summarize(b, "pl", "low", &[&lone], 13);
    let out = b.place_source(s.id, low.id).unwrap();
    assert_eq!(out.level, 2);
    assert_eq!(b.get(top.id).unwrap().level, 3);

    let before = b.get(s.id).unwrap();
    assert!(matches!(
        b.place_source(s.id, a.id),
        Err(StoreError::DuplicateSource { .. })
    ));
    assert!(matches!(
        b.place_source(s.id, s.id),
        Err(StoreError::SelfReference { .. })
    ));
    assert!(matches!(
        b.place_source(s.id, top.id),
        Err(StoreError::Cycle { .. })
    ));
    assert!(matches!(
        b.place_source(a.id, c.id),
        Err(StoreError::NotASummary { .. })
    ));
    assert!(matches!(
        b.place_source(s.id, MemoryId::new()),
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(b.get(s.id).unwrap(), before);
}

/// `add_continuation` links the previous version first with a continuation link that
/// does not raise the level (level = max(previous level, 1 + highest new source level)),
/// so `sources` and `leaves` reach every earlier version's memories; the thread state is
/// written with it, and not at all when it is refused. `clear_thread_state` removes a
/// thread's values only.
pub fn continuations_chain_and_write_state(b: &dyn MemoryBackend) {
    let t = thread("mv");
    let turns: Vec<MemoryUnit> = (0..6)
        .map(|i| {
            b.insert(turn("mv", i, &format!("turn {i}")), vector(i as u64))
                .unwrap()
        })
        .collect();
    let state = |v: &str| ThreadState {
        thread: t.clone(),
        name: "moving".into(),
        value: v.into(),
    };
    let keep = ThreadState {
        thread: thread("mv-other"),
        name: "moving".into(),
        value: "theirs".into(),
    };
    b.set_thread_state(keep.clone()).unwrap();
    let new =
        |text: &str, srcs: Vec<MemoryId>| NewSummary::new(text, srcs).with_thread(Some(t.clone()));

    let v1 = b
        .add_continuation(
            new("v1", vec![turns[0].id, turns[1].id]),
            None,
            Some(state("1")),
            vector(20),
        )
        .unwrap();
    assert_eq!(v1.level, 1);
    assert_eq!(
        v1.summary.as_ref().unwrap().source_ids,
        vec![turns[0].id, turns[1].id]
    );
    assert_eq!(b.thread_state(&t, "moving").unwrap().as_deref(), Some("1"));

    let v2 = b
        .add_continuation(
            new("v2", vec![turns[2].id, turns[3].id]),
            Some(v1.id),
            Some(state("2")),
            vector(21),
        )
        .unwrap();
    assert_eq!(v2.level, 1, "a continuation does not raise the level");
    let info = v2.summary.clone().unwrap();
    assert_eq!(info.source_ids, vec![v1.id, turns[2].id, turns[3].id]);
    assert_eq!((info.level, info.source_count, info.stale), (1, 3, false));
    assert_eq!(
        (info.time_range_start, info.time_range_end),
        (minutes(0), minutes(3))
    );
    assert_eq!(b.get(v2.id).unwrap(), v2);
    assert_eq!(source_ids(b, v2.id), vec![v1.id, turns[2].id, turns[3].id]);
    assert_eq!(ids(&b.leaves(v2.id).unwrap()), ids(&turns[..4]));
    assert_eq!(ids(&b.summaries_of(v1.id).unwrap()), vec![v2.id]);
    assert_eq!(b.thread_state(&t, "moving").unwrap().as_deref(), Some("2"));

    // A refresh keeps the continuation link's level rule.
    let refreshed = b
        .refresh_summary(v2.id, "v2 again".into(), None, vector(22))
        .unwrap();
    assert_eq!(refreshed.level, 1);
    assert_eq!(
        refreshed.summary.unwrap().source_ids,
        vec![v1.id, turns[2].id, turns[3].id]
    );

    // New sources of level 1 raise it to 2; a later version over turns stays at 2.
    let chunk = summarize(b, "mv", "chunk", &[&turns[4]], 23);
    let v3 = b
        .add_continuation(new("v3", vec![chunk.id]), Some(v2.id), None, vector(24))
        .unwrap();
    assert_eq!(v3.level, 2);
    let v4 = b
        .add_continuation(new("v4", vec![turns[5].id]), Some(v3.id), None, vector(25))
        .unwrap();
    assert_eq!(v4.level, 2);
    assert_eq!(b.get(v4.id).unwrap().summary.unwrap().level, 2);
    assert_eq!(ids(&b.leaves(v4.id).unwrap()), ids(&turns));
    assert_eq!(b.thread_state(&t, "moving").unwrap().as_deref(), Some("2"));

    // Refused: nothing written, the state included.
    let n = count(b);
    let stranger = b
        .add_summary(
            NewSummary::new(
                "theirs",
                vec![b.insert(turn("mv-other", 0, "x"), vector(30)).unwrap().id],
            )
            .with_thread(Some(thread("mv-other"))),
            vector(31),
        )
        .unwrap();
    let n = n + 2;
    for (previous, sources) in [
        (turns[0].id, vec![turns[5].id]),
        (MemoryId::new(), vec![turns[5].id]),
        (stranger.id, vec![turns[5].id]),
        (v4.id, vec![v4.id]),
    ] {
        let r = b.add_continuation(
            new("bad", sources),
            Some(previous),
            Some(state("bad")),
            vector(32),
        );
        assert!(r.is_err(), "{previous:?} accepted");
    }
    assert!(matches!(
        b.add_continuation(
            new("bad", vec![turns[5].id]),
            Some(turns[0].id),
            None,
            vector(32)
        ),
        Err(StoreError::NotASummary { .. })
    ));
    assert!(matches!(
        b.add_continuation(
            new("bad", vec![turns[5].id]),
            Some(stranger.id),
            None,
            vector(32)
        ),
        Err(StoreError::ThreadMismatch { .. })
    ));
    assert!(matches!(
        b.add_continuation(new("bad", vec![v4.id]), Some(v4.id), None, vector(32)),
        Err(StoreError::DuplicateSource { .. })
    ));
    assert_eq!(count(b), n);
    assert_eq!(b.thread_state(&t, "moving").unwrap().as_deref(), Some("2"));

    // Each version says which one it continues, and the chain survives a backup.
    assert_eq!(v1.summary.as_ref().unwrap().continues, None);
    assert_eq!(v2.summary.as_ref().unwrap().continues, Some(v1.id));
    assert_eq!(
        b.get(v4.id).unwrap().summary.unwrap().continues,
        Some(v3.id)
    );
    assert_eq!(chunk.summary.as_ref().unwrap().continues, None);
    let mut rows = Vec::new();
    b.backup_rows(true, &mut |_| Ok(()), &mut |m, v| {
        rows.push((m, v.unwrap()));
        Ok(())
    })
    .unwrap();
    let before: Vec<MemoryUnit> = rows.iter().map(|(m, _)| m.clone()).collect();
    b.delete_many(&ids(&before), DeletePolicy::Cascade).unwrap();
    assert_eq!(count(b), 0);
    let mut wrong = rows.clone();
    let at = wrong.iter().position(|(m, _)| m.id == v2.id).unwrap();
    if let Some(info) = wrong[at].0.summary.as_mut() {
        info.continues = Some(turns[2].id);
    }
    assert!(
        matches!(b.restore(wrong), Err(StoreError::Input(_))),
        "a continued version that is not the first source"
    );
    assert_eq!(count(b), 0);
    b.restore(rows).unwrap();
    for m in &before {
        assert_eq!(&b.get(m.id).unwrap(), m);
    }
    assert_eq!(ids(&b.leaves(v4.id).unwrap()), ids(&turns));
    assert_eq!(b.get(v4.id).unwrap().level, 2);
    assert_eq!(b.get(v2.id).unwrap().level, 1);

    b.set_thread_state(ThreadState {
        thread: t.clone(),
        name: "cleared_at".into(),
        value: "x".into(),
    })
    .unwrap();
    b.clear_thread_state(&t).unwrap();
    assert_eq!(b.thread_state(&t, "moving").unwrap(), None);
    assert_eq!(b.thread_state(&t, "cleared_at").unwrap(), None);
    assert_eq!(
        b.thread_state(&keep.thread, "moving").unwrap().as_deref(),
        Some("theirs")
    );
}

/// `backup_rows` lists every memory by level then insertion (each summary after its
/// sources) with its stored vector; a callback's error stops it and is returned. After
/// deleting everything, `restore` writes the rows back exactly (ids, times, levels, links
/// in order, stale flags, spans, metadata, lifetimes, vectors); restoring again, a wrong
/// level or a missing source is refused and writes nothing. `reindex` keeps search whole.
pub fn backup_and_restore_round_trip(b: &dyn MemoryBackend) {
    let a = b
        .insert(
            turn("bk", 0, "alpha").with_metadata(obj(json!({"speaker": "Ada"}))),
            vector(1),
        )
        .unwrap();
    let c = b
        .insert(
            turn("bk", 1, "beta").expires_at(t0() + Duration::days(365 * 200)),
            vector(2),
        )
        .unwrap();
    let k1 = b
        .insert(
            NewMemory::new(MemoryKind::Knowledge, "Ada lives in Paris").at(minutes(2)),
            vector(3),
        )
        .unwrap();
    let k2 = b
        .insert(
            NewMemory::new(MemoryKind::Knowledge, "Ada lives in Rome")
                .at(minutes(3))
                .supersedes(k1.id),
            vector(4),
        )
        .unwrap();
    let s1 = summarize(b, "bk", "greek letters", &[&c, &a], 10);
    let s2 = summarize(b, "bk", "everything", &[&s1, &k2], 11);
    b.update(a.id, "alpha, edited".into(), None, vector(5))
        .unwrap();
    b.refresh_summary(s2.id, "everything, again".into(), None, vector(12))
        .unwrap();
    assert!(stale(b, s1.id) && !stale(b, s2.id));

    let mut started = None;
    let mut rows: Vec<(MemoryUnit, Vec<f32>)> = Vec::new();
    let n = b
        .backup_rows(
            true,
            &mut |n| {
                started = Some(n);
                Ok(())
            },
            &mut |u, v| {
                rows.push((u, v.expect("a vector")));
                Ok(())
            },
        )
        .unwrap();
    assert_eq!((n, started), (6, Some(6)));
    let order: Vec<MemoryId> = rows.iter().map(|(u, _)| u.id).collect();
    assert_eq!(order, vec![a.id, c.id, k1.id, k2.id, s1.id, s2.id]);
    let before: Vec<MemoryUnit> = rows.iter().map(|(u, _)| u.clone()).collect();
    assert_eq!(before, b.get_many(&order).unwrap());
    let want = unit(&vector(5));
    assert!(
        rows[0]
            .1
            .iter()
            .zip(&want)
            .all(|(x, y)| (x - y).abs() < 1e-6),
        "the stored (normalized) vector"
    );
    for (u, v) in &rows {
        let hit = &b
            .search_vector(v.clone(), 1, &Filter::all().with_history())
            .unwrap()[0];
        assert_eq!(hit.memory.id, u.id);
    }

    // Callback errors stop the read and come back.
    let mut seen = 0;
    let r = b.backup_rows(false, &mut |_| Ok(()), &mut |_, v| {
        assert!(v.is_none());
        seen += 1;
        if seen == 2 {
            Err(StoreError::Config("stop".into()))
        } else {
            Ok(())
        }
    });
    assert!(matches!(r, Err(StoreError::Config(m)) if m == "stop"));
    assert_eq!(seen, 2);
    let r = b.backup_rows(
        false,
        &mut |_| Err(StoreError::Config("no".into())),
        &mut |_, _| panic!("no row after a failed start"),
    );
    assert!(matches!(r, Err(StoreError::Config(m)) if m == "no"));

    b.delete_many(&order, DeletePolicy::Cascade).unwrap();
    assert!(b.existing(&order).unwrap().is_empty());
    let restored = b.restore(rows.clone()).unwrap();
    assert_eq!(restored, before);
    assert_eq!(b.get_many(&order).unwrap(), before);
    assert_eq!(source_ids(b, s2.id), vec![s1.id, k2.id]);
    assert_eq!(source_ids(b, s1.id), vec![c.id, a.id]);
    assert_eq!(ids(&b.summaries_of(a.id).unwrap()), vec![s1.id]);
    assert!(stale(b, s1.id) && !stale(b, s2.id));
    assert_eq!(b.get(k2.id).unwrap().lifetime.supersedes, Some(k1.id));
    assert_eq!(b.get(k1.id).unwrap().lifetime.valid_to, Some(minutes(3)));
    let mut again: Vec<(MemoryUnit, Vec<f32>)> = Vec::new();
    b.backup_rows(true, &mut |_| Ok(()), &mut |u, v| {
        again.push((u, v.unwrap()));
        Ok(())
    })
    .unwrap();
    assert_eq!(again, rows, "rows and vectors as they were");

    // Refusals write nothing.
    assert!(matches!(
        b.restore(rows.clone()),
        Err(StoreError::DuplicateId { .. })
    ));
    let fresh = MemoryUnit {
        id: MemoryId::new(),
        ..rows[0].0.clone()
    };
    let mut wrong = rows[4].0.clone();
    wrong.id = MemoryId::new();
    wrong.level = 2;
    if let Some(s) = wrong.summary.as_mut() {
        s.level = 2;
    }
    assert!(matches!(
        b.restore(vec![(fresh.clone(), vector(40)), (wrong, vector(41))]),
        Err(StoreError::Input(_))
    ));
    let mut orphan = rows[4].0.clone();
    orphan.id = MemoryId::new();
    if let Some(s) = orphan.summary.as_mut() {
        s.source_ids = vec![MemoryId::new()];
    }
    assert!(matches!(
        b.restore(vec![(fresh.clone(), vector(40)), (orphan, vector(42))]),
        Err(StoreError::NotFound { .. })
    ));
    let mut raw_level = fresh.clone();
    raw_level.level = 1;
    assert!(matches!(
        b.restore(vec![(raw_level, vector(43))]),
        Err(StoreError::Input(_))
    ));
    assert!(b.existing(&[fresh.id]).unwrap().is_empty());
    assert_eq!(b.existing(&order).unwrap().len(), 6);
    assert_eq!(count(b), 5, "the superseded fact is history");

    b.reindex().unwrap();
    for (u, v) in &rows {
        let hit = &b
            .search_vector(v.clone(), 1, &Filter::all().with_history())
            .unwrap()[0];
        assert_eq!(hit.memory.id, u.id);
    }
}
