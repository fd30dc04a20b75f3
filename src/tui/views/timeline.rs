//! Allocated and reserved bytes over event index, downsampled per column with
//! `Timeline::range_summary` (min/max buckets), with the peak so far at the
//! cursor (`Timeline::peak_until`) and device capacity lines,
//! iteration/phase/OOM/narration marks on the bottom row and the cursor. The
//! title's figures are the cursor's.

use crate::alloc::format_size;
use crate::trace::timeline::BUCKET;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::Span;
use ratatui::widgets::{Block, Borders};
use ratatui::Frame;

use crate::tui::app::{App, RunView};
use crate::tui::layout::{self, Focus};
use crate::tui::marks::Glyph;
use crate::tui::theme::Theme;
use crate::tui::views::segment_map::HIGHLIGHT_GLYPH;

const EIGHTHS: [&str; 9] = [" ", "▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"];

/// Columns depend on the view range, the events, the size and the scale,
/// not on the cursor: moving the cursor reuses them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnCache {
    key: (usize, usize, usize, usize, u16, u64),
    cols: Vec<(u32, u32)>,
    marks: Vec<Option<Glyph>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimelineFrame {
    pub inner: Rect,
    /// Event range shown, `[from, to)`.
    pub from: usize,
    pub to: usize,
    /// Per column: (allocated, reserved) heights in eighths of a row.
    pub cols: Vec<(u32, u32)>,
    pub marks: Vec<Option<Glyph>>,
    pub cursor_col: Option<u16>,
    pub peak_lvl: Option<u32>,
    pub cap_lvl: Option<u32>,
    pub graph_h: u16,
    /// The bytes at the top of the graph.
    pub ymax: u64,
    pub title: String,
    /// The title's figures carry the curves' glyphs, and the legend leaves
    /// them out (see [`super::legend::curves_in_title`]).
    pub curves_in_title: bool,
    /// Columns holding an allocation of the "by Python line" selection.
    pub site_marks: Vec<bool>,
    /// Which of the legend's curves the graph draws (`legend::CURVES`).
    pub curves: [bool; 5],
    /// Said in the graph where there is nothing to draw.
    pub empty_note: Option<&'static str>,
}

impl TimelineFrame {
    /// The first event of the column under screen `x`.
    pub fn event_at_x(&self, x: u16) -> Option<usize> {
        let w = usize::from(self.inner.width);
        if w == 0 || self.to <= self.from {
            return None;
        }
        let c = usize::from(x.checked_sub(self.inner.x)?).min(w - 1);
        Some(self.from + (self.to - self.from) * c / w)
    }
}

/// The timeline of `r` in `area`, drawn up to `ymax` bytes ([`scale_max`]
/// of the run, or the largest of the runs compared).
pub fn prepare(r: &mut RunView, area: Rect, ymax: u64) -> TimelineFrame {
    let inner = layout::inner(area);
    let len = r.timeline.len();
    // Keep the cursor in a zoomed view (playback, steps).
    let (mut from, mut to) = r.timeline_range();
    if r.tl_zoom > 1 && (r.pos < from || r.pos > to) {
        r.tl_anchor = r.pos;
        (from, to) = r.timeline_range();
    }
    let w = usize::from(inner.width);
    let graph_h = if inner.height >= 3 {
        inner.height - 1
    } else {
        inner.height
    };
    let ymax = ymax.max(1);
    let lvl = |bytes: u64| (u128::from(bytes) * u128::from(graph_h) * 8 / u128::from(ymax)) as u32;
    let span = to - from;
    let key = (from, to, len, w, graph_h, ymax);
    let (cols, marks) = match &r.tl_cache {
        Some(c) if c.key == key => (c.cols.clone(), c.marks.clone()),
        _ => {
            let (cols, marks) = columns(r, from, span, w, &lvl);
            r.tl_cache = Some(ColumnCache {
                key,
                cols: cols.clone(),
                marks: marks.clone(),
            });
            (cols, marks)
        }
    };
    let cursor_col = r
        .cursor()
        .filter(|c| *c >= from && *c < to && span > 0)
        .map(|c| ((c - from) * w / span) as u16);
    let cap_lvl = r.capacity.filter(|c| *c <= ymax).map(lvl);
    // A file with no trace (state only) says nothing of what came before it.
    let peak_known = !(r.finished && r.timeline.is_empty());
    let peak = r.timeline.peak_until(r.pos).allocated;
    let peak_text = if peak_known {
        format_size(peak)
    } else {
        "unknown (no trace)".to_string()
    };
    let peak_lvl = (peak_known && peak > 0).then(|| lvl(peak));
    let drawn = len > 0;
    let curves = [
        drawn,
        drawn,
        drawn && peak_lvl.is_some(),
        drawn && cap_lvl.is_some(),
        cursor_col.is_some(),
    ];
    let empty_note = (!drawn).then_some(if r.finished {
        "No trace in this file: nothing over time. The map shows what it saved."
    } else {
        "No events yet."
    });
    // Where the legend cannot name the curves, the figures do.
    let curves_in_title = super::legend::curves_in_title(inner.width, &marks, curves);
    let [a, rs, pk, cp] = if curves_in_title {
        ["█ ", "░ ", "┄ ", "━ "]
    } else {
        [""; 4]
    };
    let figures = format!(
        "{a}alloc {} · {rs}reserved {} · {pk}peak {}{}",
        format_size(r.map.allocated),
        format_size(r.map.reserved),
        peak_text,
        r.capacity
            .map(|c| format!(" · {cp}cap {}", format_size(c)))
            .unwrap_or_default(),
    );
    let zoom = if r.tl_zoom > 1 {
        format!(" · ×{}", r.tl_zoom)
    } else {
        String::new()
    };
    // The figures are what the title is for: on a narrow panel the event
    // range and then the panel's name give way to them.
    let room = usize::from(area.width.saturating_sub(2));
    let title = [
        format!(" Timeline · {figures} · ev {from}–{to}/{len}{zoom} "),
        format!(" Timeline · {figures}{zoom} "),
        format!(" {figures}{zoom} "),
    ]
    .into_iter()
    .find(|t| t.chars().count() <= room)
    .unwrap_or_else(|| format!(" {figures}{zoom} "));
    TimelineFrame {
        inner,
        from,
        to,
        cols,
        marks,
        cursor_col,
        peak_lvl,
        cap_lvl,
        graph_h,
        ymax,
        title,
        curves_in_title,
        site_marks: Vec::new(),
        curves,
        empty_note,
    }
}

/// Per-column curve heights and marks. Wide columns start on bucket
/// boundaries so `range_summary` merges whole buckets, not single samples.
#[allow(clippy::type_complexity)]
fn columns(
    r: &RunView,
    from: usize,
    span: usize,
    w: usize,
    lvl: &dyn Fn(u64) -> u32,
) -> (Vec<(u32, u32)>, Vec<Option<Glyph>>) {
    let len = r.timeline.len();
    let aligned = w > 0 && span / w >= 2 * BUCKET;
    let edge = |c: usize| {
        let e = from + span * c / w.max(1);
        if aligned && c > 0 && c < w {
            e - e % BUCKET
        } else {
            e
        }
    };
    let mut cols = Vec::with_capacity(w);
    let mut marks = Vec::with_capacity(w);
    for c in 0..w {
        let a = edge(c);
        let b_own = edge(c + 1);
        // Zoomed in past one event per column, neighbours repeat the curve
        // but only one column carries the event's mark.
        let b = b_own.max(a + 1).min(len);
        match r.timeline.range_summary(a, b) {
            Some(s) => cols.push((lvl(s.max_allocated), lvl(s.max_reserved))),
            None => cols.push((0, 0)),
        }
        marks.push(if a < b_own {
            r.marks.glyph_in(a, b_own.min(len))
        } else {
            None
        });
    }
    (cols, marks)
}

/// The top of the y axis: the device when usage is near it (so "how close to
/// OOM" is visible), otherwise a little above the reserved peak.
pub fn scale_max(r: &RunView) -> u64 {
    let peak = r
        .timeline
        .peak_reserved()
        .max(r.timeline.peak_allocated())
        .max(1);
    match r.capacity {
        Some(cap) if cap > 0 && cap <= peak.saturating_mul(3) / 2 => cap.max(peak),
        _ => peak + peak / 10 + 1,
    }
}

pub fn render(frame: &mut Frame, area: Rect, app: &App, run: usize) {
    let Some(r) = app.runs.get(run) else { return };
    let th = &app.theme;
    let t = &r.frame.timeline;
    let focused = app.focus == Focus::Timeline && app.active == run;
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.border(focused))
        .title(Span::styled(t.title.as_str(), th.title()))
        .title_bottom(super::legend::timeline(
            th,
            area.width.saturating_sub(2),
            &t.marks,
            t.curves_in_title,
            t.curves,
        ));
    frame.render_widget(block, area);
    let inner = t.inner;
    if inner.width == 0 || inner.height == 0 || inner != layout::inner(area) {
        return;
    }
    let p = &th.palette;
    let buf = frame.buffer_mut();
    let gh = u32::from(t.graph_h);
    for (c, (alloc, res)) in t.cols.iter().enumerate() {
        let x = inner.x + c as u16;
        let is_cursor = t.cursor_col == Some(c as u16);
        for row in 0..gh {
            let y = inner.y + (gh - 1 - row) as u16;
            let (lo, hi) = (row * 8, row * 8 + 8);
            let (glyph, style): (&str, Style) = if *alloc >= hi {
                ("█", th.fg(p.allocated_line))
            } else if *alloc > lo {
                let s = if *res >= hi {
                    th.fg_bg(p.allocated_line, p.reserved_line)
                } else {
                    th.fg(p.allocated_line)
                };
                (EIGHTHS[(*alloc - lo) as usize], s)
            } else if *res >= lo + 4 {
                ("░", th.fg(p.reserved_line))
            } else if is_cursor {
                ("│", th.fg(p.cursor))
            } else if t.cap_lvl.is_some_and(|l| l >= lo && l < hi) {
                ("━", th.fg(p.capacity))
            } else if t.peak_lvl.is_some_and(|l| l >= lo && l < hi) {
                ("┄", th.fg(p.peak))
            } else {
                (" ", Style::default())
            };
            buf[(x, y)].set_symbol(glyph).set_style(style);
        }
        if inner.height > t.graph_h {
            let y = inner.y + t.graph_h;
            let (glyph, style) = if is_cursor {
                ("▲", th.fg(p.cursor))
            } else if t.site_marks.get(c).copied().unwrap_or(false) {
                (HIGHLIGHT_GLYPH, th.fg(p.highlight))
            } else {
                match t.marks.get(c).copied().flatten() {
                    Some(g) => (g.symbol(), mark_style(th, g)),
                    None => (" ", Style::default()),
                }
            };
            buf[(x, y)].set_symbol(glyph).set_style(style);
        }
    }
    if app.layout_mode == layout::LayoutMode::Presenter && inner.height > t.graph_h {
        spell_phases(buf, t, inner.x, inner.y + t.graph_h, th);
    }
    if let Some(note) = t.empty_note {
        let text = super::fit_head(note, usize::from(inner.width));
        let x = inner.x + (inner.width.saturating_sub(text.chars().count() as u16)) / 2;
        buf.set_string(x, inner.y + t.graph_h / 2, text, th.dim());
        return;
    }
    // The top of the scale, at the top left where a run starts low: compared
    // runs share it, and this says so.
    let label = format!("{}┤", format_size(t.ymax));
    let len = label.chars().count() as u16;
    if t.graph_h >= 3 && inner.width >= len.saturating_mul(3) {
        buf.set_string(inner.x, inner.y, label, th.dim());
    }
}

/// A phase's name in full, then short, for the presenter's mark row; the
/// first letter is the mark's own glyph.
fn phase_words(g: Glyph) -> Option<[&'static str; 2]> {
    use crate::trace::Phase;
    Some(match g {
        Glyph::Phase(Phase::Forward) => ["forward", "fwd"],
        Glyph::Phase(Phase::Backward) => ["backward", "bwd"],
        Glyph::Phase(Phase::Optimizer) => ["optimizer", "opt"],
        Glyph::Phase(Phase::Eval) => ["eval", "eval"],
        Glyph::ZeroGrad => ["zero_grad", "zero"],
        _ => return None,
    })
}

/// Presenter: a phase mark followed by empty columns is spelled out there
/// (`forward`, else `fwd`), never over another mark or the cursor.
fn spell_phases(buf: &mut ratatui::buffer::Buffer, t: &TimelineFrame, x0: u16, y: u16, th: &Theme) {
    let w = t.marks.len();
    let free = |c: usize| {
        c < w
            && t.marks[c].is_none()
            && t.cursor_col != Some(c as u16)
            && !t.site_marks.get(c).copied().unwrap_or(false)
    };
    let mut c = 0;
    while c < w {
        // Right after another phase's letter a word would read as one
        // with it (`fbwd`): the letters stay.
        let after_letter = c > 0 && t.marks[c - 1].is_some_and(|g| phase_words(g).is_some());
        let words = t.marks[c]
            .filter(|_| t.cursor_col != Some(c as u16) && !after_letter)
            .and_then(phase_words);
        let Some(words) = words else {
            c += 1;
            continue;
        };
        let room = (c + 1..w).take_while(|&k| free(k)).count();
        // One empty column is left after the word, so words never touch.
        let fit = words
            .into_iter()
            .find(|word| word.chars().count() < room + 1);
        if let (Some(word), Some(g)) = (fit, t.marks[c]) {
            buf.set_string(x0 + c as u16, y, word, mark_style(th, g));
            c += word.chars().count();
        } else {
            c += 1;
        }
    }
}

pub(super) fn mark_style(th: &Theme, g: Glyph) -> Style {
    let p = &th.palette;
    match g {
        Glyph::Oom | Glyph::Error => th.fg(p.oom),
        Glyph::Narration => th.fg(p.narration),
        Glyph::Iteration => th.fg(p.iteration),
        Glyph::Phase(_) | Glyph::ZeroGrad => th.fg(p.phase),
    }
}
