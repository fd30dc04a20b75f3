//! The placing thread: it takes the decoder's batches of entries, places
//! them on the map and sends the timeline's parts, or only checks that
//! every entry fits.

use super::tracking::Tracking;
use super::AHEAD;
use crate::alloc::AllocConfig;
use crate::producers::snapshot::{
    spare_part, spawn_worker, Out, Spent, EVENTS_PER_MESSAGE, SPARE_PARTS,
};
use crate::producers::source::{RunMsg, SourceMsg};
use crate::trace::mirror::TraceMirror;
use crate::trace::placing_map::{PlaceOn, PlacingMap};
use crate::trace::replay::Entry;
use crate::trace::snapshot::TraceEntry;
use crate::trace::timeline::TimelinePart;
use crate::trace::MemoryMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Parts a placer of a `file_bytes` snapshot keeps to be filled again: one
/// per 64 MiB of file (a part holds 16,384 events; a 960 MB file makes 755
/// of them), at least [`SPARE_PARTS`], at most 16 (a peak RSS of 2 % of
/// the file's size at most, for a quarter less CPU to load it).
pub(super) fn spares_for(file_bytes: u64) -> usize {
    usize::try_from(file_bytes >> 26)
        .unwrap_or(usize::MAX)
        .clamp(SPARE_PARTS, 16)
}

/// Entries for the placing thread.
pub(super) struct Batch {
    pub(super) first: usize,
    pub(super) entries: Vec<TraceEntry>,
    /// `device_free` of this batch's `oom` entries, by entry index.
    pub(super) ooms: Vec<(usize, u64)>,
}

pub(super) enum ToMirror {
    Batch(Batch),
    /// Every entry was handed over: place what is left (holding its part)
    /// and hand the tracking back.
    Settle(flume::Sender<Tracking>),
    /// No more entries.
    End(Then),
}

/// What the placing thread does once it has every entry.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Then {
    /// Send what is left.
    Send,
    /// Place what is left, to tell whether any entry misfit; send nothing.
    Check,
    /// Stop at once.
    Drop,
}

/// The thread that places entries on the map and sends the timeline's
/// parts, and what the reader knows of it.
pub(super) struct Mirror {
    tx: flume::Sender<ToMirror>,
    failed: Arc<AtomicBool>,
    /// Whether it sent parts (see [`Placer::run`]); `None`: no thread.
    handle: Option<std::thread::JoinHandle<bool>>,
}

/// How the placing of every entry ended.
pub(super) enum Finish {
    /// Every part went to the UI.
    Sent,
    /// An entry fell outside the map: nothing more was sent; `shown`:
    /// parts were before.
    Failed { shown: bool },
    /// The UI has gone.
    Gone,
}

impl Mirror {
    /// A placing thread from `start` under `config`; `ooms`: the free
    /// memory of OOM entries known up front; parts are held back until
    /// `probation` entries were placed without a gap (none are, if one
    /// is met then: see [`Mirror::finish`]); `spares`: parts kept to be
    /// filled again; `tracking`: what to gather from every entry.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn spawn(
        start: MemoryMap,
        config: AllocConfig,
        ooms: Vec<(usize, u64)>,
        probation: usize,
        spares: usize,
        tracking: Option<Tracking>,
        out: &Out,
        spent: &Spent,
    ) -> Mirror {
        let (tx, rx) = flume::bounded(AHEAD);
        let failed = Arc::new(AtomicBool::new(false));
        let placer = Placer {
            rx,
            out: out.clone(),
            spent: spent.clone(),
            failed: failed.clone(),
            probation,
            speculative: probation > 0,
            ooms,
            spares,
            tracking,
        };
        let handle = spawn_worker(
            "vramscope-place",
            "places the events",
            out,
            &failed,
            move || placer.run(start, &config),
        );
        Mirror { tx, failed, handle }
    }

    /// Hand a batch over; false once the thread has stopped.
    pub(super) fn place(&self, batch: Batch) -> bool {
        self.tx.send(ToMirror::Batch(batch)).is_ok()
    }

    /// Once every entry was handed over: what the thread gathered from
    /// them, every entry placed (`None`: the thread has stopped).
    pub(super) fn settle(&self) -> Option<Tracking> {
        let (tx, rx) = flume::bounded(1);
        self.tx.send(ToMirror::Settle(tx)).ok()?;
        rx.recv().ok()
    }

    /// The last parts and the map after them, once every entry was
    /// handed over.
    pub(super) fn finish(mut self) -> Finish {
        let _ = self.tx.send(ToMirror::End(Then::Send));
        let sent = join(self.handle.take());
        match (self.failed.load(Ordering::Relaxed), sent) {
            (true, shown) => Finish::Failed { shown },
            (false, true) => Finish::Sent,
            (false, false) => Finish::Gone,
        }
    }

    /// Stop, sending nothing more; true when parts were shown already.
    pub(super) fn discard(mut self) -> bool {
        self.failed.store(true, Ordering::Relaxed);
        let _ = self.tx.send(ToMirror::End(Then::Drop));
        join(self.handle.take())
    }

    /// Place every entry handed over, sending nothing more: whether parts
    /// were shown already, and whether any entry misfit.
    pub(super) fn check(mut self) -> (bool, bool) {
        let _ = self.tx.send(ToMirror::End(Then::Check));
        let shown = join(self.handle.take());
        (shown, self.failed.load(Ordering::Relaxed))
    }
}

/// What the placing thread returned; one that panicked may have sent parts.
pub(super) fn join(handle: Option<std::thread::JoinHandle<bool>>) -> bool {
    handle.is_some_and(|h| h.join().unwrap_or(true))
}

/// Entries waiting to be placed, and the parts placed but not yet sent.
struct Pending {
    first: usize,
    entries: Vec<Entry>,
    /// Entries placed so far.
    placed: usize,
    held: Vec<TimelinePart>,
}

/// The placing thread.
pub(super) struct Placer {
    rx: flume::Receiver<ToMirror>,
    out: Out,
    spent: Spent,
    failed: Arc<AtomicBool>,
    probation: usize,
    speculative: bool,
    ooms: Vec<(usize, u64)>,
    /// Parts kept to be filled again (see [`spare_part`]).
    spares: usize,
    tracking: Option<Tracking>,
}

impl Placer {
    /// Place every batch; returns whether parts were sent (for a discarded
    /// run: whether the UI saw any), or for a finished one whether the UI
    /// took them all.
    pub(super) fn run(self, start: MemoryMap, config: &AllocConfig) -> bool {
        match PlacingMap::tiled(start) {
            Ok(map) => self.place_on(TraceMirror::starting_from(map, config)),
            Err(map) => self.place_on(TraceMirror::starting_from(*map, config)),
        }
    }

    fn place_on<M: PlaceOn>(mut self, mut mirror: TraceMirror<'_, M>) -> bool {
        let mut pending = Pending {
            first: 0,
            entries: Vec::with_capacity(EVENTS_PER_MESSAGE),
            placed: 0,
            held: Vec::new(),
        };
        let mut sent = false;
        while let Ok(msg) = self.rx.recv() {
            let batch = match msg {
                ToMirror::Batch(b) => b,
                ToMirror::Settle(reply) => {
                    self.place_pending(&mut mirror, &mut pending);
                    if let Some(t) = self.tracking.take() {
                        let _ = reply.send(t);
                    }
                    continue;
                }
                ToMirror::End(then) => {
                    if then == Then::Drop || self.failed.load(Ordering::Relaxed) {
                        return sent;
                    }
                    if !self.place_pending(&mut mirror, &mut pending) || then == Then::Check {
                        return sent;
                    }
                    let mut held = pending.held;
                    held.push(TimelinePart {
                        head: Some(Box::new(mirror.into_map().into_memory_map())),
                        ..TimelinePart::default()
                    });
                    return held
                        .into_iter()
                        .all(|p| self.out.send(SourceMsg::Run(RunMsg::Part(p))));
                }
            };
            if let Some(t) = &mut self.tracking {
                t.push(&batch.entries);
            }
            if self.failed.load(Ordering::Relaxed) {
                continue;
            }
            if pending.entries.is_empty() {
                pending.first = batch.first;
            }
            pending
                .entries
                .extend(batch.entries.iter().map(Entry::recorded));
            self.ooms.extend_from_slice(&batch.ooms);
            if pending.entries.len() < EVENTS_PER_MESSAGE
                || !self.place_pending(&mut mirror, &mut pending)
            {
                continue;
            }
            if pending.placed >= self.probation {
                for part in pending.held.drain(..) {
                    if !self.out.send(SourceMsg::Run(RunMsg::Part(part))) {
                        return sent;
                    }
                    sent = true;
                }
            }
        }
        sent
    }

    /// The pending entries placed, into a held part: false when one misfit
    /// (the held parts are then dropped) or one did before.
    fn place_pending<M: PlaceOn>(
        &mut self,
        mirror: &mut TraceMirror<'_, M>,
        pending: &mut Pending,
    ) -> bool {
        if self.failed.load(Ordering::Relaxed) {
            return false;
        }
        if pending.entries.is_empty() {
            return true;
        }
        let part = self.fill(mirror, pending.first, &pending.entries);
        pending.placed += pending.entries.len();
        pending.entries.clear();
        if self.failed.load(Ordering::Relaxed) {
            pending.held.clear();
            if let Some(t) = &mut self.tracking {
                t.misfit();
            }
            return false;
        }
        if let Some(t) = &mut self.tracking {
            t.placed(pending.placed);
        }
        pending.held.push(part);
        true
    }

    /// Entries `first..` placed, into a part the UI gave back where there
    /// is one.
    pub(super) fn fill<M: PlaceOn>(
        &self,
        mirror: &mut TraceMirror<'_, M>,
        first: usize,
        entries: &[Entry],
    ) -> TimelinePart {
        let ooms = &self.ooms;
        let free_at = |i: usize| {
            ooms.binary_search_by_key(&i, |(at, _)| *at)
                .ok()
                .map(|k| ooms[k].1)
        };
        let mut part = spare_part(&self.spent, self.spares);
        mirror.fill_part(first, entries, free_at, &mut part);
        if self.speculative && !part.gaps.is_empty() {
            self.failed.store(true, Ordering::Relaxed);
        }
        part
    }
}
