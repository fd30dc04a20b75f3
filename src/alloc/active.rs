//! Allocated and pending-free blocks by address (PyTorch's `active_blocks`).
//!
//! An open-addressed table with the address and block id side by side, so a
//! `free` finds its block with one cache line of the table instead of a
//! control-byte group plus a bucket. Linear probing, at most half full,
//! deletion by backward shift (no tombstones to pile up over a long run).

use super::block::BlockId;

const EMPTY: u64 = u64::MAX;

#[derive(Debug, Clone, Copy)]
struct Slot {
    addr: u64,
    id: BlockId,
}

const VACANT: Slot = Slot { addr: EMPTY, id: 0 };

#[derive(Debug, Clone)]
pub(crate) struct ActiveTable {
    slots: Vec<Slot>,
    len: usize,
    shift: u32,
}

impl Default for ActiveTable {
    fn default() -> Self {
        ActiveTable::with_capacity_pow2(6)
    }
}

impl ActiveTable {
    fn with_capacity_pow2(bits: u32) -> ActiveTable {
        ActiveTable {
            slots: vec![VACANT; 1 << bits],
            len: 0,
            shift: 64 - bits,
        }
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Block addresses are multiples of 512; dropping those bits before a
    /// Fibonacci multiply spreads neighbouring blocks over the table.
    #[inline]
    fn home(&self, addr: u64) -> usize {
        ((addr >> 9)
            .wrapping_add(addr << 55)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            >> self.shift) as usize
    }

    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn get(&self, addr: u64) -> Option<BlockId> {
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            let s = self.slots[i];
            if s.addr == addr {
                return Some(s.id);
            }
            if s.addr == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    pub fn contains(&self, addr: u64) -> bool {
        self.get(addr).is_some()
    }

    /// Insert or replace the block at `addr`. `addr` must not be `u64::MAX`
    /// (no block of at least 512 bytes can start there).
    #[inline]
    pub fn insert(&mut self, addr: u64, id: BlockId) {
        debug_assert_ne!(addr, EMPTY);
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            let s = &mut self.slots[i];
            if s.addr == addr {
                s.id = id;
                return;
            }
            if s.addr == EMPTY {
                *s = Slot { addr, id };
                self.len += 1;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    #[inline]
    pub fn remove(&mut self, addr: u64) -> Option<BlockId> {
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            let s = self.slots[i];
            if s.addr == EMPTY {
                return None;
            }
            if s.addr == addr {
                break;
            }
            i = (i + 1) & mask;
        }
        let id = self.slots[i].id;
        self.len -= 1;
        // Backward shift: pull later entries of the probe run into the hole
        // when the hole lies between their home and where they sit.
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let s = self.slots[j];
            if s.addr == EMPTY {
                break;
            }
            let home = self.home(s.addr);
            let dist_home = j.wrapping_sub(home) & mask;
            let dist_hole = j.wrapping_sub(hole) & mask;
            if dist_home >= dist_hole {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = VACANT;
        Some(id)
    }

    fn grow(&mut self) {
        let bits = 64 - self.shift + 1;
        let old = std::mem::replace(self, ActiveTable::with_capacity_pow2(bits));
        for s in old.slots.into_iter().filter(|s| s.addr != EMPTY) {
            self.insert(s.addr, s.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::ActiveTable;

    #[test]
    fn agrees_with_a_hash_map_over_random_inserts_and_removes() {
        let mut table = ActiveTable::default();
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut x: u64 = 0x1234_5678_9abc_def1;
        for i in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Clustered addresses (as blocks of one segment are) stress probing.
            let addr = 0x7f00_0000_0000 + ((x % 4096) << 9);
            if x.is_multiple_of(3) {
                assert_eq!(table.remove(addr), model.remove(&addr), "remove {addr:#x}");
            } else {
                table.insert(addr, i);
                model.insert(addr, i);
            }
            assert_eq!(table.len(), model.len());
        }
        for (addr, id) in &model {
            assert_eq!(table.get(*addr), Some(*id));
        }
        for k in 0..4096u64 {
            let addr = 0x7f00_0000_0000 + (k << 9);
            assert_eq!(table.get(addr), model.get(&addr).copied());
        }
    }
}
