//! A throwaway PostgreSQL 16 + pgvector 0.6 server for tests (feature `testing`).
//!
//! The binaries come from PyPI's `pgserver` wheel, unpacked by `scripts/setup-postgres.sh`
//! (run here on first use). [`server`] starts one server per test process: `initdb` in a
//! temporary directory, then `postgres` on a free port of 127.0.0.1, as the `postgres` user
//! (or `nobody` where there is none) when the tests run as root (PostgreSQL refuses to run
//! as root); when that user cannot reach the checkout, from a copy of the binaries in the
//! temporary directory. A watchdog shell stops
//! the server and removes its directory once the test process is gone. Each
//! [`TestServer::store`] gets a schema of its own, so tests run in parallel.
#![allow(clippy::missing_panics_doc)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{PgOptions, PgStore};

/// A running test server.
#[derive(Debug)]
pub struct TestServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its data directory's parent (removed when the test process ends).
    pub dir: PathBuf,
    /// The PostgreSQL install (bin/, lib/, share/).
    pub install: PathBuf,
}

static SERVER: OnceLock<Result<TestServer, String>> = OnceLock::new();
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// The test process's server, started on first call. Panics with the reason when it cannot
/// start (the tests cannot run without it).
pub fn server() -> &'static TestServer {
    match SERVER.get_or_init(start) {
        Ok(s) => s,
        Err(e) => panic!("cannot start the test PostgreSQL server: {e}"),
    }
}

impl TestServer {
    /// A libpq connection string for database `postgres` as user `cairn`.
    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=cairn dbname=postgres",
            self.port
        )
    }

    /// Options for a fresh schema of its own.
    pub fn options(&self, model: &str, dim: usize) -> PgOptions {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        PgOptions::new(self.url(), model, dim).schema(format!("t{}_{n}", std::process::id()))
    }

    /// A store in a fresh schema of its own.
    pub fn store(&self, model: &str, dim: usize) -> PgStore {
        match PgStore::open(self.options(model, dim)) {
            Ok(s) => s,
            Err(e) => panic!("open a test store: {e}"),
        }
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The install directory: `CAIRN_PG_INSTALL` when set, else what
/// `scripts/setup-postgres.sh` provisions (and prints).
fn install_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("CAIRN_PG_INSTALL") {
        return Ok(PathBuf::from(dir));
    }
    let out = Command::new(repo_root().join("scripts/setup-postgres.sh"))
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("run scripts/setup-postgres.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!("scripts/setup-postgres.sh failed: {}", out.status));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default().trim().to_owned();
    Ok(PathBuf::from(line))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Whether this process runs as root (PostgreSQL must then run as another user).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The unprivileged user PostgreSQL runs as when the tests run as root: `postgres` when
/// the machine has one, else `nobody`.
fn server_user() -> &'static str {
    let has_postgres = Command::new("id")
        .arg("postgres")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if has_postgres {
        "postgres"
    } else {
        "nobody"
    }
}

/// A command that runs `program` as `user` (when this process is root), else as this user.
fn as_user(program: &Path, user: Option<&str>) -> Command {
    match user {
        Some(u) => {
            let mut c = Command::new("runuser");
            c.args(["-u", u, "--"]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// `install`, or a copy of it every user can reach when `user` cannot (the checkout may
/// sit below a directory only root enters, such as /root): copied once into the temporary
/// directory, under a name of its own, and renamed into place when complete.
fn reachable_install(install: &Path, user: Option<&str>) -> Result<PathBuf, String> {
    let Some(u) = user else {
        return Ok(install.to_path_buf());
    };
    let reachable = |dir: &Path| {
        as_user(Path::new("test"), Some(u))
            .arg("-x")
            .arg(dir.join("bin/postgres"))
            .status()
            .is_ok_and(|s| s.success())
    };
    if reachable(install) {
        return Ok(install.to_path_buf());
    }
    // The wheel's layout: the binaries in `<tree>/pgserver/pginstall`, the libraries they
    // load (by a relative run path) in `<tree>/pgserver.libs`: the whole tree is copied.
    let tree = install
        .ancestors()
        .nth(2)
        .ok_or_else(|| format!("{} is not inside the pgserver tree", install.display()))?;
    let inside = install.strip_prefix(tree).map_err(|e| e.to_string())?;
    let copy = std::env::temp_dir().join("cairn-pgserver-0.1.4");
    let shared = copy.join(inside);
    if !reachable(&shared) {
        let partial = std::env::temp_dir().join(format!("cairn-pgserver-{}", std::process::id()));
        run(Command::new("cp").arg("-a").arg(tree).arg(&partial))?;
        run(Command::new("chmod").arg("-R").arg("a+rX").arg(&partial))?;
        // Another test process may have put its copy in place first: then this one goes.
        if std::fs::rename(&partial, &copy).is_err() {
            let _ = std::fs::remove_dir_all(&partial);
        }
    }
    if reachable(&shared) {
        Ok(shared)
    } else {
        Err(format!(
            "user {u} cannot run {} nor a copy in {}",
            install.display(),
            shared.display()
        ))
    }
}

fn start() -> Result<TestServer, String> {
    let user = is_root().then(server_user);
    let install = reachable_install(&install_dir()?, user)?;
    let bin = install.join("bin");
    let dir = tempfile::Builder::new()
        .prefix("cairn-pg-")
        .tempdir()
        .map_err(|e| e.to_string())?
        .keep();
    if let Some(u) = user {
        run(Command::new("chown").arg(u).arg(&dir))?;
    }
    let data = dir.join("data");
    run(as_user(&bin.join("initdb"), user)
        .arg("-D")
        .arg(&data)
        .args([
            "-U",
            "cairn",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "-N",
        ]))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    // The watchdog: starts the server, waits while the test process lives, then stops the
    // server (fast shutdown) and removes the directory.
    let script = r#"
        "$@" >"$DIR/log" 2>&1 &
        while kill -0 "$WATCH" 2>/dev/null; do sleep 0.5; done
        if [ -f "$DIR/data/postmaster.pid" ]; then
            kill -INT "$(head -n 1 "$DIR/data/postmaster.pid")" 2>/dev/null
            for _ in $(seq 1 100); do [ -f "$DIR/data/postmaster.pid" ] || break; sleep 0.1; done
        fi
        rm -rf "$DIR"
    "#;
    let mut watchdog = Command::new("bash");
    watchdog
        .arg("-c")
        .arg(script)
        .arg("cairn-pg-watchdog")
        .env("DIR", &dir)
        .env("WATCH", std::process::id().to_string());
    if let Some(u) = user {
        watchdog.args(["runuser", "-u", u, "--"]);
    }
    watchdog
        .arg(bin.join("postgres"))
        .arg("-D")
        .arg(&data)
        .arg("-p")
        .arg(port.to_string())
        .arg("-k")
        .arg(&dir)
        .args([
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "max_connections=300",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    watchdog
        .spawn()
        .map_err(|e| format!("start the server: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = Command::new(bin.join("pg_isready"))
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "cairn"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ready {
            break;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
            return Err(format!("the server did not start within 60 s:\n{log}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "cairn-pg: test PostgreSQL on 127.0.0.1:{port} ({})",
        dir.display()
    );
    Ok(TestServer { port, dir, install })
}
