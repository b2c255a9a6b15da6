//! `cairn eval locomo --haystack N[,N...]`: evidence recall of `assemble_context` when each
//! LoCoMo conversation (the needle) is buried in a thread of about N turns.
//!
//! The thread holds the needle's turns exactly as [`parse_locomo`] gives them, plus sessions
//! taken from the other conversations of the directory (then from the needle's own sessions,
//! then again from all of them, each round shuffled, until the thread has N turns). A
//! haystack session gets the needle's two speakers (in each turn's prefix, its
//! `metadata.speaker` and whole-word mentions in the text), a `dia_id` that names no needle
//! turn (`hay:<round>:<conversation>:<dia>`), a `session` label of its own, and a start time
//! of its own among and around the needle's sessions, never overlapping another session.
//! The needle's questions (categories 1-4) are asked of that thread, and of the needle alone
//! in a store of its own.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cairn_core::{MemoryKind, Metadata, NewMemory, ThreadId, SPEAKER_KEY};
use cairn_harness::import::{import_id, parse_locomo, LocomoQuestion};
use cairn_harness::{ConsolidationPolicy, ContextItem, ContextOptions, Filter, MemoryHarness};
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::eval::Acc;

/// The seed of every haystack (the same threads on every run).
pub const SEED: u64 = 0x00C0_FFEE_CA1B;

/// The least time between the end of one session and the start of the next.
const SESSION_GAP_S: i64 = 60;

/// What a haystack session is called: the haystack gives every session the
/// needle's two speakers; keeping the other conversations' own names is a diagnostic that
/// measures what the renaming costs (their turns then say whose they are).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Speakers {
    /// The needle's two speakers, in the prefix, `metadata.speaker` and the text.
    #[default]
    Renamed,
    /// Each conversation's own speakers (the needle's own sessions are the needle's).
    Kept,
}

/// One LoCoMo conversation, parsed.
#[derive(Debug, Clone)]
pub struct Conversation {
    /// The file's stem; also the thread's id.
    pub stem: String,
    /// The thread the turns belong to.
    pub thread: ThreadId,
    /// `speaker_a` and `speaker_b`.
    pub speakers: [String; 2],
    /// The turns, as [`parse_locomo`] gives them.
    pub turns: Vec<NewMemory>,
    /// The questions of categories 1-4.
    pub questions: Vec<LocomoQuestion>,
}

impl Conversation {
    /// Parses one LoCoMo file's text; `stem` names the thread.
    pub fn parse(stem: &str, json: &str) -> Result<Self> {
        let thread = ThreadId::new(stem)?;
        let conv = parse_locomo(json, &thread)?;
        let v: serde_json::Value = serde_json::from_str(json)?;
        let c = v.get("conversation").unwrap_or(&v);
        let name = |k: &str| c[k].as_str().unwrap_or("").trim().to_owned();
        Ok(Self {
            stem: stem.to_owned(),
            thread,
            speakers: [name("speaker_a"), name("speaker_b")],
            turns: conv.turns,
            questions: conv
                .questions
                .into_iter()
                .filter(|q| (1..=4).contains(&q.category))
                .collect(),
        })
    }
}

/// Reads every conversation of `dir` (its `.json` files, by name).
pub fn load(dir: &Path) -> Result<Vec<Conversation>> {
    crate::eval_summaries::locomo_files(dir)?
        .iter()
        .map(|f| {
            let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or("conv");
            let text =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            Conversation::parse(stem, &text).with_context(|| f.display().to_string())
        })
        .collect()
}

/// SplitMix64: a small seeded generator (the same sequence for a seed everywhere).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = usize::try_from(self.below(i as u64 + 1)).unwrap_or(0);
            v.swap(i, j);
        }
    }
}

/// A session of one conversation: its turns, in order.
#[derive(Clone, Copy)]
struct Session<'a> {
    conv: &'a Conversation,
    turns: &'a [NewMemory],
}

impl Session<'_> {
    fn start(&self) -> i64 {
        self.turns
            .first()
            .and_then(|t| t.created_at)
            .map_or(0, |t| t.timestamp())
    }

    /// Seconds from the first turn to the last.
    fn length_s(&self) -> i64 {
        self.turns
            .last()
            .and_then(|t| t.created_at)
            .map_or(0, |t| t.timestamp())
            - self.start()
    }
}

/// The sessions of `conv` (runs of turns with the same `metadata.session`).
fn sessions(conv: &Conversation) -> Vec<Session<'_>> {
    conv.turns
        .chunk_by(|a, b| a.metadata.get("session") == b.metadata.get("session"))
        .map(|turns| Session { conv, turns })
        .collect()
}

/// `text` with every whole-word occurrence of a `from` name replaced by its `to`, in one pass
/// (so names that swap places do not collide).
fn rename(text: &str, names: &[(&str, &str)]) -> String {
    let word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while let Some(c) = text[i..].chars().next() {
        if !word(text[..i].chars().next_back()) {
            let hit = names.iter().find(|(from, _)| {
                !from.is_empty()
                    && text[i..].starts_with(from)
                    && !word(text[i + from.len()..].chars().next())
            });
            if let Some((from, to)) = hit {
                out.push_str(to);
                i += from.len();
                continue;
            }
        }
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// Occupied time, as disjoint `[start, end]` intervals in seconds keyed by start.
struct Timeline(BTreeMap<i64, i64>);

impl Timeline {
    /// Whether `[start, end]` keeps [`SESSION_GAP_S`] from every occupied interval.
    fn free(&self, start: i64, end: i64) -> bool {
        // Intervals are disjoint, so the last one starting before `end + gap` is the only one
        // that can reach back past `start - gap`.
        self.0
            .range(..=end + SESSION_GAP_S)
            .next_back()
            .is_none_or(|(_, &e)| e + SESSION_GAP_S <= start)
    }

    fn take(&mut self, start: i64, end: i64) {
        self.0.insert(start, end);
    }

    fn last_end(&self) -> i64 {
        self.0.values().copied().max().unwrap_or(0)
    }
}

/// The thread of about `target` turns for `convs[needle]`: its turns unchanged, plus
/// haystack sessions (see the module's documentation), sorted by time. Deterministic for a
/// `seed`. The thread has at least `target` turns, and fewer than `target` plus one session,
/// unless the needle alone has more.
pub fn build_thread(
    convs: &[Conversation],
    needle: usize,
    target: usize,
    seed: u64,
    speakers: Speakers,
) -> Result<Vec<NewMemory>> {
    let Some(n) = convs.get(needle) else {
        bail!("no conversation {needle} (there are {})", convs.len());
    };
    let own = sessions(n);
    let donors: Vec<Session<'_>> = convs
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != needle)
        .flat_map(|(_, c)| sessions(c))
        .collect();
    let mut rng = Rng(seed);
    let mut thread: Vec<NewMemory> = n.turns.clone();

    // The haystack's sessions: the other conversations', then the needle's own, each shuffled,
    // round after round, until the thread is long enough.
    let mut picked: Vec<(usize, Session<'_>)> = Vec::new();
    let mut total = thread.len();
    let mut round = 0;
    'rounds: while total < target {
        let (mut d, mut o) = (donors.clone(), own.clone());
        rng.shuffle(&mut d);
        rng.shuffle(&mut o);
        for s in d.into_iter().chain(o) {
            if total >= target {
                break 'rounds;
            }
            total += s.turns.len();
            picked.push((round, s));
        }
        round += 1;
    }

    // Where they go: a random start within the needle's span widened by one mean gap
    // between its sessions on each side, clear of every session already placed.
    let mut timeline = Timeline(BTreeMap::new());
    for s in &own {
        timeline.take(s.start(), s.start() + s.length_s());
    }
    let first = own.iter().map(Session::start).min().unwrap_or(0);
    let last = own
        .iter()
        .map(|s| s.start() + s.length_s())
        .max()
        .unwrap_or(0);
    let gaps = i64::try_from(own.len().saturating_sub(1).max(1)).unwrap_or(1);
    let margin = ((last - first) / gaps).max(86_400);
    let (lo, hi) = (first - margin, last + margin);
    for (k, (round, s)) in picked.iter().enumerate() {
        let len = s.length_s();
        let span = u64::try_from(hi - lo - len).unwrap_or(0).max(1);
        let mut start = None;
        for _ in 0..200 {
            // Whole minutes, like LoCoMo's session times.
            let at = (lo + i64::try_from(rng.below(span)).unwrap_or(0)).div_euclid(60) * 60;
            if timeline.free(at, at + len) {
                start = Some(at);
                break;
            }
        }
        let start = start.unwrap_or_else(|| timeline.last_end() + SESSION_GAP_S + 3_600);
        timeline.take(start, start + len);
        thread.extend(haystack_session(n, s, *round, k, start, speakers)?);
    }
    thread.sort_by_key(|m| m.created_at);
    Ok(thread)
}

/// Session `s` as haystack session `k` of `needle`'s thread, starting at `start` (seconds).
fn haystack_session(
    needle: &Conversation,
    s: &Session<'_>,
    round: usize,
    k: usize,
    start: i64,
    speakers: Speakers,
) -> Result<Vec<NewMemory>> {
    let [from_a, from_b] = &s.conv.speakers;
    let [to_a, to_b] = match speakers {
        Speakers::Renamed => &needle.speakers,
        Speakers::Kept => &s.conv.speakers,
    };
    let names = [
        (from_a.as_str(), to_a.as_str()),
        (from_b.as_str(), to_b.as_str()),
    ];
    let label = format!("hay:{k}");
    let mut out = Vec::with_capacity(s.turns.len());
    for t in s.turns {
        let dia = t
            .metadata
            .get("dia_id")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        let dia = format!("hay:{round}:{}:{dia}", s.conv.stem);
        let offset = t.created_at.map_or(0, |c| c.timestamp()) - s.start();
        let Some(at) = DateTime::<Utc>::from_timestamp(start + offset, 0) else {
            bail!("haystack time {} is out of range", start + offset);
        };
        let mut metadata: Metadata = t.metadata.clone();
        metadata.insert("dia_id".into(), dia.clone().into());
        metadata.insert("session".into(), label.clone().into());
        let content = match t.speaker() {
            Some(who) => {
                // Parsed turns are `speaker_a`'s or else `speaker_b`'s (as their roles say).
                let to = if who == from_a.as_str() { to_a } else { to_b };
                metadata.insert(SPEAKER_KEY.into(), to.clone().into());
                let text = t
                    .content
                    .strip_prefix(who)
                    .and_then(|r| r.strip_prefix(": "))
                    .unwrap_or(&t.content);
                format!("{to}: {}", rename(text, &names))
            }
            None => rename(&t.content, &names),
        };
        out.push(NewMemory {
            id: Some(import_id(needle.thread.as_str(), &dia)),
            kind: MemoryKind::Conversational,
            thread_id: Some(needle.thread.clone()),
            role: t.role,
            content,
            created_at: Some(at),
            metadata,
            lifetime: cairn_core::Lifetime::default(),
        });
    }
    Ok(out)
}

/// One figure set: a needle's, or all needles' pooled (question-weighted).
#[derive(Debug, Clone, Default, Serialize)]
pub struct HaystackFigures {
    /// Turns in the thread (pooled: the mean over the needles).
    pub haystack_turns: usize,
    /// Questions asked (categories 1-4).
    pub questions: usize,
    /// Mean share of evidence turns in the context, in the haystack thread.
    pub recall: f64,
    /// Share of questions with all their evidence in the context, in the haystack thread.
    pub full_hit: f64,
    /// [`Self::recall`] with the needle alone in its store.
    pub recall_alone: f64,
    /// [`Self::full_hit`] with the needle alone in its store.
    pub full_hit_alone: f64,
    /// [`Self::recall`] counting a haystack copy of an evidence turn as found: once the other
    /// conversations are used up, the needle's own sessions come back as haystack (new
    /// dates, `hay:` ids), and a copy can take the place of the original in the context.
    pub recall_with_copies: f64,
    /// [`Self::full_hit`] counting copies the same way.
    pub full_hit_with_copies: f64,
    /// Median `assemble_context` latency in the haystack thread (ms), the question's
    /// embedding included.
    pub latency_p50_ms: f64,
    /// 99th-percentile `assemble_context` latency in the haystack thread (ms).
    pub latency_p99_ms: f64,
    /// Median latency with the needle alone (ms).
    pub latency_p50_ms_alone: f64,
    /// 99th-percentile latency with the needle alone (ms).
    pub latency_p99_ms_alone: f64,
    /// Mean tokens of the contexts in the haystack thread.
    pub mean_tokens: f64,
    /// Wall time of consolidating the haystack thread(s), in seconds (near 0 for a reused
    /// store).
    pub consolidation_s: f64,
}

/// One haystack size.
#[derive(Debug, Clone, Serialize)]
pub struct HaystackRow {
    /// The size asked for (`--haystack`), in turns.
    pub target: usize,
    /// All needles pooled.
    #[serde(flatten)]
    pub overall: HaystackFigures,
    /// Per needle (the file's stem).
    pub per_needle: BTreeMap<String, HaystackFigures>,
}

/// The whole haystack report.
#[derive(Debug, Clone, Serialize)]
pub struct HaystackReport {
    /// The token budget.
    pub budget: usize,
    /// The seed of the threads.
    pub seed: u64,
    /// What the haystack's sessions call their speakers.
    pub speakers: Speakers,
    /// `assemble_context`'s options.
    pub options: ContextOptions,
    /// The needles (file stems).
    pub needles: Vec<String>,
    /// One row per size, in the order asked.
    pub rows: Vec<HaystackRow>,
}

/// One store's run: the questions' tallies and the consolidation's wall time.
struct Run {
    acc: Acc,
    /// The same questions, a copy of an evidence turn counted as the turn.
    copies: Acc,
    turns: usize,
    consolidation: Duration,
}

/// Runs `eval locomo --haystack`: every size of `sizes` for every needle (all conversations
/// of `dir`, or those `needles` names).
///
/// With `store_dir`, the stores are kept there (`alone-<stem>.db`, `hay<N>-<stem>.db`) and
/// reused by later runs once checked to hold the same thread.
pub async fn haystack(
    dir: &Path,
    sizes: &[usize],
    budget: usize,
    options: ContextOptions,
    needles: &[String],
    store_dir: Option<&Path>,
    speakers: Speakers,
) -> Result<HaystackReport> {
    if let Some(0) = sizes.iter().min() {
        bail!("--haystack sizes must be positive");
    }
    options.validate()?;
    let convs = load(dir)?;
    if let Some(bad) = needles
        .iter()
        .find(|n| !convs.iter().any(|c| &c.stem == *n))
    {
        bail!(
            "--needle {bad:?}: no such conversation in {} (there are {})",
            dir.display(),
            convs
                .iter()
                .map(|c| c.stem.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let chosen: Vec<usize> = (0..convs.len())
        .filter(|&i| needles.is_empty() || needles.contains(&convs[i].stem))
        .collect();
    if let Some(d) = store_dir {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let tmp = tempfile::tempdir()?;
    let place = |name: String| store_dir.unwrap_or(tmp.path()).join(name);

    // The needles alone, once for every size.
    let mut alone: BTreeMap<&str, Acc> = BTreeMap::new();
    for &i in &chosen {
        let c = &convs[i];
        let path = place(format!("alone-{}.db", c.stem));
        let run = run_store(&path, c, c.turns.clone(), budget, options).await?;
        eprintln!(
            "needle {} alone: {} turns, consolidated in {:.1} s",
            c.stem,
            run.turns,
            run.consolidation.as_secs_f64()
        );
        alone.insert(&c.stem, run.acc);
    }
    let mut alone_all = Acc::default();
    alone.values().for_each(|a| alone_all.merge(a));

    let mut rows = Vec::new();
    for &n in sizes {
        let mut pooled = Run {
            acc: Acc::default(),
            copies: Acc::default(),
            turns: 0,
            consolidation: Duration::ZERO,
        };
        let mut per_needle = BTreeMap::new();
        for &i in &chosen {
            let c = &convs[i];
            let thread = build_thread(&convs, i, n, SEED, speakers)?;
            let path = match speakers {
                Speakers::Renamed => place(format!("hay{n}-{}.db", c.stem)),
                Speakers::Kept => place(format!("hay{n}-kept-{}.db", c.stem)),
            };
            let run = run_store(&path, c, thread, budget, options).await?;
            eprintln!(
                "haystack {n}, needle {}: {} turns, consolidated in {:.1} s",
                c.stem,
                run.turns,
                run.consolidation.as_secs_f64()
            );
            pooled.acc.merge(&run.acc);
            pooled.copies.merge(&run.copies);
            pooled.consolidation += run.consolidation;
            pooled.turns += run.turns;
            let a = alone.get(c.stem.as_str()).cloned().unwrap_or_default();
            per_needle.insert(c.stem.clone(), figures(&run, &a));
        }
        eprintln!(
            "haystack {n}: consolidation {:.1} s over {} needles",
            pooled.consolidation.as_secs_f64(),
            chosen.len()
        );
        pooled.turns /= chosen.len().max(1);
        rows.push(HaystackRow {
            target: n,
            overall: figures(&pooled, &alone_all),
            per_needle,
        });
    }
    Ok(HaystackReport {
        budget,
        seed: SEED,
        speakers,
        options,
        needles: chosen.iter().map(|&i| convs[i].stem.clone()).collect(),
        rows,
    })
}

fn figures(run: &Run, alone: &Acc) -> HaystackFigures {
    let (h, a, c) = (run.acc.figures(), alone.figures(), run.copies.figures());
    HaystackFigures {
        haystack_turns: run.turns,
        questions: h.questions,
        recall: h.evidence_recall,
        full_hit: h.full_hit,
        recall_alone: a.evidence_recall,
        full_hit_alone: a.full_hit,
        recall_with_copies: c.evidence_recall,
        full_hit_with_copies: c.full_hit,
        latency_p50_ms: h.p50_latency_ms,
        latency_p99_ms: h.p99_latency_ms,
        latency_p50_ms_alone: a.p50_latency_ms,
        latency_p99_ms_alone: a.p99_latency_ms,
        mean_tokens: h.mean_tokens,
        consolidation_s: run.consolidation.as_secs_f64(),
    }
}

/// Fills the store at `path` with `turns` (all of `conv`'s thread) unless it already holds
/// them, consolidates it, and asks `conv`'s questions of it.
async fn run_store(
    path: &Path,
    conv: &Conversation,
    turns: Vec<NewMemory>,
    budget: usize,
    options: ContextOptions,
) -> Result<Run> {
    let n = turns.len();
    let consolidation = {
        let mem = crate::open(path).await?;
        check_reuse(&mem, path, conv, &turns).await?;
        crate::import_memories(&mem, turns).await?;
        let held = stored_turns(&mem, &conv.thread).await?.len();
        if held != n {
            bail!(
                "{} holds {held} turns of thread {} after the import, not {n}",
                path.display(),
                conv.stem
            );
        }
        let t = Instant::now();
        let pb = crate::progress(0, "consolidating");
        pb.enable_steady_tick(Duration::from_millis(200));
        let report = mem
            .consolidate(ConsolidationPolicy::older_than(Duration::ZERO).max_age(Duration::ZERO))
            .await?;
        pb.finish_and_clear();
        let took = t.elapsed();
        if !report.failures.is_empty() {
            bail!(
                "{}: consolidation left {} chunks unsummarized",
                path.display(),
                report.failures.len()
            );
        }
        took
        // The store closes here (its writes flushed) before it is opened for the questions.
    };
    // The questions go to a handle without the embedding cache, so every call embeds its
    // question with the model (on a fresh store each question is asked once anyway, but a
    // reused store's cache would already hold them).
    let mem = MemoryHarness::builder(path)
        .embedding_cache(false)
        .build()
        .await
        .with_context(|| format!("opening the store {}", path.display()))?;
    let pb = crate::progress(conv.questions.len() as u64, "asking");
    let mut acc = Acc::default();
    let mut copies = Acc::default();
    for q in &conv.questions {
        let t = Instant::now();
        let ctx = mem
            .assemble_context_with(conv.thread.as_str(), &q.question, budget, options)
            .await?;
        let took = t.elapsed();
        let dias: Vec<&str> = ctx
            .items
            .iter()
            .flat_map(ContextItem::named_metadata)
            .filter_map(|m| m.get("dia_id").and_then(|v| v.as_str()))
            .collect();
        let found = q
            .evidence
            .iter()
            .filter(|e| dias.contains(&e.as_str()))
            .count();
        let with_copies = q
            .evidence
            .iter()
            .filter(|e| {
                dias.iter()
                    .any(|d| *d == e.as_str() || copy_of(&conv.stem, d, e))
            })
            .count();
        acc.add(found, q.evidence.len(), ctx.tokens, took);
        copies.add(with_copies, q.evidence.len(), ctx.tokens, took);
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok(Run {
        acc,
        copies,
        turns: n,
        consolidation,
    })
}

/// Whether `dia` is a haystack copy of the needle's turn `evidence`
/// (`hay:<round>:<needle>:<evidence>`).
fn copy_of(needle: &str, dia: &str, evidence: &str) -> bool {
    dia.strip_prefix("hay:")
        .and_then(|r| r.split_once(':'))
        .and_then(|(_, r)| r.strip_prefix(needle))
        .and_then(|r| r.strip_prefix(':'))
        == Some(evidence)
}

/// The raw turns of `thread` in the store.
async fn stored_turns(
    mem: &MemoryHarness,
    thread: &ThreadId,
) -> Result<Vec<cairn_core::MemoryUnit>> {
    Ok(mem
        .list(
            Filter::all()
                .thread(thread.clone())
                .kinds([MemoryKind::Conversational]),
            0,
            usize::MAX,
        )
        .await?)
}

/// Refuses a store that holds anything but this thread: every stored turn must be one of
/// `turns`, with the same text and time, and the store must hold all of them, or else no
/// summary yet (an import that was cut short: it gets the rest).
async fn check_reuse(
    mem: &MemoryHarness,
    path: &Path,
    conv: &Conversation,
    turns: &[NewMemory],
) -> Result<()> {
    let expected: HashMap<_, _> = turns
        .iter()
        .filter_map(|t| t.id.map(|id| (id, (t.content.as_str(), t.created_at))))
        .collect();
    let stored = stored_turns(mem, &conv.thread).await?;
    let stats = mem.stats().await?.store;
    let summaries = stats
        .by_kind
        .get(MemoryKind::Summary.as_str())
        .copied()
        .unwrap_or(0);
    let same = stored
        .iter()
        .all(|m| expected.get(&m.id) == Some(&(m.content.as_str(), Some(m.created_at))));
    let whole = stored.len() == turns.len() && stats.total == turns.len() + summaries;
    if !(same && (whole || stats.total == stored.len() && summaries == 0)) {
        bail!(
            "{} does not hold the thread this run builds for {} ({} memories, {} of them its \
             turns; the thread has {} turns): delete it or pick another --store-dir",
            path.display(),
            conv.stem,
            stats.total,
            stored.len(),
            turns.len()
        );
    }
    Ok(())
}

/// A Markdown table of the report: one row per size, then recall per needle.
pub fn table(r: &HaystackReport) -> String {
    let mut s = format!(
        "LoCoMo haystack: needles {}, budget {} tokens, seed {}, haystack speakers {:?}\n\n| N | turns | questions | evidence recall | full-hit | recall alone | full-hit alone | recall / full-hit, copies counted | latency p50 / p99 (ms) | alone p50 / p99 (ms) | consolidation (s) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        r.needles.join(", "),
        r.budget,
        r.seed,
        r.speakers
    );
    for row in &r.rows {
        let f = &row.overall;
        s.push_str(&format!(
            "| {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} / {:.3} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} |\n",
            row.target,
            f.haystack_turns,
            f.questions,
            f.recall,
            f.full_hit,
            f.recall_alone,
            f.full_hit_alone,
            f.recall_with_copies,
            f.full_hit_with_copies,
            f.latency_p50_ms,
            f.latency_p99_ms,
            f.latency_p50_ms_alone,
            f.latency_p99_ms_alone,
            f.consolidation_s
        ));
    }
    s.push_str("\nEvidence recall / full-hit per needle (alone in brackets):\n\n| N |");
    for n in &r.needles {
        s.push_str(&format!(" {n} |"));
    }
    s.push_str("\n|---:|");
    s.push_str(&"---:|".repeat(r.needles.len()));
    s.push('\n');
    for row in &r.rows {
        s.push_str(&format!("| {} |", row.target));
        for n in &r.needles {
            let cell = row.per_needle.get(n).map_or("-".to_owned(), |f| {
                format!(
                    "{:.3} / {:.3} ({:.3} / {:.3})",
                    f.recall, f.full_hit, f.recall_alone, f.full_hit_alone
                )
            });
            s.push_str(&format!(" {cell} |"));
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::{HashMap, HashSet};

    use super::*;

    /// Turns of one session are this far apart (`parse_locomo`'s spacing).
    const TURN_GAP_S: i64 = 30;

    /// A LoCoMo-shaped conversation: `sessions` of `turns` turns each, a week apart from
    /// `start`; the texts mention both speakers.
    fn conv(stem: &str, a: &str, b: &str, sessions: usize, turns: usize, day: u32) -> Conversation {
        let mut c = serde_json::json!({"speaker_a": a, "speaker_b": b, "qa": []});
        for s in 1..=sessions {
            let date = chrono::NaiveDate::from_ymd_opt(2023, 3, day)
                .unwrap()
                .checked_add_days(chrono::Days::new(7 * (s as u64 - 1)))
                .unwrap();
            c[format!("session_{s}_date_time")] =
                format!("2:15 pm on {}", date.format("%-d %B, %Y")).into();
            let list: Vec<_> = (1..=turns)
                .map(|i| {
                    let (who, other) = if i % 2 == 1 { (a, b) } else { (b, a) };
                    serde_json::json!({
                        "speaker": who,
                        "dia_id": format!("D{s}:{i}"),
                        "text": format!("{other}, it's {who} from {stem} session {s}; {other}'s plan, {a}{b}x."),
                    })
                })
                .collect();
            c[format!("session_{s}")] = list.into();
        }
        Conversation::parse(stem, &c.to_string()).unwrap()
    }

    /// The needle (Ann and Bob), a donor whose first speaker is the needle's second, and a
    /// donor with other names.
    fn convs() -> Vec<Conversation> {
        vec![
            conv("needle", "Ann", "Bob", 3, 4, 1),
            conv("swap", "Bob", "Cleo", 5, 5, 3),
            conv("other", "Dan", "Eve", 4, 3, 10),
        ]
    }

    fn dia(m: &NewMemory) -> &str {
        m.metadata["dia_id"].as_str().unwrap()
    }

    #[test]
    fn needle_turns_are_unchanged() {
        let c = convs();
        let thread = build_thread(&c, 0, 60, 7, Speakers::Renamed).unwrap();
        let by_id: HashMap<_, _> = thread.iter().map(|m| (m.id, m)).collect();
        assert_eq!(by_id.len(), thread.len(), "ids are distinct");
        for t in &c[0].turns {
            assert_eq!(by_id.get(&t.id).copied(), Some(t), "{}", dia(t));
        }
        // Byte for byte what `parse_locomo` gives.
        let again = conv("needle", "Ann", "Bob", 3, 4, 1);
        let needle: Vec<_> = thread
            .iter()
            .filter(|m| !dia(m).starts_with("hay:"))
            .cloned()
            .collect();
        assert_eq!(needle, again.turns);
        assert!(thread
            .iter()
            .all(|m| m.thread_id == Some(c[0].thread.clone())));
        assert!(thread
            .windows(2)
            .all(|w| w[0].created_at <= w[1].created_at));
    }

    #[test]
    fn about_n_turns_within_one_session() {
        let c = convs();
        let largest = 5;
        for target in [13, 20, 40, 57, 100, 250] {
            let n = build_thread(&c, 0, target, 1, Speakers::Renamed)
                .unwrap()
                .len();
            assert!(n >= target && n < target + largest, "{target}: {n}");
        }
        // A needle longer than the target is left alone.
        assert_eq!(
            build_thread(&c, 0, 5, 1, Speakers::Renamed).unwrap(),
            c[0].turns
        );
        // Past every donor's turns, the needle's own sessions come in (as haystack), then
        // the donors again.
        let big = build_thread(&c, 0, 100, 1, Speakers::Renamed).unwrap();
        let ids: Vec<&str> = big.iter().map(dia).collect();
        assert!(ids.iter().any(|d| d.starts_with("hay:0:needle:")));
        assert!(ids.iter().any(|d| d.starts_with("hay:1:swap:")));
    }

    #[test]
    fn haystack_dia_ids_never_name_a_needle_turn() {
        let c = convs();
        let thread = build_thread(&c, 0, 100, 3, Speakers::Renamed).unwrap();
        let needle: HashSet<&str> = c[0].turns.iter().map(dia).collect();
        let hay: Vec<&str> = thread
            .iter()
            .map(dia)
            .filter(|d| !needle.contains(d))
            .collect();
        assert_eq!(hay.len(), thread.len() - c[0].turns.len());
        assert!(hay.iter().all(|d| d.starts_with("hay:")));
        assert_eq!(hay.iter().collect::<HashSet<_>>().len(), hay.len());
    }

    #[test]
    fn speakers_are_the_needles_two() {
        let c = convs();
        let thread = build_thread(&c, 0, 100, 5, Speakers::Renamed).unwrap();
        for m in &thread {
            let who = m.speaker().unwrap();
            assert!(who == "Ann" || who == "Bob", "{m:?}");
            assert!(m.content.starts_with(&format!("{who}: ")), "{}", m.content);
            let words: HashSet<&str> = m.content.split(|c: char| !c.is_alphanumeric()).collect();
            for gone in ["Cleo", "Dan", "Eve"] {
                assert!(!words.contains(gone), "{}", m.content);
            }
            // Roles follow the speakers: the first speaker is the user.
            assert_eq!(m.role == Some(cairn_core::Role::User), who == "Ann");
        }
        // The donor whose first speaker was Bob: Bob became Ann and Cleo Bob, in one pass,
        // possessives included; a name inside a word is left alone.
        let swap = thread
            .iter()
            .find(|m| dia(m).ends_with(":swap:D1:1"))
            .unwrap();
        assert_eq!(
            swap.content,
            "Ann: Bob, it's Ann from swap session 1; Bob's plan, BobCleox."
        );
    }

    #[test]
    fn kept_speakers_are_each_conversations_own() {
        let c = convs();
        let renamed = build_thread(&c, 0, 100, 5, Speakers::Renamed).unwrap();
        let kept = build_thread(&c, 0, 100, 5, Speakers::Kept).unwrap();
        // The same sessions on the same days, under other names.
        assert_eq!(kept.len(), renamed.len());
        for (k, r) in kept.iter().zip(&renamed) {
            assert_eq!((k.id, k.created_at), (r.id, r.created_at));
            let stem = dia(k).split(':').nth(2).unwrap_or("needle").to_owned();
            let own = &c.iter().find(|x| x.stem == stem).unwrap().speakers;
            let who = k.speaker().unwrap();
            assert!(own.iter().any(|s| s == who), "{k:?}");
            assert!(k.content.starts_with(&format!("{who}: ")), "{}", k.content);
        }
        let swap = kept
            .iter()
            .find(|m| dia(m).ends_with(":swap:D1:1"))
            .unwrap();
        assert_eq!(
            swap.content,
            "Bob: Cleo, it's Bob from swap session 1; Cleo's plan, BobCleox."
        );
        assert!(kept.iter().any(|m| m.speaker() == Some("Dan")));
    }

    #[test]
    fn sessions_interleave_in_time_without_overlap() {
        let c = convs();
        let thread = build_thread(&c, 0, 250, 11, Speakers::Renamed).unwrap();
        let t = |m: &NewMemory| m.created_at.unwrap();
        let first = c[0].turns.first().map(t).unwrap();
        let last = c[0].turns.last().map(t).unwrap();
        // Haystack sessions: their labels are their own.
        let mut hay: BTreeMap<String, Vec<&NewMemory>> = BTreeMap::new();
        for m in thread.iter().filter(|m| dia(m).starts_with("hay:")) {
            let label = m.metadata["session"].as_str().unwrap().to_owned();
            hay.entry(label).or_default().push(m);
        }
        let starts: Vec<_> = hay.values().map(|s| t(s[0])).collect();
        assert!(starts.iter().any(|&s| s < first), "before");
        assert!(starts.iter().any(|&s| s > first && s < last), "between");
        assert!(starts.iter().any(|&s| s > last), "after");
        // Within a session turns stay 30 s apart; in time order, no two sessions mix.
        for s in hay.values() {
            assert_eq!(t(s[0]).timestamp() % 60, 0, "sessions start on the minute");
            assert!(s
                .windows(2)
                .all(|w| (t(w[1]) - t(w[0])).num_seconds() == TURN_GAP_S));
        }
        let labels: Vec<String> = thread
            .iter()
            .map(|m| m.metadata["session"].to_string())
            .collect();
        let runs: Vec<&String> = labels.chunk_by(|a, b| a == b).map(|r| &r[0]).collect();
        assert_eq!(
            runs.len(),
            runs.iter().collect::<HashSet<_>>().len(),
            "each session is one run in time"
        );
    }

    #[test]
    fn deterministic_for_a_seed() {
        let c = convs();
        assert_eq!(
            build_thread(&c, 0, 100, 9, Speakers::Renamed).unwrap(),
            build_thread(&c, 0, 100, 9, Speakers::Renamed).unwrap()
        );
        assert_ne!(
            build_thread(&c, 0, 100, 9, Speakers::Renamed).unwrap(),
            build_thread(&c, 0, 100, 10, Speakers::Renamed).unwrap()
        );
        assert!(build_thread(&c, 3, 100, 9, Speakers::Renamed).is_err());
    }

    #[test]
    fn copies_of_needle_turns_are_recognised() {
        let c = convs();
        let thread = build_thread(&c, 0, 100, 2, Speakers::Renamed).unwrap();
        let copies: Vec<&str> = thread
            .iter()
            .map(dia)
            .filter(|d| copy_of("needle", d, "D2:3"))
            .collect();
        assert!(!copies.is_empty());
        assert!(copies.iter().all(|d| d.ends_with(":needle:D2:3")));
        assert!(copy_of("30", "hay:2:30:D1:3", "D1:3"));
        for (dia, e) in [
            ("hay:2:130:D1:3", "D1:3"),
            ("hay:2:30:D1:3", "D1:31"),
            ("hay:2:30:D11:3", "D1:3"),
            ("D1:3", "D1:3"),
            ("hay:2:swap:D1:3", "D1:3"),
        ] {
            assert!(!copy_of("30", dia, e), "{dia} {e}");
        }
    }

    #[test]
    fn rename_swaps_whole_words_in_one_pass() {
        let names = [("Tim", "John"), ("John", "Maria")];
        assert_eq!(
            rename("Tim told John: John's cat, Timothy and Tim!", &names),
            "John told Maria: Maria's cat, Timothy and John!"
        );
        assert_eq!(rename("é Tim", &[("Tim", "Zoë"), ("", "x")]), "é Zoë");
    }
}
