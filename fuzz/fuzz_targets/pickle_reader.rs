//! The pickle reader alone: any bytes decode to a document or an error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = vramscope::trace::pickle::decode(data);
});
