//! Whole-store backups: a versioned JSONL file from which [`MemoryHarness::import_backup`]
//! rebuilds the store exactly (same ids, trees, links in order, levels, times, metadata,
//! stale flags).
//!
//! # Format, version 1
//!
//! Line 1 is a [`BackupHeader`]:
//! `{"cairn_backup":1,"model_id":"all-MiniLM-L6-v2-int8","dim":384,"embeddings":false,"memories":N,"exported_at":"…"}`.
//! Then exactly `N` lines, one [`BackupRecord`] each: the memory's fields (`id`, `kind`,
//! `thread_id`, `role`, `content`, `created_at`, `metadata`, `level`, and for a summary
//! `summary` with `summary_type`, `source_ids` in order, `time_range_start`,
//! `time_range_end`, `source_count`, `level`, `stale`), plus `embedding` (an array of
//! `dim` numbers) when the export asked for vectors. Memories come by level, so every
//! summary follows all of its sources. Times are RFC 3339 with their microseconds; numbers
//! in metadata and vectors round-trip exactly.
//!
//! # Import rules
//!
//! The whole file is read and checked before anything is written: the header and its
//! version, every line, no id twice, every source earlier in the file or already in the
//! store, and exactly `N` memories (a cut file is refused). A memory whose id is already in
//! the store is skipped when the stored memory is identical and refused
//! ([`BackupError::Conflict`], nothing written) when it differs; so importing into an empty
//! store restores it, importing the same backup twice adds nothing, and an import that was
//! interrupted is finished by running it again. Memories are then written in transactions of
//! 256. Vectors in the file are used when its model and dimension are the store's;
//! otherwise (or without vectors) the texts are embedded with the store's model.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use cairn_core::{MemoryId, MemoryUnit};

use crate::harness::blocking;
use crate::{HarnessError, MemoryHarness};

/// The backup format version this build writes and reads.
pub const BACKUP_VERSION: u32 = 1;

/// Memories per write transaction and per existence check on import.
const BATCH: usize = 256;

/// The first line of a backup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackupHeader {
    /// The format version ([`BACKUP_VERSION`]).
    pub cairn_backup: u32,
    /// The embedding model of the exported store.
    pub model_id: String,
    /// Its dimension.
    pub dim: usize,
    /// Whether each record carries its vector.
    pub embeddings: bool,
    /// How many memory lines follow.
    pub memories: usize,
    /// When the backup was written.
    pub exported_at: DateTime<Utc>,
}

/// One memory line of a backup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackupRecord {
    /// The memory, whole.
    #[serde(flatten)]
    pub memory: MemoryUnit,
    /// Its stored vector, when the backup carries vectors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding: Option<Vec<f32>>,
}

/// What an import did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupImport {
    /// Memories written.
    pub added: usize,
    /// Memories already in the store, identical, so skipped.
    pub skipped: usize,
    /// Memories whose vector was computed with the store's model (the file had none, or
    /// another model's).
    pub embedded: usize,
}

/// A backup that cannot be written or restored. Import errors found while checking the file
/// leave the store untouched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    /// The first line is not a backup header.
    #[error("not a Cairn backup (line 1 should be its header): {0}")]
    NotABackup(String),
    /// The backup was written by a newer format.
    #[error("backup format version {found} is newer than the {supported} this build reads; upgrade Cairn")]
    VersionTooNew {
        /// Version in the file.
        found: u32,
        /// Highest version this build reads.
        supported: u32,
    },
    /// A memory line is unreadable or inconsistent.
    #[error("line {line}: {message}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The file holds another number of memories than its header announces.
    #[error("the header announces {expected} memories but the file holds {found}; it is cut or damaged, nothing was imported")]
    Count {
        /// Memories announced.
        expected: usize,
        /// Memory lines found.
        found: usize,
    },
    /// The id is in the store with other content or links.
    #[error("line {line}: memory {id} is already in the store and differs from the backup; nothing was imported")]
    Conflict {
        /// 1-based line number.
        line: usize,
        /// The id.
        id: MemoryId,
    },
    /// The store refused a write, the model failed, or a task could not run.
    #[error(transparent)]
    Harness(#[from] HarnessError),
    /// Reading or writing the file failed.
    #[error("{}: {source}", path.as_deref().map_or_else(|| "backup".into(), |p| p.display().to_string()))]
    Io {
        /// The file, when there is one.
        path: Option<PathBuf>,
        /// The error.
        source: std::io::Error,
    },
}

impl From<cairn_store::StoreError> for BackupError {
    fn from(e: cairn_store::StoreError) -> Self {
        Self::Harness(e.into())
    }
}

fn io_at(path: &Path) -> impl Fn(std::io::Error) -> BackupError + '_ {
    move |source| BackupError::Io {
        path: Some(path.to_owned()),
        source,
    }
}

fn io(source: std::io::Error) -> BackupError {
    BackupError::Io { path: None, source }
}

impl MemoryHarness {
    /// Writes a backup of the whole store to `out` (see the module docs for the format),
    /// from one consistent snapshot, a page of rows at a time; returns the number of
    /// memories written. With `with_embeddings` every line carries its vector (about 4 KB a
    /// memory for MiniLM as JSON); without, an import embeds the texts again.
    pub async fn export_backup<W: Write + Send + 'static>(
        &self,
        out: W,
        with_embeddings: bool,
    ) -> Result<usize, BackupError> {
        let inner = self.inner.clone();
        blocking(move || {
            let out = std::cell::RefCell::new(std::io::BufWriter::new(out));
            let header = |memories: usize| BackupHeader {
                cairn_backup: BACKUP_VERSION,
                model_id: inner.store.model_id(),
                dim: inner.store.dimension(),
                embeddings: with_embeddings,
                memories,
                exported_at: inner.clock.now(),
            };
            // The backend's callbacks speak its error type: a failed write is kept here and
            // stops the read with a placeholder, then comes back as itself.
            let failed: std::cell::RefCell<Option<BackupError>> = std::cell::RefCell::new(None);
            let keep = |e: BackupError| {
                *failed.borrow_mut() = Some(e);
                cairn_store::StoreError::Backend {
                    backend: "backup",
                    message: "writing the backup failed".into(),
                }
            };
            let read = inner.store.backup_rows(
                with_embeddings,
                &mut |total| write_line(&mut *out.borrow_mut(), &header(total)).map_err(keep),
                &mut |memory, embedding| {
                    write_line(&mut *out.borrow_mut(), &BackupRecord { memory, embedding })
                        .map_err(keep)
                },
            );
            if let Some(e) = failed.into_inner() {
                return Err(e);
            }
            let n = read?;
            let mut out = out.into_inner();
            out.flush().map_err(io)?;
            Ok(n)
        })
        .await?
    }

    /// Restores a backup file into this store (see the module docs for the rules: checked
    /// whole before anything is written, identical memories skipped, differing ones
    /// refused).
    pub async fn import_backup(&self, path: impl AsRef<Path>) -> Result<BackupImport, BackupError> {
        let path = path.as_ref().to_owned();
        let inner = self.inner.clone();
        blocking(move || {
            let store = &inner.store;
            let model = store.model_id();
            let dim = store.dimension();
            // Pass 1: check everything, note the ids to skip.
            let mut lines = open_lines(&path)?;
            let header = read_header(&mut lines)?;
            let use_vectors = header.embeddings && header.model_id == model && header.dim == dim;
            let mut seen: HashSet<MemoryId> = HashSet::new();
            let mut skip: HashSet<MemoryId> = HashSet::new();
            let mut count = 0;
            // Each memory of the batch with its line and the sources it cites that are not
            // earlier in the file (they must be in the store).
            let mut batch: Vec<(usize, MemoryUnit, Vec<MemoryId>)> = Vec::with_capacity(BATCH);
            let check = |batch: &mut Vec<(usize, MemoryUnit, Vec<MemoryId>)>,
                         skip: &mut HashSet<MemoryId>|
             -> Result<(), BackupError> {
                let ids: Vec<MemoryId> = batch.iter().map(|(_, m, _)| m.id).collect();
                for s in store.get_found(&ids)? {
                    if let Some((line, m, _)) = batch.iter().find(|(_, m, _)| m.id == s.id) {
                        if *m != s {
                            return Err(BackupError::Conflict {
                                line: *line,
                                id: s.id,
                            });
                        }
                        skip.insert(s.id);
                    }
                }
                let outside: Vec<MemoryId> =
                    batch.iter().flat_map(|(_, _, o)| o.iter().copied()).collect();
                if !outside.is_empty() {
                    let there = store.existing(&outside)?;
                    for (line, m, o) in batch.iter() {
                        if let Some(src) = o.iter().find(|s| !there.contains(s)) {
                            return Err(BackupError::Line {
                                line: *line,
                                message: format!(
                                    "summary {} cites {src}, which is neither earlier in the backup nor in the store",
                                    m.id
                                ),
                            });
                        }
                    }
                }
                batch.clear();
                Ok(())
            };
            for item in records(&mut lines) {
                let (line, r) = item?;
                count += 1;
                let id = r.memory.id;
                match &r.embedding {
                    Some(v) if use_vectors && v.len() != dim => {
                        return Err(BackupError::Line {
                            line,
                            message: format!("the vector has {} numbers, not {dim}", v.len()),
                        });
                    }
                    None if use_vectors => {
                        return Err(BackupError::Line {
                            line,
                            message: "the header announces vectors but this memory has none"
                                .into(),
                        });
                    }
                    _ => {}
                }
                let outside: Vec<MemoryId> = r
                    .memory
                    .summary
                    .iter()
                    .flat_map(|s| s.source_ids.iter())
                    .filter(|s| !seen.contains(s))
                    .copied()
                    .collect();
                if !seen.insert(id) {
                    return Err(BackupError::Line {
                        line,
                        message: format!("memory {id} appears twice"),
                    });
                }
                batch.push((line, r.memory, outside));
                if batch.len() == BATCH {
                    check(&mut batch, &mut skip)?;
                }
            }
            check(&mut batch, &mut skip)?;
            if count != header.memories {
                return Err(BackupError::Count {
                    expected: header.memories,
                    found: count,
                });
            }

            // Pass 2: write what is not there yet.
            let mut report = BackupImport {
                skipped: skip.len(),
                ..BackupImport::default()
            };
            let mut lines = open_lines(&path)?;
            read_header(&mut lines)?;
            let mut pending: Vec<BackupRecord> = Vec::with_capacity(BATCH);
            let mut write = |pending: &mut Vec<BackupRecord>| -> Result<(), BackupError> {
                if pending.is_empty() {
                    return Ok(());
                }
                let need: Vec<&str> = pending
                    .iter()
                    .filter(|r| !use_vectors || r.embedding.is_none())
                    .map(|r| r.memory.content.as_str())
                    .collect();
                let mut fresh = if need.is_empty() {
                    Vec::new()
                } else {
                    inner
                        .embedder
                        .embed_checked(&need)
                        .map_err(HarnessError::from)?
                }
                .into_iter();
                report.embedded += need.len();
                let mut items = Vec::with_capacity(pending.len());
                for r in pending.drain(..) {
                    let v = match r.embedding.filter(|_| use_vectors) {
                        Some(v) => v,
                        None => fresh.next().ok_or_else(|| {
                            HarnessError::Config("the embedder returned too few vectors".into())
                        })?,
                    };
                    items.push((r.memory, v));
                }
                report.added += store.restore(items)?.len();
                Ok(())
            };
            for item in records(&mut lines) {
                let (_, r) = item?;
                if skip.contains(&r.memory.id) {
                    continue;
                }
                pending.push(r);
                if pending.len() == BATCH {
                    write(&mut pending)?;
                }
            }
            write(&mut pending)?;
            Ok(report)
        })
        .await?
    }
}

type Lines = std::iter::Enumerate<std::io::Lines<BufReader<std::fs::File>>>;

fn open_lines(path: &Path) -> Result<Lines, BackupError> {
    let f = std::fs::File::open(path).map_err(io_at(path))?;
    Ok(BufReader::new(f).lines().enumerate())
}

/// Whether `line` is a backup header (how `cairn import` tells a backup from JSONL).
pub fn is_backup_header(line: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| v.get("cairn_backup").is_some())
}

fn read_header(lines: &mut Lines) -> Result<BackupHeader, BackupError> {
    let first = match lines.next() {
        Some((_, l)) => l.map_err(io)?,
        None => return Err(BackupError::NotABackup("the file is empty".into())),
    };
    let v: serde_json::Value =
        serde_json::from_str(&first).map_err(|e| BackupError::NotABackup(e.to_string()))?;
    let version = v
        .get("cairn_backup")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| BackupError::NotABackup("no \"cairn_backup\" version".into()))?;
    let version = u32::try_from(version).unwrap_or(u32::MAX);
    if version > BACKUP_VERSION {
        return Err(BackupError::VersionTooNew {
            found: version,
            supported: BACKUP_VERSION,
        });
    }
    serde_json::from_value(v).map_err(|e| BackupError::NotABackup(e.to_string()))
}

/// The memory lines after the header, with 1-based line numbers; blank lines are skipped.
fn records(
    lines: &mut Lines,
) -> impl Iterator<Item = Result<(usize, BackupRecord), BackupError>> + '_ {
    lines.filter_map(|(i, l)| {
        let line = i + 1;
        match l {
            Err(e) => Some(Err(io(e))),
            Ok(l) if l.trim().is_empty() => None,
            Ok(l) => Some(
                serde_json::from_str::<BackupRecord>(&l)
                    .map(|r| (line, r))
                    .map_err(|e| BackupError::Line {
                        line,
                        message: e.to_string(),
                    }),
            ),
        }
    })
}

/// Writes `v` as one JSON line.
fn write_line<T: Serialize>(out: &mut impl Write, v: &T) -> Result<(), BackupError> {
    serde_json::to_writer(&mut *out, v).map_err(|e| io(e.into()))?;
    out.write_all(b"\n").map_err(io)
}
