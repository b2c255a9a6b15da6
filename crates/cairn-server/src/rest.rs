//! The REST API (`/v1/...`), its OpenAPI 3.1 document, health and metrics.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, MatchedPath, Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json, Router};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::api::*;
use crate::error::{ApiError, ErrorBody};
use crate::keys::KeyStore;
use crate::metrics::Metrics;
use crate::namespace::Namespace;
use crate::service::Service;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The operations.
    pub service: Arc<Service>,
    /// The API keys.
    pub keys: Arc<KeyStore>,
    /// Request metrics.
    pub metrics: Arc<Metrics>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (status, Json(ErrorBody::from(&self))).into_response();
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

/// A JSON body whose errors name the field at fault: 400 when it is not JSON, 422 when a
/// field has the wrong type or is unknown, 413 when it is over the body limit.
pub struct ApiJson<T>(pub T);

fn json_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if inner.is_syntax() || inner.is_eof() || inner.is_io() {
        return ApiError::bad_request(None, format!("the body is not valid JSON: {inner}"));
    }
    let field = (path != ".").then_some(path);
    ApiError::invalid(field.as_deref(), inner.to_string())
}

async fn body_bytes<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(None, "the request body is over the server's limit")
        } else {
            ApiError::bad_request(None, e.body_text())
        }
    })
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = body_bytes(req, state).await?;
        let de = &mut serde_json::Deserializer::from_slice(&bytes);
        serde_path_to_error::deserialize(de)
            .map(ApiJson)
            .map_err(json_error)
    }
}

/// The body of an add: one memory or an array of them.
pub struct AddJson(pub Vec<AddMemory>, pub bool);

impl<S: Send + Sync> FromRequest<S> for AddJson {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = body_bytes(req, state).await?;
        let v: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request(None, format!("the body is not valid JSON: {e}")))?;
        let many = v.is_array();
        let parsed = if many {
            serde_path_to_error::deserialize::<_, Vec<AddMemory>>(v)
        } else {
            serde_path_to_error::deserialize::<_, AddMemory>(v).map(|m| vec![m])
        };
        parsed.map(|m| AddJson(m, many)).map_err(|e| {
            let path = e.path().to_string();
            let field = (path != ".").then_some(path);
            ApiError::invalid(field.as_deref(), e.into_inner().to_string())
        })
    }
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Cairn",
        description = "A hierarchical, vector-backed memory store for LLM agents. Every /v1 request carries `Authorization: Bearer KEY`; a key opens one namespace.",
        license(name = "Apache-2.0")
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    tags(
        (name = "memories", description = "Add, read, list and delete memories"),
        (name = "summaries", description = "Summaries and their sources"),
        (name = "recall", description = "Search and context assembly"),
        (name = "threads", description = "Threads and their summary trees"),
    )
)]
struct ApiDoc;

type ApiResult<T> = Result<T, ApiError>;

/// Adds one memory (or a JSON array of them, all or none).
#[utoipa::path(post, path = "/v1/memories", tag = "memories",
    request_body(content = AddBody, description = "One memory, or an array of them"),
    responses(
        (status = 201, description = "Added", body = Added),
        (status = 400, description = "Not JSON", body = ErrorBody),
        (status = 401, description = "No or a wrong key", body = ErrorBody),
        (status = 413, description = "Over the body or batch limit", body = ErrorBody),
        (status = 422, description = "A field is not accepted", body = ErrorBody),
    ))]
async fn add_memories(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    AddJson(batch, _): AddJson,
) -> ApiResult<(StatusCode, Json<Added>)> {
    let added = st.service.add(&ns, batch).await?;
    Ok((StatusCode::CREATED, Json(added)))
}

/// A page of a listing.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Only this thread.
    thread: Option<String>,
    /// Only this kind.
    kind: Option<String>,
    /// One metadata condition: `KEY=V`, `KEY!=V`, `KEY>V`, `KEY>=V`, `KEY<V`, `KEY<=V`,
    /// `KEY=[V1,V2]`, `KEY?` (present), `!KEY` (absent).
    #[serde(rename = "where")]
    #[param(rename = "where")]
    condition: Option<String>,
    /// Rows to skip (oldest first); prefer `cursor`.
    offset: Option<usize>,
    /// Where the page starts: the `next` of the previous page.
    cursor: Option<String>,
    /// Rows to return (default 100, at most 1,000).
    limit: Option<usize>,
}

/// Lists memories, oldest first.
#[utoipa::path(get, path = "/v1/memories", tag = "memories", params(ListQuery),
    responses((status = 200, body = Memories), (status = 422, body = ErrorBody)))]
async fn list_memories(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Memories>> {
    Ok(Json(
        st.service
            .list(
                &ns,
                q.thread.as_deref(),
                q.kind.as_deref(),
                q.condition.as_deref(),
                q.offset.unwrap_or(0),
                q.cursor.as_deref(),
                q.limit,
            )
            .await?,
    ))
}

/// One memory.
#[utoipa::path(get, path = "/v1/memories/{id}", tag = "memories",
    params(("id" = String, Path, description = "Memory id")),
    responses((status = 200, body = MemoryOut), (status = 404, body = ErrorBody)))]
async fn get_memory(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    Path(id): Path<String>,
) -> ApiResult<Json<MemoryOut>> {
    Ok(Json(st.service.get(&ns, &id).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct DeleteQuery {
    /// restrict (default: refuse while a summary cites it), cascade or detach.
    policy: Option<String>,
}

/// Deletes a memory.
#[utoipa::path(delete, path = "/v1/memories/{id}", tag = "memories",
    params(("id" = String, Path, description = "Memory id"), DeleteQuery),
    responses((status = 200, body = Deleted), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn delete_memory(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    Path(id): Path<String>,
    Query(q): Query<DeleteQuery>,
) -> ApiResult<Json<Deleted>> {
    Ok(Json(
        st.service.delete(&ns, &id, q.policy.as_deref()).await?,
    ))
}

/// Merges a patch into a memory's metadata (`null` removes a field); no re-embedding.
#[utoipa::path(patch, path = "/v1/memories/{id}", tag = "memories",
    params(("id" = String, Path, description = "Memory id")), request_body = PatchMemory,
    responses((status = 200, body = MemoryOut), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn patch_memory(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    Path(id): Path<String>,
    ApiJson(p): ApiJson<PatchMemory>,
) -> ApiResult<Json<MemoryOut>> {
    Ok(Json(st.service.patch(&ns, &id, p).await?))
}

/// Adds the memory stored under `key`, or updates it in place: the same content is left
/// alone, other metadata is replaced without re-embedding, other content is re-embedded
/// and the summaries above it become stale.
#[utoipa::path(post, path = "/v1/upsert", tag = "memories", request_body = AddMemory,
    responses((status = 200, body = UpsertedOut), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn upsert_memory(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    ApiJson(m): ApiJson<AddMemory>,
) -> ApiResult<Json<UpsertedOut>> {
    Ok(Json(st.service.upsert(&ns, m).await?))
}

/// Forgets memories (by ids, thread, metadata or everything): they are deleted, the
/// summaries built on them are written again from what remains (or deleted), and their
/// cached embeddings are dropped.
#[utoipa::path(post, path = "/v1/forget", tag = "memories", request_body = ForgetRequest,
    responses((status = 200, body = Forgotten), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn forget(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    ApiJson(r): ApiJson<ForgetRequest>,
) -> ApiResult<Json<Forgotten>> {
    Ok(Json(st.service.forget(&ns, r).await?))
}

/// Every version of a fact (what it superseded and what superseded it), oldest first.
#[utoipa::path(get, path = "/v1/memories/{id}/history", tag = "memories",
    params(("id" = String, Path, description = "Memory id")),
    responses((status = 200, body = Memories), (status = 404, body = ErrorBody)))]
async fn memory_history(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    Path(id): Path<String>,
) -> ApiResult<Json<Memories>> {
    Ok(Json(st.service.history(&ns, &id).await?))
}

/// The summaries that cite a memory (back-links).
#[utoipa::path(get, path = "/v1/memories/{id}/summaries", tag = "summaries",
    params(("id" = String, Path, description = "Memory id")),
    responses((status = 200, body = Memories), (status = 404, body = ErrorBody)))]
async fn memory_summaries(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    Path(id): Path<String>,
) -> ApiResult<Json<Memories>> {
    Ok(Json(st.service.summaries_of(&ns, &id).await?))
}

/// The summaries above a memory, every level up (nearest first).
#[utoipa::path(get, path = "/v1/memories/{id}/ancestors", tag = "summaries",
    params(("id" = String, Path, description = "Memory id")),
    responses((status = 200, body = Memories), (status = 404, body = ErrorBody)))]
async fn memory_ancestors(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    Path(id): Path<String>,
) -> ApiResult<Json<Memories>> {
    Ok(Json(st.service.ancestors(&ns, &id).await?))
}

/// A thread over time: turns per day and the spans its summaries cover.
#[utoipa::path(get, path = "/v1/threads/{id}/timeline", tag = "threads",
    params(("id" = String, Path, description = "Thread id")),
    responses((status = 200, body = Timeline), (status = 422, body = ErrorBody)))]
async fn thread_timeline(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    Path(id): Path<String>,
) -> ApiResult<Json<Timeline>> {
    Ok(Json(st.service.timeline(&ns, &id).await?))
}

/// Adds a summary over memories (or summaries) of the caller's namespace.
#[utoipa::path(post, path = "/v1/summaries", tag = "summaries", request_body = AddSummary,
    responses((status = 201, body = SummaryCreated), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn add_summary(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    ApiJson(s): ApiJson<AddSummary>,
) -> ApiResult<(StatusCode, Json<SummaryCreated>)> {
    Ok((
        StatusCode::CREATED,
        Json(st.service.add_summary(&ns, s).await?),
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct SourcesQuery {
    /// Every raw memory under the summary instead of its direct sources.
    leaves: Option<bool>,
}

/// A summary's sources, in order (or its leaves).
#[utoipa::path(get, path = "/v1/summaries/{id}/sources", tag = "summaries",
    params(("id" = String, Path, description = "Summary id"), SourcesQuery),
    responses((status = 200, body = Memories), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn summary_sources(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    Path(id): Path<String>,
    Query(q): Query<SourcesQuery>,
) -> ApiResult<Json<Memories>> {
    Ok(Json(
        st.service
            .expand(&ns, &id, q.leaves.unwrap_or(false))
            .await?,
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct TreeQuery {
    /// Levels below each root (default 2, at most 8).
    depth: Option<usize>,
}

/// The tree under a summary.
#[utoipa::path(get, path = "/v1/summaries/{id}/tree", tag = "summaries",
    params(("id" = String, Path, description = "Summary id"), TreeQuery),
    responses((status = 200, body = Trees), (status = 404, body = ErrorBody)))]
async fn summary_tree(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    Path(id): Path<String>,
    Query(q): Query<TreeQuery>,
) -> ApiResult<Json<Trees>> {
    Ok(Json(st.service.tree(&ns, Some(&id), None, q.depth).await?))
}

/// Searches memories (hybrid by default).
#[utoipa::path(post, path = "/v1/search", tag = "recall", request_body = SearchRequest,
    responses((status = 200, body = Hits), (status = 422, body = ErrorBody)))]
async fn search(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    ApiJson(r): ApiJson<SearchRequest>,
) -> ApiResult<Json<Hits>> {
    Ok(Json(st.service.search(&ns, r).await?))
}

/// Assembles the context for a thread and a query within a token budget.
#[utoipa::path(post, path = "/v1/context", tag = "recall", request_body = ContextRequest,
    responses((status = 200, body = ContextOut), (status = 422, body = ErrorBody)))]
async fn context(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    ApiJson(r): ApiJson<ContextRequest>,
) -> ApiResult<Json<ContextOut>> {
    Ok(Json(st.service.context(&ns, r).await?))
}

/// The namespace's threads with their sizes.
#[utoipa::path(get, path = "/v1/threads", tag = "threads",
    responses((status = 200, body = Threads)))]
async fn threads(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
) -> ApiResult<Json<Threads>> {
    Ok(Json(st.service.threads(&ns).await?))
}

/// A thread's summary trees: one per top summary.
#[utoipa::path(get, path = "/v1/threads/{id}/tree", tag = "threads",
    params(("id" = String, Path, description = "Thread id"), TreeQuery),
    responses((status = 200, body = Trees), (status = 422, body = ErrorBody)))]
async fn thread_tree(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    Path(id): Path<String>,
    Query(q): Query<TreeQuery>,
) -> ApiResult<Json<Trees>> {
    Ok(Json(st.service.tree(&ns, None, Some(&id), q.depth).await?))
}

/// Runs a consolidation pass now (summaries of memories older than `older_than`).
#[utoipa::path(post, path = "/v1/consolidate", tag = "threads", request_body = ConsolidateRequest,
    responses((status = 200, body = Consolidated), (status = 422, body = ErrorBody)))]
async fn consolidate(
    State(st): State<AppState>,
    Extension(ns): Extension<Namespace>,
    ApiJson(r): ApiJson<ConsolidateRequest>,
) -> ApiResult<Json<Consolidated>> {
    Ok(Json(st.service.consolidate(&ns, r).await?))
}

const UI_INDEX: &str = include_str!("../ui/index.html");
const UI_JS: &str = include_str!("../ui/app.js");
const UI_CSS: &str = include_str!("../ui/style.css");

/// The web view's static files (no key: every API call the page makes carries the key the
/// user enters).
fn ui() -> Router<AppState> {
    let page = |body: &'static str, ty: &'static str| {
        axum::routing::get(move || async move {
            (
                [
                    (header::CONTENT_TYPE, ty),
                    (header::CACHE_CONTROL, "no-cache"),
                    (
                        header::CONTENT_SECURITY_POLICY,
                        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'",
                    ),
                ],
                body,
            )
        })
    };
    Router::new()
        .route(
            "/ui",
            axum::routing::get(|| async { axum::response::Redirect::permanent("/ui/") }),
        )
        .route("/ui/", page(UI_INDEX, "text/html; charset=utf-8"))
        .route("/ui/app.js", page(UI_JS, "text/javascript; charset=utf-8"))
        .route("/ui/style.css", page(UI_CSS, "text/css; charset=utf-8"))
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn metrics(State(st): State<AppState>) -> Response {
    let mut out = String::new();
    st.metrics.render(&mut out);
    let ingest = &st.service.ingest_stats;
    use std::sync::atomic::Ordering::Relaxed;
    out.push_str("# HELP cairn_ingest_model_runs_total Model runs of the ingest queue.\n# TYPE cairn_ingest_model_runs_total counter\n");
    out.push_str(&format!(
        "cairn_ingest_model_runs_total {}\n",
        ingest.batches.load(Relaxed)
    ));
    out.push_str("# HELP cairn_ingest_texts_total Texts embedded by the ingest queue.\n# TYPE cairn_ingest_texts_total counter\n");
    out.push_str(&format!(
        "cairn_ingest_texts_total {}\n",
        ingest.texts.load(Relaxed)
    ));
    out.push_str("# HELP cairn_ingest_requests_total Add requests served by the ingest queue.\n# TYPE cairn_ingest_requests_total counter\n");
    out.push_str(&format!(
        "cairn_ingest_requests_total {}\n",
        ingest.requests.load(Relaxed)
    ));
    out.push_str("# HELP cairn_memories Memories stored, by namespace (stores opened since start).\n# TYPE cairn_memories gauge\n");
    for (ns, h) in st.service.namespaces().opened().await {
        if let Ok(s) = h.stats().await {
            out.push_str(&format!(
                "cairn_memories{{namespace=\"{}\"}} {}\n",
                crate::metrics::escape(ns.as_str()),
                s.store.total
            ));
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

async fn auth(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::to_owned);
    let Some(key) = presented else {
        return ApiError::unauthorized("missing `Authorization: Bearer KEY`").into_response();
    };
    let keys = st.keys.clone();
    let found = tokio::task::spawn_blocking(move || keys.authenticate(&key)).await;
    match found {
        Ok(Ok(Some(ns))) => {
            req.extensions_mut().insert(ns);
            next.run(req).await
        }
        Ok(Ok(None)) => ApiError::unauthorized("the API key is not valid").into_response(),
        Ok(Err(e)) => e.into_response(),
        Err(e) => ApiError::unavailable(e.to_string()).into_response(),
    }
}

async fn record(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = req.method().as_str().to_owned();
    let start = Instant::now();
    let r = next.run(req).await;
    st.metrics
        .record(&route, &method, r.status().as_u16(), start.elapsed());
    r
}

fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(add_memories, list_memories))
        .routes(routes!(get_memory, delete_memory, patch_memory))
        .routes(routes!(upsert_memory))
        .routes(routes!(forget))
        .routes(routes!(memory_summaries))
        .routes(routes!(memory_history))
        .routes(routes!(memory_ancestors))
        .routes(routes!(thread_timeline))
        .routes(routes!(add_summary))
        .routes(routes!(summary_sources))
        .routes(routes!(summary_tree))
        .routes(routes!(search))
        .routes(routes!(context))
        .routes(routes!(threads))
        .routes(routes!(thread_tree))
        .routes(routes!(consolidate))
}

/// The OpenAPI 3.1 document of the REST API.
pub fn openapi() -> utoipa::openapi::OpenApi {
    routes().split_for_parts().1
}

/// The whole HTTP application: `/v1` (keys), `/mcp` (keys), `/healthz`, `/metrics`,
/// `/openapi.json`.
pub fn app(state: AppState, mcp: Option<Router<AppState>>) -> Router {
    let (v1, api) = routes().split_for_parts();
    let v1 = v1.layer(from_fn_with_state(state.clone(), auth));
    let spec = Arc::new(api);
    let mut r = Router::new()
        .merge(v1)
        .merge(ui())
        .route("/healthz", axum::routing::get(healthz))
        .route("/metrics", axum::routing::get(metrics))
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let spec = spec.clone();
                async move { Json(spec.as_ref().clone()) }
            }),
        );
    if let Some(m) = mcp {
        r = r.merge(m.layer(from_fn_with_state(state.clone(), auth)));
    }
    let limit = state.service.limits.max_body_bytes;
    r.layer(from_fn_with_state(state.clone(), record))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}
