//! A scenario file: loaded and, when valid, run for two iterations.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope::scenario::{load_str, run, RunOptions};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok((scenario, built)) = load_str(text, "fuzz.ron") else {
        return;
    };
    let opts = RunOptions {
        iterations: Some(built.program.iterations.min(2)),
        record_events: false,
    };
    let _ = run(&scenario, &built, &opts);
});
