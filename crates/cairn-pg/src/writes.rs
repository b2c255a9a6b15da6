//! The writes the harness builds on, in PostgreSQL, with the semantics of the SQLite
//! store's methods of the same names: content rewrites and summary refreshes, metadata
//! replacement, summary growth and late sources, continuations (moving summaries) with
//! their thread state, whole-store backup reads and exact restores, and index upkeep.
//!
//! Every write is one transaction: an error leaves nothing written.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use pgvector::Vector;
use tokio_postgres::IsolationLevel;

use cairn_core::{
    check_metadata, normalized, validate_vector, Lifetime, MemoryId, MemoryKind, MemoryUnit,
    Metadata, NewMemory, SummaryInfo, ThreadId,
};
use cairn_store::backend::{
    check_link_thread, check_restored, check_restored_level, check_summary, summary_level,
    to_stored_time, SourceLink,
};
use cairn_store::{NewSummary, Result, StoreError, ThreadState};

use crate::sql::COLS;
use crate::{
    ancestor_rids, get_unit, is_unique_violation, pg, refresh_summaries, rid_checked, summary_rid,
    units, Cached, PgStore,
};

/// Rows read per query while a backup streams.
const PAGE: i64 = 256;

/// What a write reads about a memory it links to.
struct Facts {
    rid: i64,
    level: u32,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    thread: Option<String>,
}

/// The link facts of memory `id` (`NotFound` when it is not stored).
async fn source_facts<C: GenericClient + Sync>(c: &C, id: MemoryId) -> Result<Facts> {
    let row = c
        .row_opt(
            "SELECT rid, level, COALESCE(time_start, created_at), COALESCE(time_end, created_at),
                    thread_id
             FROM memories WHERE id = $1",
            &[&id.uuid()],
        )
        .await
        .map_err(pg)?
        .ok_or(StoreError::NotFound { id })?;
    Ok(Facts {
        rid: row.get(0),
        level: u32::try_from(row.get::<_, i32>(1)).unwrap_or(0),
        start: row.get(2),
        end: row.get(3),
        thread: row.get(4),
    })
}

/// The thread rule of a link from a summary of `summary_thread` to `source`, through every
/// level below a thread-less source summary (as [`crate::PgStore`]'s `add_summary`).
async fn check_thread<C: GenericClient + Sync>(
    c: &C,
    summary_thread: Option<&str>,
    source: MemoryId,
    facts: &Facts,
) -> Result<()> {
    let link = SourceLink {
        id: source,
        level: facts.level,
        thread: facts.thread.clone(),
        continues: false,
    };
    let (true, Some(t)) = (check_link_thread(summary_thread, &link)?, summary_thread) else {
        return Ok(());
    };
    let below = c
        .row_opt(
            "WITH RECURSIVE down(r) AS (
                SELECT source FROM summary_sources WHERE summary = $1
                UNION SELECT l.source FROM summary_sources l JOIN down ON l.summary = down.r)
             SELECT m.id, m.thread_id FROM memories m
              WHERE m.rid IN (SELECT r FROM down)
                AND m.thread_id IS NOT NULL AND m.thread_id <> $2 LIMIT 1",
            &[&facts.rid, &t],
        )
        .await
        .map_err(pg)?;
    match below {
        Some(b) => Err(StoreError::ThreadMismatch {
            id: MemoryId::from_uuid(b.get::<_, uuid::Uuid>(0)),
            source_thread: b.get(1),
            summary_thread: t.to_owned(),
        }),
        None => Ok(()),
    }
}

/// The thread of the memory at `rid`.
async fn thread_of<C: GenericClient + Sync>(c: &C, rid: i64) -> Result<Option<String>> {
    Ok(
        c.row_one("SELECT thread_id FROM memories WHERE rid = $1", &[&rid])
            .await
            .map_err(pg)?
            .get(0),
    )
}

/// Marks the summaries at `rids` stale.
async fn mark_stale<C: GenericClient + Sync>(c: &C, rids: &[i64]) -> Result<()> {
    if !rids.is_empty() {
        c.exec(
            "UPDATE memories SET stale = TRUE WHERE rid = ANY($1)",
            &[&rids],
        )
        .await
        .map_err(pg)?;
    }
    Ok(())
}

/// Recomputes level, time range and source count of the summaries at `rids`, lowest level
/// first (so a summary's time range sees its sources' new ranges in one pass).
async fn refresh_in_order<C: GenericClient + Sync>(c: &C, rids: &[i64]) -> Result<()> {
    let ordered: Vec<i64> = c
        .rows(
            "SELECT rid FROM memories WHERE rid = ANY($1) ORDER BY level, rid",
            &[&rids],
        )
        .await
        .map_err(pg)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    refresh_summaries(c, &ordered).await
}

/// Writes (or replaces) a thread-state value.
async fn put_state<C: GenericClient + Sync>(c: &C, s: &ThreadState) -> Result<()> {
    c.exec(
        "INSERT INTO thread_state (thread_id, name, value) VALUES ($1, $2, $3)
         ON CONFLICT (thread_id, name) DO UPDATE SET value = EXCLUDED.value",
        &[&s.thread.as_str(), &s.name, &s.value],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

fn i32_of(n: impl TryInto<i32>) -> i32 {
    n.try_into().unwrap_or(i32::MAX)
}

impl PgStore {
    /// `update` (`refresh` false) and `refresh_summary` (`refresh` true): new content,
    /// metadata when given, embedding; every summary above marked stale; a refreshed
    /// summary loses its stale flag and gets its level, span and source count recomputed.
    pub(crate) fn rewrite(
        &self,
        id: MemoryId,
        content: String,
        metadata: Option<Metadata>,
        embedding: Vec<f32>,
        refresh: bool,
    ) -> Result<MemoryUnit> {
        NewMemory::new(MemoryKind::Knowledge, content.clone()).validate()?;
        if let Some(m) = &metadata {
            check_metadata(m)?;
        }
        let v = self.prepare_vector(embedding)?;
        let model = self.options.model_id.clone();
        self.block(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            let rid = rid_checked(&tx, id, refresh, true).await?;
            let meta = metadata.map(serde_json::Value::Object);
            tx.exec(
                "UPDATE memories SET content = $2, embedding = $3,
                    metadata = COALESCE($4::jsonb, metadata), model_id = $5
                 WHERE rid = $1",
                &[&rid, &content, &v, &meta, &model],
            )
            .await
            .map_err(pg)?;
            if refresh {
                tx.exec("UPDATE memories SET stale = FALSE WHERE rid = $1", &[&rid])
                    .await
                    .map_err(pg)?;
                refresh_summaries(&tx, &[rid]).await?;
            }
            let above = ancestor_rids(&tx, rid).await?;
            mark_stale(&tx, &above).await?;
            let unit = get_unit(&tx, id).await?;
            tx.commit().await.map_err(pg)?;
            Ok(unit)
        })
    }

    /// Replaces a memory's metadata whole (checked as a patch's result is).
    pub(crate) fn replace_metadata(&self, id: MemoryId, metadata: Metadata) -> Result<MemoryUnit> {
        check_metadata(&metadata)?;
        self.block(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            let n = tx
                .exec(
                    "UPDATE memories SET metadata = $2 WHERE id = $1",
                    &[&id.uuid(), &serde_json::Value::Object(metadata)],
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

    /// Appends `sources` to a summary (after its last link), refusing cycles; the level
    /// and span of it and of every summary above are updated, those above marked stale.
    pub(crate) fn extend(&self, summary: MemoryId, sources: Vec<MemoryId>) -> Result<MemoryUnit> {
        if sources.is_empty() {
            return Err(StoreError::EmptySources);
        }
        self.block(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            // Locked: two growths of one summary would take the same positions.
            let rid = rid_checked(&tx, summary, true, true).await?;
            let summary_thread = thread_of(&tx, rid).await?;
            let ancestors = ancestor_rids(&tx, rid).await?;
            let above: HashSet<i64> = ancestors.iter().copied().collect();
            let first: i32 = tx
                .row_one(
                    "SELECT COALESCE(MAX(position), -1) + 1 FROM summary_sources WHERE summary = $1",
                    &[&rid],
                )
                .await
                .map_err(pg)?
                .get(0);
            let mut seen = HashSet::new();
            for (next, sid) in (first..).zip(&sources) {
                if *sid == summary {
                    return Err(StoreError::SelfReference { id: summary });
                }
                if !seen.insert(*sid) {
                    return Err(StoreError::DuplicateSource { id: *sid });
                }
                let facts = source_facts(&tx, *sid).await?;
                check_thread(&tx, summary_thread.as_deref(), *sid, &facts).await?;
                if above.contains(&facts.rid) {
                    return Err(StoreError::Cycle {
                        summary,
                        ancestor: *sid,
                    });
                }
                let exists: bool = tx
                    .row_one(
                        "SELECT EXISTS (SELECT 1 FROM summary_sources
                                        WHERE summary = $1 AND source = $2)",
                        &[&rid, &facts.rid],
                    )
                    .await
                    .map_err(pg)?
                    .get(0);
                if exists {
                    return Err(StoreError::DuplicateSource { id: *sid });
                }
                tx.exec(
                    "INSERT INTO summary_sources (summary, source, position, continues)
                     VALUES ($1, $2, $3, false)",
                    &[&rid, &facts.rid, &next],
                )
                .await
                .map_err(pg)?;
            }
            // The summaries above no longer cover everything under them.
            mark_stale(&tx, &ancestors).await?;
            let mut changed = vec![rid];
            changed.extend(ancestors);
            refresh_in_order(&tx, &changed).await?;
            let unit = get_unit(&tx, summary).await?;
            tx.commit().await.map_err(pg)?;
            Ok(unit)
        })
    }

    /// Adds `source` to `summary` after every source at or before its time (the order of
    /// the others kept); the summary and every summary above are marked stale and get
    /// their level and span recomputed.
    pub(crate) fn place(&self, summary: MemoryId, source: MemoryId) -> Result<MemoryUnit> {
        self.block(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            let rid = summary_rid(&tx, summary).await?;
            tx.exec("SELECT 1 FROM memories WHERE rid = $1 FOR UPDATE", &[&rid])
                .await
                .map_err(pg)?;
            let summary_thread = thread_of(&tx, rid).await?;
            if source == summary {
                return Err(StoreError::SelfReference { id: summary });
            }
            let facts = source_facts(&tx, source).await?;
            check_thread(&tx, summary_thread.as_deref(), source, &facts).await?;
            let ancestors = ancestor_rids(&tx, rid).await?;
            if ancestors.contains(&facts.rid) {
                return Err(StoreError::Cycle {
                    summary,
                    ancestor: source,
                });
            }
            // (source rid, continues, time) of every link in order, the new one included.
            let mut links: Vec<(i64, bool, DateTime<Utc>)> = tx
                .rows(
                    "SELECT l.source, l.continues, m.created_at FROM summary_sources l
                     JOIN memories m ON m.rid = l.source WHERE l.summary = $1
                     ORDER BY l.position",
                    &[&rid],
                )
                .await
                .map_err(pg)?
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect();
            if links.iter().any(|l| l.0 == facts.rid) {
                return Err(StoreError::DuplicateSource { id: source });
            }
            let created: DateTime<Utc> = tx
                .row_one(
                    "SELECT created_at FROM memories WHERE rid = $1",
                    &[&facts.rid],
                )
                .await
                .map_err(pg)?
                .get(0);
            let at = links
                .iter()
                .rposition(|l| l.2 <= created)
                .map_or(0, |i| i + 1);
            links.insert(at, (facts.rid, false, created));
            tx.exec("DELETE FROM summary_sources WHERE summary = $1", &[&rid])
                .await
                .map_err(pg)?;
            let srcs: Vec<i64> = links.iter().map(|l| l.0).collect();
            let conts: Vec<bool> = links.iter().map(|l| l.1).collect();
            tx.exec(
                "INSERT INTO summary_sources (summary, source, position, continues)
                 SELECT $1, s, (n - 1)::int, c FROM unnest($2::bigint[], $3::bool[])
                        WITH ORDINALITY AS x (s, c, n)",
                &[&rid, &srcs, &conts],
            )
            .await
            .map_err(pg)?;
            let mut changed = vec![rid];
            changed.extend(ancestors);
            mark_stale(&tx, &changed).await?;
            refresh_in_order(&tx, &changed).await?;
            let unit = get_unit(&tx, summary).await?;
            tx.commit().await.map_err(pg)?;
            Ok(unit)
        })
    }

    /// A summary of `summary.source_ids` continuing `previous` (linked first, with a
    /// continuation link that does not raise the level), and `state`, in one transaction;
    /// without `previous` and `state`, `add_summary`.
    pub(crate) fn continuation(
        &self,
        summary: NewSummary,
        previous: Option<MemoryId>,
        state: Option<ThreadState>,
        embedding: Vec<f32>,
    ) -> Result<MemoryUnit> {
        if let Some(s) = &state {
            s.validate()?;
        }
        let id = check_summary(&summary, previous)?;
        let v = self.prepare_vector(embedding)?;
        let created = to_stored_time(summary.created_at.unwrap_or_else(|| self.now()));
        let model = self.options.model_id.clone();
        self.block(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            let thread = summary.thread_id.as_ref().map(ThreadId::as_str);
            let mut facts = Vec::with_capacity(summary.source_ids.len() + 1);
            let mut links = Vec::with_capacity(summary.source_ids.len() + 1);
            for (sid, continues) in previous
                .iter()
                .map(|p| (*p, true))
                .chain(summary.source_ids.iter().map(|s| (*s, false)))
            {
                if continues {
                    summary_rid(&tx, sid).await?;
                }
                let f = source_facts(&tx, sid).await?;
                check_thread(&tx, thread, sid, &f).await?;
                links.push(SourceLink {
                    id: sid,
                    level: f.level,
                    thread: f.thread.clone(),
                    continues,
                });
                facts.push(f);
            }
            let level = summary_level(&links);
            let start = facts.iter().map(|f| f.start).min().unwrap_or(created);
            let end = facts.iter().map(|f| f.end).max().unwrap_or(created);
            let unit = MemoryUnit {
                id,
                kind: MemoryKind::Summary,
                thread_id: summary.thread_id.clone(),
                role: None,
                content: summary.content.clone(),
                created_at: created,
                metadata: summary.metadata.clone(),
                level,
                summary: Some(SummaryInfo {
                    summary_type: summary.summary_type,
                    source_ids: links.iter().map(|l| l.id).collect(),
                    time_range_start: start,
                    time_range_end: end,
                    source_count: links.len(),
                    level,
                    stale: false,
                    continues: previous,
                }),
                lifetime: Lifetime::default(),
            };
            let row = tx
                .row_opt(
                    "INSERT INTO memories (id, kind, thread_id, role, content, created_at,
                        metadata, level, summary_type, time_start, time_end, source_count,
                        model_id, embedding)
                     VALUES ($1, 'summary', $2, NULL, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
                     ON CONFLICT (id) DO NOTHING RETURNING rid",
                    &[
                        &id.uuid(),
                        &thread,
                        &unit.content,
                        &created,
                        &serde_json::Value::Object(unit.metadata.clone()),
                        &i32_of(level),
                        &summary.summary_type.as_str(),
                        &start,
                        &end,
                        &i32_of(links.len()),
                        &model,
                        &v,
                    ],
                )
                .await
                .map_err(pg)?;
            // ON CONFLICT DO NOTHING returns no row: the id is taken.
            let rid: i64 = row.ok_or(StoreError::DuplicateId { id })?.get(0);
            for (pos, (f, l)) in facts.iter().zip(&links).enumerate() {
                tx.exec(
                    "INSERT INTO summary_sources (summary, source, position, continues)
                     VALUES ($1, $2, $3, $4)",
                    &[&rid, &f.rid, &i32_of(pos), &l.continues],
                )
                .await
                .map_err(pg)?;
            }
            if let Some(st) = &state {
                put_state(&tx, st).await?;
            }
            tx.commit().await.map_err(pg)?;
            Ok(unit)
        })
    }

    /// Removes every thread-state value of `thread`.
    pub(crate) fn clear_state(&self, thread: &ThreadId) -> Result<()> {
        let t = thread.as_str().to_owned();
        self.block(move |c| async move {
            c.exec("DELETE FROM thread_state WHERE thread_id = $1", &[&t])
                .await
                .map_err(pg)?;
            Ok(())
        })
    }

    /// Every memory, by level then insertion, inside one repeatable-read transaction (a
    /// consistent snapshot while others write), [`PAGE`] rows at a time.
    pub(crate) fn backup(
        &self,
        with_embeddings: bool,
        on_start: &mut dyn FnMut(usize) -> Result<()>,
        on_row: &mut dyn FnMut(MemoryUnit, Option<Vec<f32>>) -> Result<()>,
    ) -> Result<usize> {
        self.block(move |mut c| async move {
            let tx = c
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(pg)?;
            let row = tx
                .row_one("SELECT count(*), MAX(level) FROM memories", &[])
                .await
                .map_err(pg)?;
            let (total, max_level): (i64, Option<i32>) = (row.get(0), row.get(1));
            on_start(usize::try_from(total).unwrap_or(0))?;
            let text = if with_embeddings {
                format!(
                    "SELECT {COLS}, m.embedding AS vector FROM memories m
                     WHERE m.level = $1 AND m.rid > $2 ORDER BY m.rid LIMIT $3"
                )
            } else {
                format!(
                    "SELECT {COLS} FROM memories m
                     WHERE m.level = $1 AND m.rid > $2 ORDER BY m.rid LIMIT $3"
                )
            };
            let mut sent = 0;
            for level in 0..=max_level.unwrap_or(-1) {
                let mut after = 0_i64;
                loop {
                    let rows = tx.rows(&text, &[&level, &after, &PAGE]).await.map_err(pg)?;
                    let Some(last) = rows.last() else { break };
                    after = last.get(0);
                    let vectors: Vec<Option<Vec<f32>>> = rows
                        .iter()
                        .map(|r| with_embeddings.then(|| r.get::<_, Vector>("vector").to_vec()))
                        .collect();
                    let n = rows.len();
                    for (unit, v) in units(&tx, &rows).await?.into_iter().zip(vectors) {
                        on_row(unit, v)?;
                        sent += 1;
                    }
                    if i64::try_from(n).unwrap_or(i64::MAX) < PAGE {
                        break;
                    }
                }
            }
            tx.commit().await.map_err(pg)?;
            Ok(sent)
        })
    }

    /// Writes memories as a backup holds them, in one transaction, with the checks of
    /// `cairn_store::Store::restore`.
    pub(crate) fn restore_rows(
        &self,
        items: Vec<(MemoryUnit, Vec<f32>)>,
    ) -> Result<Vec<MemoryUnit>> {
        let mut prepared = Vec::with_capacity(items.len());
        let mut seen = HashSet::new();
        for (u, v) in items {
            check_restored(&u)?;
            if !seen.insert(u.id) {
                return Err(StoreError::DuplicateId { id: u.id });
            }
            validate_vector(&v, self.options.dim)?;
            // A stored vector is unit length already: kept as it is; anything else is
            // normalized as on insert.
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            let v = if (norm - 1.0).abs() <= 1e-4 {
                v
            } else {
                normalized(v)?
            };
            prepared.push((u, v));
        }
        let model = self.options.model_id.clone();
        self.block(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            let mut out = Vec::with_capacity(prepared.len());
            for (mut unit, v) in prepared {
                let thread = unit
                    .thread_id
                    .as_ref()
                    .map(ThreadId::as_str)
                    .map(str::to_owned);
                let mut sources = Vec::new();
                if let Some(s) = unit.summary.as_mut() {
                    let mut levels = Vec::with_capacity(s.source_ids.len());
                    for sid in &s.source_ids {
                        let f = source_facts(&tx, *sid).await?;
                        check_thread(&tx, thread.as_deref(), *sid, &f).await?;
                        levels.push(f.level);
                        sources.push(f.rid);
                    }
                    check_restored_level(unit.level, s.continues.is_some(), &levels)?;
                    s.source_count = sources.len();
                }
                restore_one(&tx, &unit, &sources, v, &model).await?;
                out.push(unit);
            }
            tx.commit().await.map_err(pg)?;
            Ok(out)
        })
    }

    /// Rebuilds the HNSW index from the stored vectors (`REINDEX INDEX`).
    pub(crate) fn rebuild_index(&self) -> Result<()> {
        let schema = self.options.schema.clone();
        let mb = self.options.index_build_memory_mb;
        self.block(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            crate::sql::set_build_memory(&tx, mb).await?;
            tx.batch_execute(&format!("REINDEX INDEX {schema}.memories_embedding"))
                .await
                .map_err(pg)?;
            tx.commit().await.map_err(pg)
        })
    }

    /// Drops the HNSW index (a bulk load builds it again after).
    pub(crate) fn drop_vector_index(&self) -> Result<()> {
        let schema = self.options.schema.clone();
        self.block(move |c| async move {
            c.batch_execute(&format!("DROP INDEX IF EXISTS {schema}.memories_embedding"))
                .await
                .map_err(pg)
        })
    }

    /// Builds the HNSW index when it is missing.
    pub(crate) fn build_vector_index(&self) -> Result<()> {
        let options = self.options.clone();
        self.block(move |mut c| async move {
            let tx = c.transaction().await.map_err(pg)?;
            crate::sql::ensure_vector_index(&tx, &options).await?;
            tx.commit().await.map_err(pg)
        })
    }
}

/// Inserts one restored memory as it was (its summary facts and links in order).
async fn restore_one<C: GenericClient + Sync>(
    c: &C,
    u: &MemoryUnit,
    sources: &[i64],
    v: Vec<f32>,
    model: &str,
) -> Result<()> {
    let s = u.summary.as_ref();
    let stored = |t: Option<DateTime<Utc>>| t.map(to_stored_time);
    let row = c
        .row_opt(
            "INSERT INTO memories (id, kind, thread_id, role, content, created_at, metadata,
                level, summary_type, time_start, time_end, source_count, stale, expires_at,
                valid_from, valid_to, supersedes, model_id, embedding)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                (SELECT o.rid FROM memories o WHERE o.id = $17), $18, $19)
             ON CONFLICT (id) DO NOTHING RETURNING rid",
            &[
                &u.id.uuid(),
                &u.kind.as_str(),
                &u.thread_id.as_ref().map(ThreadId::as_str),
                &u.role.map(|r| r.as_str()),
                &u.content,
                &to_stored_time(u.created_at),
                &serde_json::Value::Object(u.metadata.clone()),
                &i32_of(u.level),
                &s.map(|s| s.summary_type.as_str()),
                &stored(s.map(|s| s.time_range_start)),
                &stored(s.map(|s| s.time_range_end)),
                &s.map(|s| i32_of(s.source_count)),
                &s.is_some_and(|s| s.stale),
                &stored(u.lifetime.expires_at),
                &stored(u.lifetime.valid_from),
                &stored(u.lifetime.valid_to),
                &u.lifetime.supersedes.map(|o| o.uuid()),
                &model,
                &Vector::from(v),
            ],
        )
        .await;
    let rid: i64 = match row {
        Err(e) if is_unique_violation(&e) => return Err(StoreError::DuplicateId { id: u.id }),
        r => r
            .map_err(pg)?
            .ok_or(StoreError::DuplicateId { id: u.id })?
            .get(0),
    };
    if !sources.is_empty() {
        // A continued version is the first source, linked as a continuation.
        let continued = s.is_some_and(|s| s.continues.is_some());
        c.exec(
            "INSERT INTO summary_sources (summary, source, position, continues)
             SELECT $1, s, (n - 1)::int, $3 AND n = 1
               FROM unnest($2::bigint[]) WITH ORDINALITY AS x (s, n)",
            &[&rid, &sources, &continued],
        )
        .await
        .map_err(pg)?;
    }
    Ok(())
}
