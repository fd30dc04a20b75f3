//! `vramscope sweep`'s loop: drain the sweep producer's channel, draw when
//! something changed, read keys; it returns when the user quits or asks for
//! a point's full run (the caller opens it and may come back). Generic over
//! the backend and the input so tests run it on `TestBackend`.

use std::time::Duration;

use crossterm::event::{Event as CEvent, KeyEventKind};
use ratatui::backend::Backend;
use ratatui::Terminal;

use super::run::{install_panic_hook, setup_terminal, CrosstermInput, InputSource, RestoreGuard};
use super::sweep::SweepState;
use super::views;
use crate::producers::{Polled, Source};

/// Longest wait for a key before the channel is looked at again.
const FRAME: Duration = Duration::from_millis(50);

/// The chart on the real terminal until `q` or Enter on a point (then
/// `state.open` says which); the terminal is restored either way.
pub fn run_sweep(state: &mut SweepState, rx: &Source) -> anyhow::Result<()> {
    install_panic_hook();
    let mut terminal = setup_terminal()?;
    let _restore = RestoreGuard;
    sweep_loop(&mut terminal, state, rx, &mut CrosstermInput)
}

pub fn sweep_loop<B, I>(
    terminal: &mut Terminal<B>,
    state: &mut SweepState,
    rx: &Source,
    input: &mut I,
) -> anyhow::Result<()>
where
    B: Backend,
    B::Error: Send + Sync + 'static,
    I: InputSource,
{
    state.open = None;
    let mut dirty = true;
    loop {
        loop {
            match rx.poll() {
                Polled::Msg(m) => dirty |= state.ingest(m),
                Polled::Empty => break,
                Polled::Closed => {
                    dirty |= state.producer_gone();
                    break;
                }
            }
        }
        if dirty {
            terminal.draw(|f| views::sweep::render(f, state))?;
            dirty = false;
        }
        if state.quit || state.open.is_some() {
            return Ok(());
        }
        match input.next(FRAME)? {
            Some(CEvent::Key(k)) if k.kind != KeyEventKind::Release => dirty |= state.handle_key(k),
            Some(CEvent::Resize(_, _)) => dirty = true,
            _ => {}
        }
        if state.quit || state.open.is_some() {
            return Ok(());
        }
    }
}
