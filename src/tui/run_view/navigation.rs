//! Moving the cursor: jumps to marks, OOMs, leaks and iterations.

use super::{oom_stops, RunView};
use crate::trace::{Event, MarkKind, Marker};
use crate::tui::input::{Dir, Jump};
use crate::tui::views::segment_map;

impl RunView {
    pub(in crate::tui) fn jump(&mut self, jump: Jump, dir: Dir) -> bool {
        let before = self.pos;
        let kind = match jump {
            Jump::Event => {
                self.pos = match dir {
                    Dir::Fwd => (self.pos + 1).min(self.len()),
                    Dir::Back => self.pos.saturating_sub(1),
                };
                return self.pos != before;
            }
            Jump::Leak => return self.jump_leak(dir).is_ok(),
            // Iterations and phases step from begin to begin.
            Jump::Phase => {
                let begins: Vec<usize> = self.marks.phase.iter().map(|x| x.0).collect();
                return self.step_in(&begins, dir);
            }
            Jump::Iteration => {
                let begins: Vec<usize> = self.marks.iteration.iter().map(|x| x.0).collect();
                return self.step_in(&begins, dir);
            }
            Jump::Narration => {
                // What is said before any event is said at the start (`g`).
                let lead = self.with_moment(0);
                let n = &self.marks.narration;
                let at = n[n.partition_point(|i| *i < lead)..].to_vec();
                return self.step_in(&at, dir);
            }
            Jump::Oom => {
                let at = oom_stops(&self.marks.oom, &self.marks.error);
                return self.step_in(&at, dir);
            }
            Jump::Op => MarkKind::Op,
        };
        if let Some(i) = self.mark_from_cursor(kind, dir) {
            self.land_on(i);
        }
        self.pos != before
    }

    /// Move to the next/previous index of `sorted` relative to the cursor
    /// (back: relative to the moment the cursor's narration belongs to).
    pub(in crate::tui) fn step_in(&mut self, sorted: &[usize], dir: Dir) -> bool {
        let target = match (dir, self.cursor()) {
            (Dir::Fwd, None) => sorted.first().copied(),
            (Dir::Fwd, Some(c)) => sorted.get(sorted.partition_point(|i| *i <= c)).copied(),
            (Dir::Back, _) => self
                .moment_start()
                .and_then(|c| sorted[..sorted.partition_point(|i| *i < c)].last().copied()),
        };
        target.is_some_and(|i| {
            self.land_on(i);
            true
        })
    }

    /// The cursor on event `index` and the narration said with it.
    fn land_on(&mut self, index: usize) {
        self.pos = self.with_moment(index + 1);
    }

    pub(in crate::tui) fn mark_from_cursor(&self, kind: MarkKind, dir: Dir) -> Option<usize> {
        match (dir, self.cursor()) {
            (Dir::Fwd, None) => self
                .timeline
                .marks()
                .iter()
                .find(|(_, k)| *k == kind)
                .map(|(i, _)| *i),
            (Dir::Fwd, Some(c)) => self.timeline.next_mark(c, kind),
            (Dir::Back, _) => self
                .moment_start()
                .and_then(|c| self.timeline.prev_mark(c, kind)),
        }
    }

    /// Select the next / previous block, in map order, that a leak holds
    /// at the cursor (the selected finding's, or every leak's). Either way
    /// the text is for the notice line: which one of how many, or why none.
    pub(in crate::tui) fn jump_leak(&mut self, dir: Dir) -> Result<String, String> {
        self.sync_map();
        let selected = self.sel_finding.and_then(|i| self.findings.get(i)).cloned();
        let mut held: Vec<u64> = match &selected {
            Some(f) => f.blocks.clone(),
            None => self
                .findings
                .iter()
                .filter(|f| f.kind.is_leak())
                .flat_map(|f| f.blocks.iter().copied())
                .collect(),
        };
        held.sort_unstable();
        let spans = self.row_spans().to_vec();
        let leaked: Vec<u64> = segment_map::block_order(&self.map, &spans)
            .into_iter()
            .filter(|a| held.binary_search(a).is_ok())
            .collect();
        if leaked.is_empty() {
            return Err(
                match (selected, self.findings.iter().any(|f| f.kind.is_leak())) {
                    (Some(f), _) => format!("f: `{}` holds no block at this moment", f.root),
                    (None, true) => "f: no leaked block is in the map at this moment".into(),
                    (None, false) => "f: no leak found up to this moment".into(),
                },
            );
        }
        let at = self
            .sel_block
            .and_then(|a| leaked.iter().position(|b| *b == a));
        let next = match (dir, at) {
            (Dir::Fwd, None) => Some(0),
            (Dir::Back, None) => Some(leaked.len() - 1),
            (Dir::Fwd, Some(i)) => (i + 1 < leaked.len()).then_some(i + 1),
            (Dir::Back, Some(i)) => i.checked_sub(1),
        };
        let n = leaked.len();
        match next {
            Some(i) => {
                self.sel_block = Some(leaked[i]);
                Ok(format!(
                    "leaked block {} of {n} (f next, F previous)",
                    i + 1
                ))
            }
            None if dir == Dir::Fwd => {
                Err(format!("f: the last of {n} leaked blocks (F goes back)"))
            }
            None => Err(format!("F: the first of {n} leaked blocks (f goes on)")),
        }
    }

    /// The iteration around the cursor and how far into it, for syncing.
    pub(in crate::tui) fn iteration_position(&self) -> Option<(u32, f64)> {
        let c = self.cursor()?;
        let events = self.timeline.events();
        let begin = std::iter::once(c)
            .chain(std::iter::successors(
                self.timeline.prev_mark(c, MarkKind::Iteration),
                |&i| self.timeline.prev_mark(i, MarkKind::Iteration),
            ))
            .find(|&i| {
                matches!(
                    events.get(i),
                    Some(Event::Marker(Marker::IterationBegin(_)))
                )
            })?;
        let Some(Event::Marker(Marker::IterationBegin(k))) = events.get(begin) else {
            return None;
        };
        let end = self
            .timeline
            .next_mark(begin, MarkKind::Iteration)
            .unwrap_or(events.len());
        let span = (end - begin).max(1) as f64;
        Some((k, (c - begin) as f64 / span))
    }

    pub(in crate::tui) fn iteration_bounds(&self, k: u32) -> Option<(usize, usize)> {
        let begin = self.marks.iteration_begin(k)?;
        let end = self
            .timeline
            .next_mark(begin, MarkKind::Iteration)
            .unwrap_or(self.timeline.len());
        Some((begin, end))
    }
}
