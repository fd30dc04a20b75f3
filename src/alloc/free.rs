//! Free, record_stream and deferred frees (allocator.md §4.3, §6).

use super::active::Found;
use super::block::{BlockId, NIL};
use super::caching::CachingAllocator;
use super::error::AllocError;
use super::event::{Action, AllocEvent};
use crate::device::Device;

/// The stream a replay uses to hold a block pending until its `free_completed`.
pub const REPLAY_PENDING_STREAM: u64 = u64::MAX;

impl<D: Device> CachingAllocator<D> {
    /// `free(ptr)`: give the block back; it becomes free now, or once its
    /// cross-stream uses complete.
    pub fn free(&mut self, addr: u64) -> Result<(), AllocError> {
        let found = self.allocated_block(addr)?;
        let id = found.id;
        let b = self.blocks.get_mut(id);
        b.allocated = false;
        let (size, pool, requested, stream, tag) = (b.size, b.pool, b.requested, b.stream, b.tag);
        let uses = if std::mem::take(&mut b.has_stream_uses) {
            self.stream_uses.remove(&id).unwrap_or_default()
        } else {
            Vec::new()
        };
        self.stats.on_free_requested(pool, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        self.emit(AllocEvent {
            action: Action::FreeRequested,
            addr,
            size: requested,
            block_size: size,
            stream,
            pool,
            device_free: 0,
            tag,
        });
        if uses.is_empty() {
            self.free_found_block(found);
        } else {
            self.blocks.get_mut(id).event_count = uses.len() as u16;
            for s in uses {
                self.pending
                    .queues
                    .entry(s)
                    .or_default()
                    .push_back((id, false));
            }
        }
        Ok(())
    }

    /// `tensor.record_stream(s)`: the block may not be reused until work queued
    /// on `s` at free time has finished (§6.3).
    pub fn record_stream(&mut self, addr: u64, stream: u64) -> Result<(), AllocError> {
        let id = self.allocated_block(addr)?.id;
        let b = self.blocks.get_mut(id);
        if stream != b.stream {
            b.has_stream_uses = true;
            let uses = self.stream_uses.entry(id).or_default();
            if !uses.contains(&stream) {
                uses.push(stream);
            }
        }
        Ok(())
    }

    /// The GPU finished everything queued on `stream` so far. PyTorch notices at
    /// the next `malloc` or `empty_cache`, not now.
    pub fn complete_stream(&mut self, stream: u64) {
        if let Some(queue) = self.pending.queues.get_mut(&stream) {
            queue.iter_mut().for_each(|e| e.1 = true);
        }
    }

    /// Blocks whose frees wait on stream events (PyTorch's `active_pending_free`).
    pub fn pending_frees(&self) -> usize {
        self.pending.queues.values().map(|q| q.len()).sum()
    }

    /// Replay: `free_requested` without `free_completed` yet.
    pub fn free_deferred(&mut self, addr: u64) -> Result<(), AllocError> {
        self.record_stream(addr, REPLAY_PENDING_STREAM)?;
        self.free(addr)
    }

    /// Replay: the `free_completed` of a block freed with [`Self::free_deferred`].
    pub fn complete_deferred(&mut self, addr: u64) -> Result<(), AllocError> {
        let Some(id) = self.active.get(addr, &self.blocks) else {
            return Err(AllocError::UnknownAddress { addr });
        };
        if self.blocks.get(id).allocated {
            return Err(AllocError::UnknownAddress { addr });
        }
        for queue in self.pending.queues.values_mut() {
            queue.retain(|e| e.0 != id);
        }
        self.blocks.get_mut(id).event_count = 0;
        self.free_block(id);
        Ok(())
    }

    fn allocated_block(&self, addr: u64) -> Result<Found, AllocError> {
        match self.active.find(addr, &self.blocks) {
            Some(found) if self.blocks.get(found.id).allocated => Ok(found),
            Some(_) => Err(AllocError::PendingFree { addr }),
            None if self.is_free_block_start(addr) => Err(AllocError::DoubleFree { addr }),
            None => Err(AllocError::UnknownAddress { addr }),
        }
    }

    fn is_free_block_start(&self, addr: u64) -> bool {
        self.free_sets
            .iter()
            .any(|set| set.iter().any(|e| e.addr == addr))
    }

    /// §6.3 process_events: at the start of every malloc, finished events free
    /// their blocks, per stream in recording order up to the first unfinished one.
    pub(crate) fn process_events(&mut self) {
        if self.pending.queues.is_empty() {
            return;
        }
        let mut done = Vec::new();
        for queue in self.pending.queues.values_mut() {
            while let Some(&(id, true)) = queue.front() {
                queue.pop_front();
                done.push(id);
            }
        }
        self.pending.queues.retain(|_, q| !q.is_empty());
        self.finish_events(done);
    }

    /// §5.5 step 1: wait for every outstanding event, in queue order.
    pub(crate) fn synchronize_events(&mut self) {
        let queues = std::mem::take(&mut self.pending.queues);
        let done = queues.into_values().flatten().map(|(id, _)| id).collect();
        self.finish_events(done);
    }

    fn finish_events(&mut self, done: Vec<BlockId>) {
        for id in done {
            let b = self.blocks.get_mut(id);
            b.event_count = b.event_count.saturating_sub(1);
            if b.event_count == 0 {
                self.free_block(id);
            }
        }
    }

    /// §6.2 `free_block` for a block in the active set.
    pub(crate) fn free_block(&mut self, id: BlockId) {
        let addr = self.blocks.get(id).addr;
        match self.active.find(addr, &self.blocks) {
            Some(found) => self.free_found_block(found),
            None => debug_assert!(false, "freeing block {id} not in the active set"),
        }
    }

    /// §6.2 `free_block`: merge with free neighbours and return to the free
    /// set; `found` is the block's active-set entry.
    #[inline]
    fn free_found_block(&mut self, found: Found) {
        let id = found.id;
        let b = self.blocks.get(id);
        let (addr, original_size, requested, pool, stream, expandable, tag, prev, next) = (
            b.addr,
            b.size,
            b.requested,
            b.pool,
            b.stream,
            b.expandable,
            b.tag,
            b.prev,
            b.next,
        );
        self.emit(AllocEvent {
            action: Action::FreeCompleted,
            addr,
            size: requested,
            block_size: original_size,
            stream,
            pool,
            device_free: 0,
            tag,
        });
        self.active.remove_at(found);
        self.blocks.get_mut(id).tag = super::Tag::NONE;
        // Both neighbours are judged before either merges (neither merge
        // changes the other's answer): their two loads, often cache misses,
        // then overlap instead of waiting on each other.
        let merge_prev = self.can_merge(id, prev);
        let merge_next = self.can_merge(id, next);
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        let (mut merged_addr, mut merged_size) = (addr, original_size);
        for (neighbour, merge) in [(prev, merge_prev), (next, merge_next)] {
            if merge {
                // `dst` is mapped (it was allocated), so a mergeable `src` is too.
                self.remove_free(neighbour);
                let absorbed = self.absorb(id, neighbour);
                net_blocks -= 1;
                net_bytes -= absorbed as i64;
                merged_size += absorbed;
                if neighbour == prev {
                    merged_addr -= absorbed;
                }
            }
        }
        self.insert_free_as(id, pool, stream, merged_size, merged_addr);
        if self.blocks.get(id).is_split() {
            net_blocks += 1;
            net_bytes += merged_size as i64;
        }
        if !expandable {
            self.stats
                .on_inactive_split_change(pool, net_blocks, net_bytes);
        }
        self.stats.on_free_completed(pool, original_size, requested);
    }

    /// §4.3 `try_merge_blocks`: `dst` absorbs `src` if it is free and equally
    /// mapped. Returns the absorbed size (0 when nothing merged).
    #[inline]
    pub(crate) fn try_merge(&mut self, dst: BlockId, src: BlockId) -> u64 {
        if !self.can_merge(dst, src) {
            return 0;
        }
        if self.blocks.get(src).mapped {
            self.remove_free(src);
        } else {
            self.remove_unmapped(src);
        }
        self.absorb(dst, src)
    }

    /// Whether `src` is a free neighbour `dst` may absorb.
    #[inline]
    fn can_merge(&self, dst: BlockId, src: BlockId) -> bool {
        self.blocks
            .opt(src)
            .is_some_and(|s| s.is_free() && s.mapped == self.blocks.get(dst).mapped)
    }

    /// `dst` takes over the neighbour `src` (already out of its free set):
    /// the address list skips `src` and its slot is freed. Returns its size.
    #[inline]
    fn absorb(&mut self, dst: BlockId, src: BlockId) -> u64 {
        let s = self.blocks.get(src);
        let (s_addr, s_size, s_prev, s_next) = (s.addr, s.size, s.prev, s.next);
        let d = self.blocks.get_mut(dst);
        if d.prev == src {
            d.addr = s_addr;
            d.prev = s_prev;
            d.size += s_size;
            if s_prev != NIL {
                self.blocks.get_mut(s_prev).next = dst;
            }
            self.fix_head(dst);
        } else {
            d.next = s_next;
            d.size += s_size;
            if s_next != NIL {
                self.blocks.get_mut(s_next).prev = dst;
            }
        }
        self.blocks.remove(src);
        s_size
    }
}
