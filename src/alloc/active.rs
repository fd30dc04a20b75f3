//! Allocated and pending-free blocks by address (PyTorch's `active_blocks`).
//!
//! An open-addressed table of 8-byte slots: a 32-bit fingerprint of the
//! address beside the block id. The block itself holds the full address, and
//! every lookup goes on to use that block, so checking the address there costs
//! no extra memory access, and the table is half the size a slot with the full
//! address would need. At most a quarter full (short probe runs, so few
//! mispredicted branches), linear probing, deletion by backward shift (no
//! tombstones to pile up over a long run).

use super::block::{Arena, BlockId, NIL};

#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The top 32 bits of the address's hash; the slot's home is its top bits.
    fp: u32,
    id: BlockId,
}

const VACANT: Slot = Slot { fp: 0, id: NIL };

/// Where a lookup found its block: pass back to [`ActiveTable::remove_at`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Found {
    slot: usize,
    pub id: BlockId,
}

#[derive(Debug, Clone)]
pub(crate) struct ActiveTable {
    slots: Vec<Slot>,
    len: usize,
    bits: u32,
}

impl Default for ActiveTable {
    fn default() -> Self {
        ActiveTable::with_capacity_pow2(6)
    }
}

#[inline]
fn fingerprint(addr: u64) -> u32 {
    // Block addresses are multiples of 512: fold the low bits in, then a
    // Fibonacci multiply spreads neighbouring blocks over the table.
    ((addr >> 9)
        .wrapping_add(addr << 55)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        >> 32) as u32
}

impl ActiveTable {
    fn with_capacity_pow2(bits: u32) -> ActiveTable {
        ActiveTable {
            slots: vec![VACANT; 1 << bits],
            len: 0,
            bits,
        }
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    #[inline]
    fn home(&self, fp: u32) -> usize {
        (fp >> (32 - self.bits)) as usize
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The block at `addr`, if any; `blocks` holds the full addresses.
    #[inline]
    pub fn find(&self, addr: u64, blocks: &Arena) -> Option<Found> {
        let fp = fingerprint(addr);
        let mask = self.mask();
        let mut i = self.home(fp);
        loop {
            let s = self.slots[i];
            if s.id == NIL {
                return None;
            }
            if s.fp == fp && blocks.get(s.id).addr == addr {
                return Some(Found { slot: i, id: s.id });
            }
            i = (i + 1) & mask;
        }
    }

    pub fn get(&self, addr: u64, blocks: &Arena) -> Option<BlockId> {
        self.find(addr, blocks).map(|f| f.id)
    }

    pub fn contains(&self, addr: u64, blocks: &Arena) -> bool {
        self.find(addr, blocks).is_some()
    }

    /// Insert block `id`, which starts at `addr`. No other block in the table
    /// may start there: an address is active at most once.
    #[inline]
    pub fn insert(&mut self, addr: u64, id: BlockId) {
        if (self.len + 1) * 4 > self.slots.len() {
            self.grow();
        }
        self.place(Slot {
            fp: fingerprint(addr),
            id,
        });
        self.len += 1;
    }

    #[inline]
    fn place(&mut self, slot: Slot) {
        let mask = self.mask();
        let mut i = self.home(slot.fp);
        while self.slots[i].id != NIL {
            i = (i + 1) & mask;
        }
        self.slots[i] = slot;
    }

    /// Remove the entry a [`Self::find`] just returned (no change in between).
    #[inline]
    pub fn remove_at(&mut self, found: Found) {
        let mask = self.mask();
        self.len -= 1;
        // Backward shift: pull later entries of the probe run into the hole
        // when the hole lies between their home and where they sit.
        let mut hole = found.slot;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let s = self.slots[j];
            if s.id == NIL {
                break;
            }
            let dist_home = j.wrapping_sub(self.home(s.fp)) & mask;
            let dist_hole = j.wrapping_sub(hole) & mask;
            if dist_home >= dist_hole {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = VACANT;
    }

    fn grow(&mut self) {
        let old = std::mem::replace(self, ActiveTable::with_capacity_pow2(self.bits + 1));
        self.len = old.len;
        for s in old.slots.into_iter().filter(|s| s.id != NIL) {
            self.place(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::ActiveTable;
    use crate::alloc::block::{Arena, Block};
    use crate::alloc::rounding::Pool;

    #[test]
    fn agrees_with_a_hash_map_over_random_inserts_and_removes() {
        let mut table = ActiveTable::default();
        let mut blocks = Arena::default();
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut x: u64 = 0x1234_5678_9abc_def1;
        for _ in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Clustered addresses (as blocks of one segment are) stress probing.
            let addr = 0x7f00_0000_0000 + ((x % 4096) << 9);
            if x.is_multiple_of(3) {
                let found = table.find(addr, &blocks);
                assert_eq!(found.map(|f| f.id), model.remove(&addr), "remove {addr:#x}");
                if let Some(f) = found {
                    table.remove_at(f);
                    blocks.remove(f.id);
                }
            } else if let std::collections::hash_map::Entry::Vacant(slot) = model.entry(addr) {
                let id = blocks.insert(Block::new(addr, 512, 0, Pool::Small, 0));
                table.insert(addr, id);
                slot.insert(id);
            }
            assert_eq!(table.len(), model.len());
        }
        for (addr, id) in &model {
            assert_eq!(table.get(*addr, &blocks), Some(*id));
        }
        for k in 0..4096u64 {
            let addr = 0x7f00_0000_0000 + (k << 9);
            assert_eq!(table.get(addr, &blocks), model.get(&addr).copied());
        }
    }
}
