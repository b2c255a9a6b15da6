//! [`ExtractiveSummarizer`]: the embedded default, no LLM.
//!
//! Method:
//! 1. The items (and the previous summary, when extending one) are split into candidate
//!    units: sentences of raw memories (a leading `Speaker: ` that repeats the item's speaker
//!    is dropped, so it is never written twice), lines of summaries (parsed back into date,
//!    speaker and sentence).
//! 2. Each unit is scored by what it tells: the sum of its distinct content words' rarity
//!    in the thread (inverse document frequency, from the caller's [`TermStats`] or counted
//!    over the items), with named things, numbers and first mentions weighing more, divided
//!    by the square root of its length. Phatic and near-empty units (fewer than three content
//!    words, or nothing but greetings, thanks and reactions) are not candidates while others
//!    are.
//! 3. Units are picked greedily by maximal marginal relevance:
//!    `λ·gain(unit) − (1 − λ)·max cos(unit, picked)` with λ = 0.7, where the gain counts only
//!    content words not yet covered, so the summary neither repeats itself in words nor in
//!    meaning. Every speaker with something to say gets a line first. Over summaries (a
//!    roll-up) the picks go round the children in turn, so every part of the time span is
//!    covered evenly. Picking stops at the token budget or at `word_ratio` (25%) of the
//!    sources' words, whichever comes first.
//! 4. The picked units are written in their original order, one per line, as
//!    `Speaker: sentence`, the date written once per day (`[2023-05-08] ` before the day's
//!    first line). A roll-up starts with its date range: `[2023-05-08 to 2023-06-20]`.
//! 5. A last line names up to eight topics: the sources' heaviest words (summed weight over
//!    the sentences that hold them, and the topics of summarized summaries) that the written
//!    lines do not already say, speakers' names left out: `Topics: tattoo, Seattle, Rainier`.
//!    Its words come out of the word budget. It keeps what the summary left out findable by
//!    keyword and by meaning.
//!
//! Deterministic: the same input gives the same summary (embeddings are deterministic; ties
//! go to the earlier unit).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use cairn_core::{
    CharEstimateCounter, Embedder, MemoryKind, SummarizeError, Summarizer, SummaryItem,
    SummaryRequest, TermStats, TokenCounter,
};
use chrono::NaiveDate;

use crate::text::{content_words, is_stop_word, tokens};

/// Sentence-selection summarizer (informative sentences, maximal marginal relevance).
pub struct ExtractiveSummarizer {
    embedder: Arc<dyn Embedder>,
    counter: Arc<dyn TokenCounter>,
    lambda: f32,
    word_ratio: f32,
}

impl std::fmt::Debug for ExtractiveSummarizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtractiveSummarizer")
            .field("model", &self.embedder.model_id())
            .field("lambda", &self.lambda)
            .field("word_ratio", &self.word_ratio)
            .finish()
    }
}

/// Words that carry no information on their own in conversation: greetings, thanks,
/// reactions, fillers. A unit made of nothing else is phatic.
#[rustfmt::skip]
const PHATIC: &[&str] = &[
    "absolutely", "always", "amazing", "anything", "appreciate", "awesome", "aww", "beautiful",
    "btw", "bye", "care", "catch", "cheers", "congrats", "congratulations", "cool", "day",
    "definitely", "everything", "excited", "fantastic", "feel", "feels", "fun", "get", "glad",
    "goes", "going", "good", "goodbye", "got", "great", "guess", "haha", "hang", "happy",
    "hear", "hearing", "hello", "hey", "hi", "hmm", "hope", "hugs", "incredible", "keep",
    "kind", "know", "later", "let", "like", "lol", "lot", "love", "lovely", "luck", "man",
    "mean", "means", "morning", "much", "nice", "night", "oh", "ok", "okay", "omg", "one",
    "proud", "really", "right", "see", "share", "sharing", "something", "soon", "sounds",
    "stuff", "sure", "sweet", "take", "talk", "thank", "thanks", "thing", "things", "think",
    "totally", "um", "wait", "well", "wishing", "wonderful", "wow", "ya", "yay", "yeah", "yep",
    "yes",
];

fn is_phatic_word(w: &str) -> bool {
    PHATIC.binary_search(&w).is_ok()
}

/// A candidate line of the summary.
#[derive(Debug, Clone)]
struct Unit {
    /// Who said it (written as `Speaker: `), when known.
    speaker: Option<String>,
    /// The day it belongs to, when known.
    date: Option<NaiveDate>,
    /// The sentence, without date or speaker.
    text: String,
    /// Position among all units (time order).
    order: usize,
    /// The item it came from (the previous summary counts as one).
    group: usize,
    /// Distinct content words (lowercase).
    words: Vec<String>,
    /// Content words that were written capitalised inside the sentence or hold a digit.
    named: HashSet<String>,
    /// Whitespace-separated words of the written line (speaker included).
    length: usize,
}

impl Unit {
    fn new(speaker: Option<String>, date: Option<NaiveDate>, text: String, group: usize) -> Self {
        let mut words = content_words(&text);
        let mut named = HashSet::new();
        for (k, raw) in text.split_whitespace().enumerate() {
            let w = raw.trim_matches(|c: char| !c.is_ascii_alphanumeric());
            let capital = k > 0 && w.chars().next().is_some_and(|c| c.is_ascii_uppercase());
            let digit = w.chars().any(|c| c.is_ascii_digit());
            if capital || digit {
                named.extend(tokens(w).filter(|t| !is_stop_word(t)));
            }
        }
        let mut seen = HashSet::new();
        words.retain(|w| seen.insert(w.clone()));
        let length = text.split_whitespace().count()
            + speaker
                .as_deref()
                .map_or(0, |s| s.split_whitespace().count());
        Self {
            speaker,
            date,
            text,
            order: 0,
            group,
            words,
            named,
            length,
        }
    }

    /// At least three content words, and at least two that are not greetings or reactions.
    fn informative(&self) -> bool {
        self.words.len() >= 3 && self.words.iter().filter(|w| !is_phatic_word(w)).count() >= 2
    }

    fn line(&self) -> String {
        match &self.speaker {
            Some(s) => format!("{s}: {}", self.text),
            None => self.text.clone(),
        }
    }
}

impl ExtractiveSummarizer {
    /// A summarizer that embeds with `embedder` and counts tokens as characters/4.
    pub fn new(embedder: Arc<dyn Embedder>) -> Self {
        Self {
            embedder,
            counter: Arc::new(CharEstimateCounter::default()),
            lambda: 0.7,
            word_ratio: 0.25,
        }
    }

    /// Counts the budget with `counter`.
    pub fn with_token_counter(mut self, counter: Arc<dyn TokenCounter>) -> Self {
        self.counter = counter;
        self
    }

    /// Relevance against redundancy, in `[0, 1]` (default 0.7).
    pub fn with_lambda(mut self, lambda: f32) -> Self {
        self.lambda = lambda.clamp(0.0, 1.0);
        self
    }

    /// The most words a summary may have, as a share of its sources' words, in `(0, 1]`
    /// (default 0.25). A summary always keeps at least one line.
    pub fn with_word_ratio(mut self, ratio: f32) -> Self {
        self.word_ratio = if ratio.is_finite() {
            ratio.clamp(0.01, 1.0)
        } else {
            0.25
        };
        self
    }
}

/// The name written before an item's sentences: its speaker, else its role, else its kind.
fn who(item: &SummaryItem) -> String {
    item.speaker
        .clone()
        .filter(|s| !s.trim().is_empty())
        .or_else(|| {
            item.role.map(|r| {
                let s = r.as_str();
                let mut c = s.chars();
                c.next()
                    .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                    .unwrap_or_default()
            })
        })
        .unwrap_or_else(|| item.kind.as_str().to_owned())
}

/// The sentence vectors the default summarizer weighs, kept in memory for the life of a
/// harness (a consolidation's roll-ups read again the lines it embedded a level below),
/// never written to a file: the embedding cache stores only memories' texts. Bounded
/// (emptied when full); emptied whenever a memory leaves the store (a delete, a forget), so
/// a forgotten sentence is not kept here either, and rid of a replaced text's sentences that
/// its new text does not say (an update, a summary written again).
pub(crate) struct SentenceMemo {
    inner: Arc<dyn Embedder>,
    map: std::sync::Mutex<Memo>,
}

#[derive(Default)]
struct Memo {
    vectors: HashMap<String, Vec<f32>>,
    /// Raised by each clear: vectors embedded before a clear are not kept after it (the
    /// text they came from may have left the store meanwhile).
    generation: u64,
}

/// Sentences a [`SentenceMemo`] keeps before it empties itself (about 12 MB at 384
/// dimensions).
const SENTENCE_MEMO: usize = 8_192;

impl SentenceMemo {
    pub(crate) fn new(inner: Arc<dyn Embedder>) -> Self {
        Self {
            inner,
            map: std::sync::Mutex::new(Memo::default()),
        }
    }

    /// Forgets every sentence kept, and every one being embedded now.
    pub(crate) fn clear(&self) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.vectors.clear();
        m.generation += 1;
    }

    /// Forgets the sentences `texts` (derived from a text that left the store while the
    /// sentences of the rest stay), and every sentence being embedded now.
    pub(crate) fn remove(&self, texts: &[&str]) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        for t in texts {
            m.vectors.remove(*t);
        }
        m.generation += 1;
    }

    /// Whether `sentence` is kept.
    #[cfg(test)]
    pub(crate) fn contains(&self, sentence: &str) -> bool {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .vectors
            .contains_key(sentence)
    }

    /// Sentences kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .vectors
            .len()
    }
}

impl Embedder for SentenceMemo {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }

    fn dim(&self) -> usize {
        self.inner.dim()
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, cairn_core::EmbedError> {
        let (mut out, generation): (Vec<Option<Vec<f32>>>, u64) = {
            let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
            (
                texts.iter().map(|t| m.vectors.get(*t).cloned()).collect(),
                m.generation,
            )
        };
        // Each sentence missing goes to the model once, however often the call repeats it.
        let mut missing: Vec<&str> = Vec::new();
        let mut seen: HashSet<&str> = HashSet::new();
        for (t, v) in texts.iter().zip(&out) {
            if v.is_none() && seen.insert(t) {
                missing.push(t);
            }
        }
        if !missing.is_empty() {
            let fresh = self.inner.embed_checked(&missing)?;
            if fresh.len() != missing.len() {
                return Err(cairn_core::EmbedError::Inference(
                    "the model returned another number of vectors".into(),
                ));
            }
            let fresh: HashMap<&str, Vec<f32>> = missing.iter().copied().zip(fresh).collect();
            for (slot, t) in out.iter_mut().zip(texts) {
                if slot.is_none() {
                    *slot = fresh.get(*t).cloned();
                }
            }
            let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
            if m.generation == generation {
                if m.vectors.len() + fresh.len() > SENTENCE_MEMO {
                    m.vectors.clear();
                }
                for (t, v) in fresh {
                    if m.vectors.len() >= SENTENCE_MEMO {
                        break;
                    }
                    m.vectors.insert(t.to_owned(), v);
                }
            }
        }
        out.into_iter()
            .map(|v| {
                v.ok_or_else(|| {
                    cairn_core::EmbedError::Inference("a sentence lost its vector".into())
                })
            })
            .collect()
    }
}

/// Every text the extractive summarizer may embed (through the harness's embedding cache)
/// for a memory whose content is `content`, from the content alone: the content itself,
/// its sentences with and without a leading `who:` (whoever the speaker is), and, read as a
/// summary, the sentence of each of its lines. A forget purges these from the cache; an
/// open that finishes a forget keeps these of every memory left. A superset of what is
/// embedded (a speaker name holding a colon past the third is not stripped).
pub(crate) fn derived_texts(content: &str) -> Vec<String> {
    let mut out = vec![content.to_owned()];
    out.extend(sentences(content.trim_start()));
    for (i, _) in content.match_indices(':').take(3) {
        out.extend(sentences(content[i + 1..].trim_start()));
    }
    for line in content.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with(TOPICS) {
            continue;
        }
        if let Some((_, _, body)) = parse_line(line) {
            if !body.is_empty() {
                out.push(body);
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// `content` without a leading `who: ` (imports write the speaker into the text too).
pub(crate) fn strip_speaker<'a>(content: &'a str, who: &str) -> &'a str {
    let c = content.trim_start();
    c.strip_prefix(who)
        .and_then(|rest| rest.strip_prefix(':'))
        .map_or(c, str::trim_start)
}

/// One line of a summary, read back: `[date] Speaker: sentence`, each part optional.
/// `None` for a date-range header line.
fn parse_line(line: &str) -> Option<(Option<NaiveDate>, Option<String>, String)> {
    let mut rest = line.trim();
    let mut date = None;
    if let Some(inner) = rest.strip_prefix('[') {
        if let Some(end) = inner.find(']') {
            let tag = &inner[..end];
            if let Ok(d) = NaiveDate::parse_from_str(tag, "%Y-%m-%d") {
                date = Some(d);
                rest = inner[end + 1..].trim_start();
            } else if tag.contains(" to ") && inner[end + 1..].trim().is_empty() {
                return None;
            }
        }
    }
    let mut speaker = None;
    if let Some(colon) = rest.find(": ") {
        let name = &rest[..colon];
        let plausible = !name.is_empty()
            && name.len() <= 40
            && name.split_whitespace().count() <= 4
            && name.chars().next().is_some_and(char::is_alphabetic)
            && !name.contains(['.', '!', '?', ',', '[', ']']);
        if plausible {
            speaker = Some(name.to_owned());
            rest = rest[colon + 2..].trim_start();
        }
    }
    Some((date, speaker, rest.to_owned()))
}

/// Splits text into sentences at `.`, `!` or `?` followed by whitespace, and at newlines.
pub fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut start = 0;
        let chars: Vec<(usize, char)> = line.char_indices().collect();
        for (k, (i, c)) in chars.iter().enumerate() {
            if matches!(c, '.' | '!' | '?')
                && chars.get(k + 1).is_some_and(|(_, n)| n.is_whitespace())
            {
                let end = i + c.len_utf8();
                let s = line[start..end].trim();
                if !s.is_empty() {
                    out.push(s.to_owned());
                }
                start = end;
            }
        }
        let s = line[start..].trim();
        if !s.is_empty() {
            out.push(s.to_owned());
        }
    }
    out
}

/// The units of a request, in time order, and the number of words of its sources.
fn units(request: &SummaryRequest) -> (Vec<Unit>, usize, Vec<String>) {
    let mut out = Vec::new();
    let mut source_words = 0;
    let mut group = 0;
    let mut pool: Vec<String> = Vec::new();
    let mut summary_lines = |text: &str, first_date: Option<NaiveDate>, group: usize| {
        let mut date = first_date;
        let mut units = Vec::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(list) = line.strip_prefix(TOPICS) {
                pool.extend(
                    list.split(',')
                        .map(str::trim)
                        .filter(|t| !t.is_empty())
                        .map(str::to_owned),
                );
                continue;
            }
            let Some((d, speaker, body)) = parse_line(line) else {
                continue;
            };
            if d.is_some() {
                date = d;
            }
            if !body.is_empty() {
                units.push(Unit::new(speaker, date, body, group));
            }
        }
        units
    };
    if let Some(prev) = &request.previous {
        source_words += prev.split_whitespace().count();
        out.extend(summary_lines(prev, None, group));
        group += 1;
    }
    for item in &request.items {
        if item.kind == MemoryKind::Summary {
            source_words += item.content.split_whitespace().count();
            let start = item.time_start.unwrap_or(item.created_at).date_naive();
            out.extend(summary_lines(&item.content, Some(start), group));
        } else {
            let name = who(item);
            let body = strip_speaker(&item.content, &name);
            source_words += body.split_whitespace().count();
            let date = Some(item.created_at.date_naive());
            for s in sentences(body) {
                out.push(Unit::new(Some(name.clone()), date, s, group));
            }
        }
        group += 1;
    }
    for (i, u) in out.iter_mut().enumerate() {
        u.order = i;
    }
    (out, source_words, pool)
}

/// The last line of a summary: the words that stand for what its sources talked about.
pub const TOPICS: &str = "Topics: ";

/// Topics: the sources' heaviest words (summed weight over the units that hold them; over
/// summaries, their topics and the named things of their lines) that the picked lines do
/// not already say, in the form first written; numbers, short and phatic words left out.
fn topics(
    units: &[Unit],
    weights: &[Vec<(String, f32)>],
    picked: &[usize],
    pool: &[String],
    stats: Option<&TermStats>,
    n: usize,
) -> Vec<String> {
    let mut covered: HashSet<String> = picked
        .iter()
        .flat_map(|i| units[*i].words.iter().cloned())
        .collect();
    // Speakers head every line already.
    covered.extend(
        units
            .iter()
            .filter_map(|u| u.speaker.as_deref())
            .flat_map(tokens),
    );
    let eligible = |w: &str| {
        w.len() > 2
            && !w.chars().all(|c| c.is_ascii_digit())
            && !is_phatic_word(w)
            && !covered.contains(w)
    };
    // word -> (score, first position, surface form)
    let mut score: HashMap<String, (f32, usize, String)> = HashMap::new();
    let mut at = 0usize;
    // Over summaries, their topics stand for them: of the lines, only named things count.
    let rollup = !pool.is_empty();
    for (u, ws) in units.iter().zip(weights) {
        for (w, weight) in ws
            .iter()
            .filter(|(w, _)| eligible(w) && (!rollup || u.named.contains(w)))
        {
            at += 1;
            let surface = u
                .text
                .split_whitespace()
                .map(|r| r.trim_matches(|c: char| !c.is_ascii_alphanumeric()))
                .find(|r| r.eq_ignore_ascii_case(w))
                .unwrap_or(w);
            let e = score
                .entry(w.clone())
                .or_insert_with(|| (0.0, at, surface.to_owned()));
            e.0 += weight;
        }
    }
    for t in pool {
        let key = t.to_ascii_lowercase();
        if key.split_whitespace().count() != 1 || !eligible(&key) {
            continue;
        }
        at += 1;
        let weight = stats
            .filter(|s| s.docs() > 0)
            .map_or(1.0, |s| s.idf(&key).max(0.05));
        let e = score.entry(key).or_insert_with(|| (0.0, at, t.clone()));
        e.0 += weight;
    }
    let mut ranked: Vec<(f32, usize, String)> = score.into_values().collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    distinct(ranked.into_iter().map(|(_, _, s)| s), n)
}

/// The first `n` of `words` that differ from every earlier one in more than case and a
/// plural `s` ("School", "schools" and "school" are one).
fn distinct(words: impl Iterator<Item = String>, n: usize) -> Vec<String> {
    let key = |w: &str| {
        let l = w.to_ascii_lowercase();
        match l.strip_suffix('s') {
            Some(stem) if stem.len() > 2 => stem.to_owned(),
            _ => l,
        }
    };
    let mut seen = HashSet::new();
    words.filter(|w| seen.insert(key(w))).take(n).collect()
}

/// Word weights: rarity in the thread (or among the units), more for named things and
/// numbers, more for a word's first mention. In the unit's word order, so that sums over
/// them are the same on every run.
fn weights(units: &[Unit], stats: Option<&TermStats>) -> Vec<Vec<(String, f32)>> {
    let local;
    let stats = match stats {
        Some(s) if s.docs() > 0 => s,
        _ => {
            let mut s = TermStats::new();
            for u in units {
                s.add_doc(u.words.iter().cloned());
            }
            local = s;
            &local
        }
    };
    let mut seen: HashSet<&str> = HashSet::new();
    units
        .iter()
        .map(|u| {
            u.words
                .iter()
                .map(|w| {
                    let mut weight = stats.idf(w).max(0.05);
                    if u.named.contains(w) {
                        weight *= 1.5;
                    }
                    if is_phatic_word(w) {
                        weight *= 0.25;
                    }
                    if seen.insert(w.as_str()) {
                        weight *= 1.2;
                    }
                    (w.clone(), weight)
                })
                .collect()
        })
        .collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl ExtractiveSummarizer {
    /// Picks units (indices, in time order) under the token and word budgets.
    fn select(
        &self,
        units: &[Unit],
        vectors: &[Vec<f32>],
        weights: &[Vec<(String, f32)>],
        token_budget: usize,
        word_budget: usize,
        round_robin: bool,
    ) -> Vec<usize> {
        let n = units.len();
        // Candidates: informative units, or all of them when none is.
        let informative: Vec<bool> = units.iter().map(Unit::informative).collect();
        let candidate: Vec<bool> = if informative.iter().any(|x| *x) {
            informative
        } else {
            units.iter().map(|u| !u.words.is_empty()).collect()
        };
        let candidate: Vec<bool> = if candidate.iter().any(|x| *x) {
            candidate
        } else {
            vec![true; n]
        };
        #[allow(clippy::cast_precision_loss)]
        let density = |i: usize, covered: &HashSet<&str>| -> f32 {
            let gain: f32 = weights[i]
                .iter()
                .filter(|(w, _)| !covered.contains(w.as_str()))
                .map(|(_, v)| *v)
                .sum();
            gain / (units[i].length.max(1) as f32).sqrt()
        };
        let empty = HashSet::new();
        let top = (0..n)
            .filter(|i| candidate[*i])
            .map(|i| density(i, &empty))
            .fold(0f32, f32::max)
            .max(f32::EPSILON);
        let mut covered: HashSet<&str> = HashSet::new();
        let mut max_sim = vec![0f32; n];
        // 0 = open, 1 = picked, 2 = out (does not fit, or not a candidate).
        let mut state: Vec<u8> = candidate.iter().map(|c| if *c { 0 } else { 2 }).collect();
        let mut picked: Vec<usize> = Vec::new();
        let (mut tokens_used, mut words_used) = (0usize, 0usize);
        let groups: Vec<usize> = {
            let mut g: Vec<usize> = units.iter().map(|u| u.group).collect();
            g.dedup();
            g
        };
        // Speakers first: each one with a candidate gets one line before anyone a second.
        let mut speakers: Vec<Option<&str>> = Vec::new();
        for (i, u) in units.iter().enumerate() {
            if candidate[i] && !speakers.contains(&u.speaker.as_deref()) {
                speakers.push(u.speaker.as_deref());
            }
        }
        let mut unseen_speakers: Vec<Option<&str>> =
            if round_robin { Vec::new() } else { speakers };
        let mut turn = 0usize;
        let mut misses = 0usize;
        loop {
            // Which units may be picked this round.
            let allowed = |i: usize| -> bool {
                if !unseen_speakers.is_empty() {
                    return unseen_speakers.contains(&units[i].speaker.as_deref());
                }
                if round_robin && !groups.is_empty() {
                    return units[i].group == groups[turn % groups.len()];
                }
                true
            };
            let mut best: Option<(usize, f32)> = None;
            for i in (0..n).filter(|i| state[*i] == 0 && allowed(*i)) {
                let gain = density(i, &covered) / top;
                let score = self.lambda * gain - (1.0 - self.lambda) * max_sim[i];
                if best.is_none_or(|(_, b)| score > b) {
                    best = Some((i, score));
                }
            }
            let Some((i, _)) = best else {
                if !unseen_speakers.is_empty() {
                    unseen_speakers.clear();
                    continue;
                }
                // This child has nothing left: the next one's turn.
                if round_robin && misses < groups.len() && (0..n).any(|i| state[i] == 0) {
                    turn += 1;
                    misses += 1;
                    continue;
                }
                break;
            };
            let cost = self.counter.count(&units[i].line()) + 1;
            if tokens_used + cost > token_budget || words_used + units[i].length > word_budget {
                if picked.is_empty() {
                    // Nothing fits: the best unit alone, cut to the budget by the caller.
                    picked.push(i);
                    break;
                }
                state[i] = 2;
                continue;
            }
            tokens_used += cost;
            words_used += units[i].length;
            state[i] = 1;
            picked.push(i);
            covered.extend(units[i].words.iter().map(String::as_str));
            for j in 0..n {
                max_sim[j] = max_sim[j].max(dot(&vectors[i], &vectors[j]));
            }
            let who = units[i].speaker.as_deref();
            unseen_speakers.retain(|s| *s != who);
            if round_robin {
                turn += 1;
                misses = 0;
            }
        }
        picked.sort_by_key(|i| units[*i].order);
        picked
    }
}

/// Writes picked units one per line, the date once per day.
fn render(units: &[&Unit], header: Option<String>) -> String {
    let mut lines: Vec<String> = header.into_iter().collect();
    let mut day = None;
    for u in units {
        let mut line = u.line();
        if u.date.is_some() && u.date != day {
            day = u.date;
            if let Some(d) = u.date {
                line = format!("[{}] {line}", d.format("%Y-%m-%d"));
            }
        }
        lines.push(line);
    }
    lines.join("\n")
}

/// The top `n` keywords of a summary: the content words of its sentences and topics (dates
/// and speakers' names left out) ranked by count times rarity in `stats`, named things and
/// numbers weighing more; each in the form first written.
pub fn summary_keywords(text: &str, stats: &TermStats, n: usize) -> Vec<String> {
    let lines: Vec<(Option<String>, String)> = text
        .lines()
        .filter_map(|l| match l.strip_prefix(TOPICS) {
            Some(list) => Some((None, list.to_owned())),
            None => parse_line(l).map(|(_, who, body)| (who, body)),
        })
        .collect();
    let speakers: HashSet<String> = lines
        .iter()
        .filter_map(|(who, _)| who.as_deref())
        .flat_map(tokens)
        .collect();
    let mut score: HashMap<String, (f32, usize, String)> = HashMap::new();
    let mut at = 0usize;
    for (_, body) in lines {
        let unit = Unit::new(None, None, body, 0);
        for raw in unit.text.split_whitespace() {
            let surface = raw.trim_matches(|c: char| !c.is_ascii_alphanumeric());
            for w in tokens(surface)
                .filter(|w| !is_stop_word(w) && !is_phatic_word(w) && !speakers.contains(w))
            {
                at += 1;
                let mut weight = if stats.docs() > 0 { stats.idf(&w) } else { 1.0 };
                if unit.named.contains(&w) {
                    weight *= 1.5;
                }
                let e = score
                    .entry(w)
                    .or_insert_with(|| (0.0, at, surface.to_owned()));
                e.0 += weight;
            }
        }
    }
    let mut ranked: Vec<(String, (f32, usize, String))> = score.into_iter().collect();
    ranked.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0).then(a.1 .1.cmp(&b.1 .1)));
    distinct(
        ranked
            .into_iter()
            .filter(|(w, _)| w.len() > 1)
            .map(|(_, (_, _, s))| s),
        n,
    )
}

#[async_trait]
impl Summarizer for ExtractiveSummarizer {
    fn name(&self) -> &str {
        "extractive"
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<String, SummarizeError> {
        let (units, source_words, pool) = units(request);
        if units.is_empty() {
            return Err(SummarizeError::NoInput);
        }
        let texts: Vec<String> = units.iter().map(|u| u.text.clone()).collect();
        let embedder = self.embedder.clone();
        let vectors = tokio::task::spawn_blocking(move || {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            embedder.embed_checked(&refs)
        })
        .await
        .map_err(|e| SummarizeError::Other(e.to_string()))?
        .map_err(|e| SummarizeError::Other(format!("embedding sentences: {e}")))?;
        let rollup = request.items.iter().any(|i| i.kind == MemoryKind::Summary);
        let header = if rollup {
            request
                .time_range()
                .map(|(a, b)| format!("[{} to {}]", a.format("%Y-%m-%d"), b.format("%Y-%m-%d")))
        } else {
            None
        };
        let days: HashSet<NaiveDate> = units.iter().filter_map(|u| u.date).collect();
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let word_budget = ((source_words as f32 * self.word_ratio).floor() as usize)
            .saturating_sub(days.len() + if header.is_some() { 3 } else { 0 });
        // Up to 8 topics, one per 5 words of budget, none below 3; their words come out of
        // the sentences' share.
        let n_topics = match (word_budget / 5).min(8) {
            n if n >= 3 => n,
            _ => 0,
        };
        let word_budget = word_budget.saturating_sub(n_topics + usize::from(n_topics > 0));
        // The header's tokens, and about three per topic, come out of the sentences' share.
        let header_tokens = header.as_deref().map_or(0, |h| self.counter.count(h) + 1)
            + if n_topics > 0 { 3 * n_topics + 3 } else { 0 };
        let budget = request
            .max_tokens
            .max(1)
            .saturating_sub(header_tokens)
            .max(1);
        let weights = weights(&units, request.term_stats.as_deref());
        let picked = self.select(&units, &vectors, &weights, budget, word_budget, rollup);
        let chosen: Vec<&Unit> = picked.iter().map(|i| &units[*i]).collect();
        let mut out = render(&chosen, header.clone());
        // A single unit longer than the budget is cut to it.
        if chosen.len() == 1 && self.counter.count(&out) > request.max_tokens.max(1) {
            let mut unit = chosen[0].clone();
            loop {
                let keep = unit.text.chars().count() * 9 / 10;
                unit.text = unit.text.chars().take(keep).collect();
                let mut cut = unit.clone();
                cut.text = format!("{}…", unit.text.trim_end());
                out = render(&[&cut], header.clone());
                if unit.text.is_empty() || self.counter.count(&out) <= request.max_tokens.max(1) {
                    break;
                }
            }
        }
        let mut topics = topics(
            &units,
            &weights,
            &picked,
            &pool,
            request.term_stats.as_deref(),
            n_topics,
        );
        while topics.len() >= 3 {
            let line = format!("{out}\n{TOPICS}{}", topics.join(", "));
            if self.counter.count(&line) <= request.max_tokens.max(1) {
                out = line;
                break;
            }
            topics.pop();
        }
        if out.trim().is_empty() {
            return Err(SummarizeError::EmptyOutput);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentence_split() {
        assert_eq!(
            sentences("Hi there. How are you?  Fine!\nNew line e.g. 3.5 works"),
            vec![
                "Hi there.",
                "How are you?",
                "Fine!",
                "New line e.g.",
                "3.5 works"
            ]
        );
        assert!(sentences("   ").is_empty());
    }

    /// Counts the texts it embeds.
    struct Counting(std::sync::atomic::AtomicUsize);

    impl Embedder for Counting {
        fn model_id(&self) -> &str {
            "counting"
        }
        fn dim(&self) -> usize {
            2
        }
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, cairn_core::EmbedError> {
            self.0
                .fetch_add(texts.len(), std::sync::atomic::Ordering::SeqCst);
            Ok(texts.iter().map(|t| vec![1.0, t.len() as f32]).collect())
        }
    }

    /// The memo embeds each sentence once (repeats in one call too, in their places),
    /// answers as the model does, empties when cleared and when full.
    #[test]
    fn the_sentence_memo_embeds_once_and_empties() {
        let model = Arc::new(Counting(0.into()));
        let memo = SentenceMemo::new(model.clone());
        let calls = || model.0.load(std::sync::atomic::Ordering::SeqCst);
        let v = memo.embed(&["ab", "abc", "ab"]).unwrap();
        assert_eq!(v, vec![vec![1.0, 2.0], vec![1.0, 3.0], vec![1.0, 2.0]]);
        assert_eq!(calls(), 2, "a repeat goes to the model once");
        assert_eq!(memo.len(), 2);
        assert_eq!(memo.embed(&["abc", "ab"]).unwrap()[0], vec![1.0, 3.0]);
        assert_eq!(calls(), 2, "both kept");
        memo.clear();
        assert_eq!(memo.len(), 0);
        memo.embed(&["ab"]).unwrap();
        assert_eq!(calls(), 3);
        let many: Vec<String> = (0..SENTENCE_MEMO + 10).map(|i| format!("s{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let v = memo.embed(&refs).unwrap();
        assert_eq!(v.len(), SENTENCE_MEMO + 10);
        assert_eq!(v[SENTENCE_MEMO + 9], vec![1.0, 5.0]);
        assert_eq!(
            memo.len(),
            SENTENCE_MEMO,
            "emptied, then filled up to the bound"
        );
    }

    /// Empties the memo it serves while it embeds (as a forget does from another thread).
    struct Clearing(std::sync::OnceLock<std::sync::Weak<SentenceMemo>>);

    impl Embedder for Clearing {
        fn model_id(&self) -> &str {
            "clearing"
        }
        fn dim(&self) -> usize {
            2
        }
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, cairn_core::EmbedError> {
            if let Some(m) = self.0.get().and_then(std::sync::Weak::upgrade) {
                m.clear();
            }
            Ok(texts.iter().map(|_| vec![1.0, 0.0]).collect())
        }
    }

    /// A vector embedded while the memo was emptied is returned but not kept.
    #[test]
    fn a_sentence_embedded_across_a_clear_is_not_kept() {
        let model = Arc::new(Clearing(std::sync::OnceLock::new()));
        let memo = Arc::new(SentenceMemo::new(model.clone()));
        model.0.set(Arc::downgrade(&memo)).unwrap();
        assert_eq!(memo.embed(&["gone"]).unwrap(), vec![vec![1.0, 0.0]]);
        assert_eq!(memo.len(), 0);
    }

    #[test]
    fn phatic_words_are_sorted() {
        assert!(PHATIC.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn lines_read_back() {
        assert_eq!(
            parse_line("[2023-05-08] Caroline: I went to a support group."),
            Some((
                NaiveDate::from_ymd_opt(2023, 5, 8),
                Some("Caroline".to_owned()),
                "I went to a support group.".to_owned()
            ))
        );
        assert_eq!(
            parse_line("Mel Lee: Painted a lake: sunrise."),
            Some((
                None,
                Some("Mel Lee".into()),
                "Painted a lake: sunrise.".into()
            ))
        );
        assert_eq!(
            parse_line("Well, so: it rained."),
            Some((None, None, "Well, so: it rained.".into()))
        );
        assert_eq!(parse_line("[2023-05-08 to 2023-06-01]"), None);
    }

    #[test]
    fn speaker_prefix_is_stripped_once() {
        assert_eq!(
            strip_speaker("Audrey: Hey Andrew!", "Audrey"),
            "Hey Andrew!"
        );
        assert_eq!(strip_speaker("Hey Andrew!", "Audrey"), "Hey Andrew!");
        assert_eq!(strip_speaker("Audreys: x", "Audrey"), "Audreys: x");
    }

    #[test]
    fn greetings_are_not_informative() {
        for s in [
            "Good to see ya!",
            "Have a good one!",
            ":)",
            "Take care!",
            "Thanks so much, that sounds great!",
        ] {
            assert!(!Unit::new(None, None, s.into(), 0).informative(), "{s}");
        }
        assert!(Unit::new(
            None,
            None,
            "I adopted a puppy named Biscuit in May.".into(),
            0
        )
        .informative());
    }

    #[test]
    fn keywords_rank_rare_named_things() {
        let mut stats = TermStats::new();
        for _ in 0..20 {
            stats.add_doc(["went", "today", "get", "dog", "hiking"].map(str::to_owned));
        }
        stats.add_doc(["tattoo".to_owned()]);
        let kw = summary_keywords(
            "[2023-05-08] Audrey: I went to get a dog tattoo today.\nAndrew: Went hiking at Mount Rainier today.",
            &stats,
            4,
        );
        assert!(kw.contains(&"tattoo".to_owned()), "{kw:?}");
        assert!(kw.contains(&"Rainier".to_owned()), "{kw:?}");
        assert!(!kw.iter().any(|k| k == "Audrey" || k == "2023"), "{kw:?}");
    }
}
