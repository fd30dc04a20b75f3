//! The Python helper (`python/vramscope_live`) is tested by its own unittest
//! suite against a stand-in torch (`python/tests`); this runs that suite so
//! `cargo test` fails when the helper does.

use std::path::Path;
use std::process::Command;

#[test]
fn python_helper_tests_pass() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let run = Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "python/tests", "-v"])
        .current_dir(root)
        .output();
    let out = match run {
        Ok(out) => out,
        Err(e) => panic!(
            "python3 could not be run ({e}): the live helper's tests (python/tests) need \
             python3 on PATH; install it to run them"
        ),
    };
    // unittest prints "OK (skipped=N)": a skipped test checked nothing, so it fails here
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("skipped"),
        "python/tests skipped tests (each says what it needs):\n{err}"
    );
    assert!(
        out.status.success(),
        "python/tests failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
