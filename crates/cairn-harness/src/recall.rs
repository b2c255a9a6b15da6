//! Ranking a thread's turns for a query, for context assembly.
//!
//! Every turn of the thread gets one score, in standard deviations of the thread's scores:
//! - its match: the vector similarity and the BM25 score, each in standard deviations of
//!   the thread's scores, then weighted (0.6 vector, 0.4 keyword by default). The vector
//!   score's mean and deviation are the whole thread's, estimated from the turns the search
//!   ranked when it did not reach them all, so a score means the same at any thread length;
//!   the keyword score is 0 for a turn that matches no word of the query and positive for
//!   every turn that matches one (a single turn holding a unique name or code stands far
//!   out);
//! - plus a share of its neighbours' match: half the better adjacent turn's, a quarter of the
//!   better turn two away, within one stretch of conversation (no gap over 12 hours). A
//!   question that matches the query lifts the answer after it, and the answer the
//!   question before it;
//! - plus a bonus when the query names the turn's speaker (exactly one of the thread's
//!   speakers), and another when the turn falls in a time range the query names ("in May
//!   2023", "on 8 May 2023", "in 2022", up to a week after);
//! - optionally (off by default), a share of its length (log of its characters,
//!   standardised over the thread).
//!
//! The query's vector is computed with the thread's speakers' names replaced by "someone"
//! (see `RecallWeights::names_out_of_vector`).
//!
//! Measured on LoCoMo (docs/evaluation.md): each part is on only while it raises evidence
//! recall there, and the weights are round values from flat optima, not fitted per question.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use chrono::{Duration, NaiveDate};
use serde::{Deserialize, Serialize};

use cairn_store::TimelineEntry;

/// How turns are scored for recall (see the module documentation). Fields left out of a
/// serialized value take their defaults; unknown fields are an error.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecallWeights {
    /// Weight of the standardised vector score; the keyword score gets the rest. Default 0.6.
    pub vector: f32,
    /// Share of the better adjacent turn's match a turn inherits (half of it from two turns
    /// away). Default 0.5.
    pub neighbor: f32,
    /// Weight of the standardised log length of a turn. Default 0: it helped on LoCoMo while
    /// speakers' names were in the query's vector (turns that answer questions are longer
    /// than the others there), and no longer does.
    pub length: f32,
    /// Bonus for turns of the one speaker the query names. Default 0.3.
    pub speaker: f32,
    /// Bonus for turns in the time range the query names. Default 0.6.
    pub time: f32,
    /// Bonus for turns under the thread's level-1 summaries that best match the query (the
    /// summary route: the top 3 of a hybrid search over them). Default 0.
    pub route: f32,
    /// Largest gap between two turns of one stretch of conversation. Default 12 hours.
    pub stretch_gap_secs: i64,
    /// Whether the query's vector is computed with the names of the thread's speakers
    /// replaced by "someone": a name pulls a small model's vector toward every turn of that
    /// speaker, whatever the turn says, and the speaker bonus scores who speaks instead.
    /// Default true.
    pub names_out_of_vector: bool,
    /// Whether the keyword search leaves the names of the thread's speakers out of the
    /// query: a name matches the turns whose text mentions the speaker (often the other
    /// speaker's, greeting them), not the turns they said, which the speaker bonus scores
    /// from the turn's speaker field whatever its text holds. Default true.
    pub names_out_of_keywords: bool,
}

impl Default for RecallWeights {
    fn default() -> Self {
        Self {
            vector: 0.6,
            neighbor: 0.5,
            length: 0.0,
            speaker: 0.3,
            time: 0.6,
            route: 0.0,
            stretch_gap_secs: 12 * 3600,
            names_out_of_vector: true,
            names_out_of_keywords: true,
        }
    }
}

/// Level-1 summaries whose turns get the route bonus.
pub(crate) const ROUTE_SUMMARIES: usize = 3;

/// Mean and (population) standard deviation of `values`; `None` when empty.
fn mean_sd(values: impl Iterator<Item = f64> + Clone) -> Option<(f64, f64)> {
    let (count, sum) = values
        .clone()
        .fold((0usize, 0.0), |(c, s), v| (c + 1, s + v));
    if count == 0 {
        return None;
    }
    #[allow(clippy::cast_precision_loss)]
    let n = count as f64;
    let mean = sum / n;
    let var = values.map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    Some((mean, var.sqrt()))
}

/// `(v - mean) / sd` for each of `values`; all zeros when `sd` is (about) 0.
#[allow(clippy::cast_possible_truncation)]
fn scale(values: &mut [f32], mean: f64, sd: f64) {
    for v in values.iter_mut() {
        *v = if sd > 1e-9 {
            ((f64::from(*v) - mean) / sd) as f32
        } else {
            0.0
        };
    }
}

/// Standardises `values` (mean 0, standard deviation 1); all zeros when they do not vary.
fn standardise(values: &mut [f32]) {
    if let Some((mean, sd)) = mean_sd(values.iter().map(|&v| f64::from(v))) {
        scale(values, mean, sd);
    }
}

/// The standard normal density.
fn normal_pdf(z: f64) -> f64 {
    (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// The standard normal quantile for `p` in (0, 1) (Acklam's rational approximation,
/// relative error under 1.2e-9).
fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    const LOW: f64 = 0.024_25;
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < LOW {
        tail((-2.0 * p.ln()).sqrt())
    } else if p <= 1.0 - LOW {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    }
}

/// The mean and standard deviation of all `total` scores of a thread, estimated from the
/// best `ranked` of them (the others, below them, unknown): the moments of a normal
/// distribution cut below its top `ranked / total` share, solved for the whole one. When
/// every score is ranked, their plain mean and standard deviation.
///
/// So a turn's standard score is the same whether its thread was ranked whole or only to
/// some depth: it does not depend on how many turns lie beyond the search depth (filling
/// them in with the lowest score found shrinks the deviation, and inflates the scores of
/// long threads by a factor that grows with their length).
fn thread_moments(ranked: &[f32], total: usize) -> Option<(f64, f64)> {
    let (mean, sd) = mean_sd(ranked.iter().map(|&v| f64::from(v)))?;
    if ranked.len() >= total {
        return Some((mean, sd));
    }
    #[allow(clippy::cast_precision_loss)]
    let p = ranked.len() as f64 / total as f64;
    // The cut, in the whole distribution's standard scores, and the inverse Mills ratio:
    // above the cut, the mean is mu + sigma * lambda and the variance
    // sigma^2 * (1 + cut * lambda - lambda^2).
    let cut = normal_quantile(1.0 - p);
    let lambda = normal_pdf(cut) / p;
    let shrink = (1.0 + cut * lambda - lambda * lambda).max(1e-6);
    let sigma = sd / shrink.sqrt();
    Some((mean - sigma * lambda, sigma))
}

/// How a thread's match scores are put on one scale (see the module documentation): the
/// vector similarity's mean and deviation over the whole thread, the similarity given to a
/// turn the vector search did not rank, and the keyword scores' deviation over the whole
/// thread (a turn that matches no word scores 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Scales {
    vector: Option<(f64, f64)>,
    floor: f32,
    keyword_sd: Option<f64>,
}

impl Scales {
    /// The scales of a thread of `total` turns whose vector search ranked `vector` and whose
    /// keyword search ranked `keyword` (all of them turns of the thread). Only the ranked
    /// turns are needed, so the scales cost the same at any thread length.
    pub(crate) fn new(vector: &[(u64, f32)], keyword: &[(u64, f32)], total: usize) -> Self {
        let ranked: Vec<f32> = vector.iter().map(|h| h.1).collect();
        let floor = ranked.iter().copied().reduce(f32::min).unwrap_or(0.0);
        let n = total.max(keyword.len());
        let keyword_sd = (n > 0).then(|| {
            let (sum, squares) = keyword.iter().fold((0.0f64, 0.0f64), |(s, q), h| {
                let x = f64::from(h.1.max(0.0));
                (s + x, q + x * x)
            });
            #[allow(clippy::cast_precision_loss)]
            let n = n as f64;
            let mean = sum / n;
            (squares / n - mean * mean).max(0.0).sqrt()
        });
        Self {
            vector: thread_moments(&ranked, total.max(ranked.len())),
            floor,
            keyword_sd,
        }
    }

    /// The match of a turn whose similarity is `v` (the floor when the vector search did not
    /// rank it) and whose BM25 score is `k` (0 when it matches no word), before neighbours
    /// and bonuses: what [`score_entries`] starts from.
    #[allow(clippy::cast_possible_truncation)]
    pub(crate) fn base(&self, v: Option<f32>, k: Option<f32>, w: &RecallWeights) -> f32 {
        let v = f64::from(v.unwrap_or(self.floor));
        let vz = match self.vector {
            Some((mean, sd)) if sd > 1e-9 => ((v - mean) / sd) as f32,
            _ => 0.0,
        };
        let k = f64::from(k.unwrap_or(0.0).max(0.0));
        let kz = match self.keyword_sd {
            Some(sd) if sd > 1e-9 => (k / sd) as f32,
            _ => 0.0,
        };
        w.vector * vz + (1.0 - w.vector) * kz
    }
}

/// What of a query the scores use besides its vector and keyword rankings: the one speaker
/// it names and the time range it names.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct QueryCues<'a> {
    /// The one speaker of the thread the query names.
    pub speaker: Option<&'a str>,
    /// The time range the query names, as [from, to) dates.
    pub range: Option<(NaiveDate, NaiveDate)>,
}

impl<'a> QueryCues<'a> {
    /// The cues of `query` among the thread's `speakers`.
    pub(crate) fn new(query: &str, speakers: impl IntoIterator<Item = &'a str>) -> Self {
        Self {
            speaker: named_speaker(speakers, query),
            range: time_range(query),
        }
    }
}

/// One score per timeline entry (same order) for a query whose vector search gave `vector`
/// and keyword search gave `keyword` (index id, score; best first; either may hold ids that
/// are not on the timeline, which are ignored): the whole thread's timeline, scored on its
/// own scales.
pub(crate) fn score_timeline(
    timeline: &[TimelineEntry],
    vector: &[(u64, f32)],
    keyword: &[(u64, f32)],
    routed: &HashSet<u64>,
    query: &str,
    w: &RecallWeights,
) -> Vec<f32> {
    let on: HashSet<u64> = timeline.iter().map(|e| e.vid).collect();
    let vector: Vec<(u64, f32)> = vector
        .iter()
        .copied()
        .filter(|h| on.contains(&h.0))
        .collect();
    let keyword: Vec<(u64, f32)> = keyword
        .iter()
        .copied()
        .filter(|h| on.contains(&h.0))
        .collect();
    let scales = Scales::new(&vector, &keyword, timeline.len());
    let cues = QueryCues::new(query, timeline.iter().filter_map(|e| e.speaker.as_deref()));
    score_entries(
        timeline,
        &vector.into_iter().collect(),
        &keyword.into_iter().collect(),
        &scales,
        routed,
        cues,
        w,
    )
}

/// One score per entry of `entries` (same order): a contiguous stretch of a thread's
/// timeline, oldest first, scored on the whole thread's `scales`. `vector` and `keyword` hold
/// the similarities and BM25 scores known (a turn without a similarity gets the scales'
/// floor, without a keyword score 0); neighbours are looked for within the stretch only.
pub(crate) fn score_entries(
    entries: &[TimelineEntry],
    vector: &HashMap<u64, f32>,
    keyword: &HashMap<u64, f32>,
    scales: &Scales,
    routed: &HashSet<u64>,
    cues: QueryCues<'_>,
    w: &RecallWeights,
) -> Vec<f32> {
    let n = entries.len();
    if n == 0 {
        return Vec::new();
    }
    let mut vs: Vec<f32> = entries
        .iter()
        .map(|e| vector.get(&e.vid).copied().unwrap_or(scales.floor))
        .collect();
    match scales.vector {
        Some((mean, sd)) => scale(&mut vs, mean, sd),
        None => vs.fill(0.0),
    }
    // Keyword: in standard deviations of the thread's BM25 scores, not shifted, so that
    // the turns that match nothing stay at 0: every match counts for something, and the
    // rarer the matches the more they count (one turn that holds a unique name or code
    // stands far out).
    let mut ks: Vec<f32> = entries
        .iter()
        .map(|e| keyword.get(&e.vid).copied().unwrap_or(0.0).max(0.0))
        .collect();
    if let Some(sd) = scales.keyword_sd {
        scale(&mut ks, 0.0, sd);
    }
    let base: Vec<f32> = vs
        .iter()
        .zip(&ks)
        .map(|(v, k)| w.vector * v + (1.0 - w.vector) * k)
        .collect();
    // Neighbours within one stretch of conversation.
    // (Options are validated before; a gap no time can hold links everything.)
    let gap = Duration::try_seconds(w.stretch_gap_secs).unwrap_or(Duration::MAX);
    let linked = |a: usize, b: usize| (entries[b].at - entries[a].at) <= gap;
    let prev = |i: usize| (i > 0 && linked(i - 1, i)).then(|| i - 1);
    let next = |i: usize| (i + 1 < n && linked(i, i + 1)).then_some(i + 1);
    let best = |a: Option<usize>, b: Option<usize>| {
        a.into_iter()
            .chain(b)
            .map(|j| base[j])
            .fold(None, |m: Option<f32>, x| Some(m.map_or(x, |m| m.max(x))))
    };
    let mut out: Vec<f32> = (0..n)
        .map(|i| {
            let (p1, n1) = (prev(i), next(i));
            let near = best(p1, n1).unwrap_or(0.0);
            let far = best(p1.and_then(prev), n1.and_then(next)).unwrap_or(0.0);
            base[i] + w.neighbor * near + w.neighbor / 2.0 * far
        })
        .collect();
    if w.length != 0.0 {
        #[allow(clippy::cast_precision_loss)]
        let mut len: Vec<f32> = entries
            .iter()
            .map(|e| ((e.chars + 1) as f32).ln())
            .collect();
        standardise(&mut len);
        for (s, l) in out.iter_mut().zip(len) {
            *s += w.length * l;
        }
    }
    if let Some(who) = cues.speaker {
        for (s, e) in out.iter_mut().zip(entries) {
            if e.speaker.as_deref() == Some(who) {
                *s += w.speaker;
            }
        }
    }
    if w.route != 0.0 {
        for (s, e) in out.iter_mut().zip(entries) {
            if routed.contains(&e.vid) {
                *s += w.route;
            }
        }
    }
    if let Some(range) = cues.range {
        let (from, to) = bonus_range(range);
        for (s, e) in out.iter_mut().zip(entries) {
            let d = e.at.date_naive();
            if from <= d && d < to {
                *s += w.time;
            }
        }
    }
    out
}

/// The dates a query's time range bonus covers: the range it names and a week after.
pub(crate) fn bonus_range(range: (NaiveDate, NaiveDate)) -> (NaiveDate, NaiveDate) {
    (range.0, range.1 + Duration::days(7))
}

/// The words of `text` (runs of letters and digits), lowercased, each with its byte range.
fn spanned_words(text: &str) -> Vec<(std::ops::Range<usize>, String)> {
    let mut words = Vec::new();
    let mut start = None;
    for (i, c) in text
        .char_indices()
        .chain(std::iter::once((text.len(), ' ')))
    {
        match (start, c.is_alphanumeric()) {
            (None, true) => start = Some(i),
            (Some(s), false) => {
                words.push((s..i, text[s..i].to_lowercase()));
                start = None;
            }
            _ => {}
        }
    }
    words
}

/// The words of `text` (runs of letters and digits), lowercased.
fn lower_words(text: &str) -> Vec<String> {
    spanned_words(text).into_iter().map(|(_, w)| w).collect()
}

/// The one speaker of `speakers` (repeats allowed) that `query` names (as a whole word or
/// words, any case); `None` when it names none or several.
fn named_speaker<'a>(speakers: impl IntoIterator<Item = &'a str>, query: &str) -> Option<&'a str> {
    let words = lower_words(query);
    let names: HashSet<&str> = speakers.into_iter().collect();
    let mut named = names.into_iter().filter(|name| {
        let parts = lower_words(name);
        !parts.is_empty() && words.windows(parts.len()).any(|w| w == parts.as_slice())
    });
    let first = named.next()?;
    named.next().is_none().then_some(first)
}

/// `query` as it is embedded for recall: every whole-word mention of one of `speakers` (any
/// case, the longest name first) replaced by "someone"; `query` itself when it names none.
///
/// A speaker's turns start with their name (`Speaker: text`) and a small embedding model
/// weighs names heavily, so a name in the query pulls its vector toward every turn of that
/// speaker, whatever the turn says. Who speaks is scored by the speaker bonus instead, and
/// the vector is left to say what the query is about. (Measured on LoCoMo dev:
/// docs/evaluation.md.)
pub(crate) fn vector_query<'q>(query: &'q str, speakers: &[String]) -> Cow<'q, str> {
    replace_names(query, speakers, "someone")
}

/// `query` as it is searched by keyword for recall: every whole-word mention of one of
/// `speakers` left out (see [`RecallWeights::names_out_of_keywords`]).
pub(crate) fn keyword_query<'q>(query: &'q str, speakers: &[String]) -> Cow<'q, str> {
    replace_names(query, speakers, " ")
}

/// `query` with every whole-word mention of one of `speakers` (any case, the longest name
/// first) replaced by `with`; `query` itself when it names none.
fn replace_names<'q>(query: &'q str, speakers: &[String], with: &str) -> Cow<'q, str> {
    let mut names: Vec<Vec<String>> = speakers
        .iter()
        .map(|n| lower_words(n))
        .filter(|p| !p.is_empty())
        .collect();
    if names.is_empty() {
        return Cow::Borrowed(query);
    }
    names.sort_by_key(|p| std::cmp::Reverse(p.len()));
    let words = spanned_words(query);
    let mut out = String::with_capacity(query.len());
    let mut copied = 0;
    let mut i = 0;
    while i < words.len() {
        let matched = names.iter().find(|p| {
            words.len() - i >= p.len()
                && words[i..i + p.len()]
                    .iter()
                    .zip(p.iter())
                    .all(|(w, n)| &w.1 == n)
        });
        if let Some(p) = matched {
            let (from, to) = (words[i].0.start, words[i + p.len() - 1].0.end);
            out.push_str(&query[copied..from]);
            out.push_str(with);
            copied = to;
            i += p.len();
        } else {
            i += 1;
        }
    }
    if copied == 0 {
        return Cow::Borrowed(query);
    }
    out.push_str(&query[copied..]);
    Cow::Owned(out)
}

const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

fn month(word: &str) -> Option<u32> {
    let w = word.to_lowercase();
    MONTHS
        .iter()
        .position(|m| *m == w || ((3..=4).contains(&w.len()) && m.starts_with(&w)))
        .and_then(|i| u32::try_from(i + 1).ok())
}

fn year(word: &str) -> Option<i32> {
    (word.len() == 4 && word.chars().all(|c| c.is_ascii_digit()))
        .then(|| word.parse().ok())
        .flatten()
        .filter(|y| (1900..=2199).contains(y))
}

fn day(word: &str) -> Option<u32> {
    let digits = word
        .strip_suffix("st")
        .or_else(|| word.strip_suffix("nd"))
        .or_else(|| word.strip_suffix("rd"))
        .or_else(|| word.strip_suffix("th"))
        .unwrap_or(word);
    (!digits.is_empty() && digits.len() <= 2 && digits.chars().all(|c| c.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
        .filter(|d| (1..=31).contains(d))
}

fn month_range(y: i32, m: u32) -> Option<(NaiveDate, NaiveDate)> {
    let from = NaiveDate::from_ymd_opt(y, m, 1)?;
    let to = if m == 12 {
        NaiveDate::from_ymd_opt(y + 1, 1, 1)?
    } else {
        NaiveDate::from_ymd_opt(y, m + 1, 1)?
    };
    Some((from, to))
}

/// The first absolute time range `text` names, as [from, to) dates: a day ("8 May 2023",
/// "May 8th, 2023", "2023-05-08"), a month ("May 2023", "2023-05") or a year ("2022").
/// Relative expressions ("last week") are not read.
pub(crate) fn time_range(text: &str) -> Option<(NaiveDate, NaiveDate)> {
    let words: Vec<&str> = text
        .split(|c: char| !(c.is_alphanumeric() || c == '-'))
        .filter(|w| !w.is_empty())
        .collect();
    for (i, w) in words.iter().enumerate() {
        // ISO dates.
        let parts: Vec<&str> = w.split('-').collect();
        if parts.len() >= 2 && parts.len() <= 3 {
            if let (Some(y), Ok(m)) = (year(parts[0]), parts[1].parse::<u32>()) {
                if parts.len() == 3 {
                    if let Some(d) = parts[2]
                        .parse::<u32>()
                        .ok()
                        .and_then(|d| NaiveDate::from_ymd_opt(y, m, d))
                    {
                        return Some((d, d + Duration::days(1)));
                    }
                } else if let Some(r) = month_range(y, m) {
                    return Some(r);
                }
            }
        }
        let Some(m) = month(w) else {
            continue;
        };
        // "8 May 2023" / "May 8, 2023" / "May 2023".
        let before = i
            .checked_sub(1)
            .and_then(|j| words.get(j))
            .and_then(|w| day(w));
        let after_day = words.get(i + 1).and_then(|w| day(w));
        let y_at = if after_day.is_some() { i + 2 } else { i + 1 };
        let Some(y) = words.get(y_at).and_then(|w| year(w)) else {
            continue;
        };
        if let Some(d) = after_day.or(before) {
            if let Some(date) = NaiveDate::from_ymd_opt(y, m, d) {
                return Some((date, date + Duration::days(1)));
            }
        }
        return month_range(y, m);
    }
    let y = words.iter().find_map(|w| year(w))?;
    Some((
        NaiveDate::from_ymd_opt(y, 1, 1)?,
        NaiveDate::from_ymd_opt(y + 1, 1, 1)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::DateTime;

    fn ymd(y: i32, m: u32, d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(y, m, d).unwrap()
    }

    #[test]
    fn time_expressions() {
        let day = |y, m, d| Some((ymd(y, m, d), ymd(y, m, d) + Duration::days(1)));
        assert_eq!(
            time_range("What did Joanna do on 8 May 2023?"),
            day(2023, 5, 8)
        );
        assert_eq!(
            time_range("What happened on May 8th, 2023?"),
            day(2023, 5, 8)
        );
        assert_eq!(time_range("and on 2023-05-08"), day(2023, 5, 8));
        assert_eq!(
            time_range("What did Joanna accomplish in January 2022?"),
            Some((ymd(2022, 1, 1), ymd(2022, 2, 1)))
        );
        assert_eq!(
            time_range("in Dec 2022"),
            Some((ymd(2022, 12, 1), ymd(2023, 1, 1)))
        );
        assert_eq!(
            time_range("the 2021-11 release"),
            Some((ymd(2021, 11, 1), ymd(2021, 12, 1)))
        );
        assert_eq!(
            time_range("Where did they travel in 2022?"),
            Some((ymd(2022, 1, 1), ymd(2023, 1, 1)))
        );
        // No absolute time: words that look like months or numbers alone are not dates.
        assert_eq!(time_range("May I ask what she painted?"), None);
        assert_eq!(time_range("What did she buy last week?"), None);
        assert_eq!(time_range("She ran 5 miles on 3 March"), None);
        assert_eq!(time_range("room 4812"), None);
        assert_eq!(
            time_range("30 February 2023"),
            Some((ymd(2023, 2, 1), ymd(2023, 3, 1)))
        );
    }

    fn entry(i: i64, vid: u64, speaker: &str) -> TimelineEntry {
        TimelineEntry {
            at: DateTime::from_timestamp(1_700_000_000 + i * 30, 0).unwrap(),
            vid,
            speaker: Some(speaker.to_owned()),
            chars: 40,
        }
    }

    #[test]
    fn speaker_names_are_left_out_of_the_vector_query() {
        let t = ["Ann Lee", "Bob", "Ann"].map(str::to_owned);
        // Whole words, any case, the longest name first, possessives kept.
        assert_eq!(
            vector_query("What did ann lee's brother and BOB cook?", &t),
            "What did someone's brother and someone cook?"
        );
        assert_eq!(vector_query("Ann: and Ann Lee", &t), "someone: and someone");
        // Not inside other words; other names stay.
        assert_eq!(
            vector_query("Did Annie meet Bobby?", &t),
            "Did Annie meet Bobby?"
        );
        assert!(matches!(vector_query("no names", &t), Cow::Borrowed(_)));
        // Non-ASCII text around a name keeps its characters.
        assert_eq!(
            vector_query("Était-ce Bob, café?", &t),
            "Était-ce someone, café?"
        );
        // A thread without speakers changes nothing.
        assert_eq!(vector_query("Bob?", &[]), "Bob?");
        // The keyword query leaves them out.
        assert_eq!(
            keyword_query("What did Ann Lee tell Bob?", &t),
            "What did   tell  ?"
        );
    }

    #[test]
    fn neighbours_lift_within_a_stretch_only() {
        // Turns 0-3 one stretch; turn 4 a day later.
        let mut t: Vec<TimelineEntry> = (0..4)
            .map(|i| entry(i, u64::try_from(i).unwrap(), "Ann"))
            .collect();
        let mut late = entry(3, 4, "Bob");
        late.at += Duration::days(1);
        t.push(late);
        let vector = vec![(1, 0.9), (0, 0.1), (2, 0.1), (3, 0.1), (4, 0.1)];
        let s = score_timeline(
            &t,
            &vector,
            &[],
            &HashSet::new(),
            "something",
            &RecallWeights::default(),
        );
        // Turn 1 matches; turns 0 and 2 inherit from it, turn 3 a quarter of it, turn 4 none.
        assert!(s[1] > s[0] && s[1] > s[2], "{s:?}");
        assert!(s[0] > s[3] && s[2] > s[3] && s[3] > s[4], "{s:?}");
        let plain = RecallWeights {
            neighbor: 0.0,
            ..RecallWeights::default()
        };
        let s = score_timeline(&t, &vector, &[], &HashSet::new(), "something", &plain);
        assert_eq!(s[0], s[4]);
    }

    #[test]
    fn speaker_and_time_bonuses() {
        let t: Vec<TimelineEntry> = (0..6)
            .map(|i| {
                let who = if i % 2 == 0 { "Ann Lee" } else { "Bob" };
                entry(i * 10_000, u64::try_from(i).unwrap(), who)
            })
            .collect();
        let flat: Vec<(u64, f32)> = (0..6).map(|i| (i, 0.5)).collect();
        let w = RecallWeights {
            neighbor: 0.0,
            ..RecallWeights::default()
        };
        let s = score_timeline(
            &t,
            &flat,
            &[],
            &HashSet::new(),
            "what does ann lee like?",
            &w,
        );
        assert!(s[0] > s[1] && s[2] > s[3], "{s:?}");
        // Both named: no bonus.
        let s = score_timeline(
            &t,
            &flat,
            &[],
            &HashSet::new(),
            "do Ann Lee and Bob agree?",
            &w,
        );
        assert!(s.iter().all(|x| *x == s[0]), "{s:?}");
        // A year the turns are not in: no bonus; their own: all of them.
        let s = score_timeline(&t, &flat, &[], &HashSet::new(), "in 1999", &w);
        assert!(s.iter().all(|x| *x == 0.0), "{s:?}");
        let s = score_timeline(&t, &flat, &[], &HashSet::new(), "in November 2023", &w);
        assert!(s.iter().all(|x| *x == w.time), "{s:?}");
    }

    #[test]
    fn routed_turns_get_the_route_bonus() {
        let t: Vec<TimelineEntry> = (0..4)
            .map(|i| entry(i * 100_000, u64::try_from(i).unwrap(), "A"))
            .collect();
        let flat = [(0, 0.5), (1, 0.5), (2, 0.5), (3, 0.5)];
        let routed: HashSet<u64> = [1, 3].into_iter().collect();
        let off = score_timeline(&t, &flat, &[], &routed, "x", &RecallWeights::default());
        assert!(off.iter().all(|x| *x == off[0]), "off by default: {off:?}");
        let w = RecallWeights {
            route: 0.5,
            neighbor: 0.0,
            ..RecallWeights::default()
        };
        let on = score_timeline(&t, &flat, &[], &routed, "x", &w);
        assert_eq!(on, vec![0.0, 0.5, 0.0, 0.5]);
    }

    #[test]
    fn every_keyword_match_counts_and_a_single_one_most() {
        let t: Vec<TimelineEntry> = (0..4)
            .map(|i| entry(i * 100_000, u64::try_from(i).unwrap(), "A"))
            .collect();
        let w = RecallWeights {
            neighbor: 0.0,
            ..RecallWeights::default()
        };
        // No vector scores: keyword decides; unknown ids are ignored. A weak match still
        // scores above the turns that match nothing.
        let s = score_timeline(
            &t,
            &[],
            &[(2, 9.0), (0, 3.0), (99, 50.0)],
            &HashSet::new(),
            "x",
            &w,
        );
        assert!(s[2] > s[0] && s[0] > s[1] && s[1] == s[3], "{s:?}");
        assert_eq!(s[1], 0.0, "{s:?}");
        // One turn alone matches (a unique name or code): it gets the most credit, and more
        // the longer the thread it stands out of.
        let credit = |n: usize| {
            let t = line(n);
            let s = score_timeline(&t, &[], &[(1, 4.0)], &HashSet::new(), "x", &w);
            assert!(
                s.iter().enumerate().all(|(i, x)| i == 1 || *x == 0.0),
                "{s:?}"
            );
            s[1]
        };
        assert!(credit(4) > 0.5, "{}", credit(4));
        assert!(credit(400) > credit(4));
    }

    /// `n` turns of one speaker, weeks apart (no two in one stretch, so neighbours add
    /// nothing), index ids 0..n.
    fn line(n: usize) -> Vec<TimelineEntry> {
        (0..n)
            .map(|i| {
                entry(
                    i64::try_from(i).unwrap() * 100_000,
                    u64::try_from(i).unwrap(),
                    "A",
                )
            })
            .collect()
    }

    /// A thread's similarities as a normal distribution would spread them (its quantiles,
    /// shuffled over the thread by a fixed stride), with one turn far above the rest.
    fn spread(n: usize, planted: f32) -> (Vec<TimelineEntry>, Vec<(u64, f32)>) {
        let t = line(n);
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
        let mut hits: Vec<(u64, f32)> = (0..n)
            .map(|r| {
                let q = normal_quantile((r as f64 + 0.5) / n as f64);
                let vid = u64::try_from((r * 7_919) % n).unwrap();
                (vid, (0.2 + 0.1 * q) as f32)
            })
            .collect();
        hits.iter_mut().find(|h| h.0 == 0).unwrap().1 = planted;
        hits.sort_by(|a, b| b.1.total_cmp(&a.1));
        (t, hits)
    }

    #[test]
    fn the_vector_scale_does_not_grow_with_the_turns_beyond_the_depth() {
        let w = RecallWeights {
            neighbor: 0.0,
            ..RecallWeights::default()
        };
        // Turn 0 is 5 deviations above the mean (0.2 + 5 * 0.1). A thread of 1,000 turns
        // ranked whole, and threads of 5,000 and 20,000 ranked 1,000 deep: the same
        // distribution, so the same standard score for it.
        let score = |n: usize, depth: usize| {
            let (t, mut hits) = spread(n, 0.7);
            hits.truncate(depth);
            let s = score_timeline(&t, &hits, &[], &HashSet::new(), "x", &w);
            s[0] / w.vector
        };
        let whole = score(1_000, 1_000);
        assert!((whole - 5.0).abs() < 0.1, "{whole}");
        for n in [5_000, 20_000] {
            let cut = score(n, 1_000);
            assert!(
                (cut - whole).abs() < 0.25,
                "{n} turns: {cut} against {whole}"
            );
            // And ranking the long thread whole gives about the same.
            let full = score(n, n);
            assert!((cut - full).abs() < 0.25, "{n} turns: {cut} against {full}");
        }
        // The turns beyond the depth stay below every ranked turn.
        let (t, mut hits) = spread(5_000, 0.7);
        hits.truncate(1_000);
        let s = score_timeline(&t, &hits, &[], &HashSet::new(), "x", &w);
        let ranked: HashSet<u64> = hits.iter().map(|h| h.0).collect();
        let lowest_ranked = t
            .iter()
            .zip(&s)
            .filter(|(e, _)| ranked.contains(&e.vid))
            .map(|(_, x)| *x)
            .fold(f32::INFINITY, f32::min);
        assert!(t
            .iter()
            .zip(&s)
            .all(|(e, x)| ranked.contains(&e.vid) || *x <= lowest_ranked));
    }

    #[test]
    fn normal_quantiles() {
        for (p, z) in [
            (0.5, 0.0),
            (0.975, 1.959_964),
            (0.01, -2.326_348),
            (0.8, 0.841_621),
        ] {
            assert!((normal_quantile(p) - z).abs() < 1e-5, "{p}");
        }
    }

    #[test]
    fn longer_turns_lead_among_equal_matches() {
        let mut t: Vec<TimelineEntry> = (0..3)
            .map(|i| entry(i * 100_000, u64::try_from(i).unwrap(), "A"))
            .collect();
        t[1].chars = 300;
        let flat: Vec<(u64, f32)> = (0..3).map(|i| (i, 0.5)).collect();
        let on = RecallWeights {
            length: 0.2,
            ..RecallWeights::default()
        };
        let s = score_timeline(&t, &flat, &[], &HashSet::new(), "x", &on);
        assert!(s[1] > s[0] && s[0] == s[2], "{s:?}");
        // Off by default.
        let s = score_timeline(
            &t,
            &flat,
            &[],
            &HashSet::new(),
            "x",
            &RecallWeights::default(),
        );
        assert!(s[1] == s[0], "{s:?}");
    }
}
