//! The state at one moment, in the fields of PyTorch's `_snapshot()["segments"]`
//! (allocator.md §13.2). Expandable reservations appear as one segment per
//! maximal run of mapped blocks.

use super::block::{BlockId, NIL};
use super::caching::{CachingAllocator, SegmentSlot};
use super::rounding::Pool;
use super::Tag;
use crate::device::Device;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockState {
    ActiveAllocated,
    ActivePendingFree,
    Inactive,
}

impl BlockState {
    /// Counts toward `active_size`.
    pub fn is_active(self) -> bool {
        self != BlockState::Inactive
    }

    /// PyTorch's spelling (as in the files; the docstring says `active_awaiting_free`).
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
    /// The allocation's tag; free blocks drop theirs, as PyTorch drops frames.
    pub tag: Tag,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub device: u32,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: u64,
    pub pool: Pool,
    pub is_expandable: bool,
    /// Tag of the request that created the segment (its `frames`).
    pub tag: Tag,
    pub blocks: Vec<BlockInfo>,
}

impl<D: Device> CachingAllocator<D> {
    /// `torch.cuda.memory_snapshot()`: every segment, sorted by address.
    pub fn snapshot(&self) -> Vec<SegmentInfo> {
        let mut out = Vec::new();
        for slot in &self.segments {
            match slot {
                SegmentSlot::Plain(s) => {
                    out.push(self.segment_info(s.head, s.addr, s.stream, s.pool, false, s.tag));
                }
                SegmentSlot::Expandable(r) => {
                    self.expandable_segments(r.head, r.stream, r.pool, r.tag, &mut out)
                }
                SegmentSlot::Vacant => {}
            }
        }
        out.sort_by_key(|s| s.address);
        out
    }

    fn expandable_segments(
        &self,
        head: BlockId,
        stream: u64,
        pool: Pool,
        tag: Tag,
        out: &mut Vec<SegmentInfo>,
    ) {
        let mut id = head;
        while id != NIL {
            let b = self.blocks.get(id);
            if b.mapped {
                let seg = self.segment_info(id, b.addr, stream, pool, true, tag);
                let end = seg.address + seg.total_size;
                out.push(seg);
                while id != NIL && self.blocks.get(id).addr < end {
                    id = self.blocks.get(id).next;
                }
            } else {
                id = b.next;
            }
        }
    }

    /// Blocks from `first` while they are mapped (a plain segment is all mapped).
    fn segment_info(
        &self,
        first: BlockId,
        addr: u64,
        stream: u64,
        pool: Pool,
        expandable: bool,
        tag: Tag,
    ) -> SegmentInfo {
        let mut seg = SegmentInfo {
            device: self.device_index,
            address: addr,
            total_size: 0,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream,
            pool,
            is_expandable: expandable,
            tag,
            blocks: Vec::new(),
        };
        let mut id = first;
        while let Some(b) = self.blocks.opt(id).filter(|b| b.mapped) {
            let state = if b.allocated {
                BlockState::ActiveAllocated
            } else if b.event_count > 0 || b.has_stream_uses {
                BlockState::ActivePendingFree
            } else {
                BlockState::Inactive
            };
            seg.total_size += b.size;
            if state == BlockState::ActiveAllocated {
                seg.allocated_size += b.size;
            }
            if state != BlockState::Inactive {
                seg.active_size += b.size;
                seg.requested_size += b.requested;
            }
            seg.blocks.push(BlockInfo {
                address: b.addr,
                size: b.size,
                requested_size: b.requested,
                state,
                tag: if state == BlockState::Inactive {
                    Tag::NONE
                } else {
                    b.tag
                },
            });
            id = b.next;
        }
        seg
    }

    /// The largest free (inactive) block, in bytes.
    pub fn largest_free_block(&self) -> u64 {
        self.free_sets
            .iter()
            .map(|s| s.largest())
            .max()
            .unwrap_or(0)
    }

    /// Number of free (inactive, mapped) blocks.
    pub fn free_block_count(&self) -> usize {
        self.free_sets.iter().map(|s| s.len()).sum()
    }
}
