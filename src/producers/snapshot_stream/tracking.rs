//! What a one-pass view needs from the trace besides its events, gathered
//! on the placing thread as the entries pass it: the reader decodes, and
//! the placer has time to spare (the reader's CPU is the view's wall time).

use std::sync::Arc;

use crate::alloc::Action;
use crate::trace::replay::reconstruct::StartTracker;
use crate::trace::replay::{Entry, FinalSegment};
use crate::trace::snapshot::TraceEntry;

use super::super::snapshot_tags::GrowingTags;
use super::PROBATION;

/// The start state, the device size's clues and the tags' per-entry
/// columns, from every entry in order.
pub(super) struct Tracking {
    /// Watching only the final blocks while the map takes every entry
    /// (see [`StartTracker::watching`]); every address once it does not.
    pub(super) start: StartTracker,
    /// The entries so far, until the map took the first [`PROBATION`]
    /// without a misfit: to read again into a tracker of every address if
    /// it did not.
    early: Option<Vec<Entry>>,
    /// `start` records every address.
    every_address: bool,
    /// Every `segment_map` (the device size, where expandable segments
    /// tell it).
    pub(super) maps: Vec<Entry>,
    /// Entries that make an event.
    pub(super) events: usize,
    /// The view's tags: each entry's stack id, action and time (the reader
    /// resolves the stacks, whose text only it holds).
    tags: Arc<GrowingTags>,
}

impl Tracking {
    pub(super) fn new(finals: &[FinalSegment], tags: Arc<GrowingTags>) -> Tracking {
        Tracking {
            start: StartTracker::watching(finals),
            early: Some(Vec::new()),
            every_address: false,
            maps: Vec::new(),
            events: 0,
            tags,
        }
    }

    /// Whether `start` holds the state the trace began in, once every
    /// entry was pushed: it records every address, or the map took every
    /// entry (`misfit`: it did not).
    pub(super) fn start_known(&self, misfit: bool) -> bool {
        self.every_address || !misfit
    }

    /// The next entries, before they are placed.
    pub(super) fn push(&mut self, entries: &[TraceEntry]) {
        self.tags.grow(|t| t.push_columns(entries));
        for e in entries {
            let entry = Entry::recorded(e);
            self.start.push(&entry);
            if let Some(early) = &mut self.early {
                early.push(entry);
            }
            if e.action == Action::SegmentMap {
                self.maps.push(entry);
            }
            self.events += usize::from(e.action.is_allocator());
        }
    }

    /// The map took `clean` entries without a misfit: past [`PROBATION`]
    /// the first entries are no longer kept.
    pub(super) fn placed(&mut self, clean: usize) {
        if clean >= PROBATION {
            self.early = None;
        }
    }

    /// An entry misfit: from here on, record every address (from the
    /// first entry, while they are kept).
    pub(super) fn misfit(&mut self) {
        if let Some(early) = self.early.take() {
            let mut every = StartTracker::new();
            early.iter().for_each(|e| every.push(e));
            self.start = every;
            self.every_address = true;
        }
    }
}
