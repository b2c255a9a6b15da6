use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{InputError, MemoryId, MemoryKind, Role, SummaryType, ThreadId};

/// Free JSON metadata attached to a memory: always a JSON object.
pub type Metadata = serde_json::Map<String, serde_json::Value>;

/// The metadata key that holds who said a conversational memory (a name, as text): set it
/// with [`NewMemory::with_speaker`], read it with [`MemoryUnit::speaker`]. Context assembly
/// ranks a speaker's turns by it, whatever their text says.
pub const SPEAKER_KEY: &str = "speaker";

/// The largest accepted memory content, in bytes (1 MiB).
pub const MAX_CONTENT_BYTES: usize = 1 << 20;

/// What is known about a summary beyond its text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryInfo {
    /// What the summary summarizes.
    pub summary_type: SummaryType,
    /// The memories it was built from, in their original order.
    pub source_ids: Vec<MemoryId>,
    /// The earliest `created_at` among its sources (through every level).
    pub time_range_start: DateTime<Utc>,
    /// The latest `created_at` among its sources (through every level).
    pub time_range_end: DateTime<Utc>,
    /// How many direct sources it has.
    pub source_count: usize,
    /// 1 + the highest level of its sources.
    pub level: u32,
    /// True when a source changed or was detached after the summary was written.
    pub stale: bool,
    /// For a version of a moving summary: the version it continues, its first source,
    /// linked without raising the level (see `Store::add_continuation`). `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continues: Option<MemoryId>,
}

/// How long a memory holds: an expiry (TTL) and, for facts, the time they held true. Reads
/// hide a memory from its expiry on (consolidation then deletes it), and hide a fact once a
/// later one supersedes it, unless they ask for history or for another time
/// (`Filter::as_of`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifetime {
    /// Hidden from reads from this time on, and deleted by the next consolidation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    /// When the fact became true; the memory's time when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_from: Option<DateTime<Utc>>,
    /// When it stopped being true: set by the store when a later memory supersedes it (or
    /// given, for a fact known to end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_to: Option<DateTime<Utc>>,
    /// The earlier memory this one supersedes (its `valid_to` becomes this one's
    /// `valid_from`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supersedes: Option<MemoryId>,
}

impl Lifetime {
    /// True when nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A stored memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryUnit {
    /// Public id.
    pub id: MemoryId,
    /// What the memory is.
    pub kind: MemoryKind,
    /// The conversation thread it belongs to, if any.
    pub thread_id: Option<ThreadId>,
    /// Who said it, for conversational memories.
    pub role: Option<Role>,
    /// The text.
    pub content: String,
    /// When it happened (callers may give past times when importing).
    pub created_at: DateTime<Utc>,
    /// Free JSON object.
    pub metadata: Metadata,
    /// 0 for raw memories; 1 + the highest source level for summaries.
    pub level: u32,
    /// Present for summaries.
    pub summary: Option<SummaryInfo>,
    /// Expiry and validity (empty for most memories).
    #[serde(default, flatten)]
    pub lifetime: Lifetime,
}

impl MemoryUnit {
    /// True for summaries.
    pub fn is_summary(&self) -> bool {
        self.summary.is_some()
    }

    /// Who said it: the text its metadata holds under [`SPEAKER_KEY`], if any.
    pub fn speaker(&self) -> Option<&str> {
        self.metadata.get(SPEAKER_KEY).and_then(|v| v.as_str())
    }
}

/// A memory to be written; the store assigns the id (unless given) and the level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewMemory {
    /// The id to use; a fresh UUID v7 when `None`.
    pub id: Option<MemoryId>,
    /// What the memory is. [`MemoryKind::Summary`] is only accepted through the summary API.
    pub kind: MemoryKind,
    /// Thread, if any.
    pub thread_id: Option<ThreadId>,
    /// Role, if any.
    pub role: Option<Role>,
    /// The text; must not be empty or blank and at most [`MAX_CONTENT_BYTES`].
    pub content: String,
    /// When it happened; the store's clock when `None`.
    pub created_at: Option<DateTime<Utc>>,
    /// Free JSON object.
    pub metadata: Metadata,
    /// Expiry, validity, and the memory it supersedes.
    #[serde(default, flatten)]
    pub lifetime: Lifetime,
}

impl NewMemory {
    /// A memory of `kind` with `content` and nothing else set.
    pub fn new(kind: MemoryKind, content: impl Into<String>) -> Self {
        Self {
            id: None,
            kind,
            thread_id: None,
            role: None,
            content: content.into(),
            created_at: None,
            metadata: Metadata::new(),
            lifetime: Lifetime::default(),
        }
    }

    /// A conversation turn.
    pub fn conversational(thread: ThreadId, role: Role, content: impl Into<String>) -> Self {
        Self::new(MemoryKind::Conversational, content)
            .with_thread(thread)
            .with_role(role)
    }

    /// Sets the thread.
    pub fn with_thread(mut self, thread: ThreadId) -> Self {
        self.thread_id = Some(thread);
        self
    }

    /// Sets the role.
    pub fn with_role(mut self, role: Role) -> Self {
        self.role = Some(role);
        self
    }

    /// Sets the creation time.
    pub fn at(mut self, created_at: DateTime<Utc>) -> Self {
        self.created_at = Some(created_at);
        self
    }

    /// Hidden from reads from `at` on, and deleted by the next consolidation (a TTL).
    pub fn expires_at(mut self, at: DateTime<Utc>) -> Self {
        self.lifetime.expires_at = Some(at);
        self
    }

    /// Supersedes an earlier memory (a fact that changed): reads return this one and hide
    /// the earlier one, which stays as history (valid until this one's `valid_from`).
    pub fn supersedes(mut self, earlier: MemoryId) -> Self {
        self.lifetime.supersedes = Some(earlier);
        self
    }

    /// Since when the fact is true (default: the memory's time).
    pub fn valid_from(mut self, from: DateTime<Utc>) -> Self {
        self.lifetime.valid_from = Some(from);
        self
    }

    /// Sets the metadata object.
    pub fn with_metadata(mut self, metadata: Metadata) -> Self {
        self.metadata = metadata;
        self
    }

    /// Sets who said it (metadata [`SPEAKER_KEY`]); the content need not name them.
    pub fn with_speaker(mut self, speaker: impl Into<String>) -> Self {
        self.metadata.insert(
            SPEAKER_KEY.into(),
            serde_json::Value::String(speaker.into()),
        );
        self
    }

    /// Who said it: the text its metadata holds under [`SPEAKER_KEY`], if any.
    pub fn speaker(&self) -> Option<&str> {
        self.metadata.get(SPEAKER_KEY).and_then(|v| v.as_str())
    }

    /// Sets the id (imports that keep their ids).
    pub fn with_id(mut self, id: MemoryId) -> Self {
        self.id = Some(id);
        self
    }

    /// Sets the id from a caller-given external key ([`MemoryId::from_key`]): adding the
    /// same keyed memory again returns the stored one instead of a duplicate, and
    /// `MemoryHarness::upsert` updates it in place.
    pub fn with_key(self, key: &str) -> Self {
        self.with_id(MemoryId::from_key(key))
    }
}

/// Checks memory content: not empty or blank, not over [`MAX_CONTENT_BYTES`].
pub(crate) fn check_content(content: &str) -> Result<(), InputError> {
    if content.trim().is_empty() {
        return Err(InputError::EmptyContent);
    }
    if content.len() > MAX_CONTENT_BYTES {
        return Err(InputError::ContentTooLarge {
            bytes: content.len(),
            max: MAX_CONTENT_BYTES,
        });
    }
    Ok(())
}

impl NewMemory {
    /// Validates the record (content; metadata nesting depth).
    pub fn validate(&self) -> Result<(), InputError> {
        check_content(&self.content)?;
        check_metadata(&self.metadata)?;
        if let (Some(a), Some(b)) = (self.lifetime.valid_from, self.lifetime.valid_to) {
            if a > b {
                return Err(InputError::InvalidTimeRange);
            }
        }
        Ok(())
    }
}

/// The deepest accepted metadata nesting.
const MAX_METADATA_DEPTH: usize = 64;

/// Checks that metadata is not nested deeper than 64 levels (deeper JSON cannot be read back
/// by common parsers).
pub fn check_metadata(metadata: &Metadata) -> Result<(), InputError> {
    // Iterative, so hostile nesting cannot overflow the stack.
    let mut stack: Vec<(&serde_json::Value, usize)> = metadata.values().map(|v| (v, 1)).collect();
    while let Some((v, d)) = stack.pop() {
        if d > MAX_METADATA_DEPTH {
            return Err(InputError::MetadataTooDeep {
                max: MAX_METADATA_DEPTH,
            });
        }
        match v {
            serde_json::Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            serde_json::Value::Object(o) => stack.extend(o.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_checked() {
        assert_eq!(
            NewMemory::new(MemoryKind::Knowledge, "  \n").validate(),
            Err(InputError::EmptyContent)
        );
        let big = "x".repeat(MAX_CONTENT_BYTES + 1);
        assert!(matches!(
            NewMemory::new(MemoryKind::Knowledge, big).validate(),
            Err(InputError::ContentTooLarge { .. })
        ));
        assert!(NewMemory::new(MemoryKind::Knowledge, "fine")
            .validate()
            .is_ok());
    }

    #[test]
    fn deep_metadata_is_refused() {
        let mut v = serde_json::json!(1);
        for _ in 0..100 {
            v = serde_json::json!([v]);
        }
        let mut m = Metadata::new();
        m.insert("deep".into(), v);
        assert!(matches!(
            check_metadata(&m),
            Err(InputError::MetadataTooDeep { .. })
        ));
        let mut ok = Metadata::new();
        ok.insert("a".into(), serde_json::json!({"b": [1, 2, {"c": null}]}));
        assert!(check_metadata(&ok).is_ok());
    }
}
