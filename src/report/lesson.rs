//! A lesson as text, for a terminal-less `vramscope lesson`: the intro, each
//! question with its choices, the answer and explanation, the figures of the
//! part's run and its checks, and the summary.

use std::fmt::Write;

use serde::Serialize;

use crate::alloc::format_size;
use crate::lesson::{Lesson, PartVerdict, LETTERS};
use crate::scenario::ExpectationResult;

pub fn text(
    lesson: &Lesson,
    seed: u64,
    verdicts: &[PartVerdict],
    framing: &[ExpectationResult],
) -> String {
    let mut out = String::new();
    let minutes = lesson
        .minutes
        .map(|m| format!(" (about {m} minutes)"))
        .unwrap_or_default();
    let _ = writeln!(out, "lesson {}: {}{minutes}", lesson.name, lesson.title);
    let _ = writeln!(
        out,
        "choices in the order of seed {seed} (--seed {seed} shows this order again)\n"
    );
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
            "the run: {}{stop}; peak allocated {}, peak reserved {}",
            crate::units::counted(r.iterations_run, "iteration"),
            format_size(r.peak_allocated),
            format_size(r.peak_reserved)
        );
        for c in &verdict.checks {
            let mark = if c.passed { "ok" } else { "FAILED" };
            let _ = writeln!(out, "  [{mark}] {} — {}", c.expectation, c.observed);
        }
        let stated = verdict.prose.iter().filter(|c| c.passed).count();
        if stated > 0 {
            let _ = writeln!(
                out,
                "  [ok] {} the text states {} the run shows",
                crate::units::counted(stated as u32, "other size"),
                if stated == 1 { "is one" } else { "are ones" }
            );
        }
        for c in verdict.prose.iter().filter(|c| !c.passed) {
            let _ = writeln!(out, "  [FAILED] {} — {}", c.expectation, c.observed);
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(out, "── summary ──\n");
    paragraphs(&mut out, &lesson.summary, "");
    let stated = framing.iter().filter(|c| c.passed).count();
    if stated > 0 {
        let _ = writeln!(
            out,
            "[ok] {} the introduction and summary state {} the runs show",
            crate::units::counted(stated as u32, "size"),
            if stated == 1 { "is one" } else { "are ones" }
        );
    }
    for c in framing.iter().filter(|c| !c.passed) {
        let _ = writeln!(out, "[FAILED] {} — {}", c.expectation, c.observed);
    }
    out
}

fn paragraphs(out: &mut String, ps: &[String], indent: &str) {
    for p in ps {
        let _ = writeln!(out, "{indent}{p}\n");
    }
}

/// A lesson as JSON (`lesson --json`): what a workshop's own tooling needs
/// to check its lessons or print handouts.
#[derive(Debug, Serialize)]
pub struct LessonJson<'a> {
    pub name: &'a str,
    pub title: &'a str,
    pub minutes: Option<u32>,
    /// The seed the choices are shown in the order of (`--seed`).
    pub seed: u64,
    pub intro: &'a [String],
    pub parts: Vec<PartJson<'a>>,
    pub summary: &'a [String],
    /// The sizes the introduction and summary state, against the runs.
    pub framing: &'a [ExpectationResult],
    /// Every part's run shows its answer, and every size the text states.
    pub holds: bool,
}

#[derive(Debug, Serialize)]
pub struct PartJson<'a> {
    pub scenario: &'a str,
    pub question: &'a str,
    /// In the order shown (the seed's).
    pub choices: &'a [String],
    /// The right choice's letter in that order.
    pub answer: char,
    pub explanation: &'a [String],
    pub run: RunJson<'a>,
    pub checks: &'a [ExpectationResult],
    /// Every other size the part's text and its scenario's narration
    /// state, against what the run shows at that text's moment.
    pub prose: &'a [ExpectationResult],
    pub holds: bool,
}

/// The figures of a part's run the answer is checked against.
#[derive(Debug, Serialize)]
pub struct RunJson<'a> {
    pub iterations: u32,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// The iteration an OOM stopped the run in.
    pub oom_iteration: Option<u32>,
    /// Why the run stopped early otherwise.
    pub error: Option<&'a str>,
}

pub fn json<'a>(
    lesson: &'a Lesson,
    seed: u64,
    verdicts: &'a [PartVerdict],
    framing: &'a [ExpectationResult],
) -> LessonJson<'a> {
    let parts: Vec<PartJson> = lesson
        .parts
        .iter()
        .zip(verdicts)
        .map(|(part, v)| PartJson {
            scenario: &part.scenario,
            question: &part.question,
            choices: &part.choices,
            answer: part.answer,
            explanation: &part.explanation,
            run: RunJson {
                iterations: v.run.iterations_run,
                peak_allocated: v.run.peak_allocated,
                peak_reserved: v.run.peak_reserved,
                oom_iteration: v.run.oom.as_ref().map(|o| o.iteration),
                error: v.run.error.as_deref(),
            },
            checks: &v.checks,
            prose: &v.prose,
            holds: v.holds(),
        })
        .collect();
    LessonJson {
        name: &lesson.name,
        title: &lesson.title,
        minutes: lesson.minutes,
        seed,
        intro: &lesson.intro,
        holds: parts.iter().all(|p| p.holds) && framing.iter().all(|c| c.passed),
        parts,
        summary: &lesson.summary,
        framing,
    }
}
