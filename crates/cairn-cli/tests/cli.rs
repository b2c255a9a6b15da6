//! The `cairn` binary end to end (real model, temporary stores).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

use std::path::Path;
use std::process::{Command, Output};

fn cairn(db: &Path, args: &[&str]) -> Output {
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

const DEV: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/data/locomo-dev"
);

#[test]
fn locomo_import_export_round_trip_and_json_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("c.db");
    let file = Path::new(DEV).join("30.json");
    if !file.exists() {
        eprintln!("skipping: {} not present", file.display());
        return;
    }
    ok(&cairn(
        &db,
        &["import", file.to_str().unwrap(), "--format", "locomo"],
    ));
    let raw: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let expected: usize = (1..100)
        .filter_map(|n| raw[format!("session_{n}")].as_array().map(Vec::len))
        .sum();
    let stats = json(&cairn(&db, &["stats", "--json"]));
    assert_eq!(
        stats["store"]["by_kind"]["conversational"]
            .as_u64()
            .unwrap() as usize,
        expected
    );
    // Importing again adds nothing.
    let again = cairn(
        &db,
        &["import", file.to_str().unwrap(), "--format", "locomo"],
    );
    assert!(String::from_utf8_lossy(&again.stderr).contains("imported 0 memories"));
    assert_eq!(
        json(&cairn(&db, &["stats", "--json"]))["store"]["total"],
        stats["store"]["total"]
    );

    // Search JSON: hits with memory and score; turns carry dia_id, session, speaker and the
    // session's date.
    let hits = json(&cairn(
        &db,
        &[
            "search",
            "adoption agency",
            "--thread",
            "30",
            "-k",
            "3",
            "--json",
        ],
    ));
    let first = &hits[0];
    assert!(first["score"].is_number());
    let meta = &first["memory"]["metadata"];
    assert!(meta["dia_id"].as_str().unwrap().starts_with('D'));
    assert!(meta["session"].is_number() && meta["speaker"].is_string());
    let d1: Vec<_> = ok(&cairn(&db, &["export", "--memories", "--thread", "30"]))
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .collect();
    assert_eq!(d1.len(), expected);
    let first_turn = d1
        .iter()
        .find(|v| v["metadata"]["dia_id"] == "D1:1")
        .unwrap();
    let date = raw["session_1_date_time"].as_str().unwrap();
    let parsed = cairn_harness::import::parse_locomo_date(date).unwrap();
    assert_eq!(
        first_turn["created_at"].as_str().unwrap(),
        parsed.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
    );

    // Memories as JSONL, imported into a fresh store, exported again: identical.
    let exported = ok(&cairn(&db, &["export", "--memories"]));
    let f = dir.path().join("export.jsonl");
    std::fs::write(&f, &exported).unwrap();
    let db2 = dir.path().join("c2.db");
    ok(&cairn(&db2, &["import", f.to_str().unwrap()]));
    assert_eq!(
        ok(&cairn(&db2, &["export", "--memories"])),
        exported,
        "lossless round trip"
    );
    // A thread filter belongs to --memories: a backup is the whole store.
    assert!(!cairn(&db, &["export", "--thread", "30"]).status.success());

    // Consolidate, tree, expand, context JSON shapes.
    let report = json(&cairn(&db, &["consolidate", "--older-than", "0", "--json"]));
    assert!(report["chunks_per_level"]["1"].as_u64().unwrap() > 0);
    let sid = report["summaries"][0].as_str().unwrap().to_owned();
    let sources = json(&cairn(&db, &["expand", &sid, "--json"]));
    assert!(!sources.as_array().unwrap().is_empty());
    let leaves = json(&cairn(&db, &["expand", &sid, "--leaves", "--json"]));
    assert!(leaves.as_array().unwrap().len() >= sources.as_array().unwrap().len());
    let tree = json(&cairn(&db, &["tree", "--thread", "30", "--json"]));
    assert!(!tree.as_array().unwrap().is_empty());
    assert!(ok(&cairn(&db, &["tree", &sid])).contains(&sid));

    // A backup (after consolidation: summaries, links, levels) restored into a new file
    // draws the same tree, expands to the same leaves and answers the same search (the
    // texts re-embedded with the real model).
    let backup = dir.path().join("backup.jsonl");
    std::fs::write(&backup, ok(&cairn(&db, &["export"]))).unwrap();
    let restored = dir.path().join("restored.db");
    let r = cairn(&restored, &["import", backup.to_str().unwrap()]);
    ok(&r);
    assert!(String::from_utf8_lossy(&r.stderr).contains("restored"));
    assert_eq!(
        ok(&cairn(&restored, &["tree", "--thread", "30"])),
        ok(&cairn(&db, &["tree", "--thread", "30"]))
    );
    assert_eq!(
        ok(&cairn(&restored, &["expand", &sid, "--leaves"])),
        ok(&cairn(&db, &["expand", &sid, "--leaves"]))
    );
    let top = |d: &Path| {
        json(&cairn(
            d,
            &[
                "search",
                "adoption agency",
                "--thread",
                "30",
                "-k",
                "5",
                "--mode",
                "vector",
                "--json",
            ],
        ))
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["memory"]["id"].clone())
        .collect::<Vec<_>>()
    };
    assert_eq!(top(&restored), top(&db));
    assert_eq!(
        json(&cairn(&restored, &["stats", "--json"]))["store"]["by_level"],
        json(&cairn(&db, &["stats", "--json"]))["store"]["by_level"]
    );
    // With vectors, into another file: the same tree; importing it again adds nothing.
    let with = dir.path().join("backup-v.jsonl");
    std::fs::write(&with, ok(&cairn(&db, &["export", "--with-embeddings"]))).unwrap();
    let restored2 = dir.path().join("restored2.db");
    ok(&cairn(&restored2, &["import", with.to_str().unwrap()]));
    assert_eq!(
        ok(&cairn(&restored2, &["tree", "--thread", "30"])),
        ok(&cairn(&db, &["tree", "--thread", "30"]))
    );
    let again = cairn(&restored2, &["import", with.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("restored 0 memories"));
    let ctx = json(&cairn(
        &db,
        &[
            "context",
            "--thread",
            "30",
            "--query",
            "When did they adopt?",
            "--budget",
            "500",
            "--json",
        ],
    ));
    assert!(ctx["tokens"].as_u64().unwrap() <= 500);
    let item = &ctx["items"][0];
    for k in [
        "id",
        "kind",
        "level",
        "content",
        "created_at",
        "metadata",
        "source_ids",
    ] {
        assert!(!item[k].is_null(), "context item lacks {k}: {item}");
    }
    assert!(ctx["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["metadata"]["dia_id"].is_string()));
    assert_eq!(item["thread_id"], "30", "{item}");
    // Memory beyond the thread: flags accepted; a thread in scope with nothing in it, and a
    // thread without knowledge, add no related item.
    let scoped = json(&cairn(
        &db,
        &[
            "context",
            "--thread",
            "30",
            "--query",
            "When did they adopt?",
            "--budget",
            "500",
            "--knowledge",
            "--scope",
            "nobody",
            "--json",
        ],
    ));
    assert!(scoped["items"]
        .as_array()
        .unwrap()
        .iter()
        .all(|i| i["section"] != "related"));
    let batch = dir.path().join("batch.jsonl");
    std::fs::write(&batch, "{\"thread\":\"30\",\"query\":\"adoption\",\"budget\":300}\n{\"thread\":\"30\",\"query\":\"dance\",\"budget\":200}\n").unwrap();
    let lines: Vec<serde_json::Value> = ok(&cairn(
        &db,
        &["context", "--batch", batch.to_str().unwrap()],
    ))
    .lines()
    .map(|l| serde_json::from_str(l).unwrap())
    .collect();
    assert_eq!(lines.len(), 2);
    assert!(lines[1]["tokens"].as_u64().unwrap() <= 200);
}

#[test]
fn commands_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("e.db");
    let id = ok(&cairn(
        &db,
        &[
            "add",
            "Paris is the capital of France",
            "--kind",
            "knowledge",
        ],
    ))
    .trim()
    .to_owned();
    let got = json(&cairn(&db, &["get", &id, "--json"]));
    assert_eq!(got["content"], "Paris is the capital of France");
    assert_eq!(got["kind"], "knowledge");
    let del = json(&cairn(&db, &["delete", &id, "--json"]));
    assert_eq!(del["deleted"][0], id.as_str());
    ok(&cairn(&db, &["reindex"]));
    // Errors: non-zero exit, a message on stderr, nothing on stdout.
    for args in [
        vec!["get", "not-an-id"],
        vec!["get", "01a227ce-dfe3-728a-a928-cb93de8d7ae9"],
        vec!["import", "/nonexistent/file.jsonl"],
        vec!["add", "x", "--kind", "bogus"],
        vec!["delete", &id, "--policy", "sometimes"],
        vec!["search", "x", "--mode", "psychic"],
        vec!["eval", "locomo", "/nonexistent", "--strategy", "psychic"],
    ]
    .into_iter()
    .chain(
        ["{\"bogus\": 1}", "not json"]
            .map(|bad| vec!["context", "--thread", "t", "--query", "q", "--options", bad]),
    ) {
        let o = cairn(&db, &args);
        assert!(!o.status.success(), "{args:?} should fail");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("cairn: error"),
            "{args:?}"
        );
        assert!(o.stdout.is_empty());
    }
    // A malformed line is reported with its number, and nothing is imported.
    let f = dir.path().join("bad.jsonl");
    std::fs::write(
        &f,
        "{\"content\":\"fine\"}\n{\"content\":\"also fine\"}\n{not json}\n",
    )
    .unwrap();
    let before = json(&cairn(&db, &["stats", "--json"]))["store"]["total"].clone();
    let o = cairn(&db, &["import", f.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("line 3"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        json(&cairn(&db, &["stats", "--json"]))["store"]["total"],
        before
    );
}

/// The everyday commands: keyed adds and upserts, metadata patches, `--where` in search,
/// list and context, cursor paging, and `forget` (real model).
#[test]
fn keys_filters_paging_and_forget() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("d.db");
    let add = |text: &str, user: &str, key: &str| {
        let meta = format!("{{\"user_id\": \"{user}\"}}");
        ok(&cairn(
            &db,
            &[
                "add",
                text,
                "--thread",
                &format!("{user}-chat"),
                "--kind",
                "conversational",
                "--role",
                "user",
                "--meta",
                &meta,
                "--key",
                key,
            ],
        ))
        .trim()
        .to_owned()
    };
    let a = add("I moved to Lisbon last spring", "ana", "ana-1");
    let again = add("I moved to Lisbon last spring", "ana", "ana-1");
    assert_eq!(a, again, "the same key twice is one memory");
    let b = add("My favourite food is grilled sardines", "ana", "ana-2");
    let c = add("I work as a nurse in Porto", "bo", "bo-1");
    // The same key with other content: refused through add, applied through --upsert.
    let o = cairn(
        &db,
        &[
            "add",
            "I moved to Madrid",
            "--thread",
            "ana-chat",
            "--kind",
            "conversational",
            "--role",
            "user",
            "--key",
            "ana-1",
        ],
    );
    assert!(!o.status.success());
    let up = json(&cairn(
        &db,
        &[
            "add",
            "I moved to Lisbon last spring",
            "--thread",
            "ana-chat",
            "--kind",
            "conversational",
            "--role",
            "user",
            "--meta",
            "{\"user_id\": \"ana\", \"verified\": true}",
            "--key",
            "ana-1",
            "--upsert",
            "--json",
        ],
    ));
    assert_eq!(up["id"], a.as_str());
    assert_eq!(up["metadata"]["verified"], true);
    let patched = json(&cairn(
        &db,
        &["patch", &b, "--meta", "{\"rating\": 5}", "--json"],
    ));
    assert_eq!(patched["metadata"]["rating"], 5);
    // --where in search and list.
    let hits = json(&cairn(
        &db,
        &[
            "search",
            "where does the user live",
            "--where",
            "user_id=bo",
            "--json",
        ],
    ));
    let hits = hits.as_array().unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0]["memory"]["id"], c.as_str());
    let listed = json(&cairn(&db, &["list", "--where", "rating>=4", "--json"]));
    assert_eq!(listed["items"].as_array().unwrap().len(), 1);
    assert_eq!(listed["items"][0]["id"], b.as_str());
    // Paging: one at a time, following the printed cursor.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut args = vec!["list", "--limit", "1", "--json"];
        if let Some(c) = &cursor {
            args.extend(["--cursor", c.as_str()]);
        }
        let page = json(&cairn(&db, &args));
        seen.extend(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].as_str().unwrap().to_owned()),
        );
        match page["next"].as_str() {
            Some(n) => cursor = Some(n.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, vec![a.clone(), b.clone(), c.clone()]);
    // A context scoped by user recalls ana's memories from her thread into another one.
    add("Any tips for the weekend?", "ana", "ana-3");
    let ctx = ok(&cairn(
        &db,
        &[
            "context",
            "--thread",
            "bo-chat",
            "--query",
            "what food does ana like",
            "--scope-where",
            "user_id=ana",
        ],
    ));
    assert!(ctx.contains("sardines"), "{ctx}");
    // Forget ana: nothing of hers is found afterwards; bo's memory stays.
    let r = json(&cairn(&db, &["forget", "--where", "user_id=ana", "--json"]));
    assert_eq!(r["deleted"].as_array().unwrap().len(), 3);
    let hits = json(&cairn(&db, &["search", "sardines Lisbon", "--json"]));
    assert!(hits
        .as_array()
        .unwrap()
        .iter()
        .all(|h| h["memory"]["id"] == c.as_str()));
    // Errors: a bad condition, a bad cursor, nothing named to forget, --all without --yes.
    for args in [
        vec!["list", "--where", "nonsense"],
        vec!["list", "--cursor", "bogus"],
        vec!["forget"],
        vec!["forget", "--all"],
        vec!["patch", &c, "--meta", "[1]"],
    ] {
        let o = cairn(&db, &args);
        assert!(!o.status.success(), "{args:?} should fail");
        assert!(o.stdout.is_empty());
    }
    assert_eq!(json(&cairn(&db, &["stats", "--json"]))["store"]["total"], 1);
    // A superseded fact: hidden by default, kept as history.
    let v1 = ok(&cairn(&db, &["add", "The office is on Main Street"]))
        .trim()
        .to_owned();
    let v2 = ok(&cairn(
        &db,
        &["add", "The office is on Harbour Road", "--supersedes", &v1],
    ))
    .trim()
    .to_owned();
    let hits = json(&cairn(
        &db,
        &[
            "search",
            "office street road",
            "--mode",
            "keyword",
            "--json",
        ],
    ));
    assert_eq!(hits.as_array().unwrap().len(), 1);
    assert_eq!(hits[0]["memory"]["id"], v2.as_str());
    let hits = json(&cairn(
        &db,
        &[
            "search",
            "office street road",
            "--mode",
            "keyword",
            "--history",
            "--json",
        ],
    ));
    assert_eq!(hits.as_array().unwrap().len(), 2);
    let versions = json(&cairn(&db, &["history", &v2, "--json"]));
    assert_eq!(versions[0]["id"], v1.as_str());
    assert!(versions[0]["valid_to"].is_string());
    let t = json(&cairn(
        &db,
        &["add", "short-lived", "--ttl", "1h", "--json"],
    ));
    assert!(t["expires_at"].is_string());
    assert!(!cairn(&db, &["add", "x", "--ttl", "soon"]).status.success());
    ok(&cairn(&db, &["forget", "--all", "--yes"]));
    assert_eq!(json(&cairn(&db, &["stats", "--json"]))["store"]["total"], 0);
}

/// `eval locomo` on a small fixture made here: two sessions, two questions.
#[test]
fn eval_on_a_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let conv = serde_json::json!({
        "speaker_a": "Ann", "speaker_b": "Bob",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a grey cat named Pixel last week."},
            {"speaker": "Bob", "dia_id": "D1:2", "text": "Congratulations! Cats are great company."},
            {"speaker": "Ann", "dia_id": "D1:3", "text": "I also started pottery classes on Tuesdays.", "blip_caption": "a photo of a clay bowl"}
        ],
        "session_2_date_time": "10:00 am on 20 May, 2023",
        "session_2": [
            {"speaker": "Bob", "dia_id": "D2:1", "text": "How is Pixel settling in?"},
            {"speaker": "Ann", "dia_id": "D2:2", "text": "Pixel sleeps on my keyboard all day."}
        ],
        "qa": [
            {"question": "What is the name of Ann's cat?", "answer": "Pixel", "evidence": ["D1:1"], "category": 4},
            {"question": "What class did Ann start?", "answer": "pottery", "evidence": ["D:1:3", "D9:9"], "category": 4},
            {"question": "Unanswerable", "adversarial_answer": "x", "evidence": ["D1:2"], "category": 5}
        ]
    });
    std::fs::write(data.join("fixture.json"), conv.to_string()).unwrap();
    // `eval locomo` on the fixture at 400 tokens, with `extra` arguments.
    let eval = |extra: &[&str]| {
        let mut args = vec!["eval", "locomo", data.to_str().unwrap(), "--budget", "400"];
        args.extend_from_slice(extra);
        cairn(&dir.path().join("unused.db"), &args)
    };
    let r = json(&eval(&["--json"]));
    let cairn_fig = &r["overall"]["cairn_assemble_context"];
    assert_eq!(cairn_fig["questions"], 2, "category 5 is left out");
    assert_eq!(cairn_fig["evidence_recall"], 1.0);
    for s in ["last_n", "flat_vector", "flat_keyword", "flat_hybrid"] {
        assert!(r["overall"][s]["evidence_recall"].is_number(), "{s}");
    }
    assert_eq!(
        r["per_conversation"]["cairn_assemble_context"]["fixture"]["questions"],
        2
    );
    let table = ok(&eval(&[]));
    assert!(table.contains("| cairn_assemble_context |"));
    assert!(table.contains("per conversation") && table.contains("| fixture |"));
    // One strategy, with options: only it is measured, and the options reach it (all five
    // turns fit either way, but as recent turns, one message each, they cost more tokens
    // than grouped in the recalled block).
    let only = |options: &str| {
        json(&eval(&[
            "--strategy",
            "cairn_assemble_context",
            "--options",
            options,
            "--json",
        ]))
    };
    let plain = only("{}");
    let strategies: Vec<&String> = plain["overall"].as_object().unwrap().keys().collect();
    assert_eq!(strategies, ["cairn_assemble_context"]);
    let recent = only(r#"{"recent_share": 1.0, "weights": {"names_out_of_vector": false}}"#);
    let fig = |r: &serde_json::Value, f: &str| r["overall"]["cairn_assemble_context"][f].clone();
    assert_eq!(fig(&plain, "evidence_recall"), 1.0);
    assert_eq!(fig(&recent, "evidence_recall"), 1.0);
    assert!(
        fig(&recent, "mean_tokens").as_f64().unwrap()
            > fig(&plain, "mean_tokens").as_f64().unwrap(),
        "{plain} {recent}"
    );
}

/// `eval summaries` on a small fixture made here: three sessions (20, 20 and 10 turns, so
/// the default chunks of 20 fall on session boundaries), reference summaries, two questions.
#[test]
fn eval_summaries_on_a_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let sessions = [
        (
            "1:56 pm on 8 May, 2023",
            20,
            "I adopted a grey cat named Pixel last week and she already owns the sofa.",
            "adopting a grey cat and the pottery classes on Tuesdays",
            "Ann adopted a grey cat named Pixel and started pottery classes on Tuesdays; Bob \
             congratulated her and asked about the bowls she makes.",
        ),
        (
            "10:00 am on 20 May, 2023",
            20,
            "I signed up for the Lisbon marathon in October, so I run every morning now.",
            "training for the Lisbon marathon and the long runs by the river",
            "Bob is training for the Lisbon marathon in October and runs every morning; Ann \
             promised to cheer for him at the finish line.",
        ),
        (
            "9:30 am on 2 June, 2023",
            10,
            "I started a new job at the corner bakery and I bake sourdough before sunrise.",
            "the new job at the corner bakery and baking sourdough at dawn",
            "Ann started a new job at the corner bakery baking sourdough before sunrise; Bob \
             asked for a loaf.",
        ),
    ];
    let details = [
        "the morning walk to the station",
        "a rainy afternoon at the library",
        "the neighbour's garden full of tulips",
        "an old photo album from school",
        "the noisy café near the square",
        "a podcast about ancient history",
        "the bicycle with a flat tyre",
        "a long phone call with my mother",
        "the jazz concert in the park",
        "a recipe for lemon cake",
    ];
    let mut conv = serde_json::json!({"speaker_a": "Ann", "speaker_b": "Bob"});
    for (s, (date, turns, first, topic, summary)) in sessions.iter().enumerate() {
        let n = s + 1;
        let list: Vec<serde_json::Value> = (1..=*turns)
            .map(|i| {
                let speaker = if i % 2 == 1 { "Ann" } else { "Bob" };
                let text = if i == 1 || i == 3 {
                    (*first).to_owned()
                } else {
                    format!(
                        "Between {topic} I keep coming back to {}, which took most of day {i} \
                         this week and left me smiling about it.",
                        details[i % details.len()]
                    )
                };
                serde_json::json!({"speaker": speaker, "dia_id": format!("D{n}:{i}"), "text": text})
            })
            .collect();
        conv[format!("session_{n}_date_time")] = (*date).into();
        conv[format!("session_{n}")] = list.into();
        conv[format!("session_{n}_summary")] = (*summary).into();
    }
    conv["qa"] = serde_json::json!([
        {"question": "What is the name of Ann's cat?", "answer": "Pixel", "evidence": ["D1:1"], "category": 4},
        {"question": "Which marathon is Bob training for?", "answer": "Lisbon", "evidence": ["D2:3"], "category": 1},
        {"question": "Unanswerable", "adversarial_answer": "x", "evidence": ["D1:2"], "category": 5}
    ]);
    std::fs::write(data.join("fixture.json"), conv.to_string()).unwrap();
    let store = dir.path().join("summaries.db");
    let eval = |extra: &[&str]| {
        let mut args = vec![
            "eval",
            "summaries",
            data.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        cairn(&dir.path().join("unused.db"), &args)
    };
    let r = json(&eval(&["--json"]));
    assert_eq!(r["conversations"], 1);
    for m in ["cairn", "lead", "reference"] {
        for (what, f) in [
            ("overall", &r["overall"][m]),
            ("fixture", &r["per_conversation"][m]["fixture"]),
        ] {
            for k in [
                "rouge1_f1",
                "rouge1_recall",
                "rouge2_f1",
                "rougeL_f1",
                "length_ratio",
                "route_recall_at3",
                "route_full_hit_at3",
                "mean_leaves",
            ] {
                let v = f[k].as_f64().unwrap_or(f64::NAN);
                assert!((0.0..=50.0).contains(&v), "{m} {what} {k}: {f}");
            }
            assert_eq!(f["sessions"], 3, "{m} {what}: {f}");
            assert_eq!(f["questions"], 2, "{m} {what}: category 5 is left out");
        }
    }
    let reference = &r["overall"]["reference"];
    assert_eq!(reference["rouge1_f1"], 1.0, "the anchor: itself");
    assert!(reference["route_recall_at3"].as_f64().unwrap() > 0.0);
    assert!(reference["mean_leaves"].as_f64().unwrap() <= 50.0);
    // Per session: lengths in (0, 1], and lead as long as Cairn's level-1 text.
    let rows = |m: &str| r["per_session"][m]["fixture"].as_array().unwrap().clone();
    let (cairn_rows, lead_rows) = (rows("cairn"), rows("lead"));
    assert_eq!(cairn_rows.len(), 3);
    for m in ["cairn", "lead", "reference"] {
        for s in rows(m) {
            let ratio = s["length_ratio"].as_f64().unwrap();
            assert!(ratio > 0.0 && ratio <= 1.0, "{m}: {s}");
        }
    }
    for (c, l) in cairn_rows.iter().zip(&lead_rows) {
        assert_eq!(c["session"], l["session"]);
        assert_eq!(c["summary_words"], l["summary_words"], "{c} {l}");
    }
    // A rerun on the kept store finds everything in place: the same figures.
    assert_eq!(json(&eval(&["--json"])), r);
    let table = ok(&eval(&[]));
    assert!(table.contains("| cairn |") && table.contains("| reference |"));
    assert!(table.contains("Per conversation") && table.contains("| fixture | lead |"));
    // A missing directory: non-zero exit, a message naming it.
    let o = cairn(
        &dir.path().join("unused.db"),
        &["eval", "summaries", "/nonexistent/locomo"],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cairn: error") && err.contains("/nonexistent/locomo"),
        "{err}"
    );
    assert!(o.stdout.is_empty());
}

/// A LoCoMo-shaped conversation: `sessions` of six turns, a week apart, the first turn of
/// each session about `facts[session]`, the others small talk.
fn fixture_conversation(a: &str, b: &str, day: u32, facts: &[&str]) -> serde_json::Value {
    let small = [
        "the weather turned cold again this week",
        "a long walk by the river after work",
        "the new café near the station",
        "a podcast about old maps",
        "my neighbour's noisy dog",
    ];
    let mut c = serde_json::json!({"speaker_a": a, "speaker_b": b, "qa": []});
    for (s, fact) in facts.iter().enumerate() {
        let n = s + 1;
        c[format!("session_{n}_date_time")] =
            format!("2:15 pm on {} March, 2023", day + 7 * s as u32).into();
        let turns: Vec<serde_json::Value> = (1..=6)
            .map(|i| {
                let who = if i % 2 == 1 { a } else { b };
                let text = if i == 1 {
                    (*fact).to_owned()
                } else {
                    format!(
                        "{}, I keep thinking about {}.",
                        if i % 2 == 1 { b } else { a },
                        small[i % small.len()]
                    )
                };
                serde_json::json!({"speaker": who, "dia_id": format!("D{n}:{i}"), "text": text})
            })
            .collect();
        c[format!("session_{n}")] = turns.into();
    }
    c
}

/// `eval locomo --haystack` on a fixture made here (a needle and two donors, 18 turns
/// each) in a thread of 40 turns: the report's fields, a second run on the kept stores (no
/// import, the same figures), a kept store that holds another thread refused, and bad
/// arguments.
#[test]
fn eval_haystack_on_a_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let mut needle = fixture_conversation(
        "Ann",
        "Bob",
        1,
        &[
            "I adopted a grey cat named Pixel last week.",
            "I started pottery classes on Tuesdays.",
            "I signed up for the Lisbon marathon in October.",
        ],
    );
    needle["qa"] = serde_json::json!([
        {"question": "What is the name of Ann's cat?", "answer": "Pixel", "evidence": ["D1:1"], "category": 4},
        {"question": "Which marathon did Ann sign up for?", "answer": "Lisbon", "evidence": ["D3:1", "D2:1"], "category": 1},
        {"question": "Unanswerable", "adversarial_answer": "x", "evidence": ["D1:2"], "category": 5}
    ]);
    let donors = [
        fixture_conversation(
            "Cleo",
            "Dan",
            2,
            &[
                "I bought a red bicycle for the commute.",
                "I am learning to bake sourdough bread.",
                "I visited my aunt in Porto.",
            ],
        ),
        fixture_conversation(
            "Eve",
            "Finn",
            5,
            &[
                "I repainted the kitchen yellow.",
                "I joined a chess club downtown.",
                "I planted tomatoes on the balcony.",
            ],
        ),
    ];
    std::fs::write(data.join("needle.json"), needle.to_string()).unwrap();
    for (i, d) in donors.iter().enumerate() {
        std::fs::write(data.join(format!("donor{i}.json")), d.to_string()).unwrap();
    }
    let stores = dir.path().join("stores");
    let eval = |extra: &[&str]| {
        let mut args = vec!["eval", "locomo", data.to_str().unwrap()];
        args.extend_from_slice(extra);
        cairn(&dir.path().join("unused.db"), &args)
    };
    let kept = |stores: &Path| {
        eval(&[
            "--haystack",
            "40",
            "--needle",
            "needle",
            "--store-dir",
            stores.to_str().unwrap(),
            "--json",
        ])
    };
    let first = kept(&stores);
    let r = json(&first);
    assert_eq!(r["budget"], 2000);
    assert_eq!(r["needles"], serde_json::json!(["needle"]));
    let row = &r["rows"][0];
    assert_eq!(row["target"], 40);
    // 18 needle turns, then sessions of 6 until there are 40.
    assert_eq!(row["haystack_turns"], 42, "{row}");
    assert_eq!(row["questions"], 2, "category 5 is left out");
    for f in [row, &row["per_needle"]["needle"]] {
        for k in ["recall", "full_hit", "recall_alone", "full_hit_alone"] {
            let v = f[k].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&v), "{k}: {f}");
        }
        let (p50, p99) = (
            f["latency_p50_ms"].as_f64().unwrap(),
            f["latency_p99_ms"].as_f64().unwrap(),
        );
        assert!(p50 > 0.0 && p99 >= p50, "{f}");
        assert!(f["consolidation_s"].as_f64().unwrap() > 0.0, "{f}");
        // The donors' 36 turns fill the thread: no copy of the needle's own turns.
        assert_eq!(f["recall_with_copies"], f["recall"], "{f}");
        assert_eq!(f["full_hit_with_copies"], f["full_hit"], "{f}");
    }
    // Alone, all 18 turns fit in 2,000 tokens.
    assert_eq!(row["recall_alone"], 1.0, "{row}");
    let err = String::from_utf8_lossy(&first.stderr);
    assert!(
        err.contains("needle needle alone: 18 turns, consolidated in"),
        "{err}"
    );
    assert!(
        err.contains("haystack 40, needle needle: 42 turns"),
        "{err}"
    );

    // Again on the kept stores: nothing imported, the same figures. Without --json: the
    // table.
    let again = json(&kept(&stores));
    for k in [
        "haystack_turns",
        "questions",
        "recall",
        "full_hit",
        "recall_alone",
        "full_hit_alone",
    ] {
        assert_eq!(again["rows"][0][k], row[k], "{k}");
    }
    // A size under the needle's length leaves the needle alone.
    let table = ok(&eval(&[
        "--haystack",
        "40,10",
        "--needle",
        "needle",
        "--store-dir",
        stores.to_str().unwrap(),
    ]));
    assert!(table.contains("| 40 | 42 | 2 |"), "{table}");
    assert!(table.contains("| 10 | 18 | 2 |"), "{table}");
    assert!(table.contains("| N | needle |"), "{table}");

    // A kept store with another thread: the haystack where the needle alone should be.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    for e in std::fs::read_dir(&stores).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if let Some(rest) = name.strip_prefix("hay40-needle.db") {
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), other.join(format!("alone-needle.db{rest}"))).unwrap();
            }
        }
    }
    let o = kept(&other);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("alone-needle.db") && err.contains("does not hold the thread"),
        "{err}"
    );
    assert!(o.stdout.is_empty());

    // Bad arguments: an unknown needle, a zero size, --needle or --store-dir without
    // --haystack, --strategy with it.
    for args in [
        vec!["--haystack", "40", "--needle", "nope"],
        vec!["--haystack", "0"],
        vec!["--needle", "needle"],
        vec!["--store-dir", "x"],
        vec!["--haystack", "40", "--strategy", "last_n"],
    ] {
        let o = eval(&args);
        assert!(!o.status.success(), "{args:?}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}
