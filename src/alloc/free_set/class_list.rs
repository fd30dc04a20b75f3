//! A long size class: sorted entries in chunks (a two-level B+ tree).

use super::search::lower_bound;
use super::size_classes::{entry_key, key, Entry};
use crate::alloc::block::BlockId;

/// Entries per chunk of a class: small enough that an insert or remove moves
/// at most a few hundred bytes however many blocks share one size (whole
/// free segments all do).
const CHUNK: usize = 16;

/// One size class: sorted `(size, addr)` entries cut into chunks, with each
/// chunk's last key beside it so a search touches one small array and then
/// one chunk. Chunks past `lasts.len()` are empty spares kept for their
/// capacity: classes empty and refill all the time, and reusing a chunk
/// keeps the heap allocator out of the hot path.
#[derive(Debug, Clone, Default)]
pub(super) struct ClassList {
    lasts: Vec<u128>,
    chunks: Vec<Vec<Entry>>,
    pub(super) len: usize,
}

impl ClassList {
    #[inline]
    fn used(&self) -> &[Vec<Entry>] {
        &self.chunks[..self.lasts.len()]
    }

    /// The chunk that holds (or would hold) `k`.
    #[inline]
    fn chunk_for(&self, k: u128) -> usize {
        // Most classes hold one chunk: answer without touching `lasts`
        // (callers treat a key past the only chunk's end correctly).
        if self.lasts.len() <= 1 {
            return 0;
        }
        lower_bound(&self.lasts, |l| *l < k)
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

    #[inline]
    pub(super) fn insert(&mut self, size: u64, addr: u64, id: BlockId) {
        let k = key(size, addr);
        if self.lasts.is_empty() {
            self.open_chunk(0, k);
        }
        let c = self.chunk_for(k).min(self.lasts.len() - 1);
        let chunk = &mut self.chunks[c];
        let at = lower_bound(chunk, |e| entry_key(e) < k);
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

    /// Remove the entry at position `at` of chunk `c`.
    #[inline]
    pub(super) fn remove_at(&mut self, c: usize, at: usize) -> BlockId {
        let chunk = &mut self.chunks[c];
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
        id
    }

    /// The first entry whose key is ≥ `k` (None past this class's end),
    /// with its chunk and position.
    #[inline]
    pub(super) fn first_at_or_after(&self, k: u128) -> Option<(Entry, usize, usize)> {
        let c = self.chunk_for(k);
        let chunk = self.used().get(c)?;
        let at = lower_bound(chunk, |e| entry_key(e) < k);
        chunk.get(at).map(|e| (*e, c, at))
    }

    #[inline]
    pub(super) fn first(&self) -> Option<Entry> {
        self.used().first().and_then(|c| c.first()).copied()
    }

    /// Entries with size ≥ `size`, ascending.
    pub(super) fn from(&self, size: u64) -> impl Iterator<Item = Entry> + '_ {
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
    pub(super) fn below(&self, size: u64) -> impl Iterator<Item = Entry> + '_ {
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

    pub(super) fn all(&self) -> impl DoubleEndedIterator<Item = Entry> + '_ {
        self.used().iter().flatten().copied()
    }

    /// Take every entry out, keeping the chunks as spares.
    pub(super) fn take_all(&mut self) -> Vec<Entry> {
        let entries = self.all().collect();
        self.lasts.clear();
        self.chunks.iter_mut().for_each(Vec::clear);
        self.len = 0;
        entries
    }
}
