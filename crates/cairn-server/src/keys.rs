//! API keys: each maps to one namespace. Only a SHA-256 of a key is stored (in `FILE.keys`,
//! beside the store, readable by its owner only); a presented key is hashed and compared with
//! every stored hash in constant time.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rand::RngCore;
use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::namespace::Namespace;

/// Every key starts with this, so a leaked one is recognisable.
pub const KEY_PREFIX: &str = "cairn_";

/// What is known about a key (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyInfo {
    /// The name given at creation.
    pub name: String,
    /// The namespace it opens.
    pub namespace: String,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// Whether it was revoked.
    pub revoked: bool,
}

/// The key file of a store: `FILE.keys` beside it.
pub fn keys_path(db: &Path) -> PathBuf {
    if db.to_str().is_some_and(cairn_harness::is_postgres_url) {
        // A database URL names no folder: the keys live in a local file, `CAIRN_KEYS` or
        // `cairn.keys` in the working directory.
        return std::env::var_os("CAIRN_KEYS")
            .map_or_else(|| PathBuf::from("cairn.keys"), PathBuf::from);
    }
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(".keys");
    db.with_file_name(name)
}

/// The API keys of a store.
pub struct KeyStore {
    conn: Mutex<Connection>,
}

fn sql(e: rusqlite::Error) -> ApiError {
    ApiError::internal(format!("key store: {e}"))
}

fn hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl KeyStore {
    /// Opens (creating if needed) the key file of the store at `db` ([`keys_path`]).
    pub fn open(db: &Path) -> Result<Self, ApiError> {
        Self::open_file(&keys_path(db))
    }

    /// Opens (creating if needed) the key file at `path`.
    pub fn open_file(path: &Path) -> Result<Self, ApiError> {
        let path = path.to_path_buf();
        let fresh = !path.exists();
        let conn = Connection::open(&path).map_err(sql)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS api_keys (
                name TEXT PRIMARY KEY,
                namespace TEXT NOT NULL,
                hash BLOB NOT NULL,
                created_at TEXT NOT NULL,
                revoked INTEGER NOT NULL DEFAULT 0
            );",
        )
        .map_err(sql)?;
        if fresh {
            restrict_permissions(&path);
        }
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> Result<std::sync::MutexGuard<'_, Connection>, ApiError> {
        self.conn
            .lock()
            .map_err(|_| ApiError::internal("key store lock poisoned"))
    }

    /// Creates a key named `name` for `namespace`; returns the key, which is not stored and
    /// cannot be shown again.
    pub fn create(&self, name: &str, namespace: &Namespace) -> Result<String, ApiError> {
        let name = name.trim();
        if name.is_empty() || name.len() > 128 {
            return Err(ApiError::invalid(
                Some("name"),
                "a key name must be 1 to 128 characters",
            ));
        }
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        let key = format!(
            "{KEY_PREFIX}{}",
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        let conn = self.conn()?;
        let taken: Option<String> = conn
            .query_row(
                "SELECT name FROM api_keys WHERE name = ?1",
                params![name],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql)?;
        if taken.is_some() {
            return Err(ApiError::invalid(
                Some("name"),
                format!("a key named {name:?} exists; revoke it or choose another name"),
            ));
        }
        conn.execute(
            "INSERT INTO api_keys (name, namespace, hash, created_at) VALUES (?1, ?2, ?3, ?4)",
            params![
                name,
                namespace.as_str(),
                hash(&key).to_vec(),
                chrono::Utc::now().to_rfc3339()
            ],
        )
        .map_err(sql)?;
        Ok(key)
    }

    /// Every key, oldest first.
    pub fn list(&self) -> Result<Vec<KeyInfo>, ApiError> {
        let conn = self.conn()?;
        let mut st = conn
            .prepare(
                "SELECT name, namespace, created_at, revoked FROM api_keys ORDER BY created_at, name",
            )
            .map_err(sql)?;
        let rows = st
            .query_map([], |r| {
                Ok(KeyInfo {
                    name: r.get(0)?,
                    namespace: r.get(1)?,
                    created_at: r.get(2)?,
                    revoked: r.get::<_, i64>(3)? != 0,
                })
            })
            .map_err(sql)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(sql)
    }

    /// Revokes the key named `name`; false when there is none.
    pub fn revoke(&self, name: &str) -> Result<bool, ApiError> {
        let n = self
            .conn()?
            .execute(
                "UPDATE api_keys SET revoked = 1 WHERE name = ?1 AND revoked = 0",
                params![name],
            )
            .map_err(sql)?;
        Ok(n > 0)
    }

    /// The namespace a presented key opens, or `None` for a wrong, revoked or malformed key.
    /// Every stored hash is compared, in constant time, whatever matches.
    pub fn authenticate(&self, presented: &str) -> Result<Option<Namespace>, ApiError> {
        let wanted = hash(presented.trim());
        let conn = self.conn()?;
        let mut st = conn
            .prepare_cached("SELECT namespace, hash FROM api_keys WHERE revoked = 0")
            .map_err(sql)?;
        let rows = st
            .query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
            })
            .map_err(sql)?;
        let mut found: Option<String> = None;
        for row in rows {
            let (ns, h) = row.map_err(sql)?;
            let same: bool = h.len() == wanted.len() && bool::from(h.as_slice().ct_eq(&wanted));
            if same && found.is_none() {
                found = Some(ns);
            }
        }
        found.map(|n| Namespace::new(&n)).transpose()
    }
}

#[cfg(unix)]
fn restrict_permissions(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
        tracing::warn!("could not restrict {} to its owner: {e}", path.display());
    }
}

#[cfg(not(unix))]
fn restrict_permissions(_: &Path) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_opens_its_namespace_until_revoked_and_only_its_hash_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("m.db");
        let keys = KeyStore::open(&db).unwrap();
        let acme = Namespace::new("acme").unwrap();
        let k1 = keys.create("ci", &acme).unwrap();
        let k2 = keys
            .create("other", &Namespace::default_namespace())
            .unwrap();
        assert!(k1.starts_with(KEY_PREFIX) && k1.len() == KEY_PREFIX.len() + 64);
        assert_ne!(k1, k2);
        assert_eq!(keys.authenticate(&k1).unwrap(), Some(acme.clone()));
        assert_eq!(
            keys.authenticate(&k2).unwrap(),
            Some(Namespace::default_namespace())
        );
        assert_eq!(keys.authenticate("cairn_wrong").unwrap(), None);
        assert_eq!(keys.authenticate("").unwrap(), None);
        assert!(keys.create("ci", &acme).is_err(), "names are unique");
        let raw = std::fs::read(keys_path(&db)).unwrap();
        assert!(
            !raw.windows(k1.len()).any(|w| w == k1.as_bytes()),
            "the key itself is never written"
        );
        assert!(keys.revoke("ci").unwrap());
        assert!(!keys.revoke("ci").unwrap());
        assert_eq!(keys.authenticate(&k1).unwrap(), None);
        let listed = keys.list().unwrap();
        assert_eq!(listed.len(), 2);
        assert!(listed.iter().any(|k| k.name == "ci" && k.revoked));
        // A second handle on the same file (another process) sees the same keys.
        let again = KeyStore::open(&db).unwrap();
        assert_eq!(
            again.authenticate(&k2).unwrap(),
            Some(Namespace::default_namespace())
        );
    }
}
