//! Numbers at the cursor: allocated/reserved with peaks, active, inactive
//! split (free blocks in segments that hold other blocks), cached free and
//! fragmentation, largest free block, retries and OOMs.

use crate::alloc::{format_size, BlockState, Pool};
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
    let m = &r.map;
    // One walk over segments and blocks together (both sorted by address):
    // a free block is split when its segment holds more than that block.
    let (mut split_n, mut split_bytes, mut largest) = (0usize, 0u64, 0u64);
    let mut segs = m.segments.iter().peekable();
    let mut seg: Option<(u64, u64)> = None;
    for (a, b) in &m.blocks {
        while seg.is_none_or(|(s, size)| *a >= s + size) {
            match segs.peek() {
                Some((s, _)) if **s <= *a => seg = segs.next().map(|(s, g)| (*s, g.size)),
                _ => break,
            }
        }
        if b.state == BlockState::Inactive {
            largest = largest.max(b.size);
            if seg.is_some_and(|(s, size)| *a >= s && *a < s + size && b.size < size) {
                split_n += 1;
                split_bytes += b.size;
            }
        }
    }
    let large = m
        .segments
        .values()
        .filter(|s| s.pool == Pool::Large)
        .count();
    let small = m.segments.len() - large;
    let cached = m.cached_free();
    let frag = if m.reserved == 0 {
        0.0
    } else {
        cached as f64 * 100.0 / m.reserved as f64
    };
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
            format!("{split_n} blocks · {}", format_size(split_bytes)),
        ),
        (
            "cached free",
            format!("{}  ({frag:.1}% of reserved)", format_size(cached)),
        ),
        ("largest free", format_size(largest)),
        (
            "segments",
            format!("{} ({large} large, {small} small)", m.segments.len()),
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
