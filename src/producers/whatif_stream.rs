//! A what-if view read in one pass: the recorded run's requests are
//! replayed under another config while the file is decoded, instead of
//! after a replay of the whole trace (to find its `empty_cache()` calls)
//! and another (the what-if itself) once it is read.
//!
//! What the replay needs beside the entries comes late in the file or
//! from its end: the recorded settings (written after the trace), the
//! state the trace began in, and the device size, which for a run without
//! expandable segments is the most the recorded run reserved. So, as for a
//! recorded trace (`snapshot_stream`), the requests are replayed as if the
//! trace began empty under the default settings, on a device without a
//! limit, and the view says so until the file is read. Then it is
//! checked: the settings are the default's, the start is empty, the trace
//! tells no device size, and the replay never reserved more than the
//! device the whole file gives (so no request would have failed there). If
//! all hold, the events are the ones the whole file gives; if not, the view
//! starts over from the whole file. A config whose replay depends on the
//! device size from its first request (expandable segments reserve by it,
//! a memory fraction is a share of it) is replayed from the whole file.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::alloc::{Action, AllocConfig};
use crate::trace::replay::from_snapshot::{
    self, releases_segment, shows_empty_cache, BeforeKernels, DEFAULT_DEVICE_TOTAL,
};
use crate::trace::replay::reconstruct::StartTracker;
use crate::trace::replay::whatif::{Past, WhatIf};
use crate::trace::replay::{Entry, Replayer};
use crate::trace::snapshot::{import_file_tapped, FramesId, Segment, Tables, TraceEntry, TraceTap};
use crate::trace::Event;

use super::devices::{snapshot_devices, SnapshotDevices};
use super::snapshot::{pick_device, spawn_worker, Out, EVENTS_PER_MESSAGE};
use super::snapshot_stream::{with_oom, Streamed, PROBATION};
use super::snapshot_tags::{GrowingTags, SnapshotTags};
use super::source::{Opened, RecordedMsg, RunMsg, SourceMsg, TagInfo};
use super::tapped_read::{read_through, whole_again, GiveUp, Reading, StatefulTap};

/// Whether a what-if under `config` can be replayed before the device size
/// is known: its replay depends on the size only where a request fails.
pub(super) fn streams(config: &AllocConfig) -> bool {
    !config.expandable_segments && config.per_process_memory_fraction.is_none()
}

/// A device no replay fills: the size until the file tells it.
const UNBOUNDED: u64 = u64::MAX / 4;

/// Read `path` for the what-if view of `device` under `under` (which
/// [`streams`]), replaying its requests as they are decoded.
pub(super) fn stream_what_if(
    path: &Path,
    device: Option<usize>,
    under: &AllocConfig,
    out: &Out,
) -> Streamed {
    let mut tap = WhatIfTap {
        want: device,
        path,
        under,
        out,
        state: None,
    };
    let (snap, state, tapped_device) = match read_through(path, out, &mut tap) {
        Reading::Tapped {
            snap,
            state,
            device,
            ..
        } => (snap, state, device),
        Reading::Over(streamed) => return streamed,
    };
    let Tapping {
        tags,
        facts,
        replay,
    } = state;
    // The device size the whole file gives (`replayed::device_capacity`):
    // with no expandable segments the trace tells none, so the most the
    // recorded run reserved.
    let capacity = (facts.reserved_peak > 0).then_some(facts.reserved_peak);
    let replayed = replay.finish(capacity);
    let recorded = from_snapshot::config(&snap);
    let finals = from_snapshot::final_segments(&snap, tapped_device);
    let replayed_right = pick_device(&snap, device).is_ok_and(|d| d == tapped_device)
        && recorded.same_rules(&AllocConfig::default())
        && facts.start.starts_empty(&finals)
        && !facts.expandable
        && !finals.iter().any(|s| s.is_expandable);
    let (capacity, replayed) = match (replayed_right, capacity, replayed) {
        (true, Some(c), Some(r)) => (c, r),
        _ => {
            if replay.verdict(Keep::Nothing) > 0 {
                out.send(SourceMsg::Run(RunMsg::Restarted));
            }
            return whole_again(path, out);
        }
    };
    let mut devices = snapshot_devices(&snap);
    devices.push(tapped_device);
    devices.sort_unstable();
    devices.dedup();
    let opened = Opened {
        tags: Some(tags as Arc<dyn TagInfo>),
        capacity: Some(capacity),
        devices: SnapshotDevices {
            path: Some(path.to_path_buf()),
            devices,
            current: tapped_device,
            with_oom: with_oom(&snap, tapped_device, facts.oom),
            under: Some(under.clone()),
        },
        events: None,
        since_step: false,
        assumed_empty_start: false,
    };
    let Some(past) = replayed.past else {
        // No request came near the device's size: as on that device.
        replay.verdict(Keep::All);
        return Streamed::Done(
            out.send(SourceMsg::Recorded(RecordedMsg::Opened(Box::new(opened)))),
        );
    };
    // The what-if needs more than the device holds, which changes what it
    // does from the first request that does not fit: the events before it
    // stay, and the rest is replayed again on that device, from a second
    // reading (the `empty_cache()` calls are known now).
    let keep = past.events_before;
    if replay.verdict(Keep::First(keep)) > keep {
        out.send(SourceMsg::Run(RunMsg::KeepFirst(keep)));
    }
    drop(snap);
    if !out.send(SourceMsg::Recorded(RecordedMsg::Opened(Box::new(opened)))) {
        return Streamed::Done(false);
    }
    let (tx, rx) = flume::bounded(64);
    let worker = {
        let (out, under) = (out.clone(), under.clone());
        std::thread::Builder::new()
            .name("vramscope-what-if".into())
            .spawn(move || {
                super::snapshot::behind_the_ui();
                replay_on(rx, under, capacity, &replayed.empty_cache_at, keep, &out)
            })
    };
    let Ok(worker) = worker else {
        out.send(SourceMsg::Run(RunMsg::Failed(
            "could not start the thread that replays the requests".into(),
        )));
        return Streamed::Done(false);
    };
    let mut again = Entries {
        device: tapped_device,
        tx,
    };
    let read = import_file_tapped(path, &mut |_| {}, Some(&mut again));
    drop(again);
    let done = worker.join().unwrap_or(false);
    match read {
        Ok(Some(_)) => Streamed::Done(done),
        Ok(None) => Streamed::Done(false),
        Err(e) => {
            out.send(SourceMsg::Run(RunMsg::Restarted));
            out.send(SourceMsg::Run(RunMsg::Failed(e.to_string())));
            Streamed::Done(false)
        }
    }
}

/// The entries of a second reading, to the replaying thread.
struct Entries {
    device: usize,
    tx: flume::Sender<Vec<Entry>>,
}

impl TraceTap for Entries {
    fn begin(&mut self, device: usize, _: Option<&[Segment]>, _: Tables<'_>) -> bool {
        device == self.device
    }

    fn entries(&mut self, _: usize, entries: &[TraceEntry], _: Tables<'_>) -> bool {
        self.tx
            .send(entries.iter().map(Entry::recorded).collect())
            .is_ok()
    }
}

/// The requests under `under` on a device of `capacity` bytes, the
/// recorded run's `empty_cache()` calls known: events sent as they come,
/// but for the first `shown` (the UI has them from the first replay).
fn replay_on(
    rx: flume::Receiver<Vec<Entry>>,
    under: AllocConfig,
    capacity: u64,
    empty_cache_at: &[usize],
    shown: usize,
    out: &Out,
) -> bool {
    let mut what_if = WhatIf::new(None, under, capacity, true);
    let mut held: Vec<Event> = Vec::new();
    let (mut made, mut sent) = (0, 0);
    while let Ok(batch) = rx.recv() {
        what_if.feed(&batch, empty_cache_at);
        for e in what_if.take_events() {
            made += 1;
            if made > shown {
                held.push(Event::Alloc(e));
            }
        }
        if !send_events(out, &mut held, usize::MAX, false, &mut sent) {
            return false;
        }
    }
    send_events(out, &mut held, usize::MAX, true, &mut sent)
}

/// The held events in messages (the last one short only with `all`), no
/// more than `limit` sent in all; false once the UI has gone.
fn send_events(
    out: &Out,
    held: &mut Vec<Event>,
    limit: usize,
    all: bool,
    sent: &mut usize,
) -> bool {
    let room = limit.saturating_sub(*sent);
    if held.len() > room {
        held.truncate(room);
    }
    while held.len() >= EVENTS_PER_MESSAGE || (all && !held.is_empty()) {
        let n = held.len().min(EVENTS_PER_MESSAGE);
        let chunk: Vec<Event> = held.drain(..n).collect();
        if !out.send(SourceMsg::Run(RunMsg::Events(chunk))) {
            return false;
        }
        *sent += n;
    }
    true
}

/// What the checks need from the trace, gathered entry by entry.
struct Facts {
    start: StartTracker,
    /// A `segment_map` or `segment_unmap`: expandable segments, whose
    /// reservations tell the device size.
    expandable: bool,
    /// Reserved bytes as the segment entries go, and the most.
    reserved: u64,
    reserved_peak: u64,
    oom: bool,
    /// Per stack: whether it passes through `empty_cache()`.
    empty_cache: FxHashMap<FramesId, bool>,
    /// Whether the program's first kernel has come yet.
    before_kernels: BeforeKernels,
}

impl Facts {
    /// The entries as a replay reads them, noting what the checks need.
    fn push(&mut self, entries: &[TraceEntry], tables: Tables<'_>) -> Vec<Entry> {
        entries
            .iter()
            .map(|e| {
                let in_empty_cache = releases_segment(e.action)
                    && *self
                        .empty_cache
                        .entry(e.frames)
                        .or_insert_with(|| shows_empty_cache(tables.frames, e.frames));
                let entry = Entry {
                    in_empty_cache,
                    before_kernels: self.before_kernels.read(tables.frames, e),
                    ..Entry::recorded(e)
                };
                self.start.push(&entry);
                match e.action {
                    Action::SegmentAlloc | Action::SegmentMap => {
                        self.reserved = self.reserved.saturating_add(e.size);
                        self.reserved_peak = self.reserved_peak.max(self.reserved);
                        self.expandable |= e.action == Action::SegmentMap;
                    }
                    Action::SegmentFree | Action::SegmentUnmap => {
                        self.reserved = self.reserved.saturating_sub(e.size);
                        self.expandable |= e.action == Action::SegmentUnmap;
                    }
                    Action::Oom => self.oom = true,
                    _ => {}
                }
                entry
            })
            .collect()
    }
}

struct WhatIfTap<'a> {
    want: Option<usize>,
    path: &'a Path,
    under: &'a AllocConfig,
    out: &'a Out,
    state: Option<Tapping>,
}

struct Tapping {
    tags: Arc<GrowingTags>,
    facts: Facts,
    replay: Replay,
}

impl GiveUp for Tapping {
    fn give_up(self) -> bool {
        self.replay.verdict(Keep::Nothing) > 0
    }
}

impl StatefulTap for WhatIfTap<'_> {
    type State = Tapping;
    fn take_state(&mut self) -> Option<Tapping> {
        self.state.take()
    }
}

impl TraceTap for WhatIfTap<'_> {
    fn begin(&mut self, device: usize, segments: Option<&[Segment]>, tables: Tables<'_>) -> bool {
        let Some((segments, devices)) = super::snapshot_stream::taken(self.want, device, segments)
        else {
            return false;
        };
        let tags = Arc::new(GrowingTags::new(SnapshotTags::begin(
            segments,
            device,
            false,
            tables.frames,
        )));
        self.out
            .send(SourceMsg::Recorded(RecordedMsg::Opened(Box::new(Opened {
                tags: Some(tags.clone() as Arc<dyn TagInfo>),
                capacity: None,
                devices: SnapshotDevices {
                    path: Some(self.path.to_path_buf()),
                    devices,
                    current: device,
                    with_oom: Vec::new(),
                    under: Some(self.under.clone()),
                },
                events: None,
                since_step: false,
                assumed_empty_start: true,
            }))));
        self.state = Some(Tapping {
            tags,
            facts: Facts {
                start: StartTracker::new(),
                expandable: false,
                reserved: 0,
                reserved_peak: 0,
                oom: false,
                empty_cache: FxHashMap::default(),
                before_kernels: BeforeKernels::default(),
            },
            replay: Replay::spawn(self.under.clone(), self.out),
        });
        true
    }

    fn entries(&mut self, _first: usize, entries: &[TraceEntry], tables: Tables<'_>) -> bool {
        let Some(s) = &mut self.state else {
            return true;
        };
        s.tags.grow(|t| t.push(entries, tables.frames));
        let batch = s.facts.push(entries, tables);
        if s.facts.start.saw_older() {
            // The trace began with memory in use: the replay from an empty
            // start is void (the whole file is read again at the end).
            s.replay.fail();
        } else {
            s.replay.feed(batch);
        }
        !self.out.is_gone()
    }
}

/// What the replays of every entry found.
struct Replayed {
    /// Where the what-if (on a device without a limit) first reserved
    /// more than the device the whole file gives.
    past: Option<Past>,
    /// Where the recorded run called `empty_cache()`.
    empty_cache_at: Vec<usize>,
}

enum ToReplay {
    Batch(Vec<Entry>),
    /// Every entry was handed over, and the device holds this many bytes
    /// (`None`: the device is not known): replay what is left, hold its
    /// events, and say what the replays found.
    Finish(Option<u64>, flume::Sender<Replayed>),
    /// What of the held events to send.
    Verdict(Keep),
}

/// What of a replay's events the UI keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    All,
    Nothing,
    /// The first this many (the replay needed more than the device holds
    /// after them).
    First(usize),
}

impl Keep {
    fn limit(self) -> usize {
        match self {
            Keep::All => usize::MAX,
            Keep::Nothing => 0,
            Keep::First(n) => n,
        }
    }
}

/// The thread that replays the requests, and what the reader knows of it.
struct Replay {
    tx: flume::Sender<ToReplay>,
    failed: Arc<AtomicBool>,
    /// Whether it sent events; `None`: no thread.
    handle: Option<std::thread::JoinHandle<usize>>,
}

impl Replay {
    fn spawn(under: AllocConfig, out: &Out) -> Replay {
        let (tx, rx) = flume::bounded(64);
        let failed = Arc::new(AtomicBool::new(false));
        let (f, o) = (failed.clone(), out.clone());
        let handle = spawn_worker(
            "vramscope-what-if",
            "replays the requests",
            out,
            &failed,
            move || replay(rx, under, &o, &f),
        );
        Replay { tx, failed, handle }
    }

    fn feed(&self, batch: Vec<Entry>) {
        if !self.failed.load(Ordering::Relaxed) {
            let _ = self.tx.send(ToReplay::Batch(batch));
        }
    }

    fn fail(&self) {
        self.failed.store(true, Ordering::Relaxed);
    }

    /// Replay what is left, on a device of `capacity` bytes if known
    /// (`None`: it was given up, or the thread is gone).
    fn finish(&self, capacity: Option<u64>) -> Option<Replayed> {
        if self.failed.load(Ordering::Relaxed) {
            return None;
        }
        let (reply, peak) = flume::bounded(1);
        self.tx.send(ToReplay::Finish(capacity, reply)).ok()?;
        // The thread answers, then waits for the verdict.
        peak.recv().ok()
    }

    /// Send what is kept of the held events; how many events the UI was
    /// sent in all (it may have seen more than are kept).
    fn verdict(mut self, keep: Keep) -> usize {
        if keep == Keep::Nothing {
            self.failed.store(true, Ordering::Relaxed);
        }
        let _ = self.tx.send(ToReplay::Verdict(keep));
        self.handle
            .take()
            .map_or(0, |h| h.join().unwrap_or(usize::MAX))
    }
}

/// The replaying thread: the recorded run's requests replayed as they come
/// (the `empty_cache()` calls told apart by a replay under its own
/// settings), then under `under`, whose events go to the UI once
/// [`PROBATION`] entries were replayed. Returns how many events were sent.
fn replay(
    rx: flume::Receiver<ToReplay>,
    under: AllocConfig,
    out: &Out,
    failed: &AtomicBool,
) -> usize {
    let mut verify = Replayer::new(AllocConfig::default(), DEFAULT_DEVICE_TOTAL);
    let mut what_if = WhatIf::new(None, under, UNBOUNDED, true);
    // Entries the what-if has not replayed yet: its empty_cache() calls
    // before them are not all known.
    let mut waiting: Vec<Entry> = Vec::new();
    let mut held: Vec<Event> = Vec::new();
    let mut sent = 0;
    while let Ok(msg) = rx.recv() {
        match msg {
            ToReplay::Batch(batch) => {
                if failed.load(Ordering::Relaxed) {
                    continue;
                }
                verify.feed(&batch);
                waiting.extend_from_slice(&batch);
                let ready = verify
                    .settled()
                    .saturating_sub(what_if.fed())
                    .min(waiting.len());
                what_if.feed(&waiting[..ready], &verify.outcome().empty_cache_at);
                waiting.drain(..ready);
                held.extend(what_if.take_events().into_iter().map(Event::Alloc));
                if what_if.fed() >= PROBATION
                    && !send_events(out, &mut held, usize::MAX, false, &mut sent)
                {
                    return sent;
                }
            }
            ToReplay::Finish(capacity, reply) => {
                if !failed.load(Ordering::Relaxed) {
                    verify.end(None);
                    what_if.feed(&waiting, &verify.outcome().empty_cache_at);
                    waiting.clear();
                    held.extend(what_if.take_events().into_iter().map(Event::Alloc));
                    let _ = reply.send(Replayed {
                        past: capacity.and_then(|c| what_if.first_past(c)),
                        empty_cache_at: verify.outcome().empty_cache_at.clone(),
                    });
                }
            }
            ToReplay::Verdict(keep) => {
                if keep != Keep::Nothing && !failed.load(Ordering::Relaxed) {
                    send_events(out, &mut held, keep.limit(), true, &mut sent);
                }
                return sent;
            }
        }
    }
    sent
}
