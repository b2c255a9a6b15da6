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
//! `expand_summary` recovers them), the state survives a restart, and a failed or slow
//! summarizer leaves every turn in place.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use cairn_core::{
    MemoryId, MemoryKind, MemoryUnit, NewMemory, Role, SummarizeError, SummaryItem, SummaryRequest,
    SummaryType, ThreadId,
};
use cairn_store::{Filter, NewSummary};

use crate::tokens::RunningTotal;
use crate::{HarnessError, MemoryHarness, Result};

/// Metadata key marking summaries and markers written by these memories.
const MARK: &str = "conversation_memory";

#[derive(Debug, Clone)]
struct Turn {
    id: MemoryId,
    role: Role,
    content: String,
    created_at: chrono::DateTime<chrono::Utc>,
}

impl Turn {
    fn from_unit(m: &MemoryUnit) -> Self {
        Self {
            id: m.id,
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

/// The persisted state of a moving summary: its memory and the turns it covers.
#[derive(Debug, Clone)]
struct Moving {
    id: MemoryId,
    text: String,
    covered: Vec<MemoryId>,
}

/// Loads the moving summary of `kind` (the newest after the last clear) and the turns it
/// does not cover.
async fn restore(
    harness: &MemoryHarness,
    thread: &ThreadId,
    kind: &str,
) -> Result<(Option<Moving>, Vec<Turn>)> {
    let all = harness
        .list(Filter::all().thread(thread.clone()), 0, usize::MAX)
        .await?;
    let marker = |m: &MemoryUnit, what: &str| {
        m.metadata
            .get(MARK)
            .and_then(|v| v.as_str())
            .is_some_and(|v| v == format!("{kind}:{what}"))
    };
    let cleared_at = all
        .iter()
        .filter(|m| marker(m, "clear"))
        .map(|m| m.created_at)
        .max();
    let after_clear = |m: &&MemoryUnit| cleared_at.is_none_or(|c| m.created_at > c);
    let moving = all
        .iter()
        .filter(after_clear)
        .filter(|m| m.kind == MemoryKind::Summary && marker(m, "summary"))
        .max_by_key(|m| (m.created_at, m.id))
        .map(|m| Moving {
            id: m.id,
            text: m.content.clone(),
            covered: m
                .summary
                .as_ref()
                .map(|s| s.source_ids.clone())
                .unwrap_or_default(),
        });
    let covered: std::collections::HashSet<MemoryId> = moving
        .iter()
        .flat_map(|m| m.covered.iter().copied())
        .collect();
    let turns = all
        .iter()
        .filter(after_clear)
        .filter(|m| m.kind == MemoryKind::Conversational && !marker(m, "clear"))
        .filter(|m| !covered.contains(&m.id))
        .map(Turn::from_unit)
        .collect();
    Ok((moving, turns))
}

async fn write_marker(harness: &MemoryHarness, thread: &ThreadId, kind: &str) -> Result<()> {
    let mut m = NewMemory::conversational(
        thread.clone(),
        Role::System,
        "[conversation memory cleared]",
    );
    m.metadata
        .insert(MARK.into(), format!("{kind}:clear").into());
    harness.add(m).await?;
    Ok(())
}

/// Writes a moving summary covering `previous.covered` + `turns`.
async fn write_moving(
    harness: &MemoryHarness,
    thread: &ThreadId,
    kind: &str,
    text: String,
    previous: Option<&Moving>,
    turns: &[Turn],
) -> Result<Moving> {
    let mut covered: Vec<MemoryId> = previous.map(|p| p.covered.clone()).unwrap_or_default();
    covered.extend(turns.iter().map(|t| t.id));
    let mut metadata = cairn_core::Metadata::new();
    metadata.insert(MARK.into(), format!("{kind}:summary").into());
    if let Some(p) = previous {
        metadata.insert("replaces".into(), p.id.to_string().into());
    }
    let unit = harness
        .add_summary_with(NewSummary {
            id: None,
            content: text.clone(),
            source_ids: covered.clone(),
            thread_id: Some(thread.clone()),
            summary_type: SummaryType::Conversation,
            metadata,
            created_at: None,
        })
        .await?;
    Ok(Moving {
        id: unit.id,
        text,
        covered,
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
    last_error: Option<String>,
    written: u64,
    failures: u64,
}

impl MovingState {
    /// Restores the state of memory `kind` of `thread` from the store.
    async fn restore(harness: &MemoryHarness, thread: &ThreadId, kind: &str) -> Result<Self> {
        let (moving, turns) = restore(harness, thread, kind).await?;
        let mut state = Self {
            turns: VecDeque::new(),
            totals: RunningTotal::default(),
            moving,
            last_error: None,
            written: 0,
            failures: 0,
        };
        for t in turns {
            state.push(t, harness);
        }
        Ok(state)
    }

    fn push(&mut self, turn: Turn, harness: &MemoryHarness) {
        let n = harness.token_counter().count_message(&turn.content);
        self.totals.push(n);
        self.turns.push_back((turn, n));
    }

    /// Folds the oldest `take` turns into a new moving summary of `max_tokens`. On success the
    /// turns leave the state; on failure they stay and the failure is recorded. Returns
    /// whether a summary was written.
    async fn fold(
        &mut self,
        harness: &MemoryHarness,
        thread: &ThreadId,
        kind: &str,
        take: usize,
        max_tokens: usize,
        timeout: Duration,
    ) -> Result<bool> {
        let turns: Vec<Turn> = self
            .turns
            .iter()
            .take(take)
            .map(|(t, _)| t.clone())
            .collect();
        if turns.is_empty() {
            return Ok(false);
        }
        let request = SummaryRequest {
            previous: self.moving.as_ref().map(|m| m.text.clone()),
            items: turns.iter().map(Turn::item).collect(),
            max_tokens,
            ..Default::default()
        };
        match summarize(harness, &request, timeout).await {
            Ok(text) => {
                let moving =
                    write_moving(harness, thread, kind, text, self.moving.as_ref(), &turns).await?;
                for _ in 0..turns.len() {
                    self.turns.pop_front();
                    self.totals.pop_front();
                }
                self.moving = Some(moving);
                self.last_error = None;
                self.written += 1;
                Ok(true)
            }
            Err(e) => {
                tracing::warn!(memory = kind, error = %e, "summarizer failed; turns kept");
                self.last_error = Some(e.to_string());
                self.failures += 1;
                Ok(false)
            }
        }
    }

    fn clear(&mut self) {
        self.turns.clear();
        self.totals.clear();
        self.moving = None;
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

/// ConversationSummaryBufferMemory, backed by the store.
pub struct SummaryBufferMemory {
    harness: MemoryHarness,
    thread: ThreadId,
    options: SummaryBufferOptions,
    state: Mutex<MovingState>,
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
        let state = MovingState::restore(&harness, &thread, BUFFER).await?;
        Ok(Self {
            harness,
            thread,
            options,
            state: Mutex::new(state),
        })
    }

    /// Stores one exchange (the human input and the AI output), then prunes the oldest turns
    /// into the moving summary while the buffer is over the limit. A summarizer failure keeps
    /// the turns in the buffer (over the limit) and is retried on the next save.
    pub async fn save_context(&self, input: &str, output: &str) -> Result<()> {
        let ids = self
            .harness
            .add_many(vec![
                NewMemory::conversational(self.thread.clone(), Role::User, input),
                NewMemory::conversational(self.thread.clone(), Role::Assistant, output),
            ])
            .await?;
        let mut stored = Vec::with_capacity(ids.len());
        for id in ids {
            stored.push(self.harness.get(id).await?);
        }
        let mut st = self.state.lock().await;
        for m in &stored {
            st.push(Turn::from_unit(m), &self.harness);
        }
        let limit = self.options.max_token_limit;
        if st.totals.total() <= limit {
            return Ok(());
        }
        // The oldest turns whose removal brings the buffer under the limit.
        let mut take = 0;
        let mut remaining = st.totals.total();
        for (_, n) in &st.turns {
            if remaining <= limit {
                break;
            }
            remaining -= n;
            take += 1;
        }
        st.fold(
            &self.harness,
            &self.thread,
            BUFFER,
            take,
            (limit / 2).max(64),
            self.options.timeout,
        )
        .await?;
        Ok(())
    }

    /// The memory variables: `{memory_key: history}`, the moving summary first.
    pub async fn load_memory_variables(&self) -> HashMap<String, MemoryValue> {
        let st = self.state.lock().await;
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

    /// The moving summary, if any.
    pub async fn moving_summary(&self) -> Option<(MemoryId, String)> {
        self.state
            .lock()
            .await
            .moving
            .as_ref()
            .map(|m| (m.id, m.text.clone()))
    }

    /// Empties the buffer and the moving summary. The stored turns and summaries stay in
    /// the store (nothing is deleted); a marker makes a restart start empty too.
    pub async fn clear(&self) -> Result<()> {
        write_marker(&self.harness, &self.thread, BUFFER).await?;
        self.state.lock().await.clear();
        Ok(())
    }

    /// Counters.
    pub async fn stats(&self) -> ConversationStats {
        self.state
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
    harness: MemoryHarness,
    thread: ThreadId,
    options: RunningSummaryOptions,
    state: Mutex<MovingState>,
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
        let state = MovingState::restore(&harness, &thread, RUNNING).await?;
        Ok(Self {
            harness,
            thread,
            options,
            state: Mutex::new(state),
        })
    }

    /// Stores a message; summarizes when the estimate passes the limit.
    pub async fn add_message(&self, role: Role, content: &str) -> Result<MemoryId> {
        let id = self
            .harness
            .add(NewMemory::conversational(
                self.thread.clone(),
                role,
                content,
            ))
            .await?;
        let m = self.harness.get(id).await?;
        let mut st = self.state.lock().await;
        st.push(Turn::from_unit(&m), &self.harness);
        if st.totals.total() > self.options.token_limit {
            self.fold_all(&mut st).await?;
        }
        Ok(id)
    }

    /// Summarizes every unsummarized message now. Returns whether a summary was written.
    pub async fn force_summarize(&self) -> Result<bool> {
        let mut st = self.state.lock().await;
        self.fold_all(&mut st).await
    }

    async fn fold_all(&self, st: &mut MovingState) -> Result<bool> {
        let all = st.turns.len();
        st.fold(
            &self.harness,
            &self.thread,
            RUNNING,
            all,
            (self.options.token_limit / 2).max(64),
            self.options.timeout,
        )
        .await
    }

    /// The running summary text, if any.
    pub async fn get_summary(&self) -> Option<String> {
        self.state
            .lock()
            .await
            .moving
            .as_ref()
            .map(|m| m.text.clone())
    }

    /// The summary (through the template) and the recent messages, joined by
    /// [`SUMMARY_SEPARATOR`].
    pub async fn load_memory_variables(&self) -> HashMap<String, String> {
        let st = self.state.lock().await;
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
        self.state
            .lock()
            .await
            .stats(RUNNING, self.options.token_limit)
    }

    /// Empties the memory (the store keeps everything; a marker makes a restart start empty).
    pub async fn clear(&self) -> Result<()> {
        write_marker(&self.harness, &self.thread, RUNNING).await?;
        self.state.lock().await.clear();
        Ok(())
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
    ids: Vec<MemoryId>,
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

    /// Stores `message` (tool data in its metadata) and appends it to the context.
    pub async fn push(
        &self,
        messages: &mut Vec<ContextMessage>,
        mut message: ContextMessage,
    ) -> Result<MemoryId> {
        let mut m =
            NewMemory::conversational(self.thread.clone(), message.role, message.content.clone());
        if !message.tool_calls.is_empty() {
            m.metadata.insert(
                "tool_calls".into(),
                serde_json::to_value(&message.tool_calls).unwrap_or_default(),
            );
        }
        if let Some(id) = &message.tool_call_id {
            m.metadata.insert("tool_call_id".into(), id.clone().into());
        }
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
        let ids: Vec<MemoryId> = region.iter().filter_map(|m| m.memory_id).collect();
        if ids.is_empty() {
            return None;
        }
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
            ids,
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
    /// in their place. Returns `Outdated` (and changes nothing) when the context changed since
    /// it was prepared.
    pub async fn apply(
        &self,
        messages: &mut Vec<ContextMessage>,
        done: CompletedSummary,
    ) -> Result<SummarizeOutcome> {
        if done.pending.version != self.version.load(Ordering::SeqCst) {
            return Ok(SummarizeOutcome::Outdated);
        }
        let mut metadata = cairn_core::Metadata::new();
        metadata.insert(MARK.into(), "auto_context:summary".into());
        let unit = self
            .harness
            .add_summary_with(NewSummary {
                id: None,
                content: done.text.clone(),
                source_ids: done.pending.ids.clone(),
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
        let replaced = done.pending.end - done.pending.start;
        messages.splice(done.pending.start..done.pending.end, [msg]);
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
