//! The narration callout above a run's timeline: what was said at the latest
//! narration moment at or before the cursor, word-wrapped in full. The layout
//! gives it the rows it needs where the screen has them; where it has not,
//! the last row ends in `…` and `e` (or a click) shows the rest, `E` every
//! narration so far.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Padding, Paragraph};
use ratatui::Frame;

use crate::tui::app::App;
use crate::tui::callout::{cut_with_ellipsis, narration_rows, BORDERS};
use crate::tui::layout::{LayoutMode, PRESENTER_PAD};

pub fn render(frame: &mut Frame, area: Rect, app: &App, run: usize) {
    let Some(r) = app.runs.get(run) else { return };
    if r.frame.narration.is_empty() {
        return;
    }
    let th = &app.theme;
    let color = th.palette.narration;
    // The presenter layout sized the box for its text with a margin.
    let pad = match app.layout_mode {
        LayoutMode::Presenter if app.runs.len() == 1 => PRESENTER_PAD,
        _ => 0,
    };
    let width = usize::from(area.width.saturating_sub(BORDERS + 2 * pad));
    let room = usize::from(area.height.saturating_sub(BORDERS));
    let mut rows = narration_rows(&r.frame.narration, width);
    let cut = rows.len() > room;
    if cut {
        rows.truncate(room);
        if let Some(last) = rows.last_mut() {
            cut_with_ellipsis(last, width);
        }
    }
    let hint = if cut {
        " more: e · all: E "
    } else {
        " E: all so far "
    };
    let block = Block::default()
        .borders(Borders::ALL)
        .padding(Padding::horizontal(pad))
        .border_style(th.fg(color))
        .title(Span::styled(" narration ", th.fg(color)))
        .title(Span::styled(hint, th.dim()).into_right_aligned_line());
    let lines: Vec<Line> = rows
        .into_iter()
        .map(|l| Line::styled(l, th.fg(color)))
        .collect();
    frame.render_widget(Paragraph::new(lines).block(block), area);
}
