//! Replay a recorded trace through our allocator and compare, entry by entry,
//! with what PyTorch did (issue: replay and verify).
//!
//! Segment addresses come from the trace (the [`ScriptedDevice`] hands them
//! over, and refuses where the trace shows the allocator had to release memory
//! first); every other decision is the allocator's. An `alloc` matches when our
//! allocator returns the recorded address; a segment event matches when our
//! allocator makes the same call (action, address, size) in the same place.

pub mod from_snapshot;
pub mod reconstruct;
pub mod replayed;
mod scripted;
pub mod whatif;

pub use scripted::{Expected, ScriptedDevice};

use crate::alloc::{Action, AllocConfig, BlockState, CachingAllocator, SegmentInfo, Tag};
use reconstruct::Reconstruction;

/// The tag of the request trace entry `i` made (never [`Tag::NONE`]): how
/// the views and exports find a replayed or mirrored block's frames.
pub fn entry_tag(i: usize) -> Tag {
    Tag(i as u64 + 1)
}

/// The trace entry behind a tag made by [`entry_tag`].
pub fn tag_entry(tag: Tag) -> Option<usize> {
    usize::try_from(tag.0).ok()?.checked_sub(1)
}

/// The parts of a trace entry a replay reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    /// A segment release whose stack shows `torch.cuda.empty_cache()`: an
    /// explicit call, not the release an OOM path makes before giving up
    /// (the two write the same entries otherwise).
    pub in_empty_cache: bool,
    /// Made before the program launched its first kernel: a request under
    /// `nn.Module._apply` (a module's `.to()`) before the first request
    /// that is not, or an engine request in its `Setup` phase. A what-if
    /// tells a simulated device that kernels started at the first request
    /// without it ([`whatif`]); entries read with no stack leave it false,
    /// so there kernels start at the first request.
    pub before_kernels: bool,
}

impl Entry {
    /// Whether a what-if tells its device, before this entry, that the
    /// program's kernels started (the first request not [`Entry::before_kernels`]).
    pub fn starts_kernels(&self) -> bool {
        matches!(self.action, Action::Alloc | Action::Oom) && !self.before_kernels
    }

    /// Trace entry `e` as the mirror reads it: it places what the trace
    /// recorded, so it need not tell an explicit `empty_cache()` from the
    /// release an OOM path makes. Its stack is not read: not
    /// [`Entry::before_kernels`].
    pub fn recorded(e: &crate::trace::snapshot::TraceEntry) -> Entry {
        Entry {
            action: e.action,
            addr: e.addr,
            size: e.size,
            stream: e.stream,
            in_empty_cache: false,
            before_kernels: false,
        }
    }
}

/// A block of the recorded final state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalBlock {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
}

/// A segment of the recorded final state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalSegment {
    pub address: u64,
    pub total_size: u64,
    pub stream: u64,
    pub is_expandable: bool,
    pub blocks: Vec<FinalBlock>,
}

/// What a replay of one device's trace found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplayOutcome {
    pub entries: usize,
    pub allocs: usize,
    pub alloc_addr_match: usize,
    pub segment_events: usize,
    pub segment_event_match: usize,
    pub ooms: usize,
    pub oom_match: usize,
    /// `None` when there was no recorded final state to compare with.
    pub final_state_match: Option<bool>,
    /// Index of the first entry replayed (0 for a closed trace).
    pub replayable_from: usize,
    /// The first differences, in words (at most a few dozen).
    pub differences: Vec<String>,
    /// Explicit `empty_cache()` calls the trace implies, by the index of the
    /// first entry they released.
    pub empty_cache_at: Vec<usize>,
    /// The state when reserved memory peaked in the replay (what the what-if
    /// table's recorded column shows).
    pub at_worst: AtWorst,
    /// Segments at the end of the replay.
    pub segments_end: usize,
}

/// The allocator when its reserved memory peaked.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AtWorst {
    pub reserved: u64,
    pub largest_free: u64,
    /// [`crate::alloc::fragmentation`] then.
    pub fragmentation: f64,
}

impl ReplayOutcome {
    pub fn all_matched(&self) -> bool {
        self.alloc_addr_match == self.allocs
            && self.segment_event_match == self.segment_events
            && self.oom_match == self.ooms
            && self.final_state_match != Some(false)
    }

    fn differ(&mut self, text: String) {
        if self.differences.len() < 40 {
            self.differences.push(text);
        }
    }
}

fn expected(e: &Entry) -> Option<Expected> {
    match e.action {
        action if action.is_segment() => Some(Expected {
            action,
            addr: e.addr,
            size: e.size,
        }),
        _ => None,
    }
}

fn is_release(e: &Expected) -> bool {
    matches!(e.action, Action::SegmentFree | Action::SegmentUnmap)
}

/// Replays one device's trace, closed (starting from an empty allocator).
pub struct Replayer {
    alloc: CachingAllocator<ScriptedDevice>,
    outcome: ReplayOutcome,
    /// Segment events recorded since the last request, with their entry index.
    group: Vec<(usize, Expected)>,
    deferred: Vec<u64>,
    /// Reused buffer for the segment calls our allocator made.
    ours: Vec<Expected>,
    /// Started from a reconstructed state: stale requested sizes of free
    /// blocks are unknowable, so the final comparison leaves them out.
    open: bool,
    /// Entries fed so far.
    seen: usize,
    /// A `free_requested` waiting for the next entry (its completion, or not).
    held: Option<(usize, Entry)>,
    /// Segment entries whose stack shows `empty_cache()`.
    in_empty_cache: rustc_hash::FxHashSet<usize>,
}

impl Replayer {
    pub fn new(config: AllocConfig, device_total: u64) -> Replayer {
        let mut alloc = CachingAllocator::new(ScriptedDevice::new(device_total), config);
        alloc.set_oom_process_info(false);
        Replayer {
            alloc,
            outcome: ReplayOutcome::default(),
            group: Vec::new(),
            deferred: Vec::new(),
            ours: Vec::new(),
            open: false,
            seen: 0,
            held: None,
            in_empty_cache: Default::default(),
        }
    }

    /// A replay that starts from memory held before the trace began.
    pub fn seeded(config: AllocConfig, device_total: u64, start: &Reconstruction) -> Replayer {
        let mut r = Replayer::new(config, device_total);
        r.open = !start.is_empty();
        for seg in &start.segments {
            let bytes: u64 = seg.blocks.iter().map(|b| b.size).sum();
            match r
                .alloc
                .adopt_segment(seg.addr, seg.pool, seg.stream, &seg.blocks)
            {
                Ok(()) => r.alloc.device_mut().adopt(bytes),
                Err(err) => r.outcome.differ(format!("start state: {err}")),
            }
        }
        for note in &start.notes {
            r.outcome.differ(format!("start state: {note}"));
        }
        r
    }

    /// The recorded run's memory-fraction limit in bytes (snapshots do not
    /// record it; `garbage_collection_threshold` acts only under one).
    pub fn with_allowed_memory(mut self, bytes: Option<u64>) -> Replayer {
        if let Some(b) = bytes {
            self.alloc.set_allowed_memory(b);
        }
        self
    }

    pub fn allocator(&self) -> &CachingAllocator<ScriptedDevice> {
        &self.alloc
    }

    /// Run every entry; compare the end state with `final_segments` if given.
    pub fn run(
        mut self,
        entries: &[Entry],
        final_segments: Option<&[FinalSegment]>,
    ) -> ReplayOutcome {
        self.replay(entries, final_segments);
        self.outcome
    }

    /// What the replay has found so far.
    pub fn outcome(&self) -> &ReplayOutcome {
        &self.outcome
    }

    /// What [`Replayer::replay`] found.
    pub fn into_outcome(self) -> ReplayOutcome {
        self.outcome
    }

    /// [`Replayer::run`], keeping the allocator for what it ends with
    /// (its `memory_stats()` against the recorded run's).
    pub fn replay(
        &mut self,
        entries: &[Entry],
        final_segments: Option<&[FinalSegment]>,
    ) -> &ReplayOutcome {
        self.feed(entries);
        self.end(final_segments)
    }

    /// The next entries of the trace (any number of calls, in order), then
    /// [`Replayer::end`]: a trace replayed as it is read.
    pub fn feed(&mut self, entries: &[Entry]) {
        for e in entries {
            self.push(*e);
        }
    }

    fn push(&mut self, e: Entry) {
        let i = self.seen;
        self.seen += 1;
        // A free asked for right before its completion is one free.
        if let Some((at, requested)) = self.held.take() {
            let completes_now = e.action == Action::FreeCompleted && e.addr == requested.addr;
            self.free(at, &requested, completes_now);
            if completes_now {
                self.note_worst();
                return;
            }
        }
        match e.action {
            a if a.is_segment() => {
                self.outcome.segment_events += 1;
                if e.in_empty_cache {
                    self.in_empty_cache.insert(i);
                }
                self.group.extend(expected(&e).map(|x| (i, x)));
            }
            Action::Alloc | Action::Oom => self.request(i, &e),
            Action::FreeRequested => {
                self.flush_as_empty_cache();
                self.held = Some((i, e));
            }
            Action::FreeCompleted => self.complete(i, &e),
            // `snapshot`, `annotate` and unknown actions: no allocator call.
            _ => {}
        }
        self.note_worst();
    }

    /// Every `empty_cache()` before this entry index is in
    /// [`ReplayOutcome::empty_cache_at`] for good: the entries fed since
    /// are releases not yet told apart from a request's.
    pub fn settled(&self) -> usize {
        self.group.first().map_or(self.seen, |(i, _)| *i)
    }

    /// After the last entry: compare the end state with `final_segments`
    /// if given.
    pub fn end(&mut self, final_segments: Option<&[FinalSegment]>) -> &ReplayOutcome {
        if let Some((at, requested)) = self.held.take() {
            self.free(at, &requested, false);
        }
        self.flush_as_empty_cache();
        self.outcome.segments_end = self.alloc.snapshot().len();
        self.outcome.entries = self.seen;
        if let Some(segments) = final_segments {
            let ours = self.alloc.snapshot();
            let matched = compare_final(&ours, segments, !self.open, &mut self.outcome);
            self.outcome.final_state_match = Some(matched);
        }
        &self.outcome
    }

    /// Keep the state at the most reserved so far (cheap unless it grew).
    fn note_worst(&mut self) {
        let reserved = self.alloc.stats().reserved_bytes();
        if reserved > self.outcome.at_worst.reserved {
            let active = self
                .alloc
                .stats()
                .get(crate::alloc::Family::ActiveBytes, crate::alloc::Level::All)
                .current as u64;
            let largest = self.alloc.largest_free_block();
            self.outcome.at_worst = AtWorst {
                reserved,
                largest_free: largest,
                fragmentation: crate::alloc::fragmentation(
                    largest,
                    reserved.saturating_sub(active),
                ),
            };
        }
    }

    fn request(&mut self, i: usize, e: &Entry) {
        let is_oom = e.action == Action::Oom;
        // Releases recorded before a request that the cache serves cannot come
        // from that request: they are an explicit empty_cache() call. So are
        // releases whose stack shows empty_cache(), even before an OOM.
        let explicit = self
            .group
            .first()
            .is_some_and(|(at, x)| is_release(x) && self.in_empty_cache.contains(at));
        if self.group.first().is_some_and(|(_, x)| is_release(x))
            && (explicit || self.alloc.would_reuse_cached(e.size, e.stream))
        {
            let releases = self.group.iter().take_while(|(_, x)| is_release(x)).count();
            let rest = self.group.split_off(releases);
            self.flush_as_empty_cache();
            self.group = rest;
        }
        let group = std::mem::take(&mut self.group);
        self.alloc
            .device_mut()
            .set_script(group.iter().map(|(_, x)| *x), is_oom);
        let result = self.alloc.malloc(e.size, e.stream, Tag(i as u64));
        self.check_segment_events(i, &group);
        if is_oom {
            self.outcome.ooms += 1;
            match result {
                Err(err) if err.oom().is_some() => self.outcome.oom_match += 1,
                Err(err) => self
                    .outcome
                    .differ(format!("entry {i}: oom expected, got error {err}")),
                Ok(addr) => {
                    self.outcome.differ(format!(
                        "entry {i}: oom expected, but malloc({}) succeeded at {addr:#x}",
                        e.size
                    ));
                    // Keep the state as PyTorch's: the request never got memory.
                    let _ = self.alloc.free(addr);
                    self.alloc.drain_events().for_each(drop);
                }
            }
            return;
        }
        self.outcome.allocs += 1;
        match result {
            Ok(addr) if addr == e.addr => self.outcome.alloc_addr_match += 1,
            Ok(addr) => {
                self.outcome.differ(format!(
                    "entry {i}: alloc of {} at {addr:#x}, trace has {:#x}",
                    e.size, e.addr
                ));
                // Track the block under the trace's address from here on is not
                // possible: later frees of e.addr will be reported as unknown.
            }
            Err(err) => self
                .outcome
                .differ(format!("entry {i}: alloc of {} failed: {err}", e.size)),
        }
    }

    fn free(&mut self, i: usize, e: &Entry, completes_now: bool) {
        let result = if completes_now {
            self.alloc.free(e.addr)
        } else {
            self.deferred.push(e.addr);
            self.alloc.free_deferred(e.addr)
        };
        if let Err(err) = result {
            self.outcome.differ(format!("entry {i}: {err}"));
        }
        self.alloc.drain_events().for_each(drop);
    }

    fn complete(&mut self, i: usize, e: &Entry) {
        // A deferred free of ours, or a block already pending when the trace began.
        if let Some(k) = self.deferred.iter().position(|&a| a == e.addr) {
            self.deferred.swap_remove(k);
        }
        match self.alloc.complete_deferred(e.addr) {
            Ok(()) => self.check_segment_events(i, &[]),
            Err(_) => self.outcome.differ(format!(
                "entry {i}: free_completed of {:#x} without free_requested",
                e.addr
            )),
        }
    }

    /// Releases not followed by a request: an explicit `empty_cache()`.
    fn flush_as_empty_cache(&mut self) {
        if self.group.is_empty() {
            return;
        }
        let group = std::mem::take(&mut self.group);
        self.outcome
            .empty_cache_at
            .push(group.first().map_or(0, |(i, _)| *i));
        self.alloc
            .device_mut()
            .set_script(group.iter().map(|(_, x)| *x), false);
        self.alloc.empty_cache();
        let at = group.first().map_or(0, |(i, _)| *i);
        self.check_segment_events(at, &group);
    }

    /// Compare the segment calls our allocator made with the recorded ones, in order.
    fn check_segment_events(&mut self, i: usize, group: &[(usize, Expected)]) {
        let mut ours = std::mem::take(&mut self.ours);
        ours.clear();
        ours.extend(
            self.alloc
                .drain_events()
                .filter(|ev| ev.action.is_segment())
                .map(|ev| Expected {
                    action: ev.action,
                    addr: ev.addr,
                    size: ev.size,
                }),
        );
        for (k, (at, want)) in group.iter().enumerate() {
            match ours.get(k) {
                Some(got) if got == want => self.outcome.segment_event_match += 1,
                got => {
                    let got = got.map_or("nothing".to_string(), |g| {
                        format!("{} {:#x} {}", g.action.name(), g.addr, g.size)
                    });
                    self.outcome.differ(format!(
                        "entry {at}: trace has {} {:#x} {}, we did {got}",
                        want.action.name(),
                        want.addr,
                        want.size
                    ));
                }
            }
        }
        for extra in ours.iter().skip(group.len()) {
            self.outcome.differ(format!(
                "entry {i}: we did {} {:#x} {} which the trace does not have",
                extra.action.name(),
                extra.addr,
                extra.size
            ));
        }
        self.ours = ours;
        let device = self.alloc.device_mut();
        device.clear_script();
        if !device.surprises.is_empty() {
            for s in std::mem::take(&mut device.surprises) {
                self.outcome.differ(format!("entry {i}: device: {s}"));
            }
        }
    }
}

/// Compare our end state with the recorded one; differences go to `outcome`.
fn compare_final(
    ours: &[SegmentInfo],
    theirs: &[FinalSegment],
    free_requested: bool,
    outcome: &mut ReplayOutcome,
) -> bool {
    let mut ok = ours.len() == theirs.len();
    if !ok {
        outcome.differ(format!(
            "final state: {} segments, the snapshot has {}",
            ours.len(),
            theirs.len()
        ));
    }
    for (o, t) in ours.iter().zip(theirs) {
        let same_blocks = o.blocks.len() == t.blocks.len()
            && o.blocks.iter().zip(&t.blocks).all(|(a, b)| {
                a.address == b.address
                    && a.size == b.size
                    && a.state == b.state
                    && (a.requested_size == b.requested_size
                        || (!free_requested && b.state == BlockState::Inactive))
            });
        if o.address != t.address
            || o.total_size != t.total_size
            || o.is_expandable != t.is_expandable
            || !same_blocks
        {
            ok = false;
            outcome.differ(format!(
                "final segment {:#x} ({} bytes, {} blocks) differs from the snapshot's {:#x} ({} bytes, {} blocks)",
                o.address,
                o.total_size,
                o.blocks.len(),
                t.address,
                t.total_size,
                t.blocks.len()
            ));
        }
    }
    ok
}
