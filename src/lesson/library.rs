//! The built-in lessons, compiled into the binary like the built-in scenarios.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuiltInLesson {
    pub name: &'static str,
    pub source: &'static str,
}

macro_rules! lessons {
    ($($name:literal),* $(,)?) => {
        &[$(BuiltInLesson { name: $name, source: include_str!(concat!("../../scenarios/lessons/", $name, ".ron")) }),*]
    };
}

/// In the order `vramscope lessons` lists them.
static LESSONS: &[BuiltInLesson] = lessons![
    "caching-allocator",
    "leaks",
    "training-peak",
    "efficient-training"
];

macro_rules! lesson_scenarios {
    ($($name:literal),* $(,)?) => {
        &[$((concat!("scenarios/", $name, ".ron"), include_str!(concat!("../../scenarios/lessons/scenarios/", $name, ".ron")))),*]
    };
}

/// Scenario files beside the built-in lessons (`scenarios/lessons/scenarios/`):
/// what a lesson runs that no built-in scenario does (a course's exercise as
/// its text writes it), named as a lesson file names them, relative to it.
static LESSON_SCENARIOS: &[(&str, &str)] =
    lesson_scenarios!["course-deep-mlp", "course-deep-mlp-checkpoint"];

/// A scenario file of the built-in lessons, by its path relative to them
/// (`scenarios/course-deep-mlp.ron`).
pub fn lesson_scenario(path: &str) -> Option<&'static str> {
    LESSON_SCENARIOS
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, source)| *source)
}

pub fn builtin_lessons() -> &'static [BuiltInLesson] {
    LESSONS
}

pub fn builtin_lesson(name: &str) -> Option<&'static BuiltInLesson> {
    let name = name.strip_suffix(".ron").unwrap_or(name);
    LESSONS.iter().find(|b| b.name == name)
}
