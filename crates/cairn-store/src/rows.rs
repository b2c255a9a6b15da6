//! Row encoding: memories to and from SQLite values, and filter clauses.

use chrono::{DateTime, Utc};
use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension, Row};

use cairn_core::{
    InputError, MemoryId, MemoryKind, MemoryUnit, Metadata, Role, SummaryInfo, SummaryType,
    ThreadId,
};

use crate::{Result, StoreError};

/// Columns read for a memory, in the order [`decode`] expects (alias `m`).
pub(crate) const COLS: &str = "m.rid, m.id, m.kind, m.thread_id, m.role, m.content, m.created_at, \
     m.metadata, m.level, m.summary_type, m.time_start, m.time_end, m.source_count, m.stale, \
     m.expires_at, m.valid_from, m.valid_to, (SELECT o.id FROM memories o WHERE o.rid = m.supersedes)";

/// A decoded row plus its rowid (summary sources are attached afterwards).
pub(crate) struct RawRow {
    pub rid: i64,
    pub unit: MemoryUnit,
}

pub(crate) fn to_micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

pub(crate) fn from_micros(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

fn corrupt(what: &str, detail: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        0,
        rusqlite::types::Type::Text,
        format!("stored {what} is invalid: {detail}").into(),
    )
}

/// Decodes a row selected with [`COLS`].
pub(crate) fn decode(r: &Row<'_>) -> rusqlite::Result<RawRow> {
    let rid: i64 = r.get(0)?;
    let id: [u8; 16] = r.get(1)?;
    let kind: String = r.get(2)?;
    let kind: MemoryKind = kind.parse().map_err(|e| corrupt("kind", e))?;
    let thread: Option<String> = r.get(3)?;
    let thread_id = thread
        .map(ThreadId::new)
        .transpose()
        .map_err(|e| corrupt("thread", e))?;
    let role: Option<String> = r.get(4)?;
    let role = role
        .map(|x| x.parse::<Role>())
        .transpose()
        .map_err(|e| corrupt("role", e))?;
    let metadata: String = r.get(7)?;
    let metadata: Metadata = serde_json::from_str(&metadata).map_err(|e| corrupt("metadata", e))?;
    let level: u32 = r.get(8)?;
    let summary_type: Option<String> = r.get(9)?;
    let summary = match summary_type {
        None => None,
        Some(t) => {
            let summary_type: SummaryType = t.parse().map_err(|e| corrupt("summary type", e))?;
            let start: Option<i64> = r.get(10)?;
            let end: Option<i64> = r.get(11)?;
            let count: Option<i64> = r.get(12)?;
            let stale: bool = r.get(13)?;
            Some(SummaryInfo {
                summary_type,
                source_ids: Vec::new(),
                time_range_start: from_micros(start.unwrap_or(0)),
                time_range_end: from_micros(end.unwrap_or(0)),
                source_count: usize::try_from(count.unwrap_or(0)).unwrap_or(0),
                level,
                stale,
                continues: None,
            })
        }
    };
    Ok(RawRow {
        rid,
        unit: MemoryUnit {
            id: MemoryId::from_bytes(id),
            kind,
            thread_id,
            role,
            content: r.get(5)?,
            created_at: from_micros(r.get(6)?),
            metadata,
            level,
            summary,
            lifetime: cairn_core::Lifetime {
                expires_at: r.get::<_, Option<i64>>(14)?.map(from_micros),
                valid_from: r.get::<_, Option<i64>>(15)?.map(from_micros),
                valid_to: r.get::<_, Option<i64>>(16)?.map(from_micros),
                supersedes: r.get::<_, Option<[u8; 16]>>(17)?.map(MemoryId::from_bytes),
            },
        },
    })
}

/// Fills in `source_ids` of every summary row.
pub(crate) fn attach_sources(conn: &Connection, rows: &mut [RawRow]) -> Result<()> {
    let mut stmt = conn.prepare_cached(
        "SELECT s.id, l.continues FROM summary_sources l JOIN memories s ON s.rid = l.source
         WHERE l.summary = ?1 ORDER BY l.position",
    )?;
    for row in rows.iter_mut() {
        if let Some(info) = row.unit.summary.as_mut() {
            let links: Vec<(MemoryId, bool)> = stmt
                .query_map(params![row.rid], |r| {
                    Ok((
                        MemoryId::from_bytes(r.get::<_, [u8; 16]>(0)?),
                        r.get::<_, bool>(1)?,
                    ))
                })?
                .collect::<rusqlite::Result<_>>()?;
            info.continues = links.iter().find(|(_, c)| *c).map(|(id, _)| *id);
            info.source_ids = links.into_iter().map(|(id, _)| id).collect();
        }
    }
    Ok(())
}

/// Reads rows with a `WHERE` clause (over alias `m`) and attaches summary sources.
pub(crate) fn query_units(
    conn: &Connection,
    where_order: &str,
    args: &[Value],
) -> Result<Vec<MemoryUnit>> {
    let sql = format!("SELECT {COLS} FROM memories m {where_order}");
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows: Vec<RawRow> = stmt
        .query_map(rusqlite::params_from_iter(args.iter()), decode)?
        .collect::<rusqlite::Result<_>>()?;
    attach_sources(conn, &mut rows)?;
    Ok(rows.into_iter().map(|r| r.unit).collect())
}

/// [`query_units`] with one more integer column (`extra`, such as `", m.vid"`) returned
/// beside each memory.
pub(crate) fn query_units_with(
    conn: &Connection,
    extra: &str,
    where_order: &str,
    args: &[Value],
) -> Result<Vec<(MemoryUnit, i64)>> {
    let sql = format!("SELECT {COLS}{extra} FROM memories m {where_order}");
    let mut stmt = conn.prepare_cached(&sql)?;
    let n = COLS.split(',').count();
    let mut rows: Vec<RawRow> = Vec::new();
    let mut extras: Vec<i64> = Vec::new();
    let mut q = stmt.query(rusqlite::params_from_iter(args.iter()))?;
    while let Some(r) = q.next()? {
        rows.push(decode(r)?);
        extras.push(r.get(n)?);
    }
    attach_sources(conn, &mut rows)?;
    Ok(rows.into_iter().map(|r| r.unit).zip(extras).collect())
}

/// The rowid of a memory id.
pub(crate) fn rid_of(conn: &Connection, id: MemoryId) -> Result<i64> {
    conn.prepare_cached("SELECT rid FROM memories WHERE id = ?1")?
        .query_row(params![id.as_bytes()], |r| r.get(0))
        .optional()?
        .ok_or(StoreError::NotFound { id })
}

/// Reads one memory.
pub(crate) fn get_unit(conn: &Connection, id: MemoryId) -> Result<MemoryUnit> {
    query_units(
        conn,
        "WHERE m.id = ?1",
        &[Value::Blob(id.as_bytes().to_vec())],
    )?
    .pop()
    .ok_or(StoreError::NotFound { id })
}

/// Encodes a vector as little-endian f32 bytes.
pub(crate) fn encode_vector(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Decodes a little-endian f32 BLOB.
pub(crate) fn decode_vector(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A condition on one top-level metadata field; every condition given must hold (a field
/// that is absent fails all but `exists: false`). Values compare as SQLite compares JSON
/// values: numbers as numbers, text as text (so write times as RFC 3339 text in one form,
/// such as `2026-03-01T00:00:00Z`, for ranges on them to follow time).
///
/// ```
/// use cairn_store::MetaFilter;
/// let f = MetaFilter::eq("user_id", "alice");
/// let g = MetaFilter::new("priority").gte(2).lt(5);
/// let h = MetaFilter::new("tag").one_of(["work", "home"]);
/// assert!(f.validate().is_ok() && g.validate().is_ok() && h.validate().is_ok());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetaFilter {
    /// The metadata field (a top-level key of the object).
    pub key: String,
    /// Equal to this value (text, number or boolean).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eq: Option<serde_json::Value>,
    /// Not equal to this value (an absent field does not match).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ne: Option<serde_json::Value>,
    /// Equal to one of these values.
    #[serde(default, rename = "in", skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<serde_json::Value>>,
    /// Greater than.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gt: Option<serde_json::Value>,
    /// Greater than or equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gte: Option<serde_json::Value>,
    /// Less than.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lt: Option<serde_json::Value>,
    /// Less than or equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lte: Option<serde_json::Value>,
    /// Present (`true`) or absent (`false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exists: Option<bool>,
}

/// The longest metadata key a filter accepts, in bytes.
pub const MAX_META_KEY_BYTES: usize = 256;
/// The most values in one `in` condition.
pub const MAX_META_SET: usize = 1_000;

impl MetaFilter {
    /// A condition on `key` with nothing set yet.
    pub fn new(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            ..Self::default()
        }
    }

    /// `key` equal to `value`.
    pub fn eq(key: impl Into<String>, value: impl Into<serde_json::Value>) -> Self {
        Self {
            eq: Some(value.into()),
            ..Self::new(key)
        }
    }

    /// Not equal to `value`.
    pub fn ne(mut self, value: impl Into<serde_json::Value>) -> Self {
        self.ne = Some(value.into());
        self
    }

    /// Equal to one of `values`.
    pub fn one_of<V: Into<serde_json::Value>>(
        mut self,
        values: impl IntoIterator<Item = V>,
    ) -> Self {
        self.one_of = Some(values.into_iter().map(Into::into).collect());
        self
    }

    /// Greater than `value`.
    pub fn gt(mut self, value: impl Into<serde_json::Value>) -> Self {
        self.gt = Some(value.into());
        self
    }

    /// Greater than or equal to `value`.
    pub fn gte(mut self, value: impl Into<serde_json::Value>) -> Self {
        self.gte = Some(value.into());
        self
    }

    /// Less than `value`.
    pub fn lt(mut self, value: impl Into<serde_json::Value>) -> Self {
        self.lt = Some(value.into());
        self
    }

    /// Less than or equal to `value`.
    pub fn lte(mut self, value: impl Into<serde_json::Value>) -> Self {
        self.lte = Some(value.into());
        self
    }

    /// Present (`true`) or absent (`false`).
    pub fn exists(mut self, present: bool) -> Self {
        self.exists = Some(present);
        self
    }

    /// Checks the key and values: a key of 1 to [`MAX_META_KEY_BYTES`] bytes without `"`,
    /// at least one condition, scalar values (ranges: numbers or text), at most
    /// [`MAX_META_SET`] values in `in`.
    pub fn validate(&self) -> Result<(), InputError> {
        let bad = |reason| {
            Err(InputError::BadMetadataFilter {
                key: self.key.chars().take(64).collect(),
                reason,
            })
        };
        if self.key.is_empty() || self.key.len() > MAX_META_KEY_BYTES {
            return bad("the key must be 1 to 256 bytes");
        }
        if self.key.contains('"') || self.key.chars().any(char::is_control) {
            return bad("the key must not hold quotes or control characters");
        }
        let scalar = |v: &serde_json::Value| {
            matches!(
                v,
                serde_json::Value::String(_)
                    | serde_json::Value::Number(_)
                    | serde_json::Value::Bool(_)
            )
        };
        let orderable = |v: &serde_json::Value| {
            matches!(
                v,
                serde_json::Value::String(_) | serde_json::Value::Number(_)
            )
        };
        if self.eq.as_ref().is_some_and(|v| !scalar(v))
            || self.ne.as_ref().is_some_and(|v| !scalar(v))
        {
            return bad("eq and ne take text, a number or a boolean (use exists for null)");
        }
        if let Some(set) = &self.one_of {
            if set.is_empty() || set.len() > MAX_META_SET {
                return bad("in takes 1 to 1,000 values");
            }
            if !set.iter().all(scalar) {
                return bad("in takes text, numbers or booleans");
            }
        }
        if [&self.gt, &self.gte, &self.lt, &self.lte]
            .into_iter()
            .flatten()
            .any(|v| !orderable(v))
        {
            return bad("ranges take numbers or text");
        }
        if self.eq.is_none()
            && self.ne.is_none()
            && self.one_of.is_none()
            && self.gt.is_none()
            && self.gte.is_none()
            && self.lt.is_none()
            && self.lte.is_none()
            && self.exists.is_none()
        {
            return bad("no condition given (eq, ne, in, gt, gte, lt, lte or exists)");
        }
        Ok(())
    }

    /// SQL conditions over alias `m` (each starting with " AND "), with their parameters.
    fn sql(&self, sql: &mut String, args: &mut Vec<Value>) {
        let path = format!("$.\"{}\"", self.key);
        let cmp = |op: &str, v: &serde_json::Value, sql: &mut String, args: &mut Vec<Value>| {
            sql.push_str(" AND json_extract(m.metadata, ?) ");
            sql.push_str(op);
            sql.push_str(" ?");
            args.push(Value::Text(path.clone()));
            args.push(json_sql(v));
        };
        if let Some(v) = &self.eq {
            cmp("=", v, sql, args);
        }
        if let Some(v) = &self.ne {
            cmp("<>", v, sql, args);
        }
        if let Some(v) = &self.gt {
            cmp(">", v, sql, args);
        }
        if let Some(v) = &self.gte {
            cmp(">=", v, sql, args);
        }
        if let Some(v) = &self.lt {
            cmp("<", v, sql, args);
        }
        if let Some(v) = &self.lte {
            cmp("<=", v, sql, args);
        }
        if let Some(set) = &self.one_of {
            sql.push_str(" AND json_extract(m.metadata, ?) IN (");
            args.push(Value::Text(path.clone()));
            for (i, v) in set.iter().enumerate() {
                sql.push_str(if i == 0 { "?" } else { ", ?" });
                args.push(json_sql(v));
            }
            sql.push(')');
        }
        if let Some(present) = self.exists {
            // json_type is NULL only for an absent key (a JSON null has type 'null').
            sql.push_str(if present {
                " AND json_type(m.metadata, ?) IS NOT NULL"
            } else {
                " AND json_type(m.metadata, ?) IS NULL"
            });
            args.push(Value::Text(path));
        }
    }
}

/// The text form of a condition, as the CLI and query strings take it: `KEY=V`, `KEY!=V`,
/// `KEY>V`, `KEY>=V`, `KEY<V`, `KEY<=V`, `KEY=[V1,V2]` (one of), `KEY?` (present) and
/// `!KEY` (absent). A value is read as JSON when it parses as JSON (`3`, `true`, `"3"`)
/// and as text otherwise (`alice`, `2026-03-01T00:00:00Z`).
///
/// ```
/// use cairn_store::MetaFilter;
/// let f: MetaFilter = "priority>=2".parse().unwrap();
/// assert_eq!(f, MetaFilter::new("priority").gte(2));
/// let g: MetaFilter = "user_id=alice".parse().unwrap();
/// assert_eq!(g, MetaFilter::eq("user_id", "alice"));
/// ```
impl std::str::FromStr for MetaFilter {
    type Err = InputError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let value = |v: &str| -> serde_json::Value {
            serde_json::from_str(v.trim())
                .unwrap_or_else(|_| serde_json::Value::String(v.trim().to_owned()))
        };
        let f = if let Some(k) = s.strip_suffix('?') {
            Self::new(k.trim()).exists(true)
        } else if let Some(k) = s.strip_prefix('!') {
            Self::new(k.trim()).exists(false)
        } else {
            let ops = ["!=", ">=", "<=", "=", ">", "<"];
            let Some((at, op)) = ops
                .iter()
                .filter_map(|op| s.find(op).map(|i| (i, *op)))
                .min_by_key(|(i, op)| (*i, std::cmp::Reverse(op.len())))
            else {
                return Err(InputError::BadMetadataFilter {
                    key: s.chars().take(64).collect(),
                    reason: "expected KEY=V, KEY!=V, KEY>V, KEY>=V, KEY<V, KEY<=V, KEY? or !KEY",
                });
            };
            let key = s[..at].trim();
            let v = value(&s[at + op.len()..]);
            let f = Self::new(key);
            match (op, v) {
                ("=", serde_json::Value::Array(set)) => Self {
                    one_of: Some(set),
                    ..f
                },
                ("=", v) => Self { eq: Some(v), ..f },
                ("!=", v) => f.ne(v),
                (">", v) => f.gt(v),
                (">=", v) => f.gte(v),
                ("<", v) => f.lt(v),
                (_, v) => f.lte(v),
            }
        };
        f.validate()?;
        Ok(f)
    }
}

/// What reads hide: memories expired or superseded at `now`, when the store holds any
/// (`timed`; otherwise no condition is added).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Visibility {
    pub now: i64,
    pub timed: bool,
}

/// A JSON scalar as the SQL value `json_extract` returns for it.
fn json_sql(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::String(s) => Value::Text(s.clone()),
        serde_json::Value::Bool(b) => Value::Integer(i64::from(*b)),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Integer(i),
            None => Value::Real(n.as_f64().unwrap_or(f64::NAN)),
        },
        _ => Value::Null,
    }
}

/// Which memories a read or search considers.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Filter {
    /// Only these kinds (all kinds when empty).
    pub kinds: Vec<MemoryKind>,
    /// Only this thread.
    pub thread: Option<ThreadId>,
    /// Only memories of no thread (knowledge, thread-less summaries...). Cannot be combined
    /// with `thread`.
    #[serde(default)]
    pub thread_less: bool,
    /// Only levels at or above.
    pub min_level: Option<u32>,
    /// Only levels at or below.
    pub max_level: Option<u32>,
    /// Only memories created at or after.
    pub after: Option<DateTime<Utc>>,
    /// Only memories created before.
    pub before: Option<DateTime<Utc>>,
    /// Only memories whose metadata meets every one of these conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metadata: Vec<MetaFilter>,
    /// The facts that held at this time (their `valid_from` at or before it, their
    /// `valid_to` after it) instead of the current ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of: Option<DateTime<Utc>>,
    /// Superseded facts too (every version), not only the current ones.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub history: bool,
    /// Memories past their expiry too (they stay until consolidation deletes them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expired: bool,
}

impl Filter {
    /// No restriction.
    pub fn all() -> Self {
        Self::default()
    }

    /// Restricts to kinds.
    pub fn kinds(mut self, kinds: impl IntoIterator<Item = MemoryKind>) -> Self {
        self.kinds = kinds.into_iter().collect();
        self
    }

    /// Restricts to a thread.
    pub fn thread(mut self, thread: ThreadId) -> Self {
        self.thread = Some(thread);
        self
    }

    /// Restricts to memories of no thread.
    pub fn thread_less(mut self) -> Self {
        self.thread_less = true;
        self
    }

    /// Restricts to a level range (inclusive).
    pub fn levels(mut self, min: u32, max: u32) -> Self {
        self.min_level = Some(min);
        self.max_level = Some(max);
        self
    }

    /// Restricts to `[after, before)`.
    pub fn between(mut self, after: DateTime<Utc>, before: DateTime<Utc>) -> Self {
        self.after = Some(after);
        self.before = Some(before);
        self
    }

    /// The facts that held at `t` instead of the current ones.
    pub fn as_of(mut self, t: DateTime<Utc>) -> Self {
        self.as_of = Some(t);
        self
    }

    /// Every version of superseded facts too.
    pub fn with_history(mut self) -> Self {
        self.history = true;
        self
    }

    /// Adds a metadata condition.
    pub fn meta(mut self, condition: MetaFilter) -> Self {
        self.metadata.push(condition);
        self
    }

    /// True when nothing is restricted.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), InputError> {
        if self.thread_less && self.thread.is_some() {
            return Err(InputError::OutOfRange {
                name: "thread_less",
                value: "true".into(),
                expected: "false when a thread is given",
            });
        }
        if let (Some(a), Some(b)) = (self.after, self.before) {
            if a > b {
                return Err(InputError::InvalidTimeRange);
            }
        }
        if let (Some(a), Some(b)) = (self.min_level, self.max_level) {
            if a > b {
                return Err(InputError::OutOfRange {
                    name: "min_level",
                    value: a.to_string(),
                    expected: "at most max_level",
                });
            }
        }
        if self.metadata.len() > 64 {
            return Err(InputError::OutOfRange {
                name: "metadata",
                value: self.metadata.len().to_string(),
                expected: "at most 64 conditions",
            });
        }
        for m in &self.metadata {
            m.validate()?;
        }
        Ok(())
    }

    /// SQL conditions over alias `m` (each starting with " AND "), with their parameters:
    /// what the filter admits among the memories visible at `now` (microseconds): not
    /// expired and, unless `history` or `as_of` says otherwise, not superseded.
    pub(crate) fn sql_at(&self, vis: Visibility) -> (String, Vec<Value>) {
        let now = vis.now;
        let (mut sql, mut args) = if self.expired || !vis.timed {
            (String::new(), Vec::new())
        } else {
            (
                String::from(" AND (m.expires_at IS NULL OR m.expires_at > ?)"),
                vec![Value::Integer(now)],
            )
        };
        if let Some(t) = self.as_of {
            sql.push_str(
                " AND COALESCE(m.valid_from, m.created_at) <= ? AND (m.valid_to IS NULL OR m.valid_to > ?)",
            );
            args.push(Value::Integer(to_micros(t)));
            args.push(Value::Integer(to_micros(t)));
        } else if !self.history && vis.timed {
            sql.push_str(" AND (m.valid_to IS NULL OR m.valid_to > ?)");
            args.push(Value::Integer(now));
        }
        if !self.kinds.is_empty() {
            sql.push_str(" AND m.kind IN (");
            for (i, k) in self.kinds.iter().enumerate() {
                sql.push_str(if i == 0 { "?" } else { ", ?" });
                args.push(Value::Text(k.as_str().to_owned()));
            }
            sql.push(')');
        }
        if let Some(t) = &self.thread {
            sql.push_str(" AND m.thread_id = ?");
            args.push(Value::Text(t.as_str().to_owned()));
        }
        if self.thread_less {
            sql.push_str(" AND m.thread_id IS NULL");
        }
        if let Some(l) = self.min_level {
            sql.push_str(" AND m.level >= ?");
            args.push(Value::Integer(i64::from(l)));
        }
        if let Some(l) = self.max_level {
            sql.push_str(" AND m.level <= ?");
            args.push(Value::Integer(i64::from(l)));
        }
        if let Some(t) = self.after {
            sql.push_str(" AND m.created_at >= ?");
            args.push(Value::Integer(to_micros(t)));
        }
        if let Some(t) = self.before {
            sql.push_str(" AND m.created_at < ?");
            args.push(Value::Integer(to_micros(t)));
        }
        for m in &self.metadata {
            m.sql(&mut sql, &mut args);
        }
        (sql, args)
    }
}
