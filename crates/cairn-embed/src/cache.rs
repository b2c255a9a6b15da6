//! [`CachedEmbedder`]: embeds each distinct text once per model, in a bounded cache.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cairn_core::{EmbedError, Embedder, InputError};
use rusqlite::{params, Connection, OptionalExtension};
use sha2::{Digest, Sha256};

/// Cache hit and miss counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CacheStats {
    /// Texts answered from the cache.
    pub hits: u64,
    /// Texts that went to the model.
    pub misses: u64,
}

/// Entries a cache keeps unless told otherwise: 50,000 vectors, about 77 MB at
/// all-MiniLM-L6-v2's 384 dimensions (1,536 bytes a vector plus its key).
pub const DEFAULT_CACHE_CAPACITY: usize = 50_000;

/// Wraps an [`Embedder`] with a persistent cache: an SQLite table `embedding_cache` keyed by
/// (model id, sha256 of the text). Imports repeat lines and summaries get re-embedded; each
/// distinct text reaches the model once while it stays in the cache.
///
/// The table can live in the store's own database file (it is created if missing).
///
/// **Bounded.** It holds at most `capacity` entries ([`DEFAULT_CACHE_CAPACITY`] unless
/// [`Self::open_with_capacity`] says otherwise), counted over every model. Each entry has a
/// use stamp from a counter kept in the same file; a write that takes the cache over its
/// capacity evicts the entries with the oldest stamps in the same transaction. A hit
/// refreshes an entry's stamp only when the entry has fallen into the older half of the
/// stamps (a read that would otherwise write on every hit), so the policy is LRU up to that
/// half: an entry written or hit within the last `capacity / 2` stamps (a stamp is one write
/// or one refresh) is never the one evicted. The
/// count and the counter are rows of the file, so several processes sharing it keep one
/// bound.
///
/// **Purged.** [`Self::purge`] removes the vectors of given texts, under every model; the
/// harness calls it with the texts of the memories it deletes. [`Self::drop_other_models`]
/// removes what a model the store is no longer on left behind; the harness calls it when it
/// opens the cache.
pub struct CachedEmbedder {
    inner: Arc<dyn Embedder>,
    conn: Mutex<Connection>,
    capacity: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for CachedEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedEmbedder")
            .field("model", &self.inner.model_id())
            .field("capacity", &self.capacity)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

fn db_err(e: rusqlite::Error) -> EmbedError {
    EmbedError::Unavailable(format!("embedding cache: {e}"))
}

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Reads a counter of `embedding_cache_meta`.
fn meta(conn: &Connection, key: &str) -> rusqlite::Result<i64> {
    conn.prepare_cached("SELECT value FROM embedding_cache_meta WHERE key = ?1")?
        .query_row(params![key], |r| r.get(0))
}

fn set_meta(conn: &Connection, key: &str, value: i64) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE embedding_cache_meta SET value = ?2 WHERE key = ?1")?
        .execute(params![key, value])?;
    Ok(())
}

/// The distinct model ids of `embedding_cache`, one primary-key seek each (not a scan of
/// the entries).
fn models(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    conn.prepare_cached(
        "WITH RECURSIVE m(id) AS (
             SELECT min(model_id) FROM embedding_cache
             UNION ALL
             SELECT (SELECT min(model_id) FROM embedding_cache WHERE model_id > m.id)
             FROM m WHERE m.id IS NOT NULL)
         SELECT id FROM m WHERE id IS NOT NULL",
    )?
    .query_map([], |r| r.get(0))?
    .collect()
}

/// Evicts the oldest-stamped entries until at most `capacity` remain.
fn evict(conn: &Connection, capacity: usize) -> rusqlite::Result<()> {
    let entries = meta(conn, "entries")?;
    let excess = entries - to_i64(capacity);
    if excess > 0 {
        let gone = conn
            .prepare_cached(
                "DELETE FROM embedding_cache WHERE (model_id, text_sha256) IN (
                    SELECT model_id, text_sha256 FROM embedding_cache ORDER BY used LIMIT ?1)",
            )?
            .execute(params![excess])?;
        set_meta(conn, "entries", entries - to_i64(gone))?;
    }
    Ok(())
}

/// Deletes the entries of `keys` under every model, in one transaction; keeps the count.
fn purge_keys(
    conn: &mut Connection,
    keys: impl Iterator<Item = [u8; 32]>,
) -> rusqlite::Result<usize> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let models = models(&tx)?;
    let mut gone = 0;
    {
        let mut del = tx.prepare_cached(
            "DELETE FROM embedding_cache WHERE model_id = ?1 AND text_sha256 = ?2",
        )?;
        for k in keys {
            for m in &models {
                gone += del.execute(params![m, k])?;
            }
        }
    }
    let entries = meta(&tx, "entries")?;
    set_meta(&tx, "entries", (entries - to_i64(gone)).max(0))?;
    tx.commit()?;
    Ok(gone)
}

/// Deletes every entry whose key is not in `keep`, in one transaction; keeps the count.
fn retain_keys(conn: &mut Connection, keep: &HashSet<[u8; 32]>) -> rusqlite::Result<usize> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let stale: Vec<(String, Vec<u8>)> = {
        let mut stmt = tx.prepare("SELECT model_id, text_sha256 FROM embedding_cache")?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
        })?;
        let mut stale = Vec::new();
        for row in rows {
            let (model, k) = row?;
            let kept = <[u8; 32]>::try_from(k.as_slice()).is_ok_and(|k| keep.contains(&k));
            if !kept {
                stale.push((model, k));
            }
        }
        stale
    };
    let mut gone = 0;
    {
        let mut del = tx.prepare_cached(
            "DELETE FROM embedding_cache WHERE model_id = ?1 AND text_sha256 = ?2",
        )?;
        for (m, k) in &stale {
            gone += del.execute(params![m, k])?;
        }
    }
    let entries = meta(&tx, "entries")?;
    set_meta(&tx, "entries", (entries - to_i64(gone)).max(0))?;
    tx.commit()?;
    Ok(gone)
}

/// A connection to the cache table in the SQLite file at `path` for a purge, without an
/// embedder (a store opened with its cache off still purges what an earlier open cached);
/// `None` when the file has no cache table.
fn open_for_purge(path: &Path) -> rusqlite::Result<Option<Connection>> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(30))?;
    conn.pragma_update(None, "secure_delete", "ON")?;
    let has: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'embedding_cache')
             AND EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'embedding_cache_meta')",
        [],
        |r| r.get(0),
    )?;
    Ok(has.then_some(conn))
}

/// [`CachedEmbedder::purge`] on the cache table of the SQLite file at `path`, without
/// opening a cache (no embedder needed): `Ok(0)` when the file has none.
pub fn purge_file(path: &Path, texts: &[&str]) -> Result<usize, EmbedError> {
    if texts.is_empty() {
        return Ok(0);
    }
    match open_for_purge(path).map_err(db_err)? {
        Some(mut conn) => purge_keys(&mut conn, texts.iter().map(|t| key(t))).map_err(db_err),
        None => Ok(0),
    }
}

/// [`CachedEmbedder::retain_keys`] on the cache table of the SQLite file at `path`, without
/// opening a cache: `Ok(0)` when the file has none.
pub fn retain_file(path: &Path, keep: &HashSet<[u8; 32]>) -> Result<usize, EmbedError> {
    match open_for_purge(path).map_err(db_err)? {
        Some(mut conn) => retain_keys(&mut conn, keep).map_err(db_err),
        None => Ok(0),
    }
}

impl CachedEmbedder {
    /// Opens (or creates) the cache table in the SQLite file at `path`, holding at most
    /// [`DEFAULT_CACHE_CAPACITY`] entries.
    pub fn open(inner: Arc<dyn Embedder>, path: impl AsRef<Path>) -> Result<Self, EmbedError> {
        Self::open_with_capacity(inner, path, DEFAULT_CACHE_CAPACITY)
    }

    /// Opens (or creates) the cache table holding at most `capacity` entries (at least 1);
    /// a file holding more (from a larger capacity before) is trimmed at once.
    pub fn open_with_capacity(
        inner: Arc<dyn Embedder>,
        path: impl AsRef<Path>,
        capacity: usize,
    ) -> Result<Self, EmbedError> {
        if capacity == 0 {
            return Err(InputError::OutOfRange {
                name: "embedding cache capacity",
                value: "0".into(),
                expected: "at least 1 (turn the cache off instead)",
            }
            .into());
        }
        let mut conn = Connection::open(path).map_err(db_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(db_err)?;
        // WAL is the store's mode too; setting it here keeps both connections compatible.
        let _: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(db_err)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(db_err)?;
        // A purged text's vector is overwritten, not left in the file's free space.
        conn.pragma_update(None, "secure_delete", "ON")
            .map_err(db_err)?;
        // One plan whatever the bound values: SQLite built with STAT4 would re-prepare the
        // look-up on every new key otherwise.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            true,
        )
        .map_err(db_err)?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(db_err)?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS embedding_cache (
                model_id TEXT NOT NULL,
                text_sha256 BLOB NOT NULL,
                embedding BLOB NOT NULL,
                used INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (model_id, text_sha256)
            ) WITHOUT ROWID;
            CREATE TABLE IF NOT EXISTS embedding_cache_meta (
                key TEXT PRIMARY KEY,
                value INTEGER NOT NULL
            ) WITHOUT ROWID;",
        )
        .map_err(db_err)?;
        // Files written before the cache was bounded have no use stamps: their entries
        // start at 0, the oldest.
        let has_used: bool = tx
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM pragma_table_info('embedding_cache') WHERE name = 'used')",
                [],
                |r| r.get(0),
            )
            .map_err(db_err)?;
        if !has_used {
            tx.execute_batch(
                "ALTER TABLE embedding_cache ADD COLUMN used INTEGER NOT NULL DEFAULT 0",
            )
            .map_err(db_err)?;
        }
        tx.execute_batch(
            "CREATE INDEX IF NOT EXISTS embedding_cache_used ON embedding_cache (used);
             INSERT OR IGNORE INTO embedding_cache_meta (key, value)
                 SELECT 'entries', count(*) FROM embedding_cache;
             INSERT OR IGNORE INTO embedding_cache_meta (key, value)
                 SELECT 'clock', COALESCE(MAX(used), 0) FROM embedding_cache;",
        )
        .map_err(db_err)?;
        evict(&tx, capacity).map_err(db_err)?;
        tx.commit().map_err(db_err)?;
        Ok(Self {
            inner,
            conn: Mutex::new(conn),
            capacity,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// Hits and misses since opening.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }

    /// The most entries the cache keeps.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The entries it holds now (every model).
    pub fn len(&self) -> Result<usize, EmbedError> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let n: i64 = conn
            .query_row("SELECT count(*) FROM embedding_cache", [], |r| r.get(0))
            .map_err(db_err)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> Result<bool, EmbedError> {
        Ok(self.len()? == 0)
    }

    /// Whether `text` has a vector in the cache for the wrapped model (no stamp changes).
    pub fn contains(&self, text: &str) -> Result<bool, EmbedError> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        conn.prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM embedding_cache WHERE model_id = ?1 AND text_sha256 = ?2)",
        )
        .and_then(|mut s| s.query_row(params![self.inner.model_id(), key(text)], |r| r.get(0)))
        .map_err(db_err)
    }

    /// Removes the vectors of `texts` (the texts of deleted memories) under every model: a
    /// store re-embedded with another model may still hold the old model's vectors of them.
    /// Returns how many entries went. Texts not in the cache are ignored.
    pub fn purge(&self, texts: &[&str]) -> Result<usize, EmbedError> {
        if texts.is_empty() {
            return Ok(0);
        }
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        purge_keys(&mut conn, texts.iter().map(|t| key(t))).map_err(db_err)
    }

    /// Removes every entry whose text's key ([`text_key`]) is not in `keep`, under every
    /// model: what a purge does when the texts to purge are no longer known (a process
    /// stopped between deleting memories and purging their texts), given the keys of every
    /// text the store still holds. Vectors of other texts (queries, say) go too; they are
    /// embedded again when next asked for. Returns how many entries went.
    pub fn retain_keys(&self, keep: &HashSet<[u8; 32]>) -> Result<usize, EmbedError> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        retain_keys(&mut conn, keep).map_err(db_err)
    }

    /// Removes every entry of a model other than the wrapped one (a store holds the vectors
    /// of one model; the others' are left from before it was re-embedded, and no call would
    /// read them again). Returns how many entries went.
    pub fn drop_other_models(&self) -> Result<usize, EmbedError> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let others: Vec<String> = models(&conn)
            .map_err(db_err)?
            .into_iter()
            .filter(|m| m != self.inner.model_id())
            .collect();
        if others.is_empty() {
            return Ok(0);
        }
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(db_err)?;
        let mut gone = 0;
        for m in &others {
            gone += tx
                .execute(
                    "DELETE FROM embedding_cache WHERE model_id = ?1",
                    params![m],
                )
                .map_err(db_err)?;
        }
        let entries = meta(&tx, "entries").map_err(db_err)?;
        set_meta(&tx, "entries", (entries - to_i64(gone)).max(0)).map_err(db_err)?;
        tx.commit().map_err(db_err)?;
        Ok(gone)
    }

    /// The models the cache holds vectors of, by name.
    pub fn models(&self) -> Result<Vec<String>, EmbedError> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        models(&conn).map_err(db_err)
    }

    /// The wrapped embedder.
    pub fn inner(&self) -> &Arc<dyn Embedder> {
        &self.inner
    }

    /// Writes fresh vectors and refreshes the stamps of `touch`, in one transaction, then
    /// evicts down to the capacity.
    fn store(
        &self,
        model: &str,
        fresh: &[(&str, &[f32])],
        touch: &[[u8; 32]],
    ) -> Result<(), EmbedError> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(db_err)?;
        let mut clock = meta(&tx, "clock").map_err(db_err)?;
        let mut entries = meta(&tx, "entries").map_err(db_err)?;
        {
            let mut upd = tx
                .prepare_cached(
                    "UPDATE embedding_cache SET used = ?3 WHERE model_id = ?1 AND text_sha256 = ?2",
                )
                .map_err(db_err)?;
            for k in touch {
                clock += 1;
                upd.execute(params![model, k, clock]).map_err(db_err)?;
            }
            let mut ins = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO embedding_cache (model_id, text_sha256, embedding, used)
                     VALUES (?1, ?2, ?3, ?4)",
                )
                .map_err(db_err)?;
            let mut replace = tx
                .prepare_cached(
                    "UPDATE embedding_cache SET embedding = ?3, used = ?4
                     WHERE model_id = ?1 AND text_sha256 = ?2",
                )
                .map_err(db_err)?;
            for (text, v) in fresh {
                clock += 1;
                let blob: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                let k = key(text);
                if ins
                    .execute(params![model, k, blob, clock])
                    .map_err(db_err)?
                    == 1
                {
                    entries += 1;
                } else {
                    replace
                        .execute(params![model, k, blob, clock])
                        .map_err(db_err)?;
                }
            }
        }
        set_meta(&tx, "clock", clock).map_err(db_err)?;
        set_meta(&tx, "entries", entries).map_err(db_err)?;
        evict(&tx, self.capacity).map_err(db_err)?;
        tx.commit().map_err(db_err)
    }
}

fn key(text: &str) -> [u8; 32] {
    text_key(text)
}

/// The key a [`CachedEmbedder`] keeps a text's vector under (with the model's id): the
/// sha256 of its UTF-8 bytes. See [`CachedEmbedder::retain_keys`].
pub fn text_key(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

impl Embedder for CachedEmbedder {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }

    fn dim(&self) -> usize {
        self.inner.dim()
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_storing(texts, true)
    }
}

impl CachedEmbedder {
    /// Embeds `texts` from the cache where it holds them and with the model where it does
    /// not, without storing anything (no new entry, no stamp refreshed): for texts that are
    /// not memories (the sentences a summarizer weighs), which a cache purged by memory
    /// would otherwise keep after the memories are forgotten.
    pub fn embed_unstored(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_storing(texts, false)
    }

    /// An embedder that answers through [`Self::embed_unstored`].
    pub fn unstored(self: &Arc<Self>) -> Arc<dyn Embedder> {
        Arc::new(Unstored(Arc::clone(self)))
    }

    fn embed_storing(&self, texts: &[&str], keep: bool) -> Result<Vec<Vec<f32>>, EmbedError> {
        let model = self.inner.model_id().to_owned();
        let dim = self.inner.dim();
        let mut out: Vec<Option<Vec<f32>>> = vec![None; texts.len()];
        // Hits whose stamps fell into the older half: refreshed so they are not evicted.
        let mut touch: Vec<[u8; 32]> = Vec::new();
        {
            let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
            let clock = meta(&conn, "clock").map_err(db_err)?;
            let young = clock - to_i64(self.capacity / 2);
            let mut stmt = conn
                .prepare_cached(
                    "SELECT embedding, used FROM embedding_cache WHERE model_id = ?1 AND text_sha256 = ?2",
                )
                .map_err(db_err)?;
            for (slot, text) in out.iter_mut().zip(texts) {
                let k = key(text);
                let row: Option<(Vec<u8>, i64)> = stmt
                    .query_row(params![model, k], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
                    .map_err(db_err)?;
                if let Some((b, used)) = row.filter(|(b, _)| b.len() == dim * 4) {
                    *slot = Some(
                        b.chunks_exact(4)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect(),
                    );
                    if used <= young && !touch.contains(&k) {
                        touch.push(k);
                    }
                }
            }
        }
        let missing: Vec<usize> = (0..texts.len()).filter(|i| out[*i].is_none()).collect();
        // Repeats inside one call go to the model once.
        let mut unique: Vec<&str> = Vec::new();
        let mut which: Vec<usize> = Vec::with_capacity(missing.len());
        for i in &missing {
            match unique.iter().position(|u| *u == texts[*i]) {
                Some(p) => which.push(p),
                None => {
                    which.push(unique.len());
                    unique.push(texts[*i]);
                }
            }
        }
        // Counted for what the cache keeps (the unstored path's texts are never in it).
        if keep {
            self.hits
                .fetch_add((texts.len() - unique.len()) as u64, Ordering::Relaxed);
            self.misses
                .fetch_add(unique.len() as u64, Ordering::Relaxed);
        }
        let fresh = if unique.is_empty() {
            Vec::new()
        } else {
            self.inner.embed_checked(&unique)?
        };
        if keep && (!fresh.is_empty() || !touch.is_empty()) {
            let pairs: Vec<(&str, &[f32])> = unique
                .iter()
                .copied()
                .zip(fresh.iter().map(Vec::as_slice))
                .collect();
            // The cache only saves work: a write it cannot make (a full disk) is logged and
            // the vectors are still returned.
            if let Err(e) = self.store(&model, &pairs, &touch) {
                tracing::warn!(error = %e, "embedding cache write failed; vectors returned uncached");
            }
        }
        for (i, w) in missing.iter().zip(which) {
            out[*i] = fresh.get(w).cloned();
        }
        out.into_iter()
            .map(|v| v.ok_or_else(|| EmbedError::Inference("cache lost a vector".into())))
            .collect()
    }
}

/// [`CachedEmbedder::unstored`]'s embedder.
struct Unstored(Arc<CachedEmbedder>);

impl Embedder for Unstored {
    fn model_id(&self) -> &str {
        self.0.model_id()
    }

    fn dim(&self) -> usize {
        self.0.dim()
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.0.embed_unstored(texts)
    }
}
