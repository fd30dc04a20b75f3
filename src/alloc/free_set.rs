//! The ordered sets of free and unmapped blocks of one pool (allocator.md §1.4).

use std::collections::BTreeMap;
use std::ops::Bound;

use super::block::BlockId;

/// Free, mapped blocks ordered by `(stream, size, address)`: best fit is the
/// first key at or after `(stream, S, 0)`.
///
/// The order is PyTorch's exactly; the layout is for speed. Per stream, blocks
/// sit in size classes (16 linear steps per power of two of the size, as in
/// TLSF), each a short sorted vector of `(size, address)`, with a bitmap of
/// non-empty classes. A lookup finds its class, binary-searches it, and jumps
/// to the next non-empty class by bitmap: no tree to walk, and inserting or
/// removing moves a few entries of one small vector.
#[derive(Debug, Clone, Default)]
pub(crate) struct FreeSet {
    streams: Vec<(u64, Classes)>,
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

#[derive(Debug, Clone)]
struct Classes {
    lists: Vec<Vec<Entry>>,
    nonempty: [u64; WORDS],
}

impl Default for Classes {
    fn default() -> Self {
        Classes {
            lists: vec![Vec::new(); CLASSES],
            nonempty: [0; WORDS],
        }
    }
}

impl Classes {
    fn insert(&mut self, size: u64, addr: u64, id: BlockId) {
        let c = class_of(size);
        let list = &mut self.lists[c];
        let at = list.partition_point(|e| (e.0, e.1) < (size, addr));
        list.insert(at, (size, addr, id));
        self.nonempty[c / 64] |= 1 << (c % 64);
    }

    fn remove(&mut self, size: u64, addr: u64) -> Option<BlockId> {
        let c = class_of(size);
        let list = &mut self.lists[c];
        let at = list.partition_point(|e| (e.0, e.1) < (size, addr));
        if list.get(at).is_some_and(|e| e.0 == size && e.1 == addr) {
            let id = list.remove(at).2;
            if list.is_empty() {
                self.nonempty[c / 64] &= !(1 << (c % 64));
            }
            Some(id)
        } else {
            None
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
        let first = &self.lists[c];
        let at = first.partition_point(|e| e.0 < size);
        let head = first[at..].iter().copied();
        let mut next = self.next_class(c + 1);
        let rest = std::iter::from_fn(move || {
            let k = next?;
            next = self.next_class(k + 1);
            Some(self.lists[k].iter().copied())
        })
        .flatten();
        head.chain(rest)
    }

    /// Entries with size < `size`, descending.
    fn below(&self, size: u64) -> impl Iterator<Item = Entry> + '_ {
        let c = class_of(size);
        let first = &self.lists[c];
        let at = first.partition_point(|e| e.0 < size);
        let head = first[..at].iter().rev().copied();
        let mut prev = self.prev_class(c);
        let rest = std::iter::from_fn(move || {
            let k = prev?;
            prev = self.prev_class(k);
            Some(self.lists[k].iter().rev().copied())
        })
        .flatten();
        head.chain(rest)
    }

    fn largest(&self) -> Option<u64> {
        self.prev_class(CLASSES)
            .and_then(|c| self.lists[c].last())
            .map(|e| e.0)
    }
}

impl FreeSet {
    fn stream(&self, stream: u64) -> Option<&Classes> {
        self.streams
            .iter()
            .find(|(s, _)| *s == stream)
            .map(|(_, m)| m)
    }

    pub fn insert(&mut self, stream: u64, size: u64, addr: u64, id: BlockId) {
        let classes = match self.streams.iter().position(|(s, _)| *s == stream) {
            Some(i) => &mut self.streams[i].1,
            None => {
                let at = self.streams.partition_point(|(s, _)| *s < stream);
                self.streams.insert(at, (stream, Classes::default()));
                &mut self.streams[at].1
            }
        };
        classes.insert(size, addr, id);
        self.len += 1;
    }

    pub fn remove(&mut self, stream: u64, size: u64, addr: u64) -> Option<BlockId> {
        let (_, classes) = self.streams.iter_mut().find(|(s, _)| *s == stream)?;
        let id = classes.remove(size, addr)?;
        self.len -= 1;
        Some(id)
    }

    /// Blocks of `stream` in key order, starting at the first with size ≥ `size`.
    pub fn from(&self, stream: u64, size: u64) -> impl Iterator<Item = FreeEntry> + '_ {
        self.stream(stream).into_iter().flat_map(move |c| {
            c.from(size).map(move |(size, addr, id)| FreeEntry {
                stream,
                size,
                addr,
                id,
            })
        })
    }

    /// Blocks of `stream` in descending key order with size < `size`.
    pub fn below(&self, stream: u64, size: u64) -> impl Iterator<Item = FreeEntry> + '_ {
        self.stream(stream).into_iter().flat_map(move |c| {
            c.below(size).map(move |(size, addr, id)| FreeEntry {
                stream,
                size,
                addr,
                id,
            })
        })
    }

    /// Every block in `(stream, size, address)` order.
    pub fn iter(&self) -> impl Iterator<Item = FreeEntry> + '_ {
        self.streams.iter().flat_map(|(stream, c)| {
            c.from(0).map(move |(size, addr, id)| FreeEntry {
                stream: *stream,
                size,
                addr,
                id,
            })
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Size of the largest free block of any stream.
    pub fn largest(&self) -> u64 {
        self.streams
            .iter()
            .filter_map(|(_, c)| c.largest())
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
