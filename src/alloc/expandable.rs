//! Expandable segments: reservations that grow and shrink page by page
//! (allocator.md §8).

use super::block::{Block, BlockId, NIL};
use super::caching::{CachingAllocator, Reservation, SegmentSlot};
use super::constants::SMALL_BUFFER;
use super::event::{Action, AllocEvent};
use super::malloc::Request;
use super::rounding::Pool;
use super::stats::Family;
use crate::device::Device;

impl<D: Device> CachingAllocator<D> {
    fn page_size(&self, pool: Pool) -> u64 {
        match pool {
            Pool::Small => SMALL_BUFFER,
            Pool::Large => self.config.large_segment_size,
        }
    }

    /// §8.2: find room (free + unmapped) for `S` bytes and map what is missing.
    pub(crate) fn try_allocate_expandable(&mut self, req: &Request) -> Option<BlockId> {
        let mut candidate = self.find_expandable_block(req)?;
        let c = self.blocks.get(candidate);
        if !c.mapped {
            let len = c.size.min(req.size);
            candidate = self.map_block(candidate, len)?;
        }
        while self.blocks.get(candidate).size < req.size {
            let c = self.blocks.get(candidate);
            let remaining = req.size - c.size;
            let next = c.next;
            // `has_room` saw the room; past the reservation's end there is none.
            let len = remaining.min(self.blocks.opt(next)?.size);
            candidate = self.map_block(next, len)?;
        }
        self.remove_free(candidate);
        Some(candidate)
    }

    fn find_expandable_block(&mut self, req: &Request) -> Option<BlockId> {
        let usable = |a: &Self, id: BlockId| a.blocks.opt(id).is_some_and(|b| b.is_free());
        let has_room = |a: &Self, mut id: BlockId| {
            let mut bytes = 0u64;
            while bytes < req.size && usable(a, id) {
                bytes += a.blocks.get(id).size;
                id = a.blocks.get(id).next;
            }
            bytes >= req.size
        };
        let found = self.unmapped[req.pool.index()]
            .of_stream(req.stream)
            .find_map(|u| {
                let prev = self.blocks.get(u).prev;
                let c = if usable(self, prev) { prev } else { u };
                has_room(self, c).then_some(c)
            });
        if found.is_some() {
            return found;
        }
        let total = self.device.total_memory();
        let page = self.page_size(req.pool);
        let size = (total + total / 8).div_ceil(page) * page;
        if size < req.size {
            // A reservation the request cannot fit in (a device of 0 bytes):
            // nothing to map, an OOM.
            return None;
        }
        let base = self.device.reserve(size).ok()?;
        let seg = self.add_segment(SegmentSlot::Expandable(Reservation {
            base,
            size,
            page,
            pool: req.pool,
            stream: req.stream,
            head: NIL,
            tag: req.tag,
        }));
        let mut block = Block::new(base, size, req.stream, req.pool, seg);
        block.mapped = false;
        block.expandable = true;
        let id = self.new_block(block);
        self.fix_head(id);
        self.insert_unmapped(id);
        Some(id)
    }

    fn reservation(&self, id: BlockId) -> &Reservation {
        match &self.segments[self.blocks.get(id).seg as usize] {
            SegmentSlot::Expandable(r) => r,
            // Expandable blocks always point at their reservation.
            _ => unreachable!("expandable block outside a reservation"),
        }
    }

    /// Map whole pages covering the first `len` bytes of the unmapped block
    /// `id`; returns the mapped block after merging with free neighbours.
    fn map_block(&mut self, id: BlockId, len: u64) -> Option<BlockId> {
        let r = self.reservation(id);
        let (base, page) = (r.base, r.page);
        let b = self.blocks.get(id);
        let (addr, size, stream, pool, seg, next) =
            (b.addr, b.size, b.stream, b.pool, b.seg, b.next);
        let begin = (addr - base) / page;
        let end = (addr + len - base).div_ceil(page);
        let mapped = (end - begin) * page;
        if mapped == 0 {
            return Some(id);
        }
        self.device.map(addr, mapped).ok()?;
        self.remove_unmapped(id);
        self.blocks.get_mut(id).mapped = true;
        if mapped < size {
            let mut rest = Block::new(addr + mapped, size - mapped, stream, pool, seg);
            rest.mapped = false;
            rest.expandable = true;
            let rest = self.new_block(rest);
            self.splice(rest, id, next);
            self.insert_unmapped(rest);
            self.blocks.get_mut(id).size = mapped;
        }
        let prev = self.blocks.get(id).prev;
        self.try_merge(id, prev);
        let next = self.blocks.get(id).next;
        self.try_merge(id, next);
        self.insert_free(id);
        self.reserved_total += mapped;
        self.stats
            .increase(Family::ReservedBytes, pool, mapped as i64);
        self.stats.num_device_alloc += 1;
        let tag = self.reservation(id).tag;
        self.emit(AllocEvent {
            action: Action::SegmentMap,
            addr,
            size: mapped,
            block_size: mapped,
            stream,
            pool,
            device_free: 0,
            tag,
        });
        Some(id)
    }

    /// §8.4: unmap the whole pages inside the free block `id`; destroy the
    /// reservation when nothing of it stays mapped.
    pub(crate) fn unmap_block(&mut self, id: BlockId) {
        let r = self.reservation(id);
        let (base, page, seg) = (r.base, r.page, self.blocks.get(id).seg);
        let b = self.blocks.get(id);
        let (addr, size, stream, pool, prev, next) =
            (b.addr, b.size, b.stream, b.pool, b.prev, b.next);
        let first = (addr - base).div_ceil(page);
        let last = (addr + size - base) / page;
        if first >= last {
            return;
        }
        let start = base + first * page;
        let len = (last - first) * page;
        self.remove_free(id);
        self.device.unmap(start, len);
        if start > addr {
            let mut head = Block::new(addr, start - addr, stream, pool, seg);
            head.expandable = true;
            let head = self.new_block(head);
            self.splice(head, prev, id);
            self.insert_free(head);
        }
        if addr + size > start + len {
            let mut tail = Block::new(start + len, addr + size - start - len, stream, pool, seg);
            tail.expandable = true;
            let tail = self.new_block(tail);
            self.splice(tail, id, next);
            self.insert_free(tail);
        }
        {
            let b = self.blocks.get_mut(id);
            b.addr = start;
            b.size = len;
            b.mapped = false;
        }
        let prev = self.blocks.get(id).prev;
        self.try_merge(id, prev);
        let next = self.blocks.get(id).next;
        self.try_merge(id, next);
        self.insert_unmapped(id);
        self.reserved_total -= len;
        self.stats.decrease(Family::ReservedBytes, pool, len as i64);
        self.stats.num_device_free += 1;
        let tag = self.reservation(id).tag;
        self.emit(AllocEvent {
            action: Action::SegmentUnmap,
            addr: start,
            size: len,
            block_size: len,
            stream,
            pool,
            device_free: 0,
            tag,
        });
        if !self.blocks.get(id).is_split() {
            self.release_reservation(id);
        }
    }

    fn release_reservation(&mut self, id: BlockId) {
        let r = self.reservation(id);
        let (base, size, seg) = (r.base, r.size, self.blocks.get(id).seg);
        self.remove_unmapped(id);
        self.device.release_reservation(base, size);
        self.remove_segment(seg);
        self.blocks.remove(id);
    }
}
