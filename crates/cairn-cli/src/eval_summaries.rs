//! `cairn eval summaries`: summary quality on LoCoMo conversations.
//!
//! Three methods are measured in one run, each on its own thread of one store (the importer
//! derives memory ids from the thread and the turn, so the copies never collide):
//! - `cairn` (thread = the file's stem, e.g. `30`): the conversation consolidated with
//!   `ConsolidationPolicy::older_than(0).max_age(0)` (default chunking, the harness's
//!   default summarizer), restricted to that thread. A session's text is its level-1 text
//!   (see [`session_texts`]).
//! - `lead` (thread `30.lead`): each session's turns in order, cut to as many words as
//!   Cairn's level-1 text of that session ([`lead_text`]); one level-1 summary per session
//!   over all its turns.
//! - `reference` (thread `30.reference`): the dataset's `session_N_summary`, one level-1
//!   summary per session over all its turns.
//!
//! Per method, per conversation and overall:
//! - ROUGE of each session's text against `session_N_summary` ([`rouge`]), and the length
//!   ratio (summary words / session words, words = whitespace-separated, of the turns'
//!   stored contents, `"Speaker: text"`), as means over sessions. The `reference` method's
//!   ROUGE is against itself, so 1 by construction: it is reported as the anchor of the
//!   table, not as a result. Only sessions that have turns and a non-empty
//!   `session_N_summary` are scored; a session for which the method has no text scores 0
//!   (and counts in `sessions_without_text`).
//! - The summary route: for each question of categories 1-4, the method's level-1
//!   summaries of the conversation are searched for the question (k = 3, the default
//!   search mode), each hit is expanded to its leaves, and the question's evidence turns are
//!   looked for among the leaves' `dia_id`s: mean share found (`route_recall_at3`), share of
//!   questions with all of it found (`route_full_hit_at3`), and mean distinct leaves
//!   returned (`mean_leaves`), as means over questions.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use cairn_core::{MemoryId, MemoryKind, MemoryUnit, ThreadId};
use cairn_harness::import::{parse_locomo, LocomoConversation, LocomoQuestion};
use cairn_harness::text::{is_stop_word, tokens};
use cairn_harness::{ConsolidationPolicy, DeletePolicy, Filter, MemoryHarness, SearchOptions};
use serde::Serialize;

/// The methods measured, in the report's order.
pub const METHODS: [&str; 3] = ["cairn", "lead", "reference"];

/// Summaries retrieved per question on the summary route.
pub const ROUTE_K: usize = 3;

/// ROUGE scores of a summary against a reference.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Rouge {
    /// Unigram F1.
    pub rouge1_f1: f64,
    /// Unigram recall (share of the reference's unigrams found in the summary).
    pub rouge1_recall: f64,
    /// Bigram F1.
    pub rouge2_f1: f64,
    /// Bigram recall.
    pub rouge2_recall: f64,
    /// Longest-common-subsequence F1.
    #[serde(rename = "rougeL_f1")]
    pub rouge_l_f1: f64,
}

/// The tokens ROUGE compares: lowercase runs of ASCII letters and digits
/// ([`cairn_harness::text::tokens`]), English stop words removed, words of more than three
/// characters Porter-stemmed (rouge-score stems only those).
///
/// The stemmer is the `porter-stemmer` crate (Porter's original algorithm). rouge-score
/// uses NLTK's `PorterStemmer()`, whose default mode adds NLTK's extensions (e.g. it keeps a
/// final `y` after a vowel: "days" → "day", not "dai"); scores differ only where the two
/// group different words together, about 1% of LoCoMo's vocabulary.
pub fn rouge_tokens(text: &str) -> Vec<String> {
    tokens(text)
        .filter(|w| !is_stop_word(w))
        .map(|w| {
            if w.len() > 3 {
                porter_stemmer::stem(&w)
            } else {
                w
            }
        })
        .collect()
}

/// ROUGE-1, ROUGE-2 and ROUGE-L of `summary` against `reference`, on [`rouge_tokens`].
///
/// ROUGE-N counts clipped n-gram matches (precision over the summary's n-grams, recall over
/// the reference's). ROUGE-L is the sentence-level variant over each text taken as ONE
/// sequence (rouge-score's `rougeL`, not the per-sentence union of `rougeLsum`): precision
/// and recall are the longest common subsequence over the summary's and the reference's
/// lengths. F1 is their harmonic mean. An empty side (or one without bigrams) gives 0, never
/// NaN; identical texts give 1.
pub fn rouge(summary: &str, reference: &str) -> Rouge {
    let s = rouge_tokens(summary);
    let r = rouge_tokens(reference);
    let (p1, r1) = ngram_scores(&s, &r, 1);
    let (p2, r2) = ngram_scores(&s, &r, 2);
    let (pl, rl) = if s.is_empty() || r.is_empty() {
        (0.0, 0.0)
    } else {
        let l = ratio(lcs_len(&s, &r), 1);
        (l / ratio(s.len(), 1), l / ratio(r.len(), 1))
    };
    Rouge {
        rouge1_f1: f1(p1, r1),
        rouge1_recall: r1,
        rouge2_f1: f1(p2, r2),
        rouge2_recall: r2,
        rouge_l_f1: f1(pl, rl),
    }
}

/// `a / b` as a float; 0 when `b` is 0.
fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        return 0.0;
    }
    #[allow(clippy::cast_precision_loss)]
    {
        a as f64 / b as f64
    }
}

fn f1(p: f64, r: f64) -> f64 {
    if p + r > 0.0 {
        2.0 * p * r / (p + r)
    } else {
        0.0
    }
}

/// The `n`-grams of `t` with their counts.
fn ngrams(t: &[String], n: usize) -> HashMap<&[String], usize> {
    let mut m: HashMap<&[String], usize> = HashMap::new();
    if n == 0 {
        return m;
    }
    for g in t.windows(n) {
        *m.entry(g).or_default() += 1;
    }
    m
}

/// (precision, recall) of the `n`-grams of `summary` against those of `reference`.
fn ngram_scores(summary: &[String], reference: &[String], n: usize) -> (f64, f64) {
    let (s, r) = (ngrams(summary, n), ngrams(reference, n));
    let overlap: usize = s
        .iter()
        .map(|(g, c)| (*c).min(r.get(g).copied().unwrap_or(0)))
        .sum();
    let total = |t: &[String]| (t.len() + 1).saturating_sub(n);
    (
        ratio(overlap, total(summary).max(1)),
        ratio(overlap, total(reference).max(1)),
    )
}

/// The length of the longest common subsequence of `a` and `b`.
fn lcs_len(a: &[String], b: &[String]) -> usize {
    let mut prev = vec![0usize; b.len() + 1];
    let mut cur = vec![0usize; b.len() + 1];
    for x in a {
        for (j, y) in b.iter().enumerate() {
            cur[j + 1] = if x == y {
                prev[j] + 1
            } else {
                prev[j + 1].max(cur[j])
            };
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// Whitespace-separated words of `text`.
pub fn word_count(text: &str) -> usize {
    text.split_whitespace().count()
}

/// The first `words` whitespace-separated words of `turns`, in order, joined by spaces.
pub fn lead_text<'a>(turns: impl IntoIterator<Item = &'a str>, words: usize) -> String {
    turns
        .into_iter()
        .flat_map(str::split_whitespace)
        .take(words)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A memory's `metadata.session` (set by the LoCoMo importer).
fn session_of(m: &MemoryUnit) -> Option<u32> {
    m.metadata
        .get("session")?
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
}

/// The most frequent of `sessions` (ties go to the earliest session); `None` when empty.
fn majority_session(sessions: impl IntoIterator<Item = u32>) -> Option<u32> {
    let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
    for n in sessions {
        *counts.entry(n).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(n, _)| n)
}

/// The level-1 summaries of `thread`, oldest first.
fn level_one(thread: &ThreadId) -> Filter {
    Filter::all()
        .thread(thread.clone())
        .kinds([MemoryKind::Summary])
        .levels(1, 1)
}

/// Per session number, the level-1 text of `thread`: the contents of the level-1 summaries
/// assigned to that session, joined with newlines in time order.
///
/// A summary is assigned to the session that holds the majority of its leaves (their
/// `metadata.session`, as the LoCoMo importer writes it; ties go to the earliest session).
/// A summary none of whose leaves names a session is left out, and a session that holds the
/// majority of no summary has no entry.
pub async fn session_texts(
    mem: &MemoryHarness,
    thread: &ThreadId,
) -> cairn_harness::Result<BTreeMap<u32, String>> {
    let mut texts: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for s in mem.list(level_one(thread), 0, usize::MAX).await? {
        let leaves = mem.expand_to_leaves(s.id).await?;
        if let Some(n) = majority_session(leaves.iter().filter_map(session_of)) {
            texts.entry(n).or_default().push(s.content);
        }
    }
    Ok(texts.into_iter().map(|(n, t)| (n, t.join("\n"))).collect())
}

/// Makes `thread`'s level-1 summaries exactly `wanted` (text, sources): kept when they
/// already are (a rerun on a kept store), else replaced.
async fn write_summaries(
    mem: &MemoryHarness,
    thread: &ThreadId,
    wanted: &[(String, Vec<MemoryId>)],
) -> Result<()> {
    let existing = mem.list(level_one(thread), 0, usize::MAX).await?;
    let mut have = Vec::with_capacity(existing.len());
    for s in &existing {
        let sources = mem.expand_summary(s.id).await?;
        have.push((s.content.clone(), sources.iter().map(|m| m.id).collect()));
    }
    let mut want = wanted.to_vec();
    have.sort();
    want.sort();
    if have == want {
        return Ok(());
    }
    for s in existing {
        mem.delete_with(s.id, DeletePolicy::Cascade).await?;
    }
    for (text, sources) in wanted {
        mem.add_summary(text.as_str(), sources, Some(thread.as_str()))
            .await?;
    }
    Ok(())
}

/// One session's figures for one method.
#[derive(Debug, Clone, Serialize)]
pub struct SessionFigures {
    /// The session number (N of `session_N`).
    pub session: u32,
    /// Words of the session's turns.
    pub session_words: usize,
    /// Words of the method's text for the session (0: none).
    pub summary_words: usize,
    /// ROUGE against `session_N_summary`.
    #[serde(flatten)]
    pub rouge: Rouge,
    /// `summary_words / session_words`.
    pub length_ratio: f64,
}

/// Figures of one method over a set of sessions and questions.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    /// Sessions scored (with turns and a reference summary).
    pub sessions: usize,
    /// Of those, sessions for which the method had no text (scored 0).
    pub sessions_without_text: usize,
    /// Questions (categories 1-4) on the summary route.
    pub questions: usize,
    /// Mean ROUGE-1 F1 over sessions.
    pub rouge1_f1: f64,
    /// Mean ROUGE-1 recall over sessions.
    pub rouge1_recall: f64,
    /// Mean ROUGE-2 F1 over sessions.
    pub rouge2_f1: f64,
    /// Mean ROUGE-2 recall over sessions.
    pub rouge2_recall: f64,
    /// Mean ROUGE-L F1 over sessions.
    #[serde(rename = "rougeL_f1")]
    pub rouge_l_f1: f64,
    /// Mean summary words / session words over sessions.
    pub length_ratio: f64,
    /// Mean share of a question's evidence turns among the leaves of its top 3 summaries.
    pub route_recall_at3: f64,
    /// Share of questions with all evidence among those leaves.
    pub route_full_hit_at3: f64,
    /// Mean distinct leaves under a question's top 3 summaries.
    pub mean_leaves: f64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Conversations imported.
    pub conversations: usize,
    /// Method → overall figures (means over all sessions and all questions).
    pub overall: BTreeMap<String, Figures>,
    /// Method → conversation (the file's stem) → figures.
    pub per_conversation: BTreeMap<String, BTreeMap<String, Figures>>,
    /// Method → conversation → figures of each scored session, in order.
    pub per_session: BTreeMap<String, BTreeMap<String, Vec<SessionFigures>>>,
}

/// Sums behind [`Figures`].
#[derive(Default)]
struct Acc {
    sessions: usize,
    without_text: usize,
    rouge: [f64; 5],
    length_ratio: f64,
    questions: usize,
    recall: f64,
    full: f64,
    leaves: usize,
}

impl Acc {
    fn session(&mut self, s: &SessionFigures) {
        self.sessions += 1;
        self.without_text += usize::from(s.summary_words == 0);
        let r = s.rouge;
        for (sum, v) in self.rouge.iter_mut().zip([
            r.rouge1_f1,
            r.rouge1_recall,
            r.rouge2_f1,
            r.rouge2_recall,
            r.rouge_l_f1,
        ]) {
            *sum += v;
        }
        self.length_ratio += s.length_ratio;
    }

    fn question(&mut self, found: usize, of: usize, leaves: usize) {
        self.questions += 1;
        self.recall += ratio(found, of);
        self.full += f64::from(u8::from(found == of));
        self.leaves += leaves;
    }

    fn figures(&self) -> Figures {
        let per_session = |sum: f64| sum * ratio(1, self.sessions);
        let per_question = |sum: f64| sum * ratio(1, self.questions);
        Figures {
            sessions: self.sessions,
            sessions_without_text: self.without_text,
            questions: self.questions,
            rouge1_f1: per_session(self.rouge[0]),
            rouge1_recall: per_session(self.rouge[1]),
            rouge2_f1: per_session(self.rouge[2]),
            rouge2_recall: per_session(self.rouge[3]),
            rouge_l_f1: per_session(self.rouge[4]),
            length_ratio: per_session(self.length_ratio),
            route_recall_at3: per_question(self.recall),
            route_full_hit_at3: per_question(self.full),
            mean_leaves: ratio(self.leaves, self.questions),
        }
    }
}

/// The thread of `method` for the conversation `stem`.
fn method_thread(stem: &str, method: &str) -> Result<ThreadId> {
    let t = if method == "cairn" {
        stem.to_owned()
    } else {
        format!("{stem}.{method}")
    };
    Ok(ThreadId::new(t)?)
}

/// `session_N_summary` of a LoCoMo file: at the top level, inside `conversation`, or inside
/// `session_summary` (the original release); `None` when absent or blank.
fn reference_summary(file: &serde_json::Value, n: u32) -> Option<String> {
    let key = format!("session_{n}_summary");
    [
        &file[&key],
        &file["conversation"][&key],
        &file["session_summary"][&key],
    ]
    .into_iter()
    .find_map(|v| v.as_str())
    .map(str::trim)
    .filter(|s| !s.is_empty())
    .map(str::to_owned)
}

/// A turn of one session: its id on each method's thread (in [`METHODS`] order) and its
/// content.
struct Turn {
    ids: [MemoryId; 3],
    content: String,
}

/// A conversation's turns per session, each with its id on every method's thread (the
/// conversation parsed once per thread, in [`METHODS`] order).
fn sessions(parsed: &[LocomoConversation]) -> Result<BTreeMap<u32, Vec<Turn>>> {
    let mut out: BTreeMap<u32, Vec<Turn>> = BTreeMap::new();
    let first = parsed.first().map_or(&[][..], |c| &c.turns);
    for (i, m) in first.iter().enumerate() {
        let id = |p: usize| {
            parsed
                .get(p)
                .and_then(|c| c.turns.get(i))
                .and_then(|m| m.id)
                .context("the LoCoMo importer gave a turn no id")
        };
        let n = m
            .metadata
            .get("session")
            .and_then(serde_json::Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .context("the LoCoMo importer gave a turn no session")?;
        out.entry(n).or_default().push(Turn {
            ids: [id(0)?, id(1)?, id(2)?],
            content: m.content.clone(),
        });
    }
    Ok(out)
}

/// The LoCoMo files of `dir`, sorted; an error when there are none.
pub(crate) fn locomo_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    if files.is_empty() {
        anyhow::bail!("{} holds no LoCoMo .json files", dir.display());
    }
    Ok(files)
}

/// On the summary route of `thread`: (evidence turns found, distinct leaves).
async fn route(
    mem: &MemoryHarness,
    thread: &ThreadId,
    q: &LocomoQuestion,
) -> Result<(usize, usize)> {
    let opts = SearchOptions::summaries()
        .thread(thread.clone())
        .levels(1, 1)
        .k(ROUTE_K);
    let mut leaves = HashSet::new();
    let mut dias = HashSet::new();
    for hit in mem.search(&q.question, opts).await? {
        for leaf in mem.expand_to_leaves(hit.memory.id).await? {
            if leaves.insert(leaf.id) {
                if let Some(d) = leaf.metadata.get("dia_id").and_then(|v| v.as_str()) {
                    dias.insert(d.to_owned());
                }
            }
        }
    }
    let found = q.evidence.iter().filter(|e| dias.contains(*e)).count();
    Ok((found, leaves.len()))
}

/// Imports every conversation of `dir` once per method into one store (a temporary one
/// unless `store` names a file, which a later run reuses), builds each method's level-1
/// summaries, and measures them (see the module docs).
pub async fn summaries(dir: &Path, store: Option<&Path>) -> Result<Report> {
    let files = locomo_files(dir)?;
    let tmp = tempfile::tempdir()?;
    let path = store.map_or_else(|| tmp.path().join("eval.db"), Path::to_path_buf);
    let mem = MemoryHarness::open(&path)
        .await
        .with_context(|| format!("opening the store {}", path.display()))?;
    let mut overall: BTreeMap<&str, Acc> = BTreeMap::new();
    let mut per_conv: BTreeMap<&str, BTreeMap<String, Acc>> = BTreeMap::new();
    let mut per_session: BTreeMap<String, BTreeMap<String, Vec<SessionFigures>>> = BTreeMap::new();
    for f in &files {
        let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or("conv");
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let raw: serde_json::Value =
            serde_json::from_str(&text).with_context(|| f.display().to_string())?;
        let threads = [
            method_thread(stem, METHODS[0])?,
            method_thread(stem, METHODS[1])?,
            method_thread(stem, METHODS[2])?,
        ];
        let parsed = threads
            .iter()
            .map(|t| parse_locomo(&text, t))
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| f.display().to_string())?;
        let turns = sessions(&parsed)?;
        let questions: Vec<LocomoQuestion> = parsed
            .first()
            .map_or(&[][..], |c| &c.questions)
            .iter()
            .filter(|q| (1..=4).contains(&q.category))
            .cloned()
            .collect();
        for p in parsed {
            mem.add_new(p.turns).await?;
        }
        let report = mem
            .consolidate(
                ConsolidationPolicy::older_than(Duration::ZERO)
                    .max_age(Duration::ZERO)
                    .thread(threads[0].clone()),
            )
            .await?;
        eprintln!("{stem}: {report}");
        if !report.failures.is_empty() {
            eprintln!(
                "{stem}: {} chunks failed to summarize; their sessions lose that text",
                report.failures.len()
            );
        }
        let cairn = session_texts(&mem, &threads[0]).await?;
        // Per method (in `METHODS` order), per scored session: its text.
        let mut texts: [BTreeMap<u32, String>; 3] = Default::default();
        let mut lead_summaries = Vec::new();
        let mut reference_summaries = Vec::new();
        for (&n, session) in &turns {
            let Some(reference) = reference_summary(&raw, n) else {
                continue;
            };
            let own = cairn.get(&n).cloned().unwrap_or_default();
            let lead = lead_text(session.iter().map(|t| t.content.as_str()), word_count(&own));
            if !lead.is_empty() {
                lead_summaries.push((lead.clone(), session.iter().map(|t| t.ids[1]).collect()));
            }
            reference_summaries.push((
                reference.clone(),
                session.iter().map(|t| t.ids[2]).collect(),
            ));
            texts[0].insert(n, own);
            texts[1].insert(n, lead);
            texts[2].insert(n, reference);
        }
        write_summaries(&mem, &threads[1], &lead_summaries).await?;
        write_summaries(&mem, &threads[2], &reference_summaries).await?;
        for (m, method) in METHODS.iter().enumerate() {
            let conv = per_conv
                .entry(method)
                .or_default()
                .entry(stem.to_owned())
                .or_default();
            let all = overall.entry(method).or_default();
            let mut rows = Vec::new();
            for (&n, t) in &texts[m] {
                let session_words: usize = turns
                    .get(&n)
                    .map_or(0, |s| s.iter().map(|t| word_count(&t.content)).sum());
                let summary_words = word_count(t);
                let reference = texts[2].get(&n).map_or("", String::as_str);
                let row = SessionFigures {
                    session: n,
                    session_words,
                    summary_words,
                    rouge: rouge(t, reference),
                    length_ratio: ratio(summary_words, session_words),
                };
                conv.session(&row);
                all.session(&row);
                rows.push(row);
            }
            per_session
                .entry((*method).to_owned())
                .or_default()
                .insert(stem.to_owned(), rows);
            for q in &questions {
                let (found, leaves) = route(&mem, &threads[m], q).await?;
                conv.question(found, q.evidence.len(), leaves);
                all.question(found, q.evidence.len(), leaves);
            }
        }
        eprintln!(
            "{stem}: {} sessions scored, {} questions",
            texts[2].len(),
            questions.len()
        );
    }
    Ok(Report {
        conversations: files.len(),
        overall: overall
            .iter()
            .map(|(k, a)| ((*k).to_owned(), a.figures()))
            .collect(),
        per_conversation: per_conv
            .iter()
            .map(|(k, c)| {
                (
                    (*k).to_owned(),
                    c.iter().map(|(t, a)| (t.clone(), a.figures())).collect(),
                )
            })
            .collect(),
        per_session,
    })
}

/// One table row's cells.
fn cells(f: &Figures) -> String {
    format!(
        "{:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} |",
        f.rouge1_f1,
        f.rouge1_recall,
        f.rouge2_f1,
        f.rouge2_recall,
        f.rouge_l_f1,
        f.length_ratio,
        f.route_recall_at3,
        f.route_full_hit_at3,
        f.mean_leaves
    )
}

const COLUMNS: &str = "ROUGE-1 F1 | ROUGE-1 R | ROUGE-2 F1 | ROUGE-2 R | ROUGE-L F1 | length ratio | route recall@3 | full-hit@3 | mean leaves |";

/// A Markdown table of the report: methods overall, then per conversation.
pub fn table(r: &Report) -> String {
    let (sessions, questions) = r
        .overall
        .get("reference")
        .map_or((0, 0), |f| (f.sessions, f.questions));
    let mut s = format!(
        "LoCoMo summaries: {} conversations, {sessions} sessions, {questions} questions \
         (ROUGE against session_N_summary, stop words removed, stemmed; the reference's \
         ROUGE is itself, the anchor; route: top {ROUTE_K} level-1 summaries expanded to \
         their turns)\n\n| method | {COLUMNS}\n|---|{}\n",
        r.conversations,
        "---:|".repeat(9)
    );
    for m in METHODS {
        if let Some(f) = r.overall.get(m) {
            s.push_str(&format!("| {m} | {}\n", cells(f)));
        }
    }
    let empty: Vec<String> = METHODS
        .iter()
        .filter_map(|m| {
            let f = r.overall.get(*m)?;
            (f.sessions_without_text > 0)
                .then(|| format!("{m} {} of {}", f.sessions_without_text, f.sessions))
        })
        .collect();
    if !empty.is_empty() {
        s.push_str(&format!(
            "\nSessions without text (scored 0): {}\n",
            empty.join(", ")
        ));
    }
    s.push_str(&format!(
        "\nPer conversation:\n\n| conversation | method | {COLUMNS}\n|---|---|{}\n",
        "---:|".repeat(9)
    ));
    let convs = crate::eval::conversations(&r.per_conversation);
    for c in convs {
        for m in METHODS {
            if let Some(f) = r.per_conversation.get(m).and_then(|p| p.get(c)) {
                s.push_str(&format!("| {c} | {m} | {}\n", cells(f)));
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn empty_inputs_score_zero_not_nan() {
        for (a, b) in [
            ("", ""),
            ("", "a cat sat"),
            ("a cat sat", ""),
            ("the of", "and"),
        ] {
            let r = rouge(a, b);
            assert_eq!(r, Rouge::default(), "{a:?} vs {b:?}");
        }
        // One token on each side: unigrams match, there are no bigrams.
        let r = rouge("Cats!", "cat");
        assert!(close(r.rouge1_f1, 1.0) && close(r.rouge_l_f1, 1.0));
        assert_eq!((r.rouge2_f1, r.rouge2_recall), (0.0, 0.0));
    }

    #[test]
    fn identical_texts_score_one() {
        let t = "Jon lost his job as a banker and planned to start a dance studio.";
        let r = rouge(t, t);
        for v in [
            r.rouge1_f1,
            r.rouge1_recall,
            r.rouge2_f1,
            r.rouge2_recall,
            r.rouge_l_f1,
        ] {
            assert!(close(v, 1.0), "{r:?}");
        }
    }

    #[test]
    fn tokens_drop_stop_words_and_stem_long_words() {
        assert_eq!(
            rouge_tokens("The dancers were dancing; I don't run ads, cats ran."),
            // "ads" has three letters: not stemmed (rouge-score stems longer words only).
            vec!["dancer", "danc", "run", "ads", "cat", "ran"]
        );
    }

    /// Expected values from Python's rouge-score 0.1.2 (`RougeScorer(['rouge1', 'rouge2',
    /// 'rougeL'], use_stemmer=True)`, NLTK 3.10.4) on the same texts with the stop words
    /// removed first (scripts/rouge_reference.py prints them).
    #[test]
    fn agrees_with_rouge_score() {
        // (summary, reference, rouge1 F1, rouge1 recall, rouge2 F1, rouge2 recall, rougeL F1)
        let cases = [
            (
                "[2023-01-20] Jon: I lost my job as a banker, so I'm starting a dance studio.\n\
                 [2023-01-20] Gina: I lost my job at Door Dash too.",
                "Jon lost his job as a banker and planned to start a dance studio because of \
                 his passion for dancing. Gina also lost her job at Door Dash.",
                0.705882,
                0.750000,
                0.500000,
                0.533333,
                0.705882,
            ),
            (
                "The cat chased the mouse; the mouse ran into the garden and the cat followed.",
                "A mouse ran to the garden, chased by a cat that followed it.",
                0.857143,
                1.000000,
                0.500000,
                0.600000,
                0.714286,
            ),
            (
                "Melanie painted a sunrise in 2022 and ran a charity race for mental health on \
                 Saturday.",
                "On Saturday Melanie ran a charity race for mental health; she painted a lake \
                 sunrise last year.",
                0.818182,
                0.750000,
                0.400000,
                0.363636,
                0.545455,
            ),
            (
                "Caroline went to an LGBTQ support group, which was powerful, and is \
                 researching adoption agencies and counseling careers.",
                "Caroline attended a support group and talked about adopting; she wants to \
                 work in counseling and mental health.",
                0.454545,
                0.454545,
                0.100000,
                0.100000,
                0.454545,
            ),
        ];
        for (s, r, r1f, r1r, r2f, r2r, rlf) in cases {
            let got = rouge(s, r);
            let want = [r1f, r1r, r2f, r2r, rlf];
            let have = [
                got.rouge1_f1,
                got.rouge1_recall,
                got.rouge2_f1,
                got.rouge2_recall,
                got.rouge_l_f1,
            ];
            for (h, w) in have.iter().zip(want) {
                assert!((h - w).abs() < 1e-4, "{s:?} vs {r:?}: {have:?} != {want:?}");
            }
        }
    }

    /// Where the stemmers group words differently, the scores differ: rouge-score (NLTK's
    /// extensions) stems "playing" and "playful" both to "play" and gives 1.0 everywhere
    /// (scripts/rouge_reference.py); Porter's original keeps them apart.
    #[test]
    fn known_divergence_from_rouge_score() {
        let r = rouge("She is playing games.", "She is playful about games.");
        assert!(close(r.rouge1_f1, 0.5) && close(r.rouge_l_f1, 0.5), "{r:?}");
        assert_eq!(r.rouge2_f1, 0.0);
    }

    #[test]
    fn lead_cuts_to_words_and_majority_picks_the_session() {
        assert_eq!(
            lead_text(["Ann: hi  there", "Bob: hello you"], 4),
            "Ann: hi there Bob:"
        );
        assert_eq!(lead_text(["a b"], 9), "a b");
        assert_eq!(lead_text(["a b"], 0), "");
        assert_eq!(word_count(" a  b\nc "), 3);
        assert_eq!(majority_session([2, 1, 2, 3]), Some(2));
        assert_eq!(
            majority_session([3, 2, 2, 3]),
            Some(2),
            "ties: the earliest"
        );
        assert_eq!(majority_session([]), None);
    }
}
