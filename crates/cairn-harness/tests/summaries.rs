//! Summaries worth reading: chunks that follow sessions, the extractive summarizer's choice
//! of sentences and its format, roll-ups that cover their children evenly, keywords per
//! summary, and, with the real model over the LoCoMo dev conversations, no greetings at the
//! top of the tree and summary search that finds the session about a thing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{embedder, harness, now};

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use cairn_core::{
    MemoryKind, NewMemory, Role, Summarizer, SummaryItem, SummaryRequest, TermStats, ThreadId,
};
use cairn_harness::text::content_word_count;
use cairn_harness::{ConsolidationPolicy, ExtractiveSummarizer, MemoryHarness, SearchOptions};
use chrono::{DateTime, Utc};

/// A turn as the LoCoMo import writes it: `who: text`, metadata `speaker` (and `session`
/// when given).
fn turn(t: &ThreadId, who: &str, text: &str, at: DateTime<Utc>, session: Option<u32>) -> NewMemory {
    let mut m = NewMemory::conversational(t.clone(), Role::User, format!("{who}: {text}")).at(at);
    m.metadata.insert("speaker".into(), who.into());
    if let Some(s) = session {
        m.metadata.insert("session".into(), s.into());
    }
    m
}

fn policy() -> ConsolidationPolicy {
    ConsolidationPolicy::older_than(Duration::from_secs(3600)).max_level(1)
}

/// A chunk never mixes two sessions (a time gap, or a change of `metadata.session`), and a
/// tiny tail joins the chunk before it in its own session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_follow_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let mem = harness(&dir.path().join("s.db"), None).await;
    let t = ThreadId::new("sessions").unwrap();
    let start = now() - chrono::Duration::days(30);
    let mut turns = Vec::new();
    // Session A: 23 turns a minute apart. Session B, two hours later: 7 turns. Session C
    // right after B, told apart only by its `session` label: 12 turns.
    for i in 0..23 {
        let at = start + chrono::Duration::minutes(i);
        turns.push(turn(
            &t,
            "Ann",
            &format!("Session A sentence {i} about gardening tomatoes."),
            at,
            None,
        ));
    }
    for i in 0..7 {
        let at = start + chrono::Duration::minutes(22 + 120 + i);
        turns.push(turn(
            &t,
            "Bob",
            &format!("Session B sentence {i} about sailing boats."),
            at,
            Some(2),
        ));
    }
    for i in 0..12 {
        let at = start + chrono::Duration::minutes(22 + 120 + 7 + i);
        turns.push(turn(
            &t,
            "Ann",
            &format!("Session C sentence {i} about baking bread."),
            at,
            Some(3),
        ));
    }
    let ids = mem.add_many(turns).await.unwrap();
    let report = mem.consolidate(policy()).await.unwrap();
    assert!(report.failures.is_empty());
    let mut sizes = Vec::new();
    for s in &report.summaries {
        let sources = mem.expand_summary(*s).await.unwrap();
        let sessions: HashSet<char> = sources
            .iter()
            .map(|m| {
                m.content
                    .split("Session ")
                    .nth(1)
                    .unwrap()
                    .chars()
                    .next()
                    .unwrap()
            })
            .collect();
        assert_eq!(sessions.len(), 1, "a chunk mixes sessions: {sessions:?}");
        sizes.push(sources.len());
    }
    assert_eq!(sizes, vec![23, 7, 12]);
    assert_eq!(report.memories_covered, ids.len());

    // Without the gap rule (a gap longer than any here) and without labels, the same turns
    // are chunked by size alone: 20 + 22, a tiny tail of 2 joining its neighbour.
    let dir2 = tempfile::tempdir().unwrap();
    let mem2 = harness(&dir2.path().join("s.db"), None).await;
    let plain: Vec<NewMemory> = (0..42)
        .map(|i| {
            turn(
                &t,
                "Ann",
                &format!("Plain sentence {i} about rivers."),
                start + chrono::Duration::minutes(i),
                None,
            )
        })
        .collect();
    mem2.add_many(plain).await.unwrap();
    let r2 = mem2
        .consolidate(policy().session_gap(Duration::from_secs(86_400)))
        .await
        .unwrap();
    let mut sizes = Vec::new();
    for s in &r2.summaries {
        sizes.push(mem2.expand_summary(*s).await.unwrap().len());
    }
    assert_eq!(sizes, vec![20, 22]);
}

fn item(who: &str, text: &str, at: DateTime<Utc>) -> SummaryItem {
    SummaryItem {
        kind: MemoryKind::Conversational,
        role: Some(Role::User),
        speaker: Some(who.into()),
        created_at: at,
        time_start: None,
        content: format!("{who}: {text}"),
    }
}

/// A session's worth of chat: greetings and reactions around a few facts.
fn chat(day: DateTime<Utc>) -> Vec<SummaryItem> {
    let lines = [
        ("Audrey", "Hey Andrew! Good to see ya!"),
        ("Andrew", "Hi Audrey! How are you?"),
        (
            "Audrey",
            "I got a new tattoo of my four dogs on my arm last Friday.",
        ),
        ("Andrew", "Wow, that's awesome! Oh wow, that is so amazing, I really love hearing about all of that, thanks so much for sharing it with me!"),
        (
            "Andrew",
            "I started volunteering at the animal shelter in Seattle on weekends.",
        ),
        ("Audrey", "Thanks so much! :)"),
        (
            "Audrey",
            "Pepper, my oldest dog, turned 9 in April and still loves long hikes.",
        ),
        ("Andrew", "Totally, sounds great! Yeah, I really hope it all goes well for you, it sounds like a lot of fun, good luck with everything!"),
        (
            "Andrew",
            "My girlfriend and I are planning a camping trip to Mount Rainier in July.",
        ),
        ("Audrey", "Oh that is so lovely, I really love that for you, I hope it all goes great, it sounds like so much fun!"),
        ("Andrew", "Thanks, I really appreciate that, you are always so sweet and kind, it means a lot to hear that from you, really!"),
        ("Audrey", "Take care!"),
        ("Andrew", "Have a good one!"),
    ];
    lines
        .iter()
        .enumerate()
        .map(|(i, (who, text))| item(who, text, day + chrono::Duration::seconds(30 * i as i64)))
        .collect()
}

/// The extractive summarizer keeps what a session tells and drops its pleasantries, writes
/// each speaker once per line and the date once per day, covers both speakers, and keeps to
/// its share of the sources' words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extractive_summaries_select_information() {
    let s = ExtractiveSummarizer::new(embedder());
    let day = now() - chrono::Duration::days(3);
    let items = chat(day);
    let source_words: usize = items
        .iter()
        .map(|i| i.content.split_whitespace().count() - 1)
        .sum();
    let req = SummaryRequest {
        items: items.clone(),
        max_tokens: 256,
        level: 1,
        ..Default::default()
    };
    let out = s.summarize(&req).await.unwrap();
    println!("{out}");
    let mut lines: Vec<&str> = out.lines().collect();
    // The last line names the topics the lines do not already say; not the speakers.
    let topics = lines
        .pop()
        .unwrap()
        .strip_prefix("Topics: ")
        .expect("a topics line");
    assert!(topics.split(", ").count() >= 3, "{out}");
    assert!(
        !topics.contains("Audrey") && !topics.contains("Andrew"),
        "{out}"
    );
    assert!(!lines.is_empty());
    let date = format!("[{}] ", day.format("%Y-%m-%d"));
    assert!(lines[0].starts_with(&date), "{out}");
    assert_eq!(
        out.matches(&date).count(),
        1,
        "the date once per day: {out}"
    );
    for l in &lines {
        let body = l.strip_prefix(&date).unwrap_or(l);
        assert!(
            body.starts_with("Audrey: ") || body.starts_with("Andrew: "),
            "{l}"
        );
        assert!(
            !body.contains("Audrey: Audrey:") && !body.contains("Andrew: Andrew:"),
            "{l}"
        );
        assert!(content_word_count(body) >= 4, "near-empty line: {l}");
    }
    for phatic in [
        "Good to see",
        "Take care",
        "Have a good one",
        "sounds great",
        ":)",
    ] {
        assert!(!out.contains(phatic), "{phatic:?} kept: {out}");
    }
    assert!(
        out.contains("Audrey: ") && out.contains("Andrew: "),
        "both speakers: {out}"
    );
    let words = out.split_whitespace().count();
    assert!(
        words * 4 <= source_words,
        "{words} words of {source_words}: {out}"
    );
    // Deterministic.
    assert_eq!(out, s.summarize(&req).await.unwrap());

    // A ratio of 1 keeps every informative sentence and still no greeting.
    let all = ExtractiveSummarizer::new(embedder()).with_word_ratio(1.0);
    let out = all.summarize(&req).await.unwrap();
    assert_eq!(
        out.lines().filter(|l| !l.starts_with("Topics: ")).count(),
        4,
        "{out}"
    );
    assert!(!out.contains("Good to see"));
}

/// A roll-up covers its children's time span evenly, starts with its date range, and
/// attributes every line to its speaker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollups_cover_every_child() {
    let s = ExtractiveSummarizer::new(embedder()).with_word_ratio(1.0);
    let first = now() - chrono::Duration::days(40);
    let mut children = Vec::new();
    for d in 0..5 {
        let day = first + chrono::Duration::days(7 * d);
        let req = SummaryRequest {
            items: chat(day),
            max_tokens: 256,
            level: 1,
            ..Default::default()
        };
        let text = s.summarize(&req).await.unwrap();
        children.push(SummaryItem {
            kind: MemoryKind::Summary,
            role: None,
            speaker: None,
            created_at: day + chrono::Duration::minutes(5),
            time_start: Some(day),
            content: text,
        });
    }
    // Words for about one line per child.
    let child_words: usize = children
        .iter()
        .map(|c| c.content.split_whitespace().count())
        .sum();
    let ratio = (5.0 * 16.0 + 10.0) / child_words as f32;
    let rollup = ExtractiveSummarizer::new(embedder()).with_word_ratio(ratio);
    let req = SummaryRequest {
        items: children.clone(),
        max_tokens: 256,
        level: 2,
        ..Default::default()
    };
    let out = rollup.summarize(&req).await.unwrap();
    println!("{out}");
    let mut lines = out.lines();
    let last = first + chrono::Duration::days(28) + chrono::Duration::minutes(5);
    assert_eq!(
        lines.next().unwrap(),
        format!(
            "[{} to {}]",
            first.format("%Y-%m-%d"),
            last.format("%Y-%m-%d")
        )
    );
    let days: BTreeSet<String> = out
        .lines()
        .skip(1)
        .filter_map(|l| {
            l.strip_prefix('[')
                .and_then(|r| r.get(..10))
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(days.len(), 5, "every child's day is covered: {out}");
    for l in lines.filter(|l| !l.starts_with("Topics: ")) {
        let body = l.split_once("] ").map_or(l, |(_, b)| b);
        assert!(
            body.starts_with("Audrey: ") || body.starts_with("Andrew: "),
            "{l}"
        );
    }
    let words = out.split_whitespace().count() as f32;
    assert!(words <= ratio * child_words as f32 + 1.0, "{words}: {out}");
}

/// Consolidation stores each summary's keywords, rare named things first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summaries_carry_keywords() {
    let dir = tempfile::tempdir().unwrap();
    let mem = harness(&dir.path().join("k.db"), None).await;
    let t = ThreadId::new("kw").unwrap();
    let day = now() - chrono::Duration::days(3);
    let turns: Vec<NewMemory> = chat(day)
        .into_iter()
        .map(|i| {
            let who = i.speaker.clone().unwrap();
            let text = i.content.split_once(": ").unwrap().1.to_owned();
            turn(&t, &who, &text, i.created_at, None)
        })
        .collect();
    mem.add_many(turns).await.unwrap();
    let report = mem.consolidate(policy()).await.unwrap();
    assert_eq!(report.summaries.len(), 1);
    let s = mem.get(report.summaries[0]).await.unwrap();
    let kw: Vec<String> = serde_json::from_value(s.metadata["keywords"].clone()).unwrap();
    assert!(!kw.is_empty() && kw.len() <= 8, "{kw:?}");
    let lower = s.content.to_lowercase();
    assert!(
        kw.iter().all(|k| lower.contains(&k.to_lowercase())),
        "{kw:?} / {}",
        s.content
    );
    assert!(
        !kw.iter().any(|k| k == "Audrey" || k == "Andrew"),
        "speakers are not keywords: {kw:?}"
    );

    // A shared photo's caption in metadata (`blip_caption`) counts as what was said.
    let t2 = ThreadId::new("photo").unwrap();
    let mut turns: Vec<NewMemory> = chat(day)
        .into_iter()
        .map(|i| {
            let who = i.speaker.clone().unwrap();
            let text = i.content.split_once(": ").unwrap().1.to_owned();
            turn(&t2, &who, &text, i.created_at, None)
        })
        .collect();
    let mut photo = turn(
        &t2,
        "Audrey",
        "Look at this!",
        day + chrono::Duration::minutes(10),
        None,
    );
    photo.metadata.insert(
        "blip_caption".into(),
        "a golden retriever wearing a bandana on a surfboard".into(),
    );
    turns.push(photo);
    mem.add_many(turns).await.unwrap();
    let r = mem
        .consolidate(policy().thread(t2.clone()).max_age(Duration::ZERO))
        .await
        .unwrap();
    let s = mem.get(r.summaries[0]).await.unwrap();
    let leaves = mem.expand_to_leaves(s.id).await.unwrap();
    assert_eq!(leaves.len(), 14, "every turn, the photo's too");
    let items = s.content.to_lowercase();
    assert!(
        items.contains("surfboard") || items.contains("retriever"),
        "the caption is content: {}",
        s.content
    );

    // Rare words outrank common ones.
    let mut stats = TermStats::new();
    for _ in 0..10 {
        stats.add_doc(["trip".to_owned()]);
    }
    let k =
        cairn_harness::summary_keywords("Andrew: A trip to the glacier, a trip again.", &stats, 2);
    assert_eq!(k[0], "glacier", "{k:?}");
}

/// The LoCoMo dev conversations, consolidated with the real model: no summary line repeats
/// its speaker, the summaries above level 1 are not greetings, level-1 summaries stay under a
/// quarter of their sources' words, and summary search finds the sessions about a thing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_conversations_summaries_read_as_content() {
    let data = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/data/locomo-dev"
    );
    if !std::path::Path::new(data).exists() {
        eprintln!("skipping: {data} not present");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model: Arc<dyn cairn_core::Embedder> = Arc::new(cairn_embed::FastEmbedder::new().unwrap());
    let mem = MemoryHarness::builder(dir.path().join("dev.db"))
        .embedder(model)
        .build()
        .await
        .unwrap();
    let mut files: Vec<_> = std::fs::read_dir(data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 5);
    for f in &files {
        let thread = ThreadId::new(f.file_stem().unwrap().to_str().unwrap()).unwrap();
        let conv =
            cairn_harness::import::parse_locomo(&std::fs::read_to_string(f).unwrap(), &thread)
                .unwrap();
        mem.add_new(conv.turns).await.unwrap();
    }
    let report = mem
        .consolidate(ConsolidationPolicy::older_than(Duration::ZERO).max_age(Duration::ZERO))
        .await
        .unwrap();
    println!("{report}");
    assert!(report.failures.is_empty());
    assert!(
        report.chunks_per_level.get(&2).copied().unwrap_or(0) >= 5,
        "{report}"
    );
    assert!(
        report.chunks_per_level.get(&3).copied().unwrap_or(0) >= 1,
        "{report}"
    );
    let (mut upper_lines, mut thin) = (0usize, 0usize);
    for id in &report.summaries {
        let s = mem.get(*id).await.unwrap();
        let info = s.summary.as_ref().unwrap();
        for line in s.content.lines() {
            let body =
                line.split_once("] ")
                    .map_or(line, |(d, b)| if d.starts_with('[') { b } else { line });
            if body.starts_with('[') {
                continue; // the date-range header of a roll-up
            }
            let (who, said) = body.split_once(": ").unwrap_or(("", body));
            assert!(
                !said.starts_with(&format!("{who}: ")),
                "speaker written twice: {line}"
            );
            if info.level >= 2 {
                upper_lines += 1;
                thin += usize::from(content_word_count(said) < 3);
            }
        }
        if info.level == 1 {
            let sources = mem.expand_summary(*id).await.unwrap();
            let source_words: usize = sources
                .iter()
                .map(|m| m.content.split_whitespace().count() - 1)
                .sum();
            // One line at least, else a quarter of the words (plus the dates).
            let words = s.content.split_whitespace().count();
            assert!(
                s.content.lines().count() == 1 || words * 4 <= source_words + 8,
                "{words} words of {source_words}: {}",
                s.content
            );
        }
    }
    println!("level >= 2: {thin} of {upper_lines} lines under 3 content words");
    assert!(upper_lines > 100);
    assert!(
        (thin as f64) < 0.05 * upper_lines as f64,
        "{thin} of {upper_lines}"
    );

    // Summary search finds the sessions about a thing: Caroline's adoption plans and
    // Melanie's pottery (conversation 26), Jon's dance studio (30).
    for (thread, query, word) in [
        ("26", "Caroline adopting a child", "adopt"),
        ("26", "Melanie's pottery class", "pottery"),
        ("30", "Jon opening his dance studio", "studio"),
    ] {
        let hits = mem
            .search(
                query,
                SearchOptions::summaries().thread(ThreadId::new(thread).unwrap()),
            )
            .await
            .unwrap();
        assert_eq!(hits.len(), 3);
        let mut found = false;
        for h in &hits {
            let leaves = mem.expand_to_leaves(h.memory.id).await.unwrap();
            found |= leaves
                .iter()
                .any(|m| m.content.to_lowercase().contains(word));
        }
        assert!(found, "{query}: no hit reaches a turn about {word}");
    }
}
