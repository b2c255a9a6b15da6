//! The backend conformance suite on the SQLite store (each check on a fresh file).
#![allow(clippy::unwrap_used)]

use cairn_store::{Store, StoreOptions};

fn open() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions::new("conformance", cairn_store::conformance::DIM);
    let store = Store::open(dir.path().join("m.db"), options).unwrap();
    (dir, store)
}

cairn_store::conformance_suite!(open);
