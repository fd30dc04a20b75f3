//! The ordered sets of free and unmapped blocks of one pool (allocator.md §1.4).

use std::collections::BTreeMap;
use std::ops::Bound;

use super::block::BlockId;

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

const SUB_BITS: u32 = 4;
const SUBS: usize = 1 << SUB_BITS;
/// Sizes are counted in 512-byte units; 56 powers of two cover every u64 size.
const CLASSES: usize = 56 * SUBS;
const WORDS: usize = CLASSES / 64;

/// The class of a size: monotonic in the size, so classes in order hold
/// sizes in order.
#[inline]
fn class_of(size: u64) -> usize {
    let units = (size >> 9).max(1);
    let fl = 63 - units.leading_zeros();
    if fl < SUB_BITS {
        units as usize
    } else {
        let sl = (units >> (fl - SUB_BITS)) as usize & (SUBS - 1);
        ((fl - SUB_BITS + 1) as usize) * SUBS + sl
    }
}

type Entry = (u64, u64, BlockId);

/// Entries per chunk of a class: small enough that an insert or remove moves
/// at most a few hundred bytes however many blocks share one size (whole
/// free segments all do).
const CHUNK: usize = 32;

/// One size class: sorted `(size, addr)` entries cut into chunks, with each
/// chunk's last key beside it so a search touches one small array and then
/// one chunk. Chunks past `lasts.len()` are empty spares kept for their
/// capacity: classes empty and refill all the time, and reusing a chunk
/// keeps the heap allocator out of the hot path.
#[derive(Debug, Clone, Default)]
struct ClassList {
    lasts: Vec<u128>,
    chunks: Vec<Vec<Entry>>,
    len: usize,
}

fn key(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

fn entry_key(e: &Entry) -> u128 {
    key(e.0, e.1)
}

impl ClassList {
    fn used(&self) -> &[Vec<Entry>] {
        &self.chunks[..self.lasts.len()]
    }

    /// The chunk that holds (or would hold) `k`.
    fn chunk_for(&self, k: u128) -> usize {
        // Most classes hold one chunk: answer without touching `lasts`
        // (callers treat a key past the only chunk's end correctly).
        if self.lasts.len() <= 1 {
            return 0;
        }
        self.lasts.partition_point(|l| *l < k)
    }

    /// Put an empty chunk (a spare if there is one) at position `c`.
    fn open_chunk(&mut self, c: usize, last: u128) {
        if c == self.lasts.len() && self.chunks.len() > c {
            // The first spare is already in place.
            self.lasts.push(last);
            return;
        }
        let chunk = if self.chunks.len() > self.lasts.len() {
            self.chunks.pop().unwrap_or_default()
        } else {
            Vec::with_capacity(CHUNK + 1)
        };
        self.chunks.insert(c, chunk);
        self.lasts.insert(c, last);
    }

    fn insert(&mut self, size: u64, addr: u64, id: BlockId) {
        let k = key(size, addr);
        if self.lasts.is_empty() {
            self.open_chunk(0, k);
        }
        let c = self.chunk_for(k).min(self.lasts.len() - 1);
        let chunk = &mut self.chunks[c];
        let at = chunk.partition_point(|e| entry_key(e) < k);
        chunk.insert(at, (size, addr, id));
        self.len += 1;
        if at + 1 == chunk.len() {
            self.lasts[c] = k;
        }
        if chunk.len() > CHUNK {
            let lower_last = entry_key(&chunk[CHUNK / 2 - 1]);
            let upper_last = self.lasts[c];
            self.open_chunk(c + 1, upper_last);
            let (lower, upper) = self.chunks.split_at_mut(c + 1);
            upper[0].extend(lower[c].drain(CHUNK / 2..));
            self.lasts[c] = lower_last;
        }
    }

    fn remove(&mut self, size: u64, addr: u64) -> Option<BlockId> {
        let k = key(size, addr);
        let c = self.chunk_for(k);
        if c >= self.lasts.len() {
            return None;
        }
        let chunk = &mut self.chunks[c];
        let at = chunk.partition_point(|e| entry_key(e) < k);
        if !chunk.get(at).is_some_and(|e| e.0 == size && e.1 == addr) {
            return None;
        }
        let id = chunk.remove(at).2;
        self.len -= 1;
        match chunk.last() {
            None => {
                // The emptied chunk becomes a spare; at the end it already is one.
                if c + 1 < self.lasts.len() {
                    let spare = self.chunks.remove(c);
                    self.chunks.push(spare);
                }
                self.lasts.remove(c);
            }
            Some(last) => self.lasts[c] = entry_key(last),
        }
        Some(id)
    }

    /// The first entry with size ≥ `size`.
    fn first_from(&self, size: u64) -> Option<Entry> {
        let k = key(size, 0);
        let c = self.chunk_for(k);
        let chunk = self.used().get(c)?;
        let at = chunk.partition_point(|e| e.0 < size);
        chunk.get(at).copied()
    }

    fn first(&self) -> Option<Entry> {
        self.used().first().and_then(|c| c.first()).copied()
    }

    /// Entries with size ≥ `size`, ascending.
    fn from(&self, size: u64) -> impl Iterator<Item = Entry> + '_ {
        let used = self.used();
        let c = self.chunk_for(key(size, 0));
        let first = used.get(c).map_or(&[][..], |ch| {
            let at = ch.partition_point(|e| e.0 < size);
            &ch[at..]
        });
        let rest = used.get(c + 1..).unwrap_or(&[]);
        first.iter().chain(rest.iter().flatten()).copied()
    }

    /// Entries with size < `size`, descending.
    fn below(&self, size: u64) -> impl Iterator<Item = Entry> + '_ {
        let used = self.used();
        let c = self.chunk_for(key(size, 0));
        let head = used.get(c).map_or(&[][..], |ch| {
            let at = ch.partition_point(|e| e.0 < size);
            &ch[..at]
        });
        let before = &used[..c.min(used.len())];
        head.iter()
            .rev()
            .chain(before.iter().rev().flat_map(|ch| ch.iter().rev()))
            .copied()
    }

    fn all(&self) -> impl DoubleEndedIterator<Item = Entry> + '_ {
        self.used().iter().flatten().copied()
    }

    /// Take every entry out, keeping the chunks as spares.
    fn take_all(&mut self) -> Vec<Entry> {
        let entries = self.all().collect();
        self.lasts.clear();
        self.chunks.iter_mut().for_each(Vec::clear);
        self.len = 0;
        entries
    }
}

/// Entries a class keeps in its own slot of one flat array before it spills
/// into a [`ClassList`]. Most classes hold a handful of blocks, and a flat
/// slot is one memory access away, where a list is three (header, chunk
/// table, chunk).
const INLINE: usize = 32;
/// `lens` value of a class whose entries live in `spilled`.
const SPILLED: u16 = u16::MAX;

#[derive(Debug, Clone)]
struct Classes {
    lens: Vec<u16>,
    inline: Vec<Entry>,
    spilled: Vec<ClassList>,
    nonempty: [u64; WORDS],
}

impl Default for Classes {
    fn default() -> Self {
        Classes {
            lens: vec![0; CLASSES],
            // Zeroed, so pages of classes never used are never touched.
            inline: vec![(0, 0, 0); CLASSES * INLINE],
            spilled: vec![ClassList::default(); CLASSES],
            nonempty: [0; WORDS],
        }
    }
}

/// One of two iterators over entries.
enum Either<A, B> {
    Inline(A),
    Spilled(B),
}

impl<A: Iterator<Item = Entry>, B: Iterator<Item = Entry>> Iterator for Either<A, B> {
    type Item = Entry;
    fn next(&mut self) -> Option<Entry> {
        match self {
            Either::Inline(a) => a.next(),
            Either::Spilled(b) => b.next(),
        }
    }
}

impl<A, B> DoubleEndedIterator for Either<A, B>
where
    A: DoubleEndedIterator<Item = Entry>,
    B: DoubleEndedIterator<Item = Entry>,
{
    fn next_back(&mut self) -> Option<Entry> {
        match self {
            Either::Inline(a) => a.next_back(),
            Either::Spilled(b) => b.next_back(),
        }
    }
}

impl Classes {
    fn slot(&self, c: usize) -> &[Entry] {
        &self.inline[c * INLINE..c * INLINE + usize::from(self.lens[c])]
    }

    fn insert(&mut self, size: u64, addr: u64, id: BlockId) {
        let c = class_of(size);
        let n = self.lens[c];
        if n == SPILLED {
            self.spilled[c].insert(size, addr, id);
        } else if usize::from(n) < INLINE {
            let n = usize::from(n);
            let base = c * INLINE;
            let k = key(size, addr);
            let at = self.inline[base..base + n].partition_point(|e| entry_key(e) < k);
            // A short shift: a plain loop beats a call to memmove.
            let slot = &mut self.inline[base..base + n + 1];
            for i in (at..n).rev() {
                slot[i + 1] = slot[i];
            }
            slot[at] = (size, addr, id);
            self.lens[c] += 1;
        } else {
            let list = &mut self.spilled[c];
            for &(s, a, i) in &self.inline[c * INLINE..(c + 1) * INLINE] {
                list.insert(s, a, i);
            }
            list.insert(size, addr, id);
            self.lens[c] = SPILLED;
        }
        self.nonempty[c / 64] |= 1 << (c % 64);
    }

    fn remove(&mut self, size: u64, addr: u64) -> Option<BlockId> {
        let c = class_of(size);
        let n = self.lens[c];
        if n == SPILLED {
            let list = &mut self.spilled[c];
            let id = list.remove(size, addr)?;
            if list.len < INLINE / 2 {
                let entries = list.take_all();
                self.inline[c * INLINE..c * INLINE + entries.len()].copy_from_slice(&entries);
                self.lens[c] = entries.len() as u16;
            }
            return Some(id);
        }
        let base = c * INLINE;
        let n = usize::from(n);
        let k = key(size, addr);
        let at = self.inline[base..base + n].partition_point(|e| entry_key(e) < k);
        if at == n || entry_key(&self.inline[base + at]) != k {
            return None;
        }
        let id = self.inline[base + at].2;
        let slot = &mut self.inline[base..base + n];
        for i in at..n - 1 {
            slot[i] = slot[i + 1];
        }
        self.lens[c] -= 1;
        if n == 1 {
            self.nonempty[c / 64] &= !(1 << (c % 64));
        }
        Some(id)
    }

    /// The first entry with size ≥ `size` (best fit before any other rule).
    fn first_from(&self, size: u64) -> Option<Entry> {
        let c = class_of(size);
        let found = if self.lens[c] == SPILLED {
            self.spilled[c].first_from(size)
        } else {
            let slot = self.slot(c);
            slot.get(slot.partition_point(|e| e.0 < size)).copied()
        };
        found.or_else(|| self.first_of(self.next_class(c + 1)?))
    }

    fn first_of(&self, c: usize) -> Option<Entry> {
        if self.lens[c] == SPILLED {
            self.spilled[c].first()
        } else {
            self.slot(c).first().copied()
        }
    }

    /// Every entry of class `c`, ascending.
    fn all(&self, c: usize) -> impl DoubleEndedIterator<Item = Entry> + '_ {
        if self.lens[c] == SPILLED {
            Either::Spilled(self.spilled[c].all())
        } else {
            Either::Inline(self.slot(c).iter().copied())
        }
    }

    /// The first non-empty class at or after `c`.
    fn next_class(&self, c: usize) -> Option<usize> {
        let mut w = c / 64;
        let mut bits = self.nonempty.get(w)? & (!0u64 << (c % 64));
        loop {
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
            w += 1;
            bits = *self.nonempty.get(w)?;
        }
    }

    /// The last non-empty class strictly before `c`.
    fn prev_class(&self, c: usize) -> Option<usize> {
        if c == 0 {
            return None;
        }
        let c = c - 1;
        let mut w = c / 64;
        let mut bits = self.nonempty[w] & (!0u64 >> (63 - c % 64));
        loop {
            if bits != 0 {
                return Some(w * 64 + 63 - bits.leading_zeros() as usize);
            }
            if w == 0 {
                return None;
            }
            w -= 1;
            bits = self.nonempty[w];
        }
    }

    /// Entries with size ≥ `size`, ascending.
    fn from(&self, size: u64) -> impl Iterator<Item = Entry> + '_ {
        let c = class_of(size);
        let head = if self.lens[c] == SPILLED {
            Either::Spilled(self.spilled[c].from(size))
        } else {
            let slot = self.slot(c);
            Either::Inline(slot[slot.partition_point(|e| e.0 < size)..].iter().copied())
        };
        let mut next = self.next_class(c + 1);
        let rest = std::iter::from_fn(move || {
            let k = next?;
            next = self.next_class(k + 1);
            Some(self.all(k))
        })
        .flatten();
        head.chain(rest)
    }

    /// Entries with size < `size`, descending.
    fn below(&self, size: u64) -> impl Iterator<Item = Entry> + '_ {
        let c = class_of(size);
        let head = if self.lens[c] == SPILLED {
            Either::Spilled(self.spilled[c].below(size))
        } else {
            let slot = self.slot(c);
            Either::Inline(
                slot[..slot.partition_point(|e| e.0 < size)]
                    .iter()
                    .rev()
                    .copied(),
            )
        };
        let mut prev = self.prev_class(c);
        let rest = std::iter::from_fn(move || {
            let k = prev?;
            prev = self.prev_class(k);
            Some(self.all(k).rev())
        })
        .flatten();
        head.chain(rest)
    }

    fn largest(&self) -> Option<u64> {
        let c = self.prev_class(CLASSES)?;
        self.all(c).next_back().map(|e| e.0)
    }
}

impl FreeEntry {
    fn key(&self) -> (u64, u64, u64) {
        (self.stream, self.size, self.addr)
    }
}

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
    fn stream(&self, stream: u64) -> Option<&Classes> {
        self.streams
            .iter()
            .find(|(s, _)| *s == stream)
            .map(|(_, m)| m)
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

    fn place(&mut self, e: FreeEntry) {
        let classes = match self.streams.iter().position(|(s, _)| *s == e.stream) {
            Some(i) => &mut self.streams[i].1,
            None => {
                let at = self.streams.partition_point(|(s, _)| *s < e.stream);
                self.streams.insert(at, (e.stream, Classes::default()));
                &mut self.streams[at].1
            }
        };
        classes.insert(e.size, e.addr, e.id);
    }

    pub fn remove(&mut self, stream: u64, size: u64, addr: u64) -> Option<BlockId> {
        let id = match self.pending {
            Some(p) if p.key() == (stream, size, addr) => {
                self.pending = None;
                p.id
            }
            _ => {
                let (_, classes) = self.streams.iter_mut().find(|(s, _)| *s == stream)?;
                classes.remove(size, addr)?
            }
        };
        self.len -= 1;
        Some(id)
    }

    /// The first block of `stream` with size ≥ `size`: `from(stream, size).next()`.
    pub fn first_from(&self, stream: u64, size: u64) -> Option<FreeEntry> {
        let placed =
            self.stream(stream)
                .and_then(|c| c.first_from(size))
                .map(|(size, addr, id)| FreeEntry {
                    stream,
                    size,
                    addr,
                    id,
                });
        let pending = self
            .pending
            .filter(|p| p.stream == stream && p.size >= size);
        match (placed, pending) {
            (Some(a), Some(b)) => Some(if b.key() < a.key() { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// Blocks of `stream` in key order, starting at the first with size ≥ `size`.
    pub fn from(&self, stream: u64, size: u64) -> impl Iterator<Item = FreeEntry> + '_ {
        let placed = self.stream(stream).into_iter().flat_map(move |c| {
            c.from(size).map(move |(size, addr, id)| FreeEntry {
                stream,
                size,
                addr,
                id,
            })
        });
        self.with_pending(placed, |p| p.stream == stream && p.size >= size, false)
    }

    /// Blocks of `stream` in descending key order with size < `size`.
    pub fn below(&self, stream: u64, size: u64) -> impl Iterator<Item = FreeEntry> + '_ {
        let placed = self.stream(stream).into_iter().flat_map(move |c| {
            c.below(size).map(move |(size, addr, id)| FreeEntry {
                stream,
                size,
                addr,
                id,
            })
        });
        self.with_pending(placed, |p| p.stream == stream && p.size < size, true)
    }

    /// Every block in `(stream, size, address)` order.
    pub fn iter(&self) -> impl Iterator<Item = FreeEntry> + '_ {
        let placed = self.streams.iter().flat_map(|(stream, c)| {
            c.from(0).map(move |(size, addr, id)| FreeEntry {
                stream: *stream,
                size,
                addr,
                id,
            })
        });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_monotonic_and_in_range() {
        let mut sizes: Vec<u64> = (0..64u32)
            .flat_map(|shift| {
                (0..64u64)
                    .map(move |k| (1u64 << shift).saturating_add(k << shift.saturating_sub(6)))
            })
            .collect();
        sizes.extend((1..5000u64).map(|i| i * 512 * (1 + i % 7)));
        sizes.push(u64::MAX);
        sizes.sort_unstable();
        assert!(sizes.windows(2).all(|w| class_of(w[0]) <= class_of(w[1])));
        assert!(sizes.iter().all(|s| class_of(*s) < CLASSES));
    }

    #[test]
    fn many_blocks_of_one_size_stay_in_address_order() {
        // Whole free segments share one size: one class, many chunks.
        let mut set = FreeSet::default();
        let mut model: Vec<u64> = Vec::new();
        let mut x: u64 = 99;
        for i in 0..5000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let addr = (x % 100_000) << 21;
            if i % 4 == 3 && !model.is_empty() {
                let a = model.swap_remove((x as usize >> 3) % model.len());
                assert_eq!(set.remove(0, 2 << 20, a).map(|_| ()), Some(()));
            } else if !model.contains(&addr) {
                set.insert(0, 2 << 20, addr, i);
                model.push(addr);
            }
            if i % 500 == 0 {
                let mut sorted = model.clone();
                sorted.sort_unstable();
                assert_eq!(
                    set.first_from(0, 1 << 20).map(|e| e.addr),
                    sorted.first().copied()
                );
            }
        }
        model.sort_unstable();
        let all: Vec<u64> = set.iter().map(|e| e.addr).collect();
        assert_eq!(all, model);
        let below: Vec<u64> = set.below(0, 3 << 20).map(|e| e.addr).collect();
        assert_eq!(below, model.iter().rev().copied().collect::<Vec<_>>());
        assert!(set.from(0, (2 << 20) + 1).next().is_none());
        assert_eq!(set.remove(0, 2 << 20, 1 << 60), None);
        // Shrinking moves the class back to its flat slot, still in order.
        while model.len() > 3 {
            let a = model.remove(model.len() / 2);
            assert!(set.remove(0, 2 << 20, a).is_some());
        }
        let all: Vec<u64> = set.iter().map(|e| e.addr).collect();
        assert_eq!(all, model);
        assert_eq!(set.largest(), 2 << 20);
        set.insert(0, 4 << 20, 0, 1);
        assert_eq!(set.largest(), 4 << 20);
    }

    #[test]
    fn order_matches_a_sorted_list() {
        let mut set = FreeSet::default();
        let mut model: Vec<(u64, u64)> = Vec::new();
        let mut x: u64 = 12345;
        for i in 0..3000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let size = 512 * (1 + x % 40_000);
            let addr = (x >> 20) << 9;
            if i % 3 == 2 && !model.is_empty() {
                let (s, a) = model.swap_remove((x as usize) % model.len());
                assert!(set.remove(0, s, a).is_some());
            } else if !model.contains(&(size, addr)) {
                set.insert(0, size, addr, i);
                model.push((size, addr));
            }
        }
        model.sort_unstable();
        let all: Vec<(u64, u64)> = set.iter().map(|e| (e.size, e.addr)).collect();
        assert_eq!(all, model);
        assert_eq!(set.len(), model.len());
        for probe in [512, 4096, 1 << 20, 5 << 20, 20 << 20, 1 << 40] {
            let want: Vec<_> = model
                .iter()
                .filter(|e| e.0 >= probe)
                .take(5)
                .copied()
                .collect();
            let got: Vec<_> = set
                .from(0, probe)
                .take(5)
                .map(|e| (e.size, e.addr))
                .collect();
            assert_eq!(got, want, "from {probe}");
            let first = set.first_from(0, probe).map(|e| (e.size, e.addr));
            assert_eq!(first, want.first().copied(), "first_from {probe}");
            let want: Vec<_> = model
                .iter()
                .rev()
                .filter(|e| e.0 < probe)
                .take(5)
                .copied()
                .collect();
            let got: Vec<_> = set
                .below(0, probe)
                .take(5)
                .map(|e| (e.size, e.addr))
                .collect();
            assert_eq!(got, want, "below {probe}");
        }
        assert_eq!(set.largest(), model.last().map_or(0, |e| e.0));
    }
}

/// Unmapped blocks of expandable reservations, ordered by `(stream, address)`.
#[derive(Debug, Clone, Default)]
pub(crate) struct UnmappedSet {
    map: BTreeMap<(u64, u64), BlockId>,
}

impl UnmappedSet {
    pub fn insert(&mut self, stream: u64, addr: u64, id: BlockId) {
        self.map.insert((stream, addr), id);
    }

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
