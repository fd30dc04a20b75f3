//! The `?` overlay: every key binding, from `input::KEYS`, each description
//! wrapped to the width there is; j/k scroll it where the terminal is too
//! short to show them all.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph};
use ratatui::Frame;

use crate::tui::app::App;
use crate::tui::input::KEYS;
use crate::tui::popup::wrap;

/// Width of the key column, its two spaces included.
const KEY_W: usize = 22;
const TABLE_TERMS: &str = "free: inactive/reserved · frag: 1 − largest free block/inactive bytes";
const CLOSING: &str = "?, q or Esc closes this help";

fn rect(area: Rect) -> Rect {
    let w = area.width.saturating_sub(4).min(100);
    let h = (lines(w).len() as u16 + 2).min(area.height.saturating_sub(2));
    Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height.saturating_sub(h)) / 2,
        width: w,
        height: h,
    }
}

/// `(key, text)` rows for a box `w` wide: a binding's description wraps
/// under itself, the key only on its first row.
fn lines(w: u16) -> Vec<(&'static str, String)> {
    let text_w = usize::from(w.saturating_sub(2))
        .saturating_sub(KEY_W)
        .max(16);
    let mut out = Vec::new();
    for (k, d) in KEYS {
        for (i, row) in wrap(d, text_w).into_iter().enumerate() {
            out.push((if i == 0 { *k } else { "" }, row));
        }
    }
    // The table's own definitions (it shows them in full, and so does the JSON).
    for (i, row) in wrap(TABLE_TERMS, text_w).into_iter().enumerate() {
        out.push((if i == 0 { "T: free / frag" } else { "" }, row));
    }
    out.push(("", CLOSING.to_string()));
    out
}

/// The furthest the overlay scrolls on a screen of `area`.
pub fn max_scroll(area: Rect) -> usize {
    let r = rect(area);
    lines(r.width)
        .len()
        .saturating_sub(usize::from(r.height.saturating_sub(2)))
}

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let r = rect(area);
    let rows = lines(r.width);
    let total = rows.len();
    let text: Vec<Line> = rows
        .into_iter()
        .map(|(k, d)| {
            let style = if d == CLOSING { th.dim() } else { th.text() };
            Line::from(vec![
                Span::styled(format!("{k:>w$}  ", w = KEY_W - 2), th.title()),
                Span::styled(d, style),
            ])
        })
        .collect();
    let scroll = app.help_scroll.min(max_scroll(area));
    frame.render_widget(Clear, r);
    let mut block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.border(true))
        .title(Span::styled(" Keys ", th.title()));
    if max_scroll(area) > 0 {
        let shown = usize::from(r.height.saturating_sub(2));
        block = block.title_bottom(Span::styled(
            format!(
                " lines {}–{} of {total} · j/k PgDn/PgUp g/G scroll · q closes ",
                scroll + 1,
                (scroll + shown).min(total),
            ),
            th.dim(),
        ));
    }
    frame.render_widget(
        Paragraph::new(text)
            .style(th.text())
            .block(block)
            .scroll((scroll as u16, 0)),
        r,
    );
}
