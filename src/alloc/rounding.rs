//! Request rounding, pool choice and segment size (allocator.md §2.2–2.4).

use super::config::AllocConfig;
use super::constants::{
    MIN_BLOCK_SIZE, MIN_LARGE_ALLOC, ROUNDUP_INTERVALS, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE,
};

/// Which of the two per-device pools a block lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pool {
    Small,
    Large,
}

impl Pool {
    pub fn for_size(rounded: u64) -> Pool {
        if rounded <= SMALL_SIZE {
            Pool::Small
        } else {
            Pool::Large
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Pool::Small => "small",
            Pool::Large => "large",
        }
    }
    pub(crate) fn index(self) -> usize {
        match self {
            Pool::Small => 0,
            Pool::Large => 1,
        }
    }
}

pub fn ceil_to(x: u64, m: u64) -> u64 {
    x.div_ceil(m) * m
}

/// §2.3: interval index = floor(log2(R)) − 20, clamped to [0, 15].
#[inline]
pub fn division_index(size: u64) -> usize {
    let log2 = 63 - u64::from(size.max(1).leading_zeros());
    (log2.saturating_sub(20) as usize).min(ROUNDUP_INTERVALS - 1)
}

/// §2.2 `round_size(R)`.
#[inline]
pub fn round_size(size: u64, config: &AllocConfig) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let divisions = config.roundup_power2_divisions[division_index(size)];
    if divisions > 1 && size > MIN_BLOCK_SIZE * divisions {
        next_division(size, divisions)
    } else {
        ceil_to(size, MIN_BLOCK_SIZE)
    }
}

fn next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor / divisions;
    if step == 0 {
        return floor * 2;
    }
    if size.is_multiple_of(step) {
        size
    } else {
        (size / step) * step + step
    }
}

/// §2.4 `alloc_size(S)`: the size of a new segment for a rounded request.
pub fn alloc_size(rounded: u64, large_segment_size: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        large_segment_size
    } else {
        ceil_to(rounded, ROUND_LARGE)
    }
}
