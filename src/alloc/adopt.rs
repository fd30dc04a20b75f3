//! Seeding the allocator with memory that existed before a trace started
//! (open traces): whole segments with their blocks, counted in every stat as
//! if the allocator had made them.

use super::block::{Block, NIL};
use super::caching::{CachingAllocator, Segment, SegmentSlot};
use super::constants::MAX_REQUEST;
use super::free::REPLAY_PENDING_STREAM;
use super::rounding::Pool;
use super::snapshot::BlockState;
use super::stats::Family;
use super::Tag;
use crate::device::Device;

/// One block of an adopted segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdoptBlock {
    pub size: u64,
    pub requested: u64,
    pub state: BlockState,
    pub tag: Tag,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdoptError {
    #[error("segment {addr:#x}: blocks add up to {blocks} bytes, the segment has {size}")]
    Tiling { addr: u64, size: u64, blocks: u64 },
    #[error("segment {addr:#x}: two free blocks side by side at {at:#x}")]
    AdjacentFree { addr: u64, at: u64 },
    #[error("segment {addr:#x}: a block of 0 bytes at {at:#x}")]
    EmptyBlock { addr: u64, at: u64 },
    #[error("segment {addr:#x} overlaps memory the allocator already holds")]
    Overlap { addr: u64 },
    #[error("segment {addr:#x}: the block at {at:#x} asked for more than it holds")]
    Requested { addr: u64, at: u64 },
    #[error("segment {addr:#x}: larger than any segment, or past the end of the address space")]
    TooLarge { addr: u64 },
}

impl<D: Device> CachingAllocator<D> {
    /// Take over a plain segment at `addr` whose blocks (in address order) tile it.
    pub fn adopt_segment(
        &mut self,
        addr: u64,
        pool: Pool,
        stream: u64,
        blocks: &[AdoptBlock],
    ) -> Result<(), AdoptError> {
        // Sizes come from a file: no device holds more than a request may
        // be (the stats are i64), and no segment ends past the address space.
        let size = blocks
            .iter()
            .try_fold(0u64, |sum, b| sum.checked_add(b.size))
            .filter(|s| {
                self.reserved_total.saturating_add(*s) <= MAX_REQUEST
                    && addr.checked_add(*s).is_some()
            })
            .ok_or(AdoptError::TooLarge { addr })?;
        if blocks.is_empty() || size == 0 {
            return Err(AdoptError::Tiling {
                addr,
                size,
                blocks: 0,
            });
        }
        if self.active.contains(addr, &self.blocks)
            || self
                .snapshot()
                .iter()
                .any(|s| addr < s.address + s.total_size && s.address < addr + size)
        {
            return Err(AdoptError::Overlap { addr });
        }
        let mut at = addr;
        for b in blocks {
            if b.size == 0 {
                // Two blocks would start at one address.
                return Err(AdoptError::EmptyBlock { addr, at });
            }
            if b.state.is_active() && b.requested > b.size {
                return Err(AdoptError::Requested { addr, at });
            }
            at += b.size;
        }
        let mut at = addr;
        for pair in blocks.windows(2) {
            at += pair[0].size;
            if pair[0].state == BlockState::Inactive && pair[1].state == BlockState::Inactive {
                return Err(AdoptError::AdjacentFree { addr, at });
            }
        }
        let seg = self.add_segment(SegmentSlot::Plain(Segment {
            addr,
            pool,
            stream,
            head: NIL,
            tag: Tag::NONE,
        }));
        self.reserved_total += size;
        self.stats.increase(Family::Segment, pool, 1);
        self.stats
            .increase(Family::ReservedBytes, pool, size as i64);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        let split = blocks.len() > 1;
        let mut prev = NIL;
        let mut at = addr;
        for b in blocks {
            let mut block = Block::new(at, b.size, stream, pool, seg);
            block.requested = b.requested;
            block.tag = b.tag;
            let id = self.new_block(block);
            self.splice(id, prev, NIL);
            match b.state {
                BlockState::Inactive => {
                    self.insert_free(id);
                    if split {
                        self.stats.increase(Family::InactiveSplit, pool, 1);
                        self.stats
                            .increase(Family::InactiveSplitBytes, pool, b.size as i64);
                    }
                }
                BlockState::ActiveAllocated | BlockState::ActivePendingFree => {
                    self.active.insert(at, id);
                    self.stats.increase(Family::Active, pool, 1);
                    self.stats
                        .increase(Family::ActiveBytes, pool, b.size as i64);
                    self.stats
                        .increase(Family::RequestedBytes, pool, b.requested as i64);
                    if b.state == BlockState::ActiveAllocated {
                        self.blocks.get_mut(id).allocated = true;
                        self.stats.increase(Family::Allocation, pool, 1);
                        self.stats
                            .increase(Family::AllocatedBytes, pool, b.size as i64);
                        if b.size >= self.config.max_split_size {
                            self.stats.oversize_allocations.increase(1);
                        }
                    } else {
                        // Held until a replayed `free_completed` releases it.
                        self.blocks.get_mut(id).event_count = 1;
                        self.pending
                            .queues
                            .entry(REPLAY_PENDING_STREAM)
                            .or_default()
                            .push_back((id, false));
                    }
                }
            }
            prev = id;
            at += b.size;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{AdoptBlock, AdoptError};
    use crate::alloc::{AllocConfig, BlockState, CachingAllocator, Pool, Tag};
    use crate::device::SimDevice;

    fn block(size: u64, state: BlockState) -> AdoptBlock {
        AdoptBlock {
            size,
            requested: size,
            state,
            tag: Tag::NONE,
        }
    }

    fn allocator() -> CachingAllocator<SimDevice> {
        CachingAllocator::new(SimDevice::new("sim", 1 << 34, 0), AllocConfig::default())
    }

    #[test]
    fn a_zero_byte_block_is_refused_and_nothing_is_adopted() {
        let mut a = allocator();
        let blocks = [
            block(1 << 20, BlockState::ActiveAllocated),
            block(0, BlockState::ActiveAllocated),
            block(1 << 20, BlockState::Inactive),
        ];
        let addr = 0x7000_0000_0000;
        assert_eq!(
            a.adopt_segment(addr, Pool::Large, 0, &blocks),
            Err(AdoptError::EmptyBlock {
                addr,
                at: addr + (1 << 20)
            })
        );
        assert!(a.snapshot().is_empty());
        assert_eq!(a.active_blocks(), 0);
    }

    #[test]
    fn adopted_allocations_are_freed_by_address() {
        let mut a = allocator();
        let addr = 0x7000_0000_0000;
        let blocks = [
            block(1 << 20, BlockState::ActiveAllocated),
            block(1 << 20, BlockState::Inactive),
            block(2 << 20, BlockState::ActiveAllocated),
        ];
        a.adopt_segment(addr, Pool::Large, 0, &blocks)
            .expect("tiles");
        assert_eq!(a.active_blocks(), 2);
        a.free(addr + (2 << 20)).expect("adopted block");
        a.free(addr).expect("adopted block");
        assert_eq!(a.active_blocks(), 0);
        assert_eq!(a.stats().allocated_bytes(), 0);
        // Freed and merged: the whole segment is one free block again.
        assert_eq!(a.free_block_count(), 1);
        assert!(a.free(addr).is_err());
    }
}
