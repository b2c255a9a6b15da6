//! The operations every interface serves (REST and MCP call the same functions), the limits
//! on requests, and the ingest queue that embeds concurrent adds in shared model runs.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cairn_core::{
    Embedder, MemoryId, MemoryKind, MemoryUnit, NewMemory, Role, ThreadId, SPEAKER_KEY,
};
use cairn_harness::{
    ConsolidationPolicy, ContextOptions, ContextScope, Cursor, DeletePolicy, Filter, Forget,
    MemoryHarness, MetaFilter, NewSummary, SearchMode, SearchOptions,
};
use tokio::sync::{mpsc, oneshot};

pub use cairn_harness::parse_duration;

use crate::api::*;
use crate::error::ApiError;
use crate::namespace::{Namespace, Namespaces};

/// Bounds on what one request may ask for.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Memories in one add (a JSON array). Default 1,000.
    pub max_batch: usize,
    /// Search hits. Default 100.
    pub max_k: usize,
    /// Context budget in tokens. Default 32,000.
    pub max_budget: usize,
    /// Bytes of a query. Default 16 KiB.
    pub max_query_bytes: usize,
    /// Bytes of a request body. Default 16 MiB.
    pub max_body_bytes: usize,
    /// Nodes of one tree answer. Default 2,000.
    pub max_tree_nodes: usize,
    /// Levels of one tree answer below its root. Default 8.
    pub max_tree_depth: usize,
    /// Rows of one listing. Default 1,000.
    pub max_list: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_batch: 1_000,
            max_k: 100,
            max_budget: 32_000,
            max_query_bytes: 16 * 1024,
            max_body_bytes: 16 * 1024 * 1024,
            max_tree_nodes: 2_000,
            max_tree_depth: 8,
            max_list: 1_000,
        }
    }
}

/// The most turns a timeline answer reads.
pub const MAX_TIMELINE_TURNS: usize = 200_000;

/// The most summary spans a timeline answer lists.
pub const MAX_TIMELINE_SPANS: usize = 20_000;

/// The most texts one model run of the ingest queue embeds.
pub const MAX_EMBED_BATCH: usize = 256;

/// Counters of the ingest queue.
#[derive(Debug, Default)]
pub struct IngestStats {
    /// Model runs.
    pub batches: AtomicU64,
    /// Texts embedded.
    pub texts: AtomicU64,
    /// Requests served.
    pub requests: AtomicU64,
}

struct Job {
    harness: MemoryHarness,
    memories: Vec<NewMemory>,
    reply: oneshot::Sender<Result<Vec<MemoryId>, ApiError>>,
}

fn parse_id(s: &str, field: &str) -> Result<MemoryId, ApiError> {
    MemoryId::from_str(s.trim()).map_err(|_| {
        ApiError::invalid(
            Some(field),
            format!(
                "{:?} is not a memory id (a UUID)",
                s.chars().take(80).collect::<String>()
            ),
        )
    })
}

fn parse_thread(s: &str, field: &str) -> Result<ThreadId, ApiError> {
    ThreadId::new(s).map_err(|e| ApiError::invalid(Some(field), e.to_string()))
}

fn parse_kind(s: &str, field: &str) -> Result<MemoryKind, ApiError> {
    MemoryKind::from_str(s).map_err(|_| {
        ApiError::invalid(
            Some(field),
            format!(
                "unknown kind {s:?}; one of {}",
                MemoryKind::ALL
                    .iter()
                    .filter(|k| **k != MemoryKind::Summary)
                    .map(MemoryKind::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })
}

/// A request memory as the library's [`NewMemory`], checked; `at` names it in errors
/// (`""` for a single memory, `"[2]."` for the third of a batch).
pub fn new_memory(m: AddMemory, at: &str) -> Result<NewMemory, ApiError> {
    let f = |name: &str| format!("{at}{name}");
    let thread = m
        .thread
        .as_deref()
        .map(|t| parse_thread(t, &f("thread")))
        .transpose()?;
    let kind = match m.kind.as_deref() {
        Some(k) => parse_kind(k, &f("kind"))?,
        None if thread.is_some() => MemoryKind::Conversational,
        None => MemoryKind::Knowledge,
    };
    if kind == MemoryKind::Summary {
        return Err(ApiError::invalid(
            Some(&f("kind")),
            "summaries are added through /v1/summaries (memory_add_summary), with their sources",
        ));
    }
    let mut out = NewMemory::new(kind, m.content);
    out.thread_id = thread;
    out.role = m
        .role
        .as_deref()
        .map(|r| {
            Role::from_str(r).map_err(|_| {
                ApiError::invalid(
                    Some(&f("role")),
                    format!("unknown role {r:?}; one of user, assistant, system, tool"),
                )
            })
        })
        .transpose()?;
    let time = |t: &str, name: &str| {
        chrono::DateTime::parse_from_rfc3339(t)
            .map(|t| t.with_timezone(&chrono::Utc))
            .map_err(|e| {
                ApiError::invalid(
                    Some(&f(name)),
                    format!("{t:?} is not an RFC 3339 time: {e}"),
                )
            })
    };
    if let Some(t) = m.created_at.as_deref() {
        out.created_at = Some(time(t, "created_at")?);
    }
    if let Some(md) = m.metadata {
        out.metadata = md;
    }
    if m.expires_at.is_some() && m.ttl.is_some() {
        return Err(ApiError::invalid(
            Some(&f("ttl")),
            "give expires_at or ttl, not both",
        ));
    }
    if let Some(t) = m.expires_at.as_deref() {
        out.lifetime.expires_at = Some(time(t, "expires_at")?);
    }
    if let Some(t) = m.ttl.as_deref() {
        let d = cairn_harness::parse_duration(t)
            .ok()
            .and_then(|d| chrono::Duration::from_std(d).ok())
            .and_then(|d| chrono::Utc::now().checked_add_signed(d))
            .ok_or_else(|| {
                ApiError::invalid(
                    Some(&f("ttl")),
                    format!("{t:?} is not a duration like 7d within the calendar"),
                )
            })?;
        out.lifetime.expires_at = Some(d);
    }
    if let Some(t) = m.valid_from.as_deref() {
        out.lifetime.valid_from = Some(time(t, "valid_from")?);
    }
    if let Some(s) = m.supersedes.as_deref() {
        out.lifetime.supersedes = Some(parse_id(s, &f("supersedes"))?);
    }
    if let Some(k) = m.key.as_deref() {
        if k.is_empty() || k.len() > 512 {
            return Err(ApiError::invalid(
                Some(&f("key")),
                "a key is 1 to 512 bytes",
            ));
        }
        out = out.with_key(k);
    }
    if let Some(s) = m.speaker {
        out.metadata
            .insert(SPEAKER_KEY.to_owned(), serde_json::Value::String(s));
    }
    out.validate()
        .map_err(|e| ApiError::invalid(None, e.to_string()).at(f("content")))?;
    Ok(out)
}

/// A bad metadata filter names the field it came from.
fn meta_field(e: ApiError, field: &str) -> ApiError {
    if e.message.starts_with("bad metadata filter") {
        e.at(field)
    } else {
        e
    }
}

/// What `cairn serve` serves: the namespaces' stores and the operations on them.
pub struct Service {
    namespaces: Namespaces,
    ingest: mpsc::Sender<Job>,
    /// Request bounds.
    pub limits: Limits,
    /// Ingest counters.
    pub ingest_stats: Arc<IngestStats>,
    allow_consolidate: bool,
}

impl Service {
    /// Serves the namespaces; adds are embedded by `writer` (a model instance of its own,
    /// so that searches never wait behind an ingest batch) in shared runs.
    pub fn new(
        namespaces: Namespaces,
        writer: Arc<dyn Embedder>,
        limits: Limits,
        allow_consolidate: bool,
    ) -> Self {
        let (tx, rx) = mpsc::channel(1024);
        let ingest_stats = Arc::new(IngestStats::default());
        tokio::spawn(ingest_loop(rx, writer, ingest_stats.clone()));
        Self {
            namespaces,
            ingest: tx,
            limits,
            ingest_stats,
            allow_consolidate,
        }
    }

    /// The stores.
    pub fn namespaces(&self) -> &Namespaces {
        &self.namespaces
    }

    /// Add requests waiting for the ingest queue's next model run.
    pub fn ingest_queued(&self) -> usize {
        self.ingest.max_capacity() - self.ingest.capacity()
    }

    /// Whether clients may run consolidation (MCP's `memory_consolidate`).
    pub fn allow_consolidate(&self) -> bool {
        self.allow_consolidate
    }

    async fn store(&self, ns: &Namespace) -> Result<MemoryHarness, ApiError> {
        self.namespaces.get(ns).await
    }

    /// Adds memories (all or none), embedding them together with other requests' adds.
    pub async fn add(&self, ns: &Namespace, batch: Vec<AddMemory>) -> Result<Added, ApiError> {
        if batch.len() > self.limits.max_batch {
            return Err(ApiError::too_large(
                None,
                format!(
                    "{} memories in one request; at most {}",
                    batch.len(),
                    self.limits.max_batch
                ),
            ));
        }
        if batch.is_empty() {
            return Ok(Added {
                id: None,
                ids: Vec::new(),
            });
        }
        let single = batch.len() == 1;
        let memories = batch
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                new_memory(
                    m,
                    &if single {
                        String::new()
                    } else {
                        format!("[{i}].")
                    },
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let harness = self.store(ns).await?;
        let (reply, rx) = oneshot::channel();
        self.ingest
            .send(Job {
                harness,
                memories,
                reply,
            })
            .await
            .map_err(|_| ApiError::unavailable("the server is shutting down"))?;
        let ids = rx
            .await
            .map_err(|_| ApiError::unavailable("the server is shutting down"))??;
        let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
        Ok(Added {
            id: if single { ids.first().cloned() } else { None },
            ids,
        })
    }

    /// One memory.
    pub async fn get(&self, ns: &Namespace, id: &str) -> Result<MemoryOut, ApiError> {
        let id = parse_id(id, "id")?;
        let m = self.store(ns).await?.get(id).await?;
        Ok(MemoryOut::from(&m))
    }

    /// Memories of a thread and/or kind, oldest first, a page at a time.
    #[allow(clippy::too_many_arguments)]
    pub async fn list(
        &self,
        ns: &Namespace,
        thread: Option<&str>,
        kind: Option<&str>,
        condition: Option<&str>,
        offset: usize,
        cursor: Option<&str>,
        limit: Option<usize>,
    ) -> Result<Memories, ApiError> {
        let limit = limit.unwrap_or(100);
        if limit > self.limits.max_list {
            return Err(ApiError::invalid(
                Some("limit"),
                format!("limit {limit} is over {}", self.limits.max_list),
            ));
        }
        let mut f = Filter::all();
        f.thread = thread.map(|t| parse_thread(t, "thread")).transpose()?;
        if let Some(k) = kind {
            f.kinds = vec![parse_kind(k, "kind")?];
        }
        if let Some(c) = condition {
            f.metadata = vec![c
                .parse::<MetaFilter>()
                .map_err(|e| ApiError::invalid(Some("where"), e.to_string()))?];
        }
        if offset == 0 {
            let cursor = cursor
                .map(|c| {
                    c.parse::<Cursor>()
                        .map_err(|e| ApiError::invalid(Some("cursor"), e.to_string()))
                })
                .transpose()?;
            let page = self.store(ns).await?.list_page(f, cursor, limit).await?;
            return Ok(Memories {
                memories: page.items.iter().map(MemoryOut::from).collect(),
                next: page.next.map(|c| c.to_string()),
            });
        }
        if cursor.is_some() {
            return Err(ApiError::invalid(
                Some("cursor"),
                "give either offset or cursor, not both",
            ));
        }
        let ms = self.store(ns).await?.list(f, offset, limit).await?;
        Ok(Memories {
            memories: ms.iter().map(MemoryOut::from).collect(),
            next: None,
        })
    }

    /// Adds or updates the memory stored under `m.key`.
    pub async fn upsert(&self, ns: &Namespace, m: AddMemory) -> Result<UpsertedOut, ApiError> {
        if m.key.is_none() {
            return Err(ApiError::invalid(Some("key"), "an upsert needs a key"));
        }
        let memory = new_memory(m, "")?;
        let up = self.store(ns).await?.upsert(memory).await?;
        Ok(UpsertedOut {
            memory: MemoryOut::from(&up.memory),
            outcome: serde_json::to_value(up.outcome)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
        })
    }

    /// Every version of a fact, oldest first.
    pub async fn history(&self, ns: &Namespace, id: &str) -> Result<Memories, ApiError> {
        let id = parse_id(id, "id")?;
        let ms = self.store(ns).await?.history(id).await?;
        Ok(Memories {
            memories: ms.iter().map(MemoryOut::from).collect(),
            next: None,
        })
    }

    /// Merges a patch into a memory's metadata.
    pub async fn patch(
        &self,
        ns: &Namespace,
        id: &str,
        p: PatchMemory,
    ) -> Result<MemoryOut, ApiError> {
        let id = parse_id(id, "id")?;
        let m = self
            .store(ns)
            .await?
            .patch_metadata(id, p.metadata)
            .await
            .map_err(|e| ApiError::from(e).at("metadata"))?;
        Ok(MemoryOut::from(&m))
    }

    /// Forgets memories and rewrites the summaries built on them.
    pub async fn forget(&self, ns: &Namespace, r: ForgetRequest) -> Result<Forgotten, ApiError> {
        let given = usize::from(r.ids.is_some())
            + usize::from(r.thread.is_some())
            + usize::from(r.metadata.is_some())
            + usize::from(r.everything == Some(true));
        if given != 1 {
            return Err(ApiError::invalid(
                None,
                "give exactly one of ids, thread, metadata or everything: true",
            ));
        }
        let what = if let Some(ids) = r.ids {
            if ids.len() > self.limits.max_batch {
                return Err(ApiError::too_large(
                    Some("ids"),
                    format!("at most {} ids", self.limits.max_batch),
                ));
            }
            Forget::Ids(
                ids.iter()
                    .enumerate()
                    .map(|(i, id)| parse_id(id, &format!("ids[{i}]")))
                    .collect::<Result<_, _>>()?,
            )
        } else if let Some(t) = r.thread {
            Forget::Thread(parse_thread(&t, "thread")?)
        } else if let Some(m) = r.metadata {
            if m.is_empty() {
                return Err(ApiError::invalid(
                    Some("metadata"),
                    "at least one condition (forgetting everything is everything: true)",
                ));
            }
            let mut f = Filter::all();
            f.metadata = m.into_iter().map(MetaFilter::from).collect();
            Forget::Filter(f)
        } else {
            Forget::Everything
        };
        let r = self.store(ns).await?.forget(what).await?;
        let s = |v: &[cairn_core::MemoryId]| v.iter().map(ToString::to_string).collect();
        Ok(Forgotten {
            deleted: s(&r.deleted),
            resummarized: s(&r.resummarized),
            dropped: s(&r.dropped),
            erased: r.erased,
        })
    }

    /// Deletes a memory under a policy (restrict, cascade or detach).
    pub async fn delete(
        &self,
        ns: &Namespace,
        id: &str,
        policy: Option<&str>,
    ) -> Result<Deleted, ApiError> {
        let id = parse_id(id, "id")?;
        let policy = match policy {
            None => DeletePolicy::Restrict,
            Some(p) => DeletePolicy::from_str(p).map_err(|_| {
                ApiError::invalid(
                    Some("policy"),
                    format!("unknown policy {p:?}; one of restrict, cascade, detach"),
                )
            })?,
        };
        let r = self.store(ns).await?.delete_with(id, policy).await?;
        Ok(Deleted {
            deleted: r.deleted.iter().map(ToString::to_string).collect(),
            detached: r.detached.iter().map(ToString::to_string).collect(),
        })
    }

    /// Adds a caller-written summary over sources of the caller's namespace.
    pub async fn add_summary(
        &self,
        ns: &Namespace,
        s: AddSummary,
    ) -> Result<SummaryCreated, ApiError> {
        if s.source_ids.len() > self.limits.max_batch {
            return Err(ApiError::too_large(
                Some("source_ids"),
                format!("at most {} sources", self.limits.max_batch),
            ));
        }
        let ids = s
            .source_ids
            .iter()
            .enumerate()
            .map(|(i, id)| parse_id(id, &format!("source_ids[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        let thread = s
            .thread
            .as_deref()
            .map(|t| parse_thread(t, "thread"))
            .transpose()?;
        let m = self
            .store(ns)
            .await?
            .add_summary_with(NewSummary::new(s.content, ids).with_thread(thread))
            .await?;
        Ok(SummaryCreated {
            memory: MemoryOut::from(&m),
        })
    }

    /// A summary's sources in order, or every raw memory under it.
    pub async fn expand(
        &self,
        ns: &Namespace,
        id: &str,
        leaves: bool,
    ) -> Result<Memories, ApiError> {
        let id = parse_id(id, "id")?;
        let h = self.store(ns).await?;
        let ms = if leaves {
            h.expand_to_leaves(id).await?
        } else {
            h.expand_summary(id).await?
        };
        Ok(Memories {
            memories: ms.iter().map(MemoryOut::from).collect(),
            next: None,
        })
    }

    /// The summaries that cite a memory (its back-links).
    pub async fn summaries_of(&self, ns: &Namespace, id: &str) -> Result<Memories, ApiError> {
        let id = parse_id(id, "id")?;
        let ms = self.store(ns).await?.summaries_of(id).await?;
        Ok(Memories {
            memories: ms.iter().map(MemoryOut::from).collect(),
            next: None,
        })
    }

    /// The summaries above a memory, every level up (nearest first).
    pub async fn ancestors(&self, ns: &Namespace, id: &str) -> Result<Memories, ApiError> {
        let id = parse_id(id, "id")?;
        let ms = self.store(ns).await?.ancestors(id).await?;
        Ok(Memories {
            memories: ms.iter().map(MemoryOut::from).collect(),
            next: None,
        })
    }

    /// A thread's turns per day and its summaries' spans (at most
    /// [`MAX_TIMELINE_TURNS`] turns and [`MAX_TIMELINE_SPANS`] summaries).
    pub async fn timeline(&self, ns: &Namespace, thread: &str) -> Result<Timeline, ApiError> {
        let t = parse_thread(thread, "thread")?;
        let h = self.store(ns).await?;
        tokio::task::spawn_blocking(move || -> Result<Timeline, ApiError> {
            let s = h.store();
            let conv = ApiError::from;
            let raw = raw_kinds();
            let turns = s.count_in_thread(&t, &raw).map_err(conv)?;
            if turns > MAX_TIMELINE_TURNS {
                return Err(ApiError::invalid(
                    Some("thread"),
                    format!("{turns} turns: over the {MAX_TIMELINE_TURNS} a timeline draws"),
                ));
            }
            let mut f = Filter::all().kinds(raw);
            f.thread = Some(t.clone());
            let mut per_day: BTreeMap<String, usize> = BTreeMap::new();
            for e in s.timeline_entries(&f).map_err(conv)? {
                *per_day
                    .entry(e.at.format("%Y-%m-%d").to_string())
                    .or_default() += 1;
            }
            let mut sf = Filter::all().kinds([MemoryKind::Summary]);
            sf.thread = Some(t);
            let mut spans: Vec<SpanOut> = s
                .scan(&sf, 0, MAX_TIMELINE_SPANS)
                .map_err(conv)?
                .iter()
                .filter_map(|m| {
                    m.summary.as_ref().map(|i| SpanOut {
                        id: m.id.to_string(),
                        level: m.level,
                        start: i.time_range_start.to_rfc3339(),
                        end: i.time_range_end.to_rfc3339(),
                    })
                })
                .collect();
            spans.sort_by(|a, b| (a.level, &a.start).cmp(&(b.level, &b.start)));
            Ok(Timeline {
                days: per_day
                    .into_iter()
                    .map(|(day, turns)| DayCount { day, turns })
                    .collect(),
                spans,
            })
        })
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))?
    }

    fn check_query(&self, q: &str) -> Result<(), ApiError> {
        if q.len() > self.limits.max_query_bytes {
            return Err(ApiError::too_large(
                Some("query"),
                format!(
                    "the query is {} bytes; at most {}",
                    q.len(),
                    self.limits.max_query_bytes
                ),
            ));
        }
        if q.trim().is_empty() {
            return Err(ApiError::invalid(Some("query"), "the query is empty"));
        }
        Ok(())
    }

    /// Hybrid, vector or keyword search.
    pub async fn search(&self, ns: &Namespace, r: SearchRequest) -> Result<Hits, ApiError> {
        self.check_query(&r.query)?;
        let mode = match r.mode.as_deref() {
            None => SearchMode::Hybrid,
            Some(m) => SearchMode::from_str(m).map_err(|_| {
                ApiError::invalid(
                    Some("mode"),
                    format!("unknown mode {m:?}; one of hybrid, vector, keyword"),
                )
            })?,
        };
        if let Some(k) = r.k {
            if k == 0 || k > self.limits.max_k {
                return Err(ApiError::invalid(
                    Some("k"),
                    format!("k must be 1 to {}", self.limits.max_k),
                ));
            }
        }
        let mut opts = SearchOptions::all().mode(mode);
        opts.k = r.k;
        opts.filter.thread = r
            .thread
            .as_deref()
            .map(|t| parse_thread(t, "thread"))
            .transpose()?;
        if let Some(kinds) = &r.kind {
            opts.filter.kinds = kinds
                .list()
                .into_iter()
                .map(|k| parse_kind(k, "kind"))
                .collect::<Result<_, _>>()?;
        }
        opts.filter.metadata = r
            .metadata
            .unwrap_or_default()
            .into_iter()
            .map(MetaFilter::from)
            .collect();
        if let Some(t) = r.as_of.as_deref() {
            opts.filter.as_of = Some(
                chrono::DateTime::parse_from_rfc3339(t)
                    .map_err(|e| {
                        ApiError::invalid(
                            Some("as_of"),
                            format!("{t:?} is not an RFC 3339 time: {e}"),
                        )
                    })?
                    .with_timezone(&chrono::Utc),
            );
        }
        opts.filter.history = r.history.unwrap_or(false);
        if let Some(h) = r.half_life.as_deref() {
            let d = cairn_harness::parse_duration(h)
                .map_err(|e| ApiError::invalid(Some("half_life"), e))?;
            if d.is_zero() {
                return Err(ApiError::invalid(
                    Some("half_life"),
                    "half_life must be more than zero",
                ));
            }
            opts.half_life = Some(d);
        }
        let hits = self
            .store(ns)
            .await?
            .search(&r.query, opts)
            .await
            .map_err(|e| meta_field(e.into(), "metadata"))?;
        Ok(Hits {
            hits: hits.iter().map(HitOut::from).collect(),
        })
    }

    /// Context assembly.
    pub async fn context(&self, ns: &Namespace, r: ContextRequest) -> Result<ContextOut, ApiError> {
        self.check_query(&r.query)?;
        let budget = r.budget.unwrap_or(2000);
        if budget == 0 || budget > self.limits.max_budget {
            return Err(ApiError::invalid(
                Some("budget"),
                format!("budget must be 1 to {}", self.limits.max_budget),
            ));
        }
        parse_thread(&r.thread, "thread")?;
        let scope_ids = r.scope.unwrap_or_default();
        if scope_ids.len() > 64 {
            return Err(ApiError::invalid(
                Some("scope"),
                "at most 64 threads in a scope",
            ));
        }
        for (i, t) in scope_ids.iter().enumerate() {
            parse_thread(t, &format!("scope[{i}]"))?;
        }
        let mut scope = ContextScope::threads(scope_ids.iter().map(String::as_str))
            .map_err(|e| ApiError::from(e).at("scope"))?;
        scope.metadata = r
            .scope_metadata
            .unwrap_or_default()
            .into_iter()
            .map(MetaFilter::from)
            .collect();
        let options = ContextOptions {
            knowledge: r.knowledge.unwrap_or(false),
            ..ContextOptions::default()
        };
        let c = self
            .store(ns)
            .await?
            .assemble_context_scoped(&r.thread, &r.query, budget, options, scope)
            .await
            .map_err(|e| meta_field(e.into(), "scope_metadata"))?;
        Ok(ContextOut {
            items: c.items.iter().map(ContextItemOut::from).collect(),
            tokens: c.tokens,
            budget: c.budget,
            text: c.render(),
        })
    }

    /// The tree under `id`, or the trees of a thread's top summaries, `depth` levels deep
    /// (default 2) and at most [`Limits::max_tree_nodes`] nodes.
    pub async fn tree(
        &self,
        ns: &Namespace,
        id: Option<&str>,
        thread: Option<&str>,
        depth: Option<usize>,
    ) -> Result<Trees, ApiError> {
        let depth = depth.unwrap_or(2);
        if depth > self.limits.max_tree_depth {
            return Err(ApiError::invalid(
                Some("depth"),
                format!("depth must be at most {}", self.limits.max_tree_depth),
            ));
        }
        let h = self.store(ns).await?;
        let roots: Vec<MemoryUnit> = match (id, thread) {
            (Some(id), _) => vec![h.get(parse_id(id, "id")?).await?],
            (None, Some(t)) => {
                let t = parse_thread(t, "thread")?;
                let h2 = h.clone();
                tokio::task::spawn_blocking(move || h2.store().top_summaries(&t, 64))
                    .await
                    .map_err(|e| ApiError::unavailable(e.to_string()))?
                    .map_err(ApiError::from)?
            }
            (None, None) => {
                return Err(ApiError::invalid(
                    Some("thread"),
                    "give a summary id or a thread",
                ))
            }
        };
        let max_nodes = self.limits.max_tree_nodes;
        let trees = tokio::task::spawn_blocking(move || {
            let mut left = max_nodes;
            roots
                .into_iter()
                .map(|r| build_tree(&h, r, depth, &mut left))
                .collect::<Result<Vec<_>, ApiError>>()
        })
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))??;
        Ok(Trees { trees })
    }

    /// The threads of a namespace with their sizes.
    pub async fn threads(&self, ns: &Namespace) -> Result<Threads, ApiError> {
        let h = self.store(ns).await?;
        tokio::task::spawn_blocking(move || -> Result<Threads, ApiError> {
            let s = h.store();
            let conv = ApiError::from;
            let raw = raw_kinds();
            let mut threads = Vec::new();
            for t in s.threads().map_err(conv)? {
                threads.push(ThreadOut {
                    id: t.as_str().to_owned(),
                    memories: s.count_in_thread(&t, &raw).map_err(conv)?,
                    summaries: s
                        .count_in_thread(&t, &[MemoryKind::Summary])
                        .map_err(conv)?,
                });
            }
            Ok(Threads { threads })
        })
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))?
    }

    /// Runs one consolidation pass on a namespace.
    pub async fn consolidate(
        &self,
        ns: &Namespace,
        r: ConsolidateRequest,
    ) -> Result<Consolidated, ApiError> {
        let age = parse_duration(r.older_than.as_deref().unwrap_or("1h"))
            .map_err(|e| ApiError::invalid(Some("older_than"), e))?;
        let mut policy = ConsolidationPolicy::older_than(age);
        if let Some(t) = &r.thread {
            policy = policy.thread(parse_thread(t, "thread")?);
        }
        let report = self.store(ns).await?.consolidate(policy).await?;
        Ok(consolidated(&report))
    }
}

/// The wire form of a consolidation report.
pub fn consolidated(r: &cairn_harness::ConsolidationReport) -> Consolidated {
    Consolidated {
        summaries_per_level: r
            .chunks_per_level
            .iter()
            .map(|(l, n)| (l.to_string(), *n))
            .collect::<BTreeMap<_, _>>(),
        memories_covered: r.memories_covered,
        summaries: r.summaries.iter().map(ToString::to_string).collect(),
        failures: r.failures.len(),
        refreshed: r.refreshed.len(),
    }
}

/// Every kind but summaries: what a thread's turns, tool logs and knowledge are.
fn raw_kinds() -> Vec<MemoryKind> {
    MemoryKind::ALL
        .iter()
        .copied()
        .filter(|k| *k != MemoryKind::Summary)
        .collect()
}

fn build_tree(
    h: &MemoryHarness,
    m: MemoryUnit,
    depth: usize,
    left: &mut usize,
) -> Result<TreeNode, ApiError> {
    *left = left.saturating_sub(1);
    let has_sources = m.summary.as_ref().is_some_and(|s| s.source_count > 0);
    let mut node = TreeNode {
        memory: MemoryOut::from(&m),
        children: Vec::new(),
        truncated: false,
    };
    if !has_sources {
        return Ok(node);
    }
    let count = m.summary.as_ref().map_or(0, |s| s.source_count);
    if depth == 0 || *left < count {
        node.truncated = true;
        return Ok(node);
    }
    let sources = h.store().sources(m.id).map_err(ApiError::from)?;
    for s in sources {
        node.children.push(build_tree(h, s, depth - 1, left)?);
    }
    Ok(node)
}

async fn ingest_loop(
    mut rx: mpsc::Receiver<Job>,
    writer: Arc<dyn Embedder>,
    stats: Arc<IngestStats>,
) {
    while let Some(first) = rx.recv().await {
        // Whatever arrived while the previous run was busy shares this run.
        let mut texts = first.memories.len();
        let mut jobs = vec![first];
        while texts < MAX_EMBED_BATCH {
            match rx.try_recv() {
                Ok(j) => {
                    texts += j.memories.len();
                    jobs.push(j);
                }
                Err(_) => break,
            }
        }
        let all: Vec<String> = jobs
            .iter()
            .flat_map(|j| j.memories.iter().map(|m| m.content.clone()))
            .collect();
        let e = writer.clone();
        let vectors = tokio::task::spawn_blocking(move || {
            let refs: Vec<&str> = all.iter().map(String::as_str).collect();
            e.embed_checked(&refs)
        })
        .await;
        stats.batches.fetch_add(1, Ordering::Relaxed);
        stats.texts.fetch_add(texts as u64, Ordering::Relaxed);
        stats
            .requests
            .fetch_add(jobs.len() as u64, Ordering::Relaxed);
        let mut vectors = match vectors {
            Ok(Ok(v)) => v.into_iter(),
            Ok(Err(e)) => {
                let err = ApiError::from(cairn_harness::HarnessError::from(e));
                for j in jobs {
                    let _ = j.reply.send(Err(err.clone()));
                }
                continue;
            }
            Err(e) => {
                for j in jobs {
                    let _ = j.reply.send(Err(ApiError::unavailable(e.to_string())));
                }
                continue;
            }
        };
        for j in jobs {
            let items: Vec<(NewMemory, Vec<f32>)> =
                j.memories.into_iter().zip(vectors.by_ref()).collect();
            let h = j.harness;
            let reply = j.reply;
            // Each request is its own transaction (all or none); writing does not hold up the
            // next model run.
            tokio::spawn(async move {
                let r = tokio::task::spawn_blocking(move || h.store().insert_batch(items))
                    .await
                    .map_err(|e| ApiError::unavailable(e.to_string()))
                    .and_then(|r| {
                        r.map(|units| units.into_iter().map(|u| u.id).collect())
                            .map_err(ApiError::from)
                    });
                let _ = reply.send(r);
            });
        }
    }
}
