//! The code pane's state: whether it is shown (`C`; by default in the
//! presenter layout, and where the terminal is [`CODE_AUTO_WIDTH`] wide),
//! the presenter layout (`L`),
//! and the per-frame data: the scenario step at the cursor, taken from the
//! last `Step` marker among the events applied, and where it is written.

use super::app::App;
use super::layout::{LayoutMode, Shape, CODE_AUTO_WIDTH};
use super::run_view::RunView;

/// Columns of indentation per block.
pub const INDENT: usize = 4;
/// The `▶ ` before each line.
pub const GUTTER: u16 = 2;

/// Whether the code pane is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CodeWish {
    /// In the presenter layout, and where the terminal is at least
    /// [`CODE_AUTO_WIDTH`] wide.
    #[default]
    Auto,
    On,
    Off,
}

impl CodeWish {
    fn wanted(self, width: u16, mode: LayoutMode) -> bool {
        match self {
            CodeWish::Auto => mode == LayoutMode::Presenter || width >= CODE_AUTO_WIDTH,
            CodeWish::On => true,
            CodeWish::Off => false,
        }
    }
}

/// What the code pane draws for one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CodeFrame {
    /// The step whose statement runs at the cursor.
    pub step: Option<u32>,
    /// Its `file:line:column` in the scenario.
    pub location: Option<String>,
}

/// The step at the cursor of `r` and where it is written.
pub fn prepare(r: &RunView) -> CodeFrame {
    let Some(listing) = &r.listing else {
        return CodeFrame::default();
    };
    let step = r.marks.step_at(r.pos);
    CodeFrame {
        step,
        location: step.and_then(|s| listing.location(s)),
    }
}

impl App {
    /// The layout asked for at `width` columns: the code pane for a single
    /// run with a program.
    pub fn shape(&self, width: u16) -> Shape {
        let listing = match self.runs.as_slice() {
            [r] => r.listing.as_ref(),
            _ => None,
        };
        let wanted = self.code.wanted(width, self.layout_mode);
        Shape {
            mode: self.layout_mode,
            code: listing.filter(|_| wanted).map(|l| {
                let w = l.width(INDENT) + usize::from(GUTTER) + 2;
                u16::try_from(w).unwrap_or(u16::MAX)
            }),
        }
    }

    /// `C`: show the code pane, or hide it.
    pub fn toggle_code(&mut self) {
        let shown = self.areas.runs.iter().any(|r| r.code.is_some());
        self.code = if shown { CodeWish::Off } else { CodeWish::On };
        let has_program = self.active_run().is_some_and(|r| r.listing.is_some());
        self.notice = match (has_program, self.runs.len()) {
            (false, _) => Some("code pane: a recorded trace has no program to show".into()),
            (true, n) if n > 1 => Some("code pane: not in compare".into()),
            _ => None,
        };
    }

    /// `L`: the presenter layout, or back to the normal one.
    pub fn toggle_layout(&mut self) {
        self.layout_mode = match self.layout_mode {
            LayoutMode::Normal => LayoutMode::Presenter,
            LayoutMode::Presenter => LayoutMode::Normal,
        };
    }
}
