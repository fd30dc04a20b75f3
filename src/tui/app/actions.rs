//! What keys and actions do to the application state: a key read in the
//! context of the focus and any open prompt, then the action it names.

use super::{App, ColorMode, RunView, SyncMode};
use crate::producers::{open_source, EngineCommand};
use crate::tui::input::{self, UiAction};
use crate::tui::input::{Dir, Jump};
use crate::tui::theme::Theme;
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

impl App {
    pub fn handle_key(&mut self, key: KeyEvent) -> bool {
        // A notice answers the last key; the next one clears it.
        let had_notice = self.notice.take().is_some();
        self.key(key) || had_notice
    }

    fn key(&mut self, key: KeyEvent) -> bool {
        if self.prompt.is_some() {
            return self.prompt_key(key);
        }
        if self.popup.is_some() {
            return self.popup_key(key);
        }
        if let Some(redraw) = self.tab_key(key) {
            return redraw;
        }
        if key.code == input::PROMPT_KEY && !self.show_help {
            self.prompt = Some(String::new());
            return true;
        }
        match input::key_action(key, self.focus, self.show_help) {
            Some(a) => self.apply(a),
            None => false,
        }
    }

    /// Typing at the `:` prompt: Enter opens the run in place of the active
    /// one, Esc cancels.
    fn prompt_key(&mut self, key: KeyEvent) -> bool {
        let Some(text) = self.prompt.as_mut() else {
            return false;
        };
        match key.code {
            KeyCode::Esc => self.prompt = None,
            KeyCode::Backspace => {
                text.pop();
            }
            KeyCode::Char(c) if !key.modifiers.contains(KeyModifiers::CONTROL) => text.push(c),
            KeyCode::Enter => {
                let input = std::mem::take(text);
                self.prompt = None;
                if !input.trim().is_empty() {
                    self.open(&input);
                }
            }
            _ => return false,
        }
        true
    }

    /// Replace the active run with a scenario or snapshot by name or path.
    pub fn open(&mut self, input: &str) {
        match open_source(input) {
            Ok((title, source)) => {
                self.notice = Some(format!("opened {title}"));
                let run = RunView::new(title, source);
                match self.runs.get_mut(self.active) {
                    Some(slot) => *slot = run,
                    None => self.runs.push(run),
                }
                self.drain_sources();
            }
            Err(e) => self.notice = Some(e.to_string()),
        }
    }

    /// Apply one action; true when the screen must be redrawn.
    pub fn apply(&mut self, a: UiAction) -> bool {
        match a {
            UiAction::Quit => self.quit = true,
            UiAction::ToggleHelp => self.show_help = !self.show_help,
            UiAction::Escape => {
                if self.show_help {
                    self.show_help = false;
                } else if self.gpu.shown {
                    self.gpu.shown = false;
                } else if let Some(r) = self.active_mut().filter(|r| r.by_line.is_some()) {
                    r.by_line = None;
                } else if let Some(r) = self.active_mut() {
                    r.sel_block = None;
                    r.sel_finding = None;
                }
            }
            UiAction::TogglePlay => self.toggle_play(),
            UiAction::CyclePlayUnit => self.cycle_play_unit(),
            UiAction::ToggleAutoPause => self.toggle_auto_pause(),
            UiAction::ShowNarrationHistory => return self.show_narration_history(),
            UiAction::FindHolders => return self.find_holders(),
            UiAction::Jump(Jump::Leak, dir) => {
                let Some(r) = self.active_mut() else {
                    return false;
                };
                self.notice = Some(match r.jump_leak(dir) {
                    Ok(said) | Err(said) => said,
                });
                return true;
            }
            UiAction::Jump(jump, dir) => {
                self.playing = false;
                let moved = self.active_mut().is_some_and(|r| r.jump(jump, dir));
                if moved {
                    self.sync_others();
                } else if jump == Jump::Oom && dir == Dir::Fwd {
                    // None left here: the next device whose trace has one.
                    let next = self
                        .active_run()
                        .and_then(|r| r.devices.as_ref())
                        .and_then(|d| d.next_with_oom());
                    if let Some(device) = next {
                        return self.switch_device(device, true);
                    }
                }
                if !moved && jump == Jump::Oom {
                    self.notice = Some(self.no_oom(dir));
                    return true;
                }
                return moved;
            }
            UiAction::NextDevice => return self.step_device(1),
            UiAction::PrevDevice => return self.step_device(-1),
            UiAction::Start if self.show_help => self.help_scroll = 0,
            UiAction::End if self.show_help => self.help_scroll = usize::MAX,
            UiAction::Start => {
                self.playing = false;
                self.set_active_pos(0);
            }
            UiAction::End => {
                let len = self.active_run().map_or(0, RunView::len);
                self.set_active_pos(len);
            }
            UiAction::Faster => self.change_speed(true),
            UiAction::Slower => self.change_speed(false),
            UiAction::ToggleColor => {
                self.color_mode = match self.color_mode {
                    ColorMode::State => ColorMode::Category,
                    ColorMode::Category => ColorMode::State,
                }
            }
            UiAction::CycleTheme => {
                // Built-in themes are tested to parse; keep the current one if not.
                let next = self.theme_name.next();
                if let Ok(t) = Theme::builtin(next, self.theme.no_color) {
                    self.theme = t;
                    self.theme_name = next;
                    // Said on the status line, whose `theme` part a narrow
                    // screen leaves out.
                    let plain = if self.theme.no_color {
                        " (NO_COLOR)"
                    } else {
                        ""
                    };
                    self.notice = Some(format!("theme {}{plain}", self.theme.name));
                }
            }
            UiAction::FocusNext => self.focus = self.focus.next(),
            UiAction::FocusPrev => self.focus = self.focus.prev(),
            UiAction::Restart => self.restart(),
            UiAction::ToggleGpu => self.gpu.toggle(),
            UiAction::ToggleCode => self.toggle_code(),
            UiAction::ToggleLayout => self.toggle_layout(),
            UiAction::ToggleSync => {
                self.sync = match self.sync {
                    SyncMode::Fraction => SyncMode::Iteration,
                    SyncMode::Iteration => SyncMode::Fraction,
                };
                self.sync_others();
            }
            UiAction::SwitchRun => {
                if !self.runs.is_empty() {
                    self.active = (self.active + 1) % self.runs.len();
                }
            }
            UiAction::Down | UiAction::Up | UiAction::PageDown | UiAction::PageUp
                if self.show_help =>
            {
                let by = match a {
                    UiAction::Down => 1,
                    UiAction::Up => -1,
                    UiAction::PageDown => 10,
                    _ => -10,
                };
                self.help_scroll = self.help_scroll.saturating_add_signed(by);
            }
            UiAction::Down => return self.select(1),
            UiAction::Up => return self.select(-1),
            UiAction::PageDown => return self.page(1),
            UiAction::PageUp => return self.page(-1),
            UiAction::Enter => return self.enter(),
            UiAction::ZoomIn => return self.zoom(true),
            UiAction::ZoomOut => return self.zoom(false),
            UiAction::PanLeft => return self.pan(-1),
            UiAction::PanRight => return self.pan(1),
            UiAction::ShowStack => return self.show_stack(),
            UiAction::ToggleByLine => return self.toggle_by_line(),
            UiAction::ToggleSinceStep => return self.toggle_since_step(),
            UiAction::ShowMessage => return self.show_message(),
            UiAction::ShowEventSegment => return self.show_event_segment(),
        }
        true
    }

    /// Why `x`/`X` found no OOM: none yet while the run is still arriving
    /// (the cursor goes to the first one when it comes), or none there.
    fn no_oom(&mut self, dir: Dir) -> String {
        let Some(r) = self.active_mut() else {
            return "no run".into();
        };
        match dir {
            Dir::Fwd if r.is_live() => {
                r.pending_oom = true;
                format!(
                    "no OOM yet: the run is still arriving ({} events so far); the cursor goes to the first OOM when it comes",
                    r.len()
                )
            }
            Dir::Fwd => "no OOM or error after the cursor in this run".into(),
            Dir::Back => "no OOM or error before the cursor".into(),
        }
    }

    fn restart(&mut self) {
        self.play_acc = 0.0;
        self.playing = true;
        for r in &mut self.runs {
            let sent = r
                .source
                .as_ref()
                .is_some_and(|s| s.send(EngineCommand::Restart));
            if !sent {
                // Nothing to re-run: replay what we have from the start.
                r.pos = 0;
            }
        }
    }
}
