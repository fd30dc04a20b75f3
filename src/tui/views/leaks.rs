//! Leak findings: one line per finding (root, kind, bytes, growth), then the
//! selected one's path, fix and evidence. The selected finding's blocks are
//! highlighted on the map.

use crate::alloc::format_size;
use crate::leak::{Finding, Severity};
use ratatui::layout::Rect;
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};
use ratatui::Frame;

use crate::tui::app::App;
use crate::tui::layout::Focus;
use crate::tui::theme::Theme;

fn growth(g: i64, unit: &str) -> String {
    let sign = if g < 0 { "-" } else { "+" };
    format!("{sign}{}/{unit}", format_size(g.unsigned_abs()))
}

/// One finding on one line: single spaces and "/it" when the panel is too
/// narrow for the roomy form, so the figures do not wrap away from the name.
fn summary_line<'a>(th: &Theme, f: &'a Finding, selected: bool, width: usize) -> Line<'a> {
    let roomy = 4
        + f.root.chars().count()
        + f.kind.short_label().chars().count()
        + 4
        + format_size(f.bytes).len()
        + 2
        + growth(f.growth_per_iter, "iter").len()
        <= width;
    let (gap, unit) = if roomy { ("  ", "iter") } else { (" ", "it") };
    let p = &th.palette;
    let sev = match f.severity {
        Severity::Critical => th.fg(p.error),
        Severity::Warning => th.fg(p.pending),
        Severity::Info => th.dim(),
    };
    let mut spans = vec![
        Span::styled(if selected { "▶ " } else { "  " }, th.text()),
        Span::styled(if f.kind.is_leak() { "● " } else { "○ " }, sev),
        Span::styled(f.root.as_str(), th.title()),
        Span::styled(format!("{gap}{}{gap}", f.kind.short_label()), th.dim()),
        Span::styled(format_size(f.bytes), th.text()),
        Span::styled(
            format!("{gap}{}", growth(f.growth_per_iter, unit)),
            th.text(),
        ),
    ];
    if selected {
        for s in &mut spans {
            s.style = s.style.add_modifier(Modifier::REVERSED);
        }
    }
    Line::from(spans)
}

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    render_run(frame, area, app, app.active);
}

/// The leak panel of run `run` (compare shows one per run).
pub fn render_run(frame: &mut Frame, area: Rect, app: &App, run: usize) {
    let Some(r) = app.runs.get(run) else { return };
    let th = &app.theme;
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.border(app.focus == Focus::Leaks && run == app.active))
        .title(Span::styled(
            format!(" Leaks · {} · {} ", r.title, r.findings.len()),
            th.title(),
        ));
    let mut lines: Vec<Line> = Vec::new();
    // At an out-of-memory error, its answer comes first: never "no findings" alone.
    if let Some(a) = &r.oom_answer {
        for (k, text) in a.lines().into_iter().enumerate() {
            let style = if k == 0 {
                th.fg(th.palette.error)
            } else {
                th.text()
            };
            lines.push(Line::styled(text, style));
        }
        lines.push(Line::raw(""));
    }
    if r.findings.is_empty() {
        lines.push(Line::styled(
            if r.is_live() {
                "no findings yet"
            } else {
                "no findings"
            },
            th.dim(),
        ));
    }
    for (i, f) in r.findings.iter().enumerate() {
        let width = usize::from(area.width.saturating_sub(2));
        lines.push(summary_line(th, f, r.sel_finding == Some(i), width));
    }
    if let Some(f) = r.sel_finding.and_then(|i| r.findings.get(i)) {
        lines.push(Line::raw(""));
        lines.push(Line::styled(
            format!(
                "holds {} over {} · {} highlighted",
                format_size(f.bytes),
                crate::units::counted(f.iterations, "iteration"),
                crate::units::counted(f.blocks.len() as u64, "block")
            ),
            th.text(),
        ));
        if !f.by_category.is_empty() {
            let parts: Vec<String> = f
                .by_category
                .iter()
                .map(|(c, b)| format!("{c} {}", format_size(*b)))
                .collect();
            lines.push(Line::styled(
                format!("by category: {}", parts.join(", ")),
                th.text(),
            ));
        }
        // The fix before the path: on a small screen it is what must show.
        if !f.fix.is_empty() {
            lines.push(Line::from(vec![
                Span::styled("fix: ", th.title()),
                Span::styled(f.fix.as_str(), th.fg(th.palette.narration)),
            ]));
        }
        // Only a leak's path is a chain; other findings list what was seen.
        let (head, then) = if f.kind.is_leak() {
            ("path: ", "  → ")
        } else {
            ("seen: ", "  · ")
        };
        for (k, step) in f.path.iter().enumerate() {
            lines.push(Line::styled(
                format!("{}{step}", if k == 0 { head } else { then }),
                th.text(),
            ));
        }
        let outlook = match (f.ran_out_at_iteration, f.full_at_iteration) {
            (Some(n), _) => Some(format!("the run ran out of memory at iteration {n}")),
            (None, Some(n)) => Some(format!("at this rate the device is full at iteration {n}")),
            (None, None) => None,
        };
        if let Some(text) = outlook {
            lines.push(Line::styled(text, th.fg(th.palette.error)));
        }
        lines.push(Line::styled(f.evidence.as_str(), th.dim()));
    } else if !r.findings.is_empty() {
        lines.push(Line::styled("j/k select · Enter highlight", th.dim()));
    }
    let scroll = r.leak_scroll.min(lines.len().saturating_sub(1) as u16);
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .scroll((scroll, 0))
            .block(block),
        area,
    );
}
