//! `vramscope sweep`'s chart: peak allocated and reserved against batch
//! size, the fitted line, the capacity line when it is in reach, OOM points
//! marked; below it the selected point's figures and the sweep in words. A
//! pure function of `SweepState`: every figure comes from the sweep's runs.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Modifier;
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, Borders, Chart, Dataset, GraphType, Paragraph, Wrap};
use ratatui::Frame;

use crate::alloc::format_size;
use crate::sweep::{MaxBatch, SweepPoint};
use crate::tui::sweep::{SweepState, SWEEP_KEYS};
use crate::tui::theme::Theme;

/// The capacity line is drawn when it is at most this many times the
/// highest peak: above that it would flatten every point onto the axis.
const CAPACITY_IN_REACH: f64 = 4.0;
/// Lines of the selected point's box, borders included: its figures, what
/// the peak holds (two lines at 80 columns), the largest batch at its
/// sequence length (with `--find-max-batch`) and its distance from the line.
const DETAIL_HEIGHT: u16 = 7;

pub fn render(frame: &mut Frame, s: &SweepState) {
    let area = frame.area();
    let th = &s.theme;
    frame.render_widget(Block::default().style(th.text()), area);
    let [status, chart, detail, words, hints] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(8),
        Constraint::Length(DETAIL_HEIGHT),
        Constraint::Length(area.height.saturating_sub(2 + DETAIL_HEIGHT) / 3),
        Constraint::Length(1),
    ])
    .areas(area);
    let searching = match s.seq_count() {
        _ if !(s.searching && s.sweep.is_none() && s.done() == s.planned.len()) => String::new(),
        0 | 1 => " · searching the largest batch".to_string(),
        n => format!(" · searching the largest batch at {n} lengths"),
    };
    let figures = format!(
        "{} │ {} of {} points{searching} │ capacity {}",
        s.title,
        s.done(),
        s.planned.len(),
        format_size(s.capacity)
    );
    // The program's name gives way first, then the line is cut with `…`.
    let width = usize::from(area.width);
    let status_text = [
        format!(" vramscope sweep │ {figures}"),
        format!(" {figures}"),
    ]
    .into_iter()
    .find(|t| t.chars().count() <= width)
    .unwrap_or_else(|| super::fit_head(&format!(" {figures}"), width));
    frame.render_widget(
        Paragraph::new(Span::styled(status_text, th.status())).style(th.status()),
        status,
    );
    frame.render_widget(
        Paragraph::new(Span::styled(
            super::fit_head(&format!(" {SWEEP_KEYS}"), width),
            th.dim(),
        )),
        hints,
    );
    render_chart(frame, chart, s);
    render_detail(frame, detail, s);
    render_words(frame, words, s);
}

fn y_label(v: f64) -> String {
    format_size(v.max(0.0).round() as u64)
}

/// Where a batch lies on the x axis: itself, or its log₂ (`x`), which
/// spreads 1, 2, 4 … 64 evenly and bends the fitted line.
#[derive(Clone, Copy)]
struct BatchAxis {
    log: bool,
}

impl BatchAxis {
    fn x(self, batch: f64) -> f64 {
        if self.log {
            batch.max(1.0).log2()
        } else {
            batch
        }
    }

    fn batch(self, x: f64) -> f64 {
        if self.log {
            x.exp2()
        } else {
            x
        }
    }
}

/// Samples along the fitted line: two ends on a linear axis, enough on a
/// log axis for the curve it becomes there.
const FIT_SAMPLES: usize = 48;

fn render_chart(frame: &mut Frame, area: Rect, s: &SweepState) {
    let th = &s.theme;
    let p = &th.palette;
    let axis = BatchAxis { log: s.log_x };
    let seq = s.selected_seq();
    let series = s.series(seq);
    let fitting: Vec<&&SweepPoint> = series.iter().filter(|q| q.fits()).collect();
    let xy = |f: fn(&SweepPoint) -> u64| -> Vec<(f64, f64)> {
        fitting
            .iter()
            .map(|q| (axis.x(q.batch as f64), f(q) as f64))
            .collect()
    };
    let allocated = xy(|q| q.peak_allocated);
    let reserved = xy(|q| q.peak_reserved);
    let oom: Vec<(f64, f64)> = series
        .iter()
        .filter(|q| !q.fits())
        .map(|q| (axis.x(q.batch as f64), q.peak_allocated as f64))
        .collect();
    let planned: Vec<u64> = s
        .planned
        .iter()
        .filter(|q| q.1 == seq)
        .map(|q| q.0)
        .collect();
    let x_min = axis.x(planned.iter().copied().min().unwrap_or(1) as f64);
    let x_max = axis
        .x(planned.iter().copied().max().unwrap_or(1) as f64)
        .max(x_min + 1.0);
    let highest = series
        .iter()
        .map(|q| q.peak_reserved.max(q.peak_allocated))
        .max()
        .unwrap_or(0) as f64;
    let cap = s.capacity as f64;
    let capacity_drawn = highest > 0.0 && cap <= CAPACITY_IN_REACH * highest;
    let y_max = if capacity_drawn { cap } else { highest }.max(1.0) * 1.08;
    let capacity_line = [(x_min, cap), (x_max, cap)];
    let fit_line: Vec<(f64, f64)> = s
        .fit()
        .map(|f| {
            let (a, b) = (
                axis.x(f.batches[0] as f64),
                axis.x(f.batches[f.batches.len() - 1] as f64),
            );
            let n = if s.log_x { FIT_SAMPLES } else { 1 };
            (0..=n)
                .map(|i| {
                    let x = a + (b - a) * i as f64 / n as f64;
                    (x, f.allocated.at(axis.batch(x)))
                })
                .collect()
        })
        .unwrap_or_default();
    let selected: Vec<(f64, f64)> = match s.selected_point() {
        Some(Ok(q)) => vec![(axis.x(q.batch as f64), q.peak_allocated as f64)],
        _ => Vec::new(),
    };
    // Drawn in order: the fitted line first, so the measured points cover it.
    let mut datasets = Vec::new();
    if !fit_line.is_empty() {
        datasets.push(
            Dataset::default()
                .name("fitted line")
                .marker(Marker::Dot)
                .graph_type(GraphType::Line)
                .style(th.fg(p.dim))
                .data(&fit_line),
        );
    }
    datasets.push(
        Dataset::default()
            .name("reserved")
            .marker(Marker::Braille)
            .graph_type(GraphType::Line)
            .style(th.fg(p.reserved_line))
            .data(&reserved),
    );
    datasets.push(
        Dataset::default()
            .name("allocated")
            // Solid half blocks against reserved's braille dots: the two
            // lines differ by glyph, not by colour alone.
            .marker(Marker::HalfBlock)
            .graph_type(GraphType::Line)
            .style(th.fg(p.allocated_line))
            .data(&allocated),
    );
    if capacity_drawn {
        datasets.push(
            Dataset::default()
                .name("capacity")
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(th.fg(p.capacity))
                .data(&capacity_line),
        );
    }
    if !oom.is_empty() {
        datasets.push(
            Dataset::default()
                .name("OOM")
                .marker(Marker::Block)
                .graph_type(GraphType::Scatter)
                .style(th.fg(p.oom))
                .data(&oom),
        );
    }
    datasets.push(
        Dataset::default()
            .name("selected")
            .marker(Marker::Bar)
            .graph_type(GraphType::Scatter)
            .style(th.fg(p.cursor))
            .data(&selected),
    );
    let title = match (seq, capacity_drawn) {
        (Some(t), true) => format!(" peak memory against batch (seq {t}) "),
        (None, true) => " peak memory against batch ".to_string(),
        (Some(t), false) => format!(
            " peak memory against batch (seq {t}) · capacity {} is above the chart ",
            format_size(s.capacity)
        ),
        (None, false) => format!(
            " peak memory against batch · capacity {} is above the chart ",
            format_size(s.capacity)
        ),
    };
    let x_labels =
        [x_min, (x_min + x_max) / 2.0, x_max].map(|v| Span::raw(format!("{:.0}", axis.batch(v))));
    let y_labels = [0.0, y_max / 2.0, y_max].map(|v| Span::raw(y_label(v)));
    let chart = Chart::new(datasets)
        .block(
            Block::default()
                .borders(Borders::ALL)
                .border_style(th.border(true))
                .title(Span::styled(title, th.title()))
                .title_bottom(legend(th, capacity_drawn, !oom.is_empty())),
        )
        .style(th.text())
        .legend_position(None)
        .x_axis(
            Axis::default()
                .title(if s.log_x { "batch (log₂)" } else { "batch" })
                .style(th.dim())
                .bounds([x_min, x_max])
                .labels(x_labels),
        )
        .y_axis(
            Axis::default()
                .style(th.dim())
                .bounds([0.0, y_max])
                .labels(y_labels),
        );
    frame.render_widget(chart, area);
}

/// What each line and mark is, in its colour, along the chart's foot: it
/// never covers a point, and it fits at 80 columns.
fn legend(th: &Theme, capacity: bool, oom: bool) -> Line<'static> {
    let p = &th.palette;
    // Each drawn with its own glyph, so they differ without colour too
    // (capacity shares reserved's dots, and is the flat line at the top).
    let mut items = vec![
        ("▀▄ allocated", p.allocated_line),
        ("⠤ reserved", p.reserved_line),
        ("• fitted line", p.dim),
    ];
    if capacity {
        items.push(("⠉ capacity (flat)", p.capacity));
    }
    if oom {
        items.push(("█ OOM", p.oom));
    }
    items.push(("▄ selected", p.cursor));
    let mut spans = vec![Span::raw(" ")];
    for (text, color) in items {
        spans.push(Span::styled(text, th.fg(color)));
        spans.push(Span::raw("  "));
    }
    Line::from(spans)
}

fn point_lines(s: &SweepState, th: &Theme) -> Vec<Line<'static>> {
    let Some((batch, seq)) = s.planned.get(s.selected).copied() else {
        return vec![Line::raw("no points")];
    };
    let head = match seq {
        Some(t) => format!("batch {batch} · seq {t}"),
        None => format!("batch {batch}"),
    };
    let q = match s.selected_point() {
        None => return vec![Line::raw(format!("{head}: running…"))],
        Some(Err(e)) => {
            return vec![Line::from(vec![
                Span::raw(format!("{head}: ")),
                Span::styled(e.clone(), th.fg(th.palette.error)),
            ])]
        }
        Some(Ok(q)) => q,
    };
    let result = if q.oom {
        Span::styled("out of memory", th.fg(th.palette.oom))
    } else if let Some(e) = &q.error {
        Span::styled(format!("stopped: {e}"), th.fg(th.palette.error))
    } else {
        Span::raw("fits")
    };
    let mut lines = vec![Line::from(vec![
        Span::styled(head, th.text().add_modifier(Modifier::BOLD)),
        Span::raw(format!(
            " │ peak allocated {} │ peak reserved {} │ ",
            format_size(q.peak_allocated),
            format_size(q.peak_reserved)
        )),
        result,
    ])];
    if let Some(m) = &q.at_peak {
        let mut parts: Vec<(&str, u64)> = m.by_category.iter().map(|(k, v)| (*k, *v)).collect();
        parts.sort_by_key(|p| std::cmp::Reverse(p.1));
        let list: Vec<String> = parts
            .iter()
            .map(|(k, v)| format!("{} {}", k.replace('_', " "), format_size(*v)))
            .collect();
        lines.push(Line::raw(format!(
            "at the peak ({}, {}{}): {}",
            m.phase.unwrap_or("setup"),
            m.op.as_deref().unwrap_or("untagged"),
            m.module
                .as_deref()
                .filter(|x| !x.is_empty())
                .map_or(String::new(), |x| format!(" in {x}")),
            list.join(" · ")
        )));
    }
    if let Some(m) = s.max_batch() {
        lines.push(Line::raw(max_batch_line(m)));
    }
    if let Some(f) = s.fit() {
        match f.residuals.iter().find(|r| r.batch == q.batch) {
            Some(r) => lines.push(Line::raw(format!(
                "the line: {}; this point {} {} ({:.2} % of its peak)",
                format_size(r.predicted.max(0.0).round() as u64),
                format_size(r.bytes.abs().round() as u64),
                if r.bytes >= 0.0 { "above" } else { "below" },
                r.relative.abs() * 100.0
            ))),
            None => lines.push(Line::raw(
                "left out of the fitted line: the run did not finish",
            )),
        }
    }
    lines
}

/// The search's result at the selected point's sequence length, short.
fn max_batch_line(m: &MaxBatch) -> String {
    let at = m.seq.map_or(String::new(), |t| format!(" at seq {t}"));
    match (&m.error, m.batch, m.first_oom) {
        (Some(e), _, _) => format!("the search for the largest batch{at} stopped: {e}"),
        (None, None, _) => format!("largest batch that fits{at}: none, batch 1 runs out of memory"),
        (None, Some(b), Some(f)) => format!(
            "largest batch that fits{at}: {b}; {f} runs out of memory ({} runs)",
            m.runs
        ),
        (None, Some(b), None) => format!(
            "largest batch that fits{at}: every one searched, up to {b} ({} runs)",
            m.runs
        ),
    }
}

fn render_detail(frame: &mut Frame, area: Rect, s: &SweepState) {
    let th = &s.theme;
    frame.render_widget(
        Paragraph::new(point_lines(s, th))
            .wrap(Wrap { trim: false })
            .block(
                Block::default()
                    .borders(Borders::ALL)
                    .border_style(th.border(false))
                    .title(Span::styled(" selected point ", th.title())),
            ),
        area,
    );
}

fn render_words(frame: &mut Frame, area: Rect, s: &SweepState) {
    let th = &s.theme;
    let text: Vec<Line> = match (&s.failure, &s.sweep) {
        (Some(why), _) => vec![Line::styled(
            format!("the sweep stopped: {why}"),
            th.fg(th.palette.error),
        )],
        (None, Some(sweep)) => sweep
            .notes
            .iter()
            .map(|n| Line::styled(format!("note: {n}"), th.dim()))
            .chain(sweep.explanation.iter().map(|l| Line::raw(l.clone())))
            .chain(
                sweep
                    .narration
                    .iter()
                    .map(|l| Line::styled(format!("the scenario says: {l}"), th.fg(th.palette.narration))),
            )
            .collect(),
        (None, None) => vec![Line::styled(
            format!(
                "running the scenario at each point ({} of {} done); the fit follows when all have run",
                s.done(),
                s.planned.len()
            ),
            th.dim(),
        )],
    };
    frame.render_widget(
        Paragraph::new(text)
            .wrap(Wrap { trim: false })
            .scroll((s.scroll, 0))
            .block(
                Block::default()
                    .borders(Borders::ALL)
                    .border_style(th.border(false))
                    .title(Span::styled(" the fit in words ", th.title())),
            ),
        area,
    );
}
