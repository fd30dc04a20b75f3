//! The timeline's events, packed: 24 bytes per allocator event instead of
//! the 56 of an [`Event`] (28 once a tag needs more than 32 bits, as an
//! engine run's do: their upper halves are kept beside) (a 1 GB snapshot holds 14 M of them, and the views
//! keep every one), markers kept aside. Fields too wide for their packed
//! place (an OOM's free device memory, a block far larger than its request,
//! the 65,536th stream, an address or size of 2^48 or more) are kept aside
//! too, by event index.

use rustc_hash::FxHashMap;
use std::ops::Range;

use super::chunked::ChunkedVec;
use super::event::{Event, Marker};
use crate::alloc::{Action, AllocEvent, Pool, Tag};

/// `kind` of a marker: its `addr` is the index in `markers`.
const MARKER: u8 = u8::MAX;
/// `flags`: the block is in the small pool.
const SMALL: u8 = 1;
/// `flags`: the event's block size, stream or free device memory is in `wide`.
const WIDE: u8 = 2;

/// Addresses and sizes below this fit their packed 48 bits (a GPU's
/// virtual addresses do: 47 bits on x86-64 hosts, 49 on some ARM ones).
const PACKED_LIMIT: u64 = 1 << 48;

/// Fields of at most 4-byte alignment, so an event takes 24 bytes, not the
/// 32 that `u64` fields would take.
#[derive(Debug, Clone, Copy)]
struct Packed {
    addr_lo: u32,
    addr_hi: u16,
    size_hi: u16,
    size_lo: u32,
    /// The tag's lower half (the upper one is in `EventStore::tag_hi`).
    tag_lo: u32,
    /// Block size minus requested size.
    extra: u32,
    /// Index in `streams`.
    stream: u16,
    /// The action's `repr(u8)`, or [`MARKER`].
    kind: u8,
    flags: u8,
}

impl Packed {
    /// `addr` and `size` keep their low 48 bits: an event whose own do not
    /// fit is marked [`WIDE`] and read from `wide`.
    fn new(addr: u64, size: u64, tag: u64, extra: u32, stream: u16, kind: u8, flags: u8) -> Packed {
        Packed {
            addr_lo: addr as u32,
            addr_hi: (addr >> 32) as u16,
            size_hi: (size >> 32) as u16,
            size_lo: size as u32,
            tag_lo: tag as u32,
            extra,
            stream,
            kind,
            flags,
        }
    }

    fn addr(&self) -> u64 {
        u64::from(self.addr_hi) << 32 | u64::from(self.addr_lo)
    }

    fn size(&self) -> u64 {
        u64::from(self.size_hi) << 32 | u64::from(self.size_lo)
    }
}

/// What did not fit an event's packed fields.
#[derive(Debug, Clone, Copy)]
struct Wide {
    addr: u64,
    size: u64,
    block_size: u64,
    stream: u64,
    device_free: u64,
}

#[derive(Debug, Clone, Default)]
pub struct EventStore {
    packed: ChunkedVec<Packed>,
    markers: Vec<Marker>,
    streams: Vec<u64>,
    stream_index: FxHashMap<u64, u16>,
    /// The last stream looked up and its slot: nearly every event is on
    /// the stream before it.
    last_stream: Option<(u64, u16)>,
    wide: FxHashMap<usize, Wide>,
    /// Each event's tag's upper 32 bits, from the first event whose tag
    /// has any (a snapshot's tags are entry numbers: they never do).
    tag_hi: Option<ChunkedVec<u32>>,
}

impl EventStore {
    pub fn len(&self) -> usize {
        self.packed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packed.is_empty()
    }

    pub fn push(&mut self, event: Event) {
        let (packed, tag) = match event {
            Event::Marker(m) => {
                self.markers.push(m);
                let index = (self.markers.len() - 1) as u64;
                (Packed::new(index, 0, 0, 0, 0, MARKER, 0), 0)
            }
            Event::Alloc(e) => (self.pack(&e), e.tag.0),
        };
        let hi = (tag >> 32) as u32;
        if hi != 0 && self.tag_hi.is_none() {
            let mut zeros = ChunkedVec::default();
            (0..self.packed.len()).for_each(|_| zeros.push(0));
            self.tag_hi = Some(zeros);
        }
        if let Some(t) = &mut self.tag_hi {
            t.push(hi);
        }
        self.packed.push(packed);
    }

    fn tag(&self, i: usize, p: &Packed) -> u64 {
        let hi = self.tag_hi.as_ref().and_then(|t| t.get(i)).copied();
        u64::from(hi.unwrap_or(0)) << 32 | u64::from(p.tag_lo)
    }

    fn pack(&mut self, e: &AllocEvent) -> Packed {
        let extra = e
            .block_size
            .checked_sub(e.size)
            .and_then(|x| u32::try_from(x).ok());
        let stream = self.stream_slot(e.stream);
        let wide = extra.is_none()
            || stream.is_none()
            || e.device_free != 0
            || e.addr >= PACKED_LIMIT
            || e.size >= PACKED_LIMIT;
        if wide {
            let w = Wide {
                addr: e.addr,
                size: e.size,
                block_size: e.block_size,
                stream: e.stream,
                device_free: e.device_free,
            };
            self.wide.insert(self.packed.len(), w);
        }
        Packed::new(
            e.addr,
            e.size,
            e.tag.0,
            extra.unwrap_or(0),
            stream.unwrap_or(0),
            e.action as u8,
            if e.pool == Pool::Small { SMALL } else { 0 } | if wide { WIDE } else { 0 },
        )
    }

    /// The packed index of `stream`, `None` once 65,536 streams are known.
    fn stream_slot(&mut self, stream: u64) -> Option<u16> {
        if let Some((s, k)) = self.last_stream {
            if s == stream {
                return Some(k);
            }
        }
        if let Some(&k) = self.stream_index.get(&stream) {
            self.last_stream = Some((stream, k));
            return Some(k);
        }
        let k = u16::try_from(self.streams.len()).ok()?;
        self.streams.push(stream);
        self.stream_index.insert(stream, k);
        Some(k)
    }

    /// Event `i`.
    pub fn get(&self, i: usize) -> Option<Event> {
        let p = self.packed.get(i)?;
        if p.kind == MARKER {
            return self
                .markers
                .get(p.addr() as usize)
                .cloned()
                .map(Event::Marker);
        }
        let mut e = AllocEvent {
            action: Action::from_repr(p.kind)?,
            addr: p.addr(),
            size: p.size(),
            block_size: p.size() + u64::from(p.extra),
            stream: self
                .streams
                .get(usize::from(p.stream))
                .copied()
                .unwrap_or(0),
            pool: if p.flags & SMALL != 0 {
                Pool::Small
            } else {
                Pool::Large
            },
            device_free: 0,
            tag: Tag(self.tag(i, p)),
        };
        if p.flags & WIDE != 0 {
            if let Some(w) = self.wide.get(&i) {
                e.addr = w.addr;
                e.size = w.size;
                e.block_size = w.block_size;
                e.stream = w.stream;
                e.device_free = w.device_free;
            }
        }
        Some(Event::Alloc(e))
    }

    /// Keep the first `n` events.
    pub fn truncate(&mut self, n: usize) {
        let first_gone_marker = (n..self.len())
            .filter_map(|i| self.packed.get(i))
            .find(|p| p.kind == MARKER)
            .map(|p| p.addr() as usize);
        if let Some(m) = first_gone_marker {
            self.markers.truncate(m);
        }
        self.wide.retain(|i, _| *i < n);
        if let Some(t) = &mut self.tag_hi {
            t.truncate(n);
        }
        self.packed.truncate(n);
    }

    /// Events `range` (clipped to the store), in order.
    pub fn range(
        &self,
        range: Range<usize>,
    ) -> impl DoubleEndedIterator<Item = Event> + ExactSizeIterator + '_ {
        let end = range.end.min(self.len());
        (range.start.min(end)..end).map(|i| self.get(i).expect("inside the store"))
    }

    /// The markers and OOM entries among events `range` (clipped to the
    /// store), with their indices: what the timeline's marks index, read
    /// without unpacking the allocator events around them.
    pub fn markers_and_ooms(
        &self,
        range: Range<usize>,
    ) -> impl Iterator<Item = (usize, Event)> + '_ {
        let end = range.end.min(self.len());
        (range.start.min(end)..end).filter_map(|i| {
            let p = self.packed.get(i)?;
            if p.kind != MARKER && p.kind != Action::Oom as u8 {
                return None;
            }
            self.get(i).map(|e| (i, e))
        })
    }

    /// Every event, in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = Event> + ExactSizeIterator + '_ {
        self.range(0..self.len())
    }

    /// Approximate heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.packed.capacity() * std::mem::size_of::<Packed>()
            + self.markers.capacity() * std::mem::size_of::<Marker>()
            + self.wide.capacity() * (std::mem::size_of::<(usize, Wide)>() + 1)
            + self.streams.capacity() * 8
            + self.tag_hi.as_ref().map_or(0, |t| t.capacity() * 4)
    }

    /// Whether event `i` is an allocator event with this action, without
    /// unpacking it.
    pub fn is_action(&self, i: usize, action: Action) -> bool {
        self.packed.get(i).is_some_and(|p| p.kind == action as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Phase;

    fn alloc(action: Action, size: u64, block_size: u64) -> AllocEvent {
        AllocEvent {
            action,
            addr: 0x7f00_0000_0000,
            size,
            block_size,
            stream: 0,
            pool: Pool::Large,
            device_free: 0,
            tag: Tag(42),
        }
    }

    #[test]
    fn every_event_comes_back_as_it_went_in() {
        let mut events: Vec<Event> = vec![
            alloc(Action::Alloc, 1000, 1024).into(),
            Marker::PhaseBegin(Phase::Backward).into(),
            alloc(Action::SegmentAlloc, 2 << 20, 2 << 20).into(),
            AllocEvent {
                pool: Pool::Small,
                stream: 0xdead_beef,
                ..alloc(Action::FreeRequested, 512, 512)
            }
            .into(),
            // A block far larger than its request, and one smaller.
            alloc(Action::FreeCompleted, 1, 1 << 40).into(),
            alloc(Action::FreeCompleted, 1 << 20, 512).into(),
            AllocEvent {
                addr: 0,
                device_free: 3 << 30,
                ..alloc(Action::Oom, 80 << 30, 80 << 30)
            }
            .into(),
            alloc(Action::Other, u64::MAX, u64::MAX).into(),
            // Past the packed 48 bits: the address, the size, both.
            AllocEvent {
                addr: PACKED_LIMIT,
                ..alloc(Action::Alloc, 512, 512)
            }
            .into(),
            alloc(Action::Alloc, PACKED_LIMIT + 1, PACKED_LIMIT + 512).into(),
            AllocEvent {
                addr: u64::MAX,
                tag: Tag(u64::MAX),
                ..alloc(Action::SegmentFree, u64::MAX - 1, u64::MAX - 1)
            }
            .into(),
            Marker::Narration("why".into()).into(),
        ];
        // More streams than the packed index holds.
        for s in 0..70_000u64 {
            events.push(
                AllocEvent {
                    stream: s * 7,
                    ..alloc(Action::Alloc, s, s + 512)
                }
                .into(),
            );
        }
        let mut store = EventStore::default();
        for e in &events {
            store.push(e.clone());
        }
        assert_eq!(store.len(), events.len());
        let back: Vec<Event> = store.iter().collect();
        assert!(back == events, "an event changed in the store");
        assert_eq!(store.get(events.len()), None);
        let (from, to) = (7, 3);
        assert_eq!(store.range(from..to).count(), 0);
        assert_eq!(store.range(events.len() - 1..events.len() + 5).count(), 1);
        assert_eq!(store.range(1..2).next(), Some(events[1].clone()));
        assert!(store.is_action(6, Action::Oom) && !store.is_action(1, Action::Oom));
        assert_eq!(std::mem::size_of::<Packed>(), 24);
        // Every action, the three a trace may add to the allocator's included.
        let every =
            Action::ALL
                .into_iter()
                .chain([Action::Snapshot, Action::Annotate, Action::Other]);
        for a in every {
            let mut store = EventStore::default();
            store.push(alloc(a, 1, 1).into());
            assert!(store.is_action(0, a));
            assert_eq!(store.get(0), Some(alloc(a, 1, 1).into()), "{a:?}");
        }
    }

    #[test]
    fn tags_of_32_bits_take_no_room_beside_the_event() {
        let mut store = EventStore::default();
        let n = 1 << 17;
        for i in 0..n {
            store.push(
                AllocEvent {
                    tag: Tag(i),
                    ..alloc(Action::Alloc, 512, 512)
                }
                .into(),
            );
        }
        assert_eq!(store.heap_bytes() / n as usize, 24);
        // One wide tag: every tag before it keeps its value.
        store.push(
            AllocEvent {
                tag: Tag(7 << 40),
                ..alloc(Action::Alloc, 512, 512)
            }
            .into(),
        );
        store.push(alloc(Action::Alloc, 512, 512).into());
        let tag = |store: &EventStore, i: usize| match store.get(i) {
            Some(Event::Alloc(e)) => e.tag.0,
            other => panic!("{other:?}"),
        };
        let n = n as usize;
        assert_eq!((tag(&store, 0), tag(&store, n - 1)), (0, n as u64 - 1));
        assert_eq!((tag(&store, n), tag(&store, n + 1)), (7 << 40, 42));
        store.truncate(3);
        store.push(alloc(Action::Alloc, 512, 512).into());
        assert_eq!((tag(&store, 2), tag(&store, 3)), (2, 42));
    }
}
