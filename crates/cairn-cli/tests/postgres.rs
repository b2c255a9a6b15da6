//! The `cairn` binary on PostgreSQL (`--db postgres://...`, real model): import, consolidate,
//! search, context, stats, backup, and namespaces as separate schemas.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn cairn(db: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--db")
        .arg(db)
        .args(args)
        .output()
        .unwrap()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_str(ok(o).trim()).unwrap()
}

#[test]
fn the_cli_runs_on_postgres() {
    let server = cairn_pg::testing::server();
    let db = format!(
        "postgres://cairn@127.0.0.1:{}/postgres?schema=cli{}",
        server.port,
        std::process::id()
    );
    let dir = tempfile::tempdir().unwrap();
    // 50 old turns about two topics, then consolidation.
    let lines: Vec<String> = (0..50)
        .map(|i| {
            let (speaker, text) = if i % 2 == 0 {
                (
                    "Maya",
                    format!("Day {i}: I practised the cello for an hour."),
                )
            } else {
                (
                    "Leo",
                    format!("Day {i}: the bakery sold out of rye bread again."),
                )
            };
            serde_json::json!({
                "thread": "chat",
                "role": if i % 2 == 0 { "user" } else { "assistant" },
                "speaker": speaker,
                "content": text,
                "created_at": format!("2024-01-{:02}T10:{:02}:00Z", 1 + i / 10, i % 60),
            })
            .to_string()
        })
        .collect();
    let file = dir.path().join("chat.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();
    ok(&cairn(&db, &["import", file.to_str().unwrap()]));
    let report = json(&cairn(
        &db,
        &["consolidate", "--older-than", "1d", "--json"],
    ));
    assert!(
        report["memories_covered"].as_u64().unwrap() >= 40,
        "{report}"
    );

    let stats = json(&cairn(&db, &["stats", "--json"]));
    assert_eq!(stats["store"]["by_kind"]["conversational"], 50);
    assert!(stats["store"]["by_kind"]["summary"].as_u64().unwrap() >= 2);

    // Meaning, not words: the real model finds the cello turns.
    let hits = json(&cairn(
        &db,
        &[
            "search",
            "playing a string instrument",
            "--mode",
            "vector",
            "-k",
            "3",
            "--json",
        ],
    ));
    for h in hits.as_array().unwrap() {
        let text = h["memory"]["content"].as_str().unwrap();
        assert!(
            text.contains("cello") || h["memory"]["kind"] == "summary",
            "{text}"
        );
    }
    let ctx = ok(&cairn(
        &db,
        &[
            "context",
            "--thread",
            "chat",
            "--query",
            "What did Leo say about bread?",
        ],
    ));
    assert!(ctx.contains("rye bread"), "{ctx}");

    // A backup from PostgreSQL restores into a SQLite file with the same counts.
    let backup = dir.path().join("b.jsonl");
    std::fs::write(&backup, ok(&cairn(&db, &["export", "--with-embeddings"]))).unwrap();
    let lite = dir.path().join("copy.db");
    ok(&cairn(
        lite.to_str().unwrap(),
        &["import", backup.to_str().unwrap()],
    ));
    let copied = json(&cairn(lite.to_str().unwrap(), &["stats", "--json"]));
    assert_eq!(copied["store"]["total"], stats["store"]["total"]);

    // Namespaces are schemas: nothing crosses between them, and `a-b` is not `a_b`.
    let id = ok(&cairn(&db, &["--namespace", "a-b", "add", "only in a-b"]));
    let other = json(&cairn(
        &db,
        &["--namespace", "a_b", "search", "only in a-b", "--json"],
    ));
    assert_eq!(other.as_array().unwrap().len(), 0, "{other}");
    let same = json(&cairn(
        &db,
        &["--namespace", "a-b", "get", id.trim(), "--json"],
    ));
    assert_eq!(same["content"], "only in a-b");
    assert!(!cairn(&db, &["get", id.trim(), "--json"]).status.success());
}
