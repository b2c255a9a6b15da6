use thiserror::Error;

/// Bad input: each variant says what was wrong; nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum InputError {
    /// The content was empty or only whitespace.
    #[error("memory content is empty")]
    EmptyContent,
    /// The content was larger than the limit.
    #[error("memory content is {bytes} bytes, more than the {max}-byte limit")]
    ContentTooLarge {
        /// Size of the rejected content.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// A vector had the wrong number of dimensions.
    #[error("vector has {got} dimensions, expected {expected}")]
    DimensionMismatch {
        /// The store's dimension.
        expected: usize,
        /// The vector's length.
        got: usize,
    },
    /// A vector held NaN or an infinity.
    #[error("vector holds a NaN or infinite value at position {position}")]
    NonFiniteVector {
        /// Index of the first bad value.
        position: usize,
    },
    /// A vector was all zeros and cannot be normalised.
    #[error("vector is all zeros")]
    ZeroVector,
    /// A thread id was unacceptable.
    #[error("bad thread id {value:?}: {reason}")]
    BadThreadId {
        /// The rejected value (truncated).
        value: String,
        /// Why.
        reason: &'static str,
    },
    /// A memory id could not be parsed.
    #[error("{value:?} is not a memory id (expected a UUID)")]
    BadId {
        /// The rejected value (truncated).
        value: String,
    },
    /// An enum name was not recognised.
    #[error("unknown {what} {value:?}")]
    UnknownName {
        /// Which enum.
        what: &'static str,
        /// The rejected value (truncated).
        value: String,
    },
    /// Metadata nested too deeply.
    #[error("metadata is nested deeper than {max} levels")]
    MetadataTooDeep {
        /// The limit.
        max: usize,
    },
    /// A speaker's name was empty or only whitespace.
    #[error("speaker name is empty")]
    BlankSpeaker,
    /// A time range whose start is after its end.
    #[error("time range starts after it ends")]
    InvalidTimeRange,
    /// A metadata filter that cannot be run.
    #[error("bad metadata filter on {key:?}: {reason}")]
    BadMetadataFilter {
        /// The filtered key (truncated).
        key: String,
        /// Why.
        reason: &'static str,
    },
    /// A numeric parameter out of its range.
    #[error("{name} = {value} is out of range: {expected}")]
    OutOfRange {
        /// Parameter name.
        name: &'static str,
        /// The rejected value.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
}

/// An embedder failure.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum EmbedError {
    /// The input was unacceptable (empty text, for example).
    #[error(transparent)]
    Input(#[from] InputError),
    /// The model or its runtime could not be found or loaded.
    #[error("embedding model unavailable: {0}")]
    Unavailable(String),
    /// Inference failed.
    #[error("embedding failed: {0}")]
    Inference(String),
}

/// A summarizer failure. Callers keep every source when they get one.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SummarizeError {
    /// Nothing to summarize.
    #[error("nothing to summarize")]
    NoInput,
    /// The summarizer did not answer in time.
    #[error("summarizer timed out after {seconds:.1} s")]
    Timeout {
        /// The timeout that passed.
        seconds: f64,
    },
    /// The summarizer answered with nothing usable.
    #[error("summarizer returned an empty summary")]
    EmptyOutput,
    /// The summary came back far longer than asked (more than twice `budget` tokens): it
    /// would not compress anything, so it is not stored.
    #[error("summarizer returned {tokens} tokens, more than twice the budget of {budget}")]
    OverBudget {
        /// Tokens in the returned text.
        tokens: usize,
        /// The budget the request gave.
        budget: usize,
    },
    /// The service could not be reached (after retries).
    #[error("cannot reach the summarizer at {url} after {attempts} attempt(s): {message}")]
    Connection {
        /// Where it tried.
        url: String,
        /// How many attempts were made.
        attempts: u32,
        /// The last error.
        message: String,
    },
    /// The service answered with an error status.
    #[error("summarizer returned HTTP {status}: {message}")]
    Http {
        /// HTTP status code.
        status: u16,
        /// Body excerpt.
        message: String,
    },
    /// Anything else (a bad response, an embedder failure inside an extractive summarizer).
    #[error("summarizer failed: {0}")]
    Other(String),
}
