//! The ordered sets of free and unmapped blocks of one pool (allocator.md §1.4).

use std::collections::BTreeMap;
use std::ops::Bound;

use super::block::BlockId;
use size_classes::{Classes, Loc};

mod class_list;
mod search;
mod size_classes;
#[cfg(test)]
mod tests;

/// Free, mapped blocks ordered by `(stream, size, address)`: best fit is the
/// first key at or after `(stream, S, 0)`.
///
/// The order is PyTorch's exactly; the layout is for speed. Per stream, blocks
/// sit in size classes (16 linear steps per power of two of the size, as in
/// TLSF), each sorted by `(size, address)` in a fixed slot of one flat array
/// (or, past 32 entries, a chunked list), with a bitmap of non-empty classes.
/// A lookup finds its class, binary-searches it, and jumps to the next
/// non-empty class by bitmap: no tree to walk, and inserting or removing
/// moves at most a few hundred bytes.
#[derive(Debug, Clone, Default)]
pub(crate) struct FreeSet {
    streams: Vec<(u64, Classes)>,
    /// The block inserted last, not yet placed in its class (see `insert`).
    pending: Option<FreeEntry>,
    len: usize,
}

/// One free block as the set orders it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FreeEntry {
    pub stream: u64,
    pub size: u64,
    pub addr: u64,
    pub id: BlockId,
}

impl FreeEntry {
    #[inline]
    fn of(stream: u64, (size, addr, id): size_classes::Entry) -> FreeEntry {
        FreeEntry {
            stream,
            size,
            addr,
            id,
        }
    }

    #[inline]
    fn key(&self) -> (u64, u64, u64) {
        (self.stream, self.size, self.addr)
    }
}

/// A lookup's answer and where it sits, so that taking it needs no second search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hit {
    pub entry: FreeEntry,
    /// The stream's index in `streams`, or `PENDING`.
    stream_ix: u32,
    loc: Loc,
}

const PENDING: u32 = u32::MAX;

/// A sorted iterator with one more entry merged in at its place.
struct WithPending<I: Iterator<Item = FreeEntry>> {
    inner: std::iter::Peekable<I>,
    pending: Option<FreeEntry>,
    descending: bool,
}

impl<I: Iterator<Item = FreeEntry>> Iterator for WithPending<I> {
    type Item = FreeEntry;
    fn next(&mut self) -> Option<FreeEntry> {
        let take_pending = match (&self.pending, self.inner.peek()) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(p), Some(e)) => (p.key() < e.key()) != self.descending,
        };
        if take_pending {
            self.pending.take()
        } else {
            self.inner.next()
        }
    }
}

impl FreeSet {
    #[inline]
    fn stream(&self, stream: u64) -> Option<&Classes> {
        self.stream_index(stream).map(|i| &self.streams[i].1)
    }

    fn with_pending<I: Iterator<Item = FreeEntry>>(
        &self,
        inner: I,
        keep: impl Fn(&FreeEntry) -> bool,
        descending: bool,
    ) -> WithPending<I> {
        WithPending {
            inner: inner.peekable(),
            pending: self.pending.filter(keep),
            descending,
        }
    }

    /// Insert a block. It waits in `pending` until the next insert: a
    /// training loop's frees and mallocs often take back the block they just
    /// put, and then neither the insert nor the remove touches the classes.
    #[inline]
    pub fn insert(&mut self, stream: u64, size: u64, addr: u64, id: BlockId) {
        let entry = FreeEntry {
            stream,
            size,
            addr,
            id,
        };
        if let Some(p) = self.pending.replace(entry) {
            self.place(p);
        }
        self.len += 1;
    }

    #[inline]
    fn place(&mut self, e: FreeEntry) {
        let classes = match self.stream_index(e.stream) {
            Some(i) => &mut self.streams[i].1,
            None => {
                let at = self.streams.partition_point(|(s, _)| *s < e.stream);
                self.streams.insert(at, (e.stream, Classes::default()));
                &mut self.streams[at].1
            }
        };
        classes.insert(e.size, e.addr, e.id);
    }

    #[inline]
    pub fn remove(&mut self, stream: u64, size: u64, addr: u64) -> Option<BlockId> {
        let hit = self.find(stream, size, addr)?;
        self.take(hit);
        Some(hit.entry.id)
    }

    /// The block keyed `(stream, size, addr)`, if it is in the set.
    #[inline]
    pub fn find(&self, stream: u64, size: u64, addr: u64) -> Option<Hit> {
        match self.pending {
            Some(p) if p.key() == (stream, size, addr) => Some(Hit {
                entry: p,
                stream_ix: PENDING,
                loc: Loc::NONE,
            }),
            _ => {
                let ix = self.stream_index(stream)?;
                let (e, loc) = self.streams[ix].1.find(size, addr)?;
                Some(Hit {
                    entry: FreeEntry::of(stream, e),
                    stream_ix: ix as u32,
                    loc,
                })
            }
        }
    }

    /// The first block of `stream` with size ≥ `size`: `from(stream, size).next()`.
    #[inline]
    pub fn first_from(&self, stream: u64, size: u64) -> Option<Hit> {
        let ix = self.stream_index(stream);
        let placed = ix.and_then(|i| self.streams[i].1.first_from(size));
        self.earlier_with_pending(stream, ix, placed, (stream, size, 0))
    }

    /// The block of `stream` that follows `(size, addr)` in key order:
    /// stepping through `from` one search at a time, with no iterator to build.
    #[inline]
    pub fn next_after(&self, stream: u64, size: u64, addr: u64) -> Option<Hit> {
        let (size, addr) = match addr.checked_add(1) {
            Some(a) => (size, a),
            None => (size.checked_add(1)?, 0),
        };
        let ix = self.stream_index(stream);
        let placed = ix.and_then(|i| {
            self.streams[i]
                .1
                .first_at_or_after(size_classes::key(size, addr))
        });
        self.earlier_with_pending(stream, ix, placed, (stream, size, addr))
    }

    #[inline]
    fn stream_index(&self, stream: u64) -> Option<usize> {
        self.streams.iter().position(|(s, _)| *s == stream)
    }

    /// The earlier of `placed` (the classes' answer) and the pending block,
    /// if that one is at or after `k` in `stream`.
    #[inline]
    fn earlier_with_pending(
        &self,
        stream: u64,
        ix: Option<usize>,
        placed: Option<(size_classes::Entry, Loc)>,
        k: (u64, u64, u64),
    ) -> Option<Hit> {
        let placed = match (ix, placed) {
            (Some(i), Some((e, loc))) => Some(Hit {
                entry: FreeEntry::of(stream, e),
                stream_ix: i as u32,
                loc,
            }),
            _ => None,
        };
        let pending = self
            .pending
            .filter(|p| p.stream == stream && p.key() >= k)
            .map(|entry| Hit {
                entry,
                stream_ix: PENDING,
                loc: Loc::NONE,
            });
        match (placed, pending) {
            (Some(a), Some(b)) => Some(if b.entry.key() < a.entry.key() { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// Remove the block a lookup just returned (no change to the set in between).
    #[inline(always)]
    pub fn take(&mut self, hit: Hit) {
        if hit.stream_ix == PENDING {
            self.pending = None;
        } else {
            self.streams[hit.stream_ix as usize].1.remove_at(hit.loc);
        }
        self.len -= 1;
    }

    /// Blocks of `stream` in key order, starting at the first with size ≥ `size`.
    pub fn from(&self, stream: u64, size: u64) -> impl Iterator<Item = FreeEntry> + '_ {
        let placed = self
            .stream(stream)
            .into_iter()
            .flat_map(move |c| c.from(size).map(move |e| FreeEntry::of(stream, e)));
        self.with_pending(placed, |p| p.stream == stream && p.size >= size, false)
    }

    /// Blocks of `stream` in descending key order with size < `size`.
    pub fn below(&self, stream: u64, size: u64) -> impl Iterator<Item = FreeEntry> + '_ {
        let placed = self
            .stream(stream)
            .into_iter()
            .flat_map(move |c| c.below(size).map(move |e| FreeEntry::of(stream, e)));
        self.with_pending(placed, |p| p.stream == stream && p.size < size, true)
    }

    /// Every block in `(stream, size, address)` order.
    pub fn iter(&self) -> impl Iterator<Item = FreeEntry> + '_ {
        let placed = self
            .streams
            .iter()
            .flat_map(|(stream, c)| c.from(0).map(move |e| FreeEntry::of(*stream, e)));
        self.with_pending(placed, |_| true, false)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Size of the largest free block of any stream.
    pub fn largest(&self) -> u64 {
        self.streams
            .iter()
            .filter_map(|(_, c)| c.largest())
            .chain(self.pending.map(|p| p.size))
            .max()
            .unwrap_or(0)
    }
}

/// Unmapped blocks of expandable reservations, ordered by `(stream, address)`.
#[derive(Debug, Clone, Default)]
pub(crate) struct UnmappedSet {
    map: BTreeMap<(u64, u64), BlockId>,
}

impl UnmappedSet {
    #[inline]
    pub fn insert(&mut self, stream: u64, addr: u64, id: BlockId) {
        self.map.insert((stream, addr), id);
    }

    #[inline]
    pub fn remove(&mut self, stream: u64, addr: u64) {
        self.map.remove(&(stream, addr));
    }

    /// Unmapped blocks of `stream` in address order.
    pub fn of_stream(&self, stream: u64) -> impl Iterator<Item = BlockId> + '_ {
        self.map
            .range((
                Bound::Included((stream, 0)),
                Bound::Included((stream, u64::MAX)),
            ))
            .map(|(_, id)| *id)
    }
}
