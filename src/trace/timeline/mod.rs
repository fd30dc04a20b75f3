//! The event store the views read: every event, the memory curve per event,
//! min/max buckets for drawing any zoom level cheaply, markers to jump to, and
//! keyframes of the [`MemoryMap`] so any event index can be shown exactly by
//! restoring the nearest keyframe and replaying forward, and the figures "so
//! far" at any cursor (peaks, OOMs, gaps) as cheaply as a seek.

use super::allocated_curve::AllocatedCurve;
use super::event::{Event, Marker};
use super::event_store::EventStore;
use super::frozen_map::FrozenMap;
use super::memory_map::{MapError, MemoryMap};
use crate::alloc::Action;
use crate::trace::placing_map::PlaceOn;

/// A full map at least every this many events; a map of more than
/// `KEYFRAME_EVERY / 16` blocks and segments is kept every 16 events per
/// entry instead (a frozen copy is 40 bytes an entry: ≤ 2.5 bytes per
/// event), up to `MAX_KEYFRAME_GAP`: seeking replays at most that many
/// events (about 2.5 ms on this project's 2-core host; a map of thousands
/// of blocks then costs 4 to 6 bytes per event).
pub const KEYFRAME_EVERY: usize = 8192;
pub const MAX_KEYFRAME_GAP: usize = 24576;
/// Events per min/max bucket of the memory curve.
pub const BUCKET: usize = 256;

/// Whether the state before event `index` is kept as a keyframe, the last
/// one being before event `last`: the first event's always, then one per
/// 16 events per block or segment of `map`, between `KEYFRAME_EVERY` and
/// `MAX_KEYFRAME_GAP` events apart.
pub fn keyframe_due(last: Option<usize>, index: usize, map: &impl PlaceOn) -> bool {
    let gap = (16 * map.entries()).clamp(KEYFRAME_EVERY, MAX_KEYFRAME_GAP);
    last.is_none_or(|k| index >= k + gap)
}

/// The next events of a timeline, placed on the map where they were made
/// (a recorded trace's worker), with what placing them gave: the timeline
/// records them without applying the map a second time.
#[derive(Debug, Clone, Default)]
pub struct TimelinePart {
    pub events: Vec<Event>,
    /// The curve right after each event.
    pub samples: Vec<Sample>,
    /// What the map could not place, by event index in the whole timeline.
    pub gaps: Vec<(usize, MapError)>,
    /// The map before the event at each index, where a keyframe is due.
    pub keyframes: Vec<(usize, FrozenMap)>,
    /// The map after the last event, sent with the last part.
    pub head: Option<Box<MemoryMap>>,
}

impl TimelinePart {
    pub fn with_capacity(n: usize) -> TimelinePart {
        TimelinePart {
            events: Vec::with_capacity(n),
            samples: Vec::with_capacity(n),
            ..TimelinePart::default()
        }
    }

    pub fn clear(&mut self) {
        self.events.clear();
        self.samples.clear();
        self.gaps.clear();
        self.keyframes.clear();
        self.head = None;
    }
}

/// Allocated and reserved bytes right after an event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sample {
    pub allocated: u64,
    pub reserved: u64,
}

/// The range of the curve over a bucket of events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bucket {
    pub min_allocated: u64,
    pub max_allocated: u64,
    pub min_reserved: u64,
    pub max_reserved: u64,
}

impl Bucket {
    fn of(s: Sample) -> Bucket {
        Bucket {
            min_allocated: s.allocated,
            max_allocated: s.allocated,
            min_reserved: s.reserved,
            max_reserved: s.reserved,
        }
    }
    pub fn merge(self, o: Bucket) -> Bucket {
        Bucket {
            min_allocated: self.min_allocated.min(o.min_allocated),
            max_allocated: self.max_allocated.max(o.max_allocated),
            min_reserved: self.min_reserved.min(o.min_reserved),
            max_reserved: self.max_reserved.max(o.max_reserved),
        }
    }
}

/// The highest allocated and the highest reserved bytes over a stretch of
/// states, each its own maximum (they need not come from the same event).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peak {
    pub allocated: u64,
    pub reserved: u64,
}

impl Peak {
    fn merge(self, o: Peak) -> Peak {
        Peak {
            allocated: self.allocated.max(o.allocated),
            reserved: self.reserved.max(o.reserved),
        }
    }
}

/// Kinds of places worth jumping to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MarkKind {
    Iteration,
    Phase,
    Op,
    Oom,
    Narration,
    Error,
    Annotation,
}

#[derive(Debug, Clone, Default)]
pub struct Timeline {
    events: EventStore,
    /// The curve: allocated bytes after each event, and reserved bytes as
    /// the event index from which each value holds (it changes only with
    /// segments: 4 bytes per event instead of 16).
    allocated: AllocatedCurve,
    reserved: Vec<(usize, u64)>,
    buckets: Vec<Bucket>,
    keyframes: Vec<FrozenMap>,
    /// The event index each keyframe is the state before.
    keyframe_at: Vec<usize>,
    /// The running peak at each keyframe: `[k]` is the peak over the start
    /// state and the states after each of the first `k * KEYFRAME_EVERY`
    /// events (16 bytes per keyframe, not per event).
    keyframe_peaks: Vec<Peak>,
    marks: Vec<(usize, MarkKind)>,
    /// Event indices of each kind of mark, for jumps by binary search.
    by_kind: std::collections::HashMap<MarkKind, Vec<usize>>,
    head: MemoryMap,
    peak_allocated: u64,
    peak_reserved: u64,
    /// Entries the map could not place (open traces), by event index.
    gaps: Vec<(usize, MapError)>,
}

impl Timeline {
    pub fn new() -> Timeline {
        Timeline::default()
    }

    /// A timeline whose first state is `start` (an open trace's reconstructed state).
    pub fn starting_from(start: MemoryMap) -> Timeline {
        Timeline {
            peak_allocated: start.allocated,
            peak_reserved: start.reserved,
            head: start,
            ..Timeline::default()
        }
    }

    /// Add an event, applying it to the map.
    pub fn push(&mut self, event: Event) {
        let index = self.events.len();
        if keyframe_due(self.keyframe_at.last().copied(), index, &self.head) {
            self.keep_keyframe(index, FrozenMap::freeze(&self.head));
        }
        if let Event::Alloc(e) = &event {
            if let Err(err) = self.head.apply(e) {
                self.gaps.push((index, err));
            }
        }
        let sample = Sample {
            allocated: self.head.allocated,
            reserved: self.head.reserved,
        };
        self.record(event, sample);
    }

    /// Add events already placed on the map where they were made (the map
    /// is not applied again here). The part is left empty, its buffers kept
    /// for reuse.
    pub fn extend_part(&mut self, part: &mut TimelinePart) {
        let mut keyframes = part.keyframes.drain(..).peekable();
        for (event, sample) in part.events.drain(..).zip(part.samples.drain(..)) {
            let index = self.events.len();
            if let Some((_, map)) = keyframes.next_if(|(at, _)| *at == index) {
                self.keep_keyframe(index, map);
            } else if self.keyframe_at.is_empty() {
                // Seeking needs the state before the first event: with no
                // event yet, the head is the start state.
                self.keep_keyframe(index, FrozenMap::freeze(&self.head));
            }
            self.record(event, sample);
        }
        drop(keyframes);
        self.gaps.append(&mut part.gaps);
        if let Some(head) = part.head.take() {
            self.head = *head;
        }
    }

    fn keep_keyframe(&mut self, index: usize, map: FrozenMap) {
        self.keyframes.push(map);
        self.keyframe_peaks.push(self.peak());
        self.keyframe_at.push(index);
    }

    /// Everything but the map: marks, the curve, peaks, the event itself.
    fn record(&mut self, event: Event, sample: Sample) {
        let index = self.events.len();
        match &event {
            Event::Alloc(e) => {
                if e.action == Action::Oom {
                    self.mark(index, MarkKind::Oom);
                }
            }
            Event::Marker(m) => {
                let kind = match m {
                    Marker::IterationBegin(_) | Marker::IterationEnd(_) => {
                        Some(MarkKind::Iteration)
                    }
                    Marker::PhaseBegin(_) | Marker::PhaseEnd(_) => Some(MarkKind::Phase),
                    Marker::OpBegin { .. } => Some(MarkKind::Op),
                    Marker::Narration(_) => Some(MarkKind::Narration),
                    Marker::Error(_) => Some(MarkKind::Error),
                    Marker::Annotation { .. } => Some(MarkKind::Annotation),
                    Marker::OpEnd | Marker::EmptyCache | Marker::Step(_) => None,
                };
                if let Some(kind) = kind {
                    self.mark(index, kind);
                }
            }
        }
        self.peak_allocated = self.peak_allocated.max(sample.allocated);
        self.peak_reserved = self.peak_reserved.max(sample.reserved);
        if index.is_multiple_of(BUCKET) {
            self.buckets.push(Bucket::of(sample));
        } else if let Some(b) = self.buckets.last_mut() {
            *b = b.merge(Bucket::of(sample));
        }
        if self.reserved.last().map(|r| r.1) != Some(sample.reserved) {
            self.reserved.push((index, sample.reserved));
        }
        self.allocated.push(sample.allocated);
        self.events.push(event);
    }

    /// Keep the first `n` events, as if the others never came: the map,
    /// the curve, the marks and the peaks are those after event `n - 1`.
    pub fn truncate(&mut self, n: usize) {
        if n >= self.len() {
            return;
        }
        let peak = self.peak_until(n);
        self.head = self.state_at(n.checked_sub(1));
        self.peak_allocated = peak.allocated;
        self.peak_reserved = peak.reserved;
        self.events.truncate(n);
        self.allocated.truncate(n);
        self.reserved.retain(|(at, _)| *at < n);
        self.buckets.truncate(n.div_ceil(BUCKET));
        if !n.is_multiple_of(BUCKET) {
            let from = n / BUCKET * BUCKET;
            let last = self
                .samples_in(from, n)
                .map(Bucket::of)
                .reduce(Bucket::merge);
            if let (Some(b), Some(slot)) = (last, self.buckets.last_mut()) {
                *slot = b;
            }
        }
        let keep = self.keyframe_at.partition_point(|at| *at < n).max(1);
        self.keyframes.truncate(keep);
        self.keyframe_peaks.truncate(keep);
        self.keyframe_at.truncate(keep);
        self.marks.retain(|(at, _)| *at < n);
        for v in self.by_kind.values_mut() {
            v.retain(|at| *at < n);
        }
        self.gaps.retain(|(at, _)| *at < n);
    }

    pub fn extend(&mut self, events: impl IntoIterator<Item = Event>) {
        for e in events {
            self.push(e);
        }
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    pub fn events(&self) -> &EventStore {
        &self.events
    }

    /// Event `i`.
    pub fn event(&self, i: usize) -> Option<Event> {
        self.events.get(i)
    }

    /// The curve right after each event.
    pub fn samples(&self) -> impl Iterator<Item = Sample> + '_ {
        self.samples_in(0, self.allocated.len())
    }

    /// The curve right after event `i`.
    pub fn sample(&self, i: usize) -> Option<Sample> {
        self.samples_in(i, i + 1).next()
    }

    /// The curve after events `[from, to)`: one search for the reserved
    /// value at `from`, then a walk.
    fn samples_in(&self, from: usize, to: usize) -> impl Iterator<Item = Sample> + '_ {
        let to = to.min(self.allocated.len());
        let from = from.min(to);
        let mut step = self
            .reserved
            .partition_point(|(at, _)| *at <= from)
            .saturating_sub(1);
        (from..to).map(move |i| {
            while self.reserved.get(step + 1).is_some_and(|(at, _)| *at <= i) {
                step += 1;
            }
            Sample {
                allocated: self.allocated.get(i).unwrap_or(0),
                reserved: self.reserved.get(step).map_or(0, |r| r.1),
            }
        })
    }

    pub fn marks(&self) -> &[(usize, MarkKind)] {
        &self.marks
    }

    pub fn gaps(&self) -> &[(usize, MapError)] {
        &self.gaps
    }

    pub fn peak_allocated(&self) -> u64 {
        self.peak_allocated
    }

    pub fn peak_reserved(&self) -> u64 {
        self.peak_reserved
    }

    /// The peak of the whole timeline (the start state and every event).
    pub fn peak(&self) -> Peak {
        Peak {
            allocated: self.peak_allocated,
            reserved: self.peak_reserved,
        }
    }

    /// The peak so far at a cursor that has applied `pos` events: over the
    /// start state (0 bytes, or an open trace's reconstructed state) and the
    /// states after each of the first `pos` events. The keyframe's running
    /// peak plus at most `KEYFRAME_EVERY` samples, merged a bucket at a time.
    pub fn peak_until(&self, pos: usize) -> Peak {
        if pos >= self.allocated.len() {
            return self.peak();
        }
        let k = self.keyframe_before(pos);
        let before = self.keyframe_peaks[k];
        match self.range_summary(self.keyframe_at[k], pos) {
            Some(b) => before.merge(Peak {
                allocated: b.max_allocated,
                reserved: b.max_reserved,
            }),
            None => before,
        }
    }

    /// The last keyframe at or before event `index` (one exists: the first
    /// event made keyframe 0).
    fn keyframe_before(&self, index: usize) -> usize {
        self.keyframe_at
            .partition_point(|at| *at <= index)
            .saturating_sub(1)
    }

    /// OOM entries among the first `pos` events.
    pub fn ooms_until(&self, pos: usize) -> usize {
        self.by_kind
            .get(&MarkKind::Oom)
            .map_or(0, |v| v.partition_point(|i| *i < pos))
    }

    /// Entries the map could not place among the first `pos` events.
    pub fn gaps_until(&self, pos: usize) -> usize {
        self.gaps.partition_point(|(i, _)| *i < pos)
    }

    /// The map after the last event.
    pub fn head(&self) -> &MemoryMap {
        &self.head
    }

    /// The map right after event `index` (or the start state for `None`).
    pub fn state_at(&self, index: Option<usize>) -> MemoryMap {
        let Some(index) = index.map(|i| i.min(self.events.len().saturating_sub(1))) else {
            return self
                .keyframes
                .first()
                .map_or_else(|| self.head.clone(), FrozenMap::thaw);
        };
        if self.events.is_empty() {
            return self.head.clone();
        }
        let k = self.keyframe_before(index);
        let mut map = self.keyframes[k].thaw();
        for e in self.events.range(self.keyframe_at[k]..index + 1) {
            if let Event::Alloc(a) = e {
                let _ = map.apply(&a);
            }
        }
        map
    }

    /// Min/max of the curve over events `[from, to)`, using whole buckets
    /// where possible.
    pub fn range_summary(&self, from: usize, to: usize) -> Option<Bucket> {
        let to = to.min(self.allocated.len());
        if from >= to {
            return None;
        }
        let mut acc: Option<Bucket> = None;
        let mut add = |b: Bucket| acc = Some(acc.map_or(b, |a| a.merge(b)));
        // A partial bucket at each end, whole buckets between.
        let head_end = from.next_multiple_of(BUCKET).min(to);
        let tail_start = (to / BUCKET * BUCKET).max(head_end);
        self.samples_in(from, head_end)
            .for_each(|s| add(Bucket::of(s)));
        for b in head_end / BUCKET..tail_start / BUCKET {
            add(self.buckets[b]);
        }
        self.samples_in(tail_start, to)
            .for_each(|s| add(Bucket::of(s)));
        acc
    }

    fn mark(&mut self, index: usize, kind: MarkKind) {
        self.marks.push((index, kind));
        self.by_kind.entry(kind).or_default().push(index);
    }

    /// The next mark of `kind` strictly after `index`.
    pub fn next_mark(&self, index: usize, kind: MarkKind) -> Option<usize> {
        let marks = self.by_kind.get(&kind)?;
        marks.get(marks.partition_point(|i| *i <= index)).copied()
    }

    /// The last mark of `kind` strictly before `index`.
    pub fn prev_mark(&self, index: usize, kind: MarkKind) -> Option<usize> {
        let marks = self.by_kind.get(&kind)?;
        marks
            .partition_point(|i| *i < index)
            .checked_sub(1)
            .map(|k| marks[k])
    }

    /// Approximate heap bytes held, for the memory-per-event figure.
    pub fn heap_bytes(&self) -> usize {
        let map_bytes = |m: &MemoryMap| (m.blocks.len() + m.segments.len()) * 64;
        self.events.heap_bytes()
            + self.allocated.heap_bytes()
            + self.reserved.capacity() * std::mem::size_of::<(usize, u64)>()
            + self.buckets.capacity() * std::mem::size_of::<Bucket>()
            + self.keyframe_peaks.capacity() * std::mem::size_of::<Peak>()
            + self.keyframe_at.capacity() * std::mem::size_of::<usize>()
            + self.marks.capacity() * std::mem::size_of::<(usize, MarkKind)>()
            + self
                .by_kind
                .values()
                .map(|v| v.capacity() * std::mem::size_of::<usize>())
                .sum::<usize>()
            + self
                .keyframes
                .iter()
                .map(FrozenMap::heap_bytes)
                .sum::<usize>()
            + map_bytes(&self.head)
    }
}

#[cfg(test)]
mod tests;
