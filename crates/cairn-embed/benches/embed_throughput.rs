//! Sentences per second of `FastEmbedder` beside Python's onnxruntime on the same files.
//!
//! `cargo bench -p cairn-embed --bench embed_throughput` (set `CAIRN_BENCH_PYTHON` to an
//! interpreter with onnxruntime==1.32.0, tokenizers and numpy; without one, only Cairn's
//! figures are printed). Runs alternate between the two so both see the same machine load.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation
)]

use std::process::Command;
use std::time::Instant;

use cairn_core::Embedder;
use cairn_embed::FastEmbedder;

const WORDS: &[&str] = &[
    "we", "talked", "about", "the", "trip", "to", "Lisbon", "next", "spring", "and", "my",
    "sister", "said", "she", "would", "bring", "her", "dog", "because", "hotel", "allows", "pets",
    "dinner", "was", "late", "after", "meeting", "ran", "over", "new", "project", "deadline",
    "moved", "Friday", "so", "team", "will", "work", "weekend", "garden", "needs", "water",
    "tomatoes", "are", "finally", "ripe", "concert", "tickets", "sold", "out", "fast",
];

fn sentences(n: usize) -> Vec<String> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..n)
        .map(|_| {
            let len = 12 + (next() % 7) as usize; // 12..=18 words, about 15
            let words: Vec<&str> = (0..len)
                .map(|_| WORDS[(next() % WORDS.len() as u64) as usize])
                .collect();
            format!("{}.", words.join(" "))
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let reps = 5;
    let texts = sentences(1_000);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sentences.txt");
    std::fs::write(&file, texts.join("\n")).unwrap();
    let python = std::env::var("CAIRN_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/bench_onnxruntime.py"
    );

    println!("1,000 sentences of about 15 words, {threads} threads, median of {reps} runs");
    println!("| batch | Cairn FastEmbedder (sent/s) | Python onnxruntime (sent/s) | ratio |");
    println!("|---:|---:|---:|---:|");
    for batch in [32usize, 256] {
        let e = FastEmbedder::builder()
            .batch_size(batch)
            .threads(threads)
            .build()
            .unwrap();
        e.embed(&refs[..32]).unwrap(); // warm-up
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        for _ in 0..reps {
            let t = Instant::now();
            let v = e.embed(&refs).unwrap();
            ours.push(refs.len() as f64 / t.elapsed().as_secs_f64());
            assert_eq!(v.len(), refs.len());
            let out = Command::new(&python)
                .arg(script)
                .arg(&e.files().dir)
                .arg(&file)
                .arg(batch.to_string())
                .arg(threads.to_string())
                .arg("1")
                .output();
            if let Some(out) = out.ok().filter(|o| o.status.success()) {
                let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                theirs.push(json[batch.to_string()][0].as_f64().unwrap());
            }
        }
        let ours = median(ours);
        if theirs.is_empty() {
            println!("| {batch} | {ours:.0} | (python onnxruntime not available) | |");
        } else {
            let theirs = median(theirs);
            println!(
                "| {batch} | {ours:.0} | {theirs:.0} | {:.2}x |",
                ours / theirs
            );
        }
    }
}
