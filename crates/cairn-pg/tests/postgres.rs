//! PostgreSQL-specific behaviour: filtered HNSW walks that come back short, several
//! processes on one database, schemas as separate stores, model identity.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use cairn_core::{MemoryKind, NewMemory};
use cairn_pg::{PgOptions, PgStore};
use cairn_store::conformance::{vector, DIM};
use cairn_store::{Filter, MemoryBackend, MetaFilter, StoreError};
use serde_json::json;

fn options() -> PgOptions {
    cairn_pg::testing::server().options("pg-tests", DIM)
}

/// A metadata filter the planner cannot see through sends the query down the HNSW index,
/// whose walk (ef_search candidates, filtered afterwards) finds few of the 1% admitted:
/// the search notices the short answer and scores the admitted rows exactly.
#[test]
fn short_index_walks_fall_back_to_an_exact_scan() {
    let mut o = options();
    o.exact_scan_max = 0;
    let store = PgStore::open(o).unwrap();
    let mut rare = Vec::new();
    for chunk in 0..8u64 {
        let items: Vec<(NewMemory, Vec<f32>)> = (0..1_000u64)
            .map(|j| {
                let i = chunk * 1_000 + j;
                let mut meta = cairn_core::Metadata::new();
                meta.insert(
                    "tag".into(),
                    json!(if i % 100 == 3 { "rare" } else { "common" }),
                );
                (
                    NewMemory::new(MemoryKind::Knowledge, format!("fact {i}")).with_metadata(meta),
                    vector(i),
                )
            })
            .collect();
        let stored = store.insert_batch(items).unwrap();
        rare.extend(
            stored
                .iter()
                .filter(|m| m.metadata["tag"] == json!("rare"))
                .map(|m| m.id),
        );
    }
    assert_eq!(rare.len(), 80);
    let f = Filter::all().meta(MetaFilter::eq("tag", "rare"));
    for probe in 0..5 {
        let hits = store
            .search_vector(vector(1_000_000 + probe), 10, &f)
            .unwrap();
        assert_eq!(hits.len(), 10);
        assert!(hits.iter().all(|h| rare.contains(&h.memory.id)));
    }
    store.drop_schema().unwrap();
}

/// Two stores in two schemas of one database are separate; reopening a schema with another
/// model is refused.
#[test]
fn schemas_are_separate_stores_bound_to_one_model() {
    let a = options();
    let b = options();
    let sa = PgStore::open(a.clone()).unwrap();
    let sb = PgStore::open(b).unwrap();
    sa.insert(
        NewMemory::new(MemoryKind::Knowledge, "only in a"),
        vector(1),
    )
    .unwrap();
    assert_eq!(sa.recent(&Filter::all(), 10).unwrap().len(), 1);
    assert!(sb.recent(&Filter::all(), 10).unwrap().is_empty());
    let mut other = a.clone();
    other.model_id = "another-model".into();
    assert!(matches!(
        PgStore::open(other),
        Err(StoreError::ModelMismatch { .. })
    ));
    let mut bad = a;
    bad.schema = "Robert'); DROP TABLE x;--".into();
    assert!(matches!(PgStore::open(bad), Err(StoreError::Config(_))));
    // Reopening finds what was written.
    let again = PgStore::open(sa.options().clone()).unwrap();
    assert_eq!(again.recent(&Filter::all(), 10).unwrap().len(), 1);
}
