//! Where a lesson was left: the screen, each part's answer (a letter, or
//! revealed in a poll with no letter recorded), and the seed the letters
//! belong to. Kept per lesson as JSON under the user's state directory
//! (`$XDG_STATE_HOME/vramscope/lessons/NAME.json`, else
//! `~/.local/state/vramscope/lessons/NAME.json`), never in the repository,
//! so a teacher who quits at part 7 comes back to part 7.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One part's answer as the room gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    /// Not answered (or skipped).
    Open,
    /// The room's letter.
    Given(char),
    /// Shown in a poll: the answer was revealed, no letter is the room's.
    Revealed,
}

/// The screen a lesson was on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Place {
    Intro,
    Part(usize),
    Summary,
}

/// A lesson's saved place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// The lesson's name (the file's own, to refuse another lesson's file).
    pub lesson: String,
    /// The seed its choices were shuffled by: letters mean nothing under another.
    pub seed: u64,
    pub place: Place,
    pub answers: Vec<Answer>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProgressError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: not a saved lesson place: {msg}")]
    Parse {
        path: String,
        line: usize,
        column: usize,
        msg: String,
    },
    #[error("{path}: the saved place is lesson `{found}`'s, not `{wanted}`'s")]
    OtherLesson {
        path: String,
        found: String,
        wanted: String,
    },
}

/// The user's state directory for vramscope, from the environment; `None`
/// where neither `XDG_STATE_HOME` nor `HOME` (nor `LOCALAPPDATA`) is set.
pub fn state_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let base = var("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".local").join("state")))
        .or_else(|| var("LOCALAPPDATA").map(PathBuf::from))?;
    Some(base.join("vramscope"))
}

/// Where lesson `name`'s place is kept under `dir` (the name's characters
/// outside `[A-Za-z0-9_-]` become `_`, so a teacher's lesson name is a file name).
pub fn progress_path(dir: &Path, name: &str) -> PathBuf {
    let file: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join("lessons").join(format!("{file}.json"))
}

impl Progress {
    /// The place saved at `path` for lesson `name`: `Ok(None)` when nothing
    /// was saved there.
    pub fn load(path: &Path, name: &str) -> Result<Option<Progress>, ProgressError> {
        let shown = path.display().to_string();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(ProgressError::Io {
                    path: shown,
                    source,
                })
            }
        };
        let p: Progress = serde_json::from_str(&text).map_err(|e| ProgressError::Parse {
            path: shown.clone(),
            line: e.line(),
            column: e.column(),
            msg: e.to_string(),
        })?;
        if p.lesson != name {
            return Err(ProgressError::OtherLesson {
                path: shown,
                found: p.lesson,
                wanted: name.to_string(),
            });
        }
        Ok(Some(p))
    }

    /// Write to `path` whole or not at all: a temporary file beside it,
    /// renamed over it.
    pub fn save(&self, path: &Path) -> Result<(), ProgressError> {
        let io = |source| ProgressError::Io {
            path: path.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let text = serde_json::to_string_pretty(self).map_err(|e| io(std::io::Error::other(e)))?;
        let tmp = path.with_extension("json.tmp");
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(text.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// The answers for a lesson of `parts` parts shuffled by `seed`: the
    /// saved ones where the seed and the number of parts agree, none where
    /// they do not (a letter under another order is another choice).
    pub fn answers_for(&self, parts: usize, seed: u64) -> Option<Vec<Answer>> {
        (self.seed == seed && self.answers.len() == parts).then(|| self.answers.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::scratch::temp_dir;

    fn sample() -> Progress {
        Progress {
            lesson: "leaks".into(),
            seed: 7,
            place: Place::Part(6),
            answers: vec![Answer::Given('b'), Answer::Revealed, Answer::Open],
        }
    }

    #[test]
    fn a_saved_place_reads_back_and_nothing_saved_is_none() {
        let d = temp_dir("progress-roundtrip");
        let path = progress_path(&d, "leaks");
        assert_eq!(Progress::load(&path, "leaks").expect("reads"), None);
        sample().save(&path).expect("saves");
        assert_eq!(
            Progress::load(&path, "leaks").expect("reads"),
            Some(sample())
        );
        assert!(
            !path.with_extension("json.tmp").exists(),
            "no temporary left"
        );
    }

    #[test]
    fn a_mangled_or_foreign_file_is_an_error_naming_it() {
        let d = temp_dir("progress-bad");
        let path = progress_path(&d, "leaks");
        std::fs::create_dir_all(path.parent().expect("dir")).expect("dir");
        std::fs::write(&path, "{\n  \"lesson\": 3").expect("writes");
        let e = Progress::load(&path, "leaks")
            .expect_err("mangled")
            .to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains(":2:"),
            "{e}"
        );
        sample().save(&path).expect("saves");
        let e = Progress::load(&path, "training-peak")
            .expect_err("another lesson's")
            .to_string();
        assert!(e.contains("`leaks`"), "{e}");
    }

    #[test]
    fn letters_under_another_seed_are_dropped() {
        let p = sample();
        assert_eq!(p.answers_for(3, 7), Some(p.answers.clone()));
        assert_eq!(p.answers_for(3, 8), None);
        assert_eq!(p.answers_for(4, 7), None);
    }

    #[test]
    fn a_lesson_name_becomes_a_plain_file_name() {
        let p = progress_path(Path::new("/s"), "../my lesson");
        assert_eq!(p, Path::new("/s/lessons/___my_lesson.json"));
    }
}
