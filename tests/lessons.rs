//! Lessons: every built-in lesson's answers hold on its scenarios' runs (so a
//! lesson never teaches what its scenario does not show), `lessons` and a
//! headless `lesson` as a script sees them, and bad lesson files rejected
//! with the file, the position or the field.

mod common;

use common::{temp_dir, vramscope, VALID};
use vramscope::lesson::{builtin_lessons, resolve_lesson, verify, LETTERS};

const MIB: u64 = 1 << 20;

#[test]
fn every_built_in_lesson_is_true_to_its_runs() {
    assert!(builtin_lessons().len() >= 3);
    for b in builtin_lessons() {
        let loaded = resolve_lesson(b.name).unwrap_or_else(|e| panic!("{}: {e}", b.name));
        let verdicts = verify(&loaded).unwrap_or_else(|e| panic!("{}: {e}", b.name));
        for (i, (part, v)) in loaded.lesson.parts.iter().zip(&verdicts).enumerate() {
            assert!(
                !part.check.is_empty() || !part.compare.is_empty() || !part.figures.is_empty(),
                "{} part {i}: an answer nothing checks",
                b.name
            );
            for c in &v.checks {
                assert!(
                    c.passed,
                    "{} part {} ({}): the answer says {}, the run shows {}",
                    b.name,
                    i + 1,
                    part.scenario,
                    c.expectation,
                    c.observed
                );
            }
        }
    }
}

#[test]
fn built_in_lessons_are_workshop_sized_and_answers_are_not_one_letter() {
    for b in builtin_lessons() {
        let l = resolve_lesson(b.name).expect("loads").lesson;
        assert_eq!(l.name, b.name, "the name `lesson` takes is the file's");
        assert!(l.minutes.is_some_and(|m| m >= 40), "{}", b.name);
        assert!(l.parts.len() >= 8, "{}: {} parts", b.name, l.parts.len());
        // A learner who always presses the same key must not pass.
        let mut counts = [0usize; 4];
        for p in &l.parts {
            let i = LETTERS.iter().position(|c| *c == p.answer).expect("a–d");
            counts[i] += 1;
        }
        let most = counts.iter().max().copied().unwrap_or(0);
        assert!(
            most < l.parts.len(),
            "{}: every answer is the same letter",
            b.name
        );
    }
}

/// The figures the allocator lesson quotes, derived from the allocator's
/// rules rather than read off the run: 100 fp32 1000×1000 tensors take
/// 4,000,000 B blocks, five to a 20 MiB segment (20 segments); the 100 MB
/// tensor (1e8 B) gets its own segment rounded up to 2 MiB (96 MiB); the
/// model's small blocks take one 2 MiB segment.
#[test]
fn the_fragmentation_experiment_reserves_what_the_lesson_says() {
    let loaded = resolve_lesson("caching-allocator").expect("loads");
    let verdicts = verify(&loaded).expect("runs");
    let first = &verdicts[0].run;
    let big = 100_000_000u64.div_ceil(2 * MIB) * 2 * MIB;
    assert_eq!(big, 96 * MIB);
    assert_eq!(first.peak_reserved, 20 * 20 * MIB + big + 2 * MIB);
    // The fifth block of each segment keeps the segment's remainder
    // (20 MiB − 4 × 4,000,256 B, under 1 MiB more than it asked): the
    // hundred tensors fill the 20 segments, and the model's blocks add
    // less than 1 MiB.
    assert!((400 * MIB..401 * MIB).contains(&first.peak_allocated));
}

#[test]
fn lessons_lists_the_built_ins() {
    let (code, out, err) = vramscope(&["lessons"]);
    assert_eq!(code, 0, "{err}");
    for name in ["caching-allocator", "leaks", "efficient-training"] {
        assert!(
            out.lines().any(|l| l.starts_with(name)),
            "{name} missing:\n{out}"
        );
    }
    assert!(out.contains("45 min"), "{out}");
}

#[test]
fn a_lesson_without_a_terminal_prints_as_text() {
    let (code, out, err) = vramscope(&["lesson", "leaks"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("lesson leaks: "), "{out}");
    assert!(
        out.contains("── part 1 of 11 · scenario accumulate-loss-train-bug"),
        "{out}"
    );
    assert!(out.contains("\n  a) "), "choices are listed");
    assert!(out.contains("answer: c) "), "{out}");
    assert!(out.contains("the run: "), "{out}");
    assert!(out.contains("[ok] a leak rooted at `val_total`"), "{out}");
    assert!(!out.contains("FAILED"), "{out}");
    assert!(out.contains("── summary ──"), "{out}");
    let (code, again, _) = vramscope(&["lesson", "leaks", "--headless"]);
    assert_eq!((code, again), (0, out));
}

/// `lesson --json` carries each part's question and answer and the figures
/// of its run, the same figures `run --json` reports for that scenario.
#[test]
fn a_lesson_as_json_carries_each_part_s_run_and_checks() {
    let (code, out, err) = vramscope(&["lesson", "leaks", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["name"], "leaks");
    assert_eq!(v["holds"], true);
    let parts = v["parts"].as_array().expect("parts");
    assert_eq!(parts.len(), 11);
    let first = &parts[0];
    assert_eq!(first["scenario"], "accumulate-loss-train-bug");
    assert_eq!(first["answer"], "c");
    assert!(first["checks"].as_array().is_some_and(|c| !c.is_empty()));
    let (code, run, err) = vramscope(&["run", "accumulate-loss-train-bug", "--json"]);
    assert_eq!(code, 0, "{err}");
    let run: serde_json::Value = serde_json::from_str(&run).expect("run JSON");
    for key in ["peak_allocated", "peak_reserved"] {
        assert!(run[key].as_u64().is_some_and(|b| b > 0), "{key}: {run}");
        assert_eq!(first["run"][key], run[key], "{key}");
    }
    assert_eq!(first["run"]["iterations"], run["iterations_run"]);
}

#[test]
fn a_lesson_whose_run_does_not_show_its_answer_says_so_in_json() {
    let dir = temp_dir("json-wrong");
    let path = dir.join("lesson.ron");
    std::fs::write(&path, LESSON.replace("SCENARIO", "store-outputs-bug")).expect("write");
    let (code, out, _) = vramscope(&["lesson", &path.display().to_string(), "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["holds"], false);
    assert_eq!(v["parts"][0]["run"]["oom_iteration"], 52);
    assert_eq!(v["parts"][0]["checks"][0]["passed"], false);
}

const LESSON: &str = r#"Lesson(
    name: "mine",
    title: "A teacher's lesson",
    description: "one part",
    intro: ["Hello."],
    parts: [
        (
            scenario: "SCENARIO",
            question: "Does it run out of memory?",
            choices: ["yes", "no"],
            answer: 'b',
            explanation: ["It fits."],
            check: [NoOom],
        ),
    ],
    summary: ["Bye."],
)
"#;

/// Write `text` as `lesson.ron` (and the valid scenario as `ok.ron`) in a
/// fresh folder; `vramscope lesson` on it: (status, stdout, stderr, path).
fn lesson_file(tag: &str, text: &str) -> (i32, String, String, String) {
    let dir = temp_dir(tag);
    std::fs::write(dir.join("ok.ron"), VALID).expect("write scenario");
    let path = dir.join("lesson.ron");
    std::fs::write(&path, text).expect("write lesson");
    let path = path.display().to_string();
    let (code, out, err) = vramscope(&["lesson", &path]);
    (code, out, err, path)
}

#[test]
fn a_teacher_s_lesson_file_runs_its_own_scenario_file() {
    let (code, out, err, _) = lesson_file("own", &LESSON.replace("SCENARIO", "ok.ron"));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("answer: b) no"), "{out}");
    assert!(out.contains("[ok] no OOM"), "{out}");
}

#[test]
fn an_answer_the_run_does_not_show_fails() {
    // store-outputs-bug runs out of memory: `check: [NoOom]` is false there.
    let wrong = LESSON.replace("SCENARIO", "store-outputs-bug");
    let (code, out, _, _) = lesson_file("wrong", &wrong);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("[FAILED] no OOM — OOM in iteration 52"),
        "{out}"
    );
}

#[test]
fn bad_lesson_files_name_the_file_and_where() {
    let cases: &[(&str, String, &str)] = &[
        ("syntax", LESSON.replace("intro: [", "intro: (["), "lesson.ron:5:"),
        (
            "answer",
            LESSON.replace("SCENARIO", "ok.ron").replace("'b'", "'c'"),
            "lesson.ron:11:13: parts[0].answer: 'c' is not one of the choices, 'a' to 'b'",
        ),
        (
            "choices",
            LESSON.replace("SCENARIO", "ok.ron").replace(r#"["yes", "no"]"#, r#"["yes"]"#),
            "lesson.ron:10:13: parts[0].choices: 1 given; a question has 2 to 4",
        ),
        (
            "missing",
            LESSON.replace("SCENARIO", "no-such-scenario"),
            "lesson.ron: parts[0].scenario: no built-in scenario or file named \"no-such-scenario\"",
        ),
        (
            "compare",
            LESSON
                .replace("SCENARIO", "ok.ron")
                .replace("check: [NoOom],", "compare: [PeakReservedBelow(\"nope.ron\")],"),
            "lesson.ron: parts[0].compare: no built-in scenario or file named \"nope.ron\"",
        ),
        (
            "phase",
            LESSON
                .replace("SCENARIO", "ok.ron")
                .replace("check: [NoOom],", "figures: [PeakIn(\"fwd\")],"),
            "lesson.ron:13:13: parts[0].figures: PeakIn(\"fwd\"): a phase is one of setup, forward",
        ),
        (
            "field",
            LESSON.replace("SCENARIO", "ok.ron").replace("title:", "titel:"),
            "lesson.ron:3:10: Unexpected field named `titel`",
        ),
    ];
    for (tag, text, wanted) in cases {
        let (code, _, err, _) = lesson_file(tag, text);
        assert_eq!(code, 2, "{tag}: {err}");
        assert!(err.contains(wanted), "{tag}: wanted {wanted:?} in {err}");
    }
    let (code, _, err) = vramscope(&["lesson", "no-such-lesson"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no built-in lesson or file named \"no-such-lesson\""),
        "{err}"
    );
}

/// The example in scenarios/lessons/README.md loads and its answer holds.
#[test]
fn the_format_reference_example_is_a_working_lesson() {
    let readme = std::fs::read_to_string(common::scenarios_dir().join("lessons/README.md"))
        .expect("the format reference");
    let example = readme
        .split("```ron\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a ```ron block");
    let (code, out, err, _) = lesson_file("readme", example);
    assert_eq!(code, 0, "{err}{out}");
    assert!(
        out.contains("[ok] peak reserved above fragmentation-experiment-oom's"),
        "{out}"
    );
}

/// `figures:` fail where the run does not show them: the valid scenario's
/// device sets aside 100 MiB (`overhead: "100MiB"`), and allocated at its
/// iteration ends is far from 1 GiB.
#[test]
fn figures_the_run_does_not_show_fail() {
    let text = LESSON
        .replace("SCENARIO", "ok.ron")
        .replace("check: [NoOom],", "figures: [ContextOver(\"200MiB\"), ContextUnder(\"101MiB\"), BetweenStepsAllocatedOver(\"1GiB\"), PeakIn(\"forward\")],");
    let (code, out, _, _) = lesson_file("figures", &text);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("[FAILED] the context over 200.00 MiB — 100.00 MiB not the allocator's"),
        "{out}"
    );
    assert!(out.contains("[ok] the context under 101.00 MiB"), "{out}");
    // mlp-mnist (784·1024+1024 + 1024·1024+1024 + 1024·10+10 = 1,863,690
    // parameters, 7.1 MiB in fp32) at batch 256 saves a few MiB of
    // activations ([256, 1024] fp32 is 1 MiB), while AdamW's first step adds
    // 14.2 MiB of state and a parameter-sized foreach temporary: the peak is
    // not in forward.
    assert!(
        out.contains("[FAILED] the peak in the forward phase"),
        "{out}"
    );
    assert!(
        out.contains("[FAILED] allocated at every iteration end over 1024.00 MiB — allocated at iteration ends 47.28 MiB..47.28 MiB"),
        "{out}"
    );
}

/// A directory, a device or an empty file named as a lesson is bad input
/// naming the path, never a hang or a panic.
#[test]
fn a_lesson_path_that_is_not_a_lesson_file_is_refused() {
    let dir = temp_dir("notafile");
    let empty = dir.join("empty.ron");
    std::fs::write(&empty, "").expect("write");
    for (path, wanted) in [
        (
            dir.display().to_string(),
            "cannot read: not a regular file (a directory)",
        ),
        (
            "/dev/null".to_string(),
            "cannot read: not a regular file (a device)",
        ),
        (empty.display().to_string(), "empty.ron:1:1: "),
    ] {
        let (code, _, err) = vramscope(&["lesson", &path]);
        assert_eq!(code, 2, "{path}: {err}");
        assert!(err.contains(wanted), "{path}: wanted {wanted:?} in {err}");
    }
}

/// Every prefix of a built-in lesson, and the lesson with each line
/// dropped, loads or fails with an error; none panics.
#[test]
fn mangled_lessons_fail_cleanly() {
    use vramscope::lesson::load_lesson_str;
    let text = vramscope::lesson::builtin_lesson("leaks")
        .expect("built-in")
        .source;
    let mut cuts: Vec<usize> = (0..text.len()).step_by(97).collect();
    cuts.retain(|i| text.is_char_boundary(*i));
    for cut in cuts {
        let _ = load_lesson_str(&text[..cut], "cut.ron", None);
    }
    let lines: Vec<&str> = text.lines().collect();
    for skip in 0..lines.len() {
        let mangled: Vec<&str> = lines
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != skip)
            .map(|(_, l)| *l)
            .collect();
        let _ = load_lesson_str(&mangled.join("\n"), "mangled.ron", None);
    }
}
