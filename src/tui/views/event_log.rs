//! The events around the cursor, one line each.

use crate::alloc::{format_size, Action, AllocEvent};
use crate::scenario::Listing;
use crate::trace::{Event, Marker};
use crate::units::escape_controls;
use ratatui::layout::Rect;
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use ratatui::Frame;

use crate::tui::app::{App, RunView};
use crate::tui::layout::Focus;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogKind {
    Alloc,
    Free,
    Segment,
    Oom,
    Marker,
    Narration,
    Error,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub index: usize,
    pub text: String,
    pub kind: LogKind,
    pub cursor: bool,
    /// The line Enter opens (marked while the log has focus).
    pub selected: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogFrame {
    pub lines: Vec<LogLine>,
}

pub fn prepare(r: &RunView, height: usize) -> LogFrame {
    if height == 0 || r.is_empty() {
        return LogFrame::default();
    }
    let cursor = r.cursor();
    let selected = r.log_selected();
    let centre = cursor.unwrap_or(0) as isize + r.log_offset;
    let len = r.len() as isize;
    let start = (centre - height as isize / 2).clamp(0, (len - height as isize).max(0)) as usize;
    let lines = r
        .timeline
        .events()
        .range(start..start + height)
        .enumerate()
        .map(|(k, e)| {
            let index = start + k;
            let (text, kind) = match (&e, &r.listing) {
                (Event::Marker(Marker::Step(n)), Some(l)) => (step_line(l, *n), LogKind::Marker),
                _ => describe(&e),
            };
            LogLine {
                index,
                text,
                kind,
                cursor: Some(index) == cursor,
                selected: Some(index) == selected,
            }
        })
        .collect();
    LogFrame { lines }
}

/// A step marker with the statement it stands for.
fn step_line(listing: &Listing, step: u32) -> String {
    match listing.line_of(step).and_then(|i| listing.lines.get(i)) {
        Some(l) => format!("step {step}: {}", escape_controls(&l.text)),
        None => format!("step {step}"),
    }
}

fn alloc_line(a: &AllocEvent) -> (String, LogKind) {
    let kind = match a.action {
        Action::Alloc => LogKind::Alloc,
        Action::FreeRequested | Action::FreeCompleted => LogKind::Free,
        Action::Oom => LogKind::Oom,
        _ => LogKind::Segment,
    };
    let text = match a.action {
        Action::Oom => format!(
            "oom            {:>12}  device free {}",
            format_size(a.size),
            format_size(a.device_free)
        ),
        // The address in the column the other actions' take; the block's
        // size after it where rounding made it larger than the request.
        Action::Alloc => {
            let line = format!(
                "{:<14} {:>12}  {}  {:#x}",
                a.action.name(),
                format_size(a.size),
                a.pool.name(),
                a.addr,
            );
            if a.block_size == a.size {
                line
            } else {
                format!("{line}  block {}", format_size(a.block_size))
            }
        }
        _ => format!(
            "{:<14} {:>12}  {}  {:#x}",
            a.action.name(),
            format_size(a.size),
            a.pool.name(),
            a.addr
        ),
    };
    (text, kind)
}

pub fn describe(e: &Event) -> (String, LogKind) {
    match e {
        Event::Alloc(a) => alloc_line(a),
        Event::Marker(m) => match m {
            Marker::IterationBegin(k) => (format!("── iteration {k} begins"), LogKind::Marker),
            Marker::IterationEnd(k) => (format!("── iteration {k} ends"), LogKind::Marker),
            Marker::PhaseBegin(p) => (format!("─ {} begins", p.name()), LogKind::Marker),
            Marker::PhaseEnd(p) => (format!("─ {} ends", p.name()), LogKind::Marker),
            Marker::OpBegin { name, module } => (format!("op {name} ({module})"), LogKind::Marker),
            Marker::OpEnd => ("op end".to_string(), LogKind::Marker),
            Marker::Step(k) => (format!("step {k}"), LogKind::Marker),
            Marker::Narration(t) => (format!("» {}", super::one_line(t)), LogKind::Narration),
            Marker::Annotation { name, start } => (
                format!("{} {name}", if *start { "▶" } else { "◀" }),
                LogKind::Marker,
            ),
            Marker::EmptyCache => ("empty_cache()".to_string(), LogKind::Marker),
            Marker::Error(t) => (format!("error: {}", super::one_line(t)), LogKind::Error),
        },
    }
}

/// A line in `room` characters: as laid out (in columns) where it fits or
/// where a cut (`…`) leaves its address whole, else with the columns'
/// padding closed up, then cut.
fn fit_columns(text: &str, room: usize) -> String {
    let address_end = |t: &str| {
        t.find(" 0x").map(|at| {
            let end = t[at + 1..].find(' ').map_or(t.len(), |n| at + 1 + n);
            t[..end].chars().count()
        })
    };
    if text.chars().count() <= room || address_end(text).is_some_and(|e| e < room) {
        return super::fit_head(text, room);
    }
    let close: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    super::fit_head(&close, room)
}

/// The mark and the event's index before each line's text.
const INDEX_WIDTH: usize = 10;

pub fn render(frame: &mut Frame, area: Rect, app: &App, run: usize) {
    let Some(r) = app.runs.get(run) else { return };
    let th = &app.theme;
    let p = &th.palette;
    let focused = app.focus == Focus::Log;
    // A line cut by the border says so (`…`): a cut address would read as
    // another one.
    let room = usize::from(area.width.saturating_sub(2)).saturating_sub(INDEX_WIDTH);
    let lines: Vec<Line> = r
        .frame
        .log
        .lines
        .iter()
        .map(|l| {
            let color = match l.kind {
                LogKind::Alloc => p.allocated,
                LogKind::Free => p.fg,
                LogKind::Segment => p.reserved_line,
                LogKind::Oom | LogKind::Error => p.error,
                LogKind::Marker => p.dim,
                LogKind::Narration => p.narration,
            };
            let mut style = th.fg(color);
            if l.cursor {
                style = style.add_modifier(Modifier::REVERSED);
            }
            let selected = focused && l.selected;
            if selected {
                style = style.add_modifier(Modifier::BOLD | Modifier::UNDERLINED);
            }
            let mark = match (l.cursor, selected) {
                (true, _) => "▶",
                (false, true) => "›",
                _ => " ",
            };
            Line::from(vec![
                Span::styled(format!("{mark}{:>8} ", l.index), th.dim()),
                Span::styled(fit_columns(&l.text, room), style),
            ])
        })
        .collect();
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.border(focused))
        .title(Span::styled(format!(" Events · {} ", r.title), th.title()));
    // A file with no trace (state only) has no events to list: say so
    // rather than leave the panel blank.
    let lines = if lines.is_empty() && r.finished && r.is_empty() {
        vec![Line::from(Span::styled(
            " no events: the file holds the final state only (no trace)",
            th.dim(),
        ))]
    } else {
        lines
    };
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

#[cfg(test)]
mod tests {
    use super::fit_columns;

    #[test]
    fn a_line_keeps_its_columns_while_its_address_fits_then_closes_them_up() {
        let line = "alloc           64.00 MiB  large  0x7f0004a00000  block 64.00 MiB";
        assert_eq!(fit_columns(line, 80), line);
        assert_eq!(
            fit_columns(line, 55),
            "alloc           64.00 MiB  large  0x7f0004a00000  bloc…"
        );
        assert_eq!(
            fit_columns(line, 40),
            "alloc 64.00 MiB large 0x7f0004a00000 bl…"
        );
        assert_eq!(fit_columns(line, 20), "alloc 64.00 MiB lar…");
    }
}
