//! The reads the harness builds on, on PostgreSQL: index-id searches and the rows of their
//! hits, timelines, thread reads, the hierarchy by index id, consolidation's scans,
//! sequence numbers and counts. An index id (`vid`) and a sequence number are both a
//! memory's `rid`: assigned in insertion order, never reused.
//!
//! Every statement is built from constant text and bound parameters (filters through
//! [`Query::filter`]).

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use pgvector::Vector;
use tokio_postgres::Row;

use cairn_core::{MemoryId, MemoryKind, MemoryUnit, ThreadId};
use cairn_store::backend::{match_late_arrivals, order_child_links, SummarySpan};
use cairn_store::{Filter, Hit, Result, StoreError, StoreStats, TimelineEntry};

use crate::sql::{Query, COLS};
use crate::{pg, query_units, refs, units, Cached, PgStore, DEFAULT_EF_SEARCH};

/// The columns of a timeline entry (alias `m`): time, rid, text speaker, length in characters.
const TIMELINE_COLS: &str = "m.created_at, m.rid, \
     CASE WHEN jsonb_typeof(m.metadata -> 'speaker') = 'string' \
     THEN m.metadata ->> 'speaker' END, char_length(m.content)";

/// A filtered HNSW walk at `ef_search` e costs about as much as scoring this many times e
/// rows exactly (measured at 10,000 turns of one thread: 24 ms to score them all, 15-17 ms
/// to walk at `ef_search` 1,000; at 1,000 turns a walk at 800 took 9.9 ms where the exact
/// scan took 3 ms). A filter admitting fewer rows than that is scored exactly even when it
/// admits most of the store.
const WALK_ROWS_PER_EF: i64 = 5;

/// pgvector's largest `hnsw.ef_search`.
const MAX_EF_SEARCH: i64 = 1_000;

/// A row of [`TIMELINE_COLS`].
fn timeline_entry(r: &Row) -> TimelineEntry {
    TimelineEntry {
        at: r.get(0),
        vid: vid(r.get(1)),
        speaker: r.get(2),
        chars: usize::try_from(r.get::<_, i32>(3)).unwrap_or(0),
    }
}

/// A rid as an index id.
fn vid(rid: i64) -> u64 {
    u64::try_from(rid).unwrap_or(0)
}

/// An index id as a rid (`None` for one no rid can be).
fn rid(vid: u64) -> Option<i64> {
    i64::try_from(vid).ok()
}

/// A count or limit as a bound bigint.
fn big(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// (rid, score) rows as (index id, score).
fn ranked(rows: &[Row]) -> Vec<(u64, f32)> {
    #[allow(clippy::cast_possible_truncation)] // a similarity or rank fits an f32
    rows.iter()
        .map(|r| (vid(r.get(0)), r.get::<_, f64>(1) as f32))
        .collect()
}

/// The exact top `k` of what `filter` admits by cosine distance to `v`, as (rid, similarity).
/// A materialized CTE keeps the planner off the HNSW index: every admitted row is scored.
fn exact_query(v: Vector, k: i64, filter: &Filter, now: DateTime<Utc>) -> Query {
    let mut q = Query::new("WITH c AS MATERIALIZED (SELECT m.rid, m.embedding <=> ");
    q.bind(v);
    q.push(" AS d FROM memories m WHERE TRUE");
    q.filter(filter, now);
    q.push(") SELECT c.rid, 1 - c.d AS score FROM c ORDER BY c.d, c.rid LIMIT ");
    q.bind(k);
    q
}

/// What a vector search needs besides the connection.
pub(crate) struct VectorSearch {
    /// The normalized query.
    pub v: Vector,
    /// How many (at least 1).
    pub k: i64,
    /// The admitted memories.
    pub filter: Filter,
    /// The store's time.
    pub now: DateTime<Utc>,
    /// A filter admitting at most this many memories is scanned exactly.
    pub exact_max: i64,
    /// The caller's `hnsw.ef_search`, if any.
    pub ef: Option<usize>,
}

/// Vector search as (rid, similarity), best first: an exact scan when the filter admits at
/// most `exact_max` memories; otherwise a walk of the HNSW index (with a wider
/// `hnsw.ef_search` for a large k or a given `ef`, and sequential scans off under a filter),
/// falling back to the exact scan when the walk comes back short.
pub(crate) async fn vector_ids(
    c: &mut deadpool_postgres::Object,
    s: VectorSearch,
) -> Result<Vec<(u64, f32)>> {
    let VectorSearch {
        v,
        k,
        filter,
        now,
        exact_max,
        ef,
    } = s;
    // How many memories the filter admits, and the planner's estimate of the store's rows
    // (-1 before the table was first analyzed). The count stops where the choice below is
    // made: past the exact-scan bound, or past half the store's rows.
    let restricted = !filter.is_empty();
    let admitted = if restricted {
        let mut q = Query::new(
            "WITH r AS (SELECT reltuples::bigint AS n FROM pg_class \
             WHERE oid = 'memories'::regclass)
             SELECT (SELECT count(*) FROM (SELECT 1 FROM memories m WHERE TRUE",
        );
        q.filter(&filter, now);
        q.push(" LIMIT (SELECT CASE WHEN r.n > 0 THEN least(");
        let max = q.bind(exact_max.saturating_add(1));
        q.push(", r.n / 2 + 1) ELSE ");
        q.push(&max);
        q.push(" END FROM r)) x), (SELECT n FROM r)");
        let row = c.row_one(&q.text, &refs(&q.params)).await.map_err(pg)?;
        let (n, rows): (i64, Option<i64>) = (row.get(0), row.get(1));
        Some((n, rows.unwrap_or(-1)))
    } else {
        None
    };
    let ef = match ef {
        Some(e) => big(e).max(k).clamp(1, MAX_EF_SEARCH),
        None => k.saturating_mul(4).clamp(DEFAULT_EF_SEARCH, MAX_EF_SEARCH),
    };
    // Few admitted rows are scored exactly. A filter that admits most of the store (one
    // thread of a store that is mostly that thread) walks the index instead, when the walk
    // is the cheaper (it costs about as much as scoring WALK_ROWS_PER_EF rows per unit of
    // `ef_search`): the walk finds k admitted rows among its first candidates, and a short
    // walk still ends in the exact scan below.
    let most = |(n, rows): (i64, i64)| {
        rows > 0 && n.saturating_mul(2) > rows && n > ef.saturating_mul(WALK_ROWS_PER_EF)
    };
    if admitted.is_some_and(|a| a.0 <= exact_max && !most(a)) {
        let e = exact_query(v, k, &filter, now);
        let rows = c.rows(&e.text, &refs(&e.params)).await.map_err(pg)?;
        return Ok(ranked(&rows));
    }
    let mut walk = Query::new("SELECT m.rid, 1 - (m.embedding <=> ");
    let at = walk.bind(v.clone());
    walk.push(") AS score FROM memories m WHERE TRUE");
    walk.filter(&filter, now);
    walk.push(" ORDER BY m.embedding <=> ");
    walk.push(&at);
    walk.push(" LIMIT ");
    walk.bind(k);
    let short = |rows: &[Row]| i64::try_from(rows.len()).unwrap_or(0) < k;
    if !restricted && ef == DEFAULT_EF_SEARCH {
        // The connection's settings serve: one round trip.
        let rows = c.rows(&walk.text, &refs(&walk.params)).await.map_err(pg)?;
        if short(&rows) {
            // Expired or ended memories the walk met were filtered out.
            let e = exact_query(v, k, &filter, now);
            let rows = c.rows(&e.text, &refs(&e.params)).await.map_err(pg)?;
            return Ok(ranked(&rows));
        }
        return Ok(ranked(&rows));
    }
    let tx = c.transaction().await.map_err(pg)?;
    // The filter admits many rows: walk the index rather than let the planner sort every
    // admitted row.
    tx.rows(
        "SELECT set_config('hnsw.ef_search', $1, true), set_config('enable_seqscan', 'off', true)",
        &[&ef.to_string()],
    )
    .await
    .map_err(pg)?;
    let mut rows = tx.rows(&walk.text, &refs(&walk.params)).await.map_err(pg)?;
    if short(&rows) {
        // The walk came back short (the filter dropped what it reached).
        let e = exact_query(v, k, &filter, now);
        rows = tx.rows(&e.text, &refs(&e.params)).await.map_err(pg)?;
    }
    tx.commit().await.map_err(pg)?;
    Ok(ranked(&rows))
}

/// Keyword search as (rid, BM25 score), best first: memories holding any stemmed word of
/// `query` (each quoted, so punctuation and operators are never tsquery syntax); with
/// `cap`, only the words fewer than `cap` memories hold (counted up to `cap` in the GIN
/// index).
///
/// The score is FTS5's `bm25()` with its defaults (k1 = 1.2, b = 0.75, an idf of
/// ln((N - n + 0.5) / (n + 0.5)) floored at 1e-6), so both backends rank alike: n is the
/// number of memories holding the word (counted in the GIN index), N and the mean length
/// come from `fts_stats`, and a memory's length is its count of indexed tokens. Each
/// matching memory's lexemes are read once, for its length and its query words' counts.
pub(crate) fn keyword_query(
    query: &str,
    cap: Option<i64>,
    k: usize,
    filter: &Filter,
    now: DateTime<Utc>,
) -> Query {
    let mut q = keyword_words(query, cap);
    keyword_ranking(&mut q, k, filter, now);
    q
}

/// [`keyword_query`] for several asks at once, each (its number, `k`, filter), in one
/// statement: the query's words are looked up and counted once for all of them. Rows (ask,
/// rid, score): each ask's ranking in turn, as its own [`keyword_query`] ranks it.
pub(crate) fn keyword_query_each(
    query: &str,
    cap: Option<i64>,
    asks: &[(usize, usize, &Filter)],
    now: DateTime<Utc>,
) -> Query {
    let mut q = keyword_words(query, cap);
    q.push(" SELECT u.ask, u.rid, u.score FROM (");
    for (n, &(ask, k, filter)) in asks.iter().enumerate() {
        if n > 0 {
            q.push(" UNION ALL ");
        }
        q.push("(SELECT ");
        q.bind(i32::try_from(ask).unwrap_or(i32::MAX));
        q.push("::int4 AS ask, r.rid, r.score FROM (");
        keyword_ranking(&mut q, k, filter, now);
        q.push(") r)");
    }
    q.push(") u ORDER BY u.ask, u.score DESC, u.rid");
    q
}

/// The common table expressions of a keyword search up to its ranking: the query's words
/// (`w`), the corpus' size and mean length (`s`), each word's idf with the words `cap`
/// memories or more hold left out (`i`), and the words as one `tsquery` (`q`).
fn keyword_words(query: &str, cap: Option<i64>) -> Query {
    let mut q = Query::new(
        "WITH w AS (SELECT x AS lexeme,
                ('''' || replace(replace(x, '\\', '\\\\'), '''', '''''') || '''') AS quoted
            FROM unnest(tsvector_to_array(to_tsvector('english', ",
    );
    q.bind(query.to_owned());
    q.push(
        "))) x),
         s AS (SELECT greatest(sum(docs), 1)::float8 AS n,
                      greatest(sum(tokens), 1)::float8 / greatest(sum(docs), 1) AS avgdl
                 FROM fts_stats),
         i AS (SELECT w.lexeme, w.quoted,
                      greatest(ln((s.n - c.df + 0.5) / (c.df + 0.5)), 1e-6) AS idf
                 FROM w CROSS JOIN s
                 CROSS JOIN LATERAL (SELECT count(*)::float8 AS df FROM (SELECT 1 FROM memories o
                     WHERE o.fts @@ w.quoted::tsquery",
    );
    if let Some(cap) = cap {
        q.push(" LIMIT ");
        let at = q.bind(cap);
        q.push(") c) c WHERE c.df < ");
        q.push(&at);
        q.push(")");
    } else {
        q.push(") c) c)");
    }
    q.push(
        ",
         q AS (SELECT (SELECT string_agg(quoted, ' | ') FROM i)::tsquery AS q)",
    );
    q
}

/// The ranking of a keyword search over the words of [`keyword_words`]: the best `k`
/// memories `filter` admits, as (rid, score).
fn keyword_ranking(q: &mut Query, k: usize, filter: &Filter, now: DateTime<Utc>) {
    q.push(
        "
         SELECT m.rid, sc.score FROM memories m CROSS JOIN q CROSS JOIN s
           CROSS JOIN LATERAL (
             SELECT sum(i.idf * t.tf * 2.2
                        / (t.tf + 1.2 * (0.25 + 0.75 * t.dl / s.avgdl)))::float8 AS score
               FROM (SELECT e.lexeme, coalesce(array_length(e.positions, 1), 1)::float8 AS tf,
                            sum(coalesce(array_length(e.positions, 1), 1)) OVER ()::float8 AS dl
                       FROM unnest(m.fts) e) t
               JOIN i ON i.lexeme = t.lexeme) sc
          WHERE q.q IS NOT NULL AND m.fts @@ q.q",
    );
    q.filter(filter, now);
    q.push(" ORDER BY sc.score DESC, m.rid LIMIT ");
    q.bind(big(k));
}

/// The rows of ranked index ids, in the given order with their scores; ids without a row
/// are skipped (each id once).
pub(crate) async fn hits_of<C: GenericClient + Sync>(
    c: &C,
    found: Vec<(u64, f32)>,
) -> Result<Vec<Hit>> {
    if found.is_empty() {
        return Ok(Vec::new());
    }
    let rids: Vec<i64> = found.iter().filter_map(|(v, _)| rid(*v)).collect();
    let rows = c
        .rows(
            &format!("SELECT {COLS} FROM memories m WHERE m.rid = ANY($1)"),
            &[&rids],
        )
        .await
        .map_err(pg)?;
    let keys: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    let mut by: HashMap<i64, MemoryUnit> = keys.into_iter().zip(units(c, &rows).await?).collect();
    Ok(found
        .into_iter()
        .filter_map(|(v, score)| by.remove(&rid(v)?).map(|memory| Hit { memory, score }))
        .collect())
}

/// Memories with their rids (rows selecting [`COLS`]).
async fn sequenced_units<C: GenericClient + Sync>(
    c: &C,
    q: &Query,
) -> Result<Vec<(MemoryUnit, u64)>> {
    let rows = c.rows(&q.text, &refs(&q.params)).await.map_err(pg)?;
    let rids: Vec<u64> = rows.iter().map(|r| vid(r.get(0))).collect();
    Ok(units(c, &rows).await?.into_iter().zip(rids).collect())
}

/// Timeline entries from a query selecting [`TIMELINE_COLS`].
async fn timeline<C: GenericClient + Sync>(c: &C, q: &Query) -> Result<Vec<TimelineEntry>> {
    let rows = c.rows(&q.text, &refs(&q.params)).await.map_err(pg)?;
    Ok(rows.iter().map(timeline_entry).collect())
}

impl PgStore {
    /// The stored memories among `ids`, by id (one statement; unknown ids are absent).
    pub(crate) fn fetch(&self, ids: &[MemoryId]) -> Result<HashMap<MemoryId, MemoryUnit>> {
        let uuids: Vec<uuid::Uuid> = ids.iter().map(MemoryId::uuid).collect();
        self.block(move |c| async move {
            let rows = c
                .rows(
                    &format!("SELECT {COLS} FROM memories m WHERE m.id = ANY($1)"),
                    &[&uuids],
                )
                .await
                .map_err(pg)?;
            Ok(units(&c, &rows)
                .await?
                .into_iter()
                .map(|u| (u.id, u))
                .collect())
        })
    }

    /// See [`cairn_store::MemoryBackend::get_found`].
    pub(crate) fn get_found(&self, ids: &[MemoryId]) -> Result<Vec<MemoryUnit>> {
        let mut found = self.fetch(ids)?;
        Ok(ids.iter().filter_map(|id| found.remove(id)).collect())
    }

    /// See [`cairn_store::MemoryBackend::scan`].
    pub(crate) fn scan(
        &self,
        filter: &Filter,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<MemoryUnit>> {
        filter.validate()?;
        let mut q = Query::select();
        q.push(" WHERE TRUE");
        q.filter(filter, self.now());
        q.push(" ORDER BY m.created_at, m.rid LIMIT ");
        q.bind(big(limit));
        q.push(" OFFSET ");
        q.bind(big(offset));
        self.block(move |c| async move { query_units(&c, &q).await })
    }

    /// See [`cairn_store::MemoryBackend::texts`].
    pub(crate) fn texts(&self, filter: &Filter) -> Result<Vec<(String, Option<String>)>> {
        filter.validate()?;
        let mut q = Query::new(
            "SELECT m.content, CASE WHEN jsonb_typeof(m.metadata -> 'speaker') = 'string'
                THEN m.metadata ->> 'speaker' END FROM memories m WHERE TRUE",
        );
        q.filter(filter, self.now());
        q.push(" ORDER BY m.created_at, m.rid");
        self.block(move |c| async move {
            let rows = c.rows(&q.text, &refs(&q.params)).await.map_err(pg)?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
    }

    /// See [`cairn_store::MemoryBackend::timeline_entries`].
    pub(crate) fn timeline_entries(&self, filter: &Filter) -> Result<Vec<TimelineEntry>> {
        filter.validate()?;
        let mut q = Query::new(format!("SELECT {TIMELINE_COLS} FROM memories m WHERE TRUE"));
        q.filter(filter, self.now());
        q.push(" ORDER BY m.created_at, m.rid");
        self.block(move |c| async move { timeline(&c, &q).await })
    }

    /// See [`cairn_store::MemoryBackend::timeline_of`].
    pub(crate) fn timeline_of(&self, vids: &[u64]) -> Result<Vec<TimelineEntry>> {
        let rids: Vec<i64> = vids.iter().filter_map(|v| rid(*v)).collect();
        if rids.is_empty() {
            return Ok(Vec::new());
        }
        let mut q = Query::new(format!(
            "SELECT {TIMELINE_COLS} FROM memories m WHERE m.rid = ANY("
        ));
        q.bind(rids);
        q.push(") ORDER BY m.created_at, m.rid");
        self.block(move |c| async move { timeline(&c, &q).await })
    }

    /// See [`cairn_store::MemoryBackend::timeline_around`].
    pub(crate) fn timeline_around(
        &self,
        filter: &Filter,
        times: &[DateTime<Utc>],
        before: usize,
        after: usize,
    ) -> Result<Vec<Vec<TimelineEntry>>> {
        filter.validate()?;
        let now = self.now();
        let (filter, times) = (filter.clone(), times.to_vec());
        // Two statements whatever the number of times: the stretches before every time, then
        // those from every time on, each a LATERAL index range over the thread.
        let side = |backwards: bool| {
            let mut q = Query::new("SELECT x.*, t.n FROM unnest(");
            q.bind(times.clone());
            q.push(format!(
                "::timestamptz[]) WITH ORDINALITY AS t (at, n) CROSS JOIN LATERAL \
                 (SELECT {TIMELINE_COLS} FROM memories m WHERE TRUE"
            ));
            q.filter(&filter, now);
            if backwards {
                q.push(" AND m.created_at < t.at ORDER BY m.created_at DESC, m.rid DESC LIMIT ");
                q.bind(big(before));
                q.push(") x ORDER BY t.n, x.created_at DESC, x.rid DESC");
            } else {
                q.push(" AND m.created_at >= t.at ORDER BY m.created_at, m.rid LIMIT ");
                q.bind(big(after));
                q.push(") x ORDER BY t.n, x.created_at, x.rid");
            }
            q
        };
        let (back, ahead) = (side(true), side(false));
        let n = times.len();
        self.block(move |c| async move {
            let mut out: Vec<Vec<TimelineEntry>> = vec![Vec::new(); n];
            let at = |r: &Row| usize::try_from(r.get::<_, i64>(4) - 1).unwrap_or(usize::MAX);
            for r in c.rows(&back.text, &refs(&back.params)).await.map_err(pg)? {
                if let Some(stretch) = out.get_mut(at(&r)) {
                    stretch.push(timeline_entry(&r));
                }
            }
            for stretch in &mut out {
                stretch.reverse();
            }
            for r in c
                .rows(&ahead.text, &refs(&ahead.params))
                .await
                .map_err(pg)?
            {
                if let Some(stretch) = out.get_mut(at(&r)) {
                    stretch.push(timeline_entry(&r));
                }
            }
            Ok(out)
        })
    }

    /// See [`cairn_store::MemoryBackend::timeline_page`].
    pub(crate) fn timeline_page(
        &self,
        filter: &Filter,
        limit: usize,
        newest: bool,
    ) -> Result<(Vec<TimelineEntry>, bool)> {
        filter.validate()?;
        let mut q = Query::new(format!("SELECT {TIMELINE_COLS} FROM memories m WHERE TRUE"));
        q.filter(filter, self.now());
        q.push(if newest {
            " ORDER BY m.created_at DESC, m.rid DESC LIMIT "
        } else {
            " ORDER BY m.created_at, m.rid LIMIT "
        });
        q.bind(big(limit.saturating_add(1)));
        let mut page = self.block(move |c| async move { timeline(&c, &q).await })?;
        let more = page.len() > limit;
        page.truncate(limit);
        if newest {
            page.reverse();
        }
        Ok((page, more))
    }

    /// See [`cairn_store::MemoryBackend::thread_speakers`]: a skip scan over the thread's
    /// speaker index, one probe per distinct speaker however long the thread.
    pub(crate) fn thread_speakers(&self, thread: &ThreadId) -> Result<Vec<String>> {
        let t = thread.as_str().to_owned();
        self.block(move |c| async move {
            let rows = c
                .rows(
                    "WITH RECURSIVE s(v) AS (
                        (SELECT (metadata ->> 'speaker') COLLATE \"C\" FROM memories
                          WHERE thread_id = $1 AND jsonb_typeof(metadata -> 'speaker') = 'string'
                            AND (metadata ->> 'speaker') COLLATE \"C\" > ''
                          ORDER BY 1 LIMIT 1)
                        UNION ALL
                        SELECT (SELECT (m.metadata ->> 'speaker') COLLATE \"C\" FROM memories m
                                 WHERE m.thread_id = $1
                                   AND jsonb_typeof(m.metadata -> 'speaker') = 'string'
                                   AND (m.metadata ->> 'speaker') COLLATE \"C\" > s.v
                                 ORDER BY 1 LIMIT 1)
                          FROM s WHERE s.v IS NOT NULL)
                     SELECT v FROM s WHERE v IS NOT NULL",
                    &[&t],
                )
                .await
                .map_err(pg)?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    /// See [`cairn_store::MemoryBackend::top_summaries`].
    pub(crate) fn top_summaries(
        &self,
        thread: &ThreadId,
        per_level: usize,
    ) -> Result<Vec<MemoryUnit>> {
        let mut q = Query::new(format!(
            "SELECT {COLS} FROM memories m WHERE m.rid IN (
                SELECT x.rid FROM generate_series(1, (SELECT max(level) FROM memories
                    WHERE thread_id = "
        ));
        let t = q.bind(thread.as_str().to_owned());
        q.push(
            " AND kind = 'summary')) AS lv,
                LATERAL (SELECT rid FROM memories WHERE thread_id = ",
        );
        q.push(&t);
        q.push(
            " AND kind = 'summary' AND level = lv
                    ORDER BY created_at DESC, rid DESC LIMIT ",
        );
        q.bind(big(per_level));
        q.push(
            ") x)
             AND NOT EXISTS (SELECT 1 FROM summary_sources l WHERE l.source = m.rid)
             ORDER BY m.created_at, m.level, m.rid",
        );
        self.block(move |c| async move { query_units(&c, &q).await })
    }

    /// See [`cairn_store::MemoryBackend::count_in_thread`].
    pub(crate) fn count_in_thread(&self, thread: &ThreadId, kinds: &[MemoryKind]) -> Result<usize> {
        let t = thread.as_str().to_owned();
        let kinds: Vec<String> = kinds.iter().map(|k| k.as_str().to_owned()).collect();
        self.block(move |c| async move {
            let n: i64 = c
                .row_one(
                    "SELECT count(*) FROM memories WHERE thread_id = $1 AND kind = ANY($2)",
                    &[&t, &kinds],
                )
                .await
                .map_err(pg)?
                .get(0);
            Ok(usize::try_from(n).unwrap_or(0))
        })
    }

    /// See [`cairn_store::MemoryBackend::search_vector_ids`].
    pub(crate) fn search_vector_ids(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
        ef: Option<usize>,
    ) -> Result<Vec<(u64, f32)>> {
        let Some(s) = self.vector_search(query, k, filter, ef)? else {
            return Ok(Vec::new());
        };
        self.block(move |mut c| async move { vector_ids(&mut c, s).await })
    }

    /// See [`cairn_store::MemoryBackend::search_vector`]: the ids, then their rows.
    pub(crate) fn search_vector_hits(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
    ) -> Result<Vec<Hit>> {
        let Some(s) = self.vector_search(query, k, filter, None)? else {
            return Ok(Vec::new());
        };
        self.block(move |mut c| async move {
            let found = vector_ids(&mut c, s).await?;
            hits_of(&c, found).await
        })
    }

    /// A checked vector search (`None` when `k` is 0: nothing to find).
    fn vector_search(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
        ef: Option<usize>,
    ) -> Result<Option<VectorSearch>> {
        filter.validate()?;
        let v = self.prepare_vector(query)?;
        if k == 0 {
            return Ok(None);
        }
        Ok(Some(VectorSearch {
            v,
            k: big(k),
            filter: filter.clone(),
            now: self.now(),
            exact_max: self.options.exact_scan_max.max(0),
            ef,
        }))
    }

    /// See [`cairn_store::MemoryBackend::search_vector_ids_exact`].
    pub(crate) fn search_vector_ids_exact(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
    ) -> Result<Vec<(u64, f32)>> {
        filter.validate()?;
        let v = self.prepare_vector(query)?;
        if k == 0 {
            return Ok(Vec::new());
        }
        let q = exact_query(v, big(k), filter, self.now());
        self.block(move |c| async move {
            let rows = c.rows(&q.text, &refs(&q.params)).await.map_err(pg)?;
            Ok(ranked(&rows))
        })
    }

    /// See [`cairn_store::MemoryBackend::search_keyword_ids`].
    pub(crate) fn search_keyword_ids(
        &self,
        query: &str,
        k: usize,
        filter: &Filter,
    ) -> Result<Vec<(u64, f32)>> {
        self.keyword(query, None, k, filter)
    }

    /// See [`cairn_store::MemoryBackend::search_keyword_ids_capped`].
    pub(crate) fn search_keyword_ids_capped(
        &self,
        query: &str,
        k: usize,
        filter: &Filter,
        max_matches: usize,
    ) -> Result<Vec<(u64, f32)>> {
        self.keyword(query, Some(big(max_matches.saturating_add(1))), k, filter)
    }

    /// See [`cairn_store::MemoryBackend::search_keyword_ids_capped_each`]: one statement for
    /// every ask for more than none, the query's words counted once.
    pub(crate) fn search_keyword_ids_capped_each(
        &self,
        query: &str,
        asks: &[(usize, &Filter)],
        max_matches: usize,
    ) -> Result<Vec<Vec<(u64, f32)>>> {
        for (_, filter) in asks {
            filter.validate()?;
        }
        let mut out: Vec<Vec<(u64, f32)>> = vec![Vec::new(); asks.len()];
        let wanted: Vec<(usize, usize, &Filter)> = asks
            .iter()
            .enumerate()
            .filter(|(_, (k, _))| *k > 0)
            .map(|(n, (k, f))| (n, *k, *f))
            .collect();
        if wanted.is_empty() || query.trim().is_empty() {
            return Ok(out);
        }
        let cap = Some(big(max_matches.saturating_add(1)));
        let q = keyword_query_each(query, cap, &wanted, self.now());
        let rows = self
            .block(move |c| async move { c.rows(&q.text, &refs(&q.params)).await.map_err(pg) })?;
        #[allow(clippy::cast_possible_truncation)] // a rank fits an f32
        for r in &rows {
            let ask = usize::try_from(r.get::<_, i32>(0)).ok();
            let ranking = ask
                .and_then(|a| out.get_mut(a))
                .ok_or_else(|| StoreError::Backend {
                    backend: "postgres",
                    message: "a keyword search answered for an ask it was not given".into(),
                })?;
            ranking.push((vid(r.get(1)), r.get::<_, f64>(2) as f32));
        }
        Ok(out)
    }

    fn keyword(
        &self,
        query: &str,
        cap: Option<i64>,
        k: usize,
        filter: &Filter,
    ) -> Result<Vec<(u64, f32)>> {
        filter.validate()?;
        if k == 0 || query.trim().is_empty() {
            return Ok(Vec::new());
        }
        let q = keyword_query(query, cap, k, filter, self.now());
        self.block(move |c| async move {
            let rows = c.rows(&q.text, &refs(&q.params)).await.map_err(pg)?;
            Ok(ranked(&rows))
        })
    }

    /// See [`cairn_store::MemoryBackend::search_keyword`]: the ids, then their rows.
    pub(crate) fn search_keyword_hits(
        &self,
        query: &str,
        k: usize,
        filter: &Filter,
    ) -> Result<Vec<Hit>> {
        filter.validate()?;
        if k == 0 || query.trim().is_empty() {
            return Ok(Vec::new());
        }
        let q = keyword_query(query, None, k, filter, self.now());
        self.block(move |c| async move {
            let rows = c.rows(&q.text, &refs(&q.params)).await.map_err(pg)?;
            hits_of(&c, ranked(&rows)).await
        })
    }

    /// See [`cairn_store::MemoryBackend::hits`].
    pub(crate) fn hits(&self, found: Vec<(u64, f32)>) -> Result<Vec<Hit>> {
        if found.is_empty() {
            return Ok(Vec::new());
        }
        self.block(move |c| async move { hits_of(&c, found).await })
    }

    /// See [`cairn_store::MemoryBackend::similarities`].
    pub(crate) fn similarities(&self, query: Vec<f32>, vids: &[u64]) -> Result<Vec<(u64, f32)>> {
        let v = self.prepare_vector(query)?;
        let rids: Vec<i64> = vids.iter().filter_map(|v| rid(*v)).collect();
        if rids.is_empty() {
            return Ok(Vec::new());
        }
        let by: HashMap<u64, f32> = self.block(move |c| async move {
            let rows = c
                .rows(
                    "SELECT rid, 1 - (embedding <=> $1) FROM memories WHERE rid = ANY($2)",
                    &[&v, &rids],
                )
                .await
                .map_err(pg)?;
            Ok(ranked(&rows).into_iter().collect())
        })?;
        Ok(vids
            .iter()
            .filter_map(|v| by.get(v).map(|s| (*v, *s)))
            .collect())
    }

    /// See [`cairn_store::MemoryBackend::leaf_vids`].
    pub(crate) fn leaf_vids(&self, summaries: &[u64]) -> Result<HashSet<u64>> {
        let rids: Vec<i64> = summaries.iter().filter_map(|v| rid(*v)).collect();
        if rids.is_empty() {
            return Ok(HashSet::new());
        }
        self.block(move |c| async move {
            let rows = c
                .rows(
                    "WITH RECURSIVE down(r) AS (
                        SELECT source FROM summary_sources WHERE summary = ANY($1)
                        UNION SELECT l.source FROM summary_sources l JOIN down ON l.summary = down.r)
                     SELECT m.rid FROM memories m
                      WHERE m.rid = ANY(ARRAY(SELECT r FROM down)) AND m.level = 0",
                    &[&rids],
                )
                .await
                .map_err(pg)?;
            Ok(rows.iter().map(|r| vid(r.get(0))).collect())
        })
    }

    /// See [`cairn_store::MemoryBackend::child_summary_vids`].
    pub(crate) fn child_summary_vids(&self, summaries: &[u64]) -> Result<Vec<(u64, u64)>> {
        let rids: Vec<i64> = summaries.iter().filter_map(|v| rid(*v)).collect();
        if rids.is_empty() {
            return Ok(Vec::new());
        }
        let links = self.block(move |c| async move {
            let rows = c
                .rows(
                    "SELECT l.summary, l.position, l.source
                       FROM summary_sources l JOIN memories m ON m.rid = l.source
                      WHERE l.summary IN (SELECT rid FROM memories
                                           WHERE rid = ANY($1) AND level > 1)
                        AND NOT l.continues AND m.kind = 'summary'",
                    &[&rids],
                )
                .await
                .map_err(pg)?;
            Ok(rows
                .iter()
                .map(|r| {
                    let pos: i32 = r.get(1);
                    (vid(r.get(0)), i64::from(pos), vid(r.get(2)))
                })
                .collect())
        })?;
        Ok(order_child_links(summaries, links))
    }

    /// See [`cairn_store::MemoryBackend::stale_summaries`].
    pub(crate) fn stale_summaries(&self, filter: &Filter, limit: usize) -> Result<Vec<MemoryUnit>> {
        filter.validate()?;
        let mut q = Query::select();
        q.push(" WHERE m.kind = 'summary' AND m.stale");
        q.filter(filter, self.now());
        q.push(" ORDER BY m.level, m.created_at, m.rid LIMIT ");
        q.bind(big(limit));
        self.block(move |c| async move { query_units(&c, &q).await })
    }

    /// See [`cairn_store::MemoryBackend::scan_uncovered_page`].
    pub(crate) fn scan_uncovered_page(
        &self,
        filter: &Filter,
        parent_level: u32,
        limit: usize,
    ) -> Result<Vec<MemoryUnit>> {
        filter.validate()?;
        let mut q = Query::select();
        q.push(" WHERE TRUE");
        q.filter(filter, self.now());
        q.push(
            " AND NOT EXISTS (SELECT 1 FROM summary_sources l JOIN memories p ON p.rid = l.summary
                WHERE l.source = m.rid AND p.level = ",
        );
        q.bind(i32::try_from(parent_level).unwrap_or(i32::MAX));
        q.push(") ORDER BY m.created_at, m.rid LIMIT ");
        q.bind(big(limit));
        self.block(move |c| async move { query_units(&c, &q).await })
    }

    /// See [`cairn_store::MemoryBackend::late_arrivals`].
    pub(crate) fn late_arrivals(&self, filter: &Filter) -> Result<Vec<(MemoryId, MemoryId)>> {
        filter.validate()?;
        let mut q = Query::new(
            "SELECT m.id, m.rid, m.created_at, m.thread_id FROM memories m
             WHERE m.thread_id IS NOT NULL AND m.level = 0",
        );
        q.filter(filter, self.now());
        q.push(
            " AND NOT EXISTS (SELECT 1 FROM summary_sources l JOIN memories p ON p.rid = l.summary
                WHERE l.source = m.rid AND p.level = 1)
             ORDER BY m.created_at, m.rid",
        );
        self.block(move |c| async move {
            let rows = c.rows(&q.text, &refs(&q.params)).await.map_err(pg)?;
            let mut uncovered = Vec::with_capacity(rows.len());
            for r in &rows {
                uncovered.push((
                    MemoryId::from_uuid(r.get(0)),
                    r.get::<_, i64>(1),
                    r.get::<_, DateTime<Utc>>(2),
                    ThreadId::new(r.get::<_, String>(3))?,
                ));
            }
            // The spans of each thread met, read before matching (the matcher is not async).
            let mut threads: Vec<ThreadId> = uncovered.iter().map(|u| u.3.clone()).collect();
            threads.sort();
            threads.dedup();
            let mut spans: HashMap<ThreadId, Vec<SummarySpan>> = HashMap::new();
            for t in threads {
                let rows = c
                    .rows(
                        "SELECT s.id, s.rid, s.time_start, s.time_end FROM memories s
                          WHERE s.thread_id = $1 AND s.kind = 'summary' AND s.level = 1
                            AND s.summary_type = 'conversation'
                            AND s.time_start IS NOT NULL AND s.time_end IS NOT NULL
                            AND NOT EXISTS (SELECT 1 FROM summary_sources x
                                WHERE x.summary = s.rid AND x.continues)
                            AND NOT EXISTS (SELECT 1 FROM summary_sources x
                                WHERE x.source = s.rid AND x.continues)
                          ORDER BY s.time_start, s.rid",
                        &[&t.as_str()],
                    )
                    .await
                    .map_err(pg)?;
                let v = rows
                    .iter()
                    .map(|r| (MemoryId::from_uuid(r.get(0)), r.get(1), r.get(2), r.get(3)))
                    .collect();
                spans.insert(t, v);
            }
            match_late_arrivals(uncovered, |t| Ok(spans.remove(t).unwrap_or_default()))
        })
    }

    /// See [`cairn_store::MemoryBackend::thread_tail`].
    pub(crate) fn thread_tail(
        &self,
        thread: &ThreadId,
        kind: MemoryKind,
        after: u64,
    ) -> Result<Vec<(MemoryUnit, u64)>> {
        let mut q = Query::select();
        q.push(" WHERE m.thread_id = ");
        q.bind(thread.as_str().to_owned());
        q.push(" AND m.rid > ");
        q.bind(i64::try_from(after).unwrap_or(i64::MAX));
        q.push(" AND m.kind = ");
        q.bind(kind.as_str().to_owned());
        q.push(" ORDER BY m.rid");
        self.block(move |c| async move { sequenced_units(&c, &q).await })
    }

    /// See [`cairn_store::MemoryBackend::sequenced`].
    pub(crate) fn sequenced(&self, ids: &[MemoryId]) -> Result<Vec<(MemoryUnit, u64)>> {
        let mut q = Query::select();
        q.push(" WHERE m.id = ANY(");
        q.bind(ids.iter().map(MemoryId::uuid).collect::<Vec<uuid::Uuid>>());
        q.push(")");
        let found: HashMap<MemoryId, (MemoryUnit, u64)> = self.block(move |c| async move {
            Ok(sequenced_units(&c, &q)
                .await?
                .into_iter()
                .map(|(u, n)| (u.id, (u, n)))
                .collect())
        })?;
        ids.iter()
            .map(|id| {
                found
                    .get(id)
                    .cloned()
                    .ok_or(StoreError::NotFound { id: *id })
            })
            .collect()
    }

    /// See [`cairn_store::MemoryBackend::last_sequence`]: the rid sequence's last value
    /// (rids a failed or rolled-back insert took count), or the highest rid.
    pub(crate) fn last_sequence(&self) -> Result<u64> {
        self.block(|c| async move {
            let n: i64 = c
                .row_one(
                    "SELECT GREATEST(
                        COALESCE(pg_sequence_last_value(
                            pg_get_serial_sequence('memories', 'rid')::regclass), 0),
                        COALESCE((SELECT max(rid) FROM memories), 0))",
                    &[],
                )
                .await
                .map_err(pg)?
                .get(0);
            Ok(vid(n))
        })
    }

    /// See [`cairn_store::MemoryBackend::embedding`].
    pub(crate) fn embedding(&self, id: MemoryId) -> Result<Vec<f32>> {
        self.block(move |c| async move {
            let v: Vector = c
                .row_opt(
                    "SELECT embedding FROM memories WHERE id = $1",
                    &[&id.uuid()],
                )
                .await
                .map_err(pg)?
                .ok_or(StoreError::NotFound { id })?
                .get(0);
            Ok(v.to_vec())
        })
    }

    /// See [`cairn_store::MemoryBackend::stats`]: counts per kind and level, stale
    /// summaries and links (the SQLite index's fields keep their defaults).
    pub(crate) fn stats(&self) -> Result<StoreStats> {
        self.block(|c| async move {
            let mut s = StoreStats::default();
            let rows = c
                .rows(
                    "SELECT kind, level, count(*), count(*) FILTER (WHERE stale)
                       FROM memories GROUP BY kind, level",
                    &[],
                )
                .await
                .map_err(pg)?;
            for r in rows {
                let kind: String = r.get(0);
                let level = u32::try_from(r.get::<_, i32>(1)).unwrap_or(0);
                let n = usize::try_from(r.get::<_, i64>(2)).unwrap_or(0);
                s.total += n;
                *s.by_kind.entry(kind).or_default() += n;
                *s.by_level.entry(level).or_default() += n;
                s.stale_summaries += usize::try_from(r.get::<_, i64>(3)).unwrap_or(0);
            }
            let links: i64 = c
                .row_one("SELECT count(*) FROM summary_sources", &[])
                .await
                .map_err(pg)?
                .get(0);
            s.links = usize::try_from(links).unwrap_or(0);
            Ok(s)
        })
    }
}
