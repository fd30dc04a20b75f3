//! `run --device cuda` on a card larger than the scenario's GPU holds the
//! allocator to the scenario's capacity: the OOMs, retries and peaks are the
//! scenario's, not an 80 GiB card's. Shown here with a large simulated device
//! standing in for the card (the first H100 run of issue 7 found the OOM
//! scenarios running to the end without this).

use vramscope::device::budget::scenario_sized;
use vramscope::device::{Device, SimDevice};
use vramscope::scenario::{resolve, run, run_launching, RunOptions};
use vramscope::trace::Event;

const OPTS: RunOptions = RunOptions {
    iterations: None,
    record_events: true,
};

const CARD: u64 = 80 << 30;

#[test]
fn a_large_card_held_to_the_scenario_makes_the_scenarios_decisions() {
    for name in [
        "fragmentation-oom-bug",
        "accumulate-loss-eval-bug",
        "fragmentation-oom-expandable-fixed",
        "zero-grad-fixed",
    ] {
        let (s, b) = resolve(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let plain = run(&s, &b, &OPTS);
        // Laid out as the scenario's card (its driver's layout, where modelled).
        let card = SimDevice::new("a large card", CARD, 0).placed(b.engine.placement);
        let dev = scenario_sized(card, b.engine.device_bytes, b.engine.device_overhead);
        let held = run_launching(&s, &b, &OPTS, dev, None);
        assert_eq!(
            held.oom.as_ref().map(|o| (o.iteration, &o.message)),
            plain.oom.as_ref().map(|o| (o.iteration, &o.message)),
            "{name}: the OOM, its iteration and its message"
        );
        assert_eq!(held.iterations_run, plain.iterations_run, "{name}");
        assert_eq!(held.peak_reserved, plain.peak_reserved, "{name}");
        assert_eq!(held.stats, plain.stats, "{name}: memory_stats()");
        let allocs = |r: &vramscope::scenario::RunResult| -> usize {
            r.events
                .iter()
                .filter(|e| matches!(e, Event::Alloc(_)))
                .count()
        };
        assert_eq!(allocs(&held), allocs(&plain), "{name}: allocator events");
        assert!(held.events == plain.events, "{name}: event streams differ");
    }
}

#[test]
fn unheld_the_large_card_does_not_oom_where_the_scenario_does() {
    // The control: what the first H100 run showed before the fix.
    let (s, b) = resolve("fragmentation-oom-bug").expect("built-in");
    let dev = Box::new(SimDevice::new("a large card", CARD, 0));
    let free = run_launching(&s, &b, &OPTS, dev, None);
    assert!(free.oom.is_none(), "80 GiB holds what 144 MiB cannot");
    assert!(run(&s, &b, &OPTS).oom.is_some());
}

#[test]
fn a_scenario_larger_than_the_card_runs_on_the_card_as_it_is() {
    let (s, b) = resolve("zero-grad-fixed").expect("built-in");
    let small = SimDevice::new("a small card", 512 << 20, 0);
    let dev = scenario_sized(small, b.engine.device_bytes, b.engine.device_overhead);
    assert_eq!(dev.total_memory(), 512 << 20);
    let r = run_launching(&s, &b, &OPTS, dev, None);
    assert!(r.oom.is_none() && r.error.is_none());
}

/// Segments handed out top-down, as the CUDA driver often does (the H100
/// traces in `tests/fixtures/pytorch/captured` go down as often as up).
struct TopDown {
    inner: SimDevice,
    next: u64,
}

impl Device for TopDown {
    fn name(&self) -> &str {
        "top-down"
    }
    fn total_memory(&self) -> u64 {
        self.inner.total_memory()
    }
    fn mem_get_info(&self) -> (u64, u64) {
        self.inner.mem_get_info()
    }
    fn malloc(&mut self, size: u64) -> Result<u64, vramscope::device::DeviceError> {
        self.inner.malloc(size)?;
        self.next -= size.div_ceil(2 << 20) * (2 << 20);
        Ok(self.next)
    }
    fn free(&mut self, addr: u64, size: u64) {
        self.inner.free(addr, size)
    }
    fn reserve(&mut self, size: u64) -> Result<u64, vramscope::device::DeviceError> {
        self.inner.reserve(size)
    }
    fn release_reservation(&mut self, addr: u64, size: u64) {
        self.inner.release_reservation(addr, size)
    }
    fn map(&mut self, addr: u64, size: u64) -> Result<(), vramscope::device::DeviceError> {
        self.inner.map(addr, size)
    }
    fn unmap(&mut self, addr: u64, size: u64) {
        self.inner.unmap(addr, size)
    }
}

#[test]
fn when_only_unsplit_tails_move_with_the_addresses_allocated_is_not_flat_but_requested_is() {
    // On the H100, amp-fp16's iterations ended at 448.31 and 448.94 MiB
    // allocated with the same tensors live: which cached block served a
    // request (and so its unsplit tail) followed the driver's addresses.
    let (s, b) = resolve("amp-fp16").expect("built-in");
    let dev = Box::new(TopDown {
        inner: SimDevice::new("sim", b.engine.device_bytes, b.engine.device_overhead),
        next: 0x7fff_0000_0000,
    });
    let r = run_launching(&s, &b, &OPTS, dev, None);
    let ends: Vec<(u64, u64)> = r
        .per_iteration
        .iter()
        .skip(1)
        .map(|p| (p.allocated, p.requested))
        .collect();
    assert!(ends.len() > 1);
    assert!(
        ends.iter().any(|e| e.0 != ends[0].0),
        "top-down addresses move the tails, as on the H100: {ends:?}"
    );
    assert!(
        ends.iter().all(|e| e.1 == ends[0].1),
        "the same tensors are live at every end"
    );
    use vramscope::scenario::Expectation;
    let flat = vramscope::scenario::check(
        &[Expectation::AllocatedFlat, Expectation::RequestedFlat],
        &r,
    );
    assert!(!flat[0].passed, "allocated moves: {}", flat[0].observed);
    assert!(
        flat[0].observed.contains("the same tensors"),
        "{}",
        flat[0].observed
    );
    assert!(flat[1].passed, "{}", flat[1].observed);
    assert!(
        flat[1].observed.contains("unsplit block tails"),
        "{}",
        flat[1].observed
    );
}

#[test]
fn a_gpu_run_reports_its_card_and_nvml_against_the_model() {
    use vramscope::device::reconcile::Reconciliation;
    use vramscope::scenario::GpuRun;
    let (s, b) = resolve("zero-grad-fixed").expect("built-in");
    let mut r = run(&s, &b, &OPTS);
    let mib = 1u64 << 20;
    r.gpu = Some(GpuRun {
        device: "cuda:0 NVIDIA H100 80GB HBM3".into(),
        device_total: 85_017_493_504,
        held_to: Some(1 << 30),
        at_end: Reconciliation::own(Some(566 * mib), Some(518 * mib), r.peak_reserved),
    });
    let checks = vramscope::scenario::check(&s.expect, &r);
    let text = vramscope::report::run::text(&s, &r, &checks);
    assert!(
        text.contains("run on cuda:0 NVIDIA H100 80GB HBM3 (79.18 GiB); the allocator is held to the scenario's 1024.00 MiB device"),
        "{text}"
    );
    assert!(
        text.contains("this process uses 566.00 MiB = CUDA context 518.00 MiB + allocator reserved 48.00 MiB + other 0 bytes"),
        "{text}"
    );
    let json = vramscope::report::run::json(&r, &checks);
    assert_eq!(json["gpu"]["at_end"]["context"], 518 * mib);
    assert_eq!(json["gpu"]["held_to"], 1u64 << 30);

    // Where NVML lists no processes, the terms it cannot give stay unknown.
    r.gpu.as_mut().expect("set").at_end = Reconciliation::own(None, None, r.peak_reserved);
    let text = vramscope::report::run::text(&s, &r, &checks);
    assert!(
        text.contains(
            "uses unknown = CUDA context unknown + allocator reserved 48.00 MiB + other unknown"
        ),
        "{text}"
    );
    assert!(
        run(&s, &b, &OPTS).gpu.is_none(),
        "a simulated run has no card"
    );
}
