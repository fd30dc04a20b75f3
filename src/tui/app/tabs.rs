//! Tabs: several runs opened together (`vramscope open a b …`, and ranks of
//! one job), one shown at a time in the full run view. The shown tab's run
//! is `App::runs[0]`, so every view works on it unchanged; the others wait
//! here, still drained so that they load in the background.
//!
//! Over the run view, two views across tabs: the table of every tab's
//! figures (`T`) and what is alive in the shown tab and not in the baseline
//! tab (`A`; the baseline is the tab before, or the one `B` chose). Both
//! draw what `report::series` and `report::diff` computed from what each
//! tab's producer sent ([`RecordedMsg::Summary`](crate::producers::RecordedMsg)).

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::{App, RunView};
use crate::report::diff::{diff, SnapshotDiff};
use crate::report::series::{rank_of, SeriesFile, SeriesTable};

/// A view across tabs, over the run view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TabView {
    Table,
    Diff,
}

/// The diff the `A` view shows, or why there is none yet.
#[derive(Debug, Clone)]
pub enum DiffState {
    /// Tab indices (baseline, shown) and what `report::diff` found.
    Ready(usize, usize, Box<SnapshotDiff>),
    NotYet(String),
}

pub struct Tabs {
    /// Every tab's run, by tab; the shown tab's slot is empty (its run is
    /// `App::runs[0]`).
    parked: Vec<Option<RunView>>,
    pub active: usize,
    /// The tab `A` compares against; `None`: the tab before the shown one.
    pub baseline: Option<usize>,
    pub view: Option<TabView>,
    /// First line of the view across tabs in sight.
    pub scroll: usize,
    pub diff: Option<DiffState>,
    /// The summaries the ready diff was made from (a live tab sends new
    /// ones as its job runs: then the diff is made again).
    diff_from: (usize, usize),
    /// The tab bar as last prepared (also what a click hits): the tabs
    /// from `bar_first` on that fit the width around the shown one.
    pub bar: Vec<TabLabel>,
    pub bar_first: usize,
    /// Tabs are left out before / after the bar's (it shows `‹` / `›`).
    pub more_left: bool,
    pub more_right: bool,
    /// The table as last prepared, while `T` shows it.
    pub table: Option<SeriesTable>,
}

/// One tab's label on the bar, and where it is drawn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TabLabel {
    pub text: String,
    /// Its file recorded an OOM.
    pub oom: bool,
    pub failed: bool,
    pub x: u16,
    pub width: u16,
}

impl Tabs {
    /// Tabs over `runs`, the first one shown (returned apart).
    pub fn new(mut runs: Vec<RunView>) -> Option<(RunView, Tabs)> {
        if runs.is_empty() {
            return None;
        }
        let first = runs.remove(0);
        let mut parked: Vec<Option<RunView>> = vec![None];
        parked.extend(runs.into_iter().map(Some));
        let tabs = Tabs {
            parked,
            active: 0,
            baseline: None,
            view: None,
            scroll: 0,
            diff: None,
            diff_from: (0, 0),
            bar: Vec::new(),
            bar_first: 0,
            more_left: false,
            more_right: false,
            table: None,
        };
        Some((first, tabs))
    }

    pub fn len(&self) -> usize {
        self.parked.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parked.is_empty()
    }

    /// The tab the diff compares the shown one against.
    pub fn baseline_of(&self, tab: usize) -> Option<usize> {
        match self.baseline {
            Some(b) if b != tab => Some(b),
            Some(_) => None,
            None => tab.checked_sub(1),
        }
    }
}

impl App {
    /// Tab `i`'s run, shown or waiting.
    pub fn tab_run(&self, i: usize) -> Option<&RunView> {
        let t = self.tabs.as_ref()?;
        if i == t.active {
            self.runs.first()
        } else {
            t.parked.get(i)?.as_ref()
        }
    }

    /// Which summary tab `i` holds (its allocation's address): it changes
    /// when the tab's producer sends a new one.
    fn tab_summary_id(&self, i: usize) -> Option<usize> {
        let s = self.tab_run(i)?.summary.as_ref()?;
        Some(std::sync::Arc::as_ptr(s) as usize)
    }

    pub fn tab_count(&self) -> usize {
        self.tabs.as_ref().map_or(0, Tabs::len)
    }

    /// Take what the waiting tabs' producers sent; true when any changed.
    pub(super) fn drain_parked(
        &mut self,
        until: Option<std::time::Instant>,
        key_waiting: &mut dyn FnMut() -> bool,
    ) -> bool {
        let Some(t) = self.tabs.as_mut() else {
            return false;
        };
        let mut changed = false;
        for r in t.parked.iter_mut().flatten() {
            changed |= r.drain(until, key_waiting);
        }
        changed
    }

    pub(super) fn parked_backlog(&self) -> bool {
        self.tabs
            .as_ref()
            .is_some_and(|t| t.parked.iter().flatten().any(|r| r.backlog))
    }

    /// Show tab `i`; false when it is already shown or there is none.
    pub fn switch_tab(&mut self, i: usize) -> bool {
        let Some(t) = self.tabs.as_mut() else {
            return false;
        };
        if i == t.active || i >= t.len() {
            return false;
        }
        let (Some(incoming), Some(shown)) = (t.parked[i].take(), self.runs.first_mut()) else {
            return false;
        };
        let outgoing = std::mem::replace(shown, incoming);
        t.parked[t.active] = Some(outgoing);
        t.active = i;
        t.scroll = 0;
        self.active = 0;
        self.popup = None;
        if t.view == Some(TabView::Diff) {
            self.refresh_diff();
        }
        true
    }

    fn step_tab(&mut self, by: isize) -> bool {
        let n = self.tab_count();
        let Some(t) = self.tabs.as_ref() else {
            return false;
        };
        if n < 2 {
            return false;
        }
        let next = (t.active as isize + by).rem_euclid(n as isize) as usize;
        self.switch_tab(next)
    }

    /// Keys for tabs and the views across them; `None`: not one of them,
    /// the run view takes it.
    pub(super) fn tab_key(&mut self, key: KeyEvent) -> Option<bool> {
        if key.modifiers.contains(KeyModifiers::CONTROL) || self.show_help {
            return None;
        }
        let tabbed = self.tabs.is_some();
        let across = crate::tui::input::is_tab_key(key.code);
        if !tabbed {
            if across {
                self.notice = Some(
                    "tabs, the table (T) and the diff (A) need several files: vramscope open a.pickle b.pickle …"
                        .into(),
                );
                return Some(true);
            }
            return None;
        }
        let view = self.tabs.as_ref().and_then(|t| t.view);
        Some(match key.code {
            KeyCode::Char('T') => self.toggle_view(TabView::Table),
            KeyCode::Char('A') => self.toggle_view(TabView::Diff),
            KeyCode::Char('B') => self.choose_baseline(),
            KeyCode::Char('w') => self.step_tab(1),
            KeyCode::Char('W') => self.step_tab(-1),
            KeyCode::Char(c @ '1'..='9') => {
                let i = usize::from(c as u8 - b'1');
                self.switch_tab(i)
            }
            _ if view.is_none() => return None,
            KeyCode::Esc => self.close_view(),
            KeyCode::Char('q') => {
                self.quit = true;
                true
            }
            KeyCode::Char('?') => return None,
            KeyCode::Char('j') | KeyCode::Down => self.scroll_view(1),
            KeyCode::Char('k') | KeyCode::Up => self.scroll_view(-1),
            KeyCode::PageDown | KeyCode::Char(' ') => self.scroll_view(10),
            KeyCode::PageUp => self.scroll_view(-10),
            KeyCode::Char('g') | KeyCode::Home => self.scroll_view(isize::MIN),
            KeyCode::Char('G') | KeyCode::End => self.scroll_view(isize::MAX),
            // The run view waits under the view across tabs.
            _ => false,
        })
    }

    fn toggle_view(&mut self, v: TabView) -> bool {
        let Some(t) = self.tabs.as_mut() else {
            return false;
        };
        t.view = if t.view == Some(v) { None } else { Some(v) };
        t.scroll = 0;
        if t.view == Some(TabView::Diff) {
            self.refresh_diff();
        }
        true
    }

    fn close_view(&mut self) -> bool {
        self.tabs.as_mut().is_some_and(|t| t.view.take().is_some())
    }

    fn scroll_view(&mut self, by: isize) -> bool {
        let Some(t) = self.tabs.as_mut() else {
            return false;
        };
        // The view clamps it to what it holds when drawn.
        t.scroll = t.scroll.saturating_add_signed(by);
        true
    }

    /// `B`: the shown tab becomes the diff's baseline; on the baseline
    /// itself, back to "the tab before".
    fn choose_baseline(&mut self) -> bool {
        let Some(t) = self.tabs.as_mut() else {
            return false;
        };
        let title = self
            .runs
            .first()
            .map_or_else(String::new, |r| r.title.clone());
        if t.baseline == Some(t.active) {
            t.baseline = None;
            self.notice = Some("diff baseline: the tab before the shown one".into());
        } else {
            t.baseline = Some(t.active);
            self.notice = Some(format!(
                "diff baseline: tab {} ({title}); A on another tab shows what is alive there and not here",
                t.active + 1
            ));
        }
        if t.view == Some(TabView::Diff) {
            self.refresh_diff();
        }
        true
    }

    /// The diff of the shown tab against its baseline, from both tabs'
    /// summaries, or why it cannot be made yet.
    pub(super) fn refresh_diff(&mut self) {
        let Some(t) = self.tabs.as_ref() else { return };
        let shown = t.active;
        let state = match t.baseline_of(shown) {
            None => DiffState::NotYet(format!(
                "tab {} has no tab before it: show another tab, or press B here to make this one the baseline",
                shown + 1
            )),
            Some(base) => {
                let from = (
                    self.tab_summary_id(base).unwrap_or(0),
                    self.tab_summary_id(shown).unwrap_or(0),
                );
                if let Some(DiffState::Ready(b, s, _)) = &t.diff {
                    if (*b, *s) == (base, shown) && t.diff_from == from {
                        return;
                    }
                }
                if let Some(t) = self.tabs.as_mut() {
                    t.diff_from = from;
                }
                match (self.tab_run(base), self.tab_run(shown)) {
                    (Some(a), Some(b)) => match (&a.summary, &b.summary) {
                        (Some(sa), Some(sb)) => DiffState::Ready(
                            base,
                            shown,
                            Box::new(diff(&a.title, &sa.live, &b.title, &sb.live)),
                        ),
                        _ => DiffState::NotYet(not_ready(a).or(not_ready(b)).unwrap_or_default()),
                    },
                    _ => DiffState::NotYet("no such tab".into()),
                }
            }
        };
        if let Some(t) = self.tabs.as_mut() {
            t.diff = Some(state);
        }
    }

    /// Every tab's figures as the table across them.
    pub fn series_table(&self) -> SeriesTable {
        let n = self.tab_count();
        let runs: Vec<&RunView> = (0..n).filter_map(|i| self.tab_run(i)).collect();
        let reasons: Vec<String> = runs
            .iter()
            .map(|r| not_ready(r).unwrap_or_default())
            .collect();
        let files: Vec<SeriesFile<'_>> = runs
            .iter()
            .zip(&reasons)
            .map(|(r, why)| SeriesFile {
                file: &r.title,
                figures: match &r.summary {
                    Some(s) => Ok(&s.devices),
                    None => Err(why),
                },
            })
            .collect();
        SeriesTable::new(&files)
    }
}

impl App {
    /// The tab bar's labels for a bar `width` wide, and the table when shown.
    pub(super) fn prepare_tabs(&mut self, width: u16) {
        let n = self.tab_count();
        if n == 0 {
            return;
        }
        // Each label gets an equal share (less its separator) where they do
        // not all fit, but not below a readable few columns: past that the
        // bar scrolls to the shown tab instead.
        let share = (usize::from(width) / n).saturating_sub(1).max(MIN_LABEL);
        let mut x = 0u16;
        let mut bar = Vec::with_capacity(n);
        for i in 0..n {
            let Some(r) = self.tab_run(i) else { continue };
            let oom = r.summary.as_ref().is_some_and(|s| s.oom_count() > 0)
                || r.devices.as_ref().is_some_and(|d| !d.with_oom.is_empty());
            let (mark, short) = match (&r.failure, oom, r.is_live() && r.summary.is_none()) {
                (Some(_), _, _) => (" ✗", "✗"),
                (None, true, _) => (" OOM", "!"),
                (None, false, true) => (" …", "…"),
                _ => ("", ""),
            };
            let n = i + 1;
            let mut labels = vec![format!(" {n} {}{mark} ", r.title)];
            match rank_of(&r.title) {
                // Rank files differ in their rank alone.
                Some(rank) => {
                    labels.push(format!(" {n} rank {rank}{mark} "));
                    labels.push(format!(" {n}:r{rank}{short} "));
                }
                None => {
                    let room = share.saturating_sub(mark.chars().count() + 4);
                    labels.push(format!(
                        " {n} {}{mark} ",
                        crate::tui::views::fit_head(&r.title, room.max(6))
                    ));
                }
            }
            let fits = |l: &String| l.chars().count() <= share;
            let text = match labels.iter().position(fits) {
                Some(k) => labels.swap_remove(k),
                None => labels.pop().unwrap_or_default(),
            };
            let w = u16::try_from(text.chars().count()).unwrap_or(u16::MAX);
            bar.push(TabLabel {
                text,
                oom,
                failed: r.failure.is_some(),
                x,
                width: w,
            });
            x = x.saturating_add(w).saturating_add(1);
        }
        let active = self.tabs.as_ref().map_or(0, |t| t.active);
        let (first, last) = window_around(&bar, active, width);
        let (more_left, more_right) = (first > 0, last < bar.len());
        let mut x = if more_left { MORE.0 } else { 0 };
        let mut bar: Vec<TabLabel> = bar.drain(first..last).collect();
        for l in &mut bar {
            l.x = x;
            x = x.saturating_add(l.width).saturating_add(1);
        }
        let table = self
            .tabs
            .as_ref()
            .is_some_and(|t| t.view == Some(TabView::Table))
            .then(|| self.series_table());
        if let Some(t) = self.tabs.as_mut() {
            t.bar = bar;
            t.bar_first = first;
            t.more_left = more_left;
            t.more_right = more_right;
            t.table = table;
        }
    }

    /// A click on the tab bar shows the tab under it.
    pub(super) fn click_tab(&mut self, x: u16) -> bool {
        let hit = self.tabs.as_ref().and_then(|t| {
            t.bar
                .iter()
                .position(|l| x >= l.x && x < l.x.saturating_add(l.width))
                .map(|i| i + t.bar_first)
        });
        hit.is_some_and(|i| self.switch_tab(i))
    }
}

/// The narrowest a label is cut to (a rank tab's `12:r11!` fits).
const MIN_LABEL: usize = 8;

/// Columns the `‹ ` and ` ›` marks of left-out tabs take.
pub const MORE: (u16, u16) = (2, 2);

/// The labels `first..last` that fit in `width` with the shown one among
/// them: all when they fit, else as many around it as fit beside the marks.
fn window_around(bar: &[TabLabel], active: usize, width: u16) -> (usize, usize) {
    let cost = |l: &TabLabel| u32::from(l.width) + 1;
    let total: u32 = bar.iter().map(cost).sum();
    if total <= u32::from(width) || bar.is_empty() {
        return (0, bar.len());
    }
    let active = active.min(bar.len() - 1);
    let room = u32::from(width).saturating_sub(u32::from(MORE.0 + MORE.1));
    let (mut first, mut last) = (active, active + 1);
    let mut used = cost(&bar[active]);
    loop {
        let mut grew = false;
        if last < bar.len() && used + cost(&bar[last]) <= room {
            used += cost(&bar[last]);
            last += 1;
            grew = true;
        }
        if first > 0 && used + cost(&bar[first - 1]) <= room {
            first -= 1;
            used += cost(&bar[first]);
            grew = true;
        }
        if !grew {
            return (first, last);
        }
    }
}

/// Why a tab has no summary yet: still reading, failed, or not a file.
fn not_ready(r: &RunView) -> Option<String> {
    if r.summary.is_some() {
        return None;
    }
    Some(match (&r.failure, r.is_live()) {
        // A producer's failure names its file.
        (Some(why), _) => why.clone(),
        (None, true) => format!("{}: still reading", r.title),
        (None, false) => format!("{}: no snapshot figures (not a file)", r.title),
    })
}
