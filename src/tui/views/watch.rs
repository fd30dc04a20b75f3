//! `vramscope watch`: one pane per GPU (memory, utilisation, temperature and
//! sparklines of used memory and utilisation), then the selected GPU's
//! processes and its reconciliation bar. A pure function of `WatchState`;
//! a value NVML could not give reads "unknown", never 0.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Sparkline, Table, Wrap};
use ratatui::Frame;

use crate::alloc::format_size;
use crate::device::nvml::GpuReading;
use crate::device::reconcile::DeviceReconciliation;
use crate::tui::theme::Theme;
use crate::tui::watch::{GpuHistory, WatchState, WATCH_KEYS};
use crate::units::{format_percent_or_unknown as pct, format_size_or_unknown as size};

/// Lines of one GPU pane, borders included.
pub const PANE_HEIGHT: u16 = 6;
/// Lines kept for processes and reconciliation below the panes.
const DETAIL_MIN: u16 = 10;
const RECON_HEIGHT: u16 = 6;

/// The first pane shown so that `selected` is visible with `fit` panes.
pub fn first_visible(selected: usize, fit: usize) -> usize {
    selected.saturating_sub(fit.max(1) - 1)
}

pub fn render(frame: &mut Frame, s: &WatchState) {
    let area = frame.area();
    let th = &s.theme;
    frame.render_widget(Block::default().style(th.text()), area);
    let [status, body, hints] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(area);
    let status_text = format!(
        " vramscope watch │ {} GPU{} │ reading {} │ memory ~3 Hz, processes 1 Hz",
        s.gpus.len(),
        if s.gpus.len() == 1 { "" } else { "s" },
        s.readings
    );
    frame.render_widget(
        Paragraph::new(Span::styled(status_text, th.status())).style(th.status()),
        status,
    );
    frame.render_widget(
        Paragraph::new(Span::styled(format!(" {WATCH_KEYS}"), th.dim())),
        hints,
    );
    if let Some(e) = &s.error {
        let text = format!("NVML stopped answering: {e}\n\nq quits.");
        frame.render_widget(
            Paragraph::new(text)
                .style(th.text())
                .wrap(Wrap { trim: false }),
            body,
        );
        return;
    }
    if s.gpus.is_empty() {
        let text = if s.readings == 0 {
            "waiting for the first NVML reading…"
        } else {
            "NVML lists no GPU on this machine."
        };
        frame.render_widget(Paragraph::new(text).style(th.dim()), body);
        return;
    }
    let fit = usize::from(body.height.saturating_sub(DETAIL_MIN) / PANE_HEIGHT).max(1);
    let shown = fit.min(s.gpus.len());
    let [panes, detail] = Layout::vertical([
        Constraint::Length(shown as u16 * PANE_HEIGHT),
        Constraint::Min(0),
    ])
    .areas(body);
    let first = first_visible(s.selected, fit);
    for (slot, i) in (first..s.gpus.len()).take(shown).enumerate() {
        let r = Rect {
            y: panes.y + slot as u16 * PANE_HEIGHT,
            height: PANE_HEIGHT,
            ..panes
        };
        if let (Some(g), Some(h)) = (s.gpus.get(i), s.history.get(i)) {
            gpu_pane(frame, r, th, g, h, i == s.selected, (i, s.gpus.len()));
        }
    }
    let [procs, recon] =
        Layout::vertical([Constraint::Min(3), Constraint::Length(RECON_HEIGHT)]).areas(detail);
    if let Some(g) = s.gpus.get(s.selected) {
        process_table(frame, procs, th, g);
        if let Some(d) = s.devices.get(s.selected) {
            reconciliation(frame, recon, th, g.index, d);
        }
    }
}

fn gpu_pane(
    frame: &mut Frame,
    r: Rect,
    th: &Theme,
    g: &GpuReading,
    h: &GpuHistory,
    selected: bool,
    (i, n): (usize, usize),
) {
    let title = format!(
        " GPU {} · {} {}",
        g.index,
        g.name.as_deref().unwrap_or("name unknown"),
        if n > 1 {
            format!("({}/{n}) ", i + 1)
        } else {
            String::new()
        }
    );
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.border(selected))
        .title(Span::styled(title, th.title()));
    let inner = block.inner(r);
    frame.render_widget(block, r);
    let [info, util, used_row, util_row] =
        Layout::vertical([Constraint::Length(1); 4]).areas(inner);
    let temp = g
        .temperature_c
        .map_or_else(|| "temperature unknown".to_string(), |t| format!("{t}°C"));
    frame.render_widget(
        Paragraph::new(Span::styled(
            format!(
                "memory used {} of {} · free {}",
                size(g.used),
                size(g.total),
                size(g.free)
            ),
            th.text(),
        )),
        info,
    );
    frame.render_widget(
        Paragraph::new(Span::styled(
            format!(
                "GPU utilisation {} · memory utilisation {} · {temp}",
                pct(g.utilization_gpu),
                pct(g.utilization_memory)
            ),
            th.text(),
        )),
        util,
    );
    spark_row(frame, used_row, th, "used ", &h.used, g.total);
    spark_row(frame, util_row, th, "util ", &h.utilization, Some(100));
}

/// A labelled sparkline, newest on the right; a missing value draws `?`.
fn spark_row(
    frame: &mut Frame,
    r: Rect,
    th: &Theme,
    label: &str,
    values: &std::collections::VecDeque<Option<u64>>,
    max: Option<u64>,
) {
    let [l, s] = Layout::horizontal([Constraint::Length(6), Constraint::Min(1)]).areas(r);
    frame.render_widget(Paragraph::new(Span::styled(label, th.dim())), l);
    let width = usize::from(s.width);
    let skip = values.len().saturating_sub(width);
    let data: Vec<Option<u64>> = values.iter().skip(skip).copied().collect();
    let mut spark = Sparkline::default()
        .data(data)
        // A baseline under every reading: a small value (1.5 GiB of 80) is
        // under the lowest eighth and would leave the row blank.
        .bar_set(ratatui::symbols::bar::Set {
            empty: ratatui::symbols::bar::ONE_EIGHTH,
            ..ratatui::symbols::bar::NINE_LEVELS
        })
        .style(th.title())
        .absent_value_symbol("?")
        .absent_value_style(th.dim());
    if let Some(m) = max.filter(|m| *m > 0) {
        spark = spark.max(m);
    }
    frame.render_widget(spark, s);
}

fn process_table(frame: &mut Frame, r: Rect, th: &Theme, g: &GpuReading) {
    let header = Row::new(
        ["pid", "name", "NVML used", "context", "reserved", "other"]
            .map(|h| Cell::from(Span::styled(h, th.dim()))),
    );
    let rows = g.processes.iter().map(|p| {
        Row::new(vec![
            Cell::from(p.pid.to_string()),
            Cell::from(p.name.clone().unwrap_or_else(|| "unknown".into())),
            Cell::from(size(p.used)),
            // Another process's allocator is invisible from here.
            Cell::from("unknown"),
            Cell::from("unknown"),
            Cell::from("unknown"),
        ])
    });
    let short = format!(
        " Processes · GPU {} · {} listed ",
        g.index,
        g.processes.len()
    );
    let long = format!(
        "{}(context / reserved / other: another process's allocator is invisible to us) ",
        short
    );
    // A title cut mid-word reads as a bug: the long form only where it fits.
    let title = if long.chars().count() + 2 <= usize::from(r.width) {
        long
    } else {
        short
    };
    let table = Table::new(
        rows,
        [
            Constraint::Length(8),
            Constraint::Min(10),
            Constraint::Length(12),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(9),
        ],
    )
    .header(header)
    .style(th.text())
    .block(
        Block::default()
            .borders(Borders::ALL)
            .border_style(th.border(false))
            .title(Span::styled(title, th.title())),
    );
    frame.render_widget(table, r);
}

fn reconciliation(frame: &mut Frame, r: Rect, th: &Theme, index: u32, d: &DeviceReconciliation) {
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.border(false))
        .title(Span::styled(
            format!(" Reconciliation · GPU {index} "),
            th.title(),
        ));
    let inner = block.inner(r);
    frame.render_widget(block, r);
    let sum = match d.processes_sum {
        Some(s) => format!("{} ({} listed)", format_size(s), d.processes),
        None => format!(
            "unknown ({} of {} report no memory)",
            d.unknown_processes, d.processes
        ),
    };
    let mut lines = vec![
        Line::from(vec![
            Span::styled("NVML used ", th.dim()),
            Span::styled(size(d.nvml_used), th.text()),
            Span::styled(" = processes ", th.dim()),
            Span::styled(sum, th.text()),
            Span::styled(" + not attributed ", th.dim()),
            Span::styled(size(d.unattributed), th.text()),
        ]),
        bar(th, d, usize::from(inner.width.saturating_sub(40)).max(10)),
        Line::styled(
            "per process: context + reserved + other unknown (only our own CUDA runs split them)",
            th.dim(),
        ),
    ];
    if let Some(kept) = d.driver_reserved.filter(|b| *b > 0) {
        lines.push(Line::from(vec![
            Span::styled("total = used + free + ", th.dim()),
            Span::styled(format_size(kept), th.text()),
            Span::styled(
                " the driver keeps back (no process holds it, never free)",
                th.dim(),
            ),
        ]));
    }
    frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
}

/// `█` processes, `▒` not attributed (or used of unknown split), `░` free.
fn bar<'a>(th: &Theme, d: &DeviceReconciliation, width: usize) -> Line<'a> {
    let (Some(total), Some(used)) = (d.total.filter(|t| *t > 0), d.nvml_used) else {
        return Line::styled(
            "bar unavailable: the device's total or used is unknown",
            th.dim(),
        );
    };
    let cells = |b: u64| ((u128::from(b) * width as u128) / u128::from(total)) as usize;
    let used_cells = cells(used).min(width);
    let proc_cells = d.processes_sum.map_or(0, |s| cells(s).min(used_cells));
    let legend = if d.processes_sum.is_some() {
        "  █ processes ▒ not attributed ░ free"
    } else {
        "  ▒ used (split unknown) ░ free"
    };
    Line::from(vec![
        Span::styled("█".repeat(proc_cells), th.title()),
        Span::styled("▒".repeat(used_cells - proc_cells), th.text()),
        Span::styled("░".repeat(width - used_cells), th.dim()),
        Span::styled(legend, th.dim()),
    ])
}
