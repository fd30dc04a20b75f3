//! A lesson as text, for a terminal-less `vramscope lesson`: the intro, each
//! question with its choices, the answer and explanation, the figures of the
//! part's run and its checks, and the summary.

use std::fmt::Write;

use crate::alloc::format_size;
use crate::lesson::{Lesson, PartVerdict, LETTERS};

pub fn text(lesson: &Lesson, verdicts: &[PartVerdict]) -> String {
    let mut out = String::new();
    let minutes = lesson
        .minutes
        .map(|m| format!(" (about {m} minutes)"))
        .unwrap_or_default();
    let _ = writeln!(out, "lesson {}: {}{minutes}\n", lesson.name, lesson.title);
    paragraphs(&mut out, &lesson.intro, "");
    for (i, (part, verdict)) in lesson.parts.iter().zip(verdicts).enumerate() {
        let _ = writeln!(
            out,
            "── part {} of {} · scenario {} ──\n",
            i + 1,
            lesson.parts.len(),
            part.scenario
        );
        paragraphs(&mut out, &part.setup, "");
        let _ = writeln!(out, "Q: {}", part.question);
        for (letter, choice) in LETTERS.iter().zip(&part.choices) {
            let _ = writeln!(out, "  {letter}) {choice}");
        }
        let answer = LETTERS
            .iter()
            .position(|l| *l == part.answer)
            .and_then(|i| part.choices.get(i))
            .map(String::as_str)
            .unwrap_or("");
        let _ = writeln!(out, "\nanswer: {}) {answer}\n", part.answer);
        paragraphs(&mut out, &part.explanation, "  ");
        let r = &verdict.run;
        let stop = match (&r.oom, &r.error) {
            (Some(o), _) => format!("; OOM in iteration {}", o.iteration),
            (None, Some(e)) => format!("; stopped: {e}"),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            out,
            "the run: {} iterations{stop}; peak allocated {}, peak reserved {}",
            r.iterations_run,
            format_size(r.peak_allocated),
            format_size(r.peak_reserved)
        );
        for c in &verdict.checks {
            let mark = if c.passed { "ok" } else { "FAILED" };
            let _ = writeln!(out, "  [{mark}] {} — {}", c.expectation, c.observed);
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(out, "── summary ──\n");
    paragraphs(&mut out, &lesson.summary, "");
    out
}

fn paragraphs(out: &mut String, ps: &[String], indent: &str) {
    for p in ps {
        let _ = writeln!(out, "{indent}{p}\n");
    }
}
