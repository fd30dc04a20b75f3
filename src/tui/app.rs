//! The one application state: one or two runs, the cursor and playback,
//! focus, selection, colouring and theme. Keys, mouse and time change it
//! through `handle_key` / `handle_mouse` / `on_tick`; `prepare` turns it into
//! the per-frame data the pure views draw (never computed inside `draw`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crossterm::event::KeyEvent;
use ratatui::layout::Rect;

use super::by_line;
use super::code::CodeWish;
use super::gpu_panel::GpuPanel;
use super::layout::{self, Areas, Focus, LayoutMode};
use super::playback::{PlayUnit, DEFAULT_UNIT_RATE, MAX_UNIT_RATE, MIN_UNIT_RATE};
use super::popup::Popup;
use super::run_view::{collect_categories, prepare_markers};
pub use super::run_view::{RunFrame, RunView};
use super::theme::{Theme, ThemeError, ThemeName};
use super::views::{event_log, help, segment_map, stats, timeline};
use crate::producers::Source;

mod actions;
mod devices;
mod mouse;
mod play;
mod popups;
mod select;
mod tabs;
mod zoom;

pub use tabs::{DiffState, TabLabel, TabView, Tabs};

/// The longest one drain of the sources takes events for: a key pressed
/// while a large file's events arrive waits for no more than this and a
/// frame.
const DRAIN_TIME: Duration = Duration::from_millis(5);

/// Events a pending `x` waits after an OOM entry for its message.
const OOM_MESSAGE_WAIT: usize = 64;

/// Playback speed bounds and default, in events per second.
pub const MIN_SPEED: f64 = 1.0;
pub const MAX_SPEED: f64 = 1_000_000.0;
pub const DEFAULT_SPEED: f64 = 500.0;
/// Deepest map zoom (virtual cells per visible cell).
const MAX_MAP_ZOOM: u32 = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ColorMode {
    #[default]
    State,
    Category,
}

/// How the second run's cursor follows the first in compare mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// Same fraction of each run's events.
    Fraction,
    /// Same iteration, same fraction within it (fraction where absent):
    /// the default, so compared runs stand at the same point of training.
    #[default]
    Iteration,
}

#[derive(Debug, Clone)]
pub struct TuiOptions {
    pub theme: ThemeName,
    /// `None`: from the `NO_COLOR` environment variable.
    pub no_color: Option<bool>,
    /// Events per second when playing by event.
    pub speed: f64,
    /// Steps per second when playing by op, phase or iteration.
    pub unit_rate: f64,
    pub play_by: PlayUnit,
    /// Stop at every narration until space.
    pub auto_pause: bool,
    pub start_paused: bool,
    pub sync: SyncMode,
    /// Longest wait for input before the loop looks at the sources again.
    pub frame: Duration,
    /// Leave the UI when a source fails before its first event (a file given
    /// on the command line that does not open: the error goes to the shell).
    pub stop_on_load_failure: bool,
    /// `--layout`: normal, or presenter for a projector.
    pub layout: LayoutMode,
    /// Several sources as tabs, one shown at a time (`open a b …`), rather
    /// than side by side.
    pub tabs: bool,
    /// What opened this run view, for its status line (`lesson · part 3`);
    /// `q` then goes back there rather than out.
    pub context: Option<String>,
}

impl Default for TuiOptions {
    fn default() -> Self {
        TuiOptions {
            theme: ThemeName::Dark,
            no_color: None,
            speed: DEFAULT_SPEED,
            unit_rate: DEFAULT_UNIT_RATE,
            play_by: PlayUnit::Event,
            auto_pause: false,
            start_paused: false,
            sync: SyncMode::Iteration,
            frame: Duration::from_millis(25),
            stop_on_load_failure: false,
            layout: LayoutMode::Normal,
            tabs: false,
            context: None,
        }
    }
}

/// What a mouse drag started on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drag {
    Timeline(usize),
    Map { run: usize, x: u16, scroll: usize },
}

pub struct App {
    pub runs: Vec<RunView>,
    /// The run keys act on; the other one follows it (compare mode).
    pub active: usize,
    pub focus: Focus,
    pub playing: bool,
    /// Events per second when playing by event.
    pub speed: f64,
    /// Steps per second when playing by op, phase or iteration.
    pub unit_rate: f64,
    pub play_unit: PlayUnit,
    pub auto_pause: bool,
    /// Where auto-pause last stopped (the status asks for space there).
    auto_paused_at: Option<usize>,
    /// Playback has held on (or gone on from) the narration said at the
    /// start since the cursor was last away from it.
    held_start: bool,
    play_acc: f64,
    pub color_mode: ColorMode,
    pub theme_name: ThemeName,
    pub theme: Theme,
    pub show_help: bool,
    pub quit: bool,
    pub sync: SyncMode,
    pub frame_wait: Duration,
    /// The layout of the last `prepare`, for mouse hit-testing.
    pub areas: Areas,
    drag: Option<Drag>,
    /// The `:` prompt's text while the user types a run to open.
    pub prompt: Option<String>,
    /// A one-line message for the status bar (what was opened, or why not).
    pub notice: Option<String>,
    /// The GPU memory panel and its NVML readings (from the poller thread).
    pub gpu: GpuPanel,
    stop_on_load_failure: bool,
    /// Why a source failed before its first event, when that ended the UI.
    pub load_failure: Option<String>,
    /// A block's stack, an event's details or a message, over everything;
    /// it takes the keys while open.
    pub popup: Option<Popup>,
    /// First line of the help overlay in view.
    pub help_scroll: usize,
    pub layout_mode: LayoutMode,
    /// Whether the code pane is shown (`C`).
    pub code: CodeWish,
    /// Tabs, when the sources were opened as tabs.
    pub tabs: Option<Tabs>,
    /// What opened this run view (`lesson · part 3`), shown on the status line.
    pub context: Option<String>,
}

impl App {
    pub fn new(sources: Vec<(String, Source)>, opts: &TuiOptions) -> Result<App, ThemeError> {
        let no_color = opts
            .no_color
            .unwrap_or_else(super::theme::no_color_from_env);
        let theme = Theme::builtin(opts.theme, no_color)?;
        let mut gpu = GpuPanel::default();
        if sources.iter().any(|(_, s)| s.cuda.is_some()) {
            // A run on a real GPU: read NVML from the start, so the panel
            // has a reading whenever it is opened.
            gpu.start();
        }
        let mut runs: Vec<RunView> = sources
            .into_iter()
            .map(|(t, s)| RunView::new(t, s))
            .collect();
        let mut tabs = None;
        if opts.tabs && runs.len() > 1 {
            if let Some((first, t)) = Tabs::new(runs) {
                runs = vec![first];
                tabs = Some(t);
            } else {
                runs = Vec::new();
            }
        }
        Ok(App {
            runs,
            active: 0,
            focus: Focus::Map,
            playing: !opts.start_paused,
            speed: opts.speed.clamp(MIN_SPEED, MAX_SPEED),
            unit_rate: opts.unit_rate.clamp(MIN_UNIT_RATE, MAX_UNIT_RATE),
            play_unit: opts.play_by,
            auto_pause: opts.auto_pause,
            auto_paused_at: None,
            held_start: false,
            play_acc: 0.0,
            color_mode: ColorMode::State,
            theme_name: opts.theme,
            theme,
            show_help: false,
            quit: false,
            sync: opts.sync,
            frame_wait: opts.frame,
            areas: Areas::default(),
            drag: None,
            prompt: None,
            notice: None,
            gpu,
            stop_on_load_failure: opts.stop_on_load_failure,
            load_failure: None,
            popup: None,
            help_scroll: 0,
            layout_mode: opts.layout,
            code: CodeWish::Auto,
            tabs,
            context: opts.context.clone(),
        })
    }

    pub fn active_run(&self) -> Option<&RunView> {
        self.runs.get(self.active)
    }

    fn active_mut(&mut self) -> Option<&mut RunView> {
        self.runs.get_mut(self.active)
    }

    /// Take everything pending from every source (up to the per-drain
    /// budgets, with no time limit: what a test or an `open` sees does not
    /// depend on the machine's speed); true when anything changed.
    pub fn drain_sources(&mut self) -> bool {
        self.drain_within(None, &mut || false)
    }

    /// [`App::drain_sources`] for [`DRAIN_TIME`] at most, stopping early
    /// once `key_waiting` says a key was pressed: the loop answers it
    /// before taking more.
    pub fn drain_sources_until(&mut self, key_waiting: &mut dyn FnMut() -> bool) -> bool {
        self.drain_within(Some(Instant::now() + DRAIN_TIME), key_waiting)
    }

    fn drain_within(
        &mut self,
        until: Option<Instant>,
        key_waiting: &mut dyn FnMut() -> bool,
    ) -> bool {
        let mut changed = false;
        for r in &mut self.runs {
            changed |= r.drain(until, key_waiting);
            if self.stop_on_load_failure
                && r.reads_file
                && r.is_empty()
                && r.map.segments.is_empty()
            {
                if let Some(why) = &r.failure {
                    self.load_failure = Some(why.clone());
                    self.quit = true;
                }
            }
            if r.pending_oom {
                // The first place `x` stops after the cursor, once it came.
                let after = r.cursor().map_or(0, |c| c + 1);
                let stops = super::run_view::oom_stops(&r.marks.oom, &r.marks.error);
                // An OOM entry's message follows it: wait for it while the
                // source sends (a few events at most), so `x` shows it.
                let ready = |at: usize| {
                    r.marks.error.binary_search(&at).is_ok()
                        || !r.is_live()
                        || r.len() > at + OOM_MESSAGE_WAIT
                };
                if let Some(&at) = stops.iter().find(|i| **i >= after).filter(|at| ready(**at)) {
                    r.pending_oom = false;
                    r.seek_to_event(at);
                    changed = true;
                } else if !r.is_live() {
                    r.pending_oom = false;
                }
            }
        }
        changed |= self.drain_parked(until, key_waiting);
        if changed
            && self
                .tabs
                .as_ref()
                .is_some_and(|t| t.view == Some(TabView::Diff))
        {
            self.refresh_diff();
        }
        changed |= self.gpu.drain();
        changed
    }

    /// Whether a source has more waiting than the last drain took.
    pub fn has_backlog(&self) -> bool {
        self.runs.iter().any(|r| r.backlog) || self.parked_backlog()
    }

    fn set_active_pos(&mut self, pos: usize) {
        if let Some(r) = self.active_mut() {
            r.set_pos(pos);
        }
        self.sync_others();
    }

    /// Put the other runs' cursors where the active one's is (compare mode).
    fn sync_others(&mut self) {
        let Some(lead) = self.runs.get(self.active) else {
            return;
        };
        let frac = if lead.is_empty() {
            0.0
        } else {
            lead.pos as f64 / lead.len() as f64
        };
        let iter = match self.sync {
            SyncMode::Iteration => lead.iteration_position(),
            SyncMode::Fraction => None,
        };
        let active = self.active;
        for (i, r) in self.runs.iter_mut().enumerate() {
            if i == active {
                continue;
            }
            let by_iter = iter.and_then(|(k, f)| {
                r.iteration_bounds(k)
                    .map(|(b, e)| b + ((e - b) as f64 * f) as usize)
            });
            match by_iter {
                Some(idx) => r.seek_to_event(idx),
                None => r.set_pos((frac * r.len() as f64).round() as usize),
            }
        }
    }

    /// Build everything the views draw for a terminal of `size`. Called by
    /// the loop after input and new events, before `draw`.
    pub fn prepare(&mut self, size: Rect) {
        for r in &mut self.runs {
            r.sync_map();
            prepare_markers(r);
        }
        let said: Vec<layout::Callouts> = self
            .runs
            .iter()
            .map(|r| layout::Callouts {
                narration: &r.frame.narration,
                error: r.frame.error_marker.as_deref(),
            })
            .collect();
        let shape = self.shape(size.width);
        // Tabs: their bar on the top line, the run view below it.
        let (bar, body) = match self.tabs {
            Some(_) if size.height > 1 => (
                Some(Rect { height: 1, ..size }),
                Rect {
                    y: size.y + 1,
                    height: size.height - 1,
                    ..size
                },
            ),
            _ => (None, size),
        };
        self.areas = layout::compute(body, self.focus, &said, shape);
        self.areas.full = size;
        self.areas.tab_bar = bar;
        self.prepare_tabs(size.width);
        if let Some(l) = self.areas.leak_panels.get(self.active) {
            self.areas.leaks = Some(*l);
        }
        if self.areas.too_small {
            return;
        }
        for (r, ra) in self.runs.iter().zip(self.areas.runs.iter_mut()) {
            if let Some(m) = ra.map.filter(|_| r.by_line.is_some()) {
                let (map, pane) = by_line::split(m);
                if pane.height >= 3 {
                    ra.map = Some(map);
                    ra.by_line = Some(pane);
                }
            }
        }
        let mode = self.color_mode;
        // Runs compared side by side share one y scale, so heights compare.
        let ymax = self.runs.iter().map(timeline::scale_max).max().unwrap_or(1);
        for (i, r) in self.runs.iter_mut().enumerate() {
            let ra = self.areas.runs.get(i).copied().unwrap_or_default();
            let cats = if mode == ColorMode::Category {
                collect_categories(r)
            } else {
                HashMap::new()
            };
            // Before `highlighted`: it brings the by-line groups up to date.
            r.frame.by_line = match ra.by_line {
                Some(p) => by_line::prepare(r, usize::from(p.height.saturating_sub(2))),
                None => by_line::ByLineFrame::default(),
            };
            let highlighted = r.highlighted();
            r.frame.map = segment_map::prepare(r, ra.map, &highlighted, mode, &cats);
            r.frame.timeline = timeline::prepare(r, ra.timeline, ymax);
            let t = &r.frame.timeline;
            let (from, to, w) = (t.from, t.to, t.inner.width);
            r.frame.timeline.site_marks = by_line::timeline_marks(r, from, to, w);
            let key = Some((r.map_gen, r.len()));
            if r.stats_key != key {
                r.frame.stats = stats::prepare(r);
                r.stats_key = key;
            }
            let log_h = self.areas.log.map_or(0, |l| l.height.saturating_sub(2));
            r.frame.log = event_log::prepare(r, log_h as usize);
            r.frame.code = super::code::prepare(r);
            r.frame.big = match ra.figures {
                Some(_) => super::views::figures::prepare(r),
                None => Vec::new(),
            };
        }
        if self.gpu.shown {
            self.gpu.prepare(self.runs.get(self.active));
        }
        if let Some(p) = self.popup.as_mut() {
            p.prepare(size);
        }
        if self.show_help {
            self.help_scroll = self.help_scroll.min(help::max_scroll(size));
        }
    }

    /// Draw into `frame` (layout from the last `prepare`).
    pub fn draw(&self, frame: &mut ratatui::Frame) {
        super::views::draw(frame, self);
    }
}

impl super::screen::Screen for App {
    fn drain(&mut self, key_waiting: &mut dyn FnMut() -> bool) -> bool {
        self.drain_sources_until(key_waiting)
    }

    fn has_backlog(&self) -> bool {
        App::has_backlog(self)
    }

    fn handle_key(&mut self, key: KeyEvent) -> bool {
        App::handle_key(self, key)
    }

    fn handle_mouse(&mut self, event: crossterm::event::MouseEvent) -> bool {
        App::handle_mouse(self, event)
    }

    fn tick(&mut self, elapsed: Duration) -> bool {
        self.on_tick(elapsed)
    }

    fn frame_wait(&self) -> Duration {
        self.frame_wait
    }

    fn prepare(&mut self, area: Rect) {
        App::prepare(self, area)
    }

    fn draw(&self, frame: &mut ratatui::Frame) {
        App::draw(self, frame)
    }

    fn done(&self) -> bool {
        self.quit
    }
}
