//! Conformance checks of the writes the harness builds on: content and metadata rewrites,
//! summary refreshes and growth, late sources, continuations, backup and restore.

#[allow(unused_imports)]
use super::*;
