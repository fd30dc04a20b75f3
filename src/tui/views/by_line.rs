//! The "by Python line" pane (`u`) under a run's map: the rows
//! `by_line::prepare` built, the selected one in reverse video.

use ratatui::layout::Rect;
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use ratatui::Frame;

use crate::tui::app::App;

/// Width of the bytes and blocks columns.
const BYTES_W: usize = 11;
const BLOCKS_W: usize = 7;

pub fn render(frame: &mut Frame, area: Rect, app: &App, run: usize) {
    let Some(r) = app.runs.get(run) else { return };
    let th = &app.theme;
    let f = &r.frame.by_line;
    let title = if f.title.chars().count() + 2 <= usize::from(area.width) {
        &f.title
    } else {
        &f.title_short
    };
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.border(app.active == run))
        .title(Span::styled(title.as_str(), th.title()))
        .title_bottom(Span::styled(f.footer.as_str(), th.dim()));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if f.empty {
        frame.render_widget(
            Paragraph::new(if f.since_step {
                "nothing born since the step began is live at this event"
            } else {
                "nothing is allocated at this event"
            })
            .style(th.dim()),
            inner,
        );
        return;
    }
    // The marker, then a space: a size as wide as its column ("1001.43 MiB")
    // never touches it.
    let site_w = usize::from(inner.width).saturating_sub(BYTES_W + BLOCKS_W + 4);
    let lines: Vec<Line> = f
        .rows
        .iter()
        .map(|row| {
            let mut style = if row.unknown { th.dim() } else { th.text() };
            if row.selected {
                style = style.add_modifier(Modifier::REVERSED);
            }
            Line::from(vec![
                Span::styled(if row.selected { "▶ " } else { "  " }, th.dim()),
                Span::styled(
                    format!(
                        "{:>BYTES_W$} {:>BLOCKS_W$} {}",
                        row.bytes,
                        row.blocks,
                        super::fit_site(&row.site, site_w)
                    ),
                    style,
                ),
            ])
        })
        .collect();
    frame.render_widget(Paragraph::new(lines), inner);
}
