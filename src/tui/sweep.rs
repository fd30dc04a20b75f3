//! `vramscope sweep`'s chart state: the planned points, each point's run as
//! it arrives from the producer, the finished sweep with its fit, and the
//! selected point. Keys move between points and ask for a point's full run;
//! nothing here runs the engine.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::theme::Theme;
use crate::producers::{Polled, Source, SourceMsg, SweepMsg};
use crate::sweep::{Fit, MaxBatch, Sweep, SweepPoint};

/// The keys the chart understands, for its hint line: quitting first, so
/// that 80 columns keep it.
pub const SWEEP_KEYS: &str =
    "q quit  ←/→ point  Enter its run  ↑/↓ scroll  x log₂/linear  g/G first/last  h/l j/k too";

pub struct SweepState {
    pub title: String,
    /// What the allocator may use.
    pub capacity: u64,
    /// (batch, seq) of every point, in the plan's order.
    pub planned: Vec<(u64, Option<u64>)>,
    /// Each planned point once it has run: its figures, or why it could not.
    pub points: Vec<Option<Result<SweepPoint, String>>>,
    /// The sweep with its fit and words, once every point has run.
    pub sweep: Option<Sweep>,
    /// Whether the search for the largest batch follows the points.
    pub searching: bool,
    pub selected: usize,
    /// Lines the explanation is scrolled by.
    pub scroll: u16,
    /// Batch on a log₂ axis instead of a linear one (`x`).
    pub log_x: bool,
    /// The producer failed (or stopped before the sweep was done).
    pub failure: Option<String>,
    /// A point whose full run the user asked to open (Enter).
    pub open: Option<usize>,
    pub theme: Theme,
    pub quit: bool,
}

impl SweepState {
    pub fn new(
        title: String,
        capacity: u64,
        planned: Vec<(u64, Option<u64>)>,
        searching: bool,
        theme: Theme,
    ) -> SweepState {
        let points = vec![None; planned.len()];
        SweepState {
            title,
            capacity,
            planned,
            points,
            sweep: None,
            searching,
            selected: 0,
            scroll: 0,
            log_x: false,
            failure: None,
            open: None,
            theme,
            quit: false,
        }
    }

    /// Take one message from the sweep's producer.
    pub fn ingest(&mut self, msg: SweepMsg) {
        match msg {
            SweepMsg::Point { index, point } => {
                if let Some(slot) = self.points.get_mut(index) {
                    *slot = Some(*point);
                }
            }
            SweepMsg::Swept(s) => self.sweep = Some(*s),
            SweepMsg::Failed(why) => self.failure = Some(why),
        }
    }

    /// The producer's channel closed: unless the sweep is there, say so.
    pub fn producer_gone(&mut self) -> bool {
        if self.sweep.is_none() && self.failure.is_none() {
            self.failure = Some("the sweep's thread stopped before it finished".into());
            return true;
        }
        false
    }

    pub fn done(&self) -> usize {
        self.points.iter().filter(|p| p.is_some()).count()
    }

    /// The sequence length of the selected point: the chart shows its series.
    pub fn selected_seq(&self) -> Option<u64> {
        self.planned.get(self.selected).and_then(|p| p.1)
    }

    /// The points that have run at `seq`, by batch.
    pub fn series(&self, seq: Option<u64>) -> Vec<&SweepPoint> {
        let mut v: Vec<&SweepPoint> = self
            .points
            .iter()
            .filter_map(|p| p.as_ref().and_then(|r| r.as_ref().ok()))
            .filter(|p| p.seq == seq)
            .collect();
        v.sort_by_key(|p| p.batch);
        v
    }

    pub fn selected_point(&self) -> Option<&Result<SweepPoint, String>> {
        self.points.get(self.selected).and_then(Option::as_ref)
    }

    /// The fit of the selected point's series, once the sweep is done.
    pub fn fit(&self) -> Option<&Fit> {
        let seq = self.selected_seq();
        self.sweep.as_ref()?.fits.iter().find(|f| f.seq == seq)
    }

    /// The search's result at the selected point's sequence length, once
    /// the sweep is done (with `--find-max-batch`).
    pub fn max_batch(&self) -> Option<&MaxBatch> {
        let seq = self.selected_seq();
        self.sweep
            .as_ref()?
            .max_batch_by_seq
            .iter()
            .find(|m| m.seq == seq)
    }

    /// The sequence lengths the plan runs, each once.
    pub fn seq_count(&self) -> usize {
        let mut seqs: Vec<Option<u64>> = self.planned.iter().map(|p| p.1).collect();
        seqs.sort_unstable();
        seqs.dedup();
        seqs.len()
    }

    pub fn handle_key(&mut self, k: KeyEvent) -> bool {
        let last = self.planned.len().saturating_sub(1);
        match k.code {
            KeyCode::Char('q') | KeyCode::Esc => self.quit = true,
            KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => self.quit = true,
            KeyCode::Left | KeyCode::Char('h') => self.selected = self.selected.saturating_sub(1),
            KeyCode::Right | KeyCode::Char('l') => self.selected = (self.selected + 1).min(last),
            KeyCode::Home | KeyCode::Char('g') => self.selected = 0,
            KeyCode::End | KeyCode::Char('G') => self.selected = last,
            KeyCode::Char('x') => self.log_x = !self.log_x,
            KeyCode::Up | KeyCode::Char('k') => self.scroll = self.scroll.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => self.scroll = self.scroll.saturating_add(1),
            KeyCode::Enter | KeyCode::Char('o') => {
                if matches!(self.selected_point(), Some(Ok(_))) {
                    self.open = Some(self.selected);
                } else {
                    return false;
                }
            }
            _ => return false,
        }
        true
    }
}

/// Longest wait for a key before the sweep's channel is looked at again.
const SWEEP_FRAME: std::time::Duration = std::time::Duration::from_millis(50);

/// The sweep's chart in the one loop, fed by its producer: it fills in as
/// points finish and stops when the user quits or asks for a point's full
/// run (`state.open` says which).
pub struct SweepScreen<'a> {
    pub state: &'a mut SweepState,
    pub source: &'a Source,
}

impl super::screen::Screen for SweepScreen<'_> {
    fn drain(&mut self, _key_waiting: &mut dyn FnMut() -> bool) -> bool {
        let mut changed = false;
        loop {
            match self.source.poll() {
                Polled::Msg(SourceMsg::Sweep(m)) => {
                    self.state.ingest(m);
                    changed = true;
                }
                // The sweep's producer sends nothing else.
                Polled::Msg(_) => {}
                Polled::Empty => return changed,
                Polled::Closed => return changed | self.state.producer_gone(),
            }
        }
    }

    fn begin(&mut self) {
        self.state.open = None;
    }

    fn handle_key(&mut self, key: KeyEvent) -> bool {
        self.state.handle_key(key)
    }

    fn frame_wait(&self) -> std::time::Duration {
        SWEEP_FRAME
    }

    fn prepare(&mut self, _area: ratatui::layout::Rect) {}

    fn draw(&self, frame: &mut ratatui::Frame) {
        super::views::sweep::render(frame, self.state);
    }

    fn done(&self) -> bool {
        self.state.quit || self.state.open.is_some()
    }
}
