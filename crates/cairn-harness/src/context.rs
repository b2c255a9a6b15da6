//! Context assembly: what to send to a model for the next turn of a thread.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Datelike, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

use cairn_core::{MemoryId, MemoryKind, MemoryUnit, Metadata, Role, ThreadId, TokenCounter};
use cairn_store::{Filter, Hit, MemoryBackend, MetaFilter, StoreError, TimelineEntry};
use rustc_hash::FxHashMap;

use crate::harness::{blocking, fuse_ids, hybrid_ids, Inner};
use crate::recall::{
    bonus_range, keyword_query, score_entries, score_timeline, vector_query, QueryCues,
    RecallWeights, Scales, ROUTE_SUMMARIES,
};
use crate::{HarnessError, MemoryHarness, Result};

/// Why a piece is in the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Section {
    /// A summary of the thread's older turns.
    Summary,
    /// An older turn recalled for the query.
    Recalled,
    /// A memory beyond the thread recalled for the query: the thread's knowledge, or a
    /// memory of another thread in the caller's scope (see [`ContextScope`]).
    Related,
    /// One of the most recent turns, verbatim.
    Recent,
}

/// One piece of an assembled context, with its provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextItem {
    /// Memory id.
    pub id: MemoryId,
    /// Kind.
    pub kind: MemoryKind,
    /// Level (0 for turns).
    pub level: u32,
    /// Role, for turns.
    pub role: Option<Role>,
    /// Text (cut to fit only when the newest turn alone exceeds the budget).
    pub content: String,
    /// When it happened.
    pub created_at: DateTime<Utc>,
    /// The memory's metadata (imports keep theirs: a LoCoMo turn carries its `dia_id`).
    pub metadata: Metadata,
    /// For summaries: what they summarize (expand them by this item's id).
    pub source_ids: Vec<MemoryId>,
    /// For summaries: the time span of what they summarize (its earliest and latest turn,
    /// through every level).
    #[serde(default)]
    pub span: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// Its thread.
    #[serde(default)]
    pub thread_id: Option<ThreadId>,
    /// Why it is here.
    pub section: Section,
    /// Tokens it costs: a summary or recent turn, as its own message; a recalled turn, its
    /// line in the recalled block (plus the header line naming its days when it is the first
    /// line under it, plus the block's header and message overhead when it is the first).
    pub tokens: usize,
    /// For a recalled turn: the other turns of the thread in which the same speaker (same
    /// role and metadata `speaker`) said the same words, oldest first: on every other day
    /// they were said when the days fit in the budget, else on the days nearest the turn's
    /// own, and on each day named (the turn's own too) the earliest such turns, up to four
    /// a day with the turn itself (the words said twice in a day, a message re-sent). These
    /// are the copies the vector index holds of the text; a day the line gains afterwards,
    /// when another copy of its text comes up as a candidate, names that turn alone (on
    /// PostgreSQL, whose backend does not look copies up, every day is named so). The
    /// context shows the text once, under a header that names all these days (shared with
    /// the other texts said on the same days), so repeated texts do not crowd out the rest,
    /// and no day the context names is lost.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repeats: Vec<Repeat>,
}

impl ContextItem {
    /// The metadata of every turn the item names: its own, then its repeats'.
    pub fn named_metadata(&self) -> impl Iterator<Item = &Metadata> {
        std::iter::once(&self.metadata).chain(self.repeats.iter().map(|r| &r.metadata))
    }
}

/// Another turn with the same words as a recalled one, on another day or the same (see
/// [`ContextItem::repeats`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Repeat {
    /// Its memory id.
    pub id: MemoryId,
    /// When it was said.
    pub created_at: DateTime<Utc>,
    /// Its metadata.
    pub metadata: Metadata,
}

/// A chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Text.
    pub content: String,
}

/// The context for a thread and a query, within a token budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssembledContext {
    /// Summaries (oldest first), then related memories (best first), then recalled turns
    /// (in time order), then recent turns.
    pub items: Vec<ContextItem>,
    /// Tokens of [`Self::to_messages`], by the harness's counter (per-message overhead
    /// included); never over the budget unless the newest turn alone is.
    pub tokens: usize,
    /// The budget.
    pub budget: usize,
}

/// The first line of the message that holds the related memories.
const RELATED_HEADER: &str = "From other memory:\n";

/// A related memory as one line of the related block: its date, thread and kind first.
fn related_line(i: &ContextItem) -> String {
    let thread = i.thread_id.as_ref().map_or("no thread", |t| t.as_str());
    format!(
        "[{} {thread}, {}] {}",
        i.created_at.format("%Y-%m-%d"),
        i.kind.as_str(),
        recalled_line(&i.content)
    )
}

/// The first line of the message that holds the recalled turns.
const RECALLED_HEADER: &str = "Recalled from earlier in this conversation:\n";

/// Below this many tokens left, no recalled line fits (a line is at least its text and a
/// newline); recall stops there.
const MIN_LINE_TOKENS: usize = 2;

fn render_item(i: &ContextItem) -> String {
    let date = i.created_at.format("%Y-%m-%d %H:%M");
    match i.section {
        Section::Summary => match i.span {
            Some((from, to)) => format!(
                "[summary of earlier conversation, {} to {}]\n{}",
                from.format("%Y-%m-%d"),
                to.format("%Y-%m-%d"),
                i.content
            ),
            None => format!(
                "[summary of earlier conversation, up to {date}]\n{}",
                i.content
            ),
        },
        _ => format!("[{date}] {}", i.content),
    }
}

/// A recalled turn as one line of the recalled block (its days are a header line above).
fn recalled_line(content: &str) -> String {
    let mut line = one_line(content);
    line.push('\n');
    line
}

fn one_line(content: &str) -> String {
    content
        .chars()
        .map(|c| match c {
            '\n' | '\r' | '\u{0b}' | '\u{0c}' | '\u{85}' | '\u{2028}' | '\u{2029}' => ' ',
            c => c,
        })
        .collect()
}

/// The days a recalled item was said on (its own and its repeats'), oldest first, each
/// once.
fn item_days(i: &ContextItem) -> Vec<NaiveDate> {
    let mut days: Vec<NaiveDate> = std::iter::once(i.created_at)
        .chain(i.repeats.iter().map(|r| r.created_at))
        .map(|t| t.date_naive())
        .collect();
    days.sort_unstable();
    days.dedup();
    days
}

/// When a recalled item was first said (its own time or its first repeat's).
fn first_said(i: &ContextItem) -> DateTime<Utc> {
    i.repeats
        .iter()
        .map(|r| r.created_at)
        .fold(i.created_at, DateTime::min)
}

/// The recalled items (positions in `items`) grouped by the days they were said on, as the
/// block shows them: each group under one header line naming its days, the groups in the
/// order of their first turn, and each group's turns in the order they were first said. A
/// text said on one day is under that day's header, as every turn was before texts repeated;
/// texts said together on the same several days (a conversation held again, a daily
/// exchange) share one header that names those days once, instead of each naming them all.
fn day_groups(items: &[&ContextItem]) -> Vec<(Vec<NaiveDate>, Vec<usize>)> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&n| (first_said(items[n]), items[n].created_at));
    let mut groups: Vec<(Vec<NaiveDate>, Vec<usize>)> = Vec::new();
    let mut index: HashMap<Vec<NaiveDate>, usize> = HashMap::new();
    for n in order {
        let days = item_days(items[n]);
        match index.get(&days) {
            Some(&g) => groups[g].1.push(n),
            None => {
                index.insert(days.clone(), groups.len());
                groups.push((days, vec![n]));
            }
        }
    }
    groups
}

/// The header line over the recalled lines said on `days` (oldest first, at least one): the
/// day, `[2023-06-01]`, or, for lines said on several days, the first day in full and then
/// the others by month, `[2023-06-01; also on Jun 9,15, Jul 12; 2024: Jan 5,30]`: the days of
/// the first day's year without their year, those of each later year after it, and in each
/// month its name once. A text the thread holds on many days names them all, so each day
/// costs as little as it can while it reads plainly: two tokens in cl100k and o200k for a
/// day in a month already named (`,15`), four for a new month (`, Jul 12`), against eight
/// for `2023-06-01,`.
fn days_header(days: &[NaiveDate]) -> String {
    let Some((first, rest)) = days.split_first() else {
        return String::new();
    };
    if rest.is_empty() {
        return day_header(*first);
    }
    let mut line = also_head(*first);
    let mut group: Option<(i32, u32)> = None;
    for d in rest {
        let (y, m) = (d.year(), d.month());
        match group {
            Some((gy, gm)) if gy == y && gm == m => line.push(','),
            Some((gy, _)) if gy == y => {
                line.push(',');
                line.push_str(month_piece(m));
            }
            _ => {
                if group.is_some() {
                    line.push(';');
                }
                if y != first.year() {
                    line.push_str(&year_piece(y));
                }
                line.push_str(month_piece(m));
            }
        }
        line.push_str(&day_piece(*d));
        group = Some((y, m));
    }
    line.push_str(ALSO_END);
    line
}

/// The start of a header of several days, up to the first of the others.
fn also_head(first: NaiveDate) -> String {
    format!("[{}; also on", first.format("%Y-%m-%d"))
}

/// What closes a header of several days, with the line.
const ALSO_END: &str = "]\n";

/// The year that heads the other days of a later year than the first day's, with the space
/// before it.
fn year_piece(year: i32) -> String {
    format!(" {year}:")
}

/// A month (1-12) that heads its other days in a header, with the spaces around it (a
/// comma goes before all but its year's first).
fn month_piece(month: u32) -> &'static str {
    const MONTHS: [&str; 12] = [
        " Jan ", " Feb ", " Mar ", " Apr ", " May ", " Jun ", " Jul ", " Aug ", " Sep ", " Oct ",
        " Nov ", " Dec ",
    ];
    MONTHS[(month.clamp(1, 12) - 1) as usize]
}

/// An other day in a header: its day of the month (after its month, or a comma).
fn day_piece(d: NaiveDate) -> String {
    d.day().to_string()
}

/// The tokens of the pieces of headers that name days ([`day_header`], [`also_head`],
/// [`day_piece`], [`month_piece`], [`year_piece`]), each counted once per call: one call
/// folds the same few dozen days into many lines (a text said on 70 days names them all),
/// and a date formatted and tokenized again for each costs more than the rest of the
/// line's packing.
struct DayTokens<'a> {
    counter: &'a dyn TokenCounter,
    /// Per day: its header alone, and [`also_head`].
    firsts: FxHashMap<NaiveDate, (usize, usize)>,
    /// Per day of the month (1-31) and per month (1-12).
    days: [Option<usize>; 31],
    months: [Option<usize>; 12],
    years: FxHashMap<i32, usize>,
}

impl<'a> DayTokens<'a> {
    fn new(counter: &'a dyn TokenCounter) -> Self {
        Self {
            counter,
            firsts: FxHashMap::default(),
            days: [None; 31],
            months: [None; 12],
            years: FxHashMap::default(),
        }
    }

    /// The tokens of `day`'s header alone and of its [`also_head`].
    fn first(&mut self, day: NaiveDate) -> (usize, usize) {
        let c = self.counter;
        *self
            .firsts
            .entry(day)
            .or_insert_with(|| (c.count(&day_header(day)), c.count(&also_head(day))))
    }

    /// The tokens of `day`'s [`day_piece`].
    fn day(&mut self, day: NaiveDate) -> usize {
        let c = self.counter;
        let slot = &mut self.days[(day.day0() as usize).min(30)];
        *slot.get_or_insert_with(|| c.count(&day_piece(day)))
    }

    /// The tokens of `month`'s (1-12) [`month_piece`].
    fn month(&mut self, month: u32) -> usize {
        let c = self.counter;
        let slot = &mut self.months[(month.clamp(1, 12) - 1) as usize];
        *slot.get_or_insert_with(|| c.count(month_piece(month)))
    }

    /// The tokens of `year`'s [`year_piece`].
    fn year(&mut self, year: i32) -> usize {
        let c = self.counter;
        *self
            .years
            .entry(year)
            .or_insert_with(|| c.count(&year_piece(year)))
    }
}

/// The tokens of the pieces every header of several days has (see [`DaysCount`]).
struct HeaderPieces {
    comma: usize,
    semicolon: usize,
    end: usize,
}

impl HeaderPieces {
    fn new(counter: &dyn TokenCounter) -> Self {
        Self {
            comma: counter.count(","),
            semicolon: counter.count(";"),
            end: counter.count(ALSO_END),
        }
    }
}

/// Tokens of [`days_header`], counted in pieces and kept up to date as days are added: for
/// one day its header; for several, the head with the first day ([`also_head`]), each
/// later year of the others with its space and colon, each month of the others with its
/// spaces, each other day of the month, each comma and semicolon, [`ALSO_END`]. The
/// pre-tokenizers of cl100k and o200k never join two of these pieces (a month's name is a
/// word of its own after a space, its last space stands alone before a digit, a day's
/// digits stand alone between punctuation or spaces, the rest is punctuation after a
/// letter or a digit followed by a space, and the end is punctuation after a digit), so the
/// sum is the header's count (`day_headers_count_in_pieces`), and a day added costs its own
/// pieces, not the header tokenized again (a text said on 70 days is folded 70 times); for
/// other counters the context is counted again whole at the end.
#[derive(Debug, Clone)]
struct DaysCount {
    /// The first day, and the tokens of its header alone and of [`also_head`].
    first: NaiveDate,
    single: usize,
    head: usize,
    /// The other days (each once, none before the first), and their days' tokens.
    others: usize,
    days: usize,
    /// The years of the other days: each with its piece's tokens (paid by those other than
    /// the first day's).
    years: Vec<(i32, usize)>,
    /// The months (year, month) of the other days: each with its piece's tokens.
    months: Vec<((i32, u32), usize)>,
}

impl DaysCount {
    /// The header of `day` alone.
    fn new(tokens: &mut DayTokens<'_>, day: NaiveDate) -> Self {
        let (single, head) = tokens.first(day);
        Self {
            first: day,
            single,
            head,
            others: 0,
            days: 0,
            years: Vec::new(),
            months: Vec::new(),
        }
    }

    /// The header of `days` (each once).
    fn of(tokens: &mut DayTokens<'_>, days: &[NaiveDate]) -> Option<Self> {
        let (first, rest) = days.split_first()?;
        let mut count = Self::new(tokens, *first);
        for d in rest {
            count.add(tokens, *d);
        }
        Some(count)
    }

    /// Adds `day`, one not in the header yet.
    fn add(&mut self, tokens: &mut DayTokens<'_>, day: NaiveDate) {
        let other = if day < self.first {
            let was = self.first;
            *self = Self {
                others: self.others,
                days: self.days,
                years: std::mem::take(&mut self.years),
                months: std::mem::take(&mut self.months),
                ..Self::new(tokens, day)
            };
            was
        } else {
            day
        };
        self.others += 1;
        self.days += tokens.day(other);
        let (y, m) = (other.year(), other.month());
        if !self.years.iter().any(|(year, _)| *year == y) {
            self.years.push((y, tokens.year(y)));
        }
        if !self.months.iter().any(|(month, _)| *month == (y, m)) {
            self.months.push(((y, m), tokens.month(m)));
        }
    }

    /// The header's tokens.
    fn tokens(&self, pieces: &HeaderPieces) -> usize {
        if self.others == 0 {
            return self.single;
        }
        // The other days are in date order, so each year is one group, and each month one
        // run in it.
        let groups = self.years.len();
        let first_year = self.first.year();
        self.head
            + self
                .years
                .iter()
                .filter(|(y, _)| *y != first_year)
                .map(|(_, t)| t)
                .sum::<usize>()
            + self.months.iter().map(|(_, t)| t).sum::<usize>()
            + self.days
            + pieces.comma * self.others.saturating_sub(groups)
            + pieces.semicolon * groups.saturating_sub(1)
            + pieces.end
    }
}

fn day_header(day: chrono::NaiveDate) -> String {
    format!("[{}]\n", day.format("%Y-%m-%d"))
}

/// The token cost of turns added one by one to the recalled block that
/// [`AssembledContext::to_messages`] renders, for turns without repeats: a turn pays for
/// its line, for its day's header line when it is the first turn of that day, and for the
/// block's header (with the message overhead) when it is the first turn of all. For
/// evaluations that pack turns without repeats (`cairn eval`'s grouped strategies);
/// `assemble_context` counts headers of several days too.
pub struct RecalledBlockCost<'a> {
    counter: &'a dyn TokenCounter,
    days: HashSet<chrono::NaiveDate>,
    started: bool,
}

impl<'a> RecalledBlockCost<'a> {
    /// An empty block.
    pub fn new(counter: &'a dyn TokenCounter) -> Self {
        Self {
            counter,
            days: HashSet::new(),
            started: false,
        }
    }

    /// Tokens a turn of `content` at `at` would add.
    pub fn cost(&self, content: &str, at: DateTime<Utc>) -> usize {
        self.line_cost(&recalled_line(content), at)
    }

    fn line_cost(&self, line: &str, at: DateTime<Utc>) -> usize {
        self.counter.count(line) + self.headers_cost(at)
    }

    /// The header lines a turn at `at` would add.
    fn headers_cost(&self, at: DateTime<Utc>) -> usize {
        let day = at.date_naive();
        let mut tokens = 0;
        if !self.days.contains(&day) {
            tokens += self.counter.count(&day_header(day));
        }
        if !self.started {
            tokens += self.counter.count_message(RECALLED_HEADER);
        }
        tokens
    }

    /// Records a turn at `at` as added.
    pub fn add(&mut self, at: DateTime<Utc>) {
        self.days.insert(at.date_naive());
        self.started = true;
    }
}

/// The recalled turns as one block: a header, then the turns grouped under a line that
/// names the days they were said on (see [`day_groups`]). Every line ends in a newline, so
/// for counters that split at newlines the block's count is the sum of its lines' counts.
fn recalled_block(items: &[&ContextItem]) -> Option<String> {
    let mut out = String::new();
    for (days, members) in day_groups(items) {
        if out.is_empty() {
            out.push_str(RECALLED_HEADER);
        }
        out.push_str(&days_header(&days));
        for n in members {
            out.push_str(&recalled_line(&items[n].content));
        }
    }
    (!out.is_empty()).then_some(out)
}

impl AssembledContext {
    /// As chat messages: each summary as a system message, the recalled turns together as
    /// one system message (grouped by the days they were said on), and the recent turns
    /// with their roles.
    pub fn to_messages(&self) -> Vec<ChatMessage> {
        let recalled: Vec<&ContextItem> = self
            .items
            .iter()
            .filter(|i| i.section == Section::Recalled)
            .collect();
        let block = recalled_block(&recalled);
        let related: String = self
            .items
            .iter()
            .filter(|i| i.section == Section::Related)
            .map(related_line)
            .collect();
        let mut related = (!related.is_empty()).then(|| ChatMessage {
            role: "system".to_owned(),
            content: format!("{RELATED_HEADER}{related}"),
        });
        // The block goes where the first recalled turn is.
        let mut block = block.map(|content| ChatMessage {
            role: "system".to_owned(),
            content,
        });
        let mut out = Vec::new();
        for i in &self.items {
            match (i.section, i.role) {
                (Section::Recalled, _) => out.extend(block.take()),
                (Section::Related, _) => out.extend(related.take()),
                (Section::Recent, Some(r)) => out.push(ChatMessage {
                    role: r.as_str().to_owned(),
                    content: render_item(i),
                }),
                _ => out.push(ChatMessage {
                    role: "system".to_owned(),
                    content: render_item(i),
                }),
            }
        }
        out
    }

    /// As one string, one message per paragraph.
    pub fn render(&self) -> String {
        self.to_messages()
            .into_iter()
            .map(|m| m.content)
            .collect::<Vec<_>>()
            .join("\n\n")
    }
}

/// How the budget is shared, and how turns are ranked for recall. Shares are of the budget;
/// what one part leaves unused goes to recall. Fields left out of a serialized value take
/// their defaults; unknown fields are an error.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContextOptions {
    /// For the most recent turns. Default 0.1.
    pub recent_share: f64,
    /// For the thread's top summaries. Default 0.05.
    pub summary_share: f64,
    /// Candidates from each search (vector and keyword); a thread with fewer turns has all
    /// of them scored. Default 1,000.
    pub recall_depth: usize,
    /// How recalled turns are scored (see [`RecallWeights`]).
    pub weights: RecallWeights,
    /// Threads with more turns than this are recalled through their summaries instead of
    /// scoring every turn: the turns under the summaries that best match the query, the
    /// turns around the best vector and keyword matches, the turns of a time range the query
    /// names, and the turns no summary covers yet are scored, and nothing else is read (see
    /// [`MemoryHarness::assemble_context`]). Default 5,000.
    pub bounded_above: usize,
    /// Whether the thread's `knowledge` memories are recalled too (section
    /// [`Section::Related`]). Default false.
    pub knowledge: bool,
    /// For memories beyond the thread (its knowledge, the caller's scope): at most this
    /// share of the budget; what they leave goes to recall. Default 0.15.
    pub related_share: f64,
    /// Recency decay of recall, in seconds: a recalled turn's score is halved for every
    /// half-life it is older than the newest candidate. Off (`None`) by default; LoCoMo's figures are without it
    /// (docs/evaluation.md has them with it too).
    pub half_life_secs: Option<f64>,
}

impl ContextOptions {
    /// Checks the options: shares in `[0, 1]`, finite weights, a stretch gap of at least 0
    /// that a time can hold.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(HarnessError::Config(m));
        for (name, v) in [
            ("recent_share", self.recent_share),
            ("summary_share", self.summary_share),
            ("related_share", self.related_share),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return bad(format!("{name} must be in [0, 1], not {v}"));
            }
        }
        if let Some(h) = self.half_life_secs {
            // At most a million years: far beyond any store, and within a `Duration`.
            if !(h.is_finite() && h > 0.0 && h <= 3.2e13) {
                return bad(format!(
                    "half_life_secs must be a positive number of seconds up to 3.2e13, not {h}"
                ));
            }
        }
        let w = &self.weights;
        for (name, v) in [
            ("vector", w.vector),
            ("neighbor", w.neighbor),
            ("length", w.length),
            ("speaker", w.speaker),
            ("time", w.time),
            ("route", w.route),
        ] {
            if !v.is_finite() {
                return bad(format!("weights.{name} must be a finite number, not {v}"));
            }
        }
        // chrono's durations span about ±292 billion years in milliseconds; a stretch gap
        // needs no more than a century.
        if !(0..=100 * 366 * 86_400).contains(&w.stretch_gap_secs) {
            return bad(format!(
                "weights.stretch_gap_secs must be between 0 and 100 years, not {}",
                w.stretch_gap_secs
            ));
        }
        Ok(())
    }
}

impl Default for ContextOptions {
    fn default() -> Self {
        Self {
            recent_share: 0.1,
            summary_share: 0.05,
            recall_depth: 1_000,
            weights: RecallWeights::default(),
            bounded_above: 5_000,
            knowledge: false,
            related_share: 0.15,
            half_life_secs: None,
        }
    }
}

/// Memory beyond the thread that a context recalls from, besides the thread's own knowledge
/// (see [`ContextOptions::knowledge`]): other threads, such as the same user's other
/// conversations. Their turns and knowledge are searched for the query (vector and
/// keyword), and the best go into [`Section::Related`], each with its thread and kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContextScope {
    /// Other threads to recall from.
    pub threads: Vec<ThreadId>,
    /// Memories of any thread (or none) whose metadata meets all of these conditions, such
    /// as everything of one user (`MetaFilter::eq("user_id", "alice")`): their turns,
    /// tool logs and knowledge. The thread's own turns are recalled as usual, not here.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metadata: Vec<MetaFilter>,
}

impl ContextScope {
    /// A scope of other threads.
    pub fn threads<I, S>(ids: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let threads = ids
            .into_iter()
            .map(|t| ThreadId::new(t.as_ref()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Self {
            threads,
            metadata: Vec::new(),
        })
    }

    /// A scope of the memories whose metadata meets `condition` (a user id, say).
    pub fn metadata(condition: MetaFilter) -> Self {
        Self {
            threads: Vec::new(),
            metadata: vec![condition],
        }
    }

    /// True when it names nothing.
    pub fn is_empty(&self) -> bool {
        self.threads.is_empty() && self.metadata.is_empty()
    }
}

/// Related candidates from each source (the thread's knowledge, each scope thread), per
/// ranking.
const RELATED_DEPTH: usize = 20;

/// The memories beyond `thread` most related to the query (its knowledge when asked, the
/// scope's threads), best first: each source searched by vector and keyword, the rankings
/// fused.
fn related_ranking(
    inner: &Inner,
    thread: &ThreadId,
    keyword_text: &str,
    qv: &[f32],
    options: &ContextOptions,
    scope: &ContextScope,
) -> Result<Vec<(u64, f32)>> {
    let mut sources: Vec<Filter> = Vec::new();
    if options.knowledge {
        sources.push(
            Filter::all()
                .thread(thread.clone())
                .kinds([MemoryKind::Knowledge]),
        );
    }
    for t in scope.threads.iter().filter(|t| *t != thread) {
        sources.push(
            Filter::all()
                .thread(t.clone())
                .kinds([
                    MemoryKind::Conversational,
                    MemoryKind::ToolLog,
                    MemoryKind::Knowledge,
                ])
                .levels(0, 0),
        );
    }
    if !scope.metadata.is_empty() {
        let mut f = Filter::all()
            .kinds([
                MemoryKind::Conversational,
                MemoryKind::ToolLog,
                MemoryKind::Knowledge,
            ])
            .levels(0, 0);
        f.metadata.clone_from(&scope.metadata);
        sources.push(f);
    }
    let mut lists = Vec::new();
    for f in &sources {
        lists.push(
            inner
                .store
                .search_vector_ids(qv.to_vec(), RELATED_DEPTH, f, None)?,
        );
        lists.push(inner.store.search_keyword_ids_capped(
            keyword_text,
            RELATED_DEPTH,
            f,
            KEYWORD_MAX_MATCHES,
        )?);
    }
    Ok(fuse_ids(&lists, RELATED_DEPTH))
}

/// Whether a context leaves `m` out: expired, or superseded, at `now`.
fn hidden(m: &MemoryUnit, now: DateTime<Utc>) -> bool {
    let l = &m.lifetime;
    l.expires_at.is_some_and(|t| t <= now) || l.valid_to.is_some_and(|t| t <= now)
}

/// Recalled candidates read per statement, best first.
const READ_CHUNK: usize = 32;
/// At most this many candidates are tried for the recalled block.
const MAX_TRIED: usize = 320;

/// A context item made of `m`, its token count left at 0.
fn owned_item(m: MemoryUnit, section: Section) -> ContextItem {
    let span = m
        .summary
        .as_ref()
        .map(|s| (s.time_range_start, s.time_range_end));
    ContextItem {
        id: m.id,
        kind: m.kind,
        level: m.level,
        role: m.role,
        content: m.content,
        created_at: m.created_at,
        metadata: m.metadata,
        source_ids: m.summary.map(|s| s.source_ids).unwrap_or_default(),
        span,
        thread_id: m.thread_id,
        section,
        tokens: 0,
        repeats: Vec::new(),
    }
}

/// Whether `text` surely costs more than `room` tokens, told from a prefix of it (about
/// eight bytes per token of room) when it is much longer than that: a long summary is not
/// tokenized whole to find that it does not fit. A prefix never counts more than one token
/// over the whole text (the cut may split one token in two).
fn too_long(text: &str, room: usize, counter: &dyn TokenCounter) -> bool {
    let probe = room.saturating_mul(8).saturating_add(64);
    if text.len() <= probe {
        return false;
    }
    let mut cut = probe;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    counter.count(&text[..cut]) > room.saturating_add(1)
}

/// A context item for `m` as its own message, with its token count.
fn item(m: MemoryUnit, section: Section, counter: &dyn TokenCounter) -> ContextItem {
    let mut i = owned_item(m, section);
    i.tokens = counter.count_message(&render_item(&i));
    i
}

#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]
fn share(budget: usize, s: f64) -> usize {
    (budget as f64 * s.clamp(0.0, 1.0)) as usize
}

/// The query's embedding, being computed on another thread.
type PendingVector<'s> = std::thread::ScopedJoinHandle<'s, Result<Vec<f32>>>;

fn join_vector(pending: PendingVector<'_>) -> Result<Vec<f32>> {
    joined(pending, "the query embedding")?
}

/// Runs `f` on a thread of scope `s` named `name`; `what` names its work in the error when
/// no thread can be started.
fn spawn_named<'s, T: Send + 's>(
    s: &'s std::thread::Scope<'s, '_>,
    name: &str,
    what: &str,
    f: impl FnOnce() -> T + Send + 's,
) -> Result<std::thread::ScopedJoinHandle<'s, T>> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn_scoped(s, f)
        .map_err(|e| HarnessError::Task(format!("no thread for {what}: {e}")))
}

/// Waits for a thread of [`spawn_named`]: its panic is an error naming `what`, not
/// re-raised.
fn joined<T>(handle: std::thread::ScopedJoinHandle<'_, T>, what: &str) -> Result<T> {
    handle
        .join()
        .map_err(|_| HarnessError::Task(format!("{what} panicked")))
}

/// What [`read_ranked`]'s reader does, for its errors.
const READING_RECALLED: &str = "reading the recalled turns";

/// What [`reading_copies`]' reader does, for its errors.
const READING_REPEATS: &str = "reading the recalled turns' copies";

/// Reads the rows of the ranked turns `order` (best first) in chunks and hands them to
/// `take` with their index ids, in that order, until it returns false; rows whose memory
/// is gone are skipped. With more than one chunk, the next chunk's rows are read on another
/// thread while `take` looks at the last one's (it counts their tokens: about as long as
/// reading them).
fn read_ranked(
    inner: &Inner,
    order: &[(u64, f32)],
    mut take: impl FnMut(Hit, u64) -> bool,
) -> Result<()> {
    if order.len() <= READ_CHUNK {
        for (hit, vid) in read_chunk(inner, order)? {
            if !take(hit, vid) {
                break;
            }
        }
        return Ok(());
    }
    std::thread::scope(|s| {
        // One chunk waits while the next is read: the reader stays at most two ahead.
        let (send, rows) = std::sync::mpsc::sync_channel::<Result<Vec<(Hit, u64)>>>(1);
        let reader = spawn_named(s, "cairn-read-recalled", READING_RECALLED, move || {
            for chunk in order.chunks(READ_CHUNK) {
                let hits = read_chunk(inner, chunk);
                let failed = hits.is_err();
                // A closed channel: `take` has had enough.
                if send.send(hits).is_err() || failed {
                    return;
                }
            }
        })?;
        let taken = (|| -> Result<()> {
            for hits in rows {
                for (hit, vid) in hits? {
                    if !take(hit, vid) {
                        return Ok(());
                    }
                }
            }
            Ok(())
        })();
        // (`rows` is dropped here: a reader waiting to send stops.)
        let read = joined(reader, READING_RECALLED);
        taken?;
        read
    })
}

/// The rows of `chunk` (ranked turns), each with its index id and score; rows whose memory
/// is gone are skipped.
fn read_chunk(inner: &Inner, chunk: &[(u64, f32)]) -> Result<Vec<(Hit, u64)>> {
    // `hits` hands back the score it is given: each row's position in the chunk, exact in
    // an f32 below 2^24 (a chunk of recalled turns or of their copies is far smaller),
    // tells which id it is.
    #[allow(clippy::cast_precision_loss)]
    let at: Vec<(u64, f32)> = chunk
        .iter()
        .enumerate()
        .map(|(i, (v, _))| (*v, i as f32))
        .collect();
    Ok(inner
        .store
        .hits(at)?
        .into_iter()
        .filter_map(|mut h| {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let (vid, score) = *chunk.get(h.score as usize)?;
            h.score = score;
            Some((h, vid))
        })
        .collect())
}

fn turns_filter(thread: &ThreadId) -> Filter {
    Filter::all()
        .thread(thread.clone())
        .kinds([MemoryKind::Conversational, MemoryKind::ToolLog])
}

/// The texts searched for `query` in `thread`: by vector and by keyword (see
/// [`RecallWeights::names_out_of_vector`] and [`RecallWeights::names_out_of_keywords`]).
fn search_texts<'q>(
    inner: &Inner,
    thread: &ThreadId,
    query: &'q str,
    options: &ContextOptions,
) -> Result<(Cow<'q, str>, Cow<'q, str>)> {
    let w = &options.weights;
    if !(w.names_out_of_vector || w.names_out_of_keywords) {
        return Ok((Cow::Borrowed(query), Cow::Borrowed(query)));
    }
    let speakers = inner.store.thread_speakers(thread)?;
    let vector = if w.names_out_of_vector {
        vector_query(query, &speakers)
    } else {
        Cow::Borrowed(query)
    };
    let keyword = if w.names_out_of_keywords {
        keyword_query(query, &speakers)
    } else {
        Cow::Borrowed(query)
    };
    Ok((vector, keyword))
}

pub(crate) fn assemble_blocking(
    inner: &Inner,
    thread: &ThreadId,
    query: &str,
    budget: usize,
    options: &ContextOptions,
    scope: &ContextScope,
) -> Result<AssembledContext> {
    if query.trim().is_empty() {
        return assemble_with(
            inner, thread, query, query, budget, options, scope, &mut None,
        );
    }
    // The thread's speakers (an index seek each) first: the query's vector and keyword
    // search leave their names out. Then the model embeds it while the thread's recent
    // turns, summaries, timeline and keyword matches are read here: none of them needs the
    // vector.
    let (vector_text, keyword_text) = search_texts(inner, thread, query, options)?;
    std::thread::scope(|s| {
        let mut pending = Some(spawn_named(
            s,
            "cairn-embed-query",
            "the query embedding",
            || inner.embedder.embed_one(&vector_text).map_err(Into::into),
        )?);
        let out = assemble_with(
            inner,
            thread,
            query,
            &keyword_text,
            budget,
            options,
            scope,
            &mut pending,
        );
        // Not needed after all (no budget left for recall, or an error): still joined here,
        // so a panic there is not re-raised by the scope.
        if let Some(p) = pending.take() {
            let _unused = p.join();
        }
        out
    })
}

/// Assembles the context; `keyword_text` is what the keyword search looks for, `pending`
/// the query's vector being computed.
#[allow(clippy::too_many_arguments)]
fn assemble_with(
    inner: &Inner,
    thread: &ThreadId,
    query: &str,
    keyword_text: &str,
    budget: usize,
    options: &ContextOptions,
    scope: &ContextScope,
    pending: &mut Option<PendingVector<'_>>,
) -> Result<AssembledContext> {
    let counter = inner.token_counter.as_ref();
    let turns_filter = turns_filter(thread);
    let mut used = 0usize;

    // 1. Recent turns, newest first, within their share; the newest always.
    let recent_pool = inner.store.recent(&turns_filter, 64)?;
    let mut recent: Vec<ContextItem> = Vec::new();
    let recent_cap = share(budget, options.recent_share);
    for m in recent_pool.into_iter().rev() {
        let mut it = item(m, Section::Recent, counter);
        if recent.is_empty() && it.tokens > budget {
            // The newest turn alone is over the budget: cut it to fit.
            let mut text = it.content.clone();
            while !text.is_empty() && {
                it.content = format!("{}…", text.trim_end());
                it.tokens = counter.count_message(&render_item(&it));
                it.tokens > budget
            } {
                let keep = text.chars().count() * 9 / 10;
                text = text.chars().take(keep).collect();
            }
            if it.tokens > budget {
                break;
            }
        } else if !recent.is_empty() && used + it.tokens > recent_cap {
            break;
        }
        used += it.tokens;
        recent.push(it);
    }
    recent.reverse();
    // Recall looks at turns up to the oldest recent one's time (turns may share a time:
    // imports without times, batches) and leaves out the recent turns by id.
    let oldest_recent = recent.first().map(|i| i.created_at);
    let recent_ids: HashSet<MemoryId> = recent.iter().map(|i| i.id).collect();

    // 2. Top summaries of the thread (not cited by another summary), covering older turns.
    let mut summaries: Vec<ContextItem> = Vec::new();
    let summary_cap = used + share(budget, options.summary_share);
    let mut tops = inner.store.top_summaries(thread, TOP_SUMMARIES_PER_LEVEL)?;
    tops.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    for s in tops {
        let room = summary_cap.min(budget).saturating_sub(used);
        let mut it = owned_item(s, Section::Summary);
        let text = render_item(&it);
        if too_long(&text, room, counter) {
            continue;
        }
        it.tokens = counter.count_message(&text);
        if it.tokens > room {
            continue;
        }
        used += it.tokens;
        summaries.push(it);
    }
    summaries.sort_by_key(|i| i.created_at);

    // 3. Recall: every turn of the thread scored for the query (vector and keyword match,
    //    raised by its neighbours' match, by naming its speaker, by a time range the query
    //    names; see `recall`), then taken best first while they fit. Rows are read in
    //    chunks, best first, so the turns that do not make it are not decoded (but for at
    //    most two chunks read ahead, see `read_ranked`).
    let mut recalled: Vec<ContextItem> = Vec::new();
    let mut related: Vec<ContextItem> = Vec::new();
    // Whether the count added up while packing is over the context's (see `read_repeats`).
    let mut recount = false;
    // (`pending` is there exactly when the query is not empty; left for the caller to join
    // when no budget is left.)
    if let Some(p) = pending.take_if(|_| used < budget) {
        let turns = inner.store.count_in_thread(thread, &turns_filter.kinds)?;
        let (mut ranked, qv) = if turns > options.bounded_above {
            bounded_ranking(inner, thread, query, keyword_text, p, options, turns)?
        } else {
            exhaustive_ranking(inner, thread, query, keyword_text, p, options)?
        };
        if let Some(h) = options.half_life_secs {
            // From the newest candidate, as in search: the same order, no underflow.
            let newest = ranked.iter().map(|r| r.2).max();
            let now = newest.map_or(inner.clock.now(), |n| n.min(inner.clock.now()));
            let h = std::time::Duration::try_from_secs_f64(h)
                .map_err(|e| HarnessError::Config(format!("half_life_secs: {e}")))?;
            for r in &mut ranked {
                r.1 = crate::harness::decayed(r.1, now - r.2, h);
            }
            ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        }
        // Memories beyond the thread, best first, within their share.
        if options.knowledge || !scope.is_empty() {
            let cap = (used + share(budget, options.related_share)).min(budget);
            let found = related_ranking(inner, thread, keyword_text, &qv, options, scope)?;
            for hit in inner.store.hits(found)? {
                // A metadata scope also matches the thread's own turns: they are recalled
                // (or not) by the thread's ranking.
                if (hit.memory.thread_id.as_ref() == Some(thread)
                    && hit.memory.kind != MemoryKind::Knowledge)
                    || hidden(&hit.memory, inner.clock.now())
                {
                    continue;
                }
                let mut it = owned_item(hit.memory, Section::Related);
                let mut cost = counter.count(&related_line(&it));
                if related.is_empty() {
                    cost += counter.count_message(RELATED_HEADER);
                }
                if used + cost > cap {
                    continue;
                }
                used += cost;
                it.tokens = cost;
                related.push(it);
            }
        }
        let order = distinct_texts(
            inner,
            ranked
                .into_iter()
                .filter(|r| oldest_recent.is_none_or(|t| r.2 <= t))
                .map(|r| (r.0, r.1)),
        )?;
        // Recalled turns share one message: its header is paid by the first turn, and each
        // header line naming days (see `day_groups`) by the first turn said on those days.
        let block_header = counter.count_message(RECALLED_HEADER);
        let pieces = HeaderPieces::new(counter);
        // The recalled lines under each header (by its days), and each line's days with the
        // count of its header.
        let mut groups: FxHashMap<Vec<NaiveDate>, usize> = FxHashMap::default();
        let mut line_days: Vec<(Vec<NaiveDate>, DaysCount)> = Vec::new();
        // A turn whose text is already in the context on the same day (a repeated message,
        // a re-sent tool result) says nothing new: only its best-scored copy is recalled.
        // The same words on another day are another event: the day is added to the line
        // already recalled (see `ContextItem::repeats`), which moves the line under the
        // header of its new set of days: it costs that header when no other line has it
        // yet, and gives back its old one when it was that header's last line.
        let mut texts = SaidOn::default();
        for i in &recent {
            texts.add(&i.content, i.created_at.date_naive());
        }
        let mut day_tokens = DayTokens::new(counter);
        // Each recalled text's item (by its words, role and speaker: the same words from
        // someone else are not folded).
        let mut lines: HashMap<(String, Option<Role>, Option<String>), usize> = HashMap::new();
        // (No room for a line: nothing to read.)
        let order = if budget.saturating_sub(used) < MIN_LINE_TOKENS {
            Vec::new()
        } else {
            order
        };
        // (An error of the closure below, which stops the reading.)
        let mut failed: Option<HarnessError> = None;
        // Per recalled line, the copies of its text it names the days of.
        let mut line_copies_taken: Vec<Vec<u64>> = Vec::new();
        // (The rows of the copies each line takes are read on another thread as the lines
        // are made, see `reading_copies`; with no turn to try there is nothing to read.)
        let pack = |copies_wanted: &CopiesWanted| {
            read_ranked(inner, &order, |hit, vid| {
                if budget.saturating_sub(used) < MIN_LINE_TOKENS {
                    return false;
                }
                let m = hit.memory;
                // (Turns reached through summaries on a long thread are read by id: one that
                // expired or was superseded since is left out here.)
                if hidden(&m, inner.clock.now()) {
                    return true;
                }
                let day = m.created_at.date_naive();
                if recent_ids.contains(&m.id) {
                    return true;
                }
                let line_key = (m.content.clone(), m.role, m.speaker().map(str::to_owned));
                let line = lines.get(&line_key).copied();
                // A day a line of these words names already (its own, its copies', or one it
                // gained while packing): the turn is one of that day's. A copy the line took
                // when it was made is named by `read_repeats`; one it did not (a copy the
                // index did not find when it was inserted has a key of its own, and a line's
                // lookup follows one key) is named here, as the day's other turns are: the
                // header is the same.
                let named = line.filter(|n| line_days[*n].0.binary_search(&day).is_ok());
                if let Some(n) = named {
                    let it = &mut recalled[n];
                    if it.id != m.id
                        && !line_copies_taken[n].contains(&vid)
                        && it.repeats.iter().all(|r| r.id != m.id)
                    {
                        let at = it.repeats.partition_point(|r| r.created_at <= m.created_at);
                        it.repeats.insert(
                            at,
                            Repeat {
                                id: m.id,
                                created_at: m.created_at,
                                metadata: m.metadata,
                            },
                        );
                    }
                    return true;
                }
                // The words are in the context on this day already (a recent turn's).
                if texts.has(&m.content, day) {
                    return true;
                }
                if let Some(n) = line {
                    let (old, old_count) = &line_days[n];
                    let Err(at) = old.binary_search(&day) else {
                        return true;
                    };
                    let mut days = old.clone();
                    days.insert(at, day);
                    let mut count = old_count.clone();
                    count.add(&mut day_tokens, day);
                    let freed = if groups.get(old) == Some(&1) {
                        old_count.tokens(&pieces)
                    } else {
                        0
                    };
                    let added = if groups.contains_key(&days) {
                        0
                    } else {
                        count.tokens(&pieces)
                    };
                    // (`used` holds the old header's tokens when they are freed.)
                    if used + added - freed > budget {
                        return true;
                    }
                    used = used + added - freed;
                    if let Some(c) = groups.get_mut(old) {
                        *c -= 1;
                        if *c == 0 {
                            groups.remove(old);
                        }
                    }
                    *groups.entry(days.clone()).or_default() += 1;
                    line_days[n] = (days, count);
                    let it = &mut recalled[n];
                    let repeat = Repeat {
                        id: m.id,
                        created_at: m.created_at,
                        metadata: m.metadata,
                    };
                    let at = it
                        .repeats
                        .partition_point(|r| r.created_at <= repeat.created_at);
                    it.repeats.insert(at, repeat);
                    texts.add(&m.content, day);
                    return true;
                }
                let line = counter.count(&recalled_line(&m.content));
                let first = if recalled.is_empty() { block_header } else { 0 };
                // (A header costs nothing or more: a line that does not fit without one does not
                // fit, and its copies are not looked up. Near the end of the budget most turns
                // tried are such.)
                if used + line + first > budget {
                    return true;
                }
                // The line with the other days its text was said in the thread (its copies, by
                // the index): all when they fit, else the nearest; else its own day alone, and a
                // copy that comes up as a candidate adds its day as above.
                let taken = match line_copies(
                    inner,
                    &turns_filter,
                    vid,
                    &m,
                    &texts,
                    &mut day_tokens,
                    |days, count| {
                        let header = if groups.contains_key(days) {
                            0
                        } else {
                            count.tokens(&pieces)
                        };
                        used + line + first + header <= budget
                    },
                ) {
                    Ok(r) => r,
                    Err(e) => {
                        failed = Some(e);
                        return false;
                    }
                };
                let LineDays {
                    days,
                    count,
                    copies,
                } = taken.unwrap_or_else(|| LineDays {
                    days: vec![day],
                    count: DaysCount::new(&mut day_tokens, day),
                    copies: Vec::new(),
                });
                let mut cost = line + first;
                if !groups.contains_key(&days) {
                    cost += count.tokens(&pieces);
                }
                // (Turns only, none of them recent: none is in the context yet.)
                if used + cost > budget {
                    return true;
                }
                used += cost;
                *groups.entry(days.clone()).or_default() += 1;
                // (The days of the copies it took are in `line_days`: a copy that comes up later
                // is passed over there, and another speaker's same words on such a day are
                // still their own line.)
                texts.add(&m.content, day);
                line_days.push((days, count));
                lines.insert(line_key, recalled.len());
                let mut it = owned_item(m, Section::Recalled);
                it.tokens = cost;
                recalled.push(it);
                copies_wanted.read(&copies);
                line_copies_taken.push(copies);
                true
            })?;
            // (A copy lookup that failed stopped the packing: its error is the call's.)
            failed.take().map_or(Ok(()), Err)
        };
        let copy_rows = if order.is_empty() {
            HashMap::new()
        } else {
            reading_copies(inner, pack)?.1
        };
        recount = read_repeats(
            inner,
            &mut recalled,
            &line_days,
            &line_copies_taken,
            copy_rows,
            &recent_ids,
        );
        recalled.sort_by_key(|i| i.created_at);
    }

    // The block's count is the sum of its lines' for tokenizers that split at newlines
    // (cl100k): what was added up while packing is the exact count. For any other,
    // drop the last recalled turns until the exact count of the rendered messages fits.
    let n_summaries = summaries.len();
    let mut items = summaries;
    items.extend(related);
    items.extend(recalled);
    items.extend(recent);
    let mut ctx = AssembledContext {
        items,
        tokens: used,
        budget,
    };
    // (A copy counted while packing and left out after, see `read_repeats`, can move its
    // line under a header no other line pays for: the count is taken again and the last
    // recalled turns dropped until it fits.)
    while recount || !counter.newline_additive() {
        ctx.tokens = ctx
            .to_messages()
            .iter()
            .map(|m| counter.count_message(&m.content))
            .sum();
        if ctx.tokens <= budget {
            break;
        }
        let last = |s: Section| ctx.items.iter().rposition(|i| i.section == s);
        let Some(pos) = last(Section::Recalled).or_else(|| last(Section::Related)) else {
            break;
        };
        ctx.items.remove(pos);
    }
    attribute_recalled_tokens(&mut ctx.items[n_summaries..], counter);
    Ok(ctx)
}

/// How many copies of one text (see [`distinct_texts`]) are tried: the best, and one more
/// for when the best is passed over (the oldest recent turn, a turn hidden since it was
/// ranked, words already in the context that day).
const COPIES_TRIED: usize = 2;

/// How many turns of one day a recalled line names (its own among them on its day): the
/// same words said again that day (a message re-sent, a conversation held twice in a day)
/// are the same line under the same header, and the line stands for them by id; a message
/// re-sent all day long is named by its first turns, so one line does not read hundreds.
const COPIES_A_DAY: usize = 4;

/// How many turns of one day with a recalled line's words are read to name
/// [`COPIES_A_DAY`] of them: another speaker's same words hold the same vector, and are
/// passed over when their rows are read (see [`read_repeats`]).
const COPIES_READ_A_DAY: usize = 2 * COPIES_A_DAY;

/// The ranked turns `ranked` (best first) to try, up to [`MAX_TRIED`] distinct texts: of
/// the copies of a text (the same words stored again, which hold the same vector; told by
/// [`MemoryBackend::copy_keys`]) only the best [`COPIES_TRIED`], as the line made from one
/// names the days of the others (see [`line_copies`]). So a thread that repeats its texts
/// does not spend its tries on the copies of a few.
fn distinct_texts(
    inner: &Inner,
    ranked: impl Iterator<Item = (u64, f32)>,
) -> Result<Vec<(u64, f32)>> {
    let mut ranked = ranked.peekable();
    let mut tried: HashMap<u64, usize> = HashMap::new();
    let mut out = Vec::new();
    while tried.len() < MAX_TRIED && ranked.peek().is_some() {
        let chunk: Vec<(u64, f32)> = ranked
            .by_ref()
            .take((MAX_TRIED - tried.len()).max(READ_CHUNK))
            .collect();
        let ids: Vec<u64> = chunk.iter().map(|r| r.0).collect();
        for (r, key) in chunk.into_iter().zip(inner.store.copy_keys(&ids)?) {
            if tried.len() == MAX_TRIED && !tried.contains_key(&key) {
                break;
            }
            let n = tried.entry(key).or_default();
            if *n < COPIES_TRIED {
                *n += 1;
                out.push(r);
            }
        }
    }
    Ok(out)
}

/// The days of a new recalled line for turn `m` (index id `vid`) with the other days its
/// text was said in the thread: the copies the index knows of (the same words, which hold
/// the same vector), leaving out the days `texts` already holds the words on. On each day
/// the line names, its copies are named too, up to [`COPIES_A_DAY`] turns a day with the
/// line's own (the words said twice that day, say a message re-sent: the line stands for
/// both, and the header names the day once). `fits` tells from a set of days and their
/// header's count whether the line fits with them: all the days when they fit, else the
/// days nearest the line's own first, as many as fit (a text said on 70 days would
/// otherwise cost its line its place). No row is read here: the rows of the copies taken
/// are read on another thread as the block is packed (see [`reading_copies`]). `None` when
/// no copy is taken.
fn line_copies(
    inner: &Inner,
    turns: &Filter,
    vid: u64,
    m: &MemoryUnit,
    texts: &SaidOn,
    tokens: &mut DayTokens<'_>,
    fits: impl Fn(&[NaiveDate], &DaysCount) -> bool,
) -> Result<Option<LineDays>> {
    let day = m.created_at.date_naive();
    let said = texts.days(&m.content);
    // The copies on the days the words are not in the context on yet, the earliest
    // [`COPIES_READ_A_DAY`] a day (the line's own counts on its day): `read_repeats` names
    // the same speaker's among them, up to [`COPIES_A_DAY`] a day.
    let mut others: Vec<(u64, DateTime<Utc>)> = inner
        .store
        .copies_of(vid, turns)?
        .into_iter()
        .filter(|(v, at)| *v != vid && !said.contains(&at.date_naive()))
        .collect();
    others.sort_by_key(|(v, at)| (*at, *v));
    let mut a_day: HashMap<NaiveDate, usize> = HashMap::from([(day, 1)]);
    others.retain(|(_, at)| {
        let n = a_day.entry(at.date_naive()).or_default();
        *n += 1;
        *n <= COPIES_READ_A_DAY
    });
    if others.is_empty() {
        return Ok(None);
    }
    let mut days: Vec<NaiveDate> = a_day.into_keys().collect();
    days.sort_unstable();
    let Some(mut count) = DaysCount::of(tokens, &days) else {
        return Ok(None);
    };
    if !fits(&days, &count) {
        // The nearest days first, while they fit (a header costs more with every day, but
        // for one shared with another line: the whole set was tried above); a day taken
        // brings all its copies.
        others.sort_by_key(|(v, at)| ((*at - m.created_at).abs(), *v));
        days.clear();
        days.push(day);
        count = DaysCount::new(tokens, day);
        for (_, at) in &others {
            let d = at.date_naive();
            let Err(at) = days.binary_search(&d) else {
                continue;
            };
            days.insert(at, d);
            let mut c = count.clone();
            c.add(tokens, d);
            if !fits(&days, &c) {
                days.remove(at);
                break;
            }
            count = c;
        }
        others.retain(|(_, at)| days.binary_search(&at.date_naive()).is_ok());
        others.sort_by_key(|(v, at)| (*at, *v));
        if others.is_empty() {
            return Ok(None);
        }
    }
    Ok(Some(LineDays {
        days,
        count,
        copies: others.into_iter().map(|(v, _)| v).collect(),
    }))
}

/// The days each text is in the context on already (a recent turn's, a recalled line's):
/// its words said again on such a day say nothing new.
#[derive(Default)]
struct SaidOn(HashMap<String, Vec<NaiveDate>>);

impl SaidOn {
    /// The days `text` is in the context on.
    fn days(&self, text: &str) -> &[NaiveDate] {
        self.0.get(text).map_or(&[], Vec::as_slice)
    }

    /// Whether `text` is in the context on `day`.
    fn has(&self, text: &str, day: NaiveDate) -> bool {
        self.days(text).contains(&day)
    }

    /// Notes `text` as in the context on `day`.
    fn add(&mut self, text: &str, day: NaiveDate) {
        match self.0.get_mut(text) {
            Some(days) => {
                if !days.contains(&day) {
                    days.push(day);
                }
            }
            None => {
                self.0.insert(text.to_owned(), vec![day]);
            }
        }
    }
}

/// A recalled line's days (oldest first), their header's count, and the index ids of the
/// copies of its text said on those days (its own day too) that are read to be named.
struct LineDays {
    days: Vec<NaiveDate>,
    count: DaysCount,
    copies: Vec<u64>,
}

/// Where the lines being packed send the copies whose rows are wanted (see
/// [`reading_copies`]).
struct CopiesWanted(std::sync::mpsc::Sender<Vec<u64>>);

impl CopiesWanted {
    /// Asks for the rows of `vids` (index ids).
    fn read(&self, vids: &[u64]) {
        if !vids.is_empty() {
            // (A reader that stopped has failed: its error is returned when it is joined.)
            let _ = self.0.send(vids.to_vec());
        }
    }
}

/// Runs `pack` while another thread reads the rows of the copies `pack` asks for (the
/// copies each recalled line names the days of), as it asks: on a long thread that repeats
/// its texts a call names hundreds of copies, and their rows, read after the packing, took
/// as long as it. The reader takes every ask waiting for it at once and reads them when
/// they make a chunk (two chunks or more in two halves at once, see [`in_halves`]), and
/// what is left when `pack` is done. Returns `pack`'s result and the rows by index id (rows
/// whose memory is gone are left out); when `pack` fails, its error, and what is left
/// unread then is not read.
fn reading_copies<R>(
    inner: &Inner,
    pack: impl FnOnce(&CopiesWanted) -> Result<R>,
) -> Result<(R, HashMap<u64, MemoryUnit>)> {
    let failed = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let (send, take) = std::sync::mpsc::channel::<Vec<u64>>();
        let failed = &failed;
        let reader = spawn_named(
            s,
            "cairn-read-repeats",
            READING_REPEATS,
            move || -> Result<HashMap<u64, MemoryUnit>> {
                let mut rows: HashMap<u64, MemoryUnit> = HashMap::new();
                let mut wanted: Vec<(u64, f32)> = Vec::new();
                let mut read = |wanted: &mut Vec<(u64, f32)>| -> Result<()> {
                    let hits = in_halves(
                        wanted,
                        2 * READ_CHUNK,
                        "cairn-read-repeats-2",
                        READING_REPEATS,
                        |c| read_chunk(inner, c),
                    )?;
                    rows.extend(hits.into_iter().map(|(h, v)| (v, h.memory)));
                    wanted.clear();
                    Ok(())
                };
                // While the packing goes on: every ask waiting, once they make a chunk.
                while let Ok(vids) = take.recv() {
                    wanted.extend(vids.into_iter().map(|v| (v, 0.0)));
                    wanted.extend(take.try_iter().flatten().map(|v| (v, 0.0)));
                    if wanted.len() >= READ_CHUNK {
                        read(&mut wanted)?;
                    }
                }
                // (The channel is closed: the packing is done.)
                if !failed.load(std::sync::atomic::Ordering::Acquire) {
                    read(&mut wanted)?;
                }
                Ok(rows)
            },
        )?;
        let wanted = CopiesWanted(send);
        let packed = pack(&wanted);
        if packed.is_err() {
            failed.store(true, std::sync::atomic::Ordering::Release);
        }
        // (The reader, told whether the packing failed, reads what is left and returns.)
        drop(wanted);
        let rows = joined(reader, READING_REPEATS);
        let packed = packed?;
        Ok((packed, rows??))
    })
}

/// Makes the rows `rows` (by index id) of the copies each recalled line took (`copies`: per
/// line of `recalled`, their index ids) the lines' repeats, oldest first. A copy must be
/// the same words from the same speaker (the same role and metadata `speaker`), and neither
/// a recent turn nor hidden: another speaker's same words (they embed alike when the
/// speaker is not in the text) or a turn superseded since the index was read are left out,
/// as is a copy whose row is gone. Of those left, a line names the earliest of each day, up
/// to [`COPIES_A_DAY`] turns a day with its own and those it names already. Returns whether
/// a line now names other days than `line_days` (the days it was counted with while
/// packing: a day all of whose copies were left out).
fn read_repeats(
    inner: &Inner,
    recalled: &mut [ContextItem],
    line_days: &[(Vec<NaiveDate>, DaysCount)],
    copies: &[Vec<u64>],
    mut rows: HashMap<u64, MemoryUnit>,
    recent: &HashSet<MemoryId>,
) -> bool {
    let now = inner.clock.now();
    let mut other_days = false;
    for ((it, vids), (days, _)) in recalled.iter_mut().zip(copies).zip(line_days) {
        let same: Vec<MemoryUnit> = vids
            .iter()
            .filter_map(|v| rows.remove(v))
            .filter(|c| {
                c.content == it.content
                    && c.role == it.role
                    && c.speaker() == it.metadata.get("speaker").and_then(|s| s.as_str())
                    && !recent.contains(&c.id)
                    && !hidden(c, now)
            })
            .collect();
        // The turns the packing named (the days it added, and copies it met on days named
        // already) with the copies read, the earliest of each day first: a day the packing
        // added keeps its turn (no copy read is on such a day), and a day holds at most
        // [`COPIES_A_DAY`] with the line's own.
        let mut pool: Vec<Repeat> = std::mem::take(&mut it.repeats);
        let named: HashSet<MemoryId> = pool.iter().map(|r| r.id).collect();
        pool.extend(
            same.into_iter()
                .filter(|c| c.id != it.id && !named.contains(&c.id))
                .map(|c| Repeat {
                    id: c.id,
                    created_at: c.created_at,
                    metadata: c.metadata,
                }),
        );
        pool.sort_by_key(|r| (r.created_at, r.id));
        let mut a_day: HashMap<NaiveDate, usize> = HashMap::from([(it.created_at.date_naive(), 1)]);
        for r in pool {
            let n = a_day.entry(r.created_at.date_naive()).or_default();
            if *n < COPIES_A_DAY {
                *n += 1;
                it.repeats.push(r);
            }
        }
        other_days |= item_days(it) != *days;
    }
    other_days
}

/// A turn ranked for recall: index id, score, time.
type Ranked = (u64, f32, DateTime<Utc>);

/// Uncited summaries looked at per level for the summary section (see
/// `Store::top_summaries`): the section takes the newest that fit its share, and on a
/// long thread the uncited summaries pile up at the highest level (80 at 200,000 turns),
/// where the newest sixteen are more than the share holds; each one looked at costs a row
/// read and a prefix tokenized (64 took a tenth of a bounded call at 200,000 turns).
const TOP_SUMMARIES_PER_LEVEL: usize = 16;
/// Bounded recall: at most this deep a vector and a keyword ranking.
const BOUNDED_DEPTH: usize = 400;
/// Bounded recall: the query's words held by more memories than this are not searched.
const KEYWORD_MAX_MATCHES: usize = 2_000;
/// Bounded recall: at most this many of the newest turns no summary covers yet.
const TAIL_MAX: usize = 2_000;
/// Bounded recall: the turns of the time range a query names, when it holds no more.
const RANGE_MAX: usize = 400;
/// Bounded recall: the summaries of any level the route starts from.
const ROUTE_HITS: usize = 6;
/// Bounded recall: the children kept at each level of the route's descent.
const ROUTE_CHILDREN: usize = 2;
/// Bounded recall: the route descends at most this many levels from a summary it found.
const ROUTE_MAX_DESCENT: usize = 8;
/// Bounded recall: the summary rankings fused for the route are this deep.
const ROUTE_DEPTH: usize = 30;
/// Bounded recall: at most this many turns of a routed level-1 summary.
const SPAN_MAX: usize = 64;
/// Bounded recall: the best matches whose neighbours are read.
const WINDOWS: usize = 100;
/// Bounded recall: neighbours read on each side of a match.
const NEIGHBOURS: usize = 2;
/// Bounded recall: from this many matches on, their stretches are read in two halves at
/// once.
const AROUND_SPLIT: usize = 32;

/// Every turn of the thread scored for the query (see `recall`), best first (ties in time
/// order).
fn exhaustive_ranking(
    inner: &Inner,
    thread: &ThreadId,
    query: &str,
    keyword_text: &str,
    pending: PendingVector<'_>,
    options: &ContextOptions,
) -> Result<(Vec<Ranked>, Vec<f32>)> {
    let f = turns_filter(thread);
    let timeline = inner.store.timeline_entries(&f)?;
    let depth = options.recall_depth.max(1);
    let keyword = inner.store.search_keyword_ids(keyword_text, depth, &f)?;
    let qv = join_vector(pending)?;
    // The summary route: turns under the level-1 summaries that match the query best.
    let routed = if options.weights.route == 0.0 {
        HashSet::new()
    } else {
        let sf = Filter::all()
            .thread(thread.clone())
            .kinds([MemoryKind::Summary])
            .levels(1, 1);
        let top: Vec<u64> = hybrid_ids(inner, query, qv.clone(), &sf, ROUTE_SUMMARIES)?
            .into_iter()
            .map(|(vid, _)| vid)
            .collect();
        inner.store.leaf_vids(&top)?
    };
    let vector = inner.store.search_vector_ids(qv.clone(), depth, &f, None)?;
    let scores = score_timeline(
        &timeline,
        &vector,
        &keyword,
        &routed,
        query,
        &options.weights,
    );
    let mut order: Vec<usize> = (0..timeline.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let ranked = order
        .into_iter()
        .map(|i| (timeline[i].vid, scores[i], timeline[i].at))
        .collect();
    Ok((ranked, qv))
}

/// Midnight (UTC) of a date.
fn day_start(d: chrono::NaiveDate) -> DateTime<Utc> {
    d.and_time(chrono::NaiveTime::MIN).and_utc()
}

/// A thread's summaries, every level.
fn summaries_filter(thread: &ThreadId) -> Filter {
    Filter::all()
        .thread(thread.clone())
        .kinds([MemoryKind::Summary])
}

/// The spans of the level-1 summaries of the thread that recall reads under: the best
/// [`ROUTE_HITS`] summaries for the query (vector and keyword rankings fused), each one of
/// level 2 or more replaced, one level at a time, by its [`ROUTE_CHILDREN`] children nearest
/// the query, down to level 1.
/// Coarse to fine: the vector ranking looks at the summaries above level 1, so its cost
/// grows with a four-hundredth of the thread, not with the thread.
/// `keyword` is the thread's summaries of every level that match the query's rarer words
/// best (at most [`ROUTE_DEPTH`]), read while the model embeds the query.
fn route(
    inner: &Inner,
    thread: &ThreadId,
    keyword: Vec<(u64, f32)>,
    qv: &[f32],
) -> Result<Vec<(DateTime<Utc>, DateTime<Utc>)>> {
    let store = &inner.store;
    let sf = summaries_filter(thread);
    // By vector, the summaries above level 1 (a twentieth of level 1's at the default
    // chunk size), scored exactly: a thread's summaries are a small share of the store,
    // where a filtered graph walk visits many memories it does not admit. Level 1 only when
    // nothing was rolled up yet. By keyword, every level.
    let mut v =
        store.search_vector_ids_exact(qv.to_vec(), ROUTE_DEPTH, &sf.clone().levels(2, u32::MAX))?;
    if v.len() < ROUTE_HITS {
        v.extend(store.search_vector_ids_exact(
            qv.to_vec(),
            ROUTE_DEPTH,
            &sf.clone().levels(1, 1),
        )?);
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
    }
    // Down one level at a time, keeping the children nearest the query, so a hit high up
    // costs its fan-out per level, not every summary under it. Every hit descends in the
    // same steps: one read of links and one of similarities per level for all of them.
    let mut frontiers: Vec<Vec<u64>> = fuse_ids(&[v, keyword], ROUTE_HITS)
        .into_iter()
        .map(|(vid, _)| vec![vid])
        .collect();
    let mut descending: Vec<bool> = vec![true; frontiers.len()];
    for _ in 0..ROUTE_MAX_DESCENT {
        let parents: Vec<u64> = frontiers
            .iter()
            .zip(&descending)
            .filter(|(_, d)| **d)
            .flat_map(|(f, _)| f.iter().copied())
            .collect();
        let links = store.child_summary_vids(&parents)?;
        if links.is_empty() {
            break;
        }
        let mut children: HashMap<u64, Vec<u64>> = HashMap::new();
        for (parent, child) in &links {
            children.entry(*parent).or_default().push(*child);
        }
        let all: Vec<u64> = links.iter().map(|l| l.1).collect();
        let near: HashMap<u64, f32> = store.similarities(qv.to_vec(), &all)?.into_iter().collect();
        for (frontier, d) in frontiers.iter_mut().zip(descending.iter_mut()) {
            if !*d {
                continue;
            }
            let below: Vec<u64> = frontier
                .iter()
                .filter_map(|p| children.get(p))
                .flatten()
                .copied()
                .collect();
            if below.is_empty() {
                *d = false;
                continue;
            }
            let mut scored: Vec<(u64, f32)> = below
                .into_iter()
                .filter_map(|c| near.get(&c).map(|s| (c, *s)))
                .collect();
            scored.sort_by(|a, b| b.1.total_cmp(&a.1));
            *frontier = scored
                .into_iter()
                .take(ROUTE_CHILDREN)
                .map(|(v, _)| v)
                .collect();
        }
    }
    let mut chosen: Vec<u64> = frontiers.into_iter().flatten().collect();
    let mut seen = HashSet::new();
    chosen.retain(|vid| seen.insert(*vid));
    Ok(store
        .summary_spans(&chosen)?
        .into_iter()
        .map(|(_, from, to)| (from, to))
        .collect())
}

/// Whether the stretch around `t` (see `MemoryBackend::timeline_around`: `before` entries
/// before the time, then `after` from its first entry) lies whole inside one of `pages`,
/// each a contiguous part of the same timeline, oldest first. The first entry of a time in
/// a page is its first in the timeline when an earlier entry of the page precedes it.
fn held_stretch(
    pages: &[Vec<TimelineEntry>],
    t: DateTime<Utc>,
    before: usize,
    after: usize,
) -> bool {
    pages.iter().any(|page| {
        let i = page.partition_point(|e| e.at < t);
        page.get(i).is_some_and(|e| e.at == t) && i >= before.max(1) && i + after <= page.len()
    })
}

/// Joins stretches of one timeline (each contiguous and oldest first) into segments: every
/// entry once, in time order, cut wherever two entries next to each other were not next to
/// each other in any stretch (turns between them were not read).
fn join_stretches(stretches: Vec<Vec<TimelineEntry>>) -> Vec<Vec<TimelineEntry>> {
    let mut adjacent: HashSet<(u64, u64)> = HashSet::new();
    let mut all: HashMap<u64, TimelineEntry> = HashMap::new();
    for s in stretches {
        for pair in s.windows(2) {
            adjacent.insert((pair[0].vid, pair[1].vid));
        }
        for e in s {
            all.insert(e.vid, e);
        }
    }
    let mut entries: Vec<TimelineEntry> = all.into_values().collect();
    entries.sort_by(|a, b| a.at.cmp(&b.at).then(a.vid.cmp(&b.vid)));
    let mut segments: Vec<Vec<TimelineEntry>> = Vec::new();
    for e in entries {
        match segments.last_mut() {
            Some(seg)
                if seg
                    .last()
                    .is_some_and(|p| adjacent.contains(&(p.vid, e.vid))) =>
            {
                seg.push(e);
            }
            _ => segments.push(vec![e]),
        }
    }
    segments
}

/// What bounded recall's keyword lane does, for its errors.
const KEYWORD_RANKING: &str = "the keyword ranking";

/// What bounded recall's keyword lane read: the turns' keyword ranking, and the turns under
/// the summaries the query routes to (see [`route`]), a page per summary.
struct KeywordLane {
    keyword: Vec<(u64, f32)>,
    pages: Vec<Vec<TimelineEntry>>,
}

/// What bounded recall's vector lane read: the turns no summary covers yet and those of the
/// time range the query names, the query's vector and the turns' vector ranking.
struct VectorLane {
    stretches: Vec<Vec<TimelineEntry>>,
    qv: Vec<f32>,
    /// The nearest distinct texts: (one turn holding it, similarity, turns holding it).
    vector: Vec<(u64, f32, usize)>,
}

/// What [`stretches_around`]'s second thread does, for its errors.
const READING_STRETCHES: &str = "reading the stretches";

/// The stretches of [`NEIGHBOURS`] turns around each of `times` (see
/// `MemoryBackend::timeline_around`), in the order of `times`. Many times are read in two
/// halves at once, through two pooled connections: a stretch is two index seeks, and a
/// hundred of them took as long as a lane's ranking at 200,000 turns.
fn stretches_around(
    store: &dyn MemoryBackend,
    f: &Filter,
    times: &[DateTime<Utc>],
) -> Result<Vec<Vec<TimelineEntry>>> {
    in_halves(
        times,
        AROUND_SPLIT,
        "cairn-read-around",
        READING_STRETCHES,
        |t| Ok(store.timeline_around(f, t, NEIGHBOURS, NEIGHBOURS + 1)?),
    )
}

/// `read` of `items`, at once when they are fewer than `split`, else in two halves at once:
/// the second half on a thread of its own (`name`; `what` it does, for its errors), each
/// through a pooled connection of its own. The results in the items' order.
fn in_halves<T: Sync, R: Send>(
    items: &[T],
    split: usize,
    name: &str,
    what: &str,
    read: impl Fn(&[T]) -> Result<Vec<R>> + Sync,
) -> Result<Vec<R>> {
    if items.len() < split {
        return read(items);
    }
    let (first, second) = items.split_at(items.len() / 2);
    std::thread::scope(|s| {
        let other = spawn_named(s, name, what, || read(second))?;
        let first = read(first);
        let rest = joined(other, what)?;
        let mut out = first?;
        out.extend(rest?);
        Ok(out)
    })
}

/// Recall on a thread of `turns` turns, longer than [`ContextOptions::bounded_above`]: the
/// same scores as [`exhaustive_ranking`], on the whole thread's scales, for the turns worth
/// reading only — the turns under the summaries the query routes to (see [`route`]), the
/// turns around the best vector and keyword matches, the turns of a time range the query
/// names, and the newest turns no summary covers yet. Best first (ties in time order).
fn bounded_ranking(
    inner: &Inner,
    thread: &ThreadId,
    query: &str,
    keyword_text: &str,
    pending: PendingVector<'_>,
    options: &ContextOptions,
    turns: usize,
) -> Result<(Vec<Ranked>, Vec<f32>)> {
    let store = &inner.store;
    let w = &options.weights;
    let f = &turns_filter(thread);
    let depth = options.recall_depth.clamp(1, BOUNDED_DEPTH);
    // Two lanes, reading at once through separate pooled connections. The keyword lane ranks
    // the turns and the summaries (the route's) by keyword, then, given the query's vector,
    // routes through the summaries and reads the turns under the summaries it chose. This
    // thread reads the turns not under a summary yet and those of the time range the query
    // names, waits for the vector and ranks the turns by it. So the keyword rankings run
    // while the model embeds the query (without the model, while the vector ranking runs),
    // and the route runs while the vector ranking does.
    let speakers = store.thread_speakers(thread)?;
    let cues = QueryCues::new(query, speakers.iter().map(String::as_str));
    let (send_qv, take_qv) = std::sync::mpsc::sync_channel::<Vec<f32>>(1);
    let (vector_side, keyword_side) = std::thread::scope(|s| -> Result<_> {
        let lane = spawn_named(
            s,
            "cairn-keyword-lane",
            KEYWORD_RANKING,
            move || -> Result<Option<KeywordLane>> {
                // The turns' ranking and the route's (the thread's summaries of every level)
                // in one call: the query's words are counted once.
                let sf = summaries_filter(thread);
                let both = store.search_keyword_ids_capped_each(
                    keyword_text,
                    &[(depth, f), (ROUTE_DEPTH, &sf)],
                    KEYWORD_MAX_MATCHES,
                )?;
                let n = both.len();
                let Ok([keyword, route_keyword]) = <[_; 2]>::try_from(both) else {
                    return Err(HarnessError::Store(StoreError::Backend {
                        backend: "keyword search",
                        message: format!("{n} rankings for 2 asks"),
                    }));
                };
                // No vector: the other lane failed, and returns its error.
                let Ok(qv) = take_qv.recv() else {
                    return Ok(None);
                };
                let mut pages = Vec::new();
                for (from, to) in route(inner, thread, route_keyword, &qv)? {
                    let span = f
                        .clone()
                        .between(from, to + chrono::Duration::microseconds(1));
                    pages.push(store.timeline_page(&span, SPAN_MAX, false)?.0);
                }
                Ok(Some(KeywordLane { keyword, pages }))
            },
        )?;
        let vector_side = (|| -> Result<VectorLane> {
            let mut stretches: Vec<Vec<TimelineEntry>> = Vec::new();
            let mut tail = f.clone();
            tail.after = store
                .consolidated_until(thread)?
                .map(|t| t + chrono::Duration::microseconds(1));
            stretches.push(store.timeline_page(&tail, TAIL_MAX, true)?.0);
            if let Some(range) = cues.range {
                let (from, to) = bonus_range(range);
                let within = f.clone().between(day_start(from), day_start(to));
                let (page, more) = store.timeline_page(&within, RANGE_MAX, false)?;
                if !more {
                    stretches.push(page);
                }
            }
            let qv = join_vector(pending)?;
            // The keyword lane is waiting for it, or has failed: then its error is returned,
            // and the vector ranking is not needed.
            let vector = if send_qv.send(qv.clone()).is_ok() {
                store.search_vector_groups(qv.clone(), depth, f, None)?
            } else {
                Vec::new()
            };
            Ok(VectorLane {
                stretches,
                qv,
                vector,
            })
        })();
        // Without a vector the keyword lane stops waiting for one.
        drop(send_qv);
        let keyword_side = joined(lane, KEYWORD_RANKING);
        // This lane's error first: a failed embedding is why the keyword lane had no vector.
        let vector_side = vector_side?;
        let keyword_side = keyword_side??
            .ok_or_else(|| HarnessError::Task("the keyword ranking had no vector".into()))?;
        Ok((vector_side, keyword_side))
    })?;
    let VectorLane {
        mut stretches,
        qv,
        vector,
    } = vector_side;
    let KeywordLane { keyword, pages } = keyword_side;
    // The scales see the similarities of the nearest `depth` turns, copies counted, as a
    // search by turn ranks them.
    let by_turn: Vec<(u64, f32)> = vector
        .iter()
        .flat_map(|(v, sim, n)| std::iter::repeat_n((*v, *sim), *n))
        .take(depth)
        .collect();
    let scales = Scales::new(&by_turn, &keyword, turns);
    // The route's turns: under the summaries that match the query best.
    let routed: HashSet<u64> = pages.iter().flatten().map(|e| e.vid).collect();
    stretches.extend(pages);
    // Around the best matches by vector or keyword alone, one per text: the copies of a
    // text (the same words stored again, which hold the same vector) match alike, and a
    // thread that repeats its texts would otherwise spend every stretch on the copies of a
    // few (a text stored 18 times took 18 of the 100). The copies of a text share its
    // scores: the keyword ranking holds some of a text's copies, the vector ranking one.
    let mut vmap: HashMap<u64, f32> = vector.iter().map(|(v, sim, _)| (*v, *sim)).collect();
    let mut kmap: HashMap<u64, f32> = keyword.iter().copied().collect();
    let mut ids: Vec<u64> = vmap.keys().copied().collect();
    ids.extend(kmap.keys().filter(|v| !vmap.contains_key(v)));
    let keys = store.copy_keys(&ids)?;
    // Per text (by key): one turn holding it (the least id met), similarity, BM25 score.
    let mut texts: FxHashMap<u64, (u64, Option<f32>, Option<f32>)> = FxHashMap::default();
    for (v, key) in ids.iter().zip(&keys) {
        let t = texts.entry(*key).or_insert((*v, None, None));
        t.0 = t.0.min(*v);
        if let Some(s) = vmap.get(v) {
            t.1 = Some(*s);
        }
        if let Some(s) = kmap.get(v) {
            t.2 = Some(t.2.map_or(*s, |k| k.max(*s)));
        }
    }
    let mut best: Vec<(u64, f32)> = texts
        .values()
        .map(|(v, vs, ks)| (*v, scales.base(*vs, *ks, w)))
        .collect();
    best.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    best.truncate(WINDOWS);
    let mut times: Vec<DateTime<Utc>> = store
        .times_of(&best.iter().map(|b| b.0).collect::<Vec<_>>())?
        .into_iter()
        .map(|(_, at)| at)
        .collect();
    times.sort();
    times.dedup();
    // A time whose stretch a page read above already holds is not read again.
    times.retain(|t| !held_stretch(&stretches, *t, NEIGHBOURS, NEIGHBOURS + 1));
    stretches.extend(stretches_around(store.as_ref(), f, &times)?);
    // A match the stretch around its time does not hold (more turns share that time than
    // the stretch reads) is read on its own.
    let read: HashSet<u64> = stretches.iter().flatten().map(|e| e.vid).collect();
    let missing: Vec<u64> = best
        .iter()
        .map(|b| b.0)
        .filter(|v| !read.contains(v))
        .collect();
    stretches.extend(store.timeline_of(&missing)?.into_iter().map(|e| vec![e]));
    let segments = join_stretches(stretches);
    // A turn in the stretches that is a copy of a ranked text has that text's scores.
    let seen: Vec<u64> = segments.iter().flatten().map(|e| e.vid).collect();
    for (v, key) in seen.iter().zip(store.copy_keys(&seen)?) {
        if let Some((_, vs, ks)) = texts.get(&key) {
            if let Some(s) = vs {
                vmap.entry(*v).or_insert(*s);
            }
            if let Some(s) = ks {
                kmap.entry(*v).or_insert(*s);
            }
        }
    }
    // Turns the vector search did not rank get their similarity from the index's vectors.
    let unranked: Vec<u64> = segments
        .iter()
        .flatten()
        .map(|e| e.vid)
        .filter(|v| !vmap.contains_key(v))
        .collect();
    vmap.extend(store.similarities(qv.clone(), &unranked)?);
    let mut out: Vec<Ranked> = Vec::new();
    for seg in &segments {
        let scores = score_entries(seg, &vmap, &kmap, &scales, &routed, cues, w);
        out.extend(seg.iter().zip(scores).map(|(e, s)| (e.vid, s, e.at)));
    }
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)).then(a.0.cmp(&b.0)));
    Ok((out, qv))
}

/// Gives each recalled item its share of the block's tokens: its line, the header of its
/// days when it is the first line under it, the block's header on the first line of all
/// (in the block's order, see [`day_groups`]).
fn attribute_recalled_tokens(items: &mut [ContextItem], counter: &dyn TokenCounter) {
    let at: Vec<usize> = (0..items.len())
        .filter(|&n| items[n].section == Section::Recalled)
        .collect();
    let recalled: Vec<&ContextItem> = at.iter().map(|&n| &items[n]).collect();
    let mut tokens: Vec<(usize, usize)> = Vec::with_capacity(at.len());
    for (g, (days, members)) in day_groups(&recalled).into_iter().enumerate() {
        // (Counted whole: exact for any counter; packing counts it in pieces.)
        let header = counter.count(&days_header(&days));
        for (k, n) in members.into_iter().enumerate() {
            let mut t = counter.count(&recalled_line(&recalled[n].content));
            if k == 0 {
                t += header;
                if g == 0 {
                    t += counter.count_message(RECALLED_HEADER);
                }
            }
            tokens.push((at[n], t));
        }
    }
    for (n, t) in tokens {
        items[n].tokens = t;
    }
}

impl MemoryHarness {
    /// What to send to a model for `thread` and `query` within `budget` tokens (the
    /// harness's token counter): the thread's top summaries, its most recent turns verbatim
    /// (the newest always), and older turns recalled for the query — every turn of the
    /// thread scored by its vector and keyword match, raised by its neighbours' match, by
    /// the query naming its speaker (metadata `speaker`) and by falling in a time range the
    /// query names (see [`RecallWeights`]), taken best first while they fit — de-duplicated
    /// and in time order within each part.
    pub async fn assemble_context(
        &self,
        thread_id: &str,
        query: &str,
        budget: usize,
    ) -> Result<AssembledContext> {
        self.assemble_context_with(thread_id, query, budget, ContextOptions::default())
            .await
    }

    /// [`Self::assemble_context`] with explicit shares.
    pub async fn assemble_context_with(
        &self,
        thread_id: &str,
        query: &str,
        budget: usize,
        options: ContextOptions,
    ) -> Result<AssembledContext> {
        self.assemble_context_scoped(thread_id, query, budget, options, ContextScope::default())
            .await
    }

    /// [`Self::assemble_context_with`], recalling from memory beyond the thread too: the
    /// thread's knowledge when [`ContextOptions::knowledge`] is on, and the other threads of
    /// `scope` (the same user's other conversations, say), into [`Section::Related`], each
    /// item with its thread and kind, within [`ContextOptions::related_share`].
    pub async fn assemble_context_scoped(
        &self,
        thread_id: &str,
        query: &str,
        budget: usize,
        options: ContextOptions,
        scope: ContextScope,
    ) -> Result<AssembledContext> {
        options.validate()?;
        let thread = ThreadId::new(thread_id)?;
        let inner = self.inner.clone();
        let query = query.to_owned();
        blocking(move || assemble_blocking(&inner, &thread, &query, budget, &options, &scope))
            .await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(minute: i64, vid: u64) -> TimelineEntry {
        TimelineEntry {
            at: DateTime::from_timestamp(1_700_000_000 + minute * 60, 0).unwrap_or_default(),
            vid,
            speaker: None,
            chars: 10,
        }
    }

    fn vids(segments: &[Vec<TimelineEntry>]) -> Vec<Vec<u64>> {
        segments
            .iter()
            .map(|s| s.iter().map(|e| e.vid).collect())
            .collect()
    }

    /// Rows read ahead on another thread come in the ranking's order, every one of them,
    /// and stop when told (the reader stops too: no wait on a full channel); stretches read
    /// in two halves are those of one read, in the order of the times.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_ahead_and_in_halves_keep_their_order() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mem = MemoryHarness::builder(dir.path().join("r.db"))
            .embedder(std::sync::Arc::new(cairn_embed::HashEmbedder::new(32)))
            .build()
            .await
            .expect("open");
        let thread = ThreadId::new("t").expect("thread");
        let t0 = DateTime::from_timestamp(1_700_000_000, 0).unwrap_or_default();
        let turns = (0..150i64)
            .map(|i| {
                cairn_core::NewMemory::conversational(
                    thread.clone(),
                    Role::User,
                    format!("turn number {i}"),
                )
                .at(t0 + chrono::Duration::minutes(i))
            })
            .collect();
        mem.add_many(turns).await.expect("add");
        let inner = &mem.inner;
        let f = turns_filter(&thread);
        let (all, _) = inner
            .store
            .timeline_page(&f, 1_000, false)
            .expect("timeline");
        assert_eq!(all.len(), 150);
        // A ranking over several chunks, in no time order.
        #[allow(clippy::cast_precision_loss)]
        let mut order: Vec<(u64, f32)> = all.iter().map(|e| (e.vid, e.vid as f32 / 2.0)).collect();
        order.reverse();
        order.rotate_left(7);
        assert!(order.len() > 3 * READ_CHUNK);
        let mut seen = Vec::new();
        read_ranked(inner, &order, |h, vid| {
            seen.push((h.memory.content, vid, h.score));
            true
        })
        .expect("read");
        let by_vid: HashMap<u64, usize> = all.iter().enumerate().map(|(i, e)| (e.vid, i)).collect();
        // Each row with its own id and score.
        let want: Vec<(String, u64, f32)> = order
            .iter()
            .map(|(v, s)| (format!("turn number {}", by_vid[v]), *v, *s))
            .collect();
        assert_eq!(seen, want);
        let mut taken = 0;
        read_ranked(inner, &order, |_, _| {
            taken += 1;
            taken < 5
        })
        .expect("read");
        assert_eq!(taken, 5);
        // Copies asked for while packing: a few at a time (some chunks read while it goes
        // on), more than two chunks in one ask (read in halves), and a few left at its end
        // (read when it is done), with ids that have no row; every row comes back by its
        // own id, the missing ones are left out.
        let missing = all.iter().map(|e| e.vid).max().unwrap_or(0) + 1;
        let (early, late) = order.split_at(order.len() / 3);
        let (late, last) = late.split_at(late.len() - 3);
        let ((), rows) = reading_copies(inner, |wanted| {
            for few in early.chunks(5) {
                wanted.read(&few.iter().map(|(v, _)| *v).collect::<Vec<_>>());
            }
            wanted.read(&[missing]);
            wanted.read(&[]);
            wanted.read(&late.iter().map(|(v, _)| *v).collect::<Vec<_>>());
            wanted.read(&last.iter().map(|(v, _)| *v).collect::<Vec<_>>());
            Ok(())
        })
        .expect("copies");
        assert!(late.len() >= 2 * READ_CHUNK && last.len() < READ_CHUNK);
        assert_eq!(rows.len(), order.len());
        for (v, m) in &rows {
            assert_eq!(m.content, format!("turn number {}", by_vid[v]));
        }
        // A packing that fails returns its error, not the rows.
        let failed = reading_copies(inner, |wanted| -> Result<()> {
            wanted.read(&order.iter().map(|(v, _)| *v).collect::<Vec<_>>());
            Err(HarnessError::Task("packing failed".into()))
        });
        assert!(matches!(failed, Err(HarnessError::Task(m)) if m == "packing failed"));
        // Stretches: 40 times (more than `AROUND_SPLIT`), read in halves and at once.
        let times: Vec<DateTime<Utc>> = all.iter().step_by(3).take(40).map(|e| e.at).collect();
        assert!(times.len() >= AROUND_SPLIT);
        let halves = stretches_around(inner.store.as_ref(), &f, &times).expect("halves");
        let whole = inner
            .store
            .timeline_around(&f, &times, NEIGHBOURS, NEIGHBOURS + 1)
            .expect("whole");
        assert_eq!(vids(&halves), vids(&whole));
        assert_eq!(halves.len(), times.len());
    }

    /// A repeat on a day, at 09:30.
    fn repeat_on(y: i32, m: u32, d: u32) -> Repeat {
        Repeat {
            id: MemoryId::new(),
            created_at: day(y, m, d).and_hms_opt(9, 30, 0).unwrap().and_utc(),
            metadata: Metadata::new(),
        }
    }

    fn day(y: i32, m: u32, d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(y, m, d).unwrap()
    }

    /// A header of days counted in pieces is its count, for the counters whose counts add up
    /// over lines, whatever the days: one, several in a month, several months in a year,
    /// several years (with and without days in the first day's year), every month's name,
    /// one- and two-digit days, years of one to four digits; and whatever the order the days
    /// are added in (a day before the first one moves the first into the others).
    #[test]
    fn day_headers_count_in_pieces() {
        let days = [
            day(7, 3, 4),
            day(99, 12, 31),
            day(812, 6, 15),
            day(1999, 1, 1),
            day(2023, 5, 8),
            day(2023, 5, 9),
            day(2023, 5, 31),
            day(2023, 9, 21),
            day(2023, 11, 30),
            day(2024, 11, 2),
            day(2100, 12, 31),
        ];
        let many: Vec<NaiveDate> = (2023..=2025)
            .flat_map(|y| (1..=12).flat_map(move |m| [day(y, m, 1), day(y, m, 9), day(y, m, 28)]))
            .collect();
        for c in [
            crate::TiktokenCounter::cl100k().unwrap(),
            crate::TiktokenCounter::o200k().unwrap(),
        ] {
            let pieces = HeaderPieces::new(&c);
            // (One cache for every set: a day counted for one header is counted alike in
            // the next.)
            let mut t = DayTokens::new(&c);
            let mut sets: Vec<&[NaiveDate]> = (1..=days.len()).map(|n| &days[..n]).collect();
            sets.extend((0..days.len()).map(|n| &days[n..]));
            sets.push(&many);
            for set in sets {
                let header = days_header(set);
                let want = c.count(&header);
                let count = DaysCount::of(&mut t, set).unwrap();
                assert_eq!(count.tokens(&pieces), want, "{}: {header:?}", c.name());
                // Newest first, and from the middle outwards: every step counted exactly.
                for order in [
                    set.iter().rev().copied().collect::<Vec<_>>(),
                    (0..set.len())
                        .map(|k| set[(set.len() / 2 + k * 7) % set.len()])
                        .collect(),
                ] {
                    let mut seen: Vec<NaiveDate> = Vec::new();
                    let mut count: Option<DaysCount> = None;
                    for d in order {
                        if seen.contains(&d) {
                            continue;
                        }
                        seen.push(d);
                        seen.sort_unstable();
                        match count.as_mut() {
                            None => count = Some(DaysCount::new(&mut t, d)),
                            Some(n) => n.add(&mut t, d),
                        }
                        let header = days_header(&seen);
                        assert_eq!(
                            count.as_ref().map(|n| n.tokens(&pieces)),
                            Some(c.count(&header)),
                            "{}: {header:?}",
                            c.name()
                        );
                    }
                }
            }
        }
    }

    /// A header names one day in full, or the first of several in full and the others by
    /// month: those of the first day's year without it, each later year once; a day in a
    /// month already named costs two tokens in cl100k with its comma, one in a new month
    /// four (eight for `2023-06-01,`).
    #[test]
    fn day_headers_group_their_days_by_month() {
        assert_eq!(days_header(&[day(2023, 5, 8)]), "[2023-05-08]\n");
        assert_eq!(
            days_header(&[day(2023, 5, 8), day(2023, 6, 1)]),
            "[2023-05-08; also on Jun 1]\n"
        );
        assert_eq!(
            days_header(&[day(2023, 5, 8), day(2023, 5, 9), day(2023, 5, 31)]),
            "[2023-05-08; also on May 9,31]\n"
        );
        assert_eq!(
            days_header(&[
                day(2022, 12, 30),
                day(2023, 6, 1),
                day(2023, 6, 12),
                day(2023, 7, 12),
                day(2024, 1, 5),
                day(2024, 12, 31)
            ]),
            "[2022-12-30; also on 2023: Jun 1,12, Jul 12; 2024: Jan 5, Dec 31]\n"
        );
        assert_eq!(
            days_header(&[day(2022, 12, 30), day(2022, 12, 31), day(2023, 1, 2)]),
            "[2022-12-30; also on Dec 31; 2023: Jan 2]\n"
        );
        let c = crate::TiktokenCounter::cl100k().unwrap();
        let pieces = HeaderPieces::new(&c);
        let tokens = |days: &[NaiveDate]| {
            DaysCount::of(&mut DayTokens::new(&c), days)
                .unwrap()
                .tokens(&pieces)
        };
        let months: Vec<NaiveDate> = (1..=6).map(|m| day(2023, m, 10 + m)).collect();
        assert_eq!(tokens(&months) - tokens(&months[..5]), 4);
        let june: Vec<NaiveDate> = (1..=6).map(|d| day(2023, 6, 3 * d + 7)).collect();
        assert_eq!(tokens(&june) - tokens(&june[..5]), 2);
    }

    /// Recalled lines said on the same days share one header naming them, in the order they
    /// were first said; a line said on one day is under that day's header, as before texts
    /// repeated; the groups come in the order of their first turn.
    #[test]
    fn lines_said_on_the_same_days_share_a_header() {
        let at = |d: u32, h: u32| day(2023, 6, d).and_hms_opt(h, 0, 0).unwrap().and_utc();
        let line = |text: &str, t: DateTime<Utc>, repeats: Vec<Repeat>| ContextItem {
            id: MemoryId::new(),
            kind: MemoryKind::Conversational,
            role: Some(Role::User),
            content: text.to_owned(),
            created_at: t,
            tokens: 0,
            section: Section::Recalled,
            metadata: Metadata::new(),
            thread_id: None,
            level: 0,
            span: None,
            source_ids: Vec::new(),
            repeats,
        };
        // The same exchange on June 2 and July 1 (the copy of one line on July 1 is the one
        // recalled, its June 2 turn a repeat), a line of June 1, one of June 3.
        let items = [
            line("Late on the 3rd.", at(3, 20), vec![]),
            line("How are you?", at(2, 9), vec![repeat_on(2023, 7, 1)]),
            line(
                "Fine, thanks.",
                day(2023, 7, 1).and_hms_opt(9, 0, 0).unwrap().and_utc(),
                vec![Repeat {
                    created_at: at(2, 10),
                    ..repeat_on(2023, 6, 2)
                }],
            ),
            line("Early on the 1st.", at(1, 8), vec![]),
            line("Also on the 3rd.", at(3, 7), vec![]),
        ];
        let refs: Vec<&ContextItem> = items.iter().collect();
        assert_eq!(
            recalled_block(&refs).unwrap(),
            "Recalled from earlier in this conversation:\n\
             [2023-06-01]\n\
             Early on the 1st.\n\
             [2023-06-02; also on Jul 1]\n\
             How are you?\n\
             Fine, thanks.\n\
             [2023-06-03]\n\
             Also on the 3rd.\n\
             Late on the 3rd.\n"
        );
    }

    /// A summary far longer than the room is told apart from a prefix; one that may fit is
    /// never refused by it.
    #[test]
    fn too_long_is_told_from_a_prefix_and_never_refuses_what_fits() {
        let c = crate::TiktokenCounter::cl100k().unwrap();
        let long = "word ".repeat(5_000);
        assert!(too_long(&long, 100, &c));
        assert!(!too_long(&long, 5_000, &c));
        let short = "word ".repeat(20);
        assert!(!too_long(&short, 10, &c), "short texts are counted whole");
        // Whatever the room, too_long implies the whole count is over it.
        for room in [0, 1, 5, 50, 200, 1_000, 4_000, 6_000] {
            for text in [&long, &"é".repeat(3_000), &"x".repeat(10_000)] {
                if too_long(text, room, &c) {
                    assert!(c.count(text) > room, "{room}");
                }
            }
        }
    }

    /// Overlapping stretches join; stretches that do not touch stay apart even when they
    /// are close in time (turns between them were not read); a single entry inside a
    /// stretch adds nothing; entries come once each, in time order.
    #[test]
    fn a_stretch_inside_a_page_is_held() {
        // Minutes 0..8, two entries at minute 5.
        let page: Vec<TimelineEntry> = [0, 1, 2, 3, 4, 5, 5, 6, 7]
            .iter()
            .enumerate()
            .map(|(vid, m)| entry(*m, vid as u64))
            .collect();
        let pages = std::slice::from_ref(&page);
        let minutes: std::collections::BTreeSet<i64> = (-1..10)
            .filter(|m| held_stretch(pages, entry(*m, 0).at, 2, 3))
            .collect();
        // Two before and three from the time's first entry: minutes 2 to 5 (5 starts at
        // index 5: 5, 5, 6 after it); 6 has 7 alone after it.
        assert_eq!(minutes, [2, 3, 4, 5].into_iter().collect());
        // A page that may start within a time's entries holds no stretch of its first time.
        let tail = [page[6..].to_vec()];
        assert!(!held_stretch(&tail, entry(5, 0).at, 0, 1));
        assert!(held_stretch(&tail, entry(6, 0).at, 0, 1));
        assert!(!held_stretch(&[], entry(3, 0).at, 2, 3));
    }

    #[test]
    fn stretches_join_where_they_overlap() {
        let stretches = vec![
            vec![entry(10, 10), entry(11, 11), entry(12, 12)],
            vec![entry(12, 12), entry(13, 13)],
            vec![entry(11, 11)],
            vec![entry(20, 20), entry(21, 21)],
            vec![entry(15, 15)],
            vec![],
        ];
        let joined = join_stretches(stretches);
        assert_eq!(
            vids(&joined),
            vec![vec![10, 11, 12, 13], vec![15], vec![20, 21]]
        );
        assert!(join_stretches(Vec::new()).is_empty());
    }
}
