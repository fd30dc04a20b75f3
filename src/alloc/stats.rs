//! `memory_stats()` counters with PyTorch's update rules (allocator.md §11).

use std::collections::BTreeMap;

use super::rounding::Pool;

/// One stat: `current`, `peak`, and the running totals of increases and decreases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    #[inline]
    pub fn increase(&mut self, amount: i64) {
        self.current += amount;
        self.peak = self.peak.max(self.current);
        self.allocated += amount;
    }
    #[inline]
    pub fn decrease(&mut self, amount: i64) {
        self.current -= amount;
        self.freed += amount;
    }
    fn reset_peak(&mut self) {
        self.peak = self.current;
    }
    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// A per-pool stat as the hot path keeps it: `allocated` is not stored but
/// follows from `current − base + freed` (`base`: `current` when the totals
/// were last reset), so an increase writes two fields, not three.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counter {
    current: i64,
    peak: i64,
    freed: i64,
    base: i64,
}

impl Counter {
    #[inline]
    fn increase(&mut self, amount: i64) {
        self.current += amount;
        self.peak = self.peak.max(self.current);
    }
    #[inline]
    fn decrease(&mut self, amount: i64) {
        self.current -= amount;
        self.freed += amount;
    }
    /// `increase(net)` when positive, `decrease(-net)` when negative,
    /// nothing when zero; with no branch on the sign (a free's net change is
    /// as random as its neighbours). The peak cannot move on a decrease.
    #[inline]
    fn apply(&mut self, net: i64) {
        self.current += net;
        self.freed += (-net).max(0);
        self.peak = self.peak.max(self.current);
    }
    fn stat(self) -> Stat {
        Stat {
            current: self.current,
            peak: self.peak,
            allocated: self.current - self.base + self.freed,
            freed: self.freed,
        }
    }
    fn reset_peak(&mut self) {
        self.peak = self.current;
    }
    fn reset_accumulated(&mut self) {
        self.freed = 0;
        self.base = self.current;
    }
}

/// The nine per-pool families, in the order `memory_summary()` does not use
/// (it has its own); names are PyTorch's key prefixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Allocation,
    Segment,
    Active,
    InactiveSplit,
    AllocatedBytes,
    ReservedBytes,
    ActiveBytes,
    InactiveSplitBytes,
    RequestedBytes,
}

impl Family {
    pub const ALL: [Family; 9] = [
        Family::Allocation,
        Family::Segment,
        Family::Active,
        Family::InactiveSplit,
        Family::AllocatedBytes,
        Family::ReservedBytes,
        Family::ActiveBytes,
        Family::InactiveSplitBytes,
        Family::RequestedBytes,
    ];
    pub fn key(self) -> &'static str {
        match self {
            Family::Allocation => "allocation",
            Family::Segment => "segment",
            Family::Active => "active",
            Family::InactiveSplit => "inactive_split",
            Family::AllocatedBytes => "allocated_bytes",
            Family::ReservedBytes => "reserved_bytes",
            Family::ActiveBytes => "active_bytes",
            Family::InactiveSplitBytes => "inactive_split_bytes",
            Family::RequestedBytes => "requested_bytes",
        }
    }
}

/// Pool levels of a stat: `all`, `small_pool`, `large_pool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    All,
    Small,
    Large,
}

impl Level {
    pub const ALL: [Level; 3] = [Level::All, Level::Small, Level::Large];
    pub fn key(self) -> &'static str {
        match self {
            Level::All => "all",
            Level::Small => "small_pool",
            Level::Large => "large_pool",
        }
    }
    pub fn of(pool: Pool) -> Level {
        match pool {
            Pool::Small => Level::Small,
            Pool::Large => Level::Large,
        }
    }
}

/// Everything `torch.cuda.memory_stats()` reports for one device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Per family, the `small_pool` and `large_pool` stats. Every update
    /// names a pool, so `all` is their sum except for its peak, which is
    /// kept here: half the writes on the allocator's hottest path.
    families: [[Counter; 2]; 9],
    all_peaks: [i64; 9],
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    pub num_sync_all_streams: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    pub num_oom_rejections: u64,
    /// -1 when unlimited.
    pub max_split_size: i64,
}

impl MemoryStats {
    pub fn new(max_split_size: i64) -> MemoryStats {
        MemoryStats {
            max_split_size,
            ..MemoryStats::default()
        }
    }

    pub fn get(&self, family: Family, level: Level) -> Stat {
        let [small, large] = self.families[family as usize].map(Counter::stat);
        match level {
            Level::Small => small,
            Level::Large => large,
            Level::All => Stat {
                current: small.current + large.current,
                peak: self.all_peaks[family as usize],
                allocated: small.allocated + large.allocated,
                freed: small.freed + large.freed,
            },
        }
    }

    /// Update `all` and the block's pool, as PyTorch's `for_each_selected_stat_type` does.
    #[inline]
    pub(crate) fn increase(&mut self, family: Family, pool: Pool, amount: i64) {
        let f = family as usize;
        let pools = &mut self.families[f];
        pools[pool.index()].increase(amount);
        let all = pools[0].current + pools[1].current;
        self.all_peaks[f] = self.all_peaks[f].max(all);
    }

    /// [`Self::increase`] or [`Self::decrease`] by the sign of `net`.
    #[inline]
    pub(crate) fn apply(&mut self, family: Family, pool: Pool, net: i64) {
        let f = family as usize;
        let pools = &mut self.families[f];
        pools[pool.index()].apply(net);
        let all = pools[0].current + pools[1].current;
        self.all_peaks[f] = self.all_peaks[f].max(all);
    }

    #[inline]
    pub(crate) fn decrease(&mut self, family: Family, pool: Pool, amount: i64) {
        self.families[family as usize][pool.index()].decrease(amount);
    }

    /// A block handed out (`alloc_found_block`): one allocation and one
    /// active block of `size` bytes, `requested` of them asked for.
    #[inline]
    pub(crate) fn on_alloc(&mut self, pool: Pool, size: u64, requested: u64) {
        let (size, requested) = (size as i64, requested as i64);
        self.increase(Family::Allocation, pool, 1);
        self.increase(Family::AllocatedBytes, pool, size);
        self.increase(Family::Active, pool, 1);
        self.increase(Family::ActiveBytes, pool, size);
        self.increase(Family::RequestedBytes, pool, requested);
    }

    /// `free` called: the allocation ends (the block may stay active).
    #[inline]
    pub(crate) fn on_free_requested(&mut self, pool: Pool, size: u64) {
        self.decrease(Family::Allocation, pool, 1);
        self.decrease(Family::AllocatedBytes, pool, size as i64);
    }

    /// The block is free (`free_block`): no longer active.
    #[inline]
    pub(crate) fn on_free_completed(&mut self, pool: Pool, size: u64, requested: u64) {
        self.decrease(Family::Active, pool, 1);
        self.decrease(Family::ActiveBytes, pool, size as i64);
        self.decrease(Family::RequestedBytes, pool, requested as i64);
    }

    /// Net change of the inactive-split families after a free's merges.
    #[inline]
    pub(crate) fn on_inactive_split_change(&mut self, pool: Pool, blocks: i64, bytes: i64) {
        self.apply(Family::InactiveSplit, pool, blocks);
        self.apply(Family::InactiveSplitBytes, pool, bytes);
    }

    pub fn allocated_bytes(&self) -> u64 {
        self.get(Family::AllocatedBytes, Level::All).current as u64
    }
    pub fn reserved_bytes(&self) -> u64 {
        self.get(Family::ReservedBytes, Level::All).current as u64
    }
    /// What the live tensors asked for, before rounding and unsplit tails.
    pub fn requested_bytes(&self) -> u64 {
        self.get(Family::RequestedBytes, Level::All).current as u64
    }
    pub fn peak_allocated_bytes(&self) -> u64 {
        self.get(Family::AllocatedBytes, Level::All).peak as u64
    }
    pub fn peak_reserved_bytes(&self) -> u64 {
        self.get(Family::ReservedBytes, Level::All).peak as u64
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak(&mut self) {
        self.families
            .iter_mut()
            .flatten()
            .for_each(Counter::reset_peak);
        for family in Family::ALL {
            self.all_peaks[family as usize] = self.get(family, Level::All).current;
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated(&mut self) {
        self.families
            .iter_mut()
            .flatten()
            .for_each(Counter::reset_accumulated);
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
        self.num_oom_rejections = 0;
    }

    /// The flattened, key-sorted dict `torch.cuda.memory_stats()` returns.
    /// `with_oom_rejections` adds the 2.12+ counter.
    pub fn to_map(&self, with_oom_rejections: bool) -> BTreeMap<String, i64> {
        let mut map = BTreeMap::new();
        let metrics = |s: Stat| {
            [
                ("current", s.current),
                ("peak", s.peak),
                ("allocated", s.allocated),
                ("freed", s.freed),
            ]
        };
        for family in Family::ALL {
            for level in Level::ALL {
                for (metric, value) in metrics(self.get(family, level)) {
                    map.insert(
                        format!("{}.{}.{}", family.key(), level.key(), metric),
                        value,
                    );
                }
            }
        }
        for (name, stat) in [
            ("oversize_allocations", self.oversize_allocations),
            ("oversize_segments", self.oversize_segments),
        ] {
            for (metric, value) in metrics(stat) {
                map.insert(format!("{name}.{metric}"), value);
            }
        }
        let counters = [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_sync_all_streams", self.num_sync_all_streams),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
        ];
        for (name, value) in counters {
            map.insert(name.to_string(), value as i64);
        }
        if with_oom_rejections {
            map.insert(
                "num_oom_rejections".to_string(),
                self.num_oom_rejections as i64,
            );
        }
        map.insert("max_split_size".to_string(), self.max_split_size);
        map
    }

    /// The stats a real `torch.cuda.memory_stats()` reported (a live job),
    /// keyed as [`MemoryStats::to_map`] writes them; a key it lacks reads 0.
    pub fn from_map(get: impl Fn(&str) -> Option<i64>) -> MemoryStats {
        let metric = |prefix: &str| Stat {
            current: get(&format!("{prefix}.current")).unwrap_or(0),
            peak: get(&format!("{prefix}.peak")).unwrap_or(0),
            allocated: get(&format!("{prefix}.allocated")).unwrap_or(0),
            freed: get(&format!("{prefix}.freed")).unwrap_or(0),
        };
        let count = |k: &str| get(k).map_or(0, |v| v.max(0) as u64);
        let mut out = MemoryStats::new(get("max_split_size").unwrap_or(-1));
        for family in Family::ALL {
            let f = family as usize;
            for (i, level) in [Level::Small, Level::Large].into_iter().enumerate() {
                let s = metric(&format!("{}.{}", family.key(), level.key()));
                out.families[f][i] = Counter {
                    current: s.current,
                    peak: s.peak,
                    freed: s.freed,
                    base: s.current - s.allocated + s.freed,
                };
            }
            out.all_peaks[f] = metric(&format!("{}.{}", family.key(), Level::All.key())).peak;
        }
        out.oversize_allocations = metric("oversize_allocations");
        out.oversize_segments = metric("oversize_segments");
        out.num_alloc_retries = count("num_alloc_retries");
        out.num_ooms = count("num_ooms");
        out.num_sync_all_streams = count("num_sync_all_streams");
        out.num_device_alloc = count("num_device_alloc");
        out.num_device_free = count("num_device_free");
        out.num_oom_rejections = count("num_oom_rejections");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{Family, Level, MemoryStats, Pool, Stat};

    #[test]
    fn a_reported_dict_reads_back_as_the_same_stats() {
        let mut stats = MemoryStats::new(64 << 20);
        stats.on_alloc(Pool::Large, 4 << 20, 3 << 20);
        stats.on_alloc(Pool::Small, 512, 400);
        stats.on_free_requested(Pool::Large, 4 << 20);
        stats.on_free_completed(Pool::Large, 4 << 20, 3 << 20);
        stats.num_ooms = 2;
        stats.reset_accumulated();
        stats.on_alloc(Pool::Large, 2 << 20, 2 << 20);
        let map = stats.to_map(true);
        let back = MemoryStats::from_map(|k| map.get(k).copied());
        assert_eq!(back.to_map(true), map);
        assert_eq!(back.allocated_bytes(), (2 << 20) + 512);
    }

    /// The stored form (no `allocated` field) reports what plain `Stat`s
    /// updated the same way report, across peak and total resets.
    #[test]
    fn counters_agree_with_plain_stats_across_resets() {
        let mut stats = MemoryStats::new(-1);
        let mut model = [[Stat::default(); 2]; 9];
        let mut all_peak = [0i64; 9];
        let mut x: u64 = 0x5eed;
        for step in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let family = Family::ALL[(x % 9) as usize];
            let (pool, p) = if x & 16 == 0 {
                (Pool::Small, 0)
            } else {
                (Pool::Large, 1)
            };
            let f = family as usize;
            let amount = ((x >> 8) % 1000) as i64;
            if x & 32 == 0 || model[f][p].current < amount {
                stats.increase(family, pool, amount);
                model[f][p].increase(amount);
                all_peak[f] = all_peak[f].max(model[f][0].current + model[f][1].current);
            } else {
                stats.decrease(family, pool, amount);
                model[f][p].decrease(amount);
            }
            if step % 3001 == 3000 {
                stats.reset_accumulated();
                model.iter_mut().flatten().for_each(Stat::reset_accumulated);
            }
            if step % 4999 == 4998 {
                stats.reset_peak();
                model.iter_mut().flatten().for_each(Stat::reset_peak);
                for (f, peak) in all_peak.iter_mut().enumerate() {
                    *peak = model[f][0].current + model[f][1].current;
                }
            }
        }
        for family in Family::ALL {
            let f = family as usize;
            assert_eq!(stats.get(family, Level::Small), model[f][0], "{family:?}");
            assert_eq!(stats.get(family, Level::Large), model[f][1], "{family:?}");
            let all = stats.get(family, Level::All);
            assert_eq!(all.peak, all_peak[f], "{family:?}");
            assert_eq!(all.allocated, model[f][0].allocated + model[f][1].allocated);
        }
    }
}

/// Fragmentation, the one definition every view and report uses:
/// 1 − largest free block / cached free bytes. 0 when the cached free bytes
/// are one block (any request up to their size fits without a new
/// `cudaMalloc`), near 1 when they are scattered in small pieces; 0 with
/// nothing cached.
pub fn fragmentation(largest_free_block: u64, cached_free: u64) -> f64 {
    if cached_free == 0 {
        0.0
    } else {
        1.0 - largest_free_block.min(cached_free) as f64 / cached_free as f64
    }
}

/// The words that state [`fragmentation`] beside a figure.
pub const FRAGMENTATION_DEFINITION: &str =
    "1 - largest free block / cached free bytes (0: the free bytes are one block)";

#[cfg(test)]
mod fragmentation_tests {
    use super::fragmentation;

    #[test]
    fn one_free_block_is_no_fragmentation_and_scattered_pieces_are_much() {
        assert_eq!(fragmentation(0, 0), 0.0);
        assert_eq!(fragmentation(64 << 20, 64 << 20), 0.0);
        assert!((fragmentation(16 << 20, 64 << 20) - 0.75).abs() < 1e-12);
        // a largest block above the total (a malformed input) is not negative
        assert_eq!(fragmentation(128, 64), 0.0);
    }
}
