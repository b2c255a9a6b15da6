//! `cairn`: load conversations into a Cairn store, consolidate them, search, expand,
//! assemble context and evaluate retrieval, from a shell or a script.
//!
//! Every read command takes `--json` (one JSON document on stdout); errors go to stderr with
//! a non-zero exit code. Long work shows a progress bar on a terminal and stays quiet when
//! piped.

mod eval;
mod eval_haystack;
mod eval_summaries;
mod serve;

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use cairn_core::{MemoryId, MemoryKind, MemoryUnit, NewMemory, Role, ThreadId};
use cairn_harness::import::{parse_jsonl, parse_locomo, JsonlRecord};
use cairn_harness::{
    ConsolidationPolicy, ContextOptions, DeletePolicy, Filter, MemoryHarness, OpenAiSummarizer,
    SearchMode, SearchOptions, SummaryTree,
};
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "cairn",
    version,
    about = "A hierarchical, vector-backed memory store for LLM agents"
)]
struct Cli {
    /// The store: a SQLite file (created if missing), or a PostgreSQL URL
    /// (`postgres://user@host:port/db`, optionally `?schema=NAME`; default schema `cairn`).
    #[arg(long, global = true, default_value = "cairn.db", env = "CAIRN_DB")]
    db: PathBuf,
    /// The namespace (tenant) to work in: `default` is the --db file itself, any other
    /// lives in FILE.ns/NAME.db beside it. `serve --stdio` serves this namespace; `keys
    /// create` makes a key for it.
    #[arg(
        long,
        global = true,
        default_value = "default",
        env = "CAIRN_NAMESPACE"
    )]
    namespace: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Jsonl,
    Locomo,
}

#[derive(Clone, Copy, ValueEnum)]
enum SummarizerChoice {
    Extractive,
    Openai,
}

#[derive(Subcommand)]
enum Command {
    /// Import memories (JSONL lines, a LoCoMo conversation, or a backup made by `cairn
    /// export`, recognised by its header line); importing twice adds nothing.
    Import {
        file: PathBuf,
        #[arg(long, value_enum, default_value = "jsonl")]
        format: Format,
        /// Thread (default for LoCoMo: the file's stem).
        #[arg(long)]
        thread: Option<String>,
    },
    /// Add one memory.
    Add {
        content: String,
        #[arg(long, default_value = "knowledge")]
        kind: String,
        #[arg(long)]
        thread: Option<String>,
        #[arg(long)]
        role: Option<String>,
        /// Metadata, a JSON object.
        #[arg(long, value_name = "JSON")]
        meta: Option<String>,
        /// An external key: adding the same keyed memory again is a no-op (its id is
        /// printed), so retries never duplicate.
        #[arg(long)]
        key: Option<String>,
        /// With --key: update the memory stored under the key instead (content re-embedded,
        /// metadata replaced).
        #[arg(long, requires = "key")]
        upsert: bool,
        /// Hidden from reads after this long (90s, 30m, 2h, 7d) and deleted by the next
        /// consolidation.
        #[arg(long, value_name = "DURATION")]
        ttl: Option<String>,
        /// This memory replaces an earlier fact (ID): reads return this one; the earlier
        /// one stays as history (`cairn history ID`, `search --history`, `--as-of`).
        #[arg(long, value_name = "ID")]
        supersedes: Option<String>,
        /// Since when the fact holds (RFC 3339; default: now).
        #[arg(long, value_name = "TIME")]
        valid_from: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Every version of a fact (what it superseded and what superseded it), oldest first.
    History {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// List memories, oldest first, a page at a time (the last line names the next page's
    /// cursor).
    List {
        #[arg(long)]
        kind: Vec<String>,
        #[arg(long)]
        thread: Option<String>,
        /// Metadata condition (repeatable): KEY=V, KEY!=V, KEY>V, KEY>=V, KEY<V, KEY<=V,
        /// KEY=[V1,V2], KEY? (present), !KEY (absent).
        #[arg(long = "where", value_name = "COND")]
        conditions: Vec<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Where to start (the cursor a previous page printed).
        #[arg(long)]
        cursor: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Merge a JSON object into a memory's metadata (`null` removes a field); the memory is
    /// not re-embedded.
    Patch {
        id: String,
        #[arg(long, value_name = "JSON")]
        meta: String,
        #[arg(long)]
        json: bool,
    },
    /// Forget memories so that nothing recalls them: delete them, rewrite the summaries
    /// built on them from what remains, drop their cached embeddings, and scrub their
    /// bytes from a SQLite store's files (database, log, index snapshot; not done while
    /// another process holds an older read, nor on PostgreSQL: the output says which).
    Forget {
        /// A memory (repeatable).
        #[arg(long)]
        id: Vec<String>,
        /// Every memory of a thread.
        #[arg(long, conflicts_with_all = ["id", "all", "conditions"])]
        thread: Option<String>,
        /// Every memory meeting these metadata conditions (repeatable; see `list`).
        #[arg(long = "where", value_name = "COND", conflicts_with_all = ["id", "all"])]
        conditions: Vec<String>,
        /// Everything in the store (needs --yes).
        #[arg(long, requires = "yes", conflicts_with = "id")]
        all: bool,
        #[arg(long)]
        yes: bool,
        #[arg(long)]
        json: bool,
    },
    /// Show one memory.
    Get {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Delete a memory.
    Delete {
        id: String,
        #[arg(long, default_value = "restrict")]
        policy: String,
        #[arg(long)]
        json: bool,
    },
    /// Search memories.
    Search {
        query: String,
        #[arg(long)]
        kind: Vec<String>,
        #[arg(long)]
        thread: Option<String>,
        #[arg(short, long)]
        k: Option<usize>,
        #[arg(long, default_value = "hybrid")]
        mode: String,
        /// Metadata condition (repeatable; see `list`).
        #[arg(long = "where", value_name = "COND")]
        conditions: Vec<String>,
        /// The facts that held at this time (RFC 3339), not the current ones.
        #[arg(long, value_name = "TIME")]
        as_of: Option<String>,
        /// Superseded facts too.
        #[arg(long)]
        history: bool,
        /// Recency decay: scores halve every DURATION of age (30d, 12h).
        #[arg(long, value_name = "DURATION")]
        half_life: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// A summary's sources (or every raw memory under it with --leaves).
    Expand {
        id: String,
        #[arg(long)]
        leaves: bool,
        #[arg(long)]
        json: bool,
    },
    /// Draw the summary hierarchy (under ID, or every top summary of a thread).
    Tree {
        id: Option<String>,
        #[arg(long)]
        thread: Option<String>,
        /// Levels to show below each root (all by default).
        #[arg(long)]
        depth: Option<usize>,
        #[arg(long)]
        json: bool,
    },
    /// Summarize old memories into a tree.
    Consolidate {
        /// Age in seconds, or with a unit: 90s, 30m, 2h, 7d.
        #[arg(long, default_value = "1h")]
        older_than: String,
        #[arg(long, default_value_t = 20)]
        chunk_size: usize,
        #[arg(long, default_value_t = 5)]
        fanout: usize,
        #[arg(long, value_enum, default_value = "extractive")]
        summarizer: SummarizerChoice,
        #[arg(long)]
        json: bool,
    },
    /// Counts and index health.
    Stats {
        #[arg(long)]
        json: bool,
    },
    /// Back up the whole store as JSONL: every memory, summaries with their links in order,
    /// levels, times, metadata and stale flags (`cairn import FILE` restores it, ids kept).
    /// With --memories: one thread's (or every) raw memory as plain import JSONL instead.
    Export {
        /// Put each memory's vector in the backup (an import then skips the model).
        #[arg(long, conflicts_with = "memories")]
        with_embeddings: bool,
        /// Raw memories only, as the lines `import --format jsonl` reads (not a backup).
        #[arg(long)]
        memories: bool,
        /// With --memories: this thread only.
        #[arg(long, requires = "memories")]
        thread: Option<String>,
    },
    /// Rebuild the vector index from the stored embeddings.
    Reindex,
    /// Assemble the context for a thread and a query within a token budget.
    Context {
        #[arg(long, required_unless_present = "batch")]
        thread: Option<String>,
        #[arg(long, required_unless_present = "batch")]
        query: Option<String>,
        #[arg(long, default_value_t = 2000)]
        budget: usize,
        /// JSONL lines {"thread", "query", "budget"}; one JSON result per line.
        #[arg(long)]
        batch: Option<PathBuf>,
        /// Context options as JSON (fields left out keep their defaults), e.g.
        /// '{"recent_share": 0.05, "weights": {"neighbor": 0}}'.
        #[arg(long, value_name = "JSON")]
        options: Option<String>,
        /// Recall the thread's knowledge memories too.
        #[arg(long)]
        knowledge: bool,
        /// Recall from this other thread too (repeatable): the same user's other
        /// conversations, say.
        #[arg(long = "scope", value_name = "THREAD")]
        scope: Vec<String>,
        /// Recall the memories of any thread meeting this metadata condition too
        /// (repeatable, all must hold; see `list`): the same user's memories, say.
        #[arg(long = "scope-where", value_name = "COND")]
        scope_where: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Serve the store: REST and MCP over HTTP (every request needs an API key from `cairn
    /// keys create`), or MCP over stdin/stdout for one namespace with --stdio.
    Serve {
        /// Address to listen on (HTTP).
        #[arg(long, default_value = "127.0.0.1:8420")]
        listen: String,
        /// Serve MCP over stdin/stdout instead (the form MCP clients launch); logs go to
        /// stderr.
        #[arg(long)]
        stdio: bool,
        /// Consolidate every namespace this often (90s, 30m, 1h, ...), in the server.
        #[arg(long, value_name = "DURATION")]
        consolidate_every: Option<String>,
        /// With --consolidate-every: summarize memories older than this.
        #[arg(long, default_value = "1h", value_name = "DURATION")]
        consolidate_older_than: String,
        /// Offer the memory_consolidate tool to MCP clients.
        #[arg(long)]
        allow_consolidate: bool,
        /// Largest request body, in bytes.
        #[arg(long, default_value_t = 16 * 1024 * 1024)]
        max_body: usize,
        /// Most memories in one add.
        #[arg(long, default_value_t = 1000)]
        max_batch: usize,
    },
    /// API keys: each opens one namespace of this store.
    Keys {
        #[command(subcommand)]
        what: KeysCommand,
    },
    /// Retrieval evaluations.
    Eval {
        #[command(subcommand)]
        what: EvalCommand,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Create a key for --namespace (default: `default`); it is printed once, as the last
    /// word of the last line, and only its hash is kept.
    Create { name: String },
    /// List the keys (names, namespaces, creation times; never the keys).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key by name.
    Revoke { name: String },
}

#[derive(Subcommand)]
enum EvalCommand {
    /// Evidence recall of several context strategies on LoCoMo conversations: overall, per
    /// question category and per conversation. With --haystack: evidence recall and latency
    /// of `assemble_context` with each conversation buried in a thread of N turns.
    Locomo {
        dir: PathBuf,
        #[arg(long, default_value_t = 2000)]
        budget: usize,
        /// Keep the evaluation store in this file (reused by later runs).
        #[arg(long, conflicts_with = "haystack")]
        store: Option<PathBuf>,
        /// Thread sizes in turns, e.g. 1000,10000: each conversation (the needle) gets a
        /// thread of about N turns (its own plus sessions of the others, speakers renamed and
        /// dates interleaved) and its questions are asked of that thread and of it alone.
        /// Replaces the strategy table.
        #[arg(long, value_delimiter = ',', value_name = "N[,N...]")]
        haystack: Vec<usize>,
        /// With --haystack: only this conversation (the file's stem) is a needle
        /// (repeatable; all of them when absent).
        #[arg(long = "needle", value_name = "STEM", requires = "haystack")]
        needles: Vec<String>,
        /// With --haystack: keep the stores in this directory; a later run reuses the ones
        /// that hold the same thread (no import, no consolidation).
        #[arg(long, value_name = "DIR", requires = "haystack")]
        store_dir: Option<PathBuf>,
        /// With --haystack: what the other conversations' sessions call their speakers:
        /// `renamed` to the needle's two (the evaluation), or `kept` (a diagnostic of what
        /// the renaming costs; stores `hay<N>-kept-<stem>.db`).
        #[arg(long, value_enum, default_value = "renamed", requires = "haystack")]
        haystack_speakers: eval_haystack::Speakers,
        /// Options for `assemble_context` as JSON (fields left out keep their defaults),
        /// e.g. '{"weights": {"names_out_of_vector": false}}'.
        #[arg(long, value_name = "JSON")]
        options: Option<String>,
        /// Run only this strategy (repeatable): last_n, flat_vector, flat_keyword,
        /// flat_hybrid, flat_hybrid_grouped, cairn_assemble_context.
        #[arg(long = "strategy", value_name = "NAME", conflicts_with = "haystack")]
        strategies: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Summary quality on LoCoMo conversations: Cairn's level-1 summaries, a lead baseline
    /// of the same length, and the dataset's session summaries; ROUGE against the session
    /// summaries, length ratio, and evidence recall through the top 3 summaries.
    Summaries {
        dir: PathBuf,
        /// Keep the evaluation store in this file (reused by later runs).
        #[arg(long)]
        store: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

/// `--options`: a JSON object of `ContextOptions` fields; the defaults without it.
fn context_options(json: Option<&str>) -> Result<ContextOptions> {
    json.map_or_else(
        || Ok(ContextOptions::default()),
        |j| {
            serde_json::from_str(j).with_context(|| {
                format!(
                    "--options: not valid context options ({j}); expected a JSON object of \
                     these fields, each optional: {}",
                    serde_json::to_string(&ContextOptions::default()).unwrap_or_default()
                )
            })
        },
    )
}

fn id(s: &str) -> Result<MemoryId> {
    s.parse()
        .with_context(|| format!("{s:?} is not a memory id"))
}

/// Metadata conditions in their text form (`--where`).
fn conditions(c: &[String]) -> Result<Vec<cairn_harness::MetaFilter>> {
    c.iter()
        .map(|s| {
            s.parse::<cairn_harness::MetaFilter>()
                .with_context(|| format!("--where {s:?}"))
        })
        .collect()
}

/// An RFC 3339 time given on the command line.
fn time(t: &str, flag: &str) -> Result<chrono::DateTime<chrono::Utc>> {
    Ok(chrono::DateTime::parse_from_rfc3339(t)
        .with_context(|| format!("{flag}: {t:?} is not an RFC 3339 time"))?
        .with_timezone(&chrono::Utc))
}

/// A JSON object given on the command line.
fn json_object(j: &str, flag: &str) -> Result<cairn_core::Metadata> {
    serde_json::from_str(j).with_context(|| format!("{flag}: expected a JSON object, got {j}"))
}

fn thread(s: &str) -> Result<ThreadId> {
    Ok(ThreadId::new(s)?)
}

/// Parses `90`, `90s`, `30m`, `2h`, `7d`.
fn duration(s: &str) -> Result<Duration> {
    cairn_server::parse_duration(s).map_err(anyhow::Error::msg)
}

fn print_json(v: &impl serde::Serialize) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, v)?;
    writeln!(out)?;
    Ok(())
}

fn line(m: &MemoryUnit) -> String {
    let text: String = m.content.replace('\n', " ").chars().take(100).collect();
    format!(
        "{}  {:<14} L{} {:<10} {}  {}",
        m.id,
        m.kind.as_str(),
        m.level,
        m.thread_id.as_ref().map_or("-", ThreadId::as_str),
        m.created_at.format("%Y-%m-%d %H:%M"),
        text
    )
}

fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    if std::io::stderr().is_terminal() {
        let pb = indicatif::ProgressBar::new(len);
        pb.set_message(what.to_owned());
        pb
    } else {
        indicatif::ProgressBar::hidden()
    }
}

async fn open(db: &Path) -> Result<MemoryHarness> {
    MemoryHarness::open(db)
        .await
        .with_context(|| format!("opening the store {}", cairn_harness::display_location(db)))
}

fn draw(t: &SummaryTree, depth: usize, out: &mut String) {
    let m = &t.memory;
    // The lines joined: a roll-up's first line is only its date range.
    let text: String = m.content.replace('\n', " ").chars().take(100).collect();
    out.push_str(&format!(
        "{}{} [L{}] {}\n",
        "  ".repeat(depth),
        m.id,
        m.level,
        text
    ));
    for c in &t.children {
        draw(c, depth + 1, out);
    }
}

/// Whether the file's first non-blank line is a backup header.
fn starts_as_backup(file: &Path) -> Result<bool> {
    let f = std::fs::File::open(file).with_context(|| format!("reading {}", file.display()))?;
    for l in std::io::BufReader::new(f).lines() {
        let l = l.with_context(|| format!("reading {}", file.display()))?;
        if !l.trim().is_empty() {
            return Ok(cairn_harness::backup::is_backup_header(&l));
        }
    }
    Ok(false)
}

/// Imports parsed memories in batches with a progress bar; returns (added, skipped).
async fn import_memories(mem: &MemoryHarness, memories: Vec<NewMemory>) -> Result<(usize, usize)> {
    let total = memories.len();
    let pb = progress(total as u64, "importing");
    let mut added = 0;
    for chunk in memories.chunks(256) {
        added += mem.add_new(chunk.to_vec()).await?.len();
        pb.inc(chunk.len() as u64);
    }
    pb.finish_and_clear();
    Ok((added, total - added))
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli).await {
        eprintln!("cairn: error: {e:#}");
        std::process::exit(1);
    }
}

async fn run(mut cli: Cli) -> Result<()> {
    let ns = cairn_server::Namespace::new(&cli.namespace)
        .map_err(|e| anyhow::anyhow!("--namespace: {e}"))?;
    let base = cli.db.clone();
    if !ns.is_default() {
        let path = cairn_server::namespace_path(&base, &ns);
        let file = !path.to_str().is_some_and(cairn_harness::is_postgres_url);
        if let Some(dir) = path.parent().filter(|_| file) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        cli.db = path;
    }
    match cli.command {
        Command::Serve {
            listen,
            stdio,
            consolidate_every,
            consolidate_older_than,
            allow_consolidate,
            max_body,
            max_batch,
        } => {
            serve::run(serve::Args {
                db: base,
                namespace: ns,
                listen,
                stdio,
                consolidate_every: consolidate_every.as_deref().map(duration).transpose()?,
                consolidate_older_than: duration(&consolidate_older_than)?,
                allow_consolidate,
                max_body,
                max_batch,
            })
            .await?;
        }
        Command::Keys { what } => {
            let keys = cairn_server::KeyStore::open(&base)?;
            match what {
                KeysCommand::Create { name } => {
                    let key = keys.create(&name, &ns)?;
                    println!(
                        "created key {name:?} for namespace {ns} of {} (shown once; only its hash is kept):",
                        base.display()
                    );
                    println!("{key}");
                }
                KeysCommand::List { json } => {
                    let list = keys.list()?;
                    if json {
                        print_json(&list)?;
                    } else {
                        for k in list {
                            println!(
                                "{:<24} {:<16} {}{}",
                                k.name,
                                k.namespace,
                                k.created_at,
                                if k.revoked { "  revoked" } else { "" }
                            );
                        }
                    }
                }
                KeysCommand::Revoke { name } => {
                    if !keys.revoke(&name)? {
                        bail!("no active key named {name:?}");
                    }
                    println!("revoked key {name:?}");
                }
            }
        }
        Command::Import {
            file,
            format,
            thread: t,
        } => {
            if matches!(format, Format::Jsonl) && t.is_none() && starts_as_backup(&file)? {
                let mem = open(&cli.db).await?;
                let r = mem
                    .import_backup(&file)
                    .await
                    .with_context(|| format!("{}: restoring the backup", file.display()))?;
                eprintln!(
                    "restored {} memories ({} already present; {} embedded)",
                    r.added, r.skipped, r.embedded
                );
                return Ok(());
            }
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let memories = match format {
                Format::Jsonl => {
                    let t = t.as_deref().map(thread).transpose()?;
                    parse_jsonl(&text, t.as_ref())
                        .with_context(|| format!("{}: nothing imported", file.display()))?
                }
                Format::Locomo => {
                    let stem = file
                        .file_stem()
                        .and_then(|s| s.to_str())
                        .unwrap_or("locomo");
                    let t = thread(t.as_deref().unwrap_or(stem))?;
                    parse_locomo(&text, &t)
                        .with_context(|| format!("{}: nothing imported", file.display()))?
                        .turns
                }
            };
            let mem = open(&cli.db).await?;
            let (added, skipped) = import_memories(&mem, memories).await?;
            eprintln!("imported {added} memories ({skipped} already present)");
        }
        Command::Add {
            content,
            kind,
            thread: t,
            role,
            meta,
            key,
            upsert,
            ttl,
            supersedes,
            valid_from,
            json,
        } => {
            let kind: MemoryKind = kind.parse()?;
            let mut m = NewMemory::new(kind, content);
            if let Some(t) = &ttl {
                let d = chrono::Duration::from_std(duration(t)?).context("--ttl is too long")?;
                m.lifetime.expires_at = Some(
                    chrono::Utc::now()
                        .checked_add_signed(d)
                        .context("--ttl reaches past the calendar")?,
                );
            }
            m.lifetime.supersedes = supersedes.as_deref().map(id).transpose()?;
            m.lifetime.valid_from = valid_from
                .as_deref()
                .map(|t| time(t, "--valid-from"))
                .transpose()?;
            m.thread_id = t.as_deref().map(thread).transpose()?;
            m.role = role.as_deref().map(str::parse::<Role>).transpose()?;
            if let Some(j) = &meta {
                m.metadata = json_object(j, "--meta")?;
            }
            if let Some(k) = &key {
                m = m.with_key(k);
            }
            let mem = open(&cli.db).await?;
            let new = if upsert {
                let up = mem.upsert(m).await?;
                if !json {
                    eprintln!("{}", serde_json::to_string(&up.outcome)?.trim_matches('"'));
                }
                up.memory.id
            } else {
                mem.add(m).await?
            };
            if json {
                print_json(&mem.get(new).await?)?;
            } else {
                println!("{new}");
            }
        }
        Command::History { id: i, json } => {
            let mem = open(&cli.db).await?;
            let versions = mem.history(id(&i)?).await?;
            if json {
                print_json(&versions)?;
            } else {
                for m in &versions {
                    let l = &m.lifetime;
                    println!(
                        "{}  {} .. {}",
                        line(m),
                        l.valid_from
                            .unwrap_or(m.created_at)
                            .format("%Y-%m-%d %H:%M"),
                        l.valid_to
                            .map_or("now".to_owned(), |t| t.format("%Y-%m-%d %H:%M").to_string())
                    );
                }
            }
        }
        Command::List {
            kind,
            thread: t,
            conditions: c,
            limit,
            cursor,
            json,
        } => {
            let mut f = Filter::all();
            f.kinds = kind
                .iter()
                .map(|k| k.parse::<MemoryKind>())
                .collect::<Result<_, _>>()?;
            f.thread = t.as_deref().map(thread).transpose()?;
            f.metadata = conditions(&c)?;
            let cursor = cursor
                .as_deref()
                .map(str::parse::<cairn_harness::Cursor>)
                .transpose()?;
            let mem = open(&cli.db).await?;
            let page = mem.list_page(f, cursor, limit).await?;
            if json {
                print_json(&page)?;
            } else {
                page.items.iter().for_each(|m| println!("{}", line(m)));
                if let Some(next) = page.next {
                    println!("next: --cursor {next}");
                }
            }
        }
        Command::Patch { id: i, meta, json } => {
            let patch = json_object(&meta, "--meta")?;
            let mem = open(&cli.db).await?;
            let m = mem.patch_metadata(id(&i)?, patch).await?;
            if json {
                print_json(&m)?;
            } else {
                println!("{}", serde_json::to_string(&m.metadata)?);
            }
        }
        Command::Forget {
            id: ids,
            thread: t,
            conditions: c,
            all,
            yes: _,
            json,
        } => {
            let what = if all {
                cairn_harness::Forget::Everything
            } else if let Some(t) = t {
                cairn_harness::Forget::Thread(thread(&t)?)
            } else if !c.is_empty() {
                let mut f = Filter::all();
                f.metadata = conditions(&c)?;
                cairn_harness::Forget::Filter(f)
            } else if !ids.is_empty() {
                cairn_harness::Forget::Ids(ids.iter().map(|i| id(i)).collect::<Result<_>>()?)
            } else {
                anyhow::bail!("say what to forget: --id, --thread, --where or --all --yes");
            };
            let mem = open(&cli.db).await?;
            let r = mem.forget(what).await?;
            if json {
                print_json(&r)?;
            } else {
                println!(
                    "forgot {} memories; {} summaries rewritten, {} dropped; {}",
                    r.deleted.len(),
                    r.resummarized.len(),
                    r.dropped.len(),
                    if r.erased {
                        "the files hold none of their bytes"
                    } else {
                        "their bytes may stay in the files until reused (see `forget --help`)"
                    }
                );
            }
        }
        Command::Get { id: i, json } => {
            let mem = open(&cli.db).await?;
            let m = mem.get(id(&i)?).await?;
            if json {
                print_json(&m)?;
            } else {
                println!("{}", line(&m));
                println!("{}", m.content);
                if let Some(s) = &m.summary {
                    println!(
                        "summary of {} sources ({} .. {}){}",
                        s.source_count,
                        s.time_range_start,
                        s.time_range_end,
                        if s.stale { ", stale" } else { "" }
                    );
                }
            }
        }
        Command::Delete {
            id: i,
            policy,
            json,
        } => {
            let policy: DeletePolicy = policy.parse()?;
            let mem = open(&cli.db).await?;
            let r = mem.delete_with(id(&i)?, policy).await?;
            if json {
                print_json(&r)?;
            } else {
                println!(
                    "deleted {} memories; {} summaries detached",
                    r.deleted.len(),
                    r.detached.len()
                );
            }
        }
        Command::Search {
            query,
            kind,
            thread: t,
            k,
            mode,
            conditions: c,
            as_of,
            history,
            half_life,
            json,
        } => {
            let mut opts = SearchOptions::all().mode(mode.parse::<SearchMode>()?);
            opts.filter.metadata = conditions(&c)?;
            opts.filter.as_of = as_of.as_deref().map(|t| time(t, "--as-of")).transpose()?;
            opts.filter.history = history;
            opts.half_life = half_life.as_deref().map(duration).transpose()?;
            opts.filter.kinds = kind
                .iter()
                .map(|k| k.parse::<MemoryKind>())
                .collect::<Result<_, _>>()?;
            opts.filter.thread = t.as_deref().map(thread).transpose()?;
            opts.k = k;
            let mem = open(&cli.db).await?;
            let hits = mem.search(&query, opts).await?;
            if json {
                print_json(&hits)?;
            } else {
                for h in hits {
                    println!("{:>8.4}  {}", h.score, line(&h.memory));
                }
            }
        }
        Command::Expand {
            id: i,
            leaves,
            json,
        } => {
            let mem = open(&cli.db).await?;
            let out = if leaves {
                mem.expand_to_leaves(id(&i)?).await?
            } else {
                mem.expand_summary(id(&i)?).await?
            };
            if json {
                print_json(&out)?;
            } else {
                out.iter().for_each(|m| println!("{}", line(m)));
            }
        }
        Command::Tree {
            id: i,
            thread: t,
            depth,
            json,
        } => {
            let mem = open(&cli.db).await?;
            let roots: Vec<MemoryId> = match (i, t) {
                (Some(i), _) => vec![id(&i)?],
                (None, t) => {
                    let mut f = Filter::all().kinds([MemoryKind::Summary]);
                    f.thread = t.as_deref().map(thread).transpose()?;
                    let mut tops = Vec::new();
                    for s in mem.list(f, 0, usize::MAX).await? {
                        if mem.summaries_of(s.id).await?.is_empty() {
                            tops.push(s.id);
                        }
                    }
                    tops
                }
            };
            let mut trees = Vec::new();
            for r in roots {
                let depth = depth.unwrap_or(cairn_harness::MAX_TREE_DEPTH);
                trees.push(mem.summary_tree_depth(r, depth).await?);
            }
            if json {
                print_json(&trees)?;
            } else {
                let mut out = String::new();
                trees.iter().for_each(|t| draw(t, 0, &mut out));
                print!("{out}");
            }
        }
        Command::Consolidate {
            older_than,
            chunk_size,
            fanout,
            summarizer,
            json,
        } => {
            let mut b = MemoryHarness::builder(&cli.db);
            if let SummarizerChoice::Openai = summarizer {
                let url = std::env::var("CAIRN_OPENAI_BASE_URL").context("--summarizer openai needs CAIRN_OPENAI_BASE_URL (and optionally CAIRN_OPENAI_MODEL, OPENAI_API_KEY)")?;
                let model =
                    std::env::var("CAIRN_OPENAI_MODEL").unwrap_or_else(|_| "gpt-4o-mini".into());
                b = b.summarizer(std::sync::Arc::new(
                    OpenAiSummarizer::builder(url, model).build()?,
                ));
            }
            let mem = b.build().await?;
            let pb = progress(0, "consolidating");
            pb.enable_steady_tick(Duration::from_millis(200));
            let policy = ConsolidationPolicy::older_than(duration(&older_than)?)
                .chunk_size(chunk_size)
                .fanout(fanout);
            let report = mem.consolidate(policy).await?;
            pb.finish_and_clear();
            if json {
                print_json(&report)?;
            } else {
                println!("{report}");
                for f in &report.failures {
                    println!(
                        "  failed (kept for the next run): level {} {:?}: {}",
                        f.level,
                        f.thread.as_ref().map(ThreadId::as_str),
                        f.reason
                    );
                }
            }
        }
        Command::Stats { json } => {
            let mem = open(&cli.db).await?;
            let s = mem.stats().await?;
            if json {
                print_json(&s)?;
            } else {
                println!(
                    "model {}; {} memories, {} links, {} stale summaries",
                    s.model_id, s.store.total, s.store.links, s.store.stale_summaries
                );
                let mut kinds: Vec<_> = s.store.by_kind.iter().collect();
                kinds.sort();
                for (k, n) in kinds {
                    println!("  {k:<15} {n}");
                }
                let mut levels: Vec<_> = s.store.by_level.iter().collect();
                levels.sort();
                for (l, n) in levels {
                    println!("  level {l:<9} {n}");
                }
                println!(
                    "index: {} live, {} tombstones, {} unsnapshotted",
                    s.store.index.live, s.store.index.tombstones, s.store.index.unsnapshotted
                );
            }
        }
        Command::Export {
            with_embeddings,
            memories: false,
            ..
        } => {
            let mem = open(&cli.db).await?;
            let n = mem
                .export_backup(std::io::stdout(), with_embeddings)
                .await?;
            eprintln!("backed up {n} memories");
        }
        Command::Export { thread: t, .. } => {
            let mem = open(&cli.db).await?;
            let mut f = Filter::all();
            f.thread = t.as_deref().map(thread).transpose()?;
            let mut out = std::io::stdout().lock();
            for m in mem.list(f, 0, usize::MAX).await? {
                if m.kind == MemoryKind::Summary {
                    continue;
                }
                // A text speaker is written as the record's `speaker` field.
                let speaker = m.speaker().map(str::to_owned);
                let mut metadata = m.metadata;
                if speaker.is_some() {
                    metadata.remove(cairn_core::SPEAKER_KEY);
                }
                let r = JsonlRecord {
                    id: Some(m.id),
                    thread: m.thread_id,
                    role: m.role,
                    kind: Some(m.kind),
                    content: m.content,
                    created_at: Some(m.created_at),
                    speaker,
                    metadata,
                };
                serde_json::to_writer(&mut out, &r)?;
                writeln!(out)?;
            }
        }
        Command::Reindex => {
            let mem = open(&cli.db).await?;
            let pb = progress(0, "reindexing");
            pb.enable_steady_tick(Duration::from_millis(200));
            mem.reindex().await?;
            pb.finish_and_clear();
            eprintln!("index rebuilt");
        }
        Command::Context {
            thread: t,
            query,
            budget,
            batch,
            options,
            knowledge,
            scope,
            scope_where,
            json,
        } => {
            let mut options = context_options(options.as_deref())?;
            options.knowledge |= knowledge;
            let mut scope = cairn_harness::ContextScope::threads(&scope)?;
            scope.metadata = conditions(&scope_where)?;
            let mem = open(&cli.db).await?;
            let render = |ctx: &cairn_harness::AssembledContext| {
                serde_json::json!({
                    "tokens": ctx.tokens,
                    "budget": ctx.budget,
                    "items": ctx.items.iter().map(|i| serde_json::json!({
                        "id": i.id, "kind": i.kind, "level": i.level, "section": i.section,
                        "content": i.content, "created_at": i.created_at,
                        "metadata": i.metadata, "source_ids": i.source_ids,
                        "span": i.span, "thread_id": i.thread_id,
                        "repeats": i.repeats,
                    })).collect::<Vec<_>>(),
                })
            };
            if let Some(file) = batch {
                let reader = std::io::BufReader::new(
                    std::fs::File::open(&file)
                        .with_context(|| format!("reading {}", file.display()))?,
                );
                for (n, l) in reader.lines().enumerate() {
                    let l = l?;
                    if l.trim().is_empty() {
                        continue;
                    }
                    let v: serde_json::Value =
                        serde_json::from_str(&l).with_context(|| format!("line {}", n + 1))?;
                    let (Some(t), Some(q)) = (v["thread"].as_str(), v["query"].as_str()) else {
                        bail!("line {}: needs \"thread\" and \"query\"", n + 1);
                    };
                    let b = v["budget"]
                        .as_u64()
                        .map_or(budget, |b| usize::try_from(b).unwrap_or(usize::MAX));
                    let ctx = mem
                        .assemble_context_scoped(t, q, b, options, scope.clone())
                        .await?;
                    print_json(&render(&ctx))?;
                }
            } else {
                let (Some(t), Some(q)) = (t, query) else {
                    bail!("--thread and --query are required")
                };
                let ctx = mem
                    .assemble_context_scoped(&t, &q, budget, options, scope)
                    .await?;
                if json {
                    print_json(&render(&ctx))?;
                } else {
                    println!(
                        "{}\n\n({} of {} tokens)",
                        ctx.render(),
                        ctx.tokens,
                        ctx.budget
                    );
                }
            }
        }
        Command::Eval {
            what:
                EvalCommand::Locomo {
                    dir,
                    budget,
                    options,
                    haystack,
                    needles,
                    store_dir,
                    haystack_speakers,
                    json,
                    ..
                },
        } if !haystack.is_empty() => {
            let options = context_options(options.as_deref())?;
            let report = eval_haystack::haystack(
                &dir,
                &haystack,
                budget,
                options,
                &needles,
                store_dir.as_deref(),
                haystack_speakers,
            )
            .await?;
            if json {
                print_json(&report)?;
            } else {
                print!("{}", eval_haystack::table(&report));
            }
        }
        Command::Eval {
            what:
                EvalCommand::Locomo {
                    dir,
                    budget,
                    store,
                    options,
                    strategies,
                    json,
                    ..
                },
        } => {
            let options = context_options(options.as_deref())?;
            let report = eval::locomo(&dir, budget, store.as_deref(), options, &strategies).await?;
            if json {
                print_json(&report)?;
            } else {
                print!("{}", eval::table(&report));
            }
        }
        Command::Eval {
            what: EvalCommand::Summaries { dir, store, json },
        } => {
            let report = eval_summaries::summaries(&dir, store.as_deref()).await?;
            if json {
                print_json(&report)?;
            } else {
                print!("{}", eval_summaries::table(&report));
            }
        }
    }
    Ok(())
}
