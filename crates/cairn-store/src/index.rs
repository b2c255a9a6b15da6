//! The HNSW index: derived data, rebuilt from SQLite whenever it cannot be trusted.
//!
//! Data ids are the `vid` column of `memories` (never reused). Live entries have an
//! [`Attr`] row in memory; an entry in the graph without one is a tombstone, skipped by every
//! search and dropped at the next rebuild.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use cairn_core::MemoryKind;
use hnsw_rs::api::AnnT;
use hnsw_rs::prelude::{DistDot, FilterT, Hnsw, HnswIo};
use serde::{Deserialize, Serialize};

use crate::{HnswParams, Result};

/// Version of the snapshot layout (manifest + hnsw_rs dump files).
pub const SNAPSHOT_FORMAT: u32 = 1;
const BASENAME: &str = "index";
const MANIFEST: &str = "manifest.json";

/// What the filters need to know about a live entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attr {
    pub kind: MemoryKind,
    pub level: u32,
    pub created_at: i64,
    /// Interned thread; 0 = no thread.
    pub thread: u32,
}

type Graph<'a> = Hnsw<'a, f32, DistDot>;

self_cell::self_cell!(
    struct LoadedGraph {
        owner: HnswIo,
        #[not_covariant]
        dependent: Graph,
    }
);

enum GraphCell {
    Built(Graph<'static>),
    Loaded(LoadedGraph),
}

impl GraphCell {
    fn with<R>(&self, f: impl for<'x> FnOnce(&Graph<'x>) -> R) -> R {
        match self {
            GraphCell::Built(g) => f(g),
            GraphCell::Loaded(l) => l.with_dependent(|_, g| f(g)),
        }
    }
}

/// Attribute rows of live entries plus per-thread and per-kind counts.
#[derive(Default)]
pub(crate) struct Attrs {
    pub map: HashMap<usize, Attr>,
    threads: HashMap<String, u32>,
    thread_counts: HashMap<u32, usize>,
    kind_counts: HashMap<MemoryKind, usize>,
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
        *self.kind_counts.entry(attr.kind).or_default() += 1;
    }

    fn forget_counts(&mut self, a: &Attr) {
        if let Some(c) = self.thread_counts.get_mut(&a.thread) {
            *c = c.saturating_sub(1);
        }
        if let Some(c) = self.kind_counts.get_mut(&a.kind) {
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
    cell: GraphCell,
    points: usize,
    max_vid: usize,
    since_snapshot: usize,
}

/// The HNSW graph plus live attributes.
pub(crate) struct VectorIndex {
    params: HnswParams,
    model_id: String,
    dim: usize,
    graph: RwLock<GraphState>,
    attrs: RwLock<Attrs>,
}

fn new_graph(params: &HnswParams, capacity: usize) -> Graph<'static> {
    // Parameters were validated by `HnswParams::validate`, so `Hnsw::new` cannot exit.
    Hnsw::new(
        params.m,
        capacity.max(1_000),
        params.max_layer,
        params.ef_construction,
        DistDot {},
    )
}

fn read_lock<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write_lock<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

/// One entry to index.
pub(crate) struct Entry<'a> {
    pub vid: usize,
    pub vector: &'a [f32],
    pub attr: Attr,
}

impl VectorIndex {
    pub fn empty(params: HnswParams, model_id: &str, dim: usize, capacity: usize) -> Self {
        Self {
            params,
            model_id: model_id.to_owned(),
            dim,
            graph: RwLock::new(GraphState {
                cell: GraphCell::Built(new_graph(&params, capacity)),
                points: 0,
                max_vid: 0,
                since_snapshot: 0,
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

    /// Adds entries to the graph (in parallel for batches) and marks them live.
    pub fn insert(&self, entries: &[Entry<'_>]) {
        if entries.is_empty() {
            return;
        }
        {
            let mut g = write_lock(&self.graph);
            // Only the writer thread inserts, so the counters are exact.
            g.points += entries.len();
            g.since_snapshot += entries.len();
            g.max_vid = g
                .max_vid
                .max(entries.iter().map(|e| e.vid).max().unwrap_or(0));
        }
        {
            let g = read_lock(&self.graph);
            g.cell.with(|graph| {
                if entries.len() >= 32 {
                    let batch: Vec<(&[f32], usize)> =
                        entries.iter().map(|e| (e.vector, e.vid)).collect();
                    graph.parallel_insert_slice(&batch);
                } else {
                    for e in entries {
                        graph.insert_slice((e.vector, e.vid));
                    }
                }
            });
        }
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
        IndexHealth {
            points: g.points,
            live,
            tombstones: g.points.saturating_sub(live),
            unsnapshotted: g.since_snapshot,
            max_vid: g.max_vid,
        }
    }

    /// Approximate nearest neighbours among live entries admitted by `admit`, best first, as
    /// (vid, similarity).
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        admit: Option<&(dyn Fn(&Attr) -> bool + Sync)>,
    ) -> Vec<(usize, f32)> {
        let g = read_lock(&self.graph);
        let attrs = read_lock(&self.attrs);
        let ef = ef.max(k);
        let tombstones = g.points > attrs.map.len();
        let found = g.cell.with(|graph| match admit {
            None if !tombstones => graph.search(query, k, ef),
            None => {
                let f = |id: &usize| attrs.map.contains_key(id);
                graph.search_filter(query, k, ef, Some(&f as &dyn FilterT))
            }
            Some(admit) => {
                let f = |id: &usize| attrs.map.get(id).is_some_and(admit);
                graph.search_filter(query, k, ef, Some(&f as &dyn FilterT))
            }
        });
        found
            .into_iter()
            .filter(|n| attrs.map.contains_key(&n.d_id))
            .map(|n| (n.d_id, 1.0 - n.distance))
            .collect()
    }

    /// Replaces the graph with a fresh one holding `entries` (a rebuild).
    pub fn replace_with(&self, entries: &[Entry<'_>]) {
        let fresh = new_graph(&self.params, entries.len());
        for chunk in entries.chunks(4096) {
            let batch: Vec<(&[f32], usize)> = chunk.iter().map(|e| (e.vector, e.vid)).collect();
            fresh.parallel_insert_slice(&batch);
        }
        let mut attrs = Attrs::default();
        {
            let old = read_lock(&self.attrs);
            attrs.threads = old.threads.clone();
        }
        for e in entries {
            attrs.add(e.vid, e.attr);
        }
        let mut g = write_lock(&self.graph);
        let mut a = write_lock(&self.attrs);
        *g = GraphState {
            cell: GraphCell::Built(fresh),
            points: entries.len(),
            max_vid: entries.iter().map(|e| e.vid).max().unwrap_or(0),
            since_snapshot: entries.len(),
        };
        *a = attrs;
    }

    /// Sets the live attributes after loading a snapshot; returns the vids that are live in
    /// SQLite but missing from the graph (to be inserted).
    pub fn adopt_live(&self, live: Vec<(usize, Attr)>) -> Vec<usize> {
        let g = read_lock(&self.graph);
        // hnsw_rs's point iterator panics on a graph without an entry point.
        let indexed: HashSet<usize> = if g.points == 0 {
            HashSet::new()
        } else {
            g.cell.with(|graph| {
                graph
                    .get_point_indexation()
                    .into_iter()
                    .map(|p| p.get_origin_id())
                    .collect()
            })
        };
        drop(g);
        let mut a = write_lock(&self.attrs);
        let mut missing = Vec::new();
        for (vid, attr) in live {
            if indexed.contains(&vid) {
                a.add(vid, attr);
            } else {
                missing.push(vid);
            }
        }
        missing
    }

    /// Writes the snapshot directory `dir` atomically (temporary directory, then rename).
    pub fn snapshot(&self, dir: &Path) -> Result<()> {
        let parent = dir.parent().unwrap_or(Path::new("."));
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "index".into());
        let tmp = parent.join(format!("{name}.tmp-{}", std::process::id()));
        let old = parent.join(format!("{name}.old-{}", std::process::id()));
        if tmp.exists() {
            fs::remove_dir_all(&tmp)?;
        }
        fs::create_dir_all(&tmp)?;
        let mut g = write_lock(&self.graph);
        let deleted = g.points.saturating_sub(read_lock(&self.attrs).map.len());
        let mut files = Vec::new();
        // hnsw_rs cannot dump an empty graph: an empty snapshot is a manifest alone.
        if g.points > 0 {
            let dumped = g.cell.with(|graph| graph.file_dump(&tmp, BASENAME));
            let basename = dumped.map_err(|e| std::io::Error::other(format!("index dump: {e}")))?;
            for suffix in ["hnsw.graph", "hnsw.data"] {
                let file = format!("{basename}.{suffix}");
                let (len, crc) = checksum(&tmp.join(&file))?;
                files.push((file, len, crc));
            }
        }
        let manifest = Manifest {
            format_version: SNAPSHOT_FORMAT,
            model_id: self.model_id.clone(),
            dim: self.dim,
            m: self.params.m,
            ef_construction: self.params.ef_construction,
            max_layer: self.params.max_layer,
            max_vid: g.max_vid,
            points: g.points,
            deleted,
            files,
        };
        let json = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let mut f = fs::File::create(tmp.join(MANIFEST))?;
        f.write_all(&json)?;
        f.sync_all()?;
        for (file, _, _) in &manifest.files {
            fs::File::open(tmp.join(file))?.sync_all()?;
        }
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
        g.since_snapshot = 0;
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
        if m.points == 0 && m.files.is_empty() {
            return Ok(Self::empty(params, model_id, dim, 0));
        }
        if m.files.len() != 2 {
            return Err("manifest lists the wrong files".into());
        }
        let mut basename = None;
        for (file, len, crc) in &m.files {
            if file.contains('/') || file.contains('\\') || file.contains("..") {
                return Err("manifest names a file outside the snapshot".into());
            }
            let got = checksum(&dir.join(file)).map_err(|e| format!("{file}: {e}"))?;
            if got != (*len, *crc) {
                return Err(format!(
                    "{file} is truncated or corrupt (checksum mismatch)"
                ));
            }
            basename = file
                .strip_suffix(".hnsw.graph")
                .map(str::to_owned)
                .or(basename);
        }
        let basename = basename.ok_or("manifest lists no graph file")?;
        let io = HnswIo::new(dir, &basename);
        let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            LoadedGraph::try_new(io, |io| io.load_hnsw_with_dist::<f32, DistDot>(DistDot {}))
        }));
        let loaded = match loaded {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => return Err(format!("hnsw load failed ({e})")),
            Err(_) => return Err("hnsw load panicked on a damaged file".into()),
        };
        let points = loaded.with_dependent(|_, g| g.get_nb_point());
        if points != m.points {
            return Err(format!(
                "snapshot holds {points} points, manifest says {}",
                m.points
            ));
        }
        Ok(Self {
            params,
            model_id: model_id.to_owned(),
            dim,
            graph: RwLock::new(GraphState {
                cell: GraphCell::Loaded(loaded),
                points,
                max_vid: m.max_vid,
                since_snapshot: 0,
            }),
            attrs: RwLock::new(Attrs::default()),
        })
    }
}

fn checksum(path: &Path) -> std::io::Result<(u64, u32)> {
    let mut f = fs::File::open(path)?;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        len += n as u64;
        h.update(&buf[..n]);
    }
    Ok((len, h.finalize()))
}

/// The snapshot directory for a database file: `<db>.hnsw` beside it.
pub fn snapshot_dir(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push(".hnsw");
    PathBuf::from(s)
}
