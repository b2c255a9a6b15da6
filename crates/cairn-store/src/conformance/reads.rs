//! Conformance checks of the reads the harness builds on: index-id searches and row reads,
//! timelines, thread reads, consolidation's scans and sequence numbers.

use std::collections::HashMap;

use cairn_core::{Metadata, SummaryType};

use super::*;

/// A time `minutes` (and `seconds`) after [`t0`].
fn at(minutes: i64, seconds: i64) -> DateTime<Utc> {
    t0() + Duration::minutes(minutes) + Duration::seconds(seconds)
}

/// A turn of `t` at `when`, saying `text`.
fn turn_at(t: &str, when: DateTime<Utc>, text: &str) -> NewMemory {
    NewMemory::conversational(thread(t), Role::User, text).at(when)
}

/// A summary of `sources` in thread `t`, written at `when`.
fn summary_at(t: &str, sources: Vec<MemoryId>, when: DateTime<Utc>, text: &str) -> NewSummary {
    let mut s = NewSummary::new(text, sources).with_thread(Some(thread(t)));
    s.created_at = Some(when);
    s
}

/// The index id of every memory `filter` admits, from the timeline (whose order is that
/// of `scan`).
fn vids_of(b: &dyn MemoryBackend, filter: &Filter) -> HashMap<MemoryId, u64> {
    let entries = b.timeline_entries(filter).unwrap();
    let rows = b.scan(filter, 0, 100_000).unwrap();
    assert_eq!(
        entries.len(),
        rows.len(),
        "timeline and scan admit the same"
    );
    let map: HashMap<MemoryId, u64> = rows
        .iter()
        .map(|m| m.id)
        .zip(entries.iter().map(|e| e.vid))
        .collect();
    let distinct: HashSet<u64> = map.values().copied().collect();
    assert_eq!(distinct.len(), map.len(), "index ids are distinct");
    map
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    unit(a).iter().zip(unit(b)).map(|(x, y)| x * y).sum()
}

/// Index-id searches agree with the row searches and with brute force: `search_vector_ids`
/// (with and without `ef`, under a thread filter) and `search_vector_ids_exact` rank as an
/// exact cosine scan, `hits` reads their rows in the given order (skipping unknown ids,
/// keeping the scores given), `similarities` scores given ids in order, `embedding`
/// returns the stored unit vector; `search_keyword_ids` ranks as `search_keyword`, and
/// `search_keyword_ids_capped` keeps only the words at most `max_matches` memories hold, and
/// `search_keyword_ids_capped_each` answers several asks as their own calls do.
pub fn index_id_searches_agree(b: &dyn MemoryBackend) {
    let items: Vec<(NewMemory, Vec<f32>)> = (0..60)
        .map(|i| {
            let t = if i % 3 == 0 { "iy" } else { "ix" };
            (
                turn(t, i as i64, &format!("entry {i}")),
                vector(300 + i as u64),
            )
        })
        .collect();
    let vecs: Vec<Vec<f32>> = items.iter().map(|(_, v)| v.clone()).collect();
    let stored = b.insert_batch(items).unwrap();
    let all: Vec<(MemoryId, Vec<f32>)> = stored.iter().map(|m| m.id).zip(vecs).collect();
    let vid = vids_of(b, &Filter::all());
    assert_eq!(vid.len(), 60);
    let id_of: HashMap<u64, MemoryId> = vid.iter().map(|(id, v)| (*v, *id)).collect();
    for probe in [1u64, 2, 3] {
        let q = vector(70_000 + probe);
        let found = b
            .search_vector_ids(q.clone(), 8, &Filter::all(), None)
            .unwrap();
        let expect = brute_force(&all, &q, 8, |_| true);
        assert_eq!(
            found.iter().map(|(v, _)| id_of[v]).collect::<Vec<_>>(),
            expect,
            "probe {probe}"
        );
        assert!(found.windows(2).all(|w| w[0].1 >= w[1].1));
        for (v, s) in &found {
            let vec = &all.iter().find(|(id, _)| *id == id_of[v]).unwrap().1;
            assert!((s - cosine(vec, &q)).abs() < 1e-3, "{s}");
        }
        let hits = b.hits(found.clone()).unwrap();
        let rows = b.search_vector(q.clone(), 8, &Filter::all()).unwrap();
        assert_eq!(
            hits.iter().map(|h| h.memory.id).collect::<Vec<_>>(),
            rows.iter().map(|h| h.memory.id).collect::<Vec<_>>()
        );
        assert_eq!(
            hits.iter().map(|h| h.score).collect::<Vec<_>>(),
            found.iter().map(|(_, s)| *s).collect::<Vec<_>>()
        );
        let in_x = Filter::all().thread(thread("ix"));
        let expect_x = brute_force(&all, &q, 6, |i| i % 3 != 0);
        for ef in [None, Some(64), Some(400)] {
            let found = b.search_vector_ids(q.clone(), 6, &in_x, ef).unwrap();
            assert_eq!(
                found.iter().map(|(v, _)| id_of[v]).collect::<Vec<_>>(),
                expect_x,
                "ef {ef:?}"
            );
        }
        let exact = b.search_vector_ids_exact(q.clone(), 6, &in_x).unwrap();
        assert_eq!(
            exact.iter().map(|(v, _)| id_of[v]).collect::<Vec<_>>(),
            expect_x
        );
        let exact = b
            .search_vector_ids_exact(q.clone(), 100, &Filter::all().thread(thread("iy")))
            .unwrap();
        assert_eq!(
            exact.iter().map(|(v, _)| id_of[v]).collect::<Vec<_>>(),
            brute_force(&all, &q, 100, |i| i % 3 == 0)
        );
    }
    assert!(b
        .search_vector_ids(vector(1), 0, &Filter::all(), None)
        .unwrap()
        .is_empty());
    assert!(b
        .search_vector_ids_exact(vector(1), 5, &Filter::all().thread(thread("nobody")))
        .unwrap()
        .is_empty());
    // hits: the given order and scores, unknown ids skipped.
    let (a, c) = (vid[&all[5].0], vid[&all[40].0]);
    let unknown = vid.values().max().unwrap() + 1_000;
    let hits = b.hits(vec![(c, 0.5), (unknown, 0.4), (a, 0.25)]).unwrap();
    assert_eq!(
        hits.iter()
            .map(|h| (h.memory.id, h.score))
            .collect::<Vec<_>>(),
        vec![(all[40].0, 0.5), (all[5].0, 0.25)]
    );
    assert_eq!(hits[0].memory.content, "entry 40");
    assert!(b.hits(Vec::new()).unwrap().is_empty());
    // similarities: in the order asked, unknown ids left out.
    let q = vector(123);
    let sims = b.similarities(q.clone(), &[c, unknown, a]).unwrap();
    assert_eq!(sims.iter().map(|(v, _)| *v).collect::<Vec<_>>(), vec![c, a]);
    assert!((sims[0].1 - cosine(&all[40].1, &q)).abs() < 1e-4);
    assert!((sims[1].1 - cosine(&all[5].1, &q)).abs() < 1e-4);
    // embedding: the stored unit vector.
    let e = b.embedding(all[7].0).unwrap();
    assert_eq!(e.len(), DIM);
    for (x, y) in e.iter().zip(unit(&all[7].1)) {
        assert!((x - y).abs() < 1e-5);
    }
    assert!(matches!(
        b.embedding(MemoryId::new()),
        Err(StoreError::NotFound { .. })
    ));

    // Keyword search by index id.
    let texts = [
        "zebra common story told slowly",
        "zebra zebra common",
        "zebra herds roam wide plains",
        "quokka common",
        "common ground",
        "common sense",
    ];
    let kw = b
        .insert_batch(
            texts
                .iter()
                .enumerate()
                .map(|(i, s)| (turn("kw", i as i64, s), vector(900 + i as u64)))
                .collect(),
        )
        .unwrap();
    let vid = vids_of(b, &Filter::all());
    let id_of: HashMap<u64, MemoryId> = vid.iter().map(|(id, v)| (*v, *id)).collect();
    let found = b.search_keyword_ids("zebra", 10, &Filter::all()).unwrap();
    let rows = b.search_keyword("zebra", 10, &Filter::all()).unwrap();
    assert_eq!(
        found.iter().map(|(v, _)| id_of[v]).collect::<Vec<_>>(),
        rows.iter().map(|h| h.memory.id).collect::<Vec<_>>()
    );
    assert_eq!(
        found.iter().map(|(v, _)| id_of[v]).collect::<HashSet<_>>(),
        HashSet::from([kw[0].id, kw[1].id, kw[2].id])
    );
    assert_eq!(id_of[&found[0].0], kw[1].id, "two mentions rank first");
    assert!(found.windows(2).all(|w| w[0].1 >= w[1].1));
    assert_eq!(
        ids(&b
            .hits(found.clone())
            .unwrap()
            .into_iter()
            .map(|h| h.memory)
            .collect::<Vec<_>>()),
        found.iter().map(|(v, _)| id_of[v]).collect::<Vec<_>>()
    );
    let found = b
        .search_keyword_ids("zebra quokka", 10, &Filter::all().thread(thread("kw")))
        .unwrap();
    assert_eq!(found.len(), 4, "any word matches");
    assert!(b
        .search_keyword_ids("xylophone", 10, &Filter::all())
        .unwrap()
        .is_empty());
    // Capped: "common" is held by 5 memories, "zebra" by 3, "quokka" by 1.
    let capped = |q: &str, max: usize| -> HashSet<MemoryId> {
        b.search_keyword_ids_capped(q, 10, &Filter::all(), max)
            .unwrap()
            .iter()
            .map(|(v, _)| id_of[v])
            .collect()
    };
    assert_eq!(capped("common quokka", 2), HashSet::from([kw[3].id]));
    assert_eq!(
        capped("common zebra quokka", 3),
        HashSet::from([kw[0].id, kw[1].id, kw[2].id, kw[3].id]),
        "a word held by exactly max_matches memories counts"
    );
    assert_eq!(
        capped("common quokka", 5),
        HashSet::from([kw[0].id, kw[1].id, kw[3].id, kw[4].id, kw[5].id])
    );
    assert!(
        capped("common zebra", 2).is_empty(),
        "every word too common"
    );
    let found = b
        .search_keyword_ids_capped("common zebra", 10, &Filter::all(), 3)
        .unwrap();
    assert_eq!(id_of[&found[0].0], kw[1].id);
    assert_eq!(found.len(), 3);
    // Several asks of one query: each as its own call ranks it, in order; an ask for none
    // and a query of common words only are empty; a bad filter among them is an error.
    let in_kw = Filter::all().thread(thread("kw"));
    let elsewhere = Filter::all().thread(thread("ix"));
    let anywhere = Filter::all();
    let both: Vec<(usize, &Filter)> = vec![
        (10, &in_kw),
        (1, &in_kw),
        (0, &in_kw),
        (10, &elsewhere),
        (10, &anywhere),
    ];
    for (q, max) in [("common zebra quokka", 3), ("zebra quokka", 10)] {
        let each = b.search_keyword_ids_capped_each(q, &both, max).unwrap();
        assert_eq!(each.len(), both.len());
        for (got, &(k, f)) in each.iter().zip(&both) {
            assert_eq!(
                got,
                &b.search_keyword_ids_capped(q, k, f, max).unwrap(),
                "{q}"
            );
        }
        assert_eq!(each[1].len(), 1);
        assert!(each[2].is_empty() && each[3].is_empty());
        assert!(!each[0].is_empty());
    }
    assert!(b
        .search_keyword_ids_capped_each("common", &both, 2)
        .unwrap()
        .iter()
        .all(Vec::is_empty));
    assert!(b
        .search_keyword_ids_capped_each("zebra", &[], 3)
        .unwrap()
        .is_empty());
    assert_eq!(
        b.search_keyword_ids_capped_each("zebra", &[(0, &in_kw), (0, &anywhere)], 3)
            .unwrap(),
        vec![Vec::new(), Vec::new()]
    );
    let backwards = Filter::all().levels(2, 1);
    for (q, asks) in [
        ("zebra", vec![(10, &in_kw), (10, &backwards)]),
        ("zebra", vec![(0, &backwards)]),
        ("", vec![(10, &in_kw), (0, &backwards)]),
    ] {
        assert!(
            matches!(
                b.search_keyword_ids_capped_each(q, &asks, 3),
                Err(StoreError::Input(_))
            ),
            "{q:?}: a bad filter is an error"
        );
    }
}

/// Timelines on a thread with ties in time: `timeline_entries` lists time, index id, text
/// speaker and length in characters, oldest first with ties in insertion order;
/// `timeline_of` sorts given ids the same way (unknown ids left out); `timeline_around`
/// takes `before` entries before each time and `after` at or after it; `timeline_page`
/// takes the oldest or newest `limit` and says whether more were admitted; `texts` and
/// `thread_speakers` read contents and text speakers.
pub fn timelines_with_ties(b: &dyn MemoryBackend) {
    let speak = |s: serde_json::Value| {
        let mut m = Metadata::new();
        m.insert("speaker".into(), s);
        m
    };
    // (minute, text, speaker metadata)
    let rows: Vec<(i64, &str, Option<serde_json::Value>)> = vec![
        (0, "first", Some(json!("ada"))),
        (1, "héllo wörld", Some(json!("Zoe"))),
        (1, "tie two", Some(json!(7))),
        (1, "tie three", None),
        (2, "你好", Some(json!("Bob"))),
        (3, "last one", Some(json!("Ada"))),
        (3, "very last", Some(json!(""))),
    ];
    // Inserted out of time order (ties keep their relative order).
    let order = [4usize, 1, 5, 0, 2, 6, 3];
    for i in order {
        let (m, text, s) = &rows[i];
        let mut n = turn_at("tl", at(*m, 0), text);
        if let Some(s) = s {
            n = n.with_metadata(speak(s.clone()));
        }
        b.insert(n, vector(40 + i as u64)).unwrap();
    }
    // Another thread at the same times.
    b.insert(
        turn_at("tm", at(1, 0), "elsewhere").with_metadata(speak(json!("Eve"))),
        vector(3),
    )
    .unwrap();
    let tl = Filter::all().thread(thread("tl"));
    let entries = b.timeline_entries(&tl).unwrap();
    // Ties at minute 1 in insertion order: "héllo wörld" (1), "tie two" (2), "tie three" (3);
    // at minute 3: "last one" (5), then "very last" (6).
    let expect_order = [0usize, 1, 2, 3, 4, 5, 6];
    assert_eq!(entries.len(), 7);
    let hits = b
        .hits(entries.iter().map(|e| (e.vid, 0.0)).collect())
        .unwrap();
    assert_eq!(
        hits.iter()
            .map(|h| h.memory.content.as_str())
            .collect::<Vec<_>>(),
        expect_order.iter().map(|i| rows[*i].1).collect::<Vec<_>>()
    );
    assert_eq!(
        entries.iter().map(|e| e.at).collect::<Vec<_>>(),
        expect_order
            .iter()
            .map(|i| at(rows[*i].0, 0))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        entries.iter().map(|e| e.chars).collect::<Vec<_>>(),
        vec![5, 11, 7, 9, 2, 8, 9]
    );
    assert_eq!(
        entries
            .iter()
            .map(|e| e.speaker.as_deref())
            .collect::<Vec<_>>(),
        vec![
            Some("ada"),
            Some("Zoe"),
            None,
            None,
            Some("Bob"),
            Some("Ada"),
            Some("")
        ]
    );
    let vid: Vec<u64> = entries.iter().map(|e| e.vid).collect();
    // timeline_of: any order in, time order out, unknown ids left out.
    let unknown = vid.iter().max().unwrap() + 10_000;
    let of = b
        .timeline_of(&[vid[6], vid[2], unknown, vid[0], vid[3], vid[1]])
        .unwrap();
    assert_eq!(
        of,
        [0, 1, 2, 3, 6]
            .iter()
            .map(|i| entries[*i].clone())
            .collect::<Vec<_>>()
    );
    assert!(b.timeline_of(&[]).unwrap().is_empty());
    // timeline_around.
    let around = b
        .timeline_around(&tl, &[at(1, 0), at(3, 0), at(0, 0), at(9, 0)], 1, 2)
        .unwrap();
    let pick = |is: &[usize]| is.iter().map(|i| entries[*i].clone()).collect::<Vec<_>>();
    assert_eq!(around.len(), 4);
    assert_eq!(around[0], pick(&[0, 1, 2]));
    assert_eq!(around[1], pick(&[4, 5, 6]));
    assert_eq!(around[2], pick(&[0, 1]));
    assert_eq!(around[3], pick(&[6]));
    let around = b.timeline_around(&tl, &[at(1, 30)], 3, 0).unwrap();
    assert_eq!(around, vec![pick(&[1, 2, 3])]);
    // timeline_page.
    assert_eq!(
        b.timeline_page(&tl, 2, false).unwrap(),
        (pick(&[0, 1]), true)
    );
    assert_eq!(
        b.timeline_page(&tl, 3, true).unwrap(),
        (pick(&[4, 5, 6]), true)
    );
    assert_eq!(
        b.timeline_page(&tl, 7, false).unwrap(),
        (pick(&[0, 1, 2, 3, 4, 5, 6]), false)
    );
    let window = tl.clone().between(at(1, 0), at(3, 0));
    assert_eq!(
        b.timeline_page(&window, 3, true).unwrap(),
        (pick(&[2, 3, 4]), true)
    );
    assert_eq!(
        b.timeline_page(&window, 4, false).unwrap(),
        (pick(&[1, 2, 3, 4]), false)
    );
    // texts.
    assert_eq!(
        b.texts(&tl).unwrap(),
        expect_order
            .iter()
            .map(|i| {
                let speaker = entries[*i].speaker.clone();
                (rows[*i].1.to_owned(), speaker)
            })
            .collect::<Vec<_>>()
    );
    assert_eq!(
        b.texts(&Filter::all().thread(thread("tm"))).unwrap(),
        vec![("elsewhere".to_owned(), Some("Eve".to_owned()))]
    );
    // Every entry of the whole store, the other thread's at its place.
    let everything = b.timeline_entries(&Filter::all()).unwrap();
    assert_eq!(everything.len(), 8);
    assert_eq!(
        everything[4].speaker.as_deref(),
        Some("Eve"),
        "inserted last of minute 1"
    );
    // thread_speakers: distinct text speakers in byte order, the empty one left out.
    assert_eq!(
        b.thread_speakers(&thread("tl")).unwrap(),
        vec!["Ada", "Bob", "Zoe", "ada"]
    );
    assert!(b.thread_speakers(&thread("nobody")).unwrap().is_empty());
}

/// Thread reads: `count_in_thread` counts a thread's memories of the given kinds,
/// `scan` pages what a filter admits oldest first (ties by insertion) from an offset,
/// `get_found` returns the memories asked for in order, skipping deleted and unknown ids.
pub fn thread_reads(b: &dyn MemoryBackend) {
    let turns = b
        .insert_batch(
            (0..6)
                .map(|i| (turn("tr", i, &format!("turn {i}")), vector(i as u64)))
                .collect(),
        )
        .unwrap();
    let tie = b
        .insert(turn_at("tr", at(2, 0), "tie of turn 2"), vector(20))
        .unwrap();
    let fact = b
        .insert(
            NewMemory::new(MemoryKind::Knowledge, "a fact")
                .with_thread(thread("tr"))
                .at(at(10, 0)),
            vector(21),
        )
        .unwrap();
    b.insert(turn("other", 1, "elsewhere"), vector(22)).unwrap();
    let s = b
        .add_summary(
            summary_at("tr", vec![turns[0].id, turns[1].id], at(20, 0), "sum"),
            vector(23),
        )
        .unwrap();
    let tr = thread("tr");
    assert_eq!(
        b.count_in_thread(&tr, &[MemoryKind::Conversational])
            .unwrap(),
        7
    );
    assert_eq!(
        b.count_in_thread(&tr, &[MemoryKind::Conversational, MemoryKind::Summary])
            .unwrap(),
        8
    );
    assert_eq!(
        b.count_in_thread(&tr, &[MemoryKind::Knowledge, MemoryKind::Summary])
            .unwrap(),
        2
    );
    assert_eq!(b.count_in_thread(&tr, &[]).unwrap(), 0);
    assert_eq!(
        b.count_in_thread(&thread("nobody"), &[MemoryKind::Conversational])
            .unwrap(),
        0
    );
    // scan: oldest first, ties by insertion, offset and limit.
    let f = Filter::all().thread(tr.clone());
    let every = vec![
        turns[0].id,
        turns[1].id,
        turns[2].id,
        tie.id,
        turns[3].id,
        turns[4].id,
        turns[5].id,
        fact.id,
        s.id,
    ];
    assert_eq!(ids(&b.scan(&f, 0, 100).unwrap()), every);
    assert_eq!(ids(&b.scan(&f, 2, 3).unwrap()), every[2..5].to_vec());
    assert_eq!(ids(&b.scan(&f, 8, 3).unwrap()), vec![s.id]);
    assert!(b.scan(&f, 9, 3).unwrap().is_empty());
    assert!(b.scan(&f, 0, 0).unwrap().is_empty());
    let scanned = b.scan(&f, 8, 1).unwrap();
    assert_eq!(
        scanned[0].summary.as_ref().unwrap().source_ids,
        vec![turns[0].id, turns[1].id],
        "scan reads whole rows"
    );
    assert_eq!(
        ids(&b
            .scan(&f.clone().kinds([MemoryKind::Conversational]), 3, 2)
            .unwrap()),
        vec![tie.id, turns[3].id]
    );
    // get_found skips what is gone.
    b.delete(turns[4].id, DeletePolicy::Restrict).unwrap();
    let asked = [turns[5].id, turns[4].id, MemoryId::new(), s.id, turns[2].id];
    let found = b.get_found(&asked).unwrap();
    assert_eq!(ids(&found), vec![turns[5].id, s.id, turns[2].id]);
    assert_eq!(found[0].content, "turn 5");
    assert!(b.get_found(&[]).unwrap().is_empty());
    assert!(matches!(
        b.get_many(&asked),
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(
        b.count_in_thread(&tr, &[MemoryKind::Conversational])
            .unwrap(),
        6
    );
    assert_eq!(
        ids(&b.scan(&f, 4, 2).unwrap()),
        vec![turns[3].id, turns[5].id]
    );
}

/// The hierarchy by index id: `leaf_vids` walks every level down to the raw memories,
/// `child_summary_vids` lists a summary's cited summaries in order, `top_summaries` lists
/// the uncited summaries among the newest `per_level` of each level, `stale_summaries`
/// lists stale summaries lowest level first, and `stats` counts rows, levels, stale
/// summaries and links.
pub fn hierarchy_by_index_id(b: &dyn MemoryBackend) {
    let t = b
        .insert_batch(
            (0..6)
                .map(|i| (turn("hy", i, &format!("h {i}")), vector(60 + i as u64)))
                .collect(),
        )
        .unwrap();
    let s0 = b
        .add_summary(summary_at("hy", vec![t[5].id], at(10, 0), "s0"), vector(70))
        .unwrap();
    let s1 = b
        .add_summary(
            summary_at("hy", vec![t[0].id, t[1].id, t[2].id], at(11, 0), "s1"),
            vector(71),
        )
        .unwrap();
    let s2 = b
        .add_summary(
            summary_at("hy", vec![t[3].id, t[4].id], at(12, 0), "s2"),
            vector(72),
        )
        .unwrap();
    let top = b
        .add_summary(
            summary_at("hy", vec![s2.id, t[5].id, s1.id], at(13, 0), "top"),
            vector(73),
        )
        .unwrap();
    let s3 = b
        .add_summary(summary_at("hy", vec![t[4].id], at(14, 0), "s3"), vector(74))
        .unwrap();
    assert_eq!(top.level, 2);
    b.insert(turn("hz", 0, "other thread"), vector(75)).unwrap();
    let vid = vids_of(b, &Filter::all());
    let v = |m: &MemoryUnit| vid[&m.id];
    let leaves = |ms: &[&MemoryUnit]| ms.iter().map(|m| v(m)).collect::<HashSet<u64>>();
    assert_eq!(
        b.leaf_vids(&[v(&top)]).unwrap(),
        leaves(&[&t[0], &t[1], &t[2], &t[3], &t[4], &t[5]])
    );
    assert_eq!(
        b.leaf_vids(&[v(&s2), v(&s1)]).unwrap(),
        leaves(&[&t[0], &t[1], &t[2], &t[3], &t[4]])
    );
    assert_eq!(
        b.leaf_vids(&[v(&s0), v(&s3)]).unwrap(),
        leaves(&[&t[4], &t[5]])
    );
    assert!(b.leaf_vids(&[v(&t[0])]).unwrap().is_empty());
    assert!(b.leaf_vids(&[]).unwrap().is_empty());
    assert_eq!(
        b.child_summary_vids(&[v(&top)]).unwrap(),
        vec![(v(&top), v(&s2)), (v(&top), v(&s1))]
    );
    assert!(b.child_summary_vids(&[v(&s1)]).unwrap().is_empty());
    assert!(b.child_summary_vids(&[v(&t[0])]).unwrap().is_empty());
    let unknown = vid.values().max().unwrap() + 1_000;
    assert!(b.child_summary_vids(&[unknown]).unwrap().is_empty());
    assert!(b.child_summary_vids(&[]).unwrap().is_empty());
    // Several at once: in the order asked, each once, whatever else is named.
    assert_eq!(
        b.child_summary_vids(&[unknown, v(&s1), v(&top), v(&t[0]), v(&top)])
            .unwrap(),
        vec![(v(&top), v(&s2)), (v(&top), v(&s1))]
    );
    // Uncited summaries among the newest of each level, oldest first.
    let hy = thread("hy");
    assert_eq!(ids(&b.top_summaries(&hy, 1).unwrap()), vec![top.id, s3.id]);
    assert_eq!(ids(&b.top_summaries(&hy, 2).unwrap()), vec![top.id, s3.id]);
    assert_eq!(
        ids(&b.top_summaries(&hy, 10).unwrap()),
        vec![s0.id, top.id, s3.id]
    );
    assert_eq!(
        b.top_summaries(&hy, 10).unwrap()[1]
            .summary
            .as_ref()
            .unwrap()
            .source_ids,
        vec![s2.id, t[5].id, s1.id]
    );
    assert!(b.top_summaries(&thread("hz"), 10).unwrap().is_empty());
    assert!(b.top_summaries(&thread("nobody"), 10).unwrap().is_empty());
    // Stats.
    let stats = b.stats().unwrap();
    assert_eq!(stats.total, 12);
    assert_eq!(
        stats.by_kind,
        HashMap::from([
            (MemoryKind::Conversational.as_str().to_owned(), 7),
            (MemoryKind::Summary.as_str().to_owned(), 5),
        ])
    );
    assert_eq!(stats.by_level, HashMap::from([(0, 7), (1, 4), (2, 1)]));
    assert_eq!(stats.links, 1 + 3 + 2 + 3 + 1);
    assert_eq!(stats.stale_summaries, 0);
    assert!(b.stale_summaries(&Filter::all(), 10).unwrap().is_empty());
    // Detaching a source leaves its citing summaries stale.
    b.delete(t[0].id, DeletePolicy::Detach).unwrap();
    b.delete(t[3].id, DeletePolicy::Detach).unwrap();
    let stale = b.stale_summaries(&Filter::all(), 10).unwrap();
    assert_eq!(ids(&stale), vec![s1.id, s2.id]);
    assert!(stale.iter().all(|s| s.summary.as_ref().unwrap().stale));
    assert_eq!(
        ids(&b.stale_summaries(&Filter::all(), 1).unwrap()),
        vec![s1.id]
    );
    assert!(b
        .stale_summaries(&Filter::all().thread(thread("hz")), 10)
        .unwrap()
        .is_empty());
    let stats = b.stats().unwrap();
    assert_eq!(stats.total, 10);
    assert_eq!(stats.stale_summaries, 2);
    assert_eq!(stats.links, 8);
    assert_eq!(stats.by_level, HashMap::from([(0, 5), (1, 4), (2, 1)]));
    assert_eq!(
        b.leaf_vids(&[v(&top)]).unwrap(),
        leaves(&[&t[1], &t[2], &t[4], &t[5]])
    );
    // Children of several summaries in one read: in the order asked, each by position.
    let top2 = b
        .add_summary(
            summary_at("hy", vec![s3.id, s0.id], at(15, 0), "top2"),
            vector(76),
        )
        .unwrap();
    let vid = vids_of(b, &Filter::all());
    let v = |m: &MemoryUnit| vid[&m.id];
    assert_eq!(
        b.child_summary_vids(&[v(&top2), v(&s0), v(&top)]).unwrap(),
        vec![
            (v(&top2), v(&s3)),
            (v(&top2), v(&s0)),
            (v(&top), v(&s2)),
            (v(&top), v(&s1)),
        ]
    );
}

/// Consolidation's scans: `scan_uncovered_page` lists, oldest first, what no summary at a
/// level cites; `late_arrivals` pairs each raw turn written after a level-1 conversation
/// summary whose span holds its time with the earliest such summary (not turns written
/// before it, nor turns under other summary types, nor turns outside every span).
pub fn consolidation_scans(b: &dyn MemoryBackend) {
    let early = b
        .insert_batch(
            [0, 1, 2, 4, 5]
                .iter()
                .map(|m| {
                    (
                        turn_at("cs", at(*m, 0), &format!("m{m}")),
                        vector(80 + *m as u64),
                    )
                })
                .collect(),
        )
        .unwrap();
    // Written before the summaries, inside the first one's span, not cited by it.
    let before = b
        .insert(turn_at("cs", at(1, 30), "before"), vector(90))
        .unwrap();
    let a = b
        .add_summary(
            summary_at(
                "cs",
                vec![early[0].id, early[1].id, early[2].id],
                at(20, 0),
                "a",
            ),
            vector(91),
        )
        .unwrap();
    let bb = b
        .add_summary(
            summary_at("cs", vec![early[3].id, early[4].id], at(21, 0), "b"),
            vector(92),
        )
        .unwrap();
    let raw = Filter::all().thread(thread("cs")).levels(0, 0);
    assert_eq!(
        ids(&b.scan_uncovered_page(&raw, 1, 10).unwrap()),
        vec![before.id]
    );
    assert!(b.late_arrivals(&Filter::all()).unwrap().is_empty());
    // Late turns: inside a's span, between the spans, inside b's span, after both.
    let late = b
        .insert(turn_at("cs", at(0, 30), "late in a"), vector(93))
        .unwrap();
    let between = b
        .insert(turn_at("cs", at(3, 0), "between"), vector(94))
        .unwrap();
    let late_b = b
        .insert(turn_at("cs", at(4, 30), "late in b"), vector(95))
        .unwrap();
    let after = b
        .insert(turn_at("cs", at(30, 0), "after"), vector(96))
        .unwrap();
    let edge = b
        .insert(turn_at("cs", at(2, 0), "on a's end"), vector(97))
        .unwrap();
    assert_eq!(
        ids(&b.scan_uncovered_page(&raw, 1, 10).unwrap()),
        vec![late.id, before.id, edge.id, between.id, late_b.id, after.id]
    );
    assert_eq!(
        ids(&b.scan_uncovered_page(&raw, 1, 2).unwrap()),
        vec![late.id, before.id]
    );
    assert!(b.scan_uncovered_page(&raw, 1, 0).unwrap().is_empty());
    let sums = Filter::all().thread(thread("cs")).levels(1, 1);
    assert_eq!(
        ids(&b.scan_uncovered_page(&sums, 2, 10).unwrap()),
        vec![a.id, bb.id]
    );
    let c = b
        .add_summary(summary_at("cs", vec![a.id], at(40, 0), "c"), vector(98))
        .unwrap();
    assert_eq!(c.level, 2);
    assert_eq!(
        ids(&b.scan_uncovered_page(&sums, 2, 10).unwrap()),
        vec![bb.id]
    );
    assert_eq!(
        b.scan_uncovered_page(&raw, 2, 100).unwrap().len(),
        11,
        "no summary at level 2 cites a raw turn"
    );
    // Late arrivals: the turns written after a summary whose span holds their time.
    assert_eq!(
        b.late_arrivals(&Filter::all()).unwrap(),
        vec![(late.id, a.id), (edge.id, a.id), (late_b.id, bb.id)]
    );
    assert_eq!(
        b.late_arrivals(
            &Filter::all()
                .thread(thread("cs"))
                .between(at(4, 0), at(9, 0))
        )
        .unwrap(),
        vec![(late_b.id, bb.id)]
    );
    // A summary of another type leaves turns dated inside it alone.
    let x = b
        .insert_batch(vec![
            (turn_at("ct", at(0, 0), "x0"), vector(100)),
            (turn_at("ct", at(2, 0), "x2"), vector(101)),
        ])
        .unwrap();
    b.add_summary(
        summary_at("ct", vec![x[0].id, x[1].id], at(20, 0), "topic").with_type(SummaryType::Topic),
        vector(102),
    )
    .unwrap();
    b.insert(turn_at("ct", at(1, 0), "x1"), vector(103))
        .unwrap();
    assert!(b
        .late_arrivals(&Filter::all().thread(thread("ct")))
        .unwrap()
        .is_empty());
    // A turn cited by a level-1 summary is not late, even if written after another.
    b.add_summary(summary_at("cs", vec![late.id], at(50, 0), "d"), vector(104))
        .unwrap();
    assert_eq!(
        b.late_arrivals(&Filter::all()).unwrap(),
        vec![(edge.id, a.id), (late_b.id, bb.id)]
    );
}

/// Sequence numbers follow insertion order, never time: `thread_tail` lists a thread's
/// memories of a kind inserted after a number, `sequenced` gives the numbers of given
/// memories in the order asked (`NotFound` for an unknown one), and `last_sequence` is the
/// highest number given (0 when empty), never lowered by a delete.
pub fn sequence_numbers_grow(b: &dyn MemoryBackend) {
    assert_eq!(b.last_sequence().unwrap(), 0);
    let first = b
        .insert_batch(
            (0..3)
                .map(|i| (turn("sq", i + 10, &format!("sq {i}")), vector(i as u64)))
                .collect(),
        )
        .unwrap();
    let fact = b
        .insert(
            NewMemory::new(MemoryKind::Knowledge, "a fact").with_thread(thread("sq")),
            vector(9),
        )
        .unwrap();
    b.insert(turn("sr", 0, "other thread"), vector(8)).unwrap();
    let seq = b
        .sequenced(&[first[0].id, first[1].id, first[2].id, fact.id])
        .unwrap();
    assert_eq!(
        ids(&seq.iter().map(|(m, _)| m.clone()).collect::<Vec<_>>()),
        vec![first[0].id, first[1].id, first[2].id, fact.id]
    );
    let n: Vec<u64> = seq.iter().map(|(_, n)| *n).collect();
    assert!(n.windows(2).all(|w| w[0] < w[1]), "{n:?}");
    assert!(n[0] > 0);
    let last = b.last_sequence().unwrap();
    assert!(last > n[3]);
    let sq = thread("sq");
    let tail = b.thread_tail(&sq, MemoryKind::Conversational, 0).unwrap();
    assert_eq!(
        tail.iter().map(|(m, s)| (m.id, *s)).collect::<Vec<_>>(),
        vec![
            (first[0].id, n[0]),
            (first[1].id, n[1]),
            (first[2].id, n[2])
        ]
    );
    assert_eq!(tail[1].0.content, "sq 1");
    let tail = b
        .thread_tail(&sq, MemoryKind::Conversational, n[1])
        .unwrap();
    assert_eq!(
        tail.iter().map(|(m, s)| (m.id, *s)).collect::<Vec<_>>(),
        vec![(first[2].id, n[2])]
    );
    assert_eq!(
        b.thread_tail(&sq, MemoryKind::Knowledge, 0)
            .unwrap()
            .iter()
            .map(|(m, s)| (m.id, *s))
            .collect::<Vec<_>>(),
        vec![(fact.id, n[3])]
    );
    assert!(b
        .thread_tail(&sq, MemoryKind::Conversational, n[2])
        .unwrap()
        .is_empty());
    assert!(b
        .thread_tail(&thread("nobody"), MemoryKind::Conversational, 0)
        .unwrap()
        .is_empty());
    // A turn dated before the others still comes after them in sequence.
    let old = b.insert(turn("sq", 0, "dated early"), vector(7)).unwrap();
    let (_, n_old) = b.sequenced(&[old.id]).unwrap()[0].clone();
    assert!(n_old > last);
    assert_eq!(b.last_sequence().unwrap(), n_old);
    let tail = b
        .thread_tail(&sq, MemoryKind::Conversational, n[2])
        .unwrap();
    assert_eq!(
        tail.iter().map(|(m, s)| (m.id, *s)).collect::<Vec<_>>(),
        vec![(old.id, n_old)]
    );
    // The order asked; an unknown id is NotFound.
    let two = b.sequenced(&[old.id, first[0].id]).unwrap();
    assert_eq!(
        two.iter().map(|(m, s)| (m.id, *s)).collect::<Vec<_>>(),
        vec![(old.id, n_old), (first[0].id, n[0])]
    );
    assert!(matches!(
        b.sequenced(&[first[0].id, MemoryId::new()]),
        Err(StoreError::NotFound { .. })
    ));
    // A summary gets a number too; a delete never lowers the last one.
    let s = b
        .add_summary(
            NewSummary::new("sum", vec![first[0].id]).with_thread(Some(sq.clone())),
            vector(6),
        )
        .unwrap();
    let (_, n_s) = b.sequenced(&[s.id]).unwrap()[0].clone();
    assert!(n_s > n_old);
    assert_eq!(b.last_sequence().unwrap(), n_s);
    b.delete(s.id, DeletePolicy::Restrict).unwrap();
    assert_eq!(b.last_sequence().unwrap(), n_s);
    let newer = b.insert(turn("sq", 1, "newer"), vector(5)).unwrap();
    let (_, n_new) = b.sequenced(&[newer.id]).unwrap()[0].clone();
    assert!(n_new > n_s);
    assert_eq!(b.last_sequence().unwrap(), n_new);
    assert_eq!(
        b.thread_tail(&sq, MemoryKind::Conversational, n_old)
            .unwrap()
            .iter()
            .map(|(m, s)| (m.id, *s))
            .collect::<Vec<_>>(),
        vec![(newer.id, n_new)]
    );
}
