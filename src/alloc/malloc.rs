//! The malloc path (allocator.md §3, §4.1–4.2, §5.1–5.3).

use super::block::{Block, BlockId, NIL};
use super::caching::{CachingAllocator, Segment, SegmentSlot};
use super::config::AllocConfig;
use super::constants::{MAX_REQUEST, MIN_BLOCK_SIZE, SMALL_SIZE};
use super::error::{AllocError, OomError};
use super::event::{Action, AllocEvent};
use super::format::oom_message;
use super::free_set::Hit;
use super::rounding::{alloc_size, round_size, Pool};
use super::stats::Family;
use super::Tag;
use crate::device::Device;

/// One request on its way through the allocator (PyTorch's `AllocParams`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    pub requested: u64,
    pub size: u64,
    pub pool: Pool,
    pub stream: u64,
    pub tag: Tag,
}

/// §4.1 `should_split`: whether a free block that serves a request of `size`
/// keeps `remaining` bytes as a block of its own. `expandable`: the block is
/// in an expandable segment.
#[inline]
pub fn should_split(
    pool: Pool,
    expandable: bool,
    remaining: u64,
    size: u64,
    config: &AllocConfig,
) -> bool {
    if pool == Pool::Small || expandable {
        remaining >= MIN_BLOCK_SIZE
    } else {
        size < config.max_split_size && remaining > SMALL_SIZE
    }
}

impl<D: Device> CachingAllocator<D> {
    /// `malloc(size, stream)`: the address of a block of at least `size` bytes.
    pub fn malloc(&mut self, size: u64, stream: u64, tag: Tag) -> Result<u64, AllocError> {
        if size == 0 {
            return Err(AllocError::ZeroSize);
        }
        if size >= MAX_REQUEST {
            return Err(AllocError::TooLarge { size });
        }
        self.process_events();
        let Some(req) = self.request(size, stream, tag) else {
            return Err(AllocError::ZeroSize);
        };
        let block = match self.get_free_block(&req) {
            Some(b) => b,
            None => self.allocate_new(&req)?,
        };
        Ok(self.alloc_found_block(block, &req))
    }

    /// §5.1 step 6: new memory from the device, releasing cache as needed.
    fn allocate_new(&mut self, req: &Request) -> Result<BlockId, AllocError> {
        if self.gc_enabled() {
            self.garbage_collect();
        }
        if let Some(b) = self.alloc_block(req, false) {
            return Ok(b);
        }
        if self.release_available_cached_blocks(req) {
            if let Some(b) = self.alloc_block(req, false) {
                return Ok(b);
            }
        }
        self.release_cached_blocks();
        if let Some(b) = self.alloc_block(req, true) {
            return Ok(b);
        }
        Err(self.out_of_memory(req))
    }

    /// §3 `get_free_block`: best fit in `(stream, size, address)` order.
    #[inline]
    fn get_free_block(&mut self, req: &Request) -> Option<BlockId> {
        if self.gc_enabled() {
            self.gc_calls[req.pool.index()] += 1;
        }
        let found = self.cached_candidate(req)?;
        let id = found.entry.id;
        self.free_sets[req.pool.index()].take(found);
        Some(id)
    }

    /// The cached block `get_free_block` would take, without taking it.
    #[inline]
    fn cached_candidate(&self, req: &Request) -> Option<Hit> {
        let found = self.best_fit(req)?;
        let size = found.entry.size;
        let ms = self.config.max_split_size;
        if req.size < ms && size >= ms {
            return None;
        }
        if req.size >= ms
            && size
                >= req
                    .size
                    .saturating_add(self.config.max_non_split_rounding_size)
        {
            return None;
        }
        Some(found)
    }

    /// Whether `malloc(size, stream)` would be served from the cache, with no device call.
    pub fn would_reuse_cached(&self, size: u64, stream: u64) -> bool {
        self.request(size, stream, Tag::NONE)
            .is_some_and(|req| self.cached_candidate(&req).is_some())
    }

    #[inline]
    fn request(&self, size: u64, stream: u64, tag: Tag) -> Option<Request> {
        if size == 0 || size >= MAX_REQUEST {
            return None;
        }
        let rounded = round_size(size, &self.config);
        Some(Request {
            requested: size,
            size: rounded,
            pool: Pool::for_size(rounded),
            stream,
            tag,
        })
    }

    #[inline]
    fn best_fit(&self, req: &Request) -> Option<Hit> {
        let set = &self.free_sets[req.pool.index()];
        let first = set.first_from(req.stream, req.size)?;
        if !self.blocks.get(first.entry.id).expandable {
            return Some(first);
        }
        if self.config.expandable_segments {
            // §3 step 3: prefer a free block inside a reservation over the tail
            // that borders unmapped space, judged by how far each can reach.
            let reach = |id: BlockId| {
                let b = self.blocks.get(id);
                b.size
                    + self
                        .blocks
                        .opt(b.next)
                        .filter(|n| !n.mapped)
                        .map_or(0, |n| n.size)
            };
            let mut current = first;
            while let Some(next) =
                set.next_after(req.stream, current.entry.size, current.entry.addr)
            {
                if !self.blocks.get(current.entry.id).expandable
                    || reach(next.entry.id) >= reach(current.entry.id)
                {
                    break;
                }
                current = next;
            }
            Some(current)
        } else {
            // Expandable segments switched off at run time: only plain blocks qualify.
            let mut current = first;
            while self.blocks.get(current.entry.id).expandable {
                current = set.next_after(req.stream, current.entry.size, current.entry.addr)?;
            }
            Some(current)
        }
    }

    /// §5.2 `alloc_block`: one device allocation (or expandable growth).
    fn alloc_block(&mut self, req: &Request, retry: bool) -> Option<BlockId> {
        if retry {
            self.stats.num_alloc_retries += 1;
        }
        let size = alloc_size(req.size, self.config.large_segment_size);
        if let Some(max) = self.allowed_max {
            if self.reserved_total + size > max {
                return None;
            }
        }
        if self.config.expandable_segments {
            return self.try_allocate_expandable(req);
        }
        let addr = self.device.malloc(size).ok()?;
        let seg = self.add_segment(SegmentSlot::Plain(Segment {
            addr,
            pool: req.pool,
            stream: req.stream,
            head: NIL,
            tag: req.tag,
        }));
        let id = self.new_block(Block::new(addr, size, req.stream, req.pool, seg));
        self.fix_head(id);
        self.reserved_total += size;
        self.stats.increase(Family::Segment, req.pool, 1);
        self.stats
            .increase(Family::ReservedBytes, req.pool, size as i64);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.emit(AllocEvent {
            action: Action::SegmentAlloc,
            addr,
            size,
            block_size: size,
            stream: req.stream,
            pool: req.pool,
            device_free: 0,
            tag: req.tag,
        });
        Some(id)
    }

    #[inline]
    fn should_split(&self, block: &Block, size: u64) -> bool {
        should_split(
            block.pool,
            self.config.expandable_segments,
            block.size - size,
            size,
            &self.config,
        )
    }

    /// §5.3 `alloc_found_block`: split if due, mark allocated, count it.
    #[inline]
    fn alloc_found_block(&mut self, found: BlockId, req: &Request) -> u64 {
        let b = self.blocks.get(found);
        let split = self.should_split(b, req.size);
        let already_split = b.is_split();
        let expandable = b.expandable;
        let pool = b.pool;
        let block = if split {
            // The remainder stays the old block object; the front is a fresh block.
            let (addr, prev, stream, seg) = (b.addr, b.prev, b.stream, b.seg);
            let (rem_addr, rem_size) = (addr + req.size, b.size - req.size);
            let mut fresh = Block::new(addr, req.size, stream, pool, seg);
            fresh.expandable = expandable;
            let id = self.new_block(fresh);
            {
                let rem = self.blocks.get_mut(found);
                rem.addr = rem_addr;
                rem.size = rem_size;
            }
            self.splice(id, prev, found);
            self.insert_free_as(found, pool, stream, rem_size, rem_addr);
            if !expandable {
                // Split before: the inactive piece shrinks by what is handed
                // out. Whole before: the remainder is a new inactive piece.
                let (blocks, bytes) = if already_split {
                    (0, -(req.size as i64))
                } else {
                    (1, rem_size as i64)
                };
                self.stats.on_inactive_split_change(pool, blocks, bytes);
            }
            id
        } else {
            if already_split && !expandable {
                self.stats
                    .decrease(Family::InactiveSplitBytes, pool, b.size as i64);
                self.stats.decrease(Family::InactiveSplit, pool, 1);
            }
            found
        };
        let b = self.blocks.get_mut(block);
        b.allocated = true;
        b.requested = req.requested;
        b.tag = req.tag;
        let (addr, size, stream) = (b.addr, b.size, b.stream);
        self.active.insert(addr, block);
        self.emit(AllocEvent {
            action: Action::Alloc,
            addr,
            size: req.requested,
            block_size: size,
            stream,
            pool,
            device_free: 0,
            tag: req.tag,
        });
        self.stats.on_alloc(pool, size, req.requested);
        if size >= self.config.max_split_size {
            self.stats.oversize_allocations.increase(1);
        }
        addr
    }

    /// §5.6: record the `oom` entry, count it, and build PyTorch's message.
    fn out_of_memory(&mut self, req: &Request) -> AllocError {
        let (device_free, device_total) = self.device.mem_get_info();
        self.emit(AllocEvent {
            action: Action::Oom,
            addr: 0,
            size: req.size,
            block_size: req.size,
            stream: req.stream,
            pool: req.pool,
            device_free,
            tag: req.tag,
        });
        self.stats.num_ooms += 1;
        let allocated = self.stats.allocated_bytes();
        let reserved = self.stats.reserved_bytes();
        let mut info = OomError {
            device: self.device_index,
            requested: req.requested,
            rounded: req.size,
            alloc_size: alloc_size(req.size, self.config.large_segment_size),
            device_free,
            device_total,
            allocated,
            reserved,
            allowed_max: self.allowed_max,
            message: String::new(),
        };
        // NVML's per-process piece (§5.6 proc_info): this process holds all the
        // device's used memory in the simulation.
        let this_process = self
            .process_info
            .then(|| device_total.saturating_sub(device_free));
        info.message = oom_message(&info, self.config.version, this_process);
        AllocError::OutOfMemory(Box::new(info))
    }
}
