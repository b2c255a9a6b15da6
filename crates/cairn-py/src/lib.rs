//! `cairn._cairn`: the native half of Cairn's Python package.
//!
//! One class, `Harness`, over a [`MemoryHarness`]: `call(method, args_json)` runs an
//! operation with the GIL released and returns its JSON; `acall(method, args_json)` returns
//! an awaitable for asyncio (on a shared tokio runtime). Errors are `_cairn.Error(code,
//! message)`; the Python package (`python/cairn/__init__.py`) turns them into typed
//! exceptions and gives every operation its own method with keyword arguments.

use std::str::FromStr;
use std::sync::Arc;

use cairn_core::{MemoryId, MemoryKind, MemoryUnit, NewMemory, Role, ThreadId, SPEAKER_KEY};
use cairn_embed::HashEmbedder;
use cairn_harness::{
    ConsolidationPolicy, ContextOptions, ContextScope, DeletePolicy, Filter, HarnessError,
    MemoryHarness, NewSummary, SearchMode, SearchOptions,
};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use serde_json::{json, Map, Value};

pyo3::create_exception!(
    _cairn,
    Error,
    PyException,
    "A Cairn error: args are (code, message)."
);

/// An error with its category: not_found, invalid_input, conflict, storage, embedding, other.
struct Failure {
    code: &'static str,
    message: String,
}

impl Failure {
    fn invalid(message: impl Into<String>) -> Self {
        Self {
            code: "invalid_input",
            message: message.into(),
        }
    }
}

impl From<HarnessError> for Failure {
    fn from(e: HarnessError) -> Self {
        let message = e.to_string();
        let code = match &e {
            HarnessError::NotFound { .. } => "not_found",
            HarnessError::Input(_) | HarnessError::Config(_) => "invalid_input",
            HarnessError::Embed(cairn_core::EmbedError::Input(_)) => "invalid_input",
            HarnessError::Embed(_) => "embedding",
            HarnessError::Store(s) => match s {
                cairn_store::StoreError::DuplicateId { .. }
                | cairn_store::StoreError::CitedBySummaries { .. }
                | cairn_store::StoreError::CannotSupersede { .. }
                | cairn_store::StoreError::ModelMismatch { .. } => "conflict",
                cairn_store::StoreError::NotASummary { .. }
                | cairn_store::StoreError::EmptySources
                | cairn_store::StoreError::DuplicateSource { .. }
                | cairn_store::StoreError::SelfReference { .. }
                | cairn_store::StoreError::Cycle { .. }
                | cairn_store::StoreError::ThreadMismatch { .. } => "invalid_input",
                _ => "storage",
            },
            _ => "other",
        };
        Self { code, message }
    }
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> Self {
        Error::new_err((f.code, f.message))
    }
}

type Out = Result<Value, Failure>;

fn memory(m: &MemoryUnit) -> Value {
    let mut v = memory_fields(m);
    let l = &m.lifetime;
    for (k, t) in [
        ("expires_at", l.expires_at),
        ("valid_from", l.valid_from),
        ("valid_to", l.valid_to),
    ] {
        if let Some(t) = t {
            v[k] = json!(t.to_rfc3339());
        }
    }
    if let Some(s) = l.supersedes {
        v["supersedes"] = json!(s.to_string());
    }
    v
}

fn memory_fields(m: &MemoryUnit) -> Value {
    json!({
        "id": m.id.to_string(),
        "kind": m.kind.as_str(),
        "thread": m.thread_id.as_ref().map(ThreadId::as_str),
        "role": m.role.map(|r| r.as_str()),
        "speaker": m.speaker(),
        "content": m.content,
        "created_at": m.created_at.to_rfc3339(),
        "metadata": m.metadata,
        "level": m.level,
        "summary": m.summary.as_ref().map(|s| json!({
            "summary_type": s.summary_type.as_str(),
            "source_ids": s.source_ids.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "time_range_start": s.time_range_start.to_rfc3339(),
            "time_range_end": s.time_range_end.to_rfc3339(),
            "stale": s.stale,
        })),
    })
}

fn memories(ms: &[MemoryUnit]) -> Value {
    Value::Array(ms.iter().map(memory).collect())
}

/// Reads the arguments of a call.
struct Args(Map<String, Value>);

impl Args {
    fn str(&self, k: &str) -> Result<Option<String>, Failure> {
        match self.0.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(Failure::invalid(format!(
                "{k} must be a string, not {other}"
            ))),
        }
    }

    fn req(&self, k: &str) -> Result<String, Failure> {
        self.str(k)?
            .ok_or_else(|| Failure::invalid(format!("{k} is required")))
    }

    fn usize(&self, k: &str) -> Result<Option<usize>, Failure> {
        match self.0.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| Failure::invalid(format!("{k} must be a non-negative integer"))),
        }
    }

    fn bool(&self, k: &str) -> Result<bool, Failure> {
        match self.0.get(k) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(Failure::invalid(format!("{k} must be true or false"))),
        }
    }

    fn strs(&self, k: &str) -> Result<Vec<String>, Failure> {
        match self.0.get(k) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| Failure::invalid(format!("{k} must hold strings")))
                })
                .collect(),
            Some(_) => Err(Failure::invalid(format!(
                "{k} must be a string or a list of strings"
            ))),
        }
    }

    /// Metadata conditions (a list of `{key, eq | ne | in | gt | gte | lt | lte | exists}`).
    fn conditions(&self, k: &str) -> Result<Vec<cairn_harness::MetaFilter>, Failure> {
        match self.0.get(k) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(v) => {
                serde_json::from_value(v.clone()).map_err(|e| Failure::invalid(format!("{k}: {e}")))
            }
        }
    }

    fn id(&self, k: &str) -> Result<MemoryId, Failure> {
        let s = self.req(k)?;
        parse_id(&s)
    }
}

fn parse_id(s: &str) -> Result<MemoryId, Failure> {
    MemoryId::from_str(s.trim()).map_err(|_| Failure::invalid(format!("{s:?} is not a memory id")))
}

fn kind(s: &str) -> Result<MemoryKind, Failure> {
    MemoryKind::from_str(s).map_err(|e| Failure::invalid(e.to_string()))
}

fn thread(s: &str) -> Result<ThreadId, Failure> {
    ThreadId::new(s).map_err(|e| Failure::invalid(e.to_string()))
}

/// A memory from the arguments of `add` (or one element of `add_many`).
fn new_memory(a: &Args) -> Result<NewMemory, Failure> {
    let content = a.req("content")?;
    let t = a.str("thread")?.map(|t| thread(&t)).transpose()?;
    let k = match a.str("kind")? {
        Some(k) => kind(&k)?,
        None if t.is_some() => MemoryKind::Conversational,
        None => MemoryKind::Knowledge,
    };
    if k == MemoryKind::Summary {
        return Err(Failure::invalid("summaries are added with add_summary"));
    }
    let mut m = NewMemory::new(k, content);
    m.thread_id = t;
    m.role = a
        .str("role")?
        .map(|r| Role::from_str(&r).map_err(|e| Failure::invalid(e.to_string())))
        .transpose()?;
    if let Some(at) = a.str("created_at")? {
        let t = chrono::DateTime::parse_from_rfc3339(&at)
            .map_err(|e| Failure::invalid(format!("created_at {at:?}: {e}")))?;
        m.created_at = Some(t.with_timezone(&chrono::Utc));
    }
    match a.0.get("metadata") {
        None | Some(Value::Null) => {}
        Some(Value::Object(o)) => m.metadata = o.clone(),
        Some(_) => return Err(Failure::invalid("metadata must be a dict")),
    }
    if let Some(s) = a.str("speaker")? {
        m.metadata.insert(SPEAKER_KEY.to_owned(), Value::String(s));
    }
    let time = |k: &str| -> Result<Option<chrono::DateTime<chrono::Utc>>, Failure> {
        a.str(k)?
            .map(|t| {
                chrono::DateTime::parse_from_rfc3339(&t)
                    .map(|t| t.with_timezone(&chrono::Utc))
                    .map_err(|e| Failure::invalid(format!("{k} {t:?}: {e}")))
            })
            .transpose()
    };
    m.lifetime.expires_at = time("expires_at")?;
    m.lifetime.valid_from = time("valid_from")?;
    m.lifetime.supersedes = a.str("supersedes")?.map(|s| parse_id(&s)).transpose()?;
    if let Some(k) = a.str("key")? {
        if k.is_empty() {
            return Err(Failure::invalid("key must not be empty"));
        }
        m = m.with_key(&k);
    }
    m.validate().map_err(|e| Failure::invalid(e.to_string()))?;
    Ok(m)
}

fn duration(s: &str) -> Result<std::time::Duration, Failure> {
    cairn_harness::parse_duration(s).map_err(Failure::invalid)
}

/// Runs one operation.
async fn dispatch(h: MemoryHarness, method: String, args: Value) -> Out {
    let a = match args {
        Value::Object(o) => Args(o),
        Value::Null => Args(Map::new()),
        _ => return Err(Failure::invalid("arguments must be a JSON object")),
    };
    Ok(match method.as_str() {
        "add" => {
            let m = new_memory(&a)?;
            json!(h.add(m).await?.to_string())
        }
        "add_many" => {
            let list = match a.0.get("memories") {
                Some(Value::Array(l)) => l.clone(),
                _ => return Err(Failure::invalid("memories must be a list of dicts")),
            };
            let mut batch = Vec::with_capacity(list.len());
            for (i, v) in list.into_iter().enumerate() {
                let Value::Object(o) = v else {
                    return Err(Failure::invalid(format!("memories[{i}] must be a dict")));
                };
                batch.push(new_memory(&Args(o)).map_err(|f| Failure {
                    code: f.code,
                    message: format!("memories[{i}]: {}", f.message),
                })?);
            }
            let ids = h.add_many(batch).await?;
            json!(ids.iter().map(ToString::to_string).collect::<Vec<_>>())
        }
        "get" => memory(&h.get(a.id("id")?).await?),
        "list" => {
            let mut f = Filter::all();
            f.thread = a.str("thread")?.map(|t| thread(&t)).transpose()?;
            let kinds = a.strs("kind")?;
            if !kinds.is_empty() {
                f.kinds = kinds.iter().map(|k| kind(k)).collect::<Result<_, _>>()?;
            }
            let offset = a.usize("offset")?.unwrap_or(0);
            let limit = a.usize("limit")?.unwrap_or(100);
            memories(&h.list(f, offset, limit).await?)
        }
        "upsert" => {
            let up = h.upsert(new_memory(&a)?).await?;
            json!({"memory": memory(&up.memory), "outcome": serde_json::to_value(up.outcome).unwrap_or(Value::Null)})
        }
        "patch_metadata" => {
            let patch = match a.0.get("metadata") {
                Some(Value::Object(o)) => o.clone(),
                _ => return Err(Failure::invalid("metadata must be a dict")),
            };
            memory(&h.patch_metadata(a.id("id")?, patch).await?)
        }
        "list_page" => {
            let mut f = Filter::all();
            f.thread = a.str("thread")?.map(|t| thread(&t)).transpose()?;
            let kinds = a.strs("kind")?;
            if !kinds.is_empty() {
                f.kinds = kinds.iter().map(|k| kind(k)).collect::<Result<_, _>>()?;
            }
            f.metadata = a.conditions("metadata")?;
            let cursor = a
                .str("cursor")?
                .map(|c| c.parse::<cairn_harness::Cursor>())
                .transpose()
                .map_err(|e| Failure::invalid(e.to_string()))?;
            let limit = a.usize("limit")?.unwrap_or(100);
            let page = h.list_page(f, cursor, limit).await?;
            json!({"items": memories(&page.items), "next": page.next.map(|c| c.to_string())})
        }
        "forget" => {
            let what = if a.bool("everything")? {
                cairn_harness::Forget::Everything
            } else if let Some(t) = a.str("thread")? {
                cairn_harness::Forget::Thread(thread(&t)?)
            } else if a.0.get("metadata").is_some_and(|v| !v.is_null()) {
                let mut f = Filter::all();
                f.metadata = a.conditions("metadata")?;
                if f.metadata.is_empty() {
                    return Err(Failure::invalid("metadata: at least one condition"));
                }
                cairn_harness::Forget::Filter(f)
            } else {
                let ids = a.strs("ids")?;
                if ids.is_empty() {
                    return Err(Failure::invalid(
                        "say what to forget: ids, thread, metadata or everything=True",
                    ));
                }
                cairn_harness::Forget::Ids(
                    ids.iter().map(|s| parse_id(s)).collect::<Result<_, _>>()?,
                )
            };
            let r = h.forget(what).await?;
            let s = |v: &[MemoryId]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
            json!({"deleted": s(&r.deleted), "resummarized": s(&r.resummarized), "dropped": s(&r.dropped), "erased": r.erased})
        }
        "history" => memories(&h.history(a.id("id")?).await?),
        "recent" => {
            let t = a.req("thread")?;
            let limit = a.usize("limit")?.unwrap_or(20);
            memories(&h.get_conversational(&t, limit).await?)
        }
        "add_summary" => {
            let ids = a
                .strs("source_ids")?
                .iter()
                .map(|s| parse_id(s))
                .collect::<Result<Vec<_>, _>>()?;
            let t = a.str("thread")?.map(|t| thread(&t)).transpose()?;
            let s = h
                .add_summary_with(NewSummary::new(a.req("content")?, ids).with_thread(t))
                .await?;
            memory(&s)
        }
        "expand_summary" => memories(&h.expand_summary(a.id("id")?).await?),
        "expand_to_leaves" => memories(&h.expand_to_leaves(a.id("id")?).await?),
        "summaries_of" => memories(&h.summaries_of(a.id("id")?).await?),
        "ancestors" => memories(&h.ancestors(a.id("id")?).await?),
        "search" => {
            let mode = match a.str("mode")? {
                Some(m) => SearchMode::from_str(&m).map_err(|e| Failure::invalid(e.to_string()))?,
                None => SearchMode::Hybrid,
            };
            let mut o = SearchOptions::all().mode(mode);
            o.k = a.usize("k")?;
            o.filter.thread = a.str("thread")?.map(|t| thread(&t)).transpose()?;
            let kinds = a.strs("kind")?;
            if !kinds.is_empty() {
                o.filter.kinds = kinds.iter().map(|k| kind(k)).collect::<Result<_, _>>()?;
            }
            let to_u32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            o.filter.min_level = a.usize("min_level")?.map(to_u32);
            o.filter.max_level = a.usize("max_level")?.map(to_u32);
            o.filter.metadata = a.conditions("metadata")?;
            o.filter.history = a.bool("history")?;
            if let Some(t) = a.str("as_of")? {
                o.filter.as_of = Some(
                    chrono::DateTime::parse_from_rfc3339(&t)
                        .map_err(|e| Failure::invalid(format!("as_of {t:?}: {e}")))?
                        .with_timezone(&chrono::Utc),
                );
            }
            if let Some(h) = a.str("half_life")? {
                o.half_life = Some(duration(&h)?);
            }
            let hits = h.search(&a.req("query")?, o).await?;
            Value::Array(
                hits.iter()
                    .map(|hit| {
                        let mut v = memory(&hit.memory);
                        v["score"] = json!(hit.score);
                        v
                    })
                    .collect(),
            )
        }
        "assemble_context" => {
            let t = a.req("thread")?;
            let q = a.str("query")?.unwrap_or_default();
            let budget = a.usize("budget")?.unwrap_or(2000);
            let options = ContextOptions {
                knowledge: a.bool("knowledge")?,
                ..ContextOptions::default()
            };
            let scope_ids = a.strs("scope")?;
            let mut scope = ContextScope::threads(scope_ids.iter().map(String::as_str))?;
            scope.metadata = a.conditions("scope_metadata")?;
            let c = h
                .assemble_context_scoped(&t, &q, budget, options, scope)
                .await?;
            let items: Vec<Value> = c
                .items
                .iter()
                .map(|i| {
                    json!({
                        "id": i.id.to_string(),
                        "kind": i.kind.as_str(),
                        "level": i.level,
                        "role": i.role.map(|r| r.as_str()),
                        "speaker": i.metadata.get(SPEAKER_KEY),
                        "content": i.content,
                        "created_at": i.created_at.to_rfc3339(),
                        "metadata": i.metadata,
                        "thread": i.thread_id.as_ref().map(ThreadId::as_str),
                        "source_ids": i.source_ids.iter().map(ToString::to_string).collect::<Vec<_>>(),
                        "section": i.section,
                        "tokens": i.tokens,
                        "repeats": i.repeats.iter().map(|r| json!({
                            "id": r.id.to_string(),
                            "created_at": r.created_at.to_rfc3339(),
                            "metadata": r.metadata,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({
                "items": items,
                "tokens": c.tokens,
                "budget": c.budget,
                "text": c.render(),
                "messages": c.to_messages(),
            })
        }
        "consolidate" => {
            let mut p = ConsolidationPolicy::older_than(duration(
                &a.str("older_than")?.unwrap_or_else(|| "1h".into()),
            )?);
            if let Some(n) = a.usize("chunk_size")? {
                // A tail waits for `min_chunk` memories (5 by default): never more than a chunk.
                p = p.chunk_size(n).min_chunk(n.clamp(1, 5));
            }
            if let Some(n) = a.usize("fanout")? {
                p = p.fanout(n);
            }
            if let Some(t) = a.str("thread")? {
                p = p.thread(thread(&t)?);
            }
            let r = h.consolidate(p).await?;
            json!({
                "summaries": r.summaries.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "summaries_per_level": r.chunks_per_level,
                "memories_covered": r.memories_covered,
                "failures": r.failures.len(),
                "refreshed": r.refreshed.len(),
            })
        }
        "delete" => {
            let policy = match a.str("policy")? {
                Some(p) => {
                    DeletePolicy::from_str(&p).map_err(|e| Failure::invalid(e.to_string()))?
                }
                None => DeletePolicy::Restrict,
            };
            let r = h.delete_with(a.id("id")?, policy).await?;
            json!({
                "deleted": r.deleted.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "detached": r.detached.iter().map(ToString::to_string).collect::<Vec<_>>(),
            })
        }
        "delete_thread" => {
            let t = thread(&a.req("thread")?)?;
            json!(h
                .forget(cairn_harness::Forget::Thread(t))
                .await?
                .deleted
                .len())
        }
        "threads" => {
            let h2 = h.clone();
            let ts = tokio::task::spawn_blocking(move || h2.store().threads())
                .await
                .map_err(|e| Failure {
                    code: "other",
                    message: e.to_string(),
                })?
                .map_err(|e| Failure::from(HarnessError::from(e)))?;
            json!(ts.iter().map(ThreadId::as_str).collect::<Vec<_>>())
        }
        "stats" => serde_json::to_value(h.stats().await?).map_err(|e| Failure {
            code: "other",
            message: e.to_string(),
        })?,
        "count_tokens" => json!(h.token_counter().count(&a.req("text")?)),
        other => return Err(Failure::invalid(format!("no operation {other:?}"))),
    })
}

fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

/// A store opened from Python.
#[pyclass(frozen, module = "cairn._cairn")]
struct Harness {
    inner: MemoryHarness,
}

fn parse_args(args: &str) -> Result<Value, Failure> {
    serde_json::from_str(args).map_err(|e| Failure::invalid(format!("arguments: {e}")))
}

#[pymethods]
impl Harness {
    /// Opens (creating if needed) the store at `path`; `embedder` is "minilm" (the local
    /// model, fetched on first use) or "hash" (deterministic, no meaning: for tests).
    #[new]
    #[pyo3(signature = (path, embedder = "minilm", cache = true))]
    fn new(py: Python<'_>, path: String, embedder: &str, cache: bool) -> PyResult<Self> {
        let hash = match embedder {
            "minilm" => false,
            "hash" => true,
            other => {
                return Err(Failure::invalid(format!(
                    "unknown embedder {other:?}: \"minilm\" or \"hash\""
                ))
                .into())
            }
        };
        let inner = py.detach(move || {
            runtime().block_on(async move {
                let mut b = MemoryHarness::builder(&path).embedding_cache(cache);
                if hash {
                    b = b.embedder(Arc::new(HashEmbedder::new(384)));
                }
                b.build().await.map_err(Failure::from)
            })
        })?;
        Ok(Self { inner })
    }

    /// Runs `method` with `args` (a JSON object) and returns its result as JSON, with the
    /// GIL released meanwhile.
    fn call(&self, py: Python<'_>, method: String, args: &str) -> PyResult<String> {
        let args = parse_args(args)?;
        let h = self.inner.clone();
        let v = py.detach(move || runtime().block_on(dispatch(h, method, args)))?;
        Ok(v.to_string())
    }

    /// The same as an awaitable for asyncio.
    fn acall<'py>(
        &self,
        py: Python<'py>,
        method: String,
        args: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let args = parse_args(args)?;
        let h = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let v = runtime()
                .spawn(dispatch(h, method, args))
                .await
                .map_err(|e| Error::new_err(("other", e.to_string())))?
                .map_err(PyErr::from)?;
            Ok(v.to_string())
        })
    }
}

/// A store location for display: a PostgreSQL URL without its password, a path as it is
/// ([`cairn_harness::display_location`]).
#[pyfunction]
fn display_location(location: &str) -> String {
    cairn_harness::display_location(std::path::Path::new(location))
}

/// The native module.
#[pymodule]
fn _cairn(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Harness>()?;
    m.add_function(wrap_pyfunction!(display_location, m)?)?;
    m.add("Error", m.py().get_type::<Error>())?;
    Ok(())
}
