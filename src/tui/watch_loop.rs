//! `vramscope watch`'s loop: drain the poller's channel, draw when something
//! changed, read keys. Generic over the backend and the input so tests run it
//! on `TestBackend`; the real terminal is set up and restored (on errors and
//! panics too) by `tui::run`'s helpers.

use std::time::Duration;

use crossterm::event::{Event as CEvent, KeyEventKind};
use ratatui::backend::Backend;
use ratatui::Terminal;

use super::run::{install_panic_hook, setup_terminal, CrosstermInput, InputSource, RestoreGuard};
use super::theme::Theme;
use super::views;
use super::watch::WatchState;
use crate::device::nvml::GpuReading;
use crate::producers::{Polled, Source, SourceMsg};

/// Longest wait for a key before the channel is looked at again.
const FRAME: Duration = Duration::from_millis(50);

/// Full-screen `watch` on the real terminal until `q`, starting from the
/// poller's `first` reading. The final state says whether NVML failed on the
/// way (`error`).
pub fn run_watch(first: Vec<GpuReading>, rx: Source, theme: Theme) -> anyhow::Result<WatchState> {
    let mut state = WatchState::new(theme);
    state.ingest(Ok(first));
    install_panic_hook();
    let mut terminal = setup_terminal()?;
    let _restore = RestoreGuard;
    watch_loop(&mut terminal, &mut state, &rx, &mut CrosstermInput)?;
    Ok(state)
}

pub fn watch_loop<B, I>(
    terminal: &mut Terminal<B>,
    state: &mut WatchState,
    rx: &Source,
    input: &mut I,
) -> anyhow::Result<()>
where
    B: Backend,
    B::Error: Send + Sync + 'static,
    I: InputSource,
{
    let mut dirty = true;
    loop {
        loop {
            match rx.poll() {
                Polled::Msg(SourceMsg::Gpus(reading)) => {
                    state.ingest(reading);
                    dirty = true;
                }
                Polled::Msg(_) => {}
                Polled::Empty => break,
                Polled::Closed => {
                    if state.error.is_none() {
                        state.error = Some("the NVML thread stopped".into());
                        dirty = true;
                    }
                    break;
                }
            }
        }
        if dirty {
            terminal.draw(|f| views::watch::render(f, state))?;
            dirty = false;
        }
        if state.quit {
            return Ok(());
        }
        match input.next(FRAME)? {
            Some(CEvent::Key(k)) if k.kind != KeyEventKind::Release => dirty |= state.handle_key(k),
            Some(CEvent::Resize(_, _)) => dirty = true,
            _ => {}
        }
        if state.quit {
            return Ok(());
        }
    }
}
