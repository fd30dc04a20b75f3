//! The caching allocator's state and its public face: `malloc`, `free`,
//! `empty_cache`, stats, snapshots. The decisions live in `malloc.rs`,
//! `free.rs`, `release.rs` and `expandable.rs`.

use std::collections::{BTreeMap, VecDeque};

use rustc_hash::FxHashMap;

use super::active::ActiveTable;
use super::block::{Arena, Block, BlockId, NIL};
use super::config::AllocConfig;
use super::event::AllocEvent;
use super::free_set::{FreeSet, UnmappedSet};
use super::rounding::Pool;
use super::stats::MemoryStats;
use super::Tag;
use crate::device::Device;

/// A plain (`cudaMalloc`) segment: one contiguous, fixed-size range.
#[derive(Debug, Clone)]
pub(crate) struct Segment {
    pub addr: u64,
    pub pool: Pool,
    pub stream: u64,
    pub head: BlockId,
    /// Who asked for the request that created the segment (its `frames`).
    pub tag: Tag,
}

/// An expandable segment's virtual reservation (allocator.md §8.1).
#[derive(Debug, Clone)]
pub(crate) struct Reservation {
    pub base: u64,
    pub size: u64,
    pub page: u64,
    pub pool: Pool,
    pub stream: u64,
    pub head: BlockId,
    pub tag: Tag,
}

/// One segment's place in the arena: plain or expandable.
#[derive(Debug, Clone)]
pub(crate) enum SegmentSlot {
    Plain(Segment),
    Expandable(Reservation),
    Vacant,
}

/// Cross-stream uses waiting for the GPU, per stream in recording order (§6.3).
#[derive(Debug, Clone, Default)]
pub(crate) struct PendingEvents {
    pub queues: BTreeMap<u64, VecDeque<(BlockId, bool)>>,
}

/// A model of PyTorch's `DeviceCachingAllocator` for one device.
#[derive(Debug, Clone)]
pub struct CachingAllocator<D: Device> {
    pub(crate) device: D,
    pub(crate) device_index: u32,
    pub(crate) config: AllocConfig,
    pub(crate) blocks: Arena,
    pub(crate) free_sets: [FreeSet; 2],
    pub(crate) unmapped: [UnmappedSet; 2],
    /// Allocated and pending-free blocks by address (PyTorch's active set).
    pub(crate) active: ActiveTable,
    pub(crate) segments: Vec<SegmentSlot>,
    pub(crate) vacant_segments: Vec<u32>,
    pub(crate) pending: PendingEvents,
    /// Streams recorded with `record_stream` per allocated block (§6.3).
    pub(crate) stream_uses: FxHashMap<BlockId, Vec<u64>>,
    pub(crate) stats: MemoryStats,
    /// Bytes obtained from the device: segments plus mapped pages (`total_allocated_memory`).
    pub(crate) reserved_total: u64,
    /// `Some(allowed_max)` once a memory fraction is set (§9).
    pub(crate) allowed_max: Option<u64>,
    pub(crate) fraction: Option<f64>,
    /// Per-pool `get_free_block` counters for garbage-collection ages (§5.7).
    pub(crate) gc_calls: [u64; 2],
    pub(crate) record: bool,
    /// Whether OOM messages carry NVML's "this process has … in use" piece.
    pub(crate) process_info: bool,
    pub(crate) events: Vec<AllocEvent>,
}

impl<D: Device> CachingAllocator<D> {
    pub fn new(device: D, config: AllocConfig) -> CachingAllocator<D> {
        let stats = MemoryStats::new(config.max_split_size_stat());
        let mut allocator = CachingAllocator {
            device,
            device_index: 0,
            config,
            blocks: Arena::default(),
            free_sets: Default::default(),
            unmapped: Default::default(),
            active: ActiveTable::default(),
            segments: Vec::new(),
            vacant_segments: Vec::new(),
            pending: PendingEvents::default(),
            stream_uses: FxHashMap::default(),
            stats,
            reserved_total: 0,
            allowed_max: None,
            fraction: None,
            gc_calls: [0; 2],
            record: true,
            process_info: true,
            events: Vec::new(),
        };
        // 2.10+: the config key is applied when the device allocator is created.
        if let Some(f) = allocator.config.per_process_memory_fraction {
            allocator.set_memory_fraction(f);
        }
        allocator
    }

    pub fn with_device_index(mut self, index: u32) -> Self {
        self.device_index = index;
        self
    }

    pub fn config(&self) -> &AllocConfig {
        &self.config
    }

    pub fn device(&self) -> &D {
        &self.device
    }

    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    pub fn device_index(&self) -> u32 {
        self.device_index
    }

    /// `torch.cuda.memory_stats()` for this device.
    pub fn stats(&self) -> &MemoryStats {
        &self.stats
    }

    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// Turn trace recording on or off (`_record_memory_history`); never changes a decision.
    pub fn set_recording(&mut self, on: bool) {
        self.record = on;
    }

    /// Include (or leave out, as without NVML) the per-process sentence of OOM messages.
    pub fn set_oom_process_info(&mut self, on: bool) {
        self.process_info = on;
    }

    /// Trace entries recorded since the last call, oldest first.
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, AllocEvent> {
        self.events.drain(..)
    }

    pub fn take_events(&mut self) -> Vec<AllocEvent> {
        std::mem::take(&mut self.events)
    }

    /// `torch.cuda.set_per_process_memory_fraction(f)` (§9). From 2.10, 1.0 removes the limit.
    pub fn set_memory_fraction(&mut self, fraction: f64) {
        if !self.config.version.classic_parser() && fraction >= 1.0 {
            self.allowed_max = None;
            self.fraction = None;
            return;
        }
        self.fraction = Some(fraction);
        self.allowed_max = Some((fraction * self.device.total_memory() as f64) as u64);
    }

    /// The limit a recorded run's `set_per_process_memory_fraction` made, in
    /// bytes: a snapshot does not record the fraction, only its effects.
    pub fn set_allowed_memory(&mut self, bytes: u64) {
        let total = self.device.total_memory().max(1);
        self.fraction = Some(bytes as f64 / total as f64);
        self.allowed_max = Some(bytes);
    }

    pub fn memory_fraction_limit(&self) -> Option<u64> {
        self.allowed_max
    }

    /// Re-apply a config string at run time (`_set_allocator_settings`). The
    /// stats' `max_split_size` keeps the value from creation, as in PyTorch.
    pub fn set_config(&mut self, config: AllocConfig) {
        self.config = config;
    }

    /// Bytes obtained from the device (segments plus mapped pages).
    pub fn reserved_total(&self) -> u64 {
        self.reserved_total
    }

    /// Number of live allocated or pending-free blocks.
    pub fn active_blocks(&self) -> usize {
        self.active.len()
    }

    #[inline]
    pub(crate) fn emit(&mut self, event: AllocEvent) {
        if self.record {
            self.events.push(event);
        }
    }

    pub(crate) fn gc_enabled(&self) -> bool {
        self.allowed_max.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    /// Put a free mapped block into its pool's free set, stamping its GC age base.
    pub(crate) fn insert_free(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        let (pool, stream, size, addr) = (b.pool, b.stream, b.size, b.addr);
        self.insert_free_as(id, pool, stream, size, addr);
    }

    /// [`Self::insert_free`] for a block whose place and size the caller has
    /// just written: reading them back from the block could stall on those
    /// stores.
    #[inline]
    pub(crate) fn insert_free_as(
        &mut self,
        id: BlockId,
        pool: Pool,
        stream: u64,
        size: u64,
        addr: u64,
    ) {
        self.blocks.get_mut(id).gc_count_base = self.gc_calls[pool.index()] as u32;
        self.free_sets[pool.index()].insert(stream, size, addr, id);
    }

    #[inline]
    pub(crate) fn remove_free(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        let (pool, stream, size, addr) = (b.pool, b.stream, b.size, b.addr);
        self.free_sets[pool.index()].remove(stream, size, addr);
    }

    pub(crate) fn insert_unmapped(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        let (pool, stream, addr) = (b.pool, b.stream, b.addr);
        self.unmapped[pool.index()].insert(stream, addr, id);
    }

    pub(crate) fn remove_unmapped(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        let (pool, stream, addr) = (b.pool, b.stream, b.addr);
        self.unmapped[pool.index()].remove(stream, addr);
    }

    pub(crate) fn add_segment(&mut self, slot: SegmentSlot) -> u32 {
        if let Some(i) = self.vacant_segments.pop() {
            self.segments[i as usize] = slot;
            i
        } else {
            self.segments.push(slot);
            (self.segments.len() - 1) as u32
        }
    }

    pub(crate) fn remove_segment(&mut self, seg: u32) {
        self.segments[seg as usize] = SegmentSlot::Vacant;
        self.vacant_segments.push(seg);
    }

    /// Keep the segment's head pointer right after a relink that may have
    /// changed which block comes first.
    #[inline]
    pub(crate) fn fix_head(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        if b.prev != NIL {
            return;
        }
        match &mut self.segments[b.seg as usize] {
            SegmentSlot::Plain(s) => s.head = id,
            SegmentSlot::Expandable(r) => r.head = id,
            SegmentSlot::Vacant => {}
        }
    }

    /// Insert `new` between `prev` and `next` in the address list.
    #[inline]
    pub(crate) fn splice(&mut self, new: BlockId, prev: BlockId, next: BlockId) {
        self.blocks.get_mut(new).prev = prev;
        self.blocks.get_mut(new).next = next;
        if prev != NIL {
            self.blocks.get_mut(prev).next = new;
        }
        if next != NIL {
            self.blocks.get_mut(next).prev = new;
        }
        self.fix_head(new);
    }

    #[inline(always)]
    pub(crate) fn new_block(&mut self, block: Block) -> BlockId {
        self.blocks.insert(block)
    }
}
