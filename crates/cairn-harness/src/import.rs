//! Parsers for outside data: generic JSONL memories and LoCoMo conversation files.
//!
//! Imported memories get ids derived from their content's identity (a UUID v8 over the
//! thread and the turn's key), so importing the same file twice adds nothing.

use std::collections::HashSet;

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use cairn_core::{MemoryId, MemoryKind, Metadata, NewMemory, Role, ThreadId, SPEAKER_KEY};

/// An import problem, with the line (JSONL) or field (LoCoMo) it concerns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// A JSONL line could not be read.
    #[error("line {line}: {message}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        message: String,
    },
    /// A LoCoMo file was malformed.
    #[error("LoCoMo file: {0}")]
    Locomo(String),
}

/// A deterministic memory id for an imported item.
pub fn import_id(thread: &str, key: &str) -> MemoryId {
    let mut h = Sha256::new();
    h.update(thread.as_bytes());
    h.update([0]);
    h.update(key.as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    MemoryId::from_uuid(uuid::Builder::from_custom_bytes(b).into_uuid())
}

/// One line of the generic JSONL format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonlRecord {
    /// The memory id (kept on export, so a round trip is lossless); derived when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<MemoryId>,
    /// Thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<ThreadId>,
    /// Role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// Kind (default conversational when a thread and role are given, else knowledge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<MemoryKind>,
    /// The text.
    pub content: String,
    /// RFC 3339 time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    /// Who said it (a conversation turn's speaker): stored as metadata
    /// [`cairn_core::SPEAKER_KEY`], which must not say otherwise; must not be blank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speaker: Option<String>,
    /// JSON object.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
}

/// Parses JSONL memories; the whole input is checked before anything is returned, so a bad
/// line means nothing is imported. Blank lines are skipped.
pub fn parse_jsonl(
    text: &str,
    thread_override: Option<&ThreadId>,
) -> Result<Vec<NewMemory>, ImportError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| ImportError::Line {
            line: i + 1,
            message,
        };
        let r: JsonlRecord = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        let thread = thread_override.cloned().or(r.thread);
        let kind = r.kind.unwrap_or(if thread.is_some() && r.role.is_some() {
            MemoryKind::Conversational
        } else {
            MemoryKind::Knowledge
        });
        if kind == MemoryKind::Summary {
            return Err(bad("summaries cannot be imported as plain memories".into()));
        }
        let key = format!(
            "{}|{}|{}|{}",
            i,
            r.created_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
            r.role.map(|r| r.as_str()).unwrap_or(""),
            r.content
        );
        let id =
            r.id.unwrap_or_else(|| import_id(thread.as_ref().map_or("", ThreadId::as_str), &key));
        let mut m = NewMemory {
            id: Some(id),
            kind,
            thread_id: thread,
            role: r.role,
            content: r.content,
            created_at: r.created_at,
            metadata: r.metadata,
            lifetime: cairn_core::Lifetime::default(),
        };
        if let Some(who) = r.speaker {
            let who = who.trim();
            if who.is_empty() {
                return Err(bad("speaker is blank".into()));
            }
            if m.metadata
                .get(SPEAKER_KEY)
                .is_some_and(|v| v.as_str() != Some(who))
            {
                return Err(bad(format!(
                    "speaker {who:?} and metadata.{SPEAKER_KEY} disagree"
                )));
            }
            m = m.with_speaker(who);
        }
        m.validate().map_err(|e| bad(e.to_string()))?;
        out.push(m);
    }
    Ok(out)
}

/// A LoCoMo question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocomoQuestion {
    /// The question.
    pub question: String,
    /// Category 1-5 (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial).
    pub category: u8,
    /// Evidence turn ids, normalised, only ids that name a turn.
    pub evidence: Vec<String>,
}

/// A parsed LoCoMo conversation.
#[derive(Debug, Clone)]
pub struct LocomoConversation {
    /// One memory per turn, in order.
    pub turns: Vec<NewMemory>,
    /// The questions that kept evidence after normalisation.
    pub questions: Vec<LocomoQuestion>,
}

/// Parses a LoCoMo session date such as `"1:56 pm on 8 May, 2023"`.
pub fn parse_locomo_date(s: &str) -> Option<DateTime<Utc>> {
    let s = s.trim().replace("am on", "AM on").replace("pm on", "PM on");
    NaiveDateTime::parse_from_str(&s, "%I:%M %p on %d %B, %Y")
        .ok()
        .map(|n| n.and_utc())
}

/// Normalises an evidence id (`D:11:26` → `D11:26`, `D30:05` → `D30:5`); several ids in one
/// string are split.
pub fn normalize_evidence(raw: &str) -> Vec<String> {
    raw.split([';', ',', ' '])
        .filter(|p| !p.trim().is_empty())
        .filter_map(|p| {
            let p = p.trim().trim_start_matches('D').trim_start_matches(':');
            let (a, b) = p.split_once(':')?;
            let a: u32 = a.trim().parse().ok()?;
            let b: u32 = b.trim().parse().ok()?;
            Some(format!("D{a}:{b}"))
        })
        .collect()
}

/// Parses a LoCoMo conversation file into turns of `thread` and its questions.
///
/// Each turn becomes a conversational memory: `created_at` is its session's date plus 30
/// seconds per turn, `metadata` carries `dia_id`, `session` and `speaker`, the first speaker
/// is the user and the second the assistant, and a shared photo's caption is appended to the
/// text.
pub fn parse_locomo(json: &str, thread: &ThreadId) -> Result<LocomoConversation, ImportError> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| ImportError::Locomo(e.to_string()))?;
    let conv = v.get("conversation").unwrap_or(&v);
    let speaker_a = conv["speaker_a"].as_str().unwrap_or("").to_owned();
    let mut turns = Vec::new();
    let mut ids = HashSet::new();
    for n in 1.. {
        let Some(session) = conv.get(format!("session_{n}")) else {
            break;
        };
        let Some(list) = session.as_array() else {
            return Err(ImportError::Locomo(format!("session_{n} is not a list")));
        };
        let date_key = format!("session_{n}_date_time");
        let date = conv[&date_key]
            .as_str()
            .and_then(parse_locomo_date)
            .ok_or_else(|| ImportError::Locomo(format!("{date_key} is missing or unreadable")))?;
        for (i, turn) in list.iter().enumerate() {
            let speaker = turn["speaker"].as_str().unwrap_or("").to_owned();
            let dia_id = turn["dia_id"]
                .as_str()
                .ok_or_else(|| ImportError::Locomo(format!("session_{n} turn {i} has no dia_id")))?
                .to_owned();
            let mut text = turn["text"].as_str().unwrap_or("").trim().to_owned();
            if let Some(caption) = turn["blip_caption"]
                .as_str()
                .filter(|c| !c.trim().is_empty())
            {
                text = format!("{text} [shares a photo: {}]", caption.trim());
            }
            if text.trim().is_empty() {
                continue;
            }
            let role = if speaker == speaker_a {
                Role::User
            } else {
                Role::Assistant
            };
            let mut metadata = Metadata::new();
            metadata.insert("dia_id".into(), dia_id.clone().into());
            metadata.insert("session".into(), n.into());
            if !speaker.trim().is_empty() {
                metadata.insert(SPEAKER_KEY.into(), speaker.clone().into());
            }
            let offset = chrono::Duration::seconds(30 * i64::try_from(i).unwrap_or(0));
            ids.insert(dia_id.clone());
            turns.push(NewMemory {
                id: Some(import_id(thread.as_str(), &dia_id)),
                kind: MemoryKind::Conversational,
                thread_id: Some(thread.clone()),
                role: Some(role),
                content: if speaker.trim().is_empty() {
                    text
                } else {
                    format!("{speaker}: {text}")
                },
                created_at: Some(date + offset),
                metadata,
                lifetime: cairn_core::Lifetime::default(),
            });
        }
    }
    if turns.is_empty() {
        return Err(ImportError::Locomo("no sessions with turns".into()));
    }
    let mut questions = Vec::new();
    for q in v["qa"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
        let evidence: Vec<String> = q["evidence"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
            .iter()
            .filter_map(|e| e.as_str())
            .flat_map(normalize_evidence)
            .filter(|e| ids.contains(e))
            .collect::<Vec<_>>();
        let mut seen = HashSet::new();
        let evidence: Vec<String> = evidence
            .into_iter()
            .filter(|e| seen.insert(e.clone()))
            .collect();
        let category = q["category"]
            .as_u64()
            .and_then(|c| u8::try_from(c).ok())
            .unwrap_or(0);
        if evidence.is_empty() {
            continue;
        }
        questions.push(LocomoQuestion {
            question: q["question"].as_str().unwrap_or("").to_owned(),
            category,
            evidence,
        });
    }
    Ok(LocomoConversation { turns, questions })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_evidence() {
        let d = parse_locomo_date("1:56 pm on 8 May, 2023").unwrap();
        assert_eq!(d.to_rfc3339(), "2023-05-08T13:56:00+00:00");
        assert!(parse_locomo_date("10:37 am on 27 June, 2023").is_some());
        assert!(parse_locomo_date("tomorrow").is_none());
        assert_eq!(normalize_evidence("D8:6; D9:17"), vec!["D8:6", "D9:17"]);
        assert_eq!(normalize_evidence("D:11:26"), vec!["D11:26"]);
        assert_eq!(normalize_evidence("D30:05"), vec!["D30:5"]);
        assert!(normalize_evidence("nonsense").is_empty());
    }

    #[test]
    fn jsonl_is_all_or_nothing_with_line_numbers() {
        let ok = "{\"thread\":\"t\",\"role\":\"user\",\"content\":\"hi\"}\n\n{\"content\":\"fact\",\"metadata\":{\"a\":1}}";
        let m = parse_jsonl(ok, None).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].kind, MemoryKind::Conversational);
        assert_eq!(m[1].kind, MemoryKind::Knowledge);
        assert_eq!(
            parse_jsonl(ok, None).unwrap()[0].id,
            m[0].id,
            "ids are deterministic"
        );
        let bad = "{\"content\":\"fine\"}\n{\"content\": 3}";
        assert!(matches!(
            parse_jsonl(bad, None),
            Err(ImportError::Line { line: 2, .. })
        ));
        let empty = "{\"content\":\"  \"}";
        assert!(matches!(
            parse_jsonl(empty, None),
            Err(ImportError::Line { line: 1, .. })
        ));
        let bad_thread = "{\"thread\":\"\",\"content\":\"x\"}";
        assert!(parse_jsonl(bad_thread, None).is_err());
    }

    #[test]
    fn jsonl_speaker_is_stored_and_checked() {
        // A valid speaker is stored (trimmed) as the turn's speaker; metadata that agrees is
        // fine; the content is kept as given.
        let ok = concat!(
            "{\"thread\":\"t\",\"role\":\"user\",\"speaker\":\" Gina \",\"content\":\"hi\"}\n",
            "{\"thread\":\"t\",\"speaker\":\"Jon\",\"metadata\":{\"speaker\":\"Jon\"},\"content\":\"yo\"}"
        );
        let m = parse_jsonl(ok, None).unwrap();
        assert_eq!(m[0].speaker(), Some("Gina"));
        assert_eq!(m[0].content, "hi");
        assert_eq!(m[1].speaker(), Some("Jon"));
        // A blank speaker, or one the metadata contradicts, is an error on its line.
        for bad in [
            "{\"thread\":\"t\",\"speaker\":\"  \",\"content\":\"hi\"}",
            "{\"thread\":\"t\",\"speaker\":\"Gina\",\"metadata\":{\"speaker\":\"Jon\"},\"content\":\"hi\"}",
            "{\"thread\":\"t\",\"speaker\":\"Gina\",\"metadata\":{\"speaker\":7},\"content\":\"hi\"}",
        ] {
            let text = format!("{{\"content\":\"fine\"}}\n{bad}");
            assert!(
                matches!(
                    parse_jsonl(&text, None),
                    Err(ImportError::Line { line: 2, .. })
                ),
                "{bad}"
            );
        }
    }
}
