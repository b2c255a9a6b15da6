//! Schema, migrations, row decoding and filter clauses for PostgreSQL.

use chrono::{DateTime, Utc};
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use cairn_core::{
    Lifetime, MemoryId, MemoryKind, MemoryUnit, Metadata, Role, SummaryInfo, SummaryType, ThreadId,
};
use cairn_store::{Filter, MetaFilter, Result, StoreError};

use crate::{pg, Param, PgOptions};

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i64 = 3;

/// Columns read for a memory, in the order [`decode`] expects (alias `m`).
pub const COLS: &str = "m.rid, m.id, m.kind, m.thread_id, m.role, m.content, m.created_at, \
     m.metadata, m.level, m.summary_type, m.time_start, m.time_end, m.source_count, m.stale, \
     m.expires_at, m.valid_from, m.valid_to, (SELECT o.id FROM memories o WHERE o.rid = m.supersedes)";

/// Migration `i` moves a store from version `i` to `i + 1`; `{dim}` is the embedding
/// dimension, `{schema}` the store's schema.
///
/// Version 2 keeps the collection statistics BM25 needs (memories and their token count)
/// in `fts_stats`: statement triggers append one row of deltas per write statement, so
/// concurrent writers never wait on each other, and every 64th row folds the committed ones
/// into one (rows locked by another folder are skipped). It also indexes each thread's
/// speakers for the skip scan of `thread_speakers`, and each thread's memories by kind and
/// level (a thread's summaries, its turn count) so those reads skip the thread's other rows.
///
/// Version 3 turns off the keyword index's pending list (`fastupdate`): GIN appends new
/// entries to an unsorted list of up to 4 MB that every search reads whole, which cost a
/// keyword search 10-18 ms at 100,000 memories after a load (0.1 ms without). Writes
/// update the index in place instead, at no measurable cost beside the HNSW index.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE memories (
    rid          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id           uuid NOT NULL UNIQUE,
    kind         text NOT NULL,
    thread_id    text,
    role         text,
    content      text NOT NULL,
    created_at   timestamptz NOT NULL,
    metadata     jsonb NOT NULL DEFAULT '{}',
    level        integer NOT NULL DEFAULT 0,
    summary_type text,
    time_start   timestamptz,
    time_end     timestamptz,
    source_count integer,
    stale        boolean NOT NULL DEFAULT false,
    expires_at   timestamptz,
    valid_from   timestamptz,
    valid_to     timestamptz,
    supersedes   bigint REFERENCES memories (rid) ON DELETE SET NULL,
    model_id     text NOT NULL,
    embedding    vector({dim}) NOT NULL,
    fts          tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED
);
CREATE INDEX memories_thread_time ON memories (thread_id, created_at, rid);
CREATE INDEX memories_kind_level ON memories (kind, level, created_at);
CREATE INDEX memories_time ON memories (created_at, rid);
CREATE INDEX memories_supersedes ON memories (supersedes) WHERE supersedes IS NOT NULL;
CREATE INDEX memories_embedding ON memories USING hnsw (embedding vector_cosine_ops);
CREATE INDEX memories_fts ON memories USING gin (fts);
CREATE TABLE summary_sources (
    summary   bigint NOT NULL REFERENCES memories (rid) ON DELETE CASCADE,
    source    bigint NOT NULL REFERENCES memories (rid) ON DELETE RESTRICT,
    position  integer NOT NULL,
    continues boolean NOT NULL DEFAULT false,
    PRIMARY KEY (summary, position),
    UNIQUE (summary, source)
);
CREATE INDEX summary_sources_source ON summary_sources (source);
CREATE TABLE thread_state (
    thread_id text NOT NULL,
    name      text NOT NULL,
    value     text NOT NULL,
    PRIMARY KEY (thread_id, name)
);
"#,
    r#"
CREATE FUNCTION {schema}.cairn_doclen(tsvector) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
    AS $$ SELECT coalesce(sum(coalesce(array_length(positions, 1), 1)), 0)::bigint FROM unnest($1) $$;
CREATE TABLE fts_stats (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    docs   bigint NOT NULL,
    tokens bigint NOT NULL
);
INSERT INTO fts_stats (docs, tokens)
    SELECT count(*), coalesce(sum({schema}.cairn_doclen(fts)), 0) FROM memories;
CREATE FUNCTION {schema}.cairn_fts_stats() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d bigint := 0;
    t bigint := 0;
    r bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT count(*), coalesce(sum({schema}.cairn_doclen(fts)), 0) INTO d, t FROM new_rows;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT -count(*), -coalesce(sum({schema}.cairn_doclen(fts)), 0) INTO d, t FROM old_rows;
    ELSE
        -- Only rewritten texts change the counts (most updates touch metadata or flags).
        SELECT coalesce(sum({schema}.cairn_doclen(n.fts) - {schema}.cairn_doclen(o.fts)), 0)
            INTO t FROM old_rows o JOIN new_rows n USING (rid) WHERE n.fts <> o.fts;
    END IF;
    IF d <> 0 OR t <> 0 THEN
        INSERT INTO {schema}.fts_stats (docs, tokens) VALUES (d, t) RETURNING id INTO r;
        IF r % 64 = 0 THEN
            -- Folding is housekeeping: where the session's isolation level refuses it (rows
            -- another writer folded meanwhile), the deltas stay as they are.
            BEGIN
                WITH gone AS (
                    DELETE FROM {schema}.fts_stats WHERE id IN (
                        SELECT id FROM {schema}.fts_stats FOR UPDATE SKIP LOCKED)
                    RETURNING docs, tokens)
                INSERT INTO {schema}.fts_stats (docs, tokens)
                    SELECT sum(docs), sum(tokens) FROM gone HAVING count(*) > 0;
            EXCEPTION WHEN serialization_failure THEN
                NULL;
            END;
        END IF;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER memories_fts_stats_insert AFTER INSERT ON memories
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.cairn_fts_stats();
CREATE TRIGGER memories_fts_stats_update AFTER UPDATE ON memories
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.cairn_fts_stats();
CREATE TRIGGER memories_fts_stats_delete AFTER DELETE ON memories
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.cairn_fts_stats();
CREATE INDEX memories_thread_kind_level ON memories (thread_id, kind, level);
CREATE INDEX memories_thread_speaker
    ON memories (thread_id, (metadata ->> 'speaker') COLLATE "C")
    WHERE jsonb_typeof(metadata -> 'speaker') = 'string';
"#,
    r#"
ALTER INDEX {schema}.memories_fts SET (fastupdate = off);
SELECT gin_clean_pending_list('{schema}.memories_fts'::regclass);
"#,
];

/// Creates the extension and schema when missing, migrates the store to
/// [`SCHEMA_VERSION`] and checks its model, all in one transaction under an advisory lock
/// (several processes may open one store at once).
pub async fn migrate(c: &deadpool_postgres::Object, o: &PgOptions) -> Result<()> {
    let schema = &o.schema;
    // The extension is database-wide; creating it races between processes, so it is made
    // under a lock of its own.
    c.batch_execute(
        "BEGIN; SELECT pg_advisory_xact_lock(7238214566);
         CREATE EXTENSION IF NOT EXISTS vector SCHEMA public; COMMIT;",
    )
    .await
    .map_err(pg)?;
    c.batch_execute(&format!(
        "BEGIN; SELECT pg_advisory_xact_lock(hashtext('cairn:{schema}'));
         CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS {schema}.cairn_meta (key text PRIMARY KEY, value text NOT NULL);"
    ))
    .await
    .map_err(pg)?;
    let result = migrate_locked(c, o).await;
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    c.batch_execute(end).await.map_err(pg)?;
    result
}

async fn meta(c: &deadpool_postgres::Object, key: &str) -> Result<Option<String>> {
    Ok(
        c.query_opt("SELECT value FROM cairn_meta WHERE key = $1", &[&key])
            .await
            .map_err(pg)?
            .map(|r| r.get(0)),
    )
}

async fn migrate_locked(c: &deadpool_postgres::Object, o: &PgOptions) -> Result<()> {
    let schema = &o.schema;
    let version: i64 = meta(c, "schema_version")
        .await?
        .map(|v| v.parse().unwrap_or(i64::MAX))
        .unwrap_or(0);
    if version > SCHEMA_VERSION {
        return Err(StoreError::FormatTooNew {
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if version > 0 {
        let model = meta(c, "model_id").await?.unwrap_or_default();
        let dim: usize = meta(c, "dim")
            .await?
            .and_then(|d| d.parse().ok())
            .unwrap_or(0);
        if model != o.model_id || dim != o.dim {
            return Err(StoreError::ModelMismatch {
                stored_model: model,
                stored_dim: dim,
                requested_model: o.model_id.clone(),
                requested_dim: o.dim,
            });
        }
    }
    for (i, m) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(version).unwrap_or(0))
    {
        c.batch_execute(
            &m.replace("{dim}", &o.dim.to_string())
                .replace("{schema}", schema),
        )
        .await
        .map_err(pg)?;
        let v = (i + 1).to_string();
        c.execute(
            "INSERT INTO cairn_meta (key, value) VALUES ('schema_version', $1)
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            &[&v],
        )
        .await
        .map_err(pg)?;
    }
    if version == 0 {
        c.execute(
            "INSERT INTO cairn_meta (key, value) VALUES ('model_id', $1), ('dim', $2)",
            &[&o.model_id, &o.dim.to_string()],
        )
        .await
        .map_err(pg)?;
    }
    // A bulk load that died before building the index again left the store without it.
    ensure_vector_index(c, o).await
}

/// Builds the HNSW index when the store has none (inside the caller's transaction), with
/// [`PgOptions::index_build_memory_mb`] of `maintenance_work_mem`. Looks the index up
/// first: `CREATE INDEX IF NOT EXISTS` would take the table's write lock even when the
/// index is there.
pub async fn ensure_vector_index<C: deadpool_postgres::GenericClient + Sync>(
    c: &C,
    o: &PgOptions,
) -> Result<()> {
    let schema = &o.schema;
    let present = c
        .query_opt(
            "SELECT 1 FROM pg_indexes WHERE schemaname = $1 AND indexname = 'memories_embedding'",
            &[schema],
        )
        .await
        .map_err(pg)?
        .is_some();
    if present {
        return Ok(());
    }
    tracing::info!(schema = %schema, "building the HNSW index of the store");
    set_build_memory(c, o.index_build_memory_mb).await?;
    c.batch_execute(&format!(
        "CREATE INDEX IF NOT EXISTS memories_embedding ON {schema}.memories
             USING hnsw (embedding vector_cosine_ops);"
    ))
    .await
    .map_err(pg)?;
    Ok(())
}

/// Sets `maintenance_work_mem` to `mb` MiB for the caller's transaction (a bound
/// parameter, as every value in this crate's SQL).
pub async fn set_build_memory<C: deadpool_postgres::GenericClient + Sync>(
    c: &C,
    mb: u32,
) -> Result<()> {
    c.query_one(
        "SELECT set_config('maintenance_work_mem', $1, true)",
        &[&format!("{mb}MB")],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

fn corrupt(what: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Backend {
        backend: "postgres",
        message: format!("stored {what} is invalid: {detail}"),
    }
}

/// Decodes a row selected with [`COLS`] into (rid, memory); summary sources are attached
/// by the caller.
pub fn decode(r: &Row) -> Result<(i64, MemoryUnit)> {
    let kind: String = r.get(2);
    let kind: MemoryKind = kind.parse().map_err(|e| corrupt("kind", e))?;
    let thread_id = r
        .get::<_, Option<String>>(3)
        .map(ThreadId::new)
        .transpose()
        .map_err(|e| corrupt("thread", e))?;
    let role = r
        .get::<_, Option<String>>(4)
        .map(|x| x.parse::<Role>())
        .transpose()
        .map_err(|e| corrupt("role", e))?;
    let metadata: Metadata = match r.get::<_, serde_json::Value>(7) {
        serde_json::Value::Object(m) => m,
        other => return Err(corrupt("metadata", other)),
    };
    let level = u32::try_from(r.get::<_, i32>(8)).unwrap_or(0);
    let summary = match r.get::<_, Option<String>>(9) {
        None => None,
        Some(t) => {
            let summary_type: SummaryType = t.parse().map_err(|e| corrupt("summary type", e))?;
            let created: DateTime<Utc> = r.get(6);
            Some(SummaryInfo {
                summary_type,
                source_ids: Vec::new(),
                time_range_start: r.get::<_, Option<DateTime<Utc>>>(10).unwrap_or(created),
                time_range_end: r.get::<_, Option<DateTime<Utc>>>(11).unwrap_or(created),
                source_count: usize::try_from(r.get::<_, Option<i32>>(12).unwrap_or(0))
                    .unwrap_or(0),
                level,
                stale: r.get(13),
                continues: None,
            })
        }
    };
    Ok((
        r.get(0),
        MemoryUnit {
            id: MemoryId::from_uuid(r.get(1)),
            kind,
            thread_id,
            role,
            content: r.get(5),
            created_at: r.get(6),
            metadata,
            level,
            summary,
            lifetime: Lifetime {
                expires_at: r.get(14),
                valid_from: r.get(15),
                valid_to: r.get(16),
                supersedes: r.get::<_, Option<uuid::Uuid>>(17).map(MemoryId::from_uuid),
            },
        },
    ))
}

/// SQL text with its parameters, numbered as they are bound.
pub struct Query {
    /// The text.
    pub text: String,
    /// The parameters, `$1` first.
    pub params: Vec<Param>,
}

impl Query {
    /// A query starting with `text`.
    pub fn new(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            params: Vec::new(),
        }
    }

    /// `SELECT` [`COLS`] `FROM memories m`.
    pub fn select() -> Self {
        Self::new(format!("SELECT {COLS} FROM memories m"))
    }

    /// Appends text.
    pub fn push(&mut self, text: impl AsRef<str>) {
        self.text.push_str(text.as_ref());
    }

    /// Binds a value at the end of the text; returns its placeholder (`$n`).
    pub fn bind(&mut self, v: impl ToSql + Sync + Send + 'static) -> String {
        self.params.push(Box::new(v));
        let at = format!("${}", self.params.len());
        self.text.push_str(&at);
        at
    }

    /// Appends the filter's conditions (each ` AND ...`), with the visibility rules of the
    /// SQLite store: expired memories and ended facts are left out unless asked for.
    pub fn filter(&mut self, f: &Filter, now: DateTime<Utc>) {
        if !f.expired {
            self.push(" AND (m.expires_at IS NULL OR m.expires_at > ");
            self.bind(now);
            self.push(")");
        }
        if let Some(t) = f.as_of {
            self.push(" AND COALESCE(m.valid_from, m.created_at) <= ");
            self.bind(t);
            self.push(" AND (m.valid_to IS NULL OR m.valid_to > ");
            self.bind(t);
            self.push(")");
        } else if !f.history {
            self.push(" AND (m.valid_to IS NULL OR m.valid_to > ");
            self.bind(now);
            self.push(")");
        }
        if !f.kinds.is_empty() {
            self.push(" AND m.kind = ANY(");
            self.bind(
                f.kinds
                    .iter()
                    .map(|k| k.as_str().to_owned())
                    .collect::<Vec<String>>(),
            );
            self.push(")");
        }
        if let Some(t) = &f.thread {
            self.push(" AND m.thread_id = ");
            self.bind(t.as_str().to_owned());
        }
        if f.thread_less {
            self.push(" AND m.thread_id IS NULL");
        }
        if let Some(l) = f.min_level {
            self.push(" AND m.level >= ");
            self.bind(i32::try_from(l).unwrap_or(i32::MAX));
        }
        if let Some(l) = f.max_level {
            self.push(" AND m.level <= ");
            self.bind(i32::try_from(l).unwrap_or(i32::MAX));
        }
        if let Some(t) = f.after {
            self.push(" AND m.created_at >= ");
            self.bind(t);
        }
        if let Some(t) = f.before {
            self.push(" AND m.created_at < ");
            self.bind(t);
        }
        for m in &f.metadata {
            self.meta(m);
        }
    }

    /// One metadata condition. Equality and `in` compare JSON values (numbers as numbers);
    /// ranges compare values of the same JSON type only (numbers with numbers, text with
    /// text); an absent field fails every condition but `exists: false`.
    fn meta(&mut self, m: &MetaFilter) {
        let field = |q: &mut Self| {
            q.push(" AND (m.metadata -> ");
            q.bind(m.key.clone());
            q.push("::text)");
        };
        if let Some(v) = &m.eq {
            field(self);
            self.push(" = ");
            self.bind(v.clone());
        }
        if let Some(v) = &m.ne {
            field(self);
            self.push(" <> ");
            self.bind(v.clone());
            field(self);
            self.push(" <> 'null'::jsonb");
        }
        for (op, v) in [(">", &m.gt), (">=", &m.gte), ("<", &m.lt), ("<=", &m.lte)] {
            if let Some(v) = v {
                self.push(" AND jsonb_typeof(m.metadata -> ");
                self.bind(m.key.clone());
                self.push("::text) = jsonb_typeof(");
                self.bind(v.clone());
                self.push("::jsonb)");
                field(self);
                self.push(format!(" {op} "));
                self.bind(v.clone());
            }
        }
        if let Some(set) = &m.one_of {
            field(self);
            self.push(" = ANY(");
            self.bind(set.clone());
            self.push("::jsonb[])");
        }
        if let Some(present) = m.exists {
            self.push(if present {
                " AND jsonb_exists(m.metadata, "
            } else {
                " AND NOT jsonb_exists(m.metadata, "
            });
            self.bind(m.key.clone());
            self.push(")");
        }
    }
}
