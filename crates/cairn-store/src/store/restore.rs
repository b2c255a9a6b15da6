//! Whole-store backup reads and exact restores at the row level (the backup file format
//! itself lives in the harness, which also embeds what a backup holds no vector for).

use super::{begin_vectors, check_thread, index_committed, insert_row, source_facts, Store};
use crate::rows::{decode_vector, query_units_with};
use crate::{Result, StoreError};

use std::collections::HashSet;

use cairn_core::{normalized, validate_vector, MemoryUnit};
use rusqlite::params;
use rusqlite::types::Value;

/// Rows read per query while a backup streams.
const PAGE: usize = 256;

impl Store {
    /// Reads every memory for a backup inside one read transaction (a consistent snapshot
    /// while others keep writing), `PAGE` rows at a time, never the whole store at once.
    ///
    /// `on_start` gets the number of memories first; `on_row` then gets each memory whole
    /// (summaries with their sources in order, level, time range, stale flag) and, when
    /// `with_embeddings`, its stored vector. The order is by level, then by insertion, so
    /// every summary comes after all of its sources (a summary's level is above each
    /// source's). Returns the number of memories; an error from a callback stops the read
    /// and is returned.
    pub fn backup_rows<E: From<StoreError>>(
        &self,
        with_embeddings: bool,
        on_start: impl FnOnce(usize) -> Result<(), E>,
        mut on_row: impl FnMut(MemoryUnit, Option<Vec<f32>>) -> Result<(), E>,
    ) -> Result<usize, E> {
        let outcome = self.read(|c| {
            let tx = c.unchecked_transaction()?;
            let run = || -> Result<usize, E> {
                let (total, max_level): (i64, Option<i64>) = tx
                    .query_row("SELECT count(*), MAX(level) FROM memories", [], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .map_err(StoreError::from)?;
                on_start(usize::try_from(total).unwrap_or(0))?;
                let mut sent = 0;
                let mut emb = tx
                    .prepare_cached("SELECT embedding FROM memories WHERE rid = ?1")
                    .map_err(StoreError::from)?;
                for level in 0..=max_level.unwrap_or(-1) {
                    let mut after = 0_i64;
                    loop {
                        let page = query_units_with(
                            &tx,
                            ", m.rid",
                            "WHERE m.level = ? AND m.rid > ? ORDER BY m.rid LIMIT ?",
                            &[
                                Value::Integer(level),
                                Value::Integer(after),
                                Value::Integer(i64::try_from(PAGE).unwrap_or(i64::MAX)),
                            ],
                        )?;
                        let n = page.len();
                        for (unit, rid) in page {
                            after = rid;
                            let v = if with_embeddings {
                                let blob: Vec<u8> = emb
                                    .query_row(params![rid], |r| r.get(0))
                                    .map_err(StoreError::from)?;
                                Some(decode_vector(&blob))
                            } else {
                                None
                            };
                            on_row(unit, v)?;
                            sent += 1;
                        }
                        if n < PAGE {
                            break;
                        }
                    }
                }
                Ok(sent)
            };
            let out = run();
            tx.finish()?;
            Ok(out)
        });
        match outcome {
            Ok(out) => out,
            Err(e) => Err(e.into()),
        }
    }

    /// Writes memories exactly as a backup holds them, in one transaction: all or none.
    ///
    /// Ids, kinds, threads, roles, texts, times and metadata are kept; a summary keeps its
    /// sources in order, its time range, its stale flag and its level, and may have no
    /// sources left (all of them detached). Checked before anything is written: text and
    /// metadata as for any insert; a raw memory has level 0 and no summary facts; a summary
    /// has kind `summary`, level at least 1, and with sources exactly 1 + their highest
    /// level (`InputError::OutOfRange` otherwise); sources exist (in the store or earlier in
    /// `items`: `NotFound`), are not repeated (`DuplicateSource`) and are not the summary
    /// (`SelfReference`); threads as for [`Store::add_summary`] (`ThreadMismatch`); an id
    /// already stored is `DuplicateId`.
    pub fn restore(&self, items: Vec<(MemoryUnit, Vec<f32>)>) -> Result<Vec<MemoryUnit>> {
        let mut prepared = Vec::with_capacity(items.len());
        let mut seen = HashSet::new();
        for (u, v) in items {
            crate::backend::check_restored(&u)?;
            if !seen.insert(u.id) {
                return Err(StoreError::DuplicateId { id: u.id });
            }
            validate_vector(&v, self.inner.shared.options.dim)?;
            // A stored vector is unit length already: kept bit for bit (normalizing it again
            // can move the last bit); anything else is normalized as on insert.
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            let v = if (norm - 1.0).abs() <= 1e-4 {
                v
            } else {
                normalized(v)?
            };
            prepared.push((u, v));
        }
        self.write(move |conn, shared| {
            let tx = begin_vectors(conn, shared)?;
            let mut vids = Vec::with_capacity(prepared.len());
            for (unit, v) in &mut prepared {
                let mut sources = Vec::new();
                if let Some(s) = unit.summary.as_mut() {
                    let thread = unit.thread_id.as_ref().map(cairn_core::ThreadId::as_str);
                    for sid in &s.source_ids {
                        let facts = source_facts(&tx, *sid)?;
                        check_thread(&tx, thread, *sid, &facts)?;
                        sources.push(facts);
                    }
                    let levels: Vec<u32> = sources.iter().map(|f| f.level).collect();
                    crate::backend::check_restored_level(
                        unit.level,
                        s.continues.is_some(),
                        &levels,
                    )?;
                    s.source_count = sources.len();
                }
                let (vid, rid) = insert_row(&tx, shared, unit, v)?;
                if let Some(s) = &unit.summary {
                    tx.prepare_cached("UPDATE memories SET stale = ?2 WHERE rid = ?1")?
                        .execute(params![rid, s.stale])?;
                    let mut link = tx.prepare_cached(
                        "INSERT INTO summary_sources (summary, source, position, continues)
                         VALUES (?1, ?2, ?3, ?4)",
                    )?;
                    for (pos, f) in sources.iter().enumerate() {
                        let continues = pos == 0 && s.continues.is_some();
                        link.execute(params![
                            rid,
                            f.rid,
                            i64::try_from(pos).unwrap_or(i64::MAX),
                            continues
                        ])?;
                    }
                }
                vids.push(vid);
            }
            tx.commit()?;
            index_committed(conn, shared, &prepared, &vids);
            Ok(prepared.into_iter().map(|(u, _)| u).collect())
        })
    }
}
