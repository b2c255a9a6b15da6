//! Consolidation: chunking, levels, cutoff, failures, timeouts, interruption (stop flag and
//! SIGKILL), and summarizers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{embedder, forest, harness, now, Slow};

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use cairn_core::{
    MemoryKind, NewMemory, Role, SummarizeError, Summarizer, SummaryRequest, ThreadId,
};
use cairn_harness::{ConsolidationPolicy, ExtractiveSummarizer, Filter, MemoryHarness};

/// Three threads of turns, one every 10 minutes ending `recent` turns before now.
async fn seed(mem: &MemoryHarness, per_thread: usize, recent: usize) {
    for t in 0..3 {
        let thread = ThreadId::new(format!("thread-{t}")).unwrap();
        let batch: Vec<NewMemory> = (0..per_thread)
            .map(|i| {
                let at = if i + recent >= per_thread {
                    // Inside the last hour.
                    now() - chrono::Duration::minutes(((per_thread - i) as i64) * 5)
                } else {
                    now() - chrono::Duration::days(20) + chrono::Duration::minutes(i as i64 * 10)
                };
                let role = if i % 2 == 0 { Role::User } else { Role::Assistant };
                let mut m = NewMemory::conversational(thread.clone(), role, format!("In thread {t}, message {i} talks about topic {}. It has a second sentence number {i}.", i % 7)).at(at);
                m.metadata.insert("speaker".into(), serde_json::json!(format!("Speaker{}", i % 2)));
                m
            })
            .collect();
        mem.add_many(batch).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builds_a_tree_from_old_memories_only() {
    let dir = tempfile::tempdir().unwrap();
    let mem = harness(&dir.path().join("c.db"), None).await;
    seed(&mem, 107, 4).await;
    let policy = ConsolidationPolicy::older_than(Duration::from_secs(3600)).fanout(3);
    let report = mem.consolidate(policy.clone()).await.unwrap();
    println!("{report}");
    assert!(report.failures.is_empty());
    // 103 old turns per thread, one session: 5 chunks of 20 + a tail of 3, which is older
    // than max_age (7 days) and, being under min_chunk, joins the chunk before it.
    assert_eq!(report.chunks_per_level[&1], 3 * 5);
    // 5 level-1 summaries per thread roll up by 3 into 1; the other 2 wait for a full group.
    assert_eq!(report.chunks_per_level[&2], 3);
    assert_eq!(report.memories_covered, 3 * 103 + 3 * 3);
    let cutoff = now() - chrono::Duration::hours(1);
    for t in 0..3 {
        let turns = mem
            .get_conversational(&format!("thread-{t}"), 1_000)
            .await
            .unwrap();
        let mut reachable = HashSet::new();
        let summaries = mem
            .list(
                Filter::all()
                    .kinds([MemoryKind::Summary])
                    .thread(ThreadId::new(format!("thread-{t}")).unwrap()),
                0,
                1_000,
            )
            .await
            .unwrap();
        for s in &summaries {
            assert_eq!(
                s.thread_id.as_ref().unwrap().as_str(),
                format!("thread-{t}"),
                "chunks never mix threads"
            );
            for leaf in mem.expand_to_leaves(s.id).await.unwrap() {
                assert_eq!(leaf.thread_id, s.thread_id);
                reachable.insert(leaf.id);
            }
            if s.level == 1 {
                // chunk_size, or chunk_size + a tail under min_chunk.
                assert!(s.summary.as_ref().unwrap().source_count <= 20 + 4);
                // Who said it and when survives.
                assert!(
                    s.content.contains("Speaker") && s.content.contains('['),
                    "{}",
                    s.content
                );
            }
        }
        for turn in &turns {
            if turn.created_at < cutoff {
                assert!(
                    reachable.contains(&turn.id),
                    "old turn {} not covered",
                    turn.content
                );
            } else {
                assert!(
                    !reachable.contains(&turn.id),
                    "a turn newer than the cutoff was touched"
                );
                assert!(mem.summaries_of(turn.id).await.unwrap().is_empty());
            }
        }
        // Every covered turn is reachable from a top summary.
        let tops: Vec<_> = summaries.iter().filter(|s| s.level == 2).collect();
        // Roll-ups say what they are; level-1 summaries summarize a conversation.
        for s in &summaries {
            let t = s.summary.as_ref().unwrap().summary_type;
            let want = if s.level == 1 {
                cairn_core::SummaryType::Conversation
            } else {
                cairn_core::SummaryType::Rollup
            };
            assert_eq!(t, want, "level {}", s.level);
        }
        let mut from_tops = HashSet::new();
        for t in &tops {
            from_tops.extend(
                mem.expand_to_leaves(t.id)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|m| m.id),
            );
        }
        let level1_alone: Vec<_> = summaries.iter().filter(|s| s.level == 1).collect();
        for s in level1_alone {
            if mem.summaries_of(s.id).await.unwrap().is_empty() {
                from_tops.extend(
                    mem.expand_to_leaves(s.id)
                        .await
                        .unwrap()
                        .into_iter()
                        .map(|m| m.id),
                );
            }
        }
        assert_eq!(from_tops, reachable);
    }
    // Idempotent: a second pass writes nothing.
    let again = mem.consolidate(policy).await.unwrap();
    assert_eq!(again.chunks(), 0, "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_fresh_tails_wait() {
    let dir = tempfile::tempdir().unwrap();
    let mem = harness(&dir.path().join("t.db"), None).await;
    let thread = ThreadId::new("t").unwrap();
    // 23 turns two hours old: one chunk of 20, a tail of 3 that is younger than max_age.
    let batch = (0..23)
        .map(|i| {
            NewMemory::conversational(thread.clone(), Role::User, format!("turn {i}."))
                .at(now() - chrono::Duration::hours(2))
        })
        .collect();
    mem.add_many(batch).await.unwrap();
    let r = mem
        .consolidate(ConsolidationPolicy::older_than(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert_eq!(r.chunks(), 1);
    assert_eq!(r.deferred_tails, 1);
    let r = mem
        .consolidate(
            ConsolidationPolicy::older_than(Duration::from_secs(3600))
                .max_age(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    assert_eq!(r.chunks(), 1, "an overdue tail is summarized");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_stay_with_their_results() {
    let dir = tempfile::tempdir().unwrap();
    let mem = harness(&dir.path().join("tc.db"), None).await;
    let thread = ThreadId::new("tools").unwrap();
    let mut batch = Vec::new();
    for i in 0..40 {
        let at = now() - chrono::Duration::days(30) + chrono::Duration::minutes(i);
        let m = if i == 19 {
            let mut m = NewMemory::conversational(
                thread.clone(),
                Role::Assistant,
                "calling the weather tool",
            )
            .at(at);
            m.metadata.insert("tool_calls".into(), serde_json::json!([{"id": "call-1", "name": "weather"}, {"id": "call-2", "name": "time"}]));
            m
        } else if i == 20 || i == 21 {
            let mut m =
                NewMemory::conversational(thread.clone(), Role::Tool, format!("result {i}")).at(at);
            m.metadata.insert(
                "tool_call_id".into(),
                serde_json::json!(if i == 20 { "call-1" } else { "call-2" }),
            );
            m
        } else {
            NewMemory::conversational(thread.clone(), Role::User, format!("plain turn {i}.")).at(at)
        };
        batch.push(m);
    }
    mem.add_many(batch).await.unwrap();
    let r = mem
        .consolidate(ConsolidationPolicy::older_than(Duration::from_secs(60)).fanout(10))
        .await
        .unwrap();
    assert_eq!(r.chunks_per_level[&1], 2);
    let first = mem.expand_summary(r.summaries[0]).await.unwrap();
    assert_eq!(first.len(), 22, "the chunk grew to take both results");
    assert_eq!(first.last().unwrap().content, "result 21");

    // An unresolved call at a chunk's end: the chunk stops before it.
    let dir = tempfile::tempdir().unwrap();
    let mem = harness(&dir.path().join("tc2.db"), None).await;
    let mut batch = Vec::new();
    for i in 0..25 {
        let at = now() - chrono::Duration::days(30) + chrono::Duration::minutes(i);
        let mut m =
            NewMemory::conversational(thread.clone(), Role::User, format!("turn {i}.")).at(at);
        if i == 18 {
            m.role = Some(Role::Assistant);
            m.metadata
                .insert("tool_calls".into(), serde_json::json!([{"id": "pending"}]));
        }
        batch.push(m);
    }
    mem.add_many(batch).await.unwrap();
    let r = mem
        .consolidate(ConsolidationPolicy::older_than(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(r.chunks(), 1);
    assert_eq!(mem.expand_summary(r.summaries[0]).await.unwrap().len(), 18);
    assert_eq!(r.deferred_tails, 1, "the open call waits for its result");
}

/// Fails every third call.
struct Flaky {
    inner: ExtractiveSummarizer,
    calls: AtomicUsize,
}

#[async_trait]
impl Summarizer for Flaky {
    fn name(&self) -> &str {
        "flaky"
    }
    async fn summarize(&self, r: &SummaryRequest) -> Result<String, SummarizeError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) % 3 == 2 {
            return Err(SummarizeError::Http {
                status: 503,
                message: "overloaded".into(),
            });
        }
        self.inner.summarize(r).await
    }
}

/// Raises a stop flag on its `after`-th call (and still answers it).
struct StopAfter {
    inner: ExtractiveSummarizer,
    calls: AtomicUsize,
    after: usize,
    flag: Arc<AtomicBool>,
}

#[async_trait]
impl Summarizer for StopAfter {
    fn name(&self) -> &str {
        "stop-after"
    }
    async fn summarize(&self, r: &SummaryRequest) -> Result<String, SummarizeError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) + 1 == self.after {
            self.flag.store(true, Ordering::SeqCst);
        }
        self.inner.summarize(r).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_lose_nothing_and_the_next_pass_completes() {
    let dir = tempfile::tempdir().unwrap();
    let reference = {
        let mem = harness(&dir.path().join("ref.db"), None).await;
        seed(&mem, 107, 0).await;
        mem.consolidate(ConsolidationPolicy::older_than(Duration::from_secs(3600)).fanout(3))
            .await
            .unwrap();
        forest(&mem, None).await
    };
    let flaky = Arc::new(Flaky {
        inner: ExtractiveSummarizer::new(embedder()),
        calls: AtomicUsize::new(0),
    });
    let mem = harness(&dir.path().join("f.db"), Some(flaky)).await;
    seed(&mem, 107, 0).await;
    let before = mem.stats().await.unwrap().store.total;
    let policy = ConsolidationPolicy::older_than(Duration::from_secs(3600)).fanout(3);
    let r1 = mem.consolidate(policy.clone()).await.unwrap();
    assert!(!r1.failures.is_empty());
    assert!(r1.failures.iter().all(|f| f.reason.contains("503")));
    let after = mem.stats().await.unwrap().store;
    assert_eq!(after.by_kind["conversational"], before, "no memory lost");
    let mut passes = 1;
    loop {
        let r = mem.consolidate(policy.clone()).await.unwrap();
        passes += 1;
        if r.chunks() == 0 && r.failures.is_empty() {
            break;
        }
        assert!(passes < 10);
    }
    assert_eq!(
        forest(&mem, None).await,
        reference,
        "retries complete the same tree"
    );

    // A summarizer slower than the timeout: every chunk fails as a timeout, nothing written.
    let slow = Arc::new(Slow(
        Duration::from_millis(300),
        ExtractiveSummarizer::new(embedder()),
    ));
    let mem = harness(&dir.path().join("s.db"), Some(slow)).await;
    seed(&mem, 30, 0).await;
    let r = mem
        .consolidate(
            ConsolidationPolicy::older_than(Duration::from_secs(3600))
                .timeout(Duration::from_millis(20)),
        )
        .await
        .unwrap();
    assert_eq!(r.chunks(), 0);
    assert!(!r.failures.is_empty());
    assert!(
        r.failures.iter().all(|f| f.reason.contains("timed out")),
        "{:?}",
        r.failures
    );
    assert_eq!(mem.stats().await.unwrap().store.total, 90);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_flag_then_resume_gives_the_same_tree() {
    let dir = tempfile::tempdir().unwrap();
    let reference = {
        let mem = harness(&dir.path().join("ref.db"), None).await;
        seed(&mem, 107, 0).await;
        mem.consolidate(ConsolidationPolicy::older_than(Duration::from_secs(3600)).fanout(3))
            .await
            .unwrap();
        forest(&mem, None).await
    };
    // The summarizer raises the stop flag on its 5th call: deterministic, no timing.
    let stop = Arc::new(AtomicBool::new(false));
    let stopper = Arc::new(StopAfter {
        inner: ExtractiveSummarizer::new(embedder()),
        calls: AtomicUsize::new(0),
        after: 5,
        flag: stop.clone(),
    });
    let mem = harness(&dir.path().join("i.db"), Some(stopper)).await;
    seed(&mem, 107, 0).await;
    let policy = ConsolidationPolicy::older_than(Duration::from_secs(3600))
        .fanout(3)
        .stop_flag(stop.clone());
    let r = mem.consolidate(policy.clone()).await.unwrap();
    assert!(r.cancelled);
    assert_eq!(r.chunks(), 5, "stopped after the chunk in progress");
    stop.store(false, Ordering::SeqCst);
    mem.consolidate(policy).await.unwrap();
    assert_eq!(forest(&mem, None).await, reference);
}

const CHILD: &str = "CAIRN_CONSOLIDATE_CHILD_DB";

/// Child side of the SIGKILL test: consolidates slowly until killed.
#[test]
fn consolidate_child() {
    let Ok(path) = std::env::var(CHILD) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let slow = Arc::new(Slow(
            Duration::from_millis(15),
            ExtractiveSummarizer::new(embedder()),
        ));
        let mem = harness(std::path::Path::new(&path), Some(slow)).await;
        println!("ready");
        mem.consolidate(ConsolidationPolicy::older_than(Duration::from_secs(3600)).fanout(3))
            .await
            .unwrap();
        println!("done");
    });
}

/// Killing a consolidating process at seeded random moments, then running again, gives the
/// same tree as one uninterrupted pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_pass_then_resume_gives_the_same_tree() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.db");
    {
        let mem = harness(&base, None).await;
        seed(&mem, 107, 0).await;
    }
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for round in 0..3 {
        let path = dir.path().join(format!("kill-{round}.db"));
        std::fs::copy(&base, &path).unwrap();
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "consolidate_child",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        while let Some(Ok(l)) = lines.next() {
            if l.contains("ready") {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(40..250)));
        child.kill().unwrap();
        child.wait().unwrap();
        let mem = harness(&path, None).await;
        let partial = mem
            .stats()
            .await
            .unwrap()
            .store
            .by_kind
            .get("summary")
            .copied()
            .unwrap_or(0);
        mem.consolidate(ConsolidationPolicy::older_than(Duration::from_secs(3600)).fanout(3))
            .await
            .unwrap();
        let resumed = forest(&mem, None).await;
        let fresh_path = dir.path().join(format!("fresh-{round}.db"));
        std::fs::copy(&base, &fresh_path).unwrap();
        let fresh = harness(&fresh_path, None).await;
        fresh
            .consolidate(ConsolidationPolicy::older_than(Duration::from_secs(3600)).fanout(3))
            .await
            .unwrap();
        assert_eq!(
            resumed,
            forest(&fresh, None).await,
            "round {round} (killed after {partial} summaries)"
        );
    }
}

/// The extractive summarizer keeps to its budget, keeps speakers and dates, is
/// deterministic, and summarizes summaries too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extractive_summaries_respect_the_budget() {
    use cairn_core::{SummaryItem, TokenCounter};
    use cairn_harness::TiktokenCounter;
    let counter = Arc::new(TiktokenCounter::cl100k().unwrap());
    let s = ExtractiveSummarizer::new(embedder()).with_token_counter(counter.clone());
    let items: Vec<SummaryItem> = (0..30)
        .map(|i| SummaryItem {
            kind: MemoryKind::Conversational,
            role: Some(if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            }),
            speaker: Some(if i % 2 == 0 {
                "Ann".into()
            } else {
                "Bob".into()
            }),
            created_at: now() - chrono::Duration::days(3),
            time_start: None,
            content: format!(
                "Sentence {i} mentions topic {}. Another clause about item {i}!",
                i % 4
            ),
        })
        .collect();
    let req = SummaryRequest {
        previous: None,
        items: items.clone(),
        max_tokens: 60,
        ..Default::default()
    };
    let a = s.summarize(&req).await.unwrap();
    let b = s.summarize(&req).await.unwrap();
    assert_eq!(a, b, "deterministic");
    assert!(counter.count(&a) <= 60, "{} tokens: {a}", counter.count(&a));
    // The date once (one day), then a speaker on every line.
    assert_eq!(a.matches('[').count(), 1, "{a}");
    assert!(a.starts_with('['), "{a}");
    assert!(
        a.lines()
            .all(|l| l.contains("Ann: ") || l.contains("Bob: ")),
        "{a}"
    );
    // Level 2: summaries as input keep their lines.
    let upper = SummaryRequest {
        previous: None,
        items: vec![SummaryItem {
            kind: MemoryKind::Summary,
            role: None,
            speaker: None,
            created_at: now(),
            time_start: None,
            content: a.clone(),
        }],
        max_tokens: 45,
        ..Default::default()
    };
    let top = s.summarize(&upper).await.unwrap();
    assert!(counter.count(&top) <= 45);
    // Lines are reused verbatim (the date moves to the first line of its day).
    let body = |l: &str| l.split_once("] ").map_or(l, |(_, b)| b).to_owned();
    assert!(
        a.lines().any(|l| top.lines().any(|t| body(t) == body(l))),
        "lines are reused verbatim: {a}\n---\n{top}"
    );
    // A single unit longer than the budget is cut to it.
    let huge = SummaryRequest {
        previous: None,
        items: vec![SummaryItem {
            time_start: None,
            content: "word ".repeat(500),
            ..items[0].clone()
        }],
        max_tokens: 20,
        ..Default::default()
    };
    assert!(counter.count(&s.summarize(&huge).await.unwrap()) <= 20);
    let empty = SummaryRequest {
        previous: None,
        items: vec![],
        max_tokens: 20,
        ..Default::default()
    };
    assert!(matches!(
        s.summarize(&empty).await,
        Err(SummarizeError::NoInput)
    ));
}

/// Issue 16, item 4: stale summaries are refreshed from their current sources, lowest level
/// first: a pass re-summarizes the level-1 summary over an updated turn, then the level-2
/// summary above it (stale in turn); a detached turn leaves its summary's text. One summary
/// can be refreshed on its own; a memory that is not a summary is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_summaries_are_refreshed_from_their_sources() {
    let dir = tempfile::tempdir().unwrap();
    let mem = harness(&dir.path().join("stale.db"), None).await;
    seed(&mem, 107, 4).await;
    let policy = ConsolidationPolicy::older_than(Duration::from_secs(3600))
        .fanout(3)
        .thread(ThreadId::new("thread-0").unwrap());
    mem.consolidate(policy.clone()).await.unwrap();
    let turns = mem
        .list(
            Filter::all()
                .thread(ThreadId::new("thread-0").unwrap())
                .levels(0, 0),
            0,
            usize::MAX,
        )
        .await
        .unwrap();
    let first = turns[0].id;
    let l1 = mem.summaries_of(first).await.unwrap()[0].clone();
    let l2 = mem.summaries_of(l1.id).await.unwrap()[0].clone();
    assert!(!l1.content.contains("xylophone"));
    mem.update(
        first,
        "In thread 0 the xylophone recital moved to the harbour xylophone hall on Friday.",
    )
    .await
    .unwrap();
    assert!(mem.get(l1.id).await.unwrap().summary.unwrap().stale);
    assert!(mem.get(l2.id).await.unwrap().summary.unwrap().stale);
    let report = mem.consolidate(policy.clone()).await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.refreshed, vec![l1.id, l2.id], "lowest level first");
    let fresh = mem.get(l1.id).await.unwrap();
    assert!(!fresh.summary.as_ref().unwrap().stale);
    assert!(
        fresh.content.contains("xylophone"),
        "the refreshed summary reads the updated turn: {}",
        fresh.content
    );
    assert!(!mem.get(l2.id).await.unwrap().summary.unwrap().stale);
    let stats = mem.stats().await.unwrap();
    assert_eq!(stats.store.stale_summaries, 0);
    // A summary that kept nothing of a detached turn's text after its refresh.
    let sources = mem.expand_summary(l1.id).await.unwrap();
    let gone = sources[0].id;
    mem.delete_with(gone, cairn_store::DeletePolicy::Detach)
        .await
        .unwrap();
    let again = mem.refresh_summary(l1.id).await.unwrap();
    assert!(!again.content.contains("xylophone"), "{}", again.content);
    assert!(!again.summary.as_ref().unwrap().stale);
    assert_eq!(
        again.summary.as_ref().unwrap().source_count,
        sources.len() - 1
    );
    // The level above is stale again and the next pass refreshes it alone.
    let report = mem.consolidate(policy).await.unwrap();
    assert_eq!(report.refreshed, vec![l2.id]);
    assert!(matches!(
        mem.refresh_summary(turns[5].id).await,
        Err(cairn_harness::HarnessError::Store(
            cairn_store::StoreError::NotASummary { .. }
        ))
    ));
}

/// Issue 16, item 7: consolidation reads what it has to cover a page at a time (and the
/// thread-less pass reads thread-less memories only); the tree does not depend on the page
/// size, including pages that cut a session and pages shorter than a level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paged_consolidation_builds_the_same_tree() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.db");
    {
        let mem = harness(&base, None).await;
        seed(&mem, 107, 4).await;
        // Thread-less tool logs, old: the thread-less pass summarizes them alone.
        let logs: Vec<NewMemory> = (0..30)
            .map(|i| {
                NewMemory::new(MemoryKind::ToolLog, format!("tool log {i}: ran the job"))
                    .at(now() - chrono::Duration::days(10) + chrono::Duration::minutes(i))
            })
            .collect();
        mem.add_many(logs).await.unwrap();
        mem.store().close().unwrap();
    }
    let mut trees = Vec::new();
    for page in [5_000, 40, 47] {
        let path = dir.path().join(format!("page-{page}.db"));
        std::fs::copy(&base, &path).unwrap();
        let mem = harness(&path, None).await;
        let policy = ConsolidationPolicy::older_than(Duration::from_secs(3600))
            .fanout(3)
            .page_size(page);
        let report = mem.consolidate(policy).await.unwrap();
        assert!(report.failures.is_empty());
        trees.push(forest(&mem, None).await);
    }
    assert!(trees[0].iter().any(|s| s.contains("tool log")));
    assert_eq!(trees[1], trees[0], "pages of 40");
    assert_eq!(trees[2], trees[0], "pages of 47");
    let dir2 = tempfile::tempdir().unwrap();
    let mem = harness(&dir2.path().join("bad.db"), None).await;
    assert!(mem
        .consolidate(ConsolidationPolicy::older_than(Duration::from_secs(1)).page_size(39))
        .await
        .is_err());
}
