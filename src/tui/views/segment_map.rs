//! The segment/block map: one row per segment (an expandable reservation's
//! mapped and unmapped ranges share a row), grouped by pool under headers,
//! blocks drawn to scale inside the row. Each cell shows the block covering
//! most of its bytes, so the picture stays honest at any zoom; `z` zooms in
//! to see small blocks. States differ by glyph as well as colour (NO_COLOR).

use std::collections::HashMap;

use crate::alloc::{format_size, BlockState, Pool, Tag};
use crate::trace::MemoryMap;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use ratatui::Frame;

use super::legend;
use crate::tui::app::{App, ColorMode, RunView};
use crate::tui::layout;
use crate::tui::theme::{Theme, CATEGORY_LETTERS, CATEGORY_LETTERS_PENDING};

mod detail;
mod rows;

use detail::detail_lines;
pub use rows::{block_order, row_spans, segment_order};

/// Width of the per-row label (`L* 20.0M `).
const LABEL_W: u16 = 10;
/// Lines of the selected-block detail at the bottom of the panel.
const DETAIL_H: u16 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CellKind {
    #[default]
    Empty,
    Allocated,
    Pending,
    /// A free block in a segment that also holds other blocks (PyTorch's
    /// `inactive_split`: what fragmentation is made of).
    InactiveSplit,
    /// A free block that is a whole segment: cached, releasable by `empty_cache`.
    CachedFree,
    /// Expandable pages that were mapped once and are unmapped now.
    Unmapped,
}

impl CellKind {
    pub fn glyph(self, alt: bool) -> &'static str {
        match self {
            CellKind::Empty => " ",
            CellKind::Allocated if alt => "▓",
            CellKind::Allocated => "█",
            CellKind::Pending => "▒",
            CellKind::InactiveSplit => "░",
            CellKind::CachedFree => "·",
            CellKind::Unmapped => "╌",
        }
    }
}

/// Glyph of cells holding a block of the selected leak finding.
pub const HIGHLIGHT_GLYPH: &str = "▚";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MapCell {
    pub kind: CellKind,
    /// Neighbouring blocks alternate, so block boundaries stay visible.
    pub alt: bool,
    /// Address of the block drawn here (0: none).
    pub block: u64,
    pub cat: Option<u8>,
    pub highlighted: bool,
    pub selected: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapRow {
    Header(String),
    Segment {
        start: u64,
        label: String,
        cells: Vec<MapCell>,
    },
}

/// One row of the map before drawing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowSpan {
    Header {
        pool: Pool,
        segments: usize,
        bytes: u64,
    },
    Segment {
        start: u64,
        size: u64,
        pool: Pool,
        expandable: bool,
    },
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapFrame {
    pub area: Option<Rect>,
    /// The visible rows, top to bottom.
    pub rows: Vec<MapRow>,
    pub first_row: usize,
    pub total_rows: usize,
    /// Screen x of the first bar cell and the bar width in cells.
    pub bar_x: u16,
    pub bar_width: usize,
    pub rows_y: u16,
    pub detail: Vec<String>,
    pub zoom: u32,
    /// Segments above and below the rows in view (the title says so).
    pub hidden_above: usize,
    pub hidden_below: usize,
}

/// What the rows in view draw, for the legend (which names only that).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drawn {
    pub kinds: Vec<CellKind>,
    /// `▓`: an allocated block beside another.
    pub alt: bool,
    pub cats: Vec<Option<u8>>,
    pub highlighted: bool,
}

impl Drawn {
    fn note(&mut self, c: &MapCell) {
        if c.highlighted {
            self.highlighted = true;
        }
        if c.kind == CellKind::Empty {
            return;
        }
        if !self.kinds.contains(&c.kind) {
            self.kinds.push(c.kind);
        }
        if c.kind == CellKind::Allocated && c.alt {
            self.alt = true;
        }
        if matches!(c.kind, CellKind::Allocated | CellKind::Pending) && !self.cats.contains(&c.cat)
        {
            self.cats.push(c.cat);
        }
    }
}

impl MapFrame {
    /// What the rows in view draw.
    pub fn drawn(&self) -> Drawn {
        let mut d = Drawn::default();
        for row in &self.rows {
            if let MapRow::Segment { cells, .. } = row {
                cells.iter().for_each(|c| d.note(c));
            }
        }
        d
    }

    /// The block drawn at screen cell `(x, y)`.
    pub fn block_at_cell(&self, x: u16, y: u16) -> Option<u64> {
        let row = self.rows.get(usize::from(y.checked_sub(self.rows_y)?))?;
        let col = usize::from(x.checked_sub(self.bar_x)?);
        match row {
            MapRow::Segment { cells, .. } => cells.get(col).map(|c| c.block).filter(|a| *a != 0),
            MapRow::Header(_) => None,
        }
    }
}

/// Compact size for row labels: `512B`, `20.0M`, `1.5G`.
pub fn short_size(bytes: u64) -> String {
    const K: f64 = 1024.0;
    let b = bytes as f64;
    if b < K {
        format!("{bytes}B")
    } else if b < K * K {
        format!("{:.0}K", b / K)
    } else if b < K * K * K {
        format!("{:.1}M", b / (K * K))
    } else {
        format!("{:.1}G", b / (K * K * K))
    }
}

/// Visible rows with their cells, and the detail of the selected block.
pub fn prepare(
    r: &mut RunView,
    area: Option<Rect>,
    highlighted: &[u64],
    mode: ColorMode,
    cats: &HashMap<Tag, Option<u8>>,
) -> MapFrame {
    let Some(area) = area else {
        return MapFrame::default();
    };
    let inner = layout::inner(area);
    // The "by Python line" pane below says what the selection is.
    let detail_h = if r.sel_block.is_some() && r.by_line.is_none() && inner.height > DETAIL_H + 2 {
        DETAIL_H
    } else {
        0
    };
    let rows_h = usize::from(inner.height.saturating_sub(detail_h));
    let spans = r.row_spans().to_vec();
    // Keep the selected block's row in view.
    if let Some(sel) = r.sel_block {
        if let Some(row) = spans.iter().position(|s| matches!(s, RowSpan::Segment { start, size, .. } if sel >= *start && sel < start + size)) {
            if row < r.map_scroll_y {
                r.map_scroll_y = row.saturating_sub(1);
            } else if rows_h > 0 && row >= r.map_scroll_y + rows_h {
                r.map_scroll_y = row + 1 - rows_h;
            }
        }
    }
    r.map_scroll_y = r.map_scroll_y.min(spans.len().saturating_sub(rows_h));
    let bar_width = usize::from(inner.width.saturating_sub(LABEL_W));
    let virt = bar_width * r.map_zoom.max(1) as usize;
    r.map_scroll_x = r.map_scroll_x.min(virt.saturating_sub(bar_width));
    let ctx = CellCtx {
        map: &r.map,
        highlighted,
        selected: r.sel_block,
        mode,
        cats,
        virt,
        scroll_x: r.map_scroll_x,
        width: bar_width,
    };
    let rows = spans
        .iter()
        .skip(r.map_scroll_y)
        .take(rows_h)
        .map(|s| match *s {
            RowSpan::Header {
                pool,
                segments,
                bytes,
            } => MapRow::Header(format!(
                "{} pool · {segments} segment{} · {}",
                pool.name(),
                if segments == 1 { "" } else { "s" },
                format_size(bytes)
            )),
            RowSpan::Segment {
                start,
                size,
                pool,
                expandable,
            } => MapRow::Segment {
                start,
                label: format!(
                    "{}{}{:>7}",
                    if pool == Pool::Large { 'L' } else { 'S' },
                    if expandable { '*' } else { ' ' },
                    short_size(size)
                ),
                cells: ctx.cells(start, size),
            },
        })
        .collect();
    let is_segment = |s: &RowSpan| matches!(s, RowSpan::Segment { .. });
    let hidden_above = spans
        .iter()
        .take(r.map_scroll_y)
        .filter(|s| is_segment(s))
        .count();
    let hidden_below = spans
        .iter()
        .skip(r.map_scroll_y + rows_h)
        .filter(|s| is_segment(s))
        .count();
    MapFrame {
        hidden_above,
        hidden_below,
        area: Some(area),
        rows,
        first_row: r.map_scroll_y,
        total_rows: spans.len(),
        bar_x: inner.x + LABEL_W,
        bar_width,
        rows_y: inner.y,
        detail: if detail_h > 0 {
            detail_lines(r, usize::from(inner.width))
        } else {
            Vec::new()
        },
        zoom: r.map_zoom,
    }
}

struct CellCtx<'a> {
    map: &'a MemoryMap,
    highlighted: &'a [u64],
    selected: Option<u64>,
    mode: ColorMode,
    cats: &'a HashMap<Tag, Option<u8>>,
    virt: usize,
    scroll_x: usize,
    width: usize,
}

impl CellCtx<'_> {
    /// Cells `[scroll_x, scroll_x + width)` of the row `[start, start+size)`
    /// at `virt` cells for the whole row. Work is O(pieces + visible cells).
    fn cells(&self, start: u64, size: u64) -> Vec<MapCell> {
        let mut best: Vec<(u64, MapCell)> = vec![(0, MapCell::default()); self.width];
        if size == 0 || self.width == 0 {
            return Vec::new();
        }
        let end = start + size;
        let virt = self.virt as u128;
        let col_of = |off: u64| (u128::from(off) * virt / u128::from(size)) as usize;
        let byte_of = |col: usize| (col as u128 * u128::from(size) / virt) as u64;
        let mut ordinal = 0usize;
        let mut place = |a: u64, len: u64, cell: MapCell| {
            let (off, off_end) = (a - start, a - start + len);
            let c0 = col_of(off).max(self.scroll_x);
            let c1 = (col_of(off_end) + 1)
                .min(self.scroll_x + self.width)
                .min(self.virt);
            for c in c0..c1 {
                let cover = off_end
                    .min(byte_of(c + 1))
                    .saturating_sub(off.max(byte_of(c)));
                let slot = &mut best[c - self.scroll_x];
                if cover > slot.0 {
                    *slot = (cover, cell);
                }
            }
        };
        for (a, b) in self.map.blocks.range(start..end) {
            let seg_size = self.map.segment_at(*a).map_or(0, |(_, s)| s.size);
            let kind = match b.state {
                BlockState::ActiveAllocated => CellKind::Allocated,
                BlockState::ActivePendingFree => CellKind::Pending,
                BlockState::Inactive if b.size < seg_size => CellKind::InactiveSplit,
                BlockState::Inactive => CellKind::CachedFree,
            };
            let cat = match self.mode {
                ColorMode::Category => self.cats.get(&b.tag).copied().flatten(),
                ColorMode::State => None,
            };
            place(
                *a,
                b.size,
                MapCell {
                    kind,
                    alt: ordinal % 2 == 1,
                    block: *a,
                    cat,
                    highlighted: self.highlighted.binary_search(a).is_ok(),
                    selected: self.selected == Some(*a),
                },
            );
            ordinal += 1;
        }
        for (a, (len, _)) in self.map.unmapped.range(start..end) {
            place(
                *a,
                *len,
                MapCell {
                    kind: CellKind::Unmapped,
                    ..MapCell::default()
                },
            );
        }
        best.into_iter().map(|(_, c)| c).collect()
    }
}

pub fn render(frame: &mut Frame, area: Rect, app: &App, run: usize) {
    let Some(r) = app.runs.get(run) else { return };
    let th = &app.theme;
    let m = &r.frame.map;
    let focused = app.focus == crate::tui::layout::Focus::Map && app.active == run;
    let mode = match app.color_mode {
        ColorMode::State => "by state",
        ColorMode::Category => "by category",
    };
    let title = format!(
        " Memory map · {} · {mode}{} ",
        r.title,
        if m.zoom > 1 {
            format!(" · zoom ×{}", m.zoom)
        } else {
            String::new()
        }
    );
    let mut block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.border(focused))
        .title_bottom(legend::map(
            th,
            app.color_mode,
            r.by_line.is_some(),
            area.width.saturating_sub(2),
            m.rows
                .iter()
                .any(|r| matches!(r, MapRow::Segment { .. }))
                .then(|| m.drawn())
                .as_ref(),
        ));
    // Segments out of view are said, or a room never knows they exist;
    // on a narrow map the words give way before the count does.
    let more = match (m.hidden_above, m.hidden_below) {
        (0, 0) => None,
        (0, b) => Some([format!(" ↓ {b} more (PgDn) "), format!(" ↓ {b} more ")]),
        (a, 0) => Some([format!(" ↑ {a} more (PgUp) "), format!(" ↑ {a} more ")]),
        (a, b) => Some([format!(" ↑ {a} · ↓ {b} more "), format!(" ↑{a} ↓{b} ")]),
    };
    let room = usize::from(area.width.saturating_sub(2));
    let short_title = format!(" Map · {} ", r.title);
    let (title, more) = match more {
        None => (title, None),
        Some([long, short]) => {
            let w = |a: &str, b: &str| a.chars().count() + b.chars().count() + 1;
            if w(&title, &long) <= room {
                (title, Some(long))
            } else if w(&title, &short) <= room {
                (title, Some(short))
            } else if w(&short_title, &short) <= room {
                (short_title, Some(short))
            } else {
                (title, None)
            }
        }
    };
    block = block.title(Span::styled(title, th.title()));
    if let Some(more) = more {
        block = block.title(Line::styled(more, th.title()).right_aligned());
    }
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if m.total_rows == 0 {
        let msg = if r.loading.is_some() {
            "reading the file… (the status line says how far)"
        } else if r.is_empty() && r.is_live() {
            "waiting for events…"
        } else {
            "no segments at this event"
        };
        frame.render_widget(Paragraph::new(msg).style(th.dim()), inner);
        return;
    }
    let buf = frame.buffer_mut();
    for (i, row) in m.rows.iter().enumerate() {
        let y = m.rows_y + i as u16;
        if y >= inner.y + inner.height {
            break;
        }
        match row {
            MapRow::Header(text) => {
                let line = Line::from(vec![Span::styled(format!("── {text} "), th.title())]);
                buf.set_line(inner.x, y, &line, inner.width);
            }
            MapRow::Segment { label, cells, .. } => {
                buf.set_stringn(inner.x, y, label, usize::from(LABEL_W), th.dim());
                for (c, cell) in cells.iter().enumerate() {
                    let x = m.bar_x + c as u16;
                    if x >= inner.x + inner.width {
                        break;
                    }
                    let (glyph, style) = cell_look(th, app.color_mode, cell);
                    buf[(x, y)].set_symbol(glyph).set_style(style);
                }
            }
        }
    }
    if !m.detail.is_empty() {
        let h = (m.detail.len() as u16).min(DETAIL_H);
        let d = Rect {
            y: inner.y + inner.height - h,
            height: h,
            ..inner
        };
        let lines: Vec<Line> = m
            .detail
            .iter()
            .map(|t| Line::styled(t.as_str(), th.text()))
            .collect();
        frame.render_widget(Paragraph::new(lines), d);
    }
}

/// A cell's glyph: its state's, or in the category view its category's
/// letter (in its colour too: no category told apart by colour alone).
fn glyph_of(th: &Theme, mode: ColorMode, c: &MapCell) -> &'static str {
    let letters = match c.kind {
        CellKind::Allocated => &CATEGORY_LETTERS,
        CellKind::Pending => &CATEGORY_LETTERS_PENDING,
        _ => return c.kind.glyph(c.alt),
    };
    match (th.no_color, mode, c.cat) {
        (_, ColorMode::Category, Some(i)) => letters
            .get(usize::from(i))
            .copied()
            .unwrap_or_else(|| c.kind.glyph(c.alt)),
        _ => c.kind.glyph(c.alt),
    }
}

fn cell_look(th: &Theme, mode: ColorMode, c: &MapCell) -> (&'static str, Style) {
    let p = &th.palette;
    let color = match (c.kind, mode) {
        (CellKind::Allocated | CellKind::Pending, ColorMode::Category) => th.category(c.cat),
        (CellKind::Allocated, _) if c.alt => p.allocated_alt,
        (CellKind::Allocated, _) => p.allocated,
        (CellKind::Pending, _) => p.pending,
        (CellKind::InactiveSplit, _) => p.inactive_split,
        (CellKind::CachedFree, _) => p.cached_free,
        (CellKind::Unmapped | CellKind::Empty, _) => p.unmapped,
    };
    let (glyph, mut style) = if c.highlighted {
        (HIGHLIGHT_GLYPH, th.fg(p.highlight))
    } else {
        (glyph_of(th, mode, c), th.fg(color))
    };
    if c.selected {
        // Reverse video works without colour too.
        style = style.add_modifier(Modifier::REVERSED);
    }
    (glyph, style)
}
