//! The web view in a real browser: headless Chromium (Debian's package, provisioned by
//! scripts/setup-chromium.sh) loads `/ui/` from `cairn serve` over a store holding a
//! consolidated LoCoMo conversation, and the test reads the DOM the page built: tree nodes,
//! an opened node, search hits with their ancestors, an expansion in place, the context
//! preview; then it saves a screenshot.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_cairn");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cairn(db: &Path, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("--db")
        .arg(db)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn get(url: &str) -> (u16, String, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    match agent.get(url).call() {
        Ok(mut r) => {
            let ty = r
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            (
                r.status().as_u16(),
                ty,
                r.body_mut().read_to_string().unwrap_or_default(),
            )
        }
        Err(_) => (0, String::new(), String::new()),
    }
}

fn chromium() -> String {
    let status = Command::new(root().join("scripts/setup-chromium.sh"))
        .status()
        .expect("run scripts/setup-chromium.sh");
    assert!(status.success(), "provisioning chromium failed");
    if let Ok(c) = std::env::var("CAIRN_CHROMIUM") {
        return c;
    }
    for c in ["chromium", "chromium-browser"] {
        if Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return c.to_owned();
        }
    }
    panic!("no chromium after scripts/setup-chromium.sh");
}

/// Runs headless Chromium on `url` until the page's scripts settle; `--dump-dom` or
/// `--screenshot=FILE` as `what`.
fn browse(chrome: &str, profile: &Path, what: &str, url: &str) -> String {
    let out = Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--virtual-time-budget=30000",
            "--window-size=1280,1500",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(what)
        .arg(url)
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "chromium failed on {url}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn count(dom: &str, needle: &str) -> usize {
    dom.matches(needle).count()
}

#[test]
fn the_web_view_shows_trees_search_expansions_and_context_in_a_real_browser() {
    let chrome = chromium();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ui.db");
    let conv = root().join("../shared/data/locomo-dev/26.json");
    cairn(
        &db,
        &["import", conv.to_str().unwrap(), "--format", "locomo"],
    );
    cairn(&db, &["consolidate", "--older-than", "1h"]);
    let key = cairn(&db, &["keys", "create", "ui"])
        .split_whitespace()
        .last()
        .unwrap()
        .to_owned();
    let other = cairn(&db, &["--namespace", "other", "keys", "create", "ui-other"])
        .split_whitespace()
        .last()
        .unwrap()
        .to_owned();

    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _server = Served(
        Command::new(BIN)
            .arg("--db")
            .arg(&db)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://127.0.0.1:{port}");
    let start = Instant::now();
    while get(&format!("{base}/healthz")).0 != 200 {
        assert!(start.elapsed() < Duration::from_secs(120), "no /healthz");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The page is served without a key; the API is not.
    let (st, ty, html) = get(&format!("{base}/ui/"));
    assert_eq!(st, 200);
    assert!(ty.starts_with("text/html"), "{ty}");
    assert!(html.contains("<script src=\"app.js\">"));
    assert_eq!(get(&format!("{base}/ui/app.js")).0, 200);
    assert_eq!(get(&format!("{base}/v1/threads")).0, 401);

    let profile = dir.path().join("chrome");
    let url = format!(
        "{base}/ui/#key={key}&thread=26&open=1&q=adoption%20agency&context=What%20did%20Caroline%20research%3F"
    );
    let dom = browse(&chrome, &profile, "--dump-dom", &url);
    assert!(
        dom.contains("data-ready=\"1\""),
        "the page did not finish: {dom}"
    );
    assert!(!dom.contains(&key), "the key must not be in the page");
    // The thread list and its tree: top summaries, one opened onto its sources.
    assert!(dom.contains("data-thread=\"26\""));
    let nodes = count(&dom, "class=\"node");
    assert!(nodes >= 8, "{nodes} tree nodes");
    assert_eq!(count(&dom, "class=\"node expanded\""), 1);
    assert!(dom.contains("aria-expanded=\"true\""));
    // Search hits, their summary ancestors, and one expanded in place.
    let hits = count(&dom, "class=\"hit\"");
    assert!(hits >= 3, "{hits} hits");
    assert!(count(&dom, "class=\"chip ancestor\"") >= 1);
    assert_eq!(count(&dom, "class=\"expansion\""), 1);
    assert!(count(&dom, "class=\"source\"") >= 2);
    assert!(dom.to_lowercase().contains("adoption"));
    // The context preview, by section with token counts, and the timeline.
    assert!(dom.contains("data-section=\"recalled\""));
    assert!(dom.contains("data-section=\"recent\""));
    assert!(dom.contains(" of 2000 tokens"));
    assert!(count(&dom, "class=\"day\"") >= 10, "timeline bars");
    assert!(count(&dom, "class=\"span\"") >= 10, "summary spans");

    // Another namespace's key sees nothing of it.
    let dom = browse(
        &chrome,
        &dir.path().join("chrome2"),
        "--dump-dom",
        &format!("{base}/ui/#key={other}&thread=26&open=1&q=adoption"),
    );
    assert!(!dom.contains("data-thread=\"26\""));
    assert_eq!(count(&dom, "class=\"node"), 0);
    assert_eq!(count(&dom, "class=\"hit\""), 0);

    // A screenshot of the first view (the README's image comes from one).
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cairn-ui.png");
    let _ = std::fs::remove_file(&shot);
    browse(
        &chrome,
        &dir.path().join("chrome3"),
        &format!("--screenshot={}", shot.display()),
        &url,
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
}
