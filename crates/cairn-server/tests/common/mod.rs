//! A server on 127.0.0.1 for tests: real HTTP, real SQLite, the deterministic hash embedder
//! (the real model is exercised by the CLI's end-to-end tests).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use cairn_core::Embedder;
use cairn_embed::HashEmbedder;
use cairn_server::{Limits, Namespace, Server, ServerOptions};
use tokio_util::sync::CancellationToken;

pub const DIM: usize = 64;

pub fn embedder() -> Arc<dyn Embedder> {
    Arc::new(HashEmbedder::new(DIM))
}

pub async fn open(db: PathBuf, keys: PathBuf, limits: Limits) -> Server {
    let e = embedder();
    let mut o = ServerOptions::new(db);
    o.keys = keys;
    o.reader = Some(e.clone());
    o.writer = Some(e);
    o.limits = limits;
    o.allow_consolidate = true;
    Server::open(o).await.unwrap()
}

pub struct TestServer {
    pub base: String,
    pub key_a: String,
    pub key_b: String,
    pub db: PathBuf,
    pub stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
    pub dir: tempfile::TempDir,
    pub agent: ureq::Agent,
}

pub fn start(limits: Limits) -> TestServer {
    start_on(None, limits)
}

/// A server on the store at `db` (a SQLite file in a temporary directory when `None`, or a
/// PostgreSQL URL); its keys in the temporary directory.
pub fn start_on(db: Option<PathBuf>, limits: Limits) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let db = db.unwrap_or_else(|| dir.path().join("m.db"));
    let keys = dir.path().join("keys");
    let (tx, rx) = std::sync::mpsc::channel::<(SocketAddr, String, String, CancellationToken)>();
    let path = db.clone();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let server = open(path, keys, limits).await;
            let a = server
                .keys()
                .create("a", &Namespace::new("alpha").unwrap())
                .unwrap();
            let b = server
                .keys()
                .create("b", &Namespace::new("beta").unwrap())
                .unwrap();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let stop = CancellationToken::new();
            tx.send((addr, a, b, stop.clone())).unwrap();
            server.serve_http(listener, stop).await.unwrap();
        });
    });
    let (addr, key_a, key_b, stop) = rx.recv().unwrap();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    TestServer {
        base: format!("http://{addr}"),
        key_a,
        key_b,
        db,
        stop,
        thread: Some(thread),
        dir,
        agent,
    }
}

impl TestServer {
    /// (status, JSON body or Null).
    pub fn call(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
    ) -> (u16, serde_json::Value) {
        let url = format!("{}{path}", self.base);
        let auth = key.map(|k| format!("Bearer {k}"));
        let resp = match (method, body) {
            ("GET", _) => {
                let mut r = self.agent.get(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
            ("DELETE", _) => {
                let mut r = self.agent.delete(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
            ("PATCH", b) => {
                let mut r = self
                    .agent
                    .patch(&url)
                    .header("Content-Type", "application/json");
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.send(b.unwrap_or(""))
            }
            (_, b) => {
                let mut r = self
                    .agent
                    .post(&url)
                    .header("Content-Type", "application/json");
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.send(b.unwrap_or(""))
            }
        };
        let mut resp = resp.unwrap();
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(64 * 1024 * 1024)
            .read_to_string()
            .unwrap();
        let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        (status, json)
    }

    pub fn stop(&mut self) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
