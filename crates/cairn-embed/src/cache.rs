//! [`CachedEmbedder`]: embeds each distinct text once per model.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cairn_core::{EmbedError, Embedder};
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

/// Wraps an [`Embedder`] with a persistent cache: an SQLite table `embedding_cache` keyed by
/// (model id, sha256 of the text). Imports repeat lines and summaries get re-embedded; each
/// distinct text reaches the model once.
///
/// The table can live in the store's own database file (it is created if missing).
pub struct CachedEmbedder {
    inner: Arc<dyn Embedder>,
    conn: Mutex<Connection>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for CachedEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedEmbedder")
            .field("model", &self.inner.model_id())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

fn db_err(e: rusqlite::Error) -> EmbedError {
    EmbedError::Unavailable(format!("embedding cache: {e}"))
}

impl CachedEmbedder {
    /// Opens (or creates) the cache table in the SQLite file at `path`.
    pub fn open(inner: Arc<dyn Embedder>, path: impl AsRef<Path>) -> Result<Self, EmbedError> {
        let conn = Connection::open(path).map_err(db_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(db_err)?;
        // WAL is the store's mode too; setting it here keeps both connections compatible.
        let _: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(db_err)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(db_err)?;
        // One plan whatever the bound values: SQLite built with STAT4 would re-prepare the
        // look-up on every new key otherwise.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            true,
        )
        .map_err(db_err)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS embedding_cache (
                model_id TEXT NOT NULL,
                text_sha256 BLOB NOT NULL,
                embedding BLOB NOT NULL,
                PRIMARY KEY (model_id, text_sha256)
            ) WITHOUT ROWID",
        )
        .map_err(db_err)?;
        Ok(Self {
            inner,
            conn: Mutex::new(conn),
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

    /// The wrapped embedder.
    pub fn inner(&self) -> &Arc<dyn Embedder> {
        &self.inner
    }
}

fn key(text: &str) -> [u8; 32] {
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
        let model = self.inner.model_id().to_owned();
        let dim = self.inner.dim();
        let mut out: Vec<Option<Vec<f32>>> = vec![None; texts.len()];
        {
            let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
            let mut stmt = conn
                .prepare_cached(
                    "SELECT embedding FROM embedding_cache WHERE model_id = ?1 AND text_sha256 = ?2",
                )
                .map_err(db_err)?;
            for (slot, text) in out.iter_mut().zip(texts) {
                let blob: Option<Vec<u8>> = stmt
                    .query_row(params![model, key(text)], |r| r.get(0))
                    .optional()
                    .map_err(db_err)?;
                if let Some(b) = blob.filter(|b| b.len() == dim * 4) {
                    *slot = Some(
                        b.chunks_exact(4)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect(),
                    );
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
        self.hits
            .fetch_add((texts.len() - unique.len()) as u64, Ordering::Relaxed);
        self.misses
            .fetch_add(unique.len() as u64, Ordering::Relaxed);
        if !unique.is_empty() {
            let fresh = self.inner.embed_checked(&unique)?;
            {
                let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
                let tx = conn
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .map_err(db_err)?;
                {
                    let mut ins = tx
                        .prepare_cached(
                            "INSERT OR REPLACE INTO embedding_cache (model_id, text_sha256, embedding) VALUES (?1, ?2, ?3)",
                        )
                        .map_err(db_err)?;
                    for (text, v) in unique.iter().zip(&fresh) {
                        let blob: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                        ins.execute(params![model, key(text), blob])
                            .map_err(db_err)?;
                    }
                }
                tx.commit().map_err(db_err)?;
            }
            for (i, w) in missing.iter().zip(which) {
                out[*i] = Some(fresh[w].clone());
            }
        }
        out.into_iter()
            .map(|v| v.ok_or_else(|| EmbedError::Inference("cache lost a vector".into())))
            .collect()
    }
}
