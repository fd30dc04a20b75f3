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

/// The programs `capture.sh` runs when given none and that have been
/// captured: its `programs=(…)` list.
fn capture_sh_programs() -> Vec<String> {
    capture_sh_list("programs")
}

/// The programs written before a GPU was at hand: capture.sh's
/// `awaiting=(…)` list (it runs them too).
fn capture_sh_awaiting() -> Vec<String> {
    capture_sh_list("awaiting")
}

fn capture_sh_list(name: &str) -> Vec<String> {
    let path = here().join("fixtures/pytorch/capture.sh");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=(")))
        .unwrap_or_else(|| panic!("capture.sh: a {name}=(…) line"));
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
/// "checked as shipped against the capture …", and a test checks it), or
/// the program written for it that awaits a GPU (its report says so, and
/// claims no check).
#[test]
fn every_built_in_names_a_capture_that_exists() {
    let awaiting = capture_sh_awaiting();
    for b in vramscope::scenario::builtins() {
        let name = b.name;
        let (_, built) = resolve(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some(stem) = built.conditions.awaiting_capture.as_deref() {
            assert!(
                awaiting.iter().any(|a| a == stem),
                "{name} awaits {stem}, which capture.sh's awaiting=(…) does not list"
            );
            assert!(
                built.conditions.verification().contains("awaits a GPU run"),
                "{name}: {}",
                built.conditions.verification()
            );
            continue;
        }
        let stem = built
            .conditions
            .capture
            .as_deref()
            .unwrap_or_else(|| panic!("{name} names no capture (nor one it awaits)"));
        assert!(
            captured(stem, "json").exists(),
            "{name} names the capture {stem}, which is not in captured/"
        );
    }
}

/// A program that awaits a GPU is ready to run: it exists, names the
/// built-in it captures (the JSON records it, which the check compares),
/// is named by that built-in, and has no capture yet. Once `capture.sh`
/// has run it, this fails until it moves to `programs=(…)` with a test
/// and its built-in names the capture.
#[test]
fn programs_awaiting_a_gpu_are_ready_to_capture() {
    let programs = capture_sh_programs();
    let builtins: Vec<(String, vramscope::scenario::Built)> = vramscope::scenario::builtins()
        .iter()
        .map(|b| {
            let (s, built) = resolve(b.name).unwrap_or_else(|e| panic!("{}: {e}", b.name));
            (s.name, built)
        })
        .collect();
    for stem in capture_sh_awaiting() {
        assert!(
            !programs.contains(&stem),
            "{stem} is in both programs=(…) and awaiting=(…)"
        );
        let path = here().join(format!("fixtures/pytorch/{stem}.py"));
        let source =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (name, _) = builtins
            .iter()
            .find(|(_, b)| b.conditions.awaiting_capture.as_deref() == Some(stem.as_str()))
            .unwrap_or_else(|| panic!("{stem}: no built-in names it as awaiting_capture"));
        assert!(
            source.contains(&format!("\"{name}\"")),
            "{stem}.py does not name the scenario \"{name}\""
        );
        assert_eq!(
            name.replace('-', "_"),
            stem,
            "{stem}: named after its scenario"
        );
        for ext in ["pickle", "json"] {
            assert!(
                !captured(&stem, ext).exists(),
                "{stem}.{ext} is captured: move {stem} to programs=(…), check it in a test, and \
                 name it as the built-in's capture"
            );
        }
    }
}

/// Every scenario that names a capture: the built-ins and the test
/// scenarios beside the capture programs.
fn scenarios_with_captures() -> Vec<(
    String,
    vramscope::scenario::Scenario,
    vramscope::scenario::Built,
)> {
    let mut out = Vec::new();
    for b in vramscope::scenario::builtins() {
        let (s, built) = resolve(b.name).unwrap_or_else(|e| panic!("{}: {e}", b.name));
        out.push((b.name.to_string(), s, built));
    }
    for entry in std::fs::read_dir(here().join("fixtures/pytorch")).expect("fixtures/pytorch") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "ron") {
            let (s, built) = resolve(path.to_str().expect("utf-8"))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push((s.name.clone(), s, built));
        }
    }
    out.retain(|(_, _, built)| built.conditions.capture.is_some());
    out
}

/// The preset a scenario's model is, by name or as built.
fn preset_of(
    s: &vramscope::scenario::Scenario,
    built: &vramscope::scenario::Built,
) -> Option<&'static str> {
    use vramscope::engine::{ModelConfig, PRESET_CATALOGUE};
    if let vramscope::scenario::ModelSpec::Preset(name) = &s.model {
        return PRESET_CATALOGUE
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.name);
    }
    PRESET_CATALOGUE
        .iter()
        .find(|p| ModelConfig::preset(p.name).is_some_and(|m| m.kind == built.model.kind))
        .map(|p| p.name)
}

/// `vramscope model --list` and `run` tell one story: a preset that any
/// scenario with a capture runs is verified, naming a scenario on it, that
/// scenario's capture, and the conditions it states (so a preset matched
/// only with measured workspaces says so); a preset no such scenario runs
/// is "from source only".
#[test]
fn preset_evidence_agrees_with_the_scenarios_that_run_them() {
    use vramscope::engine::{Evidence, PRESET_CATALOGUE};
    let scenarios = scenarios_with_captures();
    for p in PRESET_CATALOGUE {
        let on_it: Vec<_> = scenarios
            .iter()
            .filter(|(_, s, built)| preset_of(s, built) == Some(p.name))
            .collect();
        match p.evidence {
            Evidence::SourceOnly => assert!(
                on_it.is_empty(),
                "{} says \"from source only\", but {:?} run it against a capture",
                p.name,
                on_it.iter().map(|(n, _, _)| n).collect::<Vec<_>>()
            ),
            Evidence::Hardware {
                capture,
                scenario,
                conditions,
            } => {
                let (_, _, built) =
                    on_it
                        .iter()
                        .find(|(n, _, _)| n == scenario)
                        .unwrap_or_else(|| {
                            panic!(
                                "{}: {scenario} is not a scenario on it with a capture",
                                p.name
                            )
                        });
                assert_eq!(
                    built.conditions.capture.as_deref(),
                    Some(capture),
                    "{}",
                    p.name
                );
                assert_eq!(
                    conditions.is_some(),
                    !built.conditions.stated_engine.is_empty(),
                    "{}: {scenario} states {:?}",
                    p.name,
                    built.conditions.stated_engine
                );
                // conditions are named only where no scenario on it does without
                let plain = on_it
                    .iter()
                    .find(|(_, _, b)| b.conditions.stated_engine.is_empty());
                assert!(
                    conditions.is_none() || plain.is_none(),
                    "{}: {:?} matches its capture with no stated conditions: name it instead",
                    p.name,
                    plain.map(|(n, _, _)| n)
                );
            }
        }
    }
}

/// `vramscope model --list` marks a preset "verified on hardware" by the
/// capture it names: that capture exists and a test checks it.
#[test]
fn presets_verified_on_hardware_name_a_checked_capture() {
    use vramscope::engine::{Evidence, PRESET_CATALOGUE};
    let tests = checked_stems();
    for p in PRESET_CATALOGUE {
        if let Evidence::Hardware { capture, .. } = p.evidence {
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
