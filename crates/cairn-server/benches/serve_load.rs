//! `cairn serve` under load, with the real model, over loopback HTTP.
//!
//! The bench re-executes itself as the server (a child process, so that it can be
//! SIGKILLed), then:
//! - **Phase A (graceful):** 32 client threads, each with its own HTTP agent and thread,
//!   mix adds (about half; one in eight a batch of 8), contexts and searches for
//!   `CAIRN_LOAD_SECS` (default 60); the server is stopped with SIGTERM and every
//!   acknowledged add (a 201 with its ids) is looked up in the SQLite file.
//! - **Phase B (crash):** the same store, the same load, SIGKILL a third of the way into
//!   it; the server is started again (recovery) and every add acknowledged in either
//!   phase is read back through `GET /v1/memories/{id}` and from the SQLite file.
//!
//! Prints a markdown table per phase and the integrity counts; exits non-zero when an
//! acknowledged add is missing or changed.
//!
//! `cargo bench -p cairn-server --bench serve_load` (60 s), `-- --quick` or
//! `CAIRN_LOAD_SECS=10` for a shorter run. Under `cargo test` (no `--bench`) it only says
//! how to run it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_core::MemoryId;
use cairn_server::{KeyStore, Namespace, Server, ServerOptions};
use serde_json::{json, Value};

/// `DB:PORT` in the server child's environment.
const CHILD_ENV: &str = "CAIRN_LOAD_CHILD";

const TOPICS: &[&str] = &[
    "the train to Porto",
    "my sister's wedding",
    "a bug in the parser",
    "sourdough that collapsed",
    "the quarterly budget",
    "a hiking trip in the Alps",
    "the new puppy",
    "learning Spanish",
    "the leaking kitchen tap",
    "a job interview on Thursday",
];

fn main() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        serve_child(&spec);
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let secs_env = std::env::var("CAIRN_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    if !args.iter().any(|a| a == "--bench") && !quick && secs_env.is_none() {
        println!(
            "serve_load: a load test with the real model; run it with \
             `cargo bench -p cairn-server --bench serve_load` (-- --quick for a smoke run)"
        );
        return;
    }
    let secs = secs_env.unwrap_or(if quick { 5 } else { 60 }).max(3);
    let clients = std::env::var("CAIRN_LOAD_CLIENTS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(32)
        .max(1);
    let ok = run(Duration::from_secs(secs), clients);
    if !ok {
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------------------------------
// The server child.

fn serve_child(spec: &str) {
    let (db, port) = spec.rsplit_once(':').expect("CAIRN_LOAD_CHILD=DB:PORT");
    let port: u16 = port.parse().expect("a port");
    let db = PathBuf::from(db);
    // The same runtime as `cairn serve` (#[tokio::main]: a worker per core).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let r: anyhow::Result<()> = rt.block_on(async move {
        let stop = cairn_server::shutdown_signal();
        let server = Server::open(ServerOptions::new(db)).await?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        server.serve_http(listener, stop).await
    });
    if let Err(e) = r {
        eprintln!("serve_load child: {e:#}");
        std::process::exit(2);
    }
}

/// The server child; SIGKILLed when dropped still running.
struct ServerProc {
    child: Child,
    base: String,
}

impl ServerProc {
    fn start(db: &Path) -> (Self, Duration) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let t = Instant::now();
        let child = Command::new(std::env::current_exe().unwrap())
            .env(CHILD_ENV, format!("{}:{port}", db.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut p = ServerProc {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let agent = agent(Duration::from_secs(2));
        loop {
            if let Some(st) = p.child.try_wait().unwrap() {
                panic!("the server exited while starting: {st}");
            }
            assert!(
                t.elapsed() < Duration::from_secs(300),
                "the server did not answer /healthz within 300 s"
            );
            if let Ok(r) = agent.get(format!("{}/healthz", p.base)).call() {
                if r.status() == 200 {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let ready = t.elapsed();
        (p, ready)
    }

    /// SIGTERM, then waits (SIGKILL after 120 s): the exit status and how long it took.
    fn terminate(mut self) -> (Option<ExitStatus>, Duration) {
        let t = Instant::now();
        let pid = self.child.id().to_string();
        // `kill -TERM`: no unsafe code (the workspace forbids it) and no new dependency.
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(sent, "could not send SIGTERM to the server");
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return (Some(st), t.elapsed());
            }
            if t.elapsed() > Duration::from_secs(120) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return (None, t.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL (`Child::kill` on unix).
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into()
}

// ---------------------------------------------------------------------------------------
// The load.

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Route {
    Add,
    AddBatch,
    Context,
    Search,
}

impl Route {
    const ALL: [Route; 4] = [Route::Add, Route::AddBatch, Route::Context, Route::Search];

    fn label(self) -> &'static str {
        match self {
            Route::Add => "POST /v1/memories (1)",
            Route::AddBatch => "POST /v1/memories (batch of 8)",
            Route::Context => "POST /v1/context",
            Route::Search => "POST /v1/search",
        }
    }
}

#[derive(Default)]
struct RouteStats {
    /// Latencies (ms) of the requests answered with the expected status.
    ok_ms: Vec<f64>,
    /// Errors: a wrong status or a transport error, by what it was.
    errors: BTreeMap<String, usize>,
    /// Requests that failed because the server had been killed (phase B).
    after_kill: usize,
}

#[derive(Default)]
struct ClientOut {
    stats: BTreeMap<Route, RouteStats>,
    /// Acknowledged adds: (id, content).
    acked: Vec<(String, String)>,
}

struct LoadResult {
    stats: BTreeMap<Route, RouteStats>,
    acked: Vec<(String, String)>,
    /// From the start to the deadline or the kill.
    elapsed: Duration,
    metrics: BTreeMap<String, f64>,
}

/// A small deterministic generator (no dependency for a coin toss).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn turn(phase: &str, c: usize, i: u64, rng: &mut Rng) -> Value {
    let topic = TOPICS[rng.below(TOPICS.len() as u64) as usize];
    let role = if i.is_multiple_of(2) {
        "user"
    } else {
        "assistant"
    };
    json!({
        "content": format!(
            "phase {phase} client {c} turn {i}: more about {topic}, note {}.",
            rng.below(100_000)
        ),
        "thread": format!("load-{c}"),
        "role": role,
    })
}

fn client(
    phase: &'static str,
    c: usize,
    base: &str,
    key: &str,
    deadline: Instant,
    stop: &AtomicBool,
    killed: &AtomicBool,
) -> ClientOut {
    let agent = agent(Duration::from_secs(60));
    let auth = format!("Bearer {key}");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((c as u64 + 1) * 0x1000_0000_01B3));
    let mut out = ClientOut::default();
    let mut i = 0u64;
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        let roll = rng.below(100);
        let (route, path, body, expect) = if roll < 50 {
            if rng.below(8) == 0 {
                let batch: Vec<Value> = (0..8)
                    .map(|_| {
                        i += 1;
                        turn(phase, c, i, &mut rng)
                    })
                    .collect();
                (Route::AddBatch, "/v1/memories", Value::Array(batch), 201)
            } else {
                i += 1;
                (Route::Add, "/v1/memories", turn(phase, c, i, &mut rng), 201)
            }
        } else if roll < 75 {
            let topic = TOPICS[rng.below(TOPICS.len() as u64) as usize];
            let body = json!({
                "thread": format!("load-{c}"),
                "query": format!("what did we say about {topic}?"),
                "budget": 2000,
            });
            (Route::Context, "/v1/context", body, 200)
        } else {
            let topic = TOPICS[rng.below(TOPICS.len() as u64) as usize];
            let body = json!({ "query": format!("plans for {topic}"), "k": 10 });
            (Route::Search, "/v1/search", body, 200)
        };
        let t = Instant::now();
        let r = agent
            .post(format!("{base}{path}"))
            .header("Authorization", &auth)
            .send_json(&body);
        let answer = r.and_then(|mut resp| {
            let status = resp.status().as_u16();
            let text = resp
                .body_mut()
                .with_config()
                .limit(64 * 1024 * 1024)
                .read_to_string()?;
            Ok((status, text))
        });
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let s = out.stats.entry(route).or_default();
        match answer {
            Ok((status, text)) if status == expect => {
                s.ok_ms.push(ms);
                if expect == 201 {
                    let v: Value = serde_json::from_str(&text).unwrap();
                    let ids = v["ids"].as_array().unwrap();
                    let sent: Vec<&Value> = match &body {
                        Value::Array(b) => b.iter().collect(),
                        one => vec![one],
                    };
                    assert_eq!(ids.len(), sent.len(), "one id per memory");
                    for (id, m) in ids.iter().zip(sent) {
                        out.acked.push((
                            id.as_str().unwrap().to_owned(),
                            m["content"].as_str().unwrap().to_owned(),
                        ));
                    }
                }
            }
            Ok((status, text)) => {
                if killed.load(Ordering::Relaxed) {
                    s.after_kill += 1;
                } else {
                    let code = serde_json::from_str::<Value>(&text)
                        .ok()
                        .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
                        .unwrap_or_default();
                    *s.errors.entry(format!("{status} {code}")).or_default() += 1;
                }
            }
            Err(e) => {
                if killed.load(Ordering::Relaxed) {
                    s.after_kill += 1;
                } else {
                    let what = e.to_string();
                    let what: String = what.chars().take(60).collect();
                    *s.errors.entry(what).or_default() += 1;
                }
            }
        }
    }
    out
}

fn scrape(base: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let Ok(mut r) = agent(Duration::from_secs(10))
        .get(format!("{base}/metrics"))
        .call()
    else {
        return out;
    };
    let text = r.body_mut().read_to_string().unwrap_or_default();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        if let Some((name, v)) = line.rsplit_once(' ') {
            if let Ok(v) = v.parse::<f64>() {
                out.insert(name.to_owned(), v);
            }
        }
    }
    out
}

/// Runs the load until `duration` ends, or, with `kill_after`, SIGKILLs the server then
/// (after scraping its metrics) and stops the clients.
fn load(
    phase: &'static str,
    server: ServerProc,
    key: &str,
    clients: usize,
    duration: Duration,
    kill_after: Option<Duration>,
) -> (LoadResult, Option<ServerProc>) {
    let base = server.base.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let deadline = start + duration;
    let outs = Arc::new(Mutex::new(Vec::new()));
    let mut handles: Vec<_> = (0..clients)
        .map(|c| {
            let (base, key) = (base.clone(), key.to_owned());
            let (stop, killed, outs) = (stop.clone(), killed.clone(), outs.clone());
            std::thread::spawn(move || {
                let o = client(phase, c, &base, &key, deadline, &stop, &killed);
                outs.lock().unwrap().push(o);
            })
        })
        .collect();
    let (metrics, elapsed, server) = if let Some(after) = kill_after {
        std::thread::sleep(after);
        let metrics = scrape(&base);
        // No new requests from here: what fails now was in flight at the kill.
        killed.store(true, Ordering::SeqCst);
        stop.store(true, Ordering::SeqCst);
        let elapsed = start.elapsed();
        server.kill();
        (metrics, elapsed, None)
    } else {
        for h in handles.drain(..) {
            h.join().unwrap();
        }
        let elapsed = start.elapsed();
        (scrape(&base), elapsed, Some(server))
    };
    for h in handles {
        h.join().unwrap();
    }
    let mut stats: BTreeMap<Route, RouteStats> = BTreeMap::new();
    let mut acked = Vec::new();
    for o in Arc::try_unwrap(outs).ok().unwrap().into_inner().unwrap() {
        for (r, s) in o.stats {
            let t = stats.entry(r).or_default();
            t.ok_ms.extend(s.ok_ms);
            t.after_kill += s.after_kill;
            for (e, n) in s.errors {
                *t.errors.entry(e).or_default() += n;
            }
        }
        acked.extend(o.acked);
    }
    (
        LoadResult {
            stats,
            acked,
            elapsed,
            metrics,
        },
        server,
    )
}

// ---------------------------------------------------------------------------------------
// Reports and checks.

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn table(r: &LoadResult) {
    let secs = r.elapsed.as_secs_f64();
    println!("| route | requests | errors | req/s | p50 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut all = Vec::new();
    let (mut total, mut errors) = (0usize, 0usize);
    for route in Route::ALL {
        let Some(s) = r.stats.get(&route) else {
            continue;
        };
        let mut v = s.ok_ms.clone();
        v.sort_by(f64::total_cmp);
        let e: usize = s.errors.values().sum();
        let n = v.len() + e;
        total += n;
        errors += e;
        println!(
            "| {} | {n} | {e} | {:.1} | {:.1} | {:.1} | {:.1} |",
            route.label(),
            n as f64 / secs,
            percentile(&v, 0.5),
            percentile(&v, 0.99),
            v.last().copied().unwrap_or(f64::NAN),
        );
        all.extend(v);
    }
    all.sort_by(f64::total_cmp);
    println!(
        "| **all** | {total} | {errors} | {:.1} | {:.1} | {:.1} | {:.1} |",
        total as f64 / secs,
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        all.last().copied().unwrap_or(f64::NAN),
    );
    println!();
    for route in Route::ALL {
        if let Some(s) = r.stats.get(&route) {
            for (e, n) in &s.errors {
                println!("- error on {}: {n} × `{e}`", route.label());
            }
        }
    }
    let after: usize = r.stats.values().map(|s| s.after_kill).sum();
    if after > 0 {
        println!("- requests in flight at the kill (failed; not counted above, not acknowledged): {after}");
    }
    let memories: usize = r.acked.len();
    println!(
        "- acknowledged adds: {memories} memories ({:.1} memories/s)",
        memories as f64 / secs
    );
    let m = |k: &str| r.metrics.get(k).copied().unwrap_or(f64::NAN);
    let (runs, texts, reqs) = (
        m("cairn_ingest_model_runs_total"),
        m("cairn_ingest_texts_total"),
        m("cairn_ingest_requests_total"),
    );
    println!(
        "- ingest micro-batching (server's /metrics since its start): {runs} model runs, \
         {texts} texts, {reqs} add requests: {:.2} texts and {:.2} requests per model run",
        texts / runs,
        reqs / runs
    );
}

/// (found with the same content, changed content, missing) for `acked`, read from the
/// SQLite file of the stopped server; and the rows in the file.
fn check_sqlite(db: &Path, acked: &[(String, String)]) -> (usize, usize, usize, usize) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM memories", [], |r| r.get(0))
        .unwrap();
    let mut stmt = conn
        .prepare("SELECT content FROM memories WHERE id = ?1")
        .unwrap();
    let (mut same, mut changed, mut missing) = (0, 0, 0);
    for (id, content) in acked {
        let id = MemoryId::from_str(id).unwrap();
        let got: Option<String> = stmt
            .query_row([id.as_bytes().as_slice()], |r| r.get(0))
            .ok();
        match got {
            Some(c) if &c == content => same += 1,
            Some(_) => changed += 1,
            None => missing += 1,
        }
    }
    (same, changed, missing, rows as usize)
}

/// (found with the same content, changed, missing) through `GET /v1/memories/{id}`, on 4
/// threads.
fn check_api(base: &str, key: &str, acked: &[(String, String)]) -> (usize, usize, usize) {
    let chunk = acked.len().div_ceil(4).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = acked
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    let agent = agent(Duration::from_secs(30));
                    let auth = format!("Bearer {key}");
                    let (mut same, mut changed, mut missing) = (0, 0, 0);
                    for (id, content) in part {
                        let r = agent
                            .get(format!("{base}/v1/memories/{id}"))
                            .header("Authorization", &auth)
                            .call();
                        let got = r.ok().and_then(|mut r| {
                            (r.status() == 200)
                                .then(|| r.body_mut().read_json::<Value>().ok())
                                .flatten()
                        });
                        match got {
                            Some(v) if v["content"].as_str() == Some(content) => same += 1,
                            Some(_) => changed += 1,
                            None => missing += 1,
                        }
                    }
                    (same, changed, missing)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .fold((0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2))
    })
}

/// What vector searches for sampled memories' own text found after the restart.
#[derive(Default)]
struct IndexCheck {
    sampled: usize,
    top10: usize,
    /// Missed in the top 10, found in the top 100.
    top100: usize,
    /// Missed in the top 100, found with a filter on its thread.
    filtered: usize,
    /// Not found at all.
    lost: Vec<String>,
}

fn vector_rank(
    agent: &ureq::Agent,
    base: &str,
    auth: &str,
    id: &str,
    body: Value,
) -> Option<usize> {
    let r = agent
        .post(format!("{base}/v1/search"))
        .header("Authorization", auth)
        .send_json(body);
    let v = r
        .ok()
        .and_then(|mut r| r.body_mut().read_json::<Value>().ok())?;
    v["hits"]
        .as_array()?
        .iter()
        .position(|x| x["id"].as_str() == Some(id))
}

/// Of `n` memories sampled evenly from `acked`, how many a vector search for their exact
/// text finds (the vector index covers them after the restart); misses are retried with
/// k = 100, then within their thread, to tell the approximate search from a lost vector.
fn check_index(base: &str, key: &str, acked: &[(String, String)], n: usize) -> IndexCheck {
    let agent = agent(Duration::from_secs(30));
    let auth = format!("Bearer {key}");
    let step = (acked.len() / n.max(1)).max(1);
    let mut out = IndexCheck::default();
    for (id, content) in acked.iter().step_by(step).take(n) {
        out.sampled += 1;
        let q = |k: usize| json!({ "query": content, "k": k, "mode": "vector" });
        if vector_rank(&agent, base, &auth, id, q(10)).is_some() {
            out.top10 += 1;
            continue;
        }
        if vector_rank(&agent, base, &auth, id, q(100)).is_some() {
            out.top100 += 1;
            continue;
        }
        // "phase B client 3 turn 17: ..." is in thread load-3.
        let c = content.split_whitespace().nth(3).unwrap_or_default();
        let body =
            json!({ "query": content, "k": 10, "mode": "vector", "thread": format!("load-{c}") });
        if vector_rank(&agent, base, &auth, id, body).is_some() {
            out.filtered += 1;
        } else {
            out.lost.push(id.clone());
        }
    }
    out
}

fn print_index(phase: &str, c: &IndexCheck) {
    println!(
        "- vector index after the restart, phase {phase}: {}/{} sampled memories in the top 10 \
         of a vector search for their own text; of the others, {} in the top 100, {} found \
         only within their thread, {} not found{}",
        c.top10,
        c.sampled,
        c.top100,
        c.filtered,
        c.lost.len(),
        if c.lost.is_empty() {
            String::new()
        } else {
            format!(" ({})", c.lost.join(", "))
        }
    );
}

fn run(secs: Duration, clients: usize) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("load.db");
    let key = KeyStore::open(&db)
        .unwrap()
        .create("load", &Namespace::default_namespace())
        .unwrap();
    let mut ok = true;
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("# `cairn serve` under load\n");
    println!(
        "{clients} client threads (one HTTP agent and one thread each), loopback, the real \
         model (MiniLM, two instances: queries and adds), {cores} cores shared by the \
         clients and the server.\n"
    );

    // Phase A: graceful.
    eprintln!("phase A: starting the server");
    let (server, ready) = ServerProc::start(&db);
    eprintln!(
        "phase A: ready in {:.1} s; {} s of load",
        ready.as_secs_f64(),
        secs.as_secs()
    );
    let (a, server) = load("A", server, &key, clients, secs, None);
    let (status, took) = server.unwrap().terminate();
    println!(
        "## Phase A: {:.0} s of load, then SIGTERM\n",
        a.elapsed.as_secs_f64()
    );
    println!(
        "- server ready (GET /healthz) {:.1} s after spawn",
        ready.as_secs_f64()
    );
    table(&a);
    let graceful = status.is_some_and(|s| s.success());
    println!(
        "- SIGTERM: the server exited in {:.2} s ({})",
        took.as_secs_f64(),
        status.map_or_else(|| "did not exit; SIGKILLed".to_owned(), |s| s.to_string())
    );
    ok &= graceful;
    let (same, changed, missing, rows) = check_sqlite(&db, &a.acked);
    println!(
        "- integrity (SQLite, after SIGTERM): {same}/{} acknowledged memories found with \
         their content; {changed} changed, {missing} missing; {rows} rows in the store",
        a.acked.len()
    );
    ok &= changed == 0 && missing == 0;
    println!();

    // Phase B: crash.
    let kill_after = secs / 3;
    eprintln!("phase B: restarting the server");
    let (server, ready) = ServerProc::start(&db);
    eprintln!(
        "phase B: ready in {:.1} s; SIGKILL after {:.0} s of load",
        ready.as_secs_f64(),
        kill_after.as_secs_f64()
    );
    let (b, _) = load("B", server, &key, clients, secs, Some(kill_after));
    println!(
        "## Phase B: {:.0} s of load, then SIGKILL mid-run\n",
        b.elapsed.as_secs_f64()
    );
    println!(
        "- server ready (restart on phase A's store) {:.1} s after spawn",
        ready.as_secs_f64()
    );
    table(&b);
    eprintln!("phase B: recovering");
    let (server, recovered) = ServerProc::start(&db);
    println!(
        "- restart after SIGKILL: ready (GET /healthz) {:.1} s after spawn",
        recovered.as_secs_f64()
    );
    let all: Vec<(String, String)> = a.acked.iter().chain(&b.acked).cloned().collect();
    let (same, changed, missing) = check_api(&server.base, &key, &all);
    println!(
        "- integrity (GET /v1/memories/{{id}} after the restart): {same}/{} acknowledged \
         memories of both phases found with their content; {changed} changed, {missing} missing",
        all.len()
    );
    ok &= changed == 0 && missing == 0;
    print_index("A", &check_index(&server.base, &key, &a.acked, 100));
    print_index("B", &check_index(&server.base, &key, &b.acked, 100));
    let (status, _) = server.terminate();
    ok &= status.is_some_and(|s| s.success());
    let (same, changed, missing, rows) = check_sqlite(&db, &all);
    println!(
        "- integrity (SQLite, after the restart and a SIGTERM): {same}/{} found with their \
         content; {changed} changed, {missing} missing; {rows} rows in the store ({} \
         committed but never acknowledged: adds in flight at the kill)",
        all.len(),
        rows.saturating_sub(all.len())
    );
    ok &= changed == 0 && missing == 0;
    println!();
    println!("{}", if ok { "OK" } else { "FAILED" });
    ok
}
