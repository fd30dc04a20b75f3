//! Reading a lesson: RON with line:column errors, then our checks (each
//! naming the file, and the field with its line:column where it can be
//! found), then every scenario the lesson names is loaded, so a lesson that
//! names a missing or broken scenario fails before it starts.

use std::path::{Path, PathBuf};

use ron::extensions::Extensions;
use ron::Options;

use super::format::Lesson;
use super::library::{builtin_lesson, lesson_scenario};
use super::LETTERS;
use crate::files::{read_bounded, BoundedReadError};
use crate::scenario::{builtin, load_named_file, load_str, Built, LoadError, Scenario};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LessonError {
    #[error("{file}: cannot read: {reason}")]
    Io { file: String, reason: String },
    #[error("{file}:{line}:{column}: {message}")]
    At {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{file}: {message}")]
    Field { file: String, message: String },
    #[error("{file}: {field}: {source}")]
    Scenario {
        file: String,
        field: String,
        source: LoadError,
    },
    #[error("no built-in lesson or file named \"{0}\" (see `vramscope lessons`)")]
    NotFound(String),
}

/// Far larger than a lesson a person writes.
const MAX_LESSON_BYTES: u64 = 4 << 20;
/// Parts a lesson may have: the built-in ones have 11 to 16; each part's
/// scenario is loaded to check the lesson, and run by `--headless` (1,200
/// parts took 18 s).
pub const MAX_PARTS: usize = 100;

/// A lesson, where it came from, and where its relative scenario paths start.
#[derive(Debug, Clone)]
pub struct LoadedLesson {
    pub lesson: Lesson,
    /// The file as errors name it (`scenarios/lessons/NAME.ron` for a built-in).
    pub file: String,
    /// The lesson file's folder; None for a built-in (built-in scenario names only).
    pub base: Option<PathBuf>,
}

impl LoadedLesson {
    /// A scenario the lesson names: a built-in, else a file beside the
    /// lesson (for a built-in lesson, one compiled in with it).
    pub fn scenario(&self, name: &str) -> Result<(Scenario, Built), LoadError> {
        if let Some(b) = builtin(name) {
            return load_str(b.source, &format!("scenarios/{}.ron", b.name));
        }
        if self.base.is_none() {
            if let Some(source) = lesson_scenario(name) {
                return load_str(source, &format!("scenarios/lessons/{name}"));
            }
        }
        match &self.base {
            // Anything there is read as a scenario or refused as what it is
            // (a directory, a named pipe), not reported missing.
            Some(dir) if std::fs::metadata(dir.join(name)).is_ok() => {
                load_named_file(&dir.join(name))
            }
            _ => Err(LoadError::NotFound(name.to_string())),
        }
    }
}

/// A built-in lesson by name, or a lesson file.
pub fn resolve_lesson(name_or_path: &str) -> Result<LoadedLesson, LessonError> {
    if let Some(b) = builtin_lesson(name_or_path) {
        return load_lesson_str(b.source, &format!("scenarios/lessons/{}.ron", b.name), None);
    }
    let path = Path::new(name_or_path);
    if path.exists() {
        load_lesson_file(path)
    } else {
        Err(LessonError::NotFound(name_or_path.to_string()))
    }
}

pub fn load_lesson_file(path: &Path) -> Result<LoadedLesson, LessonError> {
    let file = path.display().to_string();
    let io = |reason: String| LessonError::Io {
        file: file.clone(),
        reason,
    };
    let bytes = read_bounded(path, MAX_LESSON_BYTES).map_err(|e| match e {
        BoundedReadError::Io(e) => io(e.to_string()),
        BoundedReadError::TooLong => io(format!(
            "longer than {} MiB: not a lesson file",
            MAX_LESSON_BYTES >> 20
        )),
    })?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| io(format!("not UTF-8 text at byte {}", e.valid_up_to())))?;
    let base = path
        .parent()
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
        .map(Path::to_path_buf);
    load_lesson_str(text, &file, base)
}

/// Parse and validate `text`; `base` is where relative scenario files are
/// looked for (None: built-in scenarios only).
pub fn load_lesson_str(
    text: &str,
    file: &str,
    base: Option<PathBuf>,
) -> Result<LoadedLesson, LessonError> {
    let lesson: Lesson = Options::default()
        .with_default_extension(Extensions::IMPLICIT_SOME)
        .from_str(text)
        .map_err(|e| LessonError::At {
            file: file.to_string(),
            line: e.position.line,
            column: e.position.col,
            message: e.code.to_string(),
        })?;
    if let Some((field, occurrence, message)) = problem(&lesson) {
        return Err(match locate(text, field, occurrence) {
            Some((line, column)) => LessonError::At {
                file: file.to_string(),
                line,
                column,
                message,
            },
            None => LessonError::Field {
                file: file.to_string(),
                message,
            },
        });
    }
    let loaded = LoadedLesson {
        lesson,
        file: file.to_string(),
        base,
    };
    // Each scenario once, however many parts name it.
    let mut checked = std::collections::HashSet::new();
    for (i, part) in loaded.lesson.parts.iter().enumerate() {
        let names = std::iter::once(("scenario", part.scenario.as_str()))
            .chain(part.compare.iter().map(|c| ("compare", c.other())))
            .chain(
                part.says
                    .iter()
                    .flat_map(|s| s.1.others())
                    .map(|n| ("says", n)),
            );
        for (field, name) in names {
            if !checked.insert(name) {
                continue;
            }
            loaded
                .scenario(name)
                .map_err(|source| LessonError::Scenario {
                    file: file.to_string(),
                    field: format!("parts[{i}].{field}"),
                    source,
                })?;
        }
    }
    Ok(loaded)
}

/// The first thing wrong with a parsed lesson: the field's name, which of
/// its occurrences in the file it is, and the message.
fn problem(l: &Lesson) -> Option<(&'static str, usize, String)> {
    if l.name.trim().is_empty() {
        return Some(("name", 0, "name: must not be empty".into()));
    }
    if l.intro.is_empty() {
        return Some(("intro", 0, "intro: at least one paragraph".into()));
    }
    if l.parts.is_empty() {
        return Some(("parts", 0, "parts: at least one part".into()));
    }
    if l.parts.len() > MAX_PARTS {
        let m = format!(
            "parts: {} given; a lesson has at most {MAX_PARTS}",
            crate::units::format_count(l.parts.len() as u64)
        );
        return Some(("parts", 0, m));
    }
    for (i, p) in l.parts.iter().enumerate() {
        let at = |f: &str, m: String| format!("parts[{i}].{f}: {m}");
        if p.question.trim().is_empty() {
            return Some(("question", i, at("question", "must not be empty".into())));
        }
        if !(2..=LETTERS.len()).contains(&p.choices.len()) {
            let m = format!(
                "{} given; a question has 2 to 4 (keys a to d)",
                p.choices.len()
            );
            return Some(("choices", i, at("choices", m)));
        }
        let letters = &LETTERS[..p.choices.len()];
        if !letters.contains(&p.answer) {
            let last = letters[letters.len() - 1];
            let m = format!("'{}' is not one of the choices, 'a' to '{last}'", p.answer);
            return Some(("answer", i, at("answer", m)));
        }
        let phases = crate::trace::event::Phase::ALL.map(|ph| ph.name());
        for f in &p.figures {
            if let super::format::Figure::PeakIn(name) = f {
                if !phases.contains(&name.as_str()) {
                    let m = format!(
                        "PeakIn(\"{name}\"): a phase is one of {}",
                        phases.join(", ")
                    );
                    return Some(("figures", i, at("figures", m)));
                }
            }
        }
        if p.explanation.is_empty() {
            let m = "at least one paragraph: why the answer is right".to_string();
            return Some(("explanation", i, at("explanation", m)));
        }
    }
    None
}

/// Line and column (1-based) of the `occurrence`-th `field:` outside
/// strings and comments.
fn locate(text: &str, field: &str, occurrence: usize) -> Option<(usize, usize)> {
    let mut seen = 0;
    let (mut line, mut col) = (1, 1);
    let mut in_string = false;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if in_string {
            match c {
                '\\' => {
                    chars.next();
                    col += 1;
                }
                '"' => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
        } else if c == '/' && text[i..].starts_with("//") {
            while chars.peek().is_some_and(|(_, c)| *c != '\n') {
                chars.next();
            }
            continue;
        } else if text[i..].starts_with(field)
            && !text[..i].ends_with(|p: char| p.is_alphanumeric() || p == '_')
            && text[i + field.len()..].trim_start().starts_with(':')
        {
            if seen == occurrence {
                return Some((line, col));
            }
            seen += 1;
        }
        if c == '\n' {
            line += 1;
            col = 1;
        } else {
            col += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_skips_strings_and_comments() {
        let text = "// answer: no\n(q: \"answer: no\",\n  answer: 'a', answer: 'b')";
        assert_eq!(locate(text, "answer", 0), Some((3, 3)));
        assert_eq!(locate(text, "answer", 1), Some((3, 16)));
        assert_eq!(locate(text, "answer", 2), None);
    }
}
