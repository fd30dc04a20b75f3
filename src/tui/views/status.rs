//! The top status bar (playback, speed, cursor, iteration/phase, modes) and
//! the bottom key-hint bar.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use crate::alloc::format_size;
use crate::producers::LoadProgress;
use crate::tui::app::{App, ColorMode, SyncMode};
use crate::tui::input;

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    if let Some(text) = &app.prompt {
        let line = format!(" open: {text}▏  (a built-in scenario, a .ron file or a snapshot; Enter opens, Esc cancels)");
        frame.render_widget(
            Paragraph::new(Line::from(Span::styled(line, th.status()))).style(th.status()),
            area,
        );
        return;
    }
    let Some(r) = app.active_run() else { return };
    let play = if app.playing {
        "▶ playing"
    } else {
        "⏸ paused"
    };
    let live = if r.is_live() && r.pos >= r.len() {
        " LIVE"
    } else if r.failure.is_some() {
        " FAILED"
    } else if r.finished {
        " done"
    } else {
        ""
    };
    let mut parts = vec![format!(" vramscope  {play} {:.0} ev/s", app.speed)];
    // What was opened, or why not: first, where even 80 columns show it.
    if let Some(notice) = &app.notice {
        parts.push(notice.clone());
    }
    if let Some(d) = r
        .devices
        .as_ref()
        .filter(|d| d.devices.len() > 1 || d.current != 0)
    {
        parts.push(d.label());
    }
    match (r.loading, r.expected_events) {
        (Some(LoadProgress::Reading { done, total }), _) => parts.push(if total > 0 {
            format!(
                "reading {} of {} {}",
                format_size(done),
                format_size(total),
                bar(done, total)
            )
        } else {
            format!("reading {}…", format_size(done))
        }),
        (None, Some(expected)) if r.len() < expected && r.is_live() => parts.push(format!(
            "event {}/{} · placing {} of {} events {}",
            r.pos,
            r.len(),
            r.len(),
            expected,
            bar(r.len() as u64, expected as u64)
        )),
        _ => parts.push(format!("event {}/{}{live}", r.pos, r.len())),
    }
    if let Some(k) = r.frame.iteration {
        parts.push(format!(
            "iter {k}{}",
            r.frame.phase.map(|p| format!(" {p}")).unwrap_or_default()
        ));
    }
    parts.push(match app.color_mode {
        ColorMode::State => "colour: state".into(),
        ColorMode::Category => "colour: category".into(),
    });
    if app.runs.len() > 1 {
        parts.push(format!(
            "keys → {} · sync {}",
            r.title,
            match app.sync {
                SyncMode::Fraction => "fraction",
                SyncMode::Iteration => "iteration",
            }
        ));
    }
    parts.push(format!("theme {}", app.theme.name));
    parts.push("? help".into());
    let text = parts.join(" │ ");
    frame.render_widget(
        Paragraph::new(Line::from(Span::styled(text, th.status()))).style(th.status()),
        area,
    );
}

/// `▕████▌    ▏ 56%`: `done` of `total` in ten cells.
fn bar(done: u64, total: u64) -> String {
    const CELLS: u64 = 10;
    let eighths =
        (done.min(total) as u128 * u128::from(CELLS) * 8 / u128::from(total.max(1))) as u64;
    let full = (eighths / 8) as usize;
    let part = ["", "▏", "▎", "▍", "▌", "▋", "▊", "▉"][(eighths % 8) as usize];
    let used = full + usize::from(!part.is_empty());
    format!(
        "▕{}{}{}▏ {}%",
        "█".repeat(full),
        part,
        " ".repeat(CELLS as usize - used.min(CELLS as usize)),
        done.min(total) * 100 / total.max(1)
    )
}

pub fn render_hints(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let text = format!(
        " [{}] {}  │ space play  h/l step  Tab panel  q quit",
        app.focus.name(),
        input::hints(app.focus)
    );
    frame.render_widget(Paragraph::new(Span::styled(text, th.dim())), area);
}
