//! A synthetic `_dump_snapshot` pickle of any size, for benchmarks and
//! tests of the importer on traces far bigger than the real files.
//!
//! It is what PyTorch writes, as far as the importer can tell: protocol 4
//! with `FRAME`s, the current dict layout with every key of torch 2.9+,
//! strings, frame dicts and frames lists memoised once and referenced with
//! `BINGET`/`LONG_BINGET` (alloc, free_requested and free_completed share
//! one frames list, as in real files), entry dicts batched by 1000.
//!
//! The trace is *closed* and replays exactly: it is the event log of our own
//! [`CachingAllocator`] on a [`SimDevice`] running a random training-like
//! workload (many small tensors, fewer large ones, a live set that grows
//! and shrinks), so every `segment_alloc` comes before the first alloc in
//! its segment and the final `segments` are the allocator's end state.
//!
//! Output is streamed: the workload is run twice from the same seed, once
//! to learn how many steps reach `target_bytes` and what the final segments
//! are (written first, as PyTorch does), once to write the trace. Memory
//! stays at the allocator's state plus one 64 KiB frame.

use std::io::{self, Write};

use super::dict_keys::{self, SegmentHeader};
use crate::alloc::{AllocConfig, AllocEvent, BlockState, CachingAllocator, Pool, SegmentInfo, Tag};
use crate::device::SimDevice;
use crate::trace::pickle::{PickleWriter, BATCH, FRAME_TARGET};

/// What [`synthetic_snapshot`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SynthStats {
    /// File size.
    pub bytes: u64,
    /// Trace entries (one device).
    pub entries: u64,
    /// `alloc` entries.
    pub allocs: u64,
    /// Segments in the final state.
    pub segments: u64,
    /// Distinct frames lists in the pool the entries draw from.
    pub stacks: u64,
}

/// Distinct stacks the workload draws from, and the frames they use.
const STACKS: usize = 3000;
const FRAMES: usize = 1500;
/// The live set never exceeds this (well under the simulated device).
const LIVE_CAP: u64 = 12 << 30;
const DEVICE_TOTAL: u64 = 80 << 30;

/// Write a synthetic snapshot of about `target_bytes` to `writer` (the
/// step count is sized on a probe run that writes no segments: within a
/// few % at 1 GB, 10% at 3 MB). The same `seed` gives the same bytes.
pub fn synthetic_snapshot(
    mut writer: impl Write,
    target_bytes: u64,
    seed: u64,
) -> io::Result<SynthStats> {
    let pool = FramePool::new(seed);
    // Pass 1: count the trace's bytes to find the number of steps.
    let mut probe = Workload::new(seed);
    let mut w = PickleWriter::new();
    let mut memo = Memo::new(&pool);
    let mut sink = Counter(io::sink(), 0);
    // In the file the segments come first: their keys take the first memo
    // slots (so "size", "stream", "frames" are BINGETs in entries) and
    // their dicts the next few hundred (so the entries' own keys are
    // LONG_BINGETs, as in PyTorch's files). Give the probe the same memo.
    for key in [
        "segments",
        "device",
        "address",
        "total_size",
        "allocated_size",
        "active_size",
        "requested_size",
        "stream",
        "segment_type",
        "large",
        "segment_pool_id",
        "is_expandable",
        "frames",
        "blocks",
        "size",
        "state",
        "active_allocated",
    ] {
        w.str(key);
    }
    for _ in 0..300 {
        w.empty_list();
        w.memoize();
    }
    let mut steps = 0u64;
    while sink.1 < target_bytes {
        for (i, e) in probe.step().iter().enumerate() {
            entry(&mut w, &mut memo, &pool, e, probe.time_us + i as i64);
        }
        steps += 1;
        if w.buffered() >= FRAME_TARGET {
            w.flush_frame(&mut sink)?;
        }
    }
    let finals = probe.alloc.snapshot();
    drop((probe, memo, w));

    // Pass 2: the file.
    let mut out = Counter(&mut writer, 0);
    let mut w = PickleWriter::new();
    let mut memo = Memo::new(&pool);
    let mut stats = SynthStats {
        segments: finals.len() as u64,
        stacks: STACKS as u64,
        ..SynthStats::default()
    };
    w.empty_dict();
    w.memoize();
    w.mark();
    w.str("segments");
    w.empty_list();
    w.memoize();
    for chunk in finals.chunks(BATCH) {
        w.mark();
        for s in chunk {
            segment(&mut w, &mut memo, &pool, s);
            if w.buffered() >= FRAME_TARGET {
                w.flush_frame(&mut out)?;
            }
        }
        w.appends();
    }
    w.str("device_traces");
    // One device: CPython appends a single item with APPEND, no MARK.
    w.empty_list();
    w.memoize();
    w.empty_list();
    w.memoize();
    let mut work = Workload::new(seed);
    let mut in_batch = 0usize;
    for _ in 0..steps {
        for (i, e) in work.step().iter().enumerate() {
            if in_batch == 0 {
                w.mark();
            }
            entry(&mut w, &mut memo, &pool, e, work.time_us + i as i64);
            stats.entries += 1;
            stats.allocs += u64::from(e.action == crate::alloc::Action::Alloc);
            in_batch += 1;
            if in_batch == BATCH {
                w.appends();
                in_batch = 0;
            }
            if w.buffered() >= FRAME_TARGET {
                w.flush_frame(&mut out)?;
            }
        }
    }
    if in_batch > 0 {
        w.appends();
    }
    w.append();
    debug_assert_eq!(work.alloc.snapshot(), finals);
    w.str("allocator_settings");
    settings(&mut w);
    w.str("external_annotations");
    w.empty_list();
    w.memoize();
    w.setitems();
    w.finish_into(&mut out)?;
    stats.bytes = out.1;
    Ok(stats)
}

/// Counts what goes through.
struct Counter<W>(W, u64);

impl<W: Write> Write for Counter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.0.write(buf)?;
        self.1 += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// Log-uniform in `[lo, hi)`.
    fn log_uniform(&mut self, lo: u64, hi: u64) -> u64 {
        let (a, b) = ((lo as f64).ln(), (hi as f64).ln());
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((a + u * (b - a)).exp() as u64).clamp(lo, hi - 1)
    }
}

/// The stacks: `(filename, line, name)` frames, innermost first.
struct FramePool {
    frames: Vec<(String, i64, String)>,
    stacks: Vec<Vec<u32>>,
}

impl FramePool {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed ^ 0x5eed_f7a3);
        let torch = [
            "nn/modules/linear.py",
            "nn/modules/conv.py",
            "nn/modules/normalization.py",
            "nn/modules/activation.py",
            "nn/functional.py",
            "optim/adamw.py",
            "_tensor.py",
            "autograd/graph.py",
        ];
        let cpp = [
            "torch::unwind::unwind()",
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
            "at::native::empty_cuda",
            "at::TensorBase::to",
            "torch::autograd::Engine::evaluate_function",
        ];
        let mut frames = Vec::with_capacity(FRAMES);
        for i in 0..FRAMES {
            frames.push(match i % 4 {
                0 => (
                    "??".to_string(),
                    0,
                    cpp[i / 4 % cpp.len()].to_string() + &format!("#{i}"),
                ),
                1 => (
                    format!(
                        "/usr/lib/python3.12/site-packages/torch/{}",
                        torch[i / 4 % torch.len()]
                    ),
                    (rng.below(2000) + 1) as i64,
                    format!("forward_{}", i % 97),
                ),
                _ => (
                    format!("/home/user/project/model/block_{}.py", i % 61),
                    (rng.below(900) + 1) as i64,
                    format!("layer_{}", i % 211),
                ),
            });
        }
        let stacks = (0..STACKS)
            .map(|_| {
                let depth = 6 + rng.below(19) as usize;
                (0..depth)
                    .map(|_| rng.below(FRAMES as u64) as u32)
                    .collect()
            })
            .collect();
        Self { frames, stacks }
    }
}

/// Memo indices of what was already written.
struct Memo {
    stacks: Vec<Option<u32>>,
    frames: Vec<Option<u32>>,
}

impl Memo {
    fn new(pool: &FramePool) -> Self {
        Self {
            stacks: vec![None; pool.stacks.len()],
            frames: vec![None; pool.frames.len()],
        }
    }
}

/// The workload: one allocator, a live set, a clock.
struct Workload {
    rng: Rng,
    alloc: CachingAllocator<SimDevice>,
    live: Vec<(u64, u64)>,
    live_bytes: u64,
    time_us: i64,
    n: u64,
}

impl Workload {
    fn new(seed: u64) -> Self {
        let mut alloc = CachingAllocator::new(
            SimDevice::new("synthetic", DEVICE_TOTAL, 0),
            AllocConfig::default(),
        );
        alloc.set_recording(true);
        Self {
            rng: Rng(seed),
            alloc,
            live: Vec::new(),
            live_bytes: 0,
            time_us: 1_700_000_000_000_000,
            n: 0,
        }
    }

    /// One malloc or free; its trace entries (with the clock advanced).
    fn step(&mut self) -> Vec<AllocEvent> {
        self.n += 1;
        self.time_us += 8 + self.rng.below(40) as i64;
        // The live set breathes between ~100 and ~3000 tensors, like
        // forward/backward passes.
        let phase = (self.n / 20_000).is_multiple_of(2);
        let want = if phase { 3000 } else { 100 };
        let alloc = self.live.is_empty()
            || (self.live.len() < want && self.rng.below(100) < 70)
            || (self.live.len() >= want && self.rng.below(100) < 30);
        let size = match self.rng.below(100) {
            0..=69 => self.rng.log_uniform(1, 1 << 20),
            70..=95 => self.rng.log_uniform(1 << 20, 32 << 20),
            _ => self.rng.log_uniform(32 << 20, 512 << 20),
        };
        if alloc && self.live_bytes + size <= LIVE_CAP {
            // Skewed towards a few hot stacks, as real code is.
            let r = self.rng.below(STACKS as u64);
            let stack = r * r / STACKS as u64;
            if let Ok(addr) = self.alloc.malloc(size, 0, Tag(stack + 1)) {
                self.live.push((addr, size));
                self.live_bytes += size;
            }
        } else if !self.live.is_empty() {
            let i = self.rng.below(self.live.len() as u64) as usize;
            let (addr, size) = self.live.swap_remove(i);
            self.live_bytes -= size;
            let _ = self.alloc.free(addr);
        }
        self.alloc.take_events()
    }
}

/// A frames list: written once, then referenced from the memo.
fn stack(w: &mut PickleWriter, memo: &mut Memo, pool: &FramePool, tag: Tag) {
    let Some(i) = (tag.0 as usize)
        .checked_sub(1)
        .filter(|&i| i < pool.stacks.len())
    else {
        w.empty_list();
        w.memoize();
        return;
    };
    if let Some(m) = memo.stacks[i] {
        w.get(m);
        return;
    }
    w.empty_list();
    memo.stacks[i] = Some(w.memoize());
    w.mark();
    for &f in &pool.stacks[i] {
        let f = f as usize;
        if let Some(m) = memo.frames[f] {
            w.get(m);
            continue;
        }
        let (file, line, name) = &pool.frames[f];
        w.empty_dict();
        memo.frames[f] = Some(w.memoize());
        w.mark();
        w.str("filename");
        w.str(file);
        w.str("name");
        w.str(name);
        w.str("line");
        w.int(*line);
        w.setitems();
    }
    w.appends();
}

fn entry(w: &mut PickleWriter, memo: &mut Memo, pool: &FramePool, e: &AllocEvent, time_us: i64) {
    w.empty_dict();
    w.memoize();
    w.mark();
    w.str("action");
    w.str(e.action.name());
    w.str("addr");
    w.uint(e.addr);
    w.str("size");
    w.uint(e.size);
    w.str("stream");
    w.uint(e.stream);
    w.str("time_us");
    w.int(time_us);
    w.str("compile_context");
    w.str("N/A");
    w.str("user_metadata");
    w.str("");
    w.str("frames");
    stack(w, memo, pool, e.tag);
    w.setitems();
}

fn segment(w: &mut PickleWriter, memo: &mut Memo, pool: &FramePool, s: &SegmentInfo) {
    w.empty_dict();
    w.memoize();
    w.mark();
    let header = SegmentHeader {
        device: 0,
        address: s.address,
        total_size: s.total_size,
        allocated_size: s.allocated_size,
        active_size: s.active_size,
        requested_size: s.requested_size,
        stream: s.stream,
        segment_type: match s.pool {
            Pool::Small => "small",
            Pool::Large => "large",
        },
        pool_id: (0, 0),
        is_expandable: s.is_expandable,
    };
    dict_keys::segment(w, &header);
    w.str("frames");
    stack(w, memo, pool, s.tag);
    w.str("blocks");
    w.empty_list();
    w.memoize();
    w.mark();
    for b in &s.blocks {
        w.empty_dict();
        w.memoize();
        w.mark();
        dict_keys::block(w, b.address, b.size, b.requested_size, b.state.as_str());
        w.str("frames");
        let tag = if b.state == BlockState::Inactive {
            Tag::NONE
        } else {
            b.tag
        };
        stack(w, memo, pool, tag);
        w.setitems();
    }
    w.appends();
    w.setitems();
}

/// PyTorch's defaults, as `allocator_settings`.
fn settings(w: &mut PickleWriter) {
    w.empty_dict();
    w.memoize();
    w.mark();
    w.str("PYTORCH_CUDA_ALLOC_CONF");
    w.str("");
    w.str("max_split_size");
    w.int(-1);
    w.str("garbage_collection_threshold");
    w.float(0.0);
    w.str("expandable_segments");
    w.bool(false);
    w.str("roundup_power2_divisions");
    w.empty_dict();
    w.memoize();
    w.mark();
    for i in 0..16 {
        w.str(&(1u64 << i).to_string());
        w.int(0);
    }
    w.setitems();
    w.setitems();
}
