//! An allocation's call stack as the views read it: every frame the file
//! recorded, as text resolved once (a snapshot's own strings cannot cross
//! threads), which frame is the user's first line, and how the runs of
//! C++/PyTorch frames around it fold.

use std::sync::Arc;

use crate::trace::snapshot::{Frame, FrameKind};
use crate::units::escape_line;

/// Longest text kept of a frame's file or name. Real paths and names are far
/// shorter; a crafted file's 64 MB name costs one line, not the terminal.
const MAX_FIELD: usize = 4096;

/// Shortest run of non-user frames that folds into one line (a single frame
/// takes no more room than the line that would stand for it).
const MIN_FOLD: usize = 2;

/// One frame, escaped for the terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackFrame {
    pub file: Box<str>,
    pub line: i64,
    pub name: Box<str>,
    pub kind: FrameKind,
}

impl StackFrame {
    pub fn from_frame(f: &Frame) -> StackFrame {
        StackFrame {
            file: field(&f.filename),
            line: f.line,
            name: field(&f.name),
            kind: f.kind(),
        }
    }

    /// `file:line in name`, as the headless report names a call site.
    pub fn location(&self) -> String {
        format!("{}:{} in {}", self.file, self.line, self.name)
    }
}

fn field(text: &str) -> Box<str> {
    let escaped = escape_line(text);
    if escaped.len() <= MAX_FIELD {
        return escaped.into();
    }
    let mut end = MAX_FIELD;
    while !escaped.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &escaped[..end], text.len()).into()
}

/// The frames of one stack, innermost first (as PyTorch records them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stack {
    pub frames: Vec<Arc<StackFrame>>,
    /// Index of the first (innermost) frame of the user's own code.
    pub first_user: Option<usize>,
    /// That frame's [`StackFrame::location`]: the stack's call site.
    pub site: Option<Arc<str>>,
}

/// One line of a stack as shown: a frame, or a run of frames folded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackRow {
    Frame(usize),
    Folded {
        first: usize,
        count: usize,
        native: usize,
        torch: usize,
        interpreter: usize,
    },
}

impl StackRow {
    /// The words of a folded row: `… 14 C++/PyTorch frames`.
    pub fn folded_label(count: usize, native: usize, torch: usize, interpreter: usize) -> String {
        let kinds: Vec<&str> = [
            (native, "C++"),
            (torch, "PyTorch"),
            (interpreter, "interpreter"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(_, k)| *k)
        .collect();
        format!(
            "… {count} {} frame{}",
            kinds.join("/"),
            if count == 1 { "" } else { "s" }
        )
    }
}

impl Stack {
    pub fn new(frames: Vec<Arc<StackFrame>>) -> Stack {
        let first_user = frames.iter().position(|f| f.kind == FrameKind::User);
        let site = first_user.map(|i| Arc::from(frames[i].location()));
        Stack {
            frames,
            first_user,
            site,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// The rows to show: every frame when `unfolded`, otherwise each run of
    /// [`MIN_FOLD`] or more frames that are not the user's code as one row.
    pub fn rows(&self, unfolded: bool) -> Vec<StackRow> {
        let mut rows = Vec::new();
        let mut i = 0;
        while i < self.frames.len() {
            let run = self.frames[i..]
                .iter()
                .take_while(|f| f.kind != FrameKind::User)
                .count();
            if unfolded || run < MIN_FOLD {
                rows.extend((i..i + run.max(1)).map(StackRow::Frame));
                i += run.max(1);
                continue;
            }
            let of = |k: FrameKind| {
                self.frames[i..i + run]
                    .iter()
                    .filter(|f| f.kind == k)
                    .count()
            };
            rows.push(StackRow::Folded {
                first: i,
                count: run,
                native: of(FrameKind::Native),
                torch: of(FrameKind::Torch),
                interpreter: of(FrameKind::Interpreter),
            });
            i += run;
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(file: &str, line: i64, name: &str) -> Arc<StackFrame> {
        Arc::new(StackFrame::from_frame(&Frame {
            filename: file.into(),
            line,
            name: name.into(),
        }))
    }

    fn sample() -> Stack {
        Stack::new(vec![
            frame("??", 0, "torch::unwind::unwind()"),
            frame("", 0, "c10::cuda::CUDACachingAllocator::malloc"),
            frame(
                "/venv/site-packages/torch/nn/modules/linear.py",
                125,
                "forward",
            ),
            frame("/home/me/model.py", 42, "forward"),
            frame(
                "/venv/site-packages/torch/nn/modules/module.py",
                1736,
                "_call_impl",
            ),
            frame("/home/me/train.py", 7, "<module>"),
            frame("<frozen runpy>", 88, "_run_code"),
            frame("<frozen runpy>", 198, "_run_module_as_main"),
        ])
    }

    #[test]
    fn runs_of_other_frames_fold_and_the_user_frame_stands_out() {
        let s = sample();
        assert_eq!(s.first_user, Some(3));
        assert_eq!(s.site.as_deref(), Some("/home/me/model.py:42 in forward"));
        let rows = s.rows(false);
        assert_eq!(
            rows,
            vec![
                StackRow::Folded {
                    first: 0,
                    count: 3,
                    native: 2,
                    torch: 1,
                    interpreter: 0
                },
                StackRow::Frame(3),
                StackRow::Frame(4),
                StackRow::Frame(5),
                StackRow::Folded {
                    first: 6,
                    count: 2,
                    native: 0,
                    torch: 0,
                    interpreter: 2
                },
            ]
        );
        assert_eq!(s.rows(true).len(), s.frames.len());
        assert_eq!(StackRow::folded_label(3, 2, 1, 0), "… 3 C++/PyTorch frames");
    }

    #[test]
    fn a_huge_name_is_cut_and_controls_are_escaped() {
        let long = "x".repeat(1 << 20);
        let f = frame("\u{1b}]0;evil\u{7}.py", 1, &long);
        assert!(f.file.starts_with("\\u{1b}]0;evil"));
        assert!(f.name.len() < MAX_FIELD + 32, "{}", f.name.len());
        assert!(f.name.ends_with("… (1048576 bytes)"));
    }
}
