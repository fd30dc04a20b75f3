//! `vramscope lesson`'s loop: draw, read a key, until the learner quits or
//! asks for a part's scenario (then `state.open` says which; the caller runs
//! it in the run view and may come back). Generic over the backend and the
//! input so tests run it on `TestBackend`.

use std::time::Duration;

use crossterm::event::{Event as CEvent, KeyEventKind};
use ratatui::backend::Backend;
use ratatui::layout::Rect;
use ratatui::Terminal;

use super::lesson::LessonState;
use super::run::{install_panic_hook, setup_terminal, CrosstermInput, InputSource, RestoreGuard};
use super::views;

const FRAME: Duration = Duration::from_millis(100);

/// The lesson on the real terminal; the terminal is restored either way.
pub fn run_lesson(state: &mut LessonState) -> anyhow::Result<()> {
    install_panic_hook();
    let mut terminal = setup_terminal()?;
    let _restore = RestoreGuard;
    lesson_loop(&mut terminal, state, &mut CrosstermInput)
}

pub fn lesson_loop<B, I>(
    terminal: &mut Terminal<B>,
    state: &mut LessonState,
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
        if dirty {
            terminal.draw(|f| views::lesson::render(f, state))?;
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
        // Scrolling stops at the text's end, so ↑ answers at once after it.
        let size = terminal.size()?;
        let most = views::lesson::max_scroll(Rect::new(0, 0, size.width, size.height), state);
        state.scroll = state.scroll.min(most);
    }
}
