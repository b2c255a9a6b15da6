//! Reliability under faults, load and hostile input (see docs/reliability.md).
//!
//! Lengths are set by environment variables: `CAIRN_CRASH_ROUNDS` (SIGKILL rounds, default
//! 50), `CAIRN_SOAK_SECS` (soak test, default 3), `CAIRN_PROPTEST_CASES` (cases per
//! property, default 32).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{embedder, forest, harness, now, Slow};

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cairn_core::{
    MemoryId, MemoryKind, NewMemory, Role, SummarizeError, Summarizer, SummaryRequest, ThreadId,
};
use cairn_harness::{
    ConsolidationPolicy, ExtractiveSummarizer, Filter, HarnessError, MemoryHarness,
    OpenAiSummarizer, SearchMode, SearchOptions,
};
use cairn_store::StoreError;
use rand::{Rng, SeedableRng};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn thread(name: &str) -> ThreadId {
    ThreadId::new(name).unwrap()
}

/// `n` turns of `name`, twenty days old, one every ten minutes.
fn old_turns(name: &str, n: usize) -> Vec<NewMemory> {
    (0..n)
        .map(|i| {
            let role = if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            };
            NewMemory::conversational(
                thread(name),
                role,
                format!(
                    "In {name}, message {i} talks about topic {}. A second sentence, number {i}.",
                    i % 7
                ),
            )
            .at(now() - chrono::Duration::days(20) + chrono::Duration::minutes(i as i64 * 10))
        })
        .collect()
}

/// Consolidates until a pass finds nothing to do.
async fn consolidate_fully(mem: &MemoryHarness, name: &str) {
    let policy = ConsolidationPolicy::older_than(Duration::from_secs(3600))
        .fanout(3)
        .thread(thread(name));
    for _ in 0..10 {
        let r = mem.consolidate(policy.clone()).await.unwrap();
        if r.chunks() == 0 && r.failures.is_empty() {
            return;
        }
    }
    panic!("consolidation did not settle");
}

/// Every summary's links are whole: it expands to exactly the sources it lists, its level is
/// one above its highest source, and it is not its own ancestor. The index holds exactly
/// the stored memories, with their attributes (`Store::check_index`).
async fn check_integrity(mem: &MemoryHarness) {
    let summaries = mem
        .list(Filter::all().kinds([MemoryKind::Summary]), 0, usize::MAX)
        .await
        .unwrap();
    for s in &summaries {
        let info = s.summary.as_ref().unwrap();
        let sources = mem.expand_summary(s.id).await.unwrap();
        let ids: Vec<MemoryId> = sources.iter().map(|m| m.id).collect();
        assert_eq!(ids, info.source_ids, "summary {} is whole", s.id);
        assert_eq!(info.source_count, ids.len());
        let top = sources.iter().map(|m| m.level).max().unwrap_or(0);
        assert_eq!(s.level, top + 1, "summary {} level", s.id);
        assert!(!mem
            .ancestors(s.id)
            .await
            .unwrap()
            .iter()
            .any(|a| a.id == s.id));
    }
    let check = mem.sqlite().unwrap().check_index().unwrap();
    assert!(check.is_consistent(), "index matches the rows: {check:?}");
}

// ---------------------------------------------------------------------------------------
// Crash at any instant

const WORDS: [&str; 24] = [
    "apple", "river", "engine", "violet", "harbor", "quartz", "lantern", "meadow", "copper",
    "falcon", "glacier", "orchid", "pepper", "saddle", "tunnel", "walnut", "yonder", "zephyr",
    "basil", "canyon", "dune", "ember", "fjord", "grove",
];

const CRASH_CHILD: &str = "CAIRN_RELIABILITY_CHILD_DB";

/// Child side of the SIGKILL test: consolidates the old thread slowly in the background
/// while adding turns, writing summaries and deleting turns on three live threads, printing
/// each acknowledged write. Runs until killed.
#[test]
fn crash_child() {
    let Ok(path) = std::env::var(CRASH_CHILD) else {
        return;
    };
    let seed: u64 = std::env::var("CAIRN_RELIABILITY_SEED")
        .unwrap()
        .parse()
        .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let slow = Arc::new(Slow(
            Duration::from_millis(40),
            ExtractiveSummarizer::new(embedder()),
        ));
        let mem = harness(std::path::Path::new(&path), Some(slow)).await;
        let bg = mem.clone();
        tokio::spawn(async move { consolidate_fully(&bg, "old").await });
        println!("ready");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut live: HashMap<usize, Vec<MemoryId>> = HashMap::new();
        let mut cited: HashSet<MemoryId> = HashSet::new();
        for n in 0.. {
            let t = rng.random_range(0..3usize);
            let name = format!("live-{t}");
            let turns = live.entry(t).or_default();
            let op = rng.random_range(0..100);
            if op < 65 || turns.len() < 4 {
                let id = mem
                    .add(NewMemory::conversational(
                        thread(&name),
                        Role::User,
                        format!(
                            "{} {} {} {} turn {n} on {name}",
                            WORDS[rng.random_range(0..WORDS.len())],
                            WORDS[rng.random_range(0..WORDS.len())],
                            WORDS[rng.random_range(0..WORDS.len())],
                            WORDS[rng.random_range(0..WORDS.len())],
                        ),
                    ))
                    .await
                    .unwrap();
                println!("A {id}");
                turns.push(id);
            } else if op < 85 {
                let mut picked = Vec::new();
                while picked.len() < 3 {
                    let id = turns[rng.random_range(0..turns.len())];
                    if !picked.contains(&id) {
                        picked.push(id);
                    }
                }
                let s = mem
                    .add_summary(format!("summary {n} of {name}"), &picked, Some(&name))
                    .await
                    .unwrap();
                cited.extend(picked.iter().copied());
                let list: Vec<String> = picked.iter().map(ToString::to_string).collect();
                println!("S {s} {}", list.join(","));
            } else if let Some(pos) = turns.iter().position(|id| !cited.contains(id)) {
                let id = turns.remove(pos);
                println!("X {id}");
                mem.delete(id).await.unwrap();
                println!("D {id}");
            }
        }
    });
}

/// Kills a process doing mixed work at seeded random moments; after each kill the reopened
/// store has every acknowledged write, whole summaries, an index that matches its rows, and
/// consolidation resumes to the same tree as an uninterrupted run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_mixed_work_loses_nothing() {
    let rounds = env_usize("CAIRN_CRASH_ROUNDS", 50);
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.db");
    {
        let mem = harness(&base, None).await;
        mem.add_many(old_turns("old", 107)).await.unwrap();
        mem.store().close().unwrap();
    }
    let reference = {
        let path = dir.path().join("reference.db");
        std::fs::copy(&base, &path).unwrap();
        let mem = harness(&path, None).await;
        consolidate_fully(&mem, "old").await;
        forest(&mem, Some("old")).await
    };
    assert!(!reference.is_empty());
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let (mut acked, mut summaries, mut deletes) = (0, 0, 0);
    for round in 0..rounds {
        let path = dir.path().join(format!("round-{round}.db"));
        std::fs::copy(&base, &path).unwrap();
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_child",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CRASH_CHILD, &path)
            .env("CAIRN_RELIABILITY_SEED", round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        // Wait for the child to be open and working (slow when other tests load the
        // machine), then kill it at a seeded moment.
        let mut lines = Vec::new();
        loop {
            let l = rx
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|e| panic!("round {round}: the child never started ({e})"));
            let ready = l.ends_with("ready");
            lines.push(l);
            if ready {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(5..400)));
        child.kill().unwrap();
        child.wait().unwrap();
        reader.join().unwrap();
        lines.extend(rx.try_iter());

        let mem = harness(&path, None).await;
        let mut added = Vec::new();
        let mut intents = HashSet::new();
        let mut deleted = Vec::new();
        // The last line may be cut short by the kill: only whole lines count.
        let whole = |id: &str| id.parse::<MemoryId>().ok();
        for l in &lines {
            let mut parts = l.split(' ');
            match (parts.next(), parts.next().and_then(whole)) {
                (Some("A"), Some(id)) => added.push(id),
                (Some("X"), Some(id)) => {
                    intents.insert(id);
                }
                (Some("D"), Some(id)) => deleted.push(id),
                (Some("S"), Some(id)) => {
                    let listed: Vec<Option<MemoryId>> =
                        parts.next().unwrap_or("").split(',').map(whole).collect();
                    if listed.len() != 3 || listed.iter().any(Option::is_none) {
                        continue;
                    }
                    let sources: Vec<MemoryId> = listed.into_iter().flatten().collect();
                    let got = mem.expand_summary(id).await.unwrap();
                    let got: Vec<MemoryId> = got.iter().map(|m| m.id).collect();
                    assert_eq!(got, sources, "round {round}: summary {id}");
                    summaries += 1;
                }
                _ => {}
            }
        }
        for id in &added {
            if !intents.contains(id) {
                mem.get(*id)
                    .await
                    .unwrap_or_else(|e| panic!("round {round}: acknowledged {id} lost: {e}"));
                acked += 1;
            }
        }
        for id in &deleted {
            assert!(
                matches!(mem.get(*id).await, Err(HarnessError::NotFound { .. })),
                "round {round}: deleted {id} is back"
            );
            deletes += 1;
        }
        check_integrity(&mem).await;
        // Memories are found by their own text (the index answers for the rows).
        for id in added.iter().filter(|id| !intents.contains(id)).step_by(7) {
            let m = mem.get(*id).await.unwrap();
            let hits = mem
                .search(
                    &m.content,
                    SearchOptions::all().mode(SearchMode::Vector).k(10),
                )
                .await
                .unwrap();
            // The 64-dimension test embedder can give two near-identical texts the same
            // vector, so the memory is among the best hits rather than always first.
            assert!(
                hits.iter().any(|h| h.memory.id == *id),
                "round {round}: {id} not found by its own text {:?}: {:?}",
                m.content,
                hits.iter()
                    .map(|h| (h.score, h.memory.content.clone()))
                    .collect::<Vec<_>>()
            );
        }
        consolidate_fully(&mem, "old").await;
        assert_eq!(
            forest(&mem, Some("old")).await,
            reference,
            "round {round}: consolidation resumed to the same tree"
        );
        drop(mem);
        let _ = std::fs::remove_file(&path);
    }
    println!(
        "{rounds} SIGKILL rounds: {acked} acknowledged adds, {summaries} summaries, \
         {deletes} deletes checked"
    );
    assert!(acked > rounds, "the children did some work");
}

// ---------------------------------------------------------------------------------------
// Two processes on one store

const WORKER_CHILD: &str = "CAIRN_RELIABILITY_WORKER_DB";

/// Child side of the two-process test. Opens the store, says `ready`, then serves commands
/// from stdin while (with `CAIRN_RELIABILITY_WRITE` set to a thread name) it writes turns
/// and summaries on that thread in the background, printing each acknowledged write:
/// - `consolidate`: consolidates the thread `old` until done, then prints `consolidated`;
/// - `find <id>`: reads the memory and searches for its text in its thread (vector search),
///   printing `found <id>` when both succeed, `lost <id>` otherwise;
/// - `summaries <thread>`: one summary search on the thread, printing `summaries` and the
///   ids found;
/// - `check`: compares the index with the rows (`consistent` or `inconsistent`).
#[test]
fn worker_child() {
    let Ok(path) = std::env::var(WORKER_CHILD) else {
        return;
    };
    let seed: u64 = std::env::var("CAIRN_RELIABILITY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mem = harness(std::path::Path::new(&path), None).await;
        if let Ok(name) = std::env::var("CAIRN_RELIABILITY_WRITE") {
            let w = mem.clone();
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                let mut turns: Vec<MemoryId> = Vec::new();
                // At most 600 writes a thread, so that a thread's searches scan it exactly
                // (the graph's recall on the 64-dimension test vectors is not the point).
                for n in 0..600 {
                    if n % 6 == 5 && turns.len() >= 3 {
                        let picked = turns[turns.len() - 3..].to_vec();
                        let s = w
                            .add_summary(format!("summary {n} of {name}"), &picked, Some(&name))
                            .await
                            .unwrap();
                        println!("S {s}");
                    } else {
                        let id = w
                            .add(NewMemory::conversational(
                                thread(&name),
                                Role::User,
                                format!(
                                    "{} {} {} turn {n} on {name}",
                                    WORDS[rng.random_range(0..WORDS.len())],
                                    WORDS[rng.random_range(0..WORDS.len())],
                                    WORDS[rng.random_range(0..WORDS.len())],
                                ),
                            ))
                            .await
                            .unwrap();
                        println!("A {id}");
                        turns.push(id);
                    }
                }
            });
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        std::thread::spawn(move || {
            for l in std::io::stdin().lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        println!("ready");
        while let Some(cmd) = rx.recv().await {
            let mut parts = cmd.split(' ');
            match (parts.next(), parts.next()) {
                (Some("consolidate"), _) => {
                    consolidate_fully(&mem, "old").await;
                    println!("consolidated");
                }
                (Some("find"), Some(id)) => {
                    let id: MemoryId = id.parse().unwrap();
                    let why = match mem.get(id).await {
                        Ok(m) => {
                            let t = m.thread_id.clone().unwrap();
                            let hits = mem
                                .search(
                                    &m.content,
                                    SearchOptions::all()
                                        .mode(SearchMode::Vector)
                                        .thread(t)
                                        .k(10),
                                )
                                .await
                                .unwrap();
                            if hits.iter().any(|h| h.memory.id == id) {
                                None
                            } else {
                                let s = mem.stats().await.unwrap();
                                Some(format!(
                                    "not among {} hits; {:?}; store {:?}",
                                    hits.len(),
                                    hits.first().map(|h| (h.score, &h.memory.content)),
                                    s
                                ))
                            }
                        }
                        Err(e) => Some(e.to_string()),
                    };
                    match why {
                        None => println!("found {id}"),
                        Some(why) => println!("lost {id} {why}"),
                    }
                }
                (Some("summaries"), Some(t)) => {
                    let hits = mem
                        .search(
                            "summary",
                            SearchOptions::summaries().thread(thread(t)).k(100_000),
                        )
                        .await
                        .unwrap();
                    let ids: Vec<String> = hits.iter().map(|h| h.memory.id.to_string()).collect();
                    println!("summaries {}", ids.join(","));
                }
                (Some("check"), _) => {
                    let ok = mem.sqlite().unwrap().check_index().unwrap().is_consistent();
                    println!("{}", if ok { "consistent" } else { "inconsistent" });
                }
                _ => println!("unknown command {cmd}"),
            }
        }
    });
}

/// A running [`worker_child`]: its stdin, and its stdout lines on a channel.
struct Worker {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Worker {
    fn start(path: &std::path::Path, write: Option<&str>, seed: u64) -> Worker {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = Command::new(exe);
        cmd.args([
            "--exact",
            "worker_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(WORKER_CHILD, path)
        .env("CAIRN_RELIABILITY_SEED", seed.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        if let Some(t) = write {
            cmd.env("CAIRN_RELIABILITY_WRITE", t);
        }
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut w = Worker {
            child,
            stdin,
            lines: rx,
            seen: Vec::new(),
        };
        w.wait_for(|l| l.ends_with("ready"));
        w
    }

    /// Reads lines until one passes `done`; returns it. Every line is kept in `seen`.
    fn wait_for(&mut self, done: impl Fn(&str) -> bool) -> String {
        loop {
            let l = self
                .lines
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|e| {
                    panic!("the worker stopped answering ({e}): {:?}", self.seen.last())
                });
            self.seen.push(l.clone());
            if done(&l) {
                return l;
            }
        }
    }

    fn ask(&mut self, cmd: &str, done: impl Fn(&str) -> bool) -> String {
        use std::io::Write;
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        self.wait_for(done)
    }

    /// SIGKILL; returns every whole line it printed.
    fn kill(mut self) -> Vec<String> {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(l);
        }
        self.seen
    }
}

/// Acknowledged adds and summaries among a worker's lines (a line cut by a kill does not
/// parse and does not count).
fn acknowledged(lines: &[String]) -> (Vec<MemoryId>, Vec<MemoryId>) {
    let (mut adds, mut sums) = (Vec::new(), Vec::new());
    for l in lines {
        match l.split_once(' ') {
            Some(("A", id)) => adds.extend(id.parse::<MemoryId>().ok()),
            Some(("S", id)) => sums.extend(id.parse::<MemoryId>().ok()),
            _ => {}
        }
    }
    (adds, sums)
}

/// Issue 16, item 1, with real processes: a long-lived process reading through
/// `MemoryHarness` finds, in one call, the summaries another process's consolidation wrote;
/// then two writing processes are SIGKILLed in turn at seeded moments and the survivor
/// finds every write the victim acknowledged, with an index that matches the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_see_each_others_writes() {
    let rounds = env_usize("CAIRN_MULTIPROCESS_ROUNDS", 6);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    {
        let mem = harness(&path, None).await;
        mem.add_many(old_turns("old", 107)).await.unwrap();
        mem.store().close().unwrap();
    }
    // The agent's process is open (its index loaded) before the cron's process writes.
    let mut agent = Worker::start(&path, None, 0);
    let none = agent.ask("summaries old", |l| l.starts_with("summaries"));
    assert_eq!(none, "summaries ", "no summaries yet");
    let mut cron = Worker::start(&path, None, 0);
    cron.ask("consolidate", |l| l == "consolidated");
    let written: HashSet<String> = {
        let mem = harness(&path, None).await;
        mem.list(Filter::all().kinds([MemoryKind::Summary]), 0, usize::MAX)
            .await
            .unwrap()
            .iter()
            .map(|m| m.id.to_string())
            .collect()
    };
    assert!(written.len() > 5, "the cron wrote a tree");
    let found = agent.ask("summaries old", |l| l.starts_with("summaries"));
    let found: HashSet<String> = found["summaries ".len()..]
        .split(',')
        .map(str::to_owned)
        .collect();
    assert_eq!(
        found, written,
        "the agent's first search finds every summary"
    );
    assert_eq!(
        agent.ask("check", |l| l.ends_with("consistent")),
        "consistent"
    );
    cron.kill();
    agent.kill();

    // Two writers; each round one of them is killed and the other checks its writes.
    let mut rng = rand::rngs::StdRng::seed_from_u64(16);
    let mut workers = [
        Some(Worker::start(&path, Some("p0-0"), 1)),
        Some(Worker::start(&path, Some("p1-0"), 2)),
    ];
    let mut names = [String::from("p0-0"), String::from("p1-0")];
    let mut checked = 0;
    for round in 0..rounds {
        let victim = rng.random_range(0..2usize);
        let survivor = 1 - victim;
        std::thread::sleep(Duration::from_millis(rng.random_range(20..300)));
        let lines = workers[victim].take().unwrap().kill();
        // (A victim killed right after it started may have acknowledged nothing.)
        let (adds, sums) = acknowledged(&lines);
        let s = workers[survivor].as_mut().unwrap();
        for id in &adds {
            let answer = s.ask(&format!("find {id}"), |l| {
                l.starts_with("found") || l.starts_with("lost")
            });
            assert_eq!(answer, format!("found {id}"), "round {round}");
            checked += 1;
        }
        let listed = s.ask(&format!("summaries {}", names[victim]), |l| {
            l.starts_with("summaries")
        });
        let listed: HashSet<&str> = listed["summaries ".len()..].split(',').collect();
        for id in &sums {
            assert!(
                listed.contains(id.to_string().as_str()),
                "round {round}: summary {id} of the killed process not found"
            );
        }
        assert_eq!(s.ask("check", |l| l.ends_with("consistent")), "consistent");
        names[victim] = format!("p{victim}-{}", round + 1);
        workers[victim] = Some(Worker::start(
            &path,
            Some(&names[victim]),
            100 + round as u64,
        ));
    }
    for w in workers.into_iter().flatten() {
        w.kill();
    }
    let mem = harness(&path, None).await;
    check_integrity(&mem).await;
    println!(
        "{rounds} rounds: {checked} acknowledged writes of killed processes found by the other"
    );
    assert!(checked > rounds, "the workers did some work");
}

// ---------------------------------------------------------------------------------------
// Disk full

/// Unmounts on drop.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_fails_cleanly_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("small");
    if !mount_tmpfs(&mount, "3m") {
        eprintln!("skipped: mounting a tmpfs needs root (CAP_SYS_ADMIN)");
        return;
    }
    let _guard = Mount(mount.clone());
    let ballast = mount.join("ballast");
    std::fs::write(&ballast, vec![0u8; 1 << 20]).unwrap();
    let path = mount.join("full.db");
    let mem = harness(&path, None).await;
    let mut ids = Vec::new();
    let error = loop {
        let text = format!("memory {} {}", ids.len(), "filler words ".repeat(300));
        match mem.add_knowledge(text).await {
            Ok(id) => ids.push(id),
            Err(e) => break e,
        }
        assert!(ids.len() < 10_000, "the disk never filled");
    };
    println!("disk full after {} memories: {error}", ids.len());
    assert!(
        matches!(error, HarnessError::Store(StoreError::DiskFull)),
        "{error:?}"
    );
    // Still readable, nothing lost.
    for id in &ids {
        mem.get(*id).await.unwrap();
    }
    let hits = mem
        .search("memory filler", SearchOptions::all().k(5))
        .await
        .unwrap();
    assert!(!hits.is_empty());
    // Space freed: writes work again.
    std::fs::remove_file(&ballast).unwrap();
    let more = mem
        .add_knowledge("written after space was freed")
        .await
        .unwrap();
    mem.store().close().unwrap();
    drop(mem);
    let mem = harness(&path, None).await;
    for id in ids.iter().chain([&more]) {
        mem.get(*id).await.unwrap();
    }
    assert_eq!(mem.stats().await.unwrap().store.total, ids.len() + 1);
    check_integrity(&mem).await;
    mem.store().close().unwrap();
}

/// Mounts a small tmpfs at `mount` (root only); false when it cannot.
fn mount_tmpfs(mount: &std::path::Path, size: &str) -> bool {
    std::fs::create_dir_all(mount).unwrap();
    Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(mount)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Issue 16, item 2, on a full disk: a store of 2,000 memories (a snapshot of about 1 MB,
/// due again after 200 new entries), 150 writes, then the disk filled to about 320 KB free,
/// so the next snapshot fails while commits still fit. Every write that returned `Ok` is
/// stored exactly once, every `Err` wrote nothing, and snapshot failures are counted in
/// `stats`, not returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_snapshots_never_fail_a_committed_write() {
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("small");
    if !mount_tmpfs(&mount, "32m") {
        eprintln!("skipped: mounting a tmpfs needs root (CAP_SYS_ADMIN)");
        return;
    }
    let _guard = Mount(mount.clone());
    let path = mount.join("full.db");
    {
        let mem = harness(&path, None).await;
        let many = (0..2_000)
            .map(|i| NewMemory::new(MemoryKind::Knowledge, format!("base memory {i}")))
            .collect();
        mem.add_many(many).await.unwrap();
        mem.store().close().unwrap();
    }
    let e = embedder();
    let mem = MemoryHarness::builder(&path)
        .embedder(e.clone())
        .clock(Arc::new(cairn_core::ManualClock::new(now())))
        .summarizer(Arc::new(ExtractiveSummarizer::new(e)))
        .store_options(|o| o.snapshot_every = 1)
        // The store's own writes are the point here, not the embedding cache's.
        .embedding_cache(false)
        .build()
        .await
        .unwrap();
    let mut acked = Vec::new();
    for i in 0..150 {
        acked.push(mem.add_knowledge(format!("early {i}")).await.unwrap());
    }
    let base = mem.stats().await.unwrap().store.total - acked.len();
    // Fill the disk with 64 KiB files, then free five of them.
    let mut ballast = Vec::new();
    loop {
        let f = mount.join(format!("ballast-{}", ballast.len()));
        if std::fs::write(&f, vec![0u8; 1 << 16]).is_err() {
            let _ = std::fs::remove_file(&f);
            break;
        }
        ballast.push(f);
    }
    for f in ballast.drain(ballast.len() - 5..) {
        std::fs::remove_file(f).unwrap();
    }
    let mut failed = 0;
    let mut snapshot_failures_seen = 0;
    for i in 0..20_000 {
        let text = format!("memory {i} {}", WORDS[i % WORDS.len()].repeat(8));
        match mem.add_knowledge(text).await {
            Ok(id) => acked.push(id),
            Err(e) => {
                assert!(
                    matches!(e, HarnessError::Store(StoreError::DiskFull)),
                    "{e:?}"
                );
                failed += 1;
            }
        }
        let total = mem.stats().await.unwrap().store.total;
        assert_eq!(
            total,
            base + acked.len(),
            "write {i}: stored once per Ok, never on Err"
        );
        snapshot_failures_seen = mem.stats().await.unwrap().store.snapshot_failures;
        if failed >= 3 {
            break;
        }
    }
    println!(
        "{} writes acknowledged, {failed} refused, {snapshot_failures_seen} snapshot failures after commits",
        acked.len()
    );
    assert!(failed >= 3, "the disk never filled");
    assert!(
        snapshot_failures_seen > 0,
        "snapshots failed after committed writes"
    );
    for f in ballast {
        std::fs::remove_file(f).unwrap();
    }
    mem.add_knowledge("written after space was freed")
        .await
        .unwrap();
    let stats = mem.stats().await.unwrap().store;
    assert_eq!(stats.last_snapshot_error, None, "the snapshot was retried");
    mem.store().close().unwrap();
    drop(mem);
    let mem = harness(&path, None).await;
    for id in &acked {
        mem.get(*id).await.unwrap();
    }
    assert_eq!(
        mem.stats().await.unwrap().store.total,
        base + acked.len() + 1
    );
    check_integrity(&mem).await;
    mem.store().close().unwrap();
}

// ---------------------------------------------------------------------------------------
// Summarizer faults

struct Faulty(&'static str);

#[async_trait]
impl Summarizer for Faulty {
    fn name(&self) -> &str {
        self.0
    }
    async fn summarize(&self, r: &SummaryRequest) -> Result<String, SummarizeError> {
        match self.0 {
            "error" => Err(SummarizeError::Other("model crashed".into())),
            "timeout" => {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok("late".into())
            }
            "empty" => Ok("  \n ".into()),
            _ => Ok("far too long ".repeat(r.max_tokens * 3)),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summarizer_faults_are_reported_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, expect) in [
        ("error", "model crashed"),
        ("timeout", "timed out"),
        ("empty", "empty summary"),
        ("huge", "more than twice the budget"),
    ] {
        let mem = harness(
            &dir.path().join(format!("{kind}.db")),
            Some(Arc::new(Faulty(kind))),
        )
        .await;
        mem.add_many(old_turns("t", 45)).await.unwrap();
        let report = mem
            .consolidate(
                ConsolidationPolicy::older_than(Duration::from_secs(3600))
                    .timeout(Duration::from_millis(100)),
            )
            .await
            .unwrap();
        assert_eq!(report.chunks(), 0, "{kind}");
        assert_eq!(report.failures.len(), 3, "{kind}: one per chunk");
        for f in &report.failures {
            assert!(f.reason.contains(expect), "{kind}: {}", f.reason);
            assert_eq!(
                f.memory_ids.len(),
                if f.memory_ids.len() == 5 { 5 } else { 20 }
            );
        }
        let stats = mem.stats().await.unwrap().store;
        assert_eq!(stats.total, 45, "{kind}: nothing written, nothing lost");
        assert_eq!(stats.links, 0);
    }
}

// ---------------------------------------------------------------------------------------
// Load

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i]
}

/// Writers, readers, searches, expansions and a consolidation loop on one store for
/// `CAIRN_SOAK_SECS` seconds: every write is there afterwards, nothing fails or hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_mixed_load() {
    let secs = env_usize("CAIRN_SOAK_SECS", 3);
    let dir = tempfile::tempdir().unwrap();
    let mem = harness(&dir.path().join("soak.db"), None).await;
    let deadline = Instant::now() + Duration::from_secs(secs as u64);
    let lat: Arc<Mutex<HashMap<&'static str, Vec<Duration>>>> = Arc::default();
    let written: Arc<Mutex<Vec<MemoryId>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let record =
        |lat: &Arc<Mutex<HashMap<&'static str, Vec<Duration>>>>, op: &'static str, d: Duration| {
            lat.lock().unwrap().entry(op).or_default().push(d);
        };
    let mut tasks = Vec::new();
    for w in 0..3usize {
        let (mem, lat, written) = (mem.clone(), lat.clone(), written.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0usize;
            while Instant::now() < deadline {
                // Old turns, so that the consolidation loop has work.
                let m = NewMemory::conversational(
                    thread(&format!("soak-{w}")),
                    Role::User,
                    format!("writer {w} turn {i} about subject {}", i % 11),
                )
                .at(now() - chrono::Duration::days(30) + chrono::Duration::seconds(i as i64));
                let t = Instant::now();
                let id = mem.add(m).await.unwrap();
                record(&lat, "add", t.elapsed());
                written.lock().unwrap().push(id);
                i += 1;
            }
        }));
    }
    {
        let (mem, lat, written) = (mem.clone(), lat.clone(), written.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(3);
            while Instant::now() < deadline {
                let pick = {
                    let w = written.lock().unwrap();
                    (!w.is_empty()).then(|| w[rng.random_range(0..w.len())])
                };
                if let Some(id) = pick {
                    let t = Instant::now();
                    mem.get(id).await.unwrap();
                    record(&lat, "get", t.elapsed());
                }
                let t = Instant::now();
                mem.search(
                    &format!("turn about subject {}", rng.random_range(0..11)),
                    SearchOptions::all().k(10),
                )
                .await
                .unwrap();
                record(&lat, "search", t.elapsed());
                let summaries = mem
                    .list(Filter::all().kinds([MemoryKind::Summary]), 0, 50)
                    .await
                    .unwrap();
                if let Some(s) = summaries.last() {
                    let t = Instant::now();
                    mem.expand_summary(s.id).await.unwrap();
                    record(&lat, "expand", t.elapsed());
                }
                let t = Instant::now();
                mem.assemble_context("soak-0", "what about subject 3", 500)
                    .await
                    .unwrap();
                record(&lat, "context", t.elapsed());
            }
        }));
    }
    {
        let (mem, lat, stop) = (mem.clone(), lat.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let t = Instant::now();
                let r = mem
                    .consolidate(ConsolidationPolicy::older_than(Duration::from_secs(3600)))
                    .await
                    .unwrap();
                assert!(r.failures.is_empty(), "{:?}", r.failures);
                record(&lat, "consolidate", t.elapsed());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    let consolidator = tasks.pop().unwrap();
    let all = futures_join(tasks);
    tokio::time::timeout(Duration::from_secs(secs as u64 + 120), all)
        .await
        .expect("no deadlock");
    stop.store(true, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(120), consolidator)
        .await
        .expect("consolidation loop stops")
        .unwrap();
    let written = written.lock().unwrap().clone();
    for id in &written {
        mem.get(*id).await.unwrap();
    }
    check_integrity(&mem).await;
    let mut lat = lat.lock().unwrap();
    println!("soak {secs} s: {} writes, all present", written.len());
    println!("| operation | count | p50 (ms) | p99 (ms) |\n|---|---:|---:|---:|");
    let mut ops: Vec<_> = lat.keys().copied().collect();
    ops.sort_unstable();
    for op in ops {
        let v = lat.get_mut(op).unwrap();
        let n = v.len();
        let p50 = percentile(v, 0.5);
        let p99 = percentile(v, 0.99);
        println!(
            "| {op} | {n} | {:.2} | {:.2} |",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
    }
    assert!(written.len() > 10);
}

async fn futures_join(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in tasks {
        t.await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// Hostile input

fn cases() -> u32 {
    u32::try_from(env_usize("CAIRN_PROPTEST_CASES", 32)).unwrap_or(32)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Text from every corner of Unicode: NUL and control characters, combining marks,
/// right-to-left text, emoji, SQL and FTS5 syntax.
fn hostile_text() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let pieces = prop_oneof![
        any::<char>().prop_map(String::from),
        Just("\u{0}".to_owned()),
        Just("e\u{301}\u{308}\u{20dd}".to_owned()),
        Just("\u{202e}שלום עולם\u{202c} مرحبا".to_owned()),
        Just("'); DROP TABLE memories; --".to_owned()),
        Just("\"unbalanced AND OR NOT NEAR( * ^".to_owned()),
        Just(" ".to_owned()),
        Just("\u{feff}\u{200b}".to_owned()),
        Just("👩‍👩‍👧 🏳️‍🌈".to_owned()),
        "[a-z]{1,8}",
    ];
    proptest::collection::vec(pieces, 0..24).prop_map(|v| v.concat())
}

/// Arbitrary text, thread names and queries: typed errors or exact round trips, never a
/// panic, and the store stays whole.
#[test]
fn hostile_text_round_trips_or_gets_typed_errors() {
    use proptest::prelude::*;
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let mem = rt.block_on(harness(&dir.path().join("h.db"), None));
    let stored = AtomicUsize::new(0);
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: cases(),
        ..Default::default()
    });
    runner
        .run(
            &(hostile_text(), hostile_text(), hostile_text()),
            |(content, thread_name, query)| {
                rt.block_on(async {
                    match ThreadId::new(thread_name.as_str()) {
                        Err(_) => {}
                        Ok(t) => {
                            let m = NewMemory::conversational(t, Role::User, content.clone());
                            match mem.add(m).await {
                                Ok(id) => {
                                    stored.fetch_add(1, Ordering::SeqCst);
                                    let back = mem.get(id).await.unwrap();
                                    prop_assert_eq!(back.content, content.clone());
                                    let t = back.thread_id.unwrap();
                                    prop_assert_eq!(t.as_str(), thread_name.as_str());
                                }
                                Err(HarnessError::Input(_)) => {
                                    prop_assert!(content.trim().is_empty());
                                }
                                Err(e) => prop_assert!(false, "{e:?}"),
                            }
                        }
                    }
                    for mode in [SearchMode::Vector, SearchMode::Keyword, SearchMode::Hybrid] {
                        match mem.search(&query, SearchOptions::all().mode(mode)).await {
                            Ok(_) => {}
                            Err(HarnessError::Input(_)) => prop_assert!(query.trim().is_empty()),
                            Err(e) => prop_assert!(false, "{mode:?} {query:?}: {e:?}"),
                        }
                    }
                    Ok(())
                })
            },
        )
        .unwrap();
    rt.block_on(async {
        let total = mem.stats().await.unwrap().store.total;
        assert_eq!(total, stored.load(Ordering::SeqCst));
        // A 1 MiB string is accepted whole; one byte more is a typed error.
        let big = "ab\u{0}ç".repeat((1 << 20) / 5);
        let id = mem.add_knowledge(big.clone()).await.unwrap();
        assert_eq!(mem.get(id).await.unwrap().content, big);
        let over = "x".repeat((1 << 20) + 1);
        assert!(matches!(
            mem.add_knowledge(over).await,
            Err(HarnessError::Input(_))
        ));
        check_integrity(&mem).await;
    });
}

/// Metadata nested to any depth: stored whole up to the limit, a typed error beyond it.
#[test]
fn deep_metadata_is_stored_or_refused() {
    use proptest::prelude::*;
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let mem = rt.block_on(harness(&dir.path().join("m.db"), None));
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: cases(),
        ..Default::default()
    });
    runner
        .run(&(1usize..200, hostile_text()), |(depth, leaf)| {
            rt.block_on(async {
                let mut v = serde_json::json!(leaf);
                for i in 0..depth {
                    v = if i % 2 == 0 {
                        serde_json::json!({ "k": v })
                    } else {
                        serde_json::json!([v, null, 1.5])
                    };
                }
                let mut meta = cairn_core::Metadata::new();
                meta.insert("deep".into(), v.clone());
                let m = NewMemory::new(MemoryKind::Knowledge, "a fact").with_metadata(meta);
                match mem.add(m).await {
                    Ok(id) => {
                        prop_assert!(depth <= 64);
                        prop_assert_eq!(&mem.get(id).await.unwrap().metadata["deep"], &v);
                    }
                    Err(HarnessError::Input(_)) => prop_assert!(depth > 60),
                    Err(e) => prop_assert!(false, "{e:?}"),
                }
                Ok(())
            })
        })
        .unwrap();
}

/// NaN, infinite, zero and wrong-length vectors are refused with a typed error and write
/// nothing.
#[test]
fn bad_vectors_are_refused() {
    use proptest::prelude::*;
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let mem = rt.block_on(harness(&dir.path().join("v.db"), None));
    let store = mem.store();
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: cases(),
        ..Default::default()
    });
    let bad = prop_oneof![
        (0usize..64).prop_map(|i| {
            let mut v = vec![0.1f32; 64];
            v[i] = f32::NAN;
            v
        }),
        (0usize..64, any::<bool>()).prop_map(|(i, neg)| {
            let mut v = vec![0.1f32; 64];
            v[i] = if neg {
                f32::NEG_INFINITY
            } else {
                f32::INFINITY
            };
            v
        }),
        Just(vec![0.0f32; 64]),
        (0usize..200)
            .prop_filter("not 64", |n| *n != 64)
            .prop_map(|n| vec![0.5f32; n]),
    ];
    runner
        .run(&bad, |v| {
            let r = store.insert(NewMemory::new(MemoryKind::Knowledge, "x"), v.clone());
            prop_assert!(matches!(r, Err(StoreError::Input(_))), "{r:?}");
            let q = store.search_vector(v, 3, &Filter::all());
            prop_assert!(matches!(q, Err(StoreError::Input(_))), "{q:?}");
            Ok(())
        })
        .unwrap();
    assert_eq!(store.stats().unwrap().total, 0);
}

/// Random summary graphs, with attempts at cycles, self-reference, repeats and unknown ids:
/// every refusal is typed and the graph stays whole (levels, links, no cycles).
#[test]
fn random_summary_graphs_stay_whole() {
    use proptest::prelude::*;
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: cases().min(16),
        ..Default::default()
    });
    let case = AtomicUsize::new(0);
    let ops = proptest::collection::vec(
        (any::<bool>(), proptest::collection::vec(0usize..64, 1..5)),
        1..40,
    );
    runner
        .run(&ops, |ops| {
            let path = dir
                .path()
                .join(format!("g{}.db", case.fetch_add(1, Ordering::SeqCst)));
            rt.block_on(async {
                let mem = harness(&path, None).await;
                let mut ids = mem.add_many(old_turns("g", 8)).await.unwrap();
                let mut summaries: Vec<MemoryId> = Vec::new();
                for (extend, picks) in ops {
                    let mut sources: Vec<MemoryId> =
                        picks.iter().map(|p| ids[p % ids.len()]).collect();
                    if picks[0] % 7 == 0 {
                        sources.push(MemoryId::new()); // unknown
                    }
                    let r = if extend && !summaries.is_empty() {
                        let target = summaries[picks[0] % summaries.len()];
                        mem.extend_summary(target, &sources).await.map(|u| u.id)
                    } else {
                        mem.add_summary("s", &sources, Some("g")).await
                    };
                    match r {
                        Ok(id) => {
                            if !summaries.contains(&id) {
                                summaries.push(id);
                                ids.push(id);
                            }
                        }
                        Err(HarnessError::NotFound { .. }) => {}
                        Err(HarnessError::Store(
                            StoreError::Cycle { .. }
                            | StoreError::SelfReference { .. }
                            | StoreError::DuplicateSource { .. },
                        )) => {}
                        Err(e) => prop_assert!(false, "{e:?}"),
                    }
                }
                check_integrity(&mem).await;
                Ok(())
            })
        })
        .unwrap();
}

/// Issue 16, item 6: any options — shares, weights and gaps of any size or sign, NaN and
/// infinities, depths up to `usize::MAX`, consolidation ages, gaps and sizes of any size —
/// give an answer or `HarnessError::Config`, never a panic or another error.
#[test]
#[allow(clippy::cast_possible_truncation)]
fn any_options_answer_or_get_config_errors() {
    use cairn_harness::{ContextOptions, RecallWeights};
    use proptest::prelude::*;
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let mem = rt.block_on(async {
        let mem = harness(&dir.path().join("o.db"), None).await;
        mem.add_many(old_turns("t", 30)).await.unwrap();
        mem
    });
    // Mostly ordinary values (so that the paths behind the checks run), often extreme ones.
    let number = prop_oneof![
        30 => 0.0..1.0f64,
        2 => -2.0..2.0f64,
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => Just(1e300),
        1 => any::<f64>(),
    ];
    let weights = (
        number.clone(),
        number.clone(),
        number.clone(),
        number.clone(),
        prop_oneof![
            30 => 0..100_000i64,
            1 => Just(i64::MAX),
            1 => Just(i64::MIN),
            1 => Just(10_000_000_000_000_000i64),
            1 => any::<i64>(),
        ],
    );
    let depth = prop_oneof![30 => 0..5_000usize, 1 => Just(usize::MAX), 1 => any::<usize>()];
    let secs = prop_oneof![30 => 0..10_000_000u64, 1 => Just(u64::MAX), 1 => any::<u64>()];
    let size = prop_oneof![30 => 2..50usize, 1 => Just(usize::MAX), 1 => any::<usize>()];
    let answered = AtomicUsize::new(0);
    let config = proptest::test_runner::Config {
        cases: cases(),
        ..Default::default()
    };
    // Seeded: the count of valid option sets below is the same every run.
    let rng = proptest::test_runner::TestRng::deterministic_rng(config.rng_algorithm);
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(config, rng);
    runner
        .run(
            &(
                (number.clone(), number, depth, weights),
                (
                    secs.clone(),
                    secs.clone(),
                    secs,
                    size.clone(),
                    size.clone(),
                    size,
                ),
            ),
            |(
                (recent, summary, depth, (vector, neighbor, speaker, time, gap)),
                (older, max_age, session, chunk, fanout, page),
            )| {
                let options = ContextOptions {
                    recent_share: recent,
                    summary_share: summary,
                    recall_depth: depth,
                    weights: RecallWeights {
                        vector: vector as f32,
                        neighbor: neighbor as f32,
                        speaker: speaker as f32,
                        time: time as f32,
                        stretch_gap_secs: gap,
                        ..RecallWeights::default()
                    },
                    // Both recall paths: the bounded one on any thread, or never.
                    bounded_above: if depth % 2 == 0 { 0 } else { usize::MAX },
                    knowledge: depth % 3 == 0,
                    related_share: summary,
                    half_life_secs: (depth % 4 == 0).then_some(3_600.0),
                };
                rt.block_on(async {
                    match mem
                        .assemble_context_with("t", "topic 3", 500, options)
                        .await
                    {
                        Ok(_) => {
                            answered.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(HarnessError::Config(_)) => {}
                        Err(e) => prop_assert!(false, "{options:?}: {e:?}"),
                    }
                    let policy = ConsolidationPolicy::older_than(Duration::from_secs(older))
                        .max_age(Duration::from_secs(max_age))
                        .session_gap(Duration::from_secs(session))
                        .chunk_size(chunk)
                        .fanout(fanout)
                        .page_size(page)
                        .thread(thread("t"));
                    match mem.consolidate(policy).await {
                        Ok(_) | Err(HarnessError::Config(_)) => {}
                        Err(e) => prop_assert!(false, "consolidate: {e:?}"),
                    }
                    Ok(())
                })
            },
        )
        .unwrap();
    println!(
        "{} of {} option sets answered",
        answered.load(Ordering::SeqCst),
        cases()
    );
    assert!(
        answered.load(Ordering::SeqCst) > 0,
        "valid options were drawn"
    );
    rt.block_on(check_integrity(&mem));
}

// ---------------------------------------------------------------------------------------
// Isolation

/// Over random multi-thread stores, searches, expansions and context assembly restricted to
/// one thread never return another thread's memories, and a summary cannot cite across
/// threads.
#[test]
fn threads_never_leak_into_each_other() {
    use proptest::prelude::*;
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: cases().min(12),
        ..Default::default()
    });
    let case = AtomicUsize::new(0);
    let words = &WORDS[..6];
    let spec = proptest::collection::vec((0usize..3, 0usize..6, 0usize..6), 10..60);
    runner
        .run(&(spec, 0usize..6), |(spec, q)| {
            let path = dir
                .path()
                .join(format!("i{}.db", case.fetch_add(1, Ordering::SeqCst)));
            rt.block_on(async {
                let mem = harness(&path, None).await;
                let mut by_thread: HashMap<usize, Vec<MemoryId>> = HashMap::new();
                for (i, (t, a, b)) in spec.iter().enumerate() {
                    let id = mem
                        .add(
                            NewMemory::conversational(
                                thread(&format!("t{t}")),
                                Role::User,
                                // Every fifth turn the same words in every thread
                                // (repeats, never another thread's).
                                if i % 5 == 0 {
                                    format!("{} and {}", words[*a], words[*b])
                                } else {
                                    format!("{} and {} number {i}", words[*a], words[*b])
                                },
                            )
                            .at(now() - chrono::Duration::minutes(100 - i as i64)),
                        )
                        .await
                        .unwrap();
                    by_thread.entry(*t).or_default().push(id);
                }
                // A summary per thread over its first turns; a cross-thread one is refused.
                for (t, ids) in &by_thread {
                    let n = ids.len().min(4);
                    mem.add_summary(
                        format!("{} summary", words[*t]),
                        &ids[..n],
                        Some(&format!("t{t}")),
                    )
                    .await
                    .unwrap();
                    if let Some(other) = by_thread.keys().find(|o| *o != t) {
                        let r = mem
                            .add_summary("mixed", &[by_thread[other][0]], Some(&format!("t{t}")))
                            .await;
                        prop_assert!(
                            matches!(
                                r,
                                Err(HarnessError::Store(StoreError::ThreadMismatch { .. }))
                            ),
                            "{r:?}"
                        );
                    }
                }
                for t in by_thread.keys() {
                    let name = format!("t{t}");
                    let mine = |id: &MemoryId| -> bool { by_thread[t].contains(id) };
                    for mode in [SearchMode::Vector, SearchMode::Keyword, SearchMode::Hybrid] {
                        let hits = mem
                            .search(
                                words[q],
                                SearchOptions::all().thread(thread(&name)).mode(mode).k(50),
                            )
                            .await
                            .unwrap();
                        for h in &hits {
                            prop_assert_eq!(
                                h.memory.thread_id.as_ref().map(ThreadId::as_str),
                                Some(name.as_str())
                            );
                        }
                    }
                    let summaries = mem
                        .list(
                            Filter::all()
                                .kinds([MemoryKind::Summary])
                                .thread(thread(&name)),
                            0,
                            100,
                        )
                        .await
                        .unwrap();
                    for s in summaries {
                        for leaf in mem.expand_to_leaves(s.id).await.unwrap() {
                            prop_assert!(mine(&leaf.id));
                        }
                    }
                    // Both recall paths (the bounded one is the default on long threads
                    // only): every item, and every turn a recalled line names as a repeat.
                    for bounded_above in [0, usize::MAX] {
                        let options = cairn_harness::ContextOptions {
                            bounded_above,
                            ..cairn_harness::ContextOptions::default()
                        };
                        let ctx = mem
                            .assemble_context_with(&name, words[q], 400, options)
                            .await
                            .unwrap();
                        let named = ctx.items.iter().flat_map(|i| {
                            std::iter::once(i.id).chain(i.repeats.iter().map(|r| r.id))
                        });
                        for id in named {
                            let m = mem.get(id).await.unwrap();
                            prop_assert_eq!(
                                m.thread_id.as_ref().map(ThreadId::as_str),
                                Some(name.as_str())
                            );
                        }
                    }
                }
                Ok(())
            })
        })
        .unwrap();
}

// ---------------------------------------------------------------------------------------
// SQL and secrets

/// SQL text is only ever assembled from fixed fragments: every `format!` whose template
/// reads like SQL may interpolate only the crate's own fixed pieces (the column list and
/// the filter's `AND ... = ?` conditions, whose values are bound as parameters).
#[test]
fn sql_is_built_with_parameters_only() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // `marks` is `?, ?, …` (placeholders only), `extra`, `TIMELINE_COLS` and `ATTR_COLS` literal column
    // lists, `order` one of two literal ORDER BY lists, `schema` the PostgreSQL store's
    // schema name (checked to be `[a-z_][a-z0-9_]*` before any connection).
    let allowed = [
        "cond",
        "cols",
        "COLS",
        "TIMELINE_COLS",
        "ATTR_COLS",
        "where_order",
        "marks",
        "extra",
        "order",
        "schema",
    ];
    let sql_words = [
        "SELECT ", "INSERT ", "UPDATE ", "DELETE ", "WHERE ", "PRAGMA ", "CREATE ",
    ];
    let mut checked = 0;
    // Each crate's `src` and its subfolders one level down (`store/`).
    let mut dirs = Vec::new();
    for krate in std::fs::read_dir(&root).unwrap() {
        let src = krate.unwrap().path().join("src");
        if let Ok(entries) = std::fs::read_dir(&src) {
            dirs.extend(entries.map(|e| e.unwrap().path()).filter(|p| p.is_dir()));
            dirs.push(src);
        }
    }
    for src in dirs {
        let Ok(files) = std::fs::read_dir(&src) else {
            continue;
        };
        for f in files {
            let f = f.unwrap().path();
            if f.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            let mut rest = text.as_str();
            while let Some(at) = rest.find("format!(") {
                let after = &rest[at + 8..];
                let lit_start = after.find('"').unwrap_or(0);
                let lit = &after[lit_start + 1..];
                let mut lit_end = lit.len();
                let mut escaped = false;
                for (i, c) in lit.char_indices() {
                    match c {
                        '\\' if !escaped => escaped = true,
                        '"' if !escaped => {
                            lit_end = i;
                            break;
                        }
                        _ => escaped = false,
                    }
                }
                let template = &lit[..lit_end];
                if sql_words.iter().any(|w| template.contains(w)) {
                    checked += 1;
                    let mut t = template;
                    while let Some(open) = t.find('{') {
                        let close = t[open..].find('}').unwrap() + open;
                        let name = &t[open + 1..close];
                        assert!(
                            allowed.contains(&name),
                            "{}: SQL formatted with {{{name}}}: {template}",
                            f.display()
                        );
                        t = &t[close + 1..];
                    }
                }
                rest = after;
            }
        }
    }
    assert!(checked >= 3, "the scan found the store's SQL ({checked})");
    // The filter's fragments carry placeholders, never values.
    let rows = std::fs::read_to_string(root.join("cairn-store/src/rows.rs")).unwrap();
    for line in rows.lines().filter(|l| l.contains("push_str(")) {
        assert!(
            !line.contains("format!"),
            "a formatted SQL fragment: {line}"
        );
    }
}

/// A rejected API key that the server echoes back appears neither in the error nor in any
/// log line.
#[test]
fn api_keys_stay_out_of_errors_and_logs() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        // Two connections: one 500 (retried, logged) and one 401 echoing the key.
        for status in ["500 Internal Server Error", "401 Unauthorized"] {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = vec![0u8; 65536];
            let mut got = Vec::new();
            loop {
                let n = s.read(&mut buf).unwrap();
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got);
                if let Some(h) = text.find("\r\n\r\n") {
                    let len = text
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if got.len() >= h + 4 + len {
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            let text = String::from_utf8_lossy(&got).to_string();
            let auth = text
                .lines()
                .find(|l| l.to_ascii_lowercase().starts_with("authorization:"))
                .unwrap_or("")
                .to_owned();
            let body = format!("{{\"error\": \"Incorrect API key provided: {auth}\"}}");
            write!(
                s,
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
        }
    });
    let key = "sk-test-4f9a1c2b7e";
    let var = "CAIRN_RELIABILITY_TEST_KEY";
    std::env::set_var(var, key);
    let logs: Arc<Mutex<Vec<u8>>> = Arc::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || LogSink(sink.clone()))
        .finish();
    let err = tracing::subscriber::with_default(subscriber, || {
        let s = OpenAiSummarizer::builder(format!("http://127.0.0.1:{port}/v1"), "m")
            .api_key_env(var)
            .retries(1)
            .backoff(Duration::from_millis(1))
            .build()
            .unwrap();
        tracing::info!(summarizer = ?s, "built");
        let r = s.summarize_blocking(&SummaryRequest {
            previous: None,
            items: vec![cairn_core::SummaryItem {
                kind: MemoryKind::Conversational,
                role: Some(Role::User),
                speaker: None,
                time_start: None,
                content: "hello".into(),
                created_at: now(),
            }],
            max_tokens: 50,
            ..Default::default()
        });
        let e = r.unwrap_err();
        tracing::warn!(error = %e, debug = ?e, "summarizer failed");
        e
    });
    server.join().unwrap();
    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    let shown = format!("{err} {err:?}");
    assert!(
        matches!(err, SummarizeError::Http { status: 401, .. }),
        "{shown}"
    );
    assert!(shown.contains("[redacted]"), "{shown}");
    assert!(!shown.contains(key), "the key is in the error: {shown}");
    assert!(logs.contains("retrying the summarizer"), "{logs}");
    assert!(!logs.contains(key), "the key is in the logs: {logs}");
}

struct LogSink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Numbers in metadata come back bit for bit (found by the `metadata` fuzz target: without
/// serde_json's `float_roundtrip`, 1.1111111111444443e25 came back as ...445e25).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_numbers_round_trip_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let mem = harness(&dir.path().join("f.db"), None).await;
    let raw = r#"{"a": 11111111111444444420412402, "b": 0.1, "c": -2.2250738585072014e-308, "d": 1.7976931348623157e308}"#;
    let meta: cairn_core::Metadata = serde_json::from_str(raw).unwrap();
    let id = mem
        .add(NewMemory::new(MemoryKind::Knowledge, "numbers").with_metadata(meta.clone()))
        .await
        .unwrap();
    assert_eq!(mem.get(id).await.unwrap().metadata, meta);
}
