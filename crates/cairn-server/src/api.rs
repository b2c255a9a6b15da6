//! The shapes on the wire, shared by REST (utoipa schemas) and MCP (JSON schemas).

use cairn_core::{MemoryUnit, SPEAKER_KEY};
use cairn_harness::{ContextItem, SearchHit};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A JSON object of free metadata.
pub type Metadata = serde_json::Map<String, serde_json::Value>;

/// A memory to add.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddMemory {
    /// The text (required; not blank; at most 1 MiB).
    pub content: String,
    /// conversational (default when a thread is given), knowledge (default otherwise),
    /// entity, workflow, toolbox, tool_log, file or persona.
    #[serde(default)]
    pub kind: Option<String>,
    /// The conversation thread.
    #[serde(default)]
    pub thread: Option<String>,
    /// user, assistant, system or tool.
    #[serde(default)]
    pub role: Option<String>,
    /// Who said it (a name); kept in the metadata under `speaker`.
    #[serde(default)]
    pub speaker: Option<String>,
    /// When it happened (RFC 3339); now when left out.
    #[serde(default)]
    pub created_at: Option<String>,
    /// A JSON object kept with the memory.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Metadata>,
    /// An external key (1 to 512 bytes): the memory's id is derived from it, so adding the
    /// same keyed memory again returns the stored one (a retry never duplicates) and the
    /// same key with other content is a 409 (use `/v1/upsert` to change it).
    #[serde(default)]
    pub key: Option<String>,
    /// Hidden from reads from this time on (RFC 3339), and deleted by the next
    /// consolidation.
    #[serde(default)]
    pub expires_at: Option<String>,
    /// Hidden from reads after this long (`90s`, `30m`, `2h`, `7d`); instead of `expires_at`.
    #[serde(default)]
    pub ttl: Option<String>,
    /// The id of the earlier fact this one replaces: reads return this one, the earlier
    /// one stays as history.
    #[serde(default)]
    pub supersedes: Option<String>,
    /// Since when the fact holds (RFC 3339); default: its time.
    #[serde(default)]
    pub valid_from: Option<String>,
}

/// A condition on one top-level metadata field; every condition given must hold.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetaCondition {
    /// The metadata field.
    pub key: String,
    /// Equal to (text, number or boolean).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub eq: Option<serde_json::Value>,
    /// Not equal to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub ne: Option<serde_json::Value>,
    /// Equal to one of.
    #[serde(default, rename = "in", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub one_of: Option<Vec<serde_json::Value>>,
    /// Greater than (a number, or text such as an RFC 3339 time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub gt: Option<serde_json::Value>,
    /// Greater than or equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub gte: Option<serde_json::Value>,
    /// Less than.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub lt: Option<serde_json::Value>,
    /// Less than or equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub lte: Option<serde_json::Value>,
    /// Present (true) or absent (false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exists: Option<bool>,
}

impl From<MetaCondition> for cairn_harness::MetaFilter {
    fn from(c: MetaCondition) -> Self {
        Self {
            key: c.key,
            eq: c.eq,
            ne: c.ne,
            one_of: c.one_of,
            gt: c.gt,
            gte: c.gte,
            lt: c.lt,
            lte: c.lte,
            exists: c.exists,
        }
    }
}

/// A metadata patch.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchMemory {
    /// Merged into the metadata (JSON merge patch: `null` removes a field); the memory is
    /// not re-embedded.
    #[schema(value_type = Object)]
    pub metadata: Metadata,
}

/// What an upsert did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct UpsertedOut {
    /// The memory as stored now.
    pub memory: MemoryOut,
    /// inserted, unchanged, metadata_updated or content_updated.
    pub outcome: String,
}

/// What to forget: exactly one of `ids`, `thread`, `metadata` or `everything`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForgetRequest {
    /// These memories.
    #[serde(default)]
    pub ids: Option<Vec<String>>,
    /// Every memory of this thread.
    #[serde(default)]
    pub thread: Option<String>,
    /// Every memory meeting all these metadata conditions (a user: `user_id`).
    #[serde(default)]
    pub metadata: Option<Vec<MetaCondition>>,
    /// Everything in the namespace.
    #[serde(default)]
    pub everything: Option<bool>,
}

/// What was forgotten.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct Forgotten {
    /// Every memory removed.
    pub deleted: Vec<String>,
    /// Summaries rewritten from the sources they keep.
    pub resummarized: Vec<String>,
    /// Summaries deleted because they could not be rewritten.
    pub dropped: Vec<String>,
    /// Whether the store's files were scrubbed of what was forgotten too (false on
    /// PostgreSQL, or while another process held an older read of a SQLite store).
    #[serde(default)]
    pub erased: bool,
}

/// The ids of the memories added, in the order given.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct Added {
    /// The id of the memory, when one was added.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Every id, in the order given.
    pub ids: Vec<String>,
}

/// What a summary summarizes.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct SummaryOut {
    /// session, rollup, ... (what the summary summarizes).
    pub summary_type: String,
    /// Its direct sources, in order.
    pub source_ids: Vec<String>,
    /// Its earliest source's time (through every level).
    pub time_range_start: String,
    /// Its latest source's time.
    pub time_range_end: String,
    /// Whether a source changed after it was written.
    pub stale: bool,
}

/// A stored memory.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct MemoryOut {
    /// Its id.
    pub id: String,
    /// Its kind.
    pub kind: String,
    /// Its thread.
    pub thread: Option<String>,
    /// Its role.
    pub role: Option<String>,
    /// Who said it, when known.
    pub speaker: Option<String>,
    /// The text.
    pub content: String,
    /// When it happened (RFC 3339).
    pub created_at: String,
    /// 0 for raw memories, 1 + the highest source level for summaries.
    pub level: u32,
    /// Its metadata.
    #[schema(value_type = Object)]
    pub metadata: Metadata,
    /// For summaries: what they summarize.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<SummaryOut>,
    /// When it stops being read (RFC 3339), if it expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// Since when the fact holds, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_from: Option<String>,
    /// Until when it held, once superseded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_to: Option<String>,
    /// The earlier fact it supersedes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supersedes: Option<String>,
}

impl From<&MemoryUnit> for MemoryOut {
    fn from(m: &MemoryUnit) -> Self {
        Self {
            id: m.id.to_string(),
            kind: m.kind.as_str().to_owned(),
            thread: m.thread_id.as_ref().map(|t| t.as_str().to_owned()),
            role: m.role.map(|r| r.as_str().to_owned()),
            speaker: m.speaker().map(str::to_owned),
            content: m.content.clone(),
            created_at: m.created_at.to_rfc3339(),
            level: m.level,
            metadata: m.metadata.clone(),
            summary: m.summary.as_ref().map(|s| SummaryOut {
                summary_type: s.summary_type.as_str().to_owned(),
                source_ids: s.source_ids.iter().map(ToString::to_string).collect(),
                time_range_start: s.time_range_start.to_rfc3339(),
                time_range_end: s.time_range_end.to_rfc3339(),
                stale: s.stale,
            }),
            expires_at: m.lifetime.expires_at.map(|t| t.to_rfc3339()),
            valid_from: m.lifetime.valid_from.map(|t| t.to_rfc3339()),
            valid_to: m.lifetime.valid_to.map(|t| t.to_rfc3339()),
            supersedes: m.lifetime.supersedes.map(|i| i.to_string()),
        }
    }
}

/// A list of memories.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct Memories {
    /// The memories, in order.
    pub memories: Vec<MemoryOut>,
    /// Listings: the cursor of the next page (pass it as `cursor`); absent after the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// A summary to add, written by the caller (an agent's own summary).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddSummary {
    /// The summary's text.
    pub content: String,
    /// What it summarizes, in order: memories or summaries of the same thread.
    pub source_ids: Vec<String>,
    /// Its thread (the sources' thread).
    #[serde(default)]
    pub thread: Option<String>,
}

/// A stored summary.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct SummaryCreated {
    /// The summary as stored.
    pub memory: MemoryOut,
}

/// One kind or several.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema, JsonSchema)]
#[serde(untagged)]
pub enum Kinds {
    /// One kind.
    One(String),
    /// Several kinds.
    Many(Vec<String>),
}

impl Kinds {
    /// The kinds as a list.
    pub fn list(&self) -> Vec<&str> {
        match self {
            Kinds::One(k) => vec![k.as_str()],
            Kinds::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// A search.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchRequest {
    /// What to look for.
    pub query: String,
    /// How many hits (default 10; 3 when searching summaries only; at most 100).
    #[serde(default)]
    pub k: Option<usize>,
    /// hybrid (default), vector or keyword.
    #[serde(default)]
    pub mode: Option<String>,
    /// Only this thread.
    #[serde(default)]
    pub thread: Option<String>,
    /// Only this kind (or these kinds).
    #[serde(default)]
    pub kind: Option<Kinds>,
    /// Only memories meeting all these metadata conditions.
    #[serde(default)]
    pub metadata: Option<Vec<MetaCondition>>,
    /// The facts that held at this time (RFC 3339), not the current ones.
    #[serde(default)]
    pub as_of: Option<String>,
    /// Superseded facts too.
    #[serde(default)]
    pub history: Option<bool>,
    /// Recency decay: scores halve every this much age (`30d`, `12h`).
    #[serde(default)]
    pub half_life: Option<String>,
}

/// A search hit.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct HitOut {
    /// The memory's id.
    pub id: String,
    /// Its text.
    pub content: String,
    /// Higher is better (cosine, fused rank or negated BM25, by mode).
    pub score: f32,
    /// Its kind.
    pub kind: String,
    /// Its thread.
    pub thread: Option<String>,
    /// Its level.
    pub level: u32,
    /// When it happened.
    pub created_at: String,
    /// Who said it, when known.
    pub speaker: Option<String>,
    /// Its metadata (left out when empty).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    #[schema(value_type = Object)]
    pub metadata: Metadata,
}

impl From<&SearchHit> for HitOut {
    fn from(h: &SearchHit) -> Self {
        let m = &h.memory;
        Self {
            id: m.id.to_string(),
            content: m.content.clone(),
            score: h.score,
            kind: m.kind.as_str().to_owned(),
            thread: m.thread_id.as_ref().map(|t| t.as_str().to_owned()),
            level: m.level,
            created_at: m.created_at.to_rfc3339(),
            speaker: m.speaker().map(str::to_owned),
            metadata: m.metadata.clone(),
        }
    }
}

/// Search results, best first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct Hits {
    /// The hits.
    pub hits: Vec<HitOut>,
}

/// A context to assemble.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContextRequest {
    /// The conversation.
    pub thread: String,
    /// What the agent is about to answer.
    pub query: String,
    /// Tokens (cl100k_base) the context may take; default 2000, at most 32000.
    #[serde(default)]
    pub budget: Option<usize>,
    /// Recall the thread's knowledge memories too.
    #[serde(default)]
    pub knowledge: Option<bool>,
    /// Other threads to recall from (the same user's other conversations).
    #[serde(default)]
    pub scope: Option<Vec<String>>,
    /// Also recall memories of any thread meeting all these metadata conditions (the same
    /// user's memories: `user_id`).
    #[serde(default)]
    pub scope_metadata: Option<Vec<MetaCondition>>,
}

/// One item of an assembled context, with its provenance.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct ContextItemOut {
    /// The memory's id (expand a summary by it).
    pub id: String,
    /// summary, related, recalled or recent.
    pub section: String,
    /// Its kind.
    pub kind: String,
    /// Its level.
    pub level: u32,
    /// Its role.
    pub role: Option<String>,
    /// Who said it, when known.
    pub speaker: Option<String>,
    /// The text.
    pub content: String,
    /// When it happened.
    pub created_at: String,
    /// Its thread.
    pub thread: Option<String>,
    /// Tokens it costs in the context.
    pub tokens: usize,
    /// For summaries: what they summarize.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub source_ids: Vec<String>,
    /// For a recalled turn: the other turns that said the same words (shown once, with
    /// their dates): on other days, and on each day named up to four with its own, oldest
    /// first.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub repeats: Vec<RepeatOut>,
}

/// A turn with the same words as a recalled one, on another day or the same.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct RepeatOut {
    /// Its memory id.
    pub id: String,
    /// When it was said (RFC 3339).
    pub created_at: String,
}

impl From<&ContextItem> for ContextItemOut {
    fn from(i: &ContextItem) -> Self {
        let section = serde_json::to_value(i.section)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        Self {
            id: i.id.to_string(),
            section,
            kind: i.kind.as_str().to_owned(),
            level: i.level,
            role: i.role.map(|r| r.as_str().to_owned()),
            speaker: i
                .metadata
                .get(SPEAKER_KEY)
                .and_then(|v| v.as_str())
                .map(str::to_owned),
            content: i.content.clone(),
            created_at: i.created_at.to_rfc3339(),
            thread: i.thread_id.as_ref().map(|t| t.as_str().to_owned()),
            tokens: i.tokens,
            source_ids: i.source_ids.iter().map(ToString::to_string).collect(),
            repeats: i
                .repeats
                .iter()
                .map(|r| RepeatOut {
                    id: r.id.to_string(),
                    created_at: r.created_at.to_rfc3339(),
                })
                .collect(),
        }
    }
}

/// An assembled context.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct ContextOut {
    /// Summaries, related memories, recalled turns, recent turns.
    pub items: Vec<ContextItemOut>,
    /// Tokens the context takes as chat messages.
    pub tokens: usize,
    /// The budget asked for.
    pub budget: usize,
    /// The context as one text, ready for a prompt.
    pub text: String,
}

/// What a delete removed.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct Deleted {
    /// Every memory removed (the target first).
    pub deleted: Vec<String>,
    /// Summaries that lost a source and were marked stale.
    pub detached: Vec<String>,
}

/// A summary tree node.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct TreeNode {
    /// The memory at this node.
    pub memory: MemoryOut,
    /// Its sources, in order (empty for raw memories and for nodes below the depth asked).
    #[schema(no_recursion)]
    pub children: Vec<TreeNode>,
    /// True when the node has sources that were not listed (depth or size limit).
    pub truncated: bool,
}

/// Summary trees.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct Trees {
    /// One tree per top summary (or the tree under the id asked for).
    pub trees: Vec<TreeNode>,
}

/// A consolidation pass to run now.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsolidateRequest {
    /// Summarize memories older than this: 90s, 30m, 2h, 7d (default 1h).
    #[serde(default)]
    pub older_than: Option<String>,
    /// Only this thread.
    #[serde(default)]
    pub thread: Option<String>,
}

/// What a consolidation pass did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct Consolidated {
    /// Summaries written, by level ("1", "2", ...).
    pub summaries_per_level: std::collections::BTreeMap<String, usize>,
    /// Raw memories newly covered by a level-1 summary.
    pub memories_covered: usize,
    /// The ids of the summaries written.
    pub summaries: Vec<String>,
    /// Chunks that failed (their sources were kept as they are).
    pub failures: usize,
    /// Stale summaries rewritten.
    pub refreshed: usize,
}

/// A thread and its size.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct ThreadOut {
    /// The thread id.
    pub id: String,
    /// Its raw memories (conversation turns, tool logs, knowledge, ...).
    pub memories: usize,
    /// Its summaries.
    pub summaries: usize,
}

/// The threads of a namespace.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct Threads {
    /// The threads, by id.
    pub threads: Vec<ThreadOut>,
}

/// The body of `POST /v1/memories`: one memory, or an array of them (added all or none).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum AddBody {
    /// One memory.
    One(Box<AddMemory>),
    /// Several, in one transaction.
    Many(Vec<AddMemory>),
}

/// Turns on one day.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct DayCount {
    /// The day (UTC, `YYYY-MM-DD`).
    pub day: String,
    /// Raw memories of the thread that day.
    pub turns: usize,
}

/// The time a summary covers.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct SpanOut {
    /// The summary's id.
    pub id: String,
    /// Its level.
    pub level: u32,
    /// Its earliest source's time.
    pub start: String,
    /// Its latest source's time.
    pub end: String,
}

/// A thread over time: turns per day and the spans of its summaries.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct Timeline {
    /// Days with at least one turn, in order.
    pub days: Vec<DayCount>,
    /// The summaries' spans, by level then time.
    pub spans: Vec<SpanOut>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::{MemoryId, MemoryKind, Metadata};
    use cairn_harness::{Repeat, Section};

    /// A recalled item's repeats travel with their ids and dates; an item without any has
    /// no `repeats` field.
    #[test]
    fn context_items_carry_their_repeats() {
        let at = chrono::DateTime::from_timestamp(1_700_006_400, 0).unwrap();
        let mut item = ContextItem {
            id: MemoryId::new(),
            kind: MemoryKind::Conversational,
            level: 0,
            role: None,
            content: "Walked the dog.".into(),
            created_at: at,
            metadata: Metadata::new(),
            source_ids: Vec::new(),
            span: None,
            thread_id: None,
            section: Section::Recalled,
            tokens: 9,
            repeats: Vec::new(),
        };
        let plain = serde_json::to_value(ContextItemOut::from(&item)).unwrap();
        assert!(plain.get("repeats").is_none(), "{plain}");
        let other = MemoryId::new();
        item.repeats.push(Repeat {
            id: other,
            created_at: at + chrono::Duration::days(3),
            metadata: Metadata::new(),
        });
        let out = serde_json::to_value(ContextItemOut::from(&item)).unwrap();
        assert_eq!(out["repeats"][0]["id"], other.to_string());
        assert_eq!(out["repeats"][0]["created_at"], "2023-11-18T00:00:00+00:00");
    }
}
