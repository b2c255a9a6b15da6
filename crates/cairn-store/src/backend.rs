//! The storage boundary, shared by every backend: the [`MemoryBackend`] trait, the input
//! checks and link rules each backend applies before it writes, and (feature
//! `conformance`) the behaviour suite every backend passes.
//!
//! Two backends implement it: [`crate::Store`] (SQLite rows + the crate's own HNSW graph,
//! the embedded default) and `cairn_pg::PgStore` (PostgreSQL + pgvector).
//!
//! ```
//! use cairn_core::{NewMemory, Role, ThreadId};
//! use cairn_store::{Filter, MemoryBackend, NewSummary, Store, StoreOptions};
//!
//! fn remember(b: &dyn MemoryBackend) -> cairn_store::Result<usize> {
//!     let t = ThreadId::new("chat")?;
//!     let a = b.insert(NewMemory::conversational(t.clone(), Role::User, "hi"), vec![1.0, 0.0])?;
//!     let s = b.add_summary(NewSummary::new("a greeting", vec![a.id]).with_thread(Some(t)), vec![1.0, 0.0])?;
//!     Ok(b.sources(s.id)?.len())
//! }
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path().join("m.db"), StoreOptions::new("demo", 2))?;
//! assert_eq!(remember(&store)?, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashSet;

use chrono::{DateTime, Utc};

use cairn_core::{
    normalized, validate_vector, InputError, MemoryId, MemoryKind, MemoryUnit, Metadata, NewMemory,
    ThreadId,
};

use crate::{
    Cursor, DeletePolicy, DeleteReport, Filter, Hit, NewSummary, Page, Result, StoreError,
    ThreadState,
};

/// What every Cairn storage backend does: rows with their embeddings, summary links both
/// ways, vector and keyword search under a [`Filter`], thread reads and deletes under a
/// [`DeletePolicy`]. Every method blocks; every write is one transaction (all of it or
/// nothing), and an error means nothing was written.
///
/// The semantics are those documented on [`crate::Store`]'s methods of the same names; the
/// conformance suite (`cairn_store::conformance`, feature `conformance`) checks them on every
/// backend.
pub trait MemoryBackend: Send + Sync {
    /// A short name for messages (`"sqlite"`, `"postgres"`).
    fn backend_name(&self) -> &'static str;

    /// The embedding dimension this store holds.
    fn dimension(&self) -> usize;

    /// Inserts memories (not summaries) in one transaction: all or none. A memory whose id
    /// is already stored with the same content comes back as stored (idempotent retries);
    /// other content under that id is [`StoreError::DuplicateId`].
    fn insert_batch(&self, items: Vec<(NewMemory, Vec<f32>)>) -> Result<Vec<MemoryUnit>>;

    /// Inserts one memory.
    fn insert(&self, memory: NewMemory, embedding: Vec<f32>) -> Result<MemoryUnit> {
        self.insert_batch(vec![(memory, embedding)])?
            .pop()
            .ok_or(StoreError::Config("an insert returned nothing".into()))
    }

    /// Writes a summary and its ordered links in one transaction (level 1 + the highest
    /// source level; time range spanning the sources').
    fn add_summary(&self, summary: NewSummary, embedding: Vec<f32>) -> Result<MemoryUnit>;

    /// One memory ([`StoreError::NotFound`] for an unknown id).
    fn get(&self, id: MemoryId) -> Result<MemoryUnit>;

    /// A summary's direct sources, in order ([`StoreError::NotASummary`] for a raw memory).
    fn sources(&self, summary: MemoryId) -> Result<Vec<MemoryUnit>>;

    /// The summaries citing `id` directly, oldest first.
    fn summaries_of(&self, id: MemoryId) -> Result<Vec<MemoryUnit>>;

    /// Every summary above `id`, lowest level first.
    fn ancestors(&self, id: MemoryId) -> Result<Vec<MemoryUnit>>;

    /// Every level-0 memory under a summary, once each, in time order.
    fn leaves(&self, summary: MemoryId) -> Result<Vec<MemoryUnit>>;

    /// The newest `limit` memories the filter admits, returned oldest first.
    fn recent(&self, filter: &Filter, limit: usize) -> Result<Vec<MemoryUnit>>;

    /// The `k` memories nearest `query` (cosine) among those the filter admits, best first.
    /// Returns `k` hits whenever the filter admits at least `k` memories.
    fn search_vector(&self, query: Vec<f32>, k: usize, filter: &Filter) -> Result<Vec<Hit>>;

    /// The `k` memories that best match the words of `query` (any word), best first.
    fn search_keyword(&self, query: &str, k: usize, filter: &Filter) -> Result<Vec<Hit>>;

    /// Deletes memories under `policy` in one transaction (all or none).
    fn delete_many(&self, ids: &[MemoryId], policy: DeletePolicy) -> Result<DeleteReport>;

    /// Deletes one memory.
    fn delete(&self, id: MemoryId, policy: DeletePolicy) -> Result<DeleteReport> {
        self.delete_many(&[id], policy)
    }

    /// Every thread holding a memory, sorted.
    fn threads(&self) -> Result<Vec<ThreadId>>;

    /// One page of the memories a filter admits, oldest first (by time, then insertion
    /// order), starting after `cursor`. Memories added while paging never make a page
    /// repeat or skip one listed before.
    fn page(&self, filter: &Filter, cursor: Option<Cursor>, limit: usize) -> Result<Page>;

    /// Merges `patch` into a memory's metadata (RFC 7386, see [`merge_patch`]) without
    /// touching its content or embedding; returns the memory as stored.
    fn patch_metadata(&self, id: MemoryId, patch: Metadata) -> Result<MemoryUnit>;

    /// A named value of a thread, if one was written.
    fn thread_state(&self, thread: &ThreadId, name: &str) -> Result<Option<String>>;

    /// Writes (or replaces) a named value of a thread.
    fn set_thread_state(&self, state: ThreadState) -> Result<()>;

    /// Which of `ids` exist.
    fn existing(&self, ids: &[MemoryId]) -> Result<HashSet<MemoryId>>;

    /// Several memories, in the order asked; an unknown id is [`StoreError::NotFound`].
    fn get_many(&self, ids: &[MemoryId]) -> Result<Vec<MemoryUnit>>;

    /// Every version of the fact `id` belongs to (what it supersedes, back to the first,
    /// and what supersedes it), oldest first by `valid_from`.
    fn versions(&self, id: MemoryId) -> Result<Vec<MemoryUnit>>;

    /// Up to `limit` memories whose expiry has passed, oldest expiry first.
    fn expired(&self, limit: usize) -> Result<Vec<MemoryId>>;

    /// Sets (or, with `None`, removes) a memory's expiry; returns the memory as stored.
    fn set_expiry(&self, id: MemoryId, expires_at: Option<DateTime<Utc>>) -> Result<MemoryUnit>;
}

/// RFC 7386 JSON merge patch of an object: a `null` removes a field, an object merges into
/// an object, anything else replaces.
pub fn merge_patch(target: &mut Metadata, patch: Metadata) {
    for (k, v) in patch {
        match v {
            serde_json::Value::Null => {
                target.remove(&k);
            }
            serde_json::Value::Object(p) => {
                let mut inner = match target.remove(&k) {
                    Some(serde_json::Value::Object(o)) => o,
                    _ => Metadata::new(),
                };
                merge_patch(&mut inner, p);
                target.insert(k, serde_json::Value::Object(inner));
            }
            other => {
                target.insert(k, other);
            }
        }
    }
}

/// A memory checked and shaped for writing: the row as it will be stored, its unit-length
/// vector, and whether the caller gave its time (an idempotent retry then compares it).
#[derive(Debug, Clone)]
pub struct PreparedMemory {
    /// The row.
    pub unit: MemoryUnit,
    /// The normalized embedding.
    pub vector: Vec<f32>,
    /// Whether `created_at` came from the caller.
    pub timed: bool,
}

/// Checks a batch for insertion and shapes its rows, as every backend does before it
/// writes: each memory valid, no summaries (they go through `add_summary`), no id twice in
/// the batch, vectors of `dim` finite values, not all zero (normalized here). Memories
/// without a time get `now`; without an id, a fresh one.
pub fn prepare_memories(
    items: Vec<(NewMemory, Vec<f32>)>,
    dim: usize,
    now: DateTime<Utc>,
) -> Result<Vec<PreparedMemory>> {
    let mut prepared = Vec::with_capacity(items.len());
    let mut seen = HashSet::new();
    for (m, v) in items {
        m.validate()?;
        if m.kind == MemoryKind::Summary {
            return Err(InputError::UnknownName {
                what: "kind for insert (summaries go through add_summary)",
                value: "summary".into(),
            }
            .into());
        }
        let id = m.id.unwrap_or_default();
        if !seen.insert(id) {
            return Err(StoreError::DuplicateId { id });
        }
        let timed = m.created_at.is_some();
        let mut lifetime = m.lifetime;
        lifetime.expires_at = lifetime.expires_at.map(to_stored_time);
        lifetime.valid_from = lifetime.valid_from.map(to_stored_time);
        lifetime.valid_to = lifetime.valid_to.map(to_stored_time);
        let unit = MemoryUnit {
            id,
            kind: m.kind,
            thread_id: m.thread_id,
            role: m.role,
            content: m.content,
            created_at: to_stored_time(m.created_at.unwrap_or(now)),
            metadata: m.metadata,
            level: 0,
            summary: None,
            lifetime,
        };
        validate_vector(&v, dim)?;
        prepared.push(PreparedMemory {
            unit,
            vector: normalized(v)?,
            timed,
        });
    }
    Ok(prepared)
}

/// Whether `stored` is the memory a keyed retry of `new` would write (same kind, thread,
/// role, content, metadata, and time when the caller gave one) and is not past its expiry
/// at `now`: then the retry returns it; otherwise the id is taken ([`StoreError::DuplicateId`]).
pub fn same_memory(stored: &MemoryUnit, new: &PreparedMemory, now: DateTime<Utc>) -> bool {
    let u = &new.unit;
    let expired = stored.lifetime.expires_at.is_some_and(|t| t <= now);
    !expired
        && stored.kind == u.kind
        && stored.thread_id == u.thread_id
        && stored.role == u.role
        && stored.content == u.content
        && stored.metadata == u.metadata
        && (!new.timed || stored.created_at == u.created_at)
}

/// A time as every backend stores it: whole microseconds (what reads return).
pub fn to_stored_time(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}

/// Checks a summary before any read: valid text and metadata, at least one source, none
/// repeated, none the summary itself (`previous`, a moving summary's earlier version,
/// counts as a source). Returns the summary's id (fresh when it has none).
pub fn check_summary(summary: &NewSummary, previous: Option<MemoryId>) -> Result<MemoryId> {
    NewMemory::new(MemoryKind::Summary, summary.content.clone())
        .with_metadata(summary.metadata.clone())
        .validate()?;
    if summary.source_ids.is_empty() {
        return Err(StoreError::EmptySources);
    }
    let id = summary.id.unwrap_or_default();
    let mut seen = HashSet::new();
    for s in previous.iter().chain(&summary.source_ids) {
        if *s == id {
            return Err(StoreError::SelfReference { id });
        }
        if !seen.insert(*s) {
            return Err(StoreError::DuplicateSource { id: *s });
        }
    }
    Ok(id)
}

/// What a backend reads about one source of a new summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceLink {
    /// The source.
    pub id: MemoryId,
    /// Its level.
    pub level: u32,
    /// Its thread.
    pub thread: Option<String>,
    /// Whether the link continues an earlier version (a moving summary), which does not
    /// raise the level.
    pub continues: bool,
}

/// The thread rule of a link, before the walk below a thread-less summary: a summary of a
/// thread may cite memories of that thread or of none. Returns whether the backend must
/// also check that nothing under `source` (a thread-less summary) belongs to another thread.
pub fn check_link_thread(summary_thread: Option<&str>, source: &SourceLink) -> Result<bool> {
    match (summary_thread, source.thread.as_deref()) {
        (Some(t), Some(st)) if t != st => Err(StoreError::ThreadMismatch {
            id: source.id,
            source_thread: st.to_owned(),
            summary_thread: t.to_owned(),
        }),
        (Some(_), None) => Ok(source.level > 0),
        _ => Ok(false),
    }
}

/// A summary's level: 1 + the highest level of its sources, a continuation link counting
/// its source's own level; at least 1.
pub fn summary_level(links: &[SourceLink]) -> u32 {
    links
        .iter()
        .map(|s| if s.continues { s.level } else { s.level + 1 })
        .max()
        .unwrap_or(1)
        .max(1)
}

impl MemoryBackend for crate::Store {
    fn backend_name(&self) -> &'static str {
        "sqlite"
    }

    fn dimension(&self) -> usize {
        self.options().dim
    }

    fn insert_batch(&self, items: Vec<(NewMemory, Vec<f32>)>) -> Result<Vec<MemoryUnit>> {
        crate::Store::insert_batch(self, items)
    }

    fn add_summary(&self, summary: NewSummary, embedding: Vec<f32>) -> Result<MemoryUnit> {
        crate::Store::add_summary(self, summary, embedding)
    }

    fn get(&self, id: MemoryId) -> Result<MemoryUnit> {
        crate::Store::get(self, id)
    }

    fn sources(&self, summary: MemoryId) -> Result<Vec<MemoryUnit>> {
        crate::Store::sources(self, summary)
    }

    fn summaries_of(&self, id: MemoryId) -> Result<Vec<MemoryUnit>> {
        crate::Store::summaries_of(self, id)
    }

    fn ancestors(&self, id: MemoryId) -> Result<Vec<MemoryUnit>> {
        crate::Store::ancestors(self, id)
    }

    fn leaves(&self, summary: MemoryId) -> Result<Vec<MemoryUnit>> {
        crate::Store::leaves(self, summary)
    }

    fn recent(&self, filter: &Filter, limit: usize) -> Result<Vec<MemoryUnit>> {
        crate::Store::recent(self, filter, limit)
    }

    fn search_vector(&self, query: Vec<f32>, k: usize, filter: &Filter) -> Result<Vec<Hit>> {
        crate::Store::search_vector(self, query, k, filter, None)
    }

    fn search_keyword(&self, query: &str, k: usize, filter: &Filter) -> Result<Vec<Hit>> {
        crate::Store::search_keyword(self, query, k, filter)
    }

    fn delete_many(&self, ids: &[MemoryId], policy: DeletePolicy) -> Result<DeleteReport> {
        crate::Store::delete_many(self, ids, policy)
    }

    fn threads(&self) -> Result<Vec<ThreadId>> {
        crate::Store::threads(self)
    }

    fn page(&self, filter: &Filter, cursor: Option<Cursor>, limit: usize) -> Result<Page> {
        crate::Store::page(self, filter, cursor, limit)
    }

    fn patch_metadata(&self, id: MemoryId, patch: Metadata) -> Result<MemoryUnit> {
        crate::Store::patch_metadata(self, id, patch)
    }

    fn thread_state(&self, thread: &ThreadId, name: &str) -> Result<Option<String>> {
        crate::Store::thread_state(self, thread, name)
    }

    fn set_thread_state(&self, state: ThreadState) -> Result<()> {
        crate::Store::set_thread_state(self, state)
    }

    fn existing(&self, ids: &[MemoryId]) -> Result<HashSet<MemoryId>> {
        crate::Store::existing(self, ids)
    }

    fn get_many(&self, ids: &[MemoryId]) -> Result<Vec<MemoryUnit>> {
        crate::Store::get_many(self, ids)
    }

    fn versions(&self, id: MemoryId) -> Result<Vec<MemoryUnit>> {
        crate::Store::versions(self, id)
    }

    fn expired(&self, limit: usize) -> Result<Vec<MemoryId>> {
        crate::Store::expired(self, limit)
    }

    fn set_expiry(&self, id: MemoryId, expires_at: Option<DateTime<Utc>>) -> Result<MemoryUnit> {
        crate::Store::set_expiry(self, id, expires_at)
    }
}
