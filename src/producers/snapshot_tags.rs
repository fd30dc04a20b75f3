//! A snapshot's stacks, trace entries and times as the views ask for them
//! ([`TagInfo`]), resolved to text up front on the producer's thread.

use std::collections::HashMap;

use rustc_hash::FxHashMap;
use std::sync::Arc;

use crate::alloc::Tag;
use crate::trace::replay::tag_entry;
use crate::trace::snapshot::{Action, FramesId, Snapshot};
use crate::trace::stack::{Stack, StackFrame};

use super::entry_times::EntryTimes;
use super::source::{BlockStack, EntryDetail, StackOrigin, TagDescription, TagInfo};

/// What the views ask of a snapshot's tags, resolved to text up front (the
/// snapshot's strings are not shareable across threads).
pub(super) struct SnapshotTags {
    /// Every distinct non-empty stack of the trace and of the final blocks.
    /// By `FramesId` (the snapshot's stacks are numbered densely).
    stacks: Vec<Option<Arc<Stack>>>,
    /// Per trace entry: its stack and its action.
    entry_frames: Vec<FramesId>,
    entry_actions: Vec<Action>,
    /// Per trace entry: µs since the epoch; `None` when no entry records a
    /// time.
    entry_times: Option<EntryTimes>,
    first_time: Option<i64>,
    /// Final-state stacks, by address, of the live blocks the views show
    /// without a tag: allocated before the trace began and never freed in it
    /// (every live block of a file without a trace).
    untagged: FxHashMap<u64, FramesId>,
    /// The trace has entries: an untagged block missing from `untagged` was
    /// freed within it.
    traced: bool,
    /// For a mirrored trace (one event per allocator entry): the entries
    /// that make no event, ascending. `None` for a what-if replay, whose
    /// events are its allocator's own.
    skipped: Option<Vec<usize>>,
}

impl SnapshotTags {
    pub(super) fn new(snap: &Snapshot, device: usize, mirrored: bool) -> SnapshotTags {
        let trace = snap
            .device_traces
            .get(device)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let entry_frames: Vec<FramesId> = trace.iter().map(|e| e.frames).collect();
        let entry_actions = trace.iter().map(|e| e.action).collect();
        let first_time = trace.iter().filter_map(|e| e.time_us()).min();
        let entry_times = first_time.map(|_| EntryTimes::new(trace.iter().map(|e| e.time_us())));
        let mut untagged: FxHashMap<u64, FramesId> = snap
            .segments
            .iter()
            .filter(|s| s.device == device as i64)
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state.is_active())
            .map(|b| (b.address, b.frames))
            .collect();
        for e in trace {
            if untagged.is_empty() {
                break;
            }
            // A block allocated in the trace carries that entry's tag; one
            // freed in it is not the block the final state holds there.
            if matches!(
                e.action,
                Action::Alloc | Action::FreeRequested | Action::FreeCompleted
            ) {
                untagged.remove(&e.addr);
            }
        }
        let mut resolved = HashMap::new();
        let mut stacks: Vec<Option<Arc<Stack>>> = Vec::new();
        for id in entry_frames.iter().chain(untagged.values()) {
            let k = id.0 as usize;
            if *id == FramesId::EMPTY || stacks.get(k).is_some_and(Option::is_some) {
                continue;
            }
            if stacks.len() <= k {
                stacks.resize(k + 1, None);
            }
            let frames = snap
                .frames
                .stack(*id)
                .iter()
                .filter_map(|f| {
                    let frame = snap.frames.frame(*f)?;
                    Some(
                        resolved
                            .entry(*f)
                            .or_insert_with(|| Arc::new(StackFrame::from_frame(frame)))
                            .clone(),
                    )
                })
                .collect();
            stacks[k] = Some(Arc::new(Stack::new(frames)));
        }
        let skipped = mirrored.then(|| {
            trace
                .iter()
                .enumerate()
                .filter(|(_, e)| !e.action.is_allocator())
                .map(|(i, _)| i)
                .collect()
        });
        SnapshotTags {
            stacks,
            entry_frames,
            entry_actions,
            entry_times,
            first_time,
            untagged,
            traced: !trace.is_empty(),
            skipped,
        }
    }

    fn time(&self, entry: usize) -> Option<i64> {
        self.entry_times.as_ref()?.get(entry)
    }

    fn entry_stack(&self, entry: usize) -> Option<Arc<Stack>> {
        self.stack_of(*self.entry_frames.get(entry)?)
    }

    fn stack_of(&self, id: FramesId) -> Option<Arc<Stack>> {
        self.stacks.get(id.0 as usize)?.clone()
    }
}

impl TagInfo for SnapshotTags {
    fn describe(&self, tag: Tag) -> Option<TagDescription> {
        let entry = tag_entry(tag)?;
        self.entry_frames.get(entry)?;
        let stack = self.entry_stack(entry);
        Some(TagDescription::of_stack(stack.as_deref()))
    }

    fn stack(&self, tag: Tag, addr: u64) -> Option<BlockStack> {
        if tag == Tag::NONE {
            return Some(match self.untagged.get(&addr) {
                Some(id) => BlockStack {
                    stack: self.stack_of(*id),
                    origin: StackOrigin::FinalState,
                },
                None => BlockStack {
                    stack: None,
                    origin: if self.traced {
                        StackOrigin::BeforeTrace
                    } else {
                        StackOrigin::FinalState
                    },
                },
            });
        }
        let entry = tag_entry(tag).filter(|e| *e < self.entry_frames.len())?;
        Some(BlockStack {
            stack: self.entry_stack(entry),
            origin: StackOrigin::Entry(entry),
        })
    }

    fn event_entry(&self, index: usize) -> Option<EntryDetail> {
        let mut entry = index;
        for s in self.skipped.as_ref()? {
            if *s > entry {
                break;
            }
            entry += 1;
        }
        Some(EntryDetail {
            entry,
            action: *self.entry_actions.get(entry)?,
            time_us: self.time(entry),
            first_time_us: self.first_time,
            stack: self.entry_stack(entry),
        })
    }

    fn entry_time(&self, entry: usize) -> Option<i64> {
        self.time(entry)
    }
}
