//! Allocated and pending-free blocks by address (PyTorch's `active_blocks`).
//!
//! A hash table of buckets, each one cache line of eight slots: a 32-bit
//! fingerprint of the address beside the block id. The block itself holds the
//! full address, and every lookup goes on to use that block, so checking the
//! address there costs no extra memory access. A lookup, an insert and a
//! removal each touch one line, and none of them branches on what it finds
//! there in the usual case: the slot is picked from a bit mask, not by
//! probing slot after slot. At most half full; a bucket that filled up once
//! is marked, and lookups that miss in it go on to the next bucket.

use super::block::{Arena, BlockId, NIL};

const WAYS: usize = 8;
/// The table grows before it is more than 1/LOAD_DEN full. At a half, a
/// bucket of eight overflows rarely (about 2 % of buckets at the limit),
/// and the table is half the size a quarter would need: fewer cache misses
/// on the allocator's hottest path.
const LOAD_DEN: usize = 2;

#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Bucket {
    /// 0 marks a vacant slot; real fingerprints are odd.
    fps: [u32; WAYS],
    ids: [BlockId; WAYS],
}

const EMPTY: Bucket = Bucket {
    fps: [0; WAYS],
    ids: [NIL; WAYS],
};

/// Where a lookup found its block: pass back to [`ActiveTable::remove_at`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Found {
    slot: usize,
    pub id: BlockId,
}

#[derive(Debug, Clone)]
pub(crate) struct ActiveTable {
    buckets: Vec<Bucket>,
    /// One bit per bucket: it was full once, so an address whose home it is
    /// may sit in a later bucket. Cleared only when the table is rebuilt.
    overflowed: Vec<u64>,
    overflowed_count: usize,
    len: usize,
    bits: u32,
    /// `insert` rebuilds the table first once `len` reaches this: the load
    /// limit, or at once when too many buckets carry overflow marks.
    rebuild_at: usize,
}

impl Default for ActiveTable {
    fn default() -> Self {
        ActiveTable::with_buckets_pow2(3)
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
        | 1
}

/// Bit `w` set where `fps[w] == fp`: two vector compares and a mask, not a
/// loop of branches.
/// Entries a table of `buckets` buckets holds before it grows.
fn load_limit(buckets: usize) -> usize {
    buckets * WAYS / LOAD_DEN
}

#[inline(always)]
fn matches(fps: &[u32; WAYS], fp: u32) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            __m128i, _mm_castsi128_ps, _mm_cmpeq_epi32, _mm_loadu_si128, _mm_movemask_ps,
            _mm_set1_epi32,
        };
        // SAFETY: SSE2 is part of x86_64; both loads read 16 of the array's
        // 32 bytes.
        unsafe {
            let want = _mm_set1_epi32(fp as i32);
            let lo = _mm_loadu_si128(fps.as_ptr().cast::<__m128i>());
            let hi = _mm_loadu_si128(fps.as_ptr().add(4).cast::<__m128i>());
            let lo = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(lo, want))) as u32;
            let hi = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(hi, want))) as u32;
            lo | hi << 4
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let mut m = 0;
        for (w, f) in fps.iter().enumerate() {
            m |= u32::from(*f == fp) << w;
        }
        m
    }
}

impl ActiveTable {
    fn with_buckets_pow2(bits: u32) -> ActiveTable {
        ActiveTable {
            buckets: vec![EMPTY; 1 << bits],
            overflowed: vec![0; (1usize << bits).div_ceil(64)],
            overflowed_count: 0,
            len: 0,
            bits,
            rebuild_at: load_limit(1 << bits),
        }
    }

    #[inline]
    fn mask(&self) -> usize {
        self.buckets.len() - 1
    }

    #[inline]
    fn home(&self, fp: u32) -> usize {
        (fp >> (32 - self.bits)) as usize
    }

    #[inline]
    fn is_overflowed(&self, b: usize) -> bool {
        self.overflowed[b / 64] & (1 << (b % 64)) != 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The block at `addr`, if any; `blocks` holds the full addresses.
    #[inline(always)]
    pub fn find(&self, addr: u64, blocks: &Arena) -> Option<Found> {
        let fp = fingerprint(addr);
        let mut b = self.home(fp);
        loop {
            let bucket = &self.buckets[b];
            let mut m = matches(&bucket.fps, fp);
            while m != 0 {
                let w = m.trailing_zeros() as usize;
                let id = bucket.ids[w];
                if blocks.get(id).addr == addr {
                    return Some(Found {
                        slot: b * WAYS + w,
                        id,
                    });
                }
                m &= m - 1;
            }
            if !self.is_overflowed(b) {
                return None;
            }
            b = (b + 1) & self.mask();
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
        if self.len >= self.rebuild_at {
            let full = self.len >= load_limit(self.buckets.len());
            // Marks only accumulate; rebuilding at the same size drops them.
            self.rebuild(self.bits + u32::from(full));
        }
        self.place(fingerprint(addr), id);
        self.len += 1;
    }

    #[inline]
    fn place(&mut self, fp: u32, id: BlockId) {
        let mut b = self.home(fp);
        loop {
            let bucket = &mut self.buckets[b];
            let vacant = matches(&bucket.fps, 0);
            if vacant != 0 {
                let w = vacant.trailing_zeros() as usize;
                bucket.fps[w] = fp;
                bucket.ids[w] = id;
                return;
            }
            if !self.is_overflowed(b) {
                self.overflowed[b / 64] |= 1 << (b % 64);
                self.overflowed_count += 1;
                if self.overflowed_count * 8 > self.buckets.len() {
                    self.rebuild_at = 0;
                }
            }
            b = (b + 1) & self.mask();
        }
    }

    /// Remove the entry a [`Self::find`] just returned (no change in between).
    #[inline]
    pub fn remove_at(&mut self, found: Found) {
        let bucket = &mut self.buckets[found.slot / WAYS];
        bucket.fps[found.slot % WAYS] = 0;
        bucket.ids[found.slot % WAYS] = NIL;
        self.len -= 1;
    }

    fn rebuild(&mut self, bits: u32) {
        let old = std::mem::replace(self, ActiveTable::with_buckets_pow2(bits));
        self.len = old.len;
        for bucket in &old.buckets {
            for (fp, id) in bucket.fps.iter().zip(&bucket.ids) {
                if *fp != 0 {
                    self.place(*fp, *id);
                }
            }
        }
        // Buckets that overflow even freshly placed do not call for another
        // rebuild; only marks added from here on do.
        self.rebuild_at = load_limit(self.buckets.len());
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

    /// Block addresses whose home is `bucket` of the initial 8-bucket table.
    fn homed_at(bucket: u32) -> impl Iterator<Item = u64> {
        (1u64..)
            .map(|k| k << 9)
            .filter(move |a| super::fingerprint(*a) >> 29 == bucket)
    }

    #[test]
    fn a_full_bucket_spills_into_the_next_and_lookups_follow_it() {
        use super::WAYS;
        let mut table = ActiveTable::default();
        let mut blocks = Arena::default();
        let home0: Vec<u64> = homed_at(0).take(WAYS + 3).collect();
        let mut ids = Vec::new();
        for &a in &home0[..WAYS + 1] {
            let id = blocks.insert(Block::new(a, 512, 0, Pool::Small, 0));
            table.insert(a, id);
            ids.push(id);
        }
        assert_eq!(table.buckets.len(), 8, "no growth yet");
        assert!(table.is_overflowed(0), "the ninth entry spilled");
        for (a, id) in home0.iter().zip(&ids) {
            assert_eq!(table.get(*a, &blocks), Some(*id), "{a:#x}");
        }
        // Free a slot of bucket 0: the spilled entry stays reachable, and
        // the next insert takes the freed slot.
        let f = table.find(home0[0], &blocks).expect("present");
        table.remove_at(f);
        assert_eq!(table.get(home0[0], &blocks), None);
        assert_eq!(table.get(home0[WAYS], &blocks), Some(ids[WAYS]));
        let id = blocks.insert(Block::new(home0[WAYS + 1], 512, 0, Pool::Small, 0));
        table.insert(home0[WAYS + 1], id);
        assert_eq!(table.get(home0[WAYS + 1], &blocks), Some(id));
        assert_eq!(table.get(home0[WAYS + 2], &blocks), None, "never inserted");
        assert_eq!(table.len(), WAYS + 1);
    }

    #[test]
    fn stale_overflow_marks_are_dropped_by_a_rebuild() {
        use super::WAYS;
        let mut table = ActiveTable::default();
        let mut blocks = Arena::default();
        let mut live = Vec::new();
        let add = |table: &mut ActiveTable, blocks: &mut Arena, a: u64| {
            let id = blocks.insert(Block::new(a, 512, 0, Pool::Small, 0));
            table.insert(a, id);
            (a, id)
        };
        for a in homed_at(0).take(WAYS + 1) {
            live.push(add(&mut table, &mut blocks, a));
        }
        // Bucket 0 empties again, but its mark stays.
        for (a, _) in live.drain(..5) {
            let f = table.find(a, &blocks).expect("present");
            table.remove_at(f);
        }
        assert!(table.is_overflowed(0));
        // A second mark passes the limit (1/8 of 8 buckets): the next insert
        // rebuilds, and only the bucket that still overflows stays marked.
        for a in homed_at(2).take(WAYS + 1) {
            live.push(add(&mut table, &mut blocks, a));
        }
        assert_eq!(table.overflowed_count, 2);
        live.push(add(
            &mut table,
            &mut blocks,
            homed_at(5).next().expect("some"),
        ));
        assert_eq!(table.buckets.len(), 8, "same size");
        assert!(!table.is_overflowed(0) && table.is_overflowed(2));
        assert_eq!(table.overflowed_count, 1);
        for (a, id) in &live {
            assert_eq!(table.get(*a, &blocks), Some(*id), "{a:#x}");
        }
        assert_eq!(table.len(), live.len());
    }
}
