//! Conversation memories and context assembly, with a scripted and a failing summarizer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use cairn_core::{Embedder, MemoryKind, Role, SummarizeError, Summarizer, SummaryRequest};
use cairn_embed::HashEmbedder;
use cairn_harness::{
    AutoContextOptions, AutoContextSummarizer, ContextMessage, ContextOptions, MemoryHarness,
    MemoryValue, RunningSummaryMemory, RunningSummaryOptions, Section, SummarizeOutcome,
    SummaryBufferMemory, SummaryBufferOptions, ToolCall, SUMMARY_SEPARATOR,
};

/// Deterministic: "S<n>[previous] items: first words of each item".
struct Scripted {
    fail: AtomicBool,
    delay: Duration,
    calls: AtomicUsize,
}

impl Scripted {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            fail: AtomicBool::new(false),
            delay: Duration::ZERO,
            calls: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl Summarizer for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    async fn summarize(&self, r: &SummaryRequest) -> Result<String, SummarizeError> {
        tokio::time::sleep(self.delay).await;
        if self.fail.load(Ordering::SeqCst) {
            return Err(SummarizeError::Http {
                status: 500,
                message: "down".into(),
            });
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let firsts: Vec<String> = r
            .items
            .iter()
            .map(|i| i.content.split_whitespace().next().unwrap_or("").to_owned())
            .collect();
        Ok(format!(
            "S{n}[{}] {}",
            r.previous.as_deref().unwrap_or("-"),
            firsts.join(" ")
        ))
    }
}

async fn harness(path: &std::path::Path, s: Arc<dyn Summarizer>) -> MemoryHarness {
    let e: Arc<dyn Embedder> = Arc::new(HashEmbedder::new(64));
    MemoryHarness::builder(path)
        .embedder(e)
        .summarizer(s)
        .build()
        .await
        .unwrap()
}

fn text(v: &std::collections::HashMap<String, MemoryValue>, key: &str) -> String {
    match &v[key] {
        MemoryValue::Text(t) => t.clone(),
        MemoryValue::Messages(m) => panic!("expected text, got {m:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summary_buffer_save_load_prune_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.db");
    let s = Scripted::new();
    let opts = SummaryBufferOptions {
        max_token_limit: 60,
        ..Default::default()
    };
    let (summary_id, expected_text) = {
        let mem = harness(&path, s.clone()).await;
        let buf = SummaryBufferMemory::open(mem.clone(), "chat", opts.clone())
            .await
            .unwrap();
        buf.save_context("hi there", "hello! how can I help?")
            .await
            .unwrap();
        let v = buf.load_memory_variables().await;
        assert_eq!(
            text(&v, "history"),
            "Human: hi there\nAI: hello! how can I help?"
        );
        for i in 0..6 {
            buf.save_context(
                &format!("question {i} about the weather in Lisbon"),
                &format!("answer {i}: it is sunny and warm"),
            )
            .await
            .unwrap();
        }
        let st = buf.stats().await;
        assert!(st.has_summary && st.estimated_tokens <= 60, "{st:?}");
        let (sid, summary) = buf.moving_summary().await.unwrap();
        let v = text(&buf.load_memory_variables().await, "history");
        assert!(v.starts_with(&format!("System: {summary}")), "{v}");
        assert!(v.ends_with("AI: answer 5: it is sunny and warm"));
        // The summary expands to exactly the pruned turns, in order; nothing is lost.
        let covered = mem.expand_to_leaves(sid).await.unwrap();
        assert_eq!(covered[0].content, "hi there");
        let all = mem.get_conversational("chat", 100).await.unwrap();
        assert_eq!(all.len(), 14);
        assert_eq!(covered.len() + st.recent_message_count, 14);
        (sid, summary)
    };
    // Restart: buffer and summary come back from the store.
    let mem = harness(&path, s.clone()).await;
    let buf = SummaryBufferMemory::open(mem.clone(), "chat", opts.clone())
        .await
        .unwrap();
    assert_eq!(
        buf.moving_summary().await.unwrap(),
        (summary_id, expected_text)
    );
    assert!(text(&buf.load_memory_variables().await, "history")
        .ends_with("AI: answer 5: it is sunny and warm"));
    // return_messages and custom prefixes/keys.
    let msgs = SummaryBufferMemory::open(
        mem.clone(),
        "chat",
        SummaryBufferOptions {
            return_messages: true,
            memory_key: "chat_history".into(),
            ..opts.clone()
        },
    )
    .await
    .unwrap();
    match &msgs.load_memory_variables().await["chat_history"] {
        MemoryValue::Messages(m) => {
            assert_eq!(m[0].role, "system");
            assert_eq!(m.last().unwrap().role, "assistant");
        }
        other => panic!("{other:?}"),
    }
    // clear: empty now and after a restart; the store keeps every turn.
    buf.clear().await.unwrap();
    assert_eq!(text(&buf.load_memory_variables().await, "history"), "");
    let again = SummaryBufferMemory::open(mem.clone(), "chat", opts)
        .await
        .unwrap();
    assert_eq!(text(&again.load_memory_variables().await, "history"), "");
    assert!(mem.get_conversational("chat", 100).await.unwrap().len() >= 14);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summary_buffer_failure_keeps_every_turn_and_retries() {
    let dir = tempfile::tempdir().unwrap();
    let s = Scripted::new();
    let mem = harness(&dir.path().join("f.db"), s.clone()).await;
    let buf = SummaryBufferMemory::open(
        mem.clone(),
        "t",
        SummaryBufferOptions {
            max_token_limit: 40,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    s.fail.store(true, Ordering::SeqCst);
    for i in 0..5 {
        buf.save_context(
            &format!("input number {i} with several words"),
            &format!("output number {i} with several words"),
        )
        .await
        .unwrap();
    }
    let st = buf.stats().await;
    assert!(!st.has_summary);
    assert_eq!(
        st.recent_message_count, 10,
        "every turn kept, over the limit"
    );
    assert!(st.estimated_tokens > 40);
    assert!(st.summarizer_failures >= 1 && st.last_error.as_deref().unwrap().contains("500"));
    s.fail.store(false, Ordering::SeqCst);
    buf.save_context("one more", "reply").await.unwrap();
    let st = buf.stats().await;
    assert!(st.has_summary && st.estimated_tokens <= 40 && st.last_error.is_none());
    let (sid, _) = buf.moving_summary().await.unwrap();
    let covered = mem.expand_to_leaves(sid).await.unwrap();
    assert_eq!(covered.len() + st.recent_message_count, 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_tasks_saving_concurrently_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mem = harness(&dir.path().join("c.db"), Scripted::new()).await;
    let buf = Arc::new(
        SummaryBufferMemory::open(
            mem.clone(),
            "shared",
            SummaryBufferOptions {
                max_token_limit: 80,
                ..Default::default()
            },
        )
        .await
        .unwrap(),
    );
    let mut tasks = Vec::new();
    for t in 0..8 {
        let buf = buf.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..10 {
                buf.save_context(
                    &format!("task {t} input {i}"),
                    &format!("task {t} output {i}"),
                )
                .await
                .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let turns = mem.get_conversational("shared", 1_000).await.unwrap();
    assert_eq!(turns.len(), 160);
    let (sid, _) = buf.moving_summary().await.unwrap();
    let covered: Vec<_> = mem
        .expand_to_leaves(sid)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    let st = buf.stats().await;
    let unique: HashSet<_> = covered.iter().collect();
    assert_eq!(unique.len(), covered.len(), "no turn covered twice");
    assert_eq!(
        covered.len() + st.recent_message_count,
        160,
        "every turn is in the summary or the buffer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_summary_force_template_stats_and_failure() {
    let dir = tempfile::tempdir().unwrap();
    let s = Scripted::new();
    let mem = harness(&dir.path().join("r.db"), s.clone()).await;
    assert!(RunningSummaryMemory::open(
        mem.clone(),
        "r",
        RunningSummaryOptions {
            template: "no placeholder".into(),
            ..Default::default()
        }
    )
    .await
    .is_err());
    assert!(RunningSummaryMemory::open(
        mem.clone(),
        "r",
        RunningSummaryOptions {
            template: "{summary} {other}".into(),
            ..Default::default()
        }
    )
    .await
    .is_err());
    let opts = RunningSummaryOptions {
        token_limit: 50,
        template: "Earlier: {summary}".into(),
        ..Default::default()
    };
    let run = RunningSummaryMemory::open(mem.clone(), "r", opts.clone())
        .await
        .unwrap();
    run.add_message(Role::User, "Alpha message about trains")
        .await
        .unwrap();
    run.add_message(Role::Assistant, "Bravo reply about trains")
        .await
        .unwrap();
    assert!(run.get_summary().await.is_none());
    assert!(run.force_summarize().await.unwrap());
    let summary = run.get_summary().await.unwrap();
    assert!(
        summary.contains("Alpha") && summary.contains("Bravo"),
        "{summary}"
    );
    run.add_message(Role::User, "Charlie asks again")
        .await
        .unwrap();
    let v = &run.load_memory_variables().await["history"];
    assert!(
        v.starts_with(&format!("Earlier: {summary}{SUMMARY_SEPARATOR}")),
        "{v}"
    );
    assert!(v.ends_with("user: Charlie asks again"));
    let st = run.get_memory_stats().await;
    assert_eq!(
        (
            st.kind.as_str(),
            st.has_summary,
            st.recent_message_count,
            st.token_limit
        ),
        ("running_summary", true, 1, 50)
    );
    assert_eq!(st.summary_length, summary.chars().count());
    // Failure: every message kept, not only the last five.
    s.fail.store(true, Ordering::SeqCst);
    for i in 0..12 {
        run.add_message(
            Role::User,
            &format!("message {i} that is long enough to count"),
        )
        .await
        .unwrap();
    }
    let st = run.get_memory_stats().await;
    assert_eq!(st.recent_message_count, 13);
    assert!(st.summarizer_failures > 0);
    s.fail.store(false, Ordering::SeqCst);
    assert!(run.force_summarize().await.unwrap());
    assert_eq!(run.get_memory_stats().await.recent_message_count, 0);
    // Restart restores the running summary.
    let again = RunningSummaryMemory::open(mem.clone(), "r", opts)
        .await
        .unwrap();
    assert_eq!(again.get_summary().await, run.get_summary().await);
}

fn call(id: &str) -> ContextMessage {
    let mut m = ContextMessage::new(Role::Assistant, "let me check");
    m.tool_calls.push(ToolCall {
        id: id.into(),
        name: "weather".into(),
        arguments: "{}".into(),
    });
    m
}

fn result(id: &str, content: &str) -> ContextMessage {
    let mut m = ContextMessage::new(Role::Tool, content);
    m.tool_call_id = Some(id.into());
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_context_keeps_system_recent_and_tool_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let s = Scripted::new();
    let mem = harness(&dir.path().join("a.db"), s.clone()).await;
    let opts = AutoContextOptions {
        max_unsummarized_messages: 6,
        ..Default::default()
    };
    let auto = AutoContextSummarizer::new(mem.clone(), "ctx", opts.clone()).unwrap();
    let mut msgs = Vec::new();
    auto.push(
        &mut msgs,
        ContextMessage::new(Role::System, "You are helpful."),
    )
    .await
    .unwrap();
    for i in 0..4 {
        auto.push(
            &mut msgs,
            ContextMessage::new(Role::User, format!("user turn {i}")),
        )
        .await
        .unwrap();
    }
    assert_eq!(
        auto.maybe_summarize(&mut msgs).await.unwrap(),
        SummarizeOutcome::NotNeeded
    );
    auto.push(&mut msgs, call("c1")).await.unwrap(); // unresolved: results not yet here
    for i in 4..7 {
        auto.push(
            &mut msgs,
            ContextMessage::new(Role::User, format!("user turn {i}")),
        )
        .await
        .unwrap();
    }
    let replaced_ids: Vec<_> = msgs[1..5].iter().map(|m| m.memory_id.unwrap()).collect();
    match auto.maybe_summarize(&mut msgs).await.unwrap() {
        SummarizeOutcome::Summarized {
            summary_id,
            replaced,
        } => {
            assert_eq!(replaced, 4, "stops before the unresolved call");
            let src: Vec<_> = mem
                .expand_summary(summary_id)
                .await
                .unwrap()
                .into_iter()
                .map(|m| m.id)
                .collect();
            assert_eq!(src, replaced_ids);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        msgs[0].content, "You are helpful.",
        "the first system message stays"
    );
    assert!(
        msgs[1].content.starts_with("Conversation summary: S0"),
        "{}",
        msgs[1].content
    );
    assert!(!msgs[2].tool_calls.is_empty(), "the call is still there");
    assert_eq!(msgs.len(), 2 + 4);

    // In-progress result: the call and its result are not summarized yet.
    let auto2 = AutoContextSummarizer::new(
        mem.clone(),
        "ctx2",
        AutoContextOptions {
            max_unsummarized_messages: 3,
            min_messages_after_summary: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let mut m2 = Vec::new();
    auto2
        .push(&mut m2, ContextMessage::new(Role::User, "a"))
        .await
        .unwrap();
    auto2.push(&mut m2, call("c9")).await.unwrap();
    auto2
        .push(&mut m2, result("c9", "IN_PROGRESS"))
        .await
        .unwrap();
    auto2
        .push(&mut m2, ContextMessage::new(Role::User, "b"))
        .await
        .unwrap();
    auto2
        .push(&mut m2, ContextMessage::new(Role::User, "c"))
        .await
        .unwrap();
    match auto2.maybe_summarize(&mut m2).await.unwrap() {
        SummarizeOutcome::Summarized { replaced, .. } => assert_eq!(replaced, 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(m2[1].tool_calls[0].id, "c9");

    // Resolved calls are summarized together with their results.
    let auto3 = AutoContextSummarizer::new(
        mem.clone(),
        "ctx3",
        AutoContextOptions {
            max_unsummarized_messages: 3,
            min_messages_after_summary: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let mut m3 = Vec::new();
    auto3.push(&mut m3, call("c5")).await.unwrap();
    auto3.push(&mut m3, result("c5", "sunny")).await.unwrap();
    auto3
        .push(&mut m3, ContextMessage::new(Role::User, "thanks"))
        .await
        .unwrap();
    auto3
        .push(&mut m3, ContextMessage::new(Role::User, "latest"))
        .await
        .unwrap();
    match auto3.maybe_summarize(&mut m3).await.unwrap() {
        SummarizeOutcome::Summarized { replaced, .. } => assert_eq!(replaced, 3),
        other => panic!("{other:?}"),
    }
    assert_eq!(m3.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_context_failure_timeout_and_outdated_results() {
    let dir = tempfile::tempdir().unwrap();
    let s = Scripted::new();
    let mem = harness(&dir.path().join("o.db"), s.clone()).await;
    let auto = AutoContextSummarizer::new(
        mem.clone(),
        "x",
        AutoContextOptions {
            max_unsummarized_messages: 2,
            min_messages_after_summary: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let mut msgs = Vec::new();
    for i in 0..5 {
        auto.push(&mut msgs, ContextMessage::new(Role::User, format!("m{i}")))
            .await
            .unwrap();
    }
    let before = msgs.clone();
    s.fail.store(true, Ordering::SeqCst);
    assert!(matches!(
        auto.maybe_summarize(&mut msgs).await.unwrap(),
        SummarizeOutcome::Failed(_)
    ));
    assert_eq!(msgs, before, "untouched on failure");
    s.fail.store(false, Ordering::SeqCst);
    // A result for an outdated context is dropped.
    let pending = auto.prepare(&msgs).unwrap();
    let done = auto.run(pending).await.unwrap();
    auto.push(
        &mut msgs,
        ContextMessage::new(Role::User, "arrived meanwhile"),
    )
    .await
    .unwrap();
    let snapshot = msgs.clone();
    assert_eq!(
        auto.apply(&mut msgs, done).await.unwrap(),
        SummarizeOutcome::Outdated
    );
    assert_eq!(msgs, snapshot);
    // A summarizer slower than the timeout leaves the context untouched.
    let slow = Arc::new(Scripted {
        fail: AtomicBool::new(false),
        delay: Duration::from_millis(300),
        calls: AtomicUsize::new(0),
    });
    let auto = AutoContextSummarizer::new(
        mem.clone(),
        "y",
        AutoContextOptions {
            max_unsummarized_messages: 2,
            min_messages_after_summary: 1,
            timeout: Duration::from_millis(20),
            summarizer: Some(slow),
            ..Default::default()
        },
    )
    .unwrap();
    let mut msgs = Vec::new();
    for i in 0..4 {
        auto.push(&mut msgs, ContextMessage::new(Role::User, format!("n{i}")))
            .await
            .unwrap();
    }
    let before = msgs.clone();
    match auto.maybe_summarize(&mut msgs).await.unwrap() {
        SummarizeOutcome::Failed(reason) => assert!(reason.contains("timed out")),
        other => panic!("{other:?}"),
    }
    assert_eq!(msgs, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_assembly_recalls_old_turns_within_budget() {
    let dir = tempfile::tempdir().unwrap();
    let mem = harness(&dir.path().join("ctx.db"), Scripted::new()).await;
    let t0 = chrono::Utc::now() - chrono::Duration::days(10);
    let mut batch = Vec::new();
    for i in 0..80 {
        let text = if i == 7 {
            "My locker combination is 4812, remember it.".to_owned()
        } else {
            format!("small talk number {i} about nothing much")
        };
        batch.push(
            cairn_core::NewMemory::conversational(
                cairn_core::ThreadId::new("long").unwrap(),
                Role::User,
                text,
            )
            .at(t0 + chrono::Duration::minutes(i)),
        );
    }
    let ids = mem.add_many(batch).await.unwrap();
    mem.add_summary(
        "Summary: small talk, and a locker combination.",
        &ids[..40],
        Some("long"),
    )
    .await
    .unwrap();
    let opts = ContextOptions {
        summary_share: 0.2,
        ..ContextOptions::default()
    };
    let ctx = mem
        .assemble_context_with("long", "what is my locker combination?", 300, opts)
        .await
        .unwrap();
    let plain = mem
        .assemble_context("long", "what is my locker combination?", 300)
        .await
        .unwrap();
    assert!(plain.tokens <= 300 && plain.items.iter().any(|i| i.id == ids[7]));
    assert!(ctx.tokens <= 300, "{}", ctx.tokens);
    assert_eq!(
        ctx.items.last().unwrap().id,
        ids[79],
        "the newest turn is last"
    );
    assert!(
        ctx.items
            .iter()
            .any(|i| i.id == ids[7] && i.section == Section::Recalled),
        "{}",
        ctx.render()
    );
    assert!(ctx
        .items
        .iter()
        .any(|i| i.section == Section::Summary && i.kind == MemoryKind::Summary));
    let msgs = ctx.to_messages();
    let recalled = ctx
        .items
        .iter()
        .filter(|i| i.section == Section::Recalled)
        .count();
    assert_eq!(
        msgs.len(),
        ctx.items.len() - recalled + 1,
        "one recalled block"
    );
    assert!(msgs.iter().any(|m| m.role == "system"
        && m.content.starts_with("Recalled from earlier")
        && m.content.contains("My locker combination is 4812")));
    assert_eq!(msgs.last().unwrap().role, "user");
    let ids_seen: HashSet<_> = ctx.items.iter().map(|i| i.id).collect();
    assert_eq!(ids_seen.len(), ctx.items.len(), "no duplicates");
}

/// Property: for random threads and budgets, the context never exceeds its budget and
/// always includes the newest turn.
#[test]
fn context_never_exceeds_budget_and_has_newest_turn() {
    use proptest::prelude::*;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mem = rt.block_on(harness(&dir.path().join("p.db"), Scripted::new()));
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: 24,
        ..Default::default()
    });
    let case = AtomicUsize::new(0);
    runner
        .run(
            &(
                1usize..60,
                20usize..600,
                proptest::collection::vec("[a-z \t\r\n?.!'0-9é]{1,120}", 60),
            ),
            |(n, budget, texts)| {
                let thread = format!("p{}", case.fetch_add(1, Ordering::SeqCst));
                rt.block_on(async {
                    let t0 = chrono::Utc::now() - chrono::Duration::days(1);
                    let batch: Vec<_> = (0..n)
                        .map(|i| {
                            let content = if texts[i].trim().is_empty() {
                                "x".to_owned()
                            } else {
                                texts[i].clone()
                            };
                            cairn_core::NewMemory::conversational(
                                cairn_core::ThreadId::new(thread.as_str()).unwrap(),
                                Role::User,
                                content,
                            )
                            .at(t0 + chrono::Duration::seconds(i as i64))
                        })
                        .collect();
                    let ids = mem.add_many(batch).await.unwrap();
                    let ctx = mem
                        .assemble_context(&thread, "what about the last one", budget)
                        .await
                        .unwrap();
                    prop_assert!(ctx.tokens <= budget, "{} > {}", ctx.tokens, budget);
                    prop_assert_eq!(ctx.items.last().map(|i| i.id), Some(ids[n - 1]));
                    let sum: usize = ctx.items.iter().map(|i| i.tokens).sum();
                    prop_assert_eq!(sum, ctx.tokens);
                    let counter = mem.token_counter();
                    let exact: usize = ctx
                        .to_messages()
                        .iter()
                        .map(|m| counter.count_message(&m.content))
                        .sum();
                    prop_assert_eq!(exact, ctx.tokens);
                    Ok(())
                })
            },
        )
        .unwrap();
}

/// Issue 16 item 8: a fold writes the previous version plus the newly folded turns (links
/// grow with the turns, not with their square), versions stay at level 1, the newest
/// version reaches every folded turn through every level, and a restart restores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_summaries_link_each_turn_once_and_reach_every_turn() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lin.db");
    let s = Scripted::new();
    let mem = harness(&path, s.clone()).await;
    let opts = SummaryBufferOptions {
        max_token_limit: 40,
        ..Default::default()
    };
    let buf = SummaryBufferMemory::open(mem.clone(), "lin", opts.clone())
        .await
        .unwrap();
    for i in 0..40 {
        buf.save_context(
            &format!("question {i} about the harbour"),
            &format!("answer {i}: boats come and go"),
        )
        .await
        .unwrap();
    }
    let st = buf.stats().await;
    assert!(st.summaries_written >= 10, "{st:?}");
    let turns = mem.get_conversational("lin", 1_000).await.unwrap();
    assert_eq!(turns.len(), 80);
    let folded = 80 - st.recent_message_count;
    let (sid, text) = buf.moving_summary().await.unwrap();
    // Every turn is cited once; each version after the first cites its predecessor once.
    let store = mem.stats().await.unwrap().store;
    let versions = usize::try_from(st.summaries_written).unwrap();
    assert_eq!(store.links, folded + versions - 1, "{store:?}");
    assert!(
        store.by_level.keys().all(|l| *l <= 1),
        "versions stay at level 1: {:?}",
        store.by_level
    );
    // Direct sources: the previous version first, then the turns of the last fold.
    let direct = mem.expand_summary(sid).await.unwrap();
    assert_eq!(direct[0].kind, MemoryKind::Summary);
    assert!(direct[1..]
        .iter()
        .all(|m| m.kind == MemoryKind::Conversational));
    // Drill-down: every folded turn, in order, nothing lost.
    let leaves: Vec<_> = mem
        .expand_to_leaves(sid)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    let expected: Vec<_> = turns[..folded].iter().map(|m| m.id).collect();
    assert_eq!(leaves, expected);
    // Restart: the newest version and the same buffer.
    let before = text_of(&buf).await;
    drop(buf);
    let again = SummaryBufferMemory::open(mem.clone(), "lin", opts)
        .await
        .unwrap();
    assert_eq!(again.moving_summary().await, Some((sid, text)));
    assert_eq!(text_of(&again).await, before);

    // The running summary folds the same way.
    let run = RunningSummaryMemory::open(
        mem.clone(),
        "run",
        RunningSummaryOptions {
            token_limit: 30,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    for i in 0..30 {
        run.add_message(Role::User, &format!("note {i} on the tides"))
            .await
            .unwrap();
    }
    let rs = run.get_memory_stats().await;
    assert!(rs.summaries_written >= 3, "{rs:?}");
    let links_after = mem.stats().await.unwrap().store.links;
    let rfolded = 30 - rs.recent_message_count;
    let rversions = usize::try_from(rs.summaries_written).unwrap();
    assert_eq!(links_after - store.links, rfolded + rversions - 1);
}

async fn text_of(buf: &SummaryBufferMemory) -> String {
    text(&buf.load_memory_variables().await, "history")
}

/// Issue 16 item 8: `clear` keeps its mark as state; no turn enters the thread, so recall,
/// context assembly and consolidation never see one; a restart still starts empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_is_state_not_a_turn() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clr.db");
    let s = Scripted::new();
    let mem = harness(&path, s.clone()).await;
    let opts = SummaryBufferOptions {
        max_token_limit: 40,
        ..Default::default()
    };
    let buf = SummaryBufferMemory::open(mem.clone(), "c", opts.clone())
        .await
        .unwrap();
    for i in 0..6 {
        buf.save_context(&format!("before {i} clear"), "ok")
            .await
            .unwrap();
    }
    buf.clear().await.unwrap();
    let run = RunningSummaryMemory::open(mem.clone(), "c", RunningSummaryOptions::default())
        .await
        .unwrap();
    run.clear().await.unwrap();
    buf.save_context("after the clear", "fine").await.unwrap();
    let all = mem.get_conversational("c", 1_000).await.unwrap();
    assert_eq!(all.len(), 14, "only the saved turns");
    assert!(all
        .iter()
        .all(|m| m.role != Some(Role::System) && !m.metadata.contains_key("conversation_memory")));
    let ctx = mem.assemble_context("c", "clear", 2_000).await.unwrap();
    assert!(!ctx.render().contains("cleared"), "{}", ctx.render());
    // A restart starts from the clear.
    let again = SummaryBufferMemory::open(mem.clone(), "c", opts)
        .await
        .unwrap();
    assert_eq!(text_of(&again).await, "Human: after the clear\nAI: fine");
    assert!(again.moving_summary().await.is_none());
}

/// Issue 16 item 8: a store written by the earlier code (each summary citing every turn so
/// far, a clear-marker turn) restores the same, and the next fold continues its newest
/// summary with the new turns only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_of_the_earlier_format_restore_and_continue() {
    use cairn_core::{Metadata, NewMemory, SummaryType, ThreadId};
    use cairn_store::NewSummary;
    let dir = tempfile::tempdir().unwrap();
    let s = Scripted::new();
    let mem = harness(&dir.path().join("old.db"), s.clone()).await;
    let t = ThreadId::new("old").unwrap();
    let t0 = chrono::Utc::now() - chrono::Duration::hours(1);
    let turn = |i: i64, text: &str| {
        NewMemory::conversational(t.clone(), Role::User, text).at(t0 + chrono::Duration::seconds(i))
    };
    let old = mem
        .add_many(vec![turn(0, "cleared one"), turn(1, "cleared two")])
        .await
        .unwrap();
    let mut marker =
        NewMemory::conversational(t.clone(), Role::System, "[conversation memory cleared]")
            .at(t0 + chrono::Duration::seconds(2));
    marker
        .metadata
        .insert("conversation_memory".into(), "summary_buffer:clear".into());
    mem.add(marker).await.unwrap();
    let ids = mem
        .add_many((3..9).map(|i| turn(i, &format!("kept {i}"))).collect())
        .await
        .unwrap();
    let old_summary = |content: &str, sources: &[cairn_core::MemoryId], at: i64| {
        let mut metadata = Metadata::new();
        metadata.insert(
            "conversation_memory".into(),
            "summary_buffer:summary".into(),
        );
        NewSummary {
            id: None,
            content: content.into(),
            source_ids: sources.to_vec(),
            thread_id: Some(t.clone()),
            summary_type: SummaryType::Conversation,
            metadata,
            created_at: Some(t0 + chrono::Duration::seconds(at)),
        }
    };
    mem.add_summary_with(old_summary("first", &ids[..2], 10))
        .await
        .unwrap();
    let newest = mem
        .add_summary_with(old_summary("second", &ids[..4], 11))
        .await
        .unwrap();
    let opts = SummaryBufferOptions {
        max_token_limit: 40,
        ..Default::default()
    };
    let buf = SummaryBufferMemory::open(mem.clone(), "old", opts.clone())
        .await
        .unwrap();
    assert_eq!(
        buf.moving_summary().await,
        Some((newest.id, "second".into()))
    );
    assert_eq!(
        text_of(&buf).await,
        "System: second\nHuman: kept 7\nHuman: kept 8"
    );
    // Opening again reads the state written by the first open.
    let again = SummaryBufferMemory::open(mem.clone(), "old", opts.clone())
        .await
        .unwrap();
    assert_eq!(text_of(&again).await, text_of(&buf).await);
    drop(again);
    for i in 0..4 {
        buf.save_context(&format!("new {i} words here"), "reply words")
            .await
            .unwrap();
    }
    let (sid, _) = buf.moving_summary().await.unwrap();
    assert_ne!(sid, newest.id);
    let direct = mem.expand_summary(sid).await.unwrap();
    assert!(direct.len() < 8, "{}", direct.len());
    let leaves: Vec<_> = mem
        .expand_to_leaves(sid)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert!(ids[..6].iter().all(|i| leaves.contains(i)));
    assert!(!leaves.contains(&old[0]) && !leaves.contains(&old[1]));
    let recent = buf.stats().await.recent_message_count;
    let all_new = mem.get_conversational("old", 1_000).await.unwrap().len() - 3;
    assert_eq!(leaves.len() + recent, all_new, "every turn after the clear");
}

/// Issue 16 item 8: a message put in the context without being stored is stored before it
/// is replaced by a summary, and the summary cites it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_context_stores_messages_before_replacing_them() {
    let dir = tempfile::tempdir().unwrap();
    let mem = harness(&dir.path().join("ac.db"), Scripted::new()).await;
    let auto = AutoContextSummarizer::new(
        mem.clone(),
        "ac",
        AutoContextOptions {
            max_unsummarized_messages: 2,
            min_messages_after_summary: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let mut msgs = Vec::new();
    auto.push(&mut msgs, ContextMessage::new(Role::User, "stored first"))
        .await
        .unwrap();
    msgs.push(ContextMessage::new(Role::Assistant, "never stored alpha"));
    msgs.push(ContextMessage::new(Role::User, "never stored bravo"));
    auto.push(&mut msgs, ContextMessage::new(Role::User, "stored second"))
        .await
        .unwrap();
    auto.push(&mut msgs, ContextMessage::new(Role::User, "stored newest"))
        .await
        .unwrap();
    let (summary_id, replaced) = match auto.maybe_summarize(&mut msgs).await.unwrap() {
        SummarizeOutcome::Summarized {
            summary_id,
            replaced,
        } => (summary_id, replaced),
        other => panic!("{other:?}"),
    };
    assert_eq!(replaced, 4);
    let cited: Vec<String> = mem
        .expand_summary(summary_id)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.content)
        .collect();
    assert_eq!(
        cited,
        [
            "stored first",
            "never stored alpha",
            "never stored bravo",
            "stored second"
        ]
    );
    let stored = mem.get_conversational("ac", 100).await.unwrap();
    assert!(stored
        .iter()
        .any(|m| m.content == "never stored alpha" && m.role == Some(Role::Assistant)));
    assert_eq!(stored.len(), 5);
}

/// Holds every summarize call until released; says when one has started.
struct Gate {
    entered: tokio::sync::Notify,
    release: tokio::sync::Semaphore,
    inner: Arc<Scripted>,
}

#[async_trait]
impl Summarizer for Gate {
    fn name(&self) -> &str {
        "gate"
    }
    async fn summarize(&self, r: &SummaryRequest) -> Result<String, SummarizeError> {
        self.entered.notify_one();
        let permit = self.release.acquire().await.unwrap();
        permit.forget();
        self.inner.summarize(r).await
    }
}

/// Issue 16 item 8: while a summary is being written (the summarizer has not answered),
/// readers answer and saves go through; afterwards nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_saves_do_not_wait_for_the_summarizer() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate {
        entered: tokio::sync::Notify::new(),
        release: tokio::sync::Semaphore::new(0),
        inner: Scripted::new(),
    });
    let mem = harness(&dir.path().join("g.db"), gate.clone()).await;
    let buf = Arc::new(
        SummaryBufferMemory::open(
            mem.clone(),
            "g",
            SummaryBufferOptions {
                max_token_limit: 30,
                ..Default::default()
            },
        )
        .await
        .unwrap(),
    );
    buf.save_context("a short start", "ok").await.unwrap();
    let saver = {
        let buf = buf.clone();
        tokio::spawn(async move {
            buf.save_context(
                "a much longer question that pushes the buffer over its limit",
                "and a much longer answer that does the same thing again",
            )
            .await
        })
    };
    gate.entered.notified().await;
    let quick = Duration::from_secs(10);
    let st = tokio::time::timeout(quick, buf.stats())
        .await
        .expect("stats waited for the summarizer");
    assert_eq!(st.recent_message_count, 4);
    tokio::time::timeout(quick, buf.load_memory_variables())
        .await
        .expect("load waited for the summarizer");
    tokio::time::timeout(quick, buf.moving_summary())
        .await
        .expect("moving_summary waited for the summarizer");
    tokio::time::timeout(quick, buf.save_context("meanwhile", "still here"))
        .await
        .expect("a save waited for the summarizer")
        .unwrap();
    gate.release.add_permits(100);
    saver.await.unwrap().unwrap();
    let st = buf.stats().await;
    let (sid, _) = buf.moving_summary().await.unwrap();
    let leaves = mem.expand_to_leaves(sid).await.unwrap();
    assert_eq!(leaves.len() + st.recent_message_count, 6);

    // The running summary: readers answer during a fold too.
    let run = Arc::new(
        RunningSummaryMemory::open(mem.clone(), "g2", RunningSummaryOptions::default())
            .await
            .unwrap(),
    );
    run.add_message(Role::User, "one message").await.unwrap();
    let forcing = {
        let run = run.clone();
        tokio::spawn(async move { run.force_summarize().await })
    };
    gate.entered.notified().await;
    tokio::time::timeout(quick, run.get_memory_stats())
        .await
        .expect("stats waited for the summarizer");
    tokio::time::timeout(quick, run.load_memory_variables())
        .await
        .expect("load waited for the summarizer");
    assert!(forcing.await.unwrap().unwrap());
}
