//! `cairn serve` end to end with the real model: the README's curl example, the contract
//! checked from outside, a `cairn add` from another process, and the official Python MCP
//! client over stdio and streamable HTTP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_cairn");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `cairn serve` child, stopped with SIGTERM (gracefully) when dropped.
struct Served(Child);

impl Served {
    fn start(db: &Path, port: u16) -> Self {
        let child = Command::new(BIN)
            .arg("--db")
            .arg(db)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let s = Served(child);
        let start = Instant::now();
        while http(port, "GET", "/healthz", None, None).0 != 200 {
            assert!(start.elapsed() < Duration::from_secs(120), "no /healthz");
            std::thread::sleep(Duration::from_millis(200));
        }
        s
    }

    fn stop(mut self) {
        let pid = self.0.id().to_string();
        assert!(Command::new("kill").arg(&pid).status().unwrap().success());
        let status = self.0.wait().unwrap();
        assert!(status.success(), "SIGTERM: a graceful exit, got {status}");
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn http(
    port: u16,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&str>,
) -> (u16, serde_json::Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let url = format!("http://127.0.0.1:{port}{path}");
    let auth = key.map(|k| format!("Bearer {k}"));
    let r = if method == "GET" {
        let mut r = agent.get(&url);
        if let Some(a) = &auth {
            r = r.header("Authorization", a);
        }
        r.call()
    } else {
        let mut r = agent.post(&url);
        if let Some(a) = &auth {
            r = r.header("Authorization", a);
        }
        r.send(body.unwrap_or(""))
    };
    match r {
        Ok(mut resp) => {
            let status = resp.status().as_u16();
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            (
                status,
                serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
            )
        }
        Err(_) => (0, serde_json::Value::Null),
    }
}

fn create_key(db: &Path, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("--db")
        .arg(db)
        .args(args)
        .args(["keys", "create"])
        .arg(format!("k{}", free_port()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let key = text
        .lines()
        .last()
        .unwrap()
        .split_whitespace()
        .last()
        .unwrap()
        .to_owned();
    assert!(key.starts_with("cairn_"), "{text}");
    key
}

/// The text of the README between `<!-- NAME:start -->` and `<!-- NAME:end -->`, inside its
/// code fence.
fn readme_block(name: &str) -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme
        .find(&format!("<!-- {name}:start -->"))
        .unwrap_or_else(|| panic!("README has no {name} block"));
    let end = readme.find(&format!("<!-- {name}:end -->")).unwrap();
    let block = &readme[start..end];
    let body = block.split_once("```").unwrap().1;
    let body = body.split_once('\n').unwrap().1;
    body.rsplit_once("```").unwrap().0.to_owned()
}

#[test]
fn the_readme_curl_example_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let script = format!(
        "set -euo pipefail\n{}\nkill %1\nwait %1 || true\n",
        readme_block("serve-example")
    );
    let bin_dir = Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .env("PATH", path)
        .env("PORT", port.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `ok` lines from /healthz, then the three answers (curl adds no newline).
    let first = stdout
        .find('{')
        .unwrap_or_else(|| panic!("no JSON in {stdout}"));
    let docs: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&stdout[first..])
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(docs.len(), 3, "{stdout}");
    let id = docs[0]["id"].as_str().unwrap();
    assert_eq!(docs[1]["hits"][0]["id"], id, "the search finds the cat");
    assert!(docs[2]["text"].as_str().unwrap().contains("Pixel"));
    assert_eq!(docs[2]["items"][0]["id"], id);
}

#[test]
fn contract_from_outside_and_a_cli_add_seen_by_the_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("m.db");
    let key = create_key(&db, &[]);
    let acme = create_key(&db, &["--namespace", "acme"]);
    let port = free_port();
    let server = Served::start(&db, port);
    assert_eq!(
        http(port, "GET", "/openapi.json", None, None).1["openapi"],
        "3.1.0"
    );
    assert_eq!(http(port, "GET", "/v1/threads", None, None).0, 401);
    assert_eq!(
        http(port, "GET", "/v1/threads", Some("cairn_nope"), None).0,
        401
    );

    let (st, added) = http(
        port,
        "POST",
        "/v1/memories",
        Some(&key),
        Some(
            r#"{"kind":"conversational","thread":"t1","role":"user","speaker":"Ana","content":"We moved to Porto last spring.","created_at":"2024-05-01T09:00:00Z","metadata":{"mood":"happy"}}"#,
        ),
    );
    assert_eq!(st, 201, "{added}");
    assert!(added["id"].is_string());

    let search = r#"{"query":"zebra crossing on Elm street","k":5,"mode":"hybrid","thread":"t1","kind":"conversational"}"#;
    let (_, before) = http(port, "POST", "/v1/search", Some(&key), Some(search));
    assert!(!before.to_string().contains("zebra"));
    // Another process writes to the same file while the server runs.
    let out = Command::new(BIN)
        .arg("--db")
        .arg(&db)
        .args([
            "add",
            "The zebra crossing is on Elm street.",
            "--kind",
            "conversational",
            "--thread",
            "t1",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new_id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let (st, after) = http(port, "POST", "/v1/search", Some(&key), Some(search));
    assert_eq!(st, 200);
    assert_eq!(after["hits"][0]["id"], new_id.as_str(), "{after}");
    assert!(after["hits"][0]["score"].is_number());
    assert!(after["hits"][0]["content"]
        .as_str()
        .unwrap()
        .contains("zebra"));

    let (st, ctx) = http(
        port,
        "POST",
        "/v1/context",
        Some(&key),
        Some(r#"{"thread":"t1","query":"Where do we live?","budget":2000}"#),
    );
    assert_eq!(st, 200);
    let items = ctx["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    for i in items {
        for f in ["content", "section", "id", "kind"] {
            assert!(i[f].is_string(), "{f} in {i}");
        }
    }
    assert!(ctx["tokens"].as_u64().unwrap() > 0);

    // The other namespace's key sees none of it.
    let (_, other) = http(port, "POST", "/v1/search", Some(&acme), Some(search));
    assert_eq!(other["hits"].as_array().unwrap().len(), 0, "{other}");
    server.stop();
}

/// The venv with the official MCP Python SDK (scripts/setup-mcp-client.sh).
fn mcp_python() -> PathBuf {
    let status = Command::new(root().join("scripts/setup-mcp-client.sh"))
        .status()
        .expect("run scripts/setup-mcp-client.sh");
    assert!(status.success(), "provisioning the MCP client failed");
    let venv = std::env::var_os("CAIRN_MCP_VENV")
        .map_or_else(|| root().join(".cache/mcp-venv"), PathBuf::from);
    venv.join("bin/python")
}

fn check(python: &Path, args: &[&str]) {
    let out = Command::new(python)
        .arg(root().join("scripts/mcp_client_check.py"))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("mcp check passed"),
        "{args:?}\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_python_mcp_client_works_over_stdio_and_http() {
    let python = mcp_python();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("memory.db");

    // Streamable HTTP, with the key's namespace; both the handshake of today's clients and
    // the newest protocol's.
    let key = create_key(&db, &[]);
    let port = free_port();
    let server = Served::start(&db, port);
    let url = format!("http://127.0.0.1:{port}/mcp");
    check(
        &python,
        &["--http", &url, "--key", &key, "--thread", "http-legacy"],
    );
    check(
        &python,
        &[
            "--http",
            &url,
            "--key",
            &key,
            "--mode",
            "auto",
            "--thread",
            "http-auto",
        ],
    );
    server.stop();

    // Stdio, launched as the README's client configuration says.
    let config: serde_json::Value = serde_json::from_str(&readme_block("mcp-config")).unwrap();
    let entry = &config["mcpServers"]["cairn"];
    assert_eq!(entry["command"], "cairn");
    let args: Vec<String> = entry["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let a = a.as_str().unwrap();
            if a.ends_with("memory.db") {
                db.display().to_string()
            } else {
                a.to_owned()
            }
        })
        .collect();
    let mut cmd = vec!["--stdio", "--", BIN];
    cmd.extend(args.iter().map(String::as_str));
    check(&python, &cmd);
}
