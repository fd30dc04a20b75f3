//! Numbers at the cursor, as the map at the cursor states them
//! (`MemoryMap::stats`): allocated/reserved with peaks, active, inactive
//! split, cached free and fragmentation, largest free block, retries and OOMs.

use crate::alloc::format_size;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::Span;
use ratatui::widgets::{Block, Borders, Cell, Row, Table};
use ratatui::Frame;

use crate::tui::app::{App, RunView};
use crate::tui::layout::Focus;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsFrame {
    pub rows: Vec<(&'static str, String)>,
}

pub fn prepare(r: &RunView) -> StatsFrame {
    let m = r.map.stats();
    // The engine's own counters when it sent them, else what the trace shows.
    let (retries, ooms) = match &r.stats {
        Some(s) => (s.num_alloc_retries.to_string(), s.num_ooms.to_string()),
        None => ("—".to_string(), r.ooms.to_string()),
    };
    let mut rows = vec![
        (
            "allocated",
            format!(
                "{}  (peak {})",
                format_size(m.allocated),
                format_size(r.timeline.peak_allocated())
            ),
        ),
        (
            "reserved",
            format!(
                "{}  (peak {})",
                format_size(m.reserved),
                format_size(r.timeline.peak_reserved())
            ),
        ),
        ("active", format_size(m.active)),
        (
            "inactive split",
            format!(
                "{} blocks · {}",
                m.inactive_split_blocks,
                format_size(m.inactive_split_bytes)
            ),
        ),
        (
            "cached free",
            format!(
                "{}  ({:.1}% of reserved)",
                format_size(m.cached_free),
                m.fragmentation() * 100.0
            ),
        ),
        ("largest free", format_size(m.largest_free)),
        (
            "segments",
            format!(
                "{} ({} large, {} small)",
                m.large_segments + m.small_segments,
                m.large_segments,
                m.small_segments
            ),
        ),
        ("retries / OOMs", format!("{retries} / {ooms}")),
        ("event", format!("{} of {}", r.pos, r.len())),
    ];
    if !r.timeline.gaps().is_empty() {
        rows.push((
            "trace gaps",
            format!(
                "{} entries not placeable (open trace)",
                r.timeline.gaps().len()
            ),
        ));
    }
    StatsFrame { rows }
}

pub fn render(frame: &mut Frame, area: Rect, app: &App, run: usize) {
    let Some(r) = app.runs.get(run) else { return };
    let th = &app.theme;
    let focused = app.focus == Focus::Stats && app.active == run;
    let rows = r.frame.stats.rows.iter().map(|(k, v)| {
        Row::new(vec![
            Cell::from(Span::styled(*k, th.dim())),
            Cell::from(Span::styled(v.as_str(), th.text())),
        ])
    });
    let table = Table::new(rows, [Constraint::Length(15), Constraint::Min(10)]).block(
        Block::default()
            .borders(Borders::ALL)
            .border_style(th.border(focused))
            .title(Span::styled(format!(" Stats · {} ", r.title), th.title())),
    );
    frame.render_widget(table, area);
}
