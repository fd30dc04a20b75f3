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
static LESSONS: &[BuiltInLesson] = lessons!["caching-allocator", "leaks", "efficient-training"];

pub fn builtin_lessons() -> &'static [BuiltInLesson] {
    LESSONS
}

pub fn builtin_lesson(name: &str) -> Option<&'static BuiltInLesson> {
    let name = name.strip_suffix(".ron").unwrap_or(name);
    LESSONS.iter().find(|b| b.name == name)
}
