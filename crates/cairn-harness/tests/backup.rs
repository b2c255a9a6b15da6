//! Whole-store backups: a store with a multi-level tree, extended, stale and detached
//! summaries, metadata and microsecond times goes through `export_backup` into an empty
//! store, which then answers `summary_tree`, `expand_to_leaves`, `summaries_of` and `get`
//! exactly as the original; a second import adds nothing; conflicting, cut and damaged
//! backups are refused before anything is written.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use cairn_core::{MemoryKind, MemoryUnit, Metadata, NewMemory, Role, ThreadId};
use cairn_harness::{BackupError, DeletePolicy, Filter, MemoryHarness, NewSummary};

fn at(secs: i64, micros: u32) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(1_700_000_000 + secs, micros * 1_000).unwrap()
}

/// A store with: 12 turns of thread "t" (metadata with a nested object and a large number,
/// times with microseconds), 3 thread-less facts, two level-1 summaries of the turns (one
/// extended later), a level-2 summary over them, a thread-less summary of the facts, a turn
/// updated under a summary (stale up the tree), a turn detached from a summary and a
/// summary whose only source was detached (deleted with it).
async fn populated(path: &Path) -> MemoryHarness {
    let mem = common::harness(path, None).await;
    let t = ThreadId::new("t").unwrap();
    let mut turns = Vec::new();
    for i in 0..12_i64 {
        let mut meta = Metadata::new();
        meta.insert(
            "speaker".into(),
            (if i % 2 == 0 { "Ann" } else { "Bo" }).into(),
        );
        meta.insert(
            "n".into(),
            serde_json::from_str("11111111111444444420412402").unwrap(),
        );
        meta.insert("deep".into(), serde_json::json!({"a": [1, {"b": i}]}));
        let role = if i % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        let m =
            NewMemory::conversational(t.clone(), role, format!("turn {i} about topic {}", i % 4))
                .at(at(i * 60, u32::try_from(i).unwrap() * 7 + 1))
                .with_metadata(meta);
        turns.push(mem.add(m).await.unwrap());
    }
    let mut facts = Vec::new();
    for (i, f) in ["the sky is blue", "water is wet", "ice is cold"]
        .iter()
        .enumerate()
    {
        facts.push(
            mem.add(NewMemory::new(MemoryKind::Knowledge, *f).at(at(1_000 + i as i64, 3)))
                .await
                .unwrap(),
        );
    }
    let s1 = mem
        .add_summary("turns 0 to 3", &turns[0..4], Some("t"))
        .await
        .unwrap();
    let s2 = mem
        .add_summary("turns 4 to 7", &turns[4..8], Some("t"))
        .await
        .unwrap();
    mem.extend_summary(s2, &turns[8..10]).await.unwrap();
    let mut meta = Metadata::new();
    meta.insert("keywords".into(), serde_json::json!(["topic", "turns"]));
    let top = mem
        .add_summary_with(
            NewSummary::new("the whole thread", vec![s1, s2])
                .with_thread(Some(t.clone()))
                .with_metadata(meta),
        )
        .await
        .unwrap();
    assert_eq!(top.level, 2);
    mem.add_summary("facts", &facts[..2], None).await.unwrap();
    let lonely = mem
        .add_summary("about ice", &facts[2..], None)
        .await
        .unwrap();
    // Stale through two levels.
    mem.update(turns[1], "turn 1, corrected").await.unwrap();
    // A detached source: s2 loses a turn and is stale; "about ice" loses its only source.
    mem.delete_with(turns[5], DeletePolicy::Detach)
        .await
        .unwrap();
    mem.delete_with(facts[2], DeletePolicy::Detach)
        .await
        .unwrap();
    // A summary whose last source goes is deleted with it (the zero-source rule).
    assert!(matches!(
        mem.get(lonely).await,
        Err(cairn_harness::HarnessError::NotFound { .. })
    ));
    mem
}

async fn everything(mem: &MemoryHarness) -> Vec<MemoryUnit> {
    let mut all = mem.list(Filter::all(), 0, usize::MAX).await.unwrap();
    all.sort_by_key(|m| m.id);
    all
}

/// Every read a user of the tree makes, for every memory: equal in both stores.
async fn assert_same(a: &MemoryHarness, b: &MemoryHarness) {
    let all = everything(a).await;
    assert_eq!(
        all,
        everything(b).await,
        "rows, links, levels, times, metadata, stale"
    );
    assert!(all
        .iter()
        .any(|m| m.summary.as_ref().is_some_and(|s| s.stale)));
    for m in &all {
        assert_eq!(
            a.summaries_of(m.id).await.unwrap(),
            b.summaries_of(m.id).await.unwrap()
        );
        assert_eq!(
            a.ancestors(m.id).await.unwrap(),
            b.ancestors(m.id).await.unwrap()
        );
        if m.kind == MemoryKind::Summary {
            assert_eq!(
                a.summary_tree(m.id).await.unwrap(),
                b.summary_tree(m.id).await.unwrap()
            );
            assert_eq!(
                a.expand_to_leaves(m.id).await.unwrap(),
                b.expand_to_leaves(m.id).await.unwrap()
            );
            assert_eq!(
                a.expand_summary(m.id).await.unwrap(),
                b.expand_summary(m.id).await.unwrap()
            );
        }
    }
    assert!(b.sqlite().unwrap().check_index().unwrap().is_consistent());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restores_the_same_store() {
    let dir = tempfile::tempdir().unwrap();
    let a = populated(&dir.path().join("a.db")).await;
    for with_embeddings in [false, true] {
        let file = dir.path().join(format!("backup-{with_embeddings}.jsonl"));
        let n = a
            .export_backup(std::fs::File::create(&file).unwrap(), with_embeddings)
            .await
            .unwrap();
        assert_eq!(n, everything(&a).await.len());
        // Sources come before the summaries that cite them.
        let text = std::fs::read_to_string(&file).unwrap();
        let mut seen = std::collections::HashSet::new();
        for l in text.lines().skip(1) {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            for s in v["summary"]["source_ids"].as_array().into_iter().flatten() {
                assert!(seen.contains(s.as_str().unwrap()), "source before summary");
            }
            seen.insert(v["id"].as_str().unwrap().to_owned());
            assert_eq!(v.get("embedding").is_some(), with_embeddings);
        }

        let b = common::harness(&dir.path().join(format!("b-{with_embeddings}.db")), None).await;
        let r = b.import_backup(&file).await.unwrap();
        assert_eq!((r.added, r.skipped), (n, 0));
        assert_eq!(r.embedded, if with_embeddings { 0 } else { n });
        assert_same(&a, &b).await;
        // Vectors from the file are kept bit for bit; re-embedded ones agree to rounding.
        for m in everything(&a).await {
            let (va, vb) = (
                a.store().embedding(m.id).unwrap(),
                b.store().embedding(m.id).unwrap(),
            );
            if with_embeddings {
                assert_eq!(va, vb);
            } else {
                let cos: f32 = va.iter().zip(&vb).map(|(x, y)| x * y).sum();
                assert!(cos > 0.999_99, "{cos}");
            }
        }
        // Again: nothing to add.
        let again = b.import_backup(&file).await.unwrap();
        assert_eq!((again.added, again.skipped), (0, n));
        assert_same(&a, &b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_backups_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let a = populated(&dir.path().join("a.db")).await;
    let file = dir.path().join("backup.jsonl");
    a.export_backup(std::fs::File::create(&file).unwrap(), false)
        .await
        .unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let fresh = |name: &str| {
        let p = dir.path().join(name);
        async move { common::harness(&p, None).await }
    };
    let write = |name: &str, body: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p
    };

    // Cut after half the lines: the count in the header tells.
    let cut = write("cut.jsonl", lines[..lines.len() / 2].join("\n"));
    let b = fresh("b.db").await;
    assert!(matches!(
        b.import_backup(&cut).await,
        Err(BackupError::Count { .. })
    ));
    assert!(everything(&b).await.is_empty());

    // A summary before its sources (the tree reversed).
    let mut reversed = vec![lines[0]];
    reversed.extend(lines[1..].iter().rev());
    let rev = write("rev.jsonl", reversed.join("\n"));
    match b.import_backup(&rev).await {
        Err(BackupError::Line { message, .. }) => {
            assert!(message.contains("neither earlier"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    assert!(everything(&b).await.is_empty());

    // A garbled line, a newer version, not a backup at all.
    let mut garbled: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
    garbled[3] = "{\"id\": 7}".into();
    let g = write("g.jsonl", garbled.join("\n"));
    assert!(matches!(
        b.import_backup(&g).await,
        Err(BackupError::Line { line: 4, .. })
    ));
    let newer = write(
        "v9.jsonl",
        lines[0].replace("\"cairn_backup\":1", "\"cairn_backup\":9"),
    );
    assert!(matches!(
        b.import_backup(&newer).await,
        Err(BackupError::VersionTooNew { found: 9, .. })
    ));
    let plain = write("plain.jsonl", "{\"content\":\"hi\"}\n".into());
    assert!(matches!(
        b.import_backup(&plain).await,
        Err(BackupError::NotABackup(_))
    ));
    assert!(everything(&b).await.is_empty());

    // A store that holds one of the ids with other content: refused, nothing written; the
    // same content is skipped and the rest restored.
    let first: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
    let id: cairn_core::MemoryId = first["id"].as_str().unwrap().parse().unwrap();
    let c = fresh("c.db").await;
    let mut other = NewMemory::new(MemoryKind::Knowledge, "something else").with_id(id);
    other.created_at = Some(at(5, 5));
    c.add(other).await.unwrap();
    match c.import_backup(&file).await {
        Err(BackupError::Conflict { line: 2, id: got }) => assert_eq!(got, id),
        other => panic!("{other:?}"),
    }
    assert_eq!(everything(&c).await.len(), 1);
    let d = fresh("d.db").await;
    let original = a.get(id).await.unwrap();
    let mut same = NewMemory::new(original.kind, original.content.clone()).with_id(id);
    same.thread_id = original.thread_id.clone();
    same.role = original.role;
    same.created_at = Some(original.created_at);
    same.metadata = original.metadata.clone();
    d.add(same).await.unwrap();
    let r = d.import_backup(&file).await.unwrap();
    assert_eq!((r.added, r.skipped), (lines.len() - 2, 1));
    assert_same(&a, &d).await;
}

/// A moving summary (each version continues the one before: a link that does not raise the
/// level) goes through a backup and comes back with the same levels, chain and leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_summaries_survive_a_backup() {
    use cairn_harness::{SummaryBufferMemory, SummaryBufferOptions};
    let dir = tempfile::tempdir().unwrap();
    let mem = common::harness(&dir.path().join("a.db"), None).await;
    let buf = SummaryBufferMemory::open(
        mem.clone(),
        "chat",
        SummaryBufferOptions {
            max_token_limit: 60,
            ..SummaryBufferOptions::default()
        },
    )
    .await
    .unwrap();
    for i in 0..10 {
        buf.save_context(
            &format!("question {i} about the garden"),
            &format!("answer {i}: water the roses"),
        )
        .await
        .unwrap();
    }
    let (moving, _) = buf.moving_summary().await.unwrap();
    let chain = mem.get(moving).await.unwrap();
    assert!(chain.summary.as_ref().unwrap().source_ids.len() > 1);
    let file = dir.path().join("b.jsonl");
    let n = mem
        .export_backup(std::fs::File::create(&file).unwrap(), true)
        .await
        .unwrap();
    let copy = common::harness(&dir.path().join("c.db"), None).await;
    assert_eq!(copy.import_backup(&file).await.unwrap().added, n);
    let back = copy.get(moving).await.unwrap();
    assert_eq!(back.level, chain.level);
    assert_eq!(back.summary, chain.summary);
    assert_eq!(
        copy.expand_to_leaves(moving).await.unwrap(),
        mem.expand_to_leaves(moving).await.unwrap()
    );
    assert_eq!(
        copy.summary_tree(moving).await.unwrap(),
        mem.summary_tree(moving).await.unwrap()
    );
}
