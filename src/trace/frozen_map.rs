//! A map kept for later (a timeline's keyframes): its segments and blocks
//! in sorted arrays, 40 bytes a block where a B-tree takes about 60, made a
//! map again in one pass (trees build from sorted input without searching).

use std::collections::BTreeMap;

use super::memory_map::{MapBlock, MapSegment, MemoryMap};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FrozenMap {
    segments: Box<[(u64, MapSegment)]>,
    blocks: Box<[(u64, MapBlock)]>,
    unmapped: Box<[(u64, (u64, u64))]>,
    allocated: u64,
    reserved: u64,
    active: u64,
}

impl FrozenMap {
    pub fn freeze(map: &MemoryMap) -> FrozenMap {
        FrozenMap {
            segments: map.segments.iter().map(|(a, s)| (*a, s.clone())).collect(),
            blocks: map.blocks.iter().map(|(a, b)| (*a, *b)).collect(),
            unmapped: map.unmapped.iter().map(|(a, u)| (*a, *u)).collect(),
            allocated: map.allocated,
            reserved: map.reserved,
            active: map.active,
        }
    }

    /// A frozen map of parts already in address order.
    pub fn from_sorted(
        segments: Box<[(u64, MapSegment)]>,
        blocks: Box<[(u64, MapBlock)]>,
        unmapped: Box<[(u64, (u64, u64))]>,
        (allocated, reserved, active): (u64, u64, u64),
    ) -> FrozenMap {
        FrozenMap {
            segments,
            blocks,
            unmapped,
            allocated,
            reserved,
            active,
        }
    }

    pub fn thaw(&self) -> MemoryMap {
        MemoryMap {
            segments: self.segments.iter().cloned().collect::<BTreeMap<_, _>>(),
            blocks: self.blocks.iter().copied().collect(),
            unmapped: self.unmapped.iter().copied().collect(),
            allocated: self.allocated,
            reserved: self.reserved,
            active: self.active,
        }
    }

    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.segments)
            + std::mem::size_of_val(&*self.blocks)
            + std::mem::size_of_val(&*self.unmapped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::Tag;
    use crate::alloc::{AllocConfig, CachingAllocator};
    use crate::device::SimDevice;

    #[test]
    fn a_thawed_map_is_the_map_that_was_frozen() {
        let config = AllocConfig {
            expandable_segments: true,
            ..AllocConfig::default()
        };
        let mut a = CachingAllocator::new(SimDevice::new("sim", 1 << 30, 0), config);
        a.set_recording(true);
        let mut live = Vec::new();
        for i in 0..200u64 {
            let size = [700, 3 << 20, 300_000, 12 << 20][(i % 4) as usize] + i;
            live.push(a.malloc(size, 0, Tag(i)).expect("fits"));
        }
        for p in live.iter().step_by(3) {
            a.free(*p).expect("live");
        }
        a.empty_cache();
        let mut map = MemoryMap::default();
        for e in a.take_events() {
            map.apply(&e).expect("placeable");
        }
        assert!(map.blocks.len() > 100 && !map.segments.is_empty());
        assert!(FrozenMap::freeze(&map).thaw() == map);
        map.unmapped.insert(0x7000_0000, (2 << 20, 512));
        assert!(FrozenMap::freeze(&map).thaw() == map);
        assert!(FrozenMap::freeze(&MemoryMap::default()).thaw() == MemoryMap::default());
    }
}
