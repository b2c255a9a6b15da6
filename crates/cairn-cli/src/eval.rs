//! `cairn eval locomo`: evidence recall of context strategies under a token budget.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cairn_core::{MemoryKind, MemoryUnit, ThreadId};
use cairn_harness::import::{parse_locomo, LocomoQuestion};
use cairn_harness::{
    ConsolidationPolicy, ContextItem, ContextOptions, MemoryHarness, RecalledBlockCost, SearchMode,
    SearchOptions,
};
use serde::Serialize;

/// Figures of one strategy over a set of questions.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    /// Questions.
    pub questions: usize,
    /// Mean share of evidence turns present.
    pub evidence_recall: f64,
    /// Share of questions with all evidence present.
    pub full_hit: f64,
    /// Share with at least one evidence turn present.
    pub any_hit: f64,
    /// Mean tokens used.
    pub mean_tokens: f64,
    /// Mean latency in milliseconds.
    pub mean_latency_ms: f64,
    /// Median latency in milliseconds.
    pub p50_latency_ms: f64,
    /// 99th-percentile latency in milliseconds.
    pub p99_latency_ms: f64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The token budget.
    pub budget: usize,
    /// Conversations imported.
    pub conversations: usize,
    /// Strategy → overall figures.
    pub overall: BTreeMap<String, Figures>,
    /// Strategy → category → figures.
    pub per_category: BTreeMap<String, BTreeMap<u8, Figures>>,
    /// Per strategy, per conversation (the file's stem).
    pub per_conversation: BTreeMap<String, BTreeMap<String, Figures>>,
}

/// Tallies of questions: recall, hits, tokens and latencies.
#[derive(Debug, Clone, Default)]
pub(crate) struct Acc {
    n: usize,
    recall: f64,
    full: f64,
    any: f64,
    tokens: f64,
    ms: Vec<f64>,
}

impl Acc {
    /// Adds one question: `found` of its `of` evidence turns, `tokens` used, `took` long.
    pub(crate) fn add(&mut self, found: usize, of: usize, tokens: usize, took: Duration) {
        self.n += 1;
        #[allow(clippy::cast_precision_loss)]
        {
            self.recall += found as f64 / of as f64;
            self.tokens += tokens as f64;
        }
        self.full += f64::from(u8::from(found == of));
        self.any += f64::from(u8::from(found > 0));
        self.ms.push(took.as_secs_f64() * 1000.0);
    }

    /// Adds every question of `other`.
    pub(crate) fn merge(&mut self, other: &Acc) {
        self.n += other.n;
        self.recall += other.recall;
        self.full += other.full;
        self.any += other.any;
        self.tokens += other.tokens;
        self.ms.extend_from_slice(&other.ms);
    }

    /// The figures of the questions added so far.
    pub(crate) fn figures(&self) -> Figures {
        #[allow(clippy::cast_precision_loss)]
        let n = self.n.max(1) as f64;
        Figures {
            questions: self.n,
            evidence_recall: self.recall / n,
            full_hit: self.full / n,
            any_hit: self.any / n,
            mean_tokens: self.tokens / n,
            mean_latency_ms: self.ms.iter().sum::<f64>() / n,
            p50_latency_ms: percentile(&self.ms, 0.5),
            p99_latency_ms: percentile(&self.ms, 0.99),
        }
    }
}

/// The `p` quantile (nearest rank) of `values`; 0 when there are none.
fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    v.get(((v.len().saturating_sub(1)) as f64 * p).round() as usize)
        .copied()
        .unwrap_or(0.0)
}

fn dia(m: &MemoryUnit) -> Option<String> {
    m.metadata
        .get("dia_id")
        .and_then(|v| v.as_str())
        .map(str::to_owned)
}

/// Fills the budget with turns in the given order; returns (dia ids, tokens).
fn fill(
    mem: &MemoryHarness,
    turns: impl IntoIterator<Item = MemoryUnit>,
    budget: usize,
) -> (HashSet<String>, usize) {
    let c = mem.token_counter();
    let mut used = 0;
    let mut ids = HashSet::new();
    for m in turns {
        let cost = c.count_message(&format!(
            "[{}] {}",
            m.created_at.format("%Y-%m-%d %H:%M"),
            m.content
        ));
        if used + cost > budget {
            continue;
        }
        used += cost;
        if let Some(d) = dia(&m) {
            ids.insert(d);
        }
    }
    (ids, used)
}

/// Fills the budget with turns in the given order, rendered the way `assemble_context`
/// renders recalled turns: one message, a header line per day, one line per turn.
fn fill_grouped(
    mem: &MemoryHarness,
    turns: impl IntoIterator<Item = MemoryUnit>,
    budget: usize,
) -> (HashSet<String>, usize) {
    let mut block = RecalledBlockCost::new(mem.token_counter().as_ref());
    let mut used = 0;
    let mut ids = HashSet::new();
    for m in turns {
        let cost = block.cost(&m.content, m.created_at);
        if used + cost > budget {
            continue;
        }
        used += cost;
        block.add(m.created_at);
        if let Some(d) = dia(&m) {
            ids.insert(d);
        }
    }
    (ids, used)
}

/// One strategy's figures: overall, per category, per conversation.
type Tally = (Acc, BTreeMap<u8, Acc>, BTreeMap<String, Acc>);

/// The strategies measured, in the report's order.
pub const STRATEGIES: [&str; 6] = [
    "last_n",
    "flat_vector",
    "flat_keyword",
    "flat_hybrid",
    "flat_hybrid_grouped",
    "cairn_assemble_context",
];

/// Imports every conversation of `dir` into a fresh temporary store, consolidates it, and
/// measures each strategy on the questions of categories 1-4.
///
/// With `store`, that file is used instead of a temporary one; when it already holds the
/// conversations (a previous run), importing adds nothing and consolidation finds nothing
/// new, so repeated runs skip straight to the questions.
/// `options` are `assemble_context`'s; `only` restricts the run to the strategies it names
/// (all of them when empty).
pub async fn locomo(
    dir: &Path,
    budget: usize,
    store: Option<&Path>,
    options: ContextOptions,
    only: &[String],
) -> Result<Report> {
    if let Some(bad) = only.iter().find(|s| !STRATEGIES.contains(&s.as_str())) {
        anyhow::bail!(
            "unknown strategy {bad:?}; the strategies are {}",
            STRATEGIES.join(", ")
        );
    }
    let strategies: Vec<&str> = STRATEGIES
        .into_iter()
        .filter(|s| only.is_empty() || only.iter().any(|o| o == s))
        .collect();
    let tmp = tempfile::tempdir()?;
    let path = store.map_or_else(|| tmp.path().join("eval.db"), Path::to_path_buf);
    let mem = MemoryHarness::open(&path).await?;
    let files = crate::eval_summaries::locomo_files(dir)?;
    let mut questions: Vec<(ThreadId, LocomoQuestion)> = Vec::new();
    for f in &files {
        let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or("conv");
        let thread = ThreadId::new(stem)?;
        let conv = parse_locomo(&std::fs::read_to_string(f)?, &thread)
            .with_context(|| f.display().to_string())?;
        mem.add_new(conv.turns).await?;
        questions.extend(
            conv.questions
                .into_iter()
                .filter(|q| (1..=4).contains(&q.category))
                .map(|q| (thread.clone(), q)),
        );
    }
    eprintln!("imported {} conversations; consolidating…", files.len());
    let report = mem
        .consolidate(ConsolidationPolicy::older_than(Duration::ZERO).max_age(Duration::ZERO))
        .await?;
    eprintln!("{report}; evaluating {} questions", questions.len());
    let mut acc: BTreeMap<&str, Tally> = BTreeMap::new();
    for (thread, q) in &questions {
        let evidence: HashSet<&str> = q.evidence.iter().map(String::as_str).collect();
        for &s in &strategies {
            let t = Instant::now();
            let (found, tokens) = match s {
                "last_n" => {
                    let mut turns = mem.get_conversational(thread.as_str(), 400).await?;
                    turns.reverse();
                    fill(&mem, turns, budget)
                }
                "cairn_assemble_context" => {
                    let ctx = mem
                        .assemble_context_with(thread.as_str(), &q.question, budget, options)
                        .await?;
                    // A recalled line names every day its words were said on: the turns
                    // of those days are in the context too.
                    let ids = ctx
                        .items
                        .iter()
                        .flat_map(ContextItem::named_metadata)
                        .filter_map(|m| m.get("dia_id").and_then(|v| v.as_str()))
                        .map(str::to_owned)
                        .collect();
                    (ids, ctx.tokens)
                }
                flat => {
                    let mode = match flat {
                        "flat_vector" => SearchMode::Vector,
                        "flat_keyword" => SearchMode::Keyword,
                        _ => SearchMode::Hybrid,
                    };
                    let grouped = flat == "flat_hybrid_grouped";
                    let opts = SearchOptions::all()
                        .thread(thread.clone())
                        .kinds([MemoryKind::Conversational])
                        .k(150)
                        .mode(mode);
                    let hits = mem.search(&q.question, opts).await?;
                    let turns = hits.into_iter().map(|h| h.memory);
                    if grouped {
                        fill_grouped(&mem, turns, budget)
                    } else {
                        fill(&mem, turns, budget)
                    }
                }
            };
            let took = t.elapsed();
            let n = evidence.iter().filter(|e| found.contains(**e)).count();
            let entry = acc.entry(s).or_default();
            entry.0.add(n, evidence.len(), tokens, took);
            entry
                .1
                .entry(q.category)
                .or_default()
                .add(n, evidence.len(), tokens, took);
            entry.2.entry(thread.as_str().to_owned()).or_default().add(
                n,
                evidence.len(),
                tokens,
                took,
            );
        }
    }
    Ok(Report {
        budget,
        conversations: files.len(),
        overall: acc
            .iter()
            .map(|(k, (a, _, _))| ((*k).to_owned(), a.figures()))
            .collect(),
        per_category: acc
            .iter()
            .map(|(k, (_, c, _))| {
                (
                    (*k).to_owned(),
                    c.iter().map(|(cat, a)| (*cat, a.figures())).collect(),
                )
            })
            .collect(),
        per_conversation: acc
            .iter()
            .map(|(k, (_, _, c))| {
                (
                    (*k).to_owned(),
                    c.iter().map(|(t, a)| (t.clone(), a.figures())).collect(),
                )
            })
            .collect(),
    })
}

/// The conversations of a per-method, per-conversation table (those of its first method).
pub(crate) fn conversations<T>(per: &BTreeMap<String, BTreeMap<String, T>>) -> Vec<&String> {
    per.values()
        .next()
        .map(|c| c.keys().collect())
        .unwrap_or_default()
}

/// A Markdown table of the report.
pub fn table(r: &Report) -> String {
    let mut s = format!(
        "LoCoMo: {} conversations, budget {} tokens\n\n| strategy | evidence recall | full-hit | any-hit | mean tokens | latency mean / p50 / p99 (ms) |\n|---|---:|---:|---:|---:|---:|\n",
        r.conversations, r.budget
    );
    for name in STRATEGIES {
        if let Some(f) = r.overall.get(name) {
            s.push_str(&format!(
                "| {name} | {:.3} | {:.3} | {:.3} | {:.0} | {:.1} / {:.1} / {:.1} |\n",
                f.evidence_recall,
                f.full_hit,
                f.any_hit,
                f.mean_tokens,
                f.mean_latency_ms,
                f.p50_latency_ms,
                f.p99_latency_ms
            ));
        }
    }
    s.push_str("\nEvidence recall per category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop):\n\n| strategy | 1 | 2 | 3 | 4 |\n|---|---:|---:|---:|---:|\n");
    for name in STRATEGIES {
        if let Some(c) = r.per_category.get(name) {
            let cell = |k: u8| {
                c.get(&k).map_or("-".to_owned(), |f| {
                    format!("{:.3} (n={})", f.evidence_recall, f.questions)
                })
            };
            s.push_str(&format!(
                "| {name} | {} | {} | {} | {} |\n",
                cell(1),
                cell(2),
                cell(3),
                cell(4)
            ));
        }
    }
    let convs = conversations(&r.per_conversation);
    s.push_str("\nEvidence recall / full-hit per conversation:\n\n| strategy |");
    for c in &convs {
        s.push_str(&format!(" {c} |"));
    }
    s.push_str("\n|---|");
    s.push_str(&"---:|".repeat(convs.len()));
    s.push('\n');
    for name in STRATEGIES {
        if let Some(per) = r.per_conversation.get(name) {
            s.push_str(&format!("| {name} |"));
            for c in &convs {
                let cell = per.get(*c).map_or("-".to_owned(), |f| {
                    format!("{:.3} / {:.3}", f.evidence_recall, f.full_hit)
                });
                s.push_str(&format!(" {cell} |"));
            }
            s.push('\n');
        }
    }
    s
}
