//! The segment/block map rebuilt from trace entries alone, so any event index
//! can be shown for a scenario run and an imported snapshot alike. It follows
//! the allocator's rules for which block survives a split or merge, so it equals
//! the allocator's own snapshot after the same entries.

use std::collections::{btree_map, BTreeMap};

use crate::alloc::{Action, AllocEvent, BlockState, Pool, SegmentInfo, Tag};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapSegment {
    pub size: u64,
    pub pool: Pool,
    pub stream: u64,
    pub expandable: bool,
    /// Who asked for the request that created the segment.
    pub tag: Tag,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapBlock {
    pub size: u64,
    pub requested: u64,
    pub state: BlockState,
    pub tag: Tag,
    /// The pool and kind of the block's segment, kept on the block (as
    /// PyTorch's `Block` keeps its pool) so that placing an entry needs no
    /// segment lookup.
    pub pool: Pool,
    pub expandable: bool,
}

/// Segments and blocks by address, plus running totals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryMap {
    pub segments: BTreeMap<u64, MapSegment>,
    pub blocks: BTreeMap<u64, MapBlock>,
    /// Expandable ranges that were mapped once and are unmapped now: address →
    /// (size, requested size of the block object that holds them, §4.4).
    pub unmapped: BTreeMap<u64, (u64, u64)>,
    pub allocated: u64,
    pub reserved: u64,
    /// Allocated plus pending-free bytes.
    pub active: u64,
}

/// The figures of one map state the Stats panel shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MapStats {
    pub allocated: u64,
    pub reserved: u64,
    pub active: u64,
    /// Free blocks in segments that hold other blocks too (split, not whole).
    pub inactive_split_blocks: usize,
    pub inactive_split_bytes: u64,
    /// Every free block's bytes.
    pub cached_free: u64,
    pub largest_free: u64,
    pub large_segments: usize,
    pub small_segments: usize,
}

impl MapStats {
    /// Cached free bytes as a share of reserved (0 with nothing reserved).
    pub fn cached_free_share(&self) -> f64 {
        if self.reserved == 0 {
            0.0
        } else {
            self.cached_free as f64 / self.reserved as f64
        }
    }

    /// [`crate::alloc::fragmentation`] of this map.
    pub fn fragmentation(&self) -> f64 {
        crate::alloc::fragmentation(self.largest_free, self.cached_free)
    }
}

/// Why an `alloc` entry could not be placed.
pub const NO_FREE_BLOCK: &str = "no free block starts here";

/// Something in the entries that the map cannot place (an open trace, a gap).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{action} at {addr:#x}: {reason}")]
pub struct MapError {
    pub action: &'static str,
    pub addr: u64,
    pub reason: &'static str,
}

impl MemoryMap {
    /// The map of an allocator's `snapshot()`.
    pub fn from_segments(segments: &[SegmentInfo]) -> MemoryMap {
        let mut map = MemoryMap::default();
        for s in segments {
            let segment = MapSegment {
                size: s.total_size,
                pool: s.pool,
                stream: s.stream,
                expandable: s.is_expandable,
                tag: s.tag,
            };
            let blocks = s.blocks.iter().map(|b| {
                let block = MapBlock {
                    size: b.size,
                    requested: b.requested_size,
                    state: b.state,
                    tag: b.tag,
                    pool: s.pool,
                    expandable: s.is_expandable,
                };
                (b.address, block)
            });
            map.insert_segment(s.address, segment, blocks);
        }
        map
    }

    /// Add a whole segment at `addr` with its blocks (which tile it, and
    /// take the segment's pool and kind), and count it in the totals.
    pub fn insert_segment(
        &mut self,
        addr: u64,
        segment: MapSegment,
        blocks: impl IntoIterator<Item = (u64, MapBlock)>,
    ) {
        self.reserved += segment.size;
        let (pool, expandable) = (segment.pool, segment.expandable);
        self.segments.insert(addr, segment);
        for (at, b) in blocks {
            let b = MapBlock {
                pool,
                expandable,
                ..b
            };
            if b.state == BlockState::ActiveAllocated {
                self.allocated += b.size;
            }
            if b.state.is_active() {
                self.active += b.size;
            }
            self.blocks.insert(at, b);
        }
    }

    /// The segment containing `addr`.
    pub fn segment_at(&self, addr: u64) -> Option<(u64, &MapSegment)> {
        segment_in(&self.segments, addr)
    }

    /// The block containing `addr`.
    pub fn block_at(&self, addr: u64) -> Option<(u64, &MapBlock)> {
        self.blocks
            .range(..=addr)
            .next_back()
            .filter(|(start, b)| addr < **start + b.size)
            .map(|(a, b)| (*a, b))
    }

    /// Blocks of the segment starting at `seg_addr`, in address order.
    pub fn blocks_of(&self, seg_addr: u64) -> impl Iterator<Item = (u64, &MapBlock)> {
        let end = self
            .segments
            .get(&seg_addr)
            .map_or(seg_addr, |s| seg_addr + s.size);
        self.blocks.range(seg_addr..end).map(|(a, b)| (*a, b))
    }

    /// Bytes in free (inactive) blocks.
    pub fn cached_free(&self) -> u64 {
        self.reserved - self.active
    }

    /// [`MapStats`] in one walk over segments and blocks together (both
    /// sorted by address): a free block is split when its segment holds more
    /// than that block.
    pub fn stats(&self) -> MapStats {
        let (mut split_n, mut split_bytes, mut largest) = (0usize, 0u64, 0u64);
        let mut segs = self.segments.iter().peekable();
        let mut seg: Option<(u64, u64)> = None;
        for (a, b) in &self.blocks {
            while seg.is_none_or(|(s, size)| *a >= s + size) {
                match segs.peek() {
                    Some((s, _)) if **s <= *a => seg = segs.next().map(|(s, g)| (*s, g.size)),
                    _ => break,
                }
            }
            if b.state == BlockState::Inactive {
                largest = largest.max(b.size);
                if seg.is_some_and(|(s, size)| *a >= s && *a < s + size && b.size < size) {
                    split_n += 1;
                    split_bytes += b.size;
                }
            }
        }
        let large = self
            .segments
            .values()
            .filter(|s| s.pool == Pool::Large)
            .count();
        MapStats {
            allocated: self.allocated,
            reserved: self.reserved,
            active: self.active,
            inactive_split_blocks: split_n,
            inactive_split_bytes: split_bytes,
            cached_free: self.cached_free(),
            largest_free: largest,
            large_segments: large,
            small_segments: self.segments.len() - large,
        }
    }

    pub fn apply(&mut self, e: &AllocEvent) -> Result<(), MapError> {
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
                self.blocks
                    .insert(e.addr, free_block(e.size, 0, e.pool, false));
                self.reserved += e.size;
            }
            Action::SegmentFree => {
                let seg = self
                    .segments
                    .remove(&e.addr)
                    .ok_or_else(|| err("no such segment"))?;
                let inside: Vec<u64> = self
                    .blocks
                    .range(e.addr..e.addr + seg.size)
                    .map(|(a, _)| *a)
                    .collect();
                for a in inside {
                    self.blocks.remove(&a);
                }
                self.reserved -= seg.size;
            }
            Action::SegmentMap => self.map_range(e),
            Action::SegmentUnmap => self
                .unmap_range(e)
                .ok_or_else(|| err("not inside a free mapped block"))?,
            Action::Alloc => self
                .alloc_at(e.addr, e.size, e.tag, |_| e.block_size)
                .map(|_| ())
                .ok_or_else(|| err(NO_FREE_BLOCK))?,
            Action::FreeRequested => self.request_free(e.addr).1.map_err(err)?,
            Action::FreeCompleted => self.complete_free(e.addr).1.map_err(err)?,
            Action::Oom | Action::Snapshot | Action::Annotate | Action::Other => {}
        }
        Ok(())
    }

    /// Take the free block at `addr` for a request of `size` bytes: `choose`
    /// sees the block and says how many of its bytes the request gets (the
    /// rest stays free, the old block object keeping its requested size).
    /// The bytes taken, or `None` when no free block that large starts there.
    pub fn alloc_at(
        &mut self,
        addr: u64,
        size: u64,
        tag: Tag,
        choose: impl FnOnce(&MapBlock) -> u64,
    ) -> Option<u64> {
        let b = self.blocks.get_mut(&addr)?;
        if b.state != BlockState::Inactive {
            return None;
        }
        let block_size = choose(b);
        if b.size < block_size {
            return None;
        }
        let old = *b;
        *b = MapBlock {
            size: block_size,
            requested: size,
            state: BlockState::ActiveAllocated,
            tag,
            ..old
        };
        if old.size > block_size {
            let rest = MapBlock {
                size: old.size - block_size,
                ..free_like(&old)
            };
            self.blocks.insert(addr + block_size, rest);
        }
        self.allocated += block_size;
        self.active += block_size;
        Some(block_size)
    }

    /// Mark the allocated block at `addr` pending free. Returns the block as
    /// it was (what the free entry reports), and why it could not be marked.
    pub fn request_free(&mut self, addr: u64) -> (Option<MapBlock>, Result<(), &'static str>) {
        let Some(b) = self.blocks.get_mut(&addr) else {
            return (None, Err("no such block"));
        };
        let found = *b;
        if b.state != BlockState::ActiveAllocated {
            return (Some(found), Err("block is not allocated"));
        }
        b.state = BlockState::ActivePendingFree;
        self.allocated -= b.size;
        (Some(found), Ok(()))
    }

    /// Free the pending block at `addr`, merged with free neighbours in its
    /// segment. Returns the block as it was, and why it could not be freed.
    pub fn complete_free(&mut self, addr: u64) -> (Option<MapBlock>, Result<(), &'static str>) {
        const NO_PENDING: &str = "no pending block";
        // One descent finds the block and the one before it, and both are
        // changed in place: placing a large trace spends most of its time
        // in these searches.
        let mut upto = self.blocks.range_mut(..=addr).rev();
        let Some((_, b)) = upto.next().filter(|(a, _)| **a == addr) else {
            return (None, Err(NO_PENDING));
        };
        let found = *b;
        if found.state != BlockState::ActivePendingFree {
            return (Some(found), Err(NO_PENDING));
        }
        self.active -= found.size;
        let Some((seg_start, seg_end)) =
            segment_in(&self.segments, addr).map(|(a, s)| (a, a + s.size))
        else {
            return (Some(found), Err(NO_PENDING));
        };
        let into_prev = upto.next().filter(|(pa, p)| {
            p.state == BlockState::Inactive && **pa >= seg_start && **pa + p.size == addr
        });
        let into = match into_prev {
            Some((pa, p)) => {
                *p = MapBlock {
                    size: p.size + found.size,
                    ..free_like(&found)
                };
                *pa
            }
            None => {
                *b = free_like(&found);
                addr
            }
        };
        if into != addr {
            self.blocks.remove(&addr);
        }
        let next = addr + found.size;
        if next < seg_end {
            if let btree_map::Entry::Occupied(n) = self.blocks.entry(next) {
                if n.get().state == BlockState::Inactive {
                    let joined = n.remove().size;
                    if let Some(merged) = self.blocks.get_mut(&into) {
                        merged.size += joined;
                    }
                }
            }
        }
        (Some(found), Ok(()))
    }

    /// Expandable growth: a new free mapped range that joins the mapped run
    /// (and free block) on either side.
    fn map_range(&mut self, e: &AllocEvent) {
        self.reserved += e.size;
        let (seg_start, _, joins_next) = join_mapped(&mut self.segments, e);
        let requested = take_unmapped(&mut self.unmapped, e);
        let mut start = e.addr;
        let mut size = e.size;
        if let Some((pa, p)) = self
            .blocks
            .range(seg_start..e.addr)
            .next_back()
            .map(|(a, p)| (*a, *p))
        {
            if p.state == BlockState::Inactive && pa + p.size == e.addr {
                self.blocks.remove(&pa);
                start = pa;
                size += p.size;
            }
        }
        // A block never spans two segments: the next one's first block
        // joins only when its segment did.
        if let Some(n) = self
            .blocks
            .get(&(e.addr + e.size))
            .copied()
            .filter(|_| joins_next)
        {
            if n.state == BlockState::Inactive {
                self.blocks.remove(&(e.addr + e.size));
                size += n.size;
            }
        }
        self.blocks
            .insert(start, free_block(size, requested, e.pool, true));
    }

    /// Expandable shrink: cut `[addr, addr+size)` out of a free block and out
    /// of its mapped run; the pieces left on either side start fresh.
    fn unmap_range(&mut self, e: &AllocEvent) -> Option<()> {
        let (ba, b) = self.block_at(e.addr).map(|(a, b)| (a, *b))?;
        if b.state != BlockState::Inactive || e.addr + e.size > ba + b.size {
            return None;
        }
        let (sa, s) = self.segment_at(e.addr).map(|(a, s)| (a, s.clone()))?;
        self.blocks.remove(&ba);
        if e.addr > ba {
            self.blocks
                .insert(ba, free_block(e.addr - ba, 0, b.pool, b.expandable));
        }
        let end = e.addr + e.size;
        if ba + b.size > end {
            let rest = free_block(ba + b.size - end, 0, b.pool, b.expandable);
            self.blocks.insert(end, rest);
        }
        cut_segment(&mut self.segments, sa, s, e.addr, end);
        self.reserved -= e.size;
        add_unmapped(&mut self.unmapped, e.addr, e.size, b.requested);
        Some(())
    }
}

/// The segment of `segments` containing `addr`.
pub(crate) fn segment_in(
    segments: &BTreeMap<u64, MapSegment>,
    addr: u64,
) -> Option<(u64, &MapSegment)> {
    segments
        .range(..=addr)
        .next_back()
        .filter(|(start, s)| addr < **start + s.size)
        .map(|(a, s)| (*a, s))
}

/// Whether `[addr, addr + size)` is a range no segment covers (a recorded
/// trace may claim anything: a map that takes it stays whole).
pub(crate) fn is_vacant(segments: &BTreeMap<u64, MapSegment>, addr: u64, size: u64) -> bool {
    let Some(end) = addr.checked_add(size).filter(|_| size > 0) else {
        return false;
    };
    segments
        .range(..end)
        .next_back()
        .is_none_or(|(start, s)| start + s.size <= addr)
}

/// Expandable growth, its segments: the new mapped range joins the mapped
/// run of the same kind on either side. The run's start, and whether it
/// joined the run before and the one after.
pub(crate) fn join_mapped(
    segments: &mut BTreeMap<u64, MapSegment>,
    e: &AllocEvent,
) -> (u64, bool, bool) {
    let mut seg_start = e.addr;
    let mut seg_size = e.size;
    let same_kind = |s: &MapSegment| s.expandable && s.pool == e.pool && s.stream == e.stream;
    let mut joins_prev = false;
    if let Some((a, s)) = segments
        .range(..e.addr)
        .next_back()
        .map(|(a, s)| (*a, s.clone()))
    {
        if a + s.size == e.addr && same_kind(&s) {
            segments.remove(&a);
            seg_start = a;
            seg_size += s.size;
            joins_prev = true;
        }
    }
    let end = e.addr + e.size;
    let mut joins_next = false;
    if let Some(s) = segments.get(&end).cloned() {
        if same_kind(&s) {
            segments.remove(&end);
            seg_size += s.size;
            joins_next = true;
        }
    }
    let tag = segments.get(&seg_start).map_or(e.tag, |s| s.tag);
    segments.insert(
        seg_start,
        MapSegment {
            size: seg_size,
            pool: e.pool,
            stream: e.stream,
            expandable: true,
            tag,
        },
    );
    (seg_start, joins_prev, joins_next)
}

/// Expandable growth, its unmapped space: the unmapped block object being
/// mapped survives the merges with its own requested size (0 for space
/// never mapped before), returned; what stays unmapped after it is a fresh
/// block.
pub(crate) fn take_unmapped(unmapped: &mut BTreeMap<u64, (u64, u64)>, e: &AllocEvent) -> u64 {
    match unmapped.remove(&e.addr) {
        Some((size, requested)) => {
            if size > e.size {
                unmapped.insert(e.addr + e.size, (size - e.size, 0));
            }
            requested
        }
        None => 0,
    }
}

/// Expandable shrink, its segments: `[addr, end)` cut out of segment `sa`
/// (`s`); the pieces on either side stay segments.
pub(crate) fn cut_segment(
    segments: &mut BTreeMap<u64, MapSegment>,
    sa: u64,
    s: MapSegment,
    addr: u64,
    end: u64,
) {
    segments.remove(&sa);
    if addr > sa {
        segments.insert(
            sa,
            MapSegment {
                size: addr - sa,
                ..s.clone()
            },
        );
    }
    if sa + s.size > end {
        segments.insert(
            end,
            MapSegment {
                size: sa + s.size - end,
                ..s
            },
        );
    }
}

/// Expandable shrink, its unmapped space: the free block object becomes the
/// unmapped `[addr, addr + size)` and absorbs unmapped neighbours, keeping
/// its `requested` size.
pub(crate) fn add_unmapped(
    unmapped: &mut BTreeMap<u64, (u64, u64)>,
    addr: u64,
    size: u64,
    requested: u64,
) {
    let (mut start, mut size) = (addr, size);
    let end = addr + size;
    if let Some((pa, (psize, _))) = unmapped.range(..addr).next_back().map(|(a, v)| (*a, *v)) {
        if pa + psize == addr {
            unmapped.remove(&pa);
            start = pa;
            size += psize;
        }
    }
    if let Some((nsize, _)) = unmapped.remove(&end) {
        size += nsize;
    }
    unmapped.insert(start, (size, requested));
}

pub(crate) fn free_block(size: u64, requested: u64, pool: Pool, expandable: bool) -> MapBlock {
    MapBlock {
        size,
        requested,
        state: BlockState::Inactive,
        tag: Tag::NONE,
        pool,
        expandable,
    }
}

/// A free block in `b`'s place: its requested size, pool and kind.
pub(crate) fn free_like(b: &MapBlock) -> MapBlock {
    free_block(b.size, b.requested, b.pool, b.expandable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{AllocConfig, CachingAllocator, Family, Level};
    use crate::device::SimDevice;

    #[test]
    fn stats_of_a_map_are_the_allocators_own() {
        let mut a =
            CachingAllocator::new(SimDevice::new("sim", 1 << 30, 0), AllocConfig::default());
        a.set_recording(true);
        let mut live = Vec::new();
        // Mixed sizes in both pools, every third block freed: split segments.
        for i in 0..90u64 {
            let size = [700, 3 << 20, 300_000, 12 << 20, 1 << 10][(i % 5) as usize] + i;
            live.push(a.malloc(size, 0, Tag::NONE).expect("fits"));
        }
        for (i, p) in live.iter().enumerate() {
            if i % 3 == 0 {
                a.free(*p).expect("live");
            }
        }
        let mut map = MemoryMap::default();
        for e in a.take_events() {
            map.apply(&e).expect("placeable");
        }
        let m = map.stats();
        let st = a.stats();
        let current = |f| st.get(f, Level::All).current as u64;
        assert!(m.inactive_split_blocks > 0, "{m:?}");
        assert_eq!(
            m.inactive_split_blocks as u64,
            current(Family::InactiveSplit)
        );
        assert_eq!(m.inactive_split_bytes, current(Family::InactiveSplitBytes));
        assert_eq!(m.allocated, st.allocated_bytes());
        assert_eq!(m.reserved, st.reserved_bytes());
        assert_eq!(m.active, current(Family::ActiveBytes));
        assert_eq!(m.largest_free, a.largest_free_block());
        let segments = |l| st.get(Family::Segment, l).current as usize;
        assert_eq!(m.large_segments, segments(Level::Large));
        assert_eq!(m.small_segments, segments(Level::Small));
        assert_eq!(m.cached_free, m.reserved - m.active);
    }
}
