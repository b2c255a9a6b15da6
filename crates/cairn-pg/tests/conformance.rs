//! The backend conformance suite on PostgreSQL + pgvector (each check in a schema of its
#![allow(clippy::expect_used)]
//! own on one throwaway server), once with the default exact-scan bound and once with
//! every filtered search walking the HNSW index first (the short-walk fallback).

mod default_bound {
    fn open() -> ((), cairn_pg::PgStore) {
        let server = cairn_pg::testing::server();
        (
            (),
            server.store("conformance", cairn_store::conformance::DIM),
        )
    }

    cairn_store::conformance_suite!(open);
}

mod index_first {
    fn open() -> ((), cairn_pg::PgStore) {
        let server = cairn_pg::testing::server();
        let mut options = server.options("conformance", cairn_store::conformance::DIM);
        options.exact_scan_max = 0;
        ((), cairn_pg::PgStore::open(options).expect("open"))
    }

    cairn_store::conformance_suite!(open);
}
