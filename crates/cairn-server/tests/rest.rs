//! REST end to end on 127.0.0.1 with a real HTTP client: the contract, the errors, and
//! namespaces that keys cannot cross.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

mod common;

use cairn_server::Limits;
use common::start;
use serde_json::{json, Value};

fn ids(v: &Value, field: &str) -> Vec<String> {
    v[field]
        .as_array()
        .unwrap_or_else(|| panic!("no {field} in {v}"))
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn rest_contract_and_every_error_status() {
    let limits = Limits {
        max_body_bytes: 64 * 1024,
        max_batch: 10,
        ..Limits::default()
    };
    let s = start(limits);
    let a = Some(s.key_a.as_str());

    // Adds: one (201 + id), a batch (201 + ids in order).
    let (st, one) = s.call(
        "POST",
        "/v1/memories",
        a,
        Some(r#"{"kind":"conversational","thread":"t1","role":"user","speaker":"Ana","content":"Ana adopted a grey cat named Pixel","created_at":"2024-03-01T10:00:00Z","metadata":{"source":"test"}}"#),
    );
    assert_eq!(st, 201, "{one}");
    let first = one["id"].as_str().unwrap().to_owned();
    let (st, many) = s.call(
        "POST",
        "/v1/memories",
        a,
        Some(r#"[{"thread":"t1","role":"assistant","content":"Ben trains for the Lisbon marathon","created_at":"2024-03-01T10:01:00Z"},{"thread":"t1","content":"Ana asked which shoes Ben runs in","created_at":"2024-03-01T10:02:00Z"}]"#),
    );
    assert_eq!(st, 201, "{many}");
    let batch: Vec<String> = many["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(batch.len(), 2);

    let (st, m) = s.call("GET", &format!("/v1/memories/{first}"), a, None);
    assert_eq!(st, 200);
    assert_eq!(m["content"], "Ana adopted a grey cat named Pixel");
    assert_eq!(m["speaker"], "Ana");
    assert_eq!(m["metadata"]["source"], "test");
    assert_eq!(m["kind"], "conversational");

    let (st, list) = s.call("GET", "/v1/memories?thread=t1&limit=10", a, None);
    assert_eq!(st, 200);
    let mut all = vec![first.clone()];
    all.extend(batch.clone());
    assert_eq!(ids(&list, "memories"), all, "oldest first");

    // Search and context, with the fields of the contract.
    let (st, hits) = s.call(
        "POST",
        "/v1/search",
        a,
        Some(
            r#"{"query":"marathon","k":2,"mode":"keyword","thread":"t1","kind":"conversational"}"#,
        ),
    );
    assert_eq!(st, 200, "{hits}");
    let h = &hits["hits"][0];
    assert_eq!(h["id"], batch[0].as_str());
    assert!(h["content"].is_string() && h["score"].is_number());

    let (st, ctx) = s.call(
        "POST",
        "/v1/context",
        a,
        Some(r#"{"thread":"t1","query":"What is the cat called?","budget":500}"#),
    );
    assert_eq!(st, 200, "{ctx}");
    let items = ctx["items"].as_array().unwrap();
    assert_eq!(items.len(), 3);
    for i in items {
        assert!(i["content"].is_string() && i["section"].is_string());
        assert!(i["id"].is_string() && i["kind"].is_string());
    }
    assert!(ctx["tokens"].as_u64().unwrap() <= 500);
    assert!(ctx["text"].as_str().unwrap().contains("Pixel"));

    // A summary over the three, its sources in order, leaves, back-links, trees, threads.
    let body =
        json!({"content": "Ana has a cat, Pixel; Ben runs.", "source_ids": all, "thread": "t1"});
    let (st, sum) = s.call("POST", "/v1/summaries", a, Some(&body.to_string()));
    assert_eq!(st, 201, "{sum}");
    assert_eq!(sum["memory"]["level"], 1);
    let sid = sum["memory"]["id"].as_str().unwrap().to_owned();
    let (st, src) = s.call("GET", &format!("/v1/summaries/{sid}/sources"), a, None);
    assert_eq!(st, 200);
    assert_eq!(ids(&src, "memories"), all);
    let (_, leaves) = s.call(
        "GET",
        &format!("/v1/summaries/{sid}/sources?leaves=true"),
        a,
        None,
    );
    assert_eq!(ids(&leaves, "memories"), all);
    let (_, back) = s.call("GET", &format!("/v1/memories/{first}/summaries"), a, None);
    assert_eq!(ids(&back, "memories"), vec![sid.clone()]);
    let (st, tree) = s.call("GET", "/v1/threads/t1/tree", a, None);
    assert_eq!(st, 200);
    assert_eq!(tree["trees"][0]["memory"]["id"], sid.as_str());
    assert_eq!(tree["trees"][0]["children"].as_array().unwrap().len(), 3);
    let (_, shallow) = s.call("GET", &format!("/v1/summaries/{sid}/tree?depth=0"), a, None);
    assert_eq!(shallow["trees"][0]["truncated"], true);
    let (_, threads) = s.call("GET", "/v1/threads", a, None);
    assert_eq!(threads["threads"][0]["id"], "t1");
    assert_eq!(threads["threads"][0]["memories"], 3);
    assert_eq!(threads["threads"][0]["summaries"], 1);

    // 401: no key, a wrong key, a malformed header.
    assert_eq!(s.call("GET", "/v1/threads", None, None).0, 401);
    assert_eq!(
        s.call("GET", "/v1/threads", Some("cairn_0000"), None).0,
        401
    );
    let (st, e) = s.call("POST", "/v1/search", Some(""), Some(r#"{"query":"x"}"#));
    assert_eq!(st, 401, "{e}");
    assert_eq!(e["error"]["code"], "unauthorized");

    // 400: not JSON.
    let (st, e) = s.call("POST", "/v1/search", a, Some(r#"{"query":"#));
    assert_eq!(st, 400, "{e}");
    // 422: the field at fault is named.
    let (st, e) = s.call("POST", "/v1/search", a, Some(r#"{"query":"x","k":"ten"}"#));
    assert_eq!((st, e["error"]["field"].as_str()), (422, Some("k")), "{e}");
    let (st, e) = s.call("POST", "/v1/search", a, Some(r#"{"query":"x","kk":1}"#));
    assert_eq!(st, 422, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("kk"));
    let (st, e) = s.call("POST", "/v1/search", a, Some(r#"{"query":"x","k":1000}"#));
    assert_eq!((st, e["error"]["field"].as_str()), (422, Some("k")), "{e}");
    let (st, e) = s.call(
        "POST",
        "/v1/context",
        a,
        Some(r#"{"thread":"t1","query":"x","budget":0}"#),
    );
    assert_eq!(
        (st, e["error"]["field"].as_str()),
        (422, Some("budget")),
        "{e}"
    );
    let (st, e) = s.call("POST", "/v1/search", a, Some(r#"{"query":"   "}"#));
    assert_eq!(
        (st, e["error"]["field"].as_str()),
        (422, Some("query")),
        "{e}"
    );
    let (st, e) = s.call(
        "POST",
        "/v1/memories",
        a,
        Some(r#"{"content":"x","created_at":"yesterday"}"#),
    );
    assert_eq!(
        (st, e["error"]["field"].as_str()),
        (422, Some("created_at")),
        "{e}"
    );
    let (st, e) = s.call("POST", "/v1/memories", a, Some(r#"{"content":"  "}"#));
    assert_eq!(
        (st, e["error"]["field"].as_str()),
        (422, Some("content")),
        "{e}"
    );

    // A batch with one bad memory writes none of it.
    let (st, e) = s.call(
        "POST",
        "/v1/memories",
        a,
        Some(r#"[{"thread":"t1","content":"fine"},{"thread":"t1","content":"x","kind":"nope"}]"#),
    );
    assert_eq!(
        (st, e["error"]["field"].as_str()),
        (422, Some("[1].kind")),
        "{e}"
    );
    let (_, list) = s.call("GET", "/v1/memories?thread=t1&kind=conversational", a, None);
    assert_eq!(
        list["memories"].as_array().unwrap().len(),
        3,
        "nothing half-written"
    );

    // 404 for an unknown id, 422 for a malformed one.
    let unknown = "01900000-0000-7000-8000-000000000000";
    let (st, e) = s.call("GET", &format!("/v1/memories/{unknown}"), a, None);
    assert_eq!((st, e["error"]["code"].as_str()), (404, Some("not_found")));
    assert_eq!(
        s.call("GET", &format!("/v1/summaries/{unknown}/sources"), a, None)
            .0,
        404
    );
    assert_eq!(s.call("GET", "/v1/memories/not-an-id", a, None).0, 422);

    // 413: over the body limit, over the batch limit.
    let big = json!({"content": "word ".repeat(20_000)}).to_string();
    let (st, e) = s.call("POST", "/v1/memories", a, Some(&big));
    assert_eq!(st, 413, "{e}");
    let eleven: Vec<Value> = (0..11)
        .map(|i| json!({"content": format!("m{i}")}))
        .collect();
    let (st, e) = s.call(
        "POST",
        "/v1/memories",
        a,
        Some(&Value::Array(eleven).to_string()),
    );
    assert_eq!(st, 413, "{e}");

    // Deletes: refused while cited (409), then cascade.
    let (st, e) = s.call("DELETE", &format!("/v1/memories/{first}"), a, None);
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (409, Some("conflict")),
        "{e}"
    );
    let (st, d) = s.call(
        "DELETE",
        &format!("/v1/memories/{first}?policy=cascade"),
        a,
        None,
    );
    assert_eq!(st, 200, "{d}");
    assert_eq!(
        d["deleted"].as_array().unwrap().len(),
        2,
        "the memory and its summary"
    );
    assert_eq!(
        s.call("GET", &format!("/v1/memories/{sid}"), a, None).0,
        404
    );
    let (st, e) = s.call(
        "DELETE",
        &format!("/v1/memories/{}?policy=sometimes", batch[0]),
        a,
        None,
    );
    assert_eq!((st, e["error"]["field"].as_str()), (422, Some("policy")));
}

#[test]
fn keys_never_reach_across_namespaces() {
    let s = start(Limits::default());
    let (a, b) = (Some(s.key_a.as_str()), Some(s.key_b.as_str()));
    let (_, added) = s.call(
        "POST",
        "/v1/memories",
        a,
        Some(r#"[{"thread":"shared-name","content":"alpha secret: the vault code is 4711"},{"thread":"shared-name","content":"alpha second turn"}]"#),
    );
    let alpha: Vec<String> = added["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let body = json!({"content": "alpha summary", "source_ids": alpha, "thread": "shared-name"});
    let (st, sum) = s.call("POST", "/v1/summaries", a, Some(&body.to_string()));
    assert_eq!(st, 201);
    let sid = sum["memory"]["id"].as_str().unwrap().to_owned();
    // Beta has its own thread of the same name.
    let (st, _) = s.call(
        "POST",
        "/v1/memories",
        b,
        Some(r#"{"thread":"shared-name","content":"beta turn"}"#),
    );
    assert_eq!(st, 201);

    // Guessed ids: every path answers 404 and changes nothing.
    for id in alpha.iter().chain([&sid]) {
        assert_eq!(s.call("GET", &format!("/v1/memories/{id}"), b, None).0, 404);
        assert_eq!(
            s.call("GET", &format!("/v1/memories/{id}/summaries"), b, None)
                .0,
            404
        );
        assert_eq!(
            s.call(
                "DELETE",
                &format!("/v1/memories/{id}?policy=cascade"),
                b,
                None
            )
            .0,
            404
        );
    }
    assert_eq!(
        s.call("GET", &format!("/v1/summaries/{sid}/sources"), b, None)
            .0,
        404
    );
    assert_eq!(
        s.call("GET", &format!("/v1/summaries/{sid}/tree"), b, None)
            .0,
        404
    );
    let cite =
        json!({"content": "beta citing alpha", "source_ids": [alpha[0]], "thread": "shared-name"});
    let (st, e) = s.call("POST", "/v1/summaries", b, Some(&cite.to_string()));
    assert_eq!(st, 404, "a summary cannot cite another namespace: {e}");

    // Search, context, threads and trees of beta see beta only.
    for mode in ["hybrid", "vector", "keyword"] {
        let q = json!({"query": "alpha secret vault code 4711", "mode": mode, "k": 50});
        let (_, hits) = s.call("POST", "/v1/search", b, Some(&q.to_string()));
        for h in hits["hits"].as_array().unwrap() {
            assert!(
                !h["content"].as_str().unwrap().contains("alpha"),
                "{mode}: {h}"
            );
        }
    }
    let (_, ctx) = s.call(
        "POST",
        "/v1/context",
        b,
        Some(r#"{"thread":"shared-name","query":"what is the vault code","budget":4000}"#),
    );
    let texts: Vec<&str> = ctx["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["content"].as_str().unwrap())
        .collect();
    assert_eq!(texts, vec!["beta turn"]);
    let (_, tree) = s.call("GET", "/v1/threads/shared-name/tree", b, None);
    assert!(tree["trees"].as_array().unwrap().is_empty());
    let (_, threads) = s.call("GET", "/v1/threads", b, None);
    assert_eq!(threads["threads"][0]["memories"], 1);

    // Alpha still has everything.
    for id in &alpha {
        assert_eq!(s.call("GET", &format!("/v1/memories/{id}"), a, None).0, 200);
    }
    let (_, src) = s.call("GET", &format!("/v1/summaries/{sid}/sources"), a, None);
    assert_eq!(src["memories"].as_array().unwrap().len(), 2);
}

#[test]
fn openapi_health_and_metrics_are_served_without_a_key() {
    let s = start(Limits::default());
    let (st, h) = s.call("GET", "/healthz", None, None);
    assert_eq!(st, 200, "{h}");
    let (st, doc) = s.call("GET", "/openapi.json", None, None);
    assert_eq!(st, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    for p in [
        "/v1/memories",
        "/v1/memories/{id}",
        "/v1/summaries",
        "/v1/summaries/{id}/sources",
        "/v1/search",
        "/v1/context",
        "/v1/threads",
        "/v1/threads/{id}/tree",
        "/v1/consolidate",
    ] {
        assert!(doc["paths"][p].is_object(), "{p} missing from the document");
    }
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    assert!(doc["components"]["schemas"]["ContextOut"].is_object());
    assert_eq!(
        doc,
        serde_json::to_value(cairn_server::rest::openapi()).unwrap(),
        "the served document is the generated one"
    );
    s.call(
        "POST",
        "/v1/search",
        Some(&s.key_a),
        Some(r#"{"query":"anything"}"#),
    );
    s.call("POST", "/v1/search", None, Some(r#"{"query":"anything"}"#));
    // MCP over HTTP sits behind the same keys.
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    assert_eq!(s.call("POST", "/mcp", None, Some(init)).0, 401);
    assert_eq!(
        s.call("POST", "/mcp", Some("cairn_wrong"), Some(init)).0,
        401
    );
    let (st, m) = s.call("GET", "/metrics", None, None);
    assert_eq!(st, 200);
    let m = m.as_str().unwrap().to_owned();
    assert!(
        m.contains(r#"cairn_http_requests_total{route="/v1/search",method="POST",status="200"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"cairn_http_requests_total{route="/v1/search",method="POST",status="401"} 1"#),
        "{m}"
    );
    assert!(m.contains("cairn_http_request_duration_seconds_bucket"));
    assert!(m.contains("cairn_memories{namespace=\"default\"} 0"), "{m}");
}

#[test]
fn consolidation_over_rest_writes_summaries_the_tree_shows() {
    let s = start(Limits::default());
    let a = Some(s.key_a.as_str());
    let turns: Vec<Value> = (0..25)
        .map(|i| {
            json!({"thread": "long", "content": format!("turn {i} about topic {}", i % 5),
                   "created_at": format!("2024-01-01T10:{i:02}:00Z")})
        })
        .collect();
    assert_eq!(
        s.call(
            "POST",
            "/v1/memories",
            a,
            Some(&Value::Array(turns).to_string())
        )
        .0,
        201
    );
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
    assert_eq!(covered, r["memories_covered"].as_u64().unwrap() as usize);
    let (st, e) = s.call(
        "POST",
        "/v1/consolidate",
        a,
        Some(r#"{"older_than":"soon"}"#),
    );
    assert_eq!(
        (st, e["error"]["field"].as_str()),
        (422, Some("older_than"))
    );
}

/// The everyday endpoints: keyed adds and `/v1/upsert`, `PATCH` of metadata, metadata
/// conditions in search, listing and context scope, cursor paging, and `/v1/forget`, which
/// never reaches another namespace; bad input is a 422 naming the field.
#[test]
fn keys_patches_filters_paging_and_forget() {
    let s = start(Limits::default());
    let (a, b) = (Some(s.key_a.as_str()), Some(s.key_b.as_str()));
    let add = |key: Option<&str>, body: &str| s.call("POST", "/v1/memories", key, Some(body));
    let (st, one) = add(
        a,
        r#"{"thread":"t","content":"Ana lives in Lisbon","key":"ana/home","metadata":{"user_id":"ana"}}"#,
    );
    assert_eq!(st, 201, "{one}");
    let id = one["id"].as_str().unwrap().to_owned();
    // A retry is the same memory; other content under the key is a conflict.
    let (st, again) = add(
        a,
        r#"{"thread":"t","content":"Ana lives in Lisbon","key":"ana/home","metadata":{"user_id":"ana"}}"#,
    );
    assert_eq!((st, again["id"].as_str().unwrap()), (201, id.as_str()));
    let (st, _) = add(
        a,
        r#"{"thread":"t","content":"Ana lives in Porto","key":"ana/home"}"#,
    );
    assert_eq!(st, 409);
    let (st, up) = s.call("POST", "/v1/upsert", a, Some(r#"{"thread":"t","content":"Ana lives in Porto","key":"ana/home","metadata":{"user_id":"ana"}}"#));
    assert_eq!(st, 200, "{up}");
    assert_eq!(up["outcome"], "content_updated");
    assert_eq!(up["memory"]["id"], id.as_str());
    let (st, _) = s.call("POST", "/v1/upsert", a, Some(r#"{"content":"no key"}"#));
    assert_eq!(st, 422);
    // The same key in another namespace is another memory.
    let (st, other) = add(
        b,
        r#"{"thread":"t","content":"Ana lives in Lisbon","key":"ana/home","metadata":{"user_id":"ana"}}"#,
    );
    assert_eq!(st, 201);
    assert_eq!(
        other["id"].as_str().unwrap(),
        id.as_str(),
        "ids come from the key"
    );

    let (st, m) = s.call(
        "PATCH",
        &format!("/v1/memories/{id}"),
        a,
        Some(r#"{"metadata":{"verified":true,"user_id":null}}"#),
    );
    assert_eq!(st, 200, "{m}");
    assert_eq!(m["metadata"], json!({"verified": true}));
    let (st, e) = s.call(
        "PATCH",
        &format!("/v1/memories/{id}"),
        a,
        Some(r#"{"metadata":[1]}"#),
    );
    assert_eq!(st, 422, "{e}");
    let (st, _) = s.call(
        "PATCH",
        "/v1/memories/01a227ce-dfe3-728a-a928-cb93de8d7ae9",
        a,
        Some(r#"{"metadata":{}}"#),
    );
    assert_eq!(st, 404);

    for i in 0..5 {
        let (st, _) = add(
            a,
            &format!(
                r#"{{"thread":"bo","content":"Bo note {i} about the garden","created_at":"2024-01-0{}T10:00:00Z","metadata":{{"user_id":"bo","n":{i}}}}}"#,
                i + 1
            ),
        );
        assert_eq!(st, 201);
    }
    let (st, hits) = s.call(
        "POST",
        "/v1/search",
        a,
        Some(r#"{"query":"garden","k":10,"metadata":[{"key":"n","gte":3}]}"#),
    );
    assert_eq!(st, 200, "{hits}");
    let ns: Vec<i64> = hits["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["metadata"]["n"].as_i64().unwrap())
        .collect();
    assert_eq!(ns.len(), 2, "{hits}");
    assert!(ns.iter().all(|n| *n >= 3));
    let (st, e) = s.call(
        "POST",
        "/v1/search",
        a,
        Some(r#"{"query":"garden","metadata":[{"key":"n"}]}"#),
    );
    assert_eq!(
        (st, e["error"]["field"].as_str()),
        (422, Some("metadata")),
        "{e}"
    );
    // Paging with cursors, and one condition in the query string.
    let mut seen = Vec::new();
    let mut path = "/v1/memories?where=user_id%3Dbo&limit=2".to_owned();
    loop {
        let (st, page) = s.call("GET", &path, a, None);
        assert_eq!(st, 200, "{page}");
        seen.extend(ids(&page, "memories"));
        match page["next"].as_str() {
            Some(c) => path = format!("/v1/memories?where=user_id%3Dbo&limit=2&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen.len(), 5);
    let (st, e) = s.call("GET", "/v1/memories?cursor=bogus", a, None);
    assert_eq!((st, e["error"]["field"].as_str()), (422, Some("cursor")));
    // A context scoped by user.
    let (st, ctx) = s.call(
        "POST",
        "/v1/context",
        a,
        Some(r#"{"thread":"t","query":"garden","scope_metadata":[{"key":"user_id","eq":"bo"}]}"#),
    );
    assert_eq!(st, 200, "{ctx}");
    assert!(
        ctx["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["section"] == "related"),
        "{ctx}"
    );

    // Forget: exactly one target; bo's memories go from alpha only.
    let (st, e) = s.call(
        "POST",
        "/v1/forget",
        a,
        Some(r#"{"thread":"bo","everything":true}"#),
    );
    assert_eq!(st, 422, "{e}");
    let (st, r) = s.call(
        "POST",
        "/v1/forget",
        a,
        Some(r#"{"metadata":[{"key":"user_id","eq":"bo"}]}"#),
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["deleted"].as_array().unwrap().len(), 5);
    assert_eq!(r["erased"], true, "nothing else reads the file: scrubbed");
    let (_, hits) = s.call(
        "POST",
        "/v1/search",
        a,
        Some(r#"{"query":"garden","k":10}"#),
    );
    assert!(
        hits["hits"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["thread"] != "bo"),
        "{hits}"
    );
    let (st, r) = s.call("POST", "/v1/forget", a, Some(r#"{"everything":true}"#));
    assert_eq!(st, 200);
    assert_eq!(r["deleted"].as_array().unwrap().len(), 1);
    let (_, list) = s.call("GET", "/v1/memories", b, None);
    assert_eq!(
        ids(&list, "memories"),
        vec![id.clone()],
        "beta keeps its memory"
    );
    let (st, _) = s.call(
        "POST",
        "/v1/forget",
        b,
        Some(&format!(
            r#"{{"ids":["{id}","01a227ce-dfe3-728a-a928-cb93de8d7ae9"]}}"#
        )),
    );
    assert_eq!(st, 404);
}

/// Lifetimes over REST: a TTL'd memory carries its expiry, a superseding fact hides the
/// earlier one unless `history` or `as_of` asks, and decay takes a half-life.
#[test]
fn ttl_supersedes_history_and_decay() {
    let s = start(Limits::default());
    let a = Some(s.key_a.as_str());
    let (st, old) = s.call(
        "POST",
        "/v1/memories",
        a,
        Some(r#"{"content":"The office is on Main Street","created_at":"2024-01-10T09:00:00Z"}"#),
    );
    assert_eq!(st, 201, "{old}");
    let old = old["id"].as_str().unwrap().to_owned();
    let (st, new) = s.call("POST", "/v1/memories", a, Some(&format!(r#"{{"content":"The office is on Harbour Road","created_at":"2024-06-01T09:00:00Z","supersedes":"{old}"}}"#)));
    assert_eq!(st, 201, "{new}");
    let new = new["id"].as_str().unwrap().to_owned();
    let found = |body: &str| {
        let (st, hits) = s.call("POST", "/v1/search", a, Some(body));
        assert_eq!(st, 200, "{hits}");
        let mut ids: Vec<String> = hits["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(
        found(r#"{"query":"office street road","mode":"keyword"}"#),
        vec![new.clone()]
    );
    let mut both = vec![old.clone(), new.clone()];
    both.sort();
    assert_eq!(
        found(r#"{"query":"office street road","mode":"keyword","history":true}"#),
        both
    );
    assert_eq!(
        found(r#"{"query":"office street road","mode":"keyword","as_of":"2024-03-01T00:00:00Z"}"#),
        vec![old.clone()]
    );
    assert_eq!(
        found(r#"{"query":"office street road","mode":"keyword","half_life":"30d"}"#),
        vec![new.clone()]
    );
    let (_, m) = s.call("GET", &format!("/v1/memories/{old}"), a, None);
    assert_eq!(m["valid_to"], "2024-06-01T09:00:00+00:00", "{m}");
    let (st, h) = s.call("GET", &format!("/v1/memories/{new}/history"), a, None);
    assert_eq!(st, 200, "{h}");
    assert_eq!(ids(&h, "memories"), vec![old.clone(), new.clone()]);
    assert_eq!(h["memories"][1]["supersedes"], old.as_str());
    let (st, m) = s.call(
        "POST",
        "/v1/memories",
        a,
        Some(r#"{"content":"temporary note","ttl":"7d"}"#),
    );
    assert_eq!(st, 201);
    let (_, m) = s.call(
        "GET",
        &format!("/v1/memories/{}", m["id"].as_str().unwrap()),
        a,
        None,
    );
    assert!(m["expires_at"].is_string(), "{m}");
    for (body, field) in [
        (r#"{"content":"x","ttl":"soon"}"#, "ttl"),
        (r#"{"content":"x","supersedes":"nope"}"#, "supersedes"),
        (r#"{"content":"x","expires_at":"tomorrow"}"#, "expires_at"),
    ] {
        let (st, e) = s.call("POST", "/v1/memories", a, Some(body));
        assert_eq!(
            (st, e["error"]["field"].as_str()),
            (422, Some(field)),
            "{e}"
        );
    }
    let (st, e) = s.call(
        "POST",
        "/v1/search",
        a,
        Some(r#"{"query":"x","half_life":"0s"}"#),
    );
    assert_eq!(
        (st, e["error"]["field"].as_str()),
        (422, Some("half_life")),
        "{e}"
    );
    // Superseding a version that is no longer current is a conflict.
    let (st, e) = s.call(
        "POST",
        "/v1/memories",
        a,
        Some(&format!(
            r#"{{"content":"elsewhere","supersedes":"{old}"}}"#
        )),
    );
    assert_eq!(st, 409, "{e}");
}
