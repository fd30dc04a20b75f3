//! A lesson on paper: `lesson NAME --handout` (the questions and their
//! choices, no answers) and `--answers` (the key), in Markdown, in the order
//! the lesson shows its choices under the same seed.

use std::fmt::Write;

use crate::lesson::{Lesson, LETTERS};

/// The line under the title: which lesson and which order, so a handout
/// and a key printed apart can be matched.
fn provenance(lesson: &Lesson, seed: u64) -> String {
    let minutes = lesson
        .minutes
        .map(|m| format!(", about {m} minutes"))
        .unwrap_or_default();
    format!(
        "Lesson `{}`, {} questions{minutes}; choices in the order of seed {seed} \
         (`vramscope lesson {} --seed {seed}`).",
        lesson.name,
        lesson.parts.len(),
        lesson.name
    )
}

/// The questions, each after its setup, with lettered choices.
pub fn questions(lesson: &Lesson, seed: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# {}\n", lesson.title);
    let _ = writeln!(out, "{}\n", provenance(lesson, seed));
    for p in &lesson.intro {
        let _ = writeln!(out, "{p}\n");
    }
    for (i, part) in lesson.parts.iter().enumerate() {
        let _ = writeln!(out, "## Question {}\n", i + 1);
        for p in &part.setup {
            let _ = writeln!(out, "{p}\n");
        }
        let _ = writeln!(out, "**{}**\n", part.question);
        for (letter, choice) in LETTERS.iter().zip(&part.choices) {
            let _ = writeln!(out, "- **{letter})** {choice}");
        }
        let _ = writeln!(out, "\nYour answer: ____\n");
    }
    out
}

/// Each question's right letter and choice, with the explanation.
pub fn answer_key(lesson: &Lesson, seed: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# {}: answer key\n", lesson.title);
    let _ = writeln!(out, "{}\n", provenance(lesson, seed));
    for (i, part) in lesson.parts.iter().enumerate() {
        let right = LETTERS
            .iter()
            .position(|l| *l == part.answer)
            .and_then(|at| part.choices.get(at))
            .map(String::as_str)
            .unwrap_or("");
        let _ = writeln!(out, "{}. **{})** {right}\n", i + 1, part.answer);
        for p in &part.explanation {
            let _ = writeln!(out, "   > {p}\n");
        }
    }
    out
}
