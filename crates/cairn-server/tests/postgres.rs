//! The server on PostgreSQL: the REST contract's core (adds, summaries, search, context,
//! consolidation, trees) with namespaces as schemas of one database, none reaching another.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use cairn_server::Limits;
use serde_json::{json, Value};

#[test]
fn the_server_runs_on_postgres_with_namespaces_as_schemas() {
    let pg = cairn_pg::testing::server();
    let url = format!(
        "postgres://cairn@127.0.0.1:{}/postgres?schema=srv{}",
        pg.port,
        std::process::id()
    );
    let s = common::start_on(Some(url.into()), Limits::default());
    let (a, b) = (Some(s.key_a.as_str()), Some(s.key_b.as_str()));

    let turns: Vec<Value> = (0..25)
        .map(|i| {
            json!({"thread": "long", "content": format!("alpha turn {i} about topic {}", i % 5),
                   "created_at": format!("2024-01-01T10:{i:02}:00Z")})
        })
        .collect();
    let (st, added) = s.call(
        "POST",
        "/v1/memories",
        a,
        Some(&Value::Array(turns).to_string()),
    );
    assert_eq!(st, 201, "{added}");
    let alpha: Vec<String> = added["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(alpha.len(), 25);
    let (st, _) = s.call(
        "POST",
        "/v1/memories",
        b,
        Some(r#"{"thread":"long","content":"beta turn"}"#),
    );
    assert_eq!(st, 201);

    // Consolidation over REST, then the tree covers what it reported.
    let (st, r) = s.call(
        "POST",
        "/v1/consolidate",
        a,
        Some(r#"{"older_than":"1h","thread":"long"}"#),
    );
    assert_eq!(st, 200, "{r}");
    assert!(r["summaries_per_level"]["1"].as_u64().unwrap() >= 1, "{r}");
    let (_, tree) = s.call("GET", "/v1/threads/long/tree?depth=1", a, None);
    let covered: usize = tree["trees"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["children"].as_array().unwrap().len())
        .sum();
    assert_eq!(covered as u64, r["memories_covered"].as_u64().unwrap());

    // Search and context: alpha sees its turns, beta only its own.
    let q = json!({"query": "alpha turn 7 topic 2", "mode": "hybrid", "k": 5});
    let (_, hits) = s.call("POST", "/v1/search", a, Some(&q.to_string()));
    assert!(!hits["hits"].as_array().unwrap().is_empty(), "{hits}");
    for mode in ["hybrid", "vector", "keyword"] {
        let q = json!({"query": "alpha turn topic", "mode": mode, "k": 50});
        let (_, hits) = s.call("POST", "/v1/search", b, Some(&q.to_string()));
        for h in hits["hits"].as_array().unwrap() {
            assert_eq!(h["content"], "beta turn", "{mode}: {h}");
        }
    }
    let (_, ctx) = s.call(
        "POST",
        "/v1/context",
        b,
        Some(r#"{"thread":"long","query":"what about topic 2","budget":4000}"#),
    );
    let texts: Vec<&str> = ctx["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["content"].as_str().unwrap())
        .collect();
    assert_eq!(texts, vec!["beta turn"]);
    for id in &alpha {
        assert_eq!(s.call("GET", &format!("/v1/memories/{id}"), b, None).0, 404);
        assert_eq!(s.call("GET", &format!("/v1/memories/{id}"), a, None).0, 200);
    }
}
