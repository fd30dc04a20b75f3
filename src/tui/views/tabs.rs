//! Tabs (`vramscope open a b …`): the tab bar, and the two views across
//! tabs over the run view: the table of every tab's figures (`T`) and what
//! is alive in the shown tab and not in the baseline (`A`). Pure renders of
//! what `report::series` and `report::diff` computed.

use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph};
use ratatui::Frame;

use super::fit_site;
use crate::alloc::format_size;
use crate::report::diff::{DeviceDiff, SnapshotDiff};
use crate::report::series::{oom_cell, SeriesRow, SeriesTable, DEFINITIONS};
use crate::tui::app::{DiffState, Tabs};
use crate::tui::popup::wrap;
use crate::tui::theme::Theme;

/// The bar: every tab's number and file, the shown one reversed, an OOM
/// or a failure marked.
pub fn render_bar(frame: &mut Frame, area: Rect, tabs: &Tabs, th: &Theme) {
    let bar = &tabs.bar;
    let shown = tabs.active.wrapping_sub(tabs.bar_first);
    let mut spans = Vec::with_capacity(bar.len() * 2 + 2);
    // Tabs left out of a narrow bar: marks where they are.
    if tabs.more_left {
        spans.push(Span::styled("‹ ", th.dim()));
    }
    for (i, l) in bar.iter().enumerate() {
        let mut style = if l.failed || l.oom {
            th.fg(th.palette.error)
        } else {
            th.text()
        };
        if i == shown {
            style = style.add_modifier(Modifier::REVERSED | Modifier::BOLD);
        }
        spans.push(Span::styled(l.text.clone(), style));
        spans.push(Span::styled("│", th.dim()));
    }
    if tabs.more_right {
        spans.push(Span::styled(" ›", th.dim()));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// The box a view across tabs is drawn in, cleared.
fn panel(frame: &mut Frame, area: Rect, title: String, bottom: &str, th: &Theme) -> Rect {
    frame.render_widget(Clear, area);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.border(true))
        .style(th.text())
        .title(Span::styled(title, th.title()))
        .title_bottom(Span::styled(bottom, th.dim()));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    inner
}

/// `lines` from `scroll` on (clamped so the last page stays full).
fn scrolled(frame: &mut Frame, inner: Rect, lines: Vec<Line<'static>>, scroll: usize) {
    let max = lines.len().saturating_sub(usize::from(inner.height));
    let from = scroll.min(max);
    let shown: Vec<Line> = lines.into_iter().skip(from).collect();
    frame.render_widget(Paragraph::new(shown), inner);
}

/// A column of the table: its header, width and the figure it shows.
struct Column {
    head: &'static str,
    width: usize,
    cell: fn(&SeriesRow) -> String,
}

fn size_or_unknown(v: Option<u64>) -> String {
    v.map_or_else(|| "unknown".to_string(), format_size)
}

/// The table's columns, most wanted first: where the terminal is narrow
/// the last ones go.
const COLUMNS: &[Column] = &[
    Column {
        head: "reserved",
        width: 10,
        cell: |r| {
            r.figures
                .as_ref()
                .map_or_else(String::new, |f| format_size(f.reserved))
        },
    },
    Column {
        head: "allocated",
        width: 10,
        cell: |r| {
            r.figures
                .as_ref()
                .map_or_else(String::new, |f| format_size(f.allocated))
        },
    },
    Column {
        head: "OOM",
        width: 12,
        cell: |r| r.figures.as_ref().map_or_else(String::new, oom_cell),
    },
    Column {
        head: "frag",
        width: 6,
        cell: |r| {
            r.figures
                .as_ref()
                .map_or_else(String::new, |f| format!("{:.1}%", f.fragmentation * 100.0))
        },
    },
    Column {
        head: "lgst free",
        width: 10,
        cell: |r| {
            r.figures
                .as_ref()
                .map_or_else(String::new, |f| format_size(f.largest_free_block))
        },
    },
    Column {
        head: "peak alloc",
        width: 10,
        cell: |r| {
            r.figures
                .as_ref()
                .map_or_else(String::new, |f| size_or_unknown(f.peak_allocated))
        },
    },
    Column {
        head: "peak res",
        width: 10,
        cell: |r| {
            r.figures
                .as_ref()
                .map_or_else(String::new, |f| size_or_unknown(f.peak_reserved))
        },
    },
    Column {
        head: "free",
        width: 6,
        cell: |r| {
            r.figures.as_ref().map_or_else(String::new, |f| {
                format!("{:.1}%", f.cached_free_share * 100.0)
            })
        },
    },
];

/// Room the label column keeps before a figure column goes.
const LABEL_MIN: usize = 14;

fn fit(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return format!("{text:<width$}");
    }
    // A row's device (` · cuda:N`) stays; the file name gives way.
    let (name, device) = match text.rfind(" · ") {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let keep = width.saturating_sub(device.chars().count() + 1);
    let cut: String = name.chars().take(keep).collect();
    format!("{cut}…{device}")
}

/// `text` wrapped to `width`, each row a line in `style`.
fn wrapped(lines: &mut Vec<Line<'static>>, text: &str, width: usize, style: Style) {
    for row in wrap(text, width.max(16)) {
        lines.push(Line::styled(row, style));
    }
}

/// The table across tabs; the rows of the shown tab's file marked `▶`.
pub fn render_table(
    frame: &mut Frame,
    area: Rect,
    table: &SeriesTable,
    shown_file: &str,
    scroll: usize,
    th: &Theme,
) {
    let inner = panel(
        frame,
        area,
        " Across tabs ".into(),
        " T / Esc close · j/k scroll · w/W or 1–9 tab · A diff ",
        th,
    );
    let width = usize::from(inner.width);
    let mut cols = COLUMNS.len();
    while cols > 1
        && width < LABEL_MIN + 2 + COLUMNS[..cols].iter().map(|c| c.width + 1).sum::<usize>()
    {
        cols -= 1;
    }
    let cols = &COLUMNS[..cols];
    let longest = table
        .rows
        .iter()
        .filter(|r| r.error.is_none())
        .map(|r| r.label.chars().count())
        .max()
        .unwrap_or(4);
    let label_w = width
        .saturating_sub(2 + cols.iter().map(|c| c.width + 1).sum::<usize>())
        .clamp(4, longest.max(4));
    let mut head = format!("  {}", fit("file", label_w));
    for c in cols {
        head.push_str(&format!(" {:>w$}", c.head, w = c.width));
    }
    let mut lines = vec![Line::styled(head, th.title())];
    for r in &table.rows {
        let mark = if r.file == shown_file { "▶ " } else { "  " };
        let mut text = format!("{mark}{}", fit(&r.label, label_w));
        let style = match (
            &r.error,
            r.figures.as_ref().is_some_and(|f| f.oom_count > 0),
        ) {
            (Some(_), _) | (None, true) => th.fg(th.palette.error),
            _ => th.text(),
        };
        match &r.error {
            Some(why) => text.push_str(&format!(" {}", super::one_line(why))),
            None => {
                for c in cols {
                    text.push_str(&format!(" {:>w$}", (c.cell)(r), w = c.width));
                }
            }
        }
        lines.push(Line::styled(text, style));
    }
    lines.push(Line::raw(""));
    if cols.len() < COLUMNS.len() {
        let left: Vec<&str> = COLUMNS[cols.len()..].iter().map(|c| c.head).collect();
        let text = format!(
            "(a wider terminal shows {} too; --headless and --json have every figure)",
            left.join(", ")
        );
        wrapped(&mut lines, &text, width, th.dim());
    }
    for (name, def) in [
        ("peak", DEFINITIONS.peak),
        ("lgst free", DEFINITIONS.largest_free_block),
        ("free", DEFINITIONS.cached_free_share),
        ("frag", DEFINITIONS.fragmentation),
    ] {
        wrapped(&mut lines, &format!("{name}: {def}"), width, th.dim());
    }
    scrolled(frame, inner, lines, scroll);
}

/// What is alive in the shown tab and not in the baseline, or why not yet.
pub fn render_diff(frame: &mut Frame, area: Rect, state: &DiffState, scroll: usize, th: &Theme) {
    let bottom = " A / Esc close · j/k scroll · B: this tab is the baseline · w/W tab ";
    let (title, lines) = match state {
        DiffState::NotYet(why) => (
            " Alive here, not in the baseline ".to_string(),
            vec![Line::styled(super::one_line(why), th.dim())],
        ),
        DiffState::Ready(base, shown, d) => (
            format!(
                " Alive in tab {} and not in tab {} (baseline) ",
                shown + 1,
                base + 1
            ),
            diff_lines(d, usize::from(area.width.saturating_sub(2)), th),
        ),
    };
    let inner = panel(frame, area, title, bottom, th);
    scrolled(frame, inner, lines, scroll);
}

fn blocks(n: usize) -> String {
    format!("{n} block{}", if n == 1 { "" } else { "s" })
}

/// µs since the Unix epoch as a UTC time of day.
fn time_of_day(us: i64) -> String {
    let ms = us.div_euclid(1000).rem_euclid(86_400_000);
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

fn diff_lines(d: &SnapshotDiff, width: usize, th: &Theme) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    wrapped(&mut lines, &format!("{} → {}", d.a, d.b), width, th.title());
    wrapped(&mut lines, &format!("({})", d.identity), width, th.dim());
    if d.devices.is_empty() {
        lines.push(Line::raw("neither snapshot holds a live block"));
    }
    for dev in &d.devices {
        device_lines(&mut lines, dev, width, th);
    }
    lines
}

fn device_lines(lines: &mut Vec<Line<'static>>, d: &DeviceDiff, width: usize, th: &Theme) {
    lines.push(Line::raw(""));
    wrapped(
        lines,
        &format!(
            "device {}: live {} in {} → {} in {}",
            d.device,
            format_size(d.a_live_bytes),
            blocks(d.a_live_blocks),
            format_size(d.b_live_bytes),
            blocks(d.b_live_blocks)
        ),
        width,
        th.title(),
    );
    let text = format!(
        "new here: {} in {} · gone since the baseline: {} in {}",
        format_size(d.new_bytes),
        blocks(d.new_blocks),
        format_size(d.gone_bytes),
        blocks(d.gone_blocks)
    );
    wrapped(lines, &text, width, th.text());
    if d.sites.is_empty() {
        lines.push(Line::styled("no block is new here", th.dim()));
    } else {
        let timed = d.sites.iter().any(|s| s.newest_time_us.is_some());
        let text = if timed {
            "new blocks by first user frame, newest allocation first (UTC, this tab's trace):"
        } else {
            "new blocks by first user frame, largest first (the trace holds no times for them):"
        };
        wrapped(lines, text, width, th.dim());
        for s in &d.sites {
            let when = s.newest_time_us.map_or_else(|| "".to_string(), time_of_day);
            let head = format!(
                "{:>11} {:>6} {:>12}  ",
                format!("+{}", format_size(s.bytes)),
                s.blocks,
                when
            );
            let site = fit_site(&s.site, width.saturating_sub(head.chars().count()));
            lines.push(Line::raw(format!("{head}{site}")));
        }
    }
    let grew: Vec<_> = d.changes.iter().filter(|c| c.change() > 0).collect();
    if !grew.is_empty() {
        let text = "live bytes grew, by first user frame (most first; blocks before → after):";
        wrapped(lines, text, width, th.dim());
        for c in grew {
            let head = format!(
                "{:>11} {:>6} → {:<6} ",
                format!("+{}", format_size(c.b_bytes.saturating_sub(c.a_bytes))),
                c.a_blocks,
                c.b_blocks
            );
            let site = fit_site(&c.site, width.saturating_sub(head.chars().count()));
            lines.push(Line::raw(format!("{head}{site}")));
        }
    }
}
