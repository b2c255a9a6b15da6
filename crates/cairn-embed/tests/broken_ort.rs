//! A broken ONNX Runtime path is a typed error, never a panic. Its own test binary: ONNX
//! Runtime is loaded once per process.

#![allow(clippy::unwrap_used)]

use cairn_core::EmbedError;
use cairn_embed::FastEmbedder;

#[test]
fn broken_ort_path_is_a_typed_error() {
    let err = FastEmbedder::builder()
        .ort_library("/nonexistent/libonnxruntime.so.1.32.0")
        .build()
        .unwrap_err();
    match err {
        EmbedError::Unavailable(msg) => {
            assert!(msg.contains("ONNX Runtime could not be loaded"), "{msg}")
        }
        other => panic!("{other:?}"),
    }
    let dir = tempfile::tempdir().unwrap();
    let not_a_lib = dir.path().join("libonnxruntime.so");
    std::fs::write(&not_a_lib, b"garbage").unwrap();
    let err = FastEmbedder::builder()
        .ort_library(&not_a_lib)
        .build()
        .unwrap_err();
    assert!(matches!(err, EmbedError::Unavailable(_)));
}

/// The provisioned library is checked against its pinned sha256 before it is loaded: a copy
/// with one byte appended (still a loadable ELF file) is refused, and the error names both
/// hashes. Skipped where the real library is not provisioned or has no pin.
#[test]
fn a_tampered_provisioned_library_is_refused() {
    use cairn_embed::provision::{self, ModelFiles, ProvisionError};
    let Some(expected) = provision::ort_sha256() else {
        eprintln!("skipping: no pinned ONNX Runtime hash on this platform");
        return;
    };
    let Some(real) = ModelFiles::find(&provision::default_cache_root()) else {
        eprintln!("skipping: the model is not provisioned");
        return;
    };
    // The real file passes.
    real.check_ort_library().unwrap();
    assert_eq!(provision::sha256_file(&real.ort_library).unwrap(), expected);

    // A copy of the bundle whose library gained one byte after provisioning.
    let root = tempfile::tempdir().unwrap();
    let bundle = root.path().join(real.dir.file_name().unwrap());
    std::fs::create_dir_all(&bundle).unwrap();
    for entry in std::fs::read_dir(&real.dir).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, bundle.join(p.file_name().unwrap())).unwrap();
    }
    let lib = bundle.join(provision::ORT_LIB);
    let mut bytes = std::fs::read(&lib).unwrap();
    bytes.push(0);
    std::fs::write(&lib, &bytes).unwrap();
    let found = provision::sha256_file(&lib).unwrap();

    let files = ModelFiles::find(root.path()).unwrap();
    match files.check_ort_library().unwrap_err() {
        ProvisionError::LibraryChecksum {
            path,
            expected: e,
            found: f,
        } => {
            assert_eq!(path, lib);
            assert_eq!(e, expected);
            assert_eq!(f, found);
        }
        other => panic!("{other:?}"),
    }
    if std::env::var_os(provision::ORT_DYLIB_ENV).is_some() {
        eprintln!("skipping the builder half: ORT_DYLIB_PATH names another library");
        return;
    }
    let err = FastEmbedder::builder()
        .cache_dir(root.path())
        .fetch(false)
        .build()
        .unwrap_err();
    match err {
        EmbedError::Unavailable(msg) => {
            assert!(msg.contains(expected) && msg.contains(&found), "{msg}");
            assert!(msg.contains("tampered"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
}
