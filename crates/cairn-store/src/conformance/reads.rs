//! Conformance checks of the reads the harness builds on: index-id searches and row reads,
//! timelines, thread reads, consolidation's scans and sequence numbers.

#[allow(unused_imports)]
use super::*;
