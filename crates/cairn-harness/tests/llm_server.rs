//! `OpenAiSummarizer` against a real OpenAI-compatible server on 127.0.0.1: llama.cpp's
//! server (PyPI xllamacpp) with SmolLM2-135M-Instruct, provisioned by scripts/setup-llm.sh.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use cairn_core::{
    ManualClock, MemoryKind, NewMemory, Role, SummarizeError, Summarizer, SummaryItem,
    SummaryRequest, ThreadId,
};
use cairn_embed::HashEmbedder;
use cairn_harness::{ConsolidationPolicy, MemoryHarness, OpenAiSummarizer};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The server process; killed when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start() -> Server {
    let status = Command::new(root().join("scripts/setup-llm.sh"))
        .status()
        .expect("run scripts/setup-llm.sh");
    assert!(status.success(), "provisioning the test LLM server failed");
    let python = std::env::var("CAIRN_LLM_VENV")
        .map(|v| PathBuf::from(v).join("bin/python"))
        .unwrap_or_else(|_| root().join(".cache/llm-venv/bin/python"));
    let port = free_port();
    let mut child = Command::new(python)
        .arg(root().join("scripts/llm_server.py"))
        .arg(port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("READY"), "server did not start: {line:?}");
    Server { child, port }
}

fn request() -> SummaryRequest {
    let at = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    let item = |role, content: &str| SummaryItem {
        kind: MemoryKind::Conversational,
        role: Some(role),
        speaker: None,
        created_at: at,
        time_start: None,
        content: content.into(),
    };
    SummaryRequest {
        previous: None,
        items: vec![
            item(
                Role::User,
                "I am planning a hiking trip to the Alps in August.",
            ),
            item(
                Role::Assistant,
                "Great! Do you need boots or a hut reservation?",
            ),
            item(Role::User, "Boots. My budget is 150 euros."),
        ],
        max_tokens: 60,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summaries_timeouts_and_connection_errors_against_a_real_server() {
    let server = start();
    let base = format!("http://127.0.0.1:{}", server.port);

    // A summary comes back.
    let s = OpenAiSummarizer::builder(&base, "smollm2")
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let text = s.summarize(&request()).await.unwrap();
    println!("summary from SmolLM2: {text:?}");
    assert!(!text.trim().is_empty());

    // A roll-up: summaries in, told their level and dates; the answer is text within the
    // checks consolidation applies (not empty, at most twice the budget).
    let at = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    let child = |days: i64, content: &str| SummaryItem {
        kind: MemoryKind::Summary,
        role: None,
        speaker: None,
        created_at: at + chrono::Duration::days(days + 1),
        time_start: Some(at + chrono::Duration::days(days)),
        content: content.into(),
    };
    let rollup = SummaryRequest {
        items: vec![
            child(
                0,
                "[2023-11-14] Ann: I am planning a hiking trip to the Alps in August.",
            ),
            child(
                9,
                "[2023-11-23] Ann: I bought boots for 150 euros.\nBob: Book the hut early.",
            ),
        ],
        max_tokens: 80,
        level: 2,
        ..Default::default()
    };
    let prompt = s.prompt(&rollup);
    assert!(
        prompt.contains("level-2") && prompt.contains("2023-11-14 to 2023-11-24"),
        "{prompt}"
    );
    let text = s.summarize(&rollup).await.unwrap();
    println!("roll-up from SmolLM2: {text:?}");
    assert!(!text.trim().is_empty());
    let counter = cairn_core::CharEstimateCounter::default();
    assert!(
        cairn_core::TokenCounter::count(&counter, &text) <= 2 * 80 * 2,
        "{text}"
    );

    // A timeout shorter than the call is reported as a timeout.
    let quick = OpenAiSummarizer::builder(&base, "smollm2")
        .timeout(Duration::from_millis(30))
        .build()
        .unwrap();
    let mut long = request();
    long.max_tokens = 400;
    match quick.summarize(&long).await {
        Err(SummarizeError::Timeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }

    // Consolidation through the real server writes a summary and keeps every source.
    let dir = tempfile::tempdir().unwrap();
    let now = chrono::DateTime::from_timestamp(1_750_000_000, 0).unwrap();
    let mem = MemoryHarness::builder(dir.path().join("llm.db"))
        .embedder(Arc::new(HashEmbedder::new(64)))
        .summarizer(Arc::new(s))
        .clock(Arc::new(ManualClock::new(now)))
        .build()
        .await
        .unwrap();
    let thread = ThreadId::new("trip").unwrap();
    let batch = request()
        .items
        .iter()
        .map(|i| {
            NewMemory::conversational(thread.clone(), i.role.unwrap(), &i.content)
                .at(now - chrono::Duration::days(30))
        })
        .collect();
    mem.add_many(batch).await.unwrap();
    let r = mem
        .consolidate(
            ConsolidationPolicy::older_than(Duration::from_secs(3600))
                .min_chunk(1)
                .summary_tokens(60),
        )
        .await
        .unwrap();
    assert_eq!(r.chunks(), 1, "{r}");
    assert_eq!(mem.expand_summary(r.summaries[0]).await.unwrap().len(), 3);
    drop(server);

    // A closed port: a connection error after the configured retries.
    let closed = format!("http://127.0.0.1:{}", free_port());
    let s = OpenAiSummarizer::builder(&closed, "m")
        .retries(2)
        .backoff(Duration::from_millis(10))
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    match s.summarize(&request()).await {
        Err(SummarizeError::Connection { attempts, url, .. }) => {
            assert_eq!(attempts, 3);
            assert!(url.starts_with(&closed));
        }
        other => panic!("expected a connection error, got {other:?}"),
    }
}
