//! Playback: space, the speed keys, the play unit (`m`: by event, op, phase
//! or iteration) and auto-pause at narration (`a`), and the tick that moves
//! the cursor. Where a step lands comes from the run's marks
//! (`playback.rs`); this file only keeps time.

use std::time::Duration;

use super::{App, MAX_SPEED, MIN_SPEED};
use crate::tui::playback::{PlayUnit, MAX_UNIT_RATE, MIN_UNIT_RATE};

/// Most unit steps one tick takes (a stalled frame must not skip a lesson).
const MAX_STEPS_PER_TICK: usize = 64;

impl App {
    /// Steps per second in the current unit (events per second by event).
    pub fn rate(&self) -> f64 {
        match self.play_unit {
            PlayUnit::Event => self.speed,
            _ => self.unit_rate,
        }
    }

    /// Whether the active run is over and the cursor at its end.
    pub fn is_done(&self) -> bool {
        self.active_run()
            .is_some_and(|r| r.finished && r.failure.is_none() && r.pos >= r.len())
    }

    /// Whether playback stopped at the narration the cursor is on.
    pub fn held_at_narration(&self) -> bool {
        !self.playing && self.auto_paused_at.is_some() && self.auto_paused_at == self.active_pos()
    }

    fn active_pos(&self) -> Option<usize> {
        self.active_run().map(|r| r.pos)
    }

    /// Advance playback by `dt`; true when the screen changed.
    pub fn on_tick(&mut self, dt: Duration) -> bool {
        if !self.playing {
            return false;
        }
        let Some(run) = self.runs.get(self.active) else {
            return false;
        };
        let (pos, len) = (run.pos, run.len());
        if pos > 0 {
            self.held_start = false;
        } else if self.auto_pause && !self.held_start && run.said_upto() > 0 {
            // What is said before any event is a moment too: hold on it.
            self.held_start = true;
            self.playing = false;
            self.auto_paused_at = Some(0);
            return true;
        }
        if pos >= len {
            // At the live edge: do not bank time, or the cursor would jump
            // ahead when the next batch arrives.
            self.play_acc = 0.0;
            if !run.is_live() {
                // The run is over: stop, and the status says done.
                self.playing = false;
                return true;
            }
            return false;
        }
        self.play_acc += self.rate() * dt.as_secs_f64();
        let steps = self.play_acc.floor();
        if steps < 1.0 {
            return false;
        }
        self.play_acc -= steps;
        let mut target = match self.play_unit {
            PlayUnit::Event => (pos as f64 + steps).min(len as f64) as usize,
            unit => {
                let mut at = pos;
                for _ in 0..(steps as usize).min(MAX_STEPS_PER_TICK) {
                    match run.next_stop(unit, at) {
                        Some(next) => at = next,
                        None => break,
                    }
                }
                at
            }
        };
        if self.auto_pause {
            if let Some(stop) = run.narration_between(pos, target) {
                target = stop;
                self.playing = false;
                self.play_acc = 0.0;
                self.auto_paused_at = Some(stop);
            }
        }
        if target == pos {
            return false;
        }
        self.set_active_pos(target);
        true
    }

    /// Space: play or pause; play at the end of a finished run starts it over.
    pub(super) fn toggle_play(&mut self) {
        self.playing = !self.playing;
        self.play_acc = 0.0;
        // Play from the start goes on from what is said there.
        self.held_start |= self.playing && self.active_pos() == Some(0);
        if self.playing
            && self
                .active_run()
                .is_some_and(|r| !r.is_live() && r.pos >= r.len())
        {
            // Said, not silent: the run is over and plays again from its start.
            self.set_active_pos(0);
            self.notice = Some("replaying from the start (G goes back to the end)".into());
        }
    }

    /// `+` / `-`: twice or half the current unit's rate.
    pub(super) fn change_speed(&mut self, faster: bool) {
        let f = if faster { 2.0 } else { 0.5 };
        match self.play_unit {
            PlayUnit::Event => self.speed = (self.speed * f).clamp(MIN_SPEED, MAX_SPEED),
            _ => self.unit_rate = (self.unit_rate * f).clamp(MIN_UNIT_RATE, MAX_UNIT_RATE),
        }
    }

    /// `m`: the next play unit (the status line shows it).
    pub(super) fn cycle_play_unit(&mut self) {
        self.play_unit = self.play_unit.next();
        self.play_acc = 0.0;
    }

    /// `a`: auto-pause at narration on or off (the status line shows it).
    pub(super) fn toggle_auto_pause(&mut self) {
        self.auto_pause = !self.auto_pause;
    }

    /// The pace as the status line says it: `2000 ev/s`, `0.5 phase/s`.
    pub fn rate_label(&self) -> String {
        match self.play_unit {
            PlayUnit::Event => format!("{:.0} ev/s", self.speed),
            unit => format!("{} {}/s", self.unit_rate, unit.name()),
        }
    }
}
