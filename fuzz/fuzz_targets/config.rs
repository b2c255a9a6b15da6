//! Configuration text: prompt templates (placeholders checked) and thread names.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(t) = cairn_harness::PromptTemplate::new(text) {
        let _ = t.render("previous", "lines");
    }
    if let Ok(id) = cairn_core::ThreadId::new(text) {
        assert_eq!(id.as_str(), text);
    }
});
