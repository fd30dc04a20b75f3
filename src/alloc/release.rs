//! Giving memory back to the device: `empty_cache`, the last-resort release,
//! oversize release and garbage collection (allocator.md §5.4, §5.5, §5.7, §7).

use super::block::BlockId;
use super::caching::CachingAllocator;
use super::event::{Action, AllocEvent};
use super::malloc::Request;
use super::rounding::Pool;
use super::stats::Family;
use crate::device::Device;

impl<D: Device> CachingAllocator<D> {
    /// `torch.cuda.empty_cache()`: release every whole free segment and unmap
    /// every whole free page, after waiting for pending frees.
    pub fn empty_cache(&mut self) {
        self.release_cached_blocks();
    }

    /// §5.5 `release_cached_blocks`.
    pub(crate) fn release_cached_blocks(&mut self) {
        self.synchronize_events();
        self.stats.num_sync_all_streams += 1;
        self.release_pool(Pool::Large);
        self.release_pool(Pool::Small);
    }

    fn release_pool(&mut self, pool: Pool) {
        let mut whole = Vec::new();
        let mut to_unmap = Vec::new();
        for e in self.free_sets[pool.index()].iter() {
            let (id, b) = (e.id, self.blocks.get(e.id));
            if b.expandable {
                to_unmap.push(id);
            } else if !b.is_split() {
                whole.push(id);
            }
        }
        for id in whole {
            self.release_block(id);
        }
        for id in to_unmap {
            self.unmap_block(id);
        }
    }

    /// `release_block`: cudaFree of a whole free segment.
    pub(crate) fn release_block(&mut self, id: BlockId) {
        self.remove_free(id);
        let b = self.blocks.get(id);
        let (addr, size, pool, stream, seg) = (b.addr, b.size, b.pool, b.stream, b.seg);
        let tag = match &self.segments[seg as usize] {
            super::caching::SegmentSlot::Plain(s) => s.tag,
            _ => super::Tag::NONE,
        };
        self.device.free(addr, size);
        self.stats.num_device_free += 1;
        self.emit(AllocEvent {
            action: Action::SegmentFree,
            addr,
            size,
            block_size: size,
            stream,
            pool,
            device_free: 0,
            tag,
        });
        self.reserved_total -= size;
        self.stats.decrease(Family::Segment, pool, 1);
        self.stats
            .decrease(Family::ReservedBytes, pool, size as i64);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.remove_segment(seg);
        self.blocks.remove(id);
    }

    /// §5.4 `release_available_cached_blocks`: only with `max_split_size` set;
    /// frees oversize cached blocks of the request's pool and stream.
    pub(crate) fn release_available_cached_blocks(&mut self, req: &Request) -> bool {
        if !self.config.max_split_limited() {
            return false;
        }
        let ms = self.config.max_split_size;
        let key = req.size.max(ms);
        let set = &self.free_sets[req.pool.index()];
        let single = set
            .from(req.stream, key)
            .map(|e| e.id)
            .find(|id| !self.blocks.get(*id).expandable);
        if let Some(id) = single {
            self.release_block(id);
            return true;
        }
        let mut chosen = Vec::new();
        let mut released = 0u64;
        for e in set.below(req.stream, key) {
            if released >= key || e.size < ms {
                break;
            }
            if !self.blocks.get(e.id).expandable {
                released += e.size;
                chosen.push(e.id);
            }
        }
        for id in chosen {
            self.release_block(id);
        }
        released >= key
    }

    /// §5.7 garbage collection: release the oldest whole cached large blocks
    /// until reserved memory is back under the threshold.
    pub(crate) fn garbage_collect(&mut self) {
        let Some(allowed) = self.allowed_max else {
            return;
        };
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.reserved_total <= threshold {
            return;
        }
        let target = self.reserved_total - threshold;
        let counter = self.gc_calls[Pool::Large.index()];
        let age =
            |b: &super::block::Block| u64::from((counter as u32).wrapping_sub(b.gc_count_base));
        let mut total_age = 0u64;
        let mut count = 0u64;
        for e in self.free_sets[Pool::Large.index()].iter() {
            let b = self.blocks.get(e.id);
            if !b.is_split() && !b.expandable {
                total_age += age(b);
                count += 1;
            }
        }
        let mut reclaimed = 0u64;
        let mut freed_any = true;
        while reclaimed < target && freed_any && count > 0 {
            let threshold_age = total_age as f64 / count as f64;
            freed_any = false;
            let victims: Vec<(BlockId, u64, u64)> = self.free_sets[Pool::Large.index()]
                .iter()
                .map(|e| (e.id, self.blocks.get(e.id)))
                .filter(|(_, b)| !b.is_split() && !b.expandable && age(b) as f64 >= threshold_age)
                .map(|(id, b)| (id, b.size, age(b)))
                .collect();
            for (id, size, block_age) in victims {
                freed_any = true;
                reclaimed += size;
                total_age -= block_age;
                count -= 1;
                self.release_block(id);
            }
        }
    }
}
