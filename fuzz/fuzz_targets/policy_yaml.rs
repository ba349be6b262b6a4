//! Policy / settings / endpoint YAML (or JSON) → `fqdnd_config::load_str`.
//!
//! Invariant: never panics, whatever the text (the crate promises "Never panic, whatever the
//! input"); a successful load is deterministic.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Files are read as UTF-8 by `fqdnd_config::load`; anything else never reaches `load_str`.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = Path::new("fuzz.yaml");
    let first = fqdnd_config::load_str(text, file);
    if let Ok(config) = &first {
        let again = fqdnd_config::load_str(text, file);
        assert_eq!(
            again.as_ref().ok(),
            Some(config),
            "load_str is not deterministic"
        );
    }
});
