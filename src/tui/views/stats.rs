//! Numbers at the cursor, as the map at the cursor states them
//! (`MemoryMap::stats`) and the timeline up to it (`Timeline::peak_until`,
//! `ooms_until`, `gaps_until`): allocated/reserved with their peaks so far,
//! active, inactive split, cached free and fragmentation, largest free block,
//! OOMs so far. A whole-run figure (the run's OOMs, the engine's retry count,
//! which no trace entry records) is said to be one, in words.

use crate::alloc::format_size;
use crate::engine::estimate::format_ms;
use crate::units::signed_size;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::Span;
use ratatui::widgets::{Block, Borders, Cell, Row, Table};
use ratatui::Frame;

use crate::tui::app::{App, RunView};
use crate::tui::layout::Focus;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsFrame {
    pub rows: Vec<(&'static str, String)>,
    /// Allocated when the cursor's iteration began, and the change from
    /// the iteration before: the per-iteration readout a leak shows in.
    pub iteration: Option<String>,
}

/// Allocated right before iteration `k`'s first event (its begin marker is
/// an event of its own, so the sample after it is the state it began in).
fn allocated_at_begin(r: &RunView, k: u32) -> Option<u64> {
    let i = r.marks.iteration_begin(k)?;
    r.timeline.sample(i).map(|s| s.allocated)
}

/// The cursor's iteration as the status line names it (`prepare_markers`).
fn iteration_readout(r: &RunView) -> Option<String> {
    let k = r.frame.iteration?;
    let now = allocated_at_begin(r, k)?;
    let change = k
        .checked_sub(1)
        .filter(|p| *p > 0)
        .and_then(|p| allocated_at_begin(r, p))
        .map(|before| match now.cmp(&before) {
            std::cmp::Ordering::Equal => format!(", as iter {} did", k - 1),
            std::cmp::Ordering::Greater => {
                format!(", +{} since iter {}", format_size(now - before), k - 1)
            }
            std::cmp::Ordering::Less => {
                format!(", -{} since iter {}", format_size(before - now), k - 1)
            }
        })
        .unwrap_or_default();
    Some(format!("iter {k} began at {}{change}", format_size(now)))
}

pub fn prepare(r: &RunView) -> StatsFrame {
    let m = r.map.stats();
    let peak = r.timeline.peak_until(r.pos);
    // A file with no trace (state only) says nothing of what came before it.
    let unknown = r.finished && r.timeline.is_empty();
    let peak_of = |bytes: u64| {
        if unknown {
            "unknown: no trace".to_string()
        } else {
            format_size(bytes)
        }
    };
    let mut rows = vec![
        (
            "allocated",
            format!(
                "{}  (peak {})",
                format_size(m.allocated),
                peak_of(peak.allocated)
            ),
        ),
        (
            "reserved",
            format!(
                "{}  (peak {})",
                format_size(m.reserved),
                peak_of(peak.reserved)
            ),
        ),
        ("active", format_size(m.active)),
        (
            "inactive split",
            format!(
                "{} block{} · {}",
                m.inactive_split_blocks,
                if m.inactive_split_blocks == 1 {
                    ""
                } else {
                    "s"
                },
                format_size(m.inactive_split_bytes)
            ),
        ),
        (
            "cached free",
            format!(
                "{}  ({:.1}% of reserved)",
                format_size(m.cached_free),
                m.cached_free_share() * 100.0
            ),
        ),
        (
            "largest free",
            if m.cached_free == 0 {
                format_size(m.largest_free)
            } else {
                format!(
                    "{}  (fragmentation {:.1}%)",
                    format_size(m.largest_free),
                    m.fragmentation() * 100.0
                )
            },
        ),
        (
            "segments",
            format!(
                "{} ({} large, {} small)",
                m.large_segments + m.small_segments,
                m.large_segments,
                m.small_segments
            ),
        ),
        ("OOMs so far", ooms(r)),
        ("event", format!("{} of {}", r.pos, r.len())),
    ];
    if let Some((iteration, e)) = r.compute_at_cursor() {
        let recompute = if e.recompute_share > 0.0 {
            format!(", {:.0}% recompute", e.recompute_share * 100.0)
        } else {
            String::new()
        };
        // In place of the event count, which the status line also shows:
        // the wide layout gives this panel nine rows.
        rows.pop();
        rows.push((
            "compute (est.)",
            format!(
                "~{} iter {iteration}{recompute} (peak-rate floor)",
                format_ms(e.milliseconds)
            ),
        ));
    }
    // A live job's creep over the whole attach (its own memory_stats()),
    // for the device shown: what the timeline cannot keep over hours.
    let device = r.devices.as_ref().map_or(0, |d| d.current) as i64;
    if let Some(t) = r.step_trends.iter().find(|t| t.device == device) {
        if let Some(slope) = t.allocated_per_step {
            // In place of the event count, as the compute estimate does.
            rows.retain(|(k, _)| *k != "event");
            rows.push((
                "per step",
                format!(
                    "{}/step allocated over steps {}–{} (memory_stats)",
                    signed_size(slope),
                    t.first_step,
                    t.last_step
                ),
            ));
        }
    }
    let gaps = r.timeline.gaps().len();
    if gaps > 0 {
        rows.push((
            "trace gaps",
            format!(
                "{} so far  (whole trace: {gaps} entries not placeable)",
                r.timeline.gaps_until(r.pos)
            ),
        ));
    }
    StatsFrame {
        rows,
        iteration: iteration_readout(r),
    }
}

/// OOM entries up to the cursor, then the whole run's: its OOM entries and,
/// when the engine sent its counters, its cudaMalloc retries (no trace entry
/// records a retry, so there is no count of them at the cursor).
fn ooms(r: &RunView) -> String {
    let plural = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let run_ooms = plural(r.timeline.ooms_until(r.len()) as u64, "OOM", "OOMs");
    let run = match &r.stats {
        Some(s) => format!(
            "{run_ooms}, {}",
            plural(s.num_alloc_retries, "retry", "retries")
        ),
        None => run_ooms,
    };
    format!("{}  (run: {run})", r.timeline.ooms_until(r.pos))
}

/// The panel's title with the iteration readout where it fits: beside the
/// run's name, or in its place on a narrow panel.
fn title(r: &RunView, width: u16) -> String {
    let plain = format!(" Stats · {} ", r.title);
    let Some(it) = &r.frame.stats.iteration else {
        return plain;
    };
    let room = usize::from(width.saturating_sub(2));
    [
        format!(" Stats · {} · {it} ", r.title),
        format!(" Stats · {it} "),
    ]
    .into_iter()
    .find(|t| t.chars().count() <= room)
    .unwrap_or(plain)
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
            .title(Span::styled(title(r, area.width), th.title())),
    );
    frame.render_widget(table, area);
}
