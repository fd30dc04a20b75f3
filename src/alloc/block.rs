//! Blocks and the arena that owns them (allocator.md §1.3).

use super::rounding::Pool;
use super::Tag;

/// Index of a block in the arena; `NIL` is "no block".
pub(crate) type BlockId = u32;
pub(crate) const NIL: BlockId = u32::MAX;

/// One block of a segment: allocated, free, pending or (expandable) unmapped.
/// Aligned so that touching a block costs one cache line, not two.
#[derive(Debug, Clone)]
#[repr(align(64))]
pub(crate) struct Block {
    pub addr: u64,
    pub size: u64,
    /// §4.4: set on hand-out, never cleared on free; fresh blocks start at 0.
    pub requested: u64,
    /// The stream of the segment the block lives in.
    pub stream: u64,
    pub prev: BlockId,
    pub next: BlockId,
    /// The segment (plain) or reservation (expandable) the block belongs to.
    pub seg: u32,
    pub pool: Pool,
    pub allocated: bool,
    pub mapped: bool,
    pub expandable: bool,
    /// Outstanding cross-stream events (§6).
    pub event_count: u16,
    /// `record_stream` was called; the streams themselves live beside the
    /// arena (rare), which keeps a block to one cache line.
    pub has_stream_uses: bool,
    /// The pool's lookup counter when the block became free (low 32 bits;
    /// ages are taken with wrapping arithmetic).
    pub gc_count_base: u32,
    pub tag: Tag,
}

impl Block {
    #[inline(always)]
    pub fn new(addr: u64, size: u64, stream: u64, pool: Pool, seg: u32) -> Block {
        Block {
            addr,
            size,
            requested: 0,
            stream,
            prev: NIL,
            next: NIL,
            seg,
            pool,
            allocated: false,
            mapped: true,
            expandable: false,
            event_count: 0,
            has_stream_uses: false,
            gc_count_base: 0,
            tag: Tag::NONE,
        }
    }

    /// Part of a segment that holds more than this one block.
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }

    /// §1.3: free = not allocated, no events, no stream uses (mapped or not).
    pub fn is_free(&self) -> bool {
        !self.allocated && self.event_count == 0 && !self.has_stream_uses
    }
}

/// Slab of blocks with slot reuse, so ids stay small and stable.
#[derive(Debug, Clone, Default)]
pub(crate) struct Arena {
    blocks: Vec<Block>,
    vacant: Vec<BlockId>,
}

impl Arena {
    /// Inlined so the caller's block is written straight into its slot: a
    /// block built on the stack and copied whole stalls the copy's wide loads
    /// on the narrow stores that built it.
    #[inline(always)]
    pub fn insert(&mut self, block: Block) -> BlockId {
        if let Some(id) = self.vacant.pop() {
            self.blocks[id as usize] = block;
            id
        } else {
            self.blocks.push(block);
            (self.blocks.len() - 1) as BlockId
        }
    }

    pub fn remove(&mut self, id: BlockId) {
        self.vacant.push(id);
    }

    /// The block `id`. Ids come from `insert` and `blocks` never shrinks,
    /// so a bad id (`NIL` where a neighbour was expected) is a bug: it
    /// panics here, in release builds too, rather than read past the arena.
    #[inline(always)]
    pub fn get(&self, id: BlockId) -> &Block {
        &self.blocks[id as usize]
    }

    #[inline(always)]
    pub fn get_mut(&mut self, id: BlockId) -> &mut Block {
        &mut self.blocks[id as usize]
    }

    /// `Some(block)` for a real neighbour, `None` for `NIL`.
    pub fn opt(&self, id: BlockId) -> Option<&Block> {
        (id != NIL).then(|| self.get(id))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_block_is_one_cache_line() {
        assert!(std::mem::size_of::<super::Block>() <= 64);
    }
}
