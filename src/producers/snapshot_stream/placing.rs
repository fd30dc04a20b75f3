//! The placing thread: it takes the decoder's batches of entries, places
//! them on the map and sends the timeline's parts, or only checks that
//! every entry fits.

use super::AHEAD;
use crate::alloc::AllocConfig;
use crate::producers::snapshot::{
    spare_part, spawn_worker, Out, Spent, EVENTS_PER_MESSAGE, SPARE_PARTS,
};
use crate::producers::source::{RunMsg, SourceMsg};
use crate::trace::mirror::TraceMirror;
use crate::trace::placing_map::{PlaceOn, PlacingMap};
use crate::trace::replay::Entry;
use crate::trace::timeline::TimelinePart;
use crate::trace::MemoryMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    pub(super) entries: Vec<Entry>,
    /// `device_free` of this batch's `oom` entries, by entry index.
    pub(super) ooms: Vec<(usize, u64)>,
}

pub(super) enum ToMirror {
    Batch(Batch),
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
    /// Entries placed so far without a misfit.
    clean: Arc<AtomicUsize>,
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
    /// is met then: see [`Mirror::failed`]); `spares`: parts kept to be
    /// filled again.
    pub(super) fn spawn(
        start: MemoryMap,
        config: AllocConfig,
        ooms: Vec<(usize, u64)>,
        probation: usize,
        spares: usize,
        out: &Out,
        spent: &Spent,
    ) -> Mirror {
        let (tx, rx) = flume::bounded(AHEAD);
        let failed = Arc::new(AtomicBool::new(false));
        let clean = Arc::new(AtomicUsize::new(0));
        let placer = Placer {
            rx,
            out: out.clone(),
            spent: spent.clone(),
            failed: failed.clone(),
            clean: clean.clone(),
            probation,
            speculative: probation > 0,
            ooms,
            spares,
        };
        let handle = spawn_worker(
            "vramscope-place",
            "places the events",
            out,
            &failed,
            move || placer.run(start, &config),
        );
        Mirror {
            tx,
            failed,
            clean,
            handle,
        }
    }

    /// Entries placed so far without a misfit.
    pub(super) fn clean_upto(&self) -> usize {
        self.clean.load(Ordering::Relaxed)
    }

    /// Whether an entry fell outside the map (placed as if the trace began
    /// empty, it did not).
    pub(super) fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Hand a batch over; false once the thread has stopped.
    pub(super) fn place(&self, batch: Batch) -> bool {
        self.tx.send(ToMirror::Batch(batch)).is_ok()
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

/// The placing thread.
pub(super) struct Placer {
    rx: flume::Receiver<ToMirror>,
    out: Out,
    spent: Spent,
    failed: Arc<AtomicBool>,
    clean: Arc<AtomicUsize>,
    probation: usize,
    speculative: bool,
    ooms: Vec<(usize, u64)>,
    /// Parts kept to be filled again (see [`spare_part`]).
    spares: usize,
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
        let mut pending: Vec<Entry> = Vec::with_capacity(EVENTS_PER_MESSAGE);
        let mut pending_first = 0;
        let mut held: Vec<TimelinePart> = Vec::new();
        let mut sent = false;
        let mut placed = 0;
        while let Ok(msg) = self.rx.recv() {
            let batch = match msg {
                ToMirror::Batch(b) => b,
                ToMirror::End(then) => {
                    if then == Then::Drop || self.failed.load(Ordering::Relaxed) {
                        return sent;
                    }
                    if !pending.is_empty() {
                        let part = self.fill(&mut mirror, pending_first, &pending);
                        if self.failed.load(Ordering::Relaxed) || then == Then::Check {
                            return sent;
                        }
                        held.push(part);
                    }
                    if then == Then::Check {
                        return sent;
                    }
                    held.push(TimelinePart {
                        head: Some(Box::new(mirror.into_map().into_memory_map())),
                        ..TimelinePart::default()
                    });
                    return held
                        .into_iter()
                        .all(|p| self.out.send(SourceMsg::Run(RunMsg::Part(p))));
                }
            };
            if self.failed.load(Ordering::Relaxed) {
                continue;
            }
            if pending.is_empty() {
                pending_first = batch.first;
            }
            pending.extend_from_slice(&batch.entries);
            self.ooms.extend_from_slice(&batch.ooms);
            if pending.len() < EVENTS_PER_MESSAGE {
                continue;
            }
            let part = self.fill(&mut mirror, pending_first, &pending);
            placed += pending.len();
            pending.clear();
            if self.failed.load(Ordering::Relaxed) {
                held.clear();
                continue;
            }
            self.clean.store(placed, Ordering::Relaxed);
            held.push(part);
            if placed >= self.probation {
                for part in held.drain(..) {
                    if !self.out.send(SourceMsg::Run(RunMsg::Part(part))) {
                        return sent;
                    }
                    sent = true;
                }
            }
        }
        sent
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
