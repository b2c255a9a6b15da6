//! Recall outside the LoCoMo shape, with the real model: a unique code in a long thread,
//! speakers kept as a field of their turns rather than a `Name:` prefix of the text.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use cairn_core::{Embedder, InputError, MemoryId, NewMemory, Role, ThreadId};
use cairn_embed::FastEmbedder;
use cairn_harness::{
    AssembledContext, ConsolidationPolicy, ContextOptions, HarnessError, MemoryHarness, Section,
};

fn minilm() -> Arc<dyn Embedder> {
    static M: OnceLock<Arc<FastEmbedder>> = OnceLock::new();
    M.get_or_init(|| Arc::new(FastEmbedder::new().unwrap()))
        .clone()
}

async fn open(dir: &tempfile::TempDir) -> MemoryHarness {
    MemoryHarness::builder(dir.path().join("h.db"))
        .embedder(minilm())
        .build()
        .await
        .unwrap()
}

fn recalled(ctx: &AssembledContext) -> Vec<&str> {
    ctx.items
        .iter()
        .filter(|i| i.section == Section::Recalled)
        .map(|i| i.content.as_str())
        .collect()
}

/// The context's tokens counted again from its rendered messages.
fn exact_tokens(mem: &MemoryHarness, ctx: &AssembledContext) -> usize {
    let counter = mem.token_counter();
    ctx.to_messages()
        .iter()
        .map(|m| counter.count_message(&m.content))
        .sum()
}

fn recalled_ids(ctx: &AssembledContext) -> Vec<MemoryId> {
    ctx.items
        .iter()
        .filter(|i| i.section == Section::Recalled)
        .map(|i| i.id)
        .collect()
}

/// A code mentioned once in a 5,000-turn thread is recalled when the query names it. The
/// turn that holds it is the only one that matches a word of the query, and every other
/// turn says the same with another code (`QZ7RX10`, `QZ7RX11`, ...): only the keyword score
/// can bring it in. Before, keyword scores were standardised
/// among the matching turns, so a single match got no keyword credit at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unique_code_is_recalled_from_a_five_thousand_turn_thread() {
    let dir = tempfile::tempdir().unwrap();
    let mem = open(&dir).await;
    let thread = ThreadId::new("inbox").unwrap();
    let cities = [
        "Porto", "Lisbon", "Madrid", "Paris", "Rome", "Vienna", "Prague", "Oslo", "Dublin",
        "Athens",
    ];
    let code_at = 2_345;
    let code = "Booked the hotel in Porto, the confirmation code is QZ7RX4.";
    let t0 = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    let turns: Vec<NewMemory> = (0..5_000usize)
        .map(|i| {
            let text = if i == code_at {
                code.to_owned()
            } else {
                format!(
                    "Booked the hotel in {}, the confirmation code is QZ7RX{}.",
                    cities[i % cities.len()],
                    i + 10
                )
            };
            // Sessions of 50 turns a day, 30 seconds apart.
            let day = i64::try_from(i / 50).unwrap();
            let step = i64::try_from(i % 50).unwrap();
            let at = t0 + chrono::Duration::days(day) + chrono::Duration::seconds(30 * step);
            NewMemory::conversational(thread.clone(), Role::User, text).at(at)
        })
        .collect();
    for batch in turns.chunks(1_000) {
        mem.add_many(batch.to_vec()).await.unwrap();
    }
    let ctx = mem
        .assemble_context("inbox", "What did the message about QZ7RX4 say?", 300)
        .await
        .unwrap();
    assert!(ctx.tokens <= 300);
    assert!(recalled(&ctx).contains(&code), "{}", ctx.render());
    // The bounded path (issue 18) finds it too, on a thread no summary covers: the code is
    // the one word of the query few memories hold, so the keyword search keeps it, and the
    // turn is read around its match (it is not among the newest turns read as the tail).
    let bounded = ContextOptions {
        bounded_above: 0,
        ..ContextOptions::default()
    };
    let ctx = mem
        .assemble_context_with(
            "inbox",
            "What did the message about QZ7RX4 say?",
            300,
            bounded,
        )
        .await
        .unwrap();
    assert!(ctx.tokens <= 300);
    assert!(recalled(&ctx).contains(&code), "{}", ctx.render());
}

/// Speakers as a field of their turns: `add_conversational_by` keeps who said a turn
/// without the text naming them, and a query that names a speaker recalls what they said.
/// Gina and Jon say the same words about their dinner, in the same surroundings; Jon
/// greets Gina by name over and over. Only the speaker field tells the two answers apart:
/// the same turns added without it (plain `add_conversational`) give the same answer to
/// both questions. Before, there was no way
/// to give a turn its speaker but metadata, and the speaker's name stayed in the keyword
/// query, where it matches the turns that mention Gina (Jon's greetings), not hers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_speaker_is_recalled_without_a_name_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let mem = open(&dir).await;
    let chat = [
        ("Jon", "Hey Gina! Long time no see, Gina!"),
        ("Gina", "So good to hear from you, it has been ages."),
        ("Jon", "Gina, you always make me laugh, Gina."),
        (
            "Gina",
            "The weather has been grey all week, lots of drizzle.",
        ),
        ("Jon", "Thanks Gina, talk soon Gina!"),
        (
            "Gina",
            "I watched a documentary about deep sea fish last night.",
        ),
        ("Jon", "Gina, I miss our chats so much, Gina."),
        ("Gina", "My clothing store had its best month ever."),
        ("Jon", "Haha, anytime Gina. Take care, Gina."),
        (
            "Gina",
            "Work is busy, we ship the new collection on Friday.",
        ),
    ];
    let answer = "I cooked a spicy lentil curry for dinner.";
    let mut turns: Vec<(&str, &str)> = Vec::new();
    for round in 0..4 {
        turns.extend(chat);
        if round == 1 {
            turns.push(("Gina", answer));
        }
        if round == 2 {
            turns.push(("Jon", answer));
        }
    }
    let mut ids = HashMap::new();
    for (who, text) in &turns {
        let id = mem
            .add_conversational_by("friends", Role::User, who, *text)
            .await
            .unwrap();
        let plain = mem
            .add_conversational("anonymous", Role::User, *text)
            .await
            .unwrap();
        if *text == answer {
            ids.insert((*who, "friends"), id);
            ids.insert((*who, "anonymous"), plain);
        }
    }
    // The speaker is a field of the turn; the text is as given.
    let all = mem.get_conversational("friends", usize::MAX).await.unwrap();
    assert_eq!(all.len(), turns.len());
    assert!(all
        .iter()
        .zip(&turns)
        .all(|(m, (who, text))| m.speaker() == Some(*who) && m.content == *text));
    // Room for the newest turn and one recalled.
    let top = |thread: &'static str, question: &'static str| {
        let mem = &mem;
        async move {
            let ctx = mem.assemble_context(thread, question, 60).await.unwrap();
            assert!(ctx.tokens <= 60);
            let got = recalled_ids(&ctx);
            assert_eq!(got.len(), 1, "{}", ctx.render());
            got[0]
        }
    };
    assert_eq!(
        top("friends", "What did Gina cook for dinner?").await,
        ids[&("Gina", "friends")]
    );
    assert_eq!(
        top("friends", "What did Jon cook for dinner?").await,
        ids[&("Jon", "friends")]
    );
    // Without the speaker field, both questions get the same turn.
    assert_eq!(
        top("anonymous", "What did Gina cook for dinner?").await,
        top("anonymous", "What did Jon cook for dinner?").await
    );
    // A blank speaker is refused, and nothing is written.
    assert!(matches!(
        mem.add_conversational_by("friends", Role::User, "  ", "hello")
            .await,
        Err(HarnessError::Input(InputError::BlankSpeaker))
    ));
    assert_eq!(
        mem.get_conversational("friends", usize::MAX)
            .await
            .unwrap()
            .len(),
        turns.len()
    );
}

/// A turn of `who` at `at`, as the LoCoMo import writes them: `who: text`, metadata
/// `speaker`.
fn spoken(
    thread: &ThreadId,
    who: &str,
    text: &str,
    at: chrono::DateTime<chrono::Utc>,
) -> NewMemory {
    NewMemory::conversational(thread.clone(), Role::User, format!("{who}: {text}"))
        .at(at)
        .with_speaker(who)
}

/// Bounded recall through the hierarchy (issue 18), with the real model: a consolidated
/// thread of 60 days of small talk, one day of which holds a question and its answer that
/// shares no word with the query. Recalled through the summaries and the turns around the
/// best matches, the answer comes back as it does when every turn is scored; most of what
/// the two paths recall is the same; a time range in the query picks its day's turn; turns
/// added after consolidation (no summary covers them) are recalled; and the summaries in the
/// context carry their time span and expand, by their id, to their sources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_recall_follows_the_hierarchy() {
    let dir = tempfile::tempdir().unwrap();
    let mem = open(&dir).await;
    let thread = ThreadId::new("life").unwrap();
    let filler = [
        "The weather has been grey all week, lots of drizzle.",
        "Work is busy, we ship the new release on Friday.",
        "I watched a documentary about deep sea fish last night.",
        "My brother started learning the violin.",
        "The train was late again this morning.",
        "We repainted the kitchen a pale green.",
        "I finally finished that long fantasy novel.",
        "The football match went to penalties.",
        "I am trying to drink less coffee.",
        "Our neighbours are renovating their roof.",
        "The library extended its opening hours.",
        "My aunt is visiting us next month.",
        "We went hiking up the hill behind the village.",
        "The bakery on the corner closed down.",
        "I started a course on photography.",
        "Our team lost the quiz night by one point.",
    ];
    let t0 = chrono::DateTime::from_timestamp(1_672_560_000, 0).unwrap(); // 2023-01-01
    let mut turns = Vec::new();
    for day in 0..60usize {
        let start = t0 + chrono::Duration::days(i64::try_from(day).unwrap());
        let mut texts: Vec<String> = (0..12)
            .map(|i| filler[(day * 5 + i * 3) % filler.len()].to_owned())
            .collect();
        if day == 21 {
            texts.insert(
                4,
                "What did you end up calling the puppy you adopted?".into(),
            );
            texts.insert(5, "Biscuit! He already knows how to sit and fetch.".into());
        }
        if day == 40 {
            texts.insert(8, "I baked a lemon cake for my sister this weekend.".into());
        }
        for (i, text) in texts.iter().enumerate() {
            let who = if i % 2 == 0 { "Ann" } else { "Bob" };
            let at = start + chrono::Duration::seconds(30 * i64::try_from(i).unwrap());
            turns.push(spoken(&thread, who, text, at));
        }
    }
    let contents: Vec<String> = turns.iter().map(|t| t.content.clone()).collect();
    let ids = mem.add_many(turns).await.unwrap();
    let id_of = |needle: &str| ids[contents.iter().position(|c| c.contains(needle)).unwrap()];
    mem.consolidate(
        ConsolidationPolicy::older_than(std::time::Duration::ZERO)
            .max_age(std::time::Duration::ZERO),
    )
    .await
    .unwrap();
    // Turns after consolidation: no summary covers them yet.
    let late = t0 + chrono::Duration::days(70);
    let mut after = vec![spoken(
        &thread,
        "Bob",
        "My new locker at the gym is number 8812.",
        late,
    )];
    for i in 1..30i64 {
        after.push(spoken(
            &thread,
            "Ann",
            filler[usize::try_from(i).unwrap() % filler.len()],
            late + chrono::Duration::seconds(30 * i),
        ));
    }
    mem.add_many(after).await.unwrap();
    let bounded = ContextOptions {
        bounded_above: 0,
        ..ContextOptions::default()
    };
    let exhaustive = ContextOptions {
        bounded_above: usize::MAX,
        ..ContextOptions::default()
    };
    let query = "What name did they give the new dog?";
    let b = mem
        .assemble_context_with("life", query, 400, bounded)
        .await
        .unwrap();
    let e = mem
        .assemble_context_with("life", query, 400, exhaustive)
        .await
        .unwrap();
    assert!(b.tokens <= 400);
    for (path, ctx) in [("bounded", &b), ("exhaustive", &e)] {
        let got = recalled_ids(ctx);
        assert!(got.contains(&id_of("Biscuit")), "{path}: {}", ctx.render());
        assert!(
            got.contains(&id_of("calling the puppy")),
            "{path}: {}",
            ctx.render()
        );
    }
    let (rb, re) = (recalled_ids(&b), recalled_ids(&e));
    let shared = rb.iter().filter(|i| re.contains(i)).count();
    assert!(
        shared * 10 >= re.len() * 7,
        "{shared} of {} shared: bounded\n{}\nexhaustive\n{}",
        re.len(),
        b.render(),
        e.render()
    );
    // A time range: its day's turns are read and get the bonus.
    let ctx = mem
        .assemble_context_with("life", "What did Ann bake in February 2023?", 120, bounded)
        .await
        .unwrap();
    assert!(
        recalled_ids(&ctx).contains(&id_of("lemon cake")),
        "{}",
        ctx.render()
    );
    // The unconsolidated tail.
    let ctx = mem
        .assemble_context_with(
            "life",
            "Which locker number does Bob have at the gym?",
            150,
            bounded,
        )
        .await
        .unwrap();
    assert!(
        recalled(&ctx).iter().any(|t| t.contains("8812")),
        "{}",
        ctx.render()
    );
    // Summaries in the context: their span, and their sources by their id.
    let wide = ContextOptions {
        bounded_above: 0,
        summary_share: 0.6,
        ..ContextOptions::default()
    };
    let ctx = mem
        .assemble_context_with("life", query, 2_000, wide)
        .await
        .unwrap();
    let summaries: Vec<_> = ctx
        .items
        .iter()
        .filter(|i| i.section == Section::Summary)
        .collect();
    assert!(!summaries.is_empty(), "{}", ctx.render());
    for s in summaries {
        let (from, to) = s.span.expect("a summary carries its span");
        assert!(from <= to);
        assert_eq!(s.thread_id.as_ref(), Some(&thread));
        let sources = mem.expand_summary(s.id).await.unwrap();
        let got: Vec<MemoryId> = sources.iter().map(|m| m.id).collect();
        assert_eq!(got, s.source_ids);
        let leaves = mem.expand_to_leaves(s.id).await.unwrap();
        assert!(leaves
            .iter()
            .all(|m| from <= m.created_at && m.created_at <= to));
        assert!(ctx.render().contains(&format!(
            "{} to {}",
            from.format("%Y-%m-%d"),
            to.format("%Y-%m-%d")
        )));
    }
}

/// Memory beyond the thread (issue 18), with the real model: the thread's knowledge and the
/// same user's other thread are recalled into the related section when asked for, each item
/// with its thread and kind, and never by default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn knowledge_and_scope_threads_are_recalled_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let mem = open(&dir).await;
    let chat = ThreadId::new("chat").unwrap();
    let work = ThreadId::new("work").unwrap();
    let t0 = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    let small_talk = [
        "The weather has been grey all week.",
        "I watched a documentary about deep sea fish.",
        "The train was late again this morning.",
        "We repainted the kitchen a pale green.",
        "I finally finished that long fantasy novel.",
        "Our neighbours are renovating their roof.",
    ];
    let mut turns: Vec<NewMemory> = small_talk
        .iter()
        .enumerate()
        .map(|(i, t)| {
            NewMemory::conversational(chat.clone(), Role::User, *t)
                .at(t0 + chrono::Duration::minutes(i64::try_from(i).unwrap()))
        })
        .collect();
    turns.push(
        NewMemory::new(
            cairn_core::MemoryKind::Knowledge,
            "The user is severely allergic to peanuts.",
        )
        .with_thread(chat.clone())
        .at(t0),
    );
    turns.push(
        NewMemory::conversational(
            work.clone(),
            Role::User,
            "My manager at the studio is called Priya Raman.",
        )
        .at(t0),
    );
    turns.push(
        NewMemory::conversational(
            work.clone(),
            Role::User,
            "The quarterly review is on Monday.",
        )
        .at(t0 + chrono::Duration::minutes(1)),
    );
    mem.add_many(turns).await.unwrap();
    let related = |ctx: &AssembledContext| -> Vec<(String, Option<String>, String)> {
        ctx.items
            .iter()
            .filter(|i| i.section == Section::Related)
            .map(|i| {
                (
                    i.content.clone(),
                    i.thread_id.as_ref().map(|t| t.as_str().to_owned()),
                    i.kind.as_str().to_owned(),
                )
            })
            .collect()
    };
    let food = "Can I have a peanut butter sandwich for lunch?";
    // Off by default.
    let ctx = mem.assemble_context("chat", food, 300).await.unwrap();
    assert!(related(&ctx).is_empty(), "{}", ctx.render());
    let knowledge = ContextOptions {
        knowledge: true,
        ..ContextOptions::default()
    };
    let ctx = mem
        .assemble_context_with("chat", food, 300, knowledge)
        .await
        .unwrap();
    assert!(ctx.tokens <= 300);
    let got = related(&ctx);
    assert!(
        got.iter().any(|(c, t, k)| c.contains("allergic")
            && t.as_deref() == Some("chat")
            && k == "knowledge"),
        "{}",
        ctx.render()
    );
    assert!(ctx.render().contains("From other memory:"));
    // The other thread, in scope.
    let boss = "What is the name of my manager?";
    let ctx = mem.assemble_context("chat", boss, 300).await.unwrap();
    assert!(!ctx.render().contains("Priya"), "{}", ctx.render());
    let scope = cairn_harness::ContextScope::threads(["work"]).unwrap();
    let ctx = mem
        .assemble_context_scoped("chat", boss, 300, ContextOptions::default(), scope)
        .await
        .unwrap();
    assert!(ctx.tokens <= 300);
    let got = related(&ctx);
    assert!(
        got.first().is_some_and(|(c, t, k)| c.contains("Priya")
            && t.as_deref() == Some("work")
            && k == "conversational"),
        "{}",
        ctx.render()
    );
    // A scope of a thread id that is not valid is a typed error.
    assert!(cairn_harness::ContextScope::threads([""]).is_err());
}

/// A text said many times in a day is recalled once that day (its best-scored copy), so the
/// copies do not crowd out the rest: 40 copies of one reminder re-sent through one day among
/// 200 turns, a question that matches it, and another turn about the cat. Before, the copies
/// filled the recalled block. The same words on another day are another event: the line
/// recalled names that day too (a repeat with its id), and costs its date, not a line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_texts_are_recalled_once_a_day() {
    let dir = tempfile::tempdir().unwrap();
    let mem = open(&dir).await;
    let thread = ThreadId::new("repeats").unwrap();
    let t0 = chrono::DateTime::from_timestamp(1_700_006_400, 0).unwrap(); // 2023-11-15 00:00
    let reminder = "Reminder: the cat's vet appointment is on Friday.";
    let mut turns: Vec<NewMemory> = (0..200usize)
        .map(|i| {
            let (text, at) = if i % 5 == 0 {
                // Day 0, every 20 minutes.
                (
                    reminder.to_owned(),
                    t0 + chrono::Duration::minutes(20 * i64::try_from(i / 5).unwrap()),
                )
            } else {
                let text = if i == 101 {
                    "The cat has been sneezing since Tuesday.".to_owned()
                } else {
                    format!("Filler message number {i} about the weather.")
                };
                (
                    text,
                    t0 + chrono::Duration::hours(24 + i64::try_from(i).unwrap()),
                )
            };
            NewMemory::conversational(thread.clone(), Role::User, text).at(at)
        })
        .collect();
    // The reminder once more, days later.
    turns.push(
        NewMemory::conversational(thread.clone(), Role::User, reminder)
            .at(t0 + chrono::Duration::days(20)),
    );
    turns.push(
        NewMemory::conversational(thread.clone(), Role::User, "Good night.")
            .at(t0 + chrono::Duration::days(21)),
    );
    mem.add_many(turns).await.unwrap();
    let ctx = mem
        .assemble_context("repeats", "When is the cat's appointment at the vet?", 300)
        .await
        .unwrap();
    let lines: Vec<&cairn_harness::ContextItem> = ctx
        .items
        .iter()
        .filter(|i| i.section == Section::Recalled && i.content == reminder)
        .collect();
    assert_eq!(lines.len(), 1, "{}", ctx.render());
    let line = lines[0];
    // The line names the turn of the other day, and on the first day four of its forty
    // turns (its own and the earliest three others): the line stands for re-sends by id
    // without reading all of them.
    let later = t0 + chrono::Duration::days(20);
    let named: Vec<chrono::DateTime<chrono::Utc>> = std::iter::once(line.created_at)
        .chain(line.repeats.iter().map(|r| r.created_at))
        .collect();
    assert_eq!(named.len(), 5, "{:?}\n{}", named, ctx.render());
    assert_eq!(named.iter().filter(|t| **t == later).count(), 1);
    assert_eq!(
        named
            .iter()
            .filter(|t| t.date_naive() == t0.date_naive())
            .count(),
        4
    );
    let ids: HashSet<MemoryId> = std::iter::once(line.id)
        .chain(line.repeats.iter().map(|r| r.id))
        .collect();
    assert_eq!(ids.len(), 5);
    // The line's own turn is of day 0, and the others of that day are the earliest three
    // besides it (every 20 minutes from midnight).
    assert_eq!(line.created_at.date_naive(), t0.date_naive());
    let mut earliest: Vec<chrono::DateTime<chrono::Utc>> = (0..4)
        .map(|k| t0 + chrono::Duration::minutes(20 * k))
        .filter(|t| *t != line.created_at)
        .take(3)
        .collect();
    earliest.push(later);
    let others: Vec<chrono::DateTime<chrono::Utc>> =
        line.repeats.iter().map(|r| r.created_at).collect();
    assert_eq!(others, earliest, "{}", ctx.render());
    // Each repeat is a turn with those words at that time, by id, oldest first.
    for (n, r) in line.repeats.iter().enumerate() {
        let other = mem.get(r.id).await.unwrap();
        assert_eq!(
            (other.content.as_str(), other.created_at),
            (reminder, r.created_at)
        );
        assert!(n == 0 || line.repeats[n - 1].created_at <= r.created_at);
    }
    // Under a header that names both days, the first in full, the other by its month (its
    // year is the first's).
    assert!(
        ctx.render()
            .contains(&format!("[2023-11-15; also on Dec 5]\n{reminder}\n")),
        "{}",
        ctx.render()
    );
    // The count of the context is exact, the dates included.
    assert_eq!(ctx.tokens, exact_tokens(&mem, &ctx));
    assert!(
        recalled(&ctx).iter().any(|t| t.contains("sneezing")),
        "{}",
        ctx.render()
    );
}

/// Texts said again on many days fold into one recalled line each, whatever the budget: at
/// every budget the context fits, its count is exact (the dates included), no text is
/// recalled twice by one role, and every turn it names (a line's own and its repeats) is a
/// distinct turn of the thread with that text and role; on each day a line names, it names
/// every turn of that day with its words (one re-sent on some days), up to four a day. The
/// same words from the assistant never fold into the user's line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_fold_into_one_line_within_any_budget() {
    use chrono::Datelike;
    let dir = tempfile::tempdir().unwrap();
    let mem = open(&dir).await;
    let thread = ThreadId::new("daily").unwrap();
    // 2023-12-20 00:00: the thirty days cross a year, so lines fold dates of two years.
    let t0 = chrono::DateTime::from_timestamp(1_703_030_400, 0).unwrap();
    let daily = [
        "Morning check-in: blood pressure 120 over 80, took the vitamin D.",
        "Walked the dog around the lake before work.",
        "Reminder: water the tomato plants on the balcony.",
    ];
    let mut turns = Vec::new();
    for day in 0..30i64 {
        for (k, text) in daily.iter().enumerate() {
            let at = t0 + chrono::Duration::days(day) + chrono::Duration::hours(8 + k as i64);
            turns.push(NewMemory::conversational(thread.clone(), Role::User, *text).at(at));
        }
        if day < 6 {
            let at = t0 + chrono::Duration::days(day) + chrono::Duration::hours(14);
            turns.push(NewMemory::conversational(thread.clone(), Role::Assistant, daily[0]).at(at));
        }
        // The assistant says the walk's words early on day 9 (before the user's turns of
        // that day: they hold the same vector, and are not the user's line's).
        if day == 9 {
            for k in 0..3 {
                let at = t0 + chrono::Duration::days(day) + chrono::Duration::hours(1 + k);
                turns.push(
                    NewMemory::conversational(thread.clone(), Role::Assistant, daily[1]).at(at),
                );
            }
        }
        // The walk re-sent the same day, once every fourth day, and six times on day 9.
        let resent = match day {
            9 => 6,
            d if d % 4 == 0 => 1,
            _ => 0,
        };
        for k in 0..resent {
            let at = t0 + chrono::Duration::days(day) + chrono::Duration::minutes(900 + 10 * k);
            turns.push(NewMemory::conversational(thread.clone(), Role::User, daily[1]).at(at));
        }
        let at = t0 + chrono::Duration::days(day) + chrono::Duration::hours(20);
        turns.push(
            NewMemory::conversational(
                thread.clone(),
                Role::User,
                format!("Evening note {day}: nothing else happened today."),
            )
            .at(at),
        );
    }
    turns.push(
        NewMemory::conversational(thread.clone(), Role::User, "Good night.")
            .at(t0 + chrono::Duration::days(40)),
    );
    // How many turns say each text, by role, on each day.
    let mut said: HashMap<(String, Option<Role>, chrono::NaiveDate), usize> = HashMap::new();
    for t in &turns {
        *said
            .entry((
                t.content.clone(),
                t.role,
                t.created_at.unwrap().date_naive(),
            ))
            .or_default() += 1;
    }
    mem.add_many(turns).await.unwrap();
    let mut resent_named = 0;
    let mut four_named = 0;
    let mut folded = 0;
    let mut across_years = 0;
    for budget in (30..=600).step_by(19) {
        let ctx = mem
            .assemble_context("daily", "How is my blood pressure in the morning?", budget)
            .await
            .unwrap();
        assert_eq!(ctx.tokens, exact_tokens(&mem, &ctx), "budget {budget}");
        let items: usize = ctx.items.iter().map(|i| i.tokens).sum();
        assert_eq!(items, ctx.tokens, "budget {budget}");
        assert!(ctx.tokens <= budget, "budget {budget}: {}", ctx.tokens);
        let mut texts = HashSet::new();
        let mut ids = HashSet::new();
        for i in ctx.items.iter().filter(|i| i.section == Section::Recalled) {
            assert!(
                texts.insert((i.content.clone(), i.role)),
                "{}",
                ctx.render()
            );
            let mut days: HashMap<chrono::NaiveDate, usize> = HashMap::new();
            *days.entry(i.created_at.date_naive()).or_default() += 1;
            assert!(ids.insert(i.id));
            for (n, r) in i.repeats.iter().enumerate() {
                *days.entry(r.created_at.date_naive()).or_default() += 1;
                assert!(ids.insert(r.id));
                assert!(n == 0 || i.repeats[n - 1].created_at <= r.created_at);
                let m = mem.get(r.id).await.unwrap();
                assert_eq!(
                    (m.content.as_str(), m.created_at, m.role),
                    (i.content.as_str(), r.created_at, i.role)
                );
            }
            for (d, n) in &days {
                let all = said[&(i.content.clone(), i.role, *d)];
                assert_eq!(*n, all.min(4), "{} on {d}: {}", i.content, ctx.render());
                resent_named += usize::from(*n > 1);
                four_named += usize::from(*n == 4);
            }
            folded += i.repeats.len();
            if i.repeats.first().map(|r| r.created_at.year())
                != i.repeats.last().map(|r| r.created_at.year())
            {
                across_years += 1;
            }
        }
    }
    assert!(folded > 0, "no repeats folded at any budget");
    assert!(across_years > 0, "no line named days of two years");
    assert!(resent_named > 0, "no line named a day's re-sent turns");
    assert!(four_named > 0, "no line named four turns of a day");
}

/// A thread that repeats its texts (a diary said again on many days): the copies of a text
/// are one candidate, so the texts that match are recalled side by side instead of one
/// text's copies taking the room, and each recalled line names every day its text was said
/// in the thread (its copies, found by the index), on both paths, and no turn of another
/// thread that says the same words (on the same days too).
#[tokio::test]
async fn a_repeated_text_is_one_line_naming_all_its_days() {
    let dir = tempfile::tempdir().unwrap();
    let mem = open(&dir).await;
    let thread = ThreadId::new("diary").unwrap();
    let t0 = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    let cat = [
        "My cat Miso knocked the plant off the shelf again.",
        "Took Miso the cat to the vet for her vaccines.",
        "The cat has started sleeping on my keyboard.",
        "Bought a new scratching post for the cat.",
        "Miso caught a moth in the kitchen tonight.",
        "The cat refuses to eat the new brand of food.",
    ];
    let other = [
        "Ran five kilometres along the river.",
        "Finished reading the novel about the lighthouse keeper.",
        "Paid the electricity bill online.",
        "Called my sister about the holiday plans.",
    ];
    let mut turns = Vec::new();
    // Text `i` on days i, i + 3, i + 6, ...: twelve days each, a set of days of its own.
    for (i, text) in cat.iter().chain(&other).enumerate() {
        for n in 0..12i64 {
            let at = t0 + chrono::Duration::days(i as i64 + 3 * n) + chrono::Duration::hours(9);
            turns.push(NewMemory::conversational(thread.clone(), Role::User, *text).at(at));
        }
    }
    for n in 0..40i64 {
        let at = t0 + chrono::Duration::days(n) + chrono::Duration::hours(20);
        turns.push(
            NewMemory::conversational(thread.clone(), Role::User, format!("Evening {n}: quiet."))
                .at(at),
        );
    }
    turns.push(
        NewMemory::conversational(thread.clone(), Role::User, "Good night.")
            .at(t0 + chrono::Duration::days(60)),
    );
    // Another thread says the same words on days of its own, and on the diary's days: none
    // of its turns is the diary's repeat.
    let elsewhere = ThreadId::new("elsewhere").unwrap();
    for (i, text) in cat.iter().enumerate() {
        for n in [0i64, 1, 50] {
            let at = t0 + chrono::Duration::days(i as i64 + 3 * n) + chrono::Duration::hours(11);
            turns.push(NewMemory::conversational(elsewhere.clone(), Role::User, *text).at(at));
        }
    }
    mem.add_many(turns).await.unwrap();
    for bounded_above in [0, usize::MAX] {
        let options = ContextOptions {
            bounded_above,
            ..ContextOptions::default()
        };
        let ctx = mem
            .assemble_context_with("diary", "What has my cat been up to?", 2_000, options)
            .await
            .unwrap();
        assert_eq!(ctx.tokens, exact_tokens(&mem, &ctx));
        let lines: Vec<_> = ctx
            .items
            .iter()
            .filter(|i| i.section == Section::Recalled)
            .collect();
        let texts: HashSet<&str> = lines.iter().map(|i| i.content.as_str()).collect();
        assert_eq!(
            texts.len(),
            lines.len(),
            "a text on one line: {}",
            ctx.render()
        );
        for text in cat {
            assert!(
                texts.contains(text),
                "bounded above {bounded_above}: {text:?} missing from\n{}",
                ctx.render()
            );
        }
        for i in &lines {
            if i.content.starts_with("Evening") {
                continue;
            }
            let mut days: HashSet<chrono::NaiveDate> = std::iter::once(i.created_at)
                .chain(i.repeats.iter().map(|r| r.created_at))
                .map(|t| t.date_naive())
                .collect();
            assert_eq!(days.len(), i.repeats.len() + 1);
            // With the days the recent turns say it on (shown as they are), all twelve.
            for r in ctx.items.iter().filter(|r| r.section == Section::Recent) {
                if r.content == i.content {
                    assert!(days.insert(r.created_at.date_naive()));
                }
            }
            assert_eq!(days.len(), 12, "{}: {}", i.content, ctx.render());
            for r in &i.repeats {
                let m = mem.get(r.id).await.unwrap();
                assert_eq!(
                    (m.content.as_str(), m.created_at, m.thread_id.as_ref()),
                    (i.content.as_str(), r.created_at, Some(&thread))
                );
            }
        }
        // The block names each line's days once, under its header: the first in full, the
        // others (all in its year, 2023) by month, each month once.
        let rendered = ctx.render();
        assert!(rendered.contains("; also on Nov "), "{rendered}");
        assert!(rendered.contains(", Dec "), "{rendered}");
        assert!(!rendered.contains("2023:"), "{rendered}");
        assert!(
            rendered
                .lines()
                .filter(|l| l.contains("; also on"))
                .all(|l| l.matches(" Nov ").count() <= 1 && l.matches(" Dec ").count() <= 1),
            "{rendered}"
        );
    }
}

/// Seeded random diaries: texts said on random days of three months, some days more than
/// once, read back at many budgets on both recall paths: every day a line names, it names
/// every turn of that day with its words, up to four, and the count of the context is
/// exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_day_a_line_names_brings_its_turns() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let mem = open(&dir).await;
    let texts = [
        "Watered the roses in the back garden this morning.",
        "Pulled weeds from the vegetable bed by the fence.",
        "The garden tomatoes are finally turning red.",
        "Planted tulip bulbs along the garden path.",
        "Spotted a hedgehog under the garden shed.",
        "Mowed the lawn and raked the garden leaves.",
    ];
    let mut checked = 0;
    for seed in 0..4u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let thread = ThreadId::new(format!("garden-{seed}")).unwrap();
        // 2023-10-20: the days cross into November and December.
        let t0 = chrono::DateTime::from_timestamp(1_697_760_000, 0).unwrap();
        let mut turns = Vec::new();
        for text in texts {
            for _ in 0..rng.random_range(4..14) {
                let day = rng.random_range(0..75i64);
                for k in 0..rng.random_range(1..4i64) {
                    let at = t0
                        + chrono::Duration::days(day)
                        + chrono::Duration::minutes(rng.random_range(0..600) + 600 * k);
                    turns.push(NewMemory::conversational(thread.clone(), Role::User, text).at(at));
                }
            }
        }
        for n in 0..60i64 {
            let at = t0 + chrono::Duration::days(n) + chrono::Duration::hours(23);
            turns.push(
                NewMemory::conversational(
                    thread.clone(),
                    Role::User,
                    format!("Day {n}: nothing else to note."),
                )
                .at(at),
            );
        }
        turns.push(
            NewMemory::conversational(thread.clone(), Role::User, "Good night.")
                .at(t0 + chrono::Duration::days(90)),
        );
        let mut said: HashMap<(String, chrono::NaiveDate), usize> = HashMap::new();
        for t in &turns {
            *said
                .entry((t.content.clone(), t.created_at.unwrap().date_naive()))
                .or_default() += 1;
        }
        mem.add_many(turns).await.unwrap();
        for bounded_above in [0, usize::MAX] {
            let options = ContextOptions {
                bounded_above,
                ..ContextOptions::default()
            };
            for budget in (40..=400).step_by(9) {
                let ctx = mem
                    .assemble_context_with(
                        thread.as_str(),
                        "What have I been doing in the garden?",
                        budget,
                        options,
                    )
                    .await
                    .unwrap();
                assert_eq!(ctx.tokens, exact_tokens(&mem, &ctx), "budget {budget}");
                assert!(ctx.tokens <= budget);
                for i in ctx.items.iter().filter(|i| i.section == Section::Recalled) {
                    let mut days: HashMap<chrono::NaiveDate, usize> = HashMap::new();
                    for t in
                        std::iter::once(i.created_at).chain(i.repeats.iter().map(|r| r.created_at))
                    {
                        *days.entry(t.date_naive()).or_default() += 1;
                    }
                    for (d, n) in days {
                        let all = said[&(i.content.clone(), d)];
                        assert_eq!(
                            n,
                            all.min(4),
                            "seed {seed}, budget {budget}: {} on {d}\n{}",
                            i.content,
                            ctx.render()
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 100, "{checked} days checked");
}
