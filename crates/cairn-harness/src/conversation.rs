//! Conversation memories that never lose a turn.
//!
//! * [`SummaryBufferMemory`] — LangChain's ConversationSummaryBufferMemory: recent turns
//!   verbatim up to `max_token_limit`, older ones pruned into a moving summary.
//! * [`RunningSummaryMemory`] — ConversationSummaryMemory's shape: everything summarized
//!   once the estimate passes the limit.
//! * [`AutoContextSummarizer`] — pipecat's automatic context summarization over an
//!   OpenAI-style message list.
//!
//! Unlike the originals, every turn is stored as a conversational memory of its thread, each
//! summary is stored as a summary memory linked to the turns it covers (so
//! `expand_to_leaves` recovers them), the state survives a restart, and a failed or slow
//! summarizer leaves every turn in place.
//!
//! # Moving summaries grow linearly
//!
//! Each fold writes a new version of the moving summary that cites the previous version
//! (a *continuation* link, first in link order) and the newly folded turns only, so a fold
//! writes as many links as it folds turns, however long the conversation. Expanding the
//! newest version through every level (`expand_to_leaves`, `Store::leaves`) reaches every
//! turn ever folded; its direct sources (`expand_summary`) are the previous version and the
//! turns of the last fold, and the link order down the chain is the folding history.
//!
//! A continuation link does not raise the level (`Store::add_continuation`): every version
//! stays at level 1 over turns. Were the ordinary rule (1 + the highest source level)
//! applied, the level would grow by one per fold (10,000 after 10,000 folds): consolidation
//! would take turns cited only by a level-k version as uncovered at level 1 and summarize
//! them again, the context's summary route (level-1 summaries) would see only the first
//! version, and levels would no longer tell a summary of turns from a roll-up of summaries.
//!
//! # State
//!
//! Each memory keeps a small state value per thread in the store (`Store::thread_state`,
//! named `conversation_memory:<kind>`), written in the same transaction as each new version:
//! the newest version, the sequence number (insertion order, `Store::sequenced`) up to which
//! every turn is folded or cleared, and the few turns at or below it that are still
//! unsummarized (normally none: saves insert and enqueue turns in one order, and a fold takes
//! the oldest). Opening reads that value, the newest version, those turns and the turns of
//! the thread inserted after the sequence number (`Store::thread_tail`, one index range): the
//! cost does not depend on the length of the thread. `clear` writes the state only; no
//! marker turn enters the thread, so recall and consolidation never see one. A store written
//! before this state existed is read the old way once (the whole thread, old clear-marker
//! turns honored) and its state written then.
//!
//! # Locks
//!
//! The summarizer runs with no lock that reads take: `load_memory_variables`, `stats` and
//! the other readers answer while a summary is being written. Saves order their inserts
//! under a short write lock (never held across a summarizer call either); one fold runs at a
//! time, and a save that finds a fold running leaves the folding to it and to later saves.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use cairn_core::{
    MemoryId, MemoryKind, MemoryUnit, NewMemory, Role, SummarizeError, SummaryItem, SummaryRequest,
    SummaryType, ThreadId,
};
use cairn_store::{Filter, NewSummary, StoreError, ThreadState};

use crate::harness::blocking;
use crate::tokens::RunningTotal;
use crate::{HarnessError, MemoryHarness, Result};

/// Metadata key marking summaries written by these memories (and, in stores written before
/// the state table, their clear-marker turns); also the prefix of their state names.
const MARK: &str = "conversation_memory";

#[derive(Debug, Clone)]
struct Turn {
    id: MemoryId,
    /// Insertion order in the store.
    seq: u64,
    role: Role,
    content: String,
    created_at: chrono::DateTime<chrono::Utc>,
}

impl Turn {
    fn from_unit(m: &MemoryUnit, seq: u64) -> Self {
        Self {
            id: m.id,
            seq,
            role: m.role.unwrap_or(Role::User),
            content: m.content.clone(),
            created_at: m.created_at,
        }
    }

    fn item(&self) -> SummaryItem {
        SummaryItem {
            kind: MemoryKind::Conversational,
            role: Some(self.role),
            speaker: None,
            created_at: self.created_at,
            time_start: None,
            content: self.content.clone(),
        }
    }
}

/// The newest version of a moving summary.
#[derive(Debug, Clone)]
struct Moving {
    id: MemoryId,
    text: String,
}

/// The state value a memory keeps per thread in the store.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Persisted {
    /// The newest version of the moving summary.
    #[serde(default)]
    summary: Option<MemoryId>,
    /// Every turn with a sequence number up to this one is folded or cleared, except `also`.
    #[serde(default)]
    after: u64,
    /// Turns up to this sequence number were cleared (what opening falls back to when the
    /// summary has been deleted: the turns it covered come back unsummarized).
    #[serde(default)]
    cleared: u64,
    /// Unsummarized turns at or below `after`.
    #[serde(default)]
    also: Vec<MemoryId>,
}

fn state_name(kind: &str) -> String {
    format!("{MARK}:{kind}")
}

fn state_write(thread: &ThreadId, kind: &str, p: &Persisted) -> Result<ThreadState> {
    Ok(ThreadState {
        thread: thread.clone(),
        name: state_name(kind),
        value: serde_json::to_string(p)
            .map_err(|e| HarnessError::Config(format!("state cannot be serialized: {e}")))?,
    })
}

/// What opening a memory found.
struct Restored {
    moving: Option<Moving>,
    /// Unsummarized turns, in insertion order.
    turns: Vec<Turn>,
    persisted: Persisted,
}

/// Loads the state of memory `kind` of `thread`: its value in the store, the newest
/// version, and the unsummarized turns (those listed and those inserted after it).
async fn restore(harness: &MemoryHarness, thread: &ThreadId, kind: &str) -> Result<Restored> {
    let h = harness.clone();
    let (t, name) = (thread.clone(), state_name(kind));
    let Some(value) = blocking(move || h.store().thread_state(&t, &name)).await?? else {
        return restore_legacy(harness, thread, kind).await;
    };
    let persisted: Persisted = serde_json::from_str(&value).map_err(|e| {
        HarnessError::Config(format!(
            "the stored state {} of thread {thread} is invalid: {e}",
            state_name(kind)
        ))
    })?;
    let h = harness.clone();
    let t = thread.clone();
    let p = persisted.clone();
    let (moving, turns) = blocking(move || -> Result<(Option<Moving>, Vec<Turn>)> {
        let store = h.store();
        let moving = match p.summary {
            None => None,
            Some(id) => match store.get(id) {
                Ok(u) => Some(Moving {
                    id,
                    text: u.content,
                }),
                // Deleted (say by a cascade from one of its turns): the turns it covered
                // come back unsummarized, nothing is lost.
                Err(StoreError::NotFound { .. }) => None,
                Err(e) => return Err(e.into()),
            },
        };
        let (after, also) = if moving.is_some() || p.summary.is_none() {
            (p.after, p.also.clone())
        } else {
            (p.cleared, Vec::new())
        };
        let mut turns = Vec::new();
        for id in also {
            match store.sequenced(&[id]) {
                Ok(mut v) => {
                    if let Some((u, seq)) = v.pop() {
                        turns.push(Turn::from_unit(&u, seq));
                    }
                }
                Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        for (u, seq) in store.thread_tail(&t, MemoryKind::Conversational, after)? {
            turns.push(Turn::from_unit(&u, seq));
        }
        turns.sort_by_key(|t| t.seq);
        Ok((moving, turns))
    })
    .await??;
    Ok(Restored {
        moving,
        turns,
        persisted,
    })
}

/// Reads a store written before the state value: the whole thread, clear-marker turns
/// honored (turns up to the newest marker are cleared), the newest summary after the marker
/// as the moving summary. Writes the state value, so this happens once per thread.
async fn restore_legacy(
    harness: &MemoryHarness,
    thread: &ThreadId,
    kind: &str,
) -> Result<Restored> {
    let all = harness
        .list(Filter::all().thread(thread.clone()), 0, usize::MAX)
        .await?;
    let marker = |m: &MemoryUnit, what: &str| {
        m.metadata
            .get(MARK)
            .and_then(|v| v.as_str())
            .is_some_and(|v| v == format!("{kind}:{what}"))
    };
    let last_marker = all
        .iter()
        .filter(|m| marker(m, "clear"))
        .max_by_key(|m| m.created_at);
    let cleared_at = last_marker.map(|m| m.created_at);
    let after_clear = |m: &&MemoryUnit| cleared_at.is_none_or(|c| m.created_at > c);
    let newest = all
        .iter()
        .filter(after_clear)
        .filter(|m| m.kind == MemoryKind::Summary && marker(m, "summary"))
        .max_by_key(|m| (m.created_at, m.id));
    let covered: Vec<MemoryId> = newest
        .and_then(|m| m.summary.as_ref())
        .map(|s| s.source_ids.clone())
        .unwrap_or_default();
    let covered_set: std::collections::HashSet<MemoryId> = covered.iter().copied().collect();
    let pending: Vec<MemoryId> = all
        .iter()
        .filter(after_clear)
        .filter(|m| m.kind == MemoryKind::Conversational && !marker(m, "clear"))
        .filter(|m| !covered_set.contains(&m.id))
        .map(|m| m.id)
        .collect();
    let moving = newest.map(|m| Moving {
        id: m.id,
        text: m.content.clone(),
    });
    let h = harness.clone();
    let marker_id = last_marker.map(|m| m.id);
    let (turns, cleared, covered_max) = blocking(move || -> Result<(Vec<Turn>, u64, u64)> {
        let store = h.store();
        let mut turns: Vec<Turn> = store
            .sequenced(&pending)?
            .iter()
            .map(|(u, seq)| Turn::from_unit(u, *seq))
            .collect();
        turns.sort_by_key(|t| t.seq);
        let cleared = match marker_id {
            Some(id) => store.sequenced(&[id])?.first().map_or(0, |(_, s)| *s),
            None => 0,
        };
        let covered_max = store
            .sequenced(&covered)?
            .iter()
            .map(|(_, s)| *s)
            .max()
            .unwrap_or(0);
        Ok((turns, cleared, covered_max))
    })
    .await??;
    let after = cleared.max(covered_max);
    let persisted = Persisted {
        summary: moving.as_ref().map(|m| m.id),
        after,
        cleared,
        also: turns
            .iter()
            .filter(|t| t.seq <= after)
            .map(|t| t.id)
            .collect(),
    };
    let write = state_write(thread, kind, &persisted)?;
    let h = harness.clone();
    blocking(move || h.store().set_thread_state(write)).await??;
    Ok(Restored {
        moving,
        turns,
        persisted,
    })
}

/// Counters of a conversation memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConversationStats {
    /// Which memory.
    pub kind: String,
    /// Whether a summary exists.
    pub has_summary: bool,
    /// Characters in the summary.
    pub summary_length: usize,
    /// Turns kept verbatim.
    pub recent_message_count: usize,
    /// Tokens of the verbatim turns (running total).
    pub estimated_tokens: usize,
    /// The limit.
    pub token_limit: usize,
    /// Summaries written.
    pub summaries_written: u64,
    /// Summarizer failures (turns were kept).
    pub summarizer_failures: u64,
    /// The last failure.
    pub last_error: Option<String>,
}

/// What `load_memory_variables` returns: either one string or a message list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MemoryValue {
    /// `Human: ...\nAI: ...` text.
    Text(String),
    /// Messages (`role`, `content`).
    Messages(Vec<crate::ChatMessage>),
}

/// LangChain-style options of [`SummaryBufferMemory`].
#[derive(Debug, Clone)]
pub struct SummaryBufferOptions {
    /// Tokens of verbatim turns kept before the oldest are summarized. Default 2000.
    pub max_token_limit: usize,
    /// The variable name. Default "history".
    pub memory_key: String,
    /// Default "Human".
    pub human_prefix: String,
    /// Default "AI".
    pub ai_prefix: String,
    /// Messages instead of a string. Default false.
    pub return_messages: bool,
    /// Summarizer timeout. Default 120 s.
    pub timeout: Duration,
}

impl Default for SummaryBufferOptions {
    fn default() -> Self {
        Self {
            max_token_limit: 2000,
            memory_key: "history".into(),
            human_prefix: "Human".into(),
            ai_prefix: "AI".into(),
            return_messages: false,
            timeout: Duration::from_secs(120),
        }
    }
}

/// What both moving-summary memories keep: the turns not yet summarized (with their
/// token counts and a running total), the moving summary, and the summarizer's record.
struct MovingState {
    turns: VecDeque<(Turn, usize)>,
    totals: RunningTotal,
    moving: Option<Moving>,
    /// Every turn up to this sequence number is folded or cleared (or still in `turns`).
    after: u64,
    /// The sequence number of the last clear.
    cleared: u64,
    /// Bumped by `clear`: a fold that started before it writes nothing.
    epoch: u64,
    last_error: Option<String>,
    written: u64,
    failures: u64,
}

impl MovingState {
    fn push(&mut self, turn: Turn, harness: &MemoryHarness) {
        let n = harness.token_counter().count_message(&turn.content);
        self.totals.push(n);
        self.turns.push_back((turn, n));
    }

    fn stats(&self, kind: &str, token_limit: usize) -> ConversationStats {
        ConversationStats {
            kind: kind.into(),
            has_summary: self.moving.is_some(),
            summary_length: self.moving.as_ref().map_or(0, |m| m.text.chars().count()),
            recent_message_count: self.turns.len(),
            estimated_tokens: self.totals.total(),
            token_limit,
            summaries_written: self.written,
            summarizer_failures: self.failures,
            last_error: self.last_error.clone(),
        }
    }
}

/// What both moving-summary memories share: the store, the state and its locks.
struct Core {
    harness: MemoryHarness,
    thread: ThreadId,
    kind: &'static str,
    /// Orders writes: a save inserts its turns and enqueues them under it (so the queue is in
    /// insertion order), `clear` and the write of a new version take it too. Never held
    /// across a summarizer call.
    writes: Mutex<()>,
    /// What readers read; held only to read or change it, never across a store or
    /// summarizer call.
    state: Mutex<MovingState>,
    /// One fold at a time. Held across the summarizer call, but only folds take it.
    folding: Mutex<()>,
}

impl Core {
    /// Restores the state of memory `kind` of `thread` from the store.
    async fn open(harness: MemoryHarness, thread: ThreadId, kind: &'static str) -> Result<Self> {
        let r = restore(&harness, &thread, kind).await?;
        let mut state = MovingState {
            turns: VecDeque::new(),
            totals: RunningTotal::default(),
            moving: r.moving,
            after: r.persisted.after,
            cleared: r.persisted.cleared,
            epoch: 0,
            last_error: None,
            written: 0,
            failures: 0,
        };
        for t in r.turns {
            state.push(t, &harness);
        }
        Ok(Self {
            harness,
            thread,
            kind,
            writes: Mutex::new(()),
            state: Mutex::new(state),
            folding: Mutex::new(()),
        })
    }

    /// Stores turns and enqueues them, in one order.
    async fn save(&self, turns: Vec<NewMemory>) -> Result<Vec<MemoryId>> {
        let _order = self.writes.lock().await;
        let ids = self.harness.add_many(turns).await?;
        let h = self.harness.clone();
        let q = ids.clone();
        let stored = blocking(move || h.store().sequenced(&q)).await??;
        let mut st = self.state.lock().await;
        for (u, seq) in &stored {
            st.push(Turn::from_unit(u, *seq), &self.harness);
        }
        Ok(ids)
    }

    /// Folds the oldest `take(state)` turns into a new version of the moving summary of
    /// `max_tokens`. With `wait`, waits for a fold already running; without, leaves the
    /// folding to it. On success the turns leave the queue; on failure they stay and the
    /// failure is recorded. Returns whether a version was written.
    async fn fold(
        &self,
        take: impl FnOnce(&MovingState) -> usize,
        max_tokens: usize,
        timeout: Duration,
        wait: bool,
    ) -> Result<bool> {
        let _one = if wait {
            self.folding.lock().await
        } else {
            match self.folding.try_lock() {
                Ok(g) => g,
                Err(_) => return Ok(false),
            }
        };
        let (turns, request, epoch) = {
            let st = self.state.lock().await;
            let n = take(&st);
            let turns: Vec<Turn> = st.turns.iter().take(n).map(|(t, _)| t.clone()).collect();
            if turns.is_empty() {
                return Ok(false);
            }
            let request = SummaryRequest {
                previous: st.moving.as_ref().map(|m| m.text.clone()),
                items: turns.iter().map(Turn::item).collect(),
                max_tokens,
                ..Default::default()
            };
            (turns, request, st.epoch)
        };
        // No lock that readers or saves take is held from here to the write.
        let text = match summarize(&self.harness, &request, timeout).await {
            Ok(text) => text,
            Err(e) => {
                tracing::warn!(memory = self.kind, error = %e, "summarizer failed; turns kept");
                let mut st = self.state.lock().await;
                st.last_error = Some(e.to_string());
                st.failures += 1;
                return Ok(false);
            }
        };
        let vector = self
            .harness
            .embed(vec![text.clone()])
            .await?
            .pop()
            .ok_or_else(|| HarnessError::Config("the embedder returned no vector".into()))?;
        let id = MemoryId::new();
        let _order = self.writes.lock().await;
        let (previous, persisted) = {
            let st = self.state.lock().await;
            if st.epoch != epoch {
                // Cleared while the summary was being written.
                return Ok(false);
            }
            let after = turns.iter().map(|t| t.seq).fold(st.after, u64::max);
            let also = st
                .turns
                .iter()
                .skip(turns.len())
                .filter(|(t, _)| t.seq <= after)
                .map(|(t, _)| t.id)
                .collect();
            let previous = st.moving.as_ref().map(|m| m.id);
            (
                previous,
                Persisted {
                    summary: Some(id),
                    after,
                    cleared: st.cleared,
                    also,
                },
            )
        };
        let mut metadata = cairn_core::Metadata::new();
        metadata.insert(MARK.into(), format!("{}:summary", self.kind).into());
        let summary = NewSummary {
            id: Some(id),
            content: text.clone(),
            source_ids: turns.iter().map(|t| t.id).collect(),
            thread_id: Some(self.thread.clone()),
            summary_type: SummaryType::Conversation,
            metadata,
            created_at: None,
        };
        let write = state_write(&self.thread, self.kind, &persisted)?;
        let h = self.harness.clone();
        blocking(move || {
            h.store()
                .add_continuation(summary, previous, Some(write), vector)
        })
        .await??;
        let mut st = self.state.lock().await;
        for _ in 0..turns.len() {
            st.turns.pop_front();
            st.totals.pop_front();
        }
        st.moving = Some(Moving { id, text });
        st.after = persisted.after;
        st.last_error = None;
        st.written += 1;
        Ok(true)
    }

    /// Empties the queue and the moving summary; the state in the store says so too.
    async fn clear(&self) -> Result<()> {
        let _order = self.writes.lock().await;
        let h = self.harness.clone();
        let last = blocking(move || h.store().last_sequence()).await??;
        let persisted = Persisted {
            summary: None,
            after: last,
            cleared: last,
            also: Vec::new(),
        };
        let write = state_write(&self.thread, self.kind, &persisted)?;
        let h = self.harness.clone();
        blocking(move || h.store().set_thread_state(write)).await??;
        let mut st = self.state.lock().await;
        st.turns.clear();
        st.totals.clear();
        st.moving = None;
        st.after = last;
        st.cleared = last;
        st.epoch += 1;
        Ok(())
    }
}

/// ConversationSummaryBufferMemory, backed by the store.
pub struct SummaryBufferMemory {
    core: Core,
    options: SummaryBufferOptions,
}

const BUFFER: &str = "summary_buffer";

impl SummaryBufferMemory {
    /// Opens the memory of `thread`, restoring its buffer and moving summary from the store.
    pub async fn open(
        harness: MemoryHarness,
        thread_id: &str,
        options: SummaryBufferOptions,
    ) -> Result<Self> {
        if options.max_token_limit == 0 {
            return Err(HarnessError::Config(
                "max_token_limit must be at least 1".into(),
            ));
        }
        let thread = ThreadId::new(thread_id)?;
        Ok(Self {
            core: Core::open(harness, thread, BUFFER).await?,
            options,
        })
    }

    /// Stores one exchange (the human input and the AI output), then prunes the oldest turns
    /// into the moving summary while the buffer is over the limit. A summarizer failure keeps
    /// the turns in the buffer (over the limit) and is retried on the next save; so is a save
    /// that finds a fold of another save still running.
    pub async fn save_context(&self, input: &str, output: &str) -> Result<()> {
        let thread = &self.core.thread;
        self.core
            .save(vec![
                NewMemory::conversational(thread.clone(), Role::User, input),
                NewMemory::conversational(thread.clone(), Role::Assistant, output),
            ])
            .await?;
        let limit = self.options.max_token_limit;
        // The oldest turns whose removal brings the buffer under the limit.
        let take = |st: &MovingState| {
            let mut take = 0;
            let mut remaining = st.totals.total();
            for (_, n) in &st.turns {
                if remaining <= limit {
                    break;
                }
                remaining -= n;
                take += 1;
            }
            take
        };
        self.core
            .fold(take, (limit / 2).max(64), self.options.timeout, false)
            .await?;
        Ok(())
    }

    /// The memory variables: `{memory_key: history}`, the moving summary first.
    pub async fn load_memory_variables(&self) -> HashMap<String, MemoryValue> {
        let st = self.core.state.lock().await;
        let value = if self.options.return_messages {
            let mut msgs = Vec::new();
            if let Some(m) = &st.moving {
                msgs.push(crate::ChatMessage {
                    role: "system".into(),
                    content: m.text.clone(),
                });
            }
            for (t, _) in &st.turns {
                msgs.push(crate::ChatMessage {
                    role: t.role.as_str().into(),
                    content: t.content.clone(),
                });
            }
            MemoryValue::Messages(msgs)
        } else {
            let mut lines = Vec::new();
            if let Some(m) = &st.moving {
                lines.push(format!("System: {}", m.text));
            }
            for (t, _) in &st.turns {
                let p = match t.role {
                    Role::User => &self.options.human_prefix,
                    Role::Assistant => &self.options.ai_prefix,
                    _ => "System",
                };
                lines.push(format!("{p}: {}", t.content));
            }
            MemoryValue::Text(lines.join("\n"))
        };
        HashMap::from([(self.options.memory_key.clone(), value)])
    }

    /// The newest version of the moving summary, if any.
    pub async fn moving_summary(&self) -> Option<(MemoryId, String)> {
        self.core
            .state
            .lock()
            .await
            .moving
            .as_ref()
            .map(|m| (m.id, m.text.clone()))
    }

    /// Empties the buffer and the moving summary. The stored turns and summaries stay in
    /// the store (nothing is deleted); the memory's state in the store makes a restart start
    /// empty too (no marker turn is written).
    pub async fn clear(&self) -> Result<()> {
        self.core.clear().await
    }

    /// Counters.
    pub async fn stats(&self) -> ConversationStats {
        self.core
            .state
            .lock()
            .await
            .stats(BUFFER, self.options.max_token_limit)
    }
}

async fn summarize(
    harness: &MemoryHarness,
    request: &SummaryRequest,
    timeout: Duration,
) -> std::result::Result<String, SummarizeError> {
    crate::consolidate::checked_summary(
        harness.summarizer().as_ref(),
        request,
        timeout,
        harness.token_counter().as_ref(),
    )
    .await
}

/// Options of [`RunningSummaryMemory`].
#[derive(Debug, Clone)]
pub struct RunningSummaryOptions {
    /// Estimated tokens of unsummarized messages that trigger a summary. Default 2000.
    pub token_limit: usize,
    /// How the summary is presented; must contain `{summary}`. Default
    /// `"Summary of the conversation so far: {summary}"`.
    pub template: String,
    /// Summarizer timeout. Default 120 s.
    pub timeout: Duration,
}

impl Default for RunningSummaryOptions {
    fn default() -> Self {
        Self {
            token_limit: 2000,
            template: "Summary of the conversation so far: {summary}".into(),
            timeout: Duration::from_secs(120),
        }
    }
}

/// The separator between the summary and the recent messages.
pub const SUMMARY_SEPARATOR: &str = "\n\n--- recent messages ---\n";

/// ConversationSummaryMemory's shape: once the estimated tokens pass the limit, every
/// unsummarized message is folded into the running summary. On failure every message is
/// kept (the original keeps only the last five).
pub struct RunningSummaryMemory {
    core: Core,
    options: RunningSummaryOptions,
}

const RUNNING: &str = "running_summary";

impl RunningSummaryMemory {
    /// Opens the memory of `thread`, restoring it from the store. The template must contain
    /// `{summary}` and no other placeholder.
    pub async fn open(
        harness: MemoryHarness,
        thread_id: &str,
        options: RunningSummaryOptions,
    ) -> Result<Self> {
        crate::openai::check_placeholders(&options.template, &["{summary}"])?;
        if options.token_limit == 0 {
            return Err(HarnessError::Config(
                "token_limit must be at least 1".into(),
            ));
        }
        let thread = ThreadId::new(thread_id)?;
        Ok(Self {
            core: Core::open(harness, thread, RUNNING).await?,
            options,
        })
    }

    /// Stores a message; summarizes when the estimate passes the limit (unless a fold is
    /// already running: then the next message or `force_summarize` folds the rest).
    pub async fn add_message(&self, role: Role, content: &str) -> Result<MemoryId> {
        let m = NewMemory::conversational(self.core.thread.clone(), role, content);
        let id = self
            .core
            .save(vec![m])
            .await?
            .pop()
            .ok_or_else(|| HarnessError::Config("the store returned no id".into()))?;
        let over = self.core.state.lock().await.totals.total() > self.options.token_limit;
        if over {
            self.fold_all(false).await?;
        }
        Ok(id)
    }

    /// Summarizes every unsummarized message now (after a fold already running, if any).
    /// Returns whether a summary was written.
    pub async fn force_summarize(&self) -> Result<bool> {
        self.fold_all(true).await
    }

    async fn fold_all(&self, wait: bool) -> Result<bool> {
        self.core
            .fold(
                |st| st.turns.len(),
                (self.options.token_limit / 2).max(64),
                self.options.timeout,
                wait,
            )
            .await
    }

    /// The running summary text, if any.
    pub async fn get_summary(&self) -> Option<String> {
        self.core
            .state
            .lock()
            .await
            .moving
            .as_ref()
            .map(|m| m.text.clone())
    }

    /// The summary (through the template) and the recent messages, joined by
    /// [`SUMMARY_SEPARATOR`].
    pub async fn load_memory_variables(&self) -> HashMap<String, String> {
        let st = self.core.state.lock().await;
        let recent: Vec<String> = st
            .turns
            .iter()
            .map(|(t, _)| format!("{}: {}", t.role.as_str(), t.content))
            .collect();
        let text = match &st.moving {
            Some(m) => format!(
                "{}{SUMMARY_SEPARATOR}{}",
                self.options.template.replace("{summary}", &m.text),
                recent.join("\n")
            ),
            None => recent.join("\n"),
        };
        HashMap::from([("history".to_owned(), text)])
    }

    /// Counters.
    pub async fn get_memory_stats(&self) -> ConversationStats {
        self.core
            .state
            .lock()
            .await
            .stats(RUNNING, self.options.token_limit)
    }

    /// Empties the memory (the store keeps everything; its state in the store makes a
    /// restart start empty; no marker turn is written).
    pub async fn clear(&self) -> Result<()> {
        self.core.clear().await
    }
}

/// A tool call made by an assistant message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id the result will name.
    pub id: String,
    /// The tool.
    pub name: String,
    /// Its arguments (JSON text).
    pub arguments: String,
}

/// An OpenAI-style message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextMessage {
    /// Who.
    pub role: Role,
    /// Text.
    pub content: String,
    /// Tool calls (assistant messages).
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// The call this message answers (tool messages).
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// The stored memory behind this message (set by [`AutoContextSummarizer::push`]).
    #[serde(default)]
    pub memory_id: Option<MemoryId>,
}

impl ContextMessage {
    /// A message without tool data.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            memory_id: None,
        }
    }
}

/// pipecat-style options of [`AutoContextSummarizer`].
#[derive(Clone)]
pub struct AutoContextOptions {
    /// Estimated tokens that trigger a summary. Default 8000.
    pub max_context_tokens: usize,
    /// Messages since the last summary that trigger one. Default 20.
    pub max_unsummarized_messages: usize,
    /// Newest messages always kept verbatim. Default 4.
    pub min_messages_after_summary: usize,
    /// How the summary enters the context; must contain `{summary}`. Default
    /// `"Conversation summary: {summary}"`.
    pub summary_message_template: String,
    /// After this the context is left untouched. Default 120 s.
    pub timeout: Duration,
    /// A tool result whose content equals this is still running. Default `"IN_PROGRESS"`.
    pub in_progress_marker: String,
    /// A summarizer of its own (default: the harness's).
    pub summarizer: Option<std::sync::Arc<dyn cairn_core::Summarizer>>,
}

impl Default for AutoContextOptions {
    fn default() -> Self {
        Self {
            max_context_tokens: 8000,
            max_unsummarized_messages: 20,
            min_messages_after_summary: 4,
            summary_message_template: "Conversation summary: {summary}".into(),
            timeout: Duration::from_secs(120),
            in_progress_marker: "IN_PROGRESS".into(),
            summarizer: None,
        }
    }
}

/// A summary being prepared for a context version.
#[derive(Debug, Clone)]
pub struct PendingSummary {
    version: u64,
    start: usize,
    end: usize,
    request: SummaryRequest,
}

/// A summary ready to be applied.
#[derive(Debug, Clone)]
pub struct CompletedSummary {
    pending: PendingSummary,
    text: String,
}

/// What [`AutoContextSummarizer::maybe_summarize`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SummarizeOutcome {
    /// No trigger fired, or nothing can be summarized yet (unresolved tool calls).
    NotNeeded,
    /// Messages were replaced by the summary (stored as `summary_id`).
    Summarized {
        /// The stored summary.
        summary_id: MemoryId,
        /// How many messages it replaced.
        replaced: usize,
    },
    /// The summarizer failed or timed out; the context is untouched.
    Failed(String),
    /// The context changed while the summary was made; the result was dropped.
    Outdated,
}

/// pipecat's automatic context summarization over a message list, backed by the store.
pub struct AutoContextSummarizer {
    harness: MemoryHarness,
    thread: ThreadId,
    options: AutoContextOptions,
    version: AtomicU64,
    since_summary: AtomicU64,
}

impl AutoContextSummarizer {
    /// A summarizer for the context of `thread`.
    pub fn new(
        harness: MemoryHarness,
        thread_id: &str,
        options: AutoContextOptions,
    ) -> Result<Self> {
        if !options.summary_message_template.contains("{summary}") {
            return Err(HarnessError::Config(
                "summary_message_template lacks {summary}".into(),
            ));
        }
        Ok(Self {
            harness,
            thread: ThreadId::new(thread_id)?,
            options,
            version: AtomicU64::new(0),
            since_summary: AtomicU64::new(0),
        })
    }

    /// The memory a message is stored as: a turn of the thread, tool data in its metadata.
    fn memory_of(&self, message: &ContextMessage) -> Result<NewMemory> {
        let mut m =
            NewMemory::conversational(self.thread.clone(), message.role, message.content.clone());
        if !message.tool_calls.is_empty() {
            m.metadata.insert(
                "tool_calls".into(),
                serde_json::to_value(&message.tool_calls).map_err(|e| {
                    HarnessError::Config(format!("tool calls cannot be serialized: {e}"))
                })?,
            );
        }
        if let Some(id) = &message.tool_call_id {
            m.metadata.insert("tool_call_id".into(), id.clone().into());
        }
        Ok(m)
    }

    /// Stores `message` (tool data in its metadata) and appends it to the context.
    pub async fn push(
        &self,
        messages: &mut Vec<ContextMessage>,
        mut message: ContextMessage,
    ) -> Result<MemoryId> {
        let m = self.memory_of(&message)?;
        let id = self.harness.add(m).await?;
        message.memory_id = Some(id);
        messages.push(message);
        self.version.fetch_add(1, Ordering::SeqCst);
        self.since_summary.fetch_add(1, Ordering::SeqCst);
        Ok(id)
    }

    /// Estimated tokens of the context.
    pub fn estimate(&self, messages: &[ContextMessage]) -> usize {
        let c = self.harness.token_counter();
        messages.iter().map(|m| c.count_message(&m.content)).sum()
    }

    /// Whether a trigger fired.
    pub fn should_summarize(&self, messages: &[ContextMessage]) -> bool {
        self.estimate(messages) > self.options.max_context_tokens
            || usize::try_from(self.since_summary.load(Ordering::SeqCst)).unwrap_or(usize::MAX)
                > self.options.max_unsummarized_messages
    }

    /// Chooses what to summarize: after the first system message, before the newest
    /// `min_messages_after_summary`, and never past an unresolved tool call.
    pub fn prepare(&self, messages: &[ContextMessage]) -> Option<PendingSummary> {
        let start = usize::from(messages.first().is_some_and(|m| m.role == Role::System));
        let mut end = messages
            .len()
            .saturating_sub(self.options.min_messages_after_summary);
        if end <= start {
            return None;
        }
        // Cut before the first call whose results are not all inside [start, end) and done.
        for i in start..end {
            let m = &messages[i];
            let unresolved = m.tool_calls.iter().any(|c| {
                !messages[i + 1..end].iter().any(|r| {
                    r.tool_call_id.as_deref() == Some(c.id.as_str())
                        && r.content.trim() != self.options.in_progress_marker
                })
            });
            let in_progress =
                m.tool_call_id.is_some() && m.content.trim() == self.options.in_progress_marker;
            if unresolved || in_progress {
                end = i;
                break;
            }
        }
        if end <= start {
            return None;
        }
        let region = &messages[start..end];
        let items = region
            .iter()
            .map(|m| SummaryItem {
                kind: MemoryKind::Conversational,
                role: Some(m.role),
                speaker: None,
                created_at: self.harness.clock().now(),
                time_start: None,
                content: if m.tool_calls.is_empty() {
                    m.content.clone()
                } else {
                    let names: Vec<&str> = m.tool_calls.iter().map(|c| c.name.as_str()).collect();
                    format!("{} [calls tools: {}]", m.content, names.join(", "))
                },
            })
            .collect();
        Some(PendingSummary {
            version: self.version.load(Ordering::SeqCst),
            start,
            end,
            request: SummaryRequest {
                previous: None,
                items,
                max_tokens: (self.options.max_context_tokens / 8).max(64),
                ..Default::default()
            },
        })
    }

    /// Runs the summarizer (with the timeout) for a prepared summary.
    pub async fn run(
        &self,
        pending: PendingSummary,
    ) -> std::result::Result<CompletedSummary, SummarizeError> {
        let summarizer = self
            .options
            .summarizer
            .clone()
            .unwrap_or_else(|| self.harness.summarizer().clone());
        let text = crate::consolidate::checked_summary(
            summarizer.as_ref(),
            &pending.request,
            self.options.timeout,
            self.harness.token_counter().as_ref(),
        )
        .await?;
        Ok(CompletedSummary { pending, text })
    }

    /// Applies a finished summary: stores it linked to the messages it replaces and puts it
    /// in their place. A replaced message that was never stored (put in the list directly,
    /// not through [`Self::push`]) is stored first, so the summary's sources hold every
    /// message it replaces and none is lost. Returns `Outdated` (and changes nothing) when
    /// the context changed since it was prepared.
    pub async fn apply(
        &self,
        messages: &mut Vec<ContextMessage>,
        done: CompletedSummary,
    ) -> Result<SummarizeOutcome> {
        let (start, end) = (done.pending.start, done.pending.end);
        if done.pending.version != self.version.load(Ordering::SeqCst)
            || end > messages.len()
            || start >= end
        {
            return Ok(SummarizeOutcome::Outdated);
        }
        let unstored: Vec<usize> = (start..end)
            .filter(|i| messages[*i].memory_id.is_none())
            .collect();
        if !unstored.is_empty() {
            let batch = unstored
                .iter()
                .map(|i| self.memory_of(&messages[*i]))
                .collect::<Result<Vec<_>>>()?;
            let ids = self.harness.add_many(batch).await?;
            for (i, id) in unstored.iter().zip(ids) {
                messages[*i].memory_id = Some(id);
            }
        }
        let mut seen = std::collections::HashSet::new();
        let source_ids: Vec<MemoryId> = messages[start..end]
            .iter()
            .filter_map(|m| m.memory_id)
            .filter(|id| seen.insert(*id))
            .collect();
        let mut metadata = cairn_core::Metadata::new();
        metadata.insert(MARK.into(), "auto_context:summary".into());
        let unit = self
            .harness
            .add_summary_with(NewSummary {
                id: None,
                content: done.text.clone(),
                source_ids,
                thread_id: Some(self.thread.clone()),
                summary_type: SummaryType::Conversation,
                metadata,
                created_at: None,
            })
            .await?;
        let mut msg = ContextMessage::new(
            Role::System,
            self.options
                .summary_message_template
                .replace("{summary}", &done.text),
        );
        msg.memory_id = Some(unit.id);
        let replaced = end - start;
        messages.splice(start..end, [msg]);
        self.version.fetch_add(1, Ordering::SeqCst);
        self.since_summary.store(0, Ordering::SeqCst);
        Ok(SummarizeOutcome::Summarized {
            summary_id: unit.id,
            replaced,
        })
    }

    /// Summarizes when a trigger fired: prepare, run, apply.
    pub async fn maybe_summarize(
        &self,
        messages: &mut Vec<ContextMessage>,
    ) -> Result<SummarizeOutcome> {
        if !self.should_summarize(messages) {
            return Ok(SummarizeOutcome::NotNeeded);
        }
        let Some(p) = self.prepare(messages) else {
            return Ok(SummarizeOutcome::NotNeeded);
        };
        match self.run(p).await {
            Ok(done) => self.apply(messages, done).await,
            Err(e) => Ok(SummarizeOutcome::Failed(e.to_string())),
        }
    }
}
