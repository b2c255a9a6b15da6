//! LoCoMo import: any input gives a conversation of valid turns or a typed error.
#![no_main]

use cairn_core::ThreadId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(thread) = ThreadId::new("fuzz") else {
        return;
    };
    if let Ok(conv) = cairn_harness::import::parse_locomo(text, &thread) {
        for m in conv.turns {
            assert!(m.validate().is_ok(), "an accepted turn must be a valid memory");
        }
    }
    let _ = cairn_harness::import::parse_locomo_date(text);
});
