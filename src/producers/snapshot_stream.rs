//! A file view that reads its snapshot once, from the first byte to the
//! first frame: the trace's entries are placed on the map (on a thread of
//! their own) while the file is still being decoded, and everything the
//! view needs beside the events (stacks, times, the start state, the device
//! size, OOMs) is gathered from the same entries as they pass.
//!
//! PyTorch writes a snapshot's trace before its allocator settings, and a
//! trace's start state (for a trace that began while memory was in use)
//! is known only from its last entry. So the entries are placed as if the
//! trace began with nothing reserved and under the default block rules,
//! and the view says so until the file is read. Then it is checked: the
//! start rebuilt from every entry is empty, the recorded settings round and
//! split blocks as the default does, the view's device is the one the
//! entries came from, and no entry fell outside the map. If all hold, the
//! events are the ones the whole file gives (the tests compare the two);
//! if one fails, the view starts over on the rebuilt start, reading the
//! file a second time. A trace whose first entries already show memory in
//! use (a ring buffer that wrapped, the usual open trace) fails within the
//! first [`PROBATION`] entries, before anything was shown.

use std::path::Path;
use std::sync::Arc;

use crate::alloc::constants::LARGE_BUFFER;
use crate::alloc::{Action, AllocConfig};
use crate::trace::mirror::start_map;
use crate::trace::replay::from_snapshot::{self, infer_device_total};
use crate::trace::replay::reconstruct::StartTracker;
use crate::trace::replay::Entry;
use crate::trace::snapshot::{import_file_tapped, Segment, Snapshot, Tables, TraceEntry, TraceTap};
use crate::trace::MemoryMap;

use super::devices::{devices_with_oom, snapshot_devices, SnapshotDevices};
use super::snapshot::{pick_device, Out, Spent};
use super::snapshot_tags::{GrowingTags, SnapshotTags};
use super::source::{Opened, RecordedMsg, RunMsg, SourceMsg, TagInfo};
use super::tapped_read::{read_through, whole_again, GiveUp, Reading, StatefulTap};

mod placing;
mod tracking;

use placing::{spares_for, Batch, Finish, Mirror};
use tracking::Tracking;

/// Entries placed before a view placed as if its trace began empty shows
/// any: an open trace almost always shows it within these (an entry that
/// frees or fills memory the map does not have), and is then placed again
/// before anything was drawn. About 10 MB of a file.
pub(super) const PROBATION: usize = 1 << 16;

/// Batches of entries the decoder may run ahead of the placing.
const AHEAD: usize = 64;

/// How reading a file in one pass ended.
pub(super) enum Streamed {
    /// The view is complete (true) or the UI has gone (false).
    Done(bool),
    /// The file could not be read in a pass (the decoder had to read it
    /// whole, or the view is of another device than the entries read):
    /// plan the view from the whole snapshot. Nothing was shown yet.
    Whole(Box<Snapshot>),
}

/// Read `path` (`file_bytes` long) for the view of `device` (the first the
/// file holds when `None`), placing the trace's entries as they are decoded.
pub(super) fn stream_file(
    path: &Path,
    file_bytes: u64,
    device: Option<usize>,
    out: &Out,
    spent: &Spent,
) -> Streamed {
    let spares = spares_for(file_bytes);
    let mut tap = ViewTap {
        want: device,
        path,
        out,
        spent,
        spares,
        state: None,
    };
    let (snap, state, tapped_device, count) = match read_through(path, out, &mut tap) {
        Reading::Tapped {
            snap,
            state,
            device,
            count,
        } => (snap, state, device, count),
        Reading::Over(streamed) => return streamed,
    };
    let picked = match pick_device(&snap, device) {
        Ok(d) => d,
        Err(e) => {
            if state.give_up() {
                out.send(SourceMsg::Run(RunMsg::Restarted));
            }
            out.send(SourceMsg::Run(RunMsg::Failed(format!(
                "{}: {e}",
                path.display()
            ))));
            return Streamed::Done(false);
        }
    };
    if picked != tapped_device {
        if state.give_up() {
            out.send(SourceMsg::Run(RunMsg::Restarted));
        }
        return whole_again(path, out);
    }
    let config = from_snapshot::config(&snap);
    let finals = from_snapshot::final_segments(&snap, tapped_device);
    let Tapping {
        tags, ooms, mirror, ..
    } = state;
    let Some(facts) = mirror.settle() else {
        mirror.discard();
        out.send(SourceMsg::Run(RunMsg::Failed(format!(
            "{}: the thread that places the events stopped",
            path.display()
        ))));
        return Streamed::Done(false);
    };
    let mut devices = snapshot_devices(&snap);
    devices.push(tapped_device);
    devices.sort_unstable();
    devices.dedup();
    let opened = Opened {
        tags: Some(tags as Arc<dyn TagInfo>),
        capacity: infer_device_total(facts.maps.iter().copied(), LARGE_BUFFER),
        devices: SnapshotDevices {
            path: Some(path.to_path_buf()),
            devices,
            current: tapped_device,
            with_oom: with_oom(&snap, tapped_device, !ooms.is_empty()),
            under: None,
        },
        events: Some(facts.events),
        since_step: false,
        assumed_empty_start: false,
    };
    let had_oom = !ooms.is_empty();
    let may_stand =
        config.same_block_rules(&AllocConfig::default()) && facts.start.starts_empty(&finals);
    let (shown, misfit) = if may_stand {
        match mirror.finish() {
            Finish::Sent => {
                drop(snap);
                return Streamed::Done(
                    out.send(SourceMsg::Recorded(RecordedMsg::Opened(Box::new(opened))))
                        && (!had_oom || answer_oom(path, tapped_device, out)),
                );
            }
            Finish::Gone => return Streamed::Done(false),
            Finish::Failed { shown } => (shown, true),
        }
    } else {
        mirror.check()
    };
    // Placed from the wrong start or under other rules: again, from the
    // start the entries rebuilt, under the recorded settings.
    if shown {
        out.send(SourceMsg::Run(RunMsg::Restarted));
    }
    let start_known = facts.start_known(misfit);
    let start = if start_known {
        facts.start.finish(&finals, &config)
    } else {
        // A misfit past the first entries, which were let go: the start
        // needs every address, from a reading of its own.
        let mut every = EveryAddress {
            device: tapped_device,
            start: StartTracker::new(),
        };
        match import_file_tapped(path, &mut |_| {}, Some(&mut every)) {
            Ok(Some(_)) => every.start.finish(&finals, &config),
            Ok(None) => return Streamed::Done(false),
            Err(e) => {
                out.send(SourceMsg::Run(RunMsg::Failed(e.to_string())));
                return Streamed::Done(false);
            }
        }
    };
    let start = start_map(&start);
    drop(snap);
    if !out.send(SourceMsg::Recorded(RecordedMsg::Opened(Box::new(opened)))) {
        return Streamed::Done(false);
    }
    if !start.segments.is_empty()
        && !out.send(SourceMsg::Run(RunMsg::Start(Box::new(start.clone()))))
    {
        return Streamed::Done(false);
    }
    let mirror = Mirror::spawn(start, config, ooms, 0, spares, None, out, spent);
    let mut again = PlaceOnly {
        device: tapped_device,
        mirror: &mirror,
        count: 0,
    };
    match import_file_tapped(path, &mut |_| {}, Some(&mut again)) {
        Ok(Some(t)) if t.tapped == Some((tapped_device, count)) => Streamed::Done(
            matches!(mirror.finish(), Finish::Sent)
                && (!had_oom || answer_oom(path, tapped_device, out)),
        ),
        Ok(None) => {
            mirror.discard();
            Streamed::Done(false)
        }
        Ok(Some(_)) => {
            mirror.discard();
            out.send(SourceMsg::Run(RunMsg::Restarted));
            out.send(SourceMsg::Run(RunMsg::Failed(format!(
                "{}: the file changed while it was read",
                path.display()
            ))));
            Streamed::Done(false)
        }
        Err(e) => {
            mirror.discard();
            out.send(SourceMsg::Run(RunMsg::Restarted));
            out.send(SourceMsg::Run(RunMsg::Failed(e.to_string())));
            Streamed::Done(false)
        }
    }
}

/// The devices whose trace records an OOM: the tapped one's entries are
/// not in `snap`, `tapped_oom` says for it.
pub(super) fn with_oom(snap: &Snapshot, tapped: usize, tapped_oom: bool) -> Vec<usize> {
    let mut v: Vec<usize> = devices_with_oom(snap)
        .into_iter()
        .filter(|d| *d != tapped)
        .collect();
    if tapped_oom {
        v.push(tapped);
        v.sort_unstable();
    }
    v
}

/// The view's side of the decoder: takes the view's trace, and sends its
/// entries to the placing thread as they come.
struct ViewTap<'a> {
    want: Option<usize>,
    path: &'a Path,
    out: &'a Out,
    spent: &'a Spent,
    /// Parts its placer keeps to be filled again.
    spares: usize,
    state: Option<Tapping>,
}

/// A trace being tapped.
struct Tapping {
    tags: Arc<GrowingTags>,
    /// The stacks resolved in `tags`, by `FramesId`.
    resolved: Vec<bool>,
    /// `device_free` of the `oom` entries, by entry index.
    ooms: Vec<(usize, u64)>,
    mirror: Mirror,
}

impl GiveUp for Tapping {
    fn give_up(self) -> bool {
        self.mirror.discard()
    }
}

impl StatefulTap for ViewTap<'_> {
    type State = Tapping;
    fn take_state(&mut self) -> Option<Tapping> {
        self.state.take()
    }
}

impl TraceTap for ViewTap<'_> {
    fn begin(&mut self, device: usize, segments: Option<&[Segment]>, tables: Tables<'_>) -> bool {
        let Some((segments, devices)) = taken(self.want, device, segments) else {
            return false;
        };
        let tags = Arc::new(GrowingTags::new(SnapshotTags::begin(
            segments,
            device,
            true,
            tables.frames,
        )));
        let opened = Opened {
            tags: Some(tags.clone() as Arc<dyn TagInfo>),
            capacity: None,
            devices: SnapshotDevices {
                path: Some(self.path.to_path_buf()),
                devices,
                current: device,
                with_oom: Vec::new(),
                under: None,
            },
            events: None,
            since_step: false,
            assumed_empty_start: true,
        };
        self.out
            .send(SourceMsg::Recorded(RecordedMsg::Opened(Box::new(opened))));
        let tracking = Tracking::new(
            &from_snapshot::final_segments_in(segments, device),
            tags.clone(),
        );
        self.state = Some(Tapping {
            tags,
            resolved: Vec::new(),
            ooms: Vec::new(),
            mirror: Mirror::spawn(
                MemoryMap::default(),
                AllocConfig::default(),
                Vec::new(),
                PROBATION,
                self.spares,
                Some(tracking),
                self.out,
                self.spent,
            ),
        });
        true
    }

    fn entries(&mut self, first: usize, entries: &[TraceEntry], tables: Tables<'_>) -> bool {
        let Some(s) = &mut self.state else {
            return true;
        };
        // Only what needs the decoder's tables is done here: the placing
        // thread takes the rest (see `Tracking`).
        let mut new_stacks = Vec::new();
        let ooms_before = s.ooms.len();
        for (j, e) in entries.iter().enumerate() {
            let k = e.frames.0 as usize;
            if !s.resolved.get(k).copied().unwrap_or(false) {
                if s.resolved.len() <= k {
                    s.resolved.resize(k + 1, false);
                }
                s.resolved[k] = true;
                new_stacks.push(e.frames);
            }
            if e.action == Action::Oom {
                let free = tables.extras.get(e.extra()).device_free.unwrap_or(0);
                s.ooms.push((first + j, free));
            }
        }
        if !new_stacks.is_empty() {
            s.tags
                .grow(|t| t.resolve_stacks(&new_stacks, tables.frames));
        }
        s.mirror.place(Batch {
            first,
            entries: entries.to_vec(),
            ooms: s.ooms[ooms_before..].to_vec(),
        });
        !self.out.is_gone()
    }
}

/// A reading for the start alone, every address recorded.
struct EveryAddress {
    device: usize,
    start: StartTracker,
}

impl TraceTap for EveryAddress {
    fn begin(&mut self, device: usize, _: Option<&[Segment]>, _: Tables<'_>) -> bool {
        device == self.device
    }

    fn entries(&mut self, _: usize, entries: &[TraceEntry], _: Tables<'_>) -> bool {
        entries
            .iter()
            .for_each(|e| self.start.push(&Entry::recorded(e)));
        true
    }
}

/// The second reading of a file whose first placing failed: only the
/// entries, to the placing thread.
struct PlaceOnly<'a> {
    device: usize,
    mirror: &'a Mirror,
    count: usize,
}

impl TraceTap for PlaceOnly<'_> {
    fn begin(&mut self, device: usize, _: Option<&[Segment]>, _: Tables<'_>) -> bool {
        device == self.device
    }

    fn entries(&mut self, first: usize, entries: &[TraceEntry], _: Tables<'_>) -> bool {
        self.count = first + entries.len();
        self.mirror.place(Batch {
            first,
            entries: entries.to_vec(),
            // The placing thread was given every OOM's free memory up front.
            ooms: Vec::new(),
        })
    }
}

/// Once the view's events are sent: the answer at the device's OOM, from
/// the file read once more (the one-pass view kept none of its entries).
/// False when the UI has gone.
fn answer_oom(path: &Path, device: usize, out: &Out) -> bool {
    let Ok(snap) = crate::trace::snapshot::import_file(path) else {
        // The file changed since: the view stands, without an answer.
        return true;
    };
    match super::snapshot::oom_answer(&snap, device) {
        Some(a) => out.send(SourceMsg::Recorded(RecordedMsg::OomAnswer(a))),
        None => true,
    }
}

/// Whether a view of `want` (None: the file's first device) taps the trace
/// of `device`, and then the final state's segments and every device the
/// file holds. Only a file that holds its final state first (as PyTorch
/// writes it): the stacks of blocks older than the trace come from it.
pub(super) fn taken(
    want: Option<usize>,
    device: usize,
    segments: Option<&[Segment]>,
) -> Option<(&[Segment], Vec<usize>)> {
    let segments = segments?;
    // The view's device: the one asked for, else the first the file holds
    // (the lowest of the traced and the final state's devices).
    let take = match want {
        Some(d) => d == device,
        None => segments
            .iter()
            .all(|s| usize::try_from(s.device).is_ok_and(|d| d >= device)),
    };
    if !take {
        return None;
    }
    let mut devices: Vec<usize> = segments
        .iter()
        .filter_map(|s| usize::try_from(s.device).ok())
        .chain([device])
        .collect();
    devices.sort_unstable();
    devices.dedup();
    Some((segments, devices))
}
