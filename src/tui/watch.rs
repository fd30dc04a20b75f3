//! `vramscope watch`'s state: the latest NVML reading of every GPU, a short
//! history of used memory and utilisation per GPU, the selected GPU, and the
//! reconciliation numbers (from `device::reconcile`) the view draws. Readings
//! arrive from the poller thread's channel; nothing here calls NVML.

use std::collections::VecDeque;

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::device::nvml::GpuReading;
use crate::device::reconcile::{DeviceReconciliation, Reconciliation};
use crate::device::GpuUnavailable;

use super::theme::Theme;
use crate::producers::{Polled, Source, SourceMsg};

/// Readings kept per GPU for the sparklines (about 40 s at 3 Hz).
pub const HISTORY: usize = 120;

/// One GPU's recent readings, oldest first; `None` where NVML could not say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuHistory {
    pub used: VecDeque<Option<u64>>,
    pub utilization: VecDeque<Option<u64>>,
}

impl GpuHistory {
    fn push(&mut self, g: &GpuReading) {
        self.used.push_back(g.used);
        self.utilization.push_back(g.utilization_gpu.map(u64::from));
        while self.used.len() > HISTORY {
            self.used.pop_front();
        }
        while self.utilization.len() > HISTORY {
            self.utilization.pop_front();
        }
    }
}

/// The keys `watch` understands, for its hint line.
pub const WATCH_KEYS: &str = "j/k ↑/↓ select GPU  g/G first/last  q Esc quit";

pub struct WatchState {
    pub gpus: Vec<GpuReading>,
    /// Per GPU: NVML's used against its processes.
    pub devices: Vec<DeviceReconciliation>,
    /// Per GPU, per process: what is known of each (only NVML's total).
    pub processes: Vec<Vec<Reconciliation>>,
    pub history: Vec<GpuHistory>,
    pub selected: usize,
    /// Readings received so far.
    pub readings: u64,
    /// Why NVML stopped answering, when it did.
    pub error: Option<String>,
    pub theme: Theme,
    pub quit: bool,
}

impl WatchState {
    pub fn new(theme: Theme) -> WatchState {
        WatchState {
            gpus: Vec::new(),
            devices: Vec::new(),
            processes: Vec::new(),
            history: Vec::new(),
            selected: 0,
            readings: 0,
            error: None,
            theme,
            quit: false,
        }
    }

    /// Take one message from the poller.
    pub fn ingest(&mut self, reading: Result<Vec<GpuReading>, GpuUnavailable>) {
        let gpus = match reading {
            Ok(g) => g,
            Err(e) => {
                self.error = Some(e.to_string());
                return;
            }
        };
        self.readings += 1;
        self.history.resize_with(gpus.len(), GpuHistory::default);
        for (h, g) in self.history.iter_mut().zip(&gpus) {
            h.push(g);
        }
        self.devices = gpus.iter().map(DeviceReconciliation::of).collect();
        self.processes = gpus
            .iter()
            .map(|g| {
                g.processes
                    .iter()
                    .map(|p| Reconciliation::foreign(p.used))
                    .collect()
            })
            .collect();
        self.gpus = gpus;
        self.selected = self.selected.min(self.gpus.len().saturating_sub(1));
    }

    /// Apply a key; true when the screen must be redrawn.
    pub fn handle_key(&mut self, key: KeyEvent) -> bool {
        if key.kind == KeyEventKind::Release {
            return false;
        }
        let last = self.gpus.len().saturating_sub(1);
        let before = self.selected;
        match key.code {
            KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => self.quit = true,
            KeyCode::Char('q') | KeyCode::Esc => self.quit = true,
            KeyCode::Char('j') | KeyCode::Down => self.selected = (self.selected + 1).min(last),
            KeyCode::Char('k') | KeyCode::Up => self.selected = self.selected.saturating_sub(1),
            KeyCode::Char('g') | KeyCode::Home => self.selected = 0,
            KeyCode::Char('G') | KeyCode::End => self.selected = last,
            _ => return false,
        }
        self.quit || self.selected != before
    }
}

/// Longest wait for a key before the poller's channel is looked at again.
const WATCH_FRAME: std::time::Duration = std::time::Duration::from_millis(50);

/// `watch` in the one loop, fed by the NVML poller until `q`; the state
/// says afterwards whether NVML failed on the way (`error`).
pub struct WatchScreen<'a> {
    pub state: &'a mut WatchState,
    pub source: &'a Source,
}

impl super::screen::Screen for WatchScreen<'_> {
    fn drain(&mut self, _key_waiting: &mut dyn FnMut() -> bool) -> bool {
        let mut changed = false;
        loop {
            match self.source.poll() {
                Polled::Msg(SourceMsg::Gpus(reading)) => {
                    self.state.ingest(reading);
                    changed = true;
                }
                Polled::Msg(_) => {}
                Polled::Empty => return changed,
                Polled::Closed => {
                    if self.state.error.is_none() {
                        self.state.error = Some("the NVML thread stopped".into());
                        changed = true;
                    }
                    return changed;
                }
            }
        }
    }

    fn handle_key(&mut self, key: KeyEvent) -> bool {
        self.state.handle_key(key)
    }

    fn frame_wait(&self) -> std::time::Duration {
        WATCH_FRAME
    }

    fn prepare(&mut self, _area: ratatui::layout::Rect) {}

    fn draw(&self, frame: &mut ratatui::Frame) {
        super::views::watch::render(frame, self.state);
    }

    fn done(&self) -> bool {
        self.state.quit
    }
}
