use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::InputError;

/// The public identifier of a memory: a UUID v7, so ids sort by creation time.
///
/// Storage-internal numbers (SQLite rowids, HNSW data ids) never cross the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MemoryId(Uuid);

impl MemoryId {
    /// A fresh, time-ordered id.
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }

    /// Wraps an existing UUID (for example one read back from storage).
    pub fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The 16 bytes of the UUID, as stored in SQLite.
    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }

    /// Builds an id from the 16 stored bytes.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(Uuid::from_bytes(bytes))
    }

    /// The id a caller-given external key stands for: the same key always gives the same
    /// id (a UUID v8 from the SHA-256 of the key), so adding a keyed memory twice (a retried
    /// request, say) finds the first one instead of writing a second.
    pub fn from_key(key: &str) -> Self {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(b"cairn external key\0");
        h.update(key.as_bytes());
        let digest = h.finalize();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        Self(uuid::Builder::from_custom_bytes(bytes).into_uuid())
    }

    /// The underlying UUID.
    pub fn uuid(&self) -> Uuid {
        self.0
    }
}

impl Default for MemoryId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for MemoryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for MemoryId {
    type Err = InputError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s.trim())
            .map(Self)
            .map_err(|_| InputError::BadId {
                value: s.chars().take(64).collect(),
            })
    }
}

/// The longest accepted thread id, in bytes.
pub const MAX_THREAD_ID_LEN: usize = 256;

/// A conversation thread: non-empty text of at most [`MAX_THREAD_ID_LEN`] bytes without control
/// characters or surrounding whitespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ThreadId(String);

impl ThreadId {
    /// Validates and wraps a thread id.
    pub fn new(value: impl Into<String>) -> Result<Self, InputError> {
        let value = value.into();
        let bad = |reason: &'static str| InputError::BadThreadId {
            value: value.chars().take(64).collect(),
            reason,
        };
        if value.is_empty() {
            return Err(bad("empty"));
        }
        if value.len() > MAX_THREAD_ID_LEN {
            return Err(bad("longer than 256 bytes"));
        }
        if value.chars().any(char::is_control) {
            return Err(bad("contains a control character"));
        }
        if value.trim() != value {
            return Err(bad("has leading or trailing whitespace"));
        }
        Ok(Self(value))
    }

    /// The thread id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for ThreadId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        ThreadId::new(s).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for ThreadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for ThreadId {
    type Err = InputError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<&str> for ThreadId {
    type Error = InputError;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_sort_by_time() {
        let a = MemoryId::new();
        let b = MemoryId::new();
        assert!(a < b);
        assert_eq!(MemoryId::from_bytes(*a.as_bytes()), a);
        assert_eq!(a.to_string().parse::<MemoryId>().unwrap(), a);
        assert!(matches!(
            "nope".parse::<MemoryId>(),
            Err(InputError::BadId { .. })
        ));
    }

    #[test]
    fn thread_ids_are_validated() {
        assert!(ThreadId::new("chat-1").is_ok());
        for bad in ["", " x", "x ", "a\u{0}b", "a\nb"] {
            assert!(
                matches!(ThreadId::new(bad), Err(InputError::BadThreadId { .. })),
                "{bad:?}"
            );
        }
        assert!(ThreadId::new("x".repeat(257)).is_err());
        assert!(serde_json::from_str::<ThreadId>("\"\"").is_err());
        let t: ThreadId = serde_json::from_str("\"t\"").unwrap();
        assert_eq!(t.as_str(), "t");
    }
}
