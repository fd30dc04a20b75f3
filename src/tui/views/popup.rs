//! A popup (`b` stack, Enter on the log, `e` message) over everything: the
//! wrapped rows `Popup::prepare` laid out.

use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph};
use ratatui::Frame;

use crate::tui::app::App;
use crate::tui::popup::LineStyle;
use crate::tui::theme::Theme;

pub fn render(frame: &mut Frame, app: &App) {
    let Some(p) = &app.popup else { return };
    let th = &app.theme;
    let f = &p.frame;
    if f.area.width < 4 || f.area.height < 3 {
        return;
    }
    let lines: Vec<Line> = f
        .rows
        .iter()
        .map(|l| Line::styled(l.text.as_str(), style(th, l.style)))
        .collect();
    frame.render_widget(Clear, f.area);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.border(true))
        .title(Span::styled(p.title.as_str(), th.title()))
        .title_bottom(Span::styled(f.footer.as_str(), th.dim()));
    frame.render_widget(Paragraph::new(lines).style(th.text()).block(block), f.area);
}

/// The user's own frame stands out without colour too (reverse video).
pub fn style(th: &Theme, s: LineStyle) -> Style {
    let p = &th.palette;
    match s {
        LineStyle::Text => th.text(),
        LineStyle::Dim | LineStyle::Folded => th.dim(),
        LineStyle::Heading => th.title(),
        LineStyle::UserFrame => th
            .fg(p.highlight)
            .add_modifier(Modifier::BOLD | Modifier::REVERSED),
        LineStyle::Error => th.fg(p.error).add_modifier(Modifier::BOLD),
    }
}
