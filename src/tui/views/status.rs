//! The top status bar (playback, speed, cursor, iteration/phase, modes) and
//! the bottom key-hint bar.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use crate::alloc::format_size;
use crate::producers::LoadProgress;
use crate::tui::app::{App, ColorMode, RunView, SyncMode};
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
    let text = fit(parts(app, r), usize::from(area.width));
    frame.render_widget(
        Paragraph::new(Line::from(Span::styled(text, th.status()))).style(th.status()),
        area,
    );
}

/// One part of the status line; where the line is too narrow, the parts
/// with the lowest `keep` go first.
struct Part {
    text: String,
    keep: u8,
}

fn part(text: impl Into<String>, keep: u8) -> Part {
    Part {
        text: text.into(),
        keep,
    }
}

const SEP: &str = " │ ";
const HELP: &str = "? help";
const NAME: &str = "vramscope";

fn parts(app: &App, r: &RunView) -> Vec<Part> {
    let mut parts = vec![part(NAME, 2)];
    if let Some(c) = &app.context {
        parts.push(part(c.clone(), 9));
    }
    let play = if app.is_done() {
        "■ done".to_string()
    } else if app.held_at_narration() {
        format!("⏸ narration: space goes on · {}", app.rate_label())
    } else if app.playing {
        format!("▶ playing {}", app.rate_label())
    } else {
        format!("⏸ paused {}", app.rate_label())
    };
    parts.push(part(play, 9));
    if app.auto_pause {
        parts.push(part("auto-pause", 6));
    }
    // What was opened, or why not (until the next key): early, and cut
    // rather than left out, so even 80 columns show it.
    if let Some(notice) = &app.notice {
        parts.push(part(notice.clone(), 9));
    }
    if let Some(note) = &r.note {
        parts.push(part(note.clone(), 8));
    }
    // A what-if of a file with no trace replays nothing: its view is the
    // recorded state, which must not pass for the other config's.
    if let Some(under) = r.replayed_nothing_under() {
        parts.push(part(
            format!(
                "no trace: nothing replayed under {}, the recorded state",
                under.raw
            ),
            8,
        ));
    }
    if let Some(d) = r
        .devices
        .as_ref()
        .filter(|d| d.devices.len() > 1 || d.current != 0)
    {
        parts.push(part(d.label(), 7));
    }
    parts.push(part(progress(r), 8));
    if r.assumed_empty_start && r.loading.is_some() {
        parts.push(part(
            "until read: as if nothing was held before the trace",
            6,
        ));
    }
    if let Some(k) = r.frame.iteration {
        parts.push(part(
            format!(
                "iter {k}{}",
                r.frame.phase.map(|p| format!(" {p}")).unwrap_or_default()
            ),
            5,
        ));
    }
    parts.push(part(
        match app.color_mode {
            ColorMode::State => "colour: state",
            ColorMode::Category => "colour: category",
        },
        1,
    ));
    if app.runs.len() > 1 {
        parts.push(part(
            format!(
                "keys → {} · sync {}",
                r.title,
                match app.sync {
                    SyncMode::Fraction => "fraction",
                    SyncMode::Iteration => "iteration",
                }
            ),
            3,
        ));
    }
    parts.push(part(format!("theme {}", app.theme.name), 0));
    parts
}

/// Where the cursor is among the events, and how far the source has got:
/// `+` while it may send more, LIVE at its edge.
fn progress(r: &RunView) -> String {
    match (r.loading, r.expected_events) {
        (Some(LoadProgress::Reading { done, total }), _) => {
            let reading = if total > 0 {
                format!(
                    "reading {} of {} {}",
                    format_size(done),
                    format_size(total),
                    bar(done, total)
                )
            } else {
                format!("reading {}…", format_size(done))
            };
            if r.is_empty() {
                reading
            } else {
                // Events placed while the rest of the file is read.
                format!("event {}/{}+ · {reading}", r.pos, r.len())
            }
        }
        (None, Some(expected)) if r.len() < expected && r.is_live() => format!(
            "event {}/{} · placing {} of {} events {}",
            r.pos,
            r.len(),
            r.len(),
            expected,
            bar(r.len() as u64, expected as u64)
        ),
        _ => {
            let state = if r.failure.is_some() {
                " FAILED"
            } else if r.is_live() && r.pos >= r.len() {
                " LIVE"
            } else if r.is_live() {
                "+"
            } else if r.reads_file {
                // A large file takes seconds to place: say when it all is.
                " · all read"
            } else {
                ""
            };
            format!("event {}/{}{state}", r.pos, r.len())
        }
    }
}

/// The parts that fit in `width` columns, `? help` always last: the least
/// kept parts are left out first, then the rest is cut.
fn fit(mut parts: Vec<Part>, width: usize) -> String {
    let line = |parts: &[Part]| {
        let mut out = String::from(" ");
        for (i, p) in parts.iter().enumerate() {
            if i > 0 {
                out.push_str(if parts[i - 1].text == NAME { "  " } else { SEP });
            }
            out.push_str(&p.text);
        }
        out
    };
    let room = width.saturating_sub(SEP.chars().count() + HELP.chars().count());
    while line(&parts).chars().count() > room {
        let Some(least) = parts
            .iter()
            .enumerate()
            .filter(|(_, p)| p.keep < 9)
            .min_by_key(|(_, p)| p.keep)
            .map(|(i, _)| i)
        else {
            break;
        };
        parts.remove(least);
    }
    let text = super::fit_head(&line(&parts), room);
    format!("{text}{SEP}{HELP}")
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
    // Only a scenario narrates: a snapshot's hint line leaves `E` out.
    let narrated = app
        .runs
        .iter()
        .any(|r| r.conditions.is_some() || !r.marks.narration.is_empty());
    let global = if app.tabs.is_some() {
        "  │ w/W tab  T table  A diff  space play  ? help  q quit"
    } else if app.context.is_some() {
        // Opened from a lesson: q goes back to its part, not out.
        "  │ space play  Tab panel  E narration  ? help  q lesson"
    } else if narrated {
        "  │ space play  Tab panel  E narration  ? help  q quit"
    } else {
        "  │ space play  Tab panel  ? help  q quit"
    };
    let room = usize::from(area.width).saturating_sub(global.chars().count());
    let local = super::fit_head(
        &format!(" [{}] {}", app.focus.name(), input::hints(app.focus)),
        room,
    );
    let text = format!("{local:<room$}{global}");
    frame.render_widget(Paragraph::new(Span::styled(text, th.dim())), area);
}
