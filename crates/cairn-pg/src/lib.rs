//! PostgreSQL + pgvector backend for Cairn: [`PgStore`] implements
//! [`cairn_store::MemoryBackend`] with the same behaviour as the embedded SQLite store
//! (checked by the shared conformance suite), for deployments that outgrow one file:
//! several Cairn processes on one database see each other's writes at once (there is no
//! local index to catch up).
//!
//! * Rows live in `memories` (one schema per store, [`PgOptions::schema`]) with a
//!   `vector(dim)` column under an HNSW index (cosine) and a generated `tsvector` under a
//!   GIN index; summary links in `summary_sources`, walked with recursive CTEs.
//! * Every write is one transaction. Migrations are versioned in `cairn_meta` and run under
//!   an advisory lock, so processes opening the same store at once do not race.
//! * Filtered vector search: pgvector 0.6 filters after its HNSW walk, which can return
//!   fewer than k rows. A filter admitting at most [`EXACT_SCAN_MAX`] memories is answered
//!   by an exact scan of those rows; a wider one walks the index with a larger
//!   `hnsw.ef_search` and falls back to the exact scan when the walk comes back short.
//! * Bulk loads ([`MemoryBackend::insert_bulk`]): a load of at least [`BULK_REBUILD_MIN`]
//!   memories and half the store drops the HNSW index, writes the rows and builds the index
//!   once after, about four times faster per row than keeping it row by row; an open finds
//!   a missing index (a loader that died part way) and builds it.
//! * Every method blocks (on the store's own small Tokio runtime): call it from a plain
//!   thread or `spawn_blocking`, as the harness does with the SQLite store.
//!
//! ```no_run
//! use cairn_pg::{PgOptions, PgStore};
//! use cairn_store::MemoryBackend;
//!
//! let store = PgStore::open(PgOptions::new("host=127.0.0.1 user=cairn dbname=cairn", "all-MiniLM-L6-v2", 384))?;
//! println!("{} threads", store.threads()?.len());
//! # Ok::<(), cairn_store::StoreError>(())
//! ```

mod extra;
mod reads;
mod sql;
#[cfg(feature = "testing")]
pub mod testing;
mod writes;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod};
use pgvector::Vector;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use cairn_core::{
    check_metadata, normalized, validate_vector, Clock, MemoryId, MemoryKind, MemoryUnit, Metadata,
    NewMemory, SystemClock, ThreadId,
};
use cairn_store::backend::merge_patch;
use cairn_store::backend::{
    check_memories, insert_chunked, prepare_memories, same_memory, to_stored_time, PreparedMemory,
};
use cairn_store::{
    Cursor, DeletePolicy, DeleteReport, Filter, Hit, MemoryBackend, NewSummary, Page, Result,
    StoreError, StoreStats, ThreadState, TimelineEntry,
};

use crate::sql::{Query, COLS};

/// A filter admitting at most this many memories is answered by an exact scan of them.
pub const EXACT_SCAN_MAX: i64 = 20_000;

/// pgvector's `hnsw.ef_search` on every connection; a search for more than a quarter of it
/// (k > 25) raises it to 4k (at most 1,000) for its own transaction, and a caller's `ef`
/// (`search_vector_ids`) sets it to that (at least k, at most 1,000).
pub const DEFAULT_EF_SEARCH: i64 = 100;

/// Where and how to open a PostgreSQL store.
#[derive(Clone)]
pub struct PgOptions {
    /// A libpq connection string (`host=... user=... dbname=...`) or URL
    /// (`postgres://user@host:port/db`).
    pub url: String,
    /// The schema holding this store's tables (created when missing): one store per schema,
    /// so one database can hold several. `[a-z_][a-z0-9_]*`, at most 63 bytes; default `cairn`.
    pub schema: String,
    /// The embedding model's id (a store is bound to one model, as the SQLite store is).
    pub model_id: String,
    /// The embedding dimension.
    pub dim: usize,
    /// Most connections held open. Default 8. `assemble_context` on a thread longer than
    /// `ContextOptions::bounded_above` reads through two at once; calls beyond the pool wait
    /// for a connection.
    pub pool_size: usize,
    /// The clock that dates memories written without a time.
    pub clock: Arc<dyn Clock>,
    /// A filtered vector search whose filter admits at most this many memories scores
    /// them all exactly instead of walking the HNSW index. Default [`EXACT_SCAN_MAX`].
    pub exact_scan_max: i64,
    /// `maintenance_work_mem` (MiB) for the statements that build the HNSW index
    /// (a bulk load, `reindex`, an index found missing on open). pgvector builds the
    /// graph in this memory and much more slowly once it outgrows it: about
    /// 1.9 KB per memory at 384 dimensions. Default [`INDEX_BUILD_MEMORY_MB`]; 1 to 2,097,151.
    pub index_build_memory_mb: u32,
}

/// The default [`PgOptions::index_build_memory_mb`]: 1 GiB, room for the graph of about
/// 500,000 memories of 384 dimensions.
pub const INDEX_BUILD_MEMORY_MB: u32 = 1_024;

/// [`MemoryBackend::insert_bulk`] takes the HNSW index down and builds it again after the
/// load when it brings at least this many memories and at least half as many as the store
/// holds (building costs about a quarter of keeping the index row by row, per row indexed).
pub const BULK_REBUILD_MIN: usize = 10_000;

impl std::fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOptions")
            .field("schema", &self.schema)
            .field("model_id", &self.model_id)
            .field("dim", &self.dim)
            .field("pool_size", &self.pool_size)
            .finish_non_exhaustive()
    }
}

impl PgOptions {
    /// Options for `url` with a model of `dim` dimensions, schema `cairn`.
    pub fn new(url: impl Into<String>, model_id: impl Into<String>, dim: usize) -> Self {
        Self {
            url: url.into(),
            schema: "cairn".into(),
            model_id: model_id.into(),
            dim,
            pool_size: 8,
            clock: Arc::new(SystemClock),
            exact_scan_max: EXACT_SCAN_MAX,
            index_build_memory_mb: INDEX_BUILD_MEMORY_MB,
        }
    }

    /// Sets the memory for building the HNSW index ([`PgOptions::index_build_memory_mb`]).
    pub fn index_build_memory_mb(mut self, mb: u32) -> Self {
        self.index_build_memory_mb = mb;
        self
    }

    /// Sets the schema.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Sets the clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    fn validate(&self) -> Result<()> {
        let s = self.schema.as_bytes();
        let ok = !s.is_empty()
            && s.len() <= 63
            && (s[0].is_ascii_lowercase() || s[0] == b'_')
            && s.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_');
        if !ok {
            return Err(StoreError::Config(format!(
                "schema {:?}: expected [a-z_][a-z0-9_]*, at most 63 bytes",
                self.schema
            )));
        }
        if self.dim == 0 || self.dim > 16_000 {
            return Err(StoreError::Config(format!(
                "dimension {} (pgvector's HNSW index takes 1 to 2,000; columns up to 16,000)",
                self.dim
            )));
        }
        if self.index_build_memory_mb == 0 || self.index_build_memory_mb > 2_097_151 {
            return Err(StoreError::Config(format!(
                "index build memory {} MiB (expected 1 to 2,097,151)",
                self.index_build_memory_mb
            )));
        }
        if self.pool_size == 0 || self.pool_size > 1_000 {
            return Err(StoreError::Config(format!(
                "pool size {} (expected 1 to 1,000)",
                self.pool_size
            )));
        }
        Ok(())
    }
}

/// A Cairn store in PostgreSQL (see the crate documentation).
///
/// It owns a small Tokio runtime and blocks on it: call its methods from a plain thread or
/// inside `tokio::task::spawn_blocking`, never directly inside an async task (Tokio panics
/// when a runtime blocks there). It may be dropped anywhere: its runtime is shut down
/// without waiting.
pub struct PgStore {
    /// Always `Some` until drop, which takes it to shut it down in the background.
    rt: Option<tokio::runtime::Runtime>,
    pool: Pool,
    options: PgOptions,
    /// Rows this handle wrote since it last had the tables analyzed, and how many more it
    /// writes before it checks again (see [`ANALYZE_AFTER`]).
    since_analyze: std::sync::atomic::AtomicUsize,
    analyze_due: std::sync::atomic::AtomicUsize,
}

/// After writing this many rows (memories, and summaries' links), and at least a tenth of
/// what `memories` held when last analyzed (or when it never was), a handle has PostgreSQL
/// analyze the tables at once:
/// until autovacuum gets to a table grown in bulk (a minute or more after), the planner
/// takes it for nearly empty, and the bounded context path's per-match range read
/// (`timeline_around`) ran as a scan of the thread for each match: 150-300 ms a statement at
/// 10,000 turns, against under 1 ms with statistics.
const ANALYZE_AFTER: usize = 1_000;

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// The rows a stored memory took: its own, and a summary's links to its sources.
fn written_rows(unit: &MemoryUnit) -> usize {
    1 + unit.summary.as_ref().map_or(0, |s| s.source_ids.len())
}

/// A driver or pool error as a store error.
fn pg(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend {
        backend: "postgres",
        message: e.to_string(),
    }
}

/// Whether `e` is a unique violation (SQLSTATE 23505).
fn is_unique_violation(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
}

type Param = Box<dyn ToSql + Sync + Send>;

fn refs(params: &[Param]) -> Vec<&(dyn ToSql + Sync)> {
    params
        .iter()
        .map(|p| p.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

impl PgStore {
    /// Connects, creates the pgvector extension, the schema and its tables when missing
    /// (migrating an older schema), and checks the store's model and dimension
    /// ([`StoreError::ModelMismatch`] when they differ).
    pub fn open(options: PgOptions) -> Result<Self> {
        options.validate()?;
        let mut config: tokio_postgres::Config = options.url.parse().map_err(pg)?;
        config.options(format!(
            "-c search_path={},public -c hnsw.ef_search={DEFAULT_EF_SEARCH}",
            options.schema
        ));
        if config.get_application_name().is_none() {
            config.application_name("cairn");
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .build()
            .map_err(pg)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cairn-pg")
            .enable_all()
            .build()?;
        let store = Self {
            rt: Some(rt),
            pool,
            options,
            since_analyze: std::sync::atomic::AtomicUsize::new(0),
            analyze_due: std::sync::atomic::AtomicUsize::new(ANALYZE_AFTER),
        };
        let options = store.options.clone();
        store.block(move |c| async move { sql::migrate(&c, &options).await })?;
        Ok(store)
    }

    /// The options it was opened with.
    pub fn options(&self) -> &PgOptions {
        &self.options
    }

    /// Runs `f` with a pooled connection, blocking until it finishes.
    fn block<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: FnOnce(deadpool_postgres::Object) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let rt = self.rt.as_ref().ok_or(StoreError::WriterGone)?;
        rt.block_on(async {
            let client = self.pool.get().await.map_err(pg)?;
            f(client).await
        })
    }

    fn now(&self) -> DateTime<Utc> {
        self.options.clock.now()
    }

    /// Counts `written` new rows (memories and summary links), and once [`ANALYZE_AFTER`] of
    /// them and a tenth of `memories`' last analyzed size have gone in, analyzes `memories`
    /// and `summary_sources` (a lock that blocks neither reads nor writes). One insert claims
    /// the count and checks; when the table is too large for it yet, the count goes back and
    /// the next check waits for a tenth of the table (no statement per insert meanwhile).
    /// The rows are stored already: a failure here is logged, not returned (autovacuum
    /// analyzes the tables later anyway), and the next try comes [`ANALYZE_AFTER`] rows on.
    fn analyze_if_grown(&self, written: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        let since = self.since_analyze.fetch_add(written, Relaxed) + written;
        let due = self.analyze_due.load(Relaxed);
        if since < due {
            return;
        }
        // (Another insert that crossed the mark at the same time checks instead.)
        let Ok(claimed) = self
            .since_analyze
            .fetch_update(Relaxed, Relaxed, |n| (n >= due).then_some(0))
        else {
            return;
        };
        let analyzed = self.block(move |c| async move {
            // -1 for a table never analyzed.
            let tuples: f32 = c
                .query_one(
                    "SELECT reltuples FROM pg_class WHERE oid = 'memories'::regclass",
                    &[],
                )
                .await
                .map_err(pg)?
                .get(0);
            #[allow(clippy::cast_precision_loss)] // a row count's tenth, roughly
            if tuples >= 0.0 && (claimed as f32) * 10.0 < tuples {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                return Ok(Some((tuples / 10.0).ceil() as usize));
            }
            c.batch_execute("ANALYZE memories, summary_sources")
                .await
                .map_err(pg)?;
            Ok(None)
        });
        match analyzed {
            Ok(None) => self.analyze_due.store(ANALYZE_AFTER, Relaxed),
            Ok(Some(tenth)) => {
                self.since_analyze.fetch_add(claimed, Relaxed);
                self.analyze_due.store(tenth.max(ANALYZE_AFTER), Relaxed);
            }
            Err(e) => {
                tracing::warn!(error = %e, "analyzing the store's tables after a bulk insert");
            }
        }
    }

    fn prepare_vector(&self, v: Vec<f32>) -> Result<Vector> {
        validate_vector(&v, self.options.dim)?;
        Ok(Vector::from(normalized(v)?))
    }

    /// The memories linked to `id` that `head` + its rid + `tail` selects (`{COLS}` in
    /// `tail` stands for [`COLS`]); `summary`: `id` must be a summary.
    fn linked(
        &self,
        id: MemoryId,
        summary: bool,
        head: String,
        tail: &'static str,
    ) -> Result<Vec<MemoryUnit>> {
        self.block(move |c| async move {
            let rid = if summary {
                summary_rid(&c, id).await?
            } else {
                rid_of(&c, id).await?
            };
            let mut q = Query::new(head);
            q.bind(rid);
            q.push(tail.replace("{COLS}", COLS));
            query_units(&c, &q).await
        })
    }

    /// Drops this store's schema and everything in it (tests, `cairn` tools).
    pub fn drop_schema(self) -> Result<()> {
        let schema = self.options.schema.clone();
        self.block(move |c| async move {
            c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                .await
                .map_err(pg)
        })
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // Dropping a runtime blocks until its tasks end, which Tokio forbids inside an
        // async task (a harness dropped on a worker thread); nothing here needs waiting for.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Statements through the connection's statement cache: after the first use of a text on
/// a connection, a call is one round trip (bind + execute) instead of two.
trait Cached: GenericClient + Sync {
    async fn rows(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
        let st = self.prepare_cached(sql).await?;
        self.query(&st, params).await
    }

    async fn row_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Option<Row>, tokio_postgres::Error> {
        let st = self.prepare_cached(sql).await?;
        self.query_opt(&st, params).await
    }

    async fn row_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Row, tokio_postgres::Error> {
        let st = self.prepare_cached(sql).await?;
        self.query_one(&st, params).await
    }

    async fn exec(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<u64, tokio_postgres::Error> {
        let st = self.prepare_cached(sql).await?;
        self.execute(&st, params).await
    }
}

impl<C: GenericClient + Sync> Cached for C {}

/// Reads memories with the rows of a query selecting [`COLS`] (plus optional trailing
/// columns), attaching summary sources.
async fn units<C: GenericClient + Sync>(c: &C, rows: &[Row]) -> Result<Vec<MemoryUnit>> {
    let mut out = Vec::with_capacity(rows.len());
    let mut summaries: Vec<(usize, i64)> = Vec::new();
    for r in rows {
        let (rid, unit) = sql::decode(r)?;
        if unit.summary.is_some() {
            summaries.push((out.len(), rid));
        }
        out.push(unit);
    }
    if !summaries.is_empty() {
        let rids: Vec<i64> = summaries.iter().map(|(_, r)| *r).collect();
        let links = c
            .rows(
                "SELECT l.summary, s.id, l.continues FROM summary_sources l
                   JOIN memories s ON s.rid = l.source
                 WHERE l.summary = ANY($1) ORDER BY l.summary, l.position",
                &[&rids],
            )
            .await
            .map_err(pg)?;
        let mut by: HashMap<i64, Vec<(MemoryId, bool)>> = HashMap::new();
        for l in links {
            let id: uuid::Uuid = l.get(1);
            by.entry(l.get(0))
                .or_default()
                .push((MemoryId::from_uuid(id), l.get(2)));
        }
        for (i, rid) in summaries {
            if let Some(info) = out[i].summary.as_mut() {
                let links = by.remove(&rid).unwrap_or_default();
                info.continues = links.iter().find(|(_, c)| *c).map(|(id, _)| *id);
                info.source_ids = links.into_iter().map(|(id, _)| id).collect();
            }
        }
    }
    Ok(out)
}

async fn query_units<C: GenericClient + Sync>(c: &C, q: &Query) -> Result<Vec<MemoryUnit>> {
    let rows = c.rows(&q.text, &refs(&q.params)).await.map_err(pg)?;
    units(c, &rows).await
}

async fn get_unit<C: GenericClient + Sync>(c: &C, id: MemoryId) -> Result<MemoryUnit> {
    let rows = c
        .rows(
            &format!("SELECT {COLS} FROM memories m WHERE m.id = $1"),
            &[&id.uuid()],
        )
        .await
        .map_err(pg)?;
    units(c, &rows)
        .await?
        .pop()
        .ok_or(StoreError::NotFound { id })
}

async fn rid_of<C: GenericClient + Sync>(c: &C, id: MemoryId) -> Result<i64> {
    c.row_opt("SELECT rid FROM memories WHERE id = $1", &[&id.uuid()])
        .await
        .map_err(pg)?
        .map(|r| r.get(0))
        .ok_or(StoreError::NotFound { id })
}

async fn summary_rid<C: GenericClient + Sync>(c: &C, id: MemoryId) -> Result<i64> {
    rid_checked(c, id, true, false).await
}

/// The row id of memory `id` ([`StoreError::NotFound`] without one;
/// [`StoreError::NotASummary`] when `summary` and it is not one), its row locked until the
/// transaction ends when `lock`.
pub(crate) async fn rid_checked<C: GenericClient + Sync>(
    c: &C,
    id: MemoryId,
    summary: bool,
    lock: bool,
) -> Result<i64> {
    let sql = if lock {
        "SELECT rid, kind FROM memories WHERE id = $1 FOR UPDATE"
    } else {
        "SELECT rid, kind FROM memories WHERE id = $1"
    };
    let row = c
        .row_opt(sql, &[&id.uuid()])
        .await
        .map_err(pg)?
        .ok_or(StoreError::NotFound { id })?;
    let kind: String = row.get(1);
    if summary && kind != MemoryKind::Summary.as_str() {
        return Err(StoreError::NotASummary { id });
    }
    Ok(row.get(0))
}

async fn ancestor_rids<C: GenericClient + Sync>(c: &C, rid: i64) -> Result<Vec<i64>> {
    let rows = c
        .rows(
            "WITH RECURSIVE up(r) AS (
                SELECT summary FROM summary_sources WHERE source = $1
                UNION SELECT l.summary FROM summary_sources l JOIN up ON l.source = up.r)
             SELECT r FROM up",
            &[&rid],
        )
        .await
        .map_err(pg)?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

async fn citing<C: GenericClient + Sync>(c: &C, rid: i64) -> Result<Vec<(i64, MemoryId)>> {
    let rows = c
        .rows(
            "SELECT m.rid, m.id FROM summary_sources l JOIN memories m ON m.rid = l.summary
             WHERE l.source = $1 ORDER BY m.rid",
            &[&rid],
        )
        .await
        .map_err(pg)?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), MemoryId::from_uuid(r.get::<_, uuid::Uuid>(1))))
        .collect())
}

/// Recomputes level, time range and source count of summaries (children before parents,
/// repeated until stable), as the SQLite store does after a detach.
async fn refresh_summaries<C: GenericClient + Sync>(c: &C, rids: &[i64]) -> Result<()> {
    for _ in 0..=rids.len() {
        let mut any = false;
        for r in rids {
            let row = c
                .row_one(
                    "WITH agg AS (
                        SELECT COALESCE(MAX(s.level + 1 - l.continues::int), 0) AS lv,
                               MIN(COALESCE(s.time_start, s.created_at)) AS t0,
                               MAX(COALESCE(s.time_end, s.created_at)) AS t1,
                               count(*)::int AS n
                        FROM summary_sources l JOIN memories s ON s.rid = l.source
                        WHERE l.summary = $1)
                     UPDATE memories m SET level = GREATEST(agg.lv, 1),
                        time_start = COALESCE(agg.t0, m.time_start),
                        time_end = COALESCE(agg.t1, m.time_end), source_count = agg.n
                     FROM agg, (SELECT level AS before FROM memories WHERE rid = $1) b
                     WHERE m.rid = $1
                     RETURNING b.before, m.level",
                    &[r],
                )
                .await
                .map_err(pg)?;
            let (before, after): (i32, i32) = (row.get(0), row.get(1));
            any |= before != after;
        }
        if !any {
            break;
        }
    }
    Ok(())
}

/// Inserts one new memory (ending the validity of the one it supersedes).
async fn insert_one<C: GenericClient + Sync>(c: &C, p: &PreparedMemory, model: &str) -> Result<()> {
    let u = &p.unit;
    let mut supersedes: Option<i64> = None;
    if let Some(old) = u.lifetime.supersedes {
        let until = u.lifetime.valid_from.unwrap_or(u.created_at);
        supersedes = Some(supersede(c, old, u.id, until).await?);
    }
    let r = c
        .exec(
            "INSERT INTO memories (id, kind, thread_id, role, content, created_at, metadata,
                level, expires_at, valid_from, valid_to, supersedes, model_id, embedding)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $8, $9, $10, $11, $12, $13)",
            &[
                &u.id.uuid(),
                &u.kind.as_str(),
                &u.thread_id.as_ref().map(ThreadId::as_str),
                &u.role.map(|r| r.as_str()),
                &u.content,
                &u.created_at,
                &serde_json::Value::Object(u.metadata.clone()),
                &u.lifetime.expires_at,
                &u.lifetime.valid_from,
                &u.lifetime.valid_to,
                &supersedes,
                &model,
                &Vector::from(p.vector.clone()),
            ],
        )
        .await;
    match r {
        Err(e) if is_unique_violation(&e) => Err(StoreError::DuplicateId { id: u.id }),
        r => r.map(|_| ()).map_err(pg),
    }
}

/// Inserts new memories (none superseding another) with one statement, in batch order;
/// returns the ids another writer stored since the batch looked (not written).
async fn insert_many<C: GenericClient + Sync>(
    c: &C,
    fresh: &[PreparedMemory],
    model: &str,
) -> Result<Vec<uuid::Uuid>> {
    let ids: Vec<uuid::Uuid> = fresh.iter().map(|p| p.unit.id.uuid()).collect();
    let kinds: Vec<&str> = fresh.iter().map(|p| p.unit.kind.as_str()).collect();
    let threads: Vec<Option<&str>> = fresh
        .iter()
        .map(|p| p.unit.thread_id.as_ref().map(ThreadId::as_str))
        .collect();
    let roles: Vec<Option<&str>> = fresh
        .iter()
        .map(|p| p.unit.role.map(|r| r.as_str()))
        .collect();
    let contents: Vec<&str> = fresh.iter().map(|p| p.unit.content.as_str()).collect();
    let times: Vec<DateTime<Utc>> = fresh.iter().map(|p| p.unit.created_at).collect();
    let metas: Vec<serde_json::Value> = fresh
        .iter()
        .map(|p| serde_json::Value::Object(p.unit.metadata.clone()))
        .collect();
    let expires: Vec<Option<DateTime<Utc>>> =
        fresh.iter().map(|p| p.unit.lifetime.expires_at).collect();
    let from: Vec<Option<DateTime<Utc>>> =
        fresh.iter().map(|p| p.unit.lifetime.valid_from).collect();
    let to: Vec<Option<DateTime<Utc>>> = fresh.iter().map(|p| p.unit.lifetime.valid_to).collect();
    let vectors: Vec<Vector> = fresh
        .iter()
        .map(|p| Vector::from(p.vector.clone()))
        .collect();
    let written = c
        .rows(
            "INSERT INTO memories (id, kind, thread_id, role, content, created_at, metadata,
                level, expires_at, valid_from, valid_to, model_id, embedding)
             SELECT r.id, r.kind, r.thread_id, r.role, r.content, r.created_at, r.metadata, 0,
                    r.expires_at, r.valid_from, r.valid_to, $12, r.embedding
             FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::timestamptz[], $7::jsonb[], $8::timestamptz[], $9::timestamptz[],
                         $10::timestamptz[], $11::vector[])
                  WITH ORDINALITY AS r (id, kind, thread_id, role, content, created_at,
                                        metadata, expires_at, valid_from, valid_to, embedding, n)
             ORDER BY r.n
             ON CONFLICT (id) DO NOTHING
             RETURNING id",
            &[
                &ids, &kinds, &threads, &roles, &contents, &times, &metas, &expires, &from, &to,
                &vectors, &model,
            ],
        )
        .await
        .map_err(pg)?;
    let got: HashSet<uuid::Uuid> = written.iter().map(|r| r.get(0)).collect();
    Ok(ids.into_iter().filter(|id| !got.contains(id)).collect())
}

impl MemoryBackend for PgStore {
    fn backend_name(&self) -> &'static str {
        "postgres"
    }

    fn dimension(&self) -> usize {
        self.options.dim
    }

    fn model_id(&self) -> String {
        self.options.model_id.clone()
    }

    // -- reads the harness uses (src/reads.rs) --

    fn get_found(&self, ids: &[MemoryId]) -> Result<Vec<MemoryUnit>> {
        PgStore::get_found(self, ids)
    }

    fn scan(&self, filter: &Filter, offset: usize, limit: usize) -> Result<Vec<MemoryUnit>> {
        PgStore::scan(self, filter, offset, limit)
    }

    fn texts(&self, filter: &Filter) -> Result<Vec<(String, Option<String>)>> {
        PgStore::texts(self, filter)
    }

    fn timeline_entries(&self, filter: &Filter) -> Result<Vec<TimelineEntry>> {
        PgStore::timeline_entries(self, filter)
    }

    fn timeline_of(&self, vids: &[u64]) -> Result<Vec<TimelineEntry>> {
        PgStore::timeline_of(self, vids)
    }

    fn timeline_around(
        &self,
        filter: &Filter,
        times: &[DateTime<Utc>],
        before: usize,
        after: usize,
    ) -> Result<Vec<Vec<TimelineEntry>>> {
        PgStore::timeline_around(self, filter, times, before, after)
    }

    fn timeline_page(
        &self,
        filter: &Filter,
        limit: usize,
        newest: bool,
    ) -> Result<(Vec<TimelineEntry>, bool)> {
        PgStore::timeline_page(self, filter, limit, newest)
    }

    fn thread_speakers(&self, thread: &ThreadId) -> Result<Vec<String>> {
        PgStore::thread_speakers(self, thread)
    }

    fn top_summaries(&self, thread: &ThreadId, per_level: usize) -> Result<Vec<MemoryUnit>> {
        PgStore::top_summaries(self, thread, per_level)
    }

    fn count_in_thread(&self, thread: &ThreadId, kinds: &[MemoryKind]) -> Result<usize> {
        PgStore::count_in_thread(self, thread, kinds)
    }

    fn search_vector_ids(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
        ef: Option<usize>,
    ) -> Result<Vec<(u64, f32)>> {
        PgStore::search_vector_ids(self, query, k, filter, ef)
    }

    fn search_vector_ids_exact(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
    ) -> Result<Vec<(u64, f32)>> {
        PgStore::search_vector_ids_exact(self, query, k, filter)
    }

    fn search_keyword_ids(
        &self,
        query: &str,
        k: usize,
        filter: &Filter,
    ) -> Result<Vec<(u64, f32)>> {
        PgStore::search_keyword_ids(self, query, k, filter)
    }

    fn search_keyword_ids_capped(
        &self,
        query: &str,
        k: usize,
        filter: &Filter,
        max_matches: usize,
    ) -> Result<Vec<(u64, f32)>> {
        PgStore::search_keyword_ids_capped(self, query, k, filter, max_matches)
    }

    fn search_keyword_ids_capped_each(
        &self,
        query: &str,
        asks: &[(usize, &Filter)],
        max_matches: usize,
    ) -> Result<Vec<Vec<(u64, f32)>>> {
        PgStore::search_keyword_ids_capped_each(self, query, asks, max_matches)
    }

    fn hits(&self, found: Vec<(u64, f32)>) -> Result<Vec<Hit>> {
        PgStore::hits(self, found)
    }

    fn similarities(&self, query: Vec<f32>, vids: &[u64]) -> Result<Vec<(u64, f32)>> {
        PgStore::similarities(self, query, vids)
    }

    fn leaf_vids(&self, summaries: &[u64]) -> Result<HashSet<u64>> {
        PgStore::leaf_vids(self, summaries)
    }

    fn child_summary_vids(&self, summaries: &[u64]) -> Result<Vec<(u64, u64)>> {
        PgStore::child_summary_vids(self, summaries)
    }

    fn stale_summaries(&self, filter: &Filter, limit: usize) -> Result<Vec<MemoryUnit>> {
        PgStore::stale_summaries(self, filter, limit)
    }

    fn scan_uncovered_page(
        &self,
        filter: &Filter,
        parent_level: u32,
        limit: usize,
    ) -> Result<Vec<MemoryUnit>> {
        PgStore::scan_uncovered_page(self, filter, parent_level, limit)
    }

    fn late_arrivals(&self, filter: &Filter) -> Result<Vec<(MemoryId, MemoryId)>> {
        PgStore::late_arrivals(self, filter)
    }

    fn thread_tail(
        &self,
        thread: &ThreadId,
        kind: MemoryKind,
        after: u64,
    ) -> Result<Vec<(MemoryUnit, u64)>> {
        PgStore::thread_tail(self, thread, kind, after)
    }

    fn sequenced(&self, ids: &[MemoryId]) -> Result<Vec<(MemoryUnit, u64)>> {
        PgStore::sequenced(self, ids)
    }

    fn last_sequence(&self) -> Result<u64> {
        PgStore::last_sequence(self)
    }

    fn embedding(&self, id: MemoryId) -> Result<Vec<f32>> {
        PgStore::embedding(self, id)
    }

    fn stats(&self) -> Result<StoreStats> {
        PgStore::stats(self)
    }

    // -- writes the harness uses (src/writes.rs) --

    fn update(
        &self,
        id: MemoryId,
        content: String,
        metadata: Option<Metadata>,
        embedding: Vec<f32>,
    ) -> Result<MemoryUnit> {
        self.rewrite(id, content, metadata, embedding, false)
    }

    fn refresh_summary(
        &self,
        id: MemoryId,
        content: String,
        metadata: Option<Metadata>,
        embedding: Vec<f32>,
    ) -> Result<MemoryUnit> {
        self.rewrite(id, content, metadata, embedding, true)
    }

    fn set_metadata(&self, id: MemoryId, metadata: Metadata) -> Result<MemoryUnit> {
        self.replace_metadata(id, metadata)
    }

    fn extend_summary(&self, summary: MemoryId, sources: Vec<MemoryId>) -> Result<MemoryUnit> {
        let added = sources.len();
        let unit = self.extend(summary, sources)?;
        self.analyze_if_grown(added);
        Ok(unit)
    }

    fn place_source(&self, summary: MemoryId, source: MemoryId) -> Result<MemoryUnit> {
        self.place(summary, source)
    }

    fn add_continuation(
        &self,
        summary: NewSummary,
        previous: Option<MemoryId>,
        state: Option<ThreadState>,
        embedding: Vec<f32>,
    ) -> Result<MemoryUnit> {
        let unit = self.continuation(summary, previous, state, embedding)?;
        self.analyze_if_grown(written_rows(&unit));
        Ok(unit)
    }

    fn clear_thread_state(&self, thread: &ThreadId) -> Result<()> {
        self.clear_state(thread)
    }

    fn backup_rows(
        &self,
        with_embeddings: bool,
        on_start: &mut dyn FnMut(usize) -> Result<()>,
        on_row: &mut dyn FnMut(MemoryUnit, Option<Vec<f32>>) -> Result<()>,
    ) -> Result<usize> {
        self.backup(with_embeddings, on_start, on_row)
    }

    fn restore(&self, items: Vec<(MemoryUnit, Vec<f32>)>) -> Result<Vec<MemoryUnit>> {
        let units = self.restore_rows(items)?;
        self.analyze_if_grown(units.iter().map(written_rows).sum());
        Ok(units)
    }

    /// `REINDEX INDEX` of the HNSW index (pgvector keeps it current on every write; this
    /// rebuilds it compact, as the SQLite store's rebuild drops its tombstones).
    fn reindex(&self) -> Result<()> {
        self.rebuild_index()
    }

    /// Closes the connection pool: later calls on this store fail.
    fn close(&self) -> Result<()> {
        self.pool.close();
        Ok(())
    }

    /// A load of at least [`BULK_REBUILD_MIN`] memories and at least half the store's
    /// count goes in without the HNSW index: it is dropped, the chunks are written, and it
    /// is built again (also when the load fails part way). Vector searches meanwhile scan
    /// exactly, and other writers wait while the index builds. A process that dies part
    /// way leaves the store without the index; the next open builds it.
    fn insert_bulk(&self, items: Vec<(NewMemory, Vec<f32>)>) -> Result<Vec<MemoryUnit>> {
        check_memories(&items, self.options.dim)?;
        if items.len() < BULK_REBUILD_MIN {
            return insert_chunked(self, items);
        }
        let count = self.block(|c| async move {
            let n: i64 = c
                .query_one("SELECT count(*) FROM memories", &[])
                .await
                .map_err(pg)?
                .get(0);
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })?;
        if items.len() < count / 2 {
            return insert_chunked(self, items);
        }
        self.drop_vector_index()?;
        let loaded = insert_chunked(self, items);
        let built = self.build_vector_index();
        let units = loaded?;
        built?;
        Ok(units)
    }

    fn insert_batch(&self, items: Vec<(NewMemory, Vec<f32>)>) -> Result<Vec<MemoryUnit>> {
        let now = self.now();
        let prepared = prepare_memories(items, self.options.dim, now)?;
        let model = self.options.model_id.clone();
        let (out, inserted) = self.block(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            let ids: Vec<uuid::Uuid> = prepared.iter().map(|p| p.unit.id.uuid()).collect();
            let taken: HashSet<uuid::Uuid> = tx
                .rows("SELECT id FROM memories WHERE id = ANY($1)", &[&ids])
                .await
                .map_err(pg)?
                .iter()
                .map(|r| r.get(0))
                .collect();
            // What each position returns: the stored copy of a retry, or the new row.
            let mut out = Vec::with_capacity(prepared.len());
            let mut fresh = Vec::with_capacity(prepared.len());
            for p in prepared {
                if taken.contains(&p.unit.id.uuid()) {
                    let stored = get_unit(&tx, p.unit.id).await?;
                    if !same_memory(&stored, &p, now) {
                        return Err(StoreError::DuplicateId { id: p.unit.id });
                    }
                    out.push(stored);
                } else {
                    out.push(p.unit.clone());
                    fresh.push(p);
                }
            }
            let inserted = fresh.len();
            if fresh.iter().any(|p| p.unit.lifetime.supersedes.is_some()) {
                // In order, one row at a time: a memory may supersede one written earlier
                // in the same batch.
                for p in &fresh {
                    insert_one(&tx, p, &model).await?;
                }
            } else if !fresh.is_empty() {
                // A concurrent writer of the same keyed memory: its copy is returned when
                // it is the same memory (a retry raced itself), else the id is taken.
                for id in insert_many(&tx, &fresh, &model).await? {
                    let id = MemoryId::from_uuid(id);
                    let stored = get_unit(&tx, id).await?;
                    let mine = fresh.iter().find(|p| p.unit.id == id);
                    match mine {
                        Some(p) if same_memory(&stored, p, now) => {
                            for o in out.iter_mut().filter(|o| o.id == id) {
                                *o = stored.clone();
                            }
                        }
                        _ => return Err(StoreError::DuplicateId { id }),
                    }
                }
            }
            tx.commit().await.map_err(pg)?;
            Ok((out, inserted))
        })?;
        self.analyze_if_grown(inserted);
        Ok(out)
    }

    fn add_summary(&self, summary: NewSummary, embedding: Vec<f32>) -> Result<MemoryUnit> {
        // A summary that continues nothing, with no state: one writer for both.
        let unit = self.continuation(summary, None, None, embedding)?;
        self.analyze_if_grown(written_rows(&unit));
        Ok(unit)
    }

    fn get(&self, id: MemoryId) -> Result<MemoryUnit> {
        self.block(move |c| async move { get_unit(&c, id).await })
    }

    fn sources(&self, summary: MemoryId) -> Result<Vec<MemoryUnit>> {
        self.linked(
            summary,
            true,
            format!(
                "SELECT {COLS} FROM memories m JOIN summary_sources l ON l.source = m.rid
                 WHERE l.summary = "
            ),
            " ORDER BY l.position",
        )
    }

    fn summaries_of(&self, id: MemoryId) -> Result<Vec<MemoryUnit>> {
        self.linked(
            id,
            false,
            format!(
                "SELECT {COLS} FROM memories m JOIN summary_sources l ON l.summary = m.rid
                 WHERE l.source = "
            ),
            " ORDER BY m.created_at, m.rid",
        )
    }

    // The walks' rows are collected into an array first, so the rows are read by primary
    // key whatever the planner guesses of the walk's size (a join sized from stale
    // statistics hashed the whole table).
    fn ancestors(&self, id: MemoryId) -> Result<Vec<MemoryUnit>> {
        self.linked(
            id,
            false,
            "WITH RECURSIVE up(r) AS (SELECT summary FROM summary_sources WHERE source = ".into(),
            " UNION SELECT l.summary FROM summary_sources l JOIN up ON l.source = up.r)
             SELECT {COLS} FROM memories m WHERE m.rid = ANY(ARRAY(SELECT r FROM up))
             ORDER BY m.level, m.created_at, m.rid",
        )
    }

    fn leaves(&self, summary: MemoryId) -> Result<Vec<MemoryUnit>> {
        self.linked(
            summary,
            true,
            "WITH RECURSIVE down(r) AS (SELECT source FROM summary_sources WHERE summary = ".into(),
            " UNION SELECT l.source FROM summary_sources l JOIN down ON l.summary = down.r)
             SELECT {COLS} FROM memories m WHERE m.rid = ANY(ARRAY(SELECT r FROM down))
               AND m.level = 0 ORDER BY m.created_at, m.rid",
        )
    }

    fn recent(&self, filter: &Filter, limit: usize) -> Result<Vec<MemoryUnit>> {
        filter.validate()?;
        let mut q = Query::select();
        q.push(" WHERE TRUE");
        q.filter(filter, self.now());
        q.push(" ORDER BY m.created_at DESC, m.rid DESC LIMIT ");
        q.bind(i64::try_from(limit).unwrap_or(i64::MAX));
        let mut out = self.block(move |c| async move { query_units(&c, &q).await })?;
        out.reverse();
        Ok(out)
    }

    fn search_vector(&self, query: Vec<f32>, k: usize, filter: &Filter) -> Result<Vec<Hit>> {
        PgStore::search_vector_hits(self, query, k, filter)
    }

    fn search_keyword(&self, query: &str, k: usize, filter: &Filter) -> Result<Vec<Hit>> {
        PgStore::search_keyword_hits(self, query, k, filter)
    }

    fn delete_many(&self, ids: &[MemoryId], policy: DeletePolicy) -> Result<DeleteReport> {
        Ok(self.delete_many_with_texts(ids, policy)?.0)
    }

    fn delete_many_with_texts(
        &self,
        ids: &[MemoryId],
        policy: DeletePolicy,
    ) -> Result<(DeleteReport, Vec<String>)> {
        let ids = ids.to_vec();
        self.block(move |mut c| async move { delete_many(&mut c, &ids, policy).await })
    }

    fn times_of(&self, vids: &[u64]) -> Result<Vec<(u64, DateTime<Utc>)>> {
        let rids = extra::rids(vids);
        self.block(move |c| async move { extra::times_of(&c, &rids).await })
    }

    fn summary_spans(&self, vids: &[u64]) -> Result<Vec<(u64, DateTime<Utc>, DateTime<Utc>)>> {
        let rids = extra::rids(vids);
        self.block(move |c| async move { extra::summary_spans(&c, &rids).await })
    }

    fn consolidated_until(&self, thread: &ThreadId) -> Result<Option<DateTime<Utc>>> {
        let t = thread.as_str().to_owned();
        self.block(move |c| async move { extra::consolidated_until(&c, &t).await })
    }

    fn threads(&self) -> Result<Vec<ThreadId>> {
        self.block(|c| async move {
            let rows = c
                .rows(
                    "SELECT DISTINCT thread_id COLLATE \"C\" AS t FROM memories
                         WHERE thread_id IS NOT NULL ORDER BY t",
                    &[],
                )
                .await
                .map_err(pg)?;
            Ok(rows
                .iter()
                .filter_map(|r| ThreadId::new(r.get::<_, String>(0)).ok())
                .collect())
        })
    }
    fn page(&self, filter: &Filter, cursor: Option<Cursor>, limit: usize) -> Result<Page> {
        filter.validate()?;
        let take = limit.min(100_000);
        let mut q = Query::new(format!(
            "SELECT {COLS}, m.rid AS seq FROM memories m WHERE TRUE"
        ));
        q.filter(filter, self.now());
        if let Some(c) = cursor {
            q.push(" AND (m.created_at, m.rid) > (");
            q.bind(c.created_at());
            q.push(", ");
            q.bind(c.sequence());
            q.push(")");
        }
        q.push(" ORDER BY m.created_at, m.rid LIMIT ");
        q.bind(i64::try_from(take).unwrap_or(i64::MAX).saturating_add(1));
        self.block(move |c| async move {
            let rows = c.rows(&q.text, &refs(&q.params)).await.map_err(pg)?;
            let seqs: Vec<i64> = rows.iter().map(|r| r.get("seq")).collect();
            let mut items = units(&c, &rows).await?;
            let more = items.len() > take;
            items.truncate(take);
            let next = match (more, items.last()) {
                (true, Some(last)) => Some(Cursor::after(last.created_at, seqs[items.len() - 1])),
                _ => None,
            };
            Ok(Page { items, next })
        })
    }

    fn patch_metadata(&self, id: MemoryId, patch: Metadata) -> Result<MemoryUnit> {
        check_metadata(&patch)?;
        self.block(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            // Locked while it changes, so two patches of one memory do not lose either.
            tx.row_opt(
                "SELECT 1 FROM memories WHERE id = $1 FOR UPDATE",
                &[&id.uuid()],
            )
            .await
            .map_err(pg)?
            .ok_or(StoreError::NotFound { id })?;
            let mut unit = get_unit(&tx, id).await?;
            merge_patch(&mut unit.metadata, patch);
            check_metadata(&unit.metadata)?;
            tx.exec(
                "UPDATE memories SET metadata = $2 WHERE id = $1",
                &[
                    &id.uuid(),
                    &serde_json::Value::Object(unit.metadata.clone()),
                ],
            )
            .await
            .map_err(pg)?;
            tx.commit().await.map_err(pg)?;
            Ok(unit)
        })
    }

    fn thread_state(&self, thread: &ThreadId, name: &str) -> Result<Option<String>> {
        let (thread, name) = (thread.as_str().to_owned(), name.to_owned());
        self.block(move |c| async move {
            Ok(c.row_opt(
                "SELECT value FROM thread_state WHERE thread_id = $1 AND name = $2",
                &[&thread, &name],
            )
            .await
            .map_err(pg)?
            .map(|r| r.get(0)))
        })
    }

    fn set_thread_state(&self, state: ThreadState) -> Result<()> {
        state.validate()?;
        self.block(move |c| async move {
            c.exec(
                "INSERT INTO thread_state (thread_id, name, value) VALUES ($1, $2, $3)
                 ON CONFLICT (thread_id, name) DO UPDATE SET value = EXCLUDED.value",
                &[&state.thread.as_str(), &state.name, &state.value],
            )
            .await
            .map_err(pg)?;
            Ok(())
        })
    }
    fn existing(&self, ids: &[MemoryId]) -> Result<HashSet<MemoryId>> {
        let uuids: Vec<uuid::Uuid> = ids.iter().map(MemoryId::uuid).collect();
        self.block(move |c| async move {
            Ok(
                c.rows("SELECT id FROM memories WHERE id = ANY($1)", &[&uuids])
                    .await
                    .map_err(pg)?
                    .iter()
                    .map(|r| MemoryId::from_uuid(r.get(0)))
                    .collect(),
            )
        })
    }

    fn get_many(&self, ids: &[MemoryId]) -> Result<Vec<MemoryUnit>> {
        let found = self.fetch(ids)?;
        ids.iter()
            .map(|id| {
                found
                    .get(id)
                    .cloned()
                    .ok_or(StoreError::NotFound { id: *id })
            })
            .collect()
    }

    fn versions(&self, id: MemoryId) -> Result<Vec<MemoryUnit>> {
        self.linked(
            id,
            false,
            "WITH RECURSIVE back(rid) AS (SELECT ".into(),
            "::bigint UNION SELECT o.supersedes FROM memories o JOIN back b ON o.rid = b.rid
                 WHERE o.supersedes IS NOT NULL),
             fwd(rid) AS (SELECT rid FROM back WHERE rid = (SELECT min(rid) FROM back)
                 UNION SELECT o.rid FROM memories o JOIN fwd f ON o.supersedes = f.rid)
             SELECT {COLS} FROM memories m
             WHERE m.rid = ANY(ARRAY(SELECT rid FROM back UNION SELECT rid FROM fwd))
             ORDER BY COALESCE(m.valid_from, m.created_at), m.rid",
        )
    }

    fn expired(&self, limit: usize) -> Result<Vec<MemoryId>> {
        let now = self.now();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.block(move |c| async move {
            Ok(c.rows(
                "SELECT id FROM memories WHERE expires_at IS NOT NULL AND expires_at <= $1
                 ORDER BY expires_at LIMIT $2",
                &[&now, &limit],
            )
            .await
            .map_err(pg)?
            .iter()
            .map(|r| MemoryId::from_uuid(r.get(0)))
            .collect())
        })
    }

    fn set_expiry(&self, id: MemoryId, expires_at: Option<DateTime<Utc>>) -> Result<MemoryUnit> {
        let expires_at = expires_at.map(to_stored_time);
        self.block(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            let n = tx
                .exec(
                    "UPDATE memories SET expires_at = $2 WHERE id = $1",
                    &[&id.uuid(), &expires_at],
                )
                .await
                .map_err(pg)?;
            if n == 0 {
                return Err(StoreError::NotFound { id });
            }
            let unit = get_unit(&tx, id).await?;
            tx.commit().await.map_err(pg)?;
            Ok(unit)
        })
    }
}

/// Ends the validity of `old` at `until` because `new` supersedes it; returns `old`'s rid.
async fn supersede<C: GenericClient + Sync>(
    c: &C,
    old: MemoryId,
    new: MemoryId,
    until: DateTime<Utc>,
) -> Result<i64> {
    if old == new {
        return Err(StoreError::CannotSupersede {
            id: old,
            reason: "a memory cannot supersede itself",
        });
    }
    let row = c
        .row_opt(
            "SELECT rid, kind, valid_to FROM memories WHERE id = $1 FOR UPDATE",
            &[&old.uuid()],
        )
        .await
        .map_err(pg)?
        .ok_or(StoreError::NotFound { id: old })?;
    let kind: String = row.get(1);
    if kind == MemoryKind::Summary.as_str() {
        return Err(StoreError::CannotSupersede {
            id: old,
            reason: "it is a summary",
        });
    }
    if row.get::<_, Option<DateTime<Utc>>>(2).is_some() {
        return Err(StoreError::CannotSupersede {
            id: old,
            reason: "it is no longer current (supersede the current version)",
        });
    }
    let rid: i64 = row.get(0);
    c.exec(
        "UPDATE memories SET valid_to = $2 WHERE rid = $1",
        &[&rid, &until],
    )
    .await
    .map_err(pg)?;
    Ok(rid)
}

async fn delete_many(
    c: &mut deadpool_postgres::Object,
    ids: &[MemoryId],
    policy: DeletePolicy,
) -> Result<(DeleteReport, Vec<String>)> {
    let tx = c.transaction().await.map_err(pg)?;
    let mut report = DeleteReport::default();
    let mut doomed: Vec<i64> = Vec::with_capacity(ids.len());
    let mut doomed_set: HashSet<i64> = HashSet::with_capacity(ids.len());
    let mut named: HashMap<i64, MemoryId> = HashMap::with_capacity(ids.len());
    for id in ids {
        let rid = rid_of(&tx, *id).await?;
        named.entry(rid).or_insert(*id);
        if doomed_set.insert(rid) {
            doomed.push(rid);
        }
    }
    let targets = doomed.clone();
    match policy {
        DeletePolicy::Restrict => {
            for rid in &targets {
                let cites: Vec<MemoryId> = citing(&tx, *rid)
                    .await?
                    .into_iter()
                    .filter(|(r, _)| !doomed_set.contains(r))
                    .map(|(_, id)| id)
                    .collect();
                if let (false, Some(id)) = (cites.is_empty(), named.get(rid)) {
                    return Err(StoreError::CitedBySummaries {
                        id: *id,
                        summaries: cites,
                    });
                }
            }
        }
        DeletePolicy::Cascade => {
            for rid in &targets {
                for a in ancestor_rids(&tx, *rid).await? {
                    if doomed_set.insert(a) {
                        doomed.push(a);
                    }
                }
            }
        }
        DeletePolicy::Detach => {
            let mut kept: Vec<(i64, MemoryId)> = Vec::new();
            let mut kept_set: HashSet<i64> = HashSet::new();
            let mut frontier = targets.clone();
            while let Some(gone) = frontier.pop() {
                let cites = citing(&tx, gone).await?;
                tx.exec("DELETE FROM summary_sources WHERE source = $1", &[&gone])
                    .await
                    .map_err(pg)?;
                for (r, sid) in cites {
                    let left: i64 = tx
                        .row_one(
                            "SELECT count(*) FROM summary_sources WHERE summary = $1",
                            &[&r],
                        )
                        .await
                        .map_err(pg)?
                        .get(0);
                    if left == 0 {
                        if doomed_set.insert(r) {
                            doomed.push(r);
                            frontier.push(r);
                        }
                    } else if kept_set.insert(r) {
                        kept.push((r, sid));
                    }
                }
            }
            kept.retain(|(r, _)| !doomed_set.contains(r));
            let rids: Vec<i64> = kept.iter().map(|(r, _)| *r).collect();
            tx.exec(
                "UPDATE memories SET stale = TRUE WHERE rid = ANY($1)",
                &[&rids],
            )
            .await
            .map_err(pg)?;
            let mut up = rids.clone();
            for r in &rids {
                up.extend(ancestor_rids(&tx, *r).await?);
            }
            up.sort_unstable();
            up.dedup();
            up.retain(|r| !doomed_set.contains(r));
            refresh_summaries(&tx, &up).await?;
            report.detached = kept.into_iter().map(|(_, id)| id).collect();
        }
    }
    for r in &doomed {
        tx.exec(
            "DELETE FROM summary_sources WHERE summary = $1 OR source = $1",
            &[r],
        )
        .await
        .map_err(pg)?;
        // A deleted version leaves the chain of its fact, as in the SQLite store.
        let row = tx
            .row_one(
                "SELECT supersedes, valid_to FROM memories WHERE rid = $1",
                &[r],
            )
            .await
            .map_err(pg)?;
        let (older, until): (Option<i64>, Option<DateTime<Utc>>) = (row.get(0), row.get(1));
        let newer: Option<(i64, DateTime<Utc>)> = tx
            .row_opt(
                "SELECT rid, COALESCE(valid_from, created_at) FROM memories
                 WHERE supersedes = $1 ORDER BY rid LIMIT 1",
                &[r],
            )
            .await
            .map_err(pg)?
            .map(|x| (x.get(0), x.get(1)))
            .filter(|(n, _)| !doomed_set.contains(n));
        if let Some(o) = older.filter(|o| !doomed_set.contains(o)) {
            let o_until = match newer {
                Some((_, start)) => Some(start),
                None => until,
            };
            tx.exec(
                "UPDATE memories SET valid_to = $2 WHERE rid = $1",
                &[&o, &o_until],
            )
            .await
            .map_err(pg)?;
            if let Some((n, _)) = newer {
                tx.exec(
                    "UPDATE memories SET supersedes = $2 WHERE rid = $1",
                    &[&n, &o],
                )
                .await
                .map_err(pg)?;
            }
        }
        tx.exec(
            "UPDATE memories SET supersedes = NULL WHERE supersedes = $1",
            &[r],
        )
        .await
        .map_err(pg)?;
    }
    let mut texts = Vec::with_capacity(doomed.len());
    for r in &doomed {
        let row = tx
            .row_one(
                "DELETE FROM memories WHERE rid = $1 RETURNING id, content",
                &[r],
            )
            .await
            .map_err(pg)?;
        report
            .deleted
            .push(MemoryId::from_uuid(row.get::<_, uuid::Uuid>(0)));
        texts.push(row.get(1));
    }
    tx.commit().await.map_err(pg)?;
    Ok((report, texts))
}
