//! The HNSW index: derived data, rebuilt from SQLite whenever it cannot be trusted.
//!
//! Data ids are the `vid` column of `memories` (never reused). Live entries have an
//! [`Attr`] row in memory; an entry in the graph without one is a tombstone, skipped by every
//! search and dropped at the next rebuild.

use std::collections::HashMap;
use std::fs;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use cairn_core::MemoryKind;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::hnsw::Hnsw;
use crate::{HnswParams, Result};

/// Version of the snapshot layout (manifest + graph file). Version 1 held hnsw_rs dump
/// files; version 2 graphs linked repeated vectors as nodes of their own (see
/// [`crate::hnsw`]'s twins). Older snapshots are rebuilt from SQLite.
pub const SNAPSHOT_FORMAT: u32 = 3;
const GRAPH_FILE: &str = "index.graph";
const MANIFEST: &str = "manifest.json";

/// What the filters need to know about a live entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attr {
    pub kind: MemoryKind,
    pub level: u32,
    pub created_at: i64,
    /// Interned thread; 0 = no thread.
    pub thread: u32,
    /// Expiry (microseconds); `i64::MAX` when none.
    pub expires: i64,
    /// Since when the fact holds (microseconds): its time unless given.
    pub valid_from: i64,
    /// Until when it holds (microseconds); `i64::MAX` while it still does.
    pub valid_to: i64,
}

impl Attr {
    /// Whether the entry may be hidden by time (an expiry or an end of validity).
    pub fn timed(&self) -> bool {
        self.expires != i64::MAX || self.valid_to != i64::MAX
    }

    /// Whether a read at `now` sees it: not expired (unless `expired`), and current (or,
    /// with `as_of`, valid then; with `history`, any version).
    pub fn visible(&self, now: i64, as_of: Option<i64>, history: bool, expired: bool) -> bool {
        (expired || self.expires > now)
            && match as_of {
                Some(t) => self.valid_from <= t && self.valid_to > t,
                None => history || self.valid_to > now,
            }
    }
}

/// Which live entries a filtered search admits, by vid and attributes.
pub(crate) type Admit<'a> = dyn Fn(usize, &Attr) -> bool + Sync + 'a;

/// Attribute rows by vid. Every filtered graph walk looks up each node it reaches here, so
/// the lookup is one read: vids are the store's own sequence (from 1, never reused), dense
/// enough to index a vector by (a hash map took two reads, its control bytes and its slot:
/// two fifths of a bounded recall's vector search on a 200,000-turn thread). A vid far
/// beyond the live entries (a sequence that jumped, or most entries deleted) is kept in a
/// hash map instead, so the vector never grows past about twice the live entries.
#[derive(Default)]
pub(crate) struct VidMap {
    /// Vids below its length; `None` for no live entry.
    dense: Vec<Option<Attr>>,
    /// Vids at or above `dense.len()`.
    sparse: FxHashMap<usize, Attr>,
    len: usize,
}

/// [`VidMap`] holds vids below this many times its live entries (plus [`DENSE_SLACK`])
/// densely.
const DENSE_FACTOR: usize = 2;
/// See [`DENSE_FACTOR`].
const DENSE_SLACK: usize = 1 << 12;

impl VidMap {
    /// The attributes of `vid`'s live entry.
    #[inline(always)]
    pub fn get(&self, vid: &usize) -> Option<&Attr> {
        match self.dense.get(*vid) {
            Some(slot) => slot.as_ref(),
            None if self.sparse.is_empty() => None,
            None => self.sparse.get(vid),
        }
    }

    /// Whether `vid` has a live entry.
    #[inline(always)]
    pub fn contains_key(&self, vid: &usize) -> bool {
        self.get(vid).is_some()
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The vids of the live entries (dense ones in order, then the others).
    pub fn keys(&self) -> impl Iterator<Item = usize> + '_ {
        self.dense
            .iter()
            .enumerate()
            .filter_map(|(v, a)| a.as_ref().map(|_| v))
            .chain(self.sparse.keys().copied())
    }

    /// Sets `vid`'s attributes; returns the ones they replace.
    pub fn insert(&mut self, vid: usize, attr: Attr) -> Option<Attr> {
        // (Bounded by the live entries after the insert: a vid already kept aside adds none.)
        let live = self.len + usize::from(!self.contains_key(&vid));
        if vid >= self.dense.len() && vid < DENSE_FACTOR * live + DENSE_SLACK {
            self.dense.resize(vid + 1, None);
            // Vids the vector now reaches move into it.
            if !self.sparse.is_empty() {
                let reached: Vec<usize> =
                    self.sparse.keys().filter(|v| **v <= vid).copied().collect();
                for v in reached {
                    self.dense[v] = self.sparse.remove(&v);
                }
            }
        }
        let old = match self.dense.get_mut(vid) {
            Some(slot) => slot.replace(attr),
            None => self.sparse.insert(vid, attr),
        };
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Takes `vid`'s attributes out.
    pub fn remove(&mut self, vid: &usize) -> Option<Attr> {
        let old = match self.dense.get_mut(*vid) {
            Some(slot) => slot.take(),
            None => self.sparse.remove(vid),
        };
        if old.is_some() {
            self.len -= 1;
        }
        old
    }
}

/// Attribute rows of live entries plus per-thread and per-kind counts.
#[derive(Default)]
pub(crate) struct Attrs {
    /// By vid.
    pub map: VidMap,
    threads: HashMap<String, u32>,
    thread_counts: HashMap<u32, usize>,
    kind_counts: HashMap<MemoryKind, usize>,
    thread_kind_counts: HashMap<(u32, MemoryKind), usize>,
    /// Live entries that time may hide ([`Attr::timed`]).
    pub timed: usize,
}

impl Attrs {
    pub fn thread_key(&self, thread: &str) -> Option<u32> {
        self.threads.get(thread).copied()
    }

    pub fn intern(&mut self, thread: Option<&str>) -> u32 {
        match thread {
            None => 0,
            Some(t) => {
                if let Some(k) = self.threads.get(t) {
                    return *k;
                }
                let k = u32::try_from(self.threads.len() + 1).unwrap_or(u32::MAX);
                self.threads.insert(t.to_owned(), k);
                k
            }
        }
    }

    fn add(&mut self, vid: usize, attr: Attr) {
        if let Some(old) = self.map.insert(vid, attr) {
            self.forget_counts(&old);
        }
        *self.thread_counts.entry(attr.thread).or_default() += 1;
        if attr.timed() {
            self.timed += 1;
        }
        *self.kind_counts.entry(attr.kind).or_default() += 1;
        *self
            .thread_kind_counts
            .entry((attr.thread, attr.kind))
            .or_default() += 1;
    }

    fn forget_counts(&mut self, a: &Attr) {
        if a.timed() {
            self.timed = self.timed.saturating_sub(1);
        }
        if let Some(c) = self.thread_counts.get_mut(&a.thread) {
            *c = c.saturating_sub(1);
        }
        if let Some(c) = self.kind_counts.get_mut(&a.kind) {
            *c = c.saturating_sub(1);
        }
        if let Some(c) = self.thread_kind_counts.get_mut(&(a.thread, a.kind)) {
            *c = c.saturating_sub(1);
        }
    }

    fn remove(&mut self, vid: usize) -> bool {
        match self.map.remove(&vid) {
            Some(old) => {
                self.forget_counts(&old);
                true
            }
            None => false,
        }
    }

    /// Live entries in a thread.
    pub fn thread_count(&self, key: u32) -> usize {
        self.thread_counts.get(&key).copied().unwrap_or(0)
    }

    /// Live entries of the given kinds in a thread.
    pub fn thread_kinds_count(&self, key: u32, kinds: &[MemoryKind]) -> usize {
        kinds
            .iter()
            .map(|k| {
                self.thread_kind_counts
                    .get(&(key, *k))
                    .copied()
                    .unwrap_or(0)
            })
            .sum()
    }

    /// Live entries of the given kinds.
    pub fn kinds_count(&self, kinds: &[MemoryKind]) -> usize {
        kinds
            .iter()
            .map(|k| self.kind_counts.get(k).copied().unwrap_or(0))
            .sum()
    }
}

/// The manifest written beside the snapshot files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`SNAPSHOT_FORMAT`].
    pub format_version: u32,
    /// Embedding model id.
    pub model_id: String,
    /// Embedding dimension.
    pub dim: usize,
    /// Graph parameters (ef_search is not part of the identity).
    pub m: usize,
    /// Graph parameter.
    pub ef_construction: usize,
    /// Graph parameter.
    pub max_layer: usize,
    /// Highest vid in the graph.
    pub max_vid: usize,
    /// Entries in the graph (live and deleted).
    pub points: usize,
    /// Deleted entries still in the graph when the snapshot was taken.
    pub deleted: usize,
    /// CRC-32 and length of each dump file.
    pub files: Vec<(String, u64, u32)>,
    /// Labels of the deleted entries whose vector the graph file does not hold.
    #[serde(default)]
    pub erased: Vec<u64>,
}

/// Index health figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexHealth {
    /// Entries in the graph, live and deleted.
    pub points: usize,
    /// Live entries.
    pub live: usize,
    /// Deleted entries awaiting a rebuild.
    pub tombstones: usize,
    /// Entries added since the last snapshot.
    pub unsnapshotted: usize,
    /// Highest vid in the graph.
    pub max_vid: usize,
}

struct GraphState {
    graph: Hnsw,
    max_vid: usize,
    since_snapshot: usize,
    /// Vids whose vector the loaded snapshot did not hold (deleted when it was written;
    /// sorted): such an entry cannot serve a live row.
    erased: Vec<usize>,
}

/// The HNSW graph plus live attributes.
pub(crate) struct VectorIndex {
    params: HnswParams,
    model_id: String,
    dim: usize,
    graph: RwLock<GraphState>,
    attrs: RwLock<Attrs>,
}

/// A graph label as a vid (labels past `usize` match no entry).
fn label_vid(l: u64) -> usize {
    usize::try_from(l).unwrap_or(usize::MAX)
}

fn read_lock<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write_lock<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// One entry to index.
pub(crate) struct Entry<'a> {
    pub vid: usize,
    pub vector: &'a [f32],
    pub attr: Attr,
}

impl VectorIndex {
    pub fn empty(params: HnswParams, model_id: &str, dim: usize) -> Self {
        Self::with_graph(params, model_id, dim, Hnsw::new(dim, params), 0, 0)
    }

    fn with_graph(
        params: HnswParams,
        model_id: &str,
        dim: usize,
        graph: Hnsw,
        max_vid: usize,
        since_snapshot: usize,
    ) -> Self {
        Self {
            params,
            model_id: model_id.to_owned(),
            dim,
            graph: RwLock::new(GraphState {
                graph,
                max_vid,
                since_snapshot,
                erased: Vec::new(),
            }),
            attrs: RwLock::new(Attrs::default()),
        }
    }

    pub fn attrs(&self) -> RwLockReadGuard<'_, Attrs> {
        read_lock(&self.attrs)
    }

    pub fn intern(&self, thread: Option<&str>) -> u32 {
        if let Some(t) = thread {
            if let Some(k) = read_lock(&self.attrs).thread_key(t) {
                return k;
            }
        }
        write_lock(&self.attrs).intern(thread)
    }

    /// Adds entries to the graph (batches linked in parallel) and marks them live. Searches
    /// go on while the new nodes are linked; they are filtered out until marked live.
    ///
    /// Vectors were checked by the store, so the graph cannot refuse them; if it did, the
    /// entries stay out of the index (reported, and found missing by `Store::check_index`
    /// and caught up at the next open).
    pub fn insert(&self, entries: &[Entry<'_>]) {
        if entries.is_empty() {
            return;
        }
        let items: Vec<(u64, &[f32])> = entries.iter().map(|e| (e.vid as u64, e.vector)).collect();
        let nodes = {
            let mut g = write_lock(&self.graph);
            match g.graph.reserve(&items) {
                Ok(nodes) => {
                    // Only the writer thread inserts, so the counters are exact.
                    g.since_snapshot += entries.len();
                    g.max_vid = g
                        .max_vid
                        .max(entries.iter().map(|e| e.vid).max().unwrap_or(0));
                    nodes
                }
                Err(e) => {
                    tracing::error!(error = %e, entries = entries.len(), "vector index refused entries");
                    return;
                }
            }
        };
        read_lock(&self.graph).graph.link(nodes, threads());
        let mut a = write_lock(&self.attrs);
        for e in entries {
            a.add(e.vid, e.attr);
        }
    }

    /// Changes the attributes of a live entry (same vector).
    pub fn set_attr(&self, vid: usize, attr: Attr) {
        let mut a = write_lock(&self.attrs);
        if a.map.contains_key(&vid) {
            a.add(vid, attr);
        }
    }

    /// Marks entries deleted; returns how many were live.
    pub fn remove(&self, vids: &[usize]) -> usize {
        let mut a = write_lock(&self.attrs);
        vids.iter().filter(|v| a.remove(**v)).count()
    }

    pub fn health(&self) -> IndexHealth {
        let g = read_lock(&self.graph);
        let live = read_lock(&self.attrs).map.len();
        let points = g.graph.len();
        IndexHealth {
            points,
            live,
            tombstones: points.saturating_sub(live),
            unsnapshotted: g.since_snapshot,
            max_vid: g.max_vid,
        }
    }

    /// How many of `vids` have an entry whose vector a snapshot erased (it was deleted when
    /// the snapshot was written): an index loaded from that snapshot cannot serve them.
    pub fn erased_among(&self, vids: impl IntoIterator<Item = usize>) -> usize {
        let g = read_lock(&self.graph);
        if g.erased.is_empty() {
            return 0;
        }
        vids.into_iter()
            .filter(|v| g.erased.binary_search(v).is_ok())
            .count()
    }

    /// Labels of every node in the graph (live and deleted).
    pub fn graph_vids(&self) -> Vec<usize> {
        read_lock(&self.graph)
            .graph
            .labels()
            .iter()
            .map(|l| usize::try_from(*l).unwrap_or(usize::MAX))
            .collect()
    }

    /// Approximate nearest neighbours among live entries admitted by `admit`, best first, as
    /// (vid, similarity).
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        admit: Option<&Admit<'_>>,
    ) -> Vec<(usize, f32)> {
        self.walk(admit, |g, f, live| {
            g.search(query, k, ef.max(k), f)
                .into_iter()
                .filter(|(l, _)| live(*l))
                .map(|(l, d)| (label_vid(l), 1.0 - d))
                .collect()
        })
    }

    /// [`Self::search`] with `k` counting distinct vectors (see [`Hnsw::search_groups`]): the
    /// `k` nearest vectors that live entries admitted by `admit` hold, each as (the least
    /// such vid, similarity, how many such entries hold it: counted as [`Hnsw::search_groups`]
    /// counts), best first.
    pub fn search_groups(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        admit: Option<&Admit<'_>>,
    ) -> Vec<(usize, f32, usize)> {
        self.walk(admit, |g, f, live| {
            g.search_groups(query, k, ef.max(k), f)
                .into_iter()
                .filter(|(l, _, _)| live(*l))
                .map(|(l, d, n)| (label_vid(l), 1.0 - d, n))
                .collect()
        })
    }

    /// Runs a graph search `search` with the label test that admits the live entries
    /// `admit` accepts (no test when the graph holds as many nodes as live entries and all
    /// are admitted), and a test of liveness for its answers (a node deleted while another
    /// entry waits to be linked passes the first).
    fn walk<T>(
        &self,
        admit: Option<&Admit<'_>>,
        search: impl FnOnce(&Hnsw, Option<&dyn Fn(u64) -> bool>, &dyn Fn(u64) -> bool) -> T,
    ) -> T {
        let g = read_lock(&self.graph);
        let attrs = read_lock(&self.attrs);
        // Nodes not (yet, or no longer) live are filtered out; with none, no filter runs.
        let all_live = g.graph.len() == attrs.map.len();
        let live = |l: u64| attrs.map.contains_key(&label_vid(l));
        let filtered = |l: u64| {
            let v = label_vid(l);
            attrs
                .map
                .get(&v)
                .is_some_and(|a| admit.is_some_and(|f| f(v, a)))
        };
        match admit {
            None if all_live => search(&g.graph, None, &live),
            None => search(&g.graph, Some(&live), &live),
            Some(_) => search(&g.graph, Some(&filtered), &live),
        }
    }

    /// For each of `vids`, which vector its graph node holds, as a key: vids with the same
    /// key hold the same vector (the same text stored again); `None` for a vid the graph
    /// does not hold.
    pub fn twin_keys(&self, vids: &[usize]) -> Vec<Option<usize>> {
        let g = read_lock(&self.graph);
        vids.iter()
            .map(|v| {
                g.graph
                    .twin_key(*v as u64)
                    .and_then(|k| usize::try_from(k).ok())
            })
            .collect()
    }

    /// The live entries `admit` accepts that hold the same vector as `vid`'s node (`vid`
    /// among them when admitted), as (vid, time in microseconds), in vid order.
    pub fn twins(&self, vid: usize, admit: &Admit<'_>) -> Vec<(usize, i64)> {
        let labels = read_lock(&self.graph).graph.twin_labels(vid as u64);
        let attrs = read_lock(&self.attrs);
        let mut out: Vec<(usize, i64)> = labels
            .into_iter()
            .filter_map(|l| {
                let v = usize::try_from(l).ok()?;
                let a = attrs.map.get(&v)?;
                admit(v, a).then_some((v, a.created_at))
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// Exact nearest neighbours among `vids` (best first, as (vid, similarity)), scored on
    /// the graph's vectors; `None` when one of them is not in the graph (yet).
    pub fn exact_among(
        &self,
        query: &[f32],
        k: usize,
        vids: &[usize],
    ) -> Option<Vec<(usize, f32)>> {
        let labels: Vec<u64> = vids.iter().map(|v| *v as u64).collect();
        let found = read_lock(&self.graph)
            .graph
            .exact_among(query, k, &labels)?;
        Some(
            found
                .into_iter()
                .map(|(l, d)| (usize::try_from(l).unwrap_or(usize::MAX), 1.0 - d))
                .collect(),
        )
    }

    /// Replaces the graph with a fresh one holding `entries` (a rebuild).
    pub fn replace_with(&self, entries: &[Entry<'_>]) {
        let mut fresh = Hnsw::new(self.dim, self.params);
        let items: Vec<(u64, &[f32])> = entries.iter().map(|e| (e.vid as u64, e.vector)).collect();
        if let Err(e) = fresh.insert(&items, threads()) {
            tracing::error!(error = %e, "vector index rebuild refused its entries");
        }
        let mut attrs = Attrs::default();
        {
            let old = read_lock(&self.attrs);
            attrs.threads = old.threads.clone();
        }
        for e in entries {
            if fresh.contains(e.vid as u64) {
                attrs.add(e.vid, e.attr);
            }
        }
        let mut g = write_lock(&self.graph);
        let mut a = write_lock(&self.attrs);
        let points = fresh.len();
        *g = GraphState {
            graph: fresh,
            max_vid: entries.iter().map(|e| e.vid).max().unwrap_or(0),
            since_snapshot: points,
            erased: Vec::new(),
        };
        *a = attrs;
    }

    /// Takes over `fresh`'s graph and live attributes (a rebuild made off the writer
    /// thread, brought up to date by the caller).
    pub fn swap_in(&self, fresh: VectorIndex) {
        let graph = fresh.graph.into_inner().unwrap_or_else(|p| p.into_inner());
        let attrs = fresh.attrs.into_inner().unwrap_or_else(|p| p.into_inner());
        let mut g = write_lock(&self.graph);
        let mut a = write_lock(&self.attrs);
        *g = graph;
        *a = attrs;
    }

    /// Sets the live attributes after loading a snapshot; returns the vids that are live in
    /// SQLite but missing from the graph (to be inserted).
    pub fn adopt_live(&self, live: Vec<(usize, Attr)>) -> Vec<usize> {
        let g = read_lock(&self.graph);
        let mut a = write_lock(&self.attrs);
        let mut missing = Vec::new();
        for (vid, attr) in live {
            if g.graph.contains(vid as u64) {
                a.add(vid, attr);
            } else {
                missing.push(vid);
            }
        }
        missing
    }

    /// Writes the snapshot directory `dir` atomically (temporary directory, then rename),
    /// under `lock` (the lock of `dir`'s writers; see [`SnapshotLock`]). Searches go on
    /// meanwhile; only the writer thread changes the graph. What an interrupted write of
    /// any process left beside `dir` (a temporary or a replaced directory, holding vectors
    /// as they were then) is removed first: under the lock no other write is under way
    /// (where the file system has no locks, only this process's own leftovers are).
    pub fn snapshot(&self, dir: &Path, lock: &SnapshotLock) -> Result<()> {
        let parent = dir.parent().unwrap_or(Path::new("."));
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "index".into());
        let tmp = parent.join(format!("{name}.tmp-{}", std::process::id()));
        let old = parent.join(format!("{name}.old-{}", std::process::id()));
        let stale = if lock.held {
            leftovers(parent, &name)?
        } else {
            [&tmp, &old]
                .into_iter()
                .filter(|d| d.exists())
                .cloned()
                .collect()
        };
        for d in stale {
            fs::remove_dir_all(d)?;
        }
        fs::create_dir_all(&tmp)?;
        let manifest = {
            let g = read_lock(&self.graph);
            let attrs = read_lock(&self.attrs);
            let points = g.graph.len();
            let deleted = points.saturating_sub(attrs.map.len());
            let path = tmp.join(GRAPH_FILE);
            let file = fs::File::create(&path)?;
            let mut w = BufWriter::with_capacity(1 << 20, CrcWriter::new(file));
            // A deleted entry's vector is not written (see `Hnsw::write_to_erasing`).
            let erased = g
                .graph
                .write_to_erasing(&mut w, |label| {
                    usize::try_from(label).is_ok_and(|v| attrs.map.contains_key(&v))
                })
                .map_err(|e| match e {
                    crate::hnsw::HnswError::Io(e) => e,
                    other => std::io::Error::other(other.to_string()),
                })?;
            drop(attrs);
            let cw = w.into_inner().map_err(|e| e.into_error())?;
            let (file, len, crc) = cw.finish();
            file.sync_all()?;
            Manifest {
                format_version: SNAPSHOT_FORMAT,
                model_id: self.model_id.clone(),
                dim: self.dim,
                m: self.params.m,
                ef_construction: self.params.ef_construction,
                max_layer: self.params.max_layer,
                max_vid: g.max_vid,
                points,
                deleted,
                files: vec![(GRAPH_FILE.to_owned(), len, crc)],
                erased,
            }
        };
        let json = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let mut f = fs::File::create(tmp.join(MANIFEST))?;
        f.write_all(&json)?;
        f.sync_all()?;
        if dir.exists() {
            fs::rename(dir, &old)?;
        }
        fs::rename(&tmp, dir)?;
        if old.exists() {
            fs::remove_dir_all(&old)?;
        }
        if let Ok(d) = fs::File::open(parent) {
            let _ = d.sync_all();
        }
        write_lock(&self.graph).since_snapshot = 0;
        Ok(())
    }

    /// Loads a snapshot written by [`Self::snapshot`]; `Err` with the reason when it is
    /// missing, damaged or made for other parameters.
    pub fn load(
        dir: &Path,
        params: HnswParams,
        model_id: &str,
        dim: usize,
    ) -> std::result::Result<Self, String> {
        let bytes = fs::read(dir.join(MANIFEST)).map_err(|e| format!("no manifest ({e})"))?;
        let m: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| format!("unreadable manifest ({e})"))?;
        if m.format_version != SNAPSHOT_FORMAT {
            return Err(format!(
                "snapshot format {} is not {SNAPSHOT_FORMAT}",
                m.format_version
            ));
        }
        if m.model_id != model_id || m.dim != dim {
            return Err(format!(
                "snapshot made for model {} ({} dims)",
                m.model_id, m.dim
            ));
        }
        if (m.m, m.ef_construction, m.max_layer)
            != (params.m, params.ef_construction, params.max_layer)
        {
            return Err("snapshot made with other HNSW parameters".into());
        }
        let [(file, len, crc)] = m.files.as_slice() else {
            return Err("manifest lists the wrong files".into());
        };
        if file != GRAPH_FILE {
            return Err(format!("manifest names an unknown file {file:?}"));
        }
        let f = fs::File::open(dir.join(GRAPH_FILE)).map_err(|e| format!("{file}: {e}"))?;
        let mut r = CrcReader::new(BufReader::with_capacity(1 << 20, f));
        let graph = Hnsw::read_from(&mut r, dim, params);
        let (got_len, got_crc) = r.finish();
        if (got_len, got_crc) != (*len, *crc) {
            return Err(format!(
                "{file} is truncated or corrupt (checksum mismatch)"
            ));
        }
        let graph = graph.map_err(|e| format!("{file}: {e}"))?;
        if graph.len() != m.points {
            return Err(format!(
                "snapshot holds {} points, manifest says {}",
                graph.len(),
                m.points
            ));
        }
        let index = Self::with_graph(params, model_id, dim, graph, m.max_vid, 0);
        let mut erased: Vec<usize> = m.erased.iter().map(|l| label_vid(*l)).collect();
        erased.sort_unstable();
        write_lock(&index.graph).erased = erased;
        Ok(index)
    }
}

/// A writer that counts and checksums what passes through it.
struct CrcWriter<W> {
    inner: W,
    len: u64,
    crc: crc32fast::Hasher,
}

impl<W> CrcWriter<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            len: 0,
            crc: crc32fast::Hasher::new(),
        }
    }

    fn finish(self) -> (W, u64, u32) {
        (self.inner, self.len, self.crc.finalize())
    }
}

impl<W: Write> Write for CrcWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that counts and checksums what passes through it (reading on to the end of the
/// file when finished, so trailing bytes count).
struct CrcReader<R> {
    inner: R,
    len: u64,
    crc: crc32fast::Hasher,
}

impl<R: Read> CrcReader<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            len: 0,
            crc: crc32fast::Hasher::new(),
        }
    }

    fn finish(mut self) -> (u64, u32) {
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(n) = self.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
        (self.len, self.crc.finalize())
    }
}

impl<R: Read> Read for CrcReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
}

/// The snapshot directory for a database file: `<db>.hnsw` beside it.
pub fn snapshot_dir(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push(".hnsw");
    PathBuf::from(s)
}

/// The directories an interrupted snapshot write left beside the snapshot `name` in
/// `parent`: `<name>.tmp-<pid>` (a write under way) and `<name>.old-<pid>` (the snapshot it
/// replaced).
fn leftovers(parent: &Path, name: &str) -> Result<Vec<PathBuf>> {
    let (tmp, old) = (format!("{name}.tmp-"), format!("{name}.old-"));
    let mut out = Vec::new();
    let entries = match fs::read_dir(parent) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e.into()),
    };
    for e in entries {
        let e = e?;
        let file_name = e.file_name();
        let f = file_name.to_string_lossy();
        let pid = f.strip_prefix(&tmp).or_else(|| f.strip_prefix(&old));
        if pid.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            && e.file_type()?.is_dir()
        {
            out.push(e.path());
        }
    }
    Ok(out)
}

/// The exclusive lock of a snapshot directory's writers, in every process: held from
/// before a writer catches its index up with the database until its snapshot is in place.
/// So a snapshot written last is never older than the database was when the one before it
/// was written: a process that deleted (and erased) a memory, then wrote its snapshot, is
/// not followed by another process's snapshot made from an index that still held the
/// memory's vector. A lock on the file `<dir>.lock` (the operating system's advisory file
/// lock, released when the guard is dropped or the process ends).
#[derive(Debug)]
pub struct SnapshotLock {
    _file: fs::File,
    /// Whether the lock is held: `false` on a file system without advisory locks.
    held: bool,
}

impl SnapshotLock {
    /// Waits for the lock of the snapshot directory `dir`.
    pub fn acquire(dir: &Path) -> Result<Self> {
        let mut path = dir.as_os_str().to_owned();
        path.push(".lock");
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(PathBuf::from(path))?;
        let held = match file.lock() {
            Ok(()) => true,
            // A file system without advisory locks: snapshots are still written whole (a
            // temporary directory, then a rename), only not one process at a time.
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                tracing::warn!(error = %e, "no file locks here: snapshots of several processes are not serialized");
                false
            }
            Err(e) => return Err(e.into()),
        };
        Ok(SnapshotLock { _file: file, held })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn attr(n: usize) -> Attr {
        Attr {
            kind: MemoryKind::ALL[n % MemoryKind::ALL.len()],
            level: 0,
            created_at: i64::try_from(n).unwrap_or(i64::MAX),
            thread: 1,
            expires: i64::MAX,
            valid_from: 0,
            valid_to: i64::MAX,
        }
    }

    proptest! {
        /// The dense vid map answers as a map does, for vids in sequence, scattered, and far
        /// beyond the live entries (kept aside, then moved in when the vector reaches them),
        /// and its vector stays within its bound of the live entries.
        #[test]
        fn vid_map_is_a_map(ops in prop::collection::vec(
            (
                prop::bool::weighted(0.7),
                prop_oneof![0usize..64, 0usize..6_000, Just(usize::MAX - 1)],
            ),
            0..600,
        )) {
            let mut m = VidMap::default();
            let mut model: BTreeMap<usize, Attr> = BTreeMap::new();
            let mut most = 0;
            for (i, (insert, vid)) in ops.iter().enumerate() {
                if *insert {
                    prop_assert_eq!(m.insert(*vid, attr(i)), model.insert(*vid, attr(i)));
                } else {
                    prop_assert_eq!(m.remove(vid), model.remove(vid));
                }
                most = most.max(model.len());
                prop_assert_eq!(m.len(), model.len());
                prop_assert!(m.dense.len() <= DENSE_FACTOR * most + DENSE_SLACK);
                prop_assert!(m.sparse.keys().all(|v| *v >= m.dense.len()));
            }
            for (i, (_, vid)) in ops.iter().enumerate() {
                for v in [*vid, vid.saturating_add(1), i] {
                    prop_assert_eq!(m.get(&v), model.get(&v));
                    prop_assert_eq!(m.contains_key(&v), model.contains_key(&v));
                }
            }
            let mut keys: Vec<usize> = m.keys().collect();
            keys.sort_unstable();
            prop_assert_eq!(keys, model.keys().copied().collect::<Vec<_>>());
        }
    }

    /// A vid kept aside and set again moves into the vector only within the bound of the
    /// live entries: setting it again adds no entry.
    #[test]
    fn a_vid_set_twice_keeps_the_vector_bounded() {
        let mut m = VidMap::default();
        let far = DENSE_FACTOR + DENSE_SLACK;
        assert!(m.insert(far, attr(0)).is_none());
        assert!(m.dense.len() <= DENSE_FACTOR + DENSE_SLACK);
        assert_eq!(m.insert(far, attr(1)), Some(attr(0)));
        assert_eq!(m.len(), 1);
        assert!(m.dense.len() <= DENSE_FACTOR + DENSE_SLACK);
        assert_eq!(m.get(&far), Some(&attr(1)));
        // A second live entry lets the vector reach it.
        assert!(m.insert(1, attr(2)).is_none());
        assert!(m.insert(far, attr(3)).is_some());
        assert_eq!(m.dense.len(), far + 1);
        assert!(m.sparse.is_empty());
        assert_eq!(m.get(&far), Some(&attr(3)));
    }
}
