//! The GPU memory panel (`v`) over the bottom of the screen: the rows and
//! notes `GpuPanel::prepare` built.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};
use ratatui::Frame;

use crate::tui::app::App;

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let f = &app.gpu.frame;
    let w = area.width.saturating_sub(4).min(100);
    let mut lines: Vec<Line> = f
        .rows
        .iter()
        .map(|(k, v)| {
            Line::from(vec![
                Span::styled(format!("{k:>19}  "), th.dim()),
                Span::styled(v.as_str(), th.text()),
            ])
        })
        .collect();
    lines.extend(f.notes.iter().map(|n| Line::styled(n.as_str(), th.dim())));
    let paragraph = Paragraph::new(lines)
        .style(th.text())
        .wrap(Wrap { trim: false });
    // As tall as its text wraps to at this width (words do not break), up
    // to the screen.
    let want = paragraph.line_count(w.saturating_sub(2)) + 2;
    let h = u16::try_from(want)
        .unwrap_or(u16::MAX)
        .min(area.height.saturating_sub(2));
    let r = Rect {
        x: area.x + (area.width.saturating_sub(w)) / 2,
        y: area.y + area.height.saturating_sub(h + 1),
        width: w,
        height: h,
    };
    frame.render_widget(Clear, r);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.border(true))
        .title(Span::styled(f.title.as_str(), th.title()));
    frame.render_widget(paragraph.block(block), r);
}
