//! A live job's stacks, entries and times as the views ask for them
//! ([`TagInfo`]). The table grows while the job runs: the producer appends
//! after each batch, the UI reads under a lock held for one lookup.

use std::sync::{Arc, RwLock};

use rustc_hash::FxHashMap;

use super::source::{BlockStack, EntryDetail, StackOrigin, TagDescription, TagInfo};
use crate::alloc::{Action, Tag};
use crate::trace::replay::tag_entry;
use crate::trace::snapshot::{FramesId, Snapshot, TraceEntry};
use crate::trace::stack::{Stack, StackFrame};

#[derive(Default)]
struct Table {
    /// Resolved stacks by `FramesId`.
    stacks: Vec<Option<Arc<Stack>>>,
    entry_frames: Vec<FramesId>,
    entry_actions: Vec<Action>,
    entry_times: Vec<Option<i64>>,
    first_time: Option<i64>,
    /// Event index → entry index (entries that make no event are skipped).
    event_entries: Vec<u32>,
    /// Blocks of the start state, by address, with their recorded stack.
    untagged: FxHashMap<u64, FramesId>,
}

/// The shown device's tags since the view last started over.
#[derive(Default)]
pub(super) struct JobTags {
    table: RwLock<Table>,
}

impl JobTags {
    /// Forget every entry: the view starts over from a state whose blocks
    /// carry `untagged`'s stacks.
    pub(super) fn restart(&self, snap: &Snapshot, untagged: FxHashMap<u64, FramesId>) {
        let Ok(mut t) = self.table.write() else {
            return;
        };
        let stacks = std::mem::take(&mut t.stacks);
        *t = Table {
            stacks,
            untagged,
            ..Table::default()
        };
        let ids: Vec<FramesId> = t.untagged.values().copied().collect();
        for id in ids {
            resolve(&mut t.stacks, snap, id);
        }
    }

    /// Entries appended to the shown device's trace.
    pub(super) fn extend(&self, snap: &Snapshot, entries: &[TraceEntry]) {
        let Ok(mut t) = self.table.write() else {
            return;
        };
        for e in entries {
            resolve(&mut t.stacks, snap, e.frames);
            let i = t.entry_frames.len();
            if e.action.is_allocator() {
                t.event_entries.push(i as u32);
            }
            t.entry_frames.push(e.frames);
            t.entry_actions.push(e.action);
            t.entry_times.push(e.time_us());
            if t.first_time.is_none() {
                t.first_time = e.time_us();
            }
        }
    }
}

impl JobTags {
    /// `n` marker events (step boundaries) placed in the timeline: they
    /// come from no entry.
    pub(super) fn markers(&self, n: usize) {
        if let Ok(mut t) = self.table.write() {
            t.event_entries.extend(std::iter::repeat_n(NOT_AN_ENTRY, n));
        }
    }
}

/// An event index that names no entry (`entry_actions` is never this long).
const NOT_AN_ENTRY: u32 = u32::MAX;

fn resolve(stacks: &mut Vec<Option<Arc<Stack>>>, snap: &Snapshot, id: FramesId) {
    let k = id.0 as usize;
    if id == FramesId::EMPTY || stacks.get(k).is_some_and(Option::is_some) {
        return;
    }
    if stacks.len() <= k {
        stacks.resize(k + 1, None);
    }
    let frames = snap
        .frames
        .resolve(id)
        .map(|f| Arc::new(StackFrame::from_frame(f)))
        .collect();
    stacks[k] = Some(Arc::new(Stack::new(frames)));
}

impl Table {
    fn stack_of(&self, id: FramesId) -> Option<Arc<Stack>> {
        self.stacks.get(id.0 as usize)?.clone()
    }

    fn entry_stack(&self, entry: usize) -> Option<Arc<Stack>> {
        self.stack_of(*self.entry_frames.get(entry)?)
    }
}

impl TagInfo for JobTags {
    fn describe(&self, tag: Tag) -> Option<TagDescription> {
        let t = self.table.read().ok()?;
        let entry = tag_entry(tag)?;
        t.entry_frames.get(entry)?;
        let stack = t.entry_stack(entry);
        Some(TagDescription::of_stack(stack.as_deref()))
    }

    fn stack(&self, tag: Tag, addr: u64) -> Option<BlockStack> {
        let t = self.table.read().ok()?;
        if tag == Tag::NONE {
            return Some(BlockStack {
                stack: t.untagged.get(&addr).and_then(|id| t.stack_of(*id)),
                origin: StackOrigin::FinalState,
            });
        }
        let entry = tag_entry(tag).filter(|e| *e < t.entry_frames.len())?;
        Some(BlockStack {
            stack: t.entry_stack(entry),
            origin: StackOrigin::Entry(entry),
        })
    }

    fn event_entry(&self, index: usize) -> Option<EntryDetail> {
        let t = self.table.read().ok()?;
        let entry = *t.event_entries.get(index)? as usize;
        Some(EntryDetail {
            entry,
            action: *t.entry_actions.get(entry)?,
            time_us: t.entry_times.get(entry).copied().flatten(),
            first_time_us: t.first_time,
            stack: t.entry_stack(entry),
        })
    }

    fn entry_time(&self, entry: usize) -> Option<i64> {
        self.table
            .read()
            .ok()?
            .entry_times
            .get(entry)
            .copied()
            .flatten()
    }
}
