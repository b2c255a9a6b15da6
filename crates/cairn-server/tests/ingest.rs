//! The ingest queue: adds that arrive together share one model run, searches never wait
//! behind it, and the server's scheduled consolidation writes summaries.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use cairn_core::{EmbedError, Embedder};
use cairn_server::api::{AddMemory, SearchRequest};
use cairn_server::{Limits, Namespace, Server, ServerOptions};

/// The hash embedder behind a gate: every call waits until the gate is open, and calls are
/// counted.
struct Gated {
    inner: Arc<dyn Embedder>,
    open: Mutex<bool>,
    cv: Condvar,
    calls: AtomicUsize,
}

impl Gated {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: common::embedder(),
            open: Mutex::new(false),
            cv: Condvar::new(),
            calls: AtomicUsize::new(0),
        })
    }

    fn release(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

impl Embedder for Gated {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }

    fn dim(&self) -> usize {
        self.inner.dim()
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cv.wait(open).unwrap();
        }
        self.inner.embed(texts)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_that_arrive_together_share_a_model_run_and_searches_do_not_wait() {
    let dir = tempfile::tempdir().unwrap();
    let writer = Gated::new();
    let mut o = ServerOptions::new(dir.path().join("m.db"));
    o.reader = Some(common::embedder());
    o.writer = Some(writer.clone());
    let server = Server::open(o).await.unwrap();
    let svc = server.service().clone();
    let ns = Namespace::default_namespace();

    // 16 requests: the first reaches the model and waits at the gate; the other 15 queue.
    let add = |i: usize| {
        let (svc, ns) = (svc.clone(), ns.clone());
        tokio::spawn(async move {
            let m = AddMemory {
                content: format!("turn {i} about the harbour"),
                thread: Some("t".into()),
                ..AddMemory::default()
            };
            svc.add(&ns, vec![m]).await
        })
    };
    let mut tasks = vec![add(0)];
    while writer.calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tasks.extend((1..16).map(add));
    while svc.ingest_queued() < 15 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(writer.calls.load(Ordering::SeqCst), 1);

    // A search embeds its query with the reader: it answers while the writer is held.
    let hits = tokio::time::timeout(
        Duration::from_secs(30),
        svc.search(
            &ns,
            SearchRequest {
                query: "harbour".into(),
                k: None,
                mode: None,
                thread: None,
                kind: None,
                metadata: None,
                as_of: None,
                history: None,
                half_life: None,
            },
        ),
    )
    .await
    .expect("a search waited behind the ingest model run")
    .unwrap();
    assert!(hits.hits.is_empty(), "nothing is acknowledged yet");

    writer.release();
    let mut ids = Vec::new();
    for t in tasks {
        ids.extend(t.await.unwrap().unwrap().ids);
    }
    assert_eq!(ids.len(), 16);
    let stats = &svc.ingest_stats;
    assert_eq!(
        stats.batches.load(Ordering::SeqCst),
        2,
        "one run, then the 15 together"
    );
    assert_eq!(stats.texts.load(Ordering::SeqCst), 16);
    assert_eq!(writer.calls.load(Ordering::SeqCst), 2);
    for id in ids {
        svc.get(&ns, &id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_consolidates_every_namespace_on_its_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::open(
        dir.path().join("m.db"),
        dir.path().join("keys"),
        Limits::default(),
    )
    .await;
    let svc = server.service();
    let acme = Namespace::new("acme").unwrap();
    for ns in [Namespace::default_namespace(), acme.clone()] {
        let batch = (0..25)
            .map(|i| AddMemory {
                content: format!("{ns} turn {i} on topic {}", i % 4),
                thread: Some("t".into()),
                created_at: Some(format!("2024-02-01T10:{i:02}:00Z")),
                ..AddMemory::default()
            })
            .collect();
        svc.add(&ns, batch).await.unwrap();
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let task = server.spawn_consolidation(
        Duration::from_millis(50),
        Duration::from_secs(3600),
        stop.clone(),
    );
    for ns in [Namespace::default_namespace(), acme] {
        let mut tries = 0;
        loop {
            let t = svc.threads(&ns).await.unwrap();
            if t.threads[0].summaries > 0 {
                break;
            }
            tries += 1;
            assert!(tries < 600, "namespace {ns} was never consolidated");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    stop.cancel();
    task.await.unwrap();
}
