//! Metadata JSON from outside: parsed, checked (nesting depth) and round-tripped through
//! serialization without a panic or a change.
#![no_main]

use cairn_core::{check_metadata, Metadata};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(meta) = serde_json::from_slice::<Metadata>(data) else {
        return;
    };
    if check_metadata(&meta).is_ok() {
        let text = serde_json::to_string(&meta).expect("checked metadata serializes");
        let back: Metadata = serde_json::from_str(&text).expect("and parses back");
        assert_eq!(back, meta);
    }
});
