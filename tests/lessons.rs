//! Lessons: every built-in lesson's answers hold on its scenarios' runs (so a
//! lesson never teaches what its scenario does not show), `lessons` and a
//! headless `lesson` as a script sees them, and bad lesson files rejected
//! with the file, the position or the field. The shared helpers are here,
//! the tests by subject in tests/lessons/ (the built-ins, the CLI, a
//! teacher's files).

#[path = "lessons/built_ins.rs"]
mod built_ins;
#[path = "lessons/cli.rs"]
mod cli;
mod common;
#[path = "lessons/files.rs"]
mod files;

use common::{temp_dir, vramscope, VALID};
use vramscope::lesson::{
    builtin_lessons, default_seed, load_lesson_str, resolve_lesson, shuffled, verify,
    verify_framing, Lesson, LETTERS,
};

const MIB: u64 = 1 << 20;

/// Every lesson a room sees: the built-ins and the README's example.
fn every_lesson() -> Vec<Lesson> {
    let mut out: Vec<Lesson> = builtin_lessons()
        .iter()
        .map(|b| resolve_lesson(b.name).expect("loads").lesson)
        .collect();
    let example = load_lesson_str(&readme_example(), "README.md", None).expect("the example loads");
    out.push(example.lesson);
    out
}

fn right_choice(p: &vramscope::lesson::Part) -> usize {
    LETTERS.iter().position(|c| *c == p.answer).expect("a–d")
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

/// The lesson example of scenarios/lessons/README.md (its first ```ron block).
fn readme_example() -> String {
    let readme = std::fs::read_to_string(common::scenarios_dir().join("lessons/README.md"))
        .expect("the format reference");
    readme
        .split("```ron\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a ```ron block")
        .to_string()
}
