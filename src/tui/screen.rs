//! The one terminal loop, for every full-screen view: the run view
//! ([`super::App`]), a lesson, a sweep's chart and `watch`. Each is a
//! [`Screen`]: it takes what its producers sent, answers keys, moves with
//! time, prepares its frame's data for the terminal's size, and draws that
//! frame; the loop does the rest, the same way for all of them.
//!
//! The loop is generic over the ratatui `Backend` and the input source
//! (gitui), so tests run it on `TestBackend` with a scripted key stream.
//! Each turn drains the producers (for a few milliseconds at most, and
//! stopping for a pressed key), renders if anything changed (yazi), then
//! takes all pending input and answers it with a frame at once; it never
//! blocks longer than one frame, and not at all while a producer has more
//! waiting. While a producer is far ahead (a large file's events), frames
//! come at a steady pace and the time between them goes to taking its
//! events.

use std::time::{Duration, Instant};

use crossterm::event::{Event as CEvent, KeyEvent, KeyEventKind, MouseEvent};
use ratatui::backend::Backend;
use ratatui::layout::Rect;
use ratatui::{Frame, Terminal};

use super::run::{install_panic_hook, setup_terminal, CrosstermInput, InputSource, RestoreGuard};

/// Frames at most this often while a producer has more waiting than a
/// drain takes: the rest of the time takes its events.
const BUSY_FRAME: Duration = Duration::from_millis(33);

/// A full-screen view the loop runs.
pub trait Screen {
    /// Called once as the loop starts (a screen the user left to open
    /// something forgets what it opened).
    fn begin(&mut self) {}

    /// Take what the producers sent since the last turn, without blocking,
    /// stopping early once `key_waiting` says a key was pressed (the loop
    /// answers it before taking more); true when the screen changed.
    fn drain(&mut self, _key_waiting: &mut dyn FnMut() -> bool) -> bool {
        false
    }

    /// More is waiting from a producer: take it after a look at the keys,
    /// not after a frame's wait.
    fn has_backlog(&self) -> bool {
        false
    }

    /// One key press (or repeat); true when a redraw is due.
    fn handle_key(&mut self, key: KeyEvent) -> bool;

    /// One mouse event; true when a redraw is due.
    fn handle_mouse(&mut self, _event: MouseEvent) -> bool {
        false
    }

    /// `elapsed` since the last turn (playback); true when a redraw is due.
    fn tick(&mut self, _elapsed: Duration) -> bool {
        false
    }

    /// The longest wait for input before the producers are looked at again.
    fn frame_wait(&self) -> Duration;

    /// Build this frame's data for a terminal of `area` (the views only
    /// draw what this made).
    fn prepare(&mut self, area: Rect);

    /// Draw the prepared frame.
    fn draw(&self, frame: &mut Frame);

    /// The loop ends: the user quit, or asked for something the caller
    /// opens (a lesson part's run, a sweep point's run).
    fn done(&self) -> bool;
}

/// The loop, until the screen is done or the input fails.
pub fn run_screen<B, I, S>(
    terminal: &mut Terminal<B>,
    screen: &mut S,
    input: &mut I,
) -> anyhow::Result<()>
where
    B: Backend,
    B::Error: Send + Sync + 'static,
    I: InputSource,
    S: Screen + ?Sized,
{
    screen.begin();
    let mut last = Instant::now();
    let mut dirty = true;
    let mut drawn: Option<Instant> = None;
    loop {
        dirty |= screen.drain(&mut || input.has_input());
        let paced = screen.has_backlog() && drawn.is_some_and(|at| at.elapsed() < BUSY_FRAME);
        if dirty && !paced {
            render(terminal, screen)?;
            dirty = false;
            drawn = Some(Instant::now());
        }
        if screen.done() {
            return Ok(());
        }
        // More is waiting from a producer: take it after a look at the
        // keys, not after a frame's wait (it would pile up meanwhile).
        let wait = if screen.has_backlog() {
            Duration::ZERO
        } else {
            screen.frame_wait()
        };
        if let Some(ev) = input.next(wait)? {
            let mut keyed = handle_event(screen, ev);
            while !screen.done() {
                match input.next(Duration::ZERO)? {
                    Some(ev) => keyed |= handle_event(screen, ev),
                    None => break,
                }
            }
            // Answered now, not after the next drain.
            if keyed && !screen.done() {
                render(terminal, screen)?;
                dirty = false;
                drawn = Some(Instant::now());
            }
        }
        let now = Instant::now();
        dirty |= screen.tick(now - last);
        last = now;
        if screen.done() {
            return Ok(());
        }
    }
}

/// Prepare for the terminal's current size and draw one frame.
pub fn render<B, S>(terminal: &mut Terminal<B>, screen: &mut S) -> anyhow::Result<()>
where
    B: Backend,
    B::Error: Send + Sync + 'static,
    S: Screen + ?Sized,
{
    let size = terminal.size()?;
    screen.prepare(Rect::new(0, 0, size.width, size.height));
    terminal.draw(|f| screen.draw(f))?;
    Ok(())
}

/// Apply one terminal event; true when a redraw is due.
pub fn handle_event<S: Screen + ?Sized>(screen: &mut S, ev: CEvent) -> bool {
    match ev {
        // Windows reports releases too; act on presses and repeats only.
        CEvent::Key(k) if k.kind != KeyEventKind::Release => screen.handle_key(k),
        CEvent::Mouse(m) => screen.handle_mouse(m),
        CEvent::Resize(_, _) => true,
        _ => false,
    }
}

/// `screen` on the real terminal: set up, the loop, and restored on every
/// way out (errors and panics included).
pub fn run_on_terminal<S: Screen + ?Sized>(screen: &mut S) -> anyhow::Result<()> {
    install_panic_hook();
    let mut terminal = setup_terminal()?;
    let _restore = RestoreGuard;
    run_screen(&mut terminal, screen, &mut CrosstermInput)
}
