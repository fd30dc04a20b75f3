//! Where a GPU's driver puts each `cudaMalloc`: which segment sits below
//! which decides the caching allocator's ties between equal-size cached
//! blocks (`BlockComparatorSize`: stream, size, then address).
//!
//! [`Placement::H100Driver`] is a model of the virtual-address allocator of
//! the H100 captures' driver (580.159, CUDA 13.0), derived on half of the 97
//! captures' `segment_alloc` entries and checked on the other half
//! (docs/driver_addresses.md). It predicts the *order* of segments (nine
//! pairs of ten), not their addresses: the CUDA context, cuBLAS, cuDNN and
//! lazily loaded kernel modules also call the driver, unrecorded, and move
//! the addresses. It is not the H100 profile's default: two captures exact
//! in request order are not under it.

use std::collections::BTreeMap;

const MIB: u64 = 1 << 20;
/// Every allocation is a whole number of 2 MiB pages.
const GRANULE: u64 = 2 * MIB;
/// A fresh range is reserved in multiples of 32 MiB; what the segment does
/// not use stays free for later, smaller ones (a 20 MiB segment's 12 MiB).
const CHUNK: u64 = 32 * MIB;
/// The free range the context leaves below its own allocations, which the
/// first segments fill from its bottom up (the captures: 414 MiB between
/// the first small segment and the chunks below, plus one chunk).
const FIRST_RANGE: u64 = 446 * MIB;

/// How a simulated device lays out its segments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Placement {
    /// Each segment where the previous one ended (no driver measured).
    #[default]
    InOrder,
    /// The H100 driver's rule ([`DriverVa`]).
    H100Driver,
}

/// The driver's address space as the model sees it: ranges reserved top
/// down in [`CHUNK`] multiples, free ranges inside them filled lowest
/// address first, freed segments' ranges free again.
#[derive(Debug, Clone)]
pub struct DriverVa {
    /// Free ranges: start → length (disjoint, never adjacent).
    free: BTreeMap<u64, u64>,
    /// The lowest address reserved so far: the next range ends here.
    floor: u64,
}

impl DriverVa {
    /// An address space whose first range ends at `top`.
    pub fn new(top: u64) -> DriverVa {
        let floor = top - FIRST_RANGE;
        DriverVa {
            free: BTreeMap::from([(floor, FIRST_RANGE)]),
            floor,
        }
    }

    /// The address of a new segment of `size` bytes.
    pub fn malloc(&mut self, size: u64) -> u64 {
        let size = size.div_ceil(GRANULE) * GRANULE;
        let fit = self
            .free
            .iter()
            .find(|(_, &len)| len >= size)
            .map(|(&start, &len)| (start, len));
        if let Some((start, len)) = fit {
            self.free.remove(&start);
            if len > size {
                self.free.insert(start + size, len - size);
            }
            return start;
        }
        let reserved = size.div_ceil(CHUNK) * CHUNK;
        self.floor = self.floor.saturating_sub(reserved);
        if reserved > size {
            self.give_back(self.floor + size, reserved - size);
        }
        self.floor
    }

    /// A segment's range is free again.
    pub fn free(&mut self, addr: u64, size: u64) {
        self.give_back(addr, size.div_ceil(GRANULE) * GRANULE);
    }

    fn give_back(&mut self, addr: u64, size: u64) {
        let (mut start, mut len) = (addr, size);
        if let Some((&s, &l)) = self.free.range(..addr).next_back() {
            if s + l == addr {
                self.free.remove(&s);
                start = s;
                len += l;
            }
        }
        if let Some(l) = self.free.remove(&(addr + size)) {
            len += l;
        }
        self.free.insert(start, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_range_fills_from_its_bottom_up() {
        let mut va = DriverVa::new(1 << 40);
        let a = va.malloc(20 * MIB);
        let b = va.malloc(2 * MIB);
        assert_eq!(a, (1 << 40) - FIRST_RANGE);
        assert_eq!(b, a + 20 * MIB);
    }

    #[test]
    fn past_the_first_range_chunks_go_down_and_their_tails_are_filled() {
        let mut va = DriverVa::new(1 << 40);
        let first = va.malloc(FIRST_RANGE);
        let twenty = va.malloc(20 * MIB);
        let next = va.malloc(24 * MIB);
        assert_eq!(twenty, first - CHUNK);
        assert_eq!(
            next,
            twenty - CHUNK,
            "a 24 MiB segment does not fit the 12 MiB tail"
        );
        let small = va.malloc(2 * MIB);
        assert_eq!(small, next + 24 * MIB, "the lowest free range that fits");
        let big = va.malloc(100 * MIB);
        assert_eq!(big, next - 128 * MIB, "100 MiB reserves four chunks");
    }

    #[test]
    fn a_freed_range_is_reused_and_merged() {
        let mut va = DriverVa::new(1 << 40);
        let a = va.malloc(64 * MIB);
        let b = va.malloc(64 * MIB);
        va.free(a, 64 * MIB);
        va.free(b, 64 * MIB);
        assert_eq!(va.malloc(128 * MIB), a, "the two ranges are one again");
    }
}
