//! JSONL import: any input parses to memories that pass validation, or to a typed error
//! naming a line; never a panic.
#![no_main]

use cairn_core::ThreadId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let thread = ThreadId::new("fuzz").ok();
    for t in [None, thread.as_ref()] {
        if let Ok(memories) = cairn_harness::import::parse_jsonl(text, t) {
            for m in memories {
                assert!(m.validate().is_ok(), "an accepted line must be a valid memory");
            }
        }
    }
});
