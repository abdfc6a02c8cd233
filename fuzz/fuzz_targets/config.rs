//! Fuzz target: arbitrary text as the configuration file. The property: a configuration
//! or an error naming the key, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = refusal_gate::config::Config::parse(text);
    }
});
