//! Reads of context assembly that take index ids (here: row ids): times, summary spans, and
//! how far a thread is consolidated.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;

use cairn_core::MemoryKind;

use crate::{pg, Cached, Result};

/// Index ids as row ids; one past `i64::MAX` names no row.
pub(crate) fn rids(vids: &[u64]) -> Vec<i64> {
    vids.iter()
        .map(|v| i64::try_from(*v).unwrap_or(-1))
        .collect()
}

/// When each of `rids` happened, in their order; unknown ids are left out.
pub(crate) async fn times_of<C: GenericClient + Sync>(
    c: &C,
    rids: &[i64],
) -> Result<Vec<(u64, DateTime<Utc>)>> {
    let rows = c
        .rows(
            "SELECT r.rid, m.created_at
               FROM unnest($1::bigint[]) WITH ORDINALITY AS r (rid, n)
               JOIN memories m ON m.rid = r.rid
              ORDER BY r.n",
            &[&rids],
        )
        .await
        .map_err(pg)?;
    Ok(rows
        .iter()
        .filter_map(|r| Some((u64::try_from(r.get::<_, i64>(0)).ok()?, r.get(1))))
        .collect())
}

/// The span of each summary of `rids`, in their order; ids that are not summaries (or have
/// no span) are left out.
#[allow(clippy::type_complexity)]
pub(crate) async fn summary_spans<C: GenericClient + Sync>(
    c: &C,
    rids: &[i64],
) -> Result<Vec<(u64, DateTime<Utc>, DateTime<Utc>)>> {
    let rows = c
        .rows(
            "SELECT r.rid, m.time_start, m.time_end
               FROM unnest($1::bigint[]) WITH ORDINALITY AS r (rid, n)
               JOIN memories m ON m.rid = r.rid
              WHERE m.kind = 'summary' AND m.time_start IS NOT NULL
                AND m.time_end IS NOT NULL
              ORDER BY r.n",
            &[&rids],
        )
        .await
        .map_err(pg)?;
    Ok(rows
        .iter()
        .filter_map(|r| Some((u64::try_from(r.get::<_, i64>(0)).ok()?, r.get(1), r.get(2))))
        .collect())
}

/// The latest time a thread's newest level-1 summary covers.
pub(crate) async fn consolidated_until<C: GenericClient + Sync>(
    c: &C,
    thread: &str,
) -> Result<Option<DateTime<Utc>>> {
    let row = c
        .row_opt(
            "SELECT COALESCE(time_end, created_at) FROM memories
              WHERE thread_id = $1 AND kind = $2 AND level = 1
              ORDER BY created_at DESC, rid DESC LIMIT 1",
            &[&thread, &MemoryKind::Summary.as_str()],
        )
        .await
        .map_err(pg)?;
    Ok(row.map(|r| r.get(0)))
}
