//! The `?` overlay: every key binding, from `input::KEYS`.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph};
use ratatui::Frame;

use crate::tui::app::App;
use crate::tui::input::KEYS;

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let w = area.width.saturating_sub(4).min(96);
    let h = (KEYS.len() as u16 + 4).min(area.height.saturating_sub(2));
    let r = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height.saturating_sub(h)) / 2,
        width: w,
        height: h,
    };
    let mut lines: Vec<Line> = KEYS
        .iter()
        .map(|(k, d)| {
            Line::from(vec![
                Span::styled(format!("{k:>20}  "), th.title()),
                Span::styled(*d, th.text()),
            ])
        })
        .collect();
    lines.push(Line::styled(
        "                 ? or Esc closes this help",
        th.dim(),
    ));
    frame.render_widget(Clear, r);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.border(true))
        .title(Span::styled(" Keys ", th.title()));
    frame.render_widget(Paragraph::new(lines).style(th.text()).block(block), r);
}
