//! What is drawn when the terminal is smaller than the layout needs.

use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Wrap};
use ratatui::Frame;

use crate::tui::app::App;
use crate::tui::layout::{MIN_HEIGHT, MIN_WIDTH};

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let lines = vec![
        Line::styled("Terminal too small", th.title()),
        Line::styled(
            format!(
                "{}×{} here, needs {MIN_WIDTH}×{MIN_HEIGHT}",
                area.width, area.height
            ),
            th.text(),
        ),
        Line::styled("enlarge the window, or q to quit", th.dim()),
    ];
    frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: true }), area);
}
