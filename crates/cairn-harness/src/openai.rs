//! [`OpenAiSummarizer`]: any OpenAI-compatible `/v1/chat/completions` server (llama.cpp's
//! server, Ollama, vLLM, OpenAI).

use std::time::Duration;

use async_trait::async_trait;
use cairn_core::{MemoryKind, Role, SummarizeError, Summarizer, SummaryItem, SummaryRequest};
use rand::Rng;

use crate::{HarnessError, Result};

/// The placeholder for the previous summary.
pub const PREVIOUS: &str = "{previous_summary}";
/// The placeholder for the new transcript lines.
pub const NEW_LINES: &str = "{new_lines}";

/// LangChain's progressive-summary prompt, with named placeholders.
pub const DEFAULT_TEMPLATE: &str = "Progressively summarize the lines of conversation provided, adding onto the previous summary and returning a new summary. Keep names, dates and decisions.\n\nCurrent summary:\n{previous_summary}\n\nNew lines of conversation:\n{new_lines}\n\nNew summary:";

/// The placeholder for the level of the summary a roll-up writes.
pub const LEVEL: &str = "{level}";
/// The placeholder for the dates a roll-up's sources span.
pub const DATE_RANGE: &str = "{date_range}";

/// The roll-up prompt: summaries of summaries, told their level and dates, asked for
/// who, what and when.
pub const DEFAULT_ROLLUP_TEMPLATE: &str = "Combine the summaries below into one level-{level} summary of a conversation that spans {date_range}. Say who did what and when: keep each person's name with what they said, did or plan, and keep the dates. Write short factual sentences; leave out greetings.\n\nSummaries, oldest first:\n{new_lines}\n\nCombined summary:";

/// Checks that every placeholder of `known` (written `{name}`) appears in `template` and no
/// other `{identifier}` does; other braces (JSON, say) are left alone.
pub(crate) fn check_placeholders(template: &str, known: &[&str]) -> Result<()> {
    for p in known {
        if !template.contains(p) {
            return Err(HarnessError::Config(format!(
                "the template lacks the placeholder {p}"
            )));
        }
    }
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let after = &rest[open..];
        let Some(close) = after.find('}') else { break };
        let name = &after[..=close];
        let is_ident = name[1..name.len() - 1]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if is_ident && name.len() > 2 && !known.contains(&name) {
            return Err(HarnessError::Config(format!(
                "unknown placeholder {name} in the template (known: {})",
                known.join(", ")
            )));
        }
        rest = &after[close + 1..];
    }
    Ok(())
}

/// A prompt template with `{previous_summary}` and `{new_lines}`, checked when built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptTemplate(String);

impl PromptTemplate {
    /// Checks that both placeholders appear and no other `{name}` does.
    pub fn new(template: impl Into<String>) -> Result<Self> {
        let t = template.into();
        check_placeholders(&t, &[PREVIOUS, NEW_LINES])?;
        Ok(Self(t))
    }

    /// Fills the placeholders.
    pub fn render(&self, previous: &str, new_lines: &str) -> String {
        self.0
            .replace(PREVIOUS, previous)
            .replace(NEW_LINES, new_lines)
    }
}

impl Default for PromptTemplate {
    fn default() -> Self {
        Self(DEFAULT_TEMPLATE.to_owned())
    }
}

/// The prompt for roll-ups (summaries of summaries), with `{level}`, `{date_range}` and
/// `{new_lines}`, checked when built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollupTemplate(String);

impl RollupTemplate {
    /// Checks that the three placeholders appear and no other `{name}` does.
    pub fn new(template: impl Into<String>) -> Result<Self> {
        let t = template.into();
        check_placeholders(&t, &[LEVEL, DATE_RANGE, NEW_LINES])?;
        Ok(Self(t))
    }

    /// Fills the placeholders.
    pub fn render(&self, level: u32, date_range: &str, new_lines: &str) -> String {
        self.0
            .replace(LEVEL, &level.to_string())
            .replace(DATE_RANGE, date_range)
            .replace(NEW_LINES, new_lines)
    }
}

impl Default for RollupTemplate {
    fn default() -> Self {
        Self(DEFAULT_ROLLUP_TEMPLATE.to_owned())
    }
}

/// Renders summaries for a roll-up prompt: one numbered block each, headed by its dates.
fn render_summaries(items: &[SummaryItem]) -> String {
    items
        .iter()
        .enumerate()
        .map(|(n, i)| {
            let start = i.time_start.unwrap_or(i.created_at);
            format!(
                "{}. ({} to {})\n{}",
                n + 1,
                start.format("%Y-%m-%d"),
                i.created_at.format("%Y-%m-%d"),
                i.content.trim()
            )
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// Renders items as `ROLE: text` lines; tool calls and tool results are marked.
pub fn render_transcript(items: &[SummaryItem]) -> String {
    items
        .iter()
        .map(|i| {
            let role = match (i.kind, i.role) {
                (MemoryKind::ToolLog, _) | (_, Some(Role::Tool)) => "TOOL RESULT".to_owned(),
                (MemoryKind::Summary, _) => "SUMMARY".to_owned(),
                (_, Some(r)) => r.as_str().to_uppercase(),
                (k, None) => k.as_str().to_uppercase(),
            };
            let who = i
                .speaker
                .as_ref()
                .map(|s| format!("{role} ({s})"))
                .unwrap_or(role);
            format!("{who}: {}", i.content.replace('\n', " "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Builder for [`OpenAiSummarizer`].
#[derive(Debug, Clone)]
pub struct OpenAiBuilder {
    base_url: String,
    model: String,
    api_key_env: Option<String>,
    template: PromptTemplate,
    rollup_template: RollupTemplate,
    max_tokens: u32,
    timeout: Duration,
    retries: u32,
    backoff: Duration,
    temperature: f32,
}

impl OpenAiBuilder {
    /// The environment variable holding the API key (default `OPENAI_API_KEY`; unset means
    /// no key, as local servers need none). The key is read once and never logged.
    pub fn api_key_env(mut self, var: impl Into<String>) -> Self {
        self.api_key_env = Some(var.into());
        self
    }

    /// The prompt template.
    pub fn template(mut self, t: PromptTemplate) -> Self {
        self.template = t;
        self
    }

    /// The roll-up prompt (for summaries of summaries).
    pub fn rollup_template(mut self, t: RollupTemplate) -> Self {
        self.rollup_template = t;
        self
    }

    /// Most tokens the model may answer with. Default 256.
    pub fn max_tokens(mut self, n: u32) -> Self {
        self.max_tokens = n;
        self
    }

    /// Per-attempt timeout. Default 60 s.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// Retries after the first attempt on connection errors, 429 and 5xx. Default 3.
    pub fn retries(mut self, n: u32) -> Self {
        self.retries = n;
        self
    }

    /// First backoff; doubles each retry, with up to 50% random jitter. Default 500 ms.
    pub fn backoff(mut self, d: Duration) -> Self {
        self.backoff = d;
        self
    }

    /// Sampling temperature. Default 0.2.
    pub fn temperature(mut self, t: f32) -> Self {
        self.temperature = t;
        self
    }

    /// Builds the client.
    pub fn build(self) -> Result<OpenAiSummarizer> {
        let base = self.base_url.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(HarnessError::Config(format!(
                "base URL {base:?} must start with http:// or https://"
            )));
        }
        if self.model.trim().is_empty() {
            return Err(HarnessError::Config("model name is empty".into()));
        }
        let var = self
            .api_key_env
            .clone()
            .unwrap_or_else(|| "OPENAI_API_KEY".into());
        let api_key = std::env::var(&var).ok().filter(|k| !k.is_empty());
        let url = if base.ends_with("/v1") {
            format!("{base}/chat/completions")
        } else {
            format!("{base}/v1/chat/completions")
        };
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(self.timeout))
            .http_status_as_error(false)
            .build()
            .into();
        Ok(OpenAiSummarizer {
            url,
            api_key,
            agent,
            settings: self,
        })
    }
}

/// Summaries from an OpenAI-compatible chat-completions server.
#[derive(Clone)]
pub struct OpenAiSummarizer {
    /// The configuration it was built from.
    settings: OpenAiBuilder,
    url: String,
    api_key: Option<String>,
    agent: ureq::Agent,
}

impl std::fmt::Debug for OpenAiSummarizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiSummarizer")
            .field("url", &self.url)
            .field("model", &self.settings.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.settings.timeout)
            .field("retries", &self.settings.retries)
            .finish_non_exhaustive()
    }
}

enum Attempt {
    Done(String),
    Retry(SummarizeError),
    Fail(SummarizeError),
}

impl OpenAiSummarizer {
    /// A builder for `base_url` (for example `http://127.0.0.1:8080`) and `model`.
    pub fn builder(base_url: impl Into<String>, model: impl Into<String>) -> OpenAiBuilder {
        OpenAiBuilder {
            base_url: base_url.into(),
            model: model.into(),
            api_key_env: None,
            template: PromptTemplate::default(),
            rollup_template: RollupTemplate::default(),
            max_tokens: 256,
            timeout: Duration::from_secs(60),
            retries: 3,
            backoff: Duration::from_millis(500),
            temperature: 0.2,
        }
    }

    /// The endpoint called.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn attempt(&self, body: &serde_json::Value) -> Attempt {
        let mut req = self.agent.post(&self.url);
        if let Some(k) = &self.api_key {
            req = req.header("Authorization", &format!("Bearer {k}"));
        }
        let mut resp = match req.send_json(body) {
            Ok(r) => r,
            Err(ureq::Error::Timeout(_)) => {
                return Attempt::Fail(SummarizeError::Timeout {
                    seconds: self.settings.timeout.as_secs_f64(),
                })
            }
            Err(e) => {
                return Attempt::Retry(SummarizeError::Connection {
                    url: self.url.clone(),
                    attempts: 1,
                    message: self.scrub(e.to_string()),
                })
            }
        };
        let status = resp.status().as_u16();
        if status != 200 {
            let text: String = resp
                .body_mut()
                .read_to_string()
                .unwrap_or_default()
                .chars()
                .take(300)
                .collect();
            // Servers echo a rejected key back ("Incorrect API key provided: sk-..."): it
            // must not travel on in errors and logs.
            let e = SummarizeError::Http {
                status,
                message: self.scrub(text),
            };
            return if status == 429 || status >= 500 {
                Attempt::Retry(e)
            } else {
                Attempt::Fail(e)
            };
        }
        let json: serde_json::Value = match resp.body_mut().read_json() {
            Ok(j) => j,
            Err(ureq::Error::Timeout(_)) => {
                return Attempt::Fail(SummarizeError::Timeout {
                    seconds: self.settings.timeout.as_secs_f64(),
                })
            }
            Err(e) => return Attempt::Fail(SummarizeError::Other(format!("bad response: {e}"))),
        };
        match json["choices"][0]["message"]["content"].as_str() {
            Some(s) if !s.trim().is_empty() => Attempt::Done(s.trim().to_owned()),
            Some(_) => Attempt::Fail(SummarizeError::EmptyOutput),
            None => Attempt::Fail(SummarizeError::Other(
                "the response has no choices[0].message.content".into(),
            )),
        }
    }

    /// `text` with the API key (when there is one) replaced by `[redacted]`.
    fn scrub(&self, text: String) -> String {
        match &self.api_key {
            Some(k) if !k.is_empty() && text.contains(k.as_str()) => {
                text.replace(k.as_str(), "[redacted]")
            }
            _ => text,
        }
    }

    /// The prompt sent for `request`: the roll-up prompt when every item is a summary and
    /// there is no previous summary to extend, else the progressive one.
    pub fn prompt(&self, request: &SummaryRequest) -> String {
        let rollup = request.previous.is_none()
            && !request.items.is_empty()
            && request.items.iter().all(|i| i.kind == MemoryKind::Summary);
        match request.time_range() {
            Some((start, end)) if rollup => self.settings.rollup_template.render(
                request.level.max(2),
                &format!("{} to {}", start.format("%Y-%m-%d"), end.format("%Y-%m-%d")),
                &render_summaries(&request.items),
            ),
            _ => self.settings.template.render(
                request.previous.as_deref().unwrap_or(""),
                &render_transcript(&request.items),
            ),
        }
    }

    /// The blocking call with retries.
    pub fn summarize_blocking(&self, request: &SummaryRequest) -> Result<String, SummarizeError> {
        if request.items.is_empty() {
            return Err(SummarizeError::NoInput);
        }
        let prompt = self.prompt(request);
        let max_tokens = u32::try_from(request.max_tokens)
            .unwrap_or(u32::MAX)
            .min(self.settings.max_tokens)
            .max(1);
        let body = serde_json::json!({
            "model": self.settings.model,
            "messages": [
                {"role": "system", "content": "You write concise, factual summaries of conversations."},
                {"role": "user", "content": prompt},
            ],
            "max_tokens": max_tokens,
            "temperature": self.settings.temperature,
            "stream": false,
        });
        let mut wait = self.settings.backoff;
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.attempt(&body) {
                Attempt::Done(s) => return Ok(s),
                Attempt::Fail(e) => return Err(e),
                Attempt::Retry(e) if attempts > self.settings.retries => {
                    return Err(match e {
                        SummarizeError::Connection { url, message, .. } => {
                            SummarizeError::Connection {
                                url,
                                attempts,
                                message,
                            }
                        }
                        other => other,
                    })
                }
                Attempt::Retry(e) => {
                    let jitter = rand::rng().random_range(0.0..0.5);
                    let pause = wait.mul_f64(1.0 + jitter);
                    tracing::debug!(attempt = attempts, error = %e, pause_ms = pause.as_millis(), "retrying the summarizer");
                    std::thread::sleep(pause);
                    wait = wait.saturating_mul(2);
                }
            }
        }
    }
}

#[async_trait]
impl Summarizer for OpenAiSummarizer {
    fn name(&self) -> &str {
        "openai"
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<String, SummarizeError> {
        // The HTTP call blocks: run it on the blocking pool with a cheap clone of the client.
        let me = self.clone();
        let request = request.clone();
        tokio::task::spawn_blocking(move || me.summarize_blocking(&request))
            .await
            .map_err(|e| SummarizeError::Other(e.to_string()))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_validated() {
        assert!(PromptTemplate::new("{previous_summary} {new_lines}").is_ok());
        assert!(PromptTemplate::new("{new_lines} only").is_err());
        assert!(PromptTemplate::new("{previous_summary} only").is_err());
        assert!(PromptTemplate::new("{previous_summary} {new_lines} {extra}").is_err());
        // JSON braces are not placeholders.
        assert!(PromptTemplate::new("{previous_summary} {new_lines} {\"a\": 1}").is_ok());
        let t = PromptTemplate::new("P={previous_summary};N={new_lines}").unwrap();
        assert_eq!(t.render("a", "b"), "P=a;N=b");
    }

    #[test]
    fn rollups_get_their_level_and_dates() {
        let s = OpenAiSummarizer::builder("http://127.0.0.1:1", "m")
            .build()
            .unwrap();
        let at = |d: u32| {
            chrono::NaiveDate::from_ymd_opt(2023, 5, d)
                .unwrap()
                .and_hms_opt(12, 0, 0)
                .unwrap()
                .and_utc()
        };
        let child = |d: u32, text: &str| SummaryItem {
            kind: MemoryKind::Summary,
            role: None,
            speaker: None,
            created_at: at(d + 1),
            time_start: Some(at(d)),
            content: text.into(),
        };
        let req = SummaryRequest {
            items: vec![
                child(8, "Caroline: I went to a support group."),
                child(20, "Melanie: I ran a charity race."),
            ],
            max_tokens: 100,
            level: 3,
            ..Default::default()
        };
        let p = s.prompt(&req);
        assert!(p.contains("level-3 summary"), "{p}");
        assert!(p.contains("spans 2023-05-08 to 2023-05-21"), "{p}");
        assert!(p.contains("who did what and when"), "{p}");
        assert!(
            p.contains("1. (2023-05-08 to 2023-05-09)\nCaroline: I went"),
            "{p}"
        );
        // Raw turns get the progressive prompt.
        let mut raw = req.clone();
        raw.items[0].kind = MemoryKind::Conversational;
        assert!(s.prompt(&raw).starts_with("Progressively summarize"));
        assert!(RollupTemplate::new("{level} {new_lines}").is_err());
        assert!(RollupTemplate::new("{level} {date_range} {new_lines}").is_ok());
    }

    #[test]
    fn key_is_redacted_in_debug() {
        let mut s = OpenAiSummarizer::builder("http://127.0.0.1:1", "m")
            .build()
            .unwrap();
        s.api_key = Some("sk-secret-123".into());
        let d = format!("{s:?}");
        assert!(!d.contains("sk-secret"), "{d}");
        assert!(OpenAiSummarizer::builder("ftp://x", "m").build().is_err());
    }
}
