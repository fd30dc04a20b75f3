//! The map a long trace is placed on. Same rules and results as
//! [`MemoryMap`], kept as PyTorch keeps its blocks: each found by address in
//! a hash table and linked to its neighbours in the segment (`Block::prev`
//! and `next`), so that placing an entry (a split, a free and its merges)
//! searches no ordered tree. Segments, few and rarely changed, stay in one.
//! A view gets a [`MemoryMap`] of it, or a keyframe, in one ordered walk.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::alloc::{Action, AllocEvent, BlockState, Pool, Tag};
use crate::trace::frozen_map::FrozenMap;
use crate::trace::memory_map::{
    add_unmapped, cut_segment, free_block, free_like, is_vacant, join_mapped, segment_in,
    take_unmapped, MapError, MapSegment, NO_FREE_BLOCK,
};
use crate::trace::{MapBlock, MemoryMap};

/// No neighbour: the first or last block of its segment.
const NIL: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Linked {
    block: MapBlock,
    prev: u64,
    next: u64,
}

/// What a trace mirror needs of the map it places entries on.
pub trait PlaceOn {
    /// See [`MemoryMap::alloc_at`].
    fn alloc_at(
        &mut self,
        addr: u64,
        size: u64,
        tag: Tag,
        choose: impl FnOnce(&MapBlock) -> u64,
    ) -> Option<u64>;
    /// See [`MemoryMap::request_free`].
    fn request_free(&mut self, addr: u64) -> (Option<MapBlock>, Result<(), &'static str>);
    /// See [`MemoryMap::complete_free`].
    fn complete_free(&mut self, addr: u64) -> (Option<MapBlock>, Result<(), &'static str>);
    /// The pool of the segment containing `addr`.
    fn segment_pool(&self, addr: u64) -> Option<Pool>;
    /// See [`MemoryMap::apply`].
    fn apply(&mut self, e: &AllocEvent) -> Result<(), MapError>;
    fn allocated(&self) -> u64;
    fn reserved(&self) -> u64;
    /// Blocks and segments held (what a keyframe of it costs).
    fn entries(&self) -> usize;
    fn freeze(&self) -> FrozenMap;
    /// The map as the views take it.
    fn into_memory_map(self) -> MemoryMap;
}

impl PlaceOn for MemoryMap {
    fn alloc_at(
        &mut self,
        addr: u64,
        size: u64,
        tag: Tag,
        choose: impl FnOnce(&MapBlock) -> u64,
    ) -> Option<u64> {
        MemoryMap::alloc_at(self, addr, size, tag, choose)
    }
    fn request_free(&mut self, addr: u64) -> (Option<MapBlock>, Result<(), &'static str>) {
        MemoryMap::request_free(self, addr)
    }
    fn complete_free(&mut self, addr: u64) -> (Option<MapBlock>, Result<(), &'static str>) {
        MemoryMap::complete_free(self, addr)
    }
    fn segment_pool(&self, addr: u64) -> Option<Pool> {
        self.segment_at(addr).map(|(_, s)| s.pool)
    }
    fn apply(&mut self, e: &AllocEvent) -> Result<(), MapError> {
        MemoryMap::apply(self, e)
    }
    fn allocated(&self) -> u64 {
        self.allocated
    }
    fn reserved(&self) -> u64 {
        self.reserved
    }
    fn entries(&self) -> usize {
        self.blocks.len() + self.segments.len()
    }
    fn freeze(&self) -> FrozenMap {
        FrozenMap::freeze(self)
    }
    fn into_memory_map(self) -> MemoryMap {
        self
    }
}

/// Segments and linked blocks, plus running totals.
#[derive(Debug, Clone, Default)]
pub struct PlacingMap {
    segments: BTreeMap<u64, MapSegment>,
    blocks: FxHashMap<u64, Linked>,
    unmapped: BTreeMap<u64, (u64, u64)>,
    allocated: u64,
    reserved: u64,
    active: u64,
}

impl PlacingMap {
    /// `map` as a placing map, when its blocks tile its segments (each
    /// segment covered by blocks end to end, no block outside one), as every
    /// map the allocator's rules build does; `Err` gives it back otherwise.
    pub fn tiled(map: MemoryMap) -> Result<PlacingMap, Box<MemoryMap>> {
        let mut blocks = FxHashMap::default();
        blocks.reserve(map.blocks.len());
        let mut iter = map.blocks.iter().peekable();
        for (&start, seg) in &map.segments {
            let end = start + seg.size;
            let (mut at, mut prev) = (start, NIL);
            while at < end {
                let Some((&a, b)) = iter.next().filter(|(a, _)| **a == at) else {
                    return Err(Box::new(map));
                };
                blocks.insert(
                    a,
                    Linked {
                        block: *b,
                        prev,
                        next: NIL,
                    },
                );
                if let Some(p) = blocks.get_mut(&prev) {
                    p.next = a;
                }
                prev = a;
                at = a.saturating_add(b.size.max(1));
            }
            if at != end {
                return Err(Box::new(map));
            }
        }
        if iter.next().is_some() {
            return Err(Box::new(map));
        }
        Ok(PlacingMap {
            blocks,
            segments: map.segments,
            unmapped: map.unmapped,
            allocated: map.allocated,
            reserved: map.reserved,
            active: map.active,
        })
    }

    /// Blocks in address order.
    fn ordered_blocks(&self) -> impl Iterator<Item = (u64, MapBlock)> + '_ {
        let blocks = &self.blocks;
        self.segments.keys().flat_map(move |&start| {
            let mut at = start;
            std::iter::from_fn(move || {
                let n = blocks.get(&at)?;
                let here = at;
                at = n.next;
                Some((here, n.block))
            })
        })
    }

    fn segment_at(&self, addr: u64) -> Option<(u64, &MapSegment)> {
        segment_in(&self.segments, addr)
    }

    /// The block containing `addr`: a walk along its segment (only
    /// expandable segments' rare unmaps ask).
    fn block_at(&self, addr: u64) -> Option<(u64, Linked)> {
        let (mut at, _) = self.segment_at(addr)?;
        while let Some(n) = self.blocks.get(&at) {
            if addr < at + n.block.size {
                return Some((at, *n));
            }
            at = n.next;
        }
        None
    }

    /// The last block of the segment starting at `start`.
    fn last_block(&self, start: u64) -> Option<(u64, Linked)> {
        let mut at = start;
        let mut n = *self.blocks.get(&at)?;
        while let Some(next) = self.blocks.get(&n.next) {
            at = n.next;
            n = *next;
        }
        Some((at, n))
    }

    fn set_prev(&mut self, at: u64, prev: u64) {
        if let Some(n) = self.blocks.get_mut(&at) {
            n.prev = prev;
        }
    }

    fn set_next(&mut self, at: u64, next: u64) {
        if let Some(n) = self.blocks.get_mut(&at) {
            n.next = next;
        }
    }

    /// See [`MemoryMap::map_range`]'s rules: the new range joins the mapped
    /// run and the free blocks on either side.
    fn map_range(&mut self, e: &AllocEvent) {
        self.reserved += e.size;
        let (seg_start, joins_prev, joins_next) = join_mapped(&mut self.segments, e);
        let requested = take_unmapped(&mut self.unmapped, e);
        let end = e.addr + e.size;
        let (mut start, mut size) = (e.addr, e.size);
        let mut prev = NIL;
        if joins_prev {
            if let Some((pa, p)) = self.last_block(seg_start) {
                prev = pa;
                if p.block.state == BlockState::Inactive && pa + p.block.size == e.addr {
                    self.blocks.remove(&pa);
                    start = pa;
                    size += p.block.size;
                    prev = p.prev;
                }
            }
        }
        let mut next = NIL;
        if joins_next {
            if let Some(n) = self.blocks.get(&end).copied() {
                next = end;
                if n.block.state == BlockState::Inactive {
                    self.blocks.remove(&end);
                    size += n.block.size;
                    next = n.next;
                }
            }
        }
        self.blocks.insert(
            start,
            Linked {
                block: free_block(size, requested, e.pool, true),
                prev,
                next,
            },
        );
        self.set_next(prev, start);
        self.set_prev(next, start);
    }

    /// See [`MemoryMap::unmap_range`]'s rules.
    fn unmap_range(&mut self, e: &AllocEvent) -> Option<()> {
        let (ba, node) = self.block_at(e.addr)?;
        let b = node.block;
        if b.state != BlockState::Inactive || e.addr + e.size > ba + b.size {
            return None;
        }
        let (sa, s) = self.segment_at(e.addr).map(|(a, s)| (a, s.clone()))?;
        self.blocks.remove(&ba);
        let end = e.addr + e.size;
        if e.addr > ba {
            let left = free_block(e.addr - ba, 0, b.pool, b.expandable);
            self.blocks.insert(
                ba,
                Linked {
                    block: left,
                    prev: node.prev,
                    next: NIL,
                },
            );
        } else {
            self.set_next(node.prev, NIL);
        }
        if ba + b.size > end {
            let rest = free_block(ba + b.size - end, 0, b.pool, b.expandable);
            self.blocks.insert(
                end,
                Linked {
                    block: rest,
                    prev: NIL,
                    next: node.next,
                },
            );
            self.set_prev(node.next, end);
        } else {
            self.set_prev(node.next, NIL);
        }
        cut_segment(&mut self.segments, sa, s, e.addr, end);
        self.reserved -= e.size;
        add_unmapped(&mut self.unmapped, e.addr, e.size, b.requested);
        Some(())
    }
}

impl PlaceOn for PlacingMap {
    fn alloc_at(
        &mut self,
        addr: u64,
        size: u64,
        tag: Tag,
        choose: impl FnOnce(&MapBlock) -> u64,
    ) -> Option<u64> {
        let n = self.blocks.get_mut(&addr)?;
        if n.block.state != BlockState::Inactive {
            return None;
        }
        let block_size = choose(&n.block);
        if n.block.size < block_size {
            return None;
        }
        let old = n.block;
        n.block = MapBlock {
            size: block_size,
            requested: size,
            state: BlockState::ActiveAllocated,
            tag,
            ..old
        };
        if old.size > block_size {
            let rest_at = addr + block_size;
            let next = std::mem::replace(&mut n.next, rest_at);
            let rest = MapBlock {
                size: old.size - block_size,
                ..free_like(&old)
            };
            self.blocks.insert(
                rest_at,
                Linked {
                    block: rest,
                    prev: addr,
                    next,
                },
            );
            self.set_prev(next, rest_at);
        }
        self.allocated += block_size;
        self.active += block_size;
        Some(block_size)
    }

    fn request_free(&mut self, addr: u64) -> (Option<MapBlock>, Result<(), &'static str>) {
        let Some(n) = self.blocks.get_mut(&addr) else {
            return (None, Err("no such block"));
        };
        let found = n.block;
        if found.state != BlockState::ActiveAllocated {
            return (Some(found), Err("block is not allocated"));
        }
        n.block.state = BlockState::ActivePendingFree;
        self.allocated -= found.size;
        (Some(found), Ok(()))
    }

    fn complete_free(&mut self, addr: u64) -> (Option<MapBlock>, Result<(), &'static str>) {
        const NO_PENDING: &str = "no pending block";
        let Some(node) = self.blocks.get(&addr).copied() else {
            return (None, Err(NO_PENDING));
        };
        let found = node.block;
        if found.state != BlockState::ActivePendingFree {
            return (Some(found), Err(NO_PENDING));
        }
        self.active -= found.size;
        let into = match self
            .blocks
            .get_mut(&node.prev)
            .filter(|p| p.block.state == BlockState::Inactive)
        {
            Some(p) => {
                p.block = MapBlock {
                    size: p.block.size + found.size,
                    ..free_like(&found)
                };
                p.next = node.next;
                self.blocks.remove(&addr);
                self.set_prev(node.next, node.prev);
                node.prev
            }
            None => {
                if let Some(b) = self.blocks.get_mut(&addr) {
                    b.block = free_like(&found);
                }
                addr
            }
        };
        let joined = self
            .blocks
            .get(&node.next)
            .filter(|n| n.block.state == BlockState::Inactive)
            .copied();
        if let Some(n) = joined {
            self.blocks.remove(&node.next);
            if let Some(merged) = self.blocks.get_mut(&into) {
                merged.block.size += n.block.size;
                merged.next = n.next;
            }
            self.set_prev(n.next, into);
        }
        (Some(found), Ok(()))
    }

    fn segment_pool(&self, addr: u64) -> Option<Pool> {
        self.segment_at(addr).map(|(_, s)| s.pool)
    }

    fn apply(&mut self, e: &AllocEvent) -> Result<(), MapError> {
        let err = |reason| MapError {
            action: e.action.name(),
            addr: e.addr,
            reason,
        };
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap
                if !is_vacant(&self.segments, e.addr, e.size) =>
            {
                return Err(err("overlaps memory already reserved"));
            }
            Action::SegmentAlloc => {
                let seg = MapSegment {
                    size: e.size,
                    pool: e.pool,
                    stream: e.stream,
                    expandable: false,
                    tag: e.tag,
                };
                self.segments.insert(e.addr, seg);
                let block = free_block(e.size, 0, e.pool, false);
                self.blocks.insert(
                    e.addr,
                    Linked {
                        block,
                        prev: NIL,
                        next: NIL,
                    },
                );
                self.reserved += e.size;
            }
            Action::SegmentFree => {
                let seg = self
                    .segments
                    .remove(&e.addr)
                    .ok_or_else(|| err("no such segment"))?;
                let mut at = e.addr;
                while let Some(n) = self.blocks.remove(&at) {
                    at = n.next;
                }
                self.reserved -= seg.size;
            }
            Action::SegmentMap => self.map_range(e),
            Action::SegmentUnmap => self
                .unmap_range(e)
                .ok_or_else(|| err("not inside a free mapped block"))?,
            Action::Alloc => PlaceOn::alloc_at(self, e.addr, e.size, e.tag, |_| e.block_size)
                .map(|_| ())
                .ok_or_else(|| err(NO_FREE_BLOCK))?,
            Action::FreeRequested => PlaceOn::request_free(self, e.addr).1.map_err(err)?,
            Action::FreeCompleted => PlaceOn::complete_free(self, e.addr).1.map_err(err)?,
            Action::Oom | Action::Snapshot | Action::Annotate | Action::Other => {}
        }
        Ok(())
    }

    fn allocated(&self) -> u64 {
        self.allocated
    }

    fn reserved(&self) -> u64 {
        self.reserved
    }

    fn entries(&self) -> usize {
        self.blocks.len() + self.segments.len()
    }

    fn freeze(&self) -> FrozenMap {
        FrozenMap::from_sorted(
            self.segments.iter().map(|(a, s)| (*a, s.clone())).collect(),
            self.ordered_blocks().collect(),
            self.unmapped.iter().map(|(a, u)| (*a, *u)).collect(),
            (self.allocated, self.reserved, self.active),
        )
    }

    fn into_memory_map(self) -> MemoryMap {
        let blocks = self.ordered_blocks().collect();
        MemoryMap {
            segments: self.segments,
            blocks,
            unmapped: self.unmapped,
            allocated: self.allocated,
            reserved: self.reserved,
            active: self.active,
        }
    }
}

#[cfg(test)]
mod tests;
