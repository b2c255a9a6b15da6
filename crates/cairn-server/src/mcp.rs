//! The MCP server: the same operations as REST, as tools with JSON schemas and structured
//! output. Over stdio the namespace is fixed by `--namespace`; over HTTP (`/mcp`) it comes
//! from the request's API key, checked by the same middleware as `/v1`.

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, Json, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::api::*;
use crate::error::ApiError;
use crate::namespace::Namespace;
use crate::service::Service;

/// The MCP tools over one service.
#[derive(Clone)]
pub struct CairnMcp {
    service: Arc<Service>,
    namespace: Option<Namespace>,
    tool_router: ToolRouter<Self>,
}

fn fail(e: ApiError) -> String {
    match &e.field {
        Some(f) => format!("{:?} ({f}): {}", e.code, e.message),
        None => format!("{:?}: {}", e.code, e.message),
    }
}

/// `memory_add`: one memory (its fields at the top level) or several (`memories`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddParams {
    /// Several memories, added all or none (instead of the single-memory fields).
    #[serde(default)]
    pub memories: Option<Vec<AddMemory>>,
    /// The text of a single memory.
    #[serde(default)]
    pub content: Option<String>,
    /// Its kind: conversational (default with a thread), knowledge (default without),
    /// entity, workflow, toolbox, tool_log, file, persona.
    #[serde(default)]
    pub kind: Option<String>,
    /// Its thread.
    #[serde(default)]
    pub thread: Option<String>,
    /// user, assistant, system or tool.
    #[serde(default)]
    pub role: Option<String>,
    /// Who said it (a name).
    #[serde(default)]
    pub speaker: Option<String>,
    /// When it happened (RFC 3339); now when left out.
    #[serde(default)]
    pub created_at: Option<String>,
    /// A JSON object kept with it.
    #[serde(default)]
    pub metadata: Option<Metadata>,
    /// An external key: adding the same keyed memory again returns the stored one.
    #[serde(default)]
    pub key: Option<String>,
    /// Hidden from reads after this long (`90s`, `30m`, `2h`, `7d`).
    #[serde(default)]
    pub ttl: Option<String>,
    /// The id of the earlier fact this one replaces.
    #[serde(default)]
    pub supersedes: Option<String>,
}

impl AddParams {
    fn into_batch(self) -> Result<Vec<AddMemory>, ApiError> {
        match (self.memories, self.content) {
            (Some(_), Some(_)) => Err(ApiError::invalid(
                Some("content"),
                "give either `memories` or the fields of one memory, not both",
            )),
            (Some(m), None) => Ok(m),
            (None, Some(content)) => Ok(vec![AddMemory {
                content,
                kind: self.kind,
                thread: self.thread,
                role: self.role,
                speaker: self.speaker,
                created_at: self.created_at,
                metadata: self.metadata,
                key: self.key,
                ttl: self.ttl,
                supersedes: self.supersedes,
                ..AddMemory::default()
            }]),
            (None, None) => Err(ApiError::invalid(
                Some("content"),
                "give `content` (one memory) or `memories`",
            )),
        }
    }
}

/// A memory id.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdParams {
    /// The memory's id.
    pub id: String,
}

/// `memory_expand`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExpandParams {
    /// The summary's id.
    pub id: String,
    /// Every raw memory under it instead of its direct sources.
    #[serde(default)]
    pub leaves: Option<bool>,
}

/// `memory_delete`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteParams {
    /// The memory's id.
    pub id: String,
    /// restrict (default: refuse while a summary cites it), cascade or detach.
    #[serde(default)]
    pub policy: Option<String>,
}

/// `memory_tree`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TreeParams {
    /// The tree under this summary...
    #[serde(default)]
    pub id: Option<String>,
    /// ...or the trees of this thread's top summaries.
    #[serde(default)]
    pub thread: Option<String>,
    /// Levels below each root (default 2, at most 8).
    #[serde(default)]
    pub depth: Option<usize>,
}

#[tool_router]
impl CairnMcp {
    /// The tools over `service`; `namespace` fixes the namespace (stdio), otherwise it is
    /// the one of each HTTP request's API key.
    pub fn new(service: Arc<Service>, namespace: Option<Namespace>) -> Self {
        let mut tool_router = Self::tool_router();
        if !service.allow_consolidate() {
            tool_router.remove_route("memory_consolidate");
        }
        Self {
            service,
            namespace,
            tool_router,
        }
    }

    fn ns(&self, ctx: &RequestContext<RoleServer>) -> Result<Namespace, String> {
        if let Some(ns) = &self.namespace {
            return Ok(ns.clone());
        }
        ctx.extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<Namespace>())
            .cloned()
            .ok_or_else(|| fail(ApiError::unauthorized("no namespace for this request")))
    }

    #[tool(
        description = "Store memories: one (content, with optional kind, thread, role, speaker, created_at, metadata) or several (memories: [...], all or none). Conversation turns need a thread. Returns their ids."
    )]
    async fn memory_add(
        &self,
        Parameters(p): Parameters<AddParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Added>, String> {
        let ns = self.ns(&ctx)?;
        let batch = p.into_batch().map_err(fail)?;
        self.service.add(&ns, batch).await.map(Json).map_err(fail)
    }

    #[tool(
        description = "The context to answer a query in a conversation, within a token budget: a running summary of older turns, older turns recalled for the query, and the most recent turns verbatim. Each item has its id (expand summaries by it). `text` is the context ready for a prompt."
    )]
    async fn memory_context(
        &self,
        Parameters(p): Parameters<ContextRequest>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ContextOut>, String> {
        let ns = self.ns(&ctx)?;
        self.service.context(&ns, p).await.map(Json).map_err(fail)
    }

    #[tool(
        description = "Search memories by meaning and words (mode: hybrid (default), vector or keyword), optionally in one thread or of some kinds; k hits (default 10).",
        annotations(read_only_hint = true)
    )]
    async fn memory_search(
        &self,
        Parameters(p): Parameters<SearchRequest>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Hits>, String> {
        let ns = self.ns(&ctx)?;
        self.service.search(&ns, p).await.map(Json).map_err(fail)
    }

    #[tool(
        description = "A summary's sources in their order, or with leaves=true every raw memory under it: drill down from a summary to what was actually said.",
        annotations(read_only_hint = true)
    )]
    async fn memory_expand(
        &self,
        Parameters(p): Parameters<ExpandParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Memories>, String> {
        let ns = self.ns(&ctx)?;
        self.service
            .expand(&ns, &p.id, p.leaves.unwrap_or(false))
            .await
            .map(Json)
            .map_err(fail)
    }

    #[tool(description = "One memory by id.", annotations(read_only_hint = true))]
    async fn memory_get(
        &self,
        Parameters(p): Parameters<IdParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<MemoryOut>, String> {
        let ns = self.ns(&ctx)?;
        self.service.get(&ns, &p.id).await.map(Json).map_err(fail)
    }

    #[tool(
        description = "Delete a memory. policy: restrict (default; refused while a summary cites it), cascade (delete the summaries built on it too) or detach (keep them, marked stale).",
        annotations(destructive_hint = true)
    )]
    async fn memory_delete(
        &self,
        Parameters(p): Parameters<DeleteParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Deleted>, String> {
        let ns = self.ns(&ctx)?;
        self.service
            .delete(&ns, &p.id, p.policy.as_deref())
            .await
            .map(Json)
            .map_err(fail)
    }

    #[tool(
        description = "Forget memories so that nothing recalls them: give exactly one of `ids`, `thread`, `metadata` (conditions such as {\"key\": \"user_id\", \"eq\": \"alice\"}) or `everything: true`. The summaries built on them are rewritten from what remains.",
        annotations(destructive_hint = true)
    )]
    async fn memory_forget(
        &self,
        Parameters(p): Parameters<ForgetRequest>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Forgotten>, String> {
        let ns = self.ns(&ctx)?;
        self.service.forget(&ns, p).await.map(Json).map_err(fail)
    }

    #[tool(
        description = "The summary hierarchy: the tree under a summary id, or the trees of a thread's top summaries, `depth` levels deep (default 2).",
        annotations(read_only_hint = true)
    )]
    async fn memory_tree(
        &self,
        Parameters(p): Parameters<TreeParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Trees>, String> {
        let ns = self.ns(&ctx)?;
        self.service
            .tree(&ns, p.id.as_deref(), p.thread.as_deref(), p.depth)
            .await
            .map(Json)
            .map_err(fail)
    }

    #[tool(
        description = "Store a summary you wrote over memories (or summaries) of one thread, given in order; it links both ways, so the sources can be expanded from it."
    )]
    async fn memory_add_summary(
        &self,
        Parameters(p): Parameters<AddSummary>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SummaryCreated>, String> {
        let ns = self.ns(&ctx)?;
        self.service
            .add_summary(&ns, p)
            .await
            .map(Json)
            .map_err(fail)
    }

    #[tool(
        description = "Summarize memories older than `older_than` (default 1h) in chunks, then roll summaries up a level."
    )]
    async fn memory_consolidate(
        &self,
        Parameters(p): Parameters<ConsolidateRequest>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Consolidated>, String> {
        let ns = self.ns(&ctx)?;
        self.service
            .consolidate(&ns, p)
            .await
            .map(Json)
            .map_err(fail)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CairnMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("cairn", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Cairn is your long-term memory. Store conversation turns with memory_add \
                 (with a thread), and before answering call memory_context with the thread and \
                 the question: it returns a summary of older turns, the older turns relevant to \
                 the question, and the recent turns, within a token budget. memory_expand \
                 drills from a summary down to the turns it summarizes.",
            )
    }
}
