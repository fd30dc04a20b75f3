//! A teacher's lesson files: their own scenario files run, an answer,
//! figure or prose the run does not show fails (a narration checked at its
//! own event), and bad, mangled or mistaken files are refused with the
//! file, the position or the field.

use super::*;

#[test]
fn a_teacher_s_lesson_file_runs_its_own_scenario_file() {
    let (code, out, err, _) = lesson_file("own", &LESSON.replace("SCENARIO", "ok.ron"));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("answer: ") && l.ends_with(") no")),
        "{out}"
    );
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
            "says",
            LESSON.replace("SCENARIO", "ok.ron").replace(
                "check: [NoOom],",
                "says: [Says(\"1 MiB\", Minus(PeakAllocated, Of(\"gone.ron\", PeakAllocated)))],",
            ),
            "lesson.ron: parts[0].says: no built-in scenario or file named \"gone.ron\"",
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
    let example = readme_example();
    let (code, out, err, _) = lesson_file("readme", &example);
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
/// A narration that states a result before its event fails where it is
/// said: caching-allocator part 4's "Reserved drops from 142 MiB to 122
/// MiB" at the start of the iteration (three events before empty_cache()
/// releases the segment) against the same text at `SegmentReleased`.
#[test]
fn a_narration_is_checked_at_its_own_event() {
    let shipped =
        std::fs::read_to_string(common::scenarios_dir().join("fragmentation-oom-empty-cache.ron"))
            .expect("the scenario");
    assert!(shipped.contains("(at: SegmentReleased, text: \"empty_cache() releases"));
    let early = shipped.replace("(at: SegmentReleased, text:", "(at: Iteration(1), text:");
    let lesson = LESSON
        .replace("SCENARIO", "scenario.ron")
        .replace("check: [NoOom],", "check: [Oom(Some(1))],");
    for (scenario, holds) in [(&shipped, true), (&early, false)] {
        let dir = temp_dir("narration-moment");
        std::fs::write(dir.join("scenario.ron"), scenario).expect("write");
        let path = dir.join("lesson.ron");
        std::fs::write(&path, &lesson).expect("write");
        let (code, out, err) = vramscope(&["lesson", &path.display().to_string()]);
        let failed = "[FAILED] \"122 MiB\" (the narration \"empty_cache() releases what is e…\")";
        if holds {
            assert_eq!(code, 0, "{out}{err}");
            assert!(!out.contains("FAILED"), "{out}");
        } else {
            assert_eq!(code, 1, "{out}{err}");
            assert!(out.contains(failed), "{out}");
        }
    }
}
/// Sizes in a part's text that its run does not show fail, each named with
/// where it is and the nearest figure the run has: a peak stated 1.38 MiB
/// off, a measurement in MB, a `says` that names the wrong figure. A wrong
/// choice states what is false on purpose and is not read.
#[test]
fn prose_that_states_a_wrong_figure_fails() {
    let text = LESSON
        .replace("SCENARIO", "checkpoint-reentrant-frozen-bug")
        .replace("check: [NoOom],", "check: [NoOom],\n            says: [Says(\"47 MiB\", PeakAllocated)],")
        .replace(
            "question: \"Does it run out of memory?\",",
            "setup: [\"Its peak is 627 MiB and it grows 2.9 MB a step.\"],\n            question: \"Does it run out of memory at 47 MiB?\",",
        )
        .replace(r#"["yes", "no"]"#, r#"["yes, at 12345 MiB", "no"]"#);
    let (code, out, _, _) = lesson_file("wrong-prose", &text);
    assert_eq!(code, 1, "{out}");
    for wanted in [
        "[FAILED] \"627 MiB\" (setup) is a figure of the run — nothing the run shows there rounds to it (nearest: peak allocated, 628.38 MiB)",
        "[FAILED] \"2.9 MB\" (setup) is a figure of the run — a measured figure in a decimal unit",
        "[FAILED] \"47 MiB\" is the peak allocated — 628.38 MiB",
    ] {
        assert!(out.contains(wanted), "{wanted} in\n{out}");
    }
    assert!(
        !out.lines()
            .any(|l| l.contains("FAILED") && l.contains("12345")),
        "a wrong choice is not read:\n{out}"
    );
    // The narration quotes checkpoint-reentrant-frozen-fixed's peak and
    // names it: that run's figures count.
    assert!(!out.contains("\"825 MiB\""), "{out}");
}
/// What caching-allocator part 5 says expandable segments do, checked on
/// the runs: with them, pages are mapped only at the segment's end and the
/// 8 MiB holes stay inside it; without them (fragmentation-oom-bug) no page
/// is mapped at all, and the same holes stay too.
#[test]
fn expandable_segments_grow_at_their_end_and_keep_their_holes() {
    let figures = "figures: [PagesOnlyAtSegmentEnds, HolesOver(\"39MiB\")],";
    let expandable = LESSON
        .replace("SCENARIO", "fragmentation-oom-expandable-fixed")
        .replace("check: [NoOom],", figures);
    let (code, out, _, _) = lesson_file("expandable", &expandable);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("[ok] pages mapped and unmapped only at a segment's end"),
        "{out}"
    );
    assert!(
        out.contains(
            "[ok] holes between live blocks at the end over 39.00 MiB — 5 holes of 40.00 MiB"
        ),
        "{out}"
    );
    let classic = LESSON
        .replace("SCENARIO", "fragmentation-oom-bug")
        .replace("check: [NoOom],", figures);
    let (code, out, _, _) = lesson_file("classic", &classic);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "[FAILED] pages mapped and unmapped only at a segment's end — 0 maps and 0 unmaps"
        ),
        "{out}"
    );
    assert!(out.contains("[ok] holes between live blocks"), "{out}");
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
