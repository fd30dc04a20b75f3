//! The event store the views read: every event, the memory curve per event,
//! min/max buckets for drawing any zoom level cheaply, markers to jump to, and
//! keyframes of the [`MemoryMap`] so any event index can be shown exactly by
//! restoring the nearest keyframe and replaying forward.

use super::event::{Event, Marker};
use super::memory_map::{MapError, MemoryMap};
use crate::alloc::Action;

/// A full map every this many events: seeking replays at most this many.
pub const KEYFRAME_EVERY: usize = 8192;
/// Events per min/max bucket of the memory curve.
pub const BUCKET: usize = 256;

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
    events: Vec<Event>,
    samples: Vec<Sample>,
    buckets: Vec<Bucket>,
    keyframes: Vec<MemoryMap>,
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

    pub fn push(&mut self, event: Event) {
        let index = self.events.len();
        if index.is_multiple_of(KEYFRAME_EVERY) {
            self.keyframes.push(self.head.clone());
        }
        match &event {
            Event::Alloc(e) => {
                if let Err(err) = self.head.apply(e) {
                    self.gaps.push((index, err));
                }
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
                    Marker::OpEnd | Marker::EmptyCache => None,
                };
                if let Some(kind) = kind {
                    self.mark(index, kind);
                }
            }
        }
        let sample = Sample {
            allocated: self.head.allocated,
            reserved: self.head.reserved,
        };
        self.peak_allocated = self.peak_allocated.max(sample.allocated);
        self.peak_reserved = self.peak_reserved.max(sample.reserved);
        if index.is_multiple_of(BUCKET) {
            self.buckets.push(Bucket::of(sample));
        } else if let Some(b) = self.buckets.last_mut() {
            *b = b.merge(Bucket::of(sample));
        }
        self.samples.push(sample);
        self.events.push(event);
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

    pub fn events(&self) -> &[Event] {
        &self.events
    }

    pub fn samples(&self) -> &[Sample] {
        &self.samples
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
                .cloned()
                .unwrap_or_else(|| self.head.clone());
        };
        if self.events.is_empty() {
            return self.head.clone();
        }
        let k = index / KEYFRAME_EVERY;
        let mut map = self.keyframes[k].clone();
        for e in &self.events[k * KEYFRAME_EVERY..=index] {
            if let Event::Alloc(a) = e {
                let _ = map.apply(a);
            }
        }
        map
    }

    /// Min/max of the curve over events `[from, to)`, using whole buckets
    /// where possible.
    pub fn range_summary(&self, from: usize, to: usize) -> Option<Bucket> {
        let to = to.min(self.samples.len());
        if from >= to {
            return None;
        }
        let mut acc: Option<Bucket> = None;
        let mut i = from;
        let mut add = |b: Bucket| acc = Some(acc.map_or(b, |a| a.merge(b)));
        while i < to {
            if i.is_multiple_of(BUCKET) && i + BUCKET <= to {
                add(self.buckets[i / BUCKET]);
                i += BUCKET;
            } else {
                add(Bucket::of(self.samples[i]));
                i += 1;
            }
        }
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
        self.events.capacity() * std::mem::size_of::<Event>()
            + self.samples.capacity() * std::mem::size_of::<Sample>()
            + self.buckets.capacity() * std::mem::size_of::<Bucket>()
            + self.marks.capacity() * std::mem::size_of::<(usize, MarkKind)>()
            + self
                .by_kind
                .values()
                .map(|v| v.capacity() * std::mem::size_of::<usize>())
                .sum::<usize>()
            + self.keyframes.iter().map(map_bytes).sum::<usize>()
            + map_bytes(&self.head)
    }
}
