//! The ordered sets of free and unmapped blocks of one pool (allocator.md §1.4).

use std::collections::BTreeMap;
use std::ops::Bound;

use super::block::BlockId;

/// Free, mapped blocks ordered by `(stream, size, address)`: best fit is the
/// first key at or after `(stream, S, 0)`.
#[derive(Debug, Clone, Default)]
pub(crate) struct FreeSet {
    map: BTreeMap<(u64, u64, u64), BlockId>,
}

impl FreeSet {
    pub fn insert(&mut self, stream: u64, size: u64, addr: u64, id: BlockId) {
        self.map.insert((stream, size, addr), id);
    }

    pub fn remove(&mut self, stream: u64, size: u64, addr: u64) -> Option<BlockId> {
        self.map.remove(&(stream, size, addr))
    }

    /// Blocks in key order starting at the first key ≥ `(stream, size, 0)`.
    pub fn from(&self, stream: u64, size: u64) -> impl Iterator<Item = (&(u64, u64, u64), &BlockId)> {
        self.map.range((stream, size, 0)..)
    }

    /// Blocks in descending key order strictly below `(stream, size, 0)`.
    pub fn below(&self, stream: u64, size: u64) -> impl Iterator<Item = (&(u64, u64, u64), &BlockId)> {
        self.map.range(..(stream, size, 0)).rev()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&(u64, u64, u64), &BlockId)> {
        self.map.iter()
    }

    pub fn len(&self) -> usize {
        self.map.len()
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
            .range((Bound::Included((stream, 0)), Bound::Included((stream, u64::MAX))))
            .map(|(_, id)| *id)
    }
}
