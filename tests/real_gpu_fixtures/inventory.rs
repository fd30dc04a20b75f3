//! Every program `capture.sh` runs has its capture, and a test checks it:
//! a capture nobody compares would let the scenario it names claim a
//! verification that never ran (its report says "checked as shipped
//! against the capture …"). A program added before a GPU is at hand fails
//! here until it is captured and checked.

use std::path::{Path, PathBuf};

use vramscope::scenario::resolve;

use crate::harness::captured;

fn here() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// The programs `capture.sh` runs when given none: its `programs=(…)` list.
fn capture_sh_programs() -> Vec<String> {
    let path = here().join("fixtures/pytorch/capture.sh");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("programs=("))
        .expect("capture.sh: a programs=(…) line");
    line.trim_end()
        .trim_end_matches(')')
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// The stems passed to `check(…)` / `replay_checks(…)` in this suite's files.
fn checked_stems() -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(here().join("real_gpu_fixtures")).expect("the suite's folder") {
        let path = entry.expect("an entry").path();
        if path.file_name().is_some_and(|n| n != "inventory.rs") {
            text.push_str(&std::fs::read_to_string(&path).expect("a test file"));
        }
    }
    text
}

#[test]
fn every_program_is_captured_and_its_capture_checked() {
    let programs = capture_sh_programs();
    assert!(programs.len() > 50, "{} programs", programs.len());
    let tests = checked_stems();
    let mut missing = Vec::new();
    for stem in &programs {
        let source = here().join(format!("fixtures/pytorch/{stem}.py"));
        assert!(
            source.exists(),
            "capture.sh lists {stem}, which has no program"
        );
        for ext in ["pickle", "json"] {
            if !captured(stem, ext).exists() {
                missing.push(format!("{stem}.{ext} (run capture.sh {stem} on a GPU)"));
            }
        }
        if !tests.contains(&format!("\"{stem}\"")) {
            missing.push(format!("{stem}: captured, but no test checks it"));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// Every built-in names a capture this suite holds (so its report says
/// "checked as shipped against the capture …", and a test checks it).
#[test]
fn every_built_in_names_a_capture_that_exists() {
    for b in vramscope::scenario::builtins() {
        let name = b.name;
        let (_, built) = resolve(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let stem = built
            .conditions
            .capture
            .as_deref()
            .unwrap_or_else(|| panic!("{name} names no capture"));
        assert!(
            captured(stem, "json").exists(),
            "{name} names the capture {stem}, which is not in captured/"
        );
    }
}

/// `vramscope model --list` marks a preset "verified on hardware" by the
/// capture it names: that capture exists and a test checks it.
#[test]
fn presets_verified_on_hardware_name_a_checked_capture() {
    use vramscope::engine::{Evidence, PRESET_CATALOGUE};
    let tests = checked_stems();
    for p in PRESET_CATALOGUE {
        if let Evidence::Hardware { capture } = p.evidence {
            assert!(
                captured(capture, "json").exists(),
                "{}: {capture} is not in captured/",
                p.name
            );
            assert!(
                tests.contains(&format!("\"{capture}\"")),
                "{}: no test checks {capture}",
                p.name
            );
        }
    }
}
