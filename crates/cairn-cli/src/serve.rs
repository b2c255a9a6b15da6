//! `cairn serve`: the store as a service (HTTP: REST + MCP; or MCP over stdio).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use cairn_server::{Limits, Namespace, Server, ServerOptions};

pub struct Args {
    pub db: PathBuf,
    pub namespace: Namespace,
    pub listen: String,
    pub stdio: bool,
    pub consolidate_every: Option<Duration>,
    pub consolidate_older_than: Duration,
    pub allow_consolidate: bool,
    pub max_body: usize,
    pub max_batch: usize,
}

pub async fn run(a: Args) -> Result<()> {
    // stdout is the MCP protocol with --stdio: every log line goes to stderr.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .try_init();
    let mut options = ServerOptions::new(&a.db);
    options.limits = Limits {
        max_body_bytes: a.max_body,
        max_batch: a.max_batch,
        ..Limits::default()
    };
    options.allow_consolidate = a.allow_consolidate;
    eprintln!(
        "cairn: opening {} and loading the model",
        cairn_harness::display_location(&a.db)
    );
    let server = Server::open(options).await?;
    let shutdown = cairn_server::shutdown_signal();
    let consolidation = a.consolidate_every.map(|every| {
        eprintln!(
            "cairn: consolidating every namespace every {}s (memories older than {}s)",
            every.as_secs(),
            a.consolidate_older_than.as_secs()
        );
        server.spawn_consolidation(every, a.consolidate_older_than, shutdown.clone())
    });
    if a.stdio {
        eprintln!("cairn: serving MCP over stdio, namespace {}", a.namespace);
        server.serve_stdio(a.namespace, shutdown.clone()).await?;
    } else {
        let listener = tokio::net::TcpListener::bind(&a.listen)
            .await
            .with_context(|| format!("listening on {}", a.listen))?;
        let addr = listener.local_addr()?;
        eprintln!(
            "cairn: serving http://{addr} (REST /v1, MCP /mcp, /healthz, /metrics, /openapi.json)"
        );
        server.serve_http(listener, shutdown.clone()).await?;
    }
    shutdown.cancel();
    if let Some(c) = consolidation {
        let _ = c.await;
    }
    eprintln!("cairn: stopped");
    Ok(())
}
