//! How playback moves: the unit one step covers (an event, an op, a phase,
//! an iteration), where the next step lands, and the narration moments that
//! auto-pause stops at. Every boundary is a mark the producer put in the
//! event stream (`MarkIndex`, `Timeline::next_mark`); nothing here looks at
//! memory.
//!
//! A scenario says its narration right after the event that makes it due
//! (`At::Iteration(n)` after `IterationBegin(n)`, `At::Oom` after the OOM
//! entry), so a step that lands on a moment also takes the narration markers
//! that follow it: the callout then shows that moment's text, not the one
//! before.

use super::run_view::RunView;
use crate::trace::{Event, MarkKind, Marker};

/// What one step of playback covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlayUnit {
    #[default]
    Event,
    Op,
    Phase,
    Iteration,
}

/// Steps per second when playing by op, phase or iteration.
pub const MIN_UNIT_RATE: f64 = 0.125;
pub const MAX_UNIT_RATE: f64 = 64.0;
pub const DEFAULT_UNIT_RATE: f64 = 1.0;

impl PlayUnit {
    pub const ALL: [PlayUnit; 4] = [
        PlayUnit::Event,
        PlayUnit::Op,
        PlayUnit::Phase,
        PlayUnit::Iteration,
    ];

    /// The next unit in the cycle the `m` key walks.
    pub fn next(self) -> PlayUnit {
        let i = PlayUnit::ALL.iter().position(|u| *u == self).unwrap_or(0);
        PlayUnit::ALL[(i + 1) % PlayUnit::ALL.len()]
    }

    pub fn name(self) -> &'static str {
        match self {
            PlayUnit::Event => "event",
            PlayUnit::Op => "op",
            PlayUnit::Phase => "phase",
            PlayUnit::Iteration => "iteration",
        }
    }

    /// The unit a `--play-by` value names.
    pub fn parse(s: &str) -> Option<PlayUnit> {
        PlayUnit::ALL.into_iter().find(|u| u.name() == s)
    }
}

/// The first index of `marks` (sorted by index) after `after`.
fn first_after<T>(marks: &[(usize, T)], after: Option<usize>) -> Option<usize> {
    let k = after.map_or(0, |c| marks.partition_point(|x| x.0 <= c));
    marks.get(k).map(|x| x.0)
}

fn is_narration(e: &Event) -> bool {
    matches!(e, Event::Marker(Marker::Narration(_)))
}

impl RunView {
    /// `pos` moved past the narration said right after the event it ends on.
    pub fn with_moment(&self, pos: usize) -> usize {
        let events = self.timeline.events();
        let mut p = pos.min(events.len());
        while events.get(p).is_some_and(|e| is_narration(&e)) {
            p += 1;
        }
        p
    }

    /// Events whose narration has been said at the cursor: the narration a
    /// run says before any event (`At::Start`) is said from the start.
    pub fn said_upto(&self) -> usize {
        self.pos.max(self.with_moment(0))
    }

    /// The event a step back searches from: the cursor's, before the
    /// narration it ends on (or the moment it belongs to would be found
    /// again). `None` at the start.
    pub fn moment_start(&self) -> Option<usize> {
        let events = self.timeline.events();
        let mut c = self.cursor()?;
        while events.get(c).is_some_and(|e| is_narration(&e)) {
            c = c.checked_sub(1)?;
        }
        Some(c)
    }

    /// Where one `unit` step forward from `pos` lands (narration of the
    /// moment included). At the last boundary of a finished run: its end.
    /// `None` when there is nowhere to go yet: the next boundary has not
    /// arrived, or the cursor is at the end.
    pub fn next_stop(&self, unit: PlayUnit, pos: usize) -> Option<usize> {
        let len = self.len();
        let after = pos.checked_sub(1);
        let boundary = match unit {
            PlayUnit::Event => (pos < len).then_some(pos),
            PlayUnit::Op => match after {
                None => self
                    .timeline
                    .marks()
                    .iter()
                    .find(|(_, k)| *k == MarkKind::Op)
                    .map(|(i, _)| *i),
                Some(c) => self.timeline.next_mark(c, MarkKind::Op),
            },
            PlayUnit::Phase => first_after(&self.marks.phase, after),
            PlayUnit::Iteration => first_after(&self.marks.iteration, after),
        };
        match boundary {
            Some(i) if unit == PlayUnit::Event => Some(i + 1),
            Some(i) => Some(self.with_moment(i + 1)),
            None if !self.is_live() && pos < len => Some(len),
            None => None,
        }
    }

    /// The first narration in events `[from, to)`: the cursor just after it
    /// and any said with it, where auto-pause stops.
    pub fn narration_between(&self, from: usize, to: usize) -> Option<usize> {
        let from = from.max(self.with_moment(0));
        let n = &self.marks.narration;
        n.get(n.partition_point(|i| *i < from))
            .filter(|i| **i < to)
            .map(|i| self.with_moment(i + 1))
    }
}
