//! A snapshot's stacks, trace entries and times as the views ask for them
//! ([`TagInfo`]), resolved to text up front on the producer's thread.

use rustc_hash::FxHashMap;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use crate::alloc::Tag;
use crate::trace::replay::tag_entry;
use crate::trace::snapshot::{
    Action, FrameId, FrameTable, FramesId, Segment, Snapshot, TraceEntry,
};
use crate::trace::stack::{Stack, StackFrame};

use super::entry_times::EntryTimes;
use super::source::{BlockStack, EntryDetail, StackOrigin, TagDescription, TagInfo};

/// What the views ask of a snapshot's tags, resolved to text up front (the
/// snapshot's strings are not shareable across threads). Built before the
/// first entry from the final state ([`SnapshotTags::begin`]), then grown
/// as the entries are read ([`SnapshotTags::push`]).
pub(super) struct SnapshotTags {
    /// Every distinct non-empty stack of the trace and of the final blocks.
    /// By `FramesId` (the snapshot's stacks are numbered densely).
    stacks: Vec<Option<Arc<Stack>>>,
    /// Frames resolved so far, shared by the stacks that hold them.
    resolved: FxHashMap<FrameId, Arc<StackFrame>>,
    /// Per trace entry: its stack and its action.
    entry_frames: Vec<FramesId>,
    entry_actions: Vec<Action>,
    /// Per trace entry: µs since the epoch (absent where not recorded).
    entry_times: EntryTimes,
    first_time: Option<i64>,
    /// Final-state stacks, by address, of the live blocks the views show
    /// without a tag: allocated before the trace began and never freed in it
    /// (every live block of a file without a trace).
    untagged: FxHashMap<u64, FramesId>,
    /// For a mirrored trace (one event per allocator entry): the entries
    /// that make no event, ascending. `None` for a what-if replay, whose
    /// events are its allocator's own.
    skipped: Option<Vec<usize>>,
}

impl SnapshotTags {
    /// The tags of `device`'s trace in `snap`, all entries read.
    pub(super) fn new(snap: &Snapshot, device: usize, mirrored: bool) -> SnapshotTags {
        let trace = snap
            .device_traces
            .get(device)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let mut tags = SnapshotTags::begin(&snap.segments, device, mirrored, &snap.frames);
        tags.push(trace, &snap.frames);
        tags
    }

    /// Before the first entry: the final state's live blocks of `device`
    /// (`segments`, their stacks from `frames`); `mirrored`: the events
    /// will be the trace's own, one per allocator entry.
    pub(super) fn begin(
        segments: &[Segment],
        device: usize,
        mirrored: bool,
        frames: &FrameTable,
    ) -> SnapshotTags {
        let untagged: FxHashMap<u64, FramesId> = segments
            .iter()
            .filter(|s| s.device == device as i64)
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state.is_active())
            .map(|b| (b.address, b.frames))
            .collect();
        let mut tags = SnapshotTags {
            stacks: Vec::new(),
            resolved: FxHashMap::default(),
            entry_frames: Vec::new(),
            entry_actions: Vec::new(),
            entry_times: EntryTimes::default(),
            first_time: None,
            untagged,
            skipped: mirrored.then(Vec::new),
        };
        let ids: Vec<FramesId> = tags.untagged.values().copied().collect();
        for id in ids {
            tags.resolve(id, frames);
        }
        tags
    }

    /// The next entries of the trace; `frames` holds their stacks.
    pub(super) fn push(&mut self, entries: &[TraceEntry], frames: &FrameTable) {
        self.push_columns(entries);
        for e in entries {
            self.resolve(e.frames, frames);
        }
    }

    /// The next entries' stack ids, actions and times; their stacks must
    /// be resolved ([`SnapshotTags::resolve_stacks`]) before a view asks.
    pub(super) fn push_columns(&mut self, entries: &[TraceEntry]) {
        let first = self.entry_frames.len();
        self.entry_frames.reserve(entries.len());
        self.entry_actions.reserve(entries.len());
        for (j, e) in entries.iter().enumerate() {
            self.entry_frames.push(e.frames);
            self.entry_actions.push(e.action);
            let time = e.time_us();
            self.entry_times.push(time);
            if let Some(t) = time {
                self.first_time = Some(self.first_time.map_or(t, |f| f.min(t)));
            }
            // A block allocated in the trace carries that entry's tag; one
            // freed in it is not the block the final state holds there.
            if !self.untagged.is_empty()
                && matches!(
                    e.action,
                    Action::Alloc | Action::FreeRequested | Action::FreeCompleted
                )
            {
                self.untagged.remove(&e.addr);
            }
            if let Some(skipped) = &mut self.skipped {
                if !e.action.is_allocator() {
                    skipped.push(first + j);
                }
            }
        }
    }

    /// Resolve stacks `ids` (from `frames`) to text, those not yet resolved.
    pub(super) fn resolve_stacks(&mut self, ids: &[FramesId], frames: &FrameTable) {
        for id in ids {
            self.resolve(*id, frames);
        }
    }

    /// Resolve stack `id` to text, once.
    fn resolve(&mut self, id: FramesId, frames: &FrameTable) {
        let k = id.0 as usize;
        if id == FramesId::EMPTY || self.stacks.get(k).is_some_and(Option::is_some) {
            return;
        }
        if self.stacks.len() <= k {
            self.stacks.resize(k + 1, None);
        }
        let resolved = &mut self.resolved;
        let stack = frames
            .stack(id)
            .iter()
            .filter_map(|f| {
                let frame = frames.frame(*f)?;
                Some(
                    resolved
                        .entry(*f)
                        .or_insert_with(|| Arc::new(StackFrame::from_frame(frame)))
                        .clone(),
                )
            })
            .collect();
        self.stacks[k] = Some(Arc::new(Stack::new(stack)));
    }

    fn traced(&self) -> bool {
        !self.entry_frames.is_empty()
    }

    fn time(&self, entry: usize) -> Option<i64> {
        self.entry_times.get(entry)
    }

    fn entry_stack(&self, entry: usize) -> Option<Arc<Stack>> {
        self.stack_of(*self.entry_frames.get(entry)?)
    }

    fn stack_of(&self, id: FramesId) -> Option<Arc<Stack>> {
        self.stacks.get(id.0 as usize)?.clone()
    }
}

/// [`SnapshotTags`] that grow while a file is read: the views read them
/// (many times a frame, each briefly) while the reader adds each batch.
pub(super) struct GrowingTags(RwLock<SnapshotTags>);

impl GrowingTags {
    pub(super) fn new(tags: SnapshotTags) -> GrowingTags {
        GrowingTags(RwLock::new(tags))
    }

    /// Add to the tags; a reader that panicked left them whole (each push
    /// happens under the lock), so a poisoned lock is used as it is.
    pub(super) fn grow(&self, f: impl FnOnce(&mut SnapshotTags)) {
        let mut tags = self.0.write().unwrap_or_else(PoisonError::into_inner);
        f(&mut tags);
    }

    fn read(&self) -> RwLockReadGuard<'_, SnapshotTags> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }
}

impl TagInfo for GrowingTags {
    fn describe(&self, tag: Tag) -> Option<TagDescription> {
        self.read().describe(tag)
    }

    fn stack(&self, tag: Tag, addr: u64) -> Option<BlockStack> {
        self.read().stack(tag, addr)
    }

    fn event_entry(&self, index: usize) -> Option<EntryDetail> {
        self.read().event_entry(index)
    }

    fn entry_time(&self, entry: usize) -> Option<i64> {
        self.read().entry_time(entry)
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
                    origin: if self.traced() {
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
