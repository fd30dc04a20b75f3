//! The code pane: the scenario's program as the PyTorch code it stands for,
//! the statement at the cursor marked `▶` and highlighted, scrolled so that
//! it stays in view, and the title saying where that step is written.

use ratatui::layout::Rect;
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use ratatui::Frame;

use crate::scenario::CodeLine;
use crate::tui::app::App;
use crate::tui::code::{GUTTER, INDENT};
use crate::tui::layout::{inner, LayoutMode};
use crate::units::escape_controls;

pub fn render(frame: &mut Frame, area: Rect, app: &App, run: usize) {
    let Some(r) = app.runs.get(run) else { return };
    let Some(listing) = &r.listing else { return };
    let th = &app.theme;
    let f = &r.frame.code;
    let title = match &f.location {
        Some(at) => format!(" code · {} ", super::fit_site(at, title_room(area))),
        None => " code ".to_string(),
    };
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.border(false))
        .title(Span::styled(title, th.title()));
    let rows = usize::from(inner(area).height);
    let width = usize::from(inner(area).width);
    let current: Vec<bool> = listing
        .lines
        .iter()
        .map(|l| f.step.is_some() && l.step == f.step)
        .collect();
    // A presenter's code, where it fits twice over, gets a blank row
    // between lines: easier to follow from the back of a room.
    let spaced = app.layout_mode == LayoutMode::Presenter && rows >= 2 * listing.lines.len();
    let step = if spaced { 2 } else { 1 };
    let first = scroll(&current, rows / step);
    // Reverse video shows without colour too (`NO_COLOR`, a projector).
    let lit = th.text().add_modifier(Modifier::REVERSED | Modifier::BOLD);
    let lines: Vec<Line> = listing
        .lines
        .iter()
        .zip(&current)
        .skip(first)
        .take(rows / step)
        .flat_map(|(l, &here)| {
            let text = super::fit_head(&code_text(l), width.saturating_sub(usize::from(GUTTER)));
            let line = if here {
                Line::from(vec![
                    Span::styled("▶ ", th.title()),
                    Span::styled(text, lit),
                ])
            } else if l.comment {
                Line::from(vec![Span::raw("  "), Span::styled(text, th.dim())])
            } else {
                Line::from(vec![Span::raw("  "), Span::styled(text, th.text())])
            };
            std::iter::once(line).chain(spaced.then(Line::default))
        })
        .collect();
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

fn title_room(area: Rect) -> usize {
    usize::from(area.width).saturating_sub(12)
}

fn code_text(l: &CodeLine) -> String {
    format!(
        "{}{}",
        " ".repeat(INDENT * usize::from(l.depth)),
        escape_controls(&l.text)
    )
}

/// The first line in view: the current line about a third down where the
/// listing does not fit.
fn scroll(current: &[bool], rows: usize) -> usize {
    let Some(at) = current.iter().position(|c| *c) else {
        return 0;
    };
    let last = current.iter().rposition(|c| *c).unwrap_or(at);
    let max = current.len().saturating_sub(rows);
    let want = if last - at < rows {
        at.saturating_sub(rows / 3)
    } else {
        at
    };
    want.min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_line_stays_in_view() {
        let mut current = vec![false; 30];
        current[25] = true;
        let first = scroll(&current, 10);
        assert!(first <= 25 && 25 < first + 10, "{first}");
        assert_eq!(scroll(&[false; 30], 10), 0);
        assert_eq!(crate::tui::views::fit_head("abcdef", 4), "abc…");
    }
}
