//! What-if: the same requests under another `PYTORCH_CUDA_ALLOC_CONF`, on a
//! simulated device of a given size. Answers "would expandable_segments or
//! max_split_size_mb have saved me?" without a GPU.
//!
//! A replay tells its device that the program's kernels started
//! (`Device::kernels_started`, which moves a modelled driver layout's
//! segments) just before the first request that is not
//! [`Entry::before_kernels`]: where the entries were read with their stacks
//! or an engine run's phases, where `vramscope trace` and the engine told
//! theirs; where nothing is known, at the first request.

use std::collections::HashMap;

use serde::Serialize;

use crate::alloc::{Action, AllocConfig, CachingAllocator, Family, Level, SegmentInfo};
use crate::device::{Device, SimDevice};

use super::reconstruct::Reconstruction;
use super::{entry_tag, Entry};

impl WhatIfResult {
    fn oom(&mut self, entry: usize, size: u64) {
        self.oom_count += 1;
        if self.ooms.len() < LISTED_OOMS {
            self.ooms.push(WhatIfOom { entry, size });
        }
    }
}

/// A request that did not fit under a config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WhatIfOom {
    /// Index of the trace entry that asked.
    pub entry: usize,
    pub size: u64,
}

/// One config's outcome (the report's `configs[]` entries).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WhatIfResult {
    pub conf: String,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    pub reserved_end: u64,
    /// The largest free block when reserved memory peaked.
    pub largest_free_at_worst: u64,
    /// [`crate::alloc::fragmentation`] when reserved memory peaked.
    pub fragmentation_at_worst: f64,
    pub num_alloc_retries: u64,
    /// Requests that did not fit: all counted, the first [`LISTED_OOMS`] listed.
    pub oom_count: usize,
    pub ooms: Vec<WhatIfOom>,
    /// Segments at the end (mapped runs for expandable segments).
    pub segments: usize,
}

/// OOMs a result lists (a crafted trace can repeat one request millions of times).
pub const LISTED_OOMS: usize = 100;

/// The trace's requests in the form a what-if replay reads.
#[derive(Debug, Clone, Default)]
pub struct Requests<'a> {
    pub entries: &'a [Entry],
    /// Where the recorded run called `empty_cache()` (from a verify replay).
    pub empty_cache_at: &'a [usize],
    pub start: Option<&'a Reconstruction>,
}

pub fn what_if(requests: &Requests<'_>, config: AllocConfig, capacity: u64) -> WhatIfResult {
    run(requests, config, capacity, false).result
}

/// A what-if replay and the allocator it ran on.
pub struct WhatIfRun {
    pub result: WhatIfResult,
    /// With `record`, its trace holds every decision (tags from
    /// [`entry_tag`]): what the views and an export show.
    pub allocator: CachingAllocator<SimDevice>,
    /// With `record`, the segments adopted before the first entry (an open
    /// trace's rebuilt start), which the trace does not show being made.
    pub start: Vec<SegmentInfo>,
}

/// Replay the requests; with `record`, the allocator keeps its trace.
pub fn run(requests: &Requests<'_>, config: AllocConfig, capacity: u64, record: bool) -> WhatIfRun {
    run_on(
        requests,
        config,
        SimDevice::new("what-if", capacity, 0),
        record,
    )
}

/// [`what_if`] on a given simulated device (a run's own: its total and
/// overhead, which a memory fraction is taken of).
pub fn what_if_on(requests: &Requests<'_>, config: AllocConfig, device: SimDevice) -> WhatIfResult {
    run_on(requests, config, device, false).result
}

/// [`run`] on a given simulated device.
pub fn run_on(
    requests: &Requests<'_>,
    config: AllocConfig,
    device: SimDevice,
    record: bool,
) -> WhatIfRun {
    let mut w = WhatIf::on(requests.start, config, device, record);
    w.feed(requests.entries, requests.empty_cache_at);
    w.finish()
}

/// A what-if replay fed its requests as they are read: [`WhatIf::feed`]
/// any number of times, then [`WhatIf::finish`].
pub struct WhatIf {
    a: CachingAllocator<SimDevice>,
    /// The trace's address of each live request → ours.
    ours: HashMap<u64, u64>,
    result: WhatIfResult,
    start: Vec<SegmentInfo>,
    /// Entries fed so far, and `empty_cache()` calls done so far.
    fed: usize,
    emptied: usize,
    worst: u64,
    /// Events taken with [`WhatIf::take_events`] so far.
    taken: usize,
    /// Each entry after which reserved memory was higher than ever before:
    /// its index, the events made before it, and the bytes reserved.
    highs: Vec<High>,
    /// The device was told the program's kernels started.
    kernels: Kernels,
}

/// Tells a replay's device, once, that the program's kernels started: just
/// before the first entry that [`Entry::starts_kernels`].
#[derive(Debug, Clone, Copy, Default)]
struct Kernels {
    started: bool,
}

impl Kernels {
    fn before(&mut self, e: &Entry, a: &mut CachingAllocator<SimDevice>) {
        if !self.started && e.starts_kernels() {
            self.started = true;
            a.device_mut().kernels_started();
        }
    }
}

/// A new most-reserved, after one entry (see [`WhatIf::first_past`]).
#[derive(Debug, Clone, Copy)]
struct High {
    entry: usize,
    events_before: usize,
    reserved: u64,
}

/// Where a replay on a device without a limit first reserved more than a
/// given device holds: everything before it is what that device would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Past {
    /// The entry whose request needed more.
    pub entry: usize,
    /// Events made before that entry (its `empty_cache()` included).
    pub events_before: usize,
}

impl WhatIf {
    /// A replay under `config` on a device of `capacity` bytes, from
    /// `start` (an open trace's rebuilt start).
    pub fn new(
        start: Option<&Reconstruction>,
        config: AllocConfig,
        capacity: u64,
        record: bool,
    ) -> WhatIf {
        WhatIf::on(
            start,
            config,
            SimDevice::new("what-if", capacity, 0),
            record,
        )
    }

    /// [`WhatIf::new`] on a given simulated device.
    pub fn on(
        start: Option<&Reconstruction>,
        config: AllocConfig,
        device: SimDevice,
        record: bool,
    ) -> WhatIf {
        let conf = config.raw.clone();
        let (mut a, ours) = started(start, config, device);
        let start = if record { a.snapshot() } else { Vec::new() };
        a.set_recording(record);
        WhatIf {
            a,
            ours,
            result: WhatIfResult {
                conf,
                peak_reserved: 0,
                peak_allocated: 0,
                reserved_end: 0,
                largest_free_at_worst: 0,
                fragmentation_at_worst: 0.0,
                num_alloc_retries: 0,
                oom_count: 0,
                ooms: Vec::new(),
                segments: 0,
            },
            start,
            fed: 0,
            emptied: 0,
            worst: 0,
            taken: 0,
            highs: Vec::new(),
            kernels: Kernels::default(),
        }
    }

    /// The next entries; `empty_cache_at`: where the recorded run called
    /// `empty_cache()` (every call before the last entry fed, at least).
    pub fn feed(&mut self, entries: &[Entry], empty_cache_at: &[usize]) {
        for e in entries {
            let i = self.fed;
            self.fed += 1;
            let events_before = self.taken + self.a.events.len();
            while empty_cache_at.get(self.emptied).is_some_and(|&at| at <= i) {
                self.emptied += 1;
                self.a.empty_cache();
            }
            self.kernels.before(e, &mut self.a);
            self.request(i, e, events_before);
        }
    }

    fn request(&mut self, i: usize, e: &Entry, events_before: usize) {
        let (a, result) = (&mut self.a, &mut self.result);
        match e.action {
            Action::Alloc => match a.malloc(e.size, e.stream, entry_tag(i)) {
                Ok(addr) => {
                    self.ours.insert(e.addr, addr);
                }
                Err(_) => result.oom(i, e.size),
            },
            Action::Oom => match a.malloc(e.size, e.stream, entry_tag(i)) {
                // The recorded run failed here and never used the memory.
                Ok(addr) => {
                    let _ = a.free(addr);
                }
                Err(_) => result.oom(i, e.size),
            },
            Action::FreeRequested => {
                if let Some(addr) = self.ours.remove(&e.addr) {
                    let _ = a.free(addr);
                }
            }
            _ => {}
        }
        let reserved = a.stats().reserved_bytes();
        if reserved > self.worst {
            self.worst = reserved;
            self.highs.push(High {
                entry: i,
                events_before,
                reserved,
            });
            result.largest_free_at_worst = a.largest_free_block();
            // cached free: what no live (or pending) block holds
            let active = a.stats().get(Family::ActiveBytes, Level::All).current as u64;
            result.fragmentation_at_worst = crate::alloc::fragmentation(
                result.largest_free_at_worst,
                reserved.saturating_sub(active),
            );
        }
    }

    /// Entries fed so far.
    pub fn fed(&self) -> usize {
        self.fed
    }

    /// The most it reserved so far.
    pub fn peak_reserved(&self) -> u64 {
        self.a.stats().peak_reserved_bytes()
    }

    /// The events its allocator recorded since the last call (with `record`).
    pub fn take_events(&mut self) -> Vec<crate::alloc::AllocEvent> {
        let events = self.a.take_events();
        self.taken += events.len();
        events
    }

    /// The first entry after which this replay reserved more than
    /// `capacity`: on a device of that size its request would have failed
    /// (and what the allocator does then differs), while every event
    /// before it is the same on both devices. `None`: it never did.
    pub fn first_past(&self, capacity: u64) -> Option<Past> {
        let k = self.highs.partition_point(|h| h.reserved <= capacity);
        self.highs.get(k).map(|h| Past {
            entry: h.entry,
            events_before: h.events_before,
        })
    }

    /// The segments adopted before the first entry (with `record`).
    pub fn start(&self) -> &[SegmentInfo] {
        &self.start
    }

    pub fn finish(self) -> WhatIfRun {
        let WhatIf {
            a,
            mut result,
            start,
            ..
        } = self;
        let s = a.stats();
        result.peak_reserved = s.peak_reserved_bytes();
        result.peak_allocated = s.peak_allocated_bytes();
        result.reserved_end = s.reserved_bytes();
        result.num_alloc_retries = s.num_alloc_retries;
        result.segments = a.snapshot().len();
        WhatIfRun {
            result,
            allocator: a,
            start,
        }
    }
}

/// Every config at once, the first being the original; spread over threads.
pub fn what_if_all(
    requests: &Requests<'_>,
    configs: Vec<AllocConfig>,
    capacity: u64,
) -> Vec<WhatIfResult> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = configs
            .into_iter()
            .map(|config| scope.spawn(move || what_if(requests, config, capacity)))
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    })
}

/// What a failing request would have met under another config (or after
/// `empty_cache()`): [`retry_at`]'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RetryOutcome {
    /// The request fitted.
    pub fits: bool,
    /// Earlier requests that did not fit in this replay (the recorded run
    /// met none of them), and the index of the first.
    pub earlier_ooms: usize,
    pub first_earlier_oom: Option<usize>,
    /// Just before the request: allocated and reserved bytes, the largest
    /// free cached block, and what the device had left.
    pub allocated: u64,
    pub reserved: u64,
    pub largest_free: u64,
    pub device_free: u64,
    /// Reserved bytes the request's own failure path gave back to the
    /// device (its release of whole free segments) when it did not fit.
    pub released_by_failure: u64,
    /// Segments held just before the request, and of them the ones with a
    /// live block (which `empty_cache()` cannot return).
    pub segments: usize,
    pub segments_in_use: usize,
    /// The request goes to the small pool (at most 1 MiB: 2 MiB segments
    /// of its own), and that pool's free bytes and largest free block.
    pub small_pool: bool,
    pub pool_free: u64,
    pub pool_largest_free: u64,
}

/// The requests before `at` replayed under `config` on `device`, then
/// request `at` tried (after `empty_cache()` if `empty_cache_first`).
pub fn retry_at(
    requests: &Requests<'_>,
    config: AllocConfig,
    device: SimDevice,
    at: usize,
    empty_cache_first: bool,
) -> RetryOutcome {
    let (mut a, earlier_ooms, first_earlier_oom) = replayed_to(requests, config, device, at);
    let at = at.min(requests.entries.len());
    if empty_cache_first {
        a.empty_cache();
    }
    let snapshot = a.snapshot();
    let segments_in_use = snapshot
        .iter()
        .filter(|s| s.blocks.iter().any(|b| b.state.is_active()))
        .count();
    let size = requests.entries.get(at).map_or(0, |e| e.size);
    let pool = crate::alloc::rounding::Pool::for_size(crate::alloc::rounding::round_size(
        size,
        a.config(),
    ));
    let free_pieces = snapshot
        .iter()
        .filter(|s| s.pool == pool)
        .flat_map(|s| s.blocks.iter())
        .filter(|b| !b.state.is_active())
        .map(|b| b.size);
    let (pool_free, pool_largest_free) =
        free_pieces.fold((0, 0), |(sum, max), b| (sum + b, max.max(b)));
    let mut out = RetryOutcome {
        fits: false,
        earlier_ooms,
        first_earlier_oom,
        allocated: a.stats().allocated_bytes(),
        reserved: a.stats().reserved_bytes(),
        largest_free: a.largest_free_block(),
        device_free: a.device().mem_get_info().0,
        released_by_failure: 0,
        segments: snapshot.len(),
        segments_in_use,
        small_pool: pool == crate::alloc::rounding::Pool::Small,
        pool_free,
        pool_largest_free,
    };
    if let Some(e) = requests.entries.get(at) {
        match a.malloc(e.size, e.stream, entry_tag(at)) {
            Ok(_) => out.fits = true,
            Err(_) => {
                out.released_by_failure = out.reserved.saturating_sub(a.stats().reserved_bytes())
            }
        }
    }
    out
}

/// An allocator on `device` under `config` holding `start`'s
/// segments (an open trace's rebuilt start), and the recorded addresses of
/// the live blocks it adopted, mapped to its own.
fn started(
    start: Option<&Reconstruction>,
    config: AllocConfig,
    device: SimDevice,
) -> (CachingAllocator<SimDevice>, HashMap<u64, u64>) {
    let mut a = CachingAllocator::new(device, config);
    let mut ours: HashMap<u64, u64> = HashMap::new();
    if let Some(start) = start {
        for seg in &start.segments {
            if a.adopt_segment(seg.addr, seg.pool, seg.stream, &seg.blocks)
                .is_ok()
            {
                a.device_mut()
                    .claim(seg.blocks.iter().map(|b| b.size).sum());
                let mut at = seg.addr;
                for b in &seg.blocks {
                    if b.state.is_active() {
                        ours.insert(at, at);
                    }
                    at += b.size;
                }
            }
        }
    }
    (a, ours)
}

/// The requests before `at` replayed (with the `empty_cache()` calls due
/// by then): the allocator, and the requests that did not fit (the first's
/// index).
fn replayed_to(
    requests: &Requests<'_>,
    config: AllocConfig,
    device: SimDevice,
    at: usize,
) -> (CachingAllocator<SimDevice>, usize, Option<usize>) {
    let (mut a, mut ours) = started(requests.start, config, device);
    let mut earlier_ooms = 0;
    let mut first_earlier_oom = None;
    let mut next_empty_cache = requests.empty_cache_at.iter().peekable();
    let mut kernels = Kernels::default();
    let at = at.min(requests.entries.len());
    for (i, e) in requests.entries[..at].iter().enumerate() {
        while next_empty_cache.next_if(|&&x| x <= i).is_some() {
            a.empty_cache();
        }
        kernels.before(e, &mut a);
        let fits = match e.action {
            Action::Alloc => match a.malloc(e.size, e.stream, entry_tag(i)) {
                Ok(addr) => {
                    ours.insert(e.addr, addr);
                    true
                }
                Err(_) => false,
            },
            Action::Oom => match a.malloc(e.size, e.stream, entry_tag(i)) {
                Ok(addr) => {
                    let _ = a.free(addr);
                    true
                }
                Err(_) => false,
            },
            Action::FreeRequested => {
                if let Some(addr) = ours.remove(&e.addr) {
                    let _ = a.free(addr);
                }
                true
            }
            _ => true,
        };
        if !fits {
            earlier_ooms += 1;
            first_earlier_oom.get_or_insert(i);
        }
    }
    while next_empty_cache.next_if(|&&x| x <= at).is_some() {
        a.empty_cache();
    }
    if let Some(e) = requests.entries.get(at) {
        kernels.before(e, &mut a);
    }
    (a, earlier_ooms, first_earlier_oom)
}

/// The blocks live just before request `at`, each as (the request entry
/// that made it, when the replay made it; its block bytes): what held the
/// memory when the request came.
pub fn live_at(
    requests: &Requests<'_>,
    config: AllocConfig,
    device: SimDevice,
    at: usize,
) -> Vec<(Option<usize>, u64)> {
    let (a, _, _) = replayed_to(requests, config, device, at);
    a.snapshot()
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state.is_active())
        .map(|b| (super::tag_entry(b.tag), b.size))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Placement;

    const MIB: u64 = 1 << 20;

    /// Two 20 MiB requests on the H100 driver layout: where the second
    /// segment lies, with the first `before` requests made before kernels.
    fn second_segment(before: usize) -> u64 {
        let entries: Vec<Entry> = (0..2)
            .map(|i| Entry {
                action: Action::Alloc,
                addr: 0x1000 * (i as u64 + 1),
                size: 20 * MIB,
                stream: 0,
                in_empty_cache: false,
                before_kernels: i < before,
            })
            .collect();
        let requests = Requests {
            entries: &entries,
            empty_cache_at: &[],
            start: None,
        };
        let device = SimDevice::new("what-if", 80 << 30, 0).placed(Placement::H100Driver);
        let run = run_on(&requests, AllocConfig::default(), device, false);
        let mut segments: Vec<u64> = run.allocator.snapshot().iter().map(|s| s.address).collect();
        assert_eq!(segments.len(), 2, "one segment per request");
        // The first segment goes on top whatever the layout's state.
        segments.sort_unstable();
        segments[0]
    }

    #[test]
    fn the_device_is_told_kernels_started_at_the_first_request_not_before_them() {
        let from_first = second_segment(0);
        let from_second = second_segment(1);
        let never = second_segment(2);
        // Kernels started before the second request either way: the held
        // range is open to it.
        assert_eq!(from_first, from_second);
        // Never started: the range stays held and the segment goes below it.
        assert!(never < from_second, "{never:#x} below {from_second:#x}");
    }
}
