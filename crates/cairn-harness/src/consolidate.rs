//! Time-based consolidation: old memories become a tree of summaries, never losing a source.
//!
//! One pass, level by level from the raw memories up:
//! 1. Take the memories of the level that are older than the cutoff and that no summary of
//!    the next level cites yet, per thread (chunks never mix threads), oldest first.
//! 2. Cut raw memories into sessions (a gap over `session_gap`, or a change of
//!    `metadata.session`), then each session into chunks of `chunk_size`; summaries into
//!    groups of `fanout`. No chunk mixes two sessions. A chunk never ends between a tool call
//!    and its results: it grows to take the results, or ends before the call when the
//!    results are not there yet. A session's short tail joins the chunk before it when it is
//!    under `min_chunk`; the last session's tail waits for more memories unless it is long
//!    enough or its newest member is older than `max_age`; summaries roll up only in full
//!    groups of `fanout`, and not while chunks of their own level failed in the pass.
//! 3. Summarize each chunk (with a timeout), telling the summarizer the level and the
//!    thread's word rarity; write the summary (its keywords in `metadata.keywords`, its
//!    vector the mean of its text's and its sources') and its links in one
//!    transaction. A failed or timed-out chunk is left untouched and reported; the next pass
//!    retries it.
//!
//! Idempotent and resumable: coverage is read from the links, so a memory covered at a
//! level is never summarized again at that level, and an interrupted pass followed by
//! another gives the same tree as one uninterrupted pass. A summary's `created_at` is the
//! time of its newest source, so the tree does not depend on when the pass ran.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use cairn_core::{
    MemoryId, MemoryKind, MemoryUnit, Role, SummarizeError, SummaryItem, SummaryRequest,
    SummaryType, TermStats, ThreadId,
};
use cairn_store::{Filter, NewSummary};

use crate::extractive::{strip_speaker, summary_keywords};
use crate::harness::blocking;
use crate::text::content_words;
use crate::{HarnessError, MemoryHarness, Result};

/// The metadata key of a summary consolidation wrote: what wrote it (its summarizer).
pub(crate) const CONSOLIDATION_KEY: &str = "consolidation";

/// What a consolidation pass does; build with [`ConsolidationPolicy::older_than`].
#[derive(Debug, Clone)]
pub struct ConsolidationPolicy {
    /// Only memories older than now minus this are summarized.
    pub older_than: Duration,
    /// Raw memories per summary. Default 20.
    pub chunk_size: usize,
    /// A gap between two raw memories longer than this ends a session; a change of
    /// `metadata.session` does too. No chunk mixes two sessions. Default 30 minutes.
    pub session_gap: Duration,
    /// A tail shorter than this waits for more memories... Default 5.
    pub min_chunk: usize,
    /// ...unless its newest memory is older than now minus this. Default 7 days.
    pub max_age: Duration,
    /// Summaries per roll-up summary; a level rolls up once it has this many unsummarized
    /// summaries older than the cutoff. Default 5.
    pub fanout: usize,
    /// The highest level written. Default 4.
    pub max_level: u32,
    /// Only these threads (all when empty).
    pub threads: Vec<ThreadId>,
    /// Raw kinds consolidated. Default conversational and tool_log.
    pub kinds: Vec<MemoryKind>,
    /// Tokens per summary (the summarizer's budget). Default 256.
    pub summary_tokens: usize,
    /// How long one summarizer call may take. Default 120 s.
    pub timeout: Duration,
    /// Checked between chunks: when set, the pass stops after the current chunk.
    pub stop: Option<Arc<AtomicBool>>,
    /// Memories read at a time at one level of one thread. Default 5,000.
    pub page_size: usize,
}

/// Parses `90`, `90s`, `30m`, `2h`, `7d`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('s') => (&s[..s.len() - 1], 1),
        Some('m') => (&s[..s.len() - 1], 60),
        Some('h') => (&s[..s.len() - 1], 3600),
        Some('d') => (&s[..s.len() - 1], 86_400),
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?} (use 90s, 30m, 2h, 7d)"))?;
    Ok(Duration::from_secs(n.saturating_mul(mult)))
}

impl ConsolidationPolicy {
    /// Summarize memories older than `age`, with the defaults for everything else.
    pub fn older_than(age: Duration) -> Self {
        Self {
            older_than: age,
            chunk_size: 20,
            session_gap: Duration::from_secs(30 * 60),
            min_chunk: 5,
            max_age: Duration::from_secs(7 * 24 * 3600),
            fanout: 5,
            max_level: 4,
            threads: Vec::new(),
            kinds: vec![MemoryKind::Conversational, MemoryKind::ToolLog],
            summary_tokens: 256,
            timeout: Duration::from_secs(120),
            stop: None,
            page_size: 5_000,
        }
    }

    /// Sets how many memories a pass reads at a time at one level of one thread (default
    /// 5,000; at least twice the chunk size and the fan-out, so that every full page yields
    /// a chunk). The tree does not depend on it.
    pub fn page_size(mut self, n: usize) -> Self {
        self.page_size = n;
        self
    }

    /// Sets the chunk size.
    pub fn chunk_size(mut self, n: usize) -> Self {
        self.chunk_size = n;
        self
    }

    /// Sets the gap that ends a session.
    pub fn session_gap(mut self, d: Duration) -> Self {
        self.session_gap = d;
        self
    }

    /// Sets the minimum tail size.
    pub fn min_chunk(mut self, n: usize) -> Self {
        self.min_chunk = n;
        self
    }

    /// Sets the age past which a short tail is summarized anyway.
    pub fn max_age(mut self, d: Duration) -> Self {
        self.max_age = d;
        self
    }

    /// Sets the roll-up fanout.
    pub fn fanout(mut self, n: usize) -> Self {
        self.fanout = n;
        self
    }

    /// Sets the highest level.
    pub fn max_level(mut self, l: u32) -> Self {
        self.max_level = l;
        self
    }

    /// Restricts to a thread (may be called several times).
    pub fn thread(mut self, t: ThreadId) -> Self {
        self.threads.push(t);
        self
    }

    /// Sets the per-summary token budget.
    pub fn summary_tokens(mut self, n: usize) -> Self {
        self.summary_tokens = n;
        self
    }

    /// Sets the summarizer timeout.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// Sets the stop flag.
    pub fn stop_flag(mut self, flag: Arc<AtomicBool>) -> Self {
        self.stop = Some(flag);
        self
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(HarnessError::Config(m.to_owned()));
        if self.chunk_size < 2 || self.chunk_size > MAX_GROUP {
            return bad("chunk_size must be in 2..=1000");
        }
        if self.fanout < 2 || self.fanout > MAX_GROUP {
            return bad("fanout must be in 2..=1000");
        }
        if self.min_chunk == 0 || self.min_chunk > self.chunk_size {
            return bad("min_chunk must be in 1..=chunk_size");
        }
        if self.max_level == 0 {
            return bad("max_level must be at least 1");
        }
        if self.page_size < 2 * self.chunk_size.max(self.fanout) {
            return bad("page_size must be at least twice chunk_size and fanout");
        }
        if self.summary_tokens == 0 {
            return bad("summary_tokens must be at least 1");
        }
        if chrono::Duration::from_std(self.session_gap).is_err() {
            return bad("session_gap is too large");
        }
        Ok(())
    }
}

/// The largest chunk size or fan-out.
const MAX_GROUP: usize = 1_000;

/// A chunk that was not summarized.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkFailure {
    /// The level the summary would have had.
    pub level: u32,
    /// Its thread.
    pub thread: Option<ThreadId>,
    /// The chunk's memories (all still in place).
    pub memory_ids: Vec<MemoryId>,
    /// Why.
    pub reason: String,
}

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConsolidationReport {
    /// Summaries written per level.
    pub chunks_per_level: BTreeMap<u32, usize>,
    /// Memories newly covered (sources of the summaries written).
    pub memories_covered: usize,
    /// The summaries written, in order.
    pub summaries: Vec<MemoryId>,
    /// Chunks left for the next pass because the summarizer failed or timed out.
    pub failures: Vec<ChunkFailure>,
    /// Raw-memory tails left to wait for more memories (or for a tool result).
    pub deferred_tails: usize,
    /// True when the stop flag ended the pass early.
    pub cancelled: bool,
    /// Wall time of the pass.
    pub elapsed: Duration,
    /// Time spent in the summarizer.
    pub summarizer_time: Duration,
    /// Stale summaries re-summarized from their current sources (see
    /// [`MemoryHarness::refresh_summary`]), lowest level first.
    pub refreshed: Vec<MemoryId>,
    /// Memories deleted because their expiry passed (with the summaries left with no
    /// source); the summaries built on them were rewritten as by [`MemoryHarness::forget`].
    pub expired: Vec<MemoryId>,
    /// Raw memories that arrived late, dated inside a stretch already summarized: each was
    /// added to the summary of its time (which was then rewritten), not chunked apart.
    pub placed: Vec<MemoryId>,
}

impl ConsolidationReport {
    /// Summaries written in total.
    pub fn chunks(&self) -> usize {
        self.chunks_per_level.values().sum()
    }
}

impl std::fmt::Display for ConsolidationReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let levels: Vec<String> = self
            .chunks_per_level
            .iter()
            .map(|(l, n)| format!("level {l}: {n}"))
            .collect();
        write!(
            f,
            "{} summaries ({}), {} memories covered, {} refreshed, {} failed, {} tails waiting{}, {:.2} s ({:.2} s summarizing)",
            self.chunks(),
            if levels.is_empty() { "none".to_owned() } else { levels.join(", ") },
            self.memories_covered,
            self.refreshed.len(),
            self.failures.len(),
            self.deferred_tails,
            if self.cancelled { ", cancelled" } else { "" },
            self.elapsed.as_secs_f64(),
            self.summarizer_time.as_secs_f64()
        )
    }
}

fn tool_call_ids(m: &MemoryUnit) -> Vec<String> {
    m.metadata
        .get("tool_calls")
        .and_then(|v| v.as_array())
        .map(|calls| {
            calls
                .iter()
                .filter_map(|c| c.get("id").and_then(|i| i.as_str()).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn answers(m: &MemoryUnit) -> Option<&str> {
    if m.role == Some(Role::Tool) || m.kind == MemoryKind::ToolLog {
        m.metadata.get("tool_call_id").and_then(|v| v.as_str())
    } else {
        None
    }
}

/// Cuts `items` into chunks of about `size` without splitting a tool call from its results.
/// Returns the chunks and the unchunked tail.
pub(crate) fn chunk(items: &[MemoryUnit], size: usize) -> (Vec<&[MemoryUnit]>, &[MemoryUnit]) {
    let mut chunks = Vec::new();
    let mut start = 0;
    while items.len() - start >= size {
        let mut end = start + size;
        // Open calls inside the chunk: extend to take their results, if they exist.
        let open: Vec<String> = open_calls(&items[start..end]);
        if !open.is_empty() {
            // Results that follow directly (within one more chunk) are taken in.
            let mut grown = end;
            while grown < items.len()
                && grown < end + size
                && answers(&items[grown]).is_some_and(|id| open.iter().any(|o| o == id))
            {
                grown += 1;
            }
            if grown > end && open_calls(&items[start..grown]).is_empty() {
                end = grown;
            } else {
                // Results missing: end the chunk before the earliest open call.
                let first_open = items[start..end]
                    .iter()
                    .position(|m| tool_call_ids(m).iter().any(|id| open.contains(id)))
                    .map_or(end, |p| start + p);
                if first_open == start {
                    // The chunk starts with an unresolved call: nothing can be cut yet.
                    return (chunks, &items[start..]);
                }
                end = first_open;
            }
        }
        chunks.push(&items[start..end]);
        start = end;
    }
    (chunks, &items[start..])
}

fn open_calls(items: &[MemoryUnit]) -> Vec<String> {
    let mut open: Vec<String> = Vec::new();
    for m in items {
        open.extend(tool_call_ids(m));
        if let Some(id) = answers(m) {
            open.retain(|o| o != id);
        }
    }
    open
}

/// Cuts `items` (one thread, oldest first) into sessions: a new session starts after a gap
/// longer than `gap`, or where `metadata.session` changes.
pub(crate) fn sessions(items: &[MemoryUnit], gap: chrono::Duration) -> Vec<&[MemoryUnit]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..items.len() {
        let (a, b) = (&items[i - 1], &items[i]);
        let label = |m: &MemoryUnit| m.metadata.get("session").cloned();
        let changed = matches!((label(a), label(b)), (Some(x), Some(y)) if x != y);
        if changed || b.created_at - a.created_at > gap {
            out.push(&items[start..i]);
            start = i;
        }
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
}

/// The speaker of a memory: `metadata.speaker` when it is a non-empty string.
pub(crate) fn speaker(m: &MemoryUnit) -> Option<&str> {
    m.metadata
        .get("speaker")
        .and_then(|v| v.as_str())
        .filter(|s| !s.trim().is_empty())
}

/// Word rarity over texts with their speakers: each text's content words (a leading
/// `Speaker:` left out) count as one document.
pub(crate) fn term_stats(texts: &[(String, Option<String>)]) -> TermStats {
    let mut stats = TermStats::new();
    for (content, speaker) in texts {
        let body = speaker
            .as_deref()
            .map_or(content.as_str(), |s| strip_speaker(content, s));
        stats.add_doc(content_words(body));
    }
    stats
}

/// Items for a summarizer, with speakers from metadata.
pub(crate) fn summary_items(chunk: &[MemoryUnit]) -> Vec<SummaryItem> {
    chunk
        .iter()
        .map(|m| SummaryItem {
            kind: m.kind,
            role: m.role,
            speaker: speaker(m).map(str::to_owned),
            created_at: m.created_at,
            time_start: m.summary.as_ref().map(|s| s.time_range_start),
            content: match m.metadata.get("blip_caption").and_then(|v| v.as_str()) {
                // A shared photo's caption is part of what was said.
                Some(c) if !c.trim().is_empty() && !m.content.contains(c.trim()) => {
                    format!("{} [shares a photo: {}]", m.content, c.trim())
                }
                _ => m.content.clone(),
            },
        })
        .collect()
}

impl MemoryHarness {
    /// Runs one consolidation pass (see the module docs of `consolidate`).
    pub async fn consolidate(&self, policy: ConsolidationPolicy) -> Result<ConsolidationReport> {
        policy.validate()?;
        let started = Instant::now();
        let mut report = ConsolidationReport::default();
        let now = self.inner.clock.now();
        let before = |age: Duration, name: &str| {
            chrono::Duration::from_std(age)
                .ok()
                .and_then(|d| now.checked_sub_signed(d))
                .ok_or_else(|| HarnessError::Config(format!("{name} reaches before the calendar")))
        };
        let cutoff = before(policy.older_than, "older_than")?;
        let tail_cutoff = before(policy.max_age, "max_age")?;
        // Expired memories go first (forgotten, so nothing derived from them survives).
        loop {
            let inner = self.inner.clone();
            let batch = blocking(move || inner.store.expired(1_000)).await??;
            if batch.is_empty() {
                break;
            }
            let r = self.forget(crate::Forget::Ids(batch)).await?;
            report.expired.extend(r.deleted);
        }
        let threads: Vec<Option<ThreadId>> = if policy.threads.is_empty() {
            let inner = self.inner.clone();
            let mut t: Vec<Option<ThreadId>> = blocking(move || inner.store.threads())
                .await??
                .into_iter()
                .map(Some)
                .collect();
            t.push(None);
            t
        } else {
            policy.threads.iter().cloned().map(Some).collect()
        };
        let mut incomplete: HashSet<(u32, Option<ThreadId>)> = HashSet::new();
        // Word rarity per thread, over all its raw memories older than the cutoff (covered or
        // not, so that an interrupted pass and its resumption summarize as one pass would).
        // Thread-less memories get none: the summarizer counts each chunk's own words.
        let mut stats: HashMap<ThreadId, Arc<TermStats>> = HashMap::new();
        let gap = chrono::Duration::from_std(policy.session_gap)
            .map_err(|_| HarnessError::Config("session_gap is too large".into()))?;
        // Late arrivals join the summary of their time (it becomes stale, and is rewritten
        // just below).
        for thread in threads.iter().flatten() {
            let mut f = Filter::all().levels(0, 0).thread(thread.clone());
            f.before = Some(cutoff);
            f.kinds = policy.kinds.clone();
            let inner = self.inner.clone();
            let late = blocking(move || inner.store.late_arrivals(&f)).await??;
            for (memory, summary) in late {
                let inner = self.inner.clone();
                blocking(move || inner.store.place_source(summary, memory)).await??;
                report.placed.push(memory);
            }
        }
        // Stale summaries first (their sources changed or were detached), lowest level
        // first, so roll-ups written below read their current text.
        for thread in &threads {
            self.refresh_stale(thread.as_ref(), &policy, &mut report)
                .await?;
        }
        'levels: for level in 0..policy.max_level {
            for thread in &threads {
                // A level whose own chunks failed in this pass is incomplete: rolling it up
                // now would group its summaries differently from a pass without failures.
                if level > 0 && incomplete.contains(&(level, thread.clone())) {
                    continue;
                }
                let mut filter = Filter::all().levels(level, level);
                filter.before = Some(cutoff);
                filter.kinds = if level == 0 {
                    policy.kinds.clone()
                } else {
                    vec![MemoryKind::Summary]
                };
                filter.thread = thread.clone();
                filter.thread_less = thread.is_none();
                let page = policy.page_size;
                // Page through what is uncovered, oldest first: a full page's last session
                // waits for the next page, so the chunks are cut where one read would cut them.
                loop {
                    let inner = self.inner.clone();
                    let f = filter.clone();
                    let items =
                        blocking(move || inner.store.scan_uncovered_page(&f, level + 1, page))
                            .await??;
                    let more = items.len() == page;
                    let (written_before, failed_before_page) =
                        (report.chunks(), report.failures.len());
                    let size = if level == 0 {
                        policy.chunk_size
                    } else {
                        policy.fanout
                    };
                    let thread_stats = match thread {
                        Some(t) if items.is_empty() => stats.get(t).cloned(),
                        Some(t) => match stats.get(t) {
                            Some(s) => Some(s.clone()),
                            None => {
                                let mut f = Filter::all().levels(0, 0).thread(t.clone());
                                f.before = Some(cutoff);
                                f.kinds = policy.kinds.clone();
                                let inner = self.inner.clone();
                                let texts = blocking(move || inner.store.texts(&f)).await??;
                                let s = Arc::new(term_stats(&texts));
                                stats.insert(t.clone(), s.clone());
                                Some(s)
                            }
                        },
                        None => None,
                    };
                    // Raw memories are chunked session by session; summaries roll up as one run.
                    let parts = if level == 0 {
                        sessions(&items, gap)
                    } else {
                        vec![&items[..]]
                    };
                    let mut chunks: Vec<&[MemoryUnit]> = Vec::new();
                    for (p, part) in parts.iter().enumerate() {
                        let (mut cut, tail) = chunk(part, size);
                        // Summaries roll up only in full groups of `fanout`; a raw tail waits for
                        // more memories unless its session is over (another one follows), it is
                        // long enough, or it is overdue.
                        let last = p + 1 == parts.len();
                        if more && last {
                            // Cut by the page: continued from the next page.
                            if !tail.is_empty() {
                                report.deferred_tails += 1;
                            }
                        } else if level == 0 && !tail.is_empty() {
                            let closed = !last;
                            let overdue = tail
                                .iter()
                                .map(|m| m.created_at)
                                .max()
                                .is_some_and(|t| t < tail_cutoff);
                            if (closed || tail.len() >= policy.min_chunk || overdue)
                                && open_calls(tail).is_empty()
                            {
                                match cut.pop() {
                                    // A tiny tail joins the chunk before it, in its session.
                                    Some(last) if tail.len() < policy.min_chunk => {
                                        let from = part.len() - tail.len() - last.len();
                                        cut.push(&part[from..]);
                                    }
                                    last => {
                                        cut.extend(last);
                                        cut.push(tail);
                                    }
                                }
                            } else {
                                report.deferred_tails += 1;
                            }
                        }
                        chunks.extend(cut);
                    }
                    for c in chunks {
                        if policy
                            .stop
                            .as_ref()
                            .is_some_and(|s| s.load(Ordering::SeqCst))
                        {
                            report.cancelled = true;
                            break 'levels;
                        }
                        let failed_before = report.failures.len();
                        self.summarize_chunk(
                            c,
                            level,
                            thread.clone(),
                            thread_stats.clone(),
                            &policy,
                            &mut report,
                        )
                        .await?;
                        if report.failures.len() > failed_before {
                            incomplete.insert((level + 1, thread.clone()));
                        }
                    }
                    // The next page, while this one made progress without failures (failed
                    // chunks wait for the next pass rather than being retried in this one).
                    if !more
                        || report.chunks() == written_before
                        || report.failures.len() > failed_before_page
                    {
                        break;
                    }
                }
            }
        }
        report.elapsed = started.elapsed();
        Ok(report)
    }

    async fn summarize_chunk(
        &self,
        chunk: &[MemoryUnit],
        level: u32,
        thread: Option<ThreadId>,
        stats: Option<Arc<TermStats>>,
        policy: &ConsolidationPolicy,
        report: &mut ConsolidationReport,
    ) -> Result<()> {
        let request = SummaryRequest {
            previous: None,
            items: summary_items(chunk),
            max_tokens: policy.summary_tokens,
            level: level + 1,
            term_stats: stats.clone(),
        };
        let ids: Vec<MemoryId> = chunk.iter().map(|m| m.id).collect();
        let fail = |reason: String| ChunkFailure {
            level: level + 1,
            thread: thread.clone(),
            memory_ids: ids.clone(),
            reason,
        };
        let t = Instant::now();
        let outcome = checked_summary(
            self.inner.summarizer.as_ref(),
            &request,
            policy.timeout,
            self.inner.token_counter.as_ref(),
        )
        .await;
        report.summarizer_time += t.elapsed();
        let text = match outcome {
            Ok(text) => text,
            Err(e) => {
                tracing::warn!(level, error = %e, "chunk left for the next pass");
                report.failures.push(fail(e.to_string()));
                return Ok(());
            }
        };
        let mut metadata = cairn_core::Metadata::new();
        metadata.insert(
            CONSOLIDATION_KEY.into(),
            serde_json::json!({ "summarizer": self.inner.summarizer.name() }),
        );
        let keywords = summary_keywords(&text, stats.as_deref().unwrap_or(&TermStats::new()), 8);
        metadata.insert("keywords".into(), keywords.into());
        let summary = NewSummary {
            id: None,
            content: text,
            source_ids: ids.clone(),
            thread_id: thread.clone(),
            summary_type: if level == 0 {
                SummaryType::Conversation
            } else {
                SummaryType::Rollup
            },
            metadata,
            created_at: chunk.iter().map(|m| m.created_at).max(),
        };
        match self.add_summary_blended(summary).await {
            Ok(unit) => {
                *report.chunks_per_level.entry(level + 1).or_default() += 1;
                report.memories_covered += chunk.len();
                report.summaries.push(unit.id);
                Ok(())
            }
            // A source deleted meanwhile: the chunk is retried next pass.
            Err(HarnessError::NotFound { id }) => {
                report
                    .failures
                    .push(fail(format!("source {id} was deleted during the pass")));
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

impl MemoryHarness {
    /// Re-summarizes one stale (or any) summary from its current sources with the harness's
    /// summarizer and the default consolidation budget and timeout, clears its stale flag
    /// and marks the summaries above it stale (`consolidate` refreshes those in turn).
    /// `NotASummary` for a memory that is not one; a summarizer failure is an error and
    /// changes nothing.
    pub async fn refresh_summary(&self, id: MemoryId) -> Result<MemoryUnit> {
        let unit = self.get(id).await?;
        if unit.kind != MemoryKind::Summary {
            return Err(cairn_store::StoreError::NotASummary { id }.into());
        }
        let policy = ConsolidationPolicy::older_than(Duration::ZERO);
        let stats = match &unit.thread_id {
            Some(t) => Some(self.thread_term_stats(t.clone(), None, &policy).await?),
            None => None,
        };
        self.resummarize(&unit, stats, &policy).await
    }

    /// Term statistics of a thread's raw memories (those before `cutoff` when given).
    async fn thread_term_stats(
        &self,
        thread: ThreadId,
        cutoff: Option<chrono::DateTime<chrono::Utc>>,
        policy: &ConsolidationPolicy,
    ) -> Result<Arc<TermStats>> {
        let mut f = Filter::all().levels(0, 0).thread(thread);
        f.before = cutoff;
        f.kinds = policy.kinds.clone();
        let inner = self.inner.clone();
        let texts = blocking(move || inner.store.texts(&f)).await??;
        Ok(Arc::new(term_stats(&texts)))
    }

    /// Refreshes the stale summaries of `thread` (thread-less ones for `None`), level by
    /// level: refreshing a summary marks the one above it stale, which the next level picks
    /// up. A summarizer failure is reported and leaves the summary stale for the next pass.
    async fn refresh_stale(
        &self,
        thread: Option<&ThreadId>,
        policy: &ConsolidationPolicy,
        report: &mut ConsolidationReport,
    ) -> Result<()> {
        let mut stats = None;
        let mut failed: HashSet<MemoryId> = HashSet::new();
        for level in 1..=policy.max_level {
            let mut f = Filter::all()
                .kinds([MemoryKind::Summary])
                .levels(level, level);
            f.thread = thread.cloned();
            f.thread_less = thread.is_none();
            let inner = self.inner.clone();
            // A level's stale summaries are read in pages; those that failed stay stale
            // for the next pass.
            loop {
                let inner = inner.clone();
                let f = f.clone();
                let skip = failed.len();
                let mut page =
                    blocking(move || inner.store.stale_summaries(&f, skip + 256)).await??;
                page.retain(|m| !failed.contains(&m.id));
                if page.is_empty() {
                    break;
                }
                for unit in page {
                    if stats.is_none() {
                        if let Some(t) = thread {
                            stats = Some(self.thread_term_stats(t.clone(), None, policy).await?);
                        }
                    }
                    let t = Instant::now();
                    let outcome = self.resummarize(&unit, stats.clone(), policy).await;
                    report.summarizer_time += t.elapsed();
                    match outcome {
                        Ok(fresh) => report.refreshed.push(fresh.id),
                        Err(HarnessError::Summarize(e)) => {
                            failed.insert(unit.id);
                            report.failures.push(ChunkFailure {
                                level: unit.level,
                                thread: unit.thread_id.clone(),
                                memory_ids: vec![unit.id],
                                reason: format!("refreshing a stale summary: {e}"),
                            });
                        }
                        // Deleted meanwhile (a forget, a delete that took its last
                        // source): nothing left to refresh.
                        Err(HarnessError::NotFound { .. }) => {
                            failed.insert(unit.id);
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes a new text for `unit` from its current sources (see [`Self::refresh_summary`]).
    ///
    /// Its sources may change while the summarizer runs (a forget or a delete detaches one,
    /// a late arrival is placed): a text written from sources that are no longer the
    /// summary's could quote a memory forgotten meanwhile, over the forget's own rewrite.
    /// So the sources are read again after the write, and the summary written again from
    /// them until they held still (a source gone before the write is the same case). What
    /// such a text left in the cache and the sentence memo is purged.
    async fn resummarize(
        &self,
        unit: &MemoryUnit,
        stats: Option<Arc<TermStats>>,
        policy: &ConsolidationPolicy,
    ) -> Result<MemoryUnit> {
        let id = unit.id;
        let mut old = unit.content.clone();
        let mut metadata = unit.metadata.clone();
        let level = unit.level.max(1);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let inner = self.inner.clone();
            let sources = blocking(move || inner.store.sources(id)).await??;
            let request = SummaryRequest {
                previous: None,
                items: summary_items(&sources),
                max_tokens: policy.summary_tokens,
                level,
                term_stats: stats.clone(),
            };
            let text = checked_summary(
                self.inner.summarizer.as_ref(),
                &request,
                policy.timeout,
                self.inner.token_counter.as_ref(),
            )
            .await?;
            metadata.insert(
                CONSOLIDATION_KEY.into(),
                serde_json::json!({ "summarizer": self.inner.summarizer.name() }),
            );
            let keywords =
                summary_keywords(&text, stats.as_deref().unwrap_or(&TermStats::new()), 8);
            metadata.insert("keywords".into(), keywords.into());
            let source_ids: Vec<MemoryId> = sources.iter().map(|m| m.id).collect();
            let inner = self.inner.clone();
            let (written, meta) = (old.clone(), metadata.clone());
            // The last try's write stands, checked or not.
            let last = attempt >= REWRITE_ATTEMPTS;
            let outcome = blocking(move || -> Result<Rewrite> {
                let v = match blended_vector(&inner, &text, &source_ids) {
                    Ok(v) => v,
                    // A source deleted since it was read: the text may quote it.
                    Err(e @ HarnessError::NotFound { .. }) => {
                        crate::harness::purge_cached(&inner, &[text]);
                        if last {
                            return Err(e);
                        }
                        return Ok(Rewrite::Moved(None));
                    }
                    Err(e) => return Err(e),
                };
                let unit = inner.store.refresh_summary(id, text, Some(meta), v)?;
                // The text replaced (which may quote a source forgotten since) leaves the cache.
                crate::harness::purge_replaced(&inner, &written, &unit.content);
                let now: Vec<MemoryId> = inner.store.sources(id)?.iter().map(|m| m.id).collect();
                if now == source_ids {
                    Ok(Rewrite::Done(Box::new(unit)))
                } else if last {
                    tracing::warn!(%id, "a summary's sources kept changing while it was written; it stays written from what it held last");
                    Ok(Rewrite::Done(Box::new(unit)))
                } else {
                    // Written from sources it no longer has: what the text quoted of a
                    // source gone goes from the memo too (it may hold sentences of it
                    // the text left out).
                    crate::harness::purge_cached(&inner, std::slice::from_ref(&unit.content));
                    Ok(Rewrite::Moved(Some(unit.content)))
                }
            })
            .await??;
            match outcome {
                Rewrite::Done(unit) => return Ok(*unit),
                Rewrite::Moved(written) => {
                    if let Some(w) = written {
                        old = w;
                    }
                }
            }
        }
    }

    /// Writes a consolidation summary with a vector that stands for both what it says and
    /// what it covers: the mean of its text's embedding and its sources' centroid (each
    /// unit length). An extractive summary keeps a quarter of its sources' words; the
    /// centroid keeps the rest findable, so a search over summaries reaches the session that
    /// talked about a thing even when the summary left that sentence out.
    async fn add_summary_blended(&self, summary: NewSummary) -> Result<MemoryUnit> {
        let inner = self.inner.clone();
        blocking(move || -> Result<MemoryUnit> {
            let text = summary.content.clone();
            let written = blended_vector(&inner, &summary.content, &summary.source_ids)
                .and_then(|v| Ok(inner.store.add_summary(summary, v)?));
            if let Err(HarnessError::NotFound { .. }) = &written {
                // A source deleted since the chunk was read (a forget, say): the text, which
                // may quote it, leaves the cache, and what the summarizer embedded of it the
                // sentence memo.
                crate::harness::purge_cached(&inner, &[text]);
            }
            written
        })
        .await?
    }
}

/// What one write of [`MemoryHarness::resummarize`] came to.
enum Rewrite {
    /// Written from the sources the summary still has.
    Done(Box<MemoryUnit>),
    /// Its sources changed meanwhile: written again (with the text written, if any).
    Moved(Option<String>),
}

/// How often [`MemoryHarness::resummarize`] writes a summary whose sources keep changing
/// (the last write stands, logged).
const REWRITE_ATTEMPTS: u32 = 4;

/// The mean of `text`'s embedding and the centroid of `sources`' embeddings (each unit
/// length): a summary's vector (see `add_summary_blended`).
fn blended_vector(
    inner: &crate::harness::Inner,
    text: &str,
    sources: &[MemoryId],
) -> Result<Vec<f32>> {
    let text = inner.embedder.embed_one(text)?;
    let mut centroid = vec![0f32; text.len()];
    for id in sources {
        let v = inner.store.embedding(*id)?;
        if v.len() != centroid.len() {
            return Err(cairn_core::InputError::DimensionMismatch {
                expected: centroid.len(),
                got: v.len(),
            }
            .into());
        }
        for (c, x) in centroid.iter_mut().zip(&v) {
            *c += x;
        }
    }
    Ok(match cairn_core::normalized(centroid) {
        Ok(c) => cairn_core::normalized(text.iter().zip(&c).map(|(a, b)| a + b).collect())
            .unwrap_or(text),
        Err(_) => text,
    })
}

/// Runs a summarizer with a timeout and checks what it returns: an empty text or one of more
/// than twice the request's token budget is an error (nothing is stored for it).
pub(crate) async fn checked_summary(
    summarizer: &dyn cairn_core::Summarizer,
    request: &SummaryRequest,
    timeout: Duration,
    counter: &dyn cairn_core::TokenCounter,
) -> std::result::Result<String, SummarizeError> {
    let text = match tokio::time::timeout(timeout, summarizer.summarize(request)).await {
        Err(_) => {
            return Err(SummarizeError::Timeout {
                seconds: timeout.as_secs_f64(),
            })
        }
        Ok(r) => r?,
    };
    if text.trim().is_empty() {
        return Err(SummarizeError::EmptyOutput);
    }
    let tokens = counter.count(&text);
    if tokens > request.max_tokens.saturating_mul(2) {
        return Err(SummarizeError::OverBudget {
            tokens,
            budget: request.max_tokens,
        });
    }
    Ok(text)
}
