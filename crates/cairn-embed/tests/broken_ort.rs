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
