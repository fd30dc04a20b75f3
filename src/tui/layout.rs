//! Where each panel goes for a terminal size, a focus and one or two runs.
//! A pure function of its inputs: drawing and mouse hit-testing use the same
//! [`Areas`], so a click always lands on what was drawn.
//!
//! - wide single run (≥ 110×30): map and timeline on the left; stats, leaks
//!   and event log on the right;
//! - compact single run: the focused panel (map unless leaks/stats/log has
//!   focus) above the timeline; the others are one Tab away;
//! - compare: left/right halves with map + timeline each, and a shared row
//!   below for both runs' stats (or the focused leaks/log of the active run);
//! - presenter (single run, for a projector): code and map on top, a large
//!   narration box (and the leak panel beside it where wide enough), the
//!   timeline; no stats or event log unless Tab focuses them.
//!
//! A single run's code pane, where asked for, takes the left of the map's area.

use std::sync::Arc;

use ratatui::layout::{Constraint, Direction, Layout, Rect};

use super::callout;

/// Below this the UI says so instead of drawing a broken layout.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 16;
const WIDE_WIDTH: u16 = 110;
const WIDE_HEIGHT: u16 = 30;
/// Rows the map keeps, borders included, however much a callout says.
const MAP_MIN: u16 = 5;
/// The code pane is on by default from this width: beside a map still wide
/// enough to read, with the stats and leak panels in their places.
pub const CODE_AUTO_WIDTH: u16 = 160;
/// Columns the map keeps beside the code pane.
const MAP_MIN_WIDTH: u16 = 30;
/// Narrower than this, the code pane is left out.
const CODE_MIN_WIDTH: u16 = 24;
/// Presenter: rows the narration box takes at least, borders included.
const PRESENTER_NARRATION: u16 = 7;
/// Presenter: from this width the leak panel stands beside the narration.
const PRESENTER_LEAKS_WIDTH: u16 = 120;
/// Presenter: the large figures from this height and width of the body.
const PRESENTER_FIGURES_HEIGHT: u16 = 30;
const PRESENTER_FIGURES_WIDTH: u16 = 100;
/// Presenter: columns of space either side of the narration's text.
pub const PRESENTER_PAD: u16 = 2;

/// How the screen is arranged (`--layout`, `L`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LayoutMode {
    #[default]
    Normal,
    Presenter,
}

/// What the layout is asked for besides the panels every run has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shape {
    pub mode: LayoutMode,
    /// Show the code pane (a single run with a program), where it fits, as
    /// wide as this asks, borders included.
    pub code: Option<u16>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Focus {
    #[default]
    Map,
    Timeline,
    Leaks,
    Stats,
    Log,
}

impl Focus {
    pub const ORDER: [Focus; 5] = [
        Focus::Map,
        Focus::Timeline,
        Focus::Leaks,
        Focus::Stats,
        Focus::Log,
    ];

    pub fn next(self) -> Focus {
        let i = Focus::ORDER.iter().position(|f| *f == self).unwrap_or(0);
        Focus::ORDER[(i + 1) % Focus::ORDER.len()]
    }

    pub fn prev(self) -> Focus {
        let i = Focus::ORDER.iter().position(|f| *f == self).unwrap_or(0);
        Focus::ORDER[(i + Focus::ORDER.len() - 1) % Focus::ORDER.len()]
    }

    pub fn name(self) -> &'static str {
        match self {
            Focus::Map => "map",
            Focus::Timeline => "timeline",
            Focus::Leaks => "leaks",
            Focus::Stats => "stats",
            Focus::Log => "log",
        }
    }
}

/// One run's column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunAreas {
    /// The code pane, left of the map.
    pub code: Option<Rect>,
    pub map: Option<Rect>,
    /// The "by Python line" pane, taken from the bottom of the map's area.
    pub by_line: Option<Rect>,
    pub narration: Option<Rect>,
    /// An error the run reported, below its narration.
    pub error: Option<Rect>,
    /// The presenter's large figures, above the timeline.
    pub figures: Option<Rect>,
    pub timeline: Rect,
}

/// What a run has to say above its timeline, for sizing the callouts.
#[derive(Debug, Clone, Copy, Default)]
pub struct Callouts<'a> {
    pub narration: &'a [Arc<str>],
    pub error: Option<&'a str>,
}

impl Callouts<'_> {
    fn heights(&self, width: u16, room: u16) -> (u16, u16) {
        callout::heights(self.narration, self.error, width, room)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Areas {
    pub full: Rect,
    pub too_small: bool,
    pub status: Rect,
    pub hints: Rect,
    pub runs: Vec<RunAreas>,
    /// Stats per run (empty where collapsed).
    pub stats: Vec<Rect>,
    /// Leak panel and event log of the active run, where shown.
    pub leaks: Option<Rect>,
    /// Compare: every run's leak panel, by run (the active one is `leaks`).
    pub leak_panels: Vec<Rect>,
    pub log: Option<Rect>,
    /// The tab bar, when several files are open as tabs.
    pub tab_bar: Option<Rect>,
}

/// The layout for `area`; `said[i]` is what run `i` has to say above its timeline.
pub fn compute(area: Rect, focus: Focus, said: &[Callouts], shape: Shape) -> Areas {
    let mut a = Areas {
        full: area,
        ..Areas::default()
    };
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        a.too_small = true;
        return a;
    }
    let [status, body, hints] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(area);
    a.status = status;
    a.hints = hints;
    let first = said.first().copied().unwrap_or_default();
    if said.len() >= 2 {
        compare(&mut a, body, focus, said);
        return a;
    }
    if shape.mode == LayoutMode::Presenter {
        presenter(&mut a, body, focus, first);
    } else if area.width >= WIDE_WIDTH && area.height >= WIDE_HEIGHT {
        wide(&mut a, body, first);
    } else {
        compact(&mut a, body, focus, first);
    }
    if let (Some(want), Some(run)) = (shape.code, a.runs.first_mut()) {
        split_code(run, want);
    }
    a
}

/// The code pane from the left of the map's area: as wide as it asks, up
/// to a little over half, where the map keeps room.
fn split_code(run: &mut RunAreas, want: u16) {
    let Some(m) = run.map else { return };
    let w = want
        .min(m.width * 55 / 100)
        .min(m.width.saturating_sub(MAP_MIN_WIDTH));
    if w < CODE_MIN_WIDTH {
        return;
    }
    let [code, map] =
        Layout::horizontal([Constraint::Length(w), Constraint::Min(MAP_MIN_WIDTH)]).areas(m);
    run.code = Some(code);
    run.map = Some(map);
}

/// Code and map (or the focused stats, log or leaks) on top, a large
/// narration box with the leak panel beside it, the timeline at the bottom.
fn presenter(a: &mut Areas, body: Rect, focus: Focus, said: Callouts) {
    let tl_h = (body.height / 4).clamp(5, 12);
    let beside = body.width >= PRESENTER_LEAKS_WIDTH;
    let talk_w = if beside {
        body.width * 3 / 5
    } else {
        body.width
    };
    let text_w = talk_w.saturating_sub(2 * PRESENTER_PAD);
    // The figures in large glyphs where the screen is tall and wide enough
    // to keep the map's rows too.
    let fig_h = if body.height >= PRESENTER_FIGURES_HEIGHT && body.width >= PRESENTER_FIGURES_WIDTH
    {
        super::views::figures::HEIGHT
    } else {
        0
    };
    let room = body.height.saturating_sub(tl_h + MAP_MIN + fig_h);
    let (narr_h, err_h) = said.heights(text_w, room);
    let least = PRESENTER_NARRATION.min(body.height / 4);
    let narr_h = if narr_h > 0 {
        narr_h.max(least).min(room.saturating_sub(err_h))
    } else {
        0
    };
    let talk_h = if beside {
        (narr_h + err_h).max(least.min(room))
    } else {
        narr_h + err_h
    };
    let [top, talk, figures, timeline] = Layout::vertical([
        Constraint::Min(3),
        Constraint::Length(talk_h),
        Constraint::Length(fig_h),
        Constraint::Length(tl_h),
    ])
    .areas(body);
    let (talk, leaks) = if beside {
        let [t, l] =
            Layout::horizontal([Constraint::Length(talk_w), Constraint::Min(1)]).areas(talk);
        (t, Some(l))
    } else {
        (talk, None)
    };
    let [n, e] =
        Layout::vertical([Constraint::Length(narr_h), Constraint::Length(err_h)]).areas(talk);
    let mut run = RunAreas {
        code: None,
        map: Some(top),
        by_line: None,
        narration: (narr_h > 0).then_some(n),
        error: (err_h > 0).then_some(e),
        figures: (fig_h > 0).then_some(figures),
        timeline,
    };
    a.leaks = leaks.filter(|l| l.height >= 3);
    let took_top = match focus {
        Focus::Stats => {
            a.stats.push(top);
            true
        }
        Focus::Log => {
            a.log = Some(top);
            true
        }
        Focus::Leaks if a.leaks.is_none() => {
            a.leaks = Some(top);
            true
        }
        _ => false,
    };
    if took_top {
        run.map = None;
    }
    a.runs.push(run);
}

/// Map (optional), narration and error (where there is one) and timeline
/// stacked in `col`.
fn column(col: Rect, with_map: bool, said: Callouts, timeline_h: u16) -> RunAreas {
    let map_min = if with_map { MAP_MIN } else { 0 };
    let room = col.height.saturating_sub(timeline_h + map_min);
    let (narr_h, err_h) = said.heights(col.width, room);
    let (map, n, e, t) = if with_map {
        let [m, n, e, t] = Layout::vertical([
            Constraint::Min(3),
            Constraint::Length(narr_h),
            Constraint::Length(err_h),
            Constraint::Length(timeline_h),
        ])
        .areas(col);
        (Some(m), n, e, t)
    } else {
        let [n, e, t] = Layout::vertical([
            Constraint::Length(narr_h),
            Constraint::Length(err_h),
            Constraint::Min(3),
        ])
        .areas(col);
        (None, n, e, t)
    };
    RunAreas {
        code: None,
        map,
        by_line: None,
        narration: (narr_h > 0).then_some(n),
        error: (err_h > 0).then_some(e),
        figures: None,
        timeline: t,
    }
}

fn wide(a: &mut Areas, body: Rect, said: Callouts) {
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(62), Constraint::Percentage(38)]).areas(body);
    let tl_h = (body.height / 3).clamp(8, 14);
    a.runs.push(column(left, true, said, tl_h));
    let log_h = (body.height * 35 / 100).max(6);
    let [stats, leaks, log] = Layout::vertical([
        Constraint::Length(11),
        Constraint::Min(6),
        Constraint::Length(log_h),
    ])
    .areas(right);
    a.stats.push(stats);
    a.leaks = Some(leaks);
    a.log = Some(log);
}

fn compact(a: &mut Areas, body: Rect, focus: Focus, said: Callouts) {
    let tl_h = (body.height / 3).clamp(6, 10);
    match focus {
        Focus::Leaks | Focus::Stats | Focus::Log => {
            let room = body.height.saturating_sub(tl_h + MAP_MIN);
            let (narr_h, err_h) = said.heights(body.width, room);
            let [main, rest] = Layout::vertical([
                Constraint::Min(3),
                Constraint::Length(tl_h + narr_h + err_h),
            ])
            .areas(body);
            a.runs.push(column(rest, false, said, tl_h));
            match focus {
                Focus::Leaks => a.leaks = Some(main),
                Focus::Stats => a.stats.push(main),
                _ => a.log = Some(main),
            }
        }
        Focus::Map | Focus::Timeline => a.runs.push(column(body, true, said, tl_h)),
    }
}

fn compare(a: &mut Areas, body: Rect, focus: Focus, said: &[Callouts]) {
    let bottom_h = match focus {
        Focus::Leaks | Focus::Log => body.height / 3,
        Focus::Stats => 9.min(body.height / 2),
        _ if body.height >= 28 => 9,
        _ => 0,
    };
    let [top, bottom] =
        Layout::vertical([Constraint::Min(6), Constraint::Length(bottom_h)]).areas(body);
    let halves = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Ratio(1, 2), Constraint::Ratio(1, 2)])
        .split(top);
    let tl_h = (top.height / 3).clamp(5, 10);
    for (i, half) in halves.iter().enumerate() {
        a.runs.push(column(
            *half,
            true,
            said.get(i).copied().unwrap_or_default(),
            tl_h,
        ));
    }
    if bottom_h == 0 {
        return;
    }
    let [l, r] =
        Layout::horizontal([Constraint::Ratio(1, 2), Constraint::Ratio(1, 2)]).areas(bottom);
    match focus {
        // Both runs' findings side by side: what leaks in one and not the other.
        Focus::Leaks => a.leak_panels = vec![l, r],
        Focus::Log => a.log = Some(bottom),
        _ => a.stats = vec![l, r],
    }
}

/// Whether `(x, y)` is inside `r`.
pub fn contains(r: Rect, x: u16, y: u16) -> bool {
    x >= r.x && x < r.x.saturating_add(r.width) && y >= r.y && y < r.y.saturating_add(r.height)
}

/// The inside of a bordered panel.
pub fn inner(r: Rect) -> Rect {
    Rect {
        x: r.x.saturating_add(1),
        y: r.y.saturating_add(1),
        width: r.width.saturating_sub(2),
        height: r.height.saturating_sub(2),
    }
}
