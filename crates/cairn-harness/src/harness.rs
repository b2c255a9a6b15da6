//! [`MemoryHarness`]: the async API.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use cairn_core::{
    Clock, EmbedError, Embedder, MemoryId, MemoryKind, MemoryUnit, Metadata, NewMemory, Role,
    Summarizer, SummaryType, SystemClock, ThreadId, TokenCounter,
};
use cairn_embed::{CacheStats, CachedEmbedder, FastEmbedder};
use cairn_store::{
    DeletePolicy, DeleteReport, Filter, HnswParams, MemoryBackend, NewSummary, Store, StoreOptions,
    StoreStats,
};

use crate::{HarnessError, Result};

/// How a search ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchMode {
    /// Cosine similarity of embeddings (HNSW).
    Vector,
    /// BM25 over words (SQLite FTS5).
    Keyword,
    /// Reciprocal rank fusion of both. The default: within a point of keyword search on
    /// LoCoMo's name-heavy questions and, unlike it, robust to paraphrase (docs/evaluation.md).
    #[default]
    Hybrid,
}

impl std::str::FromStr for SearchMode {
    type Err = cairn_core::InputError;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "vector" => Ok(Self::Vector),
            "keyword" => Ok(Self::Keyword),
            "hybrid" => Ok(Self::Hybrid),
            other => Err(cairn_core::InputError::UnknownName {
                what: "SearchMode",
                value: other.chars().take(64).collect(),
            }),
        }
    }
}

/// The constant of reciprocal rank fusion: score = Σ 1 / (RRF_K + rank).
pub const RRF_K: f32 = 60.0;

/// What to search and how.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SearchOptions {
    /// How many results; default 3 when searching only summaries, 10 otherwise.
    pub k: Option<usize>,
    /// Which memories.
    pub filter: Filter,
    /// Drop results scoring below this (cosine for vector, fused score for hybrid, negated
    /// BM25 for keyword).
    pub min_score: Option<f32>,
    /// How to rank.
    pub mode: SearchMode,
    /// Recency decay: a hit's score is halved for every `half_life` it is older than the
    /// newest of 4k candidates (the same ranking as ages from now, without decaying every
    /// score of an old store to zero), before the best k are kept. Off by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub half_life: Option<std::time::Duration>,
}

impl SearchOptions {
    /// Every kind, k = 10, hybrid.
    pub fn all() -> Self {
        Self::default()
    }

    /// Summaries only, k = 3 (memharness's `search(memory_type=SUMMARY)`).
    pub fn summaries() -> Self {
        Self::default().kinds([MemoryKind::Summary])
    }

    /// Only these kinds.
    pub fn kinds(mut self, kinds: impl IntoIterator<Item = MemoryKind>) -> Self {
        self.filter.kinds = kinds.into_iter().collect();
        self
    }

    /// Only this thread.
    pub fn thread(mut self, thread: ThreadId) -> Self {
        self.filter.thread = Some(thread);
        self
    }

    /// Only levels in `min..=max`.
    pub fn levels(mut self, min: u32, max: u32) -> Self {
        self.filter.min_level = Some(min);
        self.filter.max_level = Some(max);
        self
    }

    /// Only memories created in `[after, before)`.
    pub fn between(mut self, after: DateTime<Utc>, before: DateTime<Utc>) -> Self {
        self.filter.after = Some(after);
        self.filter.before = Some(before);
        self
    }

    /// Replaces the filter.
    pub fn filter(mut self, filter: Filter) -> Self {
        self.filter = filter;
        self
    }

    /// Only memories whose metadata meets `condition` (added to the others).
    pub fn meta(mut self, condition: cairn_store::MetaFilter) -> Self {
        self.filter.metadata.push(condition);
        self
    }

    /// How many results.
    pub fn k(mut self, k: usize) -> Self {
        self.k = Some(k);
        self
    }

    /// The minimum score.
    pub fn min_score(mut self, s: f32) -> Self {
        self.min_score = Some(s);
        self
    }

    /// Recency decay with this half-life (see [`Self::half_life`]).
    pub fn half_life(mut self, h: std::time::Duration) -> Self {
        self.half_life = Some(h);
        self
    }

    /// The ranking.
    pub fn mode(mut self, mode: SearchMode) -> Self {
        self.mode = mode;
        self
    }

    /// The effective k.
    pub fn effective_k(&self) -> usize {
        self.k.unwrap_or(
            if self.filter.kinds.len() == 1 && self.filter.kinds[0] == MemoryKind::Summary {
                3
            } else {
                10
            },
        )
    }
}

/// A search result.
pub type SearchHit = cairn_store::Hit;

/// A summary and everything under it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryTree {
    /// The memory at this node.
    pub memory: MemoryUnit,
    /// Its sources, in order (empty for raw memories, and below the depth asked for).
    pub children: Vec<SummaryTree>,
    /// True when the node has sources that were left out (the depth bound).
    #[serde(default)]
    pub truncated: bool,
}

/// The deepest [`MemoryHarness::summary_tree`] goes below its root: far beyond what
/// consolidation builds (levels up to 4 by default), a bound on a hand-made deep chain.
pub const MAX_TREE_DEPTH: usize = 64;

impl SummaryTree {
    /// Nodes in the tree (shared sources count once per path).
    pub fn len(&self) -> usize {
        1 + self.children.iter().map(SummaryTree::len).sum::<usize>()
    }

    /// Always false: a tree has its root.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Height: 0 for a raw memory.
    pub fn depth(&self) -> usize {
        self.children
            .iter()
            .map(|c| 1 + c.depth())
            .max()
            .unwrap_or(0)
    }
}

/// Counts and health of a harness.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HarnessStats {
    /// The store's figures.
    pub store: StoreStats,
    /// Embedding cache hits and misses (zero when the cache is off).
    pub embedding_cache: CacheStats,
    /// The embedding model.
    pub model_id: String,
}

pub(crate) struct Inner {
    /// The backend every call goes through.
    pub store: Arc<dyn MemoryBackend>,
    /// The same store when it is the embedded SQLite one (its index checks and tools).
    pub sqlite: Option<Store>,
    pub embedder: Arc<dyn Embedder>,
    pub cache: Option<Arc<CachedEmbedder>>,
    /// The default summarizer's sentence vectors (in memory only; emptied when a memory
    /// leaves the store, rid of a replaced text's own). `None` with a summarizer of the
    /// caller's.
    pub sentences: Option<Arc<crate::extractive::SentenceMemo>>,
    pub summarizer: Arc<dyn Summarizer>,
    pub token_counter: Arc<dyn TokenCounter>,
    pub clock: Arc<dyn Clock>,
    pub delete_policy: DeletePolicy,
    /// Where the store is: its SQLite path, or the PostgreSQL URL without its password.
    pub location: String,
}

/// The memory store for agents: every memory in SQLite with its embedding, an HNSW index,
/// and summaries linked both ways to what they summarize.
///
/// A cheap `Clone + Send + Sync` handle. Every blocking step (SQLite, inference, index work)
/// runs on tokio's blocking pool, never on a worker thread.
#[derive(Clone)]
pub struct MemoryHarness {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for MemoryHarness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryHarness")
            .field("backend", &self.inner.store.backend_name())
            .field("location", &self.inner.location)
            .field("model", &self.inner.embedder.model_id())
            .field("summarizer", &self.inner.summarizer.name())
            .finish_non_exhaustive()
    }
}

type StoreOptionsFn = Box<dyn FnOnce(&mut StoreOptions) + Send>;

/// Builds a [`MemoryHarness`]; every choice has a documented default.
pub struct HarnessBuilder {
    path: PathBuf,
    embedder: Option<Arc<dyn Embedder>>,
    summarizer: Option<Arc<dyn Summarizer>>,
    token_counter: Option<Arc<dyn TokenCounter>>,
    clock: Arc<dyn Clock>,
    hnsw: HnswParams,
    delete_policy: DeletePolicy,
    cache: bool,
    cache_capacity: usize,
    configure: Option<StoreOptionsFn>,
    reembed: bool,
}

impl HarnessBuilder {
    /// The embedder. Default: [`FastEmbedder`] (all-MiniLM-L6-v2, fetched on first use).
    pub fn embedder(mut self, e: Arc<dyn Embedder>) -> Self {
        self.embedder = Some(e);
        self
    }

    /// The summarizer used by consolidation and conversation memories. Default:
    /// [`crate::ExtractiveSummarizer`] over the harness's embedder.
    pub fn summarizer(mut self, s: Arc<dyn Summarizer>) -> Self {
        self.summarizer = Some(s);
        self
    }

    /// The token counter for budgets. Default: cl100k_base ([`crate::TiktokenCounter`]).
    pub fn token_counter(mut self, c: Arc<dyn TokenCounter>) -> Self {
        self.token_counter = Some(c);
        self
    }

    /// The clock. Default: the system clock.
    pub fn clock(mut self, c: Arc<dyn Clock>) -> Self {
        self.clock = c;
        self
    }

    /// HNSW parameters. Default: M 16, ef_construction 200, ef_search 64.
    pub fn hnsw(mut self, p: HnswParams) -> Self {
        self.hnsw = p;
        self
    }

    /// The policy of [`MemoryHarness::delete`]. Default: `Restrict`.
    pub fn delete_policy(mut self, p: DeletePolicy) -> Self {
        self.delete_policy = p;
        self
    }

    /// Whether embeddings are cached by text (in the same database file). Default: on.
    pub fn embedding_cache(mut self, on: bool) -> Self {
        self.cache = on;
        self
    }

    /// The most vectors the embedding cache keeps (at least 1); the least recently used go
    /// first (see [`CachedEmbedder`]). Default: [`cairn_embed::DEFAULT_CACHE_CAPACITY`]
    /// (50,000, about 77 MB for MiniLM). Deleting memories purges their texts' vectors.
    pub fn embedding_cache_capacity(mut self, entries: usize) -> Self {
        self.cache_capacity = entries;
        self
    }

    /// When the SQLite store was built with another model (or dimension): re-embed every
    /// memory with this builder's embedder before opening it, instead of failing with
    /// [`cairn_store::StoreError::ModelMismatch`]. The summaries consolidation wrote get
    /// their vector as it writes them (the mean of their text's and their sources'
    /// centroid), the others their text's. A failure (the model's, say) leaves the store on
    /// its old model, and nothing is lost either way. The model runs outside the write lock
    /// (see [`Store::reembed`]): other processes go on reading and writing meanwhile, and
    /// what they write is re-embedded too, in the last transaction. A handle
    /// still open on the old model (another process's) is refused with `ModelMismatch` at its
    /// next search, context or write of a vector, and writes nothing; it reopens with the
    /// new model. Two processes building with the same new model at once: one re-embeds,
    /// the other opens the re-embedded store.
    /// On PostgreSQL a store of another model is `Unsupported` for now. Default: off (a
    /// mismatch is an error).
    pub fn reembed(mut self, on: bool) -> Self {
        self.reembed = on;
        self
    }

    /// Adjusts any other store option (read pool, thresholds, synchronous mode).
    pub fn store_options(mut self, f: impl FnOnce(&mut StoreOptions) + Send + 'static) -> Self {
        self.configure = Some(Box::new(f));
        self
    }

    /// Opens the store (creating it if needed) and loads the model.
    pub async fn build(self) -> Result<MemoryHarness> {
        let HarnessBuilder {
            path,
            embedder,
            summarizer,
            token_counter,
            clock,
            hnsw,
            delete_policy,
            cache,
            cache_capacity,
            configure,
            reembed,
        } = self;
        let base: Arc<dyn Embedder> = match embedder {
            Some(e) => e,
            None => Arc::new(blocking(FastEmbedder::new).await??),
        };
        let (store, sqlite, location): (Arc<dyn MemoryBackend>, Option<Store>, String) =
            match postgres_url(&path) {
                #[cfg(feature = "postgres")]
                Some(url) => {
                    let (url, schema) = split_schema(url);
                    let location = display_location(Path::new(&url));
                    let mut options = cairn_pg::PgOptions::new(url, base.model_id(), base.dim())
                        .clock(clock.clone());
                    if let Some(schema) = schema {
                        options = options.schema(schema);
                    }
                    let store = match blocking(move || cairn_pg::PgStore::open(options)).await? {
                        Err(cairn_store::StoreError::ModelMismatch { .. }) if reembed => {
                            return Err(HarnessError::Store(cairn_store::StoreError::Unsupported {
                                backend: "postgres",
                                what: "re-embedding a store built with another model",
                            }))
                        }
                        r => r?,
                    };
                    (Arc::new(store), None, location)
                }
                #[cfg(not(feature = "postgres"))]
                Some(_) => {
                    return Err(HarnessError::Store(cairn_store::StoreError::Unsupported {
                        backend: "this build",
                        what: "postgres:// locations (enable the `postgres` feature)",
                    }))
                }
                None => {
                    let mut options = StoreOptions::new(base.model_id(), base.dim())
                        .hnsw(hnsw)
                        .clock(clock.clone());
                    if let Some(f) = configure {
                        f(&mut options);
                    }
                    let store_path = path.clone();
                    let reopen = options.clone();
                    let store = match blocking(move || Store::open(store_path, options)).await? {
                        Err(cairn_store::StoreError::ModelMismatch {
                            stored_model,
                            stored_dim,
                            ..
                        }) if reembed => {
                            let (store_path, e) = (path.clone(), base.clone());
                            blocking(move || {
                                let mut old = reopen.clone();
                                old.model_id.clone_from(&stored_model);
                                old.dim = stored_dim;
                                tracing::info!(
                                    from = %stored_model,
                                    to = %e.model_id(),
                                    "re-embedding the store with the new model"
                                );
                                let done = Store::reembed_blending(
                                    &store_path,
                                    old,
                                    e.model_id(),
                                    e.dim(),
                                    |texts| Ok(e.embed_checked(texts)?),
                                    |m| m.contains_key(crate::consolidate::CONSOLIDATION_KEY),
                                );
                                match done {
                                    // The model's own error, returned as itself.
                                    Err(cairn_store::StoreError::Embedding {
                                        reason,
                                        source: Some(source),
                                    }) => {
                                        return Err(match source.downcast::<EmbedError>() {
                                            Ok(x) => HarnessError::Embed(*x),
                                            Err(source) => cairn_store::StoreError::Embedding {
                                                reason,
                                                source: Some(source),
                                            }
                                            .into(),
                                        });
                                    }
                                    // Another process re-embedded it with this model meanwhile.
                                    Err(cairn_store::StoreError::ModelMismatch {
                                        stored_model: now_on,
                                        stored_dim: now_dim,
                                        ..
                                    }) if now_on == e.model_id() && now_dim == e.dim() => {}
                                    r => r?,
                                }
                                Ok::<_, HarnessError>(Store::open(store_path, reopen)?)
                            })
                            .await??
                        }
                        r => r?,
                    };
                    let location = path.display().to_string();
                    (Arc::new(store.clone()), Some(store), location)
                }
            };
        // The embedding cache lives in the SQLite file; a PostgreSQL store runs without it.
        let (embedder, cache) = if let (true, Some(store)) = (cache, sqlite.clone()) {
            let inner = base.clone();
            let c = Arc::new(
                blocking(move || {
                    let c = CachedEmbedder::open_with_capacity(inner, path, cache_capacity)?;
                    finish_forgets(&store);
                    // Vectors of a model the store was on before a re-embedding: no call
                    // reads them again.
                    match c.drop_other_models() {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(
                            entries = n,
                            "dropped the embedding cache's vectors of other models"
                        ),
                        Err(e) => {
                            tracing::warn!(error = %e, "the embedding cache keeps other models' vectors");
                        }
                    }
                    Ok::<_, cairn_core::EmbedError>(c)
                })
                .await??,
            );
            (c.clone() as Arc<dyn Embedder>, Some(c))
        } else {
            if let Some(store) = sqlite.clone() {
                blocking(move || finish_forgets(&store)).await?;
            }
            (base, None)
        };
        // The default summarizer weighs sentences, not memories: it reads the cache but does
        // not fill it, so the cache holds no text a forget could not name.
        let (summarizer, sentences) = match summarizer {
            Some(s) => (s, None),
            None => {
                let memo = Arc::new(crate::extractive::SentenceMemo::new(match &cache {
                    Some(c) => c.unstored(),
                    None => embedder.clone(),
                }));
                let s: Arc<dyn Summarizer> =
                    Arc::new(crate::ExtractiveSummarizer::new(memo.clone()));
                (s, Some(memo))
            }
        };
        let token_counter = match token_counter {
            Some(c) => c,
            None => Arc::new(blocking(crate::TiktokenCounter::cl100k).await??),
        };
        Ok(MemoryHarness {
            inner: Arc::new(Inner {
                store,
                sqlite,
                embedder,
                cache,
                sentences,
                summarizer,
                token_counter,
                clock,
                delete_policy,
                location,
            }),
        })
    }
}

/// Purges from the embedding cache the vectors of `texts` (memories deleted or forgotten)
/// and of what the extractive summarizer derived from them (sentences, a summary's lines:
/// what versions before 7fa3dc1 stored too), through this handle's cache or, when it is off,
/// the file's cache table an earlier open may have filled; the sentence memo is emptied.
/// `false` when that failed (logged: the texts stay until an open finishes a forget or they
/// are evicted).
pub(crate) fn purge_cached(inner: &Inner, texts: &[String]) -> bool {
    if texts.is_empty() {
        return true;
    }
    if let Some(memo) = &inner.sentences {
        memo.clear();
    }
    let all: Vec<String> = texts
        .iter()
        .flat_map(|t| crate::extractive::derived_texts(t))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    purge_texts(inner, &all)
}

/// Purges what the text `old` leaves behind when `new` replaces it in one memory (an
/// update, a summary written again): the texts derived from `old` (see [`purge_cached`])
/// that are not derived from `new`, from the cache and from the sentence memo (whose other
/// sentences stay: a roll-up above a summary written again reads its lines, most of them
/// the old text's, without embedding them again).
pub(crate) fn purge_replaced(inner: &Inner, old: &str, new: &str) -> bool {
    if old == new {
        return true;
    }
    let kept: BTreeSet<String> = crate::extractive::derived_texts(new).into_iter().collect();
    let gone: Vec<String> = crate::extractive::derived_texts(old)
        .into_iter()
        .filter(|t| !kept.contains(t))
        .collect();
    if let Some(memo) = &inner.sentences {
        let refs: Vec<&str> = gone.iter().map(String::as_str).collect();
        memo.remove(&refs);
    }
    purge_texts(inner, &gone)
}

/// Drops `texts` from this handle's cache or, when it is off, the file's cache table.
fn purge_texts(inner: &Inner, texts: &[String]) -> bool {
    if texts.is_empty() {
        return true;
    }
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let done = match (&inner.cache, &inner.sqlite) {
        (Some(cache), _) => cache.purge(&refs),
        (None, Some(store)) => cairn_embed::purge_file(store.path(), &refs),
        (None, None) => Ok(0),
    };
    match done {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "texts no longer in the store stay in the embedding cache");
            false
        }
    }
}

/// Deletes the summaries `marks` list that still exist, with what was built on them since
/// (Cascade): those a forget had not written again. How many went, and their texts.
pub(crate) fn delete_listed(
    store: &Store,
    marks: &[cairn_store::ForgetMark],
) -> cairn_store::Result<(usize, Vec<String>)> {
    let listed: Vec<MemoryId> = marks
        .iter()
        .flat_map(|m| m.summaries.iter().copied())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let found = store.existing(&listed)?;
    let left: Vec<MemoryId> = listed.into_iter().filter(|i| found.contains(i)).collect();
    if left.is_empty() {
        return Ok((0, Vec::new()));
    }
    let (r, texts) = store.delete_many_with_texts(&left, DeletePolicy::Cascade)?;
    Ok((r.deleted.len(), texts))
}

/// Finishes what forgets that did not live to the end left (see [`Store::mark_forget`]):
/// the summaries they were to write again and had not are deleted, with every summary
/// built on them since (their sources stay; the next consolidation summarizes them
/// again), the embedding cache keeps only the vectors of texts the store's memories may
/// have had embedded (the texts those forgets were to purge are not known any more; query
/// vectors go too), whether or not this handle has its cache on, and the store is erased
/// again so that its log and free pages keep none of it. Nothing is done while any forget
/// is under way (it holds the forget lock, in this process or another: its mark may not
/// be left behind at all). A failure is logged and the marks stay for the next open.
fn finish_forgets(store: &Store) {
    // Most opens find no mark: one read, no lock file touched.
    match store.forget_marks() {
        Ok(m) if m.is_empty() => return,
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %e, "could not read the store's forget marks");
            return;
        }
    }
    let _lock = match store.try_lock_forgets() {
        Ok(Some(l)) => l,
        Ok(None) => {
            tracing::info!("a forget is under way; what earlier ones left waits for the next open");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not take the forget lock");
            return;
        }
    };
    // Read again under the lock: a forget that ended meanwhile has cleared its own.
    let marks = match store.forget_marks() {
        Ok(m) if m.is_empty() => return,
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the store's forget marks");
            return;
        }
    };
    let done = (|| -> std::result::Result<(usize, usize), String> {
        let _lock = _lock;
        // The erase mark first: should this not finish, the next open erases too.
        store.mark_for_erase().map_err(|e| e.to_string())?;
        let (deleted, _) = delete_listed(store, &marks).map_err(|e| e.to_string())?;
        let mut keep = std::collections::HashSet::new();
        store
            .for_each_text(|t| {
                keep.extend(
                    crate::extractive::derived_texts(t)
                        .iter()
                        .map(|d| cairn_embed::text_key(d)),
                );
            })
            .map_err(|e| e.to_string())?;
        let purged = cairn_embed::retain_file(store.path(), &keep).map_err(|e| e.to_string())?;
        let names: Vec<String> = marks.iter().map(|m| m.name.clone()).collect();
        store
            .clear_forget_marks(&names)
            .map_err(|e| e.to_string())?;
        Ok((deleted, purged))
    })();
    match done {
        Ok((deleted, purged)) => {
            tracing::info!(
                forgets = marks.len(),
                summaries_deleted = deleted,
                cache_entries_purged = purged,
                "finished forgets an earlier process left"
            );
            if let Err(e) = store.erase_deleted() {
                tracing::warn!(error = %e, "what they deleted stays in the files until the next erase");
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "forgets an earlier process left are not finished; retried at the next open");
        }
    }
}

/// The PostgreSQL URL `path` holds, if it is one (`postgres://` or `postgresql://`).
fn postgres_url(path: &Path) -> Option<String> {
    let s = path.to_str()?;
    is_postgres_url(s).then(|| s.to_owned())
}

/// Whether a store location is a PostgreSQL URL (`postgres://` or `postgresql://`) rather
/// than a SQLite file path. Such a URL may carry Cairn's own `schema=NAME` parameter: the
/// schema holding the store (default `cairn`).
pub fn is_postgres_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

/// `url` with its `schema=` parameter set to `schema` (replacing any), for opening another
/// store in the same database.
pub fn with_schema(url: &str, schema: &str) -> String {
    let (base, _) = split_schema(url.to_owned());
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}schema={schema}")
}

/// The schema named in a PostgreSQL URL's `schema=` parameter, if any.
pub fn schema_of(url: &str) -> Option<String> {
    split_schema(url.to_owned()).1
}

/// Takes Cairn's own `schema=NAME` parameter out of a PostgreSQL URL (the driver refuses
/// parameters it does not know): the URL without it, and the schema when given.
fn split_schema(url: String) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url, None);
    };
    let mut schema = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|kv| match kv.strip_prefix("schema=") {
            Some(v) => {
                schema = Some(v.to_owned());
                false
            }
            None => !kv.is_empty(),
        })
        .collect();
    let url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    (url, schema)
}

/// A store location for messages and logs: a SQLite path as it is, a PostgreSQL URL
/// without its password.
pub fn display_location(location: &Path) -> String {
    match location.to_str() {
        Some(s) if is_postgres_url(s) => redact(s),
        _ => location.display().to_string(),
    }
}

/// A PostgreSQL URL without its password, for messages and logs.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (auth, host) = match rest.rsplit_once('@') {
        Some((auth, host)) => (auth, host),
        None => return url.to_owned(),
    };
    let user = auth.split_once(':').map_or(auth, |(u, _)| u);
    format!("{scheme}://{user}@{host}")
}

/// Runs blocking work on tokio's blocking pool.
pub(crate) async fn blocking<R: Send + 'static>(
    f: impl FnOnce() -> R + Send + 'static,
) -> Result<R> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| HarnessError::Task(e.to_string()))
}

fn thread(t: &str) -> Result<ThreadId> {
    Ok(ThreadId::new(t)?)
}

impl MemoryHarness {
    /// Opens the store at `path` with the embedded defaults: SQLite + the local MiniLM model
    /// (fetched on first use), extractive summaries, cl100k_base token counts.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::builder(path).build().await
    }

    /// A builder for every choice.
    pub fn builder(path: impl AsRef<Path>) -> HarnessBuilder {
        HarnessBuilder {
            path: path.as_ref().to_owned(),
            embedder: None,
            summarizer: None,
            token_counter: None,
            clock: Arc::new(SystemClock),
            hnsw: HnswParams::default(),
            delete_policy: DeletePolicy::Restrict,
            cache: true,
            cache_capacity: cairn_embed::DEFAULT_CACHE_CAPACITY,
            configure: None,
            reembed: false,
        }
    }

    /// The underlying store backend (synchronous; call it off the runtime).
    ///
    /// Its writes bypass the harness: a delete or an update made here leaves the old text's
    /// vector in the embedding cache (and its sentences in the summarizer's memory) until
    /// evicted, and is not erased from the files. Use [`Self::delete`], [`Self::update`]
    /// and [`Self::forget`] for those.
    pub fn store(&self) -> &dyn MemoryBackend {
        self.inner.store.as_ref()
    }

    /// The embedded SQLite store, when that is the backend (its index checks, snapshots and
    /// tools); `None` on PostgreSQL.
    pub fn sqlite(&self) -> Option<&Store> {
        self.inner.sqlite.as_ref()
    }

    /// Where the store is: its SQLite path, or its PostgreSQL URL without the password.
    pub fn location(&self) -> &str {
        &self.inner.location
    }

    /// The embedder in use.
    pub fn embedder(&self) -> &Arc<dyn Embedder> {
        &self.inner.embedder
    }

    /// The embedding cache, when it is on (synchronous; call it off the runtime).
    pub fn embedding_cache(&self) -> Option<&Arc<CachedEmbedder>> {
        self.inner.cache.as_ref()
    }

    /// The summarizer in use.
    pub fn summarizer(&self) -> &Arc<dyn Summarizer> {
        &self.inner.summarizer
    }

    /// The token counter in use.
    pub fn token_counter(&self) -> &Arc<dyn TokenCounter> {
        &self.inner.token_counter
    }

    /// The clock in use.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// Embeds texts off the runtime.
    pub async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>> {
        let e = self.inner.embedder.clone();
        Ok(blocking(move || {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            e.embed_checked(&refs)
        })
        .await??)
    }

    /// Adds any memory; returns its id.
    pub async fn add(&self, memory: NewMemory) -> Result<MemoryId> {
        Ok(self.add_many(vec![memory]).await?.remove(0))
    }

    /// Adds memories in one transaction (all or none), embedding them in batches.
    pub async fn add_many(&self, memories: Vec<NewMemory>) -> Result<Vec<MemoryId>> {
        if memories.is_empty() {
            return Ok(Vec::new());
        }
        for m in &memories {
            m.validate()?;
        }
        let inner = self.inner.clone();
        let units = blocking(move || -> Result<Vec<MemoryUnit>> {
            let texts: Vec<&str> = memories.iter().map(|m| m.content.as_str()).collect();
            let vectors = inner.embedder.embed_checked(&texts)?;
            let items = memories.into_iter().zip(vectors).collect();
            Ok(inner.store.insert_batch(items)?)
        })
        .await??;
        Ok(units.into_iter().map(|u| u.id).collect())
    }

    /// Adds the memories whose ids are not in the store yet (imports with deterministic ids
    /// are idempotent this way); returns the ids added.
    pub async fn add_new(&self, memories: Vec<NewMemory>) -> Result<Vec<MemoryId>> {
        let ids: Vec<MemoryId> = memories.iter().filter_map(|m| m.id).collect();
        let inner = self.inner.clone();
        let existing = blocking(move || inner.store.existing(&ids)).await??;
        let fresh: Vec<NewMemory> = memories
            .into_iter()
            .filter(|m| m.id.is_none_or(|id| !existing.contains(&id)))
            .collect();
        self.add_many(fresh).await
    }

    /// Adds a conversation turn to `thread`.
    pub async fn add_conversational(
        &self,
        thread_id: &str,
        role: Role,
        content: impl Into<String>,
    ) -> Result<MemoryId> {
        self.add(NewMemory::conversational(thread(thread_id)?, role, content))
            .await
    }

    /// Adds a conversation turn of `speaker` to `thread`: the speaker is kept as a field of
    /// the turn (metadata [`cairn_core::SPEAKER_KEY`]), so context assembly recognises their
    /// turns when a query names them, without the text having to name them. A blank
    /// speaker is [`cairn_core::InputError::BlankSpeaker`].
    pub async fn add_conversational_by(
        &self,
        thread_id: &str,
        role: Role,
        speaker: &str,
        content: impl Into<String>,
    ) -> Result<MemoryId> {
        if speaker.trim().is_empty() {
            return Err(cairn_core::InputError::BlankSpeaker.into());
        }
        self.add(
            NewMemory::conversational(thread(thread_id)?, role, content)
                .with_speaker(speaker.trim()),
        )
        .await
    }

    /// Adds a fact or passage.
    pub async fn add_knowledge(&self, content: impl Into<String>) -> Result<MemoryId> {
        self.add(NewMemory::new(MemoryKind::Knowledge, content))
            .await
    }

    /// Adds something known about an entity.
    pub async fn add_entity(&self, content: impl Into<String>) -> Result<MemoryId> {
        self.add(NewMemory::new(MemoryKind::Entity, content)).await
    }

    /// Adds a workflow (a procedure that worked).
    pub async fn add_workflow(&self, content: impl Into<String>) -> Result<MemoryId> {
        self.add(NewMemory::new(MemoryKind::Workflow, content))
            .await
    }

    /// Adds a tool description.
    pub async fn add_toolbox(&self, content: impl Into<String>) -> Result<MemoryId> {
        self.add(NewMemory::new(MemoryKind::Toolbox, content)).await
    }

    /// Adds a tool call or result record to `thread`.
    pub async fn add_tool_log(
        &self,
        thread_id: &str,
        content: impl Into<String>,
    ) -> Result<MemoryId> {
        self.add(
            NewMemory::new(MemoryKind::ToolLog, content)
                .with_thread(thread(thread_id)?)
                .with_role(Role::Tool),
        )
        .await
    }

    /// Adds a file or part of one.
    pub async fn add_file(&self, content: impl Into<String>) -> Result<MemoryId> {
        self.add(NewMemory::new(MemoryKind::File, content)).await
    }

    /// Adds a persona description.
    pub async fn add_persona(&self, content: impl Into<String>) -> Result<MemoryId> {
        self.add(NewMemory::new(MemoryKind::Persona, content)).await
    }

    /// Reads a memory.
    pub async fn get(&self, id: MemoryId) -> Result<MemoryUnit> {
        let inner = self.inner.clone();
        Ok(blocking(move || inner.store.get(id)).await??)
    }

    /// The newest `limit` turns of `thread`, returned oldest first.
    pub async fn get_conversational(
        &self,
        thread_id: &str,
        limit: usize,
    ) -> Result<Vec<MemoryUnit>> {
        let f = Filter::all()
            .thread(thread(thread_id)?)
            .kinds([MemoryKind::Conversational]);
        let inner = self.inner.clone();
        Ok(blocking(move || inner.store.recent(&f, limit)).await??)
    }

    /// Memories admitted by `filter`, oldest first.
    pub async fn list(
        &self,
        filter: Filter,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<MemoryUnit>> {
        let inner = self.inner.clone();
        Ok(blocking(move || inner.store.scan(&filter, offset, limit)).await??)
    }

    /// Replaces a memory's content (re-embedding it); summaries built on it become stale.
    pub async fn update(&self, id: MemoryId, content: impl Into<String>) -> Result<MemoryUnit> {
        self.update_with(id, content.into(), None).await
    }

    /// Replaces content and metadata.
    pub async fn update_with(
        &self,
        id: MemoryId,
        content: String,
        metadata: Option<Metadata>,
    ) -> Result<MemoryUnit> {
        let inner = self.inner.clone();
        blocking(move || -> Result<MemoryUnit> {
            let v = inner.embedder.embed_one(&content)?;
            let old = inner.store.get(id)?.content;
            let unit = inner.store.update(id, content, metadata, v)?;
            // The text replaced is not the store's any more: the cache forgets it too.
            purge_replaced(&inner, &old, &unit.content);
            Ok(unit)
        })
        .await?
    }

    /// Deletes with the harness's default policy (`Restrict` unless configured).
    pub async fn delete(&self, id: MemoryId) -> Result<DeleteReport> {
        self.delete_with(id, self.inner.delete_policy).await
    }

    /// Deletes with an explicit policy. The embedding cache forgets the texts of every
    /// memory deleted (a text another live memory shares is forgotten too: the cache is
    /// only a cache, that memory keeps its vector in the store, and the text is embedded
    /// again if it is ever needed).
    ///
    /// A delete is cheap: its rows are overwritten in the database file, but the keyword
    /// index's older segments, the log's older frames and the index snapshot keep bytes of
    /// them until [`Self::erase_deleted`] runs ([`Self::forget`] runs it).
    pub async fn delete_with(&self, id: MemoryId, policy: DeletePolicy) -> Result<DeleteReport> {
        let inner = self.inner.clone();
        blocking(move || {
            let (report, texts) = inner.store.delete_many_with_texts(&[id], policy)?;
            // The delete is committed; a cache that cannot be written is reported in the
            // log rather than turning a done delete into an error.
            purge_cached(&inner, &texts);
            Ok::<_, HarnessError>(report)
        })
        .await?
    }

    /// Scrubs what deletes left in the store's files (the keyword index's older segments,
    /// the log's older frames, the index snapshot's vectors of deleted memories; see
    /// [`cairn_store::Store::erase_deleted`]). `true` when no byte of a deleted memory is
    /// left; `false` when a reader of an older snapshot kept the log (the next erase
    /// finishes) or the backend cannot erase (PostgreSQL). Costs about 5 µs a memory of the
    /// store (a merge of the keyword index and a snapshot written again).
    pub async fn erase_deleted(&self) -> Result<bool> {
        let inner = self.inner.clone();
        Ok(blocking(move || inner.store.erase_deleted()).await??)
    }

    /// Writes a summary of `source_ids` (in that order); returns its id. Its level, time
    /// range and source count come from the sources; all links are written in one
    /// transaction.
    pub async fn add_summary(
        &self,
        summary: impl Into<String>,
        source_ids: &[MemoryId],
        thread_id: Option<&str>,
    ) -> Result<MemoryId> {
        let t = thread_id.map(thread).transpose()?;
        let s = NewSummary::new(summary, source_ids.to_vec()).with_thread(t);
        Ok(self.add_summary_with(s).await?.id)
    }

    /// Writes a summary with every field given.
    pub async fn add_summary_with(&self, summary: NewSummary) -> Result<MemoryUnit> {
        let inner = self.inner.clone();
        blocking(move || -> Result<MemoryUnit> {
            if summary.content.trim().is_empty() {
                return Err(cairn_core::InputError::EmptyContent.into());
            }
            let v = inner.embedder.embed_one(&summary.content)?;
            Ok(inner.store.add_summary(summary, v)?)
        })
        .await?
    }

    /// Appends sources to an existing summary (a moving summary that grew); a source that
    /// is the summary itself or one of its ancestors is refused (no cycles).
    pub async fn extend_summary(&self, id: MemoryId, sources: &[MemoryId]) -> Result<MemoryUnit> {
        let inner = self.inner.clone();
        let sources = sources.to_vec();
        Ok(blocking(move || inner.store.extend_summary(id, sources)).await??)
    }

    /// A summary's sources in their original order; `NotFound` for an unknown id.
    pub async fn expand_summary(&self, id: MemoryId) -> Result<Vec<MemoryUnit>> {
        let inner = self.inner.clone();
        Ok(blocking(move || inner.store.sources(id)).await??)
    }

    /// Every raw memory under a summary through every level, once each, in time order.
    pub async fn expand_to_leaves(&self, id: MemoryId) -> Result<Vec<MemoryUnit>> {
        let inner = self.inner.clone();
        Ok(blocking(move || inner.store.leaves(id)).await??)
    }

    /// The summaries that cite `id` (back-links; works at every level).
    pub async fn summaries_of(&self, id: MemoryId) -> Result<Vec<MemoryUnit>> {
        let inner = self.inner.clone();
        Ok(blocking(move || inner.store.summaries_of(id)).await??)
    }

    /// Every summary above `id`, up to the top ones, lowest level first.
    pub async fn ancestors(&self, id: MemoryId) -> Result<Vec<MemoryUnit>> {
        let inner = self.inner.clone();
        Ok(blocking(move || inner.store.ancestors(id)).await??)
    }

    /// The hierarchy under `id` as data.
    pub async fn summary_tree(&self, id: MemoryId) -> Result<SummaryTree> {
        self.summary_tree_depth(id, MAX_TREE_DEPTH).await
    }

    /// [`Self::summary_tree`] down to `depth` levels below `id` (0: the root alone); nodes
    /// whose sources were left out say so (`truncated`).
    pub async fn summary_tree_depth(&self, id: MemoryId, depth: usize) -> Result<SummaryTree> {
        let inner = self.inner.clone();
        blocking(move || -> Result<SummaryTree> {
            let root = inner.store.get(id)?;
            build_tree(inner.store.as_ref(), root, depth)
        })
        .await?
    }

    /// Searches memories (see [`SearchOptions`]).
    pub async fn search(&self, query: &str, options: SearchOptions) -> Result<Vec<SearchHit>> {
        let inner = self.inner.clone();
        let query = query.to_owned();
        blocking(move || search_blocking(&inner, &query, &options)).await?
    }

    /// Counts per kind and level, stale summaries, index health, cache hits.
    pub async fn stats(&self) -> Result<HarnessStats> {
        let inner = self.inner.clone();
        let store = blocking(move || inner.store.stats()).await??;
        Ok(HarnessStats {
            store,
            embedding_cache: self
                .inner
                .cache
                .as_ref()
                .map(|c| c.stats())
                .unwrap_or_default(),
            model_id: self.inner.embedder.model_id().to_owned(),
        })
    }

    /// Writes the index snapshot now (it is also written on close).
    pub async fn snapshot(&self) -> Result<()> {
        let inner = self.inner.clone();
        Ok(blocking(move || inner.store.snapshot()).await??)
    }

    /// Closes this handle and says what failed, where dropping it cannot: writes the index
    /// snapshot, and when this is the last handle (clones share the store) stops the writer
    /// thread after its queued writes. Every acknowledged write is committed already; a
    /// close only makes the next open faster and the shutdown explicit. Dropping still works.
    pub async fn close(self) -> Result<()> {
        let inner = self.inner;
        blocking(move || -> Result<()> {
            inner.store.snapshot()?;
            match Arc::try_unwrap(inner) {
                Ok(last) => Ok(last.store.close()?),
                Err(_shared) => Ok(()),
            }
        })
        .await?
    }

    /// Every version of the fact `id` belongs to (the memories it supersedes and those that
    /// supersede it), oldest first; each carries its `valid_from` / `valid_to`.
    pub async fn history(&self, id: MemoryId) -> Result<Vec<MemoryUnit>> {
        let inner = self.inner.clone();
        Ok(blocking(move || inner.store.versions(id)).await??)
    }

    /// Rebuilds the vector index from the stored embeddings.
    pub async fn reindex(&self) -> Result<()> {
        let inner = self.inner.clone();
        Ok(blocking(move || inner.store.reindex()).await??)
    }
}

fn build_tree(store: &dyn MemoryBackend, root: MemoryUnit, depth: usize) -> Result<SummaryTree> {
    let has_sources = root.summary.as_ref().is_some_and(|s| s.source_count > 0);
    let children = if has_sources && depth > 0 {
        store
            .sources(root.id)?
            .into_iter()
            .map(|m| build_tree(store, m, depth - 1))
            .collect::<Result<_>>()?
    } else {
        Vec::new()
    };
    Ok(SummaryTree {
        memory: root,
        children,
        truncated: has_sources && depth == 0,
    })
}

/// The search itself, on a blocking thread.
pub(crate) fn search_blocking(
    inner: &Inner,
    query: &str,
    options: &SearchOptions,
) -> Result<Vec<SearchHit>> {
    options.filter.validate()?;
    if query.trim().is_empty() {
        return Err(cairn_core::InputError::EmptyContent.into());
    }
    let wanted = options.effective_k();
    if options.half_life.is_some_and(|h| h.is_zero()) {
        return Err(HarnessError::Config(
            "half_life must be more than zero".into(),
        ));
    }
    let k = if options.half_life.is_some() {
        wanted.saturating_mul(4)
    } else {
        wanted
    };
    let mut hits = match options.mode {
        SearchMode::Vector => {
            let q = inner.embedder.embed_one(query)?;
            inner.store.search_vector(q, k, &options.filter)?
        }
        SearchMode::Keyword => inner.store.search_keyword(query, k, &options.filter)?,
        SearchMode::Hybrid => {
            let q = inner.embedder.embed_one(query)?;
            hybrid_hits(inner, query, q, &options.filter, k)?
        }
    };
    if let Some(h) = options.half_life {
        // Ages count from the newest candidate (or now, when that is earlier): the ranking
        // is the same as from now, and old stores do not decay every score to zero.
        let newest = hits.iter().map(|h| h.memory.created_at).max();
        let now = newest.map_or(inner.clock.now(), |n| n.min(inner.clock.now()));
        for hit in &mut hits {
            hit.score = decayed(hit.score, now - hit.memory.created_at, h);
        }
        hits.sort_by(|a, b| b.score.total_cmp(&a.score));
        hits.truncate(wanted);
    }
    Ok(match options.min_score {
        Some(min) => hits.into_iter().filter(|h| h.score >= min).collect(),
        None => hits,
    })
}

/// `score` decayed by `age` at half-life `h`: halved per half-life (a negative score is
/// doubled instead, so age never helps). A memory from the future is not decayed.
#[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
pub(crate) fn decayed(score: f32, age: chrono::Duration, h: std::time::Duration) -> f32 {
    let age_s = age.num_milliseconds().max(0) as f64 / 1000.0;
    let f = 0.5f64.powf(age_s / h.as_secs_f64().max(1e-9)) as f32;
    if score >= 0.0 {
        score * f
    } else {
        score / f.max(f32::MIN_POSITIVE)
    }
}

/// Reciprocal rank fusion of ranked lists; the fused score replaces each hit's score.
pub fn fuse(lists: &[Vec<SearchHit>], k: usize) -> Vec<SearchHit> {
    let weighted: Vec<(Vec<SearchHit>, f32)> = lists.iter().map(|l| (l.clone(), 1.0)).collect();
    fuse_weighted(&weighted, k)
}

/// Hybrid search with the query's vector given: vector and keyword rankings three times as
/// deep as `k` (at least 30), fused on index ids; only the winners' rows are read.
pub(crate) fn hybrid_hits(
    inner: &Inner,
    query: &str,
    vector: Vec<f32>,
    filter: &Filter,
    k: usize,
) -> Result<Vec<SearchHit>> {
    Ok(inner
        .store
        .hits(hybrid_ids(inner, query, vector, filter, k)?)?)
}

/// The index ids (and fused scores) of [`hybrid_hits`], without reading rows.
pub(crate) fn hybrid_ids(
    inner: &Inner,
    query: &str,
    vector: Vec<f32>,
    filter: &Filter,
    k: usize,
) -> Result<Vec<(u64, f32)>> {
    let depth = k.saturating_mul(3).max(30);
    let v = inner.store.search_vector_ids(vector, depth, filter, None)?;
    let w = inner.store.search_keyword_ids(query, depth, filter)?;
    Ok(fuse_ids(&[v, w], k))
}

/// Reciprocal rank fusion of rankings of index ids (see `Store::search_vector_ids`): the
/// fused score replaces each score; ties go to the lower id (the earlier insert).
pub fn fuse_ids(lists: &[Vec<(u64, f32)>], k: usize) -> Vec<(u64, f32)> {
    let mut scores: HashMap<u64, f32> = HashMap::new();
    for list in lists {
        for (rank, (id, _)) in list.iter().enumerate() {
            #[allow(clippy::cast_precision_loss)]
            let s = 1.0 / (RRF_K + rank as f32 + 1.0);
            *scores.entry(*id).or_default() += s;
        }
    }
    let mut fused: Vec<(u64, f32)> = scores.into_iter().collect();
    fused.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    fused.truncate(k);
    fused
}

/// Weighted reciprocal rank fusion: score = Σ weight / (RRF_K + rank).
pub fn fuse_weighted(lists: &[(Vec<SearchHit>, f32)], k: usize) -> Vec<SearchHit> {
    let mut scores: HashMap<MemoryId, (f32, SearchHit)> = HashMap::new();
    for (list, weight) in lists {
        for (rank, hit) in list.iter().enumerate() {
            #[allow(clippy::cast_precision_loss)]
            let s = weight / (RRF_K + rank as f32 + 1.0);
            scores
                .entry(hit.memory.id)
                .and_modify(|e| e.0 += s)
                .or_insert_with(|| (s, hit.clone()));
        }
    }
    let mut fused: Vec<SearchHit> = scores
        .into_values()
        .map(|(s, mut h)| {
            h.score = s;
            h
        })
        .collect();
    fused.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(a.memory.created_at.cmp(&b.memory.created_at))
    });
    fused.truncate(k);
    fused
}

/// Chooses a summary type from the kinds of its sources.
pub fn infer_summary_type(sources: &[MemoryUnit]) -> SummaryType {
    if sources
        .iter()
        .all(|m| m.kind == MemoryKind::Conversational || m.kind == MemoryKind::ToolLog)
    {
        SummaryType::Conversation
    } else if sources.iter().all(MemoryUnit::is_summary) {
        SummaryType::Rollup
    } else {
        SummaryType::Document
    }
}
