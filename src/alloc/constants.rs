//! Numbers from PyTorch's `CUDACachingAllocator.cpp` (allocator.md §2.1).

/// Every block size is a multiple of this; also the smallest block.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest rounded size served by the small pool.
pub const SMALL_SIZE: u64 = 1_048_576;
/// Size of every small-pool segment and of a small expandable page.
pub const SMALL_BUFFER: u64 = 2_097_152;
/// Segment size for rounded sizes in (1 MiB, 10 MiB); the large expandable page;
/// the default oversize tolerance. Configurable from 2.12 as `large_segment_size_mb`.
pub const LARGE_BUFFER: u64 = 20_971_520;
/// Rounded sizes at or above this get a segment of their own, rounded to 2 MiB.
pub const MIN_LARGE_ALLOC: u64 = 10_485_760;
/// Rounding unit of large segments.
pub const ROUND_LARGE: u64 = 2_097_152;
/// Power-of-two intervals of `roundup_power2_divisions`, from 1 MiB up.
pub const ROUNDUP_INTERVALS: usize = 16;
/// Requests at or above this fail at once: "Tried to allocate more than 1EB memory." (§5.6).
pub const MAX_REQUEST: u64 = 1 << 60;
pub const MIB: u64 = 1_048_576;
pub const GIB: u64 = 1 << 30;
