//! SQLite schema and migrations, versioned with `PRAGMA user_version`.

use rusqlite::{params, Connection, OptionalExtension};

use crate::{Result, StoreError, StoreOptions};

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i64 = 9;

/// Migrations: entry `i` moves a database from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE store_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE memories (
    rid          INTEGER PRIMARY KEY,
    id           BLOB NOT NULL UNIQUE CHECK (length(id) = 16),
    vid          INTEGER NOT NULL UNIQUE,
    kind         TEXT NOT NULL,
    thread_id    TEXT,
    role         TEXT,
    content      TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    metadata     TEXT NOT NULL DEFAULT '{}',
    level        INTEGER NOT NULL DEFAULT 0,
    summary_type TEXT,
    time_start   INTEGER,
    time_end     INTEGER,
    source_count INTEGER,
    stale        INTEGER NOT NULL DEFAULT 0,
    model_id     TEXT NOT NULL,
    embedding    BLOB NOT NULL
);
CREATE INDEX memories_thread_time ON memories (thread_id, created_at);
CREATE INDEX memories_kind_level ON memories (kind, level, created_at);
CREATE INDEX memories_time ON memories (created_at);

CREATE TABLE summary_sources (
    summary  INTEGER NOT NULL REFERENCES memories (rid) ON DELETE CASCADE,
    source   INTEGER NOT NULL REFERENCES memories (rid) ON DELETE RESTRICT,
    position INTEGER NOT NULL,
    PRIMARY KEY (summary, position),
    UNIQUE (summary, source)
) WITHOUT ROWID;
CREATE INDEX summary_sources_source ON summary_sources (source);

CREATE VIRTUAL TABLE memories_fts USING fts5 (
    content,
    content = 'memories',
    content_rowid = 'rid',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
"#,
    // 2: the thread index covers what a filtered exact scan needs (kind, level, vid), so
    // scanning a thread reads the index alone instead of one table page per row.
    r#"
DROP INDEX memories_thread_time;
CREATE INDEX memories_thread_time ON memories (thread_id, created_at, kind, level, vid);
"#,
    // 3: the thread index also covers what ranking a thread's turns needs (speaker and
    // length), so a thread's timeline reads the index alone.
    r#"
DROP INDEX memories_thread_time;
CREATE INDEX memories_thread_time ON memories (
    thread_id, created_at, kind, level, vid,
    json_extract(metadata, '$.speaker'), length(content)
);
"#,
    // 4: a thread's speakers, one index seek each (`Store::thread_speakers`), so context
    // assembly knows the names in a query before it reads the thread's timeline.
    r#"
CREATE INDEX memories_thread_speaker ON memories (
    thread_id, json_extract(metadata, '$.speaker')
) WHERE json_extract(metadata, '$.speaker') IS NOT NULL;
"#,
    // 5: the index log: every write names the vector ids whose index entry it changed, so
    // another process on the same file catches its index up by reading the log past the
    // last sequence number it saw (`origin` tells a process's own writes from others').
    r#"
CREATE TABLE index_log (
    seq    INTEGER PRIMARY KEY AUTOINCREMENT,
    vid    INTEGER NOT NULL,
    origin INTEGER NOT NULL
);
"#,
    // 6: moving summaries and per-thread state (conversation memories).
    // * `continues`: a link from a summary to the earlier version it continues; it does not
    //   raise the level (`Store::add_continuation`).
    // * `thread_state`: small named values per thread (`Store::thread_state`).
    // * rowids are never reused (`next_rid`), so they are the insertion sequence
    //   (`Store::thread_tail`), read through `memories_thread_rid`.
    r#"
ALTER TABLE summary_sources ADD COLUMN continues INTEGER NOT NULL DEFAULT 0;
CREATE TABLE thread_state (
    thread_id TEXT NOT NULL,
    name      TEXT NOT NULL,
    value     TEXT NOT NULL,
    PRIMARY KEY (thread_id, name)
) WITHOUT ROWID;
CREATE INDEX memories_thread_rid ON memories (thread_id, rid);
INSERT OR REPLACE INTO store_meta (key, value)
    SELECT 'next_rid', CAST(COALESCE(MAX(rid), 0) + 1 AS TEXT) FROM memories;
"#,
    // 7: a thread's summaries by level, newest first, without reading its turns
    // (`Store::top_summaries`, `Store::consolidated_until`), and their index ids from the
    // index alone (an exact vector scan of a thread's summaries): bounded context assembly
    // on long threads.
    r#"
CREATE INDEX memories_thread_kind_level ON memories (thread_id, kind, level, created_at, vid);
"#,
    // 8: lifetimes. `expires_at` hides a memory from reads from then on (consolidation deletes
    // it); `valid_from` / `valid_to` bound when a fact held (NULL: from its time / still);
    // `supersedes` is the rowid of the earlier fact a memory replaced.
    r#"
ALTER TABLE memories ADD COLUMN expires_at INTEGER;
ALTER TABLE memories ADD COLUMN valid_from INTEGER;
ALTER TABLE memories ADD COLUMN valid_to INTEGER;
ALTER TABLE memories ADD COLUMN supersedes INTEGER;
CREATE INDEX memories_expires ON memories (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX memories_supersedes ON memories (supersedes) WHERE supersedes IS NOT NULL;
CREATE INDEX memories_valid_to ON memories (valid_to) WHERE valid_to IS NOT NULL;
"#,
    // 9: every column a `Filter` tests but metadata, by rowid, so a keyword search filters
    // its matches from this index instead of reading each match's row (content and
    // embedding: a page per match). On a thread of repeated texts a rare word has thousands
    // of matches.
    r#"
CREATE INDEX memories_rid_filter ON memories (
    rid, vid, kind, thread_id, level, created_at, valid_from, valid_to, expires_at
);
"#,
];

/// Settings for every connection, reader or writer: a query plan that does not depend on
/// bound values (SQLite built with STAT4 otherwise re-prepares a statement each time a
/// parameter compared with an indexed column changes, which profiling found to be an eighth
/// of `assemble_context`), and room for the store's few dozen distinct statements in the
/// prepared-statement cache.
pub fn tune(conn: &Connection) -> Result<()> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}

/// Applies connection settings: WAL, busy timeout, foreign keys, synchronous level, and
/// `secure_delete` (deleted content is overwritten with zeros, so a forgotten memory's
/// bytes do not stay in the file's free space; see [`crate::Store::erase_deleted`]).
pub fn configure(conn: &Connection, synchronous_full: bool) -> Result<()> {
    tune(conn)?;
    conn.busy_timeout(std::time::Duration::from_secs(30))?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "secure_delete", "ON")?;
    let sync = if synchronous_full { "FULL" } else { "NORMAL" };
    conn.pragma_update(None, "synchronous", sync)?;
    Ok(())
}

/// Brings the database to [`SCHEMA_VERSION`] and checks its model identity.
///
/// A database from a newer build is refused; a fresh one records `options`' model id and
/// dimension.
pub fn migrate(conn: &mut Connection, options: &StoreOptions) -> Result<()> {
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(mode, "could not switch the database to WAL mode");
    }
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::FormatTooNew {
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    let start = usize::try_from(version).map_err(|_| StoreError::FormatTooNew {
        found: version,
        supported: SCHEMA_VERSION,
    })?;
    if start == 0 {
        // A version-0 file must be empty: refuse to build our schema beside someone else's.
        let tables: i64 = conn.query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
            [],
            |r| r.get(0),
        )?;
        if tables > 0 {
            return Err(StoreError::Config(
                "the file is an SQLite database of another application (it has tables but no Cairn schema version)".into(),
            ));
        }
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(start) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(
            None,
            "user_version",
            i64::try_from(i + 1).unwrap_or(i64::MAX),
        )?;
        tx.commit()?;
    }
    check_identity(conn, options)
}

pub(crate) fn check_identity(conn: &Connection, options: &StoreOptions) -> Result<()> {
    let get = |key: &str| -> Result<Option<String>> {
        Ok(conn
            .query_row(
                "SELECT value FROM store_meta WHERE key = ?1",
                params![key],
                |r| r.get(0),
            )
            .optional()?)
    };
    match (get("model_id")?, get("dim")?) {
        (Some(model), Some(dim)) => {
            let stored_dim: usize = dim.parse().unwrap_or(0);
            if model != options.model_id || stored_dim != options.dim {
                return Err(StoreError::ModelMismatch {
                    stored_model: model,
                    stored_dim,
                    requested_model: options.model_id.clone(),
                    requested_dim: options.dim,
                });
            }
            Ok(())
        }
        _ => {
            conn.execute(
                "INSERT OR REPLACE INTO store_meta (key, value) VALUES
                 ('model_id', ?1), ('dim', ?2), ('format_version', ?3), ('next_vid', COALESCE((SELECT value FROM store_meta WHERE key = 'next_vid'), '1'))",
                params![
                    options.model_id,
                    options.dim.to_string(),
                    SCHEMA_VERSION.to_string()
                ],
            )?;
            Ok(())
        }
    }
}
