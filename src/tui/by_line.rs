//! The "by Python line" pane (`u`): the live bytes at the cursor grouped by
//! the first user frame of their allocation (`trace::sites`, the headless
//! report's rule; a simulated run's op and module), the most first. The
//! selected line's blocks are highlighted on the map and its allocations
//! marked on the timeline.

use std::sync::Arc;

use ratatui::layout::Rect;

use super::run_view::RunView;
use crate::alloc::{format_size, Action};
use crate::producers::SiteKind;
use crate::trace::replay::tag_entry;
use crate::trace::sites::{group_by_site, SiteBytes, NO_STACK};
use crate::trace::timeline::MarkKind;
use crate::trace::Event;
use crate::units::format_count;

/// The pane's state: which line is selected (by its site, so it stays
/// selected as the cursor moves and the order changes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ByLine {
    pub site: Option<Arc<str>>,
    pub scroll: usize,
    /// Only the blocks born since the last step boundary before the cursor
    /// (and live at it): what grew in this step, and which line made it.
    pub since_step: bool,
}

/// Site groups of one map state.
#[derive(Debug, Clone, Default)]
pub(crate) struct SiteCache {
    map_gen: u64,
    /// The first event of the step the groups count from, when they do.
    since: Option<usize>,
    groups: Arc<Vec<SiteBytes>>,
}

/// The events that allocated for the selected site, found incrementally as
/// events arrive.
#[derive(Debug, Clone, Default)]
pub(crate) struct SiteEvents {
    site: Option<Arc<str>>,
    scanned: usize,
    at: Vec<usize>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ByLineRow {
    pub bytes: String,
    pub blocks: String,
    pub site: String,
    pub selected: bool,
    pub unknown: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ByLineFrame {
    pub title: String,
    /// The title without the step's event and the block count, for a pane
    /// too narrow for `title` (a title cut mid-word reads as a bug).
    pub title_short: String,
    pub rows: Vec<ByLineRow>,
    pub footer: String,
    /// Nothing live at the cursor.
    pub empty: bool,
    /// The rows count from the last step.
    pub since_step: bool,
}

/// What the sites of `r` are called.
fn site_kind(r: &RunView) -> SiteKind {
    r.tags
        .as_ref()
        .map_or(SiteKind::PythonLine, |t| t.site_kind())
}

fn unknown_label(kind: SiteKind) -> &'static str {
    match kind {
        SiteKind::PythonLine => NO_STACK,
        SiteKind::EngineOp => "(no op recorded)",
    }
}

impl RunView {
    /// The event where the step at the cursor began (the last iteration
    /// mark at or before it), when the pane counts from there. At a step's
    /// very end (no allocator event since the mark: a live job between two
    /// steps) it is the step that just ended, not the empty one after it.
    pub fn step_start(&self) -> Option<usize> {
        if !self.by_line.as_ref().is_some_and(|p| p.since_step) {
            return None;
        }
        let marks = self.timeline.marks();
        let k = marks.partition_point(|(at, _)| *at <= self.pos);
        let mut starts = marks[..k]
            .iter()
            .rev()
            .filter(|(_, kind)| *kind == MarkKind::Iteration)
            .map(|(at, _)| *at);
        let latest = starts.next()?;
        let has_events = |from: usize| {
            self.timeline
                .events()
                .range(from..self.pos)
                .any(|e| matches!(e, Event::Alloc(_)))
        };
        if has_events(latest) {
            return Some(latest);
        }
        Some(starts.find(|at| has_events(*at)).unwrap_or(latest))
    }

    /// Live bytes at the cursor by site (cached per map state); with the
    /// pane counting from a step, only the blocks born since it began.
    pub fn site_groups(&mut self) -> Arc<Vec<SiteBytes>> {
        let since = self.step_start();
        if self.site_cache.map_gen == self.map_gen && self.site_cache.since == since {
            return self.site_cache.groups.clone();
        }
        let tags = self.tags.clone();
        let born_from = since.map(|at| self.first_entry_from(at));
        let live = self
            .map
            .blocks
            .iter()
            .filter(|(_, b)| b.state.is_active())
            .filter(|(_, b)| match born_from {
                None => true,
                // A block from before the step (or the start state) has an
                // older entry, or none.
                Some(first) => tag_entry(b.tag).is_some_and(|e| e >= first),
            })
            .map(|(a, b)| (*a, b.size, tags.as_ref().and_then(|t| t.site(b.tag, *a))));
        let groups = Arc::new(group_by_site(live, unknown_label(site_kind(self))));
        self.site_cache = SiteCache {
            map_gen: self.map_gen,
            since,
            groups: groups.clone(),
        };
        groups
    }

    /// The trace entry of the first recorded event at or after `at`
    /// (`usize::MAX` when none has come yet: nothing is born since).
    fn first_entry_from(&self, at: usize) -> usize {
        let Some(tags) = &self.tags else {
            return usize::MAX;
        };
        (at..self.timeline.len())
            .find_map(|i| tags.event_entry(i))
            .map_or(usize::MAX, |d| d.entry)
    }

    /// `S`: count from the last step, or show all live bytes; opens the pane.
    pub(crate) fn toggle_since_step(&mut self) {
        match self.by_line.as_mut() {
            Some(p) => p.since_step = !p.since_step,
            None => {
                self.by_line = Some(ByLine {
                    since_step: true,
                    ..ByLine::default()
                });
            }
        }
        self.move_site(0);
    }

    /// The blocks of the selected line, when the pane is open (ascending).
    pub(crate) fn site_highlight(&self) -> Option<Vec<u64>> {
        let site = self.by_line.as_ref()?.site.as_ref()?;
        if self.site_cache.map_gen != self.map_gen || self.site_cache.since != self.step_start() {
            return None;
        }
        let g = self.site_cache.groups.iter().find(|g| g.site == *site)?;
        Some(g.blocks.clone())
    }

    /// Move the selection by `delta` lines; select the line's largest block
    /// on the map, so `b` shows its stack.
    pub(crate) fn move_site(&mut self, delta: isize) -> bool {
        self.sync_map();
        let groups = self.site_groups();
        let Some(pane) = self.by_line.as_mut() else {
            return false;
        };
        if groups.is_empty() {
            return false;
        }
        let cur = pane
            .site
            .as_ref()
            .and_then(|s| groups.iter().position(|g| g.site == *s));
        let last = groups.len() as isize - 1;
        let next = match cur {
            Some(i) => (i as isize + delta).clamp(0, last) as usize,
            None if delta >= 0 => 0,
            None => last as usize,
        };
        self.select_site(next)
    }

    /// Select line `index` of the list at the cursor (a click).
    pub(crate) fn select_site(&mut self, index: usize) -> bool {
        let groups = self.site_groups();
        let (Some(pane), Some(g)) = (self.by_line.as_mut(), groups.get(index)) else {
            return false;
        };
        pane.site = Some(g.site.clone());
        let map = &self.map;
        self.sel_block = g
            .blocks
            .iter()
            .max_by_key(|a| {
                (
                    map.blocks.get(a).map_or(0, |b| b.size),
                    std::cmp::Reverse(**a),
                )
            })
            .copied();
        true
    }

    /// Open the pane on its top line, or close it.
    pub(crate) fn toggle_by_line(&mut self) {
        if self.by_line.take().is_none() {
            self.by_line = Some(ByLine::default());
            self.move_site(0);
        }
    }

    /// Event indices that allocated for the selected line (ascending).
    pub(crate) fn site_events(&mut self) -> &[usize] {
        let site = self.by_line.as_ref().and_then(|p| p.site.clone());
        if self.site_events.site != site {
            self.site_events = SiteEvents {
                site,
                ..SiteEvents::default()
            };
        }
        let len = self.timeline.len();
        if let (Some(site), Some(tags)) = (&self.site_events.site, &self.tags) {
            let from = self.site_events.scanned.min(len);
            for (i, e) in self.timeline.events().range(from..len).enumerate() {
                if let Event::Alloc(a) = e {
                    if a.action == Action::Alloc
                        && tags.site(a.tag, a.addr).is_some_and(|s| s == *site)
                    {
                        self.site_events.at.push(from + i);
                    }
                }
            }
        }
        self.site_events.scanned = len;
        &self.site_events.at
    }
}

/// The pane's rows for `height` lines inside its border.
pub fn prepare(r: &mut RunView, height: usize) -> ByLineFrame {
    let groups = r.site_groups();
    let since = r.step_start();
    let counting = r.by_line.as_ref().is_some_and(|p| p.since_step);
    let kind = site_kind(r);
    let Some(pane) = r.by_line.as_mut() else {
        return ByLineFrame::default();
    };
    let sel = pane
        .site
        .as_ref()
        .and_then(|s| groups.iter().position(|g| g.site == *s));
    let height = height.max(1);
    if let Some(i) = sel {
        if i < pane.scroll {
            pane.scroll = i;
        } else if i >= pane.scroll + height {
            pane.scroll = i + 1 - height;
        }
    }
    pane.scroll = pane.scroll.min(groups.len().saturating_sub(height));
    let total: u64 = groups.iter().map(|g| g.bytes).fold(0, u64::saturating_add);
    let blocks: usize = groups.iter().map(|g| g.blocks.len()).sum();
    let (what, note) = match kind {
        SiteKind::PythonLine => ("Python line", ""),
        SiteKind::EngineOp => ("op", " · a simulated run has no Python lines"),
    };
    let scope = match (counting, since) {
        (false, _) => "Live".to_string(),
        (true, Some(at)) => format!("Grown since step (event {})", format_count(at as u64)),
        (true, None) => "Live (no step yet)".to_string(),
    };
    let title = format!(
        " {scope} by {what} · {} · {} block{} · {} line{}{note} ",
        format_size(total),
        format_count(blocks as u64),
        if blocks == 1 { "" } else { "s" },
        format_count(groups.len() as u64),
        if groups.len() == 1 { "" } else { "s" }
    );
    let short_scope = match (counting, since) {
        (false, _) => "Live",
        (true, Some(_)) => "Grown since step",
        (true, None) => "Live (no step yet)",
    };
    let title_short = format!(
        " {short_scope} by {what} · {} · {} line{} ",
        format_size(total),
        format_count(groups.len() as u64),
        if groups.len() == 1 { "" } else { "s" }
    );
    let rows = groups
        .iter()
        .enumerate()
        .skip(pane.scroll)
        .take(height)
        .map(|(i, g)| ByLineRow {
            bytes: format_size(g.bytes),
            blocks: format_count(g.blocks.len() as u64),
            site: g.site.to_string(),
            selected: Some(i) == sel,
            unknown: g.unknown,
        })
        .collect();
    ByLineFrame {
        title,
        title_short,
        rows,
        footer: if counting {
            " j/k line · b its stack · S all live · u/Esc close ".into()
        } else {
            " j/k line · b its stack · S since the step · u/Esc close ".into()
        },
        empty: groups.is_empty(),
        since_step: counting,
    }
}

/// Timeline columns holding an allocation of the selected line.
pub fn timeline_marks(r: &mut RunView, from: usize, to: usize, width: u16) -> Vec<bool> {
    let w = usize::from(width);
    let mut cols = vec![false; w];
    if r.by_line.is_none() || to <= from || w == 0 {
        return cols;
    }
    let span = to - from;
    let at = r.site_events();
    let start = at.partition_point(|i| *i < from);
    for i in at[start..].iter().take_while(|i| **i < to) {
        cols[((i - from) * w / span).min(w - 1)] = true;
    }
    cols
}

/// The pane's place: the bottom of the map's area.
pub fn split(map: Rect) -> (Rect, Rect) {
    let h = (map.height * 2 / 5)
        .clamp(5, 18)
        .min(map.height.saturating_sub(5));
    let top = Rect {
        height: map.height - h,
        ..map
    };
    let pane = Rect {
        y: map.y + top.height,
        height: h,
        ..map
    };
    (top, pane)
}
