use std::sync::Arc;

use cairn_core::{Clock, SystemClock};

use crate::{Result, StoreError};

/// HNSW graph parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HnswParams {
    /// Links per node (M). Default 16; 2..=128.
    pub m: usize,
    /// Candidate list size while building. Default 200; at least `m`, at most 4096.
    pub ef_construction: usize,
    /// Default candidate list size while searching (raised to k when smaller). Default 64;
    /// 1..=4096.
    pub ef_search: usize,
    /// Layers. Default 16; 1..=16.
    pub max_layer: usize,
}

impl Default for HnswParams {
    fn default() -> Self {
        Self {
            m: 16,
            ef_construction: 200,
            ef_search: 64,
            max_layer: 16,
        }
    }
}

impl HnswParams {
    /// Checks every parameter (hnsw_rs exits the process above 256 links, so this runs first).
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(StoreError::Config(what));
        if !(2..=128).contains(&self.m) {
            return bad(format!("HNSW m = {} (expected 2..=128)", self.m));
        }
        if self.ef_construction < self.m || self.ef_construction > 4096 {
            return bad(format!(
                "HNSW ef_construction = {} (expected m..=4096)",
                self.ef_construction
            ));
        }
        if !(1..=4096).contains(&self.ef_search) {
            return bad(format!(
                "HNSW ef_search = {} (expected 1..=4096)",
                self.ef_search
            ));
        }
        if !(1..=16).contains(&self.max_layer) {
            return bad(format!(
                "HNSW max_layer = {} (expected 1..=16)",
                self.max_layer
            ));
        }
        Ok(())
    }
}

/// What deleting a memory that summaries cite does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeletePolicy {
    /// Refuse while any summary cites the memory (the default).
    #[default]
    Restrict,
    /// Delete the summaries built on it too, recursively.
    Cascade,
    /// Drop the links and mark the citing summaries stale.
    Detach,
}

impl std::str::FromStr for DeletePolicy {
    type Err = cairn_core::InputError;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "restrict" => Ok(Self::Restrict),
            "cascade" => Ok(Self::Cascade),
            "detach" => Ok(Self::Detach),
            other => Err(cairn_core::InputError::UnknownName {
                what: "DeletePolicy",
                value: other.chars().take(64).collect(),
            }),
        }
    }
}

/// How to open a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Embedding model id recorded in the database.
    pub model_id: String,
    /// Embedding dimension.
    pub dim: usize,
    /// HNSW parameters.
    pub hnsw: HnswParams,
    /// Read-only connections kept for reads. Default 4.
    pub read_pool: usize,
    /// Pending writes the writer queue holds before callers wait. Default 256.
    pub queue_depth: usize,
    /// Rebuild the index when deleted entries exceed this share of it. Default 0.2.
    pub tombstone_ratio: f64,
    /// ... and at least this many. Default 1,000.
    pub tombstone_min: usize,
    /// Snapshot the index after this many new index entries, or a tenth of the index when
    /// that is more (a snapshot rewrites the whole graph). Default 20,000; 0 = only on close
    /// and on request.
    pub snapshot_every: usize,
    /// Searches whose filter admits at most this many memories (unfiltered ones: stores of
    /// at most this many) scan them exactly instead of walking the graph. Default 1,000.
    pub exact_scan_max: usize,
    /// ...and so do those admitting at most `exact_scan_factor × √(live memories)`. Default
    /// 24: measured, an exact scan costs about 0.19 µs per admitted memory and a filtered
    /// graph walk about 0.08-0.14 ms × (live / admitted), which cross there
    /// (docs/benchmarks.md).
    pub exact_scan_factor: f64,
    /// `PRAGMA synchronous=FULL` (survives power loss) instead of NORMAL (survives process
    /// crashes). Default false.
    pub synchronous_full: bool,
    /// Entries the index log keeps (the log through which a process catches its index up
    /// with other processes' writes on the same file; pruned to this length once it holds
    /// twice as many). A process that falls further behind re-reads every row's index
    /// attributes once instead. Default 100,000.
    pub index_log_keep: usize,
    /// Rebuild the index (when tombstones pass their threshold) on a thread of its own and
    /// swap it in when done, so that writes go on meanwhile; false rebuilds inside the
    /// write that crossed the threshold. Default true.
    pub background_rebuild: bool,
    /// Bytes of the database file each read connection maps into memory (`PRAGMA
    /// mmap_size`): reads of mapped pages skip a system call and a copy each, a third of
    /// the time of a keyword search on a long thread. Mapped pages the process touches count
    /// in its resident memory, and an I/O error on a mapped page ends the process with a
    /// signal instead of an error (SQLite's own caveat), so 0 turns it off. Default 1 GiB.
    pub mmap_bytes: u64,
    /// Count the SQL work of this handle's connections (SQLite's virtual-machine
    /// instructions, in thousands, through a progress callback every 1,000 of them), read by
    /// [`crate::Store::sql_work`]: what a call costs the database, independent of the
    /// machine's speed and load. Default false (the callback costs a little).
    pub count_sql_work: bool,
    /// The clock for default `created_at` values.
    pub clock: Arc<dyn Clock>,
}

impl StoreOptions {
    /// Options for a model with the documented defaults for everything else.
    pub fn new(model_id: impl Into<String>, dim: usize) -> Self {
        Self {
            model_id: model_id.into(),
            dim,
            hnsw: HnswParams::default(),
            read_pool: 4,
            queue_depth: 256,
            tombstone_ratio: 0.2,
            tombstone_min: 1_000,
            snapshot_every: 20_000,
            exact_scan_max: 1_000,
            exact_scan_factor: 24.0,
            synchronous_full: false,
            index_log_keep: 100_000,
            background_rebuild: true,
            mmap_bytes: 1 << 30,
            count_sql_work: false,
            clock: Arc::new(SystemClock),
        }
    }

    /// Sets the HNSW parameters.
    pub fn hnsw(mut self, params: HnswParams) -> Self {
        self.hnsw = params;
        self
    }

    /// Sets the clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Checks every option.
    pub fn validate(&self) -> Result<()> {
        self.hnsw.validate()?;
        if self.dim == 0 || self.dim > 65_536 {
            return Err(StoreError::Config(format!(
                "dim = {} (expected 1..=65536)",
                self.dim
            )));
        }
        if self.model_id.trim().is_empty() {
            return Err(StoreError::Config("model_id is empty".into()));
        }
        if self.read_pool == 0 || self.queue_depth == 0 || self.index_log_keep == 0 {
            return Err(StoreError::Config(
                "read_pool, queue_depth and index_log_keep must be at least 1".into(),
            ));
        }
        if i64::try_from(self.index_log_keep).is_err() {
            return Err(StoreError::Config(format!(
                "index_log_keep = {} is too large",
                self.index_log_keep
            )));
        }
        if !(self.tombstone_ratio > 0.0 && self.tombstone_ratio <= 1.0) {
            return Err(StoreError::Config(format!(
                "tombstone_ratio = {} (expected (0, 1])",
                self.tombstone_ratio
            )));
        }
        Ok(())
    }
}
