//! Where a GPU's driver puts each `cudaMalloc`: which segment sits below
//! which decides the caching allocator's ties between equal-size cached
//! blocks (`BlockComparatorSize`: stream, size, then address).
//!
//! [`Placement::H100Driver`] is a model of the virtual-address allocator of
//! the H100 captures' driver (580.159, CUDA 13.0), derived on half of the 97
//! captures' `segment_alloc` entries and checked on the other half
//! (docs/driver_addresses.md). It predicts the *order* of segments (93 pairs
//! of 100), not most addresses: the CUDA context, cuBLAS, cuDNN and lazily
//! loaded kernel modules also call the driver, unrecorded, and move them.
//! It is the H100 profile's default (90 of 95 traced captures exact, 69
//! in request order); two traced captures and four built-ins exact in
//! request order are not under it, each for a named cause.

use std::collections::BTreeMap;

const MIB: u64 = 1 << 20;
/// Every allocation is a whole number of 2 MiB pages.
const GRANULE: u64 = 2 * MIB;
/// A fresh range is reserved in multiples of 32 MiB; what the segment does
/// not use stays free for later, smaller ones (a 20 MiB segment's 12 MiB).
const CHUNK: u64 = 32 * MIB;
/// The range the context holds below its own allocations until the program
/// launches kernels (the captures: 414 MiB between the first small segment
/// and the first 32 MiB chunk), then filled from its bottom up.
const HELD_RANGE: u64 = 414 * MIB;
/// The first segment lies this far above the held range's top; the 2 MiB
/// page at that top is free (the captures' second segment, `X − 74 MiB`).
const FIRST_ABOVE: u64 = 74 * MIB;

/// How a simulated device lays out its segments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Placement {
    /// Each segment where the previous one ended (no driver measured).
    #[default]
    InOrder,
    /// The H100 driver's rule ([`DriverVa`]).
    H100Driver,
}

/// The driver's address space as the model sees it: the first segment at
/// the top, ranges reserved top down in [`CHUNK`] multiples below the held
/// range, free ranges filled lowest address first, freed segments' ranges
/// free again; when the program's kernels start, the driver's own code takes
/// what is free and the held range opens.
#[derive(Debug, Clone)]
pub struct DriverVa {
    /// Free ranges: start → length (disjoint, never adjacent).
    free: BTreeMap<u64, u64>,
    /// The lowest address reserved so far: the next range ends here.
    floor: u64,
    /// The range the context holds until [`DriverVa::kernels_started`].
    held: Option<(u64, u64)>,
    /// The held range's top: the first segment lies [`FIRST_ABOVE`] higher.
    top: u64,
    /// Whether the first segment has gone (to `top + FIRST_ABOVE`).
    first_placed: bool,
}

impl DriverVa {
    /// An address space whose held range ends at `top`.
    pub fn new(top: u64) -> DriverVa {
        let floor = top - HELD_RANGE;
        DriverVa {
            free: BTreeMap::from([(top, GRANULE)]),
            floor,
            held: Some((floor, HELD_RANGE)),
            top,
            first_placed: false,
        }
    }

    /// The program launched its first kernel: the kernel modules the driver
    /// loads lazily (and cuBLAS's, cuDNN's) take every free range (in the
    /// captures no later segment lands in one), and the held range opens.
    pub fn kernels_started(&mut self) {
        if let Some((start, len)) = self.held.take() {
            self.free.clear();
            self.give_back(start, len);
        }
    }

    /// The address of a new segment of `size` bytes.
    pub fn malloc(&mut self, size: u64) -> u64 {
        if !self.first_placed {
            self.first_placed = true;
            return self.top + FIRST_ABOVE;
        }
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

    /// A segment's range is free again (the first segment's, above the
    /// held range, is not modelled as reusable).
    pub fn free(&mut self, addr: u64, size: u64) {
        if addr < self.top + FIRST_ABOVE {
            self.give_back(addr, size.div_ceil(GRANULE) * GRANULE);
        }
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

    const TOP: u64 = 1 << 40;

    #[test]
    fn before_kernels_segments_go_below_the_held_range() {
        let mut va = DriverVa::new(TOP);
        let first = va.malloc(16 * MIB);
        let small = va.malloc(2 * MIB);
        let twenty = va.malloc(20 * MIB);
        let tail = va.malloc(2 * MIB);
        assert_eq!(first, TOP + FIRST_ABOVE, "the first segment on top");
        assert_eq!(small, TOP, "the 2 MiB page at the held range's top");
        assert_eq!(
            twenty,
            TOP - HELD_RANGE - CHUNK,
            "a chunk below the held range"
        );
        assert_eq!(tail, twenty + 20 * MIB, "the chunk's tail");
    }

    #[test]
    fn kernels_open_the_held_range_and_take_what_is_free() {
        let mut va = DriverVa::new(TOP);
        va.malloc(16 * MIB);
        let twenty = va.malloc(20 * MIB);
        va.kernels_started();
        let next = va.malloc(2 * MIB);
        assert_eq!(
            next,
            TOP - HELD_RANGE,
            "the held range's bottom, not the 12 MiB tail of {twenty:#x}"
        );
        let big = va.malloc(HELD_RANGE);
        assert_eq!(big, twenty - CHUNK * 13, "past the range, 13 chunks below");
        va.kernels_started();
        assert_eq!(
            va.malloc(2 * MIB),
            big + HELD_RANGE,
            "the 2 MiB left of the 416 MiB reserved: a second call takes nothing"
        );
    }

    #[test]
    fn a_freed_range_is_reused_and_merged() {
        let mut va = DriverVa::new(TOP);
        va.malloc(2 * MIB);
        va.kernels_started();
        let a = va.malloc(64 * MIB);
        let b = va.malloc(64 * MIB);
        va.free(a, 64 * MIB);
        va.free(b, 64 * MIB);
        assert_eq!(va.malloc(128 * MIB), a, "the two ranges are one again");
    }
}
