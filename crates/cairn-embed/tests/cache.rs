//! The embedding cache's bound and purge, with a counting stand-in model (the cache never
//! looks at what vectors mean).

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cairn_core::{EmbedError, Embedder};
use cairn_embed::{CachedEmbedder, DEFAULT_CACHE_CAPACITY};

/// Four-dimension vectors derived from the text's bytes; counts the texts it embeds.
#[derive(Default)]
struct Counting(AtomicUsize);

impl Embedder for Counting {
    fn model_id(&self) -> &str {
        "counting"
    }
    fn dim(&self) -> usize {
        4
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.0.fetch_add(texts.len(), Ordering::SeqCst);
        Ok(texts
            .iter()
            .map(|t| {
                let n = t.len() as f32;
                let s: u32 = t.bytes().map(u32::from).sum();
                vec![1.0, n, s as f32, 0.5]
            })
            .collect())
    }
}

fn calls(c: &Counting) -> usize {
    c.0.load(Ordering::SeqCst)
}

#[test]
fn the_cap_holds_under_many_distinct_queries() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("c.db");
    let model = Arc::new(Counting::default());
    let cache = CachedEmbedder::open_with_capacity(model.clone(), &db, 100).unwrap();
    assert_eq!(cache.capacity(), 100);
    // 2,000 distinct queries, one at a time and in batches of 7.
    for i in 0..1_000 {
        cache.embed(&[&format!("query {i}")]).unwrap();
        assert!(cache.len().unwrap() <= 100, "after query {i}");
    }
    let batch: Vec<String> = (0..1_000).map(|i| format!("batch {i}")).collect();
    for chunk in batch.chunks(7) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        cache.embed(&refs).unwrap();
        assert!(cache.len().unwrap() <= 100);
    }
    assert_eq!(cache.len().unwrap(), 100);
    assert_eq!(calls(&model), 2_000);
    // The bound is in the file: reopened with a smaller capacity, it is trimmed at once.
    drop(cache);
    let small = CachedEmbedder::open_with_capacity(model.clone(), &db, 10).unwrap();
    assert_eq!(small.len().unwrap(), 10);
    assert!(small.contains("batch 999").unwrap(), "the newest stay");
    assert!(!small.contains("batch 989").unwrap());
    // Capacity 0 is a typed error; the default is documented.
    assert!(matches!(
        CachedEmbedder::open_with_capacity(model.clone(), &db, 0),
        Err(EmbedError::Input(_))
    ));
    assert_eq!(
        CachedEmbedder::open(model, &db).unwrap().capacity(),
        DEFAULT_CACHE_CAPACITY
    );
}

#[test]
fn eviction_keeps_recently_used_entries() {
    let dir = tempfile::tempdir().unwrap();
    let model = Arc::new(Counting::default());
    let cache =
        CachedEmbedder::open_with_capacity(model.clone(), dir.path().join("c.db"), 20).unwrap();
    let hot = ["the hot query", "another hot one"];
    cache.embed(&hot).unwrap();
    // 500 cold queries go by; the hot ones are asked again every 5 of them.
    for i in 0..500 {
        cache.embed(&[&format!("cold {i}")]).unwrap();
        if i % 5 == 0 {
            cache.embed(&hot).unwrap();
        }
    }
    assert!(cache.contains(hot[0]).unwrap() && cache.contains(hot[1]).unwrap());
    // They reached the model once: every later ask was a hit.
    assert_eq!(calls(&model), 2 + 500);
    assert_eq!(cache.stats().hits, 2 * 100);
    // The newest cold queries are there, the oldest are gone.
    assert!(cache.contains("cold 499").unwrap());
    assert!(!cache.contains("cold 0").unwrap());
    assert_eq!(cache.len().unwrap(), 20);
    // A cold entry asked once more is embedded again.
    cache.embed(&["cold 0"]).unwrap();
    assert_eq!(calls(&model), 2 + 500 + 1);
}

#[test]
fn purge_forgets_texts() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("c.db");
    let model = Arc::new(Counting::default());
    let cache = CachedEmbedder::open_with_capacity(model.clone(), &db, 100).unwrap();
    cache.embed(&["keep me", "forget me", "me too"]).unwrap();
    assert_eq!(
        cache
            .purge(&["forget me", "me too", "never cached"])
            .unwrap(),
        2
    );
    assert!(!cache.contains("forget me").unwrap());
    assert!(cache.contains("keep me").unwrap());
    assert_eq!(cache.len().unwrap(), 1);
    // The count the bound uses follows the purge: 100 more fit without evicting "keep me".
    let more: Vec<String> = (0..99).map(|i| format!("more {i}")).collect();
    let refs: Vec<&str> = more.iter().map(String::as_str).collect();
    cache.embed(&refs).unwrap();
    assert!(cache.contains("keep me").unwrap());
    assert_eq!(cache.len().unwrap(), 100);
    // Gone after reopening too.
    drop(cache);
    let again = CachedEmbedder::open_with_capacity(model, &db, 100).unwrap();
    assert!(!again.contains("forget me").unwrap());
}

/// The stand-in under another model id (a store re-embedded from one to the other).
#[derive(Default)]
struct Renamed(Counting);

impl Embedder for Renamed {
    fn model_id(&self) -> &str {
        "renamed"
    }
    fn dim(&self) -> usize {
        self.0.dim()
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.0.embed(texts)
    }
}

/// A purge removes a text's vectors under every model, and dropping the other models leaves
/// the wrapped model's entries alone; both keep the count the bound uses.
#[test]
fn purge_and_drop_reach_every_model() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("c.db");
    let old = CachedEmbedder::open_with_capacity(Arc::new(Counting::default()), &db, 100).unwrap();
    old.embed(&["a secret", "kept", "old only"]).unwrap();
    drop(old);
    let new = CachedEmbedder::open_with_capacity(Arc::new(Renamed::default()), &db, 100).unwrap();
    new.embed(&["a secret", "kept", "new only"]).unwrap();
    assert_eq!(new.models().unwrap(), ["counting", "renamed"]);
    assert_eq!(new.len().unwrap(), 6);
    // Both models' vectors of the text go.
    assert_eq!(new.purge(&["a secret"]).unwrap(), 2);
    assert_eq!(new.len().unwrap(), 4);
    let old = CachedEmbedder::open_with_capacity(Arc::new(Counting::default()), &db, 100).unwrap();
    assert!(!old.contains("a secret").unwrap());
    assert!(old.contains("kept").unwrap() && old.contains("old only").unwrap());
    drop(old);
    // The other model's entries go, the wrapped model's stay.
    assert_eq!(new.drop_other_models().unwrap(), 2);
    assert_eq!(new.drop_other_models().unwrap(), 0);
    assert_eq!(new.models().unwrap(), ["renamed"]);
    assert!(new.contains("kept").unwrap() && new.contains("new only").unwrap());
    assert_eq!(new.len().unwrap(), 2);
    // The count follows: 98 more fit without evicting either.
    let more: Vec<String> = (0..98).map(|i| format!("more {i}")).collect();
    let refs: Vec<&str> = more.iter().map(String::as_str).collect();
    new.embed(&refs).unwrap();
    assert_eq!(new.len().unwrap(), 100);
    assert!(new.contains("kept").unwrap() && new.contains("new only").unwrap());
    // An empty cache holds no model.
    let empty = tempfile::tempdir().unwrap();
    let c = CachedEmbedder::open(Arc::new(Counting::default()), empty.path().join("e.db")).unwrap();
    assert!(c.models().unwrap().is_empty());
    assert_eq!(c.drop_other_models().unwrap(), 0);
}

/// `retain_keys` keeps the entries of the texts it is given, under every model, drops the
/// rest, and keeps the count the bound uses.
#[test]
fn retain_keeps_only_the_given_texts() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("c.db");
    let old = CachedEmbedder::open_with_capacity(Arc::new(Counting::default()), &db, 10).unwrap();
    old.embed(&["kept", "gone", "query"]).unwrap();
    drop(old);
    let new = CachedEmbedder::open_with_capacity(Arc::new(Renamed::default()), &db, 10).unwrap();
    new.embed(&["kept", "gone", "also kept"]).unwrap();
    assert_eq!(new.len().unwrap(), 6);
    let keep: std::collections::HashSet<[u8; 32]> = ["kept", "also kept", "never cached"]
        .into_iter()
        .map(cairn_embed::text_key)
        .collect();
    assert_eq!(new.retain_keys(&keep).unwrap(), 3);
    assert_eq!(new.len().unwrap(), 3);
    assert!(new.contains("kept").unwrap() && new.contains("also kept").unwrap());
    assert!(!new.contains("gone").unwrap());
    let old = CachedEmbedder::open_with_capacity(Arc::new(Counting::default()), &db, 10).unwrap();
    assert!(old.contains("kept").unwrap());
    assert!(!old.contains("gone").unwrap() && !old.contains("query").unwrap());
    drop(old);
    // Nothing else to drop: a second pass removes nothing.
    assert_eq!(new.retain_keys(&keep).unwrap(), 0);
    // The count follows: seven more fit without evicting the kept ones.
    let more: Vec<String> = (0..7).map(|i| format!("more {i}")).collect();
    let refs: Vec<&str> = more.iter().map(String::as_str).collect();
    new.embed(&refs).unwrap();
    assert_eq!(new.len().unwrap(), 10);
    assert!(new.contains("kept").unwrap() && new.contains("also kept").unwrap());
}
