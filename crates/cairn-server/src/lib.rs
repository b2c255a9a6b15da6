//! `cairn serve`: Cairn as a service, for agents in any language and MCP clients.
//!
//! One long-lived process owns the store and serves it over
//! - **MCP** ([rmcp]): stdio (`cairn serve --stdio`, the form MCP clients launch) and
//!   streamable HTTP at `/mcp`; tools `memory_add`, `memory_context`, `memory_search`,
//!   `memory_expand`, `memory_get`, `memory_delete`, `memory_tree`, `memory_add_summary`
//!   (and `memory_consolidate` when allowed), each with JSON schemas and structured output;
//! - **REST** ([axum]): `/v1/memories`, `/v1/summaries`, `/v1/search`, `/v1/context`,
//!   `/v1/threads`, `/v1/consolidate`, with `/healthz`, `/metrics` (Prometheus text) and
//!   `/openapi.json` (OpenAPI 3.1, generated from the handlers).
//!
//! **Tenants.** Every memory belongs to a namespace, and each namespace is its own store file
//! (the `--db` file for `default`, `FILE.ns/NAME.db` for the others), so no search, link,
//! expansion, context or delete can reach across namespaces. API keys (only their SHA-256
//! is stored, in `FILE.keys`) map to namespaces; every `/v1` and `/mcp` request needs one.
//!
//! **Ingest.** Adds from concurrent requests are embedded together in one model run (a
//! second model instance, so searches never wait behind an ingest batch); each request is
//! still written in its own transaction and acknowledged only once committed.
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! use cairn_server::{Server, ServerOptions};
//! let server = Server::open(ServerOptions::new("memory.db")).await?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8420").await?;
//! server.serve_http(listener, cairn_server::shutdown_signal()).await?;
//! # Ok(()) }
//! ```

pub mod api;
pub mod error;
pub mod keys;
pub mod mcp;
pub mod metrics;
pub mod namespace;
pub mod rest;
pub mod service;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cairn_core::Embedder;
use cairn_embed::FastEmbedder;
use cairn_harness::ConsolidationPolicy;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

pub use error::{ApiError, ErrorCode};
pub use keys::{keys_path, KeyStore};
pub use namespace::{namespace_path, namespace_schema, Namespace, Namespaces};
pub use service::{parse_duration, Limits, Service};

/// How to run the server.
pub struct ServerOptions {
    /// The store file (the default namespace's; the others sit beside it), or a PostgreSQL
    /// URL (the other namespaces are schemas of the same database).
    pub db: PathBuf,
    /// The API key file: `FILE.keys` beside a store file; for a PostgreSQL store
    /// `CAIRN_KEYS` or `cairn.keys` in the working directory (see [`keys_path`]).
    pub keys: PathBuf,
    /// Bounds on requests.
    pub limits: Limits,
    /// Whether MCP clients may run consolidation (`memory_consolidate`).
    pub allow_consolidate: bool,
    /// The model for queries (and summaries); the local MiniLM when `None`.
    pub reader: Option<Arc<dyn Embedder>>,
    /// The model for adds; a second MiniLM instance when `None`.
    pub writer: Option<Arc<dyn Embedder>>,
}

impl ServerOptions {
    /// The defaults for the store at `db`.
    pub fn new(db: impl Into<PathBuf>) -> Self {
        let db = db.into();
        Self {
            keys: keys_path(&db),
            db,
            limits: Limits::default(),
            allow_consolidate: false,
            reader: None,
            writer: None,
        }
    }
}

/// A running service: the stores, the keys, the metrics.
#[derive(Clone)]
pub struct Server {
    state: rest::AppState,
}

async fn minilm() -> anyhow::Result<Arc<dyn Embedder>> {
    let e = tokio::task::spawn_blocking(FastEmbedder::new)
        .await
        .context("loading the embedding model")??;
    Ok(Arc::new(e))
}

impl Server {
    /// Opens the default namespace's store and the models.
    pub async fn open(options: ServerOptions) -> anyhow::Result<Self> {
        let reader = match options.reader {
            Some(r) => r,
            None => minilm().await?,
        };
        let writer = match options.writer {
            Some(w) => w,
            None => minilm().await?,
        };
        let namespaces = Namespaces::open(&options.db, reader)
            .await
            .with_context(|| {
                format!(
                    "opening the store {}",
                    cairn_harness::display_location(&options.db)
                )
            })?;
        let keys = KeyStore::open_file(&options.keys)?;
        let service = Service::new(
            namespaces,
            writer,
            options.limits,
            options.allow_consolidate,
        );
        Ok(Self {
            state: rest::AppState {
                service: Arc::new(service),
                keys: Arc::new(keys),
                metrics: Arc::new(metrics::Metrics::default()),
            },
        })
    }

    /// The operations.
    pub fn service(&self) -> &Arc<Service> {
        &self.state.service
    }

    /// The API keys.
    pub fn keys(&self) -> &Arc<KeyStore> {
        &self.state.keys
    }

    /// The MCP tools with a fixed namespace (stdio), or the key's (HTTP) when `None`.
    pub fn mcp(&self, namespace: Option<Namespace>) -> mcp::CairnMcp {
        mcp::CairnMcp::new(self.state.service.clone(), namespace)
    }

    /// The whole HTTP application (REST, `/mcp`, health, metrics, OpenAPI); MCP sessions
    /// end when `shutdown` is cancelled.
    ///
    /// `/mcp` accepts only loopback `Host` headers (rmcp's guard against DNS rebinding)
    /// unless `any_host` is set, for a server listening beyond loopback, where the API key
    /// is the guard.
    pub fn router(&self, shutdown: &CancellationToken, any_host: bool) -> axum::Router {
        let tools = self.mcp(None);
        let mut config =
            StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token());
        if any_host {
            config = config.disable_allowed_hosts();
        }
        let service: StreamableHttpService<mcp::CairnMcp, LocalSessionManager> =
            StreamableHttpService::new(
                move || Ok(tools.clone()),
                Arc::new(LocalSessionManager::default()),
                config,
            );
        let mcp = axum::Router::new().nest_service("/mcp", service);
        rest::app(self.state.clone(), Some(mcp))
    }

    /// Serves HTTP on `listener` until `shutdown` is cancelled; requests in flight finish
    /// (every acknowledged add is committed), then the indexes are snapshotted.
    pub async fn serve_http(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let any_host = !listener.local_addr()?.ip().is_loopback();
        let app = self.router(&shutdown, any_host);
        let stop = shutdown.clone();
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled_owned().await })
            .await
            .context("serving HTTP")?;
        self.snapshot().await;
        Ok(())
    }

    /// Serves MCP over stdin/stdout for one namespace until the client leaves or `shutdown`
    /// is cancelled. Logs must go to stderr: stdout is the protocol.
    pub async fn serve_stdio(
        &self,
        namespace: Namespace,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let running = self
            .mcp(Some(namespace))
            .serve_with_ct(rmcp::transport::stdio(), shutdown.child_token())
            .await
            .context("starting MCP over stdio")?;
        running.waiting().await.context("serving MCP over stdio")?;
        self.snapshot().await;
        Ok(())
    }

    /// Writes every open store's index snapshot (a faster next start; the rows themselves
    /// are committed already).
    pub async fn snapshot(&self) {
        for (ns, h) in self.state.service.namespaces().opened().await {
            if let Err(e) = h.snapshot().await {
                tracing::warn!("snapshot of namespace {ns}: {e}");
            }
        }
    }

    /// Consolidates every namespace every `every` (memories older than `older_than`), until
    /// `shutdown`; a pass in progress stops after its current chunk.
    pub fn spawn_consolidation(
        &self,
        every: Duration,
        older_than: Duration,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let service = self.state.service.clone();
        tokio::spawn(async move {
            let stop = Arc::new(AtomicBool::new(false));
            let flag = stop.clone();
            let watch = shutdown.clone();
            tokio::spawn(async move {
                watch.cancelled().await;
                flag.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let db = service.namespaces().db().to_path_buf();
                let mut all = namespace::existing_namespaces(&db);
                // Namespaces opened since start (on PostgreSQL, the only ones known).
                all.extend(
                    service
                        .namespaces()
                        .opened()
                        .await
                        .into_iter()
                        .map(|(ns, _)| ns),
                );
                all.sort();
                all.dedup();
                for ns in all {
                    if shutdown.is_cancelled() {
                        break;
                    }
                    let h = match service.namespaces().get(&ns).await {
                        Ok(h) => h,
                        Err(e) => {
                            tracing::warn!("consolidation: namespace {ns}: {e}");
                            continue;
                        }
                    };
                    let policy =
                        ConsolidationPolicy::older_than(older_than).stop_flag(stop.clone());
                    match h.consolidate(policy).await {
                        Ok(r) => tracing::info!(
                            "consolidation: namespace {ns}: {} summaries, {} memories covered",
                            r.summaries.len(),
                            r.memories_covered
                        ),
                        Err(e) => tracing::warn!("consolidation: namespace {ns}: {e}"),
                    }
                }
            }
        })
    }
}

/// A token cancelled on Ctrl-C or SIGTERM.
pub fn shutdown_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = ctrl_c => {}
                        _ = term.recv() => {}
                    }
                }
                Err(_) => {
                    let _ = ctrl_c.await;
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = ctrl_c.await;
        }
        tracing::info!("shutting down: finishing requests in flight");
        t.cancel();
    });
    token
}
