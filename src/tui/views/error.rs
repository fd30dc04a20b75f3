//! A run that failed (`Failed(msg)`, or its source vanished) is drawn with
//! the message over its map, never a crash or a hang (trippy's `bsod.rs`).

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};
use ratatui::Frame;

use crate::tui::app::App;

pub fn render(frame: &mut Frame, area: Rect, app: &App, run: usize) {
    let Some(r) = app.runs.get(run) else { return };
    let Some(msg) = &r.failure else { return };
    let th = &app.theme;
    let h = 6.min(area.height);
    let box_area = Rect {
        x: area.x + 1,
        y: area.y + area.height.saturating_sub(h) / 2,
        width: area.width.saturating_sub(2),
        height: h,
    };
    frame.render_widget(Clear, box_area);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.fg(th.palette.error))
        .title(Span::styled(
            format!(" {} failed ", r.title),
            th.fg(th.palette.error),
        ))
        .title_bottom(Span::styled(" e: the message in full ", th.dim()));
    let lines = vec![
        Line::styled(super::one_line(msg), th.fg(th.palette.error)),
        Line::styled(
            format!(
                "{} events received; everything up to the failure can still be explored.",
                r.len()
            ),
            th.dim(),
        ),
    ];
    frame.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: true }).block(block),
        box_area,
    );
}
