//! Context options from outside (`cairn context --options JSON`, the eval's `--options`):
//! parsed and checked without a panic; options that pass the check hold values every
//! computation on them can use (shares in [0, 1], finite weights, a stretch gap chrono can
//! hold).
#![no_main]

use cairn_harness::ContextOptions;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(options) = serde_json::from_slice::<ContextOptions>(data) else {
        return;
    };
    if options.validate().is_ok() {
        assert!((0.0..=1.0).contains(&options.recent_share));
        assert!((0.0..=1.0).contains(&options.summary_share));
        let w = &options.weights;
        assert!([w.vector, w.neighbor, w.length, w.speaker, w.time, w.route]
            .iter()
            .all(|v| v.is_finite()));
        assert!(chrono::Duration::try_seconds(w.stretch_gap_secs).is_some());
        let text = serde_json::to_string(&options).expect("checked options serialize");
        let back: ContextOptions = serde_json::from_str(&text).expect("and parse back");
        assert_eq!(back, options);
    }
});
