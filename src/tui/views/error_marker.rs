//! The error callout: an error the run reported at or before the cursor (an
//! OOM, a bad step), its first rows, below the narration and never in its
//! place. `e` (or a click) opens it in full.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use ratatui::Frame;

use crate::tui::app::App;
use crate::tui::callout::{error_rows, BORDERS, ERROR_ROWS};

pub fn render(frame: &mut Frame, area: Rect, app: &App, run: usize) {
    let Some(r) = app.runs.get(run) else { return };
    let Some(text) = &r.frame.error_marker else {
        return;
    };
    let th = &app.theme;
    let color = th.palette.error;
    let room = usize::from(area.height.saturating_sub(BORDERS)).min(ERROR_ROWS);
    let rows = error_rows(text, usize::from(area.width.saturating_sub(BORDERS)), room);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.fg(color))
        .title(Span::styled(" error ", th.fg(color)))
        .title(Span::styled(" e: in full ", th.dim()).into_right_aligned_line());
    let lines: Vec<Line> = rows
        .into_iter()
        .map(|l| Line::styled(l, th.fg(color)))
        .collect();
    frame.render_widget(Paragraph::new(lines).block(block), area);
}
