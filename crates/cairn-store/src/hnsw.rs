//! A hierarchical navigable small world graph (Malkov & Yashunin, 2018) over unit vectors
//! under the dot product, laid out for search speed.
//!
//! * Vectors sit in one contiguous array, layer-0 neighbour lists in another (`2M` ids plus a
//!   count per node), upper-layer lists in a small per-node block: a search touches flat
//!   arrays only, with no per-node allocation, reference count or hash set.
//! * A search borrows a scratch space (visited marks with a generation counter, both
//!   heaps) from a pool, so a query allocates only its answer.
//! * Distances (`1 - dot`) are compiled for the CPU's widest vector unit (AVX-512, AVX2+FMA
//!   or the baseline) and picked once per search or insert at run time.
//! * Neighbours are chosen with the paper's heuristic (keep a candidate only when it is
//!   closer to the new node than to every neighbour already kept), as hnswlib does.
//! * A vector the graph already holds (the same text stored again) is not linked: it becomes
//!   a *twin* of the node holding it, on a chain that searches expand, and the search beam
//!   (`ef`) counts distinct vectors. Linked, the copies of a text repeated 40 times filled
//!   each other's neighbour lists (99% of the links) and a filtered search for 400 found 4%
//!   of the true answer.
//!
//! Inserting is two steps: [`Hnsw::reserve`] (needs `&mut`: copies the vectors in, draws
//! each node's level) and [`Hnsw::link`] (needs `&`: connects the reserved nodes, in
//! parallel with per-node locks). Searches may run while nodes are linked; they see a node
//! once a neighbour list points at it. There is no delete: callers filter removed labels
//! out and rebuild.
//!
//! ```
//! use cairn_store::hnsw::Hnsw;
//! use cairn_store::HnswParams;
//!
//! let mut g = Hnsw::new(2, HnswParams::default());
//! let a = [1.0f32, 0.0];
//! let b = [0.0f32, 1.0];
//! let nodes = g.reserve(&[(10, &a[..]), (20, &b[..])])?;
//! g.link(nodes, 1);
//! let hits = g.search(&[0.9, 0.1], 1, 16, None);
//! assert_eq!(hits[0].0, 10);
//! # Ok::<(), cairn_store::hnsw::HnswError>(())
//! ```

// Node ids are u32 (`reserve` refuses to pass u32::MAX nodes), levels are below 16 and
// list lengths below 257, so the narrowing casts below cannot truncate.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashSet};
use std::io::{Read, Write};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering as Mem};
use std::sync::{Mutex, MutexGuard};

use rustc_hash::FxHashMap;

use crate::HnswParams;

/// A filtered [`Hnsw::search_groups`] scores every distinct vector of the graph instead of
/// walking it when they are at most this many times `m0 * ef`. A walk for `ef` answers
/// expands `ef` admitted nodes at least, and each looks at up to `m0` neighbours; under a
/// filter it also expands the nodes the filter passes over. So a scan of that many vectors
/// (in sequence, no heap) costs about what a walk does when its filter admits half the
/// nodes it meets, and less for any narrower filter. A thread that repeats its texts (70
/// copies each) has few distinct vectors behind many labels: on a 200,000-turn LoCoMo
/// haystack, 16,279 vectors (its turns' texts and its summaries) under a filter that admits
/// the turns only: the walk for 400 of them took 3.9 ms a call, the scan about 1.5.
pub const SCAN_REACH: usize = 2;

const EMPTY: u64 = u64::MAX;
const MAGIC: &[u8; 8] = b"CAIRNHNS";
const VERSION: u32 = 2;
/// The end of a twin chain.
const NO_TWIN: u32 = u32::MAX;
/// Vectors this close (`1 - dot`, in f32) are the same vector stored twice: copies of one
/// text embed bit for bit alike. Float error in a 384-term dot product is about 1e-7.
const TWIN_DIST: f32 = 1e-6;

/// What can go wrong building or reading a graph.
#[derive(Debug, thiserror::Error)]
pub enum HnswError {
    /// A vector's length is not the graph's dimension.
    #[error("vector has {got} dimensions, the graph {expected}")]
    Dimension {
        /// The graph's dimension.
        expected: usize,
        /// The vector's length.
        got: usize,
    },
    /// The graph would pass `u32::MAX` nodes.
    #[error("the graph is full ({0} nodes)")]
    Full(usize),
    /// A serialized graph that cannot be read back.
    #[error("graph file: {0}")]
    Format(String),
    /// Reading or writing failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

#[derive(Clone, Copy, Debug)]
struct Cand {
    d: f32,
    id: u32,
}

impl PartialEq for Cand {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Cand {}
impl PartialOrd for Cand {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Cand {
    fn cmp(&self, o: &Self) -> Ordering {
        self.d.total_cmp(&o.d).then(self.id.cmp(&o.id))
    }
}

/// Per-search scratch space, pooled.
#[derive(Default)]
struct Scratch {
    marks: Vec<u16>,
    gen: u16,
    cand: BinaryHeap<Reverse<Cand>>,
    top: BinaryHeap<Cand>,
    ids: Vec<u32>,
    code: Vec<i8>,
}

impl Scratch {
    fn reset(&mut self, n: usize) {
        if self.marks.len() < n {
            self.marks.resize(n, 0);
        }
        self.gen = self.gen.wrapping_add(1);
        if self.gen == 0 {
            self.marks.fill(0);
            self.gen = 1;
        }
        self.cand.clear();
        self.top.clear();
    }

    /// Marks `id` visited; `true` the first time.
    #[inline(always)]
    fn visit(&mut self, id: u32) -> bool {
        match self.marks.get_mut(id as usize) {
            Some(m) if *m != self.gen => {
                *m = self.gen;
                true
            }
            _ => false,
        }
    }
}

/// Dot product, written so the compiler vectorizes it for the dispatched target (four
/// independent 16-lane accumulators).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let (a64, a_rest) = pulp::as_arrays::<64, f32>(a);
    let (b64, b_rest) = pulp::as_arrays::<64, f32>(b);
    let (mut s0, mut s1, mut s2, mut s3) = ([0.0f32; 16], [0.0f32; 16], [0.0f32; 16], [0.0f32; 16]);
    for (x, y) in a64.iter().zip(b64) {
        for i in 0..16 {
            s0[i] += x[i] * y[i];
            s1[i] += x[i + 16] * y[i + 16];
            s2[i] += x[i + 32] * y[i + 32];
            s3[i] += x[i + 48] * y[i + 48];
        }
    }
    let (a16, a_tail) = pulp::as_arrays::<16, f32>(a_rest);
    let (b16, b_tail) = pulp::as_arrays::<16, f32>(b_rest);
    for (x, y) in a16.iter().zip(b16) {
        for i in 0..16 {
            s0[i] += x[i] * y[i];
        }
    }
    for i in 0..16 {
        s0[i] += s1[i] + s2[i] + s3[i];
    }
    let mut s = 0.0;
    for (x, y) in a_tail.iter().zip(b_tail) {
        s += x * y;
    }
    s + s0.iter().sum::<f32>()
}

/// A vector's int8 code and scale.
#[derive(Clone, Copy)]
struct Code<'a> {
    c: &'a [i8],
    s: f32,
}

/// Appends `v`'s int8 code to `out` and returns its scale (`max |x| / 127`). Searches call
/// it under the dispatch (see [`SearchOp`]).
#[inline(always)]
fn quantize_into(v: &[f32], out: &mut Vec<i8>) -> f32 {
    let mut max = 0.0f32;
    for x in v {
        max = max.max(x.abs());
    }
    if max == 0.0 || !max.is_finite() {
        out.extend(std::iter::repeat_n(0i8, v.len()));
        return 0.0;
    }
    let inv = 127.0 / max;
    out.reserve(v.len());
    for x in v {
        out.push((x * inv).round().clamp(-127.0, 127.0) as i8);
    }
    max / 127.0
}

/// Integer dot product of two codes (the compiler turns it into multiply-add pairs).
#[inline(always)]
fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    let mut s = 0i32;
    for (x, y) in a.iter().zip(b) {
        s += i32::from(*x) * i32::from(*y);
    }
    s
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The graph. See the [module docs](self).
pub struct Hnsw {
    dim: usize,
    m: usize,
    m0: usize,
    ef_construction: usize,
    max_layer: usize,
    vectors: Vec<f32>,
    /// Vectors as int8 codes (`round(x / scale)`, scale = max |x| / 127), walked by the
    /// traversal: a quarter of the memory traffic of f32; results are re-ranked in f32.
    codes: Vec<i8>,
    scales: Vec<f32>,
    labels: Vec<u64>,
    /// Label → node, for exact scores of chosen labels (Fx-hashed: labels are our vids).
    nodes: FxHashMap<u64, u32>,
    levels: Vec<u8>,
    /// Layer 0: per node `[count, id; 2M]`.
    links0: Vec<AtomicU32>,
    /// Layers 1..=level: per node `level` blocks of `[count, id; M]`.
    upper: Vec<Box<[AtomicU32]>>,
    locks: Vec<Mutex<()>>,
    /// Per node, the next node of its twin chain or [`NO_TWIN`]. A vector inserted again
    /// (the same text stored twice) is not linked into the graph: it hangs on the chain of
    /// the node already holding it, and every search that reaches that node offers its
    /// twins too. Linked, 70 copies of one text would fill each other's neighbour lists
    /// (each at distance 0 from the rest), cutting the graph into cliques no walk crosses.
    twins: Vec<AtomicU32>,
    /// Per node on a twin chain, the node the chain hangs on (its head, a linked node);
    /// [`NO_TWIN`] for a node that is not a twin.
    heads: Vec<AtomicU32>,
    /// Per head of a twin chain, the node of the chain (the head among them) with the least
    /// label; [`NO_TWIN`] for a node without twins. A search asked for the least admitted
    /// label holding a vector looks there first: when that node is admitted, the chain
    /// (70 copies of a text) need not be walked.
    least: Vec<AtomicU32>,
    /// Whether any node has a twin (searches skip the chains otherwise).
    has_twins: AtomicBool,
    /// How many nodes are twins (hang on a chain, outside the graph's links).
    twin_count: AtomicUsize,
    /// `level << 32 | node`, or [`EMPTY`].
    entry: AtomicU64,
    entry_lock: Mutex<()>,
    scratch: Mutex<Vec<Scratch>>,
    arch: pulp::Arch,
}

impl std::fmt::Debug for Hnsw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hnsw")
            .field("dim", &self.dim)
            .field("m", &self.m)
            .field("ef_construction", &self.ef_construction)
            .field("nodes", &self.labels.len())
            .finish()
    }
}

impl Hnsw {
    /// An empty graph for `dim`-dimensional vectors with the given parameters (`ef_search`
    /// is not used here: each search names its own).
    pub fn new(dim: usize, params: HnswParams) -> Self {
        Self {
            dim,
            m: params.m.max(2),
            m0: params.m.max(2) * 2,
            ef_construction: params.ef_construction.max(params.m),
            max_layer: params.max_layer.clamp(1, 16),
            vectors: Vec::new(),
            codes: Vec::new(),
            scales: Vec::new(),
            labels: Vec::new(),
            nodes: FxHashMap::default(),
            levels: Vec::new(),
            links0: Vec::new(),
            upper: Vec::new(),
            locks: Vec::new(),
            twins: Vec::new(),
            heads: Vec::new(),
            least: Vec::new(),
            has_twins: AtomicBool::new(false),
            twin_count: AtomicUsize::new(0),
            entry: AtomicU64::new(EMPTY),
            entry_lock: Mutex::new(()),
            scratch: Mutex::new(Vec::new()),
            arch: pulp::Arch::new(),
        }
    }

    /// Nodes in the graph.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the graph has no node.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The vector dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The labels of all nodes, in insertion order.
    pub fn labels(&self) -> &[u64] {
        &self.labels
    }

    fn level_for(&self, label: u64) -> usize {
        let ml = 1.0 / (self.m as f64).ln();
        let bits = splitmix(label ^ 0x5EED_CA1B) >> 11;
        // In (0, 1].
        let u = (bits as f64 + 1.0) / (1u64 << 53) as f64;
        let l = (-u.ln() * ml).floor();
        if l.is_finite() && l > 0.0 {
            (l as usize).min(self.max_layer - 1)
        } else {
            0
        }
    }

    /// Copies `items` (label, vector) in as unlinked nodes and returns their node range, to
    /// pass to [`Self::link`]. Checks every vector's length first; nothing is added on error.
    pub fn reserve(&mut self, items: &[(u64, &[f32])]) -> Result<Range<usize>, HnswError> {
        if let Some((_, v)) = items.iter().find(|(_, v)| v.len() != self.dim) {
            return Err(HnswError::Dimension {
                expected: self.dim,
                got: v.len(),
            });
        }
        let start = self.labels.len();
        let end = start + items.len();
        if end > u32::MAX as usize - 1 {
            return Err(HnswError::Full(start));
        }
        // Grow by an eighth at least: large stores do not double their footprint at once.
        let grow = |len: usize, extra: usize| extra.max(len / 8);
        let extra = grow(self.labels.len(), items.len());
        if self.labels.capacity() - self.labels.len() < items.len() {
            self.labels.reserve_exact(extra);
            self.levels.reserve_exact(extra);
            self.locks.reserve_exact(extra);
            self.upper.reserve_exact(extra);
            self.vectors.reserve_exact(extra * self.dim);
            self.codes.reserve_exact(extra * self.dim);
            self.scales.reserve_exact(extra);
            self.links0.reserve_exact(extra * (self.m0 + 1));
            self.twins.reserve_exact(extra);
            self.heads.reserve_exact(extra);
            self.least.reserve_exact(extra);
        }
        for (label, v) in items {
            let level = self.level_for(*label);
            self.nodes.insert(*label, self.labels.len() as u32);
            self.labels.push(*label);
            self.levels.push(level as u8);
            self.vectors.extend_from_slice(v);
            self.scales.push(quantize_into(v, &mut self.codes));
            self.links0.extend((0..=self.m0).map(|_| AtomicU32::new(0)));
            self.upper.push(
                (0..level * (self.m + 1))
                    .map(|_| AtomicU32::new(0))
                    .collect(),
            );
            self.locks.push(Mutex::new(()));
            self.twins.push(AtomicU32::new(NO_TWIN));
            self.heads.push(AtomicU32::new(NO_TWIN));
            self.least.push(AtomicU32::new(NO_TWIN));
        }
        Ok(start..end)
    }

    /// Connects the reserved nodes `nodes` into the graph with up to `threads` threads.
    pub fn link(&self, nodes: Range<usize>, threads: usize) {
        let nodes = nodes.start..nodes.end.min(self.len());
        let threads = threads.clamp(1, 64).min(nodes.len().max(1));
        if threads == 1 || nodes.len() < 64 {
            for n in nodes {
                self.link_one(n as u32);
            }
            return;
        }
        // A vector the batch holds twice is linked once first: two copies linked at the same
        // time would not see each other and would head two chains (a text's copies then
        // split in two, and a lookup of them follows one). The copies after it are linked
        // once every first is, and hang on its chain.
        let mut firsts: Vec<u32> = Vec::with_capacity(nodes.len());
        let mut again: Vec<u32> = Vec::new();
        let mut by_bits: FxHashMap<u64, Vec<u32>> = FxHashMap::default();
        for n in nodes.clone() {
            let v = self.vector(n as u32);
            // (`+ 0.0` makes -0.0 hash as 0.0: the two compare equal.)
            let key = v.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
                splitmix(h ^ u64::from((x + 0.0).to_bits()))
            });
            let same = by_bits.entry(key).or_default();
            if same.iter().any(|m| self.vector(*m) == v) {
                again.push(n as u32);
            } else {
                same.push(n as u32);
                firsts.push(n as u32);
            }
        }
        for phase in [&firsts, &again] {
            let next = AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..threads.min(phase.len().max(1)) {
                    s.spawn(|| loop {
                        let i = next.fetch_add(1, Mem::Relaxed);
                        let Some(n) = phase.get(i) else {
                            break;
                        };
                        self.link_one(*n);
                    });
                }
            });
        }
    }

    /// Reserves and links in one call.
    pub fn insert(&mut self, items: &[(u64, &[f32])], threads: usize) -> Result<(), HnswError> {
        let nodes = self.reserve(items)?;
        self.link(nodes, threads);
        Ok(())
    }

    #[inline(always)]
    fn vector(&self, node: u32) -> &[f32] {
        let s = node as usize * self.dim;
        self.vectors.get(s..s + self.dim).unwrap_or(&[])
    }

    #[inline(always)]
    fn dist(&self, q: &[f32], node: u32) -> f32 {
        1.0 - dot(q, self.vector(node))
    }

    #[inline(always)]
    fn code(&self, node: u32) -> Code<'_> {
        let s = node as usize * self.dim;
        Code {
            c: self.codes.get(s..s + self.dim).unwrap_or(&[]),
            s: self.scales.get(node as usize).copied().unwrap_or(0.0),
        }
    }

    /// Approximate distance from int8 codes.
    #[inline(always)]
    fn adist(&self, q: Code<'_>, node: u32) -> f32 {
        let n = self.code(node);
        1.0 - q.s * n.s * dot_i8(q.c, n.c) as f32
    }

    #[inline(always)]
    fn list(&self, node: u32, level: usize) -> &[AtomicU32] {
        if level == 0 {
            let s = node as usize * (self.m0 + 1);
            self.links0.get(s..s + self.m0 + 1).unwrap_or(&[])
        } else {
            let s = (level - 1) * (self.m + 1);
            self.upper
                .get(node as usize)
                .and_then(|b| b.get(s..s + self.m + 1))
                .unwrap_or(&[])
        }
    }

    /// Copies a neighbour list into `out`.
    #[inline(always)]
    fn neighbours(&self, node: u32, level: usize, out: &mut Vec<u32>) {
        out.clear();
        let l = self.list(node, level);
        if let Some((count, ids)) = l.split_first() {
            let c = (count.load(Mem::Acquire) as usize).min(ids.len());
            out.extend(ids[..c].iter().map(|a| a.load(Mem::Relaxed)));
        }
    }

    fn entry(&self) -> Option<(u32, usize)> {
        let e = self.entry.load(Mem::Acquire);
        (e != EMPTY).then_some(((e & 0xFFFF_FFFF) as u32, (e >> 32) as usize))
    }

    fn take_scratch(&self) -> Scratch {
        let mut s = lock(&self.scratch).pop().unwrap_or_default();
        s.reset(self.len());
        s
    }

    fn give_scratch(&self, s: Scratch) {
        lock(&self.scratch).push(s);
    }

    #[inline(always)]
    fn greedy(
        &self,
        q: Code<'_>,
        mut cur: u32,
        mut d: f32,
        level: usize,
        ids: &mut Vec<u32>,
    ) -> (u32, f32) {
        loop {
            let mut changed = false;
            self.neighbours(cur, level, ids);
            for &n in ids.iter() {
                let dn = self.adist(q, n);
                if dn < d {
                    d = dn;
                    cur = n;
                    changed = true;
                }
            }
            if !changed {
                return (cur, d);
            }
        }
    }

    /// The next node on `node`'s twin chain, or [`NO_TWIN`].
    #[inline(always)]
    fn twin_next(&self, node: u32) -> u32 {
        self.twins
            .get(node as usize)
            .map_or(NO_TWIN, |t| t.load(Mem::Acquire))
    }

    /// Whether nodes `a` and `b` hold the same vector (see [`TWIN_DIST`]).
    #[inline(always)]
    fn same_vector(&self, a: u32, b: u32) -> bool {
        a != b && self.dist(self.vector(a), b) <= TWIN_DIST
    }

    /// The node among the first of `near` (nearest first, by int8 distance, which is off
    /// by about 1e-3) that holds `q`'s vector.
    #[inline(always)]
    fn twin_among(&self, q: u32, near: &[Cand]) -> Option<Cand> {
        // A plain loop, not a `find` (see [`SearchOp`]).
        for c in near.iter().take(4) {
            if self.same_vector(q, c.id) {
                return Some(*c);
            }
        }
        None
    }

    /// Hangs unlinked node `q` on `node`'s twin chain.
    fn add_twin(&self, node: u32, q: u32) {
        let (Some(guard), Some(head), Some(next), Some(hangs_on), Some(least)) = (
            self.locks.get(node as usize),
            self.twins.get(node as usize),
            self.twins.get(q as usize),
            self.heads.get(q as usize),
            self.least.get(node as usize),
        ) else {
            return;
        };
        let _g = lock(guard);
        hangs_on.store(node, Mem::Release);
        next.store(head.load(Mem::Acquire), Mem::Release);
        head.store(q, Mem::Release);
        let label = |n: u32| self.labels.get(n as usize).copied().unwrap_or(u64::MAX);
        let was = match least.load(Mem::Acquire) {
            NO_TWIN => node,
            l => l,
        };
        least.store(if label(q) < label(was) { q } else { was }, Mem::Release);
        self.twin_count.fetch_add(1, Mem::AcqRel);
        self.has_twins.store(true, Mem::Release);
    }

    /// Whether `admit` takes `node`'s own label (all do without a filter).
    #[inline(always)]
    fn label_admitted(&self, node: u32, admit: Option<&dyn Fn(u64) -> bool>) -> bool {
        match admit {
            None => true,
            Some(f) => self.labels.get(node as usize).is_some_and(|l| f(*l)),
        }
    }

    /// The nodes on `node`'s twin chain.
    #[inline(always)]
    fn twins_of(&self, node: u32) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors(Some(self.twin_next(node)), |t| Some(self.twin_next(*t)))
            .take_while(|t| *t != NO_TWIN)
    }

    /// The node whose twin chain `node` hangs on, or `node` itself when it is not a twin.
    #[inline(always)]
    fn head_of(&self, node: u32) -> u32 {
        match self.heads.get(node as usize).map(|h| h.load(Mem::Acquire)) {
            Some(h) if h != NO_TWIN => h,
            _ => node,
        }
    }

    /// Which vector the node holding `label` holds, as a key: labels with the same key hold
    /// the same vector (copies of one text, see [`Self::twin_labels`]); `None` for a label
    /// the graph does not hold.
    pub fn twin_key(&self, label: u64) -> Option<u64> {
        let node = *self.nodes.get(&label)?;
        self.labels.get(self.head_of(node) as usize).copied()
    }

    /// The labels of every node holding the same vector as `label`'s (the same text stored
    /// again), `label` among them, in no particular order; empty for a label the graph does
    /// not hold.
    pub fn twin_labels(&self, label: u64) -> Vec<u64> {
        let Some(&node) = self.nodes.get(&label) else {
            return Vec::new();
        };
        let head = self.head_of(node);
        std::iter::once(head)
            .chain(self.twins_of(head))
            .filter_map(|n| self.labels.get(n as usize).copied())
            .collect()
    }

    /// Best-first search of one layer from `eps`; leaves up to `ef` admitted nodes in
    /// `s.top`. With `twins` (searches, not the walks that link a node), a node is admitted
    /// when one of its twins is, and the caller expands the nodes into their labels: `ef`
    /// counts distinct vectors, so 70 copies of one text do not narrow the beam to one.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn search_layer(
        &self,
        q: Code<'_>,
        eps: &[Cand],
        level: usize,
        ef: usize,
        admit: Option<&dyn Fn(u64) -> bool>,
        twins: bool,
        s: &mut Scratch,
    ) {
        let label_admitted = |id: u32| self.label_admitted(id, admit);
        let twins = twins && self.has_twins.load(Mem::Acquire);
        let admitted =
            |id: u32| label_admitted(id) || (twins && self.twins_of(id).any(label_admitted));
        let mut bound = f32::INFINITY;
        for &e in eps {
            if !s.visit(e.id) {
                continue;
            }
            s.cand.push(Reverse(e));
            if admitted(e.id) {
                s.top.push(e);
                if s.top.len() > ef {
                    s.top.pop();
                }
            }
        }
        if s.top.len() >= ef {
            bound = s.top.peek().map_or(f32::INFINITY, |c| c.d);
        }
        let mut ids = std::mem::take(&mut s.ids);
        while let Some(Reverse(c)) = s.cand.pop() {
            if c.d > bound {
                break;
            }
            self.neighbours(c.id, level, &mut ids);
            // First the unvisited neighbours, touching each code so that their cache misses
            // overlap (the role of hnswlib's prefetch), then their distances.
            let mut fresh = 0;
            for i in 0..ids.len() {
                let n = ids[i];
                if s.visit(n) {
                    ids[fresh] = n;
                    fresh += 1;
                    std::hint::black_box(self.codes.get(n as usize * self.dim));
                }
            }
            for &n in &ids[..fresh] {
                let d = self.adist(q, n);
                if s.top.len() < ef || d < bound {
                    s.cand.push(Reverse(Cand { d, id: n }));
                    if admitted(n) {
                        s.top.push(Cand { d, id: n });
                        if s.top.len() > ef {
                            s.top.pop();
                        }
                    }
                    if s.top.len() >= ef {
                        bound = s.top.peek().map_or(f32::INFINITY, |c| c.d);
                    }
                }
            }
        }
        s.ids = ids;
    }

    /// The paper's neighbour-selection heuristic over `cands` sorted nearest first.
    #[inline(always)]
    fn select(&self, cands: &[Cand], m: usize) -> Vec<Cand> {
        if cands.len() <= m {
            return cands.to_vec();
        }
        let mut out: Vec<Cand> = Vec::with_capacity(m);
        for c in cands {
            if out.len() >= m {
                break;
            }
            let v = self.code(c.id);
            let mut good = true;
            for r in &out {
                if self.adist(v, r.id) < c.d {
                    good = false;
                    break;
                }
            }
            if good {
                out.push(*c);
            }
        }
        out
    }

    fn link_one(&self, q: u32) {
        self.arch.dispatch(LinkOp { g: self, q })
    }

    #[inline(always)]
    fn link_inner(&self, q: u32) {
        let level = self.levels.get(q as usize).copied().unwrap_or(0) as usize;
        let Some((mut ep, top_level)) = self.entry().or_else(|| {
            let _g = lock(&self.entry_lock);
            match self.entry() {
                Some(e) => Some(e),
                None => {
                    self.entry
                        .store(((level as u64) << 32) | u64::from(q), Mem::Release);
                    None
                }
            }
        }) else {
            return;
        };
        if ep == q {
            return;
        }
        let v = self.code(q);
        let mut s = self.take_scratch();
        let mut ids = Vec::new();
        let mut d = self.adist(v, ep);
        for l in (level + 1..=top_level).rev() {
            (ep, d) = self.greedy(v, ep, d, l, &mut ids);
        }
        // A vector the graph already holds becomes that node's twin instead of a node of
        // its own. A node on layer 0 only learns it from the search that links it; one
        // drawn higher is checked first with a short walk down, before it links anything.
        if level > 0 {
            let (mut e, mut de) = (ep, d);
            for l in (1..=level.min(top_level)).rev() {
                (e, de) = self.greedy(v, e, de, l, &mut ids);
            }
            s.reset(self.len());
            self.search_layer(v, &[Cand { d: de, id: e }], 0, self.m, None, false, &mut s);
            let mut near: Vec<Cand> = s.top.drain().filter(|c| c.id != q).collect();
            near.sort_unstable();
            if let Some(c) = self.twin_among(q, &near) {
                self.add_twin(c.id, q);
                self.give_scratch(s);
                return;
            }
        }
        let mut eps = vec![Cand { d, id: ep }];
        for l in (0..=level.min(top_level)).rev() {
            s.reset(self.len());
            self.search_layer(v, &eps, l, self.ef_construction, None, false, &mut s);
            let mut found: Vec<Cand> = s.top.drain().filter(|c| c.id != q).collect();
            found.sort_unstable();
            if level == 0 {
                if let Some(c) = self.twin_among(q, &found) {
                    self.add_twin(c.id, q);
                    self.give_scratch(s);
                    return;
                }
            }
            let chosen = self.select(&found, self.m);
            self.set_own_links(q, l, &chosen);
            for c in &chosen {
                self.add_backlink(c.id, q, c.d, l);
            }
            if !found.is_empty() {
                eps = found;
            }
        }
        self.give_scratch(s);
        if level > top_level {
            let _g = lock(&self.entry_lock);
            if self.entry().is_none_or(|(_, t)| level > t) {
                self.entry
                    .store(((level as u64) << 32) | u64::from(q), Mem::Release);
            }
        }
    }

    /// Writes a new node's own list at `level`, keeping links that concurrent inserts added
    /// to it meanwhile (they found it through a higher layer), pruned to the list's size.
    #[inline(always)]
    fn set_own_links(&self, q: u32, level: usize, chosen: &[Cand]) {
        let Some(guard) = self.locks.get(q as usize) else {
            return;
        };
        let _g = lock(guard);
        let Some((count, slots)) = self.list(q, level).split_first() else {
            return;
        };
        let c = (count.load(Mem::Relaxed) as usize).min(slots.len());
        let mut all: Vec<Cand> = chosen.to_vec();
        if c > 0 {
            let v = self.code(q);
            for a in &slots[..c] {
                let id = a.load(Mem::Relaxed);
                if all.iter().all(|x| x.id != id) {
                    all.push(Cand {
                        d: self.adist(v, id),
                        id,
                    });
                }
            }
            all.sort_unstable();
        }
        let kept = if all.len() > slots.len() {
            self.select(&all, slots.len())
        } else {
            all
        };
        for (slot, k) in slots.iter().zip(&kept) {
            slot.store(k.id, Mem::Relaxed);
        }
        count.store(kept.len().min(slots.len()) as u32, Mem::Release);
    }

    #[inline(always)]
    fn add_backlink(&self, node: u32, q: u32, dq: f32, level: usize) {
        let Some(guard) = self.locks.get(node as usize) else {
            return;
        };
        let _g = lock(guard);
        let list = self.list(node, level);
        let Some((count, slots)) = list.split_first() else {
            return;
        };
        let c = (count.load(Mem::Relaxed) as usize).min(slots.len());
        if slots[..c].iter().any(|a| a.load(Mem::Relaxed) == q) {
            return;
        }
        if c < slots.len() {
            slots[c].store(q, Mem::Relaxed);
            count.store(c as u32 + 1, Mem::Release);
            return;
        }
        let vn = self.code(node);
        let mut cands: Vec<Cand> = Vec::with_capacity(c + 1);
        for a in &slots[..c] {
            let id = a.load(Mem::Relaxed);
            cands.push(Cand {
                d: self.adist(vn, id),
                id,
            });
        }
        cands.push(Cand { d: dq, id: q });
        cands.sort_unstable();
        let kept = self.select(&cands, slots.len());
        for (slot, k) in slots.iter().zip(&kept) {
            slot.store(k.id, Mem::Relaxed);
        }
        count.store(kept.len().min(slots.len()) as u32, Mem::Release);
    }

    /// The `k` nearest nodes to `query` whose label `admit` accepts (all when `None`), as
    /// (label, distance = 1 - dot), nearest first. `ef` (raised to `k`) sets the candidate
    /// list: larger is slower and finds more of the true neighbours. A query of the wrong
    /// dimension finds nothing.
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        admit: Option<&dyn Fn(u64) -> bool>,
    ) -> Vec<(u64, f32)> {
        if query.len() != self.dim || k == 0 {
            return Vec::new();
        }
        self.arch.dispatch(SearchOp {
            g: self,
            q: query,
            k,
            ef: ef.max(k),
            admit,
        })
    }

    /// [`Self::search`] with `k` counting distinct vectors: the `k` nearest vectors held by a
    /// node whose label `admit` accepts, each as (the least admitted label holding it, its
    /// distance, how many admitted labels hold it), nearest first. Copies of one text (a
    /// node and its twins) are one answer, so 70 copies of the best match do not fill the
    /// answer with one text. The copies are counted for the nearest answers until `k` are
    /// (so the `k` nearest labels, copies counted, are known), and for every answer when
    /// fewer than `k` are found; a later answer's count may be a lower bound (1): counting
    /// them all would walk each text's copies.
    ///
    /// With a filter, a graph of few distinct vectors (see [`SCAN_REACH`]) is not walked:
    /// every vector is scored, and the answers are the exact nearest (but for int8 ties).
    pub fn search_groups(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        admit: Option<&dyn Fn(u64) -> bool>,
    ) -> Vec<(u64, f32, usize)> {
        let ef = ef.max(k);
        let scan = admit.is_some()
            && self.distinct() <= SCAN_REACH.saturating_mul(self.m0).saturating_mul(ef);
        self.groups(query, k, ef, admit, scan)
    }

    /// [`Self::search_groups`] through a walk of the graph, or (`scan`, with a filter) a
    /// scan of its vectors.
    fn groups(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        admit: Option<&dyn Fn(u64) -> bool>,
        scan: bool,
    ) -> Vec<(u64, f32, usize)> {
        if query.len() != self.dim || k == 0 {
            return Vec::new();
        }
        self.arch.dispatch(GroupsOp {
            g: self,
            q: query,
            k,
            ef,
            admit,
            scan,
        })
    }

    #[inline(always)]
    fn search_groups_inner(
        &self,
        q: &[f32],
        k: usize,
        ef: usize,
        admit: Option<&dyn Fn(u64) -> bool>,
        scan: bool,
    ) -> Vec<(u64, f32, usize)> {
        let approx = match admit {
            Some(a) if scan => self.scan(q, ef, a),
            _ => self.beam(q, ef, admit),
        };
        // As in `search_inner`, the f32 re-rank of the approximate top 3k. The nodes are
        // taken nearest first until k answers are found and the next node is farther than
        // the last of them (every node of the beam holds an admitted label, its own or a
        // twin's, see `search_layer`). Their copies are counted until k are (see
        // `search_groups`), and for any answer as near as the one that reached k (the final
        // order breaks ties by label); the later ones are not walked: a text stored 70 times
        // would otherwise cost 70 admission tests for each of 3k.
        let want = (3 * k).max(32);
        // A plain loop, not a `collect` (see [`SearchOp`]).
        let mut near: Vec<Cand> = Vec::with_capacity(want.min(approx.len()));
        for c in approx.iter().take(want) {
            near.push(Cand {
                d: self.dist(q, c.id),
                id: c.id,
            });
        }
        near.sort_unstable_by(|a, b| a.d.total_cmp(&b.d));
        let mut found: Vec<(Cand, u64, usize)> = Vec::with_capacity(k.min(near.len()));
        let mut counted = 0usize;
        // The answers counted exactly (the first ones), and the distance at which the count
        // reached k.
        let mut exact = 0usize;
        let mut reached: Option<f32> = None;
        for c in near {
            if found.len() >= k && found.last().is_some_and(|f| f.0.d < c.d) {
                break;
            }
            let count = reached.is_none_or(|d| c.d <= d);
            let answer = if count {
                self.admitted_copies(c.id, admit)
            } else {
                self.least_admitted(c.id, admit)
            };
            if let Some((l, n)) = answer {
                if count {
                    counted += n;
                    exact += 1;
                    if counted >= k && reached.is_none() {
                        reached = Some(c.d);
                    }
                }
                found.push((c, l, n));
            }
        }
        // Fewer than k answers: every admitted copy was reached, and all are counted (a
        // caller tells from the sum whether the search missed any).
        if found.len() < k {
            for f in found.iter_mut().skip(exact) {
                if let Some((l, n)) = self.admitted_copies(f.0.id, admit) {
                    (f.1, f.2) = (l, n);
                }
            }
        }
        found.sort_unstable_by(|a, b| a.0.d.total_cmp(&b.0.d).then(a.1.cmp(&b.1)));
        found.truncate(k);
        found.into_iter().map(|(c, l, n)| (l, c.d, n)).collect()
    }

    /// The least admitted label among `node` and its twins, and how many are admitted;
    /// `None` when none is.
    #[inline(always)]
    fn admitted_copies(
        &self,
        node: u32,
        admit: Option<&dyn Fn(u64) -> bool>,
    ) -> Option<(u64, usize)> {
        let mut least: Option<u64> = None;
        let mut n = 0usize;
        for id in std::iter::once(node).chain(self.twins_of(node)) {
            if self.label_admitted(id, admit) {
                if let Some(l) = self.labels.get(id as usize) {
                    least = Some(least.map_or(*l, |x| x.min(*l)));
                    n += 1;
                }
            }
        }
        least.map(|l| (l, n))
    }

    /// [`Self::admitted_copies`] for `node`, a node of the graph (a chain's head), with the
    /// count left at 1 when the node of the chain with the least label is admitted (the
    /// chain is then not walked).
    #[inline(always)]
    fn least_admitted(
        &self,
        node: u32,
        admit: Option<&dyn Fn(u64) -> bool>,
    ) -> Option<(u64, usize)> {
        let min = match self.least.get(node as usize).map(|l| l.load(Mem::Acquire)) {
            Some(l) if l != NO_TWIN => l,
            _ => node,
        };
        if self.label_admitted(min, admit) {
            return self.labels.get(min as usize).map(|l| (*l, 1));
        }
        self.admitted_copies(node, admit)
    }

    /// How many distinct vectors the graph holds: its nodes but the twins.
    pub fn distinct(&self) -> usize {
        self.len()
            .saturating_sub(self.twin_count.load(Mem::Acquire))
    }

    /// What [`Self::beam`] finds, from every vector of the graph: the `ef` nearest nodes
    /// (int8 distances) holding an admitted label, their own or a twin's. Twins are not
    /// scored (their head holds the same vector).
    #[inline(always)]
    fn scan(&self, q: &[f32], ef: usize, admit: &dyn Fn(u64) -> bool) -> Vec<Cand> {
        let mut code = Vec::with_capacity(self.dim);
        let scale = quantize_into(q, &mut code);
        let qc = Code { c: &code, s: scale };
        let n = u32::try_from(self.len()).unwrap_or(u32::MAX);
        // A plain loop, not a `collect` (see [`SearchOp`]).
        let mut all = Vec::with_capacity(self.distinct());
        for id in 0..n {
            if self.head_of(id) == id {
                all.push(Reverse(Cand {
                    d: self.adist(qc, id),
                    id,
                }));
            }
        }
        // A heap, not a sort: only the nearest until `ef` are admitted are taken out (all of
        // them, each a sift-down, when the filter admits fewer than `ef`).
        let mut near = BinaryHeap::from(all);
        let admit = Some(admit);
        let twins = self.has_twins.load(Mem::Acquire);
        let admitted = |id: u32| {
            self.label_admitted(id, admit)
                || (twins && self.twins_of(id).any(|t| self.label_admitted(t, admit)))
        };
        let mut out = Vec::with_capacity(ef.min(near.len()));
        while out.len() < ef {
            let Some(Reverse(c)) = near.pop() else {
                break;
            };
            if admitted(c.id) {
                out.push(c);
            }
        }
        out
    }

    /// The layer-0 beam of a search for `q` (up to `ef` admitted nodes, a node admitted
    /// when one of its twins is), nearest first by int8 distance.
    #[inline(always)]
    fn beam(&self, q: &[f32], ef: usize, admit: Option<&dyn Fn(u64) -> bool>) -> Vec<Cand> {
        let Some((mut ep, top_level)) = self.entry() else {
            return Vec::new();
        };
        let mut s = self.take_scratch();
        let mut code = std::mem::take(&mut s.code);
        code.clear();
        let scale = quantize_into(q, &mut code);
        let qc = Code { c: &code, s: scale };
        let mut ids = std::mem::take(&mut s.ids);
        let mut d = self.adist(qc, ep);
        for l in (1..=top_level).rev() {
            (ep, d) = self.greedy(qc, ep, d, l, &mut ids);
        }
        s.ids = ids;
        self.search_layer(qc, &[Cand { d, id: ep }], 0, ef, admit, true, &mut s);
        let mut approx: Vec<Cand> = s.top.drain().collect();
        s.code = code;
        self.give_scratch(s);
        approx.sort_unstable();
        approx
    }

    #[inline(always)]
    fn search_inner(
        &self,
        q: &[f32],
        k: usize,
        ef: usize,
        admit: Option<&dyn Fn(u64) -> bool>,
    ) -> Vec<(u64, f32)> {
        // Re-rank the best candidates with the f32 vectors: the true top k sits well inside
        // the approximate top 3k (int8 distances are off by about 1e-3).
        // A node stands for its admitted twins as well (see `search_layer`).
        let approx = self.beam(q, ef, admit);
        let want = (3 * k).max(32);
        let mut found: Vec<Cand> = Vec::with_capacity(want.min(approx.len()));
        for c in approx {
            if found.len() >= want {
                break;
            }
            for id in std::iter::once(c.id).chain(self.twins_of(c.id)) {
                if self.label_admitted(id, admit) {
                    found.push(Cand {
                        d: self.dist(q, id),
                        id,
                    });
                }
            }
        }
        found.sort_unstable();
        found.truncate(k);
        found
            .into_iter()
            .filter_map(|c| self.labels.get(c.id as usize).map(|l| (*l, c.d)))
            .collect()
    }

    /// Exact nearest neighbours by scanning every admitted node (for checks and for very
    /// selective filters).
    pub fn exact(
        &self,
        query: &[f32],
        k: usize,
        admit: Option<&dyn Fn(u64) -> bool>,
    ) -> Vec<(u64, f32)> {
        if query.len() != self.dim || k == 0 {
            return Vec::new();
        }
        self.arch.dispatch(ExactOp {
            g: self,
            q: query,
            k,
            admit,
        })
    }

    /// Whether a node holds `label`.
    pub fn contains(&self, label: u64) -> bool {
        self.nodes.contains_key(&label)
    }

    /// Exact nearest neighbours among the nodes holding `labels`, as [`Self::search`]
    /// returns them; `None` when a label is not in the graph.
    pub fn exact_among(&self, query: &[f32], k: usize, labels: &[u64]) -> Option<Vec<(u64, f32)>> {
        let mut nodes = Vec::with_capacity(labels.len());
        for l in labels {
            nodes.push(*self.nodes.get(l)?);
        }
        if query.len() != self.dim || k == 0 {
            return Some(Vec::new());
        }
        Some(self.arch.dispatch(AmongOp {
            g: self,
            q: query,
            k,
            nodes: &nodes,
        }))
    }

    #[inline(always)]
    fn among_inner(&self, query: &[f32], k: usize, nodes: &[u32]) -> Vec<(u64, f32)> {
        let mut all: Vec<Cand> = Vec::with_capacity(nodes.len());
        for &n in nodes {
            all.push(Cand {
                d: self.dist(query, n),
                id: n,
            });
        }
        all.sort_unstable();
        all.truncate(k);
        all.into_iter()
            .filter_map(|c| self.labels.get(c.id as usize).map(|l| (*l, c.d)))
            .collect()
    }

    #[inline(always)]
    fn exact_inner(
        &self,
        query: &[f32],
        k: usize,
        admit: Option<&dyn Fn(u64) -> bool>,
    ) -> Vec<(u64, f32)> {
        let mut top: BinaryHeap<Cand> = BinaryHeap::with_capacity(k + 1);
        for (i, l) in self.labels.iter().enumerate() {
            if let Some(f) = admit {
                if !f(*l) {
                    continue;
                }
            }
            let c = Cand {
                d: self.dist(query, i as u32),
                id: i as u32,
            };
            if top.len() < k {
                top.push(c);
            } else if top.peek().is_some_and(|w| c < *w) {
                top.pop();
                top.push(c);
            }
        }
        let mut v = top.into_sorted_vec();
        v.truncate(k);
        v.into_iter()
            .filter_map(|c| self.labels.get(c.id as usize).map(|l| (*l, c.d)))
            .collect()
    }

    /// Writes the graph (little-endian; read back by [`Self::read_from`]).
    pub fn write_to(&self, w: &mut impl Write) -> Result<(), HnswError> {
        self.write_to_erasing(w, |_| true).map(|_| ())
    }

    /// [`Self::write_to`], without the vector of any node whose label `live` rejects,
    /// unless another label holding the same vector (its twin chain) is live: the file keeps
    /// no vector of what was deleted. In its place goes the normalized mean of the node's
    /// kept layer-0 neighbours' vectors (zeros when it has none), so a walk through the
    /// tombstone is still guided the way its links were made (with zeros it found every
    /// erased node far from every query: recall@10 fell from 0.923 to 0.885 at ef 10 with
    /// 19% of the nodes erased; with the mean it was 0.966, test
    /// `recall_holds_with_erased_tombstones`). The mean tells nothing the links do not: they
    /// name those neighbours already. Returns the labels erased.
    pub fn write_to_erasing(
        &self,
        w: &mut impl Write,
        live: impl Fn(u64) -> bool,
    ) -> Result<Vec<u64>, HnswError> {
        let n = self.len();
        // A chain's vector is kept when any of its labels is live.
        let head = |i: usize| -> usize {
            match self.heads.get(i).map(|h| h.load(Mem::Acquire)) {
                Some(h) if h != NO_TWIN => h as usize,
                _ => i,
            }
        };
        let mut kept = vec![false; n];
        for (i, label) in self.labels.iter().enumerate() {
            if live(*label) {
                if let Some(k) = kept.get_mut(head(i)) {
                    *k = true;
                }
            }
        }
        let erased: Vec<bool> = (0..n)
            .map(|i| !kept.get(head(i)).copied().unwrap_or(false))
            .collect();
        let (entry_node, entry_level) = self
            .entry()
            .map_or((u64::MAX, 0), |(e, l)| (u64::from(e), l));
        w.write_all(MAGIC)?;
        for x in [
            VERSION,
            self.dim as u32,
            self.m as u32,
            self.ef_construction as u32,
            self.max_layer as u32,
            entry_level as u32,
        ] {
            w.write_all(&x.to_le_bytes())?;
        }
        w.write_all(&(n as u64).to_le_bytes())?;
        w.write_all(&entry_node.to_le_bytes())?;
        write_pod(w, &self.labels, u64::swap_bytes)?;
        w.write_all(&self.levels)?;
        let swap = |x: f32| f32::from_bits(x.to_bits().swap_bytes());
        if erased.iter().any(|e| *e) {
            let mut mean = vec![0.0f32; self.dim];
            let mut around = Vec::new();
            for (i, e) in erased.iter().enumerate() {
                if !*e {
                    write_pod(w, self.vector(i as u32), swap)?;
                    continue;
                }
                mean.fill(0.0);
                self.neighbours(i as u32, 0, &mut around);
                for n in &around {
                    if !erased.get(*n as usize).copied().unwrap_or(true) {
                        for (m, x) in mean.iter_mut().zip(self.vector(*n)) {
                            *m += x;
                        }
                    }
                }
                let norm = mean.iter().map(|x| x * x).sum::<f32>().sqrt();
                if norm > 0.0 && norm.is_finite() {
                    mean.iter_mut().for_each(|x| *x /= norm);
                } else {
                    mean.fill(0.0);
                }
                // The mean of one kept vector (one neighbour kept, or all of them copies
                // of one text) is that vector: read back, the tombstone would be a twin
                // candidate for the next copy of the neighbour's text, and its copies
                // would hang on two chains. Such a tombstone gets zeros (nothing is its
                // twin; walks through it go by its links alone).
                if around.iter().any(|n| {
                    !erased.get(*n as usize).copied().unwrap_or(true)
                        && self.dist(&mean, *n) <= TWIN_DIST
                }) {
                    mean.fill(0.0);
                }
                write_pod(w, &mean, swap)?;
            }
        } else {
            write_pod(w, &self.vectors, swap)?;
        }
        let links: Vec<u32> = self.links0.iter().map(|a| a.load(Mem::Acquire)).collect();
        write_pod(w, &links, u32::swap_bytes)?;
        let upper: Vec<u32> = self
            .upper
            .iter()
            .flat_map(|b| b.iter().map(|a| a.load(Mem::Acquire)))
            .collect();
        write_pod(w, &upper, u32::swap_bytes)?;
        let twins: Vec<u32> = self.twins.iter().map(|a| a.load(Mem::Acquire)).collect();
        write_pod(w, &twins, u32::swap_bytes)?;
        Ok(self
            .labels
            .iter()
            .zip(&erased)
            .filter(|(_, e)| **e)
            .map(|(l, _)| *l)
            .collect())
    }

    /// Reads a graph written by [`Self::write_to`], checking that it was made with `params`
    /// for `dim` and that every link points at a node.
    pub fn read_from(r: &mut impl Read, dim: usize, params: HnswParams) -> Result<Self, HnswError> {
        let bad = |s: String| HnswError::Format(s);
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic)?;
        if &magic != MAGIC {
            return Err(bad("not a Cairn HNSW graph".into()));
        }
        let mut head = [0u32; 6];
        for h in &mut head {
            *h = read_u32(r)?;
        }
        let [version, fdim, m, ef_c, max_layer, entry_level] = head.map(|x| x as usize);
        if version != VERSION as usize {
            return Err(bad(format!("graph format {version}, expected {VERSION}")));
        }
        let mut g = Self::new(dim, params);
        if (fdim, m, ef_c, max_layer) != (dim, g.m, g.ef_construction, g.max_layer) {
            return Err(bad("graph made with another dimension or parameters".into()));
        }
        let n = usize::try_from(read_u64(r)?).map_err(|_| bad("node count".into()))?;
        let entry_node = read_u64(r)?;
        if n > u32::MAX as usize - 1 {
            return Err(bad(format!("{n} nodes")));
        }
        g.labels = read_u64s(r, n)?;
        g.nodes = g
            .labels
            .iter()
            .enumerate()
            .map(|(i, l)| (*l, i as u32))
            .collect();
        g.levels = read_pod(r, n, |x: u8| x)?;
        if g.levels.iter().any(|l| *l as usize >= g.max_layer) {
            return Err(bad("node level above the layer count".into()));
        }
        let vlen = n.checked_mul(dim).ok_or_else(|| bad("size".into()))?;
        g.vectors = read_f32s(r, vlen)?;
        g.codes.reserve_exact(vlen);
        g.scales = Vec::with_capacity(n);
        if dim > 0 {
            for v in g.vectors.chunks_exact(dim) {
                g.scales.push(quantize_into(v, &mut g.codes));
            }
        }
        let stride0 = g.m0 + 1;
        let links0 = read_u32s(r, n * stride0)?;
        let upper_len: usize = g.levels.iter().map(|l| *l as usize * (g.m + 1)).sum();
        let upper = read_u32s(r, upper_len)?;
        let twins = read_u32s(r, n)?;
        let mut extra = [0u8; 1];
        if r.read(&mut extra)? != 0 {
            return Err(bad("trailing bytes after the graph".into()));
        }
        let check = |block: &[u32], cap: usize| -> bool {
            block.chunks_exact(cap + 1).all(|l| {
                let c = l[0] as usize;
                c <= cap && l[1..=c].iter().all(|id| (*id as usize) < n)
            })
        };
        if !check(&links0, g.m0) || !check(&upper, g.m) {
            return Err(bad("a link points outside the graph".into()));
        }
        if !twin_chains_are_lists(&twins) {
            return Err(bad("a twin chain points outside the graph or loops".into()));
        }
        g.has_twins = AtomicBool::new(twins.iter().any(|t| *t != NO_TWIN));
        // Each chain walked from its head (a node no twin link points at); the chains were
        // checked above to be simple lists.
        let mut heads = vec![NO_TWIN; n];
        let mut pointed = vec![false; n];
        for t in twins.iter().filter(|t| **t != NO_TWIN) {
            pointed[*t as usize] = true;
        }
        g.twin_count = AtomicUsize::new(pointed.iter().filter(|p| **p).count());
        let mut least = vec![NO_TWIN; n];
        for head in (0..n).filter(|h| !pointed[*h] && twins[*h] != NO_TWIN) {
            let mut t = twins[head];
            let mut min = head as u32;
            while t != NO_TWIN {
                heads[t as usize] = head as u32;
                if g.labels[t as usize] < g.labels[min as usize] {
                    min = t;
                }
                t = twins[t as usize];
            }
            least[head] = min;
        }
        g.heads = heads.into_iter().map(AtomicU32::new).collect();
        g.least = least.into_iter().map(AtomicU32::new).collect();
        g.twins = twins.into_iter().map(AtomicU32::new).collect();
        g.links0 = links0.into_iter().map(AtomicU32::new).collect();
        let mut rest = upper.as_slice();
        g.upper = Vec::with_capacity(n);
        for l in &g.levels {
            let (mine, tail) = rest.split_at(*l as usize * (g.m + 1));
            g.upper
                .push(mine.iter().map(|x| AtomicU32::new(*x)).collect());
            rest = tail;
        }
        g.locks = (0..n).map(|_| Mutex::new(())).collect();
        if n > 0 {
            let e = usize::try_from(entry_node).map_err(|_| bad("entry".into()))?;
            if e >= n || entry_level >= g.max_layer {
                return Err(bad("entry point outside the graph".into()));
            }
            g.entry
                .store(((entry_level as u64) << 32) | entry_node, Mem::Release);
        }
        Ok(g)
    }

    /// Labels that appear more than once (a correct graph has none).
    pub fn duplicate_labels(&self) -> Vec<u64> {
        let mut seen = HashSet::with_capacity(self.len());
        self.labels
            .iter()
            .filter(|l| !seen.insert(**l))
            .copied()
            .collect()
    }
}

/// Whether `next` (per node, the next twin or [`NO_TWIN`]) is a set of simple chains: every
/// link points at a node, no node is pointed at twice, and no chain loops (a search walks
/// them to their end).
fn twin_chains_are_lists(next: &[u32]) -> bool {
    let n = next.len();
    let mut pointed = vec![false; n];
    for &t in next {
        if t == NO_TWIN {
            continue;
        }
        match pointed.get_mut(t as usize) {
            Some(p) if !*p => *p = true,
            _ => return false,
        }
    }
    // Walked from their heads (nodes nobody points at), the chains reach every node that is
    // pointed at, unless some of them form a loop.
    let mut reached = 0usize;
    for head in (0..n).filter(|i| !pointed[*i]) {
        let mut t = next[head];
        while t != NO_TWIN {
            reached += 1;
            if reached > n {
                return false;
            }
            t = next[t as usize];
        }
    }
    reached == pointed.iter().filter(|p| **p).count()
}

/// The operations run under [`pulp::Arch::dispatch`]: everything they call on the hot
/// path is `#[inline(always)]`, so it is compiled for the detected vector unit, and their
/// distances are computed in plain loops: a closure handed to a generic function (an
/// iterator's `collect`) is compiled with that function, apart, for the baseline target.
/// The test `dispatched_paths_are_compiled_inline` fails when a function of this module
/// other than the entry points, set-up and I/O is compiled out of line.
struct SearchOp<'a> {
    g: &'a Hnsw,
    q: &'a [f32],
    k: usize,
    ef: usize,
    admit: Option<&'a dyn Fn(u64) -> bool>,
}

impl pulp::WithSimd for SearchOp<'_> {
    type Output = Vec<(u64, f32)>;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> Self::Output {
        self.g.search_inner(self.q, self.k, self.ef, self.admit)
    }
}

struct GroupsOp<'a> {
    g: &'a Hnsw,
    q: &'a [f32],
    k: usize,
    ef: usize,
    admit: Option<&'a dyn Fn(u64) -> bool>,
    scan: bool,
}

impl pulp::WithSimd for GroupsOp<'_> {
    type Output = Vec<(u64, f32, usize)>;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> Self::Output {
        self.g
            .search_groups_inner(self.q, self.k, self.ef, self.admit, self.scan)
    }
}

struct ExactOp<'a> {
    g: &'a Hnsw,
    q: &'a [f32],
    k: usize,
    admit: Option<&'a dyn Fn(u64) -> bool>,
}

impl pulp::WithSimd for ExactOp<'_> {
    type Output = Vec<(u64, f32)>;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> Self::Output {
        self.g.exact_inner(self.q, self.k, self.admit)
    }
}

struct AmongOp<'a> {
    g: &'a Hnsw,
    q: &'a [f32],
    k: usize,
    nodes: &'a [u32],
}

impl pulp::WithSimd for AmongOp<'_> {
    type Output = Vec<(u64, f32)>;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> Self::Output {
        self.g.among_inner(self.q, self.k, self.nodes)
    }
}

struct LinkOp<'a> {
    g: &'a Hnsw,
    q: u32,
}

impl pulp::WithSimd for LinkOp<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        self.g.link_inner(self.q)
    }
}

/// Writes plain values little-endian (as they are on little-endian machines).
fn write_pod<T: bytemuck::Pod>(
    w: &mut impl Write,
    xs: &[T],
    swap: fn(T) -> T,
) -> std::io::Result<()> {
    if cfg!(target_endian = "little") {
        w.write_all(bytemuck::cast_slice(xs))
    } else {
        let swapped: Vec<T> = xs.iter().map(|x| swap(*x)).collect();
        w.write_all(bytemuck::cast_slice(&swapped))
    }
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// Reads `n` plain values in chunks, so a damaged count fails at the end of the data instead
/// of allocating it all up front.
fn read_pod<T: bytemuck::Pod + Default>(
    r: &mut impl Read,
    n: usize,
    swap: fn(T) -> T,
) -> std::io::Result<Vec<T>> {
    const CHUNK: usize = 1 << 20;
    let mut out: Vec<T> = Vec::new();
    while out.len() < n {
        let take = (n - out.len()).min(CHUNK);
        let start = out.len();
        out.resize(start + take, T::default());
        r.read_exact(bytemuck::cast_slice_mut(&mut out[start..]))?;
    }
    if cfg!(target_endian = "big") {
        for x in &mut out {
            *x = swap(*x);
        }
    }
    Ok(out)
}

fn read_u32s(r: &mut impl Read, n: usize) -> std::io::Result<Vec<u32>> {
    read_pod(r, n, u32::swap_bytes)
}

fn read_u64s(r: &mut impl Read, n: usize) -> std::io::Result<Vec<u64>> {
    read_pod(r, n, u64::swap_bytes)
}

fn read_f32s(r: &mut impl Read, n: usize) -> std::io::Result<Vec<f32>> {
    read_pod(r, n, |x: f32| f32::from_bits(x.to_bits().swap_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn unit(rng: &mut StdRng, dim: usize) -> Vec<f32> {
        let v: Vec<f32> = (0..dim).map(|_| rng.random::<f32>() - 0.5).collect();
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / n).collect()
    }

    fn build(n: usize, dim: usize, threads: usize, seed: u64) -> (Hnsw, Vec<Vec<f32>>) {
        let mut rng = StdRng::seed_from_u64(seed);
        let data: Vec<Vec<f32>> = (0..n).map(|_| unit(&mut rng, dim)).collect();
        let mut g = Hnsw::new(dim, HnswParams::default());
        let items: Vec<(u64, &[f32])> = data
            .iter()
            .enumerate()
            .map(|(i, v)| (i as u64 * 3 + 7, v.as_slice()))
            .collect();
        g.insert(&items, threads).unwrap();
        (g, data)
    }

    fn recall(
        g: &Hnsw,
        queries: &[Vec<f32>],
        ef: usize,
        admit: Option<&dyn Fn(u64) -> bool>,
    ) -> f64 {
        let mut hit = 0usize;
        let mut total = 0usize;
        for q in queries {
            let truth: HashSet<u64> = g.exact(q, 10, admit).into_iter().map(|x| x.0).collect();
            let got = g.search(q, 10, ef, admit);
            assert!(
                got.windows(2).all(|w| w[0].1 <= w[1].1),
                "sorted nearest first"
            );
            if let Some(f) = admit {
                assert!(got.iter().all(|(l, _)| f(*l)), "only admitted labels");
            }
            total += truth.len();
            hit += got.iter().filter(|x| truth.contains(&x.0)).count();
        }
        hit as f64 / total as f64
    }

    #[test]
    fn dot_matches_a_plain_sum() {
        let mut rng = StdRng::seed_from_u64(1);
        for dim in [1, 3, 15, 16, 17, 63, 64, 65, 100, 384, 385] {
            let a: Vec<f32> = (0..dim).map(|_| rng.random::<f32>()).collect();
            let b: Vec<f32> = (0..dim).map(|_| rng.random::<f32>()).collect();
            let plain: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let fast = pulp::Arch::new().dispatch(|| dot(&a, &b));
            assert!(
                (f64::from(fast) - plain).abs() < 1e-4 * dim as f64,
                "dim {dim}"
            );
        }
    }

    #[test]
    fn finds_nearly_all_true_neighbours() {
        let (g, _) = build(4000, 32, 1, 2);
        let mut rng = StdRng::seed_from_u64(3);
        let queries: Vec<Vec<f32>> = (0..100).map(|_| unit(&mut rng, 32)).collect();
        let r = recall(&g, &queries, 64, None);
        assert!(r > 0.95, "recall {r}");
        // Every stored vector finds itself.
        let (g, data) = build(1000, 16, 1, 4);
        for (i, v) in data.iter().enumerate() {
            let hit = g.search(v, 1, 32, None);
            assert_eq!(hit[0].0, i as u64 * 3 + 7);
        }
    }

    #[test]
    fn parallel_build_is_as_good() {
        let (g, _) = build(4000, 32, 4, 2);
        assert_eq!(g.len(), 4000);
        assert!(g.duplicate_labels().is_empty());
        let mut rng = StdRng::seed_from_u64(3);
        let queries: Vec<Vec<f32>> = (0..100).map(|_| unit(&mut rng, 32)).collect();
        let r = recall(&g, &queries, 64, None);
        assert!(r > 0.95, "recall {r}");
    }

    #[test]
    fn filters_admit_only_their_labels() {
        let (g, _) = build(3000, 24, 2, 5);
        let mut rng = StdRng::seed_from_u64(6);
        let queries: Vec<Vec<f32>> = (0..50).map(|_| unit(&mut rng, 24)).collect();
        let odd = |l: u64| l % 2 == 1;
        let r = recall(&g, &queries, 64, Some(&odd));
        assert!(r > 0.9, "filtered recall {r}");
        let none = |_: u64| false;
        assert!(g.search(&queries[0], 5, 64, Some(&none)).is_empty());
    }

    #[test]
    fn exact_among_scores_just_those_labels() {
        let (g, data) = build(500, 8, 1, 11);
        let labels: Vec<u64> = (0..500u64).step_by(5).map(|i| i * 3 + 7).collect();
        let admit = |l: u64| (l - 7).is_multiple_of(15);
        let want = g.exact(&data[3], 7, Some(&admit));
        assert_eq!(g.exact_among(&data[3], 7, &labels), Some(want));
        assert!(g.contains(7) && !g.contains(8));
        assert_eq!(g.exact_among(&data[3], 7, &[7, 8]), None);
    }

    #[test]
    fn small_and_odd_inputs() {
        let mut g = Hnsw::new(3, HnswParams::default());
        assert!(g.search(&[1.0, 0.0, 0.0], 3, 10, None).is_empty());
        assert!(matches!(
            g.reserve(&[(1, &[1.0, 0.0][..])]),
            Err(HnswError::Dimension {
                expected: 3,
                got: 2
            })
        ));
        assert!(g.is_empty());
        g.insert(&[(1, &[1.0, 0.0, 0.0][..])], 1).unwrap();
        assert_eq!(g.search(&[0.0, 1.0, 0.0], 3, 10, None).len(), 1);
        assert!(g.search(&[0.0, 1.0], 3, 10, None).is_empty());
        assert!(g.search(&[0.0, 1.0, 0.0], 0, 10, None).is_empty());
    }

    #[test]
    fn searches_run_while_nodes_are_linked() {
        let mut rng = StdRng::seed_from_u64(8);
        let data: Vec<Vec<f32>> = (0..3000).map(|_| unit(&mut rng, 16)).collect();
        let mut g = Hnsw::new(16, HnswParams::default());
        let items: Vec<(u64, &[f32])> = data
            .iter()
            .enumerate()
            .map(|(i, v)| (i as u64, v.as_slice()))
            .collect();
        g.insert(&items[..1000], 1).unwrap();
        let nodes = g.reserve(&items[1000..]).unwrap();
        let g = &g;
        std::thread::scope(|s| {
            s.spawn(move || g.link(nodes, 2));
            s.spawn(|| {
                for v in data.iter().take(500) {
                    let hits = g.search(v, 5, 32, None);
                    assert!(!hits.is_empty());
                    assert!(hits.iter().all(|(l, _)| *l < 3000));
                }
            });
        });
        let missed: Vec<usize> = (0..data.len())
            .filter(|i| g.search(&data[*i], 1, 64, None)[0].0 != *i as u64)
            .collect();
        // Concurrent linking can leave a rare node whose in-links were all pruned away (as in
        // hnswlib); it must stay rare.
        assert!(
            missed.len() <= 3,
            "{} of 3000 missed: {missed:?}",
            missed.len()
        );
    }

    #[test]
    fn round_trips_through_bytes_and_refuses_damage() {
        let (g, data) = build(1500, 20, 2, 9);
        let mut buf = Vec::new();
        g.write_to(&mut buf).unwrap();
        let h = Hnsw::read_from(&mut buf.as_slice(), 20, HnswParams::default()).unwrap();
        assert_eq!(h.labels(), g.labels());
        for v in data.iter().take(50) {
            assert_eq!(g.search(v, 10, 64, None), h.search(v, 10, 64, None));
        }
        // Other parameters, truncation, trailing bytes and wild links are refused.
        let other = HnswParams {
            m: 8,
            ..HnswParams::default()
        };
        assert!(Hnsw::read_from(&mut buf.as_slice(), 20, other).is_err());
        assert!(Hnsw::read_from(&mut buf.as_slice(), 21, HnswParams::default()).is_err());
        for cut in [0, 7, 40, buf.len() / 2, buf.len() - 1] {
            assert!(Hnsw::read_from(&mut &buf[..cut], 20, HnswParams::default()).is_err());
        }
        let mut longer = buf.clone();
        longer.push(0);
        assert!(Hnsw::read_from(&mut longer.as_slice(), 20, HnswParams::default()).is_err());
        // Layer-0 lists start after the header, labels, levels and vectors.
        let links0 = 8 + 24 + 16 + 1500 * 8 + 1500 + 1500 * 20 * 4;
        let mut wild = buf.clone();
        wild[links0..links0 + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert!(Hnsw::read_from(&mut wild.as_slice(), 20, HnswParams::default()).is_err());
        let mut wild = buf.clone();
        wild[links0..links0 + 4].copy_from_slice(&1u32.to_le_bytes());
        wild[links0 + 4..links0 + 8].copy_from_slice(&1500u32.to_le_bytes());
        assert!(Hnsw::read_from(&mut wild.as_slice(), 20, HnswParams::default()).is_err());
        // An empty graph round-trips too.
        let e = Hnsw::new(4, HnswParams::default());
        let mut buf = Vec::new();
        e.write_to(&mut buf).unwrap();
        let e = Hnsw::read_from(&mut buf.as_slice(), 4, HnswParams::default()).unwrap();
        assert!(e.is_empty() && e.search(&[1.0, 0.0, 0.0, 0.0], 1, 8, None).is_empty());
    }

    /// `copies` copies of `distinct` random vectors, copy-major (labels `c * distinct + i`).
    fn repeated(
        distinct: usize,
        copies: usize,
        dim: usize,
        threads: usize,
    ) -> (Hnsw, Vec<Vec<f32>>) {
        repeated_labelled(distinct, copies, dim, threads, |c, i| {
            (c * distinct + i) as u64
        })
    }

    /// [`repeated`] with copy `c` of vector `i` labelled `label(c, i)`.
    fn repeated_labelled(
        distinct: usize,
        copies: usize,
        dim: usize,
        threads: usize,
        label: impl Fn(usize, usize) -> u64 + Copy,
    ) -> (Hnsw, Vec<Vec<f32>>) {
        let mut rng = StdRng::seed_from_u64(21);
        let data: Vec<Vec<f32>> = (0..distinct).map(|_| unit(&mut rng, dim)).collect();
        let items: Vec<(u64, &[f32])> = (0..copies)
            .flat_map(|c| {
                data.iter()
                    .enumerate()
                    .map(move |(i, v)| (label(c, i), v.as_slice()))
            })
            .collect();
        let mut g = Hnsw::new(dim, HnswParams::default());
        g.insert(&items, threads).unwrap();
        (g, data)
    }

    #[test]
    fn repeated_vectors_hang_on_one_node_and_are_all_found() {
        // Linked as nodes, 40 copies of each vector filled 99% of the layer-0 lists with
        // copies of their own node, and a filtered search for 400 found 4% of them.
        let (distinct, copies) = (400, 40);
        for threads in [1, 2] {
            let (g, data) = repeated(distinct, copies, 48, threads);
            assert_eq!(g.len(), distinct * copies);
            let mut ids = Vec::new();
            let (mut links, mut to_copies, mut linked) = (0usize, 0usize, 0usize);
            for n in 0..g.len() as u32 {
                g.neighbours(n, 0, &mut ids);
                linked += usize::from(!ids.is_empty());
                links += ids.len();
                to_copies += ids.iter().filter(|x| g.same_vector(n, **x)).count();
            }
            // One node linked per vector, however many threads link the batch: the copies
            // are linked after the batch's first copy, and hang on its chain.
            assert_eq!(linked, distinct, "{threads} threads");
            for i in 0..distinct {
                let mut labels = g.twin_labels(i as u64);
                labels.sort_unstable();
                let want: Vec<u64> = (0..copies).map(|c| (c * distinct + i) as u64).collect();
                assert_eq!(labels, want, "{threads} threads: copies of {i}");
            }
            assert!(
                to_copies * 50 <= links,
                "{to_copies} of {links} links join copies"
            );
            let mut rng = StdRng::seed_from_u64(22);
            for round in 0..30 {
                let q = unit(&mut rng, 48);
                let even = |l: u64| l.is_multiple_of(2);
                let admit: Option<&dyn Fn(u64) -> bool> =
                    if round % 2 == 0 { Some(&even) } else { None };
                let got = g.search(&q, 400, 400, admit);
                let truth: HashSet<u64> =
                    g.exact(&q, 400, admit).into_iter().map(|x| x.0).collect();
                assert_eq!(got.len(), 400, "round {round}: a full answer");
                assert!(got.windows(2).all(|w| w[0].1 <= w[1].1));
                let hit = got.iter().filter(|x| truth.contains(&x.0)).count();
                assert!(hit >= 380, "round {round}: {hit} of 400");
                if let Some(f) = admit {
                    assert!(got.iter().all(|(l, _)| f(*l)));
                }
            }
            // A stored vector finds every copy of itself, at distance ~0.
            for (i, v) in data.iter().enumerate().take(20) {
                let got = g.search(v, copies, 64, None);
                let want: HashSet<u64> = (0..copies).map(|c| (c * distinct + i) as u64).collect();
                let labels: HashSet<u64> = got.iter().map(|x| x.0).collect();
                assert_eq!(labels, want, "copies of {i}");
                assert!(got.iter().all(|x| x.1.abs() < 1e-5));
            }
        }
    }

    /// Copies next to each other in one batch, linked by two threads: without the batch's
    /// first copies linked first, two threads took two copies of a vector at once, neither
    /// saw the other, and the copies split over two chains.
    #[test]
    fn copies_side_by_side_in_a_batch_share_one_chain() {
        let mut rng = StdRng::seed_from_u64(41);
        let (distinct, copies, dim) = (1_000, 4, 32);
        let data: Vec<Vec<f32>> = (0..distinct).map(|_| unit(&mut rng, dim)).collect();
        let items: Vec<(u64, &[f32])> = (0..distinct * copies)
            .map(|j| (j as u64, data[j / copies].as_slice()))
            .collect();
        let mut g = Hnsw::new(dim, HnswParams::default());
        g.insert(&items, 2).unwrap();
        assert_eq!(g.distinct(), distinct);
        for i in 0..distinct {
            let mut labels = g.twin_labels((i * copies) as u64);
            labels.sort_unstable();
            let want: Vec<u64> = (i * copies..(i + 1) * copies).map(|l| l as u64).collect();
            assert_eq!(labels, want, "copies of {i}");
        }
    }

    /// An erased node whose kept neighbours hold one vector between them would get that
    /// vector as its mean: read back, it would be a twin candidate for the next copy of the
    /// neighbour's text, and the text's copies would hang on two chains.
    #[test]
    fn a_tombstone_is_never_the_twin_of_a_kept_vector() {
        let mut rng = StdRng::seed_from_u64(31);
        let (dim, params) = (16, HnswParams::default());
        let gone = unit(&mut rng, dim);
        let kept = unit(&mut rng, dim);
        for copies_kept in [1, 3] {
            // The erased node comes first (the least node id wins a tie between twins).
            let mut items: Vec<(u64, &[f32])> = vec![(0, gone.as_slice())];
            items.extend((1..=copies_kept).map(|l| (l, kept.as_slice())));
            let mut g = Hnsw::new(dim, params);
            g.insert(&items, 1).unwrap();
            let mut buf = Vec::new();
            let erased = g.write_to_erasing(&mut buf, |l| l != 0).unwrap();
            assert_eq!(erased, vec![0]);
            let bytes: Vec<u8> = gone[..4].iter().flat_map(|x| x.to_le_bytes()).collect();
            assert!(!buf.windows(bytes.len()).any(|w| w == bytes));
            let mut h = Hnsw::read_from(&mut buf.as_slice(), dim, params).unwrap();
            h.insert(&[(100, kept.as_slice())], 1).unwrap();
            let mut labels = h.twin_labels(1);
            labels.sort_unstable();
            let mut want: Vec<u64> = (1..=copies_kept).collect();
            want.push(100);
            assert_eq!(labels, want, "{copies_kept} kept");
            assert!(h.twin_labels(0).iter().all(|l| *l == 0));
        }
    }

    #[test]
    fn twins_round_trip_and_broken_chains_are_refused() {
        let (g, data) = repeated(100, 5, 16, 1);
        assert!(g.has_twins.load(Mem::Relaxed));
        let mut buf = Vec::new();
        g.write_to(&mut buf).unwrap();
        let h = Hnsw::read_from(&mut buf.as_slice(), 16, HnswParams::default()).unwrap();
        for v in data.iter().take(20) {
            assert_eq!(g.search(v, 10, 64, None), h.search(v, 10, 64, None));
            assert_eq!(h.search(v, 5, 64, None).len(), 5);
        }
        // The chains are the last 4 bytes per node; two nodes pointing at each other loop.
        let n = g.len();
        let at = buf.len() - 4 * n;
        let mut looped = buf.clone();
        looped[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
        looped[at + 4..at + 8].copy_from_slice(&0u32.to_le_bytes());
        assert!(Hnsw::read_from(&mut looped.as_slice(), 16, HnswParams::default()).is_err());
        let mut wild = buf.clone();
        wild[at..at + 4].copy_from_slice(&(n as u32).to_le_bytes());
        assert!(Hnsw::read_from(&mut wild.as_slice(), 16, HnswParams::default()).is_err());
    }

    #[test]
    fn copies_are_one_answer_and_known_by_key() {
        let (distinct, copies) = (100, 5);
        // Copy `c` of vector `i` is label `c * distinct + i`, or, with `reversed`, label
        // `(copies - 1 - c) * distinct + i`: then each vector's first copy (the node its
        // twins hang on) has the greatest label, and the least is the last twin hung.
        let vector_of = |l: u64| l % distinct as u64;
        let copy_labels = |i: u64| -> Vec<u64> {
            (0..copies as u64)
                .map(|c| c * distinct as u64 + i)
                .collect()
        };
        for reversed in [false, true] {
            let (g, data) = repeated_labelled(distinct, copies, 16, 2, |c, i| {
                let c = if reversed { copies - 1 - c } else { c };
                (c * distinct + i) as u64
            });
            let mut buf = Vec::new();
            g.write_to(&mut buf).unwrap();
            let h = Hnsw::read_from(&mut buf.as_slice(), 16, HnswParams::default()).unwrap();
            for graph in [&g, &h] {
                assert_eq!(graph.distinct(), distinct);
                // Every copy of a vector, and nothing else, shares its key and its labels.
                let mut keys = HashSet::new();
                for i in 0..distinct as u64 {
                    let key = graph.twin_key(i).unwrap();
                    assert!(keys.insert(key), "vector {i} has a key of its own");
                    for l in copy_labels(i) {
                        assert_eq!(graph.twin_key(l), Some(key));
                        let mut labels = graph.twin_labels(l);
                        labels.sort_unstable();
                        assert_eq!(labels, copy_labels(i));
                    }
                }
                assert_eq!(graph.twin_key(u64::MAX), None);
                assert!(graph.twin_labels(u64::MAX).is_empty());
                let even = |l: u64| l.is_multiple_of(2);
                // (Leaves out some vectors' least label, so their chains are walked.)
                let thirds = |l: u64| !l.is_multiple_of(3);
                let not_first = |l: u64| l >= distinct as u64;
                let few = |l: u64| vector_of(l) < 12 && l % 3 != 1;
                type Admit<'a> = Option<&'a dyn Fn(u64) -> bool>;
                let filters: [(&str, Admit<'_>); 5] = [
                    ("none", None),
                    ("even", Some(&even)),
                    ("thirds", Some(&thirds)),
                    ("not the first copy", Some(&not_first)),
                    ("few", Some(&few)),
                ];
                let mut rng = StdRng::seed_from_u64(5);
                for round in 0..10 {
                    let q = unit(&mut rng, 16);
                    // Through a walk of the graph and through a scan of its vectors (a small
                    // graph is scanned when filtered).
                    for ((name, admit), scan) in
                        filters.into_iter().flat_map(|f| [(f, false), (f, true)])
                    {
                        let k = 30;
                        let groups = graph.groups(&q, k, 64, admit, scan);
                        if admit.is_some() {
                            assert_eq!(
                                graph.search_groups(&q, k, 64, admit),
                                graph.groups(&q, k, 64, admit, true)
                            );
                        }
                        let holding = (0..distinct as u64)
                            .filter(|i| copy_labels(*i).iter().any(|l| admit.is_none_or(|f| f(*l))))
                            .count();
                        let at = format!("reversed {reversed}, round {round}, {name}, scan {scan}");
                        assert_eq!(groups.len(), k.min(holding), "{at}: distinct vectors");
                        assert!(groups.windows(2).all(|w| w[0].1 <= w[1].1));
                        let vectors: HashSet<u64> = groups.iter().map(|g| vector_of(g.0)).collect();
                        assert_eq!(vectors.len(), groups.len(), "{at}: each vector once");
                        // Counted exactly until k copies are, and all when fewer than k
                        // answers; a lower bound after.
                        let mut counted = 0;
                        for (label, d, n) in &groups {
                            let admitted: Vec<u64> = copy_labels(vector_of(*label))
                                .into_iter()
                                .filter(|l| admit.is_none_or(|f| f(*l)))
                                .collect();
                            if counted < k || groups.len() < k {
                                assert_eq!(*n, admitted.len(), "{at}");
                            } else {
                                assert!((1..=admitted.len()).contains(n), "{at}");
                            }
                            counted += n;
                            assert_eq!(Some(label), admitted.iter().min(), "{at}");
                            let v = &data[vector_of(*label) as usize];
                            assert!((d - (1.0 - dot(&q, v))).abs() < 1e-6);
                        }
                        // The nearest vectors, as the plain search ranks their copies.
                        let first = graph.search(&q, copies, 64, admit);
                        assert_eq!(vector_of(first[0].0), vector_of(groups[0].0), "{at}");
                        // A scan finds the exact nearest vectors that hold an admitted label.
                        if scan && admit.is_some() {
                            let mut all: Vec<(f32, u64)> = (0..distinct as u64)
                                .filter(|i| {
                                    copy_labels(*i).iter().any(|l| admit.is_none_or(|f| f(*l)))
                                })
                                .map(|i| (1.0 - dot(&q, &data[i as usize]), i))
                                .collect();
                            all.sort_by(|a, b| a.0.total_cmp(&b.0));
                            let want: HashSet<u64> = all.iter().take(k).map(|(_, i)| *i).collect();
                            assert_eq!(vectors, want, "{at}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn copies_are_counted_for_every_answer_as_near_as_the_kth_copy() {
        // The query's own vector (three copies), then two vectors at exactly the same
        // distance (two copies each), then vectors far off. Asked for four: the count
        // reaches four within the tie, and both tied answers are counted, whichever label
        // the final order puts first.
        let dim = 16;
        let axis =
            |j: usize| -> Vec<f32> { (0..dim).map(|i| f32::from(u8::from(i == j))).collect() };
        let q = axis(0);
        let mut a = vec![0.0; dim];
        (a[0], a[1]) = (0.8, 0.6);
        let mut b = vec![0.0; dim];
        (b[0], b[1]) = (0.8, -0.6);
        let far: Vec<Vec<f32>> = (2..dim).map(axis).collect();
        for (la, lb) in [([200, 201], [10, 11]), ([10, 11], [200, 201])] {
            let mut items: Vec<(u64, &[f32])> = vec![(100, &q), (101, &q), (102, &q)];
            items.extend(la.iter().map(|l| (*l, a.as_slice())));
            items.extend(lb.iter().map(|l| (*l, b.as_slice())));
            items.extend(
                far.iter()
                    .enumerate()
                    .map(|(j, v)| (300 + j as u64, v.as_slice())),
            );
            let mut g = Hnsw::new(dim, HnswParams::default());
            g.insert(&items, 1).unwrap();
            let groups = g.search_groups(&q, 4, 64, None);
            assert_eq!(groups.len(), 4);
            assert_eq!((groups[0].0, groups[0].2), (100, 3));
            assert_eq!(groups[1].1, groups[2].1, "the tie");
            assert_eq!((groups[1].0, groups[1].2), (10, 2), "{groups:?}");
            assert_eq!((groups[2].0, groups[2].2), (200, 2), "{groups:?}");
            assert!(groups[3].0 >= 300);
        }
    }

    #[test]
    fn twin_chains_are_checked() {
        let x = NO_TWIN;
        assert!(twin_chains_are_lists(&[]));
        assert!(twin_chains_are_lists(&[x, x, x]));
        assert!(twin_chains_are_lists(&[2, x, 1, x]));
        assert!(twin_chains_are_lists(&[1, x, 3, x]));
        assert!(!twin_chains_are_lists(&[1, 0]), "a loop");
        assert!(
            !twin_chains_are_lists(&[x, 2, 3, 1]),
            "a loop beside a head"
        );
        assert!(!twin_chains_are_lists(&[0]), "a node its own twin");
        assert!(!twin_chains_are_lists(&[2, 2, x]), "pointed at twice");
        assert!(!twin_chains_are_lists(&[5, x]), "outside");
    }

    /// The functions of this module that may be compiled out of line: entry points (each
    /// runs its operation under the dispatch), set-up before a walk, and I/O. A search,
    /// link or scan step compiled apart runs on the baseline target, not the dispatched
    /// vector unit (see [`SearchOp`]): the walk ran on SSE2 that way for weeks, at half the
    /// index's query speed, with the same results.
    /// Every function of the module off the per-distance paths is listed, whether this
    /// build inlines it or not, so the test does not hang on the inliner's choices.
    const OUT_OF_LINE: &[&str] = &[
        "Hnsw::add_twin",
        "Hnsw::contains",
        "Hnsw::dim",
        "Hnsw::distinct",
        "Hnsw::duplicate_labels",
        "Hnsw::entry",
        "Hnsw::exact",
        "Hnsw::exact_among",
        "Hnsw::give_scratch",
        "Hnsw::groups",
        "Hnsw::insert",
        "Hnsw::is_empty",
        "Hnsw::labels",
        "Hnsw::len",
        "Hnsw::level_for",
        "Hnsw::link",
        "Hnsw::link::{{closure}}",
        "Hnsw::link::{{closure}}::{{closure}}",
        "Hnsw::link_one",
        "Hnsw::new",
        "Hnsw::read_from",
        "Hnsw::read_from::{{closure}}",
        "Hnsw::reserve",
        "Hnsw::search",
        "Hnsw::search_groups",
        "Hnsw::take_scratch",
        "Hnsw::twin_key",
        "Hnsw::twin_labels",
        "Hnsw::write_to",
        "Hnsw::write_to_erasing",
        "Hnsw::write_to_erasing::{{closure}}",
        "Scratch::reset",
        "lock",
        "read_f32s",
        "read_pod",
        "read_u32",
        "read_u32s",
        "read_u64",
        "read_u64s",
        "splitmix",
        "twin_chains_are_lists",
        "write_pod",
        "<Hnsw as core::fmt::Debug>::fmt",
        "<HnswError as core::fmt::Debug>::fmt",
        "<HnswError as core::fmt::Display>::fmt",
        "<Scratch as core::default::Default>::default",
    ];

    /// The names of the function symbols of an ELF64 little-endian file (its `.symtab`).
    fn elf_function_symbols(elf: &[u8]) -> Vec<String> {
        let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
        let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) as usize;
        let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap()) as usize;
        assert_eq!(
            &elf[..6],
            b"\x7fELF\x02\x01",
            "not a 64-bit little-endian ELF file"
        );
        let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3A), u16_at(0x3C));
        let section = |i: usize| shoff + i * shentsize;
        let mut names = Vec::new();
        for i in 0..shnum {
            let sh = section(i);
            // SHT_SYMTAB; its names are in the section its link names.
            if u32_at(sh + 4) != 2 {
                continue;
            }
            let (off, size) = (u64_at(sh + 0x18), u64_at(sh + 0x20));
            let strtab = u64_at(section(u32_at(sh + 0x28)) + 0x18);
            for sym in elf[off..off + size].chunks_exact(24) {
                // STT_FUNC
                if sym[4] & 0xF != 2 {
                    continue;
                }
                let name = strtab + u32::from_le_bytes(sym[..4].try_into().unwrap()) as usize;
                let end = elf[name..].iter().position(|b| *b == 0).unwrap();
                names.push(String::from_utf8_lossy(&elf[name..name + end]).into_owned());
            }
        }
        names
    }

    /// The path inside this module of a symbol mangled the legacy way (`_ZN11cairn_store4hnsw
    /// 4Hnsw6search17h<hash>E` is `Hnsw::search`; a trait's method on a type of this module,
    /// `<HnswError as core::fmt::Debug>::fmt`), or `None` for a symbol of elsewhere.
    fn hnsw_path(symbol: &str) -> Option<String> {
        let mut rest = symbol.strip_prefix("_ZN")?;
        let mut parts: Vec<String> = Vec::new();
        while let Some(digits) = rest.find(|c: char| !c.is_ascii_digit()).filter(|&d| d > 0) {
            let len: usize = rest[..digits].parse().ok()?;
            parts.push(rest.get(digits..digits + len)?.to_owned());
            rest = &rest[digits + len..];
        }
        if parts
            .last()
            .is_some_and(|h| h.len() == 17 && h.starts_with('h'))
        {
            parts.pop();
        }
        let unescape = |p: &str| {
            p.replace("$LT$", "<")
                .replace("$GT$", ">")
                .replace("$u20$", " ")
                .replace("$u7b$", "{")
                .replace("$u7d$", "}")
                .replace("..", "::")
                .trim_start_matches('_')
                .to_owned()
        };
        let parts: Vec<String> = parts.iter().map(|p| unescape(p)).collect();
        if parts.len() > 2 && parts[0] == "cairn_store" && parts[1] == "hnsw" {
            return Some(parts[2..].join("::"));
        }
        let ty = parts.first()?.strip_prefix("<cairn_store::hnsw::")?;
        let mut path = format!("<{ty}");
        for p in &parts[1..] {
            path.push_str("::");
            path.push_str(p);
        }
        Some(path)
    }

    /// Nothing on a dispatched path (search, link, scan, their distances) is compiled out of
    /// line: this test binary's own symbol table names no function of this module beyond
    /// [`OUT_OF_LINE`], so a helper split out of a walk without `#[inline(always)]` fails
    /// it (checked with `beam`'s attribute taken away). What it cannot see: a closure
    /// handed to a generic adapter (`map(..).collect()`) is compiled inside the adapter's
    /// instantiation, a symbol of the standard library's; the plain-loop rule on
    /// [`SearchOp`] covers that.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    #[test]
    fn dispatched_paths_are_compiled_inline() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let all: std::collections::BTreeSet<String> = elf_function_symbols(&exe)
            .iter()
            .filter_map(|s| hnsw_path(s))
            .collect();
        // (The test harness calls this test through a pointer: it is always a symbol.)
        assert!(
            all.contains("tests::dispatched_paths_are_compiled_inline"),
            "this test's own symbol not found (symbols mangled another way?): {all:?}"
        );
        let ours: Vec<&String> = all.iter().filter(|p| !p.starts_with("tests::")).collect();
        let stray: Vec<&&String> = ours
            .iter()
            .filter(|p| !OUT_OF_LINE.contains(&p.as_str()))
            .collect();
        assert!(
            stray.is_empty(),
            "compiled out of line, so not for the dispatched vector unit: {stray:?}; on a \
             search or link path mark it #[inline(always)] (see SearchOp), else add it to \
             OUT_OF_LINE"
        );
    }
}
