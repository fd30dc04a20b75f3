//! Opening the popups (a block's stack, an event's details, a message in
//! full) and the "by Python line" pane, and the keys while a popup is open.

use crossterm::event::KeyEvent;

use super::App;
use crate::alloc::Action;
use crate::tui::input::{self, PopupAction};
use crate::tui::{details, narration};

impl App {
    /// A popup takes every key: scroll, fold, close, quit.
    pub(super) fn popup_key(&mut self, key: KeyEvent) -> bool {
        let Some(a) = input::popup_action(key) else {
            return false;
        };
        match a {
            PopupAction::Close => self.popup = None,
            PopupAction::Quit => self.quit = true,
            _ => {
                if let Some(p) = self.popup.as_mut() {
                    p.key(a);
                }
            }
        }
        true
    }

    /// `b`: the selected block's stack.
    pub(super) fn show_stack(&mut self) -> bool {
        let Some(r) = self.active_mut() else {
            return false;
        };
        r.sync_map();
        let Some(addr) = r.sel_block else {
            self.notice = Some("b: select a block first (j/k or click)".into());
            return true;
        };
        match details::stack_popup(r, addr) {
            Some(p) => self.popup = Some(p),
            None => {
                self.notice = Some(format!(
                    "b: block {addr:#x} is not in the map at this event"
                ));
            }
        }
        true
    }

    /// `e`: the error / OOM message or narration at the cursor in full; at
    /// an OOM entry of a snapshot (which has no message), its details.
    pub(super) fn show_message(&mut self) -> bool {
        let Some(r) = self.runs.get(self.active) else {
            return false;
        };
        if let Some(p) = details::message_popup(r) {
            self.popup = Some(p);
            return true;
        }
        let oom = r
            .cursor()
            .filter(|c| r.timeline.events().is_action(*c, Action::Oom));
        match oom.and_then(|c| details::event_popup(r, c)) {
            Some(p) => self.popup = Some(p),
            None => {
                self.notice = Some("e: no error, OOM or narration at the cursor".into());
            }
        }
        true
    }

    /// `E`: every narration up to the cursor, newest last.
    pub(super) fn show_narration_history(&mut self) -> bool {
        let Some(r) = self.runs.get(self.active) else {
            return false;
        };
        self.popup = Some(narration::history_popup(r));
        true
    }

    /// Enter on the event log: the details of its selected line.
    pub(super) fn show_event(&mut self) -> bool {
        let Some(r) = self.runs.get(self.active) else {
            return false;
        };
        let Some(p) = r.log_selected().and_then(|i| details::event_popup(r, i)) else {
            return false;
        };
        self.popup = Some(p);
        true
    }

    /// `u`: open or close the active run's "by Python line" pane.
    pub(super) fn toggle_by_line(&mut self) -> bool {
        let Some(r) = self.active_mut() else {
            return false;
        };
        r.sync_map();
        r.toggle_by_line();
        true
    }

    /// `S`: the pane shows what grew since the last step, or all live bytes.
    pub(super) fn toggle_since_step(&mut self) -> bool {
        let Some(r) = self.active_mut() else {
            return false;
        };
        r.sync_map();
        r.toggle_since_step();
        true
    }

    /// `H`: ask a running job's helper which Python names hold its tensors
    /// (PROTOCOL.md `find_holders`); its chains come back as findings.
    pub(super) fn find_holders(&mut self) -> bool {
        let Some(r) = self.active_mut() else {
            return false;
        };
        let job = matches!(
            r.job_place,
            Some(
                crate::job::nvml_match::JobPlace::Here
                    | crate::job::nvml_match::JobPlace::Remote { .. }
            )
        );
        let asked = job
            && r.is_live()
            && r.source
                .as_ref()
                .is_some_and(|s| s.send(crate::producers::EngineCommand::FindHolders));
        r.note = Some(if asked {
            "asked the job which Python names hold its tensors: its helper walks at the next step \
             (Optimizer.step or mark_step; a traced program: its next op), and the chains come to \
             the leak panel"
                .into()
        } else {
            "H asks a running job's helper which Python names hold its tensors; this view is not \
             a running job"
                .into()
        });
        true
    }
}
