//! Reads whose cost does not grow with a thread's length, for recall on long threads: counts
//! from the index's counters, parts of a thread's timeline (around given times, or a page of
//! a time range), similarities on the index's own vectors, a thread's uncited summaries
//! level by level, the summaries under a summary at one level, and keyword search over the
//! query's uncommon words only.

use super::{fts_or, fts_words, id_list, keyword_ids, timeline_entry, Store, TIMELINE_COLS};
use crate::rows::{from_micros, query_units, to_micros};
use crate::{Filter, Result, TimelineEntry};

use chrono::{DateTime, Utc};
use rusqlite::params;
use rusqlite::types::Value;

use cairn_core::{MemoryKind, MemoryUnit, ThreadId};

/// Rows named per statement when reading by index id.
const IDS_PER_STATEMENT: usize = 500;

impl Store {
    /// How many live memories of `kinds` `thread` holds, from the index's counters (no row
    /// is read; other handles' writes are caught up first).
    pub fn count_in_thread(&self, thread: &ThreadId, kinds: &[MemoryKind]) -> Result<usize> {
        self.sync()?;
        let attrs = self.inner.shared.index.attrs();
        Ok(attrs
            .thread_key(thread.as_str())
            .map_or(0, |key| attrs.thread_kinds_count(key, kinds)))
    }

    /// [`Store::search_vector_ids`] scored exactly on every memory `filter` admits (their
    /// index ids read from SQLite, their vectors from the index), never through the graph: for
    /// a small share of a large store, such as one thread's summaries, where a filtered
    /// graph walk visits many memories it does not admit.
    pub fn search_vector_ids_exact(
        &self,
        query: Vec<f32>,
        k: usize,
        filter: &Filter,
    ) -> Result<Vec<(u64, f32)>> {
        filter.validate()?;
        let q = self.prepare_vector(query)?;
        if k == 0 {
            return Ok(Vec::new());
        }
        self.sync()?;
        Ok(self
            .exact_scan(&q, k, filter)?
            .into_iter()
            .map(|(v, s)| (v as u64, s))
            .collect())
    }

    /// When each memory of `vids` happened, from the index's attributes (no row is read); ids
    /// the index does not hold are left out.
    pub fn times_of(&self, vids: &[u64]) -> Result<Vec<(u64, DateTime<Utc>)>> {
        self.sync()?;
        let attrs = self.inner.shared.index.attrs();
        Ok(vids
            .iter()
            .filter_map(|v| {
                let a = attrs.map.get(&usize::try_from(*v).ok()?)?;
                Some((*v, from_micros(a.created_at)))
            })
            .collect())
    }

    /// The time span (earliest and latest source, through every level) of each summary of
    /// `vids`, in that order; ids that are not summaries are left out. Reads three columns
    /// per summary, not the rows and their links.
    #[allow(clippy::type_complexity)]
    pub fn summary_spans(&self, vids: &[u64]) -> Result<Vec<(u64, DateTime<Utc>, DateTime<Utc>)>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT time_start, time_end FROM memories
                  WHERE vid = ?1 AND kind = 'summary' AND time_start IS NOT NULL
                    AND time_end IS NOT NULL",
            )?;
            let mut out = Vec::with_capacity(vids.len());
            for v in vids {
                let vid = i64::try_from(*v).unwrap_or(i64::MAX);
                let mut rows = stmt.query(params![vid])?;
                if let Some(r) = rows.next()? {
                    out.push((*v, from_micros(r.get(0)?), from_micros(r.get(1)?)));
                }
            }
            Ok(out)
        })
    }

    /// The timeline entries (see [`Store::timeline_entries`]) of the memories whose index ids
    /// are `vids`, oldest first (ties by insertion); unknown ids are left out.
    pub fn timeline_of(&self, vids: &[u64]) -> Result<Vec<TimelineEntry>> {
        let mut out = self.read(|c| {
            let mut out = Vec::with_capacity(vids.len());
            for chunk in vids.chunks(IDS_PER_STATEMENT) {
                let (args, marks) = id_list(chunk.iter().copied());
                let mut stmt = c.prepare_cached(&format!(
                    "SELECT {TIMELINE_COLS}, m.rid FROM memories m WHERE m.vid IN ({marks})"
                ))?;
                let rows = stmt.query_map(rusqlite::params_from_iter(args.iter()), |r| {
                    Ok((timeline_entry(r)?, r.get::<_, i64>(4)?))
                })?;
                for row in rows {
                    out.push(row?);
                }
            }
            Ok(out)
        })?;
        out.sort_by_key(|(e, rid)| (e.at, *rid));
        Ok(out.into_iter().map(|(e, _)| e).collect())
    }

    /// For each time of `times`, the stretch of the timeline of what `filter` admits around
    /// it: up to `before` entries before the time, then up to `after` entries at or after it,
    /// oldest first (ties by insertion). Each stretch is contiguous: no admitted memory lies
    /// between two of its entries. Two index seeks per time, whatever the thread's length.
    pub fn timeline_around(
        &self,
        filter: &Filter,
        times: &[DateTime<Utc>],
        before: usize,
        after: usize,
    ) -> Result<Vec<Vec<TimelineEntry>>> {
        filter.validate()?;
        let (cond, args) = filter.sql_at(self.visibility()?);
        let limit = |n: usize| Value::Integer(i64::try_from(n).unwrap_or(i64::MAX));
        self.read_snapshot(|c| {
            let mut back = c.prepare_cached(&format!(
                "SELECT {TIMELINE_COLS} FROM memories m WHERE 1 = 1{cond} AND m.created_at < ? \
                 ORDER BY m.created_at DESC, m.rid DESC LIMIT ?"
            ))?;
            let mut ahead = c.prepare_cached(&format!(
                "SELECT {TIMELINE_COLS} FROM memories m WHERE 1 = 1{cond} AND m.created_at >= ? \
                 ORDER BY m.created_at, m.rid LIMIT ?"
            ))?;
            let mut out = Vec::with_capacity(times.len());
            for t in times {
                let mut a = args.clone();
                a.push(Value::Integer(to_micros(*t)));
                let mut b = a.clone();
                a.push(limit(before));
                b.push(limit(after));
                let mut stretch: Vec<TimelineEntry> = back
                    .query_map(rusqlite::params_from_iter(a.iter()), timeline_entry)?
                    .collect::<rusqlite::Result<_>>()?;
                stretch.reverse();
                for e in ahead.query_map(rusqlite::params_from_iter(b.iter()), timeline_entry)? {
                    stretch.push(e?);
                }
                out.push(stretch);
            }
            Ok(out)
        })
    }

    /// Up to `limit` timeline entries of what `filter` admits (a time range, say): the
    /// oldest, or the newest when `newest`; oldest first either way, with whether more were
    /// admitted.
    pub fn timeline_page(
        &self,
        filter: &Filter,
        limit: usize,
        newest: bool,
    ) -> Result<(Vec<TimelineEntry>, bool)> {
        filter.validate()?;
        let (cond, mut args) = filter.sql_at(self.visibility()?);
        args.push(Value::Integer(
            i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX),
        ));
        let order = if newest {
            "m.created_at DESC, m.rid DESC"
        } else {
            "m.created_at, m.rid"
        };
        let mut page: Vec<TimelineEntry> = self.read(|c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {TIMELINE_COLS} FROM memories m WHERE 1 = 1{cond} ORDER BY {order} LIMIT ?"
            ))?;
            let rows = stmt.query_map(rusqlite::params_from_iter(args.iter()), timeline_entry)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })?;
        let more = page.len() > limit;
        page.truncate(limit);
        if newest {
            page.reverse();
        }
        Ok((page, more))
    }

    /// The cosine similarity of `query` to each memory of `vids` the index holds, computed
    /// on the index's own vectors (no row is read), in the order of `vids`; ids the index
    /// does not hold (deleted, or not indexed yet) are left out.
    pub fn similarities(&self, query: Vec<f32>, vids: &[u64]) -> Result<Vec<(u64, f32)>> {
        let q = self.prepare_vector(query)?;
        let index = &self.inner.shared.index;
        let as_usize: Vec<usize> = vids
            .iter()
            .map(|v| usize::try_from(*v).unwrap_or(usize::MAX))
            .collect();
        let found = match index.exact_among(&q, as_usize.len(), &as_usize) {
            Some(all) => all,
            // One of them is not in the graph: each on its own.
            None => as_usize
                .iter()
                .filter_map(|v| index.exact_among(&q, 1, std::slice::from_ref(v)))
                .flatten()
                .collect(),
        };
        let by_vid: std::collections::HashMap<usize, f32> = found.into_iter().collect();
        Ok(vids
            .iter()
            .filter_map(|v| {
                let key = usize::try_from(*v).unwrap_or(usize::MAX);
                by_vid.get(&key).map(|s| (*v, *s))
            })
            .collect())
    }

    /// The summaries each summary of `summaries` (index ids) cites directly, as (summary,
    /// child) index id pairs: summaries in the order given, each one's children in their
    /// order; continuation links (an earlier version of a moving summary) are left out, as
    /// are unknown ids and summaries of turns only. One statement per 500 summaries; a
    /// level-1 summary (its sources all turns) costs one row, not a row per source. The
    /// joins go in the order written (`CROSS JOIN`): with a list of ids, SQLite's planner
    /// otherwise started from every summary of the store (8 ms at 200,000 turns, against
    /// 0.06 ms).
    pub fn child_summary_vids(&self, summaries: &[u64]) -> Result<Vec<(u64, u64)>> {
        let mut seen = std::collections::HashSet::new();
        let unique: Vec<u64> = summaries
            .iter()
            .copied()
            .filter(|v| seen.insert(*v))
            .collect();
        let links = self.read(|c| {
            let mut out = Vec::new();
            for chunk in unique.chunks(IDS_PER_STATEMENT) {
                let (args, marks) = id_list(chunk.iter().copied());
                let mut stmt = c.prepare_cached(&format!(
                    "SELECT s.vid, l.position, m.vid FROM memories s
                       CROSS JOIN summary_sources l ON l.summary = s.rid
                       CROSS JOIN memories m ON m.rid = l.source
                      WHERE s.vid IN ({marks}) AND s.level > 1 AND l.continues = 0
                        AND m.kind = 'summary'"
                ))?;
                let rows = stmt.query_map(rusqlite::params_from_iter(args.iter()), |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })?;
                for row in rows {
                    let (s, pos, m) = row?;
                    let vid = |v: i64| u64::try_from(v).unwrap_or(u64::MAX);
                    out.push((vid(s), pos, vid(m)));
                }
            }
            Ok(out)
        })?;
        Ok(crate::backend::order_child_links(summaries, links))
    }

    /// `thread`'s summaries that no summary cites (the tops of its trees, and summaries not
    /// rolled up yet), oldest first, looking only at the newest `per_level` summaries of each
    /// level: consolidation rolls up the oldest first, so those are where uncited ones are.
    /// A few index seeks per level, whatever the thread's length.
    pub fn top_summaries(&self, thread: &ThreadId, per_level: usize) -> Result<Vec<MemoryUnit>> {
        let t = thread.as_str().to_owned();
        let kind = MemoryKind::Summary.as_str();
        let mut out = self.read_snapshot(|c| {
            let max: Option<i64> = c
                .prepare_cached(
                    "SELECT max(level) FROM memories WHERE thread_id = ?1 AND kind = ?2",
                )?
                .query_row(params![t, kind], |r| r.get(0))?;
            let mut out = Vec::new();
            for level in 1..=max.unwrap_or(0) {
                let args = [
                    Value::Text(t.clone()),
                    Value::Text(kind.to_owned()),
                    Value::Integer(level),
                    Value::Integer(i64::try_from(per_level).unwrap_or(i64::MAX)),
                ];
                out.extend(query_units(
                    c,
                    "WHERE m.rid IN (SELECT rid FROM memories WHERE thread_id = ? AND kind = ? \
                       AND level = ? ORDER BY created_at DESC LIMIT ?) \
                     AND NOT EXISTS (SELECT 1 FROM summary_sources l WHERE l.source = m.rid)",
                    &args,
                )?);
            }
            Ok(out)
        })?;
        out.sort_by_key(|m| m.created_at);
        Ok(out)
    }

    /// The latest time `thread`'s newest level-1 summary covers: its turns up to then are
    /// under summaries, those after it are not yet (`None` without a summary).
    pub fn consolidated_until(&self, thread: &ThreadId) -> Result<Option<DateTime<Utc>>> {
        let t = thread.as_str().to_owned();
        self.read(|c| {
            let until: Option<i64> = c
                .prepare_cached(
                    "SELECT COALESCE(time_end, created_at) FROM memories
                      WHERE thread_id = ?1 AND kind = ?2 AND level = 1
                      ORDER BY created_at DESC LIMIT 1",
                )?
                .query_row(params![t, MemoryKind::Summary.as_str()], |r| r.get(0))
                .or_else(|e| match e {
                    rusqlite::Error::QueryReturnedNoRows => Ok(None),
                    e => Err(e),
                })?;
            Ok(until.map(from_micros))
        })
    }

    /// [`Store::search_keyword_ids`] over only the words of `query` that at most
    /// `max_matches` memories of the store hold (counted by reading at most that many
    /// postings of each word), so its cost is bounded whatever the store's size: a word
    /// most memories hold says little about any of them. Empty when every word is that
    /// common.
    pub fn search_keyword_ids_capped(
        &self,
        query: &str,
        k: usize,
        filter: &Filter,
        max_matches: usize,
    ) -> Result<Vec<(u64, f32)>> {
        let found = self.search_keyword_ids_capped_each(query, &[(k, filter)], max_matches)?;
        Ok(found.into_iter().next().unwrap_or_default())
    }

    /// [`Store::search_keyword_ids_capped`] for several (`k`, filter) asks of one query:
    /// its words are counted once, and every ask reads the same snapshot. One ranking per
    /// ask, in order (none for no asks). Every filter is checked before anything is read: a
    /// bad one is an error whatever its `k` and the query.
    pub fn search_keyword_ids_capped_each(
        &self,
        query: &str,
        asks: &[(usize, &Filter)],
        max_matches: usize,
    ) -> Result<Vec<Vec<(u64, f32)>>> {
        for (_, filter) in asks {
            filter.validate()?;
        }
        let words = fts_words(query);
        if words.is_empty() || asks.iter().all(|&(k, _)| k == 0) {
            return Ok(vec![Vec::new(); asks.len()]);
        }
        let cap = i64::try_from(max_matches.saturating_add(1)).unwrap_or(i64::MAX);
        let vis = self.visibility()?;
        self.read_snapshot(|c| {
            let mut count = c.prepare_cached(
                "SELECT count(*) FROM (SELECT rowid FROM memories_fts
                  WHERE memories_fts MATCH ?1 LIMIT ?2)",
            )?;
            let mut rare = Vec::new();
            for w in words {
                let Some(q) = fts_or(std::slice::from_ref(&w)) else {
                    continue;
                };
                let n: i64 = count.query_row(params![q, cap], |r| r.get(0))?;
                if n < cap {
                    rare.push(w);
                }
            }
            let Some(fts) = fts_or(&rare) else {
                return Ok(vec![Vec::new(); asks.len()]);
            };
            asks.iter()
                .map(|&(k, filter)| {
                    if k == 0 {
                        Ok(Vec::new())
                    } else {
                        keyword_ids(c, fts.clone(), k, filter, vis)
                    }
                })
                .collect()
        })
    }
}
