//! Namespaces (tenants): each one is its own store file, so nothing can cross between them by
//! any path — search, links, expansion, context assembly and deletes all run inside one file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_core::{Embedder, TokenCounter};
use cairn_harness::MemoryHarness;
use tokio::sync::Mutex;

use crate::error::ApiError;

/// The longest namespace name.
pub const MAX_NAMESPACE_LEN: usize = 64;

/// The namespace of the `--db` file itself (what `cairn add` and the other commands write
/// without `--namespace`).
pub const DEFAULT_NAMESPACE: &str = "default";

/// A tenant: lowercase ASCII letters, digits, `-` and `_`, 1 to 64 characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace(String);

impl Namespace {
    /// Checks the name.
    pub fn new(name: &str) -> Result<Self, ApiError> {
        let ok = !name.is_empty()
            && name.len() <= MAX_NAMESPACE_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if ok {
            Ok(Self(name.to_owned()))
        } else {
            Err(ApiError::invalid(
                Some("namespace"),
                format!(
                    "namespace {:?} is not valid: use 1 to {MAX_NAMESPACE_LEN} lowercase letters, digits, '-' or '_'",
                    name.chars().take(80).collect::<String>()
                ),
            ))
        }
    }

    /// The default namespace.
    pub fn default_namespace() -> Self {
        Self(DEFAULT_NAMESPACE.to_owned())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is the default namespace (the `--db` file itself).
    pub fn is_default(&self) -> bool {
        self.0 == DEFAULT_NAMESPACE
    }
}

impl std::fmt::Display for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The folder that holds the stores of the namespaces other than the default: `FILE.ns/`
/// beside the `--db` file.
pub fn namespaces_dir(db: &Path) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(".ns");
    db.with_file_name(name)
}

/// The store file of a namespace: the `--db` file for the default one, `FILE.ns/NAME.db`
/// for the others.
///
/// On PostgreSQL (`--db postgres://...`) a namespace is a schema of the same database
/// instead: see [`namespace_schema`].
pub fn namespace_path(db: &Path, ns: &Namespace) -> PathBuf {
    if ns.is_default() {
        db.to_path_buf()
    } else if let Some(url) = db.to_str().filter(|u| cairn_harness::is_postgres_url(u)) {
        let base = cairn_harness::schema_of(url).unwrap_or_else(|| "cairn".to_owned());
        PathBuf::from(cairn_harness::with_schema(
            url,
            &namespace_schema(&base, ns),
        ))
    } else {
        namespaces_dir(db).join(format!("{}.db", ns.as_str()))
    }
}

/// The PostgreSQL schema of a namespace other than the default, beside the store's own
/// schema `base`: `BASE_ns_NAME_HASH`, the name with `-` written `_` and cut to fit
/// PostgreSQL's 63 bytes, then 8 hex digits of the name's SHA-256, so two names never share
/// a schema (`a-b` and `a_b` differ in their hash).
pub fn namespace_schema(base: &str, ns: &Namespace) -> String {
    use sha2::Digest;
    let hash = sha2::Sha256::digest(ns.as_str().as_bytes());
    let tag: String = hash.iter().take(4).map(|b| format!("{b:02x}")).collect();
    let room = 63usize.saturating_sub(base.len() + "_ns_".len() + 1 + tag.len());
    let name: String = ns.as_str().replace('-', "_").chars().take(room).collect();
    format!("{base}_ns_{name}_{tag}")
}

/// The namespaces that have a store: the default one and every `FILE.ns/NAME.db`. On
/// PostgreSQL only the default one is listed (a schema does not say which name it serves).
pub fn existing_namespaces(db: &Path) -> Vec<Namespace> {
    let mut out = vec![Namespace::default_namespace()];
    if db.to_str().is_some_and(cairn_harness::is_postgres_url) {
        return out;
    }
    if let Ok(entries) = std::fs::read_dir(namespaces_dir(db)) {
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(stem) = name.strip_suffix(".db") {
                if let Ok(ns) = Namespace::new(stem) {
                    if !ns.is_default() {
                        out.push(ns);
                    }
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The open stores, one per namespace, opened on first use and sharing one model and one
/// token counter.
pub struct Namespaces {
    db: PathBuf,
    embedder: Arc<dyn Embedder>,
    counter: Arc<dyn TokenCounter>,
    open: Mutex<HashMap<Namespace, MemoryHarness>>,
}

impl Namespaces {
    /// Opens the default namespace's store with the given model (the model is then shared
    /// by every namespace).
    pub async fn open(db: &Path, embedder: Arc<dyn Embedder>) -> Result<Self, ApiError> {
        let first = MemoryHarness::builder(db)
            .embedder(embedder.clone())
            .build()
            .await
            .map_err(ApiError::from)?;
        let counter = first.token_counter().clone();
        let mut open = HashMap::new();
        open.insert(Namespace::default_namespace(), first);
        Ok(Self {
            db: db.to_path_buf(),
            embedder,
            counter,
            open: Mutex::new(open),
        })
    }

    /// The `--db` file.
    pub fn db(&self) -> &Path {
        &self.db
    }

    /// The shared query-side model.
    pub fn embedder(&self) -> &Arc<dyn Embedder> {
        &self.embedder
    }

    /// The store of `ns`, opened (and created) on first use.
    pub async fn get(&self, ns: &Namespace) -> Result<MemoryHarness, ApiError> {
        let mut open = self.open.lock().await;
        if let Some(h) = open.get(ns) {
            return Ok(h.clone());
        }
        let path = namespace_path(&self.db, ns);
        let file = !path.to_str().is_some_and(cairn_harness::is_postgres_url);
        if let Some(dir) = path.parent().filter(|_| file) {
            std::fs::create_dir_all(dir)
                .map_err(|e| ApiError::internal(format!("creating {}: {e}", dir.display())))?;
        }
        let h = MemoryHarness::builder(&path)
            .embedder(self.embedder.clone())
            .token_counter(self.counter.clone())
            .build()
            .await
            .map_err(ApiError::from)?;
        open.insert(ns.clone(), h.clone());
        Ok(h)
    }

    /// The stores open now, by namespace.
    pub async fn opened(&self) -> Vec<(Namespace, MemoryHarness)> {
        let open = self.open.lock().await;
        let mut v: Vec<_> = open.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_map_to_files_beside_the_store() {
        assert!(Namespace::new("acme-1_x").is_ok());
        for bad in ["", "Acme", "a/b", "..", "a b", &"x".repeat(65)] {
            assert!(Namespace::new(bad).is_err(), "{bad:?} accepted");
        }
        let db = Path::new("/data/cairn.db");
        assert_eq!(
            namespace_path(db, &Namespace::default_namespace()),
            PathBuf::from("/data/cairn.db")
        );
        let ns = Namespace::new("acme").unwrap();
        assert_eq!(
            namespace_path(db, &ns),
            PathBuf::from("/data/cairn.db.ns/acme.db")
        );
    }
}
