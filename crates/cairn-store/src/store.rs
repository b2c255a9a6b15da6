//! The store handle: one writer thread, a pool of readers, the vector index.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use chrono::{DateTime, Utc};
use rusqlite::types::Value;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Transaction};
use serde::{Deserialize, Serialize};

use cairn_core::{
    check_metadata, normalized, validate_vector, InputError, MemoryId, MemoryKind, MemoryUnit,
    Metadata, NewMemory, SummaryType, ThreadId,
};

use crate::index::{snapshot_dir, Admit, Attr, Entry, IndexHealth, SnapshotLock, VectorIndex};
use crate::rows::{
    self, decode_vector, encode_vector, from_micros, query_units, query_units_with, to_micros,
    Visibility,
};
use crate::schema;
use crate::{DeletePolicy, Filter, ModelError, Result, StoreError, StoreOptions};

mod bounded;
mod restore;

/// Index ids as bound values, with the `?, ?, ...` list that names them in an `IN (...)`.
fn id_list(vids: impl IntoIterator<Item = u64>) -> (Vec<Value>, String) {
    let args: Vec<Value> = vids
        .into_iter()
        .map(|v| Value::Integer(i64::try_from(v).unwrap_or(i64::MAX)))
        .collect();
    let marks = vec!["?"; args.len()].join(", ");
    (args, marks)
}

/// A summary to be written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewSummary {
    /// The id to use; fresh when `None`.
    pub id: Option<MemoryId>,
    /// Summary text.
    pub content: String,
    /// The memories it summarizes, in order; at least one, no repeats.
    pub source_ids: Vec<MemoryId>,
    /// Thread, if any.
    pub thread_id: Option<ThreadId>,
    /// What it summarizes.
    pub summary_type: SummaryType,
    /// Free JSON object.
    pub metadata: Metadata,
    /// When it was written; the clock when `None`.
    pub created_at: Option<DateTime<Utc>>,
}

impl NewSummary {
    /// A conversation summary of `source_ids`.
    pub fn new(content: impl Into<String>, source_ids: Vec<MemoryId>) -> Self {
        Self {
            id: None,
            content: content.into(),
            source_ids,
            thread_id: None,
            summary_type: SummaryType::Conversation,
            metadata: Metadata::new(),
            created_at: None,
        }
    }

    /// Sets the thread.
    pub fn with_thread(mut self, thread: Option<ThreadId>) -> Self {
        self.thread_id = thread;
        self
    }

    /// Sets the summary type.
    pub fn with_type(mut self, t: SummaryType) -> Self {
        self.summary_type = t;
        self
    }

    /// Sets the metadata.
    pub fn with_metadata(mut self, m: Metadata) -> Self {
        self.metadata = m;
        self
    }
}

/// A small named value of a thread (a conversation memory's state: which summary is its
/// newest, where a clear left it), kept beside the memories, not as one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadState {
    /// The thread.
    pub thread: ThreadId,
    /// The value's name (non-empty, at most 200 bytes).
    pub name: String,
    /// The value (at most 64 KiB).
    pub value: String,
}

impl ThreadState {
    /// Checks the name (1 to 200 bytes) and the value (at most 64 KiB).
    pub fn validate(&self) -> Result<()> {
        if self.name.is_empty() || self.name.len() > 200 {
            return Err(StoreError::Config(format!(
                "a thread state name must have 1 to 200 bytes (got {})",
                self.name.len()
            )));
        }
        if self.value.len() > 65_536 {
            return Err(StoreError::Config(format!(
                "a thread state value must have at most 64 KiB (got {} bytes)",
                self.value.len()
            )));
        }
        Ok(())
    }
}

fn put_state(tx: &Transaction<'_>, s: &ThreadState) -> Result<()> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO thread_state (thread_id, name, value) VALUES (?1, ?2, ?3)",
    )?
    .execute(params![s.thread.as_str(), s.name, s.value])?;
    Ok(())
}

/// What a delete did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeleteReport {
    /// Every memory removed (the target first, then cascaded summaries).
    pub deleted: Vec<MemoryId>,
    /// Summaries that lost a link and were marked stale (Detach).
    pub detached: Vec<MemoryId>,
}

/// Where a listing stopped ([`Store::page`]): the time and insertion sequence of the last
/// memory returned. Written as text (`Display` / `FromStr`) for callers that pass it on;
/// treat the text as opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cursor {
    created_at: i64,
    rid: i64,
}

impl Cursor {
    /// The position after the memory created at `created_at` with insertion sequence
    /// `sequence` (what a backend's listing hands out).
    pub fn after(created_at: DateTime<Utc>, sequence: i64) -> Self {
        Self {
            created_at: to_micros(created_at),
            rid: sequence,
        }
    }

    /// The time of the last memory listed.
    pub fn created_at(&self) -> DateTime<Utc> {
        from_micros(self.created_at)
    }

    /// The insertion sequence of the last memory listed.
    pub fn sequence(&self) -> i64 {
        self.rid
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "c{}.{}", self.created_at, self.rid)
    }
}

impl std::str::FromStr for Cursor {
    type Err = InputError;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let bad = || InputError::UnknownName {
            what: "cursor",
            value: s.chars().take(64).collect(),
        };
        let body = s.trim().strip_prefix('c').ok_or_else(bad)?;
        let (t, r) = body.split_once('.').ok_or_else(bad)?;
        Ok(Self {
            created_at: t.parse().map_err(|_| bad())?,
            rid: r.parse().map_err(|_| bad())?,
        })
    }
}

impl Serialize for Cursor {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cursor {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Page {
    /// The memories, oldest first.
    pub items: Vec<MemoryUnit>,
    /// Where the next page starts; `None` after the last.
    pub next: Option<Cursor>,
}

/// A search hit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hit {
    /// The memory.
    pub memory: MemoryUnit,
    /// Cosine similarity (vector search) or negated BM25 (keyword search): higher is better.
    pub score: f32,
}

/// Counts and health.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StoreStats {
    /// Memories in total.
    pub total: usize,
    /// Memories per kind.
    pub by_kind: HashMap<String, usize>,
    /// Memories per level.
    pub by_level: HashMap<u32, usize>,
    /// Summaries marked stale.
    pub stale_summaries: usize,
    /// Summary links.
    pub links: usize,
    /// The vector index.
    pub index: IndexHealth,
    /// Times the index was rebuilt from SQLite since opening, and why the last time.
    pub rebuilds: usize,
    /// Why the index was last rebuilt, if it was.
    pub last_rebuild_reason: Option<String>,
    /// Index entries this process caught up from other processes' writes since opening.
    pub foreign_changes: usize,
    /// Times this process re-read every row's index attributes since opening (the index log
    /// had been pruned past what it last saw, or an index update after a commit failed).
    pub resyncs: usize,
    /// Index snapshots or rebuilds that failed after their write had committed (the write
    /// was acknowledged; the snapshot is retried at the next write and on close).
    pub snapshot_failures: usize,
    /// The last such failure, cleared by the next snapshot that succeeds.
    pub last_snapshot_error: Option<String>,
}

/// What [`Store::check_index`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexCheck {
    /// Rows in SQLite.
    pub rows: usize,
    /// Live entries in the index.
    pub indexed: usize,
    /// Rows without an index entry.
    pub missing: usize,
    /// Rows whose entry has another kind, level, time or thread.
    pub mismatched: usize,
    /// Index entries without a row.
    pub orphaned: usize,
}

impl IndexCheck {
    /// True when the index holds exactly the rows, with their attributes.
    pub fn is_consistent(&self) -> bool {
        self.missing == 0 && self.mismatched == 0 && self.orphaned == 0
    }
}

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

struct Shared {
    path: PathBuf,
    snapshot_dir: PathBuf,
    options: StoreOptions,
    index: VectorIndex,
    rebuilds: Mutex<(usize, Option<String>)>,
    /// This handle's id in the index log (random per open).
    origin: i64,
    /// The highest index-log sequence number this handle's index reflects.
    seen: AtomicI64,
    /// Set when an index update after a commit failed: the next sync re-reads every row.
    resync: AtomicBool,
    /// Set once the file is seen to hold a memory with an expiry or an end of validity:
    /// from then on reads test lifetimes (before, their conditions are left out, so reads
    /// keep their covering indexes).
    lifetimes: AtomicBool,
    foreign: AtomicUsize,
    resyncs: AtomicUsize,
    /// Snapshot failures after commit, and the last one's message (cleared on success).
    snapshot_failures: Mutex<(usize, Option<String>)>,
    /// A rebuild made off the writer thread, waiting to be swapped in.
    rebuilt: Arc<Mutex<Option<Rebuilt>>>,
    /// Set while a background rebuild runs (or waits to be swapped in).
    rebuilding: Arc<AtomicBool>,
    rebuild_thread: Mutex<Option<JoinHandle<()>>>,
    /// Hundreds of SQLite VM instructions run by this handle's connections, when
    /// [`StoreOptions::count_sql_work`] is on.
    sql_work: Arc<AtomicU64>,
}

/// VM instructions between two calls of the work counter's progress callback: SQLite counts
/// them per statement, so up to this many of each statement's are not counted.
const SQL_WORK_UNIT: i32 = 100;

/// Makes `conn` add to `counter` every [`SQL_WORK_UNIT`] VM instructions, when `on`.
fn count_sql_work(conn: &mut Connection, counter: &Arc<AtomicU64>, on: bool) -> Result<()> {
    if on {
        let c = Arc::clone(counter);
        conn.progress_handler(
            SQL_WORK_UNIT,
            Some(move || {
                c.fetch_add(1, Ordering::Relaxed);
                false
            }),
        )?;
    }
    Ok(())
}

/// A rebuilt index, the index-log position its rows were read at, and why it was built.
struct Rebuilt {
    index: VectorIndex,
    head: i64,
    why: String,
}

struct Inner {
    shared: Arc<Shared>,
    tx: Mutex<Option<SyncSender<Job>>>,
    writer: Mutex<Option<JoinHandle<Result<()>>>>,
    readers: Mutex<Vec<Connection>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(tx);
        if let Some(h) = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "index snapshot on close failed"),
                Err(_) => tracing::warn!("the writer thread panicked"),
            }
        }
    }
}

/// A Cairn store: SQLite rows (the source of truth) and an HNSW index derived from them.
///
/// A cheap `Clone` handle, `Send + Sync`. Writes go to one writer thread in order; reads use
/// a pool of read-only connections. Every method blocks: async callers run them through
/// `spawn_blocking`.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.shared.path)
            .finish_non_exhaustive()
    }
}

fn open_rw(path: &Path, options: &StoreOptions) -> Result<Connection> {
    let conn = Connection::open(path)?;
    schema::configure(&conn, options.synchronous_full)?;
    Ok(conn)
}

fn not_a_db(path: &Path, e: StoreError) -> StoreError {
    match e {
        StoreError::Sqlite(rusqlite::Error::SqliteFailure(f, msg))
            if matches!(
                f.code,
                rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt
            ) =>
        {
            StoreError::NotADatabase {
                path: path.to_owned(),
                message: msg.unwrap_or_else(|| f.to_string()),
            }
        }
        other => other,
    }
}

fn live_rows(conn: &Connection, index: &VectorIndex) -> Result<Vec<(usize, Attr)>> {
    let mut stmt = conn.prepare(&format!("SELECT vid, {ATTR_COLS} FROM memories"))?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, i64>(0)?, AttrRow::read(r, 1)?)))?;
    let mut out = Vec::new();
    for row in rows {
        let (vid, a) = row?;
        out.push((vid_usize(vid), a.attr(index)?));
    }
    Ok(out)
}

/// The columns an index attribute is read from, in [`AttrRow::read`]'s order.
const ATTR_COLS: &str = "kind, level, created_at, thread_id, expires_at, valid_from, valid_to";

/// An index attribute as read from its row.
struct AttrRow {
    kind: String,
    level: u32,
    created_at: i64,
    thread: Option<String>,
    expires: Option<i64>,
    valid_from: Option<i64>,
    valid_to: Option<i64>,
}

impl AttrRow {
    /// Reads [`ATTR_COLS`] starting at column `at`.
    fn read(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Self> {
        Ok(Self {
            kind: r.get(at)?,
            level: r.get(at + 1)?,
            created_at: r.get(at + 2)?,
            thread: r.get(at + 3)?,
            expires: r.get(at + 4)?,
            valid_from: r.get(at + 5)?,
            valid_to: r.get(at + 6)?,
        })
    }

    fn attr(self, index: &VectorIndex) -> Result<Attr> {
        Ok(Attr {
            kind: self.kind.parse()?,
            level: self.level,
            created_at: self.created_at,
            thread: index.intern(self.thread.as_deref()),
            expires: self.expires.unwrap_or(i64::MAX),
            valid_from: self.valid_from.unwrap_or(self.created_at),
            valid_to: self.valid_to.unwrap_or(i64::MAX),
        })
    }
}

/// An index id as the index's key (ids past `usize` match nothing).
fn vid_usize_u64(vid: u64) -> usize {
    usize::try_from(vid).unwrap_or(usize::MAX)
}

fn vid_usize(vid: i64) -> usize {
    usize::try_from(vid).unwrap_or(usize::MAX)
}

/// Reads the vectors of the given vids (all rows when `None`).
fn vectors(conn: &Connection, vids: Option<&[usize]>) -> Result<Vec<(usize, Vec<f32>)>> {
    let mut out = Vec::new();
    match vids {
        None => {
            let mut stmt = conn.prepare("SELECT vid, embedding FROM memories ORDER BY vid")?;
            let rows =
                stmt.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))?;
            for row in rows {
                let (vid, blob) = row?;
                out.push((vid_usize(vid), decode_vector(&blob)));
            }
        }
        Some(vids) => {
            let mut stmt = conn.prepare_cached("SELECT embedding FROM memories WHERE vid = ?1")?;
            for vid in vids {
                let v = i64::try_from(*vid).unwrap_or(i64::MAX);
                let blob: Vec<u8> = stmt.query_row(params![v], |r| r.get(0))?;
                out.push((*vid, decode_vector(&blob)));
            }
        }
    }
    Ok(out)
}

/// How long [`Store::erase_deleted`] waits for other connections' reads to end before it
/// leaves the log's old frames for a later erase.
const ERASE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The `store_meta` key of [`Store::mark_for_erase`].
const ERASE_MARK: &str = "erase_pending";

/// The lock on `<db>.forget.lock` that tells a forget under way from one whose process
/// stopped: held shared by each forget ([`PendingForget`]) and exclusively by whoever
/// finishes the marks left ([`Store::try_lock_forgets`]). The operating system's advisory
/// file lock, released when this is dropped or the process ends.
#[derive(Debug)]
pub struct ForgetLock {
    file: std::fs::File,
    held: bool,
}

impl ForgetLock {
    fn open(db: &Path) -> Result<Self> {
        // One lock file whatever path (a link, a relative one) the store was opened by.
        let db = std::fs::canonicalize(db).unwrap_or_else(|_| db.to_owned());
        let mut path = db.as_os_str().to_owned();
        path.push(".forget.lock");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(PathBuf::from(path))?;
        Ok(ForgetLock { file, held: false })
    }

    /// Whether the lock is held: `false` on a file system without advisory locks.
    pub fn held(&self) -> bool {
        self.held
    }
}

/// A forget under way ([`Store::mark_forget`]): its mark's name, and the forget lock held
/// shared until this is dropped. The mark stays in the database until it is cleared
/// ([`Store::clear_forget_marks`]).
#[derive(Debug)]
pub struct PendingForget {
    /// The mark's name (for [`Store::delete_marked`] and [`Store::clear_forget_marks`]).
    pub name: String,
    _lock: ForgetLock,
}

/// A forget that has not finished ([`Store::mark_forget`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForgetMark {
    /// The mark's name.
    pub name: String,
    /// The summaries its deletes left to be written again (see [`Store::delete_marked`]).
    pub summaries: Vec<MemoryId>,
}

/// The `store_meta` key prefix of [`Store::mark_forget`]'s marks, and the first key past
/// them (`:` + 1).
const FORGET_MARK: &str = "forget:";
const FORGET_MARK_END: &str = "forget;";

/// Whether the database holds the mark of [`Store::mark_for_erase`].
fn erase_marked(c: &Connection) -> Result<bool> {
    Ok(c.query_row(
        "SELECT EXISTS (SELECT 1 FROM store_meta WHERE key = ?1)",
        [ERASE_MARK],
        |r| r.get(0),
    )?)
}

impl Store {
    /// Opens (or creates) the store at `path`.
    ///
    /// Creates and migrates the schema, checks the model identity, loads the index snapshot
    /// (catching up rows written after it) or rebuilds the index from the stored embeddings
    /// when the snapshot is missing, damaged or made for other parameters.
    pub fn open(path: impl AsRef<Path>, options: StoreOptions) -> Result<Store> {
        options.validate()?;
        let path = path.as_ref().to_owned();
        let mut conn = open_rw(&path, &options).map_err(|e| not_a_db(&path, e))?;
        schema::migrate(&mut conn, &options).map_err(|e| not_a_db(&path, e))?;
        let sql_work = Arc::new(AtomicU64::new(0));
        count_sql_work(&mut conn, &sql_work, options.count_sql_work)?;
        let snap = snapshot_dir(&path);
        let (index, reason) =
            match VectorIndex::load(&snap, options.hnsw, &options.model_id, options.dim) {
                Ok(index) => (index, None),
                Err(why) => {
                    let empty = VectorIndex::empty(options.hnsw, &options.model_id, options.dim);
                    (empty, Some(why))
                }
            };
        let shared = Arc::new(Shared {
            path: path.clone(),
            snapshot_dir: snap,
            options: options.clone(),
            index,
            rebuilds: Mutex::new((0, None)),
            origin: new_origin(),
            seen: AtomicI64::new(0),
            resync: AtomicBool::new(false),
            lifetimes: AtomicBool::new(false),
            foreign: AtomicUsize::new(0),
            resyncs: AtomicUsize::new(0),
            snapshot_failures: Mutex::new((0, None)),
            rebuilt: Arc::new(Mutex::new(None)),
            rebuilding: Arc::new(AtomicBool::new(false)),
            rebuild_thread: Mutex::new(None),
            sql_work,
        });
        // The log position first, then the rows: a write committed in between is in both,
        // and applying it again is harmless.
        shared.seen.store(log_head(&conn)?, Ordering::SeqCst);
        let live = live_rows(&conn, &shared.index)?;
        // A snapshot written after a row was deleted holds no vector for it (its manifest
        // lists it); should that row be live here (the database file put back from before
        // the delete), the snapshot cannot serve it.
        let reason = match reason {
            None if shared.index.erased_among(live.iter().map(|(v, _)| *v)) > 0 => {
                Some("the snapshot erased the vectors of rows the database holds".to_owned())
            }
            r => r,
        };
        match reason {
            None => {
                let missing = adopt_rows(&conn, &shared.index, live)?;
                if missing > 0 {
                    tracing::info!(rows = missing, "index caught up from SQLite");
                }
            }
            // A new, empty store has nothing to rebuild.
            Some(_) if live.is_empty() && !shared.snapshot_dir.exists() => {}
            Some(why) => {
                tracing::warn!(reason = %why, rows = live.len(), "rebuilding the vector index from SQLite");
                rebuild(&conn, &shared, Some(why))?;
            }
        }
        let erase_owed = erase_marked(&conn)?;
        let (tx, rx) = sync_channel::<Job>(options.queue_depth);
        let writer_shared = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name("cairn-writer".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    // A panicking job drops its reply sender: its caller gets `WriterGone`;
                    // the transaction it held rolls back and the thread serves the next job.
                    let _ =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut conn)));
                }
                let health = writer_shared.index.health();
                if health.unsnapshotted > 0 || !snap_exists(&writer_shared.snapshot_dir) {
                    match snapshot(&conn, &writer_shared) {
                        // Re-embedded by another handle: this one's index is not the store's.
                        Err(StoreError::ModelMismatch { .. }) => {}
                        r => r?,
                    }
                }
                Ok(())
            })?;
        let store = Store {
            inner: Arc::new(Inner {
                shared,
                tx: Mutex::new(Some(tx)),
                writer: Mutex::new(Some(handle)),
                readers: Mutex::new(Vec::new()),
            }),
        };
        // An erase a forget owed when its process stopped (see `mark_for_erase`). The
        // store opens whatever comes of it: the mark stays for the next open or erase.
        if erase_owed {
            match store.erase_deleted() {
                Ok(true) => tracing::info!("an erase left by an earlier process is done"),
                Ok(false) => tracing::warn!(
                    "an erase left by an earlier process waits for another reader; retried at the next open or erase"
                ),
                Err(e) => tracing::warn!(error = %e, "an erase left by an earlier process failed; retried at the next open or erase"),
            }
        }
        Ok(store)
    }

    /// The store clock's now, in microseconds (what reads hide expired memories by).
    fn now_us(&self) -> i64 {
        to_micros(self.inner.shared.options.clock.now())
    }

    /// What reads hide now: nothing until the file holds a memory with an expiry or an end
    /// of validity (checked on two partial indexes, then remembered: it only ever turns on).
    fn visibility(&self) -> Result<Visibility> {
        let shared = &self.inner.shared;
        let timed = shared.lifetimes.load(Ordering::Relaxed)
            || self.read(|c| {
                Ok(c.prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM memories WHERE expires_at IS NOT NULL)
                         OR EXISTS (SELECT 1 FROM memories WHERE valid_to IS NOT NULL)",
                )?
                .query_row([], |r| r.get::<_, bool>(0))?)
            })?;
        if timed {
            shared.lifetimes.store(true, Ordering::Relaxed);
        }
        Ok(Visibility {
            now: self.now_us(),
            timed,
        })
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.inner.shared.path
    }

    /// The options it was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.inner.shared.options
    }

    /// Closes the store: waits for queued writes and writes the index snapshot. Dropping the
    /// last handle does the same but cannot report errors.
    pub fn close(self) -> Result<()> {
        // A background rebuild finishes and is swapped in (and snapshotted on close).
        self.settle()?;
        let inner = self.inner;
        // The idle readers close first: the writer's connection, closing last, then
        // checkpoints the log into the database and removes it.
        inner
            .readers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        let tx = inner.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(tx);
        let handle = inner
            .writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match handle {
            Some(h) => h.join().map_err(|_| StoreError::WriterGone)?,
            None => Ok(()),
        }
    }

    /// Runs `f` on the writer thread and waits for its result.
    fn write<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection, &Shared) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let (rtx, rrx) = sync_channel(1);
        let shared = Arc::clone(&self.inner.shared);
        let job: Job = Box::new(move |conn| {
            // Other processes' writes reach the index before this job reads or links
            // against it; after the job, the log position moves past its own entries.
            sync_index(conn, &shared);
            let out = f(conn, &shared);
            sync_index(conn, &shared);
            let _ = rtx.send(out);
        });
        let sender = self
            .inner
            .tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or(StoreError::WriterGone)?;
        sender.send(job).map_err(|_| StoreError::WriterGone)?;
        rrx.recv().map_err(|_| StoreError::WriterGone)?
    }

    /// Runs `f` with a read-only connection from the pool.
    fn read<R>(&self, f: impl FnOnce(&Connection) -> Result<R>) -> Result<R> {
        let pooled = self
            .inner
            .readers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        let conn = match pooled {
            Some(c) => c,
            None => {
                let mut c = Connection::open_with_flags(
                    &self.inner.shared.path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY
                        | OpenFlags::SQLITE_OPEN_NO_MUTEX
                        | OpenFlags::SQLITE_OPEN_URI,
                )?;
                let shared = &self.inner.shared;
                count_sql_work(&mut c, &shared.sql_work, shared.options.count_sql_work)?;
                c.busy_timeout(std::time::Duration::from_secs(30))?;
                schema::tune(&c)?;
                let mmap = self.inner.shared.options.mmap_bytes;
                if mmap > 0 {
                    c.pragma_update(None, "mmap_size", i64::try_from(mmap).unwrap_or(i64::MAX))?;
                }
                c
            }
        };
        let out = f(&conn);
        // A connection left inside a transaction (a rollback that failed) would read an old
        // snapshot for its next user: it is closed instead.
        let mut pool = self.inner.readers.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < self.inner.shared.options.read_pool && conn.is_autocommit() {
            pool.push(conn);
        }
        out
    }

    /// [`Self::read`] inside one read transaction: every statement of `f` reads the same
    /// snapshot, and the snapshot's locks are taken once, not once per statement (a
    /// statement outside a transaction takes and releases them itself: a few system calls,
    /// a third of the time of a short indexed read).
    fn read_snapshot<R>(&self, f: impl FnOnce(&Connection) -> Result<R>) -> Result<R> {
        self.read(|c| {
            let tx = c.unchecked_transaction()?;
            let out = f(c)?;
            // A read-only transaction: nothing to commit, but ending it is checked.
            tx.commit()?;
            Ok(out)
        })
    }

    /// Waits for a background index rebuild, if one is running, and swaps it in (see
    /// [`StoreOptions::background_rebuild`]). Searches never need this: they use the old
    /// index until the new one is ready.
    pub fn settle(&self) -> Result<()> {
        let handle = self
            .inner
            .shared
            .rebuild_thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(h) = handle {
            if h.join().is_err() {
                tracing::warn!("the index rebuild thread panicked");
                self.inner.shared.rebuilding.store(false, Ordering::SeqCst);
            }
            self.write(|_, _| Ok(()))?;
        }
        Ok(())
    }

    /// Catches the index up with other handles' committed writes when there are any: one
    /// indexed look-up in the index log when there are none. The same statement reads the
    /// store's model: a store another handle re-embedded since this one opened is a
    /// [`StoreError::ModelMismatch`] (this handle's vectors and queries are of the old model)
    /// for every call that syncs first: searches, `stats`, and the bounded recall path's
    /// reads of the index (`count_in_thread`, `times_of`).
    fn sync(&self) -> Result<()> {
        let shared = &self.inner.shared;
        let seen = shared.seen.load(Ordering::SeqCst);
        let rebuilt = shared
            .rebuilt
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        let (log_behind, model, dim) = self.read(|c| {
            Ok(c.prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM index_log WHERE seq > ?1 AND origin != ?2) \
                 OR COALESCE((SELECT CAST(value AS INTEGER) FROM store_meta \
                              WHERE key = 'index_log_pruned'), 0) > ?1, \
                 (SELECT value FROM store_meta WHERE key = 'model_id'), \
                 (SELECT value FROM store_meta WHERE key = 'dim')",
            )?
            .query_row(params![seen, shared.origin], |r| {
                Ok((
                    r.get::<_, bool>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, Option<String>>(2)?,
                ))
            })?)
        })?;
        same_model(&shared.options, model, dim)?;
        let behind = rebuilt || shared.resync.load(Ordering::SeqCst) || log_behind;
        if behind {
            // The writer thread applies them before any job.
            self.write(|_, _| Ok(()))?;
        }
        Ok(())
    }

    fn prepare_vector(&self, v: Vec<f32>) -> Result<Vec<f32>> {
        validate_vector(&v, self.inner.shared.options.dim)?;
        Ok(normalized(v)?)
    }

    /// Inserts one memory with its embedding; returns the stored memory.
    pub fn insert(&self, memory: NewMemory, embedding: Vec<f32>) -> Result<MemoryUnit> {
        self.insert_batch(vec![(memory, embedding)])?
            .pop()
            .ok_or(StoreError::WriterGone)
    }

    /// Inserts memories in one transaction: all of them or none.
    pub fn insert_batch(&self, items: Vec<(NewMemory, Vec<f32>)>) -> Result<Vec<MemoryUnit>> {
        let now = self.inner.shared.options.clock.now();
        let prepared = crate::backend::prepare_memories(items, self.inner.shared.options.dim, now)?;
        self.write(move |conn, shared| {
            let tx = begin_vectors(conn, shared)?;
            let mut out = Vec::with_capacity(prepared.len());
            let mut fresh = Vec::with_capacity(prepared.len());
            let mut vids = Vec::with_capacity(prepared.len());
            let mut ended = Vec::new();
            for p in prepared {
                if let Some(stored) = already_stored(&tx, &p, now)? {
                    out.push(stored);
                    continue;
                }
                let (unit, v) = (p.unit, p.vector);
                if let Some(old) = unit.lifetime.supersedes {
                    let until = unit.lifetime.valid_from.unwrap_or(unit.created_at);
                    ended.push(supersede(&tx, shared, old, unit.id, until)?);
                }
                vids.push(insert_row(&tx, shared, &unit, &v)?.0);
                out.push(unit.clone());
                fresh.push((unit, v));
            }
            tx.commit()?;
            // Entries first, then the ends of validity (a version superseded in the same
            // batch is indexed as written, then re-read).
            index_committed(conn, shared, &fresh, &vids);
            reattr_all(conn, shared, &ended);
            Ok(out)
        })
    }

    /// Merges `patch` into a memory's metadata (RFC 7386 JSON merge patch: a `null` removes a
    /// field, an object merges into an object, anything else replaces) without touching its
    /// content or embedding; returns the memory as stored. Summaries built on it stay as
    /// they are (their text does not depend on metadata).
    pub fn patch_metadata(&self, id: MemoryId, patch: Metadata) -> Result<MemoryUnit> {
        check_metadata(&patch)?;
        self.rewrite_metadata(id, move |m| crate::backend::merge_patch(m, patch))
    }

    /// Replaces a memory's metadata whole (no merge), without touching its content or
    /// embedding; returns the memory as stored.
    pub fn set_metadata(&self, id: MemoryId, metadata: Metadata) -> Result<MemoryUnit> {
        check_metadata(&metadata)?;
        self.rewrite_metadata(id, move |m| *m = metadata)
    }

    /// Applies `change` to a memory's metadata in one transaction (checked after).
    fn rewrite_metadata(
        &self,
        id: MemoryId,
        change: impl FnOnce(&mut Metadata) + Send + 'static,
    ) -> Result<MemoryUnit> {
        self.write(move |conn, _shared| {
            let tx = begin(conn)?;
            let mut unit = rows::get_unit(&tx, id)?;
            change(&mut unit.metadata);
            check_metadata(&unit.metadata)?;
            let json = serde_json::to_string(&unit.metadata)
                .map_err(|e| StoreError::Config(format!("metadata cannot be serialized: {e}")))?;
            tx.execute(
                "UPDATE memories SET metadata = ?2 WHERE id = ?1",
                params![id.as_bytes(), json],
            )?;
            tx.commit()?;
            Ok(unit)
        })
    }

    /// Sets (or, with `None`, removes) a memory's expiry; returns the memory as stored.
    pub fn set_expiry(
        &self,
        id: MemoryId,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<MemoryUnit> {
        self.write(move |conn, shared| {
            let tx = begin(conn)?;
            let (vid, level): (i64, u32) = tx
                .query_row(
                    "UPDATE memories SET expires_at = ?2 WHERE id = ?1 RETURNING vid, level",
                    params![id.as_bytes(), expires_at.map(to_micros)],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?
                .ok_or(StoreError::NotFound { id })?;
            log_vids(&tx, shared, [vid_usize(vid)])?;
            let unit = rows::get_unit(&tx, id)?;
            tx.commit()?;
            reattr_all(conn, shared, &[(vid_usize(vid), level)]);
            after_commit(conn, shared);
            Ok(unit)
        })
    }

    /// Up to `limit` memories admitted by `filter` after `cursor` (from the start when
    /// `None`), oldest first (ties in insertion order), and the cursor of the next page
    /// (`None` after the last). Keyset paging: a page never repeats or skips a memory that
    /// was there when the listing started, whatever is written or deleted meanwhile.
    pub fn page(&self, filter: &Filter, cursor: Option<Cursor>, limit: usize) -> Result<Page> {
        filter.validate()?;
        let (mut cond, mut args) = filter.sql_at(self.visibility()?);
        if let Some(c) = cursor {
            cond.push_str(" AND (m.created_at > ? OR (m.created_at = ? AND m.rid > ?))");
            args.push(Value::Integer(c.created_at));
            args.push(Value::Integer(c.created_at));
            args.push(Value::Integer(c.rid));
        }
        let take = limit.min(100_000);
        args.push(Value::Integer(i64::try_from(take).unwrap_or(i64::MAX) + 1));
        self.read(|c| {
            let mut rows = rows::query_units_with(
                c,
                ", m.rid",
                &format!("WHERE 1 = 1{cond} ORDER BY m.created_at, m.rid LIMIT ?"),
                &args,
            )?;
            let more = rows.len() > take;
            rows.truncate(take);
            let next = match rows.last() {
                Some((u, rid)) if more => Some(Cursor {
                    created_at: to_micros(u.created_at),
                    rid: *rid,
                }),
                _ => None,
            };
            Ok(Page {
                items: rows.into_iter().map(|(u, _)| u).collect(),
                next,
            })
        })
    }

    /// Writes a summary and its links in one transaction.
    ///
    /// Its level is 1 + the highest source level; its time range spans its sources'. Unknown
    /// sources, an empty or repeating source list, and self-reference are errors and write
    /// nothing.
    pub fn add_summary(&self, summary: NewSummary, embedding: Vec<f32>) -> Result<MemoryUnit> {
        self.write_summary(summary, None, None, embedding)
    }

    /// Writes a new version of a moving summary: a summary of `summary.source_ids` (the
    /// newly folded memories) that continues `previous` (the version before it, when there
    /// is one), together with a thread-state value, in one transaction.
    ///
    /// The previous version is linked as the first source with a *continuation* link, so
    /// [`Self::leaves`] and [`Self::sources`] reach everything every earlier version
    /// covered, while each version writes only its new links. A continuation link does not
    /// raise the level: the level is the higher of the previous version's level and 1 + the
    /// highest level of the new sources (a chain of moving summaries over turns stays at
    /// level 1, however many versions it has). The previous version must be a summary of the
    /// same thread (or of none); otherwise the rules of [`Self::add_summary`] apply.
    pub fn add_continuation(
        &self,
        summary: NewSummary,
        previous: Option<MemoryId>,
        state: Option<ThreadState>,
        embedding: Vec<f32>,
    ) -> Result<MemoryUnit> {
        if let Some(s) = &state {
            s.validate()?;
        }
        self.write_summary(summary, previous, state, embedding)
    }

    fn write_summary(
        &self,
        summary: NewSummary,
        previous: Option<MemoryId>,
        state: Option<ThreadState>,
        embedding: Vec<f32>,
    ) -> Result<MemoryUnit> {
        let id = crate::backend::check_summary(&summary, previous)?;
        let v = self.prepare_vector(embedding)?;
        let now = self.inner.shared.options.clock.now();
        self.write(move |conn, shared| {
            let tx = begin_vectors(conn, shared)?;
            let summary_thread = summary.thread_id.as_ref().map(ThreadId::as_str);
            // (facts, whether the link is a continuation)
            let mut links = Vec::with_capacity(summary.source_ids.len() + 1);
            if let Some(p) = previous {
                summary_rid(&tx, p)?;
                let facts = source_facts(&tx, p)?;
                check_thread(&tx, summary_thread, p, &facts)?;
                links.push((facts, true));
            }
            for sid in &summary.source_ids {
                let facts = source_facts(&tx, *sid)?;
                check_thread(&tx, summary_thread, *sid, &facts)?;
                links.push((facts, false));
            }
            let level = links
                .iter()
                .map(|(s, cont)| if *cont { s.level } else { s.level + 1 })
                .max()
                .unwrap_or(1)
                .max(1);
            let start = links.iter().map(|(s, _)| s.start).min().unwrap_or(0);
            let end = links.iter().map(|(s, _)| s.end).max().unwrap_or(0);
            let unit = MemoryUnit {
                id,
                kind: MemoryKind::Summary,
                thread_id: summary.thread_id.clone(),
                role: None,
                content: summary.content.clone(),
                created_at: crate::backend::to_stored_time(summary.created_at.unwrap_or(now)),
                metadata: summary.metadata.clone(),
                level,
                summary: Some(cairn_core::SummaryInfo {
                    summary_type: summary.summary_type,
                    source_ids: previous
                        .iter()
                        .chain(&summary.source_ids)
                        .copied()
                        .collect(),
                    time_range_start: from_micros(start),
                    time_range_end: from_micros(end),
                    source_count: links.len(),
                    level,
                    stale: false,
                    continues: previous,
                }),
                lifetime: cairn_core::Lifetime::default(),
            };
            let (vid, rid) = insert_row(&tx, shared, &unit, &v)?;
            let mut link = tx.prepare_cached(
                "INSERT INTO summary_sources (summary, source, position, continues)
                 VALUES (?1, ?2, ?3, ?4)",
            )?;
            for (pos, (s, cont)) in links.iter().enumerate() {
                link.execute(params![
                    rid,
                    s.rid,
                    i64::try_from(pos).unwrap_or(i64::MAX),
                    i64::from(*cont)
                ])?;
            }
            drop(link);
            if let Some(st) = &state {
                put_state(&tx, st)?;
            }
            tx.commit()?;
            shared.index.insert(&[Entry {
                vid,
                vector: &v,
                attr: attr_of(shared, &unit),
            }]);
            after_commit(conn, shared);
            Ok(unit)
        })
    }

    /// A named value of a thread (see [`ThreadState`]), if one was written.
    pub fn thread_state(&self, thread: &ThreadId, name: &str) -> Result<Option<String>> {
        let thread = thread.as_str().to_owned();
        let name = name.to_owned();
        self.read(move |c| {
            Ok(c.prepare_cached(
                "SELECT value FROM thread_state WHERE thread_id = ?1 AND name = ?2",
            )?
            .query_row(params![thread, name], |r| r.get(0))
            .optional()?)
        })
    }

    /// Writes (or replaces) a named value of a thread.
    pub fn set_thread_state(&self, state: ThreadState) -> Result<()> {
        state.validate()?;
        self.write(move |conn, _| {
            let tx = begin(conn)?;
            put_state(&tx, &state)?;
            tx.commit()?;
            Ok(())
        })
    }

    /// The memories of `kind` in `thread` inserted after sequence number `after`, in
    /// insertion order, each with its sequence number. One index range over (`thread_id`,
    /// rowid): the cost is that of the rows returned, not of the thread.
    ///
    /// The sequence number of a memory is its rowid, which only grows and is never reused
    /// (see [`Self::sequenced`]).
    pub fn thread_tail(
        &self,
        thread: &ThreadId,
        kind: MemoryKind,
        after: u64,
    ) -> Result<Vec<(MemoryUnit, u64)>> {
        let args = vec![
            Value::Text(thread.as_str().to_owned()),
            Value::Integer(i64::try_from(after).unwrap_or(i64::MAX)),
            Value::Text(kind.as_str().to_owned()),
        ];
        let rows = self.read(|c| {
            rows::query_units_with(
                c,
                ", m.rid",
                "INDEXED BY memories_thread_rid
                 WHERE m.thread_id = ?1 AND m.rid > ?2 AND m.kind = ?3 ORDER BY m.rid",
                &args,
            )
        })?;
        Ok(rows
            .into_iter()
            .map(|(u, rid)| (u, u64::try_from(rid).unwrap_or(0)))
            .collect())
    }

    /// The memories `ids` (in that order) with their sequence numbers: the order they were
    /// inserted in (their rowids, which are never reused, so a memory inserted later always
    /// has a higher number). `NotFound` for an unknown id.
    pub fn sequenced(&self, ids: &[MemoryId]) -> Result<Vec<(MemoryUnit, u64)>> {
        self.read(|c| {
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                let (u, rid) = rows::query_units_with(
                    c,
                    ", m.rid",
                    "WHERE m.id = ?1",
                    &[Value::Blob(id.as_bytes().to_vec())],
                )?
                .pop()
                .ok_or(StoreError::NotFound { id: *id })?;
                out.push((u, u64::try_from(rid).unwrap_or(0)));
            }
            Ok(out)
        })
    }

    /// The highest sequence number given so far (0 for an empty store): every memory
    /// inserted from now on has a higher one.
    pub fn last_sequence(&self) -> Result<u64> {
        self.read(|c| {
            let n: i64 = c.query_row(
                "SELECT MAX(COALESCE((SELECT CAST(value AS INTEGER) FROM store_meta WHERE key = 'next_rid'), 1) - 1,
                            (SELECT COALESCE(MAX(rid), 0) FROM memories))",
                [],
                |r| r.get(0),
            )?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    /// Appends sources to an existing summary (a moving summary that grew). Refuses a source
    /// that is the summary itself or one of its ancestors (a cycle), updating the level and
    /// time range of the summary and of every summary above it.
    pub fn extend_summary(&self, summary: MemoryId, sources: Vec<MemoryId>) -> Result<MemoryUnit> {
        if sources.is_empty() {
            return Err(StoreError::EmptySources);
        }
        self.write(move |conn, shared| {
            let tx = begin(conn)?;
            let rid = summary_rid(&tx, summary)?;
            let summary_thread: Option<String> = tx.query_row(
                "SELECT thread_id FROM memories WHERE rid = ?1",
                params![rid],
                |r| r.get(0),
            )?;
            let ancestors: HashSet<i64> = ancestor_rids(&tx, rid)?.into_iter().collect();
            let first: i64 = tx.query_row(
                "SELECT COALESCE(MAX(position), -1) + 1 FROM summary_sources WHERE summary = ?1",
                params![rid],
                |r| r.get(0),
            )?;
            let mut seen = HashSet::new();
            for (next, sid) in (first..).zip(&sources) {
                if *sid == summary {
                    return Err(StoreError::SelfReference { id: summary });
                }
                if !seen.insert(*sid) {
                    return Err(StoreError::DuplicateSource { id: *sid });
                }
                let facts = source_facts(&tx, *sid)?;
                check_thread(&tx, summary_thread.as_deref(), *sid, &facts)?;
                if ancestors.contains(&facts.rid) {
                    return Err(StoreError::Cycle {
                        summary,
                        ancestor: *sid,
                    });
                }
                let exists: bool = tx.query_row(
                    "SELECT EXISTS (SELECT 1 FROM summary_sources WHERE summary = ?1 AND source = ?2)",
                    params![rid, facts.rid],
                    |r| r.get(0),
                )?;
                if exists {
                    return Err(StoreError::DuplicateSource { id: *sid });
                }
                tx.execute(
                    "INSERT INTO summary_sources (summary, source, position) VALUES (?1, ?2, ?3)",
                    params![rid, facts.rid, next],
                )?;
            }
            let mut changed = vec![rid];
            changed.extend(ancestors.iter().copied());
            // The summaries above no longer cover everything under them.
            let above: Vec<i64> = ancestors.iter().copied().collect();
            mark_stale(&tx, &above)?;
            let relevelled = refresh_summaries(&tx, &changed)?;
            log_vids(&tx, shared, relevelled.iter().map(|(vid, _)| *vid))?;
            let unit = rows::get_unit(&tx, summary)?;
            tx.commit()?;
            reattr_all(conn, shared, &relevelled);
            Ok(unit)
        })
    }

    /// Raw memories admitted by `filter` (of a thread) that no level-1 summary cites,
    /// written after one of their thread's level-1 conversation summaries (not a moving
    /// summary) whose span holds their time: turns that arrived late, dated inside a stretch
    /// already summarized. Each with that summary (the earliest such), oldest first.
    pub fn late_arrivals(&self, filter: &Filter) -> Result<Vec<(MemoryId, MemoryId)>> {
        filter.validate()?;
        let (cond, args) = filter.sql_at(self.visibility()?);
        self.read(|c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT m.id, m.rid, m.created_at, m.thread_id FROM memories m
                 WHERE m.thread_id IS NOT NULL AND m.level = 0{cond}
                   AND NOT EXISTS (SELECT 1 FROM summary_sources l
                       JOIN memories p ON p.rid = l.summary
                       WHERE l.source = m.rid AND p.level = 1)
                 ORDER BY m.created_at, m.rid"
            ))?;
            let uncovered = stmt
                .query_map(rusqlite::params_from_iter(args.iter()), |r| {
                    Ok((
                        MemoryId::from_bytes(r.get::<_, [u8; 16]>(0)?),
                        r.get::<_, i64>(1)?,
                        rows::from_micros(r.get(2)?),
                        r.get::<_, String>(3)?,
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?
                .into_iter()
                .map(|(id, rid, at, t)| Ok((id, rid, at, ThreadId::new(t)?)))
                .collect::<Result<Vec<_>>>()?;
            let mut spans = c.prepare_cached(
                "SELECT s.id, s.rid, s.time_start, s.time_end FROM memories s
                  WHERE s.thread_id = ?1 AND s.kind = 'summary' AND s.level = 1
                    AND s.summary_type = 'conversation'
                    AND s.time_start IS NOT NULL AND s.time_end IS NOT NULL
                    AND NOT EXISTS (SELECT 1 FROM summary_sources x
                        WHERE x.summary = s.rid AND x.continues = 1)
                    AND NOT EXISTS (SELECT 1 FROM summary_sources x
                        WHERE x.source = s.rid AND x.continues = 1)
                  ORDER BY s.time_start, s.rid",
            )?;
            crate::backend::match_late_arrivals(uncovered, |t| {
                Ok(spans
                    .query_map(params![t.as_str()], |r| {
                        Ok((
                            MemoryId::from_bytes(r.get::<_, [u8; 16]>(0)?),
                            r.get::<_, i64>(1)?,
                            rows::from_micros(r.get(2)?),
                            rows::from_micros(r.get(3)?),
                        ))
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?)
            })
        })
    }

    /// Adds `source` to `summary` at its place in time (sources stay ordered by time), and
    /// marks the summary and every summary above it stale: a turn that arrived late joins
    /// the chunk of its time, and the next refresh rewrites the summary with it. The rules
    /// of [`Self::add_summary`] apply (same thread, no cycle, no repeat).
    pub fn place_source(&self, summary: MemoryId, source: MemoryId) -> Result<MemoryUnit> {
        self.write(move |conn, shared| {
            let tx = begin(conn)?;
            let rid = summary_rid(&tx, summary)?;
            let summary_thread: Option<String> = tx.query_row(
                "SELECT thread_id FROM memories WHERE rid = ?1",
                params![rid],
                |r| r.get(0),
            )?;
            if source == summary {
                return Err(StoreError::SelfReference { id: summary });
            }
            let facts = source_facts(&tx, source)?;
            check_thread(&tx, summary_thread.as_deref(), source, &facts)?;
            let ancestors = ancestor_rids(&tx, rid)?;
            if ancestors.contains(&facts.rid) {
                return Err(StoreError::Cycle {
                    summary,
                    ancestor: source,
                });
            }
            // (source rid, continues, time) of every link, the new one included, by time.
            let mut links: Vec<(i64, i64, i64, i64)> = {
                let mut stmt = tx.prepare_cached(
                    "SELECT l.source, l.continues, m.created_at, l.position FROM summary_sources l
                     JOIN memories m ON m.rid = l.source WHERE l.summary = ?1",
                )?;
                let rows = stmt.query_map(params![rid], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            if links.iter().any(|l| l.0 == facts.rid) {
                return Err(StoreError::DuplicateSource { id: source });
            }
            links.sort_by_key(|l| l.3);
            let created: i64 = tx.query_row(
                "SELECT created_at FROM memories WHERE rid = ?1",
                params![facts.rid],
                |r| r.get(0),
            )?;
            // After every source at or before its time (the order of the rest is kept).
            let at = links
                .iter()
                .rposition(|l| l.2 <= created)
                .map_or(0, |i| i + 1);
            links.insert(at, (facts.rid, 0, created, 0));
            tx.execute(
                "DELETE FROM summary_sources WHERE summary = ?1",
                params![rid],
            )?;
            for (pos, (src, continues, _, _)) in (0_i64..).zip(&links) {
                tx.execute(
                    "INSERT INTO summary_sources (summary, source, position, continues)
                     VALUES (?1, ?2, ?3, ?4)",
                    params![rid, src, pos, continues],
                )?;
            }
            let mut changed = vec![rid];
            changed.extend(ancestors.iter().copied());
            mark_stale(&tx, &changed)?;
            let relevelled = refresh_summaries(&tx, &changed)?;
            log_vids(&tx, shared, relevelled.iter().map(|(vid, _)| *vid))?;
            let unit = rows::get_unit(&tx, summary)?;
            tx.commit()?;
            reattr_all(conn, shared, &relevelled);
            Ok(unit)
        })
    }

    /// Replaces a memory's content (and metadata when given) with a new embedding; every
    /// summary built on it, at every level above, is marked stale.
    pub fn update(
        &self,
        id: MemoryId,
        content: String,
        metadata: Option<Metadata>,
        embedding: Vec<f32>,
    ) -> Result<MemoryUnit> {
        self.rewrite(id, content, metadata, embedding, false)
    }

    /// Rewrites a summary from its current sources (after they changed or were detached):
    /// new content (and metadata when given) and embedding. Its stale flag is cleared, its
    /// level, time range and source count are recomputed, and every summary above it is
    /// marked stale (one of their sources changed). `NotASummary` for a memory that is not.
    pub fn refresh_summary(
        &self,
        id: MemoryId,
        content: String,
        metadata: Option<Metadata>,
        embedding: Vec<f32>,
    ) -> Result<MemoryUnit> {
        self.rewrite(id, content, metadata, embedding, true)
    }

    fn rewrite(
        &self,
        id: MemoryId,
        content: String,
        metadata: Option<Metadata>,
        embedding: Vec<f32>,
        refresh: bool,
    ) -> Result<MemoryUnit> {
        let probe = NewMemory::new(MemoryKind::Knowledge, content.clone());
        probe.validate()?;
        if let Some(m) = &metadata {
            check_metadata(m)?;
        }
        let v = self.prepare_vector(embedding)?;
        self.write(move |conn, shared| {
            let tx = begin_vectors(conn, shared)?;
            let (rid, old_vid, old_content, kind): (i64, i64, String, String) = tx
                .query_row(
                    "SELECT rid, vid, content, kind FROM memories WHERE id = ?1",
                    params![id.as_bytes()],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )
                .optional()?
                .ok_or(StoreError::NotFound { id })?;
            if refresh && kind != MemoryKind::Summary.as_str() {
                return Err(StoreError::NotASummary { id });
            }
            let vid = next_vid(&tx)?;
            tx.execute(
                "INSERT INTO memories_fts (memories_fts, rowid, content) VALUES ('delete', ?1, ?2)",
                params![rid, old_content],
            )?;
            let meta_json = match &metadata {
                Some(m) => Some(serde_json::to_string(m).map_err(|e| {
                    StoreError::Config(format!("metadata cannot be serialized: {e}"))
                })?),
                None => None,
            };
            tx.execute(
                "UPDATE memories SET content = ?2, embedding = ?3, vid = ?4, metadata = COALESCE(?5, metadata), model_id = ?6 WHERE rid = ?1",
                params![rid, content, encode_vector(&v), i64::try_from(vid).unwrap_or(i64::MAX), meta_json, shared.options.model_id],
            )?;
            tx.execute(
                "INSERT INTO memories_fts (rowid, content) VALUES (?1, ?2)",
                params![rid, content],
            )?;
            if refresh {
                tx.execute("UPDATE memories SET stale = 0 WHERE rid = ?1", params![rid])?;
                refresh_summaries(&tx, &[rid])?;
            }
            let ancestors = ancestor_rids(&tx, rid)?;
            mark_stale(&tx, &ancestors)?;
            log_vids(&tx, shared, [vid_usize(old_vid), vid])?;
            let unit = rows::get_unit(&tx, id)?;
            tx.commit()?;
            shared.index.remove(&[vid_usize(old_vid)]);
            shared.index.insert(&[Entry {
                vid,
                vector: &v,
                attr: attr_of(shared, &unit),
            }]);
            after_commit(conn, shared);
            Ok(unit)
        })
    }

    /// Deletes a memory under `policy` (see [`DeletePolicy`]).
    ///
    /// Under `Detach`, a summary whose last source goes is deleted as well (a summary of
    /// nothing could be neither expanded nor refreshed), and the summaries citing it are
    /// detached from it by the same rule; those that keep a source are marked stale and get
    /// their level, time range and source count recomputed.
    pub fn delete(&self, id: MemoryId, policy: DeletePolicy) -> Result<DeleteReport> {
        self.delete_many(&[id], policy)
    }

    /// Deletes several memories under `policy` in one transaction: all of them or none (an
    /// unknown id is `NotFound`, a `Restrict` refusal is `CitedBySummaries`, and nothing is
    /// deleted). A summary in the list that cites another memory of the list does not
    /// block it under `Restrict`. See [`Self::delete`].
    pub fn delete_many(&self, ids: &[MemoryId], policy: DeletePolicy) -> Result<DeleteReport> {
        Ok(self.delete_many_with_texts(ids, policy)?.0)
    }

    /// [`Self::delete_many`], with the text of every memory deleted (in the report's order):
    /// what an embedding cache keyed by text must forget too.
    pub fn delete_many_with_texts(
        &self,
        ids: &[MemoryId],
        policy: DeletePolicy,
    ) -> Result<(DeleteReport, Vec<String>)> {
        self.delete_rows(ids, policy, None)
    }

    /// A forget's delete: [`Self::delete_many_with_texts`] under `Detach`, which also
    /// records in `mark` (made by [`Self::mark_forget`]), in the same transaction, every
    /// summary the deletes leave to be written again (those detached and every summary
    /// above them). A process that stops before it has rewritten them leaves the list to
    /// the next open.
    pub fn delete_marked(
        &self,
        ids: &[MemoryId],
        mark: &str,
    ) -> Result<(DeleteReport, Vec<String>)> {
        if !mark.starts_with(FORGET_MARK) {
            return Err(StoreError::Input(InputError::UnknownName {
                what: "forget mark",
                value: mark.chars().take(64).collect(),
            }));
        }
        self.delete_rows(ids, DeletePolicy::Detach, Some(mark.to_owned()))
    }

    fn delete_rows(
        &self,
        ids: &[MemoryId],
        policy: DeletePolicy,
        mark: Option<String>,
    ) -> Result<(DeleteReport, Vec<String>)> {
        let ids = ids.to_vec();
        self.write(move |conn, shared| {
            let mut texts = Vec::new();
            let tx = begin(conn)?;
            let mut report = DeleteReport::default();
            let mut doomed: Vec<i64> = Vec::with_capacity(ids.len());
            let mut doomed_set: HashSet<i64> = HashSet::with_capacity(ids.len());
            for id in &ids {
                let rid = rows::rid_of(&tx, *id)?;
                if doomed_set.insert(rid) {
                    doomed.push(rid);
                }
            }
            let targets = doomed.clone();
            let mut relevelled = Vec::new();
            match policy {
                DeletePolicy::Restrict => {
                    let mut named: HashMap<i64, MemoryId> = HashMap::with_capacity(ids.len());
                    for id in &ids {
                        named.entry(rows::rid_of(&tx, *id)?).or_insert(*id);
                    }
                    for rid in &targets {
                        let Some(id) = named.get(rid).copied() else {
                            continue;
                        };
                        let citing: Vec<MemoryId> = citing_ids(&tx, *rid)?
                            .into_iter()
                            .filter(|(r, _)| !doomed_set.contains(r))
                            .map(|(_, id)| id)
                            .collect();
                        if !citing.is_empty() {
                            return Err(StoreError::CitedBySummaries {
                                id,
                                summaries: citing,
                            });
                        }
                    }
                }
                DeletePolicy::Cascade => {
                    for rid in &targets {
                        for a in ancestor_rids(&tx, *rid)? {
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
                        let citing = citing_ids(&tx, gone)?;
                        tx.execute("DELETE FROM summary_sources WHERE source = ?1", params![gone])?;
                        for (r, sid) in citing {
                            let left: i64 = tx.query_row(
                                "SELECT count(*) FROM summary_sources WHERE summary = ?1",
                                params![r],
                                |x| x.get(0),
                            )?;
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
                    mark_stale(&tx, &rids)?;
                    let mut up = rids.clone();
                    for r in &rids {
                        up.extend(ancestor_rids(&tx, *r)?);
                    }
                    up.sort_unstable();
                    up.dedup();
                    up.retain(|r| !doomed_set.contains(r));
                    if let Some(mark) = &mark {
                        let mut id_of =
                            tx.prepare_cached("SELECT id FROM memories WHERE rid = ?1")?;
                        let mut ids: Vec<MemoryId> = Vec::with_capacity(up.len());
                        for r in &up {
                            ids.push(MemoryId::from_bytes(
                                id_of.query_row(params![r], |x| x.get(0))?,
                            ));
                        }
                        tx.execute(
                            "INSERT OR REPLACE INTO store_meta (key, value) VALUES (?1, ?2)",
                            params![
                                mark,
                                serde_json::to_string(&ids)
                                    .map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?
                            ],
                        )?;
                    }
                    relevelled = refresh_summaries(&tx, &up)?;
                    report.detached = kept.into_iter().map(|(_, id)| id).collect();
                }
            }
            let mut vids = Vec::with_capacity(doomed.len());
            for r in &doomed {
                tx.execute(
                    "DELETE FROM summary_sources WHERE summary = ?1 OR source = ?1",
                    params![r],
                )?;
                // A deleted version leaves the chain of its fact: the version before it
                // now holds until the version after it starts (and again holds now when
                // there is none), and the version after it supersedes the one before.
                let (older, until): (Option<i64>, Option<i64>) = tx.query_row(
                    "SELECT supersedes, valid_to FROM memories WHERE rid = ?1",
                    params![r],
                    |x| Ok((x.get(0)?, x.get(1)?)),
                )?;
                let newer: Option<(i64, i64)> = tx
                    .query_row(
                        "SELECT rid, COALESCE(valid_from, created_at) FROM memories
                         WHERE supersedes = ?1 ORDER BY rid LIMIT 1",
                        params![r],
                        |x| Ok((x.get(0)?, x.get(1)?)),
                    )
                    .optional()?
                    .filter(|(n, _)| !doomed_set.contains(n));
                if let Some(o) = older.filter(|o| !doomed_set.contains(o)) {
                    let o_until = match newer {
                        Some((_, start)) => Some(start),
                        None => until,
                    };
                    if let Some((vid, level)) = tx
                        .query_row(
                            "UPDATE memories SET valid_to = ?2 WHERE rid = ?1 RETURNING vid, level",
                            params![o, o_until],
                            |x| Ok((x.get::<_, i64>(0)?, x.get::<_, u32>(1)?)),
                        )
                        .optional()?
                    {
                        relevelled.push((vid_usize(vid), level));
                    }
                    if let Some((n, _)) = newer {
                        tx.execute(
                            "UPDATE memories SET supersedes = ?2 WHERE rid = ?1",
                            params![n, o],
                        )?;
                    }
                }
                tx.execute(
                    "UPDATE memories SET supersedes = NULL WHERE supersedes = ?1",
                    params![r],
                )?;
            }
            for r in &doomed {
                let (mid, vid, content): ([u8; 16], i64, String) = tx.query_row(
                    "SELECT id, vid, content FROM memories WHERE rid = ?1",
                    params![r],
                    |x| Ok((x.get(0)?, x.get(1)?, x.get(2)?)),
                )?;
                tx.execute(
                    "INSERT INTO memories_fts (memories_fts, rowid, content) VALUES ('delete', ?1, ?2)",
                    params![r, content],
                )?;
                tx.execute("DELETE FROM memories WHERE rid = ?1", params![r])?;
                vids.push(vid_usize(vid));
                report.deleted.push(MemoryId::from_bytes(mid));
                texts.push(content);
            }
            log_vids(
                &tx,
                shared,
                vids.iter().copied().chain(relevelled.iter().map(|(v, _)| *v)),
            )?;
            tx.commit()?;
            shared.index.remove(&vids);
            reattr_all(conn, shared, &relevelled);
            after_commit(conn, shared);
            Ok((report, texts))
        })
    }

    /// Reads one memory.
    pub fn get(&self, id: MemoryId) -> Result<MemoryUnit> {
        self.read(|c| rows::get_unit(c, id))
    }

    /// Which of `ids` exist.
    pub fn existing(&self, ids: &[MemoryId]) -> Result<HashSet<MemoryId>> {
        self.read(|c| {
            let mut stmt =
                c.prepare_cached("SELECT EXISTS (SELECT 1 FROM memories WHERE id = ?1)")?;
            let mut out = HashSet::new();
            for id in ids {
                if stmt.query_row(params![id.as_bytes()], |r| r.get::<_, bool>(0))? {
                    out.insert(*id);
                }
            }
            Ok(out)
        })
    }

    /// Reads several memories, in the order asked (one statement per 500); unknown ids are
    /// an error.
    pub fn get_many(&self, ids: &[MemoryId]) -> Result<Vec<MemoryUnit>> {
        let mut found = self.fetch(ids)?;
        ids.iter()
            .map(|id| found.remove(id).ok_or(StoreError::NotFound { id: *id }))
            .collect()
    }

    /// [`Self::get_many`] that skips ids with no memory (deleted meanwhile, say).
    pub fn get_found(&self, ids: &[MemoryId]) -> Result<Vec<MemoryUnit>> {
        let mut found = self.fetch(ids)?;
        Ok(ids.iter().filter_map(|id| found.remove(id)).collect())
    }

    fn fetch(&self, ids: &[MemoryId]) -> Result<HashMap<MemoryId, MemoryUnit>> {
        let mut found: HashMap<MemoryId, MemoryUnit> = HashMap::with_capacity(ids.len());
        self.read(|c| {
            for chunk in ids.chunks(500) {
                let args: Vec<Value> = chunk
                    .iter()
                    .map(|id| Value::Blob(id.as_bytes().to_vec()))
                    .collect();
                let marks = vec!["?"; args.len()].join(", ");
                let units = query_units(c, &format!("WHERE m.id IN ({marks})"), &args)?;
                found.extend(units.into_iter().map(|u| (u.id, u)));
            }
            Ok(())
        })?;
        Ok(found)
    }

    /// A thread's timeline for ranking its turns, read from the thread index alone: each
    /// admitted memory's time, index id, content length and speaker (the string its
    /// metadata holds under `"speaker"`, if any), oldest first (ties by insertion).
    pub fn timeline_entries(&self, filter: &Filter) -> Result<Vec<TimelineEntry>> {
        filter.validate()?;
        let (cond, args) = filter.sql_at(self.visibility()?);
        self.read(|c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {TIMELINE_COLS} FROM memories m WHERE 1 = 1{cond} \
                 ORDER BY m.created_at, m.rid"
            ))?;
            let rows = stmt.query_map(rusqlite::params_from_iter(args.iter()), timeline_entry)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// The distinct `speaker` metadata values (text) of a thread's memories, in byte order:
    /// one index seek per speaker, whatever the thread's length.
    pub fn thread_speakers(&self, thread: &ThreadId) -> Result<Vec<String>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT json_extract(metadata, '$.speaker') AS s FROM memories \
                 WHERE thread_id = ?1 AND json_extract(metadata, '$.speaker') > ?2 \
                 ORDER BY json_extract(metadata, '$.speaker') LIMIT 1",
            )?;
            let mut out: Vec<String> = Vec::new();
            loop {
                let after = out.last().map_or("", String::as_str);
                let next: Option<String> = stmt
                    .query_row(rusqlite::params![thread.as_str(), after], |r| r.get(0))
                    .optional()?;
                match next {
                    Some(s) => out.push(s),
                    None => return Ok(out),
                }
            }
        })
    }

    /// The newest `limit` memories admitted by `filter`, returned oldest first.
    pub fn recent(&self, filter: &Filter, limit: usize) -> Result<Vec<MemoryUnit>> {
        filter.validate()?;
        let (cond, mut args) = filter.sql_at(self.visibility()?);
        args.push(Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX)));
        let mut out = self.read(|c| {
            query_units(
                c,
                &format!("WHERE 1 = 1{cond} ORDER BY m.created_at DESC, m.rid DESC LIMIT ?"),
                &args,
            )
        })?;
        out.reverse();
        Ok(out)
    }

    /// The content and `metadata.speaker` (when it is text) of every memory `filter` admits,
    /// oldest first, without embeddings or other columns: the words of a thread, for
    /// statistics over its text.
    pub fn texts(&self, filter: &Filter) -> Result<Vec<(String, Option<String>)>> {
        filter.validate()?;
        let (cond, args) = filter.sql_at(self.visibility()?);
        self.read(|c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT m.content, json_extract(m.metadata, '$.speaker') FROM memories m \
                 WHERE 1 = 1{cond} ORDER BY m.created_at, m.rid"
            ))?;
            let rows = stmt.query_map(rusqlite::params_from_iter(args.iter()), |r| {
                let speaker = text_or_none(r, 1)?;
                Ok((r.get::<_, String>(0)?, speaker))
            })?;
            rows.collect::<std::result::Result<Vec<_>, _>>()
                .map_err(Into::into)
        })
    }

    /// Every memory admitted by `filter`, oldest first (`limit` rows from `offset`).
    pub fn scan(&self, filter: &Filter, offset: usize, limit: usize) -> Result<Vec<MemoryUnit>> {
        filter.validate()?;
        let (cond, mut args) = filter.sql_at(self.visibility()?);
        args.push(Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX)));
        args.push(Value::Integer(i64::try_from(offset).unwrap_or(i64::MAX)));
        self.read(|c| {
            query_units(
                c,
                &format!("WHERE 1 = 1{cond} ORDER BY m.created_at, m.rid LIMIT ? OFFSET ?"),
                &args,
            )
        })
    }

    /// Stale summaries admitted by `filter` (see [`Self::refresh_summary`]), lowest level
    /// first, then oldest: refreshing them in this order refreshes a summary's sources
    /// before the summary. At most `limit`.
    pub fn stale_summaries(&self, filter: &Filter, limit: usize) -> Result<Vec<MemoryUnit>> {
        filter.validate()?;
        let (cond, mut args) = filter.sql_at(self.visibility()?);
        args.push(Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX)));
        self.read(|c| {
            query_units(
                c,
                &format!(
                    "WHERE m.kind = 'summary' AND m.stale = 1{cond} \
                     ORDER BY m.level, m.created_at, m.rid LIMIT ?"
                ),
                &args,
            )
        })
    }

    /// Every version of the fact `id` belongs to: the memories it supersedes, back to the
    /// first, and those that supersede it, oldest first (by `valid_from`). `NotFound` for an
    /// unknown id.
    pub fn versions(&self, id: MemoryId) -> Result<Vec<MemoryUnit>> {
        self.read(|c| {
            rows::rid_of(c, id)?;
            query_units(
                c,
                "WHERE m.rid IN (WITH RECURSIVE
                    back(rid) AS (SELECT rid FROM memories WHERE id = ?1
                        UNION SELECT o.supersedes FROM memories o JOIN back b ON o.rid = b.rid
                        WHERE o.supersedes IS NOT NULL),
                    fwd(rid) AS (SELECT rid FROM memories WHERE id = ?1
                        UNION SELECT o.rid FROM memories o JOIN fwd f ON o.supersedes = f.rid)
                    SELECT rid FROM back UNION SELECT rid FROM fwd)
                 ORDER BY COALESCE(m.valid_from, m.created_at), m.rid",
                &[Value::Blob(id.as_bytes().to_vec())],
            )
        })
    }

    /// Up to `limit` memories whose expiry has passed (by the store clock), oldest expiry
    /// first: what consolidation deletes.
    pub fn expired(&self, limit: usize) -> Result<Vec<MemoryId>> {
        let now = self.now_us();
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT id FROM memories WHERE expires_at IS NOT NULL AND expires_at <= ?1
                 ORDER BY expires_at LIMIT ?2",
            )?;
            let ids = stmt
                .query_map(
                    params![now, i64::try_from(limit).unwrap_or(i64::MAX)],
                    |r| r.get::<_, [u8; 16]>(0).map(MemoryId::from_bytes),
                )?
                .collect::<rusqlite::Result<_>>()?;
            Ok(ids)
        })
    }

    /// Removes every per-thread state value of `thread` (see [`Self::thread_state`]).
    pub fn clear_thread_state(&self, thread: &ThreadId) -> Result<()> {
        let t = thread.as_str().to_owned();
        self.write(move |conn, _| {
            conn.execute("DELETE FROM thread_state WHERE thread_id = ?1", params![t])?;
            Ok(())
        })
    }

    /// Memories admitted by `filter` that no summary at `parent_level` cites yet, oldest
    /// first (what consolidation still has to cover at that level).
    pub fn scan_uncovered(&self, filter: &Filter, parent_level: u32) -> Result<Vec<MemoryUnit>> {
        self.scan_uncovered_page(filter, parent_level, usize::MAX)
    }

    /// The oldest `limit` of [`Self::scan_uncovered`]: covering them and asking again pages
    /// through the rest.
    pub fn scan_uncovered_page(
        &self,
        filter: &Filter,
        parent_level: u32,
        limit: usize,
    ) -> Result<Vec<MemoryUnit>> {
        filter.validate()?;
        let (cond, mut args) = filter.sql_at(self.visibility()?);
        args.push(Value::Integer(i64::from(parent_level)));
        args.push(Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX)));
        self.read(|c| {
            query_units(
                c,
                &format!(
                    "WHERE 1 = 1{cond} AND NOT EXISTS (SELECT 1 FROM summary_sources l
                        JOIN memories p ON p.rid = l.summary
                        WHERE l.source = m.rid AND p.level = ?)
                     ORDER BY m.created_at, m.rid LIMIT ?"
                ),
                &args,
            )
        })
    }

    /// The threads that have memories, sorted.
    pub fn threads(&self) -> Result<Vec<ThreadId>> {
        self.read(|c| {
            let mut stmt = c.prepare(
                "SELECT DISTINCT thread_id FROM memories WHERE thread_id IS NOT NULL ORDER BY thread_id",
            )?;
            let names: Vec<String> = stmt
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            Ok(names
                .into_iter()
                .filter_map(|n| ThreadId::new(n).ok())
                .collect())
        })
    }

    /// The direct sources of a summary, in their original order.
    pub fn sources(&self, summary: MemoryId) -> Result<Vec<MemoryUnit>> {
        self.read(|c| {
            let rid = summary_rid(c, summary)?;
            query_units(
                c,
                "JOIN summary_sources l ON l.source = m.rid WHERE l.summary = ? ORDER BY l.position",
                &[Value::Integer(rid)],
            )
        })
    }

    /// The summaries that cite `id` directly (back-links), oldest first.
    pub fn summaries_of(&self, id: MemoryId) -> Result<Vec<MemoryUnit>> {
        self.read(|c| {
            let rid = rows::rid_of(c, id)?;
            query_units(
                c,
                "JOIN summary_sources l ON l.summary = m.rid WHERE l.source = ? ORDER BY m.created_at, m.rid",
                &[Value::Integer(rid)],
            )
        })
    }

    /// Every summary above `id`, through every level, lowest level first.
    pub fn ancestors(&self, id: MemoryId) -> Result<Vec<MemoryUnit>> {
        self.read(|c| {
            let rid = rows::rid_of(c, id)?;
            query_units(
                c,
                "WHERE m.rid IN (WITH RECURSIVE up(r) AS (
                    SELECT summary FROM summary_sources WHERE source = ?
                    UNION SELECT l.summary FROM summary_sources l JOIN up ON l.source = up.r)
                 SELECT r FROM up) ORDER BY m.level, m.created_at, m.rid",
                &[Value::Integer(rid)],
            )
        })
    }

    /// Every raw (level 0) memory under a summary through every level, once each, in time
    /// order.
    pub fn leaves(&self, summary: MemoryId) -> Result<Vec<MemoryUnit>> {
        self.read(|c| {
            let rid = summary_rid(c, summary)?;
            query_units(
                c,
                "WHERE m.level = 0 AND m.rid IN (WITH RECURSIVE down(r) AS (
                    SELECT source FROM summary_sources WHERE summary = ?
                    UNION SELECT l.source FROM summary_sources l JOIN down ON l.summary = down.r)
                 SELECT r FROM down) ORDER BY m.created_at, m.rid",
                &[Value::Integer(rid)],
            )
        })
    }

    /// The ids of [`Self::leaves`], in the same order, without reading the rows.
    pub fn leaf_ids(&self, summary: MemoryId) -> Result<Vec<MemoryId>> {
        self.read(|c| {
            let rid = summary_rid(c, summary)?;
            let mut stmt = c.prepare_cached(
                "SELECT m.id FROM memories m WHERE m.level = 0 AND m.rid IN (WITH RECURSIVE down(r) AS (
                    SELECT source FROM summary_sources WHERE summary = ?
                    UNION SELECT l.source FROM summary_sources l JOIN down ON l.summary = down.r)
                 SELECT r FROM down) ORDER BY m.created_at, m.rid",
            )?;
            let ids = stmt
                .query_map(params![rid], |r| {
                    r.get::<_, [u8; 16]>(0).map(MemoryId::from_bytes)
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(ids)
        })
    }

    /// The index ids of the raw (level 0) memories under the summaries whose index ids are
    /// `summaries`, through every level, once each (unknown ids are ignored).
    pub fn leaf_vids(&self, summaries: &[u64]) -> Result<HashSet<u64>> {
        if summaries.is_empty() {
            return Ok(HashSet::new());
        }
        let (args, marks) = id_list(summaries.iter().copied());
        self.read(|c| {
            let mut stmt = c.prepare(&format!(
                "WITH RECURSIVE down(r) AS (
                    SELECT l.source FROM summary_sources l JOIN memories s ON s.rid = l.summary
                     WHERE s.vid IN ({marks})
                    UNION SELECT l.source FROM summary_sources l JOIN down ON l.summary = down.r)
                 SELECT m.vid FROM memories m WHERE m.level = 0 AND m.rid IN (SELECT r FROM down)"
            ))?;
            let vids = stmt
                .query_map(rusqlite::params_from_iter(args.iter()), |r| {
                    r.get::<_, i64>(0)
                })?
                .map(|v| v.map(|v| u64::try_from(v).unwrap_or(u64::MAX)))
                .collect::<rusqlite::Result<HashSet<u64>>>()?;
            Ok(vids)
        })
    }

    /// The `k` nearest memories to `query` among those admitted by `filter`, best first.
    /// `ef` overrides the configured `ef_search`.
    pub fn search_vector(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
        ef: Option<usize>,
    ) -> Result<Vec<Hit>> {
        let ranked = self.search_vector_ids(query, k, filter, ef)?;
        self.hits(ranked)
    }

    /// [`Self::search_vector`] without reading the rows: (index id, similarity), best first.
    /// Index ids are the store's internal, never reused vector ids; [`Self::hits`] reads their
    /// rows. Fusing several rankings on ids and reading only the winners saves decoding rows
    /// that lose.
    pub fn search_vector_ids(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
        ef: Option<usize>,
    ) -> Result<Vec<(u64, f32)>> {
        let found = self.admitted_search(
            query,
            k,
            filter,
            ef,
            |index, q, ef, admit| index.search(q, k, ef, admit),
            |found, admitted| found.len() >= k.min(admitted),
            |store, q| store.exact_scan(q, k, filter),
        )?;
        Ok(found.into_iter().map(|(v, s)| (v as u64, s)).collect())
    }

    /// [`Self::search_vector_ids`] with `k` counting distinct vectors: memories that hold the
    /// same vector (the same text stored again: it embeds bit for bit alike) are one answer,
    /// as (the least index id among them, similarity, how many of them `filter` admits),
    /// best first. So a text stored 70 times is one of the `k`, not 70 of them. The counts
    /// are exact for the best answers until they add up to `k` (the `k` best memories,
    /// copies counted), and for all when fewer than `k` answers are found; a later answer's
    /// may be a lower bound (1: its copies are not all walked). Where the admitted memories
    /// are few enough to be scored exactly, copies are told by the graph the same way (a
    /// memory the graph does not hold yet is its own answer).
    pub fn search_vector_groups(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
        ef: Option<usize>,
    ) -> Result<Vec<(u64, f32, usize)>> {
        let found = self.admitted_search(
            query,
            k,
            filter,
            ef,
            |index, q, ef, admit| index.search_groups(q, k, ef, admit),
            |found, admitted| {
                found.len() >= k || found.iter().map(|g| g.2).sum::<usize>() >= admitted
            },
            |store, q| {
                // Every admitted memory, best first, then one answer per vector.
                let all = store.exact_scan(q, usize::MAX, filter)?;
                let vids: Vec<usize> = all.iter().map(|(v, _)| *v).collect();
                let keys = store.inner.shared.index.twin_keys(&vids);
                let mut at: HashMap<usize, usize> = HashMap::new();
                let mut out: Vec<(usize, f32, usize)> = Vec::new();
                for ((v, sim), key) in all.into_iter().zip(keys) {
                    match at.get(&key.unwrap_or(v)) {
                        Some(&n) => {
                            let g: &mut (usize, f32, usize) = &mut out[n];
                            g.0 = g.0.min(v);
                            g.2 += 1;
                        }
                        None if out.len() < k => {
                            at.insert(key.unwrap_or(v), out.len());
                            out.push((v, sim, 1));
                        }
                        None => {}
                    }
                }
                Ok(out)
            },
        )?;
        Ok(found
            .into_iter()
            .map(|(v, s, n)| (v as u64, s, n))
            .collect())
    }

    /// For each of `vids`, a key that memories holding the same vector share (the same text
    /// stored again; see [`Self::search_vector_groups`]); a memory the index does not hold
    /// (yet) has a key of its own. A copy shares the key of the node its insertion's search
    /// finds holding the same vector (the copies in one batch are linked after the batch's
    /// first copy of their vector); should that approximate search miss it, the copy has a
    /// key of its own (and is another answer of [`Self::search_vector_groups`]). Read from the
    /// index as it is, without catching up with other processes' writes first (a search,
    /// which does, comes before in the same operation: the ids are its answers).
    pub fn copy_keys(&self, vids: &[u64]) -> Result<Vec<u64>> {
        let as_usize: Vec<usize> = vids.iter().map(|v| vid_usize_u64(*v)).collect();
        Ok(self
            .inner
            .shared
            .index
            .twin_keys(&as_usize)
            .into_iter()
            .zip(vids)
            .map(|(k, v)| k.map_or(*v, |k| k as u64))
            .collect())
    }

    /// The memories `filter` admits that hold the same vector as memory `vid` (the same
    /// text stored again), `vid` among them when admitted, as (index id, time), in id order;
    /// from the index, no row is read. Only the filter's thread, kinds, levels, time window
    /// and visibility apply (not its metadata conditions). Read from the index as it is, as
    /// [`Self::copy_keys`] is.
    pub fn copies_of(&self, vid: u64, filter: &Filter) -> Result<Vec<(u64, DateTime<Utc>)>> {
        filter.validate()?;
        let shared = &self.inner.shared;
        let thread_key = match &filter.thread {
            Some(t) => match shared.index.attrs().thread_key(t.as_str()) {
                Some(k) => Some(k),
                None => return Ok(Vec::new()),
            },
            None if filter.thread_less => Some(0),
            None => None,
        };
        let admit = self.attr_admit(filter, thread_key, None);
        Ok(shared
            .index
            .twins(vid_usize_u64(vid), &admit)
            .into_iter()
            .map(|(v, at)| (v as u64, from_micros(at)))
            .collect())
    }

    /// Whether an index entry passes `filter`'s conditions on the index's attributes (and
    /// is among `meta_vids`, the rows its metadata conditions admit, when given).
    fn attr_admit(
        &self,
        filter: &Filter,
        thread_key: Option<u32>,
        meta_vids: Option<HashSet<usize>>,
    ) -> impl Fn(usize, &Attr) -> bool + Sync + use<> {
        let now = self.now_us();
        let (as_of, history, expired) =
            (filter.as_of.map(to_micros), filter.history, filter.expired);
        let kinds = filter.kinds.clone();
        let (min_l, max_l) = (filter.min_level, filter.max_level);
        let (after, before) = (filter.after.map(to_micros), filter.before.map(to_micros));
        move |vid: usize, a: &Attr| {
            a.visible(now, as_of, history, expired)
                && meta_vids.as_ref().is_none_or(|m| m.contains(&vid))
                && thread_key.is_none_or(|t| a.thread == t)
                && (kinds.is_empty() || kinds.contains(&a.kind))
                && min_l.is_none_or(|l| a.level >= l)
                && max_l.is_none_or(|l| a.level <= l)
                && after.is_none_or(|t| a.created_at >= t)
                && before.is_none_or(|t| a.created_at < t)
        }
    }

    /// A vector search over the memories `filter` admits: `graph` walks the index (with the
    /// search breadth and the admission test, `None` when everything live is admitted);
    /// `enough` tells whether its answer is complete given how many memories are admitted;
    /// `exact` scores the admitted memories exactly, for small sets and incomplete answers.
    #[allow(clippy::too_many_arguments)]
    fn admitted_search<T>(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
        ef: Option<usize>,
        graph: impl FnOnce(&VectorIndex, &[f32], usize, Option<&Admit<'_>>) -> Vec<T>,
        enough: impl FnOnce(&[T], usize) -> bool,
        exact: impl FnOnce(&Self, &[f32]) -> Result<Vec<T>>,
    ) -> Result<Vec<T>> {
        filter.validate()?;
        let q = self.prepare_vector(query)?;
        if k == 0 {
            return Ok(Vec::new());
        }
        self.sync()?;
        let shared = &self.inner.shared;
        let ef = ef.unwrap_or(shared.options.hnsw.ef_search);
        // Metadata conditions are not in the index's attributes: the rows they admit are
        // read from SQLite first, and the graph walk admits only those (or they are scored
        // exactly when few).
        let meta_vids: Option<HashSet<usize>> = if filter.metadata.is_empty() {
            None
        } else {
            let (cond, args) = filter.sql_at(self.visibility()?);
            Some(self.read(|c| {
                let mut stmt =
                    c.prepare(&format!("SELECT m.vid FROM memories m WHERE 1 = 1{cond}"))?;
                let rows = stmt.query_map(rusqlite::params_from_iter(args.iter()), |r| {
                    r.get::<_, i64>(0)
                })?;
                let mut out = HashSet::new();
                for vid in rows {
                    out.insert(vid_usize(vid?));
                }
                Ok(out)
            })?)
        };
        let (admitted, thread_key, live, timed) = {
            let attrs = shared.index.attrs();
            let thread_key = match &filter.thread {
                Some(t) => match attrs.thread_key(t.as_str()) {
                    Some(k) => Some(k),
                    None => return Ok(Vec::new()),
                },
                // Key 0 is "no thread".
                None if filter.thread_less => Some(0),
                None => None,
            };
            let mut n = attrs.map.len();
            if let Some(key) = thread_key {
                n = n.min(if filter.kinds.is_empty() {
                    attrs.thread_count(key)
                } else {
                    attrs.thread_kinds_count(key, &filter.kinds)
                });
            }
            if !filter.kinds.is_empty() {
                n = n.min(attrs.kinds_count(&filter.kinds));
            }
            if let Some(m) = &meta_vids {
                n = n.min(m.len());
            }
            (n, thread_key, attrs.map.len(), attrs.timed)
        };
        if admitted == 0 {
            return Ok(Vec::new());
        }
        #[allow(clippy::cast_precision_loss)]
        let few = admitted <= shared.options.exact_scan_max
            || admitted as f64 <= shared.options.exact_scan_factor * (live as f64).sqrt();
        // A small store (or a narrow filter) is scanned exactly: it costs about as much as a
        // graph walk there, and the graph can miss an exact match on a small index (seen:
        // a 158-point graph whose search for a stored vector, ef 2,000, did not return it).
        let found = if few {
            exact(self, &q)?
        } else if filter.is_empty() && timed == 0 {
            graph(&shared.index, &q, ef, None)
        } else {
            let admit = self.attr_admit(filter, thread_key, meta_vids);
            let hits = graph(&shared.index, &q, ef, Some(&admit));
            if enough(&hits, admitted) {
                hits
            } else {
                exact(self, &q)?
            }
        };
        Ok(found)
    }

    fn exact_scan(&self, q: &[f32], k: usize, filter: &Filter) -> Result<Vec<(usize, f32)>> {
        let (cond, args) = filter.sql_at(self.visibility()?);
        // The admitted rows' vids from SQLite, scored on the index's vectors; rows the index
        // does not hold yet (committed a moment ago) send the scan to the stored embeddings.
        let vids = self.read(|c| {
            let mut stmt =
                c.prepare_cached(&format!("SELECT m.vid FROM memories m WHERE 1 = 1{cond}"))?;
            let rows = stmt.query_map(rusqlite::params_from_iter(args.iter()), |r| {
                r.get::<_, i64>(0)
            })?;
            let mut out = Vec::new();
            for vid in rows {
                out.push(vid_usize(vid?));
            }
            Ok(out)
        })?;
        if let Some(found) = self.inner.shared.index.exact_among(q, k, &vids) {
            return Ok(found);
        }
        self.read(|c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT m.vid, m.embedding FROM memories m WHERE 1 = 1{cond}"
            ))?;
            let mut rows = stmt.query(rusqlite::params_from_iter(args.iter()))?;
            let mut best: Vec<(usize, f32)> = Vec::new();
            while let Some(r) = rows.next()? {
                let vid: i64 = r.get(0)?;
                let blob = r.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
                let score: f32 = blob
                    .chunks_exact(4)
                    .zip(q)
                    .map(|(c, x)| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * x)
                    .sum();
                best.push((vid_usize(vid), score));
            }
            best.sort_by(|a, b| b.1.total_cmp(&a.1));
            best.truncate(k);
            Ok(best)
        })
    }

    /// The rows of ranked index ids (from [`Self::search_vector_ids`] or
    /// [`Self::search_keyword_ids`], or a fusion of them), in the given order, each with its
    /// score; ids whose row is gone (deleted meanwhile) are skipped.
    pub fn hits(&self, found: Vec<(u64, f32)>) -> Result<Vec<Hit>> {
        if found.is_empty() {
            return Ok(Vec::new());
        }
        self.read(|c| {
            // The rows in one statement per 500 hits (one read transaction, not one per hit),
            // then back in the index's order. A row deleted between the index read and this
            // read is skipped.
            let mut rows: HashMap<i64, MemoryUnit> = HashMap::with_capacity(found.len());
            for chunk in found.chunks(500) {
                let (vids, marks) = id_list(chunk.iter().map(|(vid, _)| *vid));
                let units =
                    query_units_with(c, ", m.vid", &format!("WHERE m.vid IN ({marks})"), &vids)?;
                rows.extend(units.into_iter().map(|(u, vid)| (vid, u)));
            }
            Ok(found
                .into_iter()
                .filter_map(|(vid, score)| {
                    let v = i64::try_from(vid).unwrap_or(i64::MAX);
                    rows.remove(&v).map(|memory| Hit { memory, score })
                })
                .collect())
        })
    }

    /// Keyword search (FTS5, BM25) over content; the query's words are OR-ed.
    pub fn search_keyword(&self, query: &str, k: usize, filter: &Filter) -> Result<Vec<Hit>> {
        let ranked = self.search_keyword_ids(query, k, filter)?;
        self.hits(ranked)
    }

    /// [`Self::search_keyword`] without reading the rows: (index id, negated BM25), best
    /// first (see [`Self::search_vector_ids`]).
    pub fn search_keyword_ids(
        &self,
        query: &str,
        k: usize,
        filter: &Filter,
    ) -> Result<Vec<(u64, f32)>> {
        filter.validate()?;
        let Some(fts) = fts_query(query) else {
            return Ok(Vec::new());
        };
        if k == 0 {
            return Ok(Vec::new());
        }
        let vis = self.visibility()?;
        self.read(|c| keyword_ids(c, fts, k, filter, vis))
    }

    /// The stored embedding of a memory.
    pub fn embedding(&self, id: MemoryId) -> Result<Vec<f32>> {
        self.read(|c| {
            let blob: Vec<u8> = c
                .query_row(
                    "SELECT embedding FROM memories WHERE id = ?1",
                    params![id.as_bytes()],
                    |r| r.get(0),
                )
                .optional()?
                .ok_or(StoreError::NotFound { id })?;
            Ok(decode_vector(&blob))
        })
    }

    /// Compares the vector index with the rows, between writes: every row must have a live
    /// index entry with the row's kind, level, time and thread, and no entry may lack a row.
    /// Reads every row's attributes (not the vectors): a diagnostic, not for hot paths.
    pub fn check_index(&self) -> Result<IndexCheck> {
        self.write(|conn, shared| {
            // `live_rows` may intern new thread names: it runs before the read lock.
            let rows = live_rows(conn, &shared.index)?;
            let in_graph: HashSet<usize> = shared.index.graph_vids().into_iter().collect();
            let attrs = shared.index.attrs();
            let mut check = IndexCheck {
                rows: rows.len(),
                indexed: attrs.map.len(),
                ..IndexCheck::default()
            };
            for (vid, row) in &rows {
                match attrs.map.get(vid) {
                    // Marked live but absent from the graph: no search would find it.
                    None => check.missing += 1,
                    Some(_) if !in_graph.contains(vid) => check.missing += 1,
                    Some(entry) if entry != row => check.mismatched += 1,
                    Some(_) => {}
                }
            }
            check.orphaned = check
                .indexed
                .saturating_sub(check.rows.saturating_sub(check.missing));
            Ok(check)
        })
    }

    /// Counts per kind and level, stale summaries, links and index health.
    pub fn stats(&self) -> Result<StoreStats> {
        self.sync()?;
        let mut s = self.read(|c| {
            let mut s = StoreStats::default();
            let mut stmt = c.prepare(
                "SELECT kind, level, count(*), sum(stale) FROM memories GROUP BY kind, level",
            )?;
            let mut q = stmt.query([])?;
            while let Some(r) = q.next()? {
                let kind: String = r.get(0)?;
                let level: u32 = r.get(1)?;
                let n = usize::try_from(r.get::<_, i64>(2)?).unwrap_or(0);
                let stale = usize::try_from(r.get::<_, i64>(3)?).unwrap_or(0);
                s.total += n;
                *s.by_kind.entry(kind).or_default() += n;
                *s.by_level.entry(level).or_default() += n;
                s.stale_summaries += stale;
            }
            s.links = usize::try_from(c.query_row(
                "SELECT count(*) FROM summary_sources",
                [],
                |r| r.get::<_, i64>(0),
            )?)
            .unwrap_or(0);
            Ok(s)
        })?;
        s.index = self.inner.shared.index.health();
        let r = self
            .inner
            .shared
            .rebuilds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        s.rebuilds = r.0;
        s.last_rebuild_reason = r.1;
        let shared = &self.inner.shared;
        s.foreign_changes = shared.foreign.load(Ordering::Relaxed);
        s.resyncs = shared.resyncs.load(Ordering::Relaxed);
        let f = shared
            .snapshot_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        s.snapshot_failures = f.0;
        s.last_snapshot_error = f.1;
        Ok(s)
    }

    /// SQLite virtual-machine instructions this handle's connections (its writer and its
    /// pooled readers) ran since it opened, when [`StoreOptions::count_sql_work`] is on
    /// (`None` otherwise): the database's share of a call's cost as a count (the difference
    /// across the call), not a time, so it does not depend on the machine's load. Counted
    /// in steps of 100 per statement (a statement's last partial hundred is not counted);
    /// other threads' calls on the same handle count too. Not counted: a background index
    /// rebuild's own connection, the work inside SQLite's C code that no VM instruction
    /// stands for (FTS5 decoding a posting list, sorting), and the vector index's.
    pub fn sql_work(&self) -> Option<u64> {
        let shared = &self.inner.shared;
        shared.options.count_sql_work.then(|| {
            shared.sql_work.load(Ordering::Relaxed) * u64::from(SQL_WORK_UNIT.unsigned_abs())
        })
    }

    /// Writes the index snapshot now.
    pub fn snapshot(&self) -> Result<()> {
        self.write(|conn, shared| snapshot(conn, shared))
    }

    /// Erases from the store's files what deleted memories left in them, so a forgotten
    /// memory's text and vector are gone from the disk, not only from every read:
    ///
    /// - the database overwrites deleted rows with zeros as it deletes them (SQLite's
    ///   `secure_delete`, on for every connection that writes), the embedding cache's rows
    ///   alike;
    /// - here, the keyword index is merged into one segment (FTS5 `optimize`), which drops
    ///   the deleted memories' terms that its older segments still held; the index snapshot
    ///   is written again with no vector of a deleted entry (the old snapshot's files are
    ///   removed); and the write-ahead log, whose older frames still hold the pages as they
    ///   were before the delete, is checkpointed into the database and truncated to zero
    ///   bytes.
    ///
    /// Returns `false` when the log could not be truncated because another connection (say
    /// another process) was reading an older snapshot of the database: its old frames stay
    /// until a later erase or checkpoint finds no reader. What the file system does with the
    /// blocks it freed is outside the store (encrypt the disk for that).
    ///
    /// A successful erase (`true`) clears the mark [`Self::mark_for_erase`] leaves.
    pub fn erase_deleted(&self) -> Result<bool> {
        self.write(|conn, shared| {
            // The keyword index keeps a deleted memory's terms in its older segments (a
            // delete adds a marker); merging every segment into one drops them, and the old
            // segments' pages are overwritten as they are freed.
            conn.execute(
                "INSERT INTO memories_fts (memories_fts) VALUES ('optimize')",
                [],
            )?;
            if snap_exists(&shared.snapshot_dir) {
                snapshot(conn, shared)?;
            }
            // A reader of an older snapshot holds the log; waiting for it is bounded well
            // below the writers' 30 s (a forget should not stall that long for it).
            conn.busy_timeout(ERASE_WAIT)?;
            let busy = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                r.get::<_, i64>(0)
            });
            conn.busy_timeout(std::time::Duration::from_secs(30))?;
            let whole = busy? == 0;
            if whole {
                // (The mark's page goes to the log now emptied: it holds no deleted byte.)
                conn.execute("DELETE FROM store_meta WHERE key = ?1", [ERASE_MARK])?;
            }
            Ok(whole)
        })
    }

    /// Records in the database that deletes about to be made are to be erased from the
    /// files ([`Self::erase_deleted`]): until an erase succeeds, every open of the store
    /// runs one first. A forget marks the store before it deletes, so a process that stops
    /// between its deletes and its erase (a crash, a kill) leaves the erase to the next
    /// open instead of leaving the forgotten bytes in the files.
    pub fn mark_for_erase(&self) -> Result<()> {
        self.write(|conn, _| {
            conn.execute(
                "INSERT OR REPLACE INTO store_meta (key, value) VALUES (?1, '1')",
                [ERASE_MARK],
            )?;
            Ok(())
        })
    }

    /// Whether the store is marked for an erase ([`Self::mark_for_erase`]) that has not
    /// succeeded yet.
    pub fn erase_marked(&self) -> Result<bool> {
        self.read(erase_marked)
    }

    /// Records in the database that a forget is about to delete memories, and returns the
    /// mark's name with the forget lock held shared ([`ForgetLock`]) until it is dropped. [`Self::delete_marked`] adds to the mark the summaries the deletes leave
    /// to be written again; the forget clears the mark ([`Self::clear_forget_marks`]) once
    /// it has rewritten them and purged the deleted texts from its embedding cache. A mark
    /// found at an open tells the opener that a process stopped in the middle of a forget:
    /// the harness then deletes the summaries it names (their sources stay, and the next
    /// consolidation summarizes them again) and keeps in its cache only the vectors of texts
    /// the store still holds. Each call makes its own mark, so one forget does not clear
    /// another's.
    pub fn mark_forget(&self) -> Result<PendingForget> {
        let lock = ForgetLock::open(&self.inner.shared.path)?;
        let held = match lock.file.lock_shared() {
            Ok(()) => true,
            // No lock to be had (a file system without advisory locks, or without a lock
            // daemon): the forget goes on, and an open may take its mark for a stopped one.
            Err(e) => {
                tracing::warn!(error = %e, "no forget lock: an open in another process may finish this forget's mark while it runs");
                false
            }
        };
        let name = format!("{FORGET_MARK}{}", uuid::Uuid::now_v7());
        let key = name.clone();
        self.write(move |conn, _| {
            conn.execute(
                "INSERT OR REPLACE INTO store_meta (key, value) VALUES (?1, '[]')",
                [&key],
            )?;
            Ok(())
        })?;
        Ok(PendingForget {
            name,
            _lock: ForgetLock { held, ..lock },
        })
    }

    /// Takes the forget lock exclusively, without waiting: `None` while a forget of any
    /// process is under way (it holds the lock shared from [`Self::mark_forget`] until it
    /// is dropped). What holds the returned lock may finish the marks it reads
    /// ([`Self::forget_marks`]): no process is working on them. On a file system without
    /// advisory locks the lock is granted without being held ([`ForgetLock::held`]).
    pub fn try_lock_forgets(&self) -> Result<Option<ForgetLock>> {
        let mut lock = ForgetLock::open(&self.inner.shared.path)?;
        match lock.file.try_lock() {
            Ok(()) => lock.held = true,
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(e)) if e.kind() == std::io::ErrorKind::Unsupported => {
                tracing::warn!(error = %e, "no file locks here: a forget under way in another process is not told from one that stopped");
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
        }
        Ok(Some(lock))
    }

    /// Takes `summary` off the list of `mark` (it has been written again, or deleted): an
    /// open that finishes the mark leaves it alone.
    pub fn unlist_forget_summary(&self, mark: &str, summary: MemoryId) -> Result<()> {
        let (mark, id) = (mark.to_owned(), summary.to_string());
        self.write(move |conn, _| {
            conn.execute(
                "UPDATE store_meta SET value = (
                     SELECT COALESCE(json_group_array(j.value), '[]') FROM json_each(store_meta.value) j
                     WHERE j.value <> ?2)
                 WHERE key = ?1",
                params![mark, id],
            )?;
            Ok(())
        })
    }

    /// Adds `summaries` to the list of `mark` (those a forget found to write again after
    /// its delete: built meanwhile on what it detached), each once.
    pub fn list_forget_summaries(&self, mark: &str, summaries: &[MemoryId]) -> Result<()> {
        if summaries.is_empty() {
            return Ok(());
        }
        let mark = mark.to_owned();
        let ids = serde_json::to_string(summaries)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?;
        self.write(move |conn, _| {
            conn.execute(
                "UPDATE store_meta SET value = (
                     SELECT COALESCE(json_group_array(v), '[]') FROM (
                         SELECT j.value AS v FROM json_each(store_meta.value) j
                         UNION SELECT n.value FROM json_each(?2) n))
                 WHERE key = ?1",
                params![mark, ids],
            )?;
            Ok(())
        })
    }

    /// The marks of [`Self::mark_forget`] not cleared yet.
    pub fn forget_marks(&self) -> Result<Vec<ForgetMark>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT key, value FROM store_meta WHERE key >= ?1 AND key < ?2 ORDER BY key",
            )?;
            let rows = stmt.query_map([FORGET_MARK, FORGET_MARK_END], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (name, value) = row?;
                // A value this build cannot read names no summary: the purge still runs.
                let summaries = serde_json::from_str(&value).unwrap_or_else(|e| {
                    tracing::warn!(mark = %name, error = %e, "a forget mark's summaries cannot be read");
                    Vec::new()
                });
                out.push(ForgetMark { name, summaries });
            }
            Ok(out)
        })
    }

    /// Clears marks of [`Self::mark_forget`] (names that are not such marks are ignored).
    pub fn clear_forget_marks(&self, marks: &[String]) -> Result<()> {
        let marks: Vec<String> = marks
            .iter()
            .filter(|m| m.starts_with(FORGET_MARK))
            .cloned()
            .collect();
        if marks.is_empty() {
            return Ok(());
        }
        self.write(move |conn, _| {
            let tx = conn.transaction()?;
            {
                let mut del = tx.prepare_cached("DELETE FROM store_meta WHERE key = ?1")?;
                for m in &marks {
                    del.execute([m])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
    }

    /// Calls `f` with the content of every memory the database holds (every kind, thread
    /// and version, expired ones too), in no particular order, within one read.
    pub fn for_each_text(&self, mut f: impl FnMut(&str)) -> Result<()> {
        self.read(|c| {
            let mut stmt = c.prepare("SELECT content FROM memories")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                f(&r.get::<_, String>(0)?);
            }
            Ok(())
        })
    }

    /// Rebuilds the index from the stored embeddings (drops every tombstone).
    pub fn reindex(&self) -> Result<()> {
        self.write(|conn, shared| {
            rebuild(conn, shared, Some("requested".into()))?;
            snapshot(conn, shared)
        })
    }

    /// Re-embeds every memory with a new model: `embed` is called with batches of contents.
    /// Afterwards the store belongs to `model_id`/`dim` (reopen with matching options).
    ///
    /// The model runs outside the write lock: the new vectors are staged in a TEMP table of
    /// the re-embedding's own connection (SQLite's temporary file, the size of the texts and
    /// vectors; gone with the connection, even after a crash), a batch of 64 at a time,
    /// while other handles go on reading and writing on the old model. Then one transaction
    /// embeds what was written or rewritten since it was staged, gives every memory its new
    /// vector and changes the store's model. That transaction holds the write lock while it
    /// rewrites every row (every vector goes through the WAL), so other writers wait then. A
    /// failure anywhere leaves the store on the old model, every vector as it was; the
    /// model's own (an error from `embed`, or the wrong number of vectors) is
    /// [`StoreError::Embedding`], which keeps the model's error as its source (so a caller
    /// gets its own error type back with `downcast`).
    ///
    /// A handle still open on the old model after the commit, in this process or another,
    /// is refused with [`StoreError::ModelMismatch`] at its next search (or other call that
    /// syncs its index: `stats`, the bounded recall path's reads) or write of a vector
    /// (inserts, summaries, updates, restores), and writes nothing (its vectors and queries
    /// are of the old model); it reopens with the new one. The new model must differ from
    /// the old one in name or dimension (a [`StoreError::Config`] otherwise).
    pub fn reembed(
        path: impl AsRef<Path>,
        old: StoreOptions,
        new_model_id: &str,
        new_dim: usize,
        embed: impl FnMut(&[&str]) -> std::result::Result<Vec<Vec<f32>>, ModelError>,
    ) -> Result<()> {
        Self::reembed_blending(path, old, new_model_id, new_dim, embed, |_| false)
    }

    /// [`Self::reembed`], where the summaries `blends` picks (by their metadata) get the
    /// vector of a summary that stands for its sources too: the mean of its text's new
    /// vector and its sources' new centroid (each unit length), as consolidation writes
    /// them; the lowest levels first, so a roll-up's centroid is of its sources' blended
    /// vectors. The blend is part of the last transaction: a failure leaves the store on the
    /// old model.
    pub fn reembed_blending(
        path: impl AsRef<Path>,
        old: StoreOptions,
        new_model_id: &str,
        new_dim: usize,
        mut embed: impl FnMut(&[&str]) -> std::result::Result<Vec<Vec<f32>>, ModelError>,
        blends: impl Fn(&Metadata) -> bool,
    ) -> Result<()> {
        let path = path.as_ref();
        old.validate()?;
        if !path.is_file() {
            return Err(StoreError::Config(format!(
                "no store at {} to re-embed",
                path.display()
            )));
        }
        if new_model_id == old.model_id && new_dim == old.dim {
            return Err(StoreError::Config(format!(
                "the store is already on model {new_model_id:?} ({new_dim} dimensions)"
            )));
        }
        let mut conn = open_rw(path, &old).map_err(|e| not_a_db(path, e))?;
        schema::migrate(&mut conn, &old).map_err(|e| not_a_db(path, e))?;
        // The new vectors are staged first, in a table of this connection's own (TEMP:
        // another re-embedding has its own, and a crash leaves nothing in the file), while
        // other handles go on reading and writing; then one transaction re-embeds what
        // changed meanwhile and swaps every vector in.
        conn.execute_batch(
            "CREATE TEMP TABLE reembed_stage (
                 rid INTEGER PRIMARY KEY, content TEXT NOT NULL, embedding BLOB NOT NULL);",
        )?;
        let done = stage_vectors(&mut conn, &old, new_dim, &mut embed).and_then(|()| {
            swap_in_vectors(
                &mut conn,
                path,
                &old,
                new_model_id,
                new_dim,
                &mut embed,
                blends,
            )
        });
        // The staging table goes with the connection, whatever happened.
        done
    }
}

/// Embeds `rows` (rid, text) with `embed`: one vector each, of `dim` dimensions, normalized.
fn embed_rows(
    rows: &[(i64, String)],
    dim: usize,
    embed: &mut impl FnMut(&[&str]) -> std::result::Result<Vec<Vec<f32>>, ModelError>,
) -> Result<Vec<Vec<f32>>> {
    let texts: Vec<&str> = rows.iter().map(|(_, t)| t.as_str()).collect();
    let vecs = embed(&texts).map_err(|e| StoreError::Embedding {
        reason: e.to_string(),
        source: Some(e),
    })?;
    if vecs.len() != rows.len() {
        return Err(StoreError::Embedding {
            reason: format!(
                "the model returned {} vectors for {} texts",
                vecs.len(),
                rows.len()
            ),
            source: None,
        });
    }
    vecs.into_iter()
        .map(|v| {
            validate_vector(&v, dim)?;
            Ok(normalized(v)?)
        })
        .collect()
}

/// Rows embedded per call of the model while re-embedding.
const REEMBED_BATCH: usize = 64;

/// Embeds every memory into the connection's TEMP table `reembed_stage` (rid, the text
/// embedded, its new vector), a batch of [`REEMBED_BATCH`] at a time: the model runs without
/// holding the database's write lock, and writing the TEMP table takes none.
fn stage_vectors(
    conn: &mut Connection,
    old: &StoreOptions,
    dim: usize,
    embed: &mut impl FnMut(&[&str]) -> std::result::Result<Vec<Vec<f32>>, ModelError>,
) -> Result<()> {
    let mut after = i64::MIN;
    loop {
        // Another re-embedding committed meanwhile: this one stops at once.
        schema::check_identity(conn, old)?;
        let page: Vec<(i64, String)> = conn
            .prepare_cached(
                "SELECT rid, content FROM memories WHERE rid > ?1 ORDER BY rid LIMIT ?2",
            )?
            .query_map(
                params![after, i64::try_from(REEMBED_BATCH).unwrap_or(i64::MAX)],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?
            .collect::<rusqlite::Result<_>>()?;
        let Some((last, _)) = page.last() else {
            break;
        };
        after = *last;
        let vecs = embed_rows(&page, dim, embed)?;
        // Deferred: it writes the TEMP table only, so it never locks the database file.
        let tx = conn.transaction()?;
        stage(&tx, &page, &vecs)?;
        tx.commit()?;
    }
    // The memories rewritten since their batch was staged, caught up here too (a few
    // rounds: writers may keep rewriting), so the last transaction, which holds the write
    // lock, embeds few.
    for _ in 0..3 {
        let changed = unstaged(conn)?;
        if changed.len() <= REEMBED_BATCH {
            break;
        }
        for chunk in changed.chunks(REEMBED_BATCH) {
            let vecs = embed_rows(chunk, dim, embed)?;
            let tx = conn.transaction()?;
            stage(&tx, chunk, &vecs)?;
            tx.commit()?;
        }
    }
    Ok(())
}

/// The memories whose text is not the one staged for them (written or rewritten since).
fn unstaged(conn: &Connection) -> Result<Vec<(i64, String)>> {
    Ok(conn
        .prepare(
            "SELECT m.rid, m.content FROM memories m
               LEFT JOIN reembed_stage s ON s.rid = m.rid AND s.content = m.content
              WHERE s.rid IS NULL ORDER BY m.rid",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?)
}

/// Writes staged vectors (see [`stage_vectors`]).
fn stage(tx: &Transaction<'_>, rows: &[(i64, String)], vecs: &[Vec<f32>]) -> Result<()> {
    let mut put = tx.prepare_cached(
        "INSERT OR REPLACE INTO reembed_stage (rid, content, embedding) VALUES (?1, ?2, ?3)",
    )?;
    for ((rid, content), v) in rows.iter().zip(vecs) {
        put.execute(params![rid, content, encode_vector(v)])?;
    }
    Ok(())
}

/// The re-embedding's one write transaction: still on the old model (checked under the
/// write lock); the memories written or rewritten since they were staged are embedded now;
/// every memory takes its staged vector, consolidation's summaries are blended, the store's
/// model changes, the index snapshot goes.
fn swap_in_vectors(
    conn: &mut Connection,
    path: &Path,
    old: &StoreOptions,
    new_model_id: &str,
    new_dim: usize,
    embed: &mut impl FnMut(&[&str]) -> std::result::Result<Vec<Vec<f32>>, ModelError>,
    blends: impl Fn(&Metadata) -> bool,
) -> Result<()> {
    let tx = begin(conn)?;
    // Another handle may have re-embedded it since the check at the start.
    schema::check_identity(&tx, old)?;
    let changed = unstaged(&tx)?;
    if !changed.is_empty() {
        tracing::info!(
            memories = changed.len(),
            "re-embedding the memories written while the others were"
        );
    }
    for chunk in changed.chunks(REEMBED_BATCH) {
        let vecs = embed_rows(chunk, new_dim, embed)?;
        stage(&tx, chunk, &vecs)?;
    }
    // Every memory has its staged vector now, of its current text.
    tx.execute(
        "UPDATE memories SET model_id = ?1,
                embedding = (SELECT s.embedding FROM reembed_stage s WHERE s.rid = memories.rid)",
        params![new_model_id],
    )?;
    blend_summaries(&tx, blends)?;
    tx.execute(
        "UPDATE store_meta SET value = ?1 WHERE key = 'model_id'",
        params![new_model_id],
    )?;
    tx.execute(
        "UPDATE store_meta SET value = ?1 WHERE key = 'dim'",
        params![new_dim.to_string()],
    )?;
    // The index snapshot holds the old vectors: gone before the commit, so a failure
    // here leaves the store on the old model (its next open rebuilds the index).
    // (Not under the snapshot lock: this transaction holds the database's, and a snapshot
    // writer takes them the other way round. A snapshot of the old model written after
    // this is refused at the next open by its manifest's model.)
    let snap = snapshot_dir(path);
    if snap.exists() {
        std::fs::remove_dir_all(snap)?;
    }
    tx.commit()?;
    Ok(())
}

/// Gives the summaries `blends` picks the mean of their own vector and their sources'
/// centroid (see [`Store::reembed_blending`]), lowest level first.
fn blend_summaries(tx: &Transaction<'_>, blends: impl Fn(&Metadata) -> bool) -> Result<()> {
    let summaries: Vec<(i64, Option<String>)> = {
        let mut stmt = tx.prepare(
            "SELECT rid, metadata FROM memories WHERE kind = 'summary' ORDER BY level, rid",
        )?;
        let r = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        r
    };
    let mut own = tx.prepare("SELECT embedding FROM memories WHERE rid = ?1")?;
    let mut sources = tx.prepare(
        "SELECT m.embedding FROM summary_sources s JOIN memories m ON m.rid = s.source \
         WHERE s.summary = ?1",
    )?;
    for (rid, metadata) in summaries {
        let metadata: Metadata = match metadata.as_deref() {
            Some(json) => serde_json::from_str(json).map_err(|e| {
                StoreError::Config(format!("summary {rid}: its metadata does not parse: {e}"))
            })?,
            None => Metadata::new(),
        };
        if !blends(&metadata) {
            continue;
        }
        let text = decode_vector(&own.query_row(params![rid], |r| r.get::<_, Vec<u8>>(0))?);
        let mut centroid = vec![0f32; text.len()];
        let mut rows = sources.query(params![rid])?;
        while let Some(r) = rows.next()? {
            let v = decode_vector(&r.get::<_, Vec<u8>>(0)?);
            for (c, x) in centroid.iter_mut().zip(&v) {
                *c += x;
            }
        }
        let Ok(centroid) = cairn_core::normalized(centroid) else {
            continue;
        };
        let Ok(v) =
            cairn_core::normalized(text.iter().zip(&centroid).map(|(a, b)| a + b).collect())
        else {
            continue;
        };
        tx.execute(
            "UPDATE memories SET embedding = ?2 WHERE rid = ?1",
            params![rid, encode_vector(&v)],
        )?;
    }
    Ok(())
}

/// `Ok` when the store's recorded model (`model`, `dim` as `store_meta` holds them) is
/// `options`' own, else the [`StoreError::ModelMismatch`] naming both.
fn same_model(options: &StoreOptions, model: Option<String>, dim: Option<String>) -> Result<()> {
    let stored_dim = dim.as_deref().and_then(|d| d.parse().ok()).unwrap_or(0);
    match model {
        Some(m) if m == options.model_id && stored_dim == options.dim => Ok(()),
        m => Err(StoreError::ModelMismatch {
            stored_model: m.unwrap_or_default(),
            stored_dim,
            requested_model: options.model_id.clone(),
            requested_dim: options.dim,
        }),
    }
}

/// [`begin`] for a transaction that writes vectors: also checks, under the write lock, that
/// the store is still on this handle's model. Another handle (another process, say) may have
/// re-embedded it with a new model since this one opened ([`Store::reembed`]); a vector of
/// the old model written now would be of the wrong model, or dimension, among the new ones.
fn begin_vectors<'c>(conn: &'c mut Connection, shared: &Shared) -> Result<Transaction<'c>> {
    let tx = begin(conn)?;
    let (model, dim) = tx
        .prepare_cached(
            "SELECT (SELECT value FROM store_meta WHERE key = 'model_id'), \
                    (SELECT value FROM store_meta WHERE key = 'dim')",
        )?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    same_model(&shared.options, model, dim)?;
    Ok(tx)
}

/// Starts a write transaction that takes the write lock at once (`BEGIN IMMEDIATE`): a
/// deferred one that reads first cannot wait for another writer (SQLite answers "database is
/// locked" at once to avoid a deadlock), an immediate one waits out the busy timeout.
fn begin(conn: &mut Connection) -> Result<Transaction<'_>> {
    Ok(conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?)
}

fn snap_exists(dir: &Path) -> bool {
    dir.join("manifest.json").exists()
}

fn attr_of(shared: &Shared, u: &MemoryUnit) -> Attr {
    let l = &u.lifetime;
    Attr {
        kind: u.kind,
        level: u.level,
        created_at: to_micros(u.created_at),
        thread: shared
            .index
            .intern(u.thread_id.as_ref().map(ThreadId::as_str)),
        expires: l.expires_at.map_or(i64::MAX, to_micros),
        valid_from: to_micros(l.valid_from.unwrap_or(u.created_at)),
        valid_to: l.valid_to.map_or(i64::MAX, to_micros),
    }
}

fn next_vid(tx: &Transaction<'_>) -> Result<usize> {
    let next: i64 = tx.query_row(
        "SELECT CAST(value AS INTEGER) FROM store_meta WHERE key = 'next_vid'",
        [],
        |r| r.get(0),
    )?;
    tx.execute(
        "UPDATE store_meta SET value = ?1 WHERE key = 'next_vid'",
        params![(next + 1).to_string()],
    )?;
    Ok(vid_usize(next))
}

/// The rowid for a new memory: a counter in `store_meta`, so rowids are never reused (SQLite
/// would give a new row the rowid of a deleted newest one) and order memories by insertion
/// ([`Store::thread_tail`]). Never below the highest rowid + 1, whatever the counter says.
fn next_rid(tx: &Transaction<'_>) -> Result<i64> {
    let next: i64 = tx
        .prepare_cached(
            "SELECT MAX(COALESCE((SELECT CAST(value AS INTEGER) FROM store_meta WHERE key = 'next_rid'), 1),
                        (SELECT COALESCE(MAX(rid), 0) + 1 FROM memories))",
        )?
        .query_row([], |r| r.get(0))?;
    tx.prepare_cached("INSERT OR REPLACE INTO store_meta (key, value) VALUES ('next_rid', ?1)")?
        .execute(params![(next + 1).to_string()])?;
    Ok(next)
}

/// Writes a memory's row and keyword row and logs its vid; returns (vid, rid).
fn insert_row(
    tx: &Transaction<'_>,
    shared: &Shared,
    u: &MemoryUnit,
    v: &[f32],
) -> Result<(usize, i64)> {
    let exists: bool = tx
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM memories WHERE id = ?1)")?
        .query_row(params![u.id.as_bytes()], |r| r.get(0))?;
    if exists {
        return Err(StoreError::DuplicateId { id: u.id });
    }
    let vid = next_vid(tx)?;
    let rid = next_rid(tx)?;
    let meta = serde_json::to_string(&u.metadata)
        .map_err(|e| StoreError::Config(format!("metadata cannot be serialized: {e}")))?;
    let s = u.summary.as_ref();
    tx.prepare_cached(
        "INSERT INTO memories (id, vid, kind, thread_id, role, content, created_at, metadata, level,
            summary_type, time_start, time_end, source_count, stale, model_id, embedding, rid,
            expires_at, valid_from, valid_to, supersedes)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, 0, ?14, ?15, ?16,
            ?17, ?18, ?19, (SELECT o.rid FROM memories o WHERE o.id = ?20))",
    )?
    .execute(params![
        u.id.as_bytes(),
        i64::try_from(vid).unwrap_or(i64::MAX),
        u.kind.as_str(),
        u.thread_id.as_ref().map(ThreadId::as_str),
        u.role.map(|r| r.as_str()),
        u.content,
        to_micros(u.created_at),
        meta,
        u.level,
        s.map(|s| s.summary_type.as_str()),
        s.map(|s| to_micros(s.time_range_start)),
        s.map(|s| to_micros(s.time_range_end)),
        s.map(|s| i64::try_from(s.source_count).unwrap_or(i64::MAX)),
        shared.options.model_id,
        encode_vector(v),
        rid,
        u.lifetime.expires_at.map(to_micros),
        u.lifetime.valid_from.map(to_micros),
        u.lifetime.valid_to.map(to_micros),
        u.lifetime.supersedes.map(|o| o.as_bytes().to_vec()),
    ])?;
    tx.prepare_cached("INSERT INTO memories_fts (rowid, content) VALUES (?1, ?2)")?
        .execute(params![rid, u.content])?;
    log_vids(tx, shared, [vid])?;
    Ok((vid, rid))
}

/// The stored memory with `u`'s id when it is the same memory (kind, thread, role, content,
/// metadata, and time when one was given): adding it again is a retry, not a new memory.
/// `None` when the id is free; `DuplicateId` when another memory holds it.
fn already_stored(
    tx: &Transaction<'_>,
    p: &crate::backend::PreparedMemory,
    now: DateTime<Utc>,
) -> Result<Option<MemoryUnit>> {
    let id = p.unit.id;
    let exists: bool = tx
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM memories WHERE id = ?1)")?
        .query_row(params![id.as_bytes()], |r| r.get(0))?;
    if !exists {
        return Ok(None);
    }
    let stored = rows::get_unit(tx, id)?;
    // An expired copy (not yet swept) is not returned as if it were live: adding it again
    // is a conflict (an upsert revives it).
    if crate::backend::same_memory(&stored, p, now) {
        Ok(Some(stored))
    } else {
        Err(StoreError::DuplicateId { id })
    }
}

/// Ends the validity of `old` at `until` because `new` supersedes it; returns its (vid,
/// level) for the index to re-read.
fn supersede(
    tx: &Transaction<'_>,
    shared: &Shared,
    old: MemoryId,
    new: MemoryId,
    until: DateTime<Utc>,
) -> Result<(usize, u32)> {
    if old == new {
        return Err(StoreError::CannotSupersede {
            id: old,
            reason: "a memory cannot supersede itself",
        });
    }
    let (vid, kind, level, valid_to): (i64, String, u32, Option<i64>) = tx
        .query_row(
            "SELECT vid, kind, level, valid_to FROM memories WHERE id = ?1",
            params![old.as_bytes()],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()?
        .ok_or(StoreError::NotFound { id: old })?;
    if kind == MemoryKind::Summary.as_str() {
        return Err(StoreError::CannotSupersede {
            id: old,
            reason: "it is a summary",
        });
    }
    if valid_to.is_some() {
        return Err(StoreError::CannotSupersede {
            id: old,
            reason: "it is no longer current (supersede the current version)",
        });
    }
    tx.execute(
        "UPDATE memories SET valid_to = ?2 WHERE id = ?1",
        params![old.as_bytes(), to_micros(until)],
    )?;
    log_vids(tx, shared, [vid_usize(vid)])?;
    Ok((vid_usize(vid), level))
}

/// A random id for this handle's entries in the index log.
fn new_origin() -> i64 {
    // A v7 id ends in 62 random bits.
    let (_, low) = uuid::Uuid::now_v7().as_u64_pair();
    i64::from_ne_bytes(low.to_ne_bytes())
}

/// The index log's highest sequence number (0 when empty).
fn log_head(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM index_log")?
        .query_row([], |r| r.get(0))?)
}

/// The highest sequence number pruned from the index log (0 when none was).
fn log_pruned(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached(
            "SELECT COALESCE((SELECT CAST(value AS INTEGER) FROM store_meta WHERE key = 'index_log_pruned'), 0)",
        )?
        .query_row([], |r| r.get(0))?)
}

/// Records, in the writing transaction, that the index entries of `vids` changed.
fn log_vids(
    tx: &Transaction<'_>,
    shared: &Shared,
    vids: impl IntoIterator<Item = usize>,
) -> Result<()> {
    let mut stmt = tx.prepare_cached("INSERT INTO index_log (vid, origin) VALUES (?1, ?2)")?;
    for vid in vids {
        stmt.execute(params![
            i64::try_from(vid).unwrap_or(i64::MAX),
            shared.origin
        ])?;
    }
    Ok(())
}

/// Brings the index up to every write committed by other handles (other processes, or
/// another `Store` on the same file): runs on the writer thread before and after each job.
/// A failure is logged and leaves a full re-read for the next call; it never fails the job.
fn sync_index(conn: &mut Connection, shared: &Shared) {
    swap_rebuilt(conn, shared);
    if let Err(e) = try_sync_index(conn, shared) {
        tracing::warn!(error = %e, "catching the index up with other writers failed; retried at the next call");
        shared.resync.store(true, Ordering::SeqCst);
    }
}

fn try_sync_index(conn: &Connection, shared: &Shared) -> Result<()> {
    let seen = shared.seen.load(Ordering::SeqCst);
    let pruned = log_pruned(conn)?;
    if shared.resync.load(Ordering::SeqCst) || pruned > seen {
        let head = log_head(conn)?;
        let live = live_rows(conn, &shared.index)?;
        let adopted = adopt_rows(conn, &shared.index, live)?;
        shared.seen.store(head, Ordering::SeqCst);
        shared.resync.store(false, Ordering::SeqCst);
        shared.resyncs.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            inserted = adopted,
            "index re-read from SQLite (behind the log)"
        );
        return Ok(());
    }
    let mut head = seen;
    let mut foreign = Vec::new();
    {
        let mut stmt = conn
            .prepare_cached("SELECT seq, vid, origin FROM index_log WHERE seq > ?1 ORDER BY seq")?;
        let mut rows = stmt.query(params![seen])?;
        while let Some(r) = rows.next()? {
            head = head.max(r.get::<_, i64>(0)?);
            if r.get::<_, i64>(2)? != shared.origin {
                foreign.push(vid_usize(r.get::<_, i64>(1)?));
            }
        }
    }
    if !foreign.is_empty() {
        foreign.sort_unstable();
        foreign.dedup();
        apply_vids(conn, &shared.index, &foreign)?;
        shared.foreign.fetch_add(foreign.len(), Ordering::Relaxed);
    }
    shared.seen.store(head, Ordering::SeqCst);
    // A process that fell further behind than the log keeps re-reads every row instead.
    let keep = i64::try_from(shared.options.index_log_keep).unwrap_or(i64::MAX / 2);
    if head - pruned > keep.saturating_mul(2) {
        // (Called between jobs and before a snapshot: never inside a transaction.)
        let tx = Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)?;
        let below = head - keep;
        tx.execute("DELETE FROM index_log WHERE seq <= ?1", params![below])?;
        tx.execute(
            "INSERT OR REPLACE INTO store_meta (key, value) VALUES ('index_log_pruned', ?1)",
            params![below.to_string()],
        )?;
        tx.commit()?;
    }
    Ok(())
}

/// Sets the index entries of `vids` to what their rows hold now: inserted (vector read from
/// SQLite) or re-attributed when the row exists, removed when it does not.
fn apply_vids(conn: &Connection, index: &VectorIndex, vids: &[usize]) -> Result<()> {
    let mut stmt =
        conn.prepare_cached(&format!("SELECT {ATTR_COLS} FROM memories WHERE vid = ?1"))?;
    let mut live = Vec::new();
    let mut gone = Vec::new();
    for vid in vids {
        let row = stmt
            .query_row(params![i64::try_from(*vid).unwrap_or(i64::MAX)], |r| {
                AttrRow::read(r, 0)
            })
            .optional()?;
        match row {
            Some(a) => live.push((*vid, a.attr(index)?)),
            None => gone.push(*vid),
        }
    }
    index.remove(&gone);
    adopt_rows_partial(conn, index, live)?;
    Ok(())
}

/// Makes the index hold exactly `live` (every row's vid and attributes): entries without a
/// row are removed, rows without an entry inserted. Returns how many were inserted.
fn adopt_rows(conn: &Connection, index: &VectorIndex, live: Vec<(usize, Attr)>) -> Result<usize> {
    let rows: HashSet<usize> = live.iter().map(|(v, _)| *v).collect();
    let orphans: Vec<usize> = index
        .attrs()
        .map
        .keys()
        .filter(|v| !rows.contains(v))
        .collect();
    index.remove(&orphans);
    adopt_rows_partial(conn, index, live)
}

/// Sets the attributes of the given rows' entries, inserting those the graph lacks (vectors
/// read from SQLite). Returns how many were inserted.
fn adopt_rows_partial(
    conn: &Connection,
    index: &VectorIndex,
    live: Vec<(usize, Attr)>,
) -> Result<usize> {
    let attrs: HashMap<usize, Attr> = live.iter().copied().collect();
    let missing = index.adopt_live(live);
    if missing.is_empty() {
        return Ok(0);
    }
    let vecs = vectors(conn, Some(&missing))?;
    let entries = entries_of(&vecs, &attrs);
    index.insert(&entries);
    Ok(entries.len())
}

/// Index entries for `vecs` (vid, vector) whose vid has attributes in `attrs`.
fn entries_of<'a>(vecs: &'a [(usize, Vec<f32>)], attrs: &HashMap<usize, Attr>) -> Vec<Entry<'a>> {
    vecs.iter()
        .filter_map(|(vid, v)| {
            attrs.get(vid).map(|a| Entry {
                vid: *vid,
                vector: v,
                attr: *a,
            })
        })
        .collect()
}

/// After a committed insert of `units` (with their vectors) as `vids`: index them, then
/// snapshot or rebuild as thresholds say (see [`after_commit`]).
fn index_committed(
    conn: &Connection,
    shared: &Shared,
    units: &[(MemoryUnit, Vec<f32>)],
    vids: &[usize],
) {
    let entries: Vec<Entry<'_>> = units
        .iter()
        .zip(vids)
        .map(|((u, v), vid)| Entry {
            vid: *vid,
            vector: v,
            attr: attr_of(shared, u),
        })
        .collect();
    shared.index.insert(&entries);
    after_commit(conn, shared);
}

struct SourceFacts {
    rid: i64,
    level: u32,
    start: i64,
    end: i64,
    thread: Option<String>,
}

/// A summary of a thread may cite that thread's memories and memories of no thread; a
/// summary of no thread may cite anything.
/// A summary of a thread may cite memories of that thread or of none, and through a
/// thread-less summary it may not reach another thread's memories either (checked through
/// every level).
fn check_thread(
    conn: &Connection,
    summary_thread: Option<&str>,
    source: MemoryId,
    facts: &SourceFacts,
) -> Result<()> {
    let link = crate::backend::SourceLink {
        id: source,
        level: facts.level,
        thread: facts.thread.clone(),
        continues: false,
    };
    let (true, Some(t)) = (
        crate::backend::check_link_thread(summary_thread, &link)?,
        summary_thread,
    ) else {
        return Ok(());
    };
    let below = conn
        .prepare_cached(
            "WITH RECURSIVE down(r) AS (
                SELECT source FROM summary_sources WHERE summary = ?1
                UNION SELECT l.source FROM summary_sources l JOIN down ON l.summary = down.r)
             SELECT m.id, m.thread_id FROM memories m
              WHERE m.rid IN (SELECT r FROM down)
                AND m.thread_id IS NOT NULL AND m.thread_id != ?2 LIMIT 1",
        )?
        .query_row(params![facts.rid, t], |r| {
            Ok((
                MemoryId::from_bytes(r.get::<_, [u8; 16]>(0)?),
                r.get::<_, String>(1)?,
            ))
        })
        .optional()?;
    match below {
        Some((id, st)) => Err(StoreError::ThreadMismatch {
            id,
            source_thread: st,
            summary_thread: t.to_owned(),
        }),
        None => Ok(()),
    }
}

fn source_facts(conn: &Connection, id: MemoryId) -> Result<SourceFacts> {
    conn.prepare_cached(
        "SELECT rid, level, COALESCE(time_start, created_at), COALESCE(time_end, created_at),
                thread_id
         FROM memories WHERE id = ?1",
    )?
    .query_row(params![id.as_bytes()], |r| {
        Ok(SourceFacts {
            rid: r.get(0)?,
            level: r.get(1)?,
            start: r.get(2)?,
            end: r.get(3)?,
            thread: r.get(4)?,
        })
    })
    .optional()?
    .ok_or(StoreError::NotFound { id })
}

/// Column `i` of a row when it holds text (a JSON value read with `json_extract` may be a
/// number or NULL), else `None`.
fn text_or_none(row: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<Option<String>> {
    Ok(match row.get_ref(i)? {
        rusqlite::types::ValueRef::Text(t) => Some(String::from_utf8_lossy(t).into_owned()),
        _ => None,
    })
}

/// The `k` memories admitted by `filter` that best match the FTS5 query `fts` by BM25, as
/// (index id, negated BM25), best first.
fn keyword_ids(
    c: &Connection,
    fts: String,
    k: usize,
    filter: &Filter,
    vis: Visibility,
) -> Result<Vec<(u64, f32)>> {
    let (sql, args) = keyword_statement(fts, k, filter, vis);
    let mut stmt = c.prepare_cached(&sql)?;
    let mut out = Vec::new();
    let mut q = stmt.query(rusqlite::params_from_iter(args.iter()))?;
    while let Some(r) = q.next()? {
        let vid: i64 = r.get(0)?;
        let s: f64 = r.get(1)?;
        #[allow(clippy::cast_possible_truncation)] // a BM25 score fits an f32
        out.push((u64::try_from(vid).unwrap_or(u64::MAX), -s as f32));
    }
    Ok(out)
}

/// The statement of [`keyword_ids`] and its arguments.
fn keyword_statement(
    fts: String,
    k: usize,
    filter: &Filter,
    vis: Visibility,
) -> (String, Vec<Value>) {
    let (cond, cargs) = filter.sql_at(vis);
    let mut args = vec![Value::Text(fts)];
    args.extend(cargs);
    args.push(Value::Integer(i64::try_from(k).unwrap_or(i64::MAX)));
    // Without metadata conditions, every column the filter tests is in `memories_rid_filter`
    // (schema 9): the matches are filtered from that index, not from their rows (content
    // and embedding, a page each). SQLite's planner prefers the rowid lookup, so the index
    // is named.
    let sql = if filter.metadata.is_empty() {
        format!(
            "SELECT m.vid, bm25(memories_fts) AS s FROM memories_fts
             JOIN memories m INDEXED BY memories_rid_filter ON m.rid = memories_fts.rowid
             WHERE memories_fts MATCH ?{cond} ORDER BY s LIMIT ?"
        )
    } else {
        format!(
            "SELECT m.vid, bm25(memories_fts) AS s FROM memories_fts
             JOIN memories m ON m.rid = memories_fts.rowid
             WHERE memories_fts MATCH ?{cond} ORDER BY s LIMIT ?"
        )
    };
    (sql, args)
}

/// The columns of a [`TimelineEntry`], over alias `m`.
const TIMELINE_COLS: &str =
    "m.created_at, m.vid, json_extract(m.metadata, '$.speaker'), length(m.content)";

/// A row of [`TIMELINE_COLS`].
fn timeline_entry(r: &rusqlite::Row<'_>) -> rusqlite::Result<TimelineEntry> {
    let speaker = text_or_none(r, 2)?;
    Ok(TimelineEntry {
        at: from_micros(r.get::<_, i64>(0)?),
        vid: u64::try_from(r.get::<_, i64>(1)?).unwrap_or(u64::MAX),
        speaker,
        chars: usize::try_from(r.get::<_, i64>(3)?).unwrap_or(0),
    })
}

fn summary_rid(conn: &Connection, id: MemoryId) -> Result<i64> {
    let (rid, kind): (i64, String) = conn
        .prepare_cached("SELECT rid, kind FROM memories WHERE id = ?1")?
        .query_row(params![id.as_bytes()], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .ok_or(StoreError::NotFound { id })?;
    if kind != MemoryKind::Summary.as_str() {
        return Err(StoreError::NotASummary { id });
    }
    Ok(rid)
}

/// Every summary above a memory (`?1`, its rid), through every level: each step up is a
/// look-up in `summary_sources_source`.
const ANCESTOR_RIDS: &str = "WITH RECURSIVE up(r) AS (
            SELECT summary FROM summary_sources WHERE source = ?1
            UNION SELECT l.summary FROM summary_sources l JOIN up ON l.source = up.r)
         SELECT r FROM up";

/// The summaries citing a memory (`?1`, its rid), with their ids.
const CITING_IDS: &str =
    "SELECT m.rid, m.id FROM summary_sources l JOIN memories m ON m.rid = l.summary
         WHERE l.source = ?1 ORDER BY m.rid";

fn ancestor_rids(conn: &Connection, rid: i64) -> Result<Vec<i64>> {
    let mut stmt = conn.prepare_cached(ANCESTOR_RIDS)?;
    let out = stmt
        .query_map(params![rid], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(out)
}

fn citing_ids(conn: &Connection, rid: i64) -> Result<Vec<(i64, MemoryId)>> {
    let mut stmt = conn.prepare_cached(CITING_IDS)?;
    let out = stmt
        .query_map(params![rid], |r| {
            Ok((r.get(0)?, MemoryId::from_bytes(r.get(1)?)))
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(out)
}

fn mark_stale(tx: &Transaction<'_>, rids: &[i64]) -> Result<()> {
    let mut stmt = tx.prepare_cached("UPDATE memories SET stale = 1 WHERE rid = ?1")?;
    for r in rids {
        stmt.execute(params![r])?;
    }
    Ok(())
}

/// Recomputes level, time range and source count of the given summaries (children before
/// parents, repeated until stable); returns (vid, new level) of those whose level changed.
/// A continuation link (a moving summary's previous version) passes its level on unraised.
fn refresh_summaries(tx: &Transaction<'_>, rids: &[i64]) -> Result<Vec<(usize, u32)>> {
    let mut changed = HashMap::new();
    let mut stmt = tx.prepare_cached(
        "SELECT COALESCE(MAX(s.level + 1 - l.continues), 0), MIN(COALESCE(s.time_start, s.created_at)),
                MAX(COALESCE(s.time_end, s.created_at)), count(*)
         FROM summary_sources l JOIN memories s ON s.rid = l.source WHERE l.summary = ?1",
    )?;
    let mut upd = tx.prepare_cached(
        "UPDATE memories SET level = MAX(?2, 1), time_start = COALESCE(?3, time_start),
            time_end = COALESCE(?4, time_end), source_count = ?5 WHERE rid = ?1
         RETURNING vid, level",
    )?;
    // Levels can only move along chains no longer than the number of summaries involved.
    for _ in 0..=rids.len() {
        let mut any = false;
        for r in rids {
            let (level, start, end, count): (i64, Option<i64>, Option<i64>, i64) = stmt
                .query_row(params![r], |x| {
                    Ok((x.get(0)?, x.get(1)?, x.get(2)?, x.get(3)?))
                })?;
            let before: i64 = tx.query_row(
                "SELECT level FROM memories WHERE rid = ?1",
                params![r],
                |x| x.get(0),
            )?;
            let (vid, after): (i64, i64) = upd
                .query_row(params![r, level, start, end, count], |x| {
                    Ok((x.get(0)?, x.get(1)?))
                })?;
            if after != before {
                any = true;
                changed.insert(vid_usize(vid), u32::try_from(after).unwrap_or(u32::MAX));
            }
        }
        if !any {
            break;
        }
    }
    Ok(changed.into_iter().collect())
}

/// [`reattr`] for each (vid, level), after a commit: a failure is logged and leaves a full
/// re-read of the index attributes for the next job (the write itself stands).
fn reattr_all(conn: &Connection, shared: &Shared, relevelled: &[(usize, u32)]) {
    for (vid, level) in relevelled {
        if let Err(e) = reattr(conn, shared, *vid, *level) {
            tracing::warn!(error = %e, vid, "index level update after a commit failed; re-reading the index at the next call");
            shared.resync.store(true, Ordering::SeqCst);
        }
    }
}

fn reattr(conn: &Connection, shared: &Shared, vid: usize, level: u32) -> Result<()> {
    let mut a = conn.query_row(
        &format!("SELECT {ATTR_COLS} FROM memories WHERE vid = ?1"),
        params![i64::try_from(vid).unwrap_or(i64::MAX)],
        |r| AttrRow::read(r, 0),
    )?;
    a.level = level;
    shared.index.set_attr(vid, a.attr(&shared.index)?);
    Ok(())
}

/// [`after_index_change`] after a committed write: the write is acknowledged whatever
/// happens here, so a failure (disk full, a rename race) is logged and counted in
/// [`StoreStats`], and the snapshot is retried at the next write (its threshold still holds)
/// and on close.
fn after_commit(conn: &Connection, shared: &Shared) {
    if let Err(e) = after_index_change(conn, shared) {
        snapshot_failed(shared, &e);
    }
}

/// Logs and counts a snapshot (or rebuild) that failed after its write committed.
fn snapshot_failed(shared: &Shared, e: &StoreError) {
    tracing::warn!(error = %e, "index snapshot after a committed write failed; retried later");
    let mut f = shared
        .snapshot_failures
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    f.0 += 1;
    f.1 = Some(e.to_string());
}

/// Writes the snapshot; a success clears the last snapshot error. A handle whose store was
/// re-embedded with another model since it opened writes none (its index is of the old
/// vectors): [`StoreError::ModelMismatch`].
fn snapshot(conn: &Connection, shared: &Shared) -> Result<()> {
    let (model, dim) = conn
        .prepare_cached(
            "SELECT (SELECT value FROM store_meta WHERE key = 'model_id'), \
                    (SELECT value FROM store_meta WHERE key = 'dim')",
        )?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    same_model(&shared.options, model, dim)?;
    // Other writers' deletes first: an entry another process deleted is written without
    // its vector (see `Store::erase_deleted`), not brought back from this one's graph. Under
    // the snapshot lock, so a process whose erase wrote its snapshot since is not followed
    // by this one's made from an index caught up before that delete.
    let lock = SnapshotLock::acquire(&shared.snapshot_dir)?;
    try_sync_index(conn, shared)?;
    shared.index.snapshot(&shared.snapshot_dir, &lock)?;
    shared
        .snapshot_failures
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .1 = None;
    Ok(())
}

/// Snapshots or rebuilds when thresholds are passed (runs on the writer thread).
fn after_index_change(conn: &Connection, shared: &Shared) -> Result<()> {
    let h = shared.index.health();
    let o = &shared.options;
    let limit = (o.tombstone_ratio * h.points as f64).max(o.tombstone_min as f64);
    if h.tombstones as f64 > limit {
        let why = format!("{} deleted entries", h.tombstones);
        if o.background_rebuild {
            start_rebuild(shared, why);
        } else {
            rebuild(conn, shared, Some(why))?;
            snapshot(conn, shared)?;
        }
    } else if o.snapshot_every > 0 && h.unsnapshotted >= o.snapshot_every.max(h.points / 10) {
        // A snapshot rewrites the whole graph: spacing them by a tenth of the index keeps
        // the bytes written per new entry constant as the store grows.
        snapshot(conn, shared)?;
    }
    Ok(())
}

/// Starts rebuilding the index on a thread of its own, unless a rebuild is under way: it
/// reads the rows, their vectors and the index-log position in one read transaction and
/// builds a fresh graph; the writer thread swaps it in at its next job (`swap_rebuilt`).
fn start_rebuild(shared: &Shared, why: String) {
    if shared.rebuilding.swap(true, Ordering::SeqCst) {
        return;
    }
    let path = shared.path.clone();
    let options = shared.options.clone();
    let slot = Arc::clone(&shared.rebuilt);
    let flag = Arc::clone(&shared.rebuilding);
    let spawned = std::thread::Builder::new()
        .name("cairn-rebuild".into())
        .spawn(move || match build_fresh(&path, &options) {
            Ok((index, head)) => {
                *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(Rebuilt { index, head, why });
            }
            Err(e) => {
                tracing::warn!(error = %e, "background index rebuild failed; retried at the next write");
                flag.store(false, Ordering::SeqCst);
            }
        });
    match spawned {
        Ok(h) => {
            let old = shared
                .rebuild_thread
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .replace(h);
            if let Some(old) = old {
                let _ = old.join();
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the index rebuild thread; retried at the next write");
            shared.rebuilding.store(false, Ordering::SeqCst);
        }
    }
}

/// A fresh index of every row (see [`start_rebuild`]), with the index-log position the rows
/// were read at.
fn build_fresh(path: &Path, options: &StoreOptions) -> Result<(VectorIndex, i64)> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(30))?;
    schema::tune(&conn)?;
    let fresh = VectorIndex::empty(options.hnsw, &options.model_id, options.dim);
    // One read transaction: the log position, the rows and their vectors agree.
    conn.execute_batch("BEGIN")?;
    let head = log_head(&conn)?;
    let live: HashMap<usize, Attr> = live_rows(&conn, &fresh)?.into_iter().collect();
    let vecs = vectors(&conn, None)?;
    conn.execute_batch("COMMIT")?;
    fresh.replace_with(&entries_of(&vecs, &live));
    Ok((fresh, head))
}

/// Swaps a finished background rebuild in (writer thread): first it applies every index
/// change logged after its rows were read, by this handle or any other, so the swapped-in
/// index misses nothing that was acknowledged meanwhile. Failures are logged; the old index
/// stays and a later write starts another rebuild.
fn swap_rebuilt(conn: &Connection, shared: &Shared) {
    let Some(r) = shared
        .rebuilt
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    else {
        return;
    };
    let caught_up = (|| -> Result<()> {
        if log_pruned(conn)? > r.head {
            let live = live_rows(conn, &r.index)?;
            adopt_rows(conn, &r.index, live)?;
        } else {
            let mut stmt = conn.prepare_cached("SELECT vid FROM index_log WHERE seq > ?1")?;
            let mut vids: Vec<usize> = stmt
                .query_map(params![r.head], |x| x.get::<_, i64>(0))?
                .map(|v| v.map(vid_usize))
                .collect::<rusqlite::Result<_>>()?;
            vids.sort_unstable();
            vids.dedup();
            apply_vids(conn, &r.index, &vids)?;
        }
        Ok(())
    })();
    shared.rebuilding.store(false, Ordering::SeqCst);
    match caught_up {
        Ok(()) => {
            shared.index.swap_in(r.index);
            let mut n = shared.rebuilds.lock().unwrap_or_else(|p| p.into_inner());
            n.0 += 1;
            n.1 = Some(r.why);
            drop(n);
            if let Err(e) = snapshot(conn, shared) {
                snapshot_failed(shared, &e);
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "a background index rebuild could not catch up; dropped")
        }
    }
}

fn rebuild(conn: &Connection, shared: &Shared, why: Option<String>) -> Result<()> {
    let live: HashMap<usize, Attr> = live_rows(conn, &shared.index)?.into_iter().collect();
    let vecs = vectors(conn, None)?;
    shared.index.replace_with(&entries_of(&vecs, &live));
    let mut r = shared.rebuilds.lock().unwrap_or_else(|p| p.into_inner());
    r.0 += 1;
    r.1 = why;
    Ok(())
}

/// One memory on a timeline (see [`Store::timeline_entries`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineEntry {
    /// When it happened.
    pub at: DateTime<Utc>,
    /// Its index id (as in [`Store::search_vector_ids`] and [`Store::hits`]).
    pub vid: u64,
    /// Who said it: the string its metadata holds under `"speaker"`, if any.
    pub speaker: Option<String>,
    /// Length of its content in characters.
    pub chars: usize,
}

/// English function words left out of keyword queries: they match almost every memory
/// and drown the words that carry the question.
const STOPWORDS: &[&str] = &[
    "a", "about", "after", "again", "all", "am", "an", "and", "any", "are", "as", "at", "be",
    "because", "been", "before", "being", "both", "but", "by", "can", "could", "did", "do", "does",
    "doing", "down", "during", "each", "few", "for", "from", "further", "had", "has", "have",
    "having", "he", "her", "here", "hers", "herself", "him", "himself", "his", "how", "i", "if",
    "in", "into", "is", "it", "its", "itself", "just", "me", "more", "most", "my", "myself", "no",
    "nor", "not", "now", "of", "off", "on", "once", "only", "or", "other", "our", "ours", "out",
    "over", "own", "s", "same", "she", "should", "so", "some", "such", "t", "than", "that", "the",
    "their", "theirs", "them", "then", "there", "these", "they", "this", "those", "through", "to",
    "too", "under", "until", "up", "very", "was", "we", "were", "what", "when", "where", "which",
    "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours", "yourself",
    "ll", "re", "ve", "d", "m",
];

/// The words of free text an FTS5 query looks for: lowercased, less function words (a text
/// made only of function words keeps them), once each, at most 64.
fn fts_words(text: &str) -> Vec<String> {
    let all: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let content: Vec<&String> = all
        .iter()
        .filter(|w| !STOPWORDS.contains(&w.as_str()))
        .collect();
    let chosen: Vec<&String> = if content.is_empty() {
        all.iter().collect()
    } else {
        content
    };
    let mut words: Vec<String> = Vec::new();
    for w in chosen {
        let w = w.clone();
        if !words.contains(&w) {
            words.push(w);
        }
        if words.len() == 64 {
            break;
        }
    }
    words
}

/// Words as an FTS5 query: quoted, OR-ed; `None` when there are none.
fn fts_or(words: &[String]) -> Option<String> {
    (!words.is_empty()).then(|| {
        words
            .iter()
            .map(|w| format!("\"{w}\""))
            .collect::<Vec<_>>()
            .join(" OR ")
    })
}

/// Turns free text into an FTS5 query: its words (less function words), quoted, OR-ed.
/// `None` when it has no words. A query made only of function words keeps them.
fn fts_query(text: &str) -> Option<String> {
    fts_or(&fts_words(text))
}

#[cfg(test)]
mod tests {
    use super::{fts_query, keyword_statement, Store, Visibility, ANCESTOR_RIDS, CITING_IDS};
    use crate::{Filter, MetaFilter, StoreOptions};
    use cairn_core::{MemoryKind, ThreadId};
    use chrono::{TimeZone, Utc};

    /// A keyword search filters its matches from `memories_rid_filter` alone whatever the
    /// filter tests, metadata aside (which needs the row).
    #[test]
    fn keyword_matches_are_filtered_from_the_index_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("k.db"), StoreOptions::new("m", 4)).unwrap();
        let t = Utc.with_ymd_and_hms(2024, 5, 1, 0, 0, 0).unwrap();
        let every = Filter::all()
            .kinds([MemoryKind::Conversational, MemoryKind::Summary])
            .thread(ThreadId::new("t").unwrap())
            .levels(0, 3)
            .between(t, t + chrono::Duration::days(1));
        let cases = [
            (Filter::all(), true),
            (every.clone(), true),
            (every.clone().as_of(t), true),
            (every.clone().with_history(), true),
            (Filter::all().thread_less(), true),
            (every.meta(MetaFilter::eq("speaker", "Ann")), false),
        ];
        for (filter, covered) in cases {
            for timed in [false, true] {
                let vis = Visibility { now: 0, timed };
                let (sql, args) = keyword_statement("\"x\"".into(), 5, &filter, vis);
                let plan: Vec<String> = store
                    .read(|c| {
                        Ok(c.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?
                            .query_map(rusqlite::params_from_iter(args.iter()), |r| r.get(3))?
                            .collect::<rusqlite::Result<_>>()?)
                    })
                    .unwrap();
                let index_alone = plan
                    .iter()
                    .any(|p| p.contains("COVERING INDEX memories_rid_filter"));
                assert_eq!(index_alone, covered, "{filter:?} {plan:?}");
            }
        }
    }

    /// The way up from a source (back-links, ancestors, the summaries a delete or an update
    /// touches) is a look-up in `summary_sources_source`, never a scan of the links: its
    /// cost does not grow with the store.
    #[test]
    fn back_links_are_looked_up_by_source() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("b.db"), StoreOptions::new("m", 4)).unwrap();
        for sql in [ANCESTOR_RIDS, CITING_IDS] {
            let plan: Vec<String> = store
                .read(|c| {
                    Ok(c.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?
                        .query_map([1i64], |r| r.get(3))?
                        .collect::<rusqlite::Result<_>>()?)
                })
                .unwrap();
            let on_links: Vec<&String> = plan
                .iter()
                .filter(|p| {
                    let table = p.split_whitespace().nth(1);
                    matches!(table, Some("l" | "summary_sources"))
                })
                .collect();
            assert!(!on_links.is_empty(), "{plan:?}");
            for p in &on_links {
                assert!(
                    p.contains("INDEX summary_sources_source (source=?)"),
                    "{sql}: {plan:?}"
                );
            }
        }
    }

    #[test]
    fn fts_queries_are_quoted_words() {
        assert_eq!(fts_query("  ,;  "), None);
        assert_eq!(
            fts_query("What's \"RRF\" AND-or NEAR(x)?").unwrap(),
            "\"rrf\" OR \"near\" OR \"x\""
        );
        assert_eq!(
            fts_query("what is it").unwrap(),
            "\"what\" OR \"is\" OR \"it\""
        );
    }
}
