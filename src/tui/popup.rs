//! A scrollable popup over the screen: a block's stack, an event's details,
//! a message in full. Its content is taken when it opens (`details` builds
//! it), so playback behind it cannot change what it says; `prepare` wraps the
//! lines to the width there is, so no text is ever cut.

use std::sync::Arc;

use ratatui::layout::Rect;

use super::input::PopupAction;
use crate::trace::stack::{Stack, StackRow};

/// Widest a popup grows, in columns.
const MAX_WIDTH: u16 = 150;
/// Indent of a wrapped line's continuation rows.
const WRAP_INDENT: &str = "    ";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineStyle {
    Text,
    Dim,
    Heading,
    /// The first frame of the user's own code.
    UserFrame,
    Folded,
    Error,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PopupLine {
    pub text: String,
    pub style: LineStyle,
}

impl PopupLine {
    pub fn new(text: impl Into<String>, style: LineStyle) -> PopupLine {
        PopupLine {
            text: text.into(),
            style,
        }
    }
}

/// What a popup shows, and where it is scrolled to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Popup {
    pub title: String,
    /// Lines above the stack.
    pub head: Vec<PopupLine>,
    /// Frames, innermost first, when the popup shows a stack.
    pub stack: Option<Arc<Stack>>,
    /// Every frame shown, none folded.
    pub unfolded: bool,
    /// First row in view.
    pub scroll: usize,
    /// Bring the first user frame into view at the next `prepare`.
    reveal_user: bool,
    /// Rows in view at the last `prepare` (a page).
    page: usize,
    pub frame: PopupFrame,
}

/// The rows in view, wrapped, for the view to draw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PopupFrame {
    pub area: Rect,
    pub rows: Vec<PopupLine>,
    /// Rows in all, and the first one shown.
    pub total: usize,
    pub first: usize,
    pub footer: String,
}

impl Popup {
    pub fn new(title: impl Into<String>, head: Vec<PopupLine>, stack: Option<Arc<Stack>>) -> Popup {
        // A stack with no frame of the user's own would fold to nothing.
        let unfolded = stack.as_ref().is_some_and(|s| s.first_user.is_none());
        Popup {
            title: title.into(),
            head,
            stack,
            unfolded,
            scroll: 0,
            reveal_user: true,
            page: 1,
            frame: PopupFrame::default(),
        }
    }

    /// Every logical line: the head, then the stack's rows.
    pub fn lines(&self) -> Vec<PopupLine> {
        let mut out = self.head.clone();
        let Some(stack) = &self.stack else {
            return out;
        };
        for row in stack.rows(self.unfolded) {
            out.push(match row {
                StackRow::Frame(i) => {
                    let f = &stack.frames[i];
                    let style = if stack.first_user == Some(i) {
                        LineStyle::UserFrame
                    } else if f.kind == crate::trace::snapshot::FrameKind::User {
                        LineStyle::Text
                    } else {
                        LineStyle::Dim
                    };
                    let mark = if style == LineStyle::UserFrame {
                        "▶"
                    } else {
                        " "
                    };
                    PopupLine::new(
                        format!("{mark}{:>4}  {}", format!("#{i}"), f.location()),
                        style,
                    )
                }
                StackRow::Folded {
                    first,
                    count,
                    native,
                    torch,
                    interpreter,
                } => PopupLine::new(
                    format!(
                        "       {}  (#{first}–#{}; Enter unfolds)",
                        StackRow::folded_label(count, native, torch, interpreter),
                        first + count - 1
                    ),
                    LineStyle::Folded,
                ),
            });
        }
        out
    }

    pub fn key(&mut self, a: PopupAction) {
        let page = self.page.max(1) as isize;
        match a {
            PopupAction::Scroll(n) => self.scroll_by(n),
            PopupAction::Page(n) => self.scroll_by(n * page),
            PopupAction::Top => self.scroll = 0,
            PopupAction::Bottom => self.scroll = usize::MAX,
            PopupAction::ToggleFold => {
                if self.stack.is_some() {
                    self.unfolded = !self.unfolded;
                    self.reveal_user = true;
                }
            }
            PopupAction::Close | PopupAction::Quit => {}
        }
    }

    fn scroll_by(&mut self, n: isize) {
        self.scroll = self.scroll.min(self.frame.total).saturating_add_signed(n);
    }

    /// Lay the popup out over `screen`: wrap, size, clamp the scroll.
    pub fn prepare(&mut self, screen: Rect) {
        let w = screen.width.saturating_sub(4).min(MAX_WIDTH);
        let text_w = usize::from(w.saturating_sub(2)).max(8);
        let lines = self.lines();
        let mut rows: Vec<PopupLine> = Vec::new();
        let mut user_row = None;
        for l in &lines {
            if l.style == LineStyle::UserFrame && user_row.is_none() {
                user_row = Some(rows.len());
            }
            rows.extend(
                wrap(&l.text, text_w)
                    .into_iter()
                    .map(|t| PopupLine::new(t, l.style)),
            );
        }
        let h = (rows.len() as u16 + 2)
            .max(5)
            .min(screen.height.saturating_sub(2));
        let view = usize::from(h.saturating_sub(2)).max(1);
        self.page = view;
        let max_scroll = rows.len().saturating_sub(view);
        if std::mem::take(&mut self.reveal_user) {
            if let Some(u) = user_row.filter(|u| *u >= self.scroll + view || *u < self.scroll) {
                // A little context above the user's line.
                self.scroll = u.saturating_sub(view / 3);
            }
        }
        self.scroll = self.scroll.min(max_scroll);
        let total = rows.len();
        let shown = rows.into_iter().skip(self.scroll).take(view).collect();
        self.frame = PopupFrame {
            area: Rect {
                x: screen.x + screen.width.saturating_sub(w) / 2,
                y: screen.y + screen.height.saturating_sub(h) / 2,
                width: w,
                height: h,
            },
            rows: shown,
            total,
            first: self.scroll,
            footer: self.footer(total, view),
        };
    }

    fn footer(&self, total: usize, view: usize) -> String {
        let mut parts = Vec::new();
        if total > view {
            parts.push(format!(
                "rows {}–{} of {total} · j/k PgDn/PgUp scroll",
                self.scroll + 1,
                (self.scroll + view).min(total)
            ));
        }
        let foldable = self.stack.as_ref().is_some_and(|s| {
            s.rows(false)
                .iter()
                .any(|r| matches!(r, StackRow::Folded { .. }))
        });
        if foldable {
            parts.push(if self.unfolded {
                "Enter folds C++/PyTorch frames".to_string()
            } else {
                "Enter unfolds".to_string()
            });
        }
        parts.push("Esc closes".into());
        format!(" {} ", parts.join(" · "))
    }
}

/// `text` in rows of at most `width` characters; continuation rows are
/// indented. Counting characters, not cells: the rare wide character makes a
/// row a cell longer, and the view clips it.
pub(crate) fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(WRAP_INDENT.len() + 4);
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= width {
        return vec![text.to_string()];
    }
    let mut rows = Vec::new();
    let mut at = 0;
    let mut room = width;
    while at < chars.len() {
        let mut end = (at + room).min(chars.len());
        if end < chars.len() {
            // Break after a space or a path separator when one is near.
            if let Some(k) = (at + room / 2..end)
                .rev()
                .find(|&k| matches!(chars[k - 1], ' ' | '/' | '\\' | ','))
            {
                end = k;
            }
        }
        let piece: String = chars[at..end].iter().collect();
        rows.push(if rows.is_empty() {
            piece
        } else {
            format!("{WRAP_INDENT}{piece}")
        });
        at = end;
        room = width - WRAP_INDENT.len();
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::wrap;

    #[test]
    fn long_lines_wrap_whole() {
        let text = "/home/someone/a/very/long/path/to/the/model/file.py:123 in forward";
        let rows = wrap(text, 24);
        assert!(rows.len() > 2, "{rows:?}");
        assert!(rows.iter().all(|r| r.chars().count() <= 24), "{rows:?}");
        let back: String = rows
            .iter()
            .enumerate()
            .map(|(i, r)| if i == 0 { r.as_str() } else { &r[4..] })
            .collect();
        assert_eq!(back, text);
    }
}
