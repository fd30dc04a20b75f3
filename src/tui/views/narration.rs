//! The callout above a run's timeline: the latest narration at or before the
//! cursor, or an error marker the run reported (errors win). `e` (or a
//! click) opens it in full.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};
use ratatui::Frame;

use crate::tui::app::App;

pub fn render(frame: &mut Frame, area: Rect, app: &App, run: usize) {
    let Some(r) = app.runs.get(run) else { return };
    let th = &app.theme;
    let (label, text, color) = match (&r.frame.error_marker, &r.frame.narration) {
        (Some(e), _) => (" error ", e, th.palette.error),
        (None, Some(n)) => (" narration ", n, th.palette.narration),
        (None, None) => return,
    };
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.fg(color))
        .title(Span::styled(label, th.fg(color)))
        .title(Span::styled(" e: in full ", th.dim()).into_right_aligned_line());
    let p = Paragraph::new(Line::styled(super::one_line(text), th.fg(color)))
        .wrap(Wrap { trim: true })
        .block(block);
    frame.render_widget(p, area);
}
