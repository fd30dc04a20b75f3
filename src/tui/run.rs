//! Terminal setup and restore (panic hook, guard), the input sources, and
//! the run view's entry point; the loop itself is `screen::run_screen`,
//! one for every full-screen view.

use std::io::{self, Stdout};
use std::sync::Once;
use std::time::Duration;

use crossterm::event::{self, DisableMouseCapture, EnableMouseCapture, Event as CEvent};
use crossterm::execute;
use crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;

use super::app::{App, TuiOptions};
use crate::producers::Source;

/// Terminal events, from the real terminal or a script.
pub trait InputSource {
    /// The next event, waiting at most `timeout`.
    fn next(&mut self, timeout: Duration) -> anyhow::Result<Option<CEvent>>;

    /// Whether an event is waiting, without taking it: a long drain of the
    /// sources stops early for it.
    fn has_input(&mut self) -> bool {
        false
    }
}

/// crossterm's event queue.
pub struct CrosstermInput;

impl InputSource for CrosstermInput {
    fn next(&mut self, timeout: Duration) -> anyhow::Result<Option<CEvent>> {
        if event::poll(timeout)? {
            Ok(Some(event::read()?))
        } else {
            Ok(None)
        }
    }

    fn has_input(&mut self) -> bool {
        // An error here shows again, and is reported, at the next `next`.
        event::poll(Duration::ZERO).unwrap_or(true)
    }
}

/// The entry point the binary calls: one run, or two to compare. Returns
/// why a source failed before its first event, when
/// [`TuiOptions::stop_on_load_failure`] ended the UI for it.
pub fn run_tui(sources: Vec<(String, Source)>, opts: TuiOptions) -> anyhow::Result<Option<String>> {
    let mut app = App::new(sources, &opts)?;
    super::screen::run_on_terminal(&mut app)?;
    Ok(app.load_failure)
}

pub fn setup_terminal() -> anyhow::Result<Terminal<CrosstermBackend<Stdout>>> {
    enable_raw_mode()?;
    let mut out = io::stdout();
    if let Err(e) = execute!(out, EnterAlternateScreen, EnableMouseCapture) {
        restore_terminal();
        return Err(e.into());
    }
    match Terminal::new(CrosstermBackend::new(out)) {
        Ok(mut t) => {
            let _ = t.hide_cursor();
            Ok(t)
        }
        Err(e) => {
            restore_terminal();
            Err(e.into())
        }
    }
}

/// Leave raw mode and the alternate screen; safe to call more than once.
pub fn restore_terminal() {
    let _ = disable_raw_mode();
    let _ = execute!(
        io::stdout(),
        DisableMouseCapture,
        LeaveAlternateScreen,
        crossterm::cursor::Show
    );
}

pub(crate) struct RestoreGuard;

impl Drop for RestoreGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// Restore the terminal before the panic message is printed, then let the
/// original hook print it (trippy); installed once per process.
pub fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let original = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            original(info);
        }));
    });
}
