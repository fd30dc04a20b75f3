//! A file read through a trace tap, as the one-pass views read it: the
//! loading progress to the UI, then what the tap made with the rest of the
//! file, or how the view ends when the reading does not serve it (the UI
//! forgets what it was shown of a tap's work that is given up).

use std::path::Path;

use crate::trace::snapshot::{import_file_tapped, Snapshot, SnapshotError, TraceTap};

use super::snapshot::Out;
use super::snapshot_stream::Streamed;
use super::source::{LoadProgress, RecordedMsg, RunMsg, SourceMsg};

/// A tap that keeps what it made of a trace until the reading ends.
pub(super) trait StatefulTap: TraceTap {
    type State: GiveUp;
    fn take_state(&mut self) -> Option<Self::State>;
}

/// What a tap made that the view will not use.
pub(super) trait GiveUp {
    /// Drop it; whether the UI was shown some of it (and must forget it).
    fn give_up(self) -> bool;
}

/// How a reading through a tap ended.
pub(super) enum Reading<T> {
    /// The tap took a device's trace: what it made, and the rest of the
    /// file.
    Tapped {
        snap: Box<Snapshot>,
        state: T,
        device: usize,
        /// Entries tapped.
        count: usize,
    },
    /// The view is done (the UI has gone, or the file could not be read),
    /// or must be made from the whole file; the UI was told.
    Over(Streamed),
}

/// Read `path` through `tap` (the loading progress to the UI), and hand
/// back what it made with the rest of the file.
pub(super) fn read_through<T: StatefulTap>(
    path: &Path,
    out: &Out,
    tap: &mut T,
) -> Reading<T::State> {
    let total = std::fs::metadata(path).map_or(0, |m| m.len());
    let imported = read(path, total, out, tap);
    let state = tap.take_state();
    let give_up = |state: Option<T::State>| {
        if state.is_some_and(GiveUp::give_up) {
            out.send(SourceMsg::Run(RunMsg::Restarted));
        }
    };
    let tapped = match imported {
        Ok(Some(t)) => t,
        Ok(None) => {
            // The UI has gone.
            if let Some(s) = state {
                s.give_up();
            }
            return Reading::Over(Streamed::Done(false));
        }
        Err(e) => {
            give_up(state);
            out.send(SourceMsg::Run(RunMsg::Failed(e.to_string())));
            return Reading::Over(Streamed::Done(false));
        }
    };
    match (state, tapped.tapped) {
        (Some(state), Some((device, count))) => Reading::Tapped {
            snap: Box::new(tapped.snapshot),
            state,
            device,
            count,
        },
        (state, _) => {
            // Nothing was tapped, or the decoder read the file whole (what
            // the tap was given is void).
            give_up(state);
            Reading::Over(Streamed::Whole(Box::new(tapped.snapshot)))
        }
    }
}

/// The file read again whole, for a view planned from all of it (the
/// tapped trace's entries are not in the snapshot a tapped reading gives).
pub(super) fn whole_again(path: &Path, out: &Out) -> Streamed {
    match crate::trace::snapshot::import_file(path) {
        Ok(s) => Streamed::Whole(Box::new(s)),
        Err(e) => {
            out.send(SourceMsg::Run(RunMsg::Failed(e.to_string())));
            Streamed::Done(false)
        }
    }
}

/// Decode `path` through `tap`, saying how far it has got.
pub(super) fn read(
    path: &Path,
    total: u64,
    out: &Out,
    tap: &mut dyn TraceTap,
) -> Result<Option<crate::trace::snapshot::Tapped>, SnapshotError> {
    let reading =
        |done| SourceMsg::Recorded(RecordedMsg::Loading(LoadProgress::Reading { done, total }));
    if !out.send(reading(0)) {
        return Ok(None);
    }
    let step = (total / super::snapshot::PROGRESS_STEPS).max(1);
    let mut told = 0;
    let imported = import_file_tapped(
        path,
        &mut |done| {
            if done >= told + step {
                told = done;
                out.send(reading(done));
            }
        },
        Some(tap),
    );
    if imported.as_ref().is_ok_and(Option::is_some) && !out.send(reading(total)) {
        return Ok(None);
    }
    imported
}
