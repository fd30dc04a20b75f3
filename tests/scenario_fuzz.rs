//! Malformed scenario files never panic: every truncation and random byte
//! change of the built-in scenarios is either a valid scenario or an error
//! that names the file.

use proptest::prelude::*;
use vramscope::scenario::{builtins, load_str};

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn mangled_scenarios_are_errors_not_panics(which in 0usize..64, cut in 0.0f64..1.0, flips in prop::collection::vec((0.0f64..1.0, any::<u8>()), 0..4)) {
        let all = builtins();
        let source = all[which % all.len()].source.as_bytes();
        let mut bytes = source[..(source.len() as f64 * cut) as usize].to_vec();
        for (at, b) in flips {
            if !bytes.is_empty() {
                let i = ((bytes.len() - 1) as f64 * at) as usize;
                bytes[i] = b;
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        if let Err(e) = load_str(&text, "mangled.ron") {
            prop_assert!(e.to_string().contains("mangled.ron"), "{}", e);
        }
    }
}
