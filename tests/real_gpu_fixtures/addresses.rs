//! The driver's addresses as a named cause. Which of several equal-size
//! cached blocks serves a request follows where the driver put each segment
//! (the allocator breaks ties by address), and the simulated device lays
//! segments out its own way. So where a scenario makes every request the
//! H100 made, in order, and its figures still differ, the test replays the
//! capture's own requests through our allocator on the scenario's simulated
//! device: if that reproduces the simulation, the difference is the
//! addresses and nothing the engine asks for. (The capture's own addresses
//! replay to PyTorch's figures exactly: `replay_checks`.)

use std::collections::HashMap;

use vramscope::alloc::{Action, CachingAllocator, Tag};
use vramscope::device::{Device, SimDevice};
use vramscope::scenario::{resolve, RunResult};
use vramscope::trace::replay::from_snapshot;
use vramscope::trace::snapshot::import_file;
use vramscope::trace::Event;

use crate::harness::{captured, meta, simulate_recording};

/// What a run's allocator reports: the peaks, and allocated / reserved /
/// the running peak at each iteration's end.
#[derive(Debug, PartialEq)]
pub(crate) struct Figures {
    pub(crate) peak_allocated: u64,
    pub(crate) peak_reserved: u64,
    pub(crate) ends: Vec<(u64, u64, u64)>,
}

pub(crate) fn figures_of(sim: &RunResult) -> Figures {
    Figures {
        peak_allocated: sim.peak_allocated,
        peak_reserved: sim.peak_reserved,
        ends: sim
            .per_iteration
            .iter()
            .map(|p| (p.allocated, p.reserved, p.peak_allocated))
            .collect(),
    }
}

/// The capture's requests on the simulated device: the block serving each
/// request, as (request, block) bytes, and the figures.
pub(crate) struct OnSimulatedAddresses {
    pub(crate) blocks: Vec<(u64, u64)>,
    pub(crate) figures: Figures,
}

/// The capture's requests and frees, in its order, through the allocator on
/// the scenario's simulated device: PyTorch's decisions with the
/// simulation's addresses instead of the driver's. Iterations end where the
/// program's next `iteration N` annotation starts (without them, at the
/// first request after each `zero_grad()`), the last one with the trace.
pub(crate) fn on_simulated_addresses(scenario: &str, stem: &str) -> OnSimulatedAddresses {
    let (_, built) = resolve(scenario).unwrap_or_else(|e| panic!("{scenario}: {e}"));
    let snap = import_file(&captured(stem, "pickle")).expect("imports");
    let entries = from_snapshot::entries(&snap, 0);
    let trace = &snap.device_traces[0];
    assert_eq!(
        entries.len(),
        trace.len(),
        "{stem}: one entry per trace entry"
    );
    let starts: Vec<i64> = snap
        .external_annotations
        .iter()
        .filter(|a| &*a.stage == "START" && a.name.starts_with("iteration "))
        .map(|a| a.time_us)
        .collect();
    // Where an iteration ends before the next entry at or after each time.
    let boundaries: Vec<i64> = if starts.is_empty() {
        // No `iteration N` annotations (the token-LM programs): each
        // iteration ends with `zero_grad()` and the `del` after it, so the
        // next one starts at the first request after zero_grad's END.
        let ends: Vec<i64> = snap
            .external_annotations
            .iter()
            .filter(|a| &*a.stage == "END" && a.name.starts_with("Optimizer.zero_grad"))
            .map(|a| a.time_us)
            .collect();
        let first_alloc_after = |t: i64| {
            entries
                .iter()
                .zip(trace)
                .filter(|(e, _)| e.action == Action::Alloc)
                .filter_map(|(_, x)| x.time_us())
                .find(|&at| at >= t)
        };
        ends.iter()
            .take(ends.len().saturating_sub(1))
            .filter_map(|&t| first_alloc_after(t))
            .collect()
    } else {
        starts[1..].to_vec()
    };
    let device = SimDevice::new(
        "replay",
        built.engine.device_bytes,
        built.engine.device_overhead,
    )
    .placed(built.engine.placement);
    let mut a = CachingAllocator::new(device, from_snapshot::config(&snap));
    let mut ours: HashMap<u64, u64> = HashMap::new();
    let mut blocks = Vec::new();
    let mut ends = Vec::new();
    let end = |a: &CachingAllocator<SimDevice>| {
        let s = a.stats();
        (
            s.allocated_bytes(),
            s.reserved_bytes(),
            s.peak_allocated_bytes(),
        )
    };
    let mut next = 0;
    let mut kernels = false;
    for (e, t) in entries.iter().zip(trace) {
        // Kernels start at the first request not made by a module's `.to()`
        // (from the capture's stacks), as the engine's device is told.
        if !kernels && e.starts_kernels() {
            kernels = true;
            a.device_mut().kernels_started();
        }
        let at = t.time_us().expect("the capture's entries are timed");
        while next < boundaries.len() && at >= boundaries[next] {
            ends.push(end(&a));
            next += 1;
        }
        match e.action {
            Action::Alloc => {
                let addr = a
                    .malloc(e.size, e.stream, Tag(0))
                    .unwrap_or_else(|err| panic!("{stem}: {err}"));
                ours.insert(e.addr, addr);
                let served = a.take_events().last().expect("an alloc event").block_size;
                blocks.push((e.size, served));
            }
            Action::FreeRequested => {
                let addr = ours.remove(&e.addr).expect("freed after its alloc");
                a.free(addr).expect("frees");
            }
            _ => {}
        }
    }
    ends.push(end(&a));
    assert_eq!(
        ends.len(),
        boundaries.len() + 1,
        "{stem}: one end per iteration"
    );
    let s = a.stats();
    OnSimulatedAddresses {
        blocks,
        figures: Figures {
            peak_allocated: s.peak_allocated_bytes(),
            peak_reserved: s.peak_reserved_bytes(),
            ends,
        },
    }
}

/// The H100's requests on the simulated device reach the simulation's
/// figures exactly: the peaks and every iteration end.
pub(crate) fn figures_are_the_simulations(scenario: &str, stem: &str, sim: &RunResult) {
    assert_eq!(
        on_simulated_addresses(scenario, stem).figures,
        figures_of(sim),
        "{stem}: the H100's requests on the simulated device"
    );
}

/// The H100's requests on the simulated device take exactly the
/// simulation's blocks, one by one, and reach its peak.
pub(crate) fn blocks_are_the_simulations(scenario: &str, stem: &str) {
    let real = on_simulated_addresses(scenario, stem);
    let sim = simulate_recording(scenario, &meta(stem), true);
    let simulated: Vec<(u64, u64)> = sim
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Alloc(a) if a.action == Action::Alloc => Some((a.size, a.block_size)),
            _ => None,
        })
        .collect();
    assert_eq!(real.blocks.len(), simulated.len(), "{stem}: requests");
    let first = real.blocks.iter().zip(&simulated).position(|(r, s)| r != s);
    assert_eq!(first, None, "{stem}: the first block that differs");
    assert_eq!(
        real.figures.peak_allocated, sim.peak_allocated,
        "{stem}: peak allocated"
    );
}
