//! The ordered sets of free and unmapped blocks of one pool (allocator.md §1.4).

use std::collections::BTreeMap;
use std::ops::Bound;

use super::block::BlockId;

/// Free, mapped blocks ordered by `(stream, size, address)`: best fit is the
/// first key at or after `(stream, S, 0)`. Kept as one ordered map per stream
/// (streams sorted by handle) with `(size, address)` packed into a `u128`, which
/// compares in one step; most programs use one or two streams.
#[derive(Debug, Clone, Default)]
pub(crate) struct FreeSet {
    streams: Vec<(u64, BTreeMap<u128, BlockId>)>,
}

/// One free block as the set orders it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FreeEntry {
    pub stream: u64,
    pub size: u64,
    pub addr: u64,
    pub id: BlockId,
}

fn key(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

fn entry(stream: u64, k: u128, id: BlockId) -> FreeEntry {
    FreeEntry {
        stream,
        size: (k >> 64) as u64,
        addr: k as u64,
        id,
    }
}

impl FreeSet {
    fn stream(&self, stream: u64) -> Option<&BTreeMap<u128, BlockId>> {
        self.streams
            .iter()
            .find(|(s, _)| *s == stream)
            .map(|(_, m)| m)
    }

    pub fn insert(&mut self, stream: u64, size: u64, addr: u64, id: BlockId) {
        let map = match self.streams.iter().position(|(s, _)| *s == stream) {
            Some(i) => &mut self.streams[i].1,
            None => {
                let at = self.streams.partition_point(|(s, _)| *s < stream);
                self.streams.insert(at, (stream, BTreeMap::new()));
                &mut self.streams[at].1
            }
        };
        map.insert(key(size, addr), id);
    }

    pub fn remove(&mut self, stream: u64, size: u64, addr: u64) -> Option<BlockId> {
        let (_, map) = self.streams.iter_mut().find(|(s, _)| *s == stream)?;
        map.remove(&key(size, addr))
    }

    /// Blocks of `stream` in key order, starting at the first with size ≥ `size`.
    pub fn from(&self, stream: u64, size: u64) -> impl Iterator<Item = FreeEntry> + '_ {
        self.stream(stream).into_iter().flat_map(move |m| {
            m.range(key(size, 0)..)
                .map(move |(k, id)| entry(stream, *k, *id))
        })
    }

    /// Blocks of `stream` in descending key order with size < `size`.
    pub fn below(&self, stream: u64, size: u64) -> impl Iterator<Item = FreeEntry> + '_ {
        self.stream(stream).into_iter().flat_map(move |m| {
            m.range(..key(size, 0))
                .rev()
                .map(move |(k, id)| entry(stream, *k, *id))
        })
    }

    /// Every block in `(stream, size, address)` order.
    pub fn iter(&self) -> impl Iterator<Item = FreeEntry> + '_ {
        self.streams
            .iter()
            .flat_map(|(stream, m)| m.iter().map(move |(k, id)| entry(*stream, *k, *id)))
    }

    pub fn len(&self) -> usize {
        self.streams.iter().map(|(_, m)| m.len()).sum()
    }

    /// Size of the largest free block of any stream: the last key of each.
    pub fn largest(&self) -> u64 {
        self.streams
            .iter()
            .filter_map(|(_, m)| m.last_key_value())
            .map(|(k, _)| (k >> 64) as u64)
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
