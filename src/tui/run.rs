//! Terminal setup and restore, and the app loop. The loop is generic over the
//! ratatui `Backend` and the input source (gitui), so tests run the real loop
//! on `TestBackend` with a scripted key stream. Each turn drains every
//! source (for a few milliseconds at most), renders if anything changed
//! (yazi), then takes all pending input and answers it with a frame at once;
//! it never blocks longer than one frame. While a source is far ahead (a
//! large file's events), frames come at a steady pace and the time between
//! them goes to taking its events.

use std::io::{self, Stdout};
use std::sync::Once;
use std::time::{Duration, Instant};

use crossterm::event::{
    self, DisableMouseCapture, EnableMouseCapture, Event as CEvent, KeyEventKind,
};
use crossterm::execute;
use crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use ratatui::backend::{Backend, CrosstermBackend};
use ratatui::layout::Rect;
use ratatui::Terminal;

use super::app::{App, TuiOptions};
use crate::producers::Source;

/// Frames at most this often while a source has more waiting than a drain
/// takes: the rest of the time takes its events.
const BUSY_FRAME: Duration = Duration::from_millis(33);

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
    install_panic_hook();
    let mut terminal = setup_terminal()?;
    // Restores on every way out of this function, errors included.
    let _restore = RestoreGuard;
    run_app(&mut terminal, &mut app, &mut CrosstermInput)?;
    Ok(app.load_failure)
}

/// The loop, until the app asks to quit or the input fails.
pub fn run_app<B, I>(terminal: &mut Terminal<B>, app: &mut App, input: &mut I) -> anyhow::Result<()>
where
    B: Backend,
    B::Error: Send + Sync + 'static,
    I: InputSource,
{
    let mut last = Instant::now();
    let mut dirty = true;
    let mut drawn: Option<Instant> = None;
    loop {
        dirty |= app.drain_sources_until(&mut || input.has_input());
        let paced = app.has_backlog() && drawn.is_some_and(|at| at.elapsed() < BUSY_FRAME);
        if dirty && !paced {
            render(terminal, app)?;
            dirty = false;
            drawn = Some(Instant::now());
        }
        if app.quit {
            return Ok(());
        }
        // More is waiting in a source: take it after a look at the keys,
        // not after a frame's wait (the source would pile up meanwhile).
        let wait = if app.has_backlog() {
            Duration::ZERO
        } else {
            app.frame_wait
        };
        if let Some(ev) = input.next(wait)? {
            let mut keyed = handle_event(app, ev);
            while !app.quit {
                match input.next(Duration::ZERO)? {
                    Some(ev) => keyed |= handle_event(app, ev),
                    None => break,
                }
            }
            // Answered now, not after the next drain.
            if keyed && !app.quit {
                render(terminal, app)?;
                dirty = false;
                drawn = Some(Instant::now());
            }
        }
        let now = Instant::now();
        dirty |= app.on_tick(now - last);
        last = now;
        if app.quit {
            return Ok(());
        }
    }
}

/// Prepare for the terminal's current size and draw one frame.
pub fn render<B>(terminal: &mut Terminal<B>, app: &mut App) -> anyhow::Result<()>
where
    B: Backend,
    B::Error: Send + Sync + 'static,
{
    let size = terminal.size()?;
    app.prepare(Rect::new(0, 0, size.width, size.height));
    terminal.draw(|f| app.draw(f))?;
    Ok(())
}

/// Apply one terminal event; true when a redraw is due.
pub fn handle_event(app: &mut App, ev: CEvent) -> bool {
    match ev {
        // Windows reports releases too; act on presses and repeats only.
        CEvent::Key(k) if k.kind != KeyEventKind::Release => app.handle_key(k),
        CEvent::Mouse(m) => app.handle_mouse(m),
        CEvent::Resize(_, _) => true,
        _ => false,
    }
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
