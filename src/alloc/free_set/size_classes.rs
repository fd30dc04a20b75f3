//! Size classes of one stream's free blocks: a flat slot per class, spilling
//! into a chunked list when a class grows past `INLINE` entries.

use super::class_list::ClassList;
use super::search::lower_bound;
use crate::alloc::block::BlockId;

const SUB_BITS: u32 = 4;
const SUBS: usize = 1 << SUB_BITS;
/// Sizes are counted in 512-byte units; 56 powers of two cover every u64 size.
pub(super) const CLASSES: usize = 56 * SUBS;
const WORDS: usize = CLASSES / 64;

/// The class of a size: monotonic in the size, so classes in order hold
/// sizes in order.
#[inline]
pub(super) fn class_of(size: u64) -> usize {
    let units = (size >> 9).max(1);
    let fl = 63 - units.leading_zeros();
    if fl < SUB_BITS {
        units as usize
    } else {
        let sl = (units >> (fl - SUB_BITS)) as usize & (SUBS - 1);
        // Never above `CLASSES - 1` for a u64 size; saying so lets the
        // compiler drop the bounds checks of every class array.
        (((fl - SUB_BITS + 1) as usize) * SUBS + sl).min(CLASSES - 1)
    }
}

/// A boxed slice of exactly `CLASSES` entries as a fixed-size array.
fn fixed<T, const N: usize>(v: Vec<T>) -> Box<[T; N]> {
    match v.into_boxed_slice().try_into() {
        Ok(array) => array,
        Err(_) => unreachable!("built with exactly N entries"),
    }
}

pub(super) type Entry = (u64, u64, BlockId);

/// Where an entry sits, as a lookup found it: removing it there needs no
/// second search. Class, position and (spilled classes) chunk packed in one
/// word: a lookup's answer is copied around, and a word stays in a register
/// where a struct of small fields goes through the stack and stalls the
/// loads that read it back whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc(u64);

const SPILLED_BIT: u64 = 1 << 63;

impl Loc {
    /// No place (the pending block).
    pub(super) const NONE: Loc = Loc(0);

    #[inline]
    fn inline(class: usize, at: usize) -> Loc {
        Loc(class as u64 | (at as u64) << 16)
    }
    #[inline]
    fn spilled(class: usize, chunk: usize, at: usize) -> Loc {
        Loc(class as u64 | (at as u64) << 16 | (chunk as u64) << 32 | SPILLED_BIT)
    }
    #[inline]
    fn class(self) -> usize {
        ((self.0 & 0xffff) as usize).min(CLASSES - 1)
    }
    #[inline]
    fn at(self) -> usize {
        ((self.0 >> 16) & 0xffff) as usize
    }
    #[inline]
    fn chunk(self) -> usize {
        ((self.0 >> 32) & 0x7fff_ffff) as usize
    }
    #[inline]
    fn is_spilled(self) -> bool {
        self.0 & SPILLED_BIT != 0
    }
}

#[inline]
pub(super) fn key(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

#[inline]
pub(super) fn entry_key(e: &Entry) -> u128 {
    key(e.0, e.1)
}

/// Entries a class keeps in its own slot of one flat array before it spills
/// into a [`ClassList`]. Most classes hold a handful of blocks, and a flat
/// slot is one memory access away, where a list is three (header, chunk
/// table, chunk).
const INLINE: usize = 32;
/// A class's flat slot, as two halves: `vec!` zero-allocates arrays of at
/// most 16 zeroable entries (and arrays of those), not longer ones.
type InlineSlot = [[Entry; INLINE / 2]; 2];
/// `lens` values from here up name a class whose entries live in
/// `spilled[lens - SPILL_BASE]`.
const SPILL_BASE: u16 = 1 << 15;

#[derive(Debug, Clone)]
pub(super) struct Classes {
    // Fixed-size arrays indexed by a class known to be below `CLASSES`:
    // the compiler drops the bounds checks on the hottest lines.
    lens: Box<[u16; CLASSES]>,
    inline: Box<[InlineSlot; CLASSES]>,
    /// The lists of spilled classes, packed: a few dozen classes spill, and
    /// their headers side by side stay in cache, where a header per class
    /// (most of them never used) was one more miss on every spilled lookup.
    spilled: Vec<ClassList>,
    /// Lists of classes that went back to their flat slot, kept for reuse.
    vacant_lists: Vec<u16>,
    nonempty: [u64; WORDS],
}

impl Default for Classes {
    fn default() -> Self {
        Classes {
            lens: fixed(vec![0; CLASSES]),
            // Zeroed, so pages of classes never used are never touched.
            inline: fixed(vec![[[(0, 0, 0); INLINE / 2]; 2]; CLASSES]),
            spilled: Vec::new(),
            vacant_lists: Vec::new(),
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
    /// The index in `spilled` of class `c`'s list, if it has spilled.
    #[inline]
    fn list_ix(&self, c: usize) -> Option<usize> {
        let n = self.lens[c];
        (n >= SPILL_BASE).then(|| usize::from(n - SPILL_BASE))
    }

    #[inline]
    fn slot(&self, c: usize) -> &[Entry] {
        &self.inline[c].as_flattened()[..usize::from(self.lens[c]).min(INLINE)]
    }

    #[inline]
    pub(super) fn insert(&mut self, size: u64, addr: u64, id: BlockId) {
        let c = class_of(size);
        let n = self.lens[c];
        if let Some(ix) = self.list_ix(c) {
            self.spilled[ix].insert(size, addr, id);
        } else if usize::from(n) < INLINE {
            let n = usize::from(n);
            let k = key(size, addr);
            // Insertion sort's step from the end: finding the place and
            // making room in one short loop (one hard-to-predict exit, where
            // a search and then a shift have two).
            let slot = &mut self.inline[c].as_flattened_mut()[..n + 1];
            let mut at = n;
            while at > 0 && entry_key(&slot[at - 1]) > k {
                slot[at] = slot[at - 1];
                at -= 1;
            }
            slot[at] = (size, addr, id);
            self.lens[c] += 1;
        } else {
            let ix = match self.vacant_lists.pop() {
                Some(ix) => usize::from(ix),
                None => {
                    self.spilled.push(ClassList::default());
                    self.spilled.len() - 1
                }
            };
            let list = &mut self.spilled[ix];
            for &(s, a, i) in self.inline[c].as_flattened() {
                list.insert(s, a, i);
            }
            list.insert(size, addr, id);
            // At most `CLASSES` lists: the index fits below the base's bit.
            self.lens[c] = SPILL_BASE + ix as u16;
        }
        self.nonempty[c / 64] |= 1 << (c % 64);
    }

    /// The entry keyed `(size, addr)` and where it sits.
    #[inline]
    pub(super) fn find(&self, size: u64, addr: u64) -> Option<(Entry, Loc)> {
        let c = class_of(size);
        let k = key(size, addr);
        let (e, loc) = if let Some(ix) = self.list_ix(c) {
            let (e, chunk, at) = self.spilled[ix].first_at_or_after(k)?;
            (e, Loc::spilled(c, chunk, at))
        } else {
            let slot = self.slot(c);
            let at = lower_bound(slot, |e| entry_key(e) < k);
            (*slot.get(at)?, Loc::inline(c, at))
        };
        (entry_key(&e) == k).then_some((e, loc))
    }

    /// Remove the entry a lookup just found at `loc` (no change in between).
    #[inline]
    pub(super) fn remove_at(&mut self, loc: Loc) -> BlockId {
        let c = loc.class();
        let at = loc.at();
        if loc.is_spilled() {
            let Some(ix) = self.list_ix(c) else {
                unreachable!("a spilled location in a class that has not spilled")
            };
            let list = &mut self.spilled[ix];
            let id = list.remove_at(loc.chunk(), at);
            if list.len < INLINE / 2 {
                let entries = list.take_all();
                self.inline[c].as_flattened_mut()[..entries.len()].copy_from_slice(&entries);
                self.lens[c] = entries.len() as u16;
                self.vacant_lists.push(ix as u16);
            }
            return id;
        }
        let n = usize::from(self.lens[c]).min(INLINE);
        let slot = &mut self.inline[c].as_flattened_mut()[..n];
        let id = slot[at].2;
        slot.copy_within(at + 1.., at);
        self.lens[c] -= 1;
        if n == 1 {
            self.nonempty[c / 64] &= !(1 << (c % 64));
        }
        id
    }

    /// The first entry with size ≥ `size` (best fit before any other rule).
    #[inline]
    pub(super) fn first_from(&self, size: u64) -> Option<(Entry, Loc)> {
        // Same as `first_at_or_after(key(size, 0))`; comparing sizes alone is
        // cheaper on the path every malloc takes.
        self.first_in(class_of(size), key(size, 0), |e| e.0 < size)
    }

    /// The first entry whose `(size, addr)` key is ≥ `k`.
    #[inline]
    pub(super) fn first_at_or_after(&self, k: u128) -> Option<(Entry, Loc)> {
        self.first_in(class_of((k >> 64) as u64), k, |e| entry_key(e) < k)
    }

    /// The first entry at or after `k` starting in class `c`; `before` says
    /// whether an entry of `c` lies before `k`.
    #[inline]
    fn first_in(&self, c: usize, k: u128, before: impl Fn(&Entry) -> bool) -> Option<(Entry, Loc)> {
        let found = if let Some(ix) = self.list_ix(c) {
            self.spilled[ix]
                .first_at_or_after(k)
                .map(|(e, chunk, at)| (e, Loc::spilled(c, chunk, at)))
        } else {
            let slot = self.slot(c);
            let at = lower_bound(slot, before);
            slot.get(at).map(|e| (*e, Loc::inline(c, at)))
        };
        found.or_else(|| self.first_of(self.next_class(c + 1)?))
    }

    #[inline(always)]
    fn first_of(&self, c: usize) -> Option<(Entry, Loc)> {
        if let Some(ix) = self.list_ix(c) {
            Some((self.spilled[ix].first()?, Loc::spilled(c, 0, 0)))
        } else {
            Some((*self.slot(c).first()?, Loc::inline(c, 0)))
        }
    }

    /// Every entry of class `c`, ascending.
    fn all(&self, c: usize) -> impl DoubleEndedIterator<Item = Entry> + '_ {
        if let Some(ix) = self.list_ix(c) {
            Either::Spilled(self.spilled[ix].all())
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
    pub(super) fn from(&self, size: u64) -> impl Iterator<Item = Entry> + '_ {
        let c = class_of(size);
        let head = if let Some(ix) = self.list_ix(c) {
            Either::Spilled(self.spilled[ix].from(size))
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
    pub(super) fn below(&self, size: u64) -> impl Iterator<Item = Entry> + '_ {
        let c = class_of(size);
        let head = if let Some(ix) = self.list_ix(c) {
            Either::Spilled(self.spilled[ix].below(size))
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

    pub(super) fn largest(&self) -> Option<u64> {
        let c = self.prev_class(CLASSES)?;
        self.all(c).next_back().map(|e| e.0)
    }
}
