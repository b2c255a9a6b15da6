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

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use cairn_core::{
    normalized, unit_norm, validate_vector, InputError, MemoryId, MemoryKind, MemoryUnit, Metadata,
    NewMemory, ThreadId,
};

use crate::{
    Cursor, DeletePolicy, DeleteReport, Filter, Hit, NewSummary, Page, Result, StoreError,
    StoreStats, ThreadState, TimelineEntry,
};

/// What every Cairn storage backend does: rows with their embeddings, summary links both
/// ways, vector and keyword search under a [`Filter`], thread reads and deletes under a
/// [`DeletePolicy`]. Every method blocks; every write is one transaction (all of it or
/// nothing), and an error means nothing was written. Methods may be called from several
/// threads at once, plain threads with no async runtime among them (context assembly on a
/// long thread reads through two at a time).
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

    /// Inserts many memories, for loads that are large beside the store (an import, a move
    /// from another store). Every item is checked first, so bad input (a bad memory or
    /// vector, an id twice) writes nothing. Then the items go in, in order, through
    /// [`insert_batch`](Self::insert_batch) in chunks of [`BULK_CHUNK`], one transaction each:
    /// an error past the checks (another writer took an id with other content, the database
    /// went away) keeps the chunks written before it, and a retry with the same ids completes
    /// the load, since a stored memory comes back as stored. A backend may take its vector
    /// index down while loading and build it again after, where that is faster than keeping
    /// it row by row (PostgreSQL); searches stay exact meanwhile.
    fn insert_bulk(&self, items: Vec<(NewMemory, Vec<f32>)>) -> Result<Vec<MemoryUnit>> {
        check_memories(&items, self.dimension())?;
        insert_chunked(self, items)
    }

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

    // What the harness needs beyond the rows: index-id reads for context assembly,
    // consolidation's writes, and housekeeping. An index id (`vid`) is a backend's own
    // never-reused number for a memory's vector (the HNSW id in SQLite, the row id in
    // PostgreSQL); it is only meaningful to the backend that gave it.

    /// The embedding model this store belongs to.
    fn model_id(&self) -> String;

    /// [`Self::get_many`] that skips ids with no memory (deleted meanwhile, say).
    fn get_found(&self, ids: &[MemoryId]) -> Result<Vec<MemoryUnit>>;

    /// Every memory `filter` admits, oldest first (ties by insertion): `limit` from `offset`.
    fn scan(&self, filter: &Filter, offset: usize, limit: usize) -> Result<Vec<MemoryUnit>>;

    /// The content and text `metadata.speaker` of every memory `filter` admits, oldest first.
    fn texts(&self, filter: &Filter) -> Result<Vec<(String, Option<String>)>>;

    /// The timeline of what `filter` admits (time, index id, speaker, length), oldest first.
    fn timeline_entries(&self, filter: &Filter) -> Result<Vec<TimelineEntry>>;

    /// The timeline entries of the memories whose index ids are `vids`, oldest first (ties by
    /// insertion); unknown ids are left out.
    fn timeline_of(&self, vids: &[u64]) -> Result<Vec<TimelineEntry>>;

    /// For each of `times`, up to `before` admitted entries before it and up to `after` at or
    /// after it, oldest first (see [`crate::Store::timeline_around`]).
    fn timeline_around(
        &self,
        filter: &Filter,
        times: &[DateTime<Utc>],
        before: usize,
        after: usize,
    ) -> Result<Vec<Vec<TimelineEntry>>>;

    /// Up to `limit` admitted entries, the oldest (or the newest when `newest`), oldest first,
    /// with whether more were admitted.
    fn timeline_page(
        &self,
        filter: &Filter,
        limit: usize,
        newest: bool,
    ) -> Result<(Vec<TimelineEntry>, bool)>;

    /// The distinct text `metadata.speaker` values of a thread's memories, in byte order.
    fn thread_speakers(&self, thread: &ThreadId) -> Result<Vec<String>>;

    /// A thread's summaries no summary cites, among the newest `per_level` of each level,
    /// oldest first.
    fn top_summaries(&self, thread: &ThreadId, per_level: usize) -> Result<Vec<MemoryUnit>>;

    /// How many live memories of `kinds` a thread holds.
    fn count_in_thread(&self, thread: &ThreadId, kinds: &[MemoryKind]) -> Result<usize>;

    /// [`Self::search_vector`] as (index id, similarity), best first, without reading rows;
    /// `ef` overrides the search breadth where the backend has one.
    fn search_vector_ids(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
        ef: Option<usize>,
    ) -> Result<Vec<(u64, f32)>>;

    /// [`Self::search_vector_ids`] with `k` counting distinct vectors: memories holding the
    /// same vector (the same text stored again) are one answer, as (the least index id among
    /// them, similarity, how many of them `filter` admits), best first. The counts are
    /// exact for the best answers until they add up to `k` (the `k` best memories, copies
    /// counted), and for all when fewer than `k` answers are found; a later one may be a
    /// lower bound. By default each memory is its own answer (a backend that does not tell
    /// copies apart).
    fn search_vector_groups(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
        ef: Option<usize>,
    ) -> Result<Vec<(u64, f32, usize)>> {
        Ok(self
            .search_vector_ids(query, k, filter, ef)?
            .into_iter()
            .map(|(v, s)| (v, s, 1))
            .collect())
    }

    /// For each of `vids`, a key that memories holding the same vector share (see
    /// [`Self::search_vector_groups`]; a copy the index did not find when it was inserted has
    /// a key of its own). By default
    /// each memory's own id.
    fn copy_keys(&self, vids: &[u64]) -> Result<Vec<u64>> {
        Ok(vids.to_vec())
    }

    /// The memories `filter` admits (its thread, kinds, levels, time window and visibility)
    /// that hold the same vector as memory `vid`, `vid` among them when admitted, as (index
    /// id, time), in id order. By default none are known: empty.
    fn copies_of(&self, vid: u64, filter: &Filter) -> Result<Vec<(u64, DateTime<Utc>)>> {
        let _ = (vid, filter);
        Ok(Vec::new())
    }

    /// [`Self::search_vector_ids`] scored exactly on every admitted memory, never through an
    /// approximate index.
    fn search_vector_ids_exact(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
    ) -> Result<Vec<(u64, f32)>>;

    /// [`Self::search_keyword`] as (index id, score), best first, without reading rows.
    fn search_keyword_ids(&self, query: &str, k: usize, filter: &Filter)
        -> Result<Vec<(u64, f32)>>;

    /// [`Self::search_keyword_ids`] over only the words of `query` that at most `max_matches`
    /// memories hold; empty when every word is more common.
    fn search_keyword_ids_capped(
        &self,
        query: &str,
        k: usize,
        filter: &Filter,
        max_matches: usize,
    ) -> Result<Vec<(u64, f32)>>;

    /// [`Self::search_keyword_ids_capped`] for several (`k`, filter) asks of one query, one
    /// ranking per ask in order, each as that method ranks it. A backend may count the
    /// query's words once for all of them (the default asks one at a time).
    fn search_keyword_ids_capped_each(
        &self,
        query: &str,
        asks: &[(usize, &Filter)],
        max_matches: usize,
    ) -> Result<Vec<Vec<(u64, f32)>>> {
        asks.iter()
            .map(|&(k, filter)| self.search_keyword_ids_capped(query, k, filter, max_matches))
            .collect()
    }

    /// The rows of ranked index ids, in the given order with their scores; ids whose row is
    /// gone are skipped.
    fn hits(&self, found: Vec<(u64, f32)>) -> Result<Vec<Hit>>;

    /// The cosine similarity of `query` to each memory of `vids`, in that order; unknown ids
    /// are left out.
    fn similarities(&self, query: Vec<f32>, vids: &[u64]) -> Result<Vec<(u64, f32)>>;

    /// The index ids of the level-0 memories under the summaries `summaries` (index ids),
    /// through every level, once each.
    fn leaf_vids(&self, summaries: &[u64]) -> Result<HashSet<u64>>;

    /// The summaries each summary of `summaries` (index ids) cites directly, as (summary,
    /// child) index id pairs: summaries in the order given (each once), each one's children
    /// in their order; continuation links left out, as are ids that are unknown or cite no
    /// summary. One statement for all of them.
    fn child_summary_vids(&self, summaries: &[u64]) -> Result<Vec<(u64, u64)>>;

    /// Stale summaries `filter` admits, lowest level first, then oldest; at most `limit`.
    fn stale_summaries(&self, filter: &Filter, limit: usize) -> Result<Vec<MemoryUnit>>;

    /// The oldest `limit` memories `filter` admits that no summary at `parent_level` cites.
    fn scan_uncovered_page(
        &self,
        filter: &Filter,
        parent_level: u32,
        limit: usize,
    ) -> Result<Vec<MemoryUnit>>;

    /// Raw memories that arrived after the level-1 conversation summary whose span holds
    /// their time, each with that summary, oldest first.
    fn late_arrivals(&self, filter: &Filter) -> Result<Vec<(MemoryId, MemoryId)>>;

    /// The memories of `kind` in `thread` inserted after sequence number `after`, in
    /// insertion order, with their sequence numbers (which only grow, never reused).
    fn thread_tail(
        &self,
        thread: &ThreadId,
        kind: MemoryKind,
        after: u64,
    ) -> Result<Vec<(MemoryUnit, u64)>>;

    /// The memories `ids`, in that order, with their sequence numbers; `NotFound` for one
    /// that is not stored.
    fn sequenced(&self, ids: &[MemoryId]) -> Result<Vec<(MemoryUnit, u64)>>;

    /// The highest sequence number given so far (0 for an empty store).
    fn last_sequence(&self) -> Result<u64>;

    /// A memory's stored embedding.
    fn embedding(&self, id: MemoryId) -> Result<Vec<f32>>;

    /// Counts per kind and level, stale summaries and links (and, in SQLite, index health).
    fn stats(&self) -> Result<StoreStats>;

    /// Replaces a memory's content (and metadata when given) and embedding; every summary
    /// above it is marked stale.
    fn update(
        &self,
        id: MemoryId,
        content: String,
        metadata: Option<Metadata>,
        embedding: Vec<f32>,
    ) -> Result<MemoryUnit>;

    /// Rewrites a summary from its current sources: content, metadata when given, embedding;
    /// clears its stale flag, recomputes level, span and source count, marks those above
    /// stale. `NotASummary` for a memory that is not one.
    fn refresh_summary(
        &self,
        id: MemoryId,
        content: String,
        metadata: Option<Metadata>,
        embedding: Vec<f32>,
    ) -> Result<MemoryUnit>;

    /// Replaces a memory's metadata whole (no merge).
    fn set_metadata(&self, id: MemoryId, metadata: Metadata) -> Result<MemoryUnit>;

    /// Appends sources to a summary, refusing cycles, and updates the level and span of it
    /// and of every summary above.
    fn extend_summary(&self, summary: MemoryId, sources: Vec<MemoryId>) -> Result<MemoryUnit>;

    /// Adds `source` to `summary` at its place in time and marks the summary and those above
    /// stale.
    fn place_source(&self, summary: MemoryId, source: MemoryId) -> Result<MemoryUnit>;

    /// Adds a summary that continues `previous` (a continuation link first), writing `state`
    /// in the same transaction (see [`crate::Store::add_continuation`]).
    fn add_continuation(
        &self,
        summary: NewSummary,
        previous: Option<MemoryId>,
        state: Option<ThreadState>,
        embedding: Vec<f32>,
    ) -> Result<MemoryUnit>;

    /// Removes every per-thread state value of `thread`.
    fn clear_thread_state(&self, thread: &ThreadId) -> Result<()>;

    /// Every memory for a backup: `on_start` gets the count, then `on_row` each memory whole
    /// (and its vector when `with_embeddings`), by level then insertion, so every summary
    /// comes after its sources. An error from a callback stops the read and is returned.
    fn backup_rows(
        &self,
        with_embeddings: bool,
        on_start: &mut dyn FnMut(usize) -> Result<()>,
        on_row: &mut dyn FnMut(MemoryUnit, Option<Vec<f32>>) -> Result<()>,
    ) -> Result<usize>;

    /// Writes memories read from a backup as they were (ids, times, links, flags), in one
    /// transaction, summaries after their sources; an id already stored is `DuplicateId`
    /// (see [`crate::Store::restore`] for every check).
    fn restore(&self, items: Vec<(MemoryUnit, Vec<f32>)>) -> Result<Vec<MemoryUnit>>;

    /// Writes what the backend keeps outside its rows (SQLite: the index snapshot). Nothing
    /// to do where everything is in the database.
    fn snapshot(&self) -> Result<()> {
        Ok(())
    }

    /// Erases from the backend's files what deleted memories left there (see
    /// [`crate::Store::erase_deleted`]); `true` when nothing of them is left. The default
    /// erases nothing and says so: PostgreSQL keeps a deleted row's bytes in its table's
    /// pages until they are reused (`VACUUM` frees the space, it does not overwrite it).
    fn erase_deleted(&self) -> Result<bool> {
        Ok(false)
    }

    /// Records that deletes about to be made are to be erased, so that an erase a process
    /// did not live to run is run by the next one (see [`crate::Store::mark_for_erase`]).
    /// Nothing to record where nothing is erased.
    fn mark_for_erase(&self) -> Result<()> {
        Ok(())
    }

    /// Rebuilds the vector index from the stored embeddings.
    fn reindex(&self) -> Result<()>;

    /// [`Self::delete_many`], with the text of every memory deleted (in the report's order):
    /// what an embedding cache keyed by text must forget too.
    fn delete_many_with_texts(
        &self,
        ids: &[MemoryId],
        policy: DeletePolicy,
    ) -> Result<(DeleteReport, Vec<String>)>;

    /// When each memory of `vids` happened; unknown ids are left out.
    fn times_of(&self, vids: &[u64]) -> Result<Vec<(u64, DateTime<Utc>)>>;

    /// The time span (earliest and latest source, through every level) of each summary of
    /// `vids`, in that order; ids that are not summaries are left out.
    #[allow(clippy::type_complexity)]
    fn summary_spans(&self, vids: &[u64]) -> Result<Vec<(u64, DateTime<Utc>, DateTime<Utc>)>>;

    /// The latest time a thread's newest level-1 summary covers (`None` without one).
    fn consolidated_until(&self, thread: &ThreadId) -> Result<Option<DateTime<Utc>>>;
    /// Finishes queued work and releases the backend; other handles to it see it closed.
    fn close(&self) -> Result<()> {
        Ok(())
    }
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

/// A level-1 conversation summary as late arrivals are matched to it: its id, insertion
/// sequence, and the span of its sources' times.
pub type SummarySpan = (MemoryId, i64, DateTime<Utc>, DateTime<Utc>);

/// [`MemoryBackend::child_summary_vids`]'s order from the links a backend read in any
/// order, each as (summary, position among its sources, child): summaries in the order of
/// `summaries` (a summary named twice answers at its first place), children by position.
pub fn order_child_links(summaries: &[u64], mut links: Vec<(u64, i64, u64)>) -> Vec<(u64, u64)> {
    let mut place: HashMap<u64, usize> = HashMap::with_capacity(summaries.len());
    for (i, v) in summaries.iter().enumerate() {
        place.entry(*v).or_insert(i);
    }
    links.sort_by_key(|&(s, pos, _)| (place.get(&s).copied().unwrap_or(usize::MAX), pos));
    links.into_iter().map(|(s, _, c)| (s, c)).collect()
}

/// [`MemoryBackend::late_arrivals`] from two reads each backend makes: `uncovered`, the raw
/// memories no level-1 summary cites (id, insertion sequence, time, thread; oldest first),
/// and `spans_of(thread)`, that thread's level-1 conversation summaries outside
/// continuation chains, ordered by (start, sequence). A memory's summary is the first of
/// those (in that order) whose span holds its time and that was written before it.
///
/// Matched by binary search over the spans, with a running maximum of their ends: the
/// cost grows with the memories times the log of the summaries (one correlated subquery
/// per memory made a first consolidation of a 50,000-turn thread quadratic).
pub fn match_late_arrivals(
    uncovered: Vec<(MemoryId, i64, DateTime<Utc>, ThreadId)>,
    mut spans_of: impl FnMut(&ThreadId) -> Result<Vec<SummarySpan>>,
) -> Result<Vec<(MemoryId, MemoryId)>> {
    // Per thread: its spans and the running maximum of their ends.
    let mut threads: std::collections::HashMap<ThreadId, (Vec<SummarySpan>, Vec<DateTime<Utc>>)> =
        std::collections::HashMap::new();
    let mut out = Vec::new();
    for (id, seq, at, thread) in uncovered {
        if !threads.contains_key(&thread) {
            let spans = spans_of(&thread)?;
            let mut reach = Vec::with_capacity(spans.len());
            for s in &spans {
                let end = reach.last().map_or(s.3, |r: &DateTime<Utc>| (*r).max(s.3));
                reach.push(end);
            }
            threads.insert(thread.clone(), (spans, reach));
        }
        let Some((spans, reach)) = threads.get(&thread) else {
            continue;
        };
        // Spans that start at or before `at`, from the first whose running end reaches it.
        let to = spans.partition_point(|s| s.2 <= at);
        let from = reach.partition_point(|r| *r < at);
        if let Some(s) = spans
            .get(from..to)
            .and_then(|c| c.iter().find(|s| s.3 >= at && s.1 < seq))
        {
            out.push((id, s.0));
        }
    }
    Ok(out)
}

/// Memories per transaction in [`MemoryBackend::insert_bulk`].
pub const BULK_CHUNK: usize = 1_000;

/// What an insert refuses in one memory and its vector, before anything is written: an
/// invalid memory, a summary (those go through `add_summary`), a vector of the wrong
/// size, not finite or all zero.
fn check_memory(m: &NewMemory, v: &[f32], dim: usize) -> Result<()> {
    m.validate()?;
    if m.kind == MemoryKind::Summary {
        return Err(InputError::UnknownName {
            what: "kind for insert (summaries go through add_summary)",
            value: "summary".into(),
        }
        .into());
    }
    validate_vector(v, dim)?;
    unit_norm(v)?;
    Ok(())
}

/// Checks a whole load as one insert would: every memory and vector, and no id twice.
pub fn check_memories(items: &[(NewMemory, Vec<f32>)], dim: usize) -> Result<()> {
    let mut seen = HashSet::new();
    for (m, v) in items {
        check_memory(m, v, dim)?;
        if let Some(id) = m.id {
            if !seen.insert(id) {
                return Err(StoreError::DuplicateId { id });
            }
        }
    }
    Ok(())
}

/// Inserts `items` in order through `insert_batch`, [`BULK_CHUNK`] per transaction
/// (the body of [`MemoryBackend::insert_bulk`]; call [`check_memories`] first).
pub fn insert_chunked<B: MemoryBackend + ?Sized>(
    backend: &B,
    items: Vec<(NewMemory, Vec<f32>)>,
) -> Result<Vec<MemoryUnit>> {
    let mut out = Vec::with_capacity(items.len());
    let mut rest = items.into_iter();
    loop {
        let chunk: Vec<_> = rest.by_ref().take(BULK_CHUNK).collect();
        if chunk.is_empty() {
            return Ok(out);
        }
        out.extend(backend.insert_batch(chunk)?);
    }
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
        check_memory(&m, &v, dim)?;
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

/// The checks of a memory read from a backup that need nothing stored (see
/// [`crate::Store::restore`]): text and metadata as for any insert; summary facts exactly on
/// summaries, with the same level in both places (at least 1); a raw memory at level 0;
/// sources not repeated and not the summary; a continued version that is the first source.
pub fn check_restored(u: &MemoryUnit) -> Result<()> {
    NewMemory::new(MemoryKind::Knowledge, u.content.clone())
        .with_metadata(u.metadata.clone())
        .validate()?;
    let bad = |name: &'static str, value: String, expected: &'static str| {
        StoreError::from(InputError::OutOfRange {
            name,
            value,
            expected,
        })
    };
    match (&u.summary, u.kind) {
        (None, MemoryKind::Summary) => {
            Err(bad("summary facts", "none".into(), "present for a summary"))
        }
        (Some(_), k) if k != MemoryKind::Summary => {
            Err(bad("summary facts", k.as_str().into(), "only on summaries"))
        }
        (None, _) if u.level != 0 => Err(bad("level", u.level.to_string(), "0 for a raw memory")),
        (Some(s), _) => {
            if u.level == 0 || s.level != u.level {
                return Err(bad(
                    "level",
                    format!("{} (summary facts say {})", u.level, s.level),
                    "at least 1 and the same in both places",
                ));
            }
            let mut seen = HashSet::new();
            for sid in &s.source_ids {
                if *sid == u.id {
                    return Err(StoreError::SelfReference { id: u.id });
                }
                if !seen.insert(*sid) {
                    return Err(StoreError::DuplicateSource { id: *sid });
                }
            }
            if let Some(c) = s.continues {
                if s.source_ids.first() != Some(&c) {
                    return Err(bad(
                        "continues",
                        c.to_string(),
                        "the summary's first source",
                    ));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Checks a restored summary's `level` against its sources' levels (in link order): the
/// level [`summary_level`] gives them, the first one a continuation link when the summary
/// `continues` it. Nothing to check without sources (all of them detached).
pub fn check_restored_level(level: u32, continues: bool, source_levels: &[u32]) -> Result<()> {
    if source_levels.is_empty() {
        return Ok(());
    }
    let links = source_levels
        .iter()
        .enumerate()
        .map(|(i, level)| (*level, continues && i == 0));
    if level == level_over(links) {
        Ok(())
    } else {
        Err(InputError::OutOfRange {
            name: "level",
            value: level.to_string(),
            expected: "1 + the highest level of the summary's sources (a continued version's own)",
        }
        .into())
    }
}

/// A summary's level: 1 + the highest level of its sources, a continuation link counting
/// its source's own level; at least 1.
pub fn summary_level(links: &[SourceLink]) -> u32 {
    level_over(links.iter().map(|s| (s.level, s.continues)))
}

/// [`summary_level`] over (level, continues) pairs.
fn level_over(links: impl Iterator<Item = (u32, bool)>) -> u32 {
    links
        .map(|(level, continues)| if continues { level } else { level + 1 })
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

    fn model_id(&self) -> String {
        self.options().model_id.clone()
    }

    fn get_found(&self, ids: &[MemoryId]) -> Result<Vec<MemoryUnit>> {
        crate::Store::get_found(self, ids)
    }

    fn scan(&self, filter: &Filter, offset: usize, limit: usize) -> Result<Vec<MemoryUnit>> {
        crate::Store::scan(self, filter, offset, limit)
    }

    fn texts(&self, filter: &Filter) -> Result<Vec<(String, Option<String>)>> {
        crate::Store::texts(self, filter)
    }

    fn timeline_entries(&self, filter: &Filter) -> Result<Vec<TimelineEntry>> {
        crate::Store::timeline_entries(self, filter)
    }

    fn timeline_of(&self, vids: &[u64]) -> Result<Vec<TimelineEntry>> {
        crate::Store::timeline_of(self, vids)
    }

    fn timeline_around(
        &self,
        filter: &Filter,
        times: &[DateTime<Utc>],
        before: usize,
        after: usize,
    ) -> Result<Vec<Vec<TimelineEntry>>> {
        crate::Store::timeline_around(self, filter, times, before, after)
    }

    fn timeline_page(
        &self,
        filter: &Filter,
        limit: usize,
        newest: bool,
    ) -> Result<(Vec<TimelineEntry>, bool)> {
        crate::Store::timeline_page(self, filter, limit, newest)
    }

    fn thread_speakers(&self, thread: &ThreadId) -> Result<Vec<String>> {
        crate::Store::thread_speakers(self, thread)
    }

    fn top_summaries(&self, thread: &ThreadId, per_level: usize) -> Result<Vec<MemoryUnit>> {
        crate::Store::top_summaries(self, thread, per_level)
    }

    fn count_in_thread(&self, thread: &ThreadId, kinds: &[MemoryKind]) -> Result<usize> {
        crate::Store::count_in_thread(self, thread, kinds)
    }

    fn search_vector_ids(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
        ef: Option<usize>,
    ) -> Result<Vec<(u64, f32)>> {
        crate::Store::search_vector_ids(self, query, k, filter, ef)
    }

    fn search_vector_groups(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
        ef: Option<usize>,
    ) -> Result<Vec<(u64, f32, usize)>> {
        crate::Store::search_vector_groups(self, query, k, filter, ef)
    }

    fn copy_keys(&self, vids: &[u64]) -> Result<Vec<u64>> {
        crate::Store::copy_keys(self, vids)
    }

    fn copies_of(&self, vid: u64, filter: &Filter) -> Result<Vec<(u64, DateTime<Utc>)>> {
        crate::Store::copies_of(self, vid, filter)
    }

    fn search_vector_ids_exact(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
    ) -> Result<Vec<(u64, f32)>> {
        crate::Store::search_vector_ids_exact(self, query, k, filter)
    }

    fn search_keyword_ids(
        &self,
        query: &str,
        k: usize,
        filter: &Filter,
    ) -> Result<Vec<(u64, f32)>> {
        crate::Store::search_keyword_ids(self, query, k, filter)
    }

    fn search_keyword_ids_capped(
        &self,
        query: &str,
        k: usize,
        filter: &Filter,
        max_matches: usize,
    ) -> Result<Vec<(u64, f32)>> {
        crate::Store::search_keyword_ids_capped(self, query, k, filter, max_matches)
    }

    fn search_keyword_ids_capped_each(
        &self,
        query: &str,
        asks: &[(usize, &Filter)],
        max_matches: usize,
    ) -> Result<Vec<Vec<(u64, f32)>>> {
        crate::Store::search_keyword_ids_capped_each(self, query, asks, max_matches)
    }

    fn hits(&self, found: Vec<(u64, f32)>) -> Result<Vec<Hit>> {
        crate::Store::hits(self, found)
    }

    fn similarities(&self, query: Vec<f32>, vids: &[u64]) -> Result<Vec<(u64, f32)>> {
        crate::Store::similarities(self, query, vids)
    }

    fn leaf_vids(&self, summaries: &[u64]) -> Result<HashSet<u64>> {
        crate::Store::leaf_vids(self, summaries)
    }

    fn child_summary_vids(&self, summaries: &[u64]) -> Result<Vec<(u64, u64)>> {
        crate::Store::child_summary_vids(self, summaries)
    }

    fn stale_summaries(&self, filter: &Filter, limit: usize) -> Result<Vec<MemoryUnit>> {
        crate::Store::stale_summaries(self, filter, limit)
    }

    fn scan_uncovered_page(
        &self,
        filter: &Filter,
        parent_level: u32,
        limit: usize,
    ) -> Result<Vec<MemoryUnit>> {
        crate::Store::scan_uncovered_page(self, filter, parent_level, limit)
    }

    fn late_arrivals(&self, filter: &Filter) -> Result<Vec<(MemoryId, MemoryId)>> {
        crate::Store::late_arrivals(self, filter)
    }

    fn thread_tail(
        &self,
        thread: &ThreadId,
        kind: MemoryKind,
        after: u64,
    ) -> Result<Vec<(MemoryUnit, u64)>> {
        crate::Store::thread_tail(self, thread, kind, after)
    }

    fn sequenced(&self, ids: &[MemoryId]) -> Result<Vec<(MemoryUnit, u64)>> {
        crate::Store::sequenced(self, ids)
    }

    fn last_sequence(&self) -> Result<u64> {
        crate::Store::last_sequence(self)
    }

    fn embedding(&self, id: MemoryId) -> Result<Vec<f32>> {
        crate::Store::embedding(self, id)
    }

    fn stats(&self) -> Result<StoreStats> {
        crate::Store::stats(self)
    }

    fn update(
        &self,
        id: MemoryId,
        content: String,
        metadata: Option<Metadata>,
        embedding: Vec<f32>,
    ) -> Result<MemoryUnit> {
        crate::Store::update(self, id, content, metadata, embedding)
    }

    fn refresh_summary(
        &self,
        id: MemoryId,
        content: String,
        metadata: Option<Metadata>,
        embedding: Vec<f32>,
    ) -> Result<MemoryUnit> {
        crate::Store::refresh_summary(self, id, content, metadata, embedding)
    }

    fn set_metadata(&self, id: MemoryId, metadata: Metadata) -> Result<MemoryUnit> {
        crate::Store::set_metadata(self, id, metadata)
    }

    fn extend_summary(&self, summary: MemoryId, sources: Vec<MemoryId>) -> Result<MemoryUnit> {
        crate::Store::extend_summary(self, summary, sources)
    }

    fn place_source(&self, summary: MemoryId, source: MemoryId) -> Result<MemoryUnit> {
        crate::Store::place_source(self, summary, source)
    }

    fn add_continuation(
        &self,
        summary: NewSummary,
        previous: Option<MemoryId>,
        state: Option<ThreadState>,
        embedding: Vec<f32>,
    ) -> Result<MemoryUnit> {
        crate::Store::add_continuation(self, summary, previous, state, embedding)
    }

    fn clear_thread_state(&self, thread: &ThreadId) -> Result<()> {
        crate::Store::clear_thread_state(self, thread)
    }

    fn backup_rows(
        &self,
        with_embeddings: bool,
        on_start: &mut dyn FnMut(usize) -> Result<()>,
        on_row: &mut dyn FnMut(MemoryUnit, Option<Vec<f32>>) -> Result<()>,
    ) -> Result<usize> {
        crate::Store::backup_rows(self, with_embeddings, on_start, on_row)
    }

    fn restore(&self, items: Vec<(MemoryUnit, Vec<f32>)>) -> Result<Vec<MemoryUnit>> {
        crate::Store::restore(self, items)
    }

    fn snapshot(&self) -> Result<()> {
        crate::Store::snapshot(self)
    }

    fn erase_deleted(&self) -> Result<bool> {
        crate::Store::erase_deleted(self)
    }

    fn mark_for_erase(&self) -> Result<()> {
        crate::Store::mark_for_erase(self)
    }

    fn reindex(&self) -> Result<()> {
        crate::Store::reindex(self)
    }

    fn close(&self) -> Result<()> {
        self.clone().close()
    }

    fn delete_many_with_texts(
        &self,
        ids: &[MemoryId],
        policy: DeletePolicy,
    ) -> Result<(DeleteReport, Vec<String>)> {
        crate::Store::delete_many_with_texts(self, ids, policy)
    }

    fn times_of(&self, vids: &[u64]) -> Result<Vec<(u64, DateTime<Utc>)>> {
        crate::Store::times_of(self, vids)
    }

    fn summary_spans(&self, vids: &[u64]) -> Result<Vec<(u64, DateTime<Utc>, DateTime<Utc>)>> {
        crate::Store::summary_spans(self, vids)
    }

    fn consolidated_until(&self, thread: &ThreadId) -> Result<Option<DateTime<Utc>>> {
        crate::Store::consolidated_until(self, thread)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(minute: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap() + chrono::Duration::minutes(minute)
    }

    /// The matcher picks, among the spans holding a memory's time and written before it,
    /// the first by (start, sequence), over spans that overlap, nest and end early, as the
    /// one-query-per-memory definition does (checked against it on every minute).
    #[test]
    fn late_arrivals_match_the_earliest_span_written_before() {
        let th = ThreadId::new("t").unwrap();
        let ids: Vec<MemoryId> = (0..6).map(|_| MemoryId::new()).collect();
        // (start, end, sequence): a long early span written late, nested and
        // overlapping spans, one that ends early.
        let raw = [
            (0, 100, 50),
            (10, 20, 5),
            (15, 40, 6),
            (30, 35, 7),
            (45, 60, 8),
            (45, 50, 9),
        ];
        let spans: Vec<SummarySpan> = raw
            .iter()
            .zip(&ids)
            .map(|((a, b, seq), id)| (*id, *seq, t(*a), t(*b)))
            .collect();
        let mut sorted = spans.clone();
        sorted.sort_by_key(|s| (s.2, s.1));
        for seq in [1, 10, 60] {
            let uncovered: Vec<_> = (-5..110)
                .map(|m| (MemoryId::new(), seq, t(m), th.clone()))
                .collect();
            let want: Vec<(MemoryId, MemoryId)> = uncovered
                .iter()
                .filter_map(|(id, s, at, _)| {
                    sorted
                        .iter()
                        .find(|sp| sp.2 <= *at && sp.3 >= *at && sp.1 < *s)
                        .map(|sp| (*id, sp.0))
                })
                .collect();
            let got = match_late_arrivals(uncovered, |_| Ok(sorted.clone())).unwrap();
            assert_eq!(got, want, "sequence {seq}");
            if seq == 60 {
                assert_eq!(got.len(), 101, "minutes 0 to 100 lie in the first span");
            }
        }
    }
}
